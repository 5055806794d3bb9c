"""`fsage lfs mount`: the LFS of seed 003 mounted through FUSE (libfuse3, via pyfuse3).

A thin adapter: every FUSE request becomes one call of :class:`fsage.lfs.fs.LFS`'s public,
path-based API (seed 003 §3.7 splits the same work into file, stream, directory and
file-system operations). What the adapter keeps itself:

* **Inode numbers.** FUSE inode numbers are the LFS's own, except that the FUSE root (1) is
  the LFS root (2). For each inode the kernel knows, the adapter remembers one
  (parent, name) pair it was reached by, so a request on an inode turns back into a path.
  Names that the adapter did not see go away (a hard link removed elsewhere) are found again
  by a walk of the tree.
* **Open files that are unlinked** keep their data under a hidden name in the same directory
  (``.fuse_hidden<ino>``, as libfuse's path API does) until their last handle is released.
* **Caching.** The kernel's writeback cache is on: small writes reach the LFS as page-sized
  or larger runs; ``fsync`` makes the kernel write its dirty pages, then the LFS commits
  its buffer to the log and the image file is fdatasync'ed.
* **Unmount.** When the mount goes away (``fusermount3 -u``, SIGINT or SIGTERM to the
  mount process), the LFS is closed: its buffer is written and a checkpoint taken. After
  ``kill -9`` the image holds what was committed (every completed operation reaches the log
  as a committed unit, and ``fsync`` forces it there); the next mount rolls forward from the
  last checkpoint.

The live reader cannot map files on this mount (FUSE passes no FIEMAP); it names the image
to snapshot instead.
"""

from __future__ import annotations

import errno
import logging
import os
import stat as stat_mod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from fsage.errors import FsageError, UsageError
from fsage.lfs.format import INO_ROOT, LfsError, LfsNoSpace
from fsage.lfs.fs import LFS, LfsOpError, Stat

try:
    import pyfuse3
    import trio
except ImportError:  # pragma: no cover - reported by mount()
    pyfuse3 = None  # type: ignore[assignment]
    trio = None  # type: ignore[assignment]

#: The FUSE subtype: mounts show as ``fuse.fsage-lfs`` in /proc/self/mountinfo.
SUBTYPE = "fsage-lfs"
FSTYPE = "fuse." + SUBTYPE
_HIDDEN = ".fuse_hidden"
_TIMEOUT = 1.0  # seconds the kernel may cache entries and attributes
_log = logging.getLogger(__name__)

T = TypeVar("T")

# LfsOpError carries no errno; its messages start with these words.
_ERRNO_BY_MESSAGE = (
    ("no such", errno.ENOENT),
    ("file exists", errno.EEXIST),
    ("directory not empty", errno.ENOTEMPTY),
    ("cannot replace directory", errno.ENOTEMPTY),
    ("cannot replace file", errno.ENOTDIR),
    ("not a directory", errno.ENOTDIR),
    ("is a directory", errno.EISDIR),
    ("name too long", errno.ENAMETOOLONG),
    ("not a regular file", errno.EINVAL),
    ("not a symbolic link", errno.EINVAL),
    ("cannot move", errno.EINVAL),
    ("hard links to directories", errno.EPERM),
    ("inode", errno.ENOENT),
)


class MountError(FsageError):
    """The image cannot be mounted (FUSE missing, mount point unusable, ...)."""


def errno_of(exc: Exception) -> int:
    """The errno a failed LFS call answers the kernel with."""
    if isinstance(exc, LfsNoSpace):
        return errno.ENOSPC
    if isinstance(exc, LfsOpError):
        msg = str(exc).lower()
        for prefix, code in _ERRNO_BY_MESSAGE:
            if msg.startswith(prefix):
                return code
        return errno.EINVAL
    if isinstance(exc, OSError) and exc.errno:
        return exc.errno
    return errno.EIO


def fuse_available() -> str | None:
    """None when this machine can mount through FUSE, else why not."""
    if pyfuse3 is None:
        return "pyfuse3 is not installed (pip install pyfuse3; needs libfuse3)"
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse does not exist"
    if not any(
        os.access(os.path.join(d, "fusermount3"), os.X_OK)
        for d in os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep)
    ):
        return "fusermount3 is not installed (Debian package fuse3)"
    return None


@dataclass
class _Handle:
    ino: int
    writes: int = 0


@dataclass
class _DirHandle:
    ino: int
    entries: list[tuple[str, int]] = field(default_factory=list)


class LfsOperations(pyfuse3.Operations if pyfuse3 is not None else object):  # type: ignore[misc]
    """FUSE requests onto an open :class:`LFS`."""

    supports_dot_lookup = False
    enable_writeback_cache = True

    def __init__(self, fs: LFS) -> None:
        super().__init__()
        self.fs = fs
        self.bs = fs.geo.block_size
        self._name: dict[int, tuple[int, str]] = {}
        self._files: dict[int, _Handle] = {}
        self._dirs: dict[int, _DirHandle] = {}
        self._open: dict[int, int] = {}  # ino -> open handles
        self._hidden: dict[int, str] = {}  # ino -> hidden path of an unlinked open file
        self._next_fh = 1
        self.errors = 0

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def _lfs_ino(ino: int) -> int:
        return INO_ROOT if ino == pyfuse3.ROOT_INODE else ino

    @staticmethod
    def _fuse_ino(ino: int) -> int:
        return pyfuse3.ROOT_INODE if ino == INO_ROOT else ino

    def _call(self, fn: Callable[..., T], *args: object) -> T:
        try:
            return fn(*args)
        except pyfuse3.FUSEError:
            raise
        except (LfsOpError, LfsNoSpace) as exc:
            raise pyfuse3.FUSEError(errno_of(exc)) from None
        except Exception as exc:  # anything else must not end the session
            self.errors += 1
            _log.exception("fsage lfs mount: %s failed", getattr(fn, "__name__", fn))
            raise pyfuse3.FUSEError(errno_of(exc)) from None

    def _path(self, ino: int) -> str:
        ino = self._lfs_ino(ino)
        parts: list[str] = []
        seen = 0
        while ino != INO_ROOT:
            where = self._name.get(ino)
            if where is None:
                where = self._find(ino)
            ino, name = where
            parts.append(name)
            seen += 1
            if seen > 4096:
                raise pyfuse3.FUSEError(errno.ELOOP)
        return "/".join(reversed(parts))

    def _find(self, ino: int) -> tuple[int, str]:
        """A (parent, name) of ``ino`` from a walk of the whole tree (names the adapter lost)."""
        stack = [(INO_ROOT, "")]
        while stack:
            dino, dpath = stack.pop()
            for name, child in self.fs.readdir(dpath):
                cpath = f"{dpath}/{name}" if dpath else name
                if child == ino:
                    self._name[ino] = (dino, name)
                    return dino, name
                if self.fs.is_dir(child):
                    self._name.setdefault(child, (dino, name))
                    stack.append((child, cpath))
        raise pyfuse3.FUSEError(errno.ENOENT)

    def _child(self, parent: int, name: bytes) -> str:
        base = self._path(parent)
        n = os.fsdecode(name)
        return f"{base}/{n}" if base else n

    def _entry(self, st: Stat) -> pyfuse3.EntryAttributes:
        e = pyfuse3.EntryAttributes()
        e.st_ino = self._fuse_ino(st.ino)
        e.generation = st.version
        e.entry_timeout = _TIMEOUT
        e.attr_timeout = _TIMEOUT
        e.st_mode = st.mode
        e.st_nlink = st.nlink
        e.st_uid = st.uid
        e.st_gid = st.gid
        e.st_rdev = 0
        e.st_size = st.size
        e.st_blksize = self.bs
        e.st_blocks = st.blocks * self.bs // 512
        e.st_atime_ns = st.atime_ms * 1_000_000
        e.st_mtime_ns = st.mtime_ms * 1_000_000
        e.st_ctime_ns = st.ctime_ms * 1_000_000
        return e

    def _stat(self, ino: int) -> pyfuse3.EntryAttributes:
        return self._entry(self._call(self.fs.stat_ino, self._lfs_ino(ino)))

    def _new_entry(
        self, parent: int, name: bytes, ino: int, ctx: object
    ) -> pyfuse3.EntryAttributes:
        self._name[ino] = (self._lfs_ino(parent), os.fsdecode(name))
        uid, gid = getattr(ctx, "uid", 0), getattr(ctx, "gid", 0)
        if uid or gid:
            path = self._path(ino)
            return self._entry(self._call(self.fs.setattr, path, None, uid, gid))
        return self._stat(ino)

    def _lookup_ino(self, parent: int, name: bytes) -> int:
        path = self._child(parent, name)
        st = self._call(self.fs.stat, path)
        self._name[st.ino] = (self._lfs_ino(parent), os.fsdecode(name))
        return st.ino

    def _forget_name(self, parent: int, name: str, ino: int) -> None:
        if self._name.get(ino) == (self._lfs_ino(parent), name):
            del self._name[ino]

    # ------------------------------------------------------------------ lookups, attributes
    async def lookup(
        self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        if name in (b".", b".."):
            raise pyfuse3.FUSEError(errno.ENOENT)
        try:
            ino = self._lookup_ino(parent_inode, name)
        except pyfuse3.FUSEError as exc:
            if exc.errno != errno.ENOENT:
                raise
            neg = pyfuse3.EntryAttributes()  # a negative entry the kernel may cache
            neg.st_ino = 0
            neg.entry_timeout = _TIMEOUT
            return neg
        return self._stat(ino)

    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        return self._stat(inode)

    async def setattr(
        self,
        inode: int,
        attr: pyfuse3.EntryAttributes,
        fields: pyfuse3.SetattrFields,
        fh: int | None,
        ctx: pyfuse3.RequestContext,
    ) -> pyfuse3.EntryAttributes:
        path = self._path(inode)
        if fields.update_size:
            self._call(self.fs.truncate, path, attr.st_size)
        mode = attr.st_mode & 0o7777 if fields.update_mode else None
        uid = attr.st_uid if fields.update_uid else None
        gid = attr.st_gid if fields.update_gid else None
        atime = attr.st_atime_ns // 1_000_000 if fields.update_atime else None
        mtime = attr.st_mtime_ns // 1_000_000 if fields.update_mtime else None
        if (mode, uid, gid, atime, mtime) != (None,) * 5:
            return self._entry(self._call(self.fs.setattr, path, mode, uid, gid, atime, mtime))
        return self._stat(inode)

    async def readlink(self, inode: int, ctx: pyfuse3.RequestContext) -> bytes:
        return os.fsencode(self._call(self.fs.readlink, self._path(inode)))

    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        total, live = self._call(self.fs.usage)
        used_inodes = sum(1 for _ in self._call(self.fs.inodes))
        s = pyfuse3.StatvfsData()
        s.f_bsize = s.f_frsize = self.bs
        s.f_blocks = total
        s.f_bfree = s.f_bavail = max(0, total - live)
        s.f_files = max(total, used_inodes)
        s.f_ffree = s.f_favail = s.f_files - used_inodes
        s.f_namemax = 255
        return s

    # ------------------------------------------------------------------ namespace
    async def mknod(
        self, parent_inode: int, name: bytes, mode: int, rdev: int, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        if not stat_mod.S_ISREG(mode):
            raise pyfuse3.FUSEError(errno.EPERM)  # the LFS has files, directories, links
        ino = self._call(self.fs.create, self._child(parent_inode, name), mode & 0o7777)
        return self._new_entry(parent_inode, name, ino, ctx)

    async def mkdir(
        self, parent_inode: int, name: bytes, mode: int, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        ino = self._call(self.fs.mkdir, self._child(parent_inode, name), mode & 0o7777)
        return self._new_entry(parent_inode, name, ino, ctx)

    async def symlink(
        self, parent_inode: int, name: bytes, target: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        path = self._child(parent_inode, name)
        ino = self._call(self.fs.symlink, os.fsdecode(target), path)
        return self._new_entry(parent_inode, name, ino, ctx)

    async def link(
        self, inode: int, new_parent_inode: int, new_name: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        src = self._path(inode)
        self._call(self.fs.link, src, self._child(new_parent_inode, new_name))
        return self._stat(inode)

    async def unlink(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        path = self._child(parent_inode, name)
        st = self._call(self.fs.stat, path)
        sname = os.fsdecode(name)
        if self._open.get(st.ino) and st.nlink == 1 and st.ino not in self._hidden:
            base = self._path(parent_inode)
            hidden = f"{_HIDDEN}{st.ino:08x}"
            self._call(self.fs.rename, path, f"{base}/{hidden}" if base else hidden)
            self._hidden[st.ino] = f"{base}/{hidden}" if base else hidden
            self._name[st.ino] = (self._lfs_ino(parent_inode), hidden)
            return
        self._call(self.fs.unlink, path)
        self._forget_name(parent_inode, sname, st.ino)

    async def rmdir(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        path = self._child(parent_inode, name)
        st = self._call(self.fs.stat, path)
        if not stat_mod.S_ISDIR(st.mode):
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        self._call(self.fs.rmdir, path)
        self._forget_name(parent_inode, os.fsdecode(name), st.ino)

    async def rename(
        self,
        parent_inode_old: int,
        name_old: bytes,
        parent_inode_new: int,
        name_new: bytes,
        flags: int,
        ctx: pyfuse3.RequestContext,
    ) -> None:
        if flags & pyfuse3.RENAME_EXCHANGE:
            raise pyfuse3.FUSEError(errno.EINVAL)
        src = self._child(parent_inode_old, name_old)
        dst = self._child(parent_inode_new, name_new)
        st = self._call(self.fs.stat, src)
        victim: Stat | None = None
        try:
            victim = self.fs.stat(dst)
        except LfsOpError:
            victim = None
        if victim is not None:
            if flags & pyfuse3.RENAME_NOREPLACE:
                raise pyfuse3.FUSEError(errno.EEXIST)
            if victim.ino == st.ino:
                return  # two names of one inode: POSIX says do nothing
            if stat_mod.S_ISDIR(victim.mode) and not stat_mod.S_ISDIR(st.mode):
                raise pyfuse3.FUSEError(errno.EISDIR)
            if stat_mod.S_ISDIR(st.mode) and not stat_mod.S_ISDIR(victim.mode):
                raise pyfuse3.FUSEError(errno.ENOTDIR)
            if self._open.get(victim.ino) and victim.nlink == 1:
                await self.unlink(parent_inode_new, name_new, ctx)  # kept while open
        self._call(self.fs.rename, src, dst)
        if victim is not None:
            self._forget_name(parent_inode_new, os.fsdecode(name_new), victim.ino)
        self._name[st.ino] = (self._lfs_ino(parent_inode_new), os.fsdecode(name_new))

    # ------------------------------------------------------------------ files
    def _new_fh(self, ino: int) -> int:
        fh = self._next_fh
        self._next_fh += 1
        self._files[fh] = _Handle(ino)
        self._open[ino] = self._open.get(ino, 0) + 1
        return fh

    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        ino = self._lfs_ino(inode)
        if flags & os.O_TRUNC:
            self._call(self.fs.truncate, self._path(inode), 0)
        return pyfuse3.FileInfo(fh=self._new_fh(ino), keep_cache=True)

    async def create(
        self,
        parent_inode: int,
        name: bytes,
        mode: int,
        flags: int,
        ctx: pyfuse3.RequestContext,
    ) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        ino = self._call(self.fs.create, self._child(parent_inode, name), mode & 0o7777)
        entry = self._new_entry(parent_inode, name, ino, ctx)
        return pyfuse3.FileInfo(fh=self._new_fh(ino), keep_cache=True), entry

    def _handle(self, fh: int) -> _Handle:
        h = self._files.get(fh)
        if h is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        return h

    async def read(self, fh: int, off: int, size: int) -> bytes:
        h = self._handle(fh)
        return self._call(self.fs.read, self._path(h.ino), off, size)

    async def write(self, fh: int, off: int, buf: bytes) -> int:
        h = self._handle(fh)
        h.writes += 1
        return self._call(self.fs.write, self._path(h.ino), off, buf)

    async def flush(self, fh: int) -> None:
        self._handle(fh)

    async def fsync(self, fh: int, datasync: bool) -> None:
        self._handle(fh)
        self._sync()

    def _sync(self) -> None:
        self._call(self.fs.sync)
        self._call(os.fdatasync, self.fs.fd)

    async def release(self, fh: int) -> None:
        h = self._files.pop(fh, None)
        if h is None:
            return
        left = self._open.get(h.ino, 1) - 1
        if left > 0:
            self._open[h.ino] = left
            return
        self._open.pop(h.ino, None)
        hidden = self._hidden.pop(h.ino, None)
        if hidden is not None:
            self._call(self.fs.unlink, hidden)
            self._name.pop(h.ino, None)

    # ------------------------------------------------------------------ directories
    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        path = self._path(inode)
        entries = sorted(self._call(self.fs.readdir, path))
        fh = self._next_fh
        self._next_fh += 1
        self._dirs[fh] = _DirHandle(self._lfs_ino(inode), entries)
        return fh

    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        d = self._dirs.get(fh)
        if d is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        for i in range(start_id, len(d.entries)):
            name, ino = d.entries[i]
            try:
                st = self.fs.stat_ino(ino)
            except (LfsOpError, LfsError):
                continue  # removed since opendir
            if not pyfuse3.readdir_reply(token, os.fsencode(name), self._entry(st), i + 1):
                return
            self._name.setdefault(ino, (d.ino, name))

    async def releasedir(self, fh: int) -> None:
        self._dirs.pop(fh, None)

    async def fsyncdir(self, fh: int, datasync: bool) -> None:
        self._sync()


# ---------------------------------------------------------------------------- mount


def _options(image: Path, extra: tuple[str, ...]) -> set[str]:
    opts = set(pyfuse3.default_options)
    opts.add(f"fsname={image}")
    opts.add(f"subtype={SUBTYPE}")
    if os.geteuid() == 0:
        opts.add("allow_other")
    opts.update(extra)
    return opts


async def _serve() -> None:
    import signal

    async with trio.open_nursery() as nursery:

        async def watch() -> None:
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as sigs:
                async for _ in sigs:
                    pyfuse3.terminate()
                    return

        nursery.start_soon(watch)
        await pyfuse3.main(min_tasks=1, max_tasks=1)
        nursery.cancel_scope.cancel()


def _daemonize(ready: Callable[[int], None]) -> None:
    """Fork: the parent reports the child's pid and exits at once, without closing anything
    (the child owns the image and the FUSE session)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid > 0:
        os.close(w)
        status = os.read(r, 1)
        ready(pid)
        os._exit(0 if status == b"1" else 1)
    os.close(r)
    os.setsid()
    os.chdir("/")
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    if devnull > 2:
        os.close(devnull)
    os.write(w, b"1")
    os.close(w)


def mount(
    image: Path,
    mountpoint: Path,
    *,
    foreground: bool = True,
    policy: str | None = None,
    options: tuple[str, ...] = (),
    ready: Callable[[int], None] | None = None,
) -> int:
    """Mount ``image`` on ``mountpoint`` and serve until it is unmounted (``fusermount3 -u``)
    or the process gets SIGINT/SIGTERM/SIGHUP; then close the LFS (write and checkpoint).
    With ``foreground=False`` the process forks once the mount is up: the parent calls
    ``ready(pid)`` and exits, the child serves. Returns the number of requests that failed
    with an unexpected error (logged)."""
    why = fuse_available()
    if why is not None:
        raise MountError(f"cannot mount through FUSE: {why}")
    image = image.resolve()
    mp = mountpoint.resolve()
    if not mp.is_dir():
        raise UsageError(f"{mountpoint}: not a directory")
    if os.path.ismount(mp):
        raise UsageError(f"{mountpoint}: something is already mounted there")
    fs = LFS.open(image, policy=policy)
    ops = LfsOperations(fs)
    try:
        pyfuse3.init(ops, str(mp), _options(image, options))
    except BaseException as exc:
        fs.close()
        raise MountError(f"cannot mount {image} on {mountpoint}: {exc}") from None
    if not foreground:
        _daemonize(ready or (lambda pid: None))
    elif ready is not None:
        ready(os.getpid())
    unmount = True
    try:
        trio.run(_serve)
    except BaseException:
        _log.exception("fsage lfs mount: the FUSE loop failed")
        raise
    finally:
        try:
            unmount = os.path.ismount(mp)
        except OSError:
            unmount = False
        try:
            pyfuse3.close(unmount=unmount)
        finally:
            fs.close()
    return ops.errors
