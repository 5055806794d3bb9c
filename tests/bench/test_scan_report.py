"""The report's bench section: scan runs with their aged/clean ratio or "inconclusive", and the
prediction figure (read points visible around write points; no 1.000 for a missing
baseline)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from fsage.db.store import Store
from fsage.replay.bench.run import BenchRun, store_run
from fsage.replay.bench.suites import Result
from fsage.reports.sections_bench import bench_extra, bench_section


def _scan_run(aged: list[float], clean: list[float], ratio: float | None) -> BenchRun:
    def side(values: list[float]) -> dict[str, Any]:
        med = sorted(values)[len(values) // 2]
        return {
            "seconds": med,
            "values": values,
            "spread": (max(values) - min(values)) / med,
            "mb_per_s": 100 / med,
            "bytes": 100_000_000,
            "files": 1000,
            "dirs": 10,
            "trace": {"score": 0.5, "requests": 10, "blocks": 100},
        }

    verdict = {
        "ratio": ratio,
        "verdict": "inconclusive" if ratio is None else "slower",
        "reason": "",
        "aged_median_seconds": side(aged)["seconds"],
        "clean_median_seconds": side(clean)["seconds"],
        "spread": 0.0,
        "difference": 0.0,
    }
    scan = {"path": ".", "aged": side(aged), "clean": side(clean), "aged_clean": verdict}
    results = [
        Result("scan", scan["aged"]["seconds"], "s", {"tree": "aged"}),
        Result("scan", scan["clean"]["seconds"], "s", {"tree": "clean"}),
    ]
    return BenchRun(
        suite="scan",
        target="aged.img",
        via="",
        fs_name="aged",
        started_at="2026-11-28T00:00:00+00:00",
        seconds=1.0,
        cold=True,
        params={"path": ".", "repeat": len(aged), "scan": scan},
        results=results,
        layout=None,
    )


def test_scan_runs_show_a_ratio_or_inconclusive(tmp_path: Path) -> None:
    with Store.open(tmp_path / "r.db", create=True) as store:
        store_run(store, _scan_run([10.0, 10.1, 10.2], [8.0, 8.1, 8.2], 10.1 / 8.1))
        store_run(store, _scan_run([10.0, 13.0, 11.0], [10.5, 10.4, 10.6], None))
        extra = bench_extra(store, None)
    assert extra is not None
    section = bench_section(SimpleNamespace(extra={"bench": extra}))  # type: ignore[arg-type]
    assert section is not None
    scan_tables = [t for t in section.tables if "aged/clean" in t.headers]
    assert len(scan_tables) == 1
    col = scan_tables[0].headers.index("aged/clean")
    assert [row[col] for row in scan_tables[0].rows] == [f"{10.1 / 8.1:.3f}", "inconclusive"]
    fig = section.figures[0]
    assert [t["name"] for t in fig["data"]] == ["aged", "clean"]
    # the range of the repeats drawn around each median: 13.0 - 11.0 above, 11.0 - 10.0 below
    assert fig["data"][0]["error_y"]["array"][1] == 2.0
    assert fig["data"][0]["error_y"]["arrayminus"][1] == 1.0


def _prediction(read_empty: bool) -> dict[str, Any]:
    rows = [
        {
            "run_id": i,
            "fs": "f",
            "date": "2026-11-28",
            "bench_layout": 0.5 + 0.1 * i,
            "old_layout": 0.9,
            "diff": None,
            "pred_read": None,
            "actual_read": 1.0 if i == 1 else 0.8,
            "pred_write": None,
            "actual_write": 1.0 if i == 1 else 0.8,
        }
        for i in (1, 2)
    ]
    return {
        "suite": "seq",
        "file_size": 65536,
        "baseline": {"read": 10.0, "write": 5.0},
        "baseline_empty_fs": {"read": read_empty, "write": True},
        "rows": rows,
        "notes": [],
        "read_fit": None,
        "write_fit": None,
    }


def _section(pred: dict[str, Any]) -> Any:
    runs = [{"run_id": 1, "suite": "seq", "fs": "f", "date": "d", "cold": True, "results": []}]
    data = SimpleNamespace(extra={"bench": {"runs": runs, "predictions": [pred]}})
    return bench_section(data)  # type: ignore[arg-type]


def test_read_points_stay_visible_over_write_points() -> None:
    section = _section(_prediction(read_empty=True))
    traces = {t["name"]: t for t in section.figures[0]["data"]}
    read, write = traces["read"]["marker"], traces["write"]["marker"]
    # the same places, drawn so that both show: an open circle larger than the cross inside
    assert traces["read"]["x"] == traces["write"]["x"]
    assert read["symbol"].endswith("-open") and read["size"] > write["size"]
    assert read["symbol"] != write["symbol"]


def test_a_missing_baseline_draws_nothing_and_says_so() -> None:
    section = _section(_prediction(read_empty=False))
    names = [t["name"] for t in section.figures[0]["data"]]
    assert "read" not in names and "write" in names
    assert any("read: no baseline" in n for n in section.notes)
    table = next(t for t in section.tables if "actual read" in t.headers)
    col = table.headers.index("actual read")
    assert {row[col] for row in table.rows} == {"no baseline"}


def test_scan_runs_are_not_predicted(tmp_path: Path) -> None:
    from fsage.errors import UsageError
    from fsage.replay.bench.predict import predict

    with Store.open(tmp_path / "r.db", create=True) as store:
        store_run(store, _scan_run([10.0, 10.1, 10.2], [8.0, 8.1, 8.2], 10.1 / 8.1))
        with pytest.raises(UsageError, match="aged/clean ratio"):
            predict(store, "scan")
