"""The offline executor: runs ops on an unmounted ext2/3/4 image through libext2fs (no root).

The C side is ``fsage/_ext2fs_writer.c`` (functions ``writer_*`` of ``fsage._ext2fs``). Its
allocator is libext2fs's — block by block, near the previous block — not the kernel's
(mballoc, delayed allocation, preallocation), so layouts made offline differ from layouts made
through a mount; ``OFFLINE_NOTICE`` says so and ``fsage age`` prints it.
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path
from typing import Any

from fsage.errors import SourceError, WorkloadError
from fsage.workload import (
    SPECIAL_MODES,
    Executor,
    NoSpaceError,
    Op,
    OpFailedError,
    symlink_target,
)

OFFLINE_NOTICE = (
    "offline: ops run through libext2fs on the unmounted image; its block allocator is not "
    "the kernel's, so the layout differs from aging through a mount"
)


def _ext() -> Any:
    try:
        from fsage import _ext2fs  # type: ignore[attr-defined,unused-ignore]
    except ImportError as exc:
        raise WorkloadError(
            f"the offline writer needs the fsage._ext2fs extension (build it: pip install -e .): "
            f"{exc}"
        ) from None
    return _ext2fs


class OfflineExtExecutor(Executor):
    """Runs ops on the ext image at ``image`` (which must not be mounted)."""

    def __init__(self, image: Path, *, data: str = "write") -> None:
        if data not in ("write", "fallocate"):
            raise WorkloadError(f"unknown data mode {data!r} (one of write, fallocate)")
        #: "fallocate": creates and appends allocate unwritten blocks instead of writing data.
        self.allocate_only = data == "fallocate"
        self.image = Path(image)
        self._x = _ext()
        codes = self._x.writer_errcodes()
        self._nospace = {
            codes["block_alloc_fail"],
            codes["inode_alloc_fail"],
            codes["dir_no_space"],
            errno.ENOSPC,
        }
        self._notfound = {codes["file_not_found"], errno.ENOENT}
        try:
            self._h: Any = self._x.writer_open(os.fsencode(self.image))
        except self._x.Ext2fsError as exc:
            raise SourceError(
                f"{image}: cannot open for offline writing: {self._msg(exc)}"
            ) from None
        self.description = OFFLINE_NOTICE + (
            " (data allocated with fallocate, not written)" if self.allocate_only else ""
        )

    def _msg(self, exc: BaseException) -> str:
        code = exc.args[0] if exc.args else 0
        what = exc.args[1] if len(exc.args) > 1 else ""
        if isinstance(code, int) and 0 < code < 4096:
            return f"{what}: {os.strerror(code)}"
        return f"{what}: {exc}"

    def _call(self, op: Op, fn: str, *args: Any) -> Any:
        try:
            return getattr(self._x, fn)(self._h, *args)
        except self._x.Ext2fsError as exc:
            code = exc.args[0] if exc.args else 0
            if code in self._nospace:
                raise NoSpaceError(f"{op.op} {op.path}: no space left") from None
            raise OpFailedError(f"{op.op} {op.path!r}: {self._msg(exc)}") from None

    def stat(self, path: str) -> tuple[int, int, int, int]:
        """(ino, mode, size, 512-byte blocks) of ``path`` (no symlink followed)."""
        out: tuple[int, int, int, int] = self._x.writer_stat(self._h, os.fsencode(path))
        return out

    def apply(self, op: Op) -> int:
        kind = op.op
        p = os.fsencode(op.path)
        if kind == "create":
            try:
                if self.allocate_only:
                    self._call(op, "writer_create", p, 0)
                    self._call(op, "writer_fallocate", p, 0, op.size)
                else:
                    self._call(op, "writer_create", p, op.size)
            except NoSpaceError:
                # Undo: the target must look as before the op.
                with contextlib.suppress(self._x.Ext2fsError):
                    self._x.writer_unlink(self._h, p)
                raise
            return op.size
        if kind == "append":
            old = self._call(op, "writer_stat", p)[2]
            try:
                fn = "writer_fallocate" if self.allocate_only else "writer_write"
                self._call(op, fn, p, old, op.size)
            except NoSpaceError:
                self._x.writer_truncate(self._h, p, old)
                raise
            return op.size
        if kind == "overwrite":
            if not self.allocate_only:  # allocated already
                self._call(op, "writer_write", p, op.offset, op.size)
            return op.size
        if kind == "truncate":
            self._call(op, "writer_truncate", p, op.size)
            return 0
        if kind == "punch":
            self._call(op, "writer_punch", p, op.offset, op.size)
            return 0
        if kind == "fallocate":
            old = self._call(op, "writer_stat", p)[2]
            try:
                self._call(op, "writer_fallocate", p, op.offset, op.size)
            except NoSpaceError:
                with contextlib.suppress(self._x.Ext2fsError):
                    self._x.writer_punch(self._h, p, op.offset, op.size)
                    self._x.writer_truncate(self._h, p, old)
                raise
            return 0
        if kind == "allocate-near":
            self.fallocate_from(op.path, op.offset, op.size, int(op.label))
            return 0
        if kind == "mkdir":
            self._call(op, "writer_mkdir", p)
            return 0
        if kind == "delete":
            self._call(op, "writer_unlink", p)
            return 0
        if kind == "rename":
            self._call(op, "writer_rename", p, os.fsencode(op.dest))
            return 0
        if kind == "link":
            self._call(op, "writer_link", p, os.fsencode(op.dest))
            return 0
        if kind == "symlink":
            self._call(op, "writer_symlink", p, os.fsencode(symlink_target(op)))
            return 0
        if kind == "mknod":
            self._call(op, "writer_mknod", p, SPECIAL_MODES[op.label] | 0o644, 0)
            return 0
        if kind == "setattr":
            self._call(op, "writer_setattr", p, op.mode, op.mtime_ns)
            return 0
        if kind in ("fsync", "snapshot"):
            return 0
        if kind == "sync":
            self.flush()
            return 0
        raise WorkloadError(f"unknown op {kind!r}")

    def fallocate_from(self, path: str, offset: int, size: int, goal: int) -> None:
        """The fallocate op with its blocks searched from block ``goal`` on (the kernel's
        allocator takes no such hint; the matcher uses it to fill a chosen free extent)."""
        self._call(Op("fallocate", path, size, offset), "writer_fallocate",
                   os.fsencode(path), offset, size, goal)  # fmt: skip

    def flush(self) -> None:
        try:
            self._x.writer_flush(self._h)
        except self._x.Ext2fsError as exc:
            raise WorkloadError(f"{self.image}: {self._msg(exc)}") from None

    def capacity_blocks(self) -> tuple[int, int, int]:
        bs, total, used = self._x.writer_capacity(self._h)
        return int(bs), int(total), int(used)

    def close(self) -> None:
        if self._h is not None:
            h, self._h = self._h, None
            try:
                self._x.writer_close(h)
            except self._x.Ext2fsError as exc:
                raise WorkloadError(f"{self.image}: {self._msg(exc)}") from None
