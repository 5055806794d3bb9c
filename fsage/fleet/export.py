"""`fsage export`: a database's history as a Parquet dataset (see ``fsage.fleet``).

Incremental: for each file system, only snapshots newer than the newest one already in the
dataset are exported. The small per-snapshot tables keep one file per partition (rewritten with
the old rows plus the new ones, so that a fleet query opens one file per file system); file
versions, their ends and free extents get one new file per run. Every file is written under a
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
import fcntl
import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np
import numpy.typing as npt

from fsage.analyzer.analysis import SnapshotAnalyzer, size_bucket
from fsage.analyzer.locality import GAP_BUCKETS
from fsage.db import codec
from fsage.db.store import SnapshotRow, Store
from fsage.errors import FsageError
from fsage.fleet import METADATA_KEY, SCHEMA_VERSION, SMALL_TABLES, TABLES
from fsage.fleet.dataset import file_damage, load_manifest, remove_stale_temporaries, run_range
from fsage.layout import Layout
from fsage.private import private_file, private_mkdir, private_opener

I64 = npt.NDArray[np.int64]


# Progress steps of one snapshot: its layout read, its metrics, its versions and free extents
# written.
STEPS = 3
# File versions converted to Arrow and written at a time.
FILES_CHUNK = 65536


class ExportError(FsageError):
    """The dataset cannot be written or does not match the database."""


def require_pyarrow() -> Any:
    try:
        import pyarrow
    except ImportError:
        raise ExportError("the Parquet export needs pyarrow (pip install 'fsage[fleet]')") from None
    return pyarrow


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


#: Columns added to a table after its first version: files written before them lack them
#: (readers take them as null), so a file without one is not damaged.
ADDED_COLUMNS: dict[str, frozenset[str]] = {
    "metrics": frozenset(
        {
            "same_group_share",
            "inode_to_data_median_blocks",
            "dir_scan_score_aggregate",
            "dir_scan_score_median",
            "neighbour_pairs",
            "neighbour_adjacent_share",
            "neighbour_le_1mib_share",
            "neighbour_le_group_share",
            "neighbour_farther_share",
        }
    ),
}


def schemas() -> dict[str, Any]:
    """The Arrow schema of every table (without the schema-version metadata)."""
    pa = require_pyarrow()
    key = [("host", pa.string()), ("fs", pa.string())]
    snap = [*key, ("snapshot_id", pa.int64())]
    extent = pa.struct(
        [
            ("logical", pa.int64()),
            ("physical", pa.int64()),
            ("length", pa.int64()),
            ("flags", pa.int32()),
        ]
    )
    meta = pa.struct([("physical", pa.int64()), ("kind", pa.int32())])
    ts = pa.timestamp("us", tz="UTC")
    i64, f64, s = pa.int64(), pa.float64(), pa.string()
    return {
        "snapshots": pa.schema(
            [
                *snap,
                ("taken_at", ts),
                ("uuid", s),
                ("kind", s),
                ("label", s),
                ("source", s),
                ("block_size", i64),
                ("blocks_total", i64),
                ("blocks_used", i64),
                ("blocks_free", i64),
                ("inodes_total", i64),
                ("inodes_free", i64),
                ("files", i64),
                ("dirs", i64),
                ("extents", i64),
                ("free_extents", i64),
                ("damaged", i64),
                ("new_files", i64),
                ("changed_files", i64),
                ("deleted_files", i64),
                ("seconds", f64),
                ("op_count", i64),
                ("bytes_written", i64),
                ("recreation_of", i64),
            ]
        ),
        "metrics": pa.schema(
            [
                *snap,
                ("taken_at", ts),
                ("block_size", i64),
                ("blocks_total", i64),
                ("blocks_free", i64),
                ("files", i64),
                ("directories", i64),
                ("data_blocks", i64),
                ("layout_score", f64),
                ("directories_layout_score", f64),
                ("scored_files", i64),
                ("fragmented_files", i64),
                ("mean_file_score", f64),
                ("fragments_per_file", f64),
                ("free_extent_count", i64),
                ("largest_free_extent", i64),
                ("average_free_extent", f64),
                ("free_chunks", i64),
                ("chunks_total", i64),
                ("chunk_bytes", i64),
                ("dynamic_layout_score_inode", f64),
                ("dynamic_layout_score_path", f64),
                # locality between files (SnapshotAnalyzer.locality)
                ("same_group_share", f64),
                ("inode_to_data_median_blocks", f64),
                ("dir_scan_score_aggregate", f64),
                ("dir_scan_score_median", f64),
                ("neighbour_pairs", i64),
                ("neighbour_adjacent_share", f64),
                ("neighbour_le_1mib_share", f64),
                ("neighbour_le_group_share", f64),
                ("neighbour_farther_share", f64),
            ]
        ),
        "size_buckets": pa.schema(
            [
                *snap,
                ("bucket", pa.int32()),
                ("min_blocks", i64),
                ("max_blocks", i64),
                ("files", i64),
                ("blocks", i64),
                ("contiguous", i64),
                ("denominator", i64),
                ("layout_score", f64),
            ]
        ),
        "free_buckets": pa.schema(
            [
                *snap,
                ("min_blocks", i64),
                ("max_blocks", i64),
                ("count", i64),
                ("blocks", i64),
            ]
        ),
        "files": pa.schema(
            [
                *key,
                ("first_snapshot", i64),
                ("ino", i64),
                ("generation", i64),
                ("digest", i64),
                ("mode", i64),
                ("nlink", i64),
                ("uid", i64),
                ("gid", i64),
                ("size", i64),
                ("atime_ns", i64),
                ("mtime_ns", i64),
                ("ctime_ns", i64),
                ("crtime_ns", i64),
                ("flags", i64),
                ("damaged", i64),
                ("path", s),
                ("extents", pa.list_(extent)),
                ("meta_blocks", pa.list_(meta)),
            ]
        ),
        "file_ends": pa.schema(
            [*key, ("ino", i64), ("first_snapshot", i64), ("last_snapshot", i64)]
        ),
        "free_extents": pa.schema([*snap, ("start", i64), ("length", i64)]),
    }


def _read_table(pq: Any, path: Path, table: str, **kw: Any) -> Any:
    """One file of the dataset, read; a damaged one is one line naming it."""
    import pyarrow as pa

    why = file_damage(path, table)
    if why is None:
        try:
            return pq.read_table(path, **kw)
        except (pa.ArrowException, OSError, ValueError) as exc:
            why = f"cannot be read ({str(exc).splitlines()[0] if str(exc) else exc!r})"
    raise ExportError(
        f"{path}: {why} (move it away and export again: the next run rewrites what it held)"
    )


def partition_dir(root: Path, table: str, host: str, fs: str) -> Path:
    return root / table / f"host={quote(host, safe='')}" / f"fs={quote(fs, safe='')}"


def _metadata(table: str) -> dict[bytes, bytes]:
    return {METADATA_KEY: json.dumps({"schema_version": SCHEMA_VERSION, "table": table}).encode()}


@contextmanager
def _locked(root: Path, host: str) -> Iterator[None]:
    lock = root / f".export-{quote(host, safe='')}.lock"
    with open(lock, "a", opener=private_opener) as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ExportError(f"another export of host {host} into {root} is running") from None
        yield


class _Writer:
    """Collects files under temporary names; ``commit`` renames them into place."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.pending: list[tuple[Path, Path]] = []

    def path(self, final: Path) -> Path:
        private_mkdir(final.parent, parents=True, exist_ok=True)
        tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
        self.pending.append((tmp, final))
        return private_file(tmp)

    def commit(self) -> None:
        # The snapshots table marks what is exported: it goes last.
        order = sorted(self.pending, key=lambda p: p[1].parts[-4] == "snapshots")
        for tmp, final in order:
            tmp.replace(final)
        self.pending.clear()

    def abort(self) -> None:
        for tmp, _ in self.pending:
            tmp.unlink(missing_ok=True)
        self.pending.clear()


def export_parquet(
    db: Path,
    out: Path,
    *,
    host: str | None = None,
    fs_names: list[str] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> ExportSummary:
    """Export the snapshots of ``db`` not yet in ``out`` (see the module docstring)."""
    from fsage.fleet.compact import system_memory_pool

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
        return _export_locked(store, db, out, host, fs_names, progress, summary, pa, pq, t0)


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

    with shared(out), _locked(out, host):
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
            done, uuid = _exported(pq, out, host, name)
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
        writer = _Writer(out)
        try:
            for name, rows in plans:
                fx = FsExport(host, name, len(rows), rows[0].id if rows else None,
                              rows[-1].id if rows else None)  # fmt: skip
                summary.filesystems.append(fx)
                if not rows:
                    continue

                def tick() -> None:
                    nonlocal count
                    count += 1
                    if progress is not None:
                        progress(count, total)

                fx.versions = _export_fs(pa, pq, store, out, host, name, rows, writer, tick)
            writer.commit()
        except BaseException:
            writer.abort()
            raise
    summary.seconds = time.monotonic() - t0
    return summary


def _exported(pq: Any, out: Path, host: str, fs: str) -> tuple[int | None, str | None]:
    """Newest exported snapshot id of a file system and its UUID (None, None if none), in the
    compacted files (their watermark) or its own partition."""
    covered = load_manifest(out).covered.get((host, fs))
    done, uuid = covered if covered else (None, None)
    part = partition_dir(out, "snapshots", host, fs) / "part.parquet"
    if not part.exists():
        return done, uuid
    t = _read_table(pq, part, "snapshots", columns=["snapshot_id", "uuid"])
    if t.num_rows == 0:
        return done, uuid
    ids = t.column("snapshot_id").to_numpy()
    last = int(np.argmax(ids))
    if done is not None and done >= int(ids[last]):
        return done, uuid
    return int(ids[last]), str(t.column("uuid")[last].as_py())


def _partition_rows(pq: Any, out: Path, table: str, host: str, fs: str, columns: list[str]) -> Any:
    """The rows of one file system in a large table: its part of the compacted files and its
    export runs newer than their watermark (None if there are none)."""
    import pyarrow as pa

    manifest = load_manifest(out)
    mark = manifest.watermark(host, fs)
    tables = []
    if mark is not None:
        for rel in manifest.tables.get(table, []):
            tables.append(
                _read_table(
                    pq,
                    out / table / rel,
                    table,
                    columns=columns,
                    filters=[("host", "=", host), ("fs", "=", fs)],
                )
            )
    pdir = partition_dir(out, table, host, fs)
    for p in sorted(pdir.glob("s*.parquet")) if pdir.exists() else []:
        rng = run_range(p)
        if mark is not None and rng is not None and rng[1] <= mark:
            continue
        tables.append(_read_table(pq, p, table, columns=columns))
    return pa.concat_tables(tables) if tables else None


def _open_versions(pq: Any, out: Path, host: str, fs: str) -> dict[str, I64]:
    """Keys of the versions valid in the newest exported snapshot, in ino order."""
    empty = np.zeros(0, np.int64)
    cols = ["ino", "generation", "digest", "first_snapshot"]
    t = _partition_rows(pq, out, "files", host, fs, cols)
    if t is None or t.num_rows == 0:
        return {"ino": empty, "generation": empty, "digest": empty, "first": empty}
    ino = t.column("ino").to_numpy().astype(np.int64)
    first = t.column("first_snapshot").to_numpy().astype(np.int64)
    alive = np.ones(ino.size, bool)
    e = _partition_rows(pq, out, "file_ends", host, fs, ["ino", "first_snapshot"])
    if e is not None and e.num_rows:
        ended = set(
            zip(
                e.column("ino").to_numpy().tolist(),
                e.column("first_snapshot").to_numpy().tolist(),
                strict=True,
            )
        )
        alive = np.fromiter(
            ((i, f) not in ended for i, f in zip(ino.tolist(), first.tolist(), strict=True)),
            bool,
            ino.size,
        )
    idx = np.flatnonzero(alive)
    order = idx[np.argsort(ino[idx], kind="stable")]
    return {
        "ino": ino[order],
        "generation": t.column("generation").to_numpy().astype(np.int64)[order],
        "digest": t.column("digest").to_numpy().astype(np.int64)[order],
        "first": first[order],
    }


def _export_fs(
    pa: Any,
    pq: Any,
    store: Store,
    out: Path,
    host: str,
    fs: str,
    rows: list[SnapshotRow],
    writer: _Writer,
    tick: Callable[[], None],
) -> int:
    sch = schemas()
    tag = f"s{rows[0].id:010d}-{rows[-1].id:010d}.parquet"
    large = {
        name: pq.ParquetWriter(
            writer.path(partition_dir(out, name, host, fs) / tag),
            sch[name].with_metadata(_metadata(name)),
            compression="zstd",
        )
        for name in ("files", "file_ends", "free_extents")
    }
    small: dict[str, list[dict[str, Any]]] = {name: [] for name in SMALL_TABLES}
    prev = _open_versions(pq, out, host, fs)
    prev_id = -1
    versions = 0
    try:
        for row in rows:
            layout = store.load_layout(row.id)
            tick()
            small["snapshots"].append(_snapshot_row(host, row, layout))
            m, buckets, free = _metrics(host, row, layout)
            tick()
            small["metrics"].append(m)
            small["size_buckets"].extend(buckets)
            small["free_buckets"].extend(free)
            new_rows, cur, ended = _diff(prev, layout)
            last_valid = _last_valid(prev_id, row.id, out, host, fs, pq)
            large["file_ends"].write_table(
                pa.table(
                    {
                        "host": pa.array([host] * ended.size, pa.string()),
                        "fs": pa.array([fs] * ended.size, pa.string()),
                        "ino": prev["ino"][ended],
                        "first_snapshot": prev["first"][ended],
                        "last_snapshot": np.full(ended.size, last_valid, np.int64),
                    },
                    schema=sch["file_ends"],
                )
            )
            # in chunks: the Arrow columns of a first snapshot's every file at once would be
            # as large again as the snapshot
            paths = layout.paths() if new_rows.size else {}
            for lo in range(0, new_rows.size, FILES_CHUNK):
                chunk = new_rows[lo : lo + FILES_CHUNK]
                table = _files_table(
                    pa, sch["files"], host, fs, row.id, layout, chunk, cur["digest"], paths
                )
                large["files"].write_table(table)
            del paths
            versions += int(new_rows.size)
            free_start = layout.free.start.astype(np.int64)
            large["free_extents"].write_table(
                pa.table(
                    {
                        "host": pa.array([host] * free_start.size, pa.string()),
                        "fs": pa.array([fs] * free_start.size, pa.string()),
                        "snapshot_id": np.full(free_start.size, row.id, np.int64),
                        "start": free_start,
                        "length": layout.free.length.astype(np.int64),
                    },
                    schema=sch["free_extents"],
                )
            )
            first = np.where(new_rows_mask(new_rows, len(cur["ino"])), row.id, cur["first"])
            prev = {**cur, "first": first}
            prev_id = row.id
            del layout, cur, new_rows  # before the next snapshot is read: one in memory
            tick()
    finally:
        for w in large.values():
            w.close()
    for name, new in small.items():
        final = partition_dir(out, name, host, fs) / "part.parquet"
        table = pa.Table.from_pylist(new, schema=sch[name])
        if final.exists():
            old = _read_table(pq, final, name, schema=sch[name])
            table = pa.concat_tables([old, table])
        pq.write_table(
            table.replace_schema_metadata(_metadata(name)),
            writer.path(final),
            compression="zstd",
        )
    return versions


def new_rows_mask(new_rows: I64, n: int) -> npt.NDArray[np.bool_]:
    mask = np.zeros(n, bool)
    mask[new_rows] = True
    return mask


def _last_valid(prev_id: int, snap_id: int, out: Path, host: str, fs: str, pq: Any) -> int:
    """The exported snapshot before ``snap_id`` (in this run or an earlier one)."""
    if prev_id >= 0:
        return prev_id
    done, _ = _exported(pq, out, host, fs)
    return done if done is not None else snap_id - 1


def _diff(prev: dict[str, I64], layout: Layout) -> tuple[I64, dict[str, I64], I64]:
    """New version rows of ``layout.files``, its keys (with the carried first snapshot),
    and the rows of ``prev`` that ended."""
    files = layout.files
    link_file = codec.link_files(files, layout.links)
    digest = codec.file_digests(files, layout.links, link_file).view(np.int64)
    ino = files.ino.astype(np.int64)
    gen = files.generation.astype(np.int64)
    n_prev = prev["ino"].size
    first = np.full(ino.size, -1, np.int64)
    if n_prev:
        pos = np.searchsorted(prev["ino"], ino)
        pos_c = np.minimum(pos, n_prev - 1)
        same = (
            (pos < n_prev)
            & (prev["ino"][pos_c] == ino)
            & (prev["generation"][pos_c] == gen)
            & (prev["digest"][pos_c] == digest)
        )
        first[same] = prev["first"][pos_c[same]]
        kept = np.zeros(n_prev, bool)
        kept[pos_c[same]] = True
        ended = np.flatnonzero(~kept)
    else:
        same = np.zeros(ino.size, bool)
        ended = np.zeros(0, np.int64)
    order = np.argsort(ino, kind="stable")
    if not np.array_equal(order, np.arange(ino.size)):
        raise ExportError("file table not in inode order")  # Layout guarantees it
    cur = {"ino": ino, "generation": gen, "digest": digest, "first": first}
    return np.flatnonzero(~same), cur, ended


def _files_table(
    pa: Any,
    schema: Any,
    host: str,
    fs: str,
    snap_id: int,
    layout: Layout,
    rows: I64,
    digest: I64,
    paths: dict[int, list[str]],
) -> Any:
    sub = layout.files.take(rows)
    n = len(sub)
    ino = sub.ino.astype(np.int64)
    path_col = [p[0] if (p := paths.get(i)) else None for i in ino.tolist()]
    extent_type = schema.field("extents").type
    meta_type = schema.field("meta_blocks").type
    extents = pa.ListArray.from_arrays(
        pa.array(sub.ext_off.astype(np.int32)),
        pa.StructArray.from_arrays(
            [
                pa.array(sub.ext_logical.astype(np.int64)),
                pa.array(sub.ext_physical.astype(np.int64)),
                pa.array(sub.ext_length.astype(np.int64)),
                pa.array(sub.ext_flags.astype(np.int32)),
            ],
            fields=list(extent_type.value_type),
        ),
        type=extent_type,
    )
    meta = pa.ListArray.from_arrays(
        pa.array(sub.meta_off.astype(np.int32)),
        pa.StructArray.from_arrays(
            [
                pa.array(sub.meta_physical.astype(np.int64)),
                pa.array(sub.meta_kind.astype(np.int32)),
            ],
            fields=list(meta_type.value_type),
        ),
        type=meta_type,
    )
    cols: dict[str, Any] = {
        "host": pa.array([host] * n, pa.string()),
        "fs": pa.array([fs] * n, pa.string()),
        "first_snapshot": np.full(n, snap_id, np.int64),
        "ino": ino,
        "generation": sub.generation.astype(np.int64),
        "digest": digest[rows],
    }
    for name in ("mode", "nlink", "uid", "gid", "size", "flags", "damaged"):
        cols[name] = getattr(sub, name).astype(np.int64)
    for name in ("atime", "mtime", "ctime", "crtime"):
        cols[f"{name}_ns"] = getattr(sub, name).astype(np.int64)
    cols["path"] = pa.array(path_col, pa.string())
    cols["extents"] = extents
    cols["meta_blocks"] = meta
    return pa.table(cols, schema=schema)


def _snapshot_row(host: str, row: SnapshotRow, layout: Layout) -> dict[str, Any]:
    f = layout.facts
    return {
        "host": host,
        "fs": row.fs_name,
        "snapshot_id": row.id,
        "taken_at": row.taken_at,
        "uuid": row.uuid,
        "kind": row.kind,
        "label": row.label,
        "source": row.source,
        "block_size": row.block_size,
        "blocks_total": f.blocks_total,
        "blocks_used": row.blocks_used,
        "blocks_free": row.blocks_free,
        "inodes_total": f.inodes_total,
        "inodes_free": f.inodes_free,
        "files": row.files,
        "dirs": row.dirs,
        "extents": row.extents,
        "free_extents": row.free_extents,
        "damaged": row.damaged,
        "new_files": row.new_files,
        "changed_files": row.changed_files,
        "deleted_files": row.deleted_files,
        "seconds": row.seconds,
        "op_count": row.op_count,
        "bytes_written": row.bytes_written,
        "recreation_of": row.recreation_of,
    }


def _locality_columns(loc: dict[str, Any]) -> dict[str, Any]:
    i2d, nd, ds = loc["inode_to_data_blocks"], loc["neighbour_distance"], loc["directory_scan"]
    return {
        "same_group_share": loc["same_group_share"],
        "inode_to_data_median_blocks": i2d["median"] if i2d else None,
        "dir_scan_score_aggregate": ds["aggregate"],
        "dir_scan_score_median": ds["median"],
        "neighbour_pairs": nd["pairs"],
        **{f"neighbour_{k}_share": nd[f"{k}_share"] for k in GAP_BUCKETS},
    }


def _metrics(
    host: str, row: SnapshotRow, layout: Layout
) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """The per-snapshot figures of `fsage analyze` (summary, by size, free space, dynamic,
    locality)."""
    an = SnapshotAnalyzer(layout, snapshot_id=row.id, taken_at=row.taken_at)
    summ = an.summary()
    free = an.free()
    dyn = an.model(models=(), paths=True)["dynamic_layout_score"]
    key = {"host": host, "fs": row.fs_name, "snapshot_id": row.id}
    metrics = {
        **key,
        "taken_at": row.taken_at,
        "block_size": summ["block_size"],
        "blocks_total": summ["blocks_total"],
        "blocks_free": summ["blocks_free"],
        **{
            k: summ[k]
            for k in (
                "files",
                "directories",
                "data_blocks",
                "layout_score",
                "directories_layout_score",
                "scored_files",
                "fragmented_files",
                "mean_file_score",
                "fragments_per_file",
            )
        },
        "free_extent_count": free["free_extent_count"],
        "largest_free_extent": free["largest_free_extent"],
        "average_free_extent": free["average_free_extent"],
        "free_chunks": free["free_chunks"],
        "chunks_total": free["chunks_total"],
        "chunk_bytes": free["chunk_bytes"],
        "dynamic_layout_score_inode": dyn.get("inode"),
        "dynamic_layout_score_path": dyn.get("path"),
        **_locality_columns(an.locality()),
    }
    buckets = []
    for b in an.by_size():
        den = int(b["blocks"]) - int(b["files"])  # every scored file has blocks >= 2
        score = b["layout_score"]
        buckets.append(
            {
                **key,
                "bucket": int(size_bucket(np.array([b["max_blocks"]], np.int64))[0]),
                "min_blocks": b["min_blocks"],
                "max_blocks": b["max_blocks"],
                "files": b["files"],
                "blocks": b["blocks"],
                "contiguous": round(score * den) if score is not None else 0,
                "denominator": den,
                "layout_score": score,
            }
        )
    free_rows = [
        {
            **key,
            "min_blocks": h["min_blocks"],
            "max_blocks": h["max_blocks"],
            "count": h["count"],
            "blocks": h["blocks"],
        }
        for h in free["free_extents"]
    ]
    return metrics, buckets, free_rows
