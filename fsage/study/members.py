"""One file system of a study: its image, how a step's ops reach it, how it is mounted.

Kernel file systems are images on loop devices, aged by ``fsage age --ops`` (the ager mounts
and unmounts them, journals every op and resumes a killed step). The LFS is fsage's own image
served through FUSE by a ``fsage lfs mount`` process, aged through that mount point: the ops
reach it as they reach any kernel file system, through system calls.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from fsage.errors import FsageError

Say = Callable[[str], None]
IMAGES = "images"
MOUNTS = "mnt"
#: Seconds a FUSE mount may take to come up or go away.
FUSE_WAIT_S = 30.0


def _package_root() -> Path:
    import fsage

    return Path(fsage.__file__).resolve().parent.parent


def _ismount(path: Path) -> bool | None:
    """Mounted, not mounted, or None: a FUSE mount whose server died."""
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno in (errno.ENOTCONN, errno.ECONNABORTED):
            return None
        return False
    return os.path.ismount(path)


class Member:
    """A study's file system ``kind``; its images live in ``out/images``."""

    def __init__(self, out: Path, kind: str, size: int, inodes: int | None = None) -> None:
        self.out = out
        self.kind = kind
        self.size = size
        self.inodes = inodes if kind.startswith("ext") else None  # mkfs -N
        self.image = out / IMAGES / f"{kind}.img"
        self.clean_image = out / IMAGES / f"{kind}.clean.img"

    def make(self, path: Path | None = None) -> None:
        """An empty file system of the study's size (the aged one, or ``path``)."""
        from fsage.ager.images import make_image

        target = path or self.image
        target.parent.mkdir(parents=True, exist_ok=True)
        make_image(target, self.kind, self.size, label="fsage-study", inodes=self.inodes)

    def age_target(self) -> Path:
        """What ``fsage age`` is given: the image, or the directory the ops run in."""
        return self.image

    @contextlib.contextmanager
    def aging(self) -> Iterator[Path]:
        yield self.image

    @contextlib.contextmanager
    def mounted(
        self, image: Path | None = None, *, readonly: bool = True, env: dict[str, str] | None = None
    ) -> Iterator[Path]:
        """A loop mount of ``image`` (``env`` is for a FUSE server: unused here)."""
        from fsage.ager.images import loop_mount

        with loop_mount(image or self.image, options="ro" if readonly else "") as mnt:
            yield mnt

    def scan_target(self, image: Path, mnt: Path | None) -> Path:
        """What the scan suite reads: the image (kernel) or its mount point (LFS)."""
        return image

    def record_path(self) -> Path:
        from fsage.ager.posix import record_path_for

        return record_path_for(Path(os.path.realpath(self.age_target())))

    def cleanup(self) -> None:
        """Leave nothing mounted (after a killed run)."""


class LfsMember(Member):
    """fsage's LFS, served through FUSE by a child ``fsage lfs mount`` process."""

    def __init__(self, out: Path, kind: str, size: int, inodes: int | None = None) -> None:
        super().__init__(out, kind, size, inodes)
        self.mountpoint = out / MOUNTS / "lfs"
        self.clean_mountpoint = out / MOUNTS / "lfs-clean"

    def make(self, path: Path | None = None) -> None:
        from fsage.lfs.fs import mkfs

        target = path or self.image
        target.parent.mkdir(parents=True, exist_ok=True)
        target.unlink(missing_ok=True)
        mkfs(target, size=self.size)

    def age_target(self) -> Path:
        return self.mountpoint

    @contextlib.contextmanager
    def aging(self) -> Iterator[Path]:
        with self.mounted(readonly=False) as mnt:
            yield mnt

    @contextlib.contextmanager
    def mounted(
        self, image: Path | None = None, *, readonly: bool = True, env: dict[str, str] | None = None
    ) -> Iterator[Path]:
        """``env``: more of the server's environment (its trace file, its control socket)."""
        image = image or self.image
        mnt = self.mountpoint if image == self.image else self.clean_mountpoint
        _fuse_unmount(mnt)  # a killed study's
        mnt.mkdir(parents=True, exist_ok=True)
        extra = ["-o", "ro"] if readonly else []
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "fsage",
                "lfs",
                "mount",
                str(image),
                str(mnt),
                "--foreground",
                *extra,
            ],
            cwd=_package_root(),
            env={**os.environ, **(env or {})},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            deadline = time.monotonic() + FUSE_WAIT_S
            while _ismount(mnt) is not True:
                if proc.poll() is not None:
                    err = (proc.stderr.read() if proc.stderr else b"").decode().strip()
                    last = err.splitlines()[-1] if err else f"exit {proc.returncode}"
                    raise FsageError(f"mounting {image} through FUSE: {last}")
                if time.monotonic() > deadline:
                    raise FsageError(f"mounting {image} through FUSE: no mount after 30 s")
                time.sleep(0.05)
            yield mnt
        finally:
            os.sync()
            _fuse_unmount(mnt)
            try:
                proc.wait(timeout=FUSE_WAIT_S)
            except subprocess.TimeoutExpired:
                proc.terminate()
                proc.wait()

    def scan_target(self, image: Path, mnt: Path | None) -> Path:
        assert mnt is not None
        return mnt

    def cleanup(self) -> None:
        for mnt in (self.mountpoint, self.clean_mountpoint):
            _fuse_unmount(mnt)


def _fuse_unmount(mnt: Path) -> None:
    state = _ismount(mnt)
    if state is False:
        return
    deadline = time.monotonic() + FUSE_WAIT_S
    while _ismount(mnt) is not False and time.monotonic() < deadline:
        proc = subprocess.run(["fusermount3", "-u", str(mnt)], capture_output=True, check=False)
        if proc.returncode != 0:
            time.sleep(0.1)
    if _ismount(mnt) is not False:
        subprocess.run(["fusermount3", "-uz", str(mnt)], capture_output=True, check=False)


def member(out: Path, kind: str, size: int, inodes: int | None = None) -> Member:
    return LfsMember(out, kind, size) if kind == "lfs" else Member(out, kind, size, inodes)


def age_record(m: Member) -> dict[str, Any] | None:
    """The ager's record of the last step run on ``m`` (None: none yet)."""
    try:
        data = json.loads(m.record_path().read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def release_images(out: Path, say: Say) -> None:
    """Unmount and detach every loop device of this study's images: a killed study leaves
    its scan's read-only loop devices behind, and a second loop device over an image being
    aged would be a second file system over the same blocks."""
    images = out.resolve() / IMAGES
    proc = subprocess.run(["losetup", "-J", "-l"], capture_output=True, text=True, check=False)
    if proc.returncode != 0 or not proc.stdout.strip():
        return
    try:
        loops = json.loads(proc.stdout).get("loopdevices", [])
    except ValueError:
        return
    mine = {
        str(lo["name"])
        for lo in loops
        if Path(str(lo.get("back-file") or "").removesuffix(" (deleted)")).parent == images
    }
    if not mine:
        return
    from fsage.ager.images import umount

    with open("/proc/self/mounts") as fh:
        mounts = [line.split()[:2] for line in fh]
    for dev, mnt in mounts:
        if dev in mine:
            umount(Path(mnt.replace("\\040", " ")))
            say(f"fsage: unmounted {mnt}, left behind by a killed study")
    for dev in sorted(mine):
        subprocess.run(["losetup", "-d", dev], capture_output=True, check=False)
