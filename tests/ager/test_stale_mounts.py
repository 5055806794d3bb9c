"""A run killed with SIGKILL leaves its loop mount behind: the next run on the same image must
clear it (not mount the image a second time beside it), and must refuse an image mounted by
something that is not fsage's, or by an fsage run still going."""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fsage.ager.images import clear_stale_mounts, make_image, mount, umount
from fsage.ager.run import AgeOptions, age
from fsage.errors import UnsafeTargetError
from fsage.workload import Op, WorkloadHeader, write_workload
from tests.ager.helpers import record_written_since, wait_until

MIB = 1 << 20


def loop_devices_of(image: Path, under: bool) -> dict[str, str]:
    """{major:minor: /dev/loopN} of the loop devices backed by ``image`` (or, ``under``, by a
    file below that directory), deleted since or not."""
    real = os.path.realpath(image)
    out = {}
    for sysdir in Path("/sys/block").glob("loop*"):
        try:
            backing = (sysdir / "loop" / "backing_file").read_text().strip()
        except OSError:
            continue
        backing = backing.removesuffix(" (deleted)")
        if backing == real or (under and backing.startswith(real + "/")):
            out[(sysdir / "dev").read_text().strip()] = f"/dev/{sysdir.name}"
    return out


def loops_of(image: Path) -> list[str]:
    return sorted(loop_devices_of(image, False).values())


def mounts_of(image: Path, under: bool = False, ns: int | None = None) -> list[tuple[str, str]]:
    """(loop device, mount point) of every mount of ``image`` through a loop device (in the
    mount namespace of process ``ns``, else this process's)."""
    devs = loop_devices_of(image, under)
    out = []
    for line in Path(f"/proc/{ns or 'self'}/mountinfo").read_text().splitlines():
        f = line.split()
        if f[2] in devs:
            out.append((devs[f[2]], f[4]))
    return out


def kill_when_mounted(
    cmd: list[str],
    env: dict[str, str],
    image: Path,
    prefix: str,
    under: bool = False,
    pause: float = 0.3,
    ready: Callable[[float], bool] | None = None,
    ns: int | None = None,
) -> str:
    """Start ``cmd``, SIGKILL it once it has mounted ``image`` (or, ``under``, an image below
    that directory) on a ``prefix`` mount point and then, given ``ready``, once
    ``ready(start time)`` holds (else after ``pause`` s); the mount point it left. A run that
    unmounts at the end of each interval may be caught between two: then it left no mount,
    and a new run is started (up to five). ``ns``: ``cmd`` runs in the mount namespace of that
    process (see ``private_mounts``)."""

    def ours() -> list[str]:
        found = mounts_of(image, under, ns)
        return [m for _, m in found if os.path.basename(m).startswith(prefix)]

    if ns is not None:
        cmd = in_namespace(ns, cmd)

    before = set(ours())
    for _ in range(5):
        since = time.time()
        proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
        )
        try:
            wait_until(lambda: bool(set(ours()) - before), proc, "it mounted the image")
            if ready is not None:
                wait_until(functools.partial(ready, since), proc, "it was ready to be killed")
            else:
                time.sleep(pause)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.communicate()
            # A mount or umount the run had started goes on without it: what the run left is
            # known once they are done.
            while _in_session(proc.pid):
                time.sleep(0.005)
        assert proc.returncode == -signal.SIGKILL
        left = set(ours()) - before
        assert len(left) <= 1, left
        if left:
            return left.pop()
    raise AssertionError("every run was killed between two of its mounts")


@contextlib.contextmanager
def private_mounts() -> Iterator[int]:
    """A mount namespace of the test's own, held by a process whose pid is yielded: fsage runs
    elsewhere on the machine clear the mounts of any dead fsage process they see, and would
    clear a mount a test leaves behind on purpose before the run it tests gets to it."""
    own = os.readlink("/proc/self/ns/mnt")
    holder = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sleep", "1d"])
    try:
        wait_until(lambda: _namespace(holder.pid) not in ("", own), holder, "it unshared")
        yield holder.pid
    finally:
        holder.kill()  # its namespace, and what is mounted there, go with it
        holder.wait()


def _namespace(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return ""


def in_namespace(ns: int, cmd: list[str]) -> list[str]:
    """``cmd`` run in the mount namespace of process ``ns`` (nsenter execs it: same pid)."""
    return ["nsenter", "-t", str(ns), "-m", *cmd]


def _in_session(sid: int) -> bool:
    """True while a process of session ``sid`` runs (a killed run's mount or umount)."""
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat_file.read_text().rpartition(")")[2].split()
        except OSError:
            continue  # gone meanwhile
        if int(fields[3]) == sid and fields[0] != "Z":
            return True
    return False


def _slow_ops(path: Path, count: int) -> Path:
    ops = [Op("mkdir", "d")]
    ops += [Op("create", f"d/f{i}", size=64 << 10) for i in range(count)]
    write_workload(path, WorkloadHeader("test"), iter(ops))
    return path


@pytest.mark.needs_root
@pytest.mark.slow
def test_resume_after_a_kill_clears_the_stale_mount(
    tmp_path: Path, fsage_env: dict[str, str]
) -> None:
    image = make_image(tmp_path / "a.img", "ext4", 96 * MIB)
    ops = _slow_ops(tmp_path / "ops.jsonl", 1200)
    base = [sys.executable, "-m", "fsage", "age", str(image)]
    # The runs' mount points, where no other fsage run sweeps: one that removes a dead fsage
    # process's mount point in /tmp unmounts what is mounted on it in every namespace.
    env = {**fsage_env, "TMPDIR": str(tmp_path)}
    try:
        with private_mounts() as ns:
            # killed once it runs ops (its record written): then there is a run to resume
            left = kill_when_mounted(
                [*base, "--ops", str(ops), "--fsync"],
                env,
                image,
                "fsage-age-",
                ready=lambda since: record_written_since(image, since),
                ns=ns,
            )
            done = subprocess.run(
                in_namespace(ns, [*base, "--resume"]), env=env, capture_output=True, text=True
            )
            assert done.returncode == 0, done.stderr
            assert "left behind by an fsage run that was killed" in done.stderr, done.stderr
            assert left in done.stderr
            # nothing of either run is left: no mount, no loop device, no mount point
            assert mounts_of(image, ns=ns) == [] and loops_of(image) == []
            assert not os.path.exists(left)
        fsck = subprocess.run(["e2fsck", "-fn", str(image)], capture_output=True, text=True)
        assert fsck.returncode == 0, fsck.stdout
    finally:
        for dev in loop_devices_of(image, False).values():
            subprocess.run(["losetup", "-d", dev], check=False)


@pytest.mark.needs_root
def test_an_image_mounted_by_something_else_is_refused(tmp_path: Path) -> None:
    image = make_image(tmp_path / "a.img", "ext4", 16 * MIB)
    ops = _slow_ops(tmp_path / "ops.jsonl", 3)
    for name in ("theirs", f"fsage-age-{os.getpid()}-live"):  # not fsage's; a live run's
        mnt = tmp_path / name
        mnt.mkdir()
        mount(image, mnt)
        try:
            with pytest.raises(UnsafeTargetError, match=f"mounted on {mnt}"):
                age(image, AgeOptions(ops_file=ops))
            with pytest.raises(
                UnsafeTargetError, match="still running" if "fsage" in name else "not by fsage"
            ):
                clear_stale_mounts(image)
            assert [m for _, m in mounts_of(image)] == [str(mnt)]  # left alone
        finally:
            umount(mnt)
    assert loops_of(image) == []


@pytest.mark.parametrize("use", ["age", "replay", "mnt", "match", "unpack", "bench"])
def test_every_fsage_mount_point_names_its_process(use: str) -> None:
    """Every command that loop-mounts an image names its mount point with its pid, so that a
    later run can clear it once that process is gone and refuse it while it runs."""
    from fsage.ager.images import _owner, mount_dir

    mnt = mount_dir(use)
    try:
        assert _owner(str(mnt)) == os.getpid()
        dead = str(mnt).replace(f"-{os.getpid()}-", "-999999999-")
        assert _owner(dead) is False
    finally:
        mnt.rmdir()
    assert _owner("/tmp/theirs") is True
