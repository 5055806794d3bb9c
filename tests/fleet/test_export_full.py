"""An export that cannot write its files (a full disk; here a file-size limit) is one line
and leaves nothing behind."""

from __future__ import annotations

import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyarrow")

from fsage.db.store import Store
from fsage.fleet.synth import synthetic_history


def _limited() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))


def test_export_into_a_full_disk_is_one_line(tmp_path: Path, fsage_env: dict[str, str]) -> None:
    db, ds = tmp_path / "h.db", tmp_path / "ds"
    with Store.open(db, create=True) as store:
        synthetic_history(store, "a", files=5_000, snapshots=2, seed=3)
    r = subprocess.run(
        [sys.executable, "-m", "fsage", "export", "--db", str(db), "--host", "h", str(ds)],
        env=fsage_env, capture_output=True, text=True, preexec_fn=_limited, check=False,
    )  # fmt: skip
    assert r.returncode == 1, r.stderr
    assert r.stderr.startswith(f"fsage: error: {ds}: cannot write the dataset: ")
    assert len(r.stderr.splitlines()) == 1 and "Traceback" not in r.stderr
    assert not [p for p in ds.rglob("*") if p.is_file() and p.suffix in (".parquet", ".tmp")]
