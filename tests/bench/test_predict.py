"""The regression of relative performance on layout score (seed 002), the table, the report."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from fsage.cli import main
from fsage.db.store import Store
from fsage.replay.bench.layoutscore import BenchLayout, SetScore
from fsage.replay.bench.predict import fit_line, predict
from fsage.replay.bench.run import BenchRun, store_run
from fsage.replay.bench.suites import Result
from fsage.reports import ReportData, build_sections, render
from fsage.reports.sections_bench import bench_extra
from tests.replay.synth import layout

# Seed 002's table: fs, date, bench layout, old layout, diff, pred read, actual read,
# pred write, actual write.
SEED002 = """
cnews 26Apr94 0.88 0.23 0.65 0.70 0.98 0.63 0.91
cnews 26Jul94 0.84 0.14 0.69 0.67 0.97 0.58 0.91
cnews 20Oct94 0.78 0.15 0.62 0.67 0.94 0.59 0.86
glan5 26Apr94 0.89 0.94 -0.05 0.99 0.97 0.94 0.88
glan5 26Jul94 0.89 0.95 -0.06 0.99 0.96 0.95 0.86
glan5 29Oct94 0.88 0.96 -0.08 0.99 0.96 0.96 0.89
staff 26Apr94 0.70 0.57 0.13 0.84 0.89 0.71 0.79
staff 26Jul94 0.69 0.55 0.14 0.83 0.88 0.69 0.76
staff 20Oct94 0.69 0.62 0.07 0.86 0.89 0.74 0.85
usr4 26Apr94 0.95 0.82 0.13 0.93 0.98 0.83 0.91
usr4 26Jul94 0.85 0.83 0.02 0.93 0.96 0.84 0.92
usr4 29Oct94 0.85 0.84 0.00 0.94 0.92 0.85 0.80
usr6 26Apr94 0.75 0.55 0.20 0.88 0.92 0.74 0.87
usr6 26Jul94 0.69 0.59 0.10 0.88 0.92 0.77 0.85
usr6 29Oct94 0.74 0.60 0.14 0.88 0.92 0.77 0.82
white 26Apr94 0.83 0.79 0.04 0.91 0.90 0.81 0.80
white 26Jul94 0.87 0.71 0.15 0.86 0.98 0.71 0.93
white 29Oct94 0.88 0.55 0.34 0.77 0.98 0.53 0.91
"""


def _seed002() -> list[list[str]]:
    return [line.split() for line in SEED002.strip().splitlines()]


def test_seed002_table_columns_are_consistent() -> None:
    # diff = bench layout - old layout, within the table's rounding (two decimals each).
    for row in _seed002():
        bench, old, diff = (float(v) for v in row[2:5])
        assert bench - old == pytest.approx(diff, abs=0.015), row


@pytest.mark.parametrize("fs", ["cnews", "glan5", "staff", "usr4", "white"])
def test_seed002_predictions_lie_on_one_line_per_file_system(fs: str) -> None:
    """Seed 002 predicts each file system's performance from its old files' layout score with
    an equation from linear regression: refitting the table's predictions against the old
    layout scores gives them back within the table's rounding."""
    rows = [r for r in _seed002() if r[0] == fs]
    old = [float(r[3]) for r in rows]
    for col in (5, 7):  # predicted read, predicted write
        pred = [float(r[col]) for r in rows]
        fit = fit_line(old, pred)
        assert fit is not None and fit.points == 3
        for x, y in zip(old, pred, strict=True):
            assert fit(x) == pytest.approx(y, abs=0.011), (fs, col, x, y)
        if fs != "glan5":  # glan5's predictions barely move: no slope to speak of
            assert fit.slope > 0  # better layout, better predicted performance


def test_fit_line_recovers_a_known_line_and_refuses_too_few_points() -> None:
    rng = np.random.default_rng(7)
    x = list(rng.uniform(0, 1, 20))
    y = [0.25 + 0.7 * v for v in x]
    fit = fit_line(x, y)
    assert fit is not None
    assert fit.slope == pytest.approx(0.7, abs=1e-12)
    assert fit.intercept == pytest.approx(0.25, abs=1e-12)
    assert fit.r == pytest.approx(1.0)
    assert fit_line([0.1, 0.9], [0.3, 0.9]) is None
    assert fit_line([0.5, 0.5, 0.5], [0.3, 0.4, 0.5]) is None


def _run(
    bench: float, old: float | None, old_files: int, read: float, write: float, size: int = 65536
) -> BenchRun:
    layout = BenchLayout(
        4096, SetScore(files=10, blocks=160, score=bench), SetScore(files=old_files, score=old)
    )
    p = {"file_size": size}
    return BenchRun(
        suite="create-read", target="/x", via="/x", fs_name="home", started_at="2024-01-02T00:00",
        seconds=1.0, cold=True, params={}, layout=layout,
        results=[Result("read", read, "KB/s", p), Result("write", write, "KB/s", p)],
    )  # fmt: skip


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store.open(tmp_path / "p.db", create=True)


# (bench layout, old layout) of the aged runs: bench scores span 0.2-0.9.
AGED = ((0.5, 0.4), (0.2, 0.9), (0.8, 0.6), (0.9, 0.3), (0.3, 0.5))


def test_predict_on_runs_with_a_known_line(store: Store) -> None:
    # relative read = 0.3 + 0.7 x, relative write = 0.5 x + 0.5; the empty-fs run scores 1.0.
    with store:
        store_run(store, _run(1.0, None, 0, 2000.0, 1000.0))
        for bench, old in AGED:
            store_run(
                store,
                _run(bench, old, 50, 2000.0 * (0.3 + 0.7 * bench), 1000 * (0.5 + 0.5 * bench)),
            )
        pred = predict(store, "create-read")
    assert pred.baseline == {"read": 2000.0, "write": 1000.0}
    assert pred.read_fit is not None and pred.write_fit is not None
    assert pred.read_fit.slope == pytest.approx(0.7) and pred.read_fit.intercept == pytest.approx(
        0.3
    )
    assert pred.write_fit.slope == pytest.approx(0.5)
    assert (pred.read_fit.x_min, pred.read_fit.x_max) == (0.2, 1.0)
    rows = {r.run_id: r for r in pred.rows}
    assert rows[1].pred_read is None  # the empty file system has no old files
    assert rows[2].actual_read == pytest.approx(0.65)
    assert rows[2].pred_read == pytest.approx(0.3 + 0.7 * 0.4)
    assert rows[2].pred_write == pytest.approx(0.5 + 0.5 * 0.4)
    assert rows[2].read_ci == pytest.approx(0.0, abs=1e-9)  # points exactly on the line
    assert rows[3].diff == pytest.approx(0.2 - 0.9)
    # Run 5's old files score 0.3... inside; nothing is outside 0.2-1.0 here.
    assert not any(r.outside for r in pred.rows) and pred.notes == []


def test_intervals_widen_with_noise_and_no_extrapolation(store: Store) -> None:
    rng = np.random.default_rng(3)
    with store:
        store_run(store, _run(1.0, None, 0, 2000.0, 1000.0))
        for bench, old in ((0.5, 0.55), (0.6, 0.7), (0.7, 0.1), (0.65, 0.6), (0.55, 0.65)):
            noise = float(rng.normal(0, 0.05))
            store_run(store, _run(bench, old, 50, 2000.0 * (0.3 + 0.7 * bench + noise), 900.0))
        pred = predict(store, "create-read")
    fit = pred.read_fit
    assert fit is not None and fit.points == 6 and fit.residual_sd > 0
    rows = {r.run_id: r for r in pred.rows}
    r2, r3 = rows[2], rows[4]
    assert r2.read_ci is not None and r2.read_ci > 0
    assert r3.outside and r3.pred_read is None  # old layout 0.1 < the lowest fitted 0.5
    assert any("outside" in n for n in pred.notes)
    # The interval is narrowest at the mean layout score.
    assert fit.ci(fit.x_mean) < fit.ci(fit.x_min) and fit.ci(fit.x_mean) < fit.ci(fit.x_max)


def test_too_few_or_too_close_runs_say_why(tmp_path: Path) -> None:
    db = tmp_path / "few.db"
    with Store.open(db, create=True) as store:
        store_run(store, _run(1.0, None, 0, 100.0, 100.0))
        store_run(store, _run(0.5, 0.5, 3, 80.0, 70.0))
    res = CliRunner().invoke(main, ["bench", "predict", "--db", str(db)])
    assert res.exit_code == 0, res.output
    assert (
        "note: no fit of read performance against layout score: 2 comparable runs with a "
        "layout score and a read result spanning 0.500; need 5 spanning 0.1 or more"
    ) in res.output
    lines = res.output.splitlines()
    header = next(i for i, ln in enumerate(lines) if ln.startswith("run "))
    assert re.split(r"\s{2,}", lines[header]) == [
        "run", "fs", "date", "bench layout", "old layout", "diff", "pred read", "± 95%",
        "actual read", "pred write", "± 95%", "actual write",
    ]  # fmt: skip
    assert lines[header + 3].split()[:6] == ["2", "home", "2024-01-02", "0.500", "0.500", "0.000"]
    assert lines[header + 3].split()[6:] == ["-", "-", "0.800", "-", "-", "0.700"]
    # Five runs whose scores lie within 0.04 (no empty-fs run): no fit either.
    close = tmp_path / "close.db"
    with Store.open(close, create=True) as store:
        for b in (0.50, 0.52, 0.54, 0.51, 0.53):
            store_run(store, _run(b, 0.5, 3, 80.0 * b, 70.0))
    res = CliRunner().invoke(main, ["bench", "predict", "--db", str(close), "--format", "json"])
    data = json.loads(res.output)
    assert data["read_fit"] is None
    assert any("5 comparable runs" in n and "spanning 0.040" in n for n in data["notes"])
    # An unknown file size is an error, not a silent fallback.
    res = CliRunner().invoke(main, ["bench", "predict", "--db", str(db), "--file-size", "8K"])
    assert res.exit_code != 0 and "fsage: error: no create-read results for 8192-byte" in (
        res.output
    )


def test_only_comparable_runs_are_fitted_and_dates_are_the_snapshots(store: Store) -> None:
    from fsage.replay.bench.run import stored_results

    with store:
        for bench, old in AGED:
            store_run(store, _run(bench, old, 50, 1000.0 * (0.3 + 0.7 * bench), 500.0))
        other = _run(0.9, 0.9, 50, 10.0, 10.0)
        other.params = {"files_per_dir": 100}
        store_run(store, other)
        pred = predict(store, "create-read")
        assert [r.run_id for r in pred.rows] == [1, 2, 3, 4, 5]
        assert any(n.startswith("runs 6 left out") for n in pred.notes)
        # A run linked to a recreation is dated by the snapshot it recreates.
        orig = store.add_snapshot(
            layout([]), name="x", taken_at=datetime(1994, 4, 26, 2, tzinfo=UTC)
        ).snapshot_id
        rec_layout = layout([])
        rec_layout.facts.uuid = "00000000-0000-0000-0000-0000000000aa"
        rec = store.add_snapshot(rec_layout, name="x-rec", recreation_of=orig).snapshot_id
        store.con.execute("UPDATE bench_runs SET snapshot_id = ? WHERE id = 2", (rec,))
        assert stored_results(store, "create-read")[2].snapshot_id == rec
        pred = predict(store, "create-read")
    assert {r.run_id: r.date for r in pred.rows}[2] == "1994-04-26"
    assert {r.run_id: r.date for r in pred.rows}[1] == "2024-01-02"


def test_report_section(store: Store) -> None:
    with store:
        assert bench_extra(store, None) is None
        assert not [s for s in build_sections(ReportData([], {})) if s.id == "benchmarks"]
        store_run(store, _run(1.0, None, 0, 2000.0, 1000.0))
        for bench, old in AGED:
            store_run(store, _run(bench, old, 50, 2000.0 * (0.3 + 0.7 * bench), 1000.0 * bench))
        extra = bench_extra(store, None)
    assert extra is not None and len(extra["runs"]) == 6
    data = ReportData([], {}, extra={"bench": extra})
    (sec,) = [s for s in build_sections(data) if s.id == "benchmarks"]
    assert len(sec.tables) == 2 and len(sec.tables[1].rows) == 6
    assert sec.tables[1].rows[1][3:6] == [0.5, 0.4, pytest.approx(0.1)]
    fig = sec.figures[0]
    assert [t["name"] for t in fig["data"]] == ["read", "read fit", "write", "write fit"]
    # The fit is drawn over the observed layout scores only (0.2 to 1.0).
    assert fig["data"][1]["x"] == [0.2, 1.0]
    assert fig["data"][1]["y"] == [pytest.approx(0.3 + 0.7 * 0.2), pytest.approx(1.0)]
    html = render(data, [sec])
    assert "Predicted vs actual relative performance" in html


def test_report_shows_runs_of_every_file_size(store: Store) -> None:
    # predict asks for one file size; the report must not fail on a database holding several.
    with store:
        for size in (4096, 65536):
            store_run(store, _run(1.0, None, 0, 2000.0, 1000.0, size))
            for bench, old in AGED:
                store_run(store, _run(bench, old, 50, 2000.0 * bench, 1000.0 * bench, size))
        extra = bench_extra(store, None)
    assert extra is not None
    assert sorted(p["file_size"] for p in extra["predictions"]) == [4096, 65536]
    assert all(len(p["rows"]) == 6 for p in extra["predictions"])


def _own_baseline_run(bench: float, read: float, base: float, verdict: str) -> BenchRun:
    """A run as `fsage bench IMG --baseline` stores it: its results carry the baseline of its
    own empty file system and the paired relative value bench printed."""
    run = _run(bench, 0.5, 50, read, 500.0)
    for r in run.results:
        r.params = {**r.params, "baseline": base, "relative": r.value / base, "verdict": verdict}
    return run


def test_a_run_with_its_own_baseline_is_relative_to_it_everywhere(store: Store) -> None:
    # bench printed relative read 0.210 against the empty file system it ran in turn with
    with store:
        store_run(store, _own_baseline_run(0.6, 210.0, 1000.0, "inconclusive"))
        pred = predict(store, "create-read")
        extra = bench_extra(store, None)
    (row,) = pred.rows
    assert row.actual_read == pytest.approx(0.210)  # not 1.000 against itself
    assert row.actual_write == pytest.approx(0.5)
    assert row.read_base == "own baseline" and row.read_verdict == "inconclusive"
    assert not any("no read run on an empty file system" in n for n in pred.notes)
    assert pred.table_rows()[0][8] == "0.210 (inconclusive)"
    # the report shows the same value, and draws it under "fraction of empty-fs performance"
    assert extra is not None
    data = ReportData([], {}, extra={"bench": extra})
    (section,) = [s for s in build_sections(data) if s.id == "benchmarks"]
    table = next(t for t in section.tables if "actual read" in t.headers)
    assert table.rows[0][table.headers.index("actual read")] == "0.210 (inconclusive)"
    assert table.rows[0][table.headers.index("actual write")] == "0.500 (inconclusive)"
    # drawn, as an inconclusive point (no decided trace of it)
    names = [t["name"] for t in section.figures[-1]["data"]]
    assert "read" not in names, names
    read = next(t for t in section.figures[-1]["data"] if t["name"] == "read (inconclusive)")
    assert read["y"] == [pytest.approx(0.210)]
    # `bench results` shows it too
    out = CliRunner().invoke(main, ["bench", "results", "--db", str(store.path), "--format",
                                    "csv"])  # fmt: skip
    assert out.exit_code == 0, out.output
    line = next(ln for ln in out.output.splitlines() if ",read," in ln)
    assert ",0.21,inconclusive," in line


def test_runs_without_a_baseline_of_their_own_are_named(store: Store) -> None:
    with store:
        store_run(store, _own_baseline_run(0.6, 210.0, 1000.0, "lower"))
        store_run(store, _run(0.7, 0.5, 50, 300.0, 400.0))  # no baseline, no empty fs run
        pred = predict(store, "create-read")
    rows = {r.run_id: r for r in pred.rows}
    assert rows[1].actual_read == pytest.approx(0.21) and rows[1].read_base == "own baseline"
    # the bare run is relative to the best bare run (itself): said, and not drawn as empty-fs
    assert rows[2].actual_read == pytest.approx(1.0) and rows[2].read_base == "best run"
    assert any("no read run on an empty file system for runs 2 " in n for n in pred.notes)
    assert pred.table_rows()[0][8] == pytest.approx(0.21)  # conclusive: the plain number
