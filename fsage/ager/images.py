"""Test images: make an ext4, xfs or btrfs image and loop-mount it in a temporary directory.

Loop mounting needs root and ``/dev/loop-control``; ``can_loop_mount`` says whether this
machine has both. The context managers unmount and clean up on every exit path (exceptions and
Ctrl-C included), so tests, the demo and ``fsage age`` can use them freely.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from fsage.errors import FsageError, SourceError, UnsafeTargetError
from fsage.mounttable import _OWN_MOUNT, _loops, _mounts, _owner, _pid_named, process_alive

FS_KINDS = ("ext4", "ext3", "ext2", "xfs", "btrfs")
#: Smallest image mkfs accepts for each kind (bytes).
MIN_SIZE = {"ext4": 4 << 20, "ext3": 4 << 20, "ext2": 1 << 20, "xfs": 300 << 20, "btrfs": 128 << 20}


def can_loop_mount() -> bool:
    """Root, loop devices and a mount binary: what kernel aging of an image needs."""
    return (
        hasattr(os, "geteuid")
        and os.geteuid() == 0
        and os.path.exists("/dev/loop-control")
        and shutil.which("mount") is not None
    )


def run_tool(argv: list[str], what: str) -> None:
    """Run an external tool (mke2fs, mount...); its last line of complaint becomes the error."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise FsageError(f"{what}: cannot run {argv[0]}: {exc.strerror}") from None
    if proc.returncode != 0:
        msg = [ln for ln in (proc.stderr or proc.stdout).strip().splitlines() if ln.strip()]
        raise FsageError(f"{what}: {argv[0]} failed: {msg[-1] if msg else proc.returncode}")


def make_image(
    path: Path, kind: str, size: int, *, label: str = "fsage", inodes: int | None = None
) -> Path:
    """Create (or replace) ``path`` as a sparse image holding an empty ``kind`` file system
    (``inodes``: an ext file system's inode count, mkfs -N; others allocate theirs as needed)."""
    if kind not in FS_KINDS:
        raise FsageError(f"unknown file system kind {kind!r} (one of {', '.join(FS_KINDS)})")
    if size < MIN_SIZE[kind]:
        raise FsageError(f"{kind} needs an image of at least {MIN_SIZE[kind] >> 20} MiB")
    path = Path(path)
    with open(path, "wb") as fh:
        fh.truncate(size)
    if kind.startswith("ext"):
        argv = [f"mkfs.{kind}", "-F", "-q", "-b", "4096", "-L", label[:16], str(path)]
        if inodes is not None:
            argv[-1:-1] = ["-N", str(inodes)]
    elif kind == "xfs":
        argv = ["mkfs.xfs", "-f", "-q", "-L", label[:12], str(path)]
    else:
        argv = ["mkfs.btrfs", "-f", "-q", "-L", label, str(path)]
    run_tool(argv, f"making {kind} image {path}")
    return path


def image_kind(path: Path) -> str | None:
    """'ext', 'xfs', 'btrfs' or 'lfs' from the image's magic numbers, else None."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(0x10048)
    except OSError as exc:
        raise SourceError(f"cannot read {path}: {exc.strerror}") from None
    if len(head) >= 1082 and head[1080:1082] == b"\x53\xef":
        return "ext"
    if head[:4] == b"XFSB":
        return "xfs"
    if head[0x10040:0x10048] == b"_BHRfS_M":
        return "btrfs"
    try:
        from fsage.lfs.executor import is_lfs_image  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None
    return "lfs" if is_lfs_image(path) else None


def mount(image: Path, mountpoint: Path, *, options: str = "") -> None:
    opts = "loop" + (f",{options}" if options else "")
    run_tool(["mount", "-o", opts, str(image), str(mountpoint)], f"mounting {image}")


def umount(mountpoint: Path) -> None:
    """Unmount, retrying while busy, and lazily as a last resort (never leave a mount behind)."""
    for attempt in range(10):
        proc = subprocess.run(["umount", str(mountpoint)], capture_output=True, check=False)
        if proc.returncode == 0 or not os.path.ismount(mountpoint):
            return
        time.sleep(0.1 * (attempt + 1))
    subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True, check=False)


# ---------------------------------------------------------------------------- stale mounts
#
# A run killed with SIGKILL leaves its loop mount behind. Mounting the image again then goes
# wrong either way: ``mount -o loop`` reuses the loop device and shares the stale mount's
# superblock (the run goes on under a mount nobody will unmount), and a second loop device
# (``losetup --find``, as a replay does) gives a second ext4 instance over the same blocks,
# each overwriting the other's metadata (files written through the first mount are lost
# without a trace that e2fsck sees). So a run clears fsage's own stale mounts of its image
# first. Mount points carry the pid of the process that made them, which tells a killed
# run's mount from a live one's (read with the loop devices and the mount table in
# ``fsage.mounttable``, which the image lock reads too).


def mount_dir(use: str) -> Path:
    """A fresh temporary mount point for ``use`` (age, replay, mnt, match, unpack, bench,
    scan), named with this process's id so that a later run can tell whether the process that
    mounted it is still alive. The empty mount points of processes that are gone (killed, or
    ended by a signal that skipped their clean-up) are removed first."""
    sweep_dead_mount_dirs()
    return Path(tempfile.mkdtemp(prefix=f"fsage-{use}-{os.getpid()}-"))


def sweep_dead_mount_dirs(tmp: Path | None = None) -> list[Path]:
    """Remove fsage's temporary mount points whose process is gone and that nothing is mounted
    on any more (a mounted one is clear_stale_mounts' to unmount first); a directory that holds
    anything stays. Returns those removed."""
    tmp = Path(tempfile.gettempdir()) if tmp is None else tmp
    removed: list[Path] = []
    try:
        entries = list(os.scandir(tmp))
    except OSError:
        return removed
    for entry in entries:
        m = _OWN_MOUNT.fullmatch(entry.name)
        if m is None or m[1] is None or int(m[1]) == os.getpid() or process_alive(int(m[1])):
            continue
        with contextlib.suppress(OSError):
            if entry.is_dir(follow_symlinks=False) and not os.path.ismount(entry.path):
                os.rmdir(entry.path)  # only if empty: never a file of anyone's
                removed.append(Path(entry.path))
    return removed


def clear_stale_mounts(image: Path, say: Callable[[str], None] | None = None) -> list[str]:
    """Unmount and detach what killed fsage runs left mounted from ``image`` (and any mount of
    fsage's whose process is gone); refuse when ``image`` is mounted by a live fsage run or by
    something else. Returns the one-line notices (also given to ``say``)."""
    real = os.path.realpath(image)
    mounts = _mounts()
    notices: list[str] = []
    for loop in _loops():
        deleted = loop.backing.endswith(" (deleted)")
        this_image = loop.backing.removesuffix(" (deleted)") == real
        points = mounts.get(loop.devno, [])
        owners = {mp: _owner(mp) for mp in points}
        if this_image and not deleted:
            for mp, who in owners.items():
                if who is True:
                    raise UnsafeTargetError(
                        f"{image} is mounted on {mp} ({loop.dev}), not by fsage; unmount it first"
                    )
                if who is not False:
                    raise UnsafeTargetError(
                        f"{image} is mounted on {mp} ({loop.dev}) by fsage process {who}, "
                        "which is still running"
                    )
        stale = [mp for mp, who in owners.items() if who is False]
        if not this_image:  # another image's: only mounts whose dead process is named
            stale = [mp for mp in stale if _pid_named(mp)]
        leftover = this_image and not points and not loop.autoclear  # attached, never mounted
        if not stale and not leftover:
            continue
        if os.geteuid() != 0:
            if not this_image:
                continue
            raise UnsafeTargetError(
                f"{image}: {', '.join(stale) or loop.dev} ({loop.dev}) was left by a killed "
                "fsage run; unmounting it needs root"
            )
        for mp in stale:
            umount(Path(mp))
            with contextlib.suppress(OSError):
                os.rmdir(mp)
        done = [f"unmounted {', '.join(stale)}"] if stale else []
        if len(stale) == len(points):
            if not loop.autoclear:  # the kernel detaches the others at their unmount
                subprocess.run(["losetup", "-d", loop.dev], capture_output=True, check=False)
            done.append(f"detached {loop.dev}")
        notices.append(
            f"{' and '.join(done)} ({loop.backing}): left behind by an fsage run that was killed"
        )
    for n in notices:
        if say is not None:
            say(n)
    return notices


@contextlib.contextmanager
def loop_mount(image: Path, *, options: str = "") -> Iterator[Path]:
    """Loop-mount ``image`` on a fresh temporary directory; unmount and remove it on exit."""
    if not can_loop_mount():
        raise FsageError("loop mounting needs root and /dev/loop-control")
    clear_stale_mounts(image)
    mnt = mount_dir("mnt")
    mounted = False
    try:
        mount(image, mnt, options=options)
        mounted = True
        yield mnt
    finally:
        if mounted:
            os.sync()
            umount(mnt)
        with contextlib.suppress(OSError):
            mnt.rmdir()
        # An aging of the mount point keeps its record and journal beside it; with the mount
        # point gone they name nothing and could never be resumed.
        for orphan in mnt.parent.glob(f"{mnt.name}.fsage-age*"):
            with contextlib.suppress(OSError):
                orphan.unlink()


@contextlib.contextmanager
def test_fs(kind: str, size: int, *, workdir: Path | None = None) -> Iterator[tuple[Path, Path]]:
    """A fresh ``kind`` image of ``size`` bytes, loop-mounted: yields (image, mountpoint).
    Everything (mount, image, temporary directory) is gone after the block."""
    tmp = Path(tempfile.mkdtemp(prefix="fsage-img-", dir=workdir))
    try:
        image = make_image(tmp / f"{kind}.img", kind, size)
        with loop_mount(image) as mnt:
            yield image, mnt
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


test_fs.__test__ = False  # type: ignore[attr-defined]  # not a pytest test
