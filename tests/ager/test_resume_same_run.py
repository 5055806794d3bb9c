"""A generated run stopped (SIGKILL of the process at a given op, or Ctrl-C) and resumed is the
same run: its journal equals, op for op, that of a run of the same seed that was never
stopped, on a directory target (a tmpfs) and on a loop-mounted ext4 image."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.ager.helpers import fsck_clean, mounted_tmpfs, record_written_since, wait_until
from tests.ager.test_convergence import AGRAWAL, _profile_dir

MIB = 1 << 20
pytestmark = [pytest.mark.needs_root, pytest.mark.slow]


def _journal(target: Path) -> Path:
    (journal,) = target.parent.glob(target.name + ".fsage-age.*.ops.jsonl")
    return journal


def _ops(target: Path) -> list[bytes]:
    """The journal's op lines (its header names the target: left out)."""
    return _journal(target).read_bytes().splitlines()[1:]


def _count(target: Path) -> int:
    try:
        return _journal(target).read_bytes().count(b"\n") - 1
    except ValueError:  # no journal yet
        return 0


def _stop_at(
    cmd: list[str], env: dict[str, str], target: Path, ops: int, sig: int
) -> tuple[int, str]:
    """Run ``cmd`` and send it ``sig`` once its journal holds ``ops`` ops. The wait is on the
    journal, with no time limit of its own (a loaded machine only makes it longer): the run
    itself ends the wait if it stops first. Returns the process id and what it said."""
    since = time.time()
    # At the lowest priority (nice execs it: the same process), so that this watcher, woken
    # every millisecond, sees the journal grow op by op however loaded the machine is.
    proc = subprocess.Popen(
        ["nice", "-n", "19", *cmd], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    wait_until(
        lambda: _count(target) >= ops and record_written_since(target, since), proc, f"op {ops}"
    )
    proc.send_signal(sig)
    _out, err = proc.communicate()
    want = {signal.SIGKILL: -signal.SIGKILL, signal.SIGTERM: 143}.get(sig, 130)
    assert proc.returncode == want, err.decode()
    return proc.pid, err.decode()


def _finish(cmd: list[str], env: dict[str, str]) -> str:
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout + done.stderr


def _age(target: Path, args: list[str]) -> list[str]:
    return [sys.executable, "-m", "fsage", "age", str(target), *args]


def _compare(
    make: Iterator[Path], args: list[str], stops: list[tuple[int, int]], env: dict[str, str]
) -> None:
    """Run ``args`` to its end on one target, then on another of the same kind stopped at
    each (op, signal) of ``stops`` and resumed; the two journals must be equal."""
    whole = next(make)
    _finish(_age(whole, args), env)
    expected = _ops(whole)
    assert len(expected) > max(op for op, _ in stops) + 100, len(expected)
    target = next(make)
    cmd = _age(target, args)
    for at, sig in stops:
        _stop_at(cmd, env, target, at, sig)
        cmd = _age(target, ["--resume"])
    said = _finish(cmd, env)
    got = _ops(target)
    first = next((i for i, (a, b) in enumerate(zip(expected, got, strict=False)) if a != b), None)
    assert first is None and len(got) == len(expected), (first, len(got), len(expected), said)


KILLS = [(211, signal.SIGKILL), (844, signal.SIGKILL), (1377, signal.SIGKILL)]


def _tmpfs_targets(tmp: Path, size: int) -> Iterator[Path]:
    with contextlib.ExitStack() as stack:
        for i in range(2):
            yield stack.enter_context(mounted_tmpfs(tmp / f"t{i}", size))


@pytest.mark.parametrize(
    ("profile", "stops"),
    [
        ("hfs-surge", KILLS),
        ("desktop", [(211, signal.SIGINT), (844, signal.SIGKILL), (1377, signal.SIGINT)]),
        ("news", KILLS),
        ("agrawal", [(300, signal.SIGKILL), (1377, signal.SIGINT)]),
    ],
)
def test_a_stopped_run_resumes_as_the_same_run_on_a_directory(
    profile: str, stops: list[tuple[int, int]], tmp_path: Path, fsage_env: dict[str, str]
) -> None:
    if profile == "agrawal":  # a Geriatrix profile: planned tree, steered by histograms
        profile = str(_agrawal(tmp_path))
    args = ["--profile", profile, "--seed", "3", "--fill", "0.5", "--churn", "5"]
    args += ["--ops-limit", "2500"]
    gen = _tmpfs_targets(tmp_path, 64 * MIB)
    try:
        _compare(gen, args, stops, fsage_env)
    finally:
        gen.close()


def _agrawal(tmp: Path) -> Path:
    d = tmp / "agrawal"
    d.mkdir()
    return _profile_dir(d, AGRAWAL)


def _image_targets(tmp: Path) -> Iterator[Path]:
    """Copies of one freshly made ext4 image (the same UUID and hash seed)."""
    first = tmp / "resume-a.img"
    subprocess.run(["truncate", "-s", "96M", str(first)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(first)], check=True)
    second = tmp / "resume-b.img"
    shutil.copyfile(first, second)
    yield first
    yield second


@pytest.mark.parametrize("profile", ["hfs-surge", "mail", "agrawal"])
def test_a_killed_run_resumes_as_the_same_run_on_a_mounted_image(
    profile: str, tmp_path: Path, fsage_env: dict[str, str]
) -> None:
    extra: list[str] = []
    if profile == "agrawal":  # as Geriatrix ages: blocks allocated, not written
        profile = str(_agrawal(tmp_path))
        extra = ["--data", "fallocate"]
    args = ["--profile", profile, "--seed", "5", "--fill", "0.5", "--churn", "5", *extra]
    args += ["--ops-limit", "2500", "--mount"]
    stops = [(211, signal.SIGKILL), (844, signal.SIGINT), (1377, signal.SIGKILL)]
    images = _image_targets(tmp_path)
    _compare(images, args, stops, fsage_env)
    for img in (tmp_path / "resume-a.img", tmp_path / "resume-b.img"):
        fsck_clean(img)


def _fullness(image: Path, mnt: Path) -> float:
    """The image's fullness as the kernel reports it (statvfs of a read-only mount)."""
    mnt.mkdir(exist_ok=True)
    subprocess.run(["mount", "-o", "ro,loop", str(image), str(mnt)], check=True)
    try:
        st = os.statvfs(mnt)
    finally:
        subprocess.run(["umount", str(mnt)], check=True)
    return (st.f_blocks - st.f_bfree) / st.f_blocks


@pytest.mark.parametrize("profile", ["hfs-surge", "agrawal", "database"])
def test_two_runs_of_one_seed_on_a_mounted_image_are_the_same_and_reach_their_fill(
    profile: str, tmp_path: Path, fsage_env: dict[str, str]
) -> None:
    """The generator steers a mounted ext4 by its model: two whole runs (churn, then the
    settle onto the fill target) make the same ops, and the kernel finds the fill met
    (database: holes punched and written again, which the model must count)."""
    extra: list[str] = []
    if profile == "agrawal":
        profile = str(_agrawal(tmp_path))
        extra = ["--data", "fallocate"]
    churn = "1" if profile == "database" else "3"
    args = ["--profile", profile, "--seed", "9", "--fill", "0.5", "--churn", churn, "--mount"]
    images = _image_targets(tmp_path)
    first, second = next(images), next(images)
    _finish(_age(first, [*args, *extra]), fsage_env)
    _finish(_age(second, [*args, *extra]), fsage_env)
    assert _ops(first) == _ops(second)
    for img in (first, second):
        full = _fullness(img, tmp_path / "mnt")
        assert abs(full - 0.5) <= 0.005, full
        fsck_clean(img)
