#!/usr/bin/env python3
"""Analysis and report speed, measured against the snapshot that produced the data.

1. One FILES-file ext4 snapshot (image shared with bench/snapshot.py under
   bench/.cache/ext4-FILES-SEED.img, built the same way when missing):
     fsage analyze time / fsage snapshot time          (target <= 2)
2. A HISTORY-snapshot history of a HISTORY_FILES-file image, each snapshot taken after a small
   offline change (debugfs deletes and writes ~0.5% of files):
     fsage report time                                  (target < 60 s)
   and, for scale, e2freefrag on the same image.

Each command of part 1 is timed as the user runs it (a fresh process: start-up, imports and
database open included), the best of --repeat runs, as wall and CPU (user + system) seconds;
`python3 -c pass` is timed the same way for the interpreter's share. The targets of issue 16
(show <= 3 s, show --path <= 0.3 s, analyze --by dir <= 3 s at 710k files) are printed as
ratios of wall time to target (<= 1 meets it). --baseline CHECKOUT times the same commands with
another checkout's fsage (e.g. the main branch) in the same run, for before/after ratios on a
shared machine.

Usage: python3 bench/analyze.py [--files 500000] [--history 30] [--history-files 100000]
                                [--repeat 3] [--baseline /path/to/other/checkout] [--no-history]
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / "bench" / ".cache"
sys.path.insert(0, str(REPO))

from bench.live import command_env  # noqa: E402  (the environment of a timed fsage process)


def _snapshot_bench() -> object:
    spec = importlib.util.spec_from_file_location("bench_snapshot", REPO / "bench" / "snapshot.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def timed(argv: list[str], env: dict[str, str]) -> float:
    return timed_cpu(argv, env)[0]


def timed_cpu(argv: list[str], env: dict[str, str], cwd: Path = REPO) -> tuple[float, float]:
    """Wall and CPU (user + system) seconds of one run of a command; raises if it fails."""
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    err = p.stderr.read() if p.stderr else b""
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {err.decode()[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime


def best_of(runs: list[tuple[float, float]]) -> tuple[float, float]:
    """The least wall and the least CPU seconds of some runs."""
    return min(w for w, _ in runs), min(c for _, c in runs)


def _some_file(db: Path, env: dict[str, str]) -> str:
    """The path of one regular file of snapshot 1 (from a CSV listing of one directory)."""
    out = subprocess.run(
        [sys.executable, "-m", "fsage", "show", "1", "--db", str(db), "--format", "csv"],
        env=env, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    for row in list(csv.reader(io.StringIO(out)))[1:]:
        path, _ino, mode = row[:3]
        if mode.startswith("100"):
            return path
    raise SystemExit("no regular file in the snapshot")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", type=int, default=500_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--history", type=int, default=30)
    ap.add_argument("--history-files", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3, help="runs of each timed command")
    ap.add_argument("--baseline", type=Path, help="another checkout to time the same commands with")
    ap.add_argument("--no-history", action="store_true", help="skip part 2 (the report)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    sb = _snapshot_bench()
    fsage = [sys.executable, "-m", "fsage"]
    figures: dict[str, float | int] = {}
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        work = Path(tmp)
        env = command_env(REPO)
        # -- 1: one big snapshot ------------------------------------------------------------
        image = sb.build_image(args.files, args.seed)  # type: ignore[attr-defined]
        subprocess.run(["cat", str(image)], stdout=subprocess.DEVNULL, check=True)
        db = work / "one.db"
        t_snap = timed([*fsage, "snapshot", str(image), "--db", str(db)], env)
        t_an = timed([*fsage, "analyze", "--db", str(db), "--format", "json"], env)
        one = _some_file(db, env)
        commands = {
            "analyze_by_dir": ["analyze", "--db", str(db), "--by", "dir"],
            "show": ["show", "1", "--db", str(db)],
            "show_path": ["show", "1", "--db", str(db), "--path", one],
        }
        # (figure prefix, checkout): each runs its own fsage (PYTHONPATH and working directory)
        trees = [("", REPO, env)]
        if args.baseline:
            # a copy of its package (built extensions included), compiled there: nothing is
            # written into the other checkout
            base = work / "baseline"
            shutil.copytree(args.baseline.resolve() / "fsage", base / "fsage")
            trees.append(("baseline_", base, command_env(base)))
        start = best_of(
            [timed_cpu([sys.executable, "-c", "pass"], env) for _ in range(args.repeat)]
        )
        figures.update(python_start_s=start[0], python_start_cpu_s=start[1])
        for key, cmd in commands.items():
            runs: dict[str, list[tuple[float, float]]] = {prefix: [] for prefix, _, _ in trees}
            for _ in range(args.repeat):  # interleaved: every checkout sees the same load
                for prefix, tree, its_env in trees:
                    runs[prefix].append(timed_cpu([*fsage, *cmd], its_env, cwd=tree))
            for prefix, measured in runs.items():
                wall, cpu = best_of(measured)
                figures[f"{prefix}{key}_s"] = wall
                figures[f"{prefix}{key}_cpu_s"] = cpu
        t_ff = timed(["e2freefrag", str(image)], env)
        figures.update(
            files=args.files,
            snapshot_s=t_snap,
            analyze_s=t_an,
            analyze_over_snapshot=t_an / t_snap,
            e2freefrag_s=t_ff,
            load_average=os.getloadavg()[0],
        )
        if args.no_history:
            _print(args, figures)
            return
        # -- 2: a history -------------------------------------------------------------------
        base = sb.build_image(args.history_files, args.seed)  # type: ignore[attr-defined]
        himg = work / "hist.img"
        shutil.copyfile(base, himg)
        hdb = work / "hist.db"
        t0 = time.perf_counter()
        for i in range(args.history):
            if i:
                sb.change_one_percent(himg, args.history_files, args.seed + i, work)  # type: ignore[attr-defined]
            subprocess.run([*fsage, "snapshot", str(himg), "--db", str(hdb), "--name", "h"],
                           env=env, check=True, stdout=subprocess.DEVNULL)  # fmt: skip
        figures["history_build_s"] = time.perf_counter() - t0
        out = work / "report.html"
        figures["history_snapshots"] = args.history
        figures["history_files"] = args.history_files
        figures["report_s"] = timed([*fsage, "report", "--db", str(hdb), "-o", str(out)], env)
        figures["report_bytes"] = out.stat().st_size

    _print(args, figures)


TARGETS = {"analyze_by_dir": 3.0, "show": 3.0, "show_path": 0.3}  # seconds at 710k files
LABELS = {
    "analyze_by_dir": "fsage analyze --by dir",
    "show": "fsage show (every file)",
    "show_path": "fsage show --path FILE",
}


def _print(args: argparse.Namespace, figures: dict[str, float | int]) -> None:
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    print(f"load average {figures['load_average']:.1f} on {os.cpu_count()} CPUs; "
          f"best of {args.repeat} runs; wall s / CPU s (user + system)")  # fmt: skip
    print(f"snapshot of {args.files} files:         {figures['snapshot_s']:8.2f} s")
    print(f"fsage analyze (json, all parts):     {figures['analyze_s']:8.2f} s")
    print(f"python3 -c pass (start-up):          {figures['python_start_s']:8.2f} s"
          f" / {figures['python_start_cpu_s']:.2f} s")  # fmt: skip
    for key, label in LABELS.items():
        wall, cpu = figures[f"{key}_s"], figures[f"{key}_cpu_s"]
        line = (
            f"{label + ':':<37}{wall:8.2f} s / {cpu:.2f} s   wall/target {wall / TARGETS[key]:.2f}"
            f" (target <= {TARGETS[key]:g} s at 710k files)"
        )
        if f"baseline_{key}_s" in figures:
            bw, bc = figures[f"baseline_{key}_s"], figures[f"baseline_{key}_cpu_s"]
            line += (
                f"; baseline {bw:.2f} s / {bc:.2f} s: {bw / wall:.2f}x wall, {bc / cpu:.2f}x CPU"
            )
        print(line)
    print(f"analyze / snapshot:                  {figures['analyze_over_snapshot']:8.2f}"
          "   (target <= 2)")  # fmt: skip
    print(f"e2freefrag (reference):              {figures['e2freefrag_s']:8.2f} s")
    if "report_s" in figures:
        print(
            f"report over {args.history} snapshots of {args.history_files} files: "
            f"{figures['report_s']:8.2f} s   (target < 60 s), {figures['report_bytes']} bytes"
        )


if __name__ == "__main__":
    main()
