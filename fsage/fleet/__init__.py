"""Fleet scale: a database's history as a Parquet dataset, and fleet questions over many of them.

``fsage.fleet.export`` writes the dataset (pyarrow), ``fsage.fleet.query`` answers the fleet
questions with DuckDB in process, ``fsage.fleet.report`` draws them. ``contrib/spark/`` has a
PySpark job that computes the same figures from the same dataset on a cluster.

Layout of a dataset directory (one ``host=``/``fs=`` partition per file system of each host;
the partition values are percent-encoded, the real names are the ``host`` and ``fs`` columns)::

    DIR/snapshots/host=H/fs=F/part.parquet      one row per snapshot (facts, counts, timings)
    DIR/metrics/host=H/fs=F/part.parquet        what `fsage analyze` computes, per snapshot
    DIR/size_buckets/host=H/fs=F/part.parquet   layout score per size bucket, per snapshot
    DIR/free_buckets/host=H/fs=F/part.parquet   free-space histogram (e2freefrag's buckets)
    DIR/files/host=H/fs=F/s<first>-<last>.parquet      file versions, extents as a list column
    DIR/file_ends/host=H/fs=F/s<first>-<last>.parquet  when each version stopped being valid
    DIR/free_extents/host=H/fs=F/s<first>-<last>.parquet  free extents of every snapshot
"""

from __future__ import annotations

SCHEMA_VERSION = 1
METADATA_KEY = b"fsage.export"

SMALL_TABLES = ("snapshots", "metrics", "size_buckets", "free_buckets")
LARGE_TABLES = ("files", "file_ends", "free_extents")
TABLES = SMALL_TABLES + LARGE_TABLES
