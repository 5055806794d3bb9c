"""Where a benchmark runs: an image (loop-mounted by fsage when root) or a mounted directory.

A :class:`BenchTarget` gives the suites a fresh directory of their own on the target
(``fsage-bench-<suite>-<token>``), a way to start cold (:meth:`BenchTarget.cold`: sync, drop the
page cache and, for an image fsage mounted, unmount and mount it again), layout snapshots read
the same way ``fsage snapshot`` reads the target, and the block device's I/O counters.

Without root, caches cannot be dropped: the target says so in :attr:`BenchTarget.notes` and runs
warm. An image needs root (and loop devices) to be mounted; without them fsage says so and asks for
a mounted directory instead.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fsage.errors import UsageError
from fsage.layout import Layout

DROP_CACHES = Path("/proc/sys/vm/drop_caches")
WARM_NOTE = (
    "not root: the page cache cannot be dropped and the file system cannot be remounted, so "
    "this run is warm (reads may come from memory, not the disk)"
)
BENCH_PREFIX = "fsage-bench-"


def is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def can_drop_caches() -> bool:
    return is_root() and os.access(DROP_CACHES, os.W_OK)


def drop_caches() -> None:
    """``sync; echo 3 > /proc/sys/vm/drop_caches``."""
    os.sync()
    DROP_CACHES.write_text("3\n")


@dataclass
class DiskStats:
    """Counters of /sys/block/<dev>/stat (see the kernel's Documentation/block/stat.rst)."""

    read_ios: int = 0
    read_sectors: int = 0
    read_ms: int = 0
    write_ios: int = 0
    write_sectors: int = 0
    write_ms: int = 0

    def __sub__(self, other: DiskStats) -> DiskStats:
        return DiskStats(*(getattr(self, f) - getattr(other, f) for f in self.__dataclass_fields__))


def _stat_file(path: Path) -> Path | None:
    """The /sys stat file of the block device holding ``path`` (partition or whole disk)."""
    try:
        dev = os.stat(path).st_dev
    except OSError:
        return None
    f = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}/stat")
    return f if f.exists() else None


def read_diskstats(stat_file: Path | None) -> DiskStats | None:
    if stat_file is None:
        return None
    try:
        fields = [int(x) for x in stat_file.read_text().split()]
    except (OSError, ValueError):
        return None
    if len(fields) < 8:
        return None
    return DiskStats(fields[0], fields[2], fields[3], fields[4], fields[6], fields[7])


def read_proc_io() -> dict[str, int]:
    """This process's /proc/self/io counters (rchar, wchar, read_bytes, write_bytes...)."""
    out: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/io").read_text().splitlines():
            key, _, val = line.partition(":")
            with contextlib.suppress(ValueError):
                out[key.strip()] = int(val)
    return out


class BenchTarget:
    """An image or a directory a benchmark runs on; use as a context manager."""

    def __init__(self, path: Path, suite: str) -> None:
        self.path = Path(path)
        self.suite = suite
        self.notes: list[str] = []
        self.image: Path | None = None
        self._tmp_mnt: Path | None = None
        self._mounted = False
        if not self.path.exists():
            raise UsageError(f"{path}: no such file or directory")
        if self.path.is_dir():
            if Path(os.path.realpath(self.path)) == Path("/"):
                raise UsageError("refusing to benchmark '/': give a directory on the file system")
            self.root = self.path
        elif self.path.is_file():
            from fsage.ager.images import can_loop_mount, image_kind, mount_dir

            kind = image_kind(self.path)
            if kind is None:
                raise UsageError(f"{path}: not a directory or a recognised file-system image")
            self.image = Path(os.path.realpath(self.path))
            if can_loop_mount() and kind != "lfs":
                self._tmp_mnt = mount_dir("bench")
                self.root = self._tmp_mnt
            else:
                why = (
                    "an LFS image cannot be mounted by the kernel"
                    if kind == "lfs"
                    else "loop-mounting needs root and /dev/loop-control"
                )
                raise UsageError(
                    f"{path}: cannot run the {suite} suite on this image ({why}); "
                    "give a mounted directory instead"
                )
        else:
            raise UsageError(f"{path}: not a directory or an image file")
        self.cold_possible = can_drop_caches()
        if not self.cold_possible:
            self.notes.append(WARM_NOTE)
        self.token = secrets.token_hex(4)
        self.bench_name = f"{BENCH_PREFIX}{suite}-{self.token}"
        self.bench_dir = self.root / self.bench_name

    # ------------------------------------------------------------------ mount

    def __enter__(self) -> BenchTarget:
        try:
            self._mount()
        except BaseException:
            self._cleanup_mountpoint()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._unmount()
        finally:
            self._cleanup_mountpoint()

    def _mount(self) -> None:
        if self._tmp_mnt is not None and not self._mounted:
            from fsage.ager.images import mount

            assert self.image is not None
            mount(self.image, self._tmp_mnt)
            self._mounted = True

    def _unmount(self) -> None:
        if self._mounted and self._tmp_mnt is not None:
            from fsage.ager.images import umount

            os.sync()
            umount(self._tmp_mnt)
            self._mounted = False

    def _cleanup_mountpoint(self) -> None:
        if self._tmp_mnt is not None and not self._mounted:
            with contextlib.suppress(OSError):
                self._tmp_mnt.rmdir()

    @property
    def description(self) -> str:
        if self.image is not None:
            return f"{self.image} loop-mounted on {self.root}"
        return str(self.root)

    # ------------------------------------------------------------------ cold start

    def cold(self) -> bool:
        """Start cold where possible: sync, remount a mounted image, drop caches.
        Returns whether the caches were really dropped."""
        os.sync()
        if not self.cold_possible:
            return False
        if self._mounted:
            self._unmount()
            self._mount()
        drop_caches()
        return True

    # ------------------------------------------------------------------ layout

    def layout(self) -> Layout:
        """A snapshot of the target as ``fsage snapshot`` reads it: the image itself (unmounted
        for the read) or the directory tree through FIEMAP."""
        from fsage.snapshotter import read_source

        os.sync()
        if self.image is not None:
            was = self._mounted
            self._unmount()
            try:
                return read_source(self.image)
            finally:
                if was:
                    self._mount()
        return read_source(self.root)

    # ------------------------------------------------------------------ files

    def make_bench_dir(self) -> Path:
        self.bench_dir.mkdir()
        return self.bench_dir

    def remove_bench_dir(self) -> None:
        if self.bench_dir.is_symlink():
            self.bench_dir.unlink()
        elif self.bench_dir.exists():
            shutil.rmtree(self.bench_dir, ignore_errors=True)
        os.sync()

    def statvfs(self) -> os.statvfs_result:
        return os.statvfs(self.root)

    def free_bytes(self) -> int:
        st = self.statvfs()
        return int(st.f_bavail) * int(st.f_frsize)

    def utilization(self) -> float:
        st = self.statvfs()
        if st.f_blocks == 0:
            return 0.0
        return 1.0 - st.f_bfree / st.f_blocks

    def diskstats(self) -> DiskStats | None:
        return read_diskstats(_stat_file(self.root))

    def info(self) -> dict[str, Any]:
        return {"target": str(self.path), "via": self.description, "cold": self.cold_possible}
