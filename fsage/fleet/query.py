"""Fleet questions over an exported dataset, with DuckDB in process.

Every figure is defined once here (and once more, independently, in Spark SQL in
``contrib/spark/fleet_metrics.py``, which the tests compare with these):

* ``filesystems``: per file system, its latest layout score, dynamic layout score and free-space
  figures, the total change of the layout score over its history and — where the history spans
  at least ``MIN_SPAN_DAYS`` days — the change per month (least-squares slope of the score
  against time, × 365.25 / 12 days, the month of `fsage analyze`), else ``no_rate_reason``
  says why not.
* ``size``: per size bucket over the latest snapshot of every file system, buckets in bytes
  (file systems of different block sizes share them): the fleet's layout score weighted by
  bytes (Σ contiguous / Σ (blocks − 1), blocks counted in bytes), the worst file system's,
  and the mean over file systems of the bucket's change per month (spans of
  ``MIN_SPAN_DAYS`` or more).
* ``free``: the fleet's free-space histogram (e2freefrag's buckets, in bytes) over the latest
  snapshots.
* ``outliers``: file systems whose latest layout score or change per month lies ``threshold``
  or more sample standard deviations from the fleet's mean.
* ``trend``: the layout score of every snapshot.
* ``files_by_size``: the per-file layout score computed from the exported extents (not from the
  stored metrics), aggregated per file system and size bucket, for the latest (or every)
  snapshot; it equals `fsage analyze`'s ``by_size``. Each file's extents stay a list (no
  UNNEST, no window): a file of one extent is read directly; for the others the data extents
  are sorted by logical block, and the contiguous blocks are blocks - extents + the extents
  starting where the previous one ends. Version ends are narrowed to the snapshots asked
  for before the anti-join.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import shlex
import shutil
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from fsage import scratch
from fsage.errors import FsageError
from fsage.fleet import METADATA_KEY, SCHEMA_VERSION, TABLES
from fsage.fleet.damage import damaged_files
from fsage.fleet.dataset import (
    SUMMARY_TABLE,
    DamagedFileError,
    Manifest,
    ManifestError,
    TableFiles,
    cover_table,
    dataset_files,
    drop_partitions,
    load_manifest,
    partition_of,
)
from fsage.text import size_range

MIN_SPAN_DAYS = 7
#: Why a file system has no change per month (``no_rate_reason``), in `fsage analyze`'s words:
#: one scored snapshot has no change at all (total_change is empty too, as analyze leaves it);
#: a short history has its total change, not a rate.
ONE_SCORED = "one scored snapshot"
SHORT_SPAN = f"scored snapshots span under {MIN_SPAN_DAYS} days"
# The month of fsage.analyzer.history (not imported: it loads numpy): one change per month.
DAYS_PER_MONTH = 365.25 / 12
DEFAULT_TABLES = ("filesystems", "size", "free", "outliers")
ALL_TABLES = (*DEFAULT_TABLES, "trend", "files_by_size")
# DuckDB's own memory: beyond it, joins, sorts and aggregates spill to a private temporary
# directory, so that a query's peak does not grow with the dataset. One thread: each would
# hold its own row groups and partial aggregates beside the limit, and the order in which
# threads merge partial sums changed the last digits of averages and slopes from run to run.
# (files_by_size over 1.4M files: 174 MiB with two threads and no limit, 153 with this.) A
# hash aggregate of a million groups needs 48 MB to spill at all: at 32 MB it ran out.
MEMORY_LIMIT = "48MB"
THREADS = 1
SPILL_USE = "fleet"  # its spill directories: fsage-fleet-<pid>-<random> (fsage.scratch)
# Per-partition files from which a query suggests `fsage fleet compact`: every query opens each
# of them (1000 file systems x 365 snapshots, 4003 files: 12 s of CPU for the summary, 0.9 s
# compacted).
ADVISE_COMPACT_FILES = 1000


class FleetError(FsageError):
    """The dataset is missing, unreadable or of an unknown schema version."""


ON_DAMAGE = ("refuse", "skip")


def _check_damage(
    con: Any,
    root: Path,
    manifest: Manifest,
    tables: dict[str, TableFiles],
    on_damage: str,
    warn: Callable[[str], None] | None,
) -> None:
    """Refuse a dataset with a file that cannot be read, or (``on_damage`` 'skip') leave the
    file systems of damaged per-partition files out, saying so for each file. A damaged
    compacted file holds many file systems: it is always refused."""
    damaged = damaged_files(con, root, tables, manifest)
    if not damaged:
        return
    fresh = {p for tf in tables.values() for p in tf.fresh}
    whole = [(p, why) for p, why in damaged if p not in fresh]
    if on_damage != "skip" or whole:
        p, why = (whole or damaged)[0]
        more = f" (and {len(damaged) - 1} more damaged files)" if len(damaged) > 1 else ""
        hint = "" if whole else "; --damaged skip leaves its file system out"
        raise DamagedFileError(f"{p}: {why}{more}{hint}")
    parts = {partition_of(p) for p, _ in damaged}
    drop_partitions(tables, parts)
    for p, why in damaged:
        host, fs = partition_of(p)
        if warn is not None:
            warn(f"{p}: {why}; {host}/{fs} left out")


def _duck_error(root: Path, exc: Exception) -> FleetError:
    """A DuckDB failure on the dataset's data (a page damaged inside a sound file) as one
    line; DuckDB names the file in its message."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return FleetError(f"{root}: the dataset cannot be read: {first}")


def connect(
    root: Path,
    on_damage: str = "refuse",
    warn: Callable[[str], None] | None = None,
    *,
    advise: Callable[[str], None] | None = None,
) -> Any:
    """A DuckDB connection with one view per exported table of ``root`` (damaged files:
    see ``_check_damage``). Its spill directory is removed when the connection is collected
    or the interpreter exits; ``opened`` removes it at once."""
    con, spill = _open(root, on_damage, warn, advise)
    weakref.finalize(con, shutil.rmtree, spill, ignore_errors=True)
    return con


@contextlib.contextmanager
def opened(
    root: Path,
    on_damage: str = "refuse",
    warn: Callable[[str], None] | None = None,
    *,
    advise: Callable[[str], None] | None = None,
) -> Iterator[Any]:
    """``connect``, closed and its spill directory removed on leaving, after an error too;
    a DuckDB error inside is one line (FleetError)."""
    import duckdb

    con, spill = _open(root, on_damage, warn, advise)
    try:
        yield con
    except duckdb.Error as exc:
        raise _duck_error(root, exc) from None
    finally:
        con.close()
        shutil.rmtree(spill, ignore_errors=True)


Say = Callable[[str], None] | None


def _open(root: Path, on_damage: str, warn: Say, advise: Say) -> tuple[Any, Path]:
    """A connection and its spill directory: made private (0700) in ``fsage.scratch``'s
    directory on disk (DuckDB's default is ``.tmp`` in the working directory),
    removed again if the connection cannot be made."""
    try:
        import duckdb
    except ImportError:
        raise FleetError("fleet queries need duckdb (pip install 'fsage[fleet]')") from None
    spill = scratch.make(SPILL_USE)
    try:
        return _connect(root, on_damage, warn, advise, spill), spill
    except duckdb.Error as exc:
        shutil.rmtree(spill, ignore_errors=True)
        raise _duck_error(root, exc) from None
    except BaseException:
        shutil.rmtree(spill, ignore_errors=True)
        raise


def _connect(root: Path, on_damage: str, warn: Say, advise: Say, spill: Path) -> Any:
    import duckdb

    if not root.is_dir():
        raise FleetError(f"{root} is not a directory (export one: fsage export DIR)")
    con = duckdb.connect()
    try:
        fresh = _views(con, root, on_damage, warn, spill)
        if advise is not None and fresh >= ADVISE_COMPACT_FILES:
            advise(
                f"{root}: {fresh:,} files not compacted, each read by every query; "
                f"`fsage fleet compact {shlex.quote(str(root))}` merges them into a few"
            )
    except BaseException:
        con.close()
        raise
    return con


def _views(
    con: Any, root: Path, on_damage: str, warn: Callable[[str], None] | None, spill: Path
) -> int:
    """Make the views; returns the number of per-partition files they read."""
    con.execute(f"SET temp_directory = '{_sql_str(str(spill))}'")
    con.execute(f"SET memory_limit = '{MEMORY_LIMIT}'")
    con.execute(f"SET threads = {THREADS}")
    con.execute("SET TimeZone = 'UTC'")
    con.execute("SET enable_progress_bar = false")  # it would write to stdout
    con.execute("SET parquet_metadata_cache = true")  # every query reads the same footers
    try:
        manifest = load_manifest(root)
    except ManifestError as exc:
        raise FleetError(str(exc)) from None
    tables = dataset_files(root, manifest)
    _check_damage(con, root, manifest, tables, on_damage, warn)
    if any(f.filter_fresh for f in tables.values()):
        cover_table(con, "_covered", manifest.covered)
    found = False
    created: set[str] = set()
    for table, files in tables.items():
        parts = files.all
        if not parts:
            continue
        found = found or table == "snapshots"
        version = _schema_version(con, parts[0])
        if version is None or version > SCHEMA_VERSION:
            raise FleetError(
                f"{parts[0]}: export schema version {version}, this fsage reads up to "
                f"{SCHEMA_VERSION} (upgrade fsage)"
            )
        con.execute(f"CREATE VIEW {table} AS {_view_sql(files)}")
        created.add(table)
    if not found:
        raise FleetError(f"no fsage export in {root} (make one: fsage export --db DB {root})")
    for table in TABLES:
        if table not in created:
            raise FleetError(f"{root} has no {table} table (an incomplete export?)")
    stored = manifest.tables.get(SUMMARY_TABLE)
    if stored and not tables["size_buckets"].fresh and not tables["metrics"].fresh:
        paths = [root / SUMMARY_TABLE / rel for rel in stored]
        con.execute(f"CREATE VIEW {SUMMARY_TABLE} AS SELECT * FROM {_file_list(paths)}")
    else:
        con.execute(f"CREATE VIEW {SUMMARY_TABLE} AS {SIZE_SUMMARY}")
    return sum(len(tf.fresh) for tf in tables.values())


def _sql_str(s: str) -> str:
    return s.replace("'", "''")


def _file_list(paths: list[Path]) -> str:
    # The file list, not a glob: DuckDB would list every partition again in every query.
    files = ", ".join("'" + str(p).replace("'", "''") + "'" for p in paths)
    return f"read_parquet([{files}], hive_partitioning = false)"


def _view_sql(files: TableFiles) -> str:
    """The rows of one table: the compacted files, and the per-partition files' rows newer
    than their file system's watermark (see ``fsage.fleet.dataset``)."""
    if not files.filter_fresh:
        return f"SELECT * FROM {_file_list(files.all)}"
    fresh = (
        f"SELECT p.* FROM {_file_list(files.fresh)} p LEFT JOIN _covered c"
        " ON p.host = c.host AND p.fs = c.fs"
        " WHERE c.mark IS NULL OR p.snapshot_id > c.mark"
    )
    if not files.compacted:
        return fresh
    return f"SELECT * FROM {_file_list(files.compacted)} UNION ALL {fresh}"


def _schema_version(con: Any, path: Path) -> int | None:
    """The export schema version in one Parquet file's key-value metadata (None if none)."""
    row = con.execute(
        "SELECT value FROM parquet_kv_metadata(?) WHERE key = ?", [str(path), METADATA_KEY]
    ).fetchone()
    if row is None:
        return None
    try:
        return int(json.loads(row[0])["schema_version"])
    except (ValueError, KeyError, TypeError):
        return None


Rows = Iterator[dict[str, Any]]
# Rows fetched from DuckDB at a time: a table is streamed, never held whole (the trend of 1000
# file systems x 365 snapshots as Python rows was 500 MB and more).
CHUNK = 4096


def _stream(con: Any, sql: str, params: list[Any] | None = None) -> Rows:
    cur = con.execute(sql, params or [])
    names = [d[0] for d in cur.description]
    while chunk := cur.fetchmany(CHUNK):
        for r in chunk:
            yield {k: _plain(v) for k, v in zip(names, r, strict=True)}


def _plain(v: Any) -> Any:
    """Times as ISO 8601 strings in UTC (the queries cast them to UTC timestamps)."""
    if isinstance(v, dt.datetime):
        return v.replace(tzinfo=dt.UTC).isoformat()
    return v


_LATEST = "latest AS (SELECT host, fs, max(snapshot_id) AS sid FROM metrics GROUP BY host, fs)"

_SLOPES = f"""
    fs_trend AS (
        SELECT host, fs, count(*) AS snapshots,
               min(taken_at) AS first_taken_at, max(taken_at) AS last_taken_at,
               (epoch_us(max(taken_at)) - epoch_us(min(taken_at))) / 86400e6 AS span_days,
               min_by(layout_score, snapshot_id) AS first_layout_score,
               max_by(layout_score, snapshot_id) AS last_layout_score,
               regr_slope(layout_score, epoch_us(taken_at) / 86400e6) AS slope
        FROM metrics WHERE layout_score IS NOT NULL GROUP BY host, fs),
    decline AS (
        SELECT *, CASE WHEN snapshots >= 2 THEN last_layout_score - first_layout_score END
                  AS total_change,
               CASE WHEN span_days >= {MIN_SPAN_DAYS} AND snapshots >= 2
                    THEN slope * {DAYS_PER_MONTH} END AS change_per_month,
               CASE WHEN snapshots < 2 THEN '{ONE_SCORED}'
                    WHEN span_days < {MIN_SPAN_DAYS} THEN '{SHORT_SPAN}' END AS no_rate_reason
        FROM fs_trend)
"""


def filesystems_rows(con: Any) -> Rows:
    yield from _stream(
        con,
        f"""
        WITH {_LATEST}, {_SLOPES}
        SELECT m.host, m.fs, d.snapshots, d.first_taken_at::TIMESTAMP AS first_taken_at,
               d.last_taken_at::TIMESTAMP AS last_taken_at,
               d.span_days, m.snapshot_id AS latest_snapshot, m.files, m.layout_score,
               m.dynamic_layout_score_inode AS dynamic_layout_score,
               d.first_layout_score, d.total_change, d.change_per_month, d.no_rate_reason,
               m.blocks_free::DOUBLE / m.blocks_total AS free_fraction,
               m.free_extent_count, m.block_size, m.largest_free_extent,
               m.largest_free_extent * m.block_size AS largest_free_bytes,
               CASE WHEN m.blocks_free > 0 THEN m.free_chunks::DOUBLE * m.chunk_bytes
                    / m.block_size / m.blocks_free END AS free_in_whole_chunks
        FROM metrics m JOIN latest l ON m.host = l.host AND m.fs = l.fs AND m.snapshot_id = l.sid
        LEFT JOIN decline d ON d.host = m.host AND d.fs = m.fs
        ORDER BY d.change_per_month ASC NULLS LAST, d.total_change ASC NULLS LAST,
                 m.layout_score ASC NULLS LAST, m.host, m.fs
        """,
    )


# Per file system and size bucket: the bucket's row in the latest snapshot (in_latest) and its
# change per month over the history (rate; spans of MIN_SPAN_DAYS or more). `fsage fleet
# compact` stores this table with the compacted files (view size_summary); without one, or
# with rows newer than the compaction, it is computed from size_buckets and metrics.
SIZE_SUMMARY = f"""
    WITH {_LATEST},
    cur AS (
        SELECT b.host, b.fs, b.bucket, b.min_blocks, b.max_blocks, b.files, b.blocks,
               b.contiguous, b.denominator, b.layout_score
        FROM size_buckets b JOIN latest l
        ON b.host = l.host AND b.fs = l.fs AND b.snapshot_id = l.sid),
    bm AS (
        SELECT b.host, b.fs, b.bucket, b.layout_score,
               epoch_us(m.taken_at) / 86400e6 AS day
        FROM size_buckets b JOIN metrics m
        ON b.host = m.host AND b.fs = m.fs AND b.snapshot_id = m.snapshot_id
        WHERE b.layout_score IS NOT NULL),
    slopes AS (
        SELECT host, fs, bucket, regr_slope(layout_score, day) * {DAYS_PER_MONTH} AS rate
        FROM bm GROUP BY host, fs, bucket
        HAVING max(day) - min(day) >= {MIN_SPAN_DAYS} AND count(*) >= 2)
    SELECT coalesce(c.host, s.host) AS host, coalesce(c.fs, s.fs) AS fs,
           coalesce(c.bucket, s.bucket) AS bucket, c.host IS NOT NULL AS in_latest,
           c.min_blocks, c.max_blocks, c.files, c.blocks, c.contiguous, c.denominator,
           c.layout_score, s.rate
    FROM cur c FULL OUTER JOIN slopes s
    ON c.host = s.host AND c.fs = s.fs AND c.bucket = s.bucket
    ORDER BY host, fs, bucket
"""


# The block size of each file system's latest snapshot, to put buckets in bytes: a fleet mixes
# file systems of 1 KiB and 4 KiB blocks, whose bucket k of blocks is not the same files.
_BLOCK_SIZES = """
    block_sizes AS (
        SELECT m.host, m.fs, m.block_size,
               CAST(round(log2(m.block_size)) AS INTEGER) AS log2_block_size
        FROM metrics m JOIN latest l
        ON m.host = l.host AND m.fs = l.fs AND m.snapshot_id = l.sid)
"""


def size_bucket_fields(bucket: int) -> dict[str, Any]:
    """A fleet file-size bucket in bytes: files of more than 2**(bucket-1) and at most
    2**bucket bytes, labelled as `fsage analyze` labels its buckets."""
    lo, hi = 1 << (bucket - 1), 1 << bucket
    return {"min_bytes": lo + 1, "max_bytes": hi, "label": size_range(lo + 1, hi, 1)}


def free_bucket_fields(min_bytes: int, max_bytes: int | None) -> dict[str, Any]:
    """A fleet free-extent bucket in bytes: extents of at least ``min_bytes`` and under twice
    that (``max_bytes``: the largest extent of the bucket, None when open above)."""
    # here, not at the top: fsage.analyzer loads numpy, which the other tables do not need
    from fsage.analyzer.freespace import free_extent_label

    top = None if max_bytes is None else 2 * min_bytes - 1
    return {"min_bytes": min_bytes, "max_bytes": max_bytes,
            "label": free_extent_label(min_bytes, top, 1)}  # fmt: skip


def by_size_rows(con: Any) -> Rows:
    """Per size bucket in bytes (``bucket``: files of more than 2**(bucket-1) and at most
    2**bucket bytes, ``min_bytes``..``max_bytes``, ``label``; the first bucket of a file
    system holds every scored file of two blocks), scores weighted by bytes."""
    rows = _stream(
        con,
        f"""
        WITH {_LATEST}, {_BLOCK_SIZES},
        sized AS (
            SELECT s.*, b.block_size, s.bucket + b.log2_block_size AS byte_bucket
            FROM size_summary s JOIN block_sizes b ON s.host = b.host AND s.fs = b.fs),
        cur AS (SELECT * FROM sized WHERE in_latest),
        rates AS (
            SELECT byte_bucket, avg(rate) AS mean_change_per_month, count(rate) AS rated
            FROM sized GROUP BY byte_bucket)
        SELECT c.byte_bucket AS bucket,
               count(*) AS filesystems, sum(c.files) AS files,
               sum(c.blocks * c.block_size) AS data_bytes,
               sum(c.contiguous * c.block_size)::DOUBLE
                   / sum(c.denominator * c.block_size) AS layout_score,
               min(c.layout_score) AS worst_layout_score,
               any_value(r.mean_change_per_month) AS mean_change_per_month,
               coalesce(any_value(r.rated), 0) AS rated_filesystems
        FROM cur c LEFT JOIN rates r ON r.byte_bucket = c.byte_bucket
        GROUP BY c.byte_bucket ORDER BY c.byte_bucket
        """,
    )
    for r in rows:
        yield {"bucket": r["bucket"], **size_bucket_fields(r["bucket"]), **r}


# One file system per device in the free-space figures: /, /usr and /usr/share snapshot as
# three mounted trees of one device hold the same free space, and would count it three times.
# The device is the host and the file system's UUID; its newest snapshot stands for it.
_DEVICES = """
    devices AS (
        SELECT host, arg_max(fs, (taken_at, fs)) AS fs FROM (
            SELECT s.host, s.fs, s.uuid, s.taken_at FROM snapshots s JOIN latest l
            ON s.host = l.host AND s.fs = l.fs AND s.snapshot_id = l.sid)
        GROUP BY host, coalesce(uuid, fs))
"""


def free_histogram_rows(con: Any) -> Rows:
    """e2freefrag's buckets in bytes (free extents of at least ``min_bytes`` and at most
    ``max_bytes``, ``label``), over the latest snapshot of each device (a device mounted as
    several file systems counts once); shares of the free space in bytes."""
    rows = _stream(
        con,
        f"""
        WITH {_LATEST}, {_BLOCK_SIZES}, {_DEVICES},
        cur AS (
            SELECT f.*, b.block_size, f.min_blocks * b.block_size AS min_bytes
            FROM free_buckets f JOIN latest l
            ON f.host = l.host AND f.fs = l.fs AND f.snapshot_id = l.sid
            JOIN devices d ON f.host = d.host AND f.fs = d.fs
            JOIN block_sizes b ON f.host = b.host AND f.fs = b.fs)
        SELECT min_bytes,
               CASE WHEN count(max_blocks) = count(*)
                    THEN max(max_blocks * block_size) END AS max_bytes,
               count(*) AS filesystems,
               sum(count) AS free_extents,
               sum(blocks * block_size) AS free_bytes,
               sum(blocks * block_size)::DOUBLE
                   / (SELECT sum(blocks * block_size) FROM cur) AS share_of_free_space
        FROM cur GROUP BY min_bytes ORDER BY min_bytes
        """,
    )
    for r in rows:
        yield {**r, **free_bucket_fields(r["min_bytes"], r["max_bytes"])}


# Which way an outlier lies, in words: a z of -3 on the layout score and on its change per
# month mean different things, and a rising score is an outlier too.
_DIRECTION = """
    CASE WHEN metric = 'layout_score'
         THEN CASE WHEN z < 0 THEN 'worse layout than the fleet'
                   ELSE 'better layout than the fleet' END
         WHEN z < 0 THEN 'declining faster than the fleet'
         WHEN value > 0 THEN 'improving (score rising)'
         ELSE 'declining slower than the fleet' END
"""


def outliers_rows(con: Any, threshold: float = 2.0) -> Rows:
    yield from _stream(
        con,
        f"""
        WITH {_LATEST}, {_SLOPES},
        vals AS (
            SELECT m.host, m.fs, 'layout_score' AS metric, m.layout_score AS value
            FROM metrics m JOIN latest l
            ON m.host = l.host AND m.fs = l.fs AND m.snapshot_id = l.sid
            WHERE m.layout_score IS NOT NULL
            UNION ALL
            SELECT host, fs, 'change_per_month', change_per_month FROM decline
            WHERE change_per_month IS NOT NULL),
        stats AS (
            SELECT metric, avg(value) AS mean, stddev_samp(value) AS sd, count(*) AS n
            FROM vals GROUP BY metric),
        z AS (
            SELECT v.host, v.fs, v.metric, v.value, s.mean AS fleet_mean, s.sd AS fleet_sd,
                   (v.value - s.mean) / s.sd AS z
            FROM vals v JOIN stats s ON s.metric = v.metric WHERE s.n >= 3 AND s.sd > 0)
        SELECT *, {_DIRECTION} AS direction
        FROM z WHERE abs(z) >= ? ORDER BY z ASC, host, fs, metric
        """,
        [threshold],
    )


# Rows of the trend sorted at a time: sorting all of them (365k rows for 1000 file systems x
# 365 snapshots) held 34 MiB more than the query's other work.
TREND_BATCH_ROWS = 65536


def trend_rows(con: Any, only: list[tuple[str, str]] | None = None) -> Rows:
    """Every snapshot's scores, by host, file system and snapshot (``only``: of these
    (host, fs) alone). The file systems are sorted first, then their rows a batch of about
    ``TREND_BATCH_ROWS`` at a time: the same order, in memory bounded by a batch."""
    if only is not None:
        yield from _trend_of(con, only)
        return
    keys = con.execute("SELECT host, fs, count(*) FROM metrics GROUP BY host, fs ORDER BY host, fs")
    batch: list[tuple[str, str]] = []
    rows = 0
    for host, fs, n in keys.fetchall():
        if batch and rows + n > TREND_BATCH_ROWS:
            yield from _trend_of(con, batch)
            batch, rows = [], 0
        batch.append((host, fs))
        rows += n
    if batch:
        yield from _trend_of(con, batch)


def _trend_of(con: Any, only: list[tuple[str, str]]) -> Rows:
    yield from _stream(
        con,
        """
        SELECT host, fs, snapshot_id, taken_at::TIMESTAMP AS taken_at, layout_score,
               dynamic_layout_score_inode AS dynamic_layout_score,
               blocks_free::DOUBLE / blocks_total AS free_fraction, free_extent_count
        FROM metrics
        SEMI JOIN (SELECT unnest(?::VARCHAR[]) AS host, unnest(?::VARCHAR[]) AS fs) k
        ON metrics.host = k.host AND metrics.fs = k.fs ORDER BY host, fs, snapshot_id
        """,
        [[h for h, _ in only], [f for _, f in only]],
    )


def files_by_size_rows(con: Any, every_snapshot: bool = False) -> Rows:
    """Per file system and size bucket, the layout score computed from the exported extents
    of the regular files valid in the latest snapshot (or in every snapshot)."""
    snaps = (
        "SELECT host, fs, snapshot_id AS sid FROM snapshots"
        if every_snapshot
        else "SELECT host, fs, max(snapshot_id) AS sid FROM snapshots GROUP BY host, fs"
    )
    rows = _stream(
        con,
        f"""
        WITH want AS ({snaps}),
        ended AS (
            SELECT e.host, e.fs, w.sid, e.ino, e.first_snapshot
            FROM file_ends e JOIN want w ON e.host = w.host AND e.fs = w.fs
            WHERE e.last_snapshot < w.sid),
        live AS (
            SELECT v.host, v.fs, w.sid, v.extents AS x
            FROM files v JOIN want w
            ON v.host = w.host AND v.fs = w.fs AND v.first_snapshot <= w.sid
            ANTI JOIN ended e
            ON e.host = v.host AND e.fs = v.fs AND e.sid = w.sid AND e.ino = v.ino
               AND e.first_snapshot = v.first_snapshot
            WHERE (v.mode & 61440) = 32768),
        -- one pass over the files (a CTE read twice would be materialized whole): a file
        -- of one extent directly, the others' data extents sorted by logical block
        sorted AS (
            SELECT host, fs, sid, x, CASE WHEN len(x) > 1 THEN list_sort(list_filter(
                       x, lambda y: (y.flags & 6) = 0 AND y.length > 0)) END AS e
            FROM live),
        per_file AS (
            SELECT host, fs, sid,
                   CASE WHEN len(x) = 1 THEN CASE WHEN (x[1].flags & 6) = 0 THEN x[1].length END
                        ELSE list_sum(list_transform(e, lambda y: y.length)) END AS blocks,
                   CASE WHEN len(x) = 1 THEN x[1].length - 1
                        ELSE list_sum(list_transform(e, lambda y: y.length)) - len(e)
                             + len(list_filter(list_zip(e[1:len(e) - 1], e[2:len(e)]),
                                   lambda p: p[2].physical = p[1].physical + p[1].length))
                   END AS contiguous
            FROM sorted WHERE len(x) >= 1),
        bs AS (
            SELECT DISTINCT host, fs, snapshot_id AS sid, block_size,
                   CAST(round(log2(block_size)) AS INTEGER) AS log2_block_size FROM snapshots),
        bucketed AS (
            SELECT f.host, f.fs, f.sid, f.blocks, f.contiguous, b.block_size,
                   CAST(ceil(log2(f.blocks)) AS INTEGER) + b.log2_block_size AS bucket
            FROM per_file f
            JOIN bs b ON f.host = b.host AND f.fs = b.fs AND f.sid = b.sid
            WHERE f.blocks >= 2)
        SELECT host, fs, sid AS snapshot_id, bucket, count(*) AS files, block_size,
               sum(blocks)::BIGINT AS blocks, sum(blocks)::BIGINT * block_size AS bytes,
               sum(contiguous)::BIGINT AS contiguous,
               sum(blocks - 1)::BIGINT AS denominator,
               sum(contiguous)::DOUBLE / sum(blocks - 1) AS layout_score
        FROM bucketed GROUP BY host, fs, sid, bucket, block_size
        ORDER BY host, fs, sid, bucket
        """,
    )
    for r in rows:
        yield {**r, **size_bucket_fields(r["bucket"])}


def fleet_tables(
    root: Path,
    tables: tuple[str, ...] = DEFAULT_TABLES,
    threshold: float = 2.0,
    *,
    on_damage: str = "refuse",
    warn: Callable[[str], None] | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """The named tables of the fleet analysis of the dataset at ``root``."""
    with opened(root, on_damage, warn) as con:
        return _tables(con, tables, threshold)


def filesystems(con: Any) -> list[dict[str, Any]]:
    return list(filesystems_rows(con))


def by_size(con: Any) -> list[dict[str, Any]]:
    return list(by_size_rows(con))


def free_histogram(con: Any) -> list[dict[str, Any]]:
    return list(free_histogram_rows(con))


def outliers(con: Any, threshold: float = 2.0) -> list[dict[str, Any]]:
    return list(outliers_rows(con, threshold))


def trend(con: Any) -> list[dict[str, Any]]:
    return list(trend_rows(con))


def files_by_size(con: Any, every_snapshot: bool = False) -> list[dict[str, Any]]:
    return list(files_by_size_rows(con, every_snapshot))


def table_rows(con: Any, table: str, threshold: float = 2.0) -> Rows:
    """The rows of one fleet table, fetched a chunk at a time (one table at a time per
    connection: a query ends the previous one's rows)."""
    if table == "filesystems":
        return filesystems_rows(con)
    if table == "size":
        return by_size_rows(con)
    if table == "free":
        return free_histogram_rows(con)
    if table == "outliers":
        return outliers_rows(con, threshold)
    if table == "trend":
        return trend_rows(con)
    if table == "files_by_size":
        return files_by_size_rows(con)
    raise FleetError(f"unknown fleet table {table!r} (one of {', '.join(ALL_TABLES)})")


def _tables(con: Any, tables: tuple[str, ...], threshold: float) -> dict[str, list[dict[str, Any]]]:
    return {t: list(table_rows(con, t, threshold)) for t in tables}
