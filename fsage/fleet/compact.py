"""`fsage fleet compact`: merge a dataset's many small per-partition files into few large ones.

A central job collects the hosts' export directories into one and runs the compaction; the
fleet queries then open one or a few files per table instead of one per file system. For each
file system the compaction takes everything up to the newest snapshot of its ``snapshots``
rows (its watermark; rows of a file system still being collected wait for the next run) and
writes it, sorted by host, file system and snapshot, into ``DIR/<table>/compacted/``, in row
groups of ``ROW_GROUP`` rows. See ``fsage.fleet.dataset`` for how readers combine the layouts.

Atomic: the new files get names no manifest names yet, then the manifest is replaced (the
commit), then the files it no longer needs are removed. Interrupted anywhere, the dataset reads
as before or as after, and the next run finishes the job. Idempotent: with nothing new, nothing
is written. Small tables are rewritten whole; a large table gets new files per run (one, or
more of ``FILE_GROUPS`` row groups each) until it has ``MAX_LARGE_GENERATIONS`` runs' files,
then it is rewritten whole. `fsage export` into a compacted directory
adds per-partition files beside the compacted ones, as before.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fsage.errors import FsageError
from fsage.fleet import LARGE_TABLES, TABLES
from fsage.fleet.allocator import map_large_buffers, system_memory_pool
from fsage.fleet.damage import damaged_files
from fsage.fleet.dataset import (
    COMPACTED,
    SUMMARY_TABLE,
    Manifest,
    ManifestError,
    TableFiles,
    cover_table,
    dataset_files,
    fsync_dir,
    load_manifest,
    partition_files,
    partition_of,
    remove_stale_temporaries,
    run_range,
    save_manifest,
    stamp,
)
from fsage.fleet.export_schema import DICTIONARY
from fsage.fleet.pieces import PieceWriter, first_piece, piece_name
from fsage.private import private_file, private_mkdir, private_opener

# Rows a compacted file's row groups hold: the row group being gathered comes on top of the
# fixed cost (streaming the free extents of 1.4M files: 42 MiB at 128k rows, 35 MiB at 64k).
ROW_GROUP = 64 * 1024
# DuckDB's own memory (its sorts spill to disk beyond it; a sort of 1.4M file versions failed
# at 24 MB); the Arrow batches on their way to the output come on top, one row group at
# most: the whole peaked at 161 MiB for 100k files, 173 MiB for 1.4M (bench/fleet_memory.py).
MEMORY_LIMIT = "48MB"
# DuckDB's memory where it sorts nothing: reading files in order, and the size summary (its
# joins spill). DuckDB keeps the buffers it used up to its limit: at 48MB the summary of 1000
# file systems x 365 snapshots took the compaction's peak from 170 to 196 MiB.
STREAM_MEMORY_LIMIT = "16MB"
BATCH = 8 * 1024
# File versions are wide (a list of extents each, 190 bytes a row in Arrow), and so are
# snapshots and metrics (about 200 bytes): their row groups are smaller, so that the one being
# gathered stays a few MB. At 64k rows a compaction of 1000 file systems x 365 snapshots held
# 12 MiB of snapshot rows in Arrow and peaked 20 MiB higher.
ROW_GROUPS = {"files": 16 * 1024, "snapshots": 16 * 1024, "metrics": 16 * 1024}
# Row groups of one compacted file: a Parquet writer keeps each row group's column metadata
# until it closes (22 KB a row group of file versions), so a table's rows of a generation go
# to files of this many row groups (``c<generation>.parquet``, then ``..._<k>.parquet``). At
# 11.2M files the compaction peaked at 200 MiB in one file, 185 at 256 groups, 179 at 64.
FILE_GROUPS = 64
# Generations of compacted files a large table may have before it is rewritten whole.
MAX_LARGE_GENERATIONS = 8
# A rewrite of a large table sorts the rows of small file systems a group of up to this many
# rows at a time; a larger file system streams in order. A rewrite of 100 file systems of 2000
# files x 5 snapshots peaked at 163 MiB with groups of 16k rows, 172 with 32k, 182 with 64k;
# 1000 of 100 files took 8.0, 7.1 and 8.3 s of CPU.
SORT_ROWS = 32 * 1024
# Per-partition files one DuckDB query reads at once: DuckDB keeps each open file's state
# beside its memory limit, so a query over thousands of small files costs tens of MB more
# than one over a few dozen. Partitions are merged a group at a time, in the output's order.
FILES_PER_QUERY = 64
LOCK = ".compact.lock"

# Sort order inside the compacted files (host and fs first, then time).
ORDER = {
    "snapshots": "snapshot_id",
    "metrics": "snapshot_id",
    "size_buckets": "snapshot_id, bucket",
    "free_buckets": "snapshot_id, min_blocks",
    "files": "first_snapshot, ino",
    "file_ends": "last_snapshot, ino, first_snapshot",
    "free_extents": "snapshot_id, start",
}


# Called with a stage (a table's name, "check", "summary", "clean") and the line that says
# how far it is; a new stage starts a new line.
Progress = Callable[[str, str], None]


class CompactError(FsageError):
    """The dataset cannot be compacted."""


@dataclass
class CompactSummary:
    directory: str
    generation: int
    filesystems: int = 0
    tables: dict[str, dict[str, int]] = field(default_factory=dict)
    removed: int = 0
    seconds: float = 0.0

    @property
    def changed(self) -> bool:
        return bool(self.tables)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def line(self) -> str:
        if not self.changed:
            return f"{self.directory}: nothing to compact ({self.filesystems} file systems)"
        merged = sum(t["input_files"] for t in self.tables.values())
        rows = sum(t["rows"] for t in self.tables.values())
        return (
            f"compacted {self.directory} (generation {self.generation}): {merged} files into "
            f"{sum(t['output_files'] for t in self.tables.values())}, {rows} rows written, "
            f"{self.filesystems} file systems, {self.removed} files removed in "
            f"{self.seconds:.2f} s"
        )


@contextmanager
def exclusive(root: Path) -> Iterator[None]:
    """The compaction's lock; `fsage export` holds it shared while it writes."""
    with open(root / LOCK, "a", opener=private_opener) as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CompactError(f"an export or compaction of {root} is running") from None
        yield


@contextmanager
def shared(root: Path) -> Iterator[None]:
    """Held by `fsage export` (waits while a compaction of the directory runs)."""
    with open(root / LOCK, "a", opener=private_opener) as fh:
        fcntl.flock(fh, fcntl.LOCK_SH)
        yield


def compact(
    root: Path,
    *,
    keep_sources: bool = False,
    memory_limit: str = MEMORY_LIMIT,
    progress: Progress | None = None,
) -> CompactSummary:
    """Compact the dataset at ``root`` (see the module docstring). With ``keep_sources`` the
    absorbed per-partition files stay (so that rsync does not copy them again); readers skip
    them."""
    try:
        map_large_buffers()
        system_memory_pool()
        import duckdb
        import pyarrow.parquet as pq
    except ImportError:
        raise CompactError(
            "compaction needs duckdb and pyarrow (pip install 'fsage[fleet]')"
        ) from None
    t0 = time.monotonic()
    if not root.is_dir():
        raise CompactError(f"{root} is not a directory")
    if not (root / "snapshots").is_dir():
        raise CompactError(f"no fsage export in {root} (make one: fsage export --db DB {root})")
    with exclusive(root):
        try:
            old = load_manifest(root)
        except ManifestError as exc:
            raise CompactError(str(exc)) from None
        files = dataset_files(root, old)
        if progress is not None:  # a footer read for each: seconds for thousands of files
            progress("check", f"checking {sum(len(tf.all) for tf in files.values()):,} files")
        with duckdb.connect() as check:
            check.execute("SET threads = 1")
            check.execute(f"SET memory_limit = '{memory_limit}'")
            damaged = damaged_files(check, root, files, old)
        if damaged:
            p, why = damaged[0]
            more = f" (and {len(damaged) - 1} more damaged files)" if len(damaged) > 1 else ""
            raise CompactError(f"{p}: {why}{more}; move it away and compact again")
        _remove_leftovers(root)
        tmpdir = root / f".compact-tmp-{os.getpid()}"
        private_mkdir(tmpdir, exist_ok=True)
        con = duckdb.connect()
        try:
            con.execute("SET TimeZone = 'UTC'")
            con.execute("SET enable_progress_bar = false")
            con.execute(f"SET memory_limit = '{memory_limit}'")
            # one thread: each would hold its own sort runs and batches beside the limit
            con.execute("SET threads = 1")
            # a row group's column chunks read as its pages are decoded, not all at once
            con.execute("SET disable_parquet_prefetching = true")
            con.execute(f"SET temp_directory = '{_sql_str(str(tmpdir))}'")
            summary = _compact(con, pq, root, old, files, keep_sources, progress, memory_limit)
        except duckdb.Error as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
            raise CompactError(f"{root}: the dataset cannot be read: {first}") from None
        finally:
            con.close()
            shutil.rmtree(tmpdir, ignore_errors=True)
    summary.seconds = time.monotonic() - t0
    return summary


def _remove_leftovers(root: Path) -> None:
    """What killed exports and compactions left: hidden temporary files beside the files they
    were to replace, and compactions' spill directories (the exclusive lock is ours)."""
    dirs = [root]
    for table in (*TABLES, SUMMARY_TABLE):
        dirs += [root / table / COMPACTED, *(root / table).glob("host=*/fs=*")]
    remove_stale_temporaries(dirs)
    for d in root.glob(".compact-tmp-*"):
        shutil.rmtree(d, ignore_errors=True)


def _set_limit(con: Any, limit: str) -> None:
    con.execute(f"SET memory_limit = '{_sql_str(limit)}'")


def _sql_str(s: str) -> str:
    return s.replace("'", "''")


def _read(paths: list[Path]) -> str:
    files = ", ".join("'" + _sql_str(str(p)) + "'" for p in paths)
    return f"read_parquet([{files}], hive_partitioning = false)"


def _compact(
    con: Any,
    pq: Any,
    root: Path,
    old: Manifest,
    files: dict[str, TableFiles],
    keep: bool,
    progress: Progress | None,
    memory_limit: str,
) -> CompactSummary:
    import duckdb

    from fsage.fleet.export_schema import schemas, table_metadata

    sch = schemas()
    cover_table(con, "old_cover", old.covered)
    # The new watermarks: every file system's newest snapshot row (old or fresh).
    snaps = files["snapshots"]
    new_cover: dict[tuple[str, str], tuple[int, str | None]] = dict(old.covered)
    for batch in _batches(snaps.fresh):
        for host, fs, mark, uuid in con.execute(
            f"SELECT host, fs, max(snapshot_id), arg_max(uuid, snapshot_id) FROM"
            f" {_read(batch)} GROUP BY host, fs"
        ).fetchall():
            prev = new_cover.get((host, fs))
            if prev is None or mark > prev[0]:
                new_cover[(host, fs)] = (int(mark), uuid)
    cover_table(con, "new_cover", new_cover)
    gen = old.generation + 1
    summary = CompactSummary(str(root), old.generation, filesystems=len(new_cover))
    tables = {t: list(old.tables.get(t, [])) for t in TABLES}
    absorbed = dict(old.absorbed)
    written: list[Path] = []
    consumed: list[Path] = []  # per-partition files wholly in the compacted files
    for table in TABLES:
        tf = files[table]
        take, absorb = _absorbable(con, table, tf, new_cover)
        if not take:
            continue
        whole = table not in LARGE_TABLES or _generations(tf.compacted) + 1 > MAX_LARGE_GENERATIONS
        inputs = (tf.compacted if whole else []) + take
        out = root / table / COMPACTED / f"c{gen:06d}.parquet"
        step = None
        if progress is not None:
            # a large table writes every row it reads: their number is in the footers
            large = table in LARGE_TABLES
            total = sum(pq.read_metadata(p).num_rows for p in inputs) if large else None
            step = functools.partial(_table_progress, progress, table, total)
            step(0)
        schema = sch[table].with_metadata(table_metadata(table))
        wrote: tuple[int, list[Path]] | None = None  # rows, files
        if table in LARGE_TABLES:
            # an export writes each run in the compacted order, and each compaction appends
            # later runs: read in that order, no sort
            src = _in_order(con, pq, table, tf.compacted if whole else [], take)
            with contextlib.suppress(_Unordered):
                wrote = _write(con, pq, src, out, schema, table, step, check=True)
        if wrote is None and _unfiltered(table, tf, take, absorb, whole, old):
            # each file is sorted and taken whole: read in (host, fs) order, no sort
            src = _concatenated(take)
            _set_limit(con, STREAM_MEMORY_LIMIT)
            try:
                wrote = _write(con, pq, src, out, schema, table, step, check=True)
            except (_Unordered, duckdb.OutOfMemoryException):
                pass  # the sort below, at the full limit
            finally:
                _set_limit(con, memory_limit)
        if wrote is None:
            src = _selects(con, table, tf, take, whole)
            wrote = _write(con, pq, src, out, schema, table, step)
        rows, outs = wrote
        written.extend(outs)
        rels = [f"{COMPACTED}/{o.name}" for o in outs]
        tables[table] = rels if whole else [*tables[table], *rels]
        summary.tables[table] = {
            "input_files": len(inputs),
            "output_files": len(outs),
            "rows": rows,
        }
        consumed.extend(absorb)
        for p in absorb:
            if table not in LARGE_TABLES:
                absorbed[str(p.relative_to(root))] = stamp(p)
    if written and (
        SUMMARY_TABLE not in old.tables or {"metrics", "size_buckets"} & set(summary.tables)
    ):
        if progress is not None:
            progress("summary", "writing the size summary")
        out = _write_summary(con, pq, root, tables, gen, memory_limit)
        written.append(out)
        tables[SUMMARY_TABLE] = [f"{COMPACTED}/{out.name}"]
    if written:
        for d in {p.parent for p in written}:
            fsync_dir(d)
        new = Manifest(gen, tables, new_cover, absorbed)
        _commit(root, new)
        summary.generation = gen
    else:
        new = old
    if not keep:  # and what an earlier run absorbed but did not get to remove
        for table in TABLES:
            fresh = set(files[table].fresh)
            consumed.extend(p for p in partition_files(root, table) if p not in fresh)
    if progress is not None and not keep and consumed:
        progress("clean", f"removing {len(consumed):,} merged files")
    summary.removed = _clean(root, new, [] if keep else consumed)
    gone = [rel for rel in new.absorbed if not (root / rel).exists()]
    if gone:
        # a removed file's inode may be given to the next file an export writes at its path:
        # the manifest names only absorbed files that are still there
        kept = {k: v for k, v in new.absorbed.items() if k not in gone}
        _commit(root, replace(new, absorbed=kept))
    return summary


def _table_progress(progress: Progress, table: str, total: int | None, rows: int) -> None:
    of = "" if total is None else f" of {total:,}"
    progress(table, f"compacting {table}: {rows:,}{of} rows written")


def _absorbable(
    con: Any, table: str, tf: TableFiles, cover: dict[tuple[str, str], tuple[int, str | None]]
) -> tuple[list[Path], list[Path]]:
    """The fresh files with rows to compact, and those of them that the compaction takes
    whole (they can be removed afterwards)."""
    take: list[Path] = []
    whole: list[Path] = []
    tops: dict[str, int | None] = {}
    for batch in _batches(tf.fresh) if table not in LARGE_TABLES else []:
        tops.update(
            con.execute(
                "SELECT filename, max(snapshot_id) FROM"
                f" {_read(batch)[:-1]}, filename = true) GROUP BY filename"
            ).fetchall()
        )
    for p in tf.fresh:
        mark = cover.get(partition_of(p))
        if mark is None:
            continue  # no snapshot row yet: still being collected
        if table in LARGE_TABLES:
            rng = run_range(p)
            if rng is not None and rng[1] <= mark[0]:
                take.append(p)
                whole.append(p)
            continue
        top = tops.get(str(p))
        take.append(p)
        if top is None or top <= mark[0]:
            whole.append(p)
    return take, whole


def _batches(paths: list[Path]) -> Iterator[list[Path]]:
    for lo in range(0, len(paths), FILES_PER_QUERY):
        yield paths[lo : lo + FILES_PER_QUERY]


Key = tuple[str, str]


def _groups(keys: list[Key], files: dict[Key, list[Path]]) -> Iterator[list[Key]]:
    """Consecutive (host, fs) keys whose per-partition files number at most
    ``FILES_PER_QUERY`` (a partition with more is a group of its own)."""
    group: list[Key] = []
    count = 0
    for key in keys:
        n = len(files.get(key, []))
        if group and count + n > FILES_PER_QUERY:
            yield group
            group, count = [], 0
        group.append(key)
        count += n
    if group:
        yield group


def _selects(
    con: Any, table: str, tf: TableFiles, take: list[Path], whole: bool
) -> Iterator[list[str]]:
    """The queries whose rows, one after the other, are the compacted file: one per group of
    partitions in (host, fs) order (DuckDB compares strings as bytes, as Python compares
    their code points), each sorted within."""
    files: dict[Key, list[Path]] = {}
    for p in take:
        files.setdefault(partition_of(p), []).append(p)
    compacted = tf.compacted if whole else []
    _, held = _holding(con, compacted)
    for group in _groups(sorted(set(files) | set(held)), files):
        paths = [p for key in group for p in files.get(key, [])]
        yield [
            _select(table, _held_by(group, held, compacted), paths, _within(group[0], group[-1]))
        ]


def _holding(con: Any, compacted: list[Path]) -> tuple[dict[Key, int], dict[Key, list[Path]]]:
    """Each file system's rows in the compacted files, and the files that hold it (in their
    order), a file a query as the runs are read (``_each_run``)."""
    rows: dict[Key, int] = {}
    held: dict[Key, list[Path]] = {}
    for f in compacted:
        for host, fs, n in con.execute(
            f"SELECT host, fs, count(*) FROM {_read([f])} GROUP BY host, fs"
        ).fetchall():
            rows[(host, fs)] = rows.get((host, fs), 0) + int(n)
            held.setdefault((host, fs), []).append(f)
    return rows, held


def _held_by(group: list[Key], held: dict[Key, list[Path]], compacted: list[Path]) -> list[Path]:
    """The compacted files holding a row of ``group``'s file systems, in their order: a
    query that names every compacted file holds the metadata of each until it ends."""
    mine = {f for key in group for f in held.get(key, [])}
    return [f for f in compacted if f in mine]


def _unfiltered(
    table: str, tf: TableFiles, take: list[Path], absorb: list[Path], whole: bool, old: Manifest
) -> bool:
    """Whether a small table's compacted file is its fresh files' rows, every one of them:
    nothing compacted to merge in, no row above a new watermark, no partition with an old one."""
    if table in LARGE_TABLES or (whole and tf.compacted) or len(absorb) != len(take):
        return False
    return not any(partition_of(p) in old.covered for p in take)


def _concatenated(take: list[Path]) -> Iterator[list[str]]:
    """The files' rows as they are, a group of partitions at a time in (host, fs) order and
    each partition's files in name order (an export writes each file sorted). Sorting each
    group in DuckDB held 18 MiB more for the snapshots of 1000 file systems x 365 snapshots."""
    files: dict[Key, list[Path]] = {}
    for p in take:
        files.setdefault(partition_of(p), []).append(p)
    keys = sorted(files)
    for group in _groups(keys, files):
        paths = [p for key in group for p in sorted(files[key], key=lambda p: p.name)]
        yield [f"SELECT * FROM {_read(paths)}"]


def _within(first: Key, last: Key) -> str:
    """The rows of the (host, fs) keys from ``first`` to ``last``."""
    return (
        f"(host > '{_sql_str(first[0])}' OR (host = '{_sql_str(first[0])}'"
        f" AND fs >= '{_sql_str(first[1])}')) AND (host < '{_sql_str(last[0])}'"
        f" OR (host = '{_sql_str(last[0])}' AND fs <= '{_sql_str(last[1])}'))"
    )


class _Unordered(Exception):
    """Rows read in file order are not in the compacted order."""


def _in_order(
    con: Any, pq: Any, table: str, compacted: list[Path], take: list[Path]
) -> Iterator[list[str]]:
    """A large table's rows in the compacted order, as queries read one after the other: for
    each partition in (host, fs) order, its rows in the compacted files in the order of their
    generations, then its fresh runs in snapshot order (their names). That is the compacted
    order when each run is sorted and each compaction took runs later than the one before,
    which ``_write(check=True)`` verifies. A sort of every row holds DuckDB's whole memory
    limit besides the batches (213 MiB for 1.4M files x 3 snapshots; out of DuckDB's memory
    at 5 snapshots). In a rewrite, partitions of up to ``SORT_ROWS`` rows are sorted a group
    at a time instead: a query each would cost more than the sort in a fleet of thousands of
    small file systems."""
    files: dict[Key, list[Path]] = {}
    for p in take:
        files.setdefault(partition_of(p), []).append(p)
    if not compacted:
        for key in sorted(files):
            yield _each_run(files[key])
        return
    rows, held = _holding(con, compacted)
    for key, paths in files.items():
        rows[key] = rows.get(key, 0) + sum(pq.read_metadata(p).num_rows for p in paths)
    group: list[Key] = []
    count = nfiles = 0

    def sorted_group() -> list[str]:
        paths = [p for key in group for p in files.get(key, [])]
        kept = _held_by(group, held, compacted)
        return [_select(table, kept, paths, _within(group[0], group[-1]))]

    for key in sorted(rows):
        n, mine = rows[key], len(files.get(key, []))
        if group and (count + n > SORT_ROWS or nfiles + mine > FILES_PER_QUERY):
            yield sorted_group()
            group, count, nfiles = [], 0, 0
        if n <= SORT_ROWS:
            group.append(key)
            count, nfiles = count + n, nfiles + mine
            continue
        # the row groups of other file systems in those files are skipped by their statistics
        this = f"host = '{_sql_str(key[0])}' AND fs = '{_sql_str(key[1])}'"
        kept = [f"SELECT * FROM {_read([f])} WHERE {this}" for f in held.get(key, [])]
        yield kept + _each_run(files.get(key, []))
    if group:
        yield sorted_group()


def _check_order(batch: Any, columns: list[str], last: Any) -> Any:
    """Raise _Unordered unless the batch's rows, after ``last`` (the previous batch's final
    row, a one-row batch), ascend by ``columns`` (compared as a tuple, strings as bytes);
    return its final row. Arrow's kernels: no Python object per value."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if batch.num_rows == 0:
        return last
    rows = batch.select(columns)
    if last is not None:
        rows = pa.Table.from_batches([last, rows]).combine_chunks()
    n = rows.num_rows
    ok = None
    for name in reversed(columns):  # the tuple order, built from the last column to the first
        c = rows.column(name)
        after, before = c.slice(1), c.slice(0, n - 1)
        up = pc.greater(after, before)
        ok = up if ok is None else pc.or_(up, pc.and_(pc.equal(after, before), ok))
    if not pc.all(ok).as_py():
        raise _Unordered
    return batch.select(columns).slice(batch.num_rows - 1)


def _each_run(runs: list[Path]) -> list[str]:
    """A query per run file, in name order: DuckDB holds the metadata of every file a query
    has opened until the query ends (1.4 MiB a file of 64 row groups of file versions), so a
    query over every run of a file system grew with it (85 against 68 MiB anonymous for 12
    files of 4M file versions against 3); read a file at a time, 68 for both."""
    return [f"SELECT * FROM {_read([p])}" for p in sorted(runs, key=lambda p: p.name)]


def _select(table: str, compacted: list[Path], take: list[Path], within: str) -> str:
    """The rows to write of one group of partitions: fresh rows above the old watermark and up
    to the new one (small tables; whole runs for large ones), plus the group's compacted rows
    when rewriting."""
    parts = []
    if take and table in LARGE_TABLES:
        parts.append(f"SELECT * FROM {_read(take)}")
    elif take:
        parts.append(
            f"SELECT p.* FROM {_read(take)} p JOIN new_cover n ON p.host = n.host"
            " AND p.fs = n.fs AND p.snapshot_id <= n.mark"
            " LEFT JOIN old_cover o ON p.host = o.host AND p.fs = o.fs"
            " WHERE o.mark IS NULL OR p.snapshot_id > o.mark"
        )
    if compacted:
        parts.insert(0, f"SELECT * FROM {_read(compacted)} WHERE {within}")
    src = " UNION ALL ".join(parts)
    return f"SELECT * FROM ({src}) ORDER BY host, fs, {ORDER[table]}"


def _generations(files: list[Path]) -> int:
    """How many compactions wrote ``files`` (a generation's pieces count once)."""
    return len({first_piece(f.name) for f in files})


def _piece(out: Path, k: int) -> Path:
    """The ``k``-th file of the rows going to ``out`` (``out`` itself first)."""
    return out.with_name(piece_name(out.name, k))


def _write(
    con: Any,
    pq: Any,
    queries: Iterable[list[str]],
    out: Path,
    schema: Any,
    table: str,
    progress: Callable[[int], None] | None = None,
    check: bool = False,
) -> tuple[int, list[Path]]:
    """Stream the queries' rows, one query after the other, into ``out`` and, past
    ``FILE_GROUPS`` row groups, its next pieces (each written under a hidden name, fsynced,
    renamed once all are written), in batches of ``BATCH`` rows gathered into row groups of
    ``ROW_GROUP``; the rows and the files. ``check``: the rows of each list of queries must
    come in ``ORDER`` (else _Unordered, and nothing is left behind)."""
    import pyarrow as pa

    private_mkdir(out.parent, parents=True, exist_ok=True)
    tmps: list[Path] = []

    def open_piece(k: int) -> Any:
        final = _piece(out, k)
        tmps.append(private_file(final.with_name(f".{final.name}.{os.getpid()}.tmp")))
        return pq.ParquetWriter(tmps[-1], schema, compression="zstd", use_dictionary=DICTIONARY)

    try:
        rows = _write_rows(con, pa, queries, open_piece, schema, table, progress, check)
        for tmp in tmps:
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
    except BaseException:
        for tmp in tmps:
            tmp.unlink(missing_ok=True)
        raise
    outs = [_piece(out, k) for k in range(len(tmps))]
    for tmp, final in zip(tmps, outs, strict=True):
        os.replace(tmp, final)
    return rows, outs


def _query_batches(
    con: Any, queries: Iterable[list[str]], order: list[str] | None
) -> Iterator[Any]:
    """The queries' record batches, one query after the other; ``order``: their rows, all
    the queries' one after the other, checked to ascend by these columns."""
    last = None  # across the queries: each part's keys come after the previous part's
    for part in queries:
        for sql in part:
            for batch in con.sql(sql).to_arrow_reader(BATCH):
                if order is not None:
                    last = _check_order(batch, order, last)
                yield batch


def _write_rows(
    con: Any,
    pa: Any,
    queries: Iterable[list[str]],
    open_piece: Callable[[int], Any],
    schema: Any,
    table: str,
    progress: Callable[[int], None] | None,
    check: bool,
) -> int:
    group = ROW_GROUPS.get(table, ROW_GROUP)
    order = ["host", "fs", *ORDER[table].split(", ")]
    rows = 0
    pending: list[Any] = []
    pending_rows = 0
    out = PieceWriter(open_piece, group, FILE_GROUPS)
    try:
        for batch in _query_batches(con, queries, order if check else None):
            pending.append(pa.Table.from_batches([batch]).cast(schema))
            pending_rows += batch.num_rows
            if pending_rows >= group:
                t = pa.concat_tables(pending)
                whole = pending_rows - pending_rows % group
                out.write(t.slice(0, whole))
                rows += whole
                if progress is not None:
                    progress(rows)
                rest = t.slice(whole)
                pending, pending_rows = [rest], rest.num_rows
        if pending_rows:
            out.write(pa.concat_tables(pending))
            rows += pending_rows
            if progress is not None:
                progress(rows)
    finally:
        out.close()
    return rows


def _write_summary(
    con: Any, pq: Any, root: Path, tables: dict[str, list[str]], gen: int, memory_limit: str
) -> Path:
    """The per file system and size bucket summary of the compacted rows (SIZE_SUMMARY), in
    ``STREAM_MEMORY_LIMIT`` if DuckDB can (else in ``memory_limit``)."""
    import duckdb

    from fsage.fleet.export_schema import table_metadata
    from fsage.fleet.query import SIZE_SUMMARY

    for t in ("metrics", "size_buckets"):
        con.execute(
            f"CREATE OR REPLACE TEMP VIEW {t} AS SELECT * FROM"
            f" {_read([root / t / rel for rel in tables[t]])}"
        )
    _set_limit(con, STREAM_MEMORY_LIMIT)
    try:
        table = con.sql(SIZE_SUMMARY).to_arrow_table()
    except duckdb.OutOfMemoryException:
        _set_limit(con, memory_limit)
        table = con.sql(SIZE_SUMMARY).to_arrow_table()
    finally:
        _set_limit(con, memory_limit)
    out = root / SUMMARY_TABLE / COMPACTED / f"c{gen:06d}.parquet"
    private_mkdir(out.parent, parents=True, exist_ok=True)
    tmp = private_file(out.with_name(f".{out.name}.{os.getpid()}.tmp"))
    pq.write_table(
        table.replace_schema_metadata(table_metadata(SUMMARY_TABLE)), tmp, compression="zstd"
    )
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, out)
    return out


def _commit(root: Path, manifest: Manifest) -> None:
    save_manifest(root, manifest)


def _clean(root: Path, manifest: Manifest, consumed: list[Path]) -> int:
    """Remove absorbed per-partition files and compacted files the manifest does not name
    (replaced ones, or those of an interrupted run). The number removed."""
    removed = 0
    for p in consumed:
        p.unlink(missing_ok=True)
        removed += 1
        for d in (p.parent, p.parent.parent):  # fs=, then host= when empty
            try:
                d.rmdir()
            except OSError:
                break
    for table in (*TABLES, SUMMARY_TABLE):
        keep = set(manifest.tables.get(table, []))
        cdir = root / table / COMPACTED
        if not cdir.is_dir():
            continue
        for p in cdir.iterdir():
            if f"{COMPACTED}/{p.name}" not in keep:
                p.unlink(missing_ok=True)
                removed += 1
    return removed
