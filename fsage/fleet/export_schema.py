"""The Arrow schemas of the Parquet export's tables, and the partition layout of its files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import quote

from fsage.errors import FsageError
from fsage.fleet import METADATA_KEY, SCHEMA_VERSION


class ExportError(FsageError):
    """The dataset cannot be written or does not match the database."""


def require_pyarrow() -> Any:
    try:
        import pyarrow
    except ImportError:
        raise ExportError("the Parquet export needs pyarrow (pip install 'fsage[fleet]')") from None
    return pyarrow


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

# Columns of the large tables written with a dictionary (the export's and the compaction's
# writers). A dictionary-encoded column chunk is held in memory until the row group ends (its
# dictionary page comes first), and a column of distinct values (paths, inode numbers) gains
# nothing from one: plain pages compressed by zstd made the compacted files a third smaller
# and the compaction's peak 20 MiB lower at 1.4M files.
DICTIONARY = ["host", "fs"]


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


def partition_dir(root: Path, table: str, host: str, fs: str) -> Path:
    return root / table / f"host={quote(host, safe='')}" / f"fs={quote(fs, safe='')}"


def table_metadata(table: str) -> dict[bytes, bytes]:
    return {METADATA_KEY: json.dumps({"schema_version": SCHEMA_VERSION, "table": table}).encode()}
