"""Figures a reader would misread, checked on their data: the compared snapshots' free space in
size order with shares a small bucket shows in, lines broken at empty size classes, 1.0 on the
score axes that draw it, the bench figure's intervals and 1.0 with notes that agree with its
table, and one count of operations (the file system's) in the hover, JSON and CSV."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from analyzer.layouts import layout, table
from click.testing import CliRunner

from fsage.analyzer.history import trends
from fsage.cli import main
from fsage.db.store import Store
from fsage.replay.bench.layoutscore import BenchLayout, SetScore
from fsage.replay.bench.run import BenchRun, store_run
from fsage.replay.bench.suites import Result
from fsage.reports import ReportData
from fsage.reports.sections import MIN_SCORE_SPAN, score_by_size, score_over_time
from fsage.reports.sections_bench import bench_extra, bench_section
from fsage.reports.sections_compare import compare

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30


def _size_row(max_blocks: int, score: float, files: int = 5) -> dict[str, Any]:
    return {"min_blocks": max_blocks // 2 + 1, "max_blocks": max_blocks, "files": files,
            "blocks": files * max_blocks, "layout_score": score}  # fmt: skip


def _side(sid: int, free: dict[int, tuple[int, int]], sizes: list[int]) -> dict[str, Any]:
    """A compared snapshot of 4 KiB blocks: free extents {bytes: (extents, blocks)}, and
    by_size rows of the given classes (largest blocks)."""
    bs = 4096
    return {
        "id": sid, "fs": "home", "taken_at": f"2025-01-0{sid}T00:00:00+00:00",
        "block_size": bs, "files": 10, "layout_score": 0.98, "blocks_free": 100,
        "largest_free_extent": 10,
        "free_extents": [{"min_blocks": n // bs, "count": c, "blocks": b}
                         for n, (c, b) in sorted(free.items())],
        "by_size": [_size_row(k, 0.99) for k in sizes],
    }  # fmt: skip


def test_compared_free_space_is_in_size_order_and_small_buckets_show() -> None:
    # the reviewer's pair: the first snapshot's buckets are not the second's, and one 4 GiB
    # extent holds nearly all the first snapshot's free space
    a = _side(1, {4 * KIB: (50, 60), 8 * KIB: (80, 200), 256 * KIB: (1, 100),
                  2 * MIB: (1, 900), 4 * GIB: (1, 1_086_368)}, [2, 4])  # fmt: skip
    b = _side(2, {64 * KIB: (40, 700), 4 * KIB: (10, 10), 1 * MIB: (3, 800)}, [2, 512])
    files = {"in_both": 1, "moved": 0, "moved_blocks": 0, "unchanged": 1, "only_in_a": 0,
             "only_in_b": 0}  # fmt: skip
    sec = compare(ReportData([], {}, extra={"compare": {"a": a, "b": b, "files": files}}))
    assert sec is not None
    score_fig, free_fig = sec.figures
    labels = free_fig["layout"]["xaxis"]["categoryarray"]
    assert len(labels) == 21  # 4 KiB .. 4 GiB, every bucket between
    assert labels[0] == "4 KiB-<8 KiB" and labels[6] == "256 KiB-<512 KiB"
    assert labels[-1] == "4 GiB-<8 GiB"
    traces = free_fig["data"]
    assert len(traces) == 4  # per snapshot: share of the free space, share of the extents
    for t in traces:
        assert t["x"] == labels
    a_space, a_extents, b_space, b_extents = (t["y"] for t in traces)
    assert sum(a_space) == pytest.approx(1.0) and sum(a_extents) == pytest.approx(1.0)
    assert a_space[labels.index("16 KiB-<32 KiB")] == 0  # an empty bucket keeps its place
    # the 256 KiB extent: 0.01% of the space, but 1 of the 133 extents
    i = labels.index("256 KiB-<512 KiB")
    assert a_space[i] < 1e-3 and a_extents[i] == pytest.approx(1 / 133)
    assert b_space[labels.index("64 KiB-<128 KiB")] == pytest.approx(700 / 1510)
    assert b_extents[labels.index("4 KiB-<8 KiB")] == pytest.approx(10 / 53)
    assert free_fig["layout"]["yaxis"]["tickformat"] == ".0%"
    # the score by size: one axis in size order (b's 2 MiB class is not appended after a's),
    # a's line stops at its last class, b's breaks over the classes without files
    sizes = score_fig["layout"]["xaxis"]["categoryarray"]
    assert sizes[0] == "4 KiB-8 KiB" and sizes[-1] == "1 MiB-2 MiB" and len(sizes) == 9
    sa, sb = score_fig["data"]
    assert sa["x"] == sb["x"] == sizes
    assert sb["y"][0] == 0.99 and sb["y"][1:8] == [None] * 7 and sb["y"][8] == 0.99
    assert sb["connectgaps"] is False


def _analysis(sid: int, score: float, by_size: list[dict[str, Any]] | None = None,
              ops: int | None = None) -> dict[str, Any]:  # fmt: skip
    return {
        "id": sid, "fs": "home", "taken_at": f"2025-01-01T02:{sid:02d}:00+00:00",
        "layout_score": score, "files": 10, "block_size": 4096, "blocks_free": 100,
        "largest_free_extent": 64, "free_extents": [], "by_size": by_size or [],
        "op_count": ops, "bytes_written": None if ops is None else ops * 4096,
    }  # fmt: skip


def test_size_plot_breaks_the_line_at_classes_without_files() -> None:
    # files of 8-16 KiB and of 1-2 MiB, none between
    rows = [_size_row(2, 0.99), _size_row(4, 0.98), _size_row(512, 0.97)]
    an = [_analysis(1, 0.98, rows)]
    sec = score_by_size(ReportData(analyses=an, trends=trends(an)))
    assert sec is not None
    (trace,) = sec.figures[0]["data"]
    assert trace["x"] == [4096 * 2**k for k in range(1, 10)]  # 8 KiB .. 2 MiB
    assert trace["y"] == [0.99, 0.98, None, None, None, None, None, None, 0.97]
    assert trace["connectgaps"] is False


def test_a_flat_history_keeps_the_perfect_line_on_the_score_axes() -> None:
    # a flat history near 0.995: the axis used to stop at 0.9997, the 1.0 line off the plot
    scores = [0.9977, 0.9951, 0.9947, 0.9948, 0.9948, 0.9947]
    rows = [_size_row(2, 0.9961), _size_row(4, 0.9995)]
    an = [_analysis(i + 1, s, rows) for i, s in enumerate(scores)]
    data = ReportData(analyses=an, trends=trends(an))
    for sec in (score_over_time(data), score_by_size(data)):
        assert sec is not None
        (fig,) = sec.figures
        lo, hi = fig["layout"]["yaxis"]["range"]
        assert [s["y0"] for s in fig["layout"]["shapes"]] == [1.0]
        assert 1.0 < hi <= 1.005  # the line is inside, a little below the top
        assert hi - lo >= MIN_SCORE_SPAN - 1e-12  # not zoomed into the noise
        assert lo <= min(scores)


def _bench_run(read_ci: list[float] | None, write_ci: list[float] | None,
               params: dict[str, Any] | None = None) -> BenchRun:  # fmt: skip
    """A seq run of 64 KiB files on an aged image: with intervals, its results are relative
    to its own baseline (as `fsage bench IMG` stores them); without, a run on a directory."""
    lay = BenchLayout(4096, SetScore(files=64, blocks=1024, score=0.97),
                      SetScore(files=900, score=0.99))  # fmt: skip

    def result(metric: str, rel: float, ci: list[float] | None) -> Result:
        p: dict[str, Any] = {"file_size": 65536}
        if ci is not None:
            p |= {"baseline": 1000.0, "relative": rel, "relative_ci": ci, "verdict": "lower"}
        return Result(metric, 1000.0 * rel, "KB/s", p)

    return BenchRun(
        suite="seq", target="aged.img", via="", fs_name="aged",
        started_at="2026-11-28T00:00:00+00:00", seconds=1.0, cold=True, params=params or {},
        results=[result("read", 0.44, read_ci), result("write", 0.47, write_ci)], layout=lay,
    )  # fmt: skip


def test_bench_figure_draws_intervals_and_1_and_its_notes_agree_with_the_table(
    tmp_path: Path,
) -> None:
    with Store.open(tmp_path / "b.db", create=True) as store:
        store_run(store, _bench_run([0.22, 0.60], [0.24, 0.66]))  # run 1: its own baseline
        store_run(store, _bench_run(None, None))  # run 2: no baseline
        store_run(store, _bench_run(None, None, {"fsync": True}))  # run 3: other parameters
        extra = bench_extra(store, None)
    assert extra is not None
    sec = bench_section(SimpleNamespace(extra={"bench": extra}))  # type: ignore[arg-type]
    assert sec is not None
    (fig,) = [f for f in sec.figures if "Relative performance" in f["layout"]["title"]["text"]]
    traces = {t["name"]: t for t in fig["data"]}
    for metric, (lo, hi) in (("read", (0.22, 0.60)), ("write", (0.24, 0.66))):
        t = traces[metric]
        (y,) = t["y"]
        err = t["error_y"]
        assert err["type"] == "data" and err["symmetric"] is False
        assert y + err["array"][0] == pytest.approx(hi)
        assert y - err["arrayminus"][0] == pytest.approx(lo)
    y0, y1 = fig["layout"]["yaxis"]["range"]
    assert y0 <= 0.22 and y1 > 1.0  # the whole intervals, and the empty file system
    assert [s["y0"] for s in fig["layout"]["shapes"]] == [1.0]
    # the table: run 2 has no baseline; the notes say so once, not "relative to the best"
    pred_table = next(t for t in sec.tables if "actual read" in t.headers)
    by_run = {row[0]: row for row in pred_table.rows}
    assert set(by_run) == {1, 2}
    assert by_run[2][pred_table.headers.index("actual read")] == "no baseline"
    notes = sec.notes
    assert len(notes) == len(set(notes))
    assert not any("best of them" in n for n in notes), notes
    assert sum("no fit of" in n for n in notes) == 1, notes
    assert sum("run 2:" in n and "no baseline" in n for n in notes) == 1, notes
    assert any("runs 3 left out" in n for n in notes), notes
    assert not any("2" in n.split("left out")[0] for n in notes if "left out" in n), notes


def _history_db(path: Path) -> Path:
    """Two aging runs of one file system: 0, 500 ops, then 0, 200 of the second run."""
    lay = layout(table([[(0, 100, 4)], [(0, 200, 8)]]), free=[(1000, 50)])
    with Store.open(path, create=True) as store:
        for minute, ops in enumerate((0, 500, 0, 200)):
            store.add_snapshot(
                lay, name="aged", taken_at=datetime(2025, 1, 1, 0, minute, tzinfo=UTC),
                op_count=ops, bytes_written=ops * 4096,
            )  # fmt: skip
    return path


def test_hover_json_and_csv_count_the_file_systems_operations(tmp_path: Path) -> None:
    db = _history_db(tmp_path / "h.db")
    runner = CliRunner()
    out = runner.invoke(main, ["analyze", "--db", str(db), "--history", "--format", "json"])
    assert out.exit_code == 0, out.output
    snaps = json.loads(out.stdout)["trends"]["aged"]["snapshots"]
    assert [s["ops_done"] for s in snaps] == [0, 500, 500, 700]
    assert [s["op_count"] for s in snaps] == [0, 500, 0, 200]  # each run's own, as stored
    assert snaps[3]["gib_written"] == pytest.approx(700 * 4096 / GIB)
    out = runner.invoke(main, ["analyze", "--db", str(db), "--history", "--format", "csv"])
    assert out.exit_code == 0, out.output
    rows = list(csv.DictReader(io.StringIO(out.stdout)))
    assert [int(r["ops_done"]) for r in rows] == [0, 500, 500, 700]
    assert [int(r["op_count"]) for r in rows] == [0, 500, 0, 200]
    text = runner.invoke(main, ["analyze", "--db", str(db), "--history"]).stdout.splitlines()
    head = next(i for i, ln in enumerate(text) if ln.startswith("id "))
    assert [int(ln.split()[2]) for ln in text[head + 2 : head + 6]] == [0, 500, 500, 700]
    # the report's hover: the count the snapshot is drawn at
    an = [_analysis(i + 1, 0.99, ops=ops) for i, ops in enumerate((0, 500, 0, 200))]
    sec = score_over_time(ReportData(analyses=an, trends=trends(an)))
    assert sec is not None
    (trace,) = sec.figures[0]["data"]
    assert trace["x"] == [0, 500, 500, 700]
    assert "<br>700 ops done (200 in this run)<br>" in trace["text"][3]
    assert "<br>500 ops done (0 in this run)<br>" in trace["text"][2]
    assert "<br>500 ops done<br>" in trace["text"][1]
