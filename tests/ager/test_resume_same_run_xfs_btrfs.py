"""A generated run on a loop-mounted xfs or btrfs image is steered by the generator's model of
the file system (``fsage.ager.genmodel``), the kernel's statvfs only anchoring it: two whole
runs of one seed on fresh images make the same ops, and a run killed with SIGKILL and resumed
makes, op for op, the journal of the run that was never stopped. The images are then clean by
the file system's own checker (xfs_repair -n, btrfs check)."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from fsage.ager.images import clear_stale_mounts, make_image
from tests.ager.test_resume_same_run import _age, _compare, _finish, _ops
from tests.conftest import require_tools

MIB = 1 << 20
pytestmark = [pytest.mark.needs_root, pytest.mark.slow]

#: mkfs, its checker and the image size (xfs refuses less than 300 MiB).
KINDS = {
    "xfs": (["mkfs.xfs", "xfs_repair"], 320 * MIB),
    "btrfs": (["mkfs.btrfs", "btrfs"], 256 * MIB),
}


def _images(tmp: Path, kind: str) -> Iterator[Path]:
    """Fresh images, each made by its own mkfs: two copies of one would share a UUID, which
    neither kernel takes mounted twice (and btrfs remembers by it across mounts)."""
    tools, size = KINDS[kind]
    require_tools(*tools)
    for name in ("whole", "stopped"):
        yield make_image(tmp / f"{kind}-{name}.img", kind, size)


def _checked_clean(image: Path, kind: str) -> None:
    argv = ["xfs_repair", "-n"] if kind == "xfs" else ["btrfs", "check", "--readonly"]
    proc = subprocess.run([*argv, str(image)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _fullness(image: Path, mnt: Path) -> float:
    """The image's fullness as the kernel reports it: statvfs of a read-write mount, as the
    run saw it (xfs sets blocks aside for its per-AG btrees only on one)."""
    mnt.mkdir(exist_ok=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(mnt)], check=True)
    try:
        st = os.statvfs(mnt)
    finally:
        subprocess.run(["umount", str(mnt)], check=True)
    return (st.f_blocks - st.f_bfree) / st.f_blocks


@pytest.mark.parametrize("kind", ["xfs", "btrfs"])
def test_two_runs_of_one_seed_on_a_mounted_image_make_the_same_ops(
    kind: str, tmp_path: Path, fsage_env: dict[str, str]
) -> None:
    """Whole runs: fill, churn (appends, overwrites, truncates, renames), then the settle onto
    the fill target, which the kernel then finds met within the model's error."""
    images = _images(tmp_path, kind)
    first, second = next(images), next(images)
    args = ["--profile", "hfs-surge", "--seed", "9", "--fill", "0.5", "--churn", "0.5", "--mount"]
    _finish(_age(first, args), fsage_env)
    _finish(_age(second, args), fsage_env)
    ops = _ops(first)
    assert b'"overwrite"' in b"".join(ops)  # the churn ran
    assert ops == _ops(second)
    for img in (first, second):
        _checked_clean(img, kind)
        assert abs(_fullness(img, tmp_path / "mnt") - 0.5) <= 0.01


@pytest.mark.parametrize("kind", ["xfs", "btrfs"])
def test_a_killed_run_on_a_mounted_image_resumes_as_the_same_run(
    kind: str, tmp_path: Path, fsage_env: dict[str, str]
) -> None:
    args = ["--profile", "hfs-surge", "--seed", "5", "--fill", "0.5", "--churn", "5"]
    args += ["--ops-limit", "1400", "--mount"]
    stops = [(211, signal.SIGKILL), (844, signal.SIGKILL)]
    try:
        _compare(_images(tmp_path, kind), args, stops, fsage_env)
    finally:  # what a killed run left mounted, when its resume did not clear it
        for img in tmp_path.glob(f"{kind}-*.img"):
            clear_stale_mounts(img)
    for img in sorted(tmp_path.glob(f"{kind}-*.img")):
        # the resume unmounted what the kills left (btrfs: mounted from an anonymous device)
        assert not _mounted_from(img), img
        _checked_clean(img, kind)


def _mounted_from(image: Path) -> list[str]:
    """Mount points of the loop devices backed by ``image``."""
    real = os.path.realpath(image)
    loops = set()
    for sysdir in Path("/sys/block").glob("loop*"):
        try:
            if (sysdir / "loop" / "backing_file").read_text().strip() == real:
                loops.add(f"/dev/{sysdir.name}")
        except OSError:
            continue
    with open("/proc/self/mountinfo") as fh:
        rows = [line.split() for line in fh]
    return [f[4] for f in rows if "-" in f and f[f.index("-") + 2] in loops]
