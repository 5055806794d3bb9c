"""contrib/spark/fleet_metrics.py in Spark local mode gives every figure DuckDB gives, on a
generated three-host dataset, as exported and partly compacted (slow: Spark starts a JVM)."""

from __future__ import annotations

import datetime as dt
import importlib.util
import math
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO

pytest.importorskip("pyarrow")
pytest.importorskip("duckdb")


def _java_ok() -> bool:
    java = shutil.which("java")
    if java is None:
        return False
    r = subprocess.run([java, "-version"], capture_output=True, text=True)
    return r.returncode == 0


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        if a is None or b is None:
            return a is b
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(a, str) and isinstance(b, str) and "T" in a and "T" in b:
        try:
            return dt.datetime.fromisoformat(a) == dt.datetime.fromisoformat(b)
        except ValueError:
            pass
    return bool(a == b)


@pytest.mark.slow
def test_spark_job_matches_duckdb_on_every_figure(tmp_path: Path) -> None:
    if not _java_ok():
        pytest.skip("needs Java (17) for Spark")
    pytest.importorskip("pyspark")
    from pyspark.sql import SparkSession

    from fsage.db.store import Store
    from fsage.fleet.compact import compact
    from fsage.fleet.export import export_parquet
    from fsage.fleet.query import fleet_tables
    from fsage.fleet.synth import synthetic_history

    ds, mixed = tmp_path / "fleet", tmp_path / "mixed"
    start = dt.datetime(2025, 5, 1, 2, 30, tzinfo=dt.UTC)
    seed = 20
    for h in range(3):
        db = tmp_path / f"h{h}.db"
        with Store.open(db, create=True) as store:
            for name, files, nights, step in (("root", 600, 6, 3), ("home", 900, 5, 2)):
                seed += 1
                synthetic_history(store, name, files=files, snapshots=nights - h, seed=seed,
                                  churn=0.03 * (h + 1), start=start,
                                  interval=dt.timedelta(days=step))  # fmt: skip
            if h == 2:  # one history too short for a rate
                synthetic_history(store, "tmp", files=200, snapshots=2, seed=99, start=start)
        export_parquet(db, ds, host=f"host{h}")
        if h == 2:  # hosts 0 and 1 compacted, host 2 beside them, as exported
            compact(mixed)
        export_parquet(db, mixed, host=f"host{h}")

    tables = ("filesystems", "size", "free", "outliers", "files_by_size")
    duck = fleet_tables(ds, tables, threshold=0.0)

    spec = importlib.util.spec_from_file_location(
        "fleet_metrics", REPO / "contrib" / "spark" / "fleet_metrics.py"
    )
    assert spec is not None and spec.loader is not None
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("fsage-fleet-test")
        .config("spark.ui.enabled", "false")
        # small data: no shuffle fan-out, no adaptive re-planning, no code generation
        .config("spark.sql.shuffle.partitions", "1")
        .config("spark.sql.adaptive.enabled", "false")
        .config("spark.sql.codegen.wholeStage", "false")
        .getOrCreate()
    )
    try:
        sparked = job.compute(spark, str(ds), threshold=0.0)
        sparked_mixed = job.compute(spark, str(mixed), threshold=0.0)
    finally:
        spark.stop()
    assert (mixed / "metrics" / "compacted").is_dir()
    assert list((mixed / "metrics").glob("host=host2/fs=*/part.parquet"))

    assert len(duck["filesystems"]) == 7
    assert sum(r["change_per_month"] is None for r in duck["filesystems"]) == 3
    assert len(duck["outliers"]) >= 10  # threshold 0: every rated value with its z
    compared = 0
    duck_mixed = fleet_tables(mixed, tables, threshold=0.0)
    for other in (sparked, sparked_mixed, duck_mixed):
        for name in tables:
            d, s = duck[name], other[name]
            assert len(d) == len(s), name
            for rd, rs in zip(d, s, strict=True):
                assert set(rd) == set(rs), name
                for k in rd:
                    assert _same(rd[k], rs[k]), (name, k, rd, rs)
                    compared += 1
    assert compared > 1500
