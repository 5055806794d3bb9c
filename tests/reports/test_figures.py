"""What the report's figures show a reader, checked on the figure dicts with exact values: score
axes that do not magnify a few thousandths, the file system's cumulative operations, a colour
per file system and disk model, labelled log ticks, every size bucket, one colour scale for the
heatmaps, readable free-space bars for one snapshot and a day around a lone snapshot time."""

from __future__ import annotations

from typing import Any

from fsage.analyzer.history import cumulative, trends
from fsage.reports import ReportData
from fsage.reports.sections import MIN_SCORE_SPAN, log_axis, score_axis, score_over_time
from fsage.reports.sections_disk import _every_bucket, disk_model, free_space


def test_cumulative_counts_on_across_runs() -> None:
    # run 1: start (0) .. 1500; a nightly snapshot without a count; run 2 from 0; a resume
    # continues its run's count (no fall: no new offset)
    ops = [None, 0, 500, 1500, None, 0, 400, 900, 1200, 100]
    assert cumulative(ops) == [None, 0, 500, 1500, None, 1500, 1900, 2400, 2700, 2800]
    assert cumulative([]) == []


def test_score_axes_never_magnify_a_few_thousandths() -> None:
    for values in ([0.998, 1.0, 0.999], [0.9775, 0.981], [0.5, 0.9], [1.0]):
        lo, hi = score_axis(list(values))["range"]
        assert hi - lo >= MIN_SCORE_SPAN - 1e-12
        assert lo <= min(values) and hi >= max(values) and hi <= 1.005
    lo, hi = score_axis([0.5, 0.9])["range"]
    assert hi - lo < 0.6  # a real fall is still zoomed to


def test_log_ticks_are_labelled_with_their_values() -> None:
    ax = log_axis(0.35, 180.0)
    vals, text = ax["tickvals"], ax["ticktext"]
    assert vals == [0.5, 1, 2, 5, 10, 20, 50, 100, 200]
    assert [float(t.replace(",", "")) for t in text] == vals
    wide = log_axis(0.07, 3000.0)  # more than four decades: the decades only
    assert wide["tickvals"] == [0.1, 1, 10, 100, 1000]


def test_file_size_axis_keeps_empty_buckets() -> None:
    hist = [
        {"min_bytes": 1024, "max_bytes": 2047, "files": 3},
        {"min_bytes": 4096, "max_bytes": 8191, "files": 1},
    ]
    got = _every_bucket(hist)
    assert [(r["min_bytes"], r["max_bytes"], r["files"]) for r in got] == [
        (1024, 2047, 3),
        (2048, 4095, 0),
        (4096, 8191, 1),
    ]


def _analysis(fs: str, sid: int, day: int, free: list[tuple[int, int, int]]) -> dict[str, Any]:
    rows = [{"min_blocks": k, "count": c, "blocks": b} for k, c, b in free]
    return {
        "id": sid, "fs": fs, "taken_at": f"2025-01-{day:02d}T02:30:00+00:00",
        "layout_score": 0.99, "files": 10, "block_size": 4096, "blocks_free": 100,
        "largest_free_extent": 64, "free_extents": rows, "op_count": None,
        "bytes_written": None,
    }  # fmt: skip


def test_heatmaps_share_one_colour_scale() -> None:
    an = [
        _analysis("a", 1, 1, [(1, 10, 10), (64, 1, 90)]),
        _analysis("a", 2, 2, [(1, 10, 10), (64, 1, 90)]),
        _analysis("b", 3, 1, [(1, 60, 60), (4, 10, 40)]),
        _analysis("b", 4, 2, [(1, 60, 60), (4, 10, 40)]),
    ]
    sec = free_space(ReportData(analyses=an, trends=trends(an)))
    assert sec is not None
    scales = {(f["data"][0]["zmin"], f["data"][0]["zmax"]) for f in sec.figures}
    assert scales == {(0, 0.9)}  # the largest share of any bucket: a's 90 of 100 blocks
    # no free extent of a size is white, the least share another colour
    assert len({str(f["data"][0]["colorscale"]) for f in sec.figures}) == 1
    stops = sec.figures[0]["data"][0]["colorscale"]
    assert stops[0] == [0.0, "#ffffff"] and stops[1][0] < 0.01 and stops[1][1] != "#ffffff"
    # empty buckets between the smallest and the largest are rows of the heatmap
    assert len(sec.figures[0]["data"][0]["y"]) == 7  # 1, 2, 4, ... 64 blocks


def test_one_snapshot_free_space_shows_shares_of_space_and_of_extents() -> None:
    an = [_analysis("a", 1, 1, [(1, 30, 30), (4, 5, 20), (1024, 1, 1950)])]
    sec = free_space(ReportData(analyses=an, trends=trends(an)))
    assert sec is not None
    (fig,) = sec.figures
    space, extents = fig["data"]
    assert len(space["x"]) == 11  # 1 block .. 1024 blocks, the empty buckets too
    assert sum(space["y"]) == 1.0 and abs(sum(extents["y"]) - 1.0) < 1e-12
    assert space["y"][0] == 30 / 2000 and extents["y"][0] == 30 / 36
    assert fig["layout"]["yaxis"]["tickformat"] == ".0%"


def test_a_lone_snapshot_time_spans_a_day() -> None:
    an = [_analysis("a", 1, 5, [(1, 1, 1)])]
    sec = score_over_time(ReportData(analyses=an, trends=trends(an)))
    assert sec is not None
    xaxis = sec.figures[0]["layout"]["xaxis"]
    assert xaxis["range"] == ["2025-01-04 14:30:00", "2025-01-05 14:30:00"]


def test_aged_runs_draw_on_the_cumulative_ops_axis() -> None:
    an = []
    for i, ops in enumerate([0, 500, 1000, 0, 500, 1000]):
        a = _analysis("aged", i + 1, 1, [(1, 1, 1)])
        a["taken_at"] = f"2025-01-01T02:30:{i:02d}+00:00"
        a["op_count"] = ops
        an.append(a)
    sec = score_over_time(ReportData(analyses=an, trends=trends(an)))
    assert sec is not None
    (trace,) = sec.figures[0]["data"]
    assert trace["x"] == [0, 500, 1000, 1000, 1500, 2000]


def _model_rows(rate: float) -> list[dict[str, Any]]:
    return [
        {"min_blocks": lo, "max_blocks": hi, "inode_mb_per_s": rate * hi,
         "path_mb_per_s": rate * hi / 2, "inode_files": 1, "path_files": 1}
        for lo, hi in ((2, 2), (3, 4), (5, 8))
    ]  # fmt: skip


def test_modeled_throughput_has_a_colour_per_file_system_and_model() -> None:
    an = []
    for i, fs in enumerate(("a", "b")):
        a = _analysis(fs, i + 1, 1, [])
        a["disk_model"] = {
            "models": {m: {"description": m, "by_size": _model_rows(r)}
                       for m, r in (("hdd", 1.0), ("ssd", 50.0), ("dsp3105", 0.1))},
            "dynamic_reads": {},
        }  # fmt: skip
        an.append(a)
    sec = disk_model(ReportData(analyses=an, trends={}))
    assert sec is not None
    traces = sec.figures[0]["data"]
    assert len(traces) == 12
    by_colour: dict[str, set[str]] = {}
    for t in traces:
        fs_model = t["name"].rsplit(",", 1)[0]  # "a: hdd"
        by_colour.setdefault(t["line"]["color"], set()).add(fs_model)
    assert len(by_colour) == 6 and all(len(v) == 1 for v in by_colour.values())
    dashes = {(t["line"]["color"], t["line"]["dash"]) for t in traces}
    assert len(dashes) == 12
    ax = sec.figures[0]["layout"]["yaxis"]
    assert [float(t.replace(",", "")) for t in ax["ticktext"]] == ax["tickvals"]
