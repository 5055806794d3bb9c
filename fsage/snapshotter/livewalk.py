"""The live reader's first half, without numpy: which tree to read, and the C walk itself.

``fsage snapshot DIR`` starts the walk here, on a thread of its own, before it imports numpy,
the store and the rest of the command (a tenth of a second or more of CPU, on a process that
starts from nothing): the walk's threads release the GIL, so the two overlap.
:func:`start_background_walk` starts it; ``read_live_layout`` (``fsage.snapshotter.live``)
takes it over when it is asked for the same tree with the same settings, and otherwise walks
as usual. This module therefore imports only the standard library and ``fsage._live``.

Also here: /proc/self/mountinfo, the file system types the live reader refuses, and the checks
``read_live_layout`` makes before it walks (:func:`scope_of`).

What runs before the walk starts runs alone on a process that has just started, so this module
imports only what the walk needs (os, stat, threading): no dataclasses (which imports
inspect), pathlib, re or typing at run time, a tenth of the start-up's CPU on a plain
interpreter.
"""

from __future__ import annotations

import os
import stat
import threading
import time

from fsage.errors import SourceError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

__all__ = [
    "LFS_FSTYPE",
    "PSEUDO_FS_TYPES",
    "BackgroundWalk",
    "CWalk",
    "MountInfo",
    "WalkScope",
    "background_walk_started",
    "c_walker_available",
    "find_mount",
    "forget_background_walks",
    "is_pseudo_fs",
    "read_mountinfo",
    "run_c_walk",
    "scope_of",
    "start_background_walk",
    "take_background_walk",
]

#: The file system type of a mount made by ``fsage lfs mount`` (/proc/self/mountinfo).
LFS_FSTYPE = "fuse.fsage-lfs"

# Used when /proc/filesystems cannot be read; normally every "nodev" type there is refused.
PSEUDO_FS_TYPES = frozenset(
    {
        "proc",
        "sysfs",
        "tmpfs",
        "ramfs",
        "devtmpfs",
        "devpts",
        "cgroup",
        "cgroup2",
        "overlay",
        "securityfs",
        "debugfs",
        "tracefs",
        "pstore",
        "bpf",
        "mqueue",
        "hugetlbfs",
        "configfs",
        "fusectl",
        "autofs",
        "binfmt_misc",
        "efivarfs",
        "nsfs",
        "rpc_pipefs",
        "sockfs",
        "pipefs",
        "fuse",
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "9p",
        "virtiofs",
        "zfs",
    }
)


class MountInfo:
    """One line of /proc/self/mountinfo (paths as bytes, octal escapes undone)."""

    __slots__ = (
        "fstype", "major", "minor", "mount_point", "options", "root", "source", "super_options",
    )  # fmt: skip

    def __init__(
        self,
        mount_point: bytes,
        root: bytes,  # the directory of the file system mounted here ("/" unless a bind mount)
        fstype: str,
        source: str,
        options: str,
        super_options: str,
        major: int,
        minor: int,
    ) -> None:
        self.mount_point = mount_point
        self.root = root
        self.fstype = fstype
        self.source = source
        self.options = options
        self.super_options = super_options
        self.major = major
        self.minor = minor

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"MountInfo({fields})"


_OCTAL_DIGITS = frozenset(b"01234567")


def _unescape(raw: bytes) -> bytes:
    """Undo mountinfo's octal escapes (``\\040`` for a space)."""
    if b"\\" not in raw:
        return raw
    out = bytearray()
    i = 0
    while i < len(raw):
        digits = raw[i + 1 : i + 4]
        if raw[i] == 0x5C and len(digits) == 3 and all(c in _OCTAL_DIGITS for c in digits):
            out.append(int(digits, 8) & 0xFF)
            i += 4
        else:
            out.append(raw[i])
            i += 1
    return bytes(out)


def read_mountinfo(text: bytes | None = None) -> list[MountInfo]:
    if text is None:
        with open("/proc/self/mountinfo", "rb") as f:
            text = f.read()
    out = []
    for line in text.splitlines():
        parts = line.split(b" ")
        try:
            sep = parts.index(b"-", 6)
            major, minor = (int(x) for x in parts[2].split(b":"))
            out.append(
                MountInfo(
                    mount_point=_unescape(parts[4]),
                    root=_unescape(parts[3]),
                    fstype=parts[sep + 1].decode("utf-8", "replace"),
                    source=_unescape(parts[sep + 2]).decode("utf-8", "surrogateescape"),
                    options=parts[5].decode("utf-8", "replace"),
                    super_options=b" ".join(parts[sep + 3 :]).decode("utf-8", "replace"),
                    major=major,
                    minor=minor,
                )
            )
        except (ValueError, IndexError):
            continue
    return out


def _under(path: bytes, top: bytes) -> bool:
    """True if ``path`` is ``top`` or below it (whole components)."""
    if top == b"/":
        return path.startswith(b"/")
    return path == top or path.startswith(top + b"/")


def find_mount(real: bytes, mounts: list[MountInfo] | None = None) -> MountInfo:
    """The mount that holds the canonical path ``real`` (the last one mounted wins)."""
    mounts = read_mountinfo() if mounts is None else mounts
    best: MountInfo | None = None
    for m in mounts:
        if _under(real, m.mount_point) and (
            best is None or len(m.mount_point) >= len(best.mount_point)
        ):
            best = m
    if best is None:
        raise SourceError(f"{os.fsdecode(real)}: no mount holds this path")
    return best


def _nodev_types() -> set[str] | None:
    try:
        with open("/proc/filesystems", encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    out = set()
    for line in lines:
        parts = line.split()
        if len(parts) == 2 and parts[0] == "nodev":
            out.add(parts[1])
    return out


def is_pseudo_fs(fstype: str) -> bool:
    base = fstype.split(".", 1)[0]  # "fuse.sshfs" -> "fuse"
    nodev = _nodev_types()
    return base in PSEUDO_FS_TYPES or fstype in PSEUDO_FS_TYPES or bool(nodev and base in nodev)


def c_walker_available() -> bool:
    """True if the C walk (fsage._live) is built."""
    try:
        from fsage import _live  # noqa: F401
    except ImportError:
        return False
    return True


class WalkScope:
    """What a walk reads and how: everything ``read_live_layout`` settles before it walks."""

    def __init__(
        self,
        *,
        path: str | os.PathLike[str],  # as given, for messages
        mount: MountInfo,
        real: bytes,  # the canonical path of the directory to read
        sub: bytes,  # real below the mount point ("" or "/a/b")
        dev: int,
        submounts: set[bytes],
        sync: bool,
        batch: int,
        workers: int,
        engine: str,  # "c" or "python"
        progress: Callable[[int], None] | None,
        vfs: os.statvfs_result,
        block_size: int,
        expect: int,  # about how many inodes the walk will meet (sizes the C walk's buffers)
    ) -> None:
        self.path = path
        self.mount = mount
        self.real = real
        self.sub = sub
        self.dev = dev
        self.submounts = submounts
        self.sync = sync
        self.batch = batch
        self.workers = workers
        self.engine = engine
        self.progress = progress
        self.vfs = vfs
        self.block_size = block_size
        self.expect = expect

    @property
    def mount_point(self) -> bytes:
        return self.mount.mount_point

    @property
    def comps(self) -> list[bytes]:
        return [c for c in self.sub.split(b"/") if c]

    def submounts_below(self) -> frozenset[bytes]:
        """The mounts the walk below ``sub`` would meet (and not cross). Mounts elsewhere on
        the file system change nothing it reads: comparing all of them made a walk started
        early useless whenever anything on the machine mounted or unmounted meanwhile."""
        if not self.sub:
            return frozenset(self.submounts)
        return frozenset(m for m in self.submounts if _under(m, self.sub))

    def same_walk(self, other: WalkScope) -> bool:
        """True if a walk of ``other`` reads what a walk of this scope would."""
        mine = (self.mount_point, self.real, self.dev, self.submounts_below(), self.block_size)
        theirs = (
            other.mount_point,
            other.real,
            other.dev,
            other.submounts_below(),
            other.block_size,
        )
        how = (self.sync, self.batch, self.workers, self.engine)
        return mine == theirs and how == (other.sync, other.batch, other.workers, other.engine)


def scope_of(
    path: str | os.PathLike[str],
    *,
    sync: bool = False,
    fiemap_batch: int = 256,
    workers: int = 0,
    progress: Callable[[int], None] | None = None,
    engine: str = "auto",
) -> WalkScope:
    """Check that ``path`` is a directory the live reader can read and settle how (the
    arguments are ``read_live_layout``'s); SourceError otherwise."""
    if engine not in ("auto", "c", "python"):
        raise ValueError(f"unknown live-reader engine {engine!r}")
    if engine == "auto":
        engine = "c" if c_walker_available() else "python"
    elif engine == "c" and not c_walker_available():
        raise SourceError("the live reader's C walk (fsage._live) is not built")
    if workers <= 0:
        workers = min(4, len(os.sched_getaffinity(0))) if engine == "c" else 1
    raw_path = os.fsencode(path)
    try:
        st0 = os.stat(raw_path)
    except OSError as e:
        raise SourceError(f"{path}: {e.strerror}") from None
    if not stat.S_ISDIR(st0.st_mode):
        raise SourceError(f"{path}: not a directory (the live reader reads a mounted tree)")
    if fiemap_batch < 1:
        raise ValueError("fiemap_batch must be at least 1")
    real = os.path.realpath(raw_path)
    mounts = read_mountinfo()
    mount = find_mount(real, mounts)
    if mount.fstype == LFS_FSTYPE:
        raise SourceError(
            f"{path}: is on an fsage LFS mounted through FUSE ({mount.source}); FUSE passes no "
            "FIEMAP, so the live reader cannot map it: `fsage snapshot` of the mount point or "
            "of the image reads the image instead"
        )
    if is_pseudo_fs(mount.fstype):
        raise SourceError(
            f"{path}: is on a {mount.fstype} file system, which has no block layout; "
            "the live reader reads file systems on block devices (ext4, xfs, btrfs, ...)"
        )
    mp = mount.mount_point
    sub = b"" if real == mp else (real[len(mp) :] if mp != b"/" else real)
    submounts = {
        m.mount_point[len(mp) :] if mp != b"/" else m.mount_point
        for m in mounts
        if m.mount_point != mp and _under(m.mount_point, mp)
    }
    vfs = os.statvfs(raw_path)
    block_size = int(vfs.f_frsize or vfs.f_bsize)
    if block_size <= 0:
        raise SourceError(f"{path}: statvfs reports no block size")
    return WalkScope(
        path=path,
        mount=mount,
        real=real,
        sub=sub,
        dev=st0.st_dev,
        submounts=submounts,
        sync=sync,
        batch=fiemap_batch,
        workers=workers,
        engine=engine,
        progress=progress,
        vfs=vfs,
        block_size=block_size,
        expect=max(int(vfs.f_files) - int(vfs.f_ffree), 0),
    )


class CWalk:
    """What fsage._live.walk returned: one result per call (the directories from the mount
    root down to the one asked for, then the walk below it), and the mount root's inode."""

    def __init__(self, results: list[dict[str, Any]], root_ino: int) -> None:
        self.results = results
        self.root_ino = root_ino


def run_c_walk(sc: WalkScope) -> CWalk:
    """The walk in C (fsage._live), on ``sc.workers`` threads without the GIL."""
    from fsage import _live

    subs = sorted(sc.submounts)
    state = {"dir_fiemap": True, "getversion": True}
    results: list[dict[str, Any]] = []

    def call(task: tuple[bytes, int | None], mode: int, threads: int) -> int | None:
        """Walk (or only record) one directory; its inode, None if it could not be opened."""
        res = _live.walk(
            sc.mount_point,
            [task],
            mode=mode,
            dev=sc.dev,
            submounts=subs,
            sync=sc.sync,
            batch=sc.batch,
            dir_fiemap=state["dir_fiemap"],
            getversion=state["getversion"],
            block_size=sc.block_size,
            threads=threads,
            expect=sc.expect if mode == _live.MODE_WALK else 0,
            progress=sc.progress if mode == _live.MODE_WALK else None,
            progress_base=sum(len(r["ino"]) // 8 for r in results),
        )
        state["dir_fiemap"] = state["dir_fiemap"] and bool(res["dir_fiemap"])
        state["getversion"] = state["getversion"] and bool(res["getversion"])
        results.append(res)
        top: int | None = res["top_ino"][0]
        return top

    # The directories from the mount root down to the one asked for, each with its one name.
    parent: int | None = None
    comps = sc.comps
    for i, comp in enumerate([b"", *comps[:-1]] if comps else []):
        relp = b"/" + b"/".join(comps[:i]) if i else b""
        ino = call((relp, parent), _live.MODE_RECORD, 1)
        if ino is None:
            walked = os.path.join(sc.mount_point, relp[1:]) if comp else sc.mount_point
            raise SourceError(f"{sc.path}: cannot open {os.fsdecode(walked)}")
        parent = ino
    top = call((sc.sub, parent), _live.MODE_WALK, min(sc.workers, _live.MAX_THREADS))
    if top is None:
        if not comps:
            raise SourceError(
                f"{sc.path}: cannot open the mount root {os.fsdecode(sc.mount_point)}"
            )
        raise SourceError(f"{sc.path}: cannot open this directory")
    return CWalk(results, int(results[0]["top_ino"][0]))


class BackgroundWalk:
    """The C walk of one scope, running on a thread of its own (a daemon: a process that ends
    before the walk is taken, after an error or ^C, does not wait for it)."""

    def __init__(self, scope: WalkScope) -> None:
        self.scope = scope
        self.started = time.monotonic()
        self._walk: CWalk | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="fsage-walk", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._walk = run_c_walk(self.scope)
        except BaseException as exc:  # handed to the thread that takes the walk
            self._error = exc

    def result(self) -> CWalk:
        """Wait for the walk; its CWalk, or what it raised."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._walk is not None
        return self._walk


_started: list[BackgroundWalk] = []


def start_background_walk(path: str) -> None:
    """Start the C walk of the directory ``path`` with ``read_live_layout``'s defaults and no
    progress, if it can be read (anything else is left to the reader, which then says why);
    not again while a walk of ``path`` started here waits to be taken."""
    if any(walk.scope.path == path for walk in _started):
        return
    try:
        scope = scope_of(path, engine="c")
    except (SourceError, OSError, ValueError):
        return
    _started.append(BackgroundWalk(scope))


def background_walk_started(path: str | os.PathLike[str]) -> float | None:
    """When (time.monotonic()) the walk started for the directory ``path`` began, if one
    waits to be taken: a snapshot's reported seconds then count the read from there."""
    try:
        real = os.path.realpath(os.fsencode(path))
    except (OSError, ValueError):
        return None
    return next((w.started for w in _started if w.scope.real == real), None)


def take_background_walk(scope: WalkScope) -> BackgroundWalk | None:
    """The walk started for what ``scope`` reads, if any; a started walk of something else
    is waited for and dropped."""
    while _started:
        walk = _started.pop()
        if walk.scope.same_walk(scope) and scope.progress is None:
            return walk
        _end_walk(walk)
    return None


def _end_walk(walk: BackgroundWalk) -> None:
    """Wait for a walk nobody will take (so that it does not compete with the walk that
    replaces it) and drop it."""
    try:  # noqa: SIM105 (contextlib is not imported on this path)
        walk.result()
    except Exception:  # nobody asked for this walk, nor for its failure
        pass


def forget_background_walks() -> None:
    """Drop the walks started but not taken (a command that failed, or was interrupted, first)
    without waiting for them: their threads are daemons, and the process is about to end."""
    _started.clear()
