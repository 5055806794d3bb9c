"""Figures a reader could misread, checked on their data: the throughput legend of several file
systems fits below the plot with an entry per file system and disk model, the free-space
heatmaps share the score plot's x, the operations axis has no zero line, and the histogram of
directory scans says of how many directories its shares are."""

from __future__ import annotations

from typing import Any

from fsage.analyzer.history import trends
from fsage.reports import ReportData
from fsage.reports.sections import CLOCKS, score_over_time
from fsage.reports.sections_disk import disk_model, free_space
from fsage.reports.sections_locality import locality_section


def _analysis(fs: str, sid: int, second: int, ops: int | None) -> dict[str, Any]:
    return {
        "id": sid, "fs": fs, "taken_at": f"2025-01-01T02:30:{second:02d}+00:00",
        "layout_score": 0.99, "files": 10, "block_size": 4096, "blocks_free": 100,
        "largest_free_extent": 64, "op_count": ops, "bytes_written": None,
        "free_extents": [{"min_blocks": 1, "count": 10, "blocks": 10 + sid},
                         {"min_blocks": 64, "count": 1, "blocks": 90}],
    }  # fmt: skip


def _model_rows() -> list[dict[str, Any]]:
    return [
        {"min_blocks": lo, "max_blocks": hi, "inode_mb_per_s": 2.0 * hi,
         "path_mb_per_s": 1.0 * hi, "inode_files": 1, "path_files": 1}
        for lo, hi in ((2, 2), (3, 4), (5, 8))
    ]  # fmt: skip


def test_throughput_legend_has_an_entry_per_file_system_and_model_below_the_plot() -> None:
    # the reviewer's report: four file systems, three disk models, two read orders each
    an = []
    for i, fs in enumerate(("a", "b", "c", "d")):
        a = _analysis(fs, i + 1, i, None)
        a["disk_model"] = {
            "models": {m: {"description": m, "by_size": _model_rows()}
                       for m in ("hdd", "ssd", "dsp3105")},
            "dynamic_reads": {},
        }  # fmt: skip
        an.append(a)
    sec = disk_model(ReportData(analyses=an, trends={}))
    assert sec is not None
    (fig,) = sec.figures
    traces, layout = fig["data"], fig["layout"]
    assert len(traces) == 24
    entries = [t for t in traces if t.get("showlegend", True)]
    assert len(entries) == 12  # one per file system and disk model
    assert {t["name"] for t in entries} == {
        f"{fs}: {m}" for fs in "abcd" for m in ("hdd", "ssd", "dsp3105")
    }
    # an entry's group is both read orders of one colour, told apart by the dash
    groups: dict[str, set[tuple[str, str]]] = {}
    for t in traces:
        groups.setdefault(t["legendgroup"], set()).add((t["line"]["color"], t["line"]["dash"]))
    assert len(groups) == 12
    assert all({dash for _, dash in g} == {"solid", "dash"} for g in groups.values())
    assert all(len({colour for colour, _ in g}) == 1 for g in groups.values())
    assert len({next(iter(g))[0] for g in groups.values()}) == 12
    assert "dashed: path order" in layout["legend"]["title"]["text"]
    # in rows below the plot, which keeps the figure's width
    legend = layout["legend"]
    assert legend["orientation"] == "h" and legend["y"] < 0
    assert layout["margin"]["r"] <= 30
    # every trace's hover names its file system, disk model and order
    assert all(t["text"][0].startswith(f"{t['name']} (") for t in traces)
    assert {t["text"][0].split(", ")[1].split("<br>")[0] for t in traces} == {
        "inode order",
        "path order",
    }


def _aged_and_plain() -> ReportData:
    # "aged": two aging runs of 1000 ops (the second counts from 0 again); "plain": snapshots
    # of a file system never aged, which have no operation count
    an = [_analysis("aged", i + 1, i, ops) for i, ops in enumerate([0, 500, 1000, 0, 500, 1000])]
    an += [_analysis("plain", 7, 10, None), _analysis("plain", 8, 20, None)]
    return ReportData(analyses=an, trends=trends(an))


def test_free_space_heatmaps_share_the_score_plots_x() -> None:
    data = _aged_and_plain()
    score = score_over_time(data)
    free = free_space(data)
    assert score is not None and free is not None
    (score_fig,) = score.figures
    score_x = {t["name"]: t["x"] for t in score_fig["data"]}
    assert score_x["aged"] == [0, 500, 1000, 1000, 1500, 2000]
    aged, plain = free.figures
    heat = aged["data"][0]
    # the end of the first run and the start of the second are one column, the later one's
    assert heat["x"] == [0, 500, 1000, 1500, 2000]
    assert len(heat["z"][0]) == 5 and heat["z"][0][2] == 14 / 104  # snapshot 4's, not 3's
    assert "snapshot 3 has the same count of operations" in heat["text"][0][2]
    assert aged["layout"]["xaxis"]["type"] == "linear"
    title = aged["layout"]["xaxis"]["title"]["text"]
    assert title == score_fig["layout"]["xaxis"]["title"]["text"] == CLOCKS["ops"][0]
    # a history without operation counts is on the time axis, and its title says why
    assert plain["data"][0]["x"] == [a["taken_at"] for a in data.analyses[6:]]
    assert plain["layout"]["xaxis"]["type"] == "date"
    assert "not operations as in the score plot" in plain["layout"]["xaxis"]["title"]["text"]


def test_time_heatmap_is_on_the_score_plots_time_axis() -> None:
    an = [_analysis("plain", i + 1, 10 * i, None) for i in range(3)]
    data = ReportData(analyses=an, trends=trends(an))
    score, free = score_over_time(data), free_space(data)
    assert score is not None and free is not None
    (heatmap,) = free.figures
    assert heatmap["data"][0]["x"] == score.figures[0]["data"][0]["x"]
    assert heatmap["layout"]["xaxis"]["type"] == score.figures[0]["layout"]["xaxis"]["type"]
    assert heatmap["layout"]["xaxis"]["title"]["text"] == CLOCKS["time"][0]


def test_the_operations_axis_has_no_zero_line() -> None:
    data = _aged_and_plain()
    score, free = score_over_time(data), free_space(data)
    assert score is not None and free is not None
    assert score.figures[0]["layout"]["xaxis"]["zeroline"] is False
    assert free.figures[0]["layout"]["xaxis"]["zeroline"] is False


def test_directory_scan_shares_are_of_the_directories_with_a_scan() -> None:
    # 33 directories, 4 holding a regular file: the 4 are the 100%
    a = _analysis("home", 1, 0, None)
    a["directories"] = 33
    a["locality"] = {
        "neighbour_distance": {"pairs": 5, "adjacent_share": 1.0},
        "directory_scan": {"scans": 4, "aggregate": 0.95, "median": 0.95,
                           "histogram": [0, 0, 0, 0, 0, 0, 0, 0, 1, 3]},
    }  # fmt: skip
    sec = locality_section(ReportData(analyses=[a], trends={}))
    assert sec is not None
    hist = sec.figures[1]
    (bars,) = hist["data"]
    assert bars["y"][8:] == [0.25, 0.75]
    assert "4 of 33 directories have a scan" in bars["name"]
    assert hist["layout"]["yaxis"]["title"]["text"] == "share of the directories with a scan"
    assert bars["customdata"] == [0, 0, 0, 0, 0, 0, 0, 0, 1, 3]
    headers, (row,) = sec.tables[0].headers, sec.tables[0].rows
    assert row[headers.index("directories with a scan")] == "4 of 33"


def test_heatmaps_of_histories_of_different_lengths_span_the_score_plots_x() -> None:
    """A history of 500 operations beside one of 2000: both heatmaps span 0 to 2000, as the
    score plot does, so that a column lies under its snapshot's score."""
    an = [_analysis("long", i + 1, i, ops) for i, ops in enumerate([0, 1000, 2000])]
    an += [_analysis("short", i + 4, i, ops) for i, ops in enumerate([0, 250, 500])]
    data = ReportData(analyses=an, trends=trends(an))
    free = free_space(data)
    assert free is not None
    ranges = [f["layout"]["xaxis"]["range"] for f in free.figures]
    assert len(ranges) == 2 and ranges[0] == ranges[1]
    lo, hi = ranges[0]
    assert lo < 0 and 2000 < hi < 2200
    times = [_analysis("t1", i + 1, 10 * i, None) for i in range(3)]
    times += [_analysis("t2", i + 4, 50 + i, None) for i in range(2)]
    free = free_space(ReportData(analyses=times, trends=trends(times)))
    assert free is not None
    (a_lo, a_hi), (b_lo, b_hi) = (f["layout"]["xaxis"]["range"] for f in free.figures)
    assert (a_lo, a_hi) == (
        b_lo,
        b_hi,
    ) and a_lo < "2025-01-01 02:30:00" < "2025-01-01 02:30:51" < a_hi
