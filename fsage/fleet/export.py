"""`fsage export`: a database's history as a Parquet dataset (see ``fsage.fleet``).

Incremental: for each file system, only snapshots newer than the newest one already in the
dataset are exported. The small per-snapshot tables keep one file per partition (rewritten with
the old rows plus the new ones, so that a fleet query opens one file per file system); file
versions, their ends and free extents get one new file per run (more for a large run, one per
``FILE_GROUPS`` row groups: see ``fsage.fleet.dataset``). Every file is written under a
temporary name and renamed into place, the ``snapshots`` table last: a run that fails leaves the
dataset as it was (a half-written run's files are replaced by the next run, whose names are the
same).

File versions follow the store's model: a row is a version of a file (its inode fields, first
path and extents) as first seen in ``first_snapshot``; ``file_ends`` says in which exported
snapshot it was last valid. A version is part of snapshot S when ``first_snapshot <= S`` and it
has no end before S. A version changes when the store would store a new one (same digest).
"""

from __future__ import annotations

import contextlib
import errno
import shutil
import socket
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np
import numpy.typing as npt

from fsage import paged, scratch
from fsage.db.store import SnapshotRow, Store
from fsage.fleet import SMALL_TABLES, TABLES
from fsage.fleet.dataset import remove_stale_temporaries, run_file
from fsage.fleet.export_dataset import (
    PendingFiles,
    export_lock,
    exported_upto,
    last_valid,
    open_versions,
    read_table,
)
from fsage.fleet.export_metrics import metric_rows_taking, snapshot_row, without_unread
from fsage.fleet.export_rows import FirstPaths, diff_versions, files_table, new_rows_mask
from fsage.fleet.export_schema import ADDED_COLUMNS as ADDED_COLUMNS
from fsage.fleet.export_schema import DICTIONARY, table_metadata
from fsage.fleet.export_schema import ExportError as ExportError
from fsage.fleet.export_schema import partition_dir as partition_dir
from fsage.fleet.export_schema import require_pyarrow as require_pyarrow
from fsage.fleet.export_schema import schemas as schemas
from fsage.fleet.export_stream import (
    FILES_CHUNK,
    FREE_ROWS,
    KEY,
    OPEN_SHARE,
    Keys,
    RowGroups,
    _write_ends,
    _write_free,
    export_snapshot,
)
from fsage.fleet.export_study import export_studies
from fsage.heap import give_back_freed
from fsage.private import private_mkdir

I64 = npt.NDArray[np.int64]


# Progress units of one snapshot: a share of it done is shown as a share of these, so that the
# parts of a large snapshot move the line while they are read.
STEPS = 100


@dataclass
class FsExport:
    host: str
    fs: str
    new_snapshots: int
    first: int | None
    last: int | None
    versions: int = 0

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class ExportSummary:
    directory: str
    host: str
    filesystems: list[FsExport] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def new_snapshots(self) -> int:
        return sum(f.new_snapshots for f in self.filesystems)

    def to_json(self) -> dict[str, Any]:
        return {
            "directory": self.directory,
            "host": self.host,
            "new_snapshots": self.new_snapshots,
            "seconds": self.seconds,
            "filesystems": [f.to_json() for f in self.filesystems],
        }

    def line(self) -> str:
        parts = [
            f"{f.fs}: {f.new_snapshots} new" + (f" ({f.first}-{f.last})" if f.first else "")
            for f in self.filesystems
        ]
        return (
            f"exported {self.new_snapshots} snapshot(s) of host {self.host} to {self.directory}"
            f" in {self.seconds:.2f} s" + (": " + "; ".join(parts) if parts else "")
        )


def trim_heap() -> None:
    """Give the C library's freed memory back to the system. glibc keeps a freed heap whose
    top is still in use (and raises its mmap threshold after large frees, so that the next
    snapshot's arrays land in that heap): without this a run's resident memory grows by a
    snapshot's worth of arrays after the first, and the peak is two snapshots, not one. The
    paged arrays' pages leave the resident set too (``paged.release``)."""
    give_back_freed()
    paged.release()


def export_parquet(
    db: Path,
    out: Path,
    *,
    host: str | None = None,
    fs_names: list[str] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> ExportSummary:
    """Export the snapshots of ``db`` not yet in ``out`` (see the module docstring)."""
    from fsage.fleet.allocator import system_memory_pool

    with contextlib.suppress(ImportError):  # require_pyarrow says so
        system_memory_pool()
    pa = require_pyarrow()
    import pyarrow.parquet as pq

    t0 = time.monotonic()
    host = host or socket.gethostname()
    if not host:
        raise ExportError("no host name: pass --host")
    if out.exists() and not out.is_dir():
        raise ExportError(f"{out} exists and is not a directory")
    summary = ExportSummary(str(out), host)
    with Store.open(db) as store:
        try:
            private_mkdir(out, parents=True, exist_ok=True)
        except OSError as exc:
            raise ExportError(f"{out}: {exc.strerror}") from None
        try:
            return _export_locked(store, db, out, host, fs_names, progress, summary, pa, pq, t0)
        except OSError as exc:  # a full disk, say: what was written is removed (abort)
            raise ExportError(_write_failure(out, exc)) from None
        except sqlite3.OperationalError as exc:  # its scratch databases' disk full, say; the
            # store's own errors (a damaged database) are the CLI's to name
            if getattr(exc, "sqlite_errorcode", None) != sqlite3.SQLITE_FULL:
                raise
            raise ExportError(_write_failure(out, exc)) from None


def _write_failure(out: Path, exc: BaseException) -> str:
    """What went wrong writing the dataset or the scratch beside it; when a disk may be full,
    how much room each of the two has."""
    first = str(exc).splitlines()[0] if str(exc) else repr(exc)
    code = getattr(exc, "errno", None)
    # a short write (numpy's: "N requested and M written") carries no errno
    full = code in (errno.ENOSPC, errno.EDQUOT) or "is full" in first or code is None
    if not full:
        return f"{out}: cannot write the dataset: {first}"
    where = scratch.base(out)
    room = []
    for name, path in (("the dataset", out), ("scratch", where)):
        with contextlib.suppress(OSError):
            use = shutil.disk_usage(path)
            room.append(f"{name} in {path}: {use.free >> 20:,} of {use.total >> 20:,} MiB free")
    return (
        f"{out}: cannot write the dataset: {first} ({'; '.join(room)}; the export's scratch"
        f" takes some 200 bytes a file of a snapshot, and {scratch.ENV} names another place)"
    )


def _export_locked(
    store: Store,
    db: Path,
    out: Path,
    host: str,
    fs_names: list[str] | None,
    progress: Callable[[int, int], None] | None,
    summary: ExportSummary,
    pa: Any,
    pq: Any,
    t0: float,
) -> ExportSummary:
    from fsage.fleet.compact import shared

    with shared(out), export_lock(out, host):
        # what an export of this host killed before its commit left (its lock is ours now)
        remove_stale_temporaries(
            [d for t in TABLES for d in (out / t).glob(f"host={quote(host, safe='')}/fs=*")]
        )
        known = [f["name"] for f in store.filesystems()]
        names = fs_names if fs_names else known
        for name in names:
            if name not in known:
                raise ExportError(f"no file system named {name!r} in {db}")
        plans = []
        for name in names:
            rows = store.snapshots(name)
            done, uuid = exported_upto(pq, out, host, name)
            if uuid is not None and rows and rows[0].uuid != uuid:
                raise ExportError(
                    f"{out} holds {host}/{name} with UUID {uuid}, but {db} has UUID "
                    f"{rows[0].uuid} under that name"
                )
            plans.append((name, [r for r in rows if done is None or r.id > done]))
        total = STEPS * sum(len(p[1]) for p in plans)
        count = 0
        if progress is not None and total:
            progress(0, total)  # on a terminal, a line at once: a large snapshot takes a while
        writer = PendingFiles(out)
        try:
            for name, rows in plans:
                fx = FsExport(host, name, len(rows), rows[0].id if rows else None,
                              rows[-1].id if rows else None)  # fmt: skip
                summary.filesystems.append(fx)
                if not rows:
                    continue

                def tick(units: int) -> None:
                    nonlocal count
                    count += units
                    if progress is not None:
                        progress(count, total)

                fx.versions = _export_fs(pa, pq, store, out, host, name, rows, writer, tick)
            export_studies(pa, pq, store, out, host, writer)
            writer.commit()
        except BaseException:
            writer.abort()
            raise
    summary.seconds = time.monotonic() - t0
    return summary


def _export_whole(
    pa: Any,
    sch: dict[str, Any],
    large: dict[str, Any],
    host: str,
    store: Store,
    row: SnapshotRow,
    prev_keys: Keys,
    cur_keys: Keys,
    ended_at: int,
    tick: Callable[[float], None],
) -> tuple[dict[str, Any], Any, int]:
    """One snapshot exported from its layout rebuilt whole (``export_stream`` does it a part
    at a time): the path of chunks written before per-column checksums."""
    fs = row.fs_name
    layout = store.load_layout(row.id, by_column=True)
    trim_heap()  # the stored chunks it was assembled from
    tick(1 / 3)
    snap = snapshot_row(host, row, layout)
    prev = prev_keys.upto(None)
    new_rows, cur, ended = diff_versions(prev, layout)
    _write_ends(pa, sch, large, host, fs, prev, ended, ended_at)
    # in chunks, their paths too: the Arrow columns or the path strings of a first
    # snapshot's every file at once would each be as large again as the snapshot
    paths = FirstPaths(layout.links, layout.root_ino)
    for lo in range(0, new_rows.size, FILES_CHUNK):
        table = files_table(
            pa, sch["files"], host, fs, row.id, layout,
            new_rows[lo : lo + FILES_CHUNK], cur["digest"], paths,
        )  # fmt: skip
        large["files"].write_table(table)
        del table
    del paths
    _write_free(pa, sch, large, host, fs, row.id, layout)
    cur["first"] = np.where(new_rows_mask(new_rows, len(cur["ino"])), row.id, cur["first"])
    rec = np.zeros(cur["ino"].size, KEY)
    for name in KEY.names or ():
        rec[name] = cur[name]
    cur_keys.add(rec)
    added = int(new_rows.size)
    del cur, new_rows, rec
    # the figures last, with only the columns they read: the analyzer's arrays and
    # the snapshot's other columns are not held at once
    held = [without_unread(layout)]
    del layout  # the figures take the one reference left (held)
    trim_heap()
    tick(2 / 3)
    figures = metric_rows_taking(host, row, held, trim_heap)
    tick(1.0)
    return snap, figures, added


def _export_fs(
    pa: Any,
    pq: Any,
    store: Store,
    out: Path,
    host: str,
    fs: str,
    rows: list[SnapshotRow],
    writer: PendingFiles,
    tick: Callable[[int], None],
) -> int:
    """``tick(units)``: so many more of the ``STEPS`` units of each snapshot are done."""
    sch = schemas()

    def opener(name: str) -> Callable[[int], Any]:
        def open_file(k: int) -> Any:
            file = run_file(rows[0].id, rows[-1].id, k)
            return pq.ParquetWriter(
                writer.path(partition_dir(out, name, host, fs) / file),
                sch[name].with_metadata(table_metadata(name)),
                compression="zstd",
                use_dictionary=DICTIONARY,
            )

        return open_file

    large = {
        name: RowGroups(pa, opener(name), FREE_ROWS if name == "free_extents" else FILES_CHUNK)
        for name in ("files", "file_ends", "free_extents")
    }
    small: dict[str, list[dict[str, Any]]] = {name: [] for name in SMALL_TABLES}
    versions = 0
    with scratch.directory("export", near=out) as tmp:
        prev = Keys.of(tmp / "keys-0", open_versions(pq, out, host, fs))
        prev_id = -1
        try:
            for n, row in enumerate(rows):
                ended_at = last_valid(prev_id, row.id, out, host, fs, pq)
                cur = Keys(tmp / f"keys-{n + 1}")
                shown = 0

                def share(done: float) -> None:
                    nonlocal shown
                    units = min(int(done * STEPS), STEPS)
                    if units > shown:
                        tick(units - shown)
                        shown = units

                def opening(done: float) -> None:
                    share(OPEN_SHARE * done)

                with store.snapshot_parts(row.id, done=opening) as (held, sp):
                    if sp is not None:
                        snap, (m, buckets, free), added = export_snapshot(
                            pa, sch, large, host, row, held, sp, prev, cur, ended_at, tmp, share,
                            trim_heap,
                        )  # fmt: skip
                if sp is None:  # a chunk older than per-column checksums: read whole
                    snap, (m, buckets, free), added = _export_whole(
                        pa, sch, large, host, store, row, prev, cur, ended_at, share
                    )
                share(1.0)
                versions += added
                small["snapshots"].append(snap)
                small["metrics"].append(m)
                small["size_buckets"].extend(buckets)
                small["free_buckets"].extend(free)
                for w in large.values():  # a snapshot's rows in row groups of their own
                    w.flush()
                prev.path.unlink()
                prev, prev_id = cur, row.id
                trim_heap()
        finally:
            for w in large.values():
                w.close()
    for name, new in small.items():
        final = partition_dir(out, name, host, fs) / "part.parquet"
        table = pa.Table.from_pylist(new, schema=sch[name])
        if final.exists():
            old = read_table(pq, final, name, schema=sch[name])
            table = pa.concat_tables([old, table])
        pq.write_table(
            table.replace_schema_metadata(table_metadata(name)),
            writer.path(final),
            compression="zstd",
        )
    return versions
