"""`fsage lfs mount`: the LFS of seed 003 mounted through FUSE.

libfuse3's low-level session loop runs in C (``fsage._fuse``) and hands each request to a
method of :class:`LfsOperations`, a thin adapter that makes one call of
:class:`fsage.lfs.fs.LFS`'s public, path-based API per request (seed 003 §3.7 splits the same
work into file, stream, directory and file-system operations). What the adapter keeps itself:

* **Inode numbers.** FUSE inode numbers are the LFS's own, except that the FUSE root (1) is
  the LFS root (2). For each inode the kernel knows, the adapter remembers one
  (parent, name) pair it was reached by, so a request on an inode turns back into a path.
  A name lost to an operation the adapter did not see is found again by a walk of the tree.
* **Open files that are unlinked** keep their data under a hidden name in the same directory
  (``.fuse_hidden<ino>``, as libfuse's path API does) until their last handle is released.
* **Caching.** Pages are cached for reads; writes go through to the LFS in write(2) (the
  kernel's writeback cache is off by default), so a write the LFS refuses (ENOSPC near full)
  fails there, and the size and pages the kernel keeps of a file change only with what the
  LFS stored: an fstat or read made the instant a write fails shows what is stored. (A
  write that starts inside a page not in the page cache reaches the LFS as two requests, that
  page's part and the rest; when only the rest is refused, write(2) returns the count stored.)
  ``fsync`` commits the LFS's buffer to the log and fdatasyncs the image file. Since only
  this process changes the image, the kernel keeps names, missing names and attributes for
  a day and its cached pages without asking again (``fsage/_fuse.c``); ``flush`` is not
  implemented, so the kernel sends none.
  With ``writeback=True`` (``--writeback``) small writes reach the LFS as page-sized or
  larger runs, at the cost of failures the kernel learns of late: a writeback the LFS refuses
  (at fsync or close) leaves the kernel holding pages and a size the image does not. The
  inode's pages are dropped and so is its name, so that once the file is closed the kernel
  forgets the inode (it never takes a stored size over its own while the writeback cache is
  on) and shows what is stored; files are opened without the page cache near full. While it
  is still open, a truncate of the mount's own, answered with the stored attributes, sets the
  kernel's size (:class:`fsage.lfs.kcache.SizeFixer`): it waits for the inode lock the failed
  fsync holds, so an fstat made the instant the fsync returns may still see the size the
  writes grew it to. The kernel offers no way to set that size sooner. A block whose
  checksum fails (format version 2) is answered EIO. Permissions are checked by
  the kernel (``default_permissions``) only with ``-o allow_other``: otherwise only the
  mounting user, who can write the image anyway, reaches the files, and the check would cost
  a ``getattr`` of the directory after each change in it.
* **Unmount.** When the mount goes away (``fusermount3 -u``, or SIGINT, SIGTERM or SIGHUP to
  the mount process), the LFS is closed: its buffer is written and a checkpoint taken. After
  ``kill -9`` the image holds what was committed (what was fsync'ed at least); the next mount
  rolls forward from the last checkpoint. The dead mount must still be detached with
  ``fusermount3 -u``.

* **Tracing.** With ``--trace FILE`` the server records the image blocks it reads for regular
  files' data, as block-trace text (:mod:`fsage.lfs.blocktrace`): the LFS's counterpart of a
  kernel file system's block trace, for a scan's dynamic layout score.

Times: the LFS keeps milliseconds; finer parts of a utimens are dropped.
The live reader cannot map files on this mount (FUSE passes no FIEMAP); ``fsage snapshot
MOUNTPOINT`` reads the image instead (:mod:`fsage.lfs.mounted`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import stat as stat_mod
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from fsage import imagelock
from fsage.errors import FsageError, UsageError
from fsage.lfs.blocktrace import ReadTracer
from fsage.lfs.format import INO_ROOT, LfsChecksumError, LfsError, LfsNoSpace
from fsage.lfs.fs import LFS, LfsOpError, Stat
from fsage.lfs.kcache import FUSE_ROOT, Invalidator, SizeFixer, invalidate
from fsage.lfs.mounted import FSTYPE

try:
    from fsage import _fuse
except ImportError:  # pragma: no cover - reported by fuse_available()
    _fuse = None  # type: ignore[assignment]

SUBTYPE = FSTYPE.split(".", 1)[1]
_HIDDEN = ".fuse_hidden"
#: Files are opened without the page cache once fewer segments than this can be written.
_DIRECT_BELOW_SEGMENTS = 8
NAME_MAX = 255  # octets of a name: what the LFS's directories take (fsage.lfs.dirs)


@contextlib.contextmanager
def _fuse_signals() -> Iterator[None]:
    """libfuse stops its loop (and the unmount checkpoints) on SIGTERM, SIGHUP and SIGINT, but
    installs its handlers only over the default ones: the CLI's own SIGTERM handler (which
    unwinds other commands) is put aside while the loop runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


T = TypeVar("T")
#: (ino, mode, nlink, uid, gid, size, 512-octet blocks, atime, mtime, ctime (ns), generation)
Attr = tuple[int, int, int, int, int, int, int, int, int, int, int]

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


def errno_of(exc: BaseException) -> int:
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
    if _fuse is None:
        return "fsage._fuse is not built (needs libfuse3-dev; python3 setup.py build_ext)"
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse does not exist"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is not installed (Debian package fuse3)"
    return None


def _err(code: int) -> OSError:
    return OSError(code, os.strerror(code))


@dataclass
class _Dir:
    ino: int
    entries: list[tuple[bytes, int, int]]


class LfsOperations:
    """FUSE requests (as ``fsage._fuse`` calls them) onto an open :class:`LFS`. Methods
    answer errors by raising OSError with the errno for the kernel."""

    def __init__(self, fs: LFS, writeback: bool = False) -> None:
        self.fs = fs
        # The kernel's writeback cache: without it a write reaches the LFS in write(2), and
        # the kernel's size and pages of a file change only with what the LFS stored.
        self.writeback = writeback
        self.bs = fs.geo.block_size
        self._name: dict[int, tuple[int, str]] = {}
        self._files: dict[int, int] = {}  # fh -> LFS ino
        self._dirs: dict[int, _Dir] = {}
        self._open: dict[int, int] = {}  # LFS ino -> open handles
        self._hidden: dict[int, str] = {}  # LFS ino -> hidden path of an unlinked open file
        # Inodes removed through this mount: the kernel may still send requests for them
        # (the times of a file it closed late), answered ENOENT without a walk of the tree.
        self._gone: set[int] = set()
        self._next_fh = 1
        self.errors = 0  # requests that failed with something other than an LFS refusal
        # Inodes whose writes failed: the kernel's cache of them (pages its writeback cache
        # took in, a size) holds what the LFS does not, and is dropped: by ``invalidate``
        # (from a thread of its own, as the kernel may be waiting for the failed request's
        # reply) and, at once, by ``invalidate_now`` when the file is fsync'ed (its pages
        # are written back by then, and the caller must not read them afterwards).
        self.invalidate: Callable[[int], None] = lambda ino: None
        self.invalidate_now: Callable[[int], None] = lambda ino: None
        # With the writeback cache the kernel trusts its own size of a regular file over
        # any the LFS gives: only a fresh inode takes the stored one. Dropping the file's
        # name (``forget_entry(parent, name, wait)``, FUSE inode numbers) makes the kernel
        # forget the inode once no open file holds it, so a stat after close sees what is
        # stored. ``wait``: for at most a moment, so that the close waiting for the failed
        # request's reply finds the name gone (a request that holds the directory, queued
        # behind this one, would hold the drop up for good).
        self.forget_entry: Callable[[int, bytes, bool], None] = lambda parent, name, w: None
        self._failed: set[int] = set()
        # The size the kernel keeps of an open file whose writes failed: set to the stored
        # one by a truncate of the mount's own (``SizeFixer``); None until mounted.
        self.sizes: SizeFixer | None = None
        self._stale: set[int] = set()  # inodes to drop again at their last release
        self._dropped: set[int] = set()  # names dropped, not looked up since

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def _lfs(ino: int) -> int:
        return INO_ROOT if ino == FUSE_ROOT else ino

    def _call(self, fn: Callable[..., T], *args: object) -> T:
        try:
            return fn(*args)
        except OSError:
            raise
        except (LfsOpError, LfsNoSpace) as exc:
            raise _err(errno_of(exc)) from None
        except LfsChecksumError as exc:  # a damaged block: EIO, never its bytes
            self.errors += 1
            print(f"fsage lfs: {exc}", file=sys.stderr, flush=True)
            raise _err(errno.EIO) from None
        except Exception as exc:  # the loop must go on: log it, answer EIO
            self.errors += 1
            import traceback

            traceback.print_exc()
            raise _err(errno_of(exc)) from None

    def _path(self, ino: int) -> str:
        ino = self._lfs(ino)
        parts: list[str] = []
        while ino != INO_ROOT:
            where = self._name.get(ino)
            if where is None:
                if ino in self._gone:
                    raise _err(errno.ENOENT)
                where = self._find(ino)
            ino, name = where
            parts.append(name)
            if len(parts) > 4096:
                raise _err(errno.ELOOP)
        return "/".join(reversed(parts))

    def _find(self, ino: int) -> tuple[int, str]:
        """A (parent, name) of ``ino`` from a walk of the whole tree."""
        stack = [(INO_ROOT, "")]
        while stack:
            dino, dpath = stack.pop()
            for name, child in self._call(self.fs.readdir, dpath):
                if child == ino:
                    self._name[ino] = (dino, name)
                    return dino, name
                if self.fs.is_dir(child):
                    self._name.setdefault(child, (dino, name))
                    stack.append((child, f"{dpath}/{name}" if dpath else name))
        raise _err(errno.ENOENT)

    @staticmethod
    def _checked_name(name: bytes) -> str:
        if len(name) > NAME_MAX:  # statfs says so; the kernel leaves the check to us
            raise _err(errno.ENAMETOOLONG)
        return os.fsdecode(name)

    def _at(self, parent: int, name: bytes) -> tuple[int, str]:
        """The LFS directory inode and the name of a request's (parent, name)."""
        return self._lfs(parent), self._checked_name(name)

    def _entry(self, parent: int, name: bytes) -> Stat:
        st = self._call(self.fs.lookup, *self._at(parent, name))
        if st is None:
            raise _err(errno.ENOENT)
        return st

    def _child(self, parent: int, name: bytes) -> str:
        n = self._checked_name(name)
        base = self._path(parent)
        return f"{base}/{n}" if base else n

    def _attr(self, st: Stat) -> Attr:
        def ns(ms: int) -> int:  # a damaged time (mounted with --force) shows as the latest
            return min(ms * 1_000_000, 2**63 - 1)

        return (
            FUSE_ROOT if st.ino == INO_ROOT else st.ino,
            st.mode,
            0 if st.ino in self._hidden else st.nlink,  # open but unlinked: no name left
            st.uid,
            st.gid,
            st.size,
            st.blocks * self.bs // 512,
            ns(st.atime_ms),
            ns(st.mtime_ms),
            ns(st.ctime_ms),
            st.version,
        )

    def _stat(self, ino: int) -> Attr:
        return self._attr(self._call(self.fs.stat_ino, self._lfs(ino)))

    def _made(self, parent: int, name: bytes, ino: int, uid: int, gid: int) -> Attr:
        self._name[ino] = (self._lfs(parent), os.fsdecode(name))
        self._gone.discard(ino)
        if uid or gid:
            return self._attr(self._call(self.fs.setattr_ino, ino, None, uid, gid))
        return self._stat(ino)

    def _forget_name(self, parent: int, name: bytes, ino: int, last: bool) -> None:
        """``name`` in ``parent`` no longer leads to ``ino``; ``last``: it was its last name."""
        if self._name.get(ino) == (self._lfs(parent), os.fsdecode(name)):
            del self._name[ino]
        if last:
            self._name.pop(ino, None)
            self._gone.add(ino)

    # ------------------------------------------------------------------ attributes
    def lookup(self, parent: int, name: bytes) -> Attr | None:
        st = self._call(self.fs.lookup, *self._at(parent, name))
        if st is None:
            return None  # a negative entry the kernel may cache
        self._name[st.ino] = (self._lfs(parent), os.fsdecode(name))
        self._gone.discard(st.ino)
        self._dropped.discard(st.ino)
        return self._attr(st)

    def getattr(self, ino: int) -> Attr:
        return self._stat(ino)

    def setattr(
        self,
        ino: int,
        to_set: int,
        mode: int,
        uid: int,
        gid: int,
        size: int,
        atime_ns: int,
        mtime_ns: int,
        fh: int,
    ) -> Attr:
        assert _fuse is not None
        lino = self._lfs(ino)
        if lino in self._gone:
            # The times of a file the kernel closed after its last name went.
            raise _err(errno.ENOENT)
        if to_set & _fuse.SET_SIZE and self.sizes is not None and self.sizes.is_fix(lino, size):
            return self._stat(ino)  # the mount's own truncate: answer what is stored
        now_ns = None
        if to_set & (_fuse.SET_ATIME_NOW | _fuse.SET_MTIME_NOW):
            import time

            now_ns = time.time_ns()
        atime = mtime = None
        if to_set & _fuse.SET_ATIME:
            atime = (now_ns if to_set & _fuse.SET_ATIME_NOW and now_ns else atime_ns) // 1_000_000
        if to_set & _fuse.SET_MTIME:
            mtime = (now_ns if to_set & _fuse.SET_MTIME_NOW and now_ns else mtime_ns) // 1_000_000
        args = (
            mode & 0o7777 if to_set & _fuse.SET_MODE else None,
            uid if to_set & _fuse.SET_UID else None,
            gid if to_set & _fuse.SET_GID else None,
            atime,
            mtime,
        )
        if to_set & _fuse.SET_SIZE:  # with the rest, as one operation: both or neither
            return self._attr(self._call(self.fs.setattr_ino, lino, *args, size))
        if args != (None,) * 5:
            return self._attr(self._call(self.fs.setattr_ino, lino, *args))
        return self._stat(ino)

    def readlink(self, ino: int) -> bytes:
        return os.fsencode(self._call(self.fs.readlink, self._path(ino)))

    def statfs(self) -> tuple[int, int, int, int, int, int, int]:
        """Free blocks are those no live data holds; available ones what writes can still
        take (``LFS.writable_blocks``): the log keeps clean segments back and the cleaner
        cannot compact every dead block."""
        total, live = self._call(self.fs.usage)
        avail = self._call(self.fs.writable_blocks)
        used = sum(1 for _ in self._call(self.fs.inodes))
        files = max(total, used)
        return self.bs, total, max(0, total - live), avail, files, files - used, NAME_MAX

    # ------------------------------------------------------------------ namespace
    def mknod(self, parent: int, name: bytes, mode: int, uid: int, gid: int) -> Attr:
        if not stat_mod.S_ISREG(mode):
            raise _err(errno.EPERM)  # the LFS holds files, directories and symbolic links
        ino = self._call(self.fs.create_at, *self._at(parent, name), mode & 0o7777)
        return self._made(parent, name, ino, uid, gid)

    def mkdir(self, parent: int, name: bytes, mode: int, uid: int, gid: int) -> Attr:
        ino = self._call(self.fs.mkdir_at, *self._at(parent, name), mode & 0o7777)
        return self._made(parent, name, ino, uid, gid)

    def symlink(self, target: bytes, parent: int, name: bytes, uid: int, gid: int) -> Attr:
        path = self._child(parent, name)
        ino = self._call(self.fs.symlink, os.fsdecode(target), path)
        return self._made(parent, name, ino, uid, gid)

    def link(self, ino: int, parent: int, name: bytes) -> Attr:
        src = self._path(ino)
        self._call(self.fs.link, src, self._child(parent, name))
        return self._stat(ino)

    def unlink(self, parent: int, name: bytes) -> None:
        st = self._entry(parent, name)
        if self._open.get(st.ino) and st.nlink == 1 and st.ino not in self._hidden:
            hidden = f"{_HIDDEN}{st.ino:08x}"
            base = self._path(parent)
            hpath = f"{base}/{hidden}" if base else hidden
            self._call(self.fs.rename, self._child(parent, name), hpath)
            self._hidden[st.ino] = hpath
            self._name[st.ino] = (self._lfs(parent), hidden)
            return
        self._call(self.fs.unlink_at, *self._at(parent, name))
        self._forget_name(parent, name, st.ino, st.nlink <= 1)

    def rmdir(self, parent: int, name: bytes) -> None:
        st = self._entry(parent, name)
        if not stat_mod.S_ISDIR(st.mode):
            raise _err(errno.ENOTDIR)
        self._call(self.fs.rmdir_at, *self._at(parent, name))
        self._forget_name(parent, name, st.ino, True)

    def rename(self, parent: int, name: bytes, newparent: int, newname: bytes, flags: int) -> None:
        assert _fuse is not None
        if flags & _fuse.RENAME_EXCHANGE:
            raise _err(errno.EINVAL)
        src = self._child(parent, name)
        dst = self._child(newparent, newname)
        st = self._call(self.fs.stat, src)
        try:
            victim: Stat | None = self.fs.stat(dst)
        except LfsOpError:
            victim = None
        if victim is not None:
            if flags & _fuse.RENAME_NOREPLACE:
                raise _err(errno.EEXIST)
            if victim.ino == st.ino:
                return  # two names of one inode: POSIX says do nothing
            if stat_mod.S_ISDIR(victim.mode) != stat_mod.S_ISDIR(st.mode):
                raise _err(errno.EISDIR if stat_mod.S_ISDIR(victim.mode) else errno.ENOTDIR)
            if self._open.get(victim.ino) and victim.nlink == 1:
                self.unlink(newparent, newname)  # kept under a hidden name while open
                victim = None
        self._call(self.fs.rename, src, dst)
        if victim is not None:
            last = stat_mod.S_ISDIR(victim.mode) or victim.nlink <= 1
            self._forget_name(newparent, newname, victim.ino, last)
        self._name[st.ino] = (self._lfs(newparent), os.fsdecode(newname))

    # ------------------------------------------------------------------ files
    def _new_fh(self, ino: int) -> int:
        fh = self._next_fh
        self._next_fh += 1
        self._files[fh] = ino
        self._open[ino] = self._open.get(ino, 0) + 1
        return fh

    def _fh(self, fh: int) -> int:
        ino = self._files.get(fh)
        if ino is None:
            raise _err(errno.EBADF)
        return ino

    def _direct(self) -> bool:
        """Whether files are opened without the page cache: with the writeback cache, when
        the LFS is near full, so that a write it cannot store fails in write(2), not in a
        writeback whose pages the kernel would go on showing (and whose size it keeps,
        whatever the LFS answers). Without it every write fails in write(2) already."""
        if not self.writeback:
            return False
        return self.fs.writable_blocks() < _DIRECT_BELOW_SEGMENTS * self.fs.ndata

    def open(self, ino: int, flags: int) -> tuple[int, bool]:
        if flags & os.O_TRUNC:
            self._call(self.fs.truncate_ino, self._lfs(ino), 0)
        return self._new_fh(self._lfs(ino)), self._direct()

    def create(
        self, parent: int, name: bytes, mode: int, flags: int, uid: int, gid: int
    ) -> tuple[int, Attr, bool]:
        ino = self._call(self.fs.create_at, *self._at(parent, name), mode & 0o7777)
        attr = self._made(parent, name, ino, uid, gid)
        return self._new_fh(ino), attr, self._direct()

    def read(self, fh: int, size: int, off: int) -> bytes:
        return self._call(self.fs.read_ino, self._fh(fh), off, size)

    def _drop_name(self, ino: int, wait: bool = True) -> None:
        self._stale.add(ino)
        if ino in self._dropped:  # once is enough (a writeback fails run by run)
            return
        self._dropped.add(ino)
        where = self._name.get(ino)
        if where is not None:
            parent, name = where
            self.forget_entry(FUSE_ROOT if parent == INO_ROOT else parent, os.fsencode(name), wait)

    def write(self, fh: int, data: bytes, off: int) -> int:
        ino = self._fh(fh)
        try:
            return self._call(self.fs.write_ino, ino, off, data)
        except OSError:
            self.invalidate(ino)
            if self.writeback:  # the kernel's size and pages hold the refused data
                self._failed.add(ino)
                self._drop_name(ino)  # before the reply: the close that waits for it evicts
                self._fix_size(ino)
            raise

    def fsync(self, fh: int, datasync: int) -> None:
        ino = self._fh(fh)
        try:
            self._sync()
        except OSError:
            self._failed.add(ino)
            if self.writeback:
                self._drop_name(ino)
            raise
        finally:
            if ino in self._failed:
                self._failed.discard(ino)
                self.invalidate_now(ino)
                self._fix_size(ino)

    def _fix_size(self, ino: int) -> None:
        """After a failed write of an open file: the kernel's size of it made the stored one."""
        if not self.writeback or self.sizes is None or self._open.get(ino, 0) == 0:
            return
        with contextlib.suppress(OSError):
            self.sizes.fix(ino, self._path(ino))

    def _sync(self) -> None:
        if self.fs.readonly:  # a damaged image mounted with --force: nothing is written
            return
        self._call(self.fs.sync)
        self._call(os.fdatasync, self.fs.fd)

    def release(self, fh: int) -> None:
        ino = self._files.pop(fh, None)
        if ino is None:
            return
        left = self._open.get(ino, 1) - 1
        if left > 0:
            self._open[ino] = left
            return
        self._open.pop(ino, None)
        if ino in self._stale:  # a lookup while it was open may have named it again
            if ino not in self._dropped:
                self._drop_name(ino, wait=False)
            self._stale.discard(ino)
            self._dropped.discard(ino)  # a later failure drops the name again
        hidden = self._hidden.pop(ino, None)
        if hidden is not None:
            self._call(self.fs.unlink, hidden)
            self._name.pop(ino, None)
            self._gone.add(ino)

    # ------------------------------------------------------------------ directories
    def opendir(self, ino: int) -> int:
        lino = self._lfs(ino)
        entries: list[tuple[bytes, int, int]] = []
        parent = self._name.get(lino, (INO_ROOT, ""))[0]
        entries.append((b".", ino, stat_mod.S_IFDIR))
        entries.append((b"..", FUSE_ROOT if parent == INO_ROOT else parent, stat_mod.S_IFDIR))
        for name, child in sorted(self._call(self.fs.readdir, self._path(ino))):
            try:
                mode = self.fs.stat_ino(child).mode
            except (LfsOpError, LfsError):
                continue
            entries.append((os.fsencode(name), child, mode))
        fh = self._next_fh
        self._next_fh += 1
        self._dirs[fh] = _Dir(lino, entries)
        return fh

    def readdir(self, fh: int, off: int) -> list[tuple[bytes, int, int, int]]:
        d = self._dirs.get(fh)
        if d is None:
            raise _err(errno.EBADF)
        return [(n, i, m, k + 1) for k, (n, i, m) in enumerate(d.entries) if k >= off][:512]

    def releasedir(self, fh: int) -> None:
        self._dirs.pop(fh, None)

    def fsyncdir(self, fh: int, datasync: int) -> None:
        self._sync()


# ---------------------------------------------------------------------------- mount


def _options(image: Path, extra: tuple[str, ...]) -> str:
    opts = [f"fsname={image}", f"subtype={SUBTYPE}", *extra]
    # Only the mounting user reaches the files (FUSE's default), and that user can write the
    # image anyway: the kernel checks permissions only when other users are let in. Checking
    # them always costs a request per directory change (the kernel drops the directory's
    # attributes after each one and asks again before the next permission check).
    if "allow_other" in opts and "default_permissions" not in opts:
        opts.insert(0, "default_permissions")
    for o in opts:
        if "," in o.replace("\\,", ""):
            raise UsageError(f"FUSE option {o!r}: give one option per -o (or escape ',')")
    return ",".join(opts)


def _daemonize(ready: Callable[[int], None]) -> None:
    """Fork: the parent reports the child's pid and exits at once without closing anything
    (the child owns the image and the FUSE session); the child leaves the terminal."""
    r, w = os.pipe()
    pid = os.fork()
    if pid > 0:
        os.close(w)
        ok = os.read(r, 1) == b"1"
        if ok:
            ready(pid)
        os._exit(0 if ok else 1)
    os.close(r)
    os.setsid()
    os.chdir("/")
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    if devnull > 2:
        os.close(devnull)
    imagelock.after_fork()  # the image's lock is this process's now
    os.write(w, b"1")
    os.close(w)


def _check(
    image: Path, mountpoint: Path, force: bool, say: Callable[[str], None]
) -> tuple[bool, list[int]]:
    """Check ``image`` before it is mounted: (mount it read-only (damaged, forced), segments
    whose usage-table time the mount sets right)."""
    from fsage.lfs.fsck import fsck

    rep = fsck(image)
    if rep.ok:
        return False, []
    if rep.only_times:
        say(f"{image}: setting the usage-table time of {len(rep.times)} segments from their blocks")
        return False, rep.times
    first = rep.problems[0]
    more = f" (and {len(rep.problems) - 1} more)" if len(rep.problems) > 1 else ""
    if not force:
        raise MountError(
            f"{image} is damaged: {first}{more}; see fsage lfs fsck {image}, "
            "or mount it read-only with --force"
        )
    for prob in rep.problems:
        say(f"damaged: {prob}")
    say(f"{image}: {len(rep.problems)} problems: mounting it read-only on {mountpoint}")
    return True, []


def mount(
    image: Path,
    mountpoint: Path,
    *,
    foreground: bool = True,
    policy: str | None = None,
    options: tuple[str, ...] = (),
    writeback: bool = False,
    ready: Callable[[int], None] | None = None,
    force: bool = False,
    say: Callable[[str], None] | None = None,
    trace: Path | None = None,
) -> int:
    """Mount ``image`` on ``mountpoint`` and serve until it is unmounted (``fusermount3 -u``)
    or the process gets SIGINT, SIGTERM or SIGHUP; then close the LFS (its buffer written, a
    checkpoint taken). With ``foreground=False`` the process forks once the mount is up: the
    parent calls ``ready(pid)`` and exits, the child serves. ``writeback``: the kernel's
    writeback cache (off: see the module text). The image is checked first (``fsage lfs
    fsck``): a damaged one is refused, or with ``force`` mounted read-only, its problems given
    to ``say``. ``trace``: a file the file data blocks read are recorded in, as block-trace
    text (:mod:`fsage.lfs.blocktrace`), complete once unmounted. Returns the number of requests
    that failed unexpectedly (printed)."""
    why = fuse_available()
    if why is not None:
        raise MountError(f"cannot mount through FUSE: {why}")
    assert _fuse is not None
    image = image.resolve()
    mp = mountpoint.resolve()
    try:
        os.stat(mp)
    except OSError as exc:
        # ECONNABORTED while the dead server's connection is being torn down, then ENOTCONN.
        if exc.errno in (errno.ENOTCONN, errno.ECONNABORTED):
            raise UsageError(
                f"{mountpoint}: a FUSE mount whose process died; detach it with "
                f"fusermount3 -u {mountpoint}"
            ) from None
        raise UsageError(f"{mountpoint}: {exc.strerror}") from None
    if not mp.is_dir():
        raise UsageError(f"{mountpoint}: not a directory")
    if os.path.ismount(mp):
        raise UsageError(f"{mountpoint}: something is already mounted there")
    with imagelock.image_lock(image, exclusive=True):  # no writer between check and open
        readonly, times = _check(image, mountpoint, force, say or (lambda s: None))
        opts = _options(image, (*options, "ro") if readonly else options)
        fs = LFS.open(image, policy=policy, readonly=readonly)
        if times:
            fs.fix_usage_times(times)
    tracer = None
    if trace is not None:
        try:
            tracer = ReadTracer(trace, fs.bs)
        except BaseException:
            fs.close()
            raise
        fs.read_trace = tracer
    ops = LfsOperations(fs, writeback)
    try:
        session = _fuse.Session(ops, str(mp), opts, writeback)
    except BaseException as exc:
        fs.close()
        if tracer is not None:
            tracer.close()
        raise MountError(f"cannot mount {image} on {mountpoint}: {exc}") from None
    if not foreground:
        _daemonize(ready or (lambda pid: None))
    elif ready is not None:
        ready(os.getpid())
    invalidator = Invalidator(session)  # a thread: started after the fork
    ops.invalidate = invalidator.push
    ops.invalidate_now = lambda ino: invalidate(session, ino)
    ops.sizes = SizeFixer(str(mp))
    ops.forget_entry = invalidator.forget
    from fsage.lfs.control import from_env

    control = None
    try:
        control = from_env(fs, tracer)  # requests from the program that started the mount
        with _fuse_signals():
            session.loop()
    finally:
        if control is not None:
            control.close()
        try:
            session.unmount()
        finally:
            try:
                fs.close()
            finally:
                if tracer is not None:
                    tracer.close()
    return ops.errors
