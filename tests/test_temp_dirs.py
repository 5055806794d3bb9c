"""fsage's temporary mount points (``fsage-<use>-<pid>-*`` under $TMPDIR) go away on every way
out of a run: its end, an error, Ctrl-C; and those of a process that is gone (killed) are
removed by the next run. Each run gets a $TMPDIR of its own, so that what is left is its own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fsage.ager.images import make_image, sweep_dead_mount_dirs


def _age(image: Path, env: dict[str, str], *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "fsage", "age", str(image), "--profile", "hfs-surge", *extra],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _age_ok(image: Path, env: dict[str, str], *extra: str) -> None:
    proc = _age(image, env, *extra)
    assert proc.wait(timeout=120) == 0, proc.stderr.read() if proc.stderr else b""


def _age_mounted(tmp_path: Path, tmp: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """A run far longer than the test, once it has mounted its image under ``tmp``."""
    image = make_image(tmp_path / "e.img", "ext4", 64 << 20)
    proc = _age(image, env, "--fill", "0.5", "--churn", "100", "--mount")
    deadline = time.monotonic() + 60
    while not _mounted_under(tmp) and time.monotonic() < deadline:  # started its ops
        time.sleep(0.05)
    assert _mounted_under(tmp), "the run never mounted its image"
    return proc


def _mounted_under(tmp: Path) -> list[str]:
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    return [f.split()[4] for f in lines if f.split()[4].startswith(str(tmp) + "/")]


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@pytest.fixture
def tmpdir_env(tmp_path: Path, fsage_env: dict[str, str]) -> tuple[Path, dict[str, str]]:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    return tmp, dict(fsage_env, TMPDIR=str(tmp))


@pytest.mark.needs_root
@pytest.mark.slow
def test_a_finished_run_and_a_failed_one_leave_no_mount_point(
    tmp_path: Path, tmpdir_env: tuple[Path, dict[str, str]]
) -> None:
    tmp, env = tmpdir_env
    _age_ok(make_image(tmp_path / "e.img", "ext4", 32 << 20), env, "--ops-limit", "50", "--mount")
    assert sorted(os.listdir(tmp)) == []
    garbage = tmp_path / "g.img"  # not a file system: the mount fails
    garbage.write_bytes(b"\xa5" * (8 << 20))
    proc = _age(garbage, env, "--ops-limit", "50", "--mount")
    assert proc.wait(timeout=120) != 0
    assert sorted(os.listdir(tmp)) == []


@pytest.mark.needs_root
@pytest.mark.slow
def test_ctrl_c_leaves_no_mount_point(
    tmp_path: Path, tmpdir_env: tuple[Path, dict[str, str]]
) -> None:
    tmp, env = tmpdir_env
    proc = _age_mounted(tmp_path, tmp, env)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=120) == 130
    assert sorted(os.listdir(tmp)) == []


@pytest.mark.needs_root
@pytest.mark.slow
def test_the_next_run_removes_what_a_killed_run_left(
    tmp_path: Path, tmpdir_env: tuple[Path, dict[str, str]]
) -> None:
    tmp, env = tmpdir_env
    proc = _age_mounted(tmp_path, tmp, env)
    proc.kill()
    proc.wait()
    assert _mounted_under(tmp), "a run killed mounted leaves its mount"
    dead = _dead_pid()
    left = [tmp / f"fsage-age-{dead}-abcd1234", tmp / f"fsage-scan-{dead}-efgh5678"]
    for d in left:
        d.mkdir()
    live = tmp / f"fsage-age-{os.getpid()}-live0000"  # a running process's: kept
    live.mkdir()
    full = tmp / f"fsage-scan-{dead}-full0000"  # holds something: never removed
    full.mkdir()
    (full / "x").write_text("x")
    _age_ok(make_image(tmp_path / "o.img", "ext4", 32 << 20), env, "--ops-limit", "20", "--mount")
    assert _mounted_under(tmp) == []
    assert sorted(os.listdir(tmp)) == sorted([live.name, full.name])


def test_the_sweep_keeps_what_is_not_its_own(tmp_path: Path) -> None:
    dead = _dead_pid()
    for name in (f"fsage-age-{dead}-x1", "fsage-age-y2", f"fsage-trace-{dead}-z3", "other"):
        (tmp_path / name).mkdir()
    (tmp_path / f"fsage-match-{dead}-f4").write_text("a file, not a mount point")
    removed = sweep_dead_mount_dirs(tmp_path)
    assert [p.name for p in removed] == [f"fsage-age-{dead}-x1"]
    assert sorted(os.listdir(tmp_path)) == sorted(
        ["fsage-age-y2", f"fsage-trace-{dead}-z3", "other", f"fsage-match-{dead}-f4"]
    )
