"""Which files of a dataset a fleet query or a compaction cannot read, checked with DuckDB
alone: Arrow is not imported (it was ~45 MiB of a fleet query's peak, and a second footer read
of every file).

Each file is first looked at without a Parquet reader (a regular file, not empty, ``PAR1`` at
both ends, a footer length that fits in the file: what an empty, truncated or garbage file
fails). The survivors' footers are read in one DuckDB query (``parquet_schema``), and the
files of each table are grouped by their schema: the column types of one file per group are
compared with those `fsage export` writes (``COLUMNS``; a test checks them against the export's
Arrow schemas). A footer DuckDB cannot parse fails that query: then each file is read alone,
to name the damaged ones.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fsage.fleet.dataset import SUMMARY_TABLE, Manifest, TableFiles, not_a_file
from fsage.fleet.export_schema import ADDED_COLUMNS

MAGIC = b"PAR1"
CHUNK = 128
_TYPES = {
    "s": "VARCHAR",
    "i": "BIGINT",
    "i4": "INTEGER",
    "f": "DOUBLE",
    "t": "TIMESTAMP WITH TIME ZONE",
    "x": "STRUCT(logical BIGINT, physical BIGINT, length BIGINT, flags INTEGER)[]",
    "m": "STRUCT(physical BIGINT, kind INTEGER)[]",
}
# The columns of each table as DuckDB reads them from the files `fsage export` writes (beside
# host:s fs:s), in the codes of _TYPES.
_COLUMNS = {
    "snapshots": (
        "snapshot_id:i taken_at:t uuid:s kind:s label:s source:s block_size:i blocks_total:i "
        "blocks_used:i blocks_free:i inodes_total:i inodes_free:i files:i dirs:i extents:i "
        "free_extents:i damaged:i new_files:i changed_files:i deleted_files:i seconds:f "
        "op_count:i bytes_written:i recreation_of:i"
    ),
    "metrics": (
        "snapshot_id:i taken_at:t block_size:i blocks_total:i blocks_free:i files:i "
        "directories:i data_blocks:i layout_score:f directories_layout_score:f scored_files:i "
        "fragmented_files:i mean_file_score:f fragments_per_file:f free_extent_count:i "
        "largest_free_extent:i average_free_extent:f free_chunks:i chunks_total:i "
        "chunk_bytes:i dynamic_layout_score_inode:f dynamic_layout_score_path:f "
        "same_group_share:f inode_to_data_median_blocks:f dir_scan_score_aggregate:f "
        "dir_scan_score_median:f neighbour_pairs:i neighbour_adjacent_share:f "
        "neighbour_le_1mib_share:f neighbour_le_group_share:f neighbour_farther_share:f"
    ),
    "size_buckets": (
        "snapshot_id:i bucket:i4 min_blocks:i max_blocks:i files:i blocks:i contiguous:i "
        "denominator:i layout_score:f"
    ),
    "free_buckets": "snapshot_id:i min_blocks:i max_blocks:i count:i blocks:i",
    "files": (
        "first_snapshot:i ino:i generation:i digest:i mode:i nlink:i uid:i gid:i size:i "
        "atime_ns:i mtime_ns:i ctime_ns:i crtime_ns:i flags:i damaged:i path:s extents:x "
        "meta_blocks:m"
    ),
    "file_ends": "ino:i first_snapshot:i last_snapshot:i",
    "free_extents": "snapshot_id:i start:i length:i",
}
COLUMNS: dict[str, dict[str, str]] = {
    table: {
        "host": "VARCHAR",
        "fs": "VARCHAR",
        **{n: _TYPES[c] for n, c in (col.split(":") for col in spec.split())},
    }
    for table, spec in _COLUMNS.items()
}


def unreadable(path: Path) -> str | None:
    """Why ``path`` is not a Parquet file, judged from its type, size and ends (None: it may
    be one)."""
    why = not_a_file(path)
    if why is not None:
        return why
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            head = fh.read(4)
            fh.seek(max(size - 8, 0))
            tail = fh.read(8)
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if size < 12 or head != MAGIC or tail[4:] != MAGIC:
        return "not a readable Parquet file (no Parquet magic bytes at both ends: truncated?)"
    if int.from_bytes(tail[:4], "little") > size - 12:
        return "not a readable Parquet file (its footer is longer than the file: truncated?)"
    return None


def wrong_columns(got: list[tuple[str, str]], table: str) -> str | None:
    """Why a file of ``table`` with these (column, DuckDB type) cannot stand for it: a column
    missing (but those a later version added) or of another type; extra columns are allowed."""
    have = dict(got)
    added = ADDED_COLUMNS.get(table, frozenset())
    for name, want in COLUMNS.get(table, {}).items():
        if name not in have:
            if name in added:
                continue
            return f"has no column {name!r}"
        if have[name] != want:
            return f"column {name!r} is {have[name]}, not {want}"
    return None


def _list(paths: list[Path]) -> str:
    return "[" + ", ".join("'" + str(p).replace("'", "''") + "'" for p in paths) + "]"


def _columns(con: Any, path: Path) -> list[tuple[str, str]]:
    sql = f"DESCRIBE SELECT * FROM read_parquet({_list([path])}, hive_partitioning = false)"
    rows = con.execute(sql).fetchall()
    return [(str(r[0]), str(r[1])) for r in rows]


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _schema_groups(con: Any, paths: list[Path]) -> list[list[Path]]:
    """``paths`` grouped by their whole Parquet schema (one footer read each), ``CHUNK`` files
    a query: DuckDB's memory for one query grows with the files it reads (22 MiB more for
    1000 files at once than for 128)."""
    groups: dict[str, list[str]] = {}
    for lo in range(0, len(paths), CHUNK):
        rows = con.execute(
            "SELECT fp, list(file_name) FROM ("
            " SELECT file_name, string_agg(concat_ws(':', name, type, type_length,"
            "  repetition_type, num_children, converted_type, logical_type), ' ' ORDER BY pos)"
            "  AS fp FROM (SELECT *, row_number() OVER () AS pos FROM"
            f"  parquet_schema({_list(paths[lo : lo + CHUNK])}))"
            " GROUP BY file_name) GROUP BY fp"
        ).fetchall()
        for fp, names in rows:
            groups.setdefault(fp, []).extend(names)
    return [[Path(p) for p in sorted(names)] for names in groups.values()]


def table_damage(con: Any, table: str, paths: list[Path]) -> list[tuple[Path, str]]:
    """The files of ``table`` among ``paths`` that cannot be read as a part of it, with why."""
    import duckdb

    out: list[tuple[Path, str]] = []
    sound = []
    for p in paths:
        why = unreadable(p)
        if why is None:
            sound.append(p)
        else:
            out.append((p, why))
    if not sound:
        return out
    try:
        groups = _schema_groups(con, sound)
    except duckdb.Error:
        groups = []
        for p in sound:  # which footer DuckDB cannot parse
            try:
                groups.extend(_schema_groups(con, [p]))
            except duckdb.Error as exc:
                out.append((p, f"not a readable Parquet file ({_first_line(exc)})"))
    for group in groups:
        try:
            why = wrong_columns(_columns(con, group[0]), table)
        except duckdb.Error as exc:
            why = f"not a readable Parquet file ({_first_line(exc)})"
        if why is not None:
            out.extend((p, why) for p in group)
    return out


def damaged_files(
    con: Any, root: Path, files: dict[str, TableFiles], manifest: Manifest
) -> list[tuple[Path, str]]:
    """The files a reader of the dataset would open that it cannot read, with why, in the
    order of ``files`` (``con``: a DuckDB connection to read their footers with)."""
    out: list[tuple[Path, str]] = []
    for table, tf in files.items():
        out.extend(_ordered(tf.all, table_damage(con, table, tf.all)))
    summary = [root / SUMMARY_TABLE / rel for rel in manifest.tables.get(SUMMARY_TABLE, [])]
    out.extend(_ordered(summary, table_damage(con, SUMMARY_TABLE, summary)))
    return out


def _ordered(paths: list[Path], found: list[tuple[Path, str]]) -> list[tuple[Path, str]]:
    why = dict(found)
    return [(p, why[p]) for p in paths if p in why]
