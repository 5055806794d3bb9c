"""One baseline, said the same way everywhere: a seq run of one-block files has its own
empty-file-system baseline (bench printed its relative values against it), so the report must
not call it a run without a baseline just because such files have no layout score to draw."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from fsage.cli import main
from fsage.db.store import Store
from fsage.replay.bench.run import BenchRun, store_run
from fsage.replay.bench.suites import Result
from fsage.reports.sections_bench import bench_extra, bench_section


def _seq_run() -> BenchRun:
    """A seq run of 1 KiB files (one block each: no layout score) with its interleaved
    baseline, its results' params as `fsage bench` leaves them: the baseline's median and the
    median of the rounds' paired ratios with its verdict."""

    def result(metric: str, value: float, base: float) -> Result:
        params = {"file_size": 1024, "baseline": base, "relative": value / base,
                  "relative_ci": [0.4, 0.6], "verdict": "lower"}  # fmt: skip
        return Result(metric, value, "KB/s", params)

    return BenchRun(
        suite="seq",
        target="aged.img",
        via="",
        fs_name="aged",
        started_at="2026-11-28T00:00:00+00:00",
        seconds=1.0,
        cold=True,
        params={"repeat": 8},
        results=[result("read", 10_000.0, 20_000.0), result("write", 8_000.0, 16_000.0)],
        layout=None,
    )


def test_one_block_files_with_a_baseline_are_not_said_to_have_none(tmp_path: Path) -> None:
    with Store.open(tmp_path / "b.db", create=True) as store:
        store_run(store, _seq_run())
        extra = bench_extra(store, None)
    assert extra is not None
    preds = [p for p in extra["predictions"] if p["file_size"] == 1024]
    assert len(preds) == 1, extra["predictions"]
    row = preds[0]["rows"][0]
    # What predict found: the run's own baseline, no layout score for its one-block files.
    assert row["bench_layout"] is None
    assert row["read_relative_to"] == "own baseline", row
    section = bench_section(SimpleNamespace(extra={"bench": extra}))  # type: ignore[arg-type]
    assert section is not None
    drawn = [n for n in section.notes if "no relative performance is drawn" in n]
    assert drawn, section.notes
    assert not any("no baseline" in n or "no run on an empty" in n for n in drawn), drawn
    assert any("no layout score" in n and "1,024-byte" in n for n in drawn), drawn


def test_predict_json_says_its_values_are_relative_to_an_empty_file_system(
    tmp_path: Path,
) -> None:
    db = tmp_path / "b.db"
    with Store.open(db, create=True) as store:
        store_run(store, _seq_run())
    r = CliRunner().invoke(main, ["bench", "predict", "--db", str(db), "--file-size", "1K",
                                  "--format", "json"])  # fmt: skip
    assert r.exit_code == 0, r.output
    pred = json.loads(r.stdout)
    (row,) = pred["rows"]
    # bench printed read at half the empty file system's: so does predict, and its header
    # flags agree with the row instead of saying there was no empty-fs run
    assert row["actual_read"] == pytest.approx(0.5) and row["read_relative_to"] == "own baseline"
    assert pred["baseline_empty_fs"] == {"read": True, "write": True}
    r = CliRunner().invoke(main, ["bench", "predict", "--help"])
    assert "best run on an empty file system;" not in r.output
    assert "own" in r.output and "paired ratios" in r.output


def test_inconclusive_runs_are_drawn_apart_from_decided_ones() -> None:
    """The figure of relative performance against layout score: a run whose spread was wider
    than its effect is its own faded trace named inconclusive, never a point like a measured
    one; the decided runs keep the plain trace."""

    def row(run_id: int, layout: float, value: float, verdict: str) -> dict[str, object]:
        return {"run_id": run_id, "fs": "aged", "date": "2026-11-28", "bench_layout": layout,
                "old_layout": 0.9, "diff": 0.0, "pred_read": 0.9, "pred_write": 0.9,
                "actual_read": value, "actual_write": value,
                "read_relative_to": "own baseline", "write_relative_to": "own baseline",
                "read_verdict": verdict, "write_verdict": verdict}  # fmt: skip

    pred = {"suite": "seq", "file_size": 65536, "notes": [], "baseline": {},
            "baseline_empty_fs": {"read": True, "write": True},
            "rows": [row(1, 0.8, 0.5, "lower"), row(2, 0.7, 2.4, "inconclusive"),
                     row(3, 0.6, 0.4, "lower")]}  # fmt: skip
    run = {"suite": "seq", "date": "2026-11-28", "results": []}
    extra = {"runs": [run], "predictions": [pred]}
    section = bench_section(SimpleNamespace(extra={"bench": extra}))  # type: ignore[arg-type]
    assert section is not None
    (fig,) = [f for f in section.figures if "Relative performance" in f["layout"]["title"]["text"]]
    markers = {t["name"]: t for t in fig["data"] if t["mode"] == "markers"}
    assert set(markers) == {"read", "write", "read (inconclusive)", "write (inconclusive)"}
    for metric in ("read", "write"):
        assert markers[metric]["x"] == [0.8, 0.6] and markers[metric]["y"] == [0.5, 0.4]
        faded = markers[f"{metric} (inconclusive)"]
        assert faded["x"] == [0.7] and faded["y"] == [2.4]
        assert faded["marker"]["opacity"] < 1 and "opacity" not in markers[metric]["marker"]
