"""Run any workload on an LFS image: ``LfsExecutor(image_path)`` behind the ager's interface."""

from __future__ import annotations

import os

from fsage.errors import WorkloadError
from fsage.lfs.cleaner import Counters, DiskModel, write_cost_metrics
from fsage.lfs.format import LfsNoSpace, is_lfs_image
from fsage.lfs.fs import LFS, LfsOpError
from fsage.workload import Executor, Op

__all__ = ["LfsExecutor", "is_lfs_image"]

_CHUNK = 1 << 20


class LfsExecutor(Executor):
    """Ops become calls on the LFS library; file data is a repeating pattern."""

    description = "LFS image through the fsage log-structured file system library"

    def __init__(
        self,
        image_path: str | os.PathLike[str],
        *,
        policy: str | None = None,
        checkpoint_interval: int | None = None,
    ) -> None:
        self.fs = LFS.open(image_path, policy=policy, checkpoint_interval=checkpoint_interval)
        self._pattern = bytes(range(256)) * (_CHUNK // 256)

    def _write(self, path: str, offset: int, size: int) -> None:
        pos = 0
        while pos < size:
            n = min(_CHUNK, size - pos)
            self.fs.write(path, offset + pos, memoryview(self._pattern)[:n])
            pos += n

    def _mkdirs(self, path: str) -> None:
        parts = path.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            sub = "/".join(parts[:i])
            if not self.fs.exists(sub):
                self.fs.mkdir(sub)

    def apply(self, op: Op) -> int:
        fs = self.fs
        try:
            if op.op == "mkdir":
                self._mkdirs(op.path)
                if not fs.exists(op.path):
                    fs.mkdir(op.path)
                return 0
            if op.op == "create":
                self._mkdirs(op.path)
                if fs.exists(op.path):
                    fs.truncate(op.path, 0)
                else:
                    fs.create(op.path)
                self._write(op.path, 0, op.size)
                return op.size
            if op.op == "append":
                self._write(op.path, fs.stat(op.path).size, op.size)
                return op.size
            if op.op == "overwrite":
                self._write(op.path, op.offset, op.size)
                return op.size
            if op.op == "truncate":
                fs.truncate(op.path, op.size)
                return 0
            if op.op == "delete":
                if fs.stat(op.path).mode & 0o170000 == 0o040000:
                    fs.rmdir(op.path)
                else:
                    fs.unlink(op.path)
                return 0
            if op.op == "rename":
                self._mkdirs(op.dest)
                fs.rename(op.path, op.dest)
                return 0
            if op.op in ("fsync", "sync"):
                fs.sync()
                return 0
            return 0  # snapshot markers
        except LfsNoSpace as exc:
            raise WorkloadError(f"LFS image full: {exc}") from None
        except LfsOpError as exc:
            raise WorkloadError(f"{op.op} {op.path}: {exc}") from None

    def capacity_blocks(self) -> tuple[int, int, int]:
        total, live = self.fs.usage()
        return self.fs.geo.block_size, total, live

    @property
    def counters(self) -> Counters:
        return self.fs.counters

    def write_cost(self, disk: DiskModel | None = None) -> dict[str, float]:
        """Seed 001 EQ 1-6 over what this executor wrote (see ``cleaner.write_cost_metrics``)."""
        geo = self.fs.geo
        return write_cost_metrics(
            self.fs.counters,
            block_size=geo.block_size,
            blocks_per_segment=geo.data_blocks_per_segment,
            disk=disk or DiskModel(),
        )

    def close(self) -> None:
        self.fs.close()
