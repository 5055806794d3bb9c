"""The fleet metrics of `fsage fleet` on Spark, for fleets that outgrow one machine.

Reads a dataset written by `fsage export --format parquet` (collected from many hosts into one
directory, HDFS or object-storage path; compacted by `fsage fleet compact` or not) and computes
the same tables as fsage's DuckDB queries (``fsage.fleet.query``): filesystems, size, free,
outliers and files_by_size (the layout score per size bucket from the exported extents). Needs
only pyspark; fsage need not be installed.

    spark-submit contrib/spark/fleet_metrics.py s3a://bucket/fleet fleet.json
    python3 contrib/spark/fleet_metrics.py /data/fleet fleet.json --master 'local[2]'

The output is one JSON object: table name -> list of rows (as `fsage fleet --format json`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from typing import Any

SCHEMA_VERSION = 1
TABLES = ("snapshots", "metrics", "size_buckets", "free_buckets", "files", "file_ends")
MIN_SPAN_DAYS = 7
DAYS_PER_MONTH = 365.25 / 12  # the month fsage analyze and fsage fleet use


SMALL = ("snapshots", "metrics", "size_buckets", "free_buckets")


def read_manifest(spark: Any, root: str) -> dict[str, Any] | None:
    """The compaction manifest (``_compacted.json``, written by `fsage fleet compact`), None
    when the dataset was never compacted."""
    try:
        found = spark.sparkContext.wholeTextFiles(f"{root}/_compacted.json").collect()
    except Exception:  # the JVM's "input path does not exist"
        return None
    if not found:
        return None
    manifest: dict[str, Any] = json.loads(found[0][1])
    if int(manifest["schema_version"]) > SCHEMA_VERSION:
        version = manifest["schema_version"]
        raise SystemExit(f"{root}: manifest of schema version {version}, this job reads 1")
    return manifest


def register(spark: Any, root: str) -> None:
    """One temporary view per table. Partition directories are not parsed (recursive lookup):
    the host and fs columns inside the files carry the names.

    A compacted dataset (see fsage.fleet.dataset) is read from the compacted files its
    manifest names plus, per file system, the per-partition rows newer than its watermark:
    for the small tables the rows with a newer snapshot_id, for the others the export runs
    (``s<first>-<last>.parquet``) whose last snapshot is newer."""
    manifest = read_manifest(spark, root)
    if manifest is None:
        for table in TABLES:
            df = spark.read.option("recursiveFileLookup", "true").parquet(f"{root}/{table}")
            df.createOrReplaceTempView(table)
        return
    from pyspark.sql import functions as F

    cover = spark.createDataFrame(
        [(c["host"], c["fs"], int(c["last_snapshot"])) for c in manifest["covered"]],
        "host string, fs string, mark long",
    )
    for table in TABLES:
        compacted = [f"{root}/{table}/{rel}" for rel in manifest["tables"].get(table, [])]
        df = spark.read.parquet(*compacted) if compacted else None
        try:
            fresh = spark.read.option("recursiveFileLookup", "true").parquet(
                f"{root}/{table}/host=*"
            )
        except Exception:  # no per-partition files
            fresh = None
        if fresh is not None:
            if table in SMALL:
                fresh = fresh.withColumn("_at", F.col("snapshot_id"))
            else:  # the export run's last snapshot, from the file name (read with the scan)
                run = F.regexp_extract(F.input_file_name(), r"s[0-9]+-([0-9]+)\.parquet$", 1)
                fresh = fresh.withColumn("_at", run.cast("long"))
            f, c = fresh.alias("f"), cover.alias("c")
            on = (F.col("f.host") == F.col("c.host")) & (F.col("f.fs") == F.col("c.fs"))
            keep = F.col("c.mark").isNull() | (F.col("f._at") > F.col("c.mark"))
            fresh = f.join(c, on, "left").where(keep).select("f.*").drop("_at")
            df = fresh if df is None else df.unionByName(fresh)
        if df is None:
            raise SystemExit(f"{root}: no {table} table")
        df.createOrReplaceTempView(table)


def check_schema_version(root: str) -> None:
    """Refuse a dataset of a newer schema (read from one Parquet footer, local paths only)."""
    try:
        import pathlib

        import pyarrow.parquet as pq
    except ImportError:
        return
    part = next(pathlib.Path(root, "snapshots").rglob("*.parquet"), None)
    if part is None:
        return
    raw = (pq.read_schema(part).metadata or {}).get(b"fsage.export")
    version = json.loads(raw)["schema_version"] if raw else None
    if version is None or version > SCHEMA_VERSION:
        raise SystemExit(f"{part}: export schema version {version}, this job reads 1")


LATEST = "latest AS (SELECT host, fs, max(snapshot_id) AS sid FROM metrics GROUP BY host, fs)"

# Buckets in bytes, as fsage/fleet/query.py: the block size of each file system's latest snapshot.
BLOCK_SIZES = """
    block_sizes AS (
        SELECT m.host, m.fs, m.block_size,
               CAST(round(log2(m.block_size)) AS INT) AS log2_block_size
        FROM metrics m JOIN latest l
        ON m.host = l.host AND m.fs = l.fs AND m.snapshot_id = l.sid)
"""

SLOPES = f"""
    fs_trend AS (
        SELECT host, fs, count(*) AS snapshots,
               min(taken_at) AS first_taken_at, max(taken_at) AS last_taken_at,
               (unix_micros(max(taken_at)) - unix_micros(min(taken_at))) / 86400e6 AS span_days,
               min_by(layout_score, snapshot_id) AS first_layout_score,
               max_by(layout_score, snapshot_id) AS last_layout_score,
               regr_slope(layout_score, unix_micros(taken_at) / 86400e6) AS slope
        FROM metrics WHERE layout_score IS NOT NULL GROUP BY host, fs),
    decline AS (
        SELECT *, CASE WHEN snapshots >= 2 THEN last_layout_score - first_layout_score END
                  AS total_change,
               CASE WHEN span_days >= {MIN_SPAN_DAYS} AND snapshots >= 2
                    THEN slope * {DAYS_PER_MONTH} END AS change_per_month,
               CASE WHEN snapshots < 2 THEN 'one scored snapshot'
                    WHEN span_days < {MIN_SPAN_DAYS}
                    THEN 'scored snapshots span under {MIN_SPAN_DAYS} days' END AS no_rate_reason
        FROM fs_trend)
"""

QUERIES = {
    "filesystems": f"""
        WITH {LATEST}, {SLOPES}
        SELECT m.host, m.fs, d.snapshots, d.first_taken_at, d.last_taken_at,
               d.span_days, m.snapshot_id AS latest_snapshot, m.files, m.layout_score,
               m.dynamic_layout_score_inode AS dynamic_layout_score,
               d.first_layout_score, d.total_change, d.change_per_month, d.no_rate_reason,
               CAST(m.blocks_free AS DOUBLE) / m.blocks_total AS free_fraction,
               m.free_extent_count, m.block_size, m.largest_free_extent,
               m.largest_free_extent * m.block_size AS largest_free_bytes,
               CASE WHEN m.blocks_free > 0 THEN CAST(m.free_chunks AS DOUBLE) * m.chunk_bytes
                    / m.block_size / m.blocks_free END AS free_in_whole_chunks
        FROM metrics m JOIN latest l ON m.host = l.host AND m.fs = l.fs AND m.snapshot_id = l.sid
        LEFT JOIN decline d ON d.host = m.host AND d.fs = m.fs
        ORDER BY d.change_per_month ASC NULLS LAST, d.total_change ASC NULLS LAST,
                 m.layout_score ASC NULLS LAST, m.host, m.fs
    """,
    "size": f"""
        WITH {LATEST}, {BLOCK_SIZES},
        cur AS (
            SELECT b.*, s.block_size, b.bucket + s.log2_block_size AS byte_bucket
            FROM size_buckets b JOIN latest l
            ON b.host = l.host AND b.fs = l.fs AND b.snapshot_id = l.sid
            JOIN block_sizes s ON b.host = s.host AND b.fs = s.fs),
        bm AS (
            SELECT b.host, b.fs, b.bucket, b.layout_score,
                   unix_micros(m.taken_at) / 86400e6 AS day
            FROM size_buckets b JOIN metrics m
            ON b.host = m.host AND b.fs = m.fs AND b.snapshot_id = m.snapshot_id
            WHERE b.layout_score IS NOT NULL),
        slopes AS (
            SELECT host, fs, bucket, regr_slope(layout_score, day) * {DAYS_PER_MONTH} AS rate
            FROM bm GROUP BY host, fs, bucket
            HAVING max(day) - min(day) >= {MIN_SPAN_DAYS} AND count(*) >= 2),
        rates AS (
            SELECT sl.bucket + s.log2_block_size AS byte_bucket,
                   avg(sl.rate) AS mean_change_per_month, count(sl.rate) AS rated
            FROM slopes sl JOIN block_sizes s ON sl.host = s.host AND sl.fs = s.fs
            GROUP BY sl.bucket + s.log2_block_size)
        SELECT c.byte_bucket AS bucket,
               count(*) AS filesystems, sum(c.files) AS files,
               sum(c.blocks * c.block_size) AS data_bytes,
               CAST(sum(c.contiguous * c.block_size) AS DOUBLE)
                   / sum(c.denominator * c.block_size) AS layout_score,
               min(c.layout_score) AS worst_layout_score,
               max(r.mean_change_per_month) AS mean_change_per_month,
               coalesce(max(r.rated), 0) AS rated_filesystems
        FROM cur c LEFT JOIN rates r ON r.byte_bucket = c.byte_bucket
        GROUP BY c.byte_bucket ORDER BY c.byte_bucket
    """,
    "free": f"""
        WITH {LATEST}, {BLOCK_SIZES},
        devices AS (
            SELECT host, max_by(fs, struct(taken_at, fs)) AS fs FROM (
                SELECT s.host, s.fs, s.uuid, s.taken_at FROM snapshots s JOIN latest l
                ON s.host = l.host AND s.fs = l.fs AND s.snapshot_id = l.sid)
            GROUP BY host, coalesce(uuid, fs)),
        cur AS (
            SELECT f.*, s.block_size, f.min_blocks * s.block_size AS min_bytes
            FROM free_buckets f JOIN latest l
            ON f.host = l.host AND f.fs = l.fs AND f.snapshot_id = l.sid
            JOIN devices d ON f.host = d.host AND f.fs = d.fs
            JOIN block_sizes s ON f.host = s.host AND f.fs = s.fs),
        total AS (SELECT sum(blocks * block_size) AS all_bytes FROM cur)
        SELECT min_bytes,
               CASE WHEN count(max_blocks) = count(*)
                    THEN max(max_blocks * block_size) END AS max_bytes,
               count(*) AS filesystems,
               sum(count) AS free_extents,
               sum(blocks * block_size) AS free_bytes,
               CAST(sum(blocks * block_size) AS DOUBLE) / max(all_bytes) AS share_of_free_space
        FROM cur CROSS JOIN total GROUP BY min_bytes ORDER BY min_bytes
    """,
    "outliers": f"""
        WITH {LATEST}, {SLOPES},
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
        SELECT *,
               CASE WHEN metric = 'layout_score'
                    THEN CASE WHEN z < 0 THEN 'worse layout than the fleet'
                              ELSE 'better layout than the fleet' END
                    WHEN z < 0 THEN 'declining faster than the fleet'
                    WHEN value > 0 THEN 'improving (score rising)'
                    ELSE 'declining slower than the fleet' END AS direction
        FROM z WHERE abs(z) >= {{threshold}} ORDER BY z ASC, host, fs, metric
    """,
    "files_by_size": """
        WITH want AS (SELECT host, fs, max(snapshot_id) AS sid FROM snapshots GROUP BY host, fs),
        cand AS (
            SELECT v.host, v.fs, w.sid, v.ino, v.first_snapshot, v.mode, v.extents
            FROM files v JOIN want w
            ON v.host = w.host AND v.fs = w.fs AND v.first_snapshot <= w.sid),
        live AS (
            SELECT c.* FROM cand c LEFT ANTI JOIN file_ends e
            ON e.host = c.host AND e.fs = c.fs AND e.ino = c.ino
               AND e.first_snapshot = c.first_snapshot AND e.last_snapshot < c.sid
            WHERE (c.mode & 61440) = 32768),
        ext AS (
            SELECT host, fs, sid, ino, x.logical AS logical, x.physical AS physical,
                   x.length AS length
            FROM (SELECT host, fs, sid, ino, explode(extents) AS x FROM live)
            WHERE (x.flags & 6) = 0 AND x.length > 0),
        ordered AS (
            SELECT *, lag(physical + length) OVER (
                PARTITION BY host, fs, sid, ino ORDER BY logical) AS prev_end
            FROM ext),
        per_file AS (
            SELECT host, fs, sid, ino, sum(length) AS blocks,
                   sum(length - 1)
                   + sum(CASE WHEN physical = prev_end THEN 1 ELSE 0 END) AS contiguous
            FROM ordered GROUP BY host, fs, sid, ino),
        bs AS (
            SELECT DISTINCT host, fs, snapshot_id AS sid, block_size,
                   CAST(round(log2(block_size)) AS INT) AS log2_block_size FROM snapshots),
        bucketed AS (
            SELECT p.*, b.block_size,
                   CAST(ceil(log2(p.blocks)) AS INT) + b.log2_block_size AS bucket
            FROM per_file p JOIN bs b ON p.host = b.host AND p.fs = b.fs AND p.sid = b.sid
            WHERE p.blocks >= 2)
        SELECT host, fs, sid AS snapshot_id, bucket, count(*) AS files, block_size,
               sum(blocks) AS blocks, sum(blocks) * block_size AS bytes,
               sum(contiguous) AS contiguous, sum(blocks - 1) AS denominator,
               CAST(sum(contiguous) AS DOUBLE) / sum(blocks - 1) AS layout_score
        FROM bucketed GROUP BY host, fs, sid, bucket, block_size
        ORDER BY host, fs, sid, bucket
    """,
}


def _plain(v: Any) -> Any:
    if isinstance(v, dt.datetime):  # the session runs in UTC
        return v.replace(tzinfo=dt.UTC).isoformat()
    return v


def compute(spark: Any, root: str, threshold: float = 2.0) -> dict[str, list[dict[str, Any]]]:
    """Every fleet table of the dataset at ``root``, as lists of plain dicts."""
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    register(spark, root)
    # the bounds and labels of the byte buckets, as fsage fleet gives them
    from fsage.fleet.query import free_bucket_fields, size_bucket_fields

    out = {}
    for name, sql in QUERIES.items():
        rows = spark.sql(sql.replace("{threshold}", repr(float(threshold)))).collect()
        out[name] = [{k: _plain(v) for k, v in r.asDict().items()} for r in rows]
    for name in ("size", "files_by_size"):
        out[name] = [{**r, **size_bucket_fields(r["bucket"])} for r in out[name]]
    out["free"] = [{**r, **free_bucket_fields(r["min_bytes"], r["max_bytes"])} for r in out["free"]]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dataset", help="directory (or URI) written by fsage export")
    ap.add_argument("output", help="JSON file to write ('-' for stdout)")
    ap.add_argument("--threshold", type=float, default=2.0, help="outliers: standard deviations")
    ap.add_argument("--master", help="Spark master, e.g. 'local[2]' (default: spark-submit's)")
    args = ap.parse_args(argv)
    from pyspark.sql import SparkSession

    if "://" not in args.dataset:
        check_schema_version(args.dataset)
    builder = SparkSession.builder.appName("fsage-fleet")
    if args.master:
        builder = builder.master(args.master)
    spark = builder.getOrCreate()
    try:
        result = compute(spark, args.dataset, args.threshold)
    finally:
        spark.stop()
    text = json.dumps(result, indent=2, default=str)
    if args.output == "-":
        sys.stdout.write(text + "\n")
    else:
        with open(args.output, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
