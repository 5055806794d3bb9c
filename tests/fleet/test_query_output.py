"""The streamed fleet tables print the bytes that json.dumps, csv.DictWriter and the CLI's
echo_table print for the same rows held whole."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest

from fsage.cli.common import echo_table
from fsage.fleet import output
from fsage.fleet.query import CHUNK

ROWS = [
    {"host": "h\u00e9", "fs": 'a"b\\c', "snapshot_id": 1, "taken_at": "2025-01-01T00:00:00+00:00",
     "layout_score": 0.1 + 0.2, "free_fraction": None},
    {"host": "h", "fs": "x\ny\x1b[31m", "snapshot_id": 2**40, "taken_at": None,
     "layout_score": float("nan"), "free_fraction": float("inf")},
    {"host": "h", "fs": "\U0001f600", "snapshot_id": -3, "taken_at": "t",
     "layout_score": 1e-300, "free_fraction": True},
]  # fmt: skip


def _streams(tables: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    return {k: iter(v) for k, v in tables.items()}


@pytest.mark.parametrize("n", [0, 1, 3, CHUNK + 5])
def test_json_csv_and_text_are_those_of_the_whole_rows(
    n: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [dict(ROWS[i % 3], snapshot_id=i) for i in range(n)]
    tables = {"trend": rows, "outliers": []}
    buf = io.StringIO()
    output._json(_streams(tables), buf)
    assert buf.getvalue() == json.dumps(tables, indent=2, default=str) + "\n"
    buf = io.StringIO()
    output._csv(iter(rows), buf)
    want = io.StringIO()
    if rows:
        w = csv.DictWriter(want, fieldnames=list(rows[0]), lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    assert buf.getvalue() == want.getvalue()
    buf = io.StringIO()
    output._text(_streams({"trend": rows}), buf, tmp_path)
    _, cols = output.TEXT_COLUMNS["trend"]
    print("layout score over time:")
    if rows:
        echo_table(cols, [[r[c] for c in cols] for r in rows])
    else:
        print("  (none)")
    assert buf.getvalue() == capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []  # the cells' file is gone
