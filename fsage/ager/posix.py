"""The mounted-directory executor: runs ops through POSIX calls, writing real data.

Every path is resolved one component at a time from an open descriptor of the target root with
``O_NOFOLLOW``, so a symlink (planted or recorded) never leads outside the target. Data is a
fixed pseudo-random buffer (not zeros, so no file system can elide or compress it away), written
with ``write``/``pwrite`` — never only ``fallocate``.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import random
import stat
from collections import OrderedDict
from pathlib import Path
from typing import Any

from fsage.errors import UnsafeTargetError, WorkloadError
from fsage.workload import (
    SPECIAL_MODES,
    Executor,
    NoSpaceError,
    Op,
    OpFailedError,
    symlink_target,
)

_CHUNK = 1 << 20
_DATA = memoryview(random.Random(0x5EED).randbytes(_CHUNK))
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_DIR_FDS = 256
_NEW_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
#: How file data reaches the disk: written (the default: real data), or only allocated with
#: fallocate (unwritten extents, as Geriatrix ages).
DATA_MODES = ("write", "fallocate")

#: A directory's resume record lives beside it, as ``<directory>.fsage-age`` (never inside the
#: aged file system, where it would be one of its files); older runs kept it inside as this
#: dotfile, which still marks a directory as an fsage working directory.
MARKER = ".fsage-age"
RECORD_SUFFIX = ".fsage-age"
#: Names in a target root that do not count against "empty".
IGNORED_NAMES = frozenset({MARKER, "lost+found"})


def record_path_for(target: Path) -> Path:
    """Where the resume record of ``target`` (a directory or an image) lives: beside it."""
    return target.with_name(target.name + RECORD_SUFFIX)


_libc: ctypes.CDLL | None = None


_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02


_falloc: Any = None


def _libc_fn() -> ctypes.CDLL:
    global _libc, _falloc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        _libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
        _falloc = _libc.fallocate
    return _libc


def _fallocate(fd: int, mode: int, offset: int, size: int) -> None:
    if _falloc is None:
        _libc_fn()
    if _falloc(fd, mode, offset, size) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def punch_hole(fd: int, offset: int, size: int) -> None:
    """fallocate(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE): free the range, keep the size."""
    _fallocate(fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, offset, size)


def allocate(fd: int, offset: int, size: int) -> None:
    """fallocate(mode 0): allocate the range (unwritten extents), growing the size to its end.
    Never emulated by writing zeros (``os.posix_fallocate`` would, on a file system without
    fallocate): EOPNOTSUPP is an error."""
    _fallocate(fd, 0, offset, size)


def _syncfs(fd: int) -> None:
    if _libc_fn().syncfs(fd) != 0:
        os.sync()


#: Ops that make an inode.
_INODE_OPS = frozenset({"create", "mkdir", "symlink", "mknod"})


class PosixExecutor(Executor):
    """Runs ops below ``root`` (a directory, typically a mounted file system)."""

    def __init__(self, root: Path, *, fsync: bool = False, data: str = "write") -> None:
        if data not in DATA_MODES:
            raise WorkloadError(f"unknown data mode {data!r} (one of {', '.join(DATA_MODES)})")
        self.root = Path(root)
        self.fsync = fsync
        #: "fallocate": creates and appends allocate their blocks instead of writing them.
        self.allocate_only = data == "fallocate"
        try:
            self._root_fd = os.open(self.root, _DIR_FLAGS)
        except OSError as exc:
            raise UnsafeTargetError(f"cannot open target {root}: {exc.strerror}") from None
        # Least recently used first. Descriptors handed out during the current op are pinned:
        # an op that resolves two directories (rename, link) must not see the first one closed
        # when the second lookup fills the cache.
        self._dir_fds: OrderedDict[str, int] = OrderedDict()
        self._pinned: set[str] = set()
        # How many cached keys are each directory or below it: a rename or rmdir of a path
        # that nothing cached lies in or under costs one lookup, not a scan of the cache.
        self._under: dict[str, int] = {}
        st = os.fstatvfs(self._root_fd)
        self.description = (
            f"mounted directory {self.root} through POSIX calls"
            + (" (fsync after every op)" if fsync else "")
            + (" (data allocated with fallocate, not written)" if self.allocate_only else "")
            + f", block size {st.f_frsize}"
        )

    # ------------------------------------------------------------------ paths

    def _dir_fd(self, parent: str) -> int:
        """Descriptor of directory ``parent`` (relative, '' = root), walked without following
        symlinks; cached (least recently used evicted, never one in use by the current op)."""
        if not parent:
            return self._root_fd
        fd = self._dir_fds.get(parent)
        if fd is not None:
            self._dir_fds.move_to_end(parent)
            self._pinned.add(parent)
            return fd
        head, _, name = parent.rpartition("/")
        base = self._dir_fd(head)
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=base)
        except OSError as exc:
            if exc.errno == errno.ELOOP or exc.errno == errno.ENOTDIR:
                raise UnsafeTargetError(
                    f"{parent!r} is not a directory inside the target (symlink?)"
                ) from None
            raise
        self._evict(_MAX_DIR_FDS - 1)
        self._dir_fds[parent] = fd
        self._count_under(parent, 1)
        self._pinned.add(parent)
        return fd

    def _count_under(self, key: str, delta: int) -> None:
        under = self._under
        end = len(key)
        while True:
            prefix = key[:end]
            n = under.get(prefix, 0) + delta
            if n:
                under[prefix] = n
            else:
                del under[prefix]
            end = key.rfind("/", 0, end)
            if end < 0:
                return

    def _close_cached(self, key: str) -> None:
        os.close(self._dir_fds.pop(key))
        self._count_under(key, -1)

    def _evict(self, keep: int) -> None:
        """Close the least recently used unpinned descriptors until at most ``keep`` remain
        (pinned ones stay even beyond that: an op holds at most a few)."""
        excess = len(self._dir_fds) - keep
        if excess <= 0:
            return
        # The oldest few are the victims: stop at them rather than copying the whole cache
        # (one eviction per miss once it is full, as in a tree of more directories than it).
        victims: list[str] = []
        for key in self._dir_fds:
            if key not in self._pinned:
                victims.append(key)
                if len(victims) == excess:
                    break
        for key in victims:
            self._close_cached(key)

    def _drop_dir_fds(self) -> None:
        """Close every cached descriptor (after the namespace changed under cached paths);
        only between ops or after the op's last use of them."""
        for fd in self._dir_fds.values():
            os.close(fd)
        self._dir_fds.clear()
        self._under.clear()
        self._pinned.clear()

    def _forget_dirs(self, path: str) -> None:
        """Close the cached descriptors of directory ``path`` and everything below it (it was
        removed or renamed, so those cache keys no longer name those directories)."""
        if path not in self._under:
            return
        prefix = path + "/"
        for key in [k for k in self._dir_fds if k == path or k.startswith(prefix)]:
            self._close_cached(key)
            self._pinned.discard(key)

    def _split(self, path: str) -> tuple[int, str]:
        head, _, name = path.rpartition("/")
        return self._dir_fd(head), name

    # ------------------------------------------------------------------ data

    def _write(self, fd: int, size: int, offset: int | None = None) -> int:
        if self.allocate_only:
            if size:
                allocate(fd, os.fstat(fd).st_size if offset is None else offset, size)
            return size
        done = 0
        while done < size:
            n = min(_CHUNK, size - done)
            if offset is None:
                w = os.write(fd, _DATA[:n])
            else:
                w = os.pwrite(fd, _DATA[:n], offset + done)
            if w <= 0:
                raise OSError(errno.ENOSPC, "short write")
            done += w
        return done

    def _open_file(self, path: str, flags: int) -> int:
        dfd, name = self._split(path)
        # O_NONBLOCK: opening a FIFO found at the path must fail (ENXIO), not wait for a
        # reader; it changes nothing for a regular file.
        flags |= os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
        fd = os.open(name, flags, 0o644, dir_fd=dfd)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OpFailedError(f"{path!r} is not a regular file")
        return fd

    # ------------------------------------------------------------------ ops

    def apply(self, op: Op) -> int:
        self._pinned.clear()
        try:
            return self._apply(op)
        except NoSpaceError:
            raise
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                if op.op in _INODE_OPS:
                    self._check_inodes(op)
                raise NoSpaceError(f"{op.op} {op.path}: no space left") from None
            raise OpFailedError(f"{op.op} {op.path!r}: {exc.strerror}") from None

    def _check_inodes(self, op: Op) -> None:
        """An op that makes an inode failed for lack of space: when the inodes ran out (not
        the blocks), the ager, which steers by blocks, would delete and create again forever
        without reaching its fill; stop with the cause."""
        st = os.fstatvfs(self._root_fd)
        if st.f_files and not st.f_ffree:  # btrfs reports no inode count (f_files 0)
            full = 1 - st.f_bfree / st.f_blocks if st.f_blocks else 0.0
            raise OpFailedError(
                f"{op.op} {op.path!r}: all {st.f_files:,} inodes of the file system are in use "
                f"at {full:.0%} full; a workload of this many small files needs a file system "
                "made with more inodes (mkfs.ext4 -T news, or -i BYTES_PER_INODE)"
            )

    def _apply(self, op: Op) -> int:
        kind = op.op
        if kind == "create":
            dfd, name = self._split(op.path)
            try:
                # A new name (the usual case): the file made is regular and empty.
                fd = os.open(name, _NEW_FLAGS, 0o644, dir_fd=dfd)
            except FileExistsError:
                fd = self._open_file(op.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            try:
                self._write(fd, op.size, None if not self.allocate_only else 0)
                if self.fsync:
                    os.fsync(fd)
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    os.close(fd)
                    fd = -1
                    dfd, name = self._split(op.path)
                    os.unlink(name, dir_fd=dfd)
                raise
            finally:
                if fd >= 0:
                    os.close(fd)
            return op.size
        if kind in ("append", "overwrite", "truncate"):
            fd = self._open_file(op.path, os.O_WRONLY)
            try:
                old = os.fstat(fd).st_size
                try:
                    if kind == "append":
                        self._write(fd, op.size, old)
                    elif kind == "overwrite":
                        if not self.allocate_only:  # the blocks are allocated already
                            self._write(fd, op.size, op.offset)
                    else:
                        os.ftruncate(fd, op.size)
                    if self.fsync:
                        os.fsync(fd)
                except OSError as exc:
                    if exc.errno in (errno.ENOSPC, errno.EDQUOT) and kind != "truncate":
                        os.ftruncate(fd, old) if kind == "append" else None
                    raise
            finally:
                os.close(fd)
            return 0 if kind == "truncate" else op.size
        if kind in ("punch", "fallocate"):
            fd = self._open_file(op.path, os.O_WRONLY)
            try:
                old = os.fstat(fd).st_size
                try:
                    if op.size and kind == "punch":
                        punch_hole(fd, op.offset, op.size)
                    elif op.size:
                        allocate(fd, op.offset, op.size)
                    if self.fsync:
                        os.fsync(fd)
                except OSError as exc:
                    if exc.errno in (errno.ENOSPC, errno.EDQUOT) and kind == "fallocate":
                        with contextlib.suppress(OSError):  # undo what was allocated
                            punch_hole(fd, op.offset, op.size)
                            os.ftruncate(fd, old)
                    raise
            finally:
                os.close(fd)
            return 0
        if kind == "mkdir":
            dfd, name = self._split(op.path)
            os.mkdir(name, 0o755, dir_fd=dfd)
            return 0
        if kind == "delete":
            dfd, name = self._split(op.path)
            try:
                os.unlink(name, dir_fd=dfd)
            except IsADirectoryError:
                os.rmdir(name, dir_fd=dfd)
                self._forget_dirs(op.path)
            except PermissionError:
                # Linux reports EPERM (not EISDIR) for unlink of a directory on some fs.
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                if not stat.S_ISDIR(st.st_mode):
                    raise
                os.rmdir(name, dir_fd=dfd)
                self._forget_dirs(op.path)
            return 0
        if kind == "rename":
            sfd, sname = self._split(op.path)
            dfd, dname = self._split(op.dest)
            os.rename(sname, dname, src_dir_fd=sfd, dst_dir_fd=dfd)
            # A directory renamed (or replaced by the rename) changes what cached paths name.
            self._forget_dirs(op.path)
            self._forget_dirs(op.dest)
            return 0
        if kind == "link":
            sfd, sname = self._split(op.path)
            dfd, dname = self._split(op.dest)
            os.link(sname, dname, src_dir_fd=sfd, dst_dir_fd=dfd, follow_symlinks=False)
            return 0
        if kind == "symlink":
            dfd, name = self._split(op.path)
            os.symlink(symlink_target(op), name, dir_fd=dfd)
            return 0
        if kind == "mknod":
            dfd, name = self._split(op.path)
            os.mknod(name, SPECIAL_MODES[op.label] | 0o644, 0, dir_fd=dfd)
            return 0
        if kind == "fsync":
            dfd, name = self._split(op.path)
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            return 0
        if kind == "sync":
            self.sync()
            return 0
        if kind == "snapshot":
            return 0
        raise WorkloadError(f"unknown op {kind!r}")

    def sync(self) -> None:
        _syncfs(self._root_fd)

    def capacity_blocks(self) -> tuple[int, int, int]:
        st = os.fstatvfs(self._root_fd)
        return st.f_frsize, st.f_blocks, st.f_blocks - st.f_bfree

    def close(self) -> None:
        if self._root_fd >= 0:
            self._drop_dir_fds()
            try:
                self.sync()
            finally:
                os.close(self._root_fd)
                self._root_fd = -1


# ---------------------------------------------------------------------- target checks


def check_target_dir(path: Path, *, force: bool = False, record: Path | None = None) -> Path:
    """Refuse '/', a non-directory, and a directory that is neither empty nor an fsage working
    directory (its record ``record`` exists, or an older run's marker inside it) unless
    ``force``. Nothing is written into the directory. Returns the resolved path."""
    real = Path(os.path.realpath(path))
    if real == Path("/"):
        raise UnsafeTargetError("refusing to age '/'")
    if not real.is_dir():
        raise UnsafeTargetError(f"{path} is not a directory")
    try:
        names = set(os.listdir(real))
    except OSError as exc:
        raise UnsafeTargetError(f"cannot list {path}: {exc.strerror}") from None
    known = MARKER in names or (record is not None and record.exists())
    if names - IGNORED_NAMES and not known and not force:
        raise UnsafeTargetError(
            f"{path} is not empty and not an fsage working directory (use --force to age it anyway)"
        )
    marker = real / MARKER
    if marker.is_symlink():
        raise UnsafeTargetError(f"{marker} is a symlink")
    if record is not None and record.is_symlink():
        raise UnsafeTargetError(f"{record} is a symlink")
    return real
