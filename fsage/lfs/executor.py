"""Run any workload on an LFS image: ``LfsExecutor(image_path)`` behind the ager's interface."""

from __future__ import annotations

import os
from typing import Any

from fsage.errors import WorkloadError
from fsage.lfs.cleaner import Counters, DiskModel, utilization_histogram, write_cost_metrics
from fsage.lfs.format import LfsNoSpace, is_lfs_image
from fsage.lfs.fs import LFS, LfsOpError
from fsage.workload import Executor, NoSpaceError, Op, OpFailedError

__all__ = ["LfsExecutor", "is_lfs_image", "lfs_metrics", "lfs_utilization"]

_CHUNK = 1 << 20
#: Ops that may take room in the log: their space is made before they start.
_GROWS = frozenset({"create", "append", "overwrite", "mkdir", "rename", "link", "truncate"})


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
        #: The disk model write costs are priced on (seed 001: 15 ms access, 5 MB/s).
        self.disk = DiskModel()
        self._pattern = bytes(range(256)) * (_CHUNK // 256)

    def _write(self, path: str, offset: int, size: int) -> None:
        pos = 0
        while pos < size:
            n = min(_CHUNK, size - pos)
            self.fs.write(path, offset + pos, memoryview(self._pattern)[:n])
            pos += n

    def _mkdirs(self, path: str, made: list[str]) -> None:
        parts = path.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            sub = "/".join(parts[:i])
            if not self.fs.exists(sub):
                self.fs.mkdir(sub)
                made.append(sub)

    def apply(self, op: Op) -> int:
        """Run one op as one operation of the file system (``LFS.atomic``): room for its data
        is made first, and if it fails part way (the log is full even after cleaning, or any
        other error) the file system is left exactly as it was before it. Out of space raises
        ``NoSpaceError``, so the ager turns to deletes as it does on ENOSPC."""
        made: list[str] = []
        undo: list[tuple[str, str, int]] = []
        bs = self.fs.geo.block_size
        need = -(-max(op.size, 0) // bs) + 8 if op.op in _GROWS else 0
        try:
            with self.fs.atomic(need):
                return self._apply(op, made, undo)
        except LfsNoSpace as exc:
            raise NoSpaceError(f"{op.op} {op.path}: no space left ({exc})") from None
        except LfsOpError as exc:
            raise OpFailedError(f"{op.op} {op.path}: {exc}") from None

    def _apply(self, op: Op, made: list[str], undo: list[tuple[str, str, int]]) -> int:
        fs = self.fs
        if op.op == "mkdir":
            self._mkdirs(op.path, made)
            if not fs.exists(op.path):
                fs.mkdir(op.path)
                made.append(op.path)
            return 0
        if op.op == "create":
            self._mkdirs(op.path, made)
            if fs.exists(op.path):
                undo.append(("truncate", op.path, fs.stat(op.path).size))
                fs.truncate(op.path, 0)
            else:
                fs.create(op.path)
                undo.append(("unlink", op.path, 0))
            self._write(op.path, 0, op.size)
            return op.size
        if op.op in ("append", "overwrite"):
            old = fs.stat(op.path).size
            undo.append(("truncate", op.path, old))
            self._write(op.path, old if op.op == "append" else op.offset, op.size)
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
            self._mkdirs(op.dest, made)
            fs.rename(op.path, op.dest)
            return 0
        if op.op == "link":
            self._mkdirs(op.dest, made)
            fs.link(op.path, op.dest)
            return 0
        if op.op in ("fsync", "sync"):
            fs.sync()
            return 0
        if op.op == "snapshot":
            return 0
        if op.op == "setattr":  # the log keeps milliseconds
            mtime_ms = None if op.mtime_ns is None else op.mtime_ns // 1_000_000
            fs.setattr(op.path, mode=op.mode, mtime_ms=mtime_ms)
            return 0
        if op.op in ("punch", "fallocate"):
            # A log has no unwritten extents to reserve or holes to punch in place.
            raise WorkloadError(
                f"op {op.op!r} is not supported on an LFS image (the log writes data only "
                "when it is written; age LFS images with --data write and no punch/fallocate)"
            )
        if op.op in ("symlink", "mknod"):
            raise OpFailedError(f"{op.op} {op.path}: not supported on an LFS image")
        raise WorkloadError(f"op {op.op!r} is not supported on an LFS image")

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

    def aging_metrics(
        self, carried: Counters | None = None, disk: DiskModel | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """What an aging run records for an LFS target: (metrics, utilization).

        metrics: seed 001 EQ 1-6 (``write_cost_metrics``) over ``carried`` (counters of
        earlier opens of the same image in the run) plus this open's counters, the counters
        themselves, the disk model, the cleaning policy and the segment geometry.
        utilization: live and data blocks, their ratio, clean segments and the segment
        utilization histogram (``utilization_histogram``, ten buckets) of the log now."""
        disk = disk or self.disk
        total = Counters()
        if carried is not None:
            total.add(carried)
        total.add(self.fs.counters)
        return lfs_metrics(self.fs, total, disk), lfs_utilization(self.fs)

    def close(self) -> None:
        self.fs.close()


def lfs_metrics(fs: LFS, counters: Counters, disk: DiskModel) -> dict[str, Any]:
    geo = fs.geo
    m: dict[str, Any] = dict(
        write_cost_metrics(
            counters,
            block_size=geo.block_size,
            blocks_per_segment=geo.data_blocks_per_segment,
            disk=disk,
        )
    )
    m["counters"] = counters.to_json()
    m["disk"] = {"access_s": disk.access_s, "bandwidth_bps": disk.bandwidth_bps}
    m["policy"] = fs.policy
    m["block_size"] = geo.block_size
    m["blocks_per_segment"] = geo.blocks_per_segment
    m["data_blocks_per_segment"] = geo.data_blocks_per_segment
    return m


def lfs_utilization(fs: LFS) -> dict[str, Any]:
    geo = fs.geo
    total, live = fs.usage()
    log = list(range(geo.first_log_segment, geo.segments))
    return {
        "data_blocks": total,
        "live_blocks": live,
        "fraction": live / total if total else 0.0,
        "segments": len(log),
        "clean_segments": len(fs.clean),
        "histogram": utilization_histogram(fs.live, geo.data_blocks_per_segment, log),
    }
