"""The aging studies of a database in the Parquet export.

One row per study, step and file system, in ``DIR/study_results/host=H/study=N/part.parquet``:
the columns of the study report's paper table (:mod:`fsage.reports.study`, so the export and
the report cannot disagree), the study's parameters, the snapshot the step took (its
``fs_name`` and ``snapshot_id`` join the ``snapshots`` and ``metrics`` tables, where the study's
snapshots are exported as any others) and the whole stored result as JSON. A study grows while
it runs or is resumed, and its rows are few: each export rewrites its partition whole.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any
from urllib.parse import quote

from fsage.db.store import Store
from fsage.fleet.export_dataset import PendingFiles
from fsage.fleet.export_schema import table_metadata

TABLE = "study_results"
#: Float columns of the report's table row, exported as they are.
FLOATS = (
    "gib",
    "aged_s_per_gib",
    "clean_s_per_gib",
    "ratio",
    "ratio_low",
    "ratio_high",
    "layout_score",
    "dynamic_score",
    "modeled_dynamic_score",
    "free_share",
    "largest_free_mib",
    "dsp3105_aged_s",
    "dsp3105_clean_s",
    "dsp3105_ratio",
    "hdd_aged_s",
    "hdd_clean_s",
    "hdd_ratio",
)
INTS = ("files", "nospace_ops")


def study_schema() -> Any:
    import pyarrow as pa

    i64, f64, s = pa.int64(), pa.float64(), pa.string()
    return pa.schema(
        [
            ("host", s),
            ("study_id", i64),
            ("workload", s),
            ("size", i64),
            ("steps", i64),
            ("seed", i64),
            ("params", s),
            ("step", i64),
            ("fs", s),
            ("fs_name", s),
            ("snapshot_id", i64),
            ("error", s),
            ("verdict", s),
            ("rounds", i64),
            ("aged_seconds", f64),
            ("clean_seconds", f64),
            *((k, i64) for k in INTS),
            *((k, f64) for k in FLOATS),
            ("metrics", s),
        ]
    )


def study_dir(root: Path, host: str, study_id: int) -> Path:
    return root / TABLE / f"host={quote(host, safe='')}" / f"study={study_id}"


def study_rows(store: Store, host: str, study_id: int) -> list[dict[str, Any]]:
    """The export's rows of one study (failed steps included, with their error)."""
    from fsage.reports.study import table_row
    from fsage.study.store import load_study

    row = load_study(store, study_id)
    p = row.params
    out = []
    for r in row.results:
        scan = r.get("scan") or {}
        flat = table_row(r) if "error" not in r else {}
        out.append(
            {
                "host": host,
                "study_id": row.id,
                "workload": p.get("workload"),
                "size": p.get("size"),
                "steps": p.get("steps"),
                "seed": p.get("seed"),
                "params": json.dumps(p, sort_keys=True),
                "step": r["step"],
                "fs": r["fs"],
                "fs_name": f"study{row.id}-{r['fs']}",
                "snapshot_id": r.get("snapshot_id"),
                "error": r.get("error"),
                "verdict": scan.get("verdict"),
                "rounds": scan.get("rounds", len(scan.get("aged_values") or []) or None),
                "aged_seconds": scan.get("aged_seconds"),
                "clean_seconds": scan.get("clean_seconds"),
                **{k: flat.get(k) for k in (*INTS, *FLOATS)},
                "metrics": json.dumps(
                    {k: v for k, v in r.items() if k not in ("step", "fs")},
                    sort_keys=True,
                    default=str,
                ),
            }
        )
    return out


def export_studies(
    pa: Any, pq: Any, store: Store, out: Path, host: str, writer: PendingFiles
) -> int:
    """Write every study of ``store`` under ``out`` (committed with the export's other files);
    returns the rows written."""
    from fsage.study.store import list_studies

    try:
        studies = list_studies(store)
    except sqlite3.OperationalError:  # a database from before studies were stored
        return 0
    schema = study_schema().with_metadata(table_metadata(TABLE))
    n = 0
    for s in studies:
        rows = study_rows(store, host, int(s["id"]))
        table = pa.Table.from_pylist(rows, schema=schema)
        pq.write_table(table, writer.path(study_dir(out, host, int(s["id"])) / "part.parquet"),
                       compression="zstd")  # fmt: skip
        n += len(rows)
    return n
