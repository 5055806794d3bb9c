"""The mounted-directory executor: runs ops through POSIX calls, writing real data.

Every path is resolved one component at a time from an open descriptor of the target root with
``O_NOFOLLOW``, so a symlink (planted or recorded) never leads outside the target. Data is a
fixed pseudo-random buffer (not zeros, so no file system can elide or compress it away), written
with ``write``/``pwrite`` — never only ``fallocate``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import random
import stat
from pathlib import Path

from fsage.errors import UnsafeTargetError, WorkloadError
from fsage.workload import Executor, NoSpaceError, Op, OpFailedError, symlink_target

_CHUNK = 1 << 20
_DATA = memoryview(random.Random(0x5EED).randbytes(_CHUNK))
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_DIR_FDS = 256
_SPECIAL_MODES = {
    "fifo": stat.S_IFIFO,
    "socket": stat.S_IFSOCK,
    "char": stat.S_IFCHR,
    "block": stat.S_IFBLK,
}

#: The dotfile that marks a directory as an fsage working directory (and holds the resume record).
MARKER = ".fsage-age"
#: Names in a target root that do not count against "empty".
IGNORED_NAMES = frozenset({MARKER, "lost+found"})

_libc: ctypes.CDLL | None = None


def _syncfs(fd: int) -> None:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if _libc.syncfs(fd) != 0:
        os.sync()


class PosixExecutor(Executor):
    """Runs ops below ``root`` (a directory, typically a mounted file system)."""

    def __init__(self, root: Path, *, fsync: bool = False) -> None:
        self.root = Path(root)
        self.fsync = fsync
        try:
            self._root_fd = os.open(self.root, _DIR_FLAGS)
        except OSError as exc:
            raise UnsafeTargetError(f"cannot open target {root}: {exc.strerror}") from None
        self._dir_fds: dict[str, int] = {}
        st = os.fstatvfs(self._root_fd)
        self.description = (
            f"mounted directory {self.root} through POSIX calls"
            + (" (fsync after every op)" if fsync else "")
            + f", block size {st.f_frsize}"
        )

    # ------------------------------------------------------------------ paths

    def _dir_fd(self, parent: str) -> int:
        """Descriptor of directory ``parent`` (relative, '' = root), walked without following
        symlinks; cached."""
        if not parent:
            return self._root_fd
        fd = self._dir_fds.get(parent)
        if fd is not None:
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
        if len(self._dir_fds) >= _MAX_DIR_FDS:
            self._drop_dir_fds()
        self._dir_fds[parent] = fd
        return fd

    def _drop_dir_fds(self) -> None:
        for fd in self._dir_fds.values():
            os.close(fd)
        self._dir_fds.clear()

    def _split(self, path: str) -> tuple[int, str]:
        head, _, name = path.rpartition("/")
        return self._dir_fd(head), name

    # ------------------------------------------------------------------ data

    def _write(self, fd: int, size: int, offset: int | None = None) -> int:
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
        fd = os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dfd)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OpFailedError(f"{path!r} is not a regular file")
        return fd

    # ------------------------------------------------------------------ ops

    def apply(self, op: Op) -> int:
        try:
            return self._apply(op)
        except NoSpaceError:
            raise
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise NoSpaceError(f"{op.op} {op.path}: no space left") from None
            raise OpFailedError(f"{op.op} {op.path!r}: {exc.strerror}") from None

    def _apply(self, op: Op) -> int:
        kind = op.op
        if kind == "create":
            fd = self._open_file(op.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            try:
                self._write(fd, op.size)
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
                self._drop_dir_fds()
            except PermissionError:
                # Linux reports EPERM (not EISDIR) for unlink of a directory on some fs.
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                if not stat.S_ISDIR(st.st_mode):
                    raise
                os.rmdir(name, dir_fd=dfd)
                self._drop_dir_fds()
            return 0
        if kind == "rename":
            sfd, sname = self._split(op.path)
            dfd, dname = self._split(op.dest)
            os.rename(sname, dname, src_dir_fd=sfd, dst_dir_fd=dfd)
            if op.path in self._dir_fds or any(k.startswith(op.path + "/") for k in self._dir_fds):
                self._drop_dir_fds()
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
            os.mknod(name, _SPECIAL_MODES[op.label] | 0o644, 0, dir_fd=dfd)
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


def check_target_dir(path: Path, *, force: bool = False) -> Path:
    """Refuse '/', a non-directory, and a directory that is neither empty nor marked as an fsage
    working directory (unless ``force``); mark it. Returns the resolved path."""
    real = Path(os.path.realpath(path))
    if real == Path("/"):
        raise UnsafeTargetError("refusing to age '/'")
    if not real.is_dir():
        raise UnsafeTargetError(f"{path} is not a directory")
    try:
        names = set(os.listdir(real))
    except OSError as exc:
        raise UnsafeTargetError(f"cannot list {path}: {exc.strerror}") from None
    if names - IGNORED_NAMES and MARKER not in names and not force:
        raise UnsafeTargetError(
            f"{path} is not empty and not an fsage working directory (use --force to age it anyway)"
        )
    marker = real / MARKER
    if marker.is_symlink():
        raise UnsafeTargetError(f"{marker} is a symlink")
    if not marker.exists():
        marker.write_text("{}\n", encoding="utf-8")
    return real
