"""The kernel's blk tracer is one per machine: fsage records who holds it, so a trace killed
while it held the tracer does not lock every later trace out, and a live holder is named."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import fsage.tracerlock as tl

_CHILD = """
import sys, time
from pathlib import Path
import fsage.tracerlock as tl
tl._lock_dir = lambda: Path(sys.argv[1])
with tl.tracer_holder():
    print("held", flush=True)
    time.sleep(60)
"""


def _holder(d: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    p = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(d)], stdout=subprocess.PIPE, text=True, env=env
    )
    assert p.stdout is not None and p.stdout.readline().strip() == "held"
    return p


def test_a_live_holder_is_named_and_a_killed_one_is_taken_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tl, "_lock_dir", lambda: tmp_path)
    with tl.tracer_holder() as dead:
        assert dead is None  # nobody held it before
    child = _holder(tmp_path)
    try:
        with (
            pytest.raises(tl.TracerBusyError, match=rf"fsage trace \({child.pid} "),
            tl.tracer_holder(),
        ):
            pass
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    deadline = time.monotonic() + 10
    while True:  # the kernel drops a dead process's flock as it reaps it
        try:
            with tl.tracer_holder() as dead:
                assert dead is not None and dead.startswith(f"{child.pid} ")
            break
        except tl.TracerBusyError:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    with tl.tracer_holder() as dead:
        assert dead is None  # a holder that finished clears its record


def test_the_holder_file_is_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tl, "_lock_dir", lambda: tmp_path / "locks")
    with tl.tracer_holder():
        assert (tl.holder_file().stat().st_mode & 0o777) == 0o600
        assert (tmp_path / "locks").stat().st_mode & 0o077 == 0
