"""Peak memory of fsage commands, each in a fresh process: a synthetic history exported
(and compacted) by one process, then the command run by another whose peak resident set
is read from the kernel (VmHWM: the process's own, where ru_maxrss would start from the
forking parent's size)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

_BUILD = """
import sys
from pathlib import Path
from fsage.db.store import Store
from fsage.fleet.compact import compact
from fsage.fleet.export import export_parquet
from fsage.fleet.synth import synthetic_history
db, out, files, compacted = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
with Store.open(db, create=True) as store:
    synthetic_history(store, "big", files=files, snapshots=2, seed=7)
export_parquet(db, out, host="h")
if compacted == "1":
    compact(out)
"""

_PROBE = """
import json, sys
from fsage.launch import run
try:
    run(sys.argv[1:])
finally:
    status = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines())
    print(json.dumps({"peak_kib": int(status["VmHWM"].split()[0])}), file=sys.stderr)
"""


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def exported(tmp: Path, files: int, *, compacted: bool = False) -> Path:
    """A dataset of one file system of ``files`` files over two snapshots."""
    out = tmp / f"d{files}"
    argv = [sys.executable, "-c", _BUILD, str(tmp / f"{files}.db"), str(out), str(files)]
    argv.append("1" if compacted else "0")
    subprocess.run(argv, env=env(), cwd=REPO, check=True, capture_output=True, timeout=300)
    return out


def peak_mib(args: list[str]) -> tuple[float, str]:
    """(peak MiB, stdout) of ``fsage ARGS`` run as the command line runs it."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, *args],
        env=env(),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return float(json.loads(done.stderr.splitlines()[-1])["peak_kib"]) / 1024, done.stdout


def lowest_peak(runs: list[list[str]]) -> tuple[float, list[str]]:
    """(the lowest peak MiB, each run's stdout) of ``fsage ARGS`` for each ARGS of ``runs``:
    a loaded machine only adds to a peak, so the lowest of a few runs is the command's own."""
    measured = [peak_mib(args) for args in runs]
    return min(peak for peak, _ in measured), [out for _, out in measured]
