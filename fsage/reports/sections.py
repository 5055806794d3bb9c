"""The standard report sections: summary, layout score vs size and over time, free space,
fragments per file, modeled read throughput, file-size distribution."""

from __future__ import annotations

import datetime as dt
import html
from typing import Any

import numpy as np

from fsage.analyzer.freespace import MAX_BUCKET, free_extent_label
from fsage.analyzer.history import SEED000_TREND, change_text, cumulative, trend_line
from fsage.reports.html import ReportData, Section, Table, register_section
from fsage.text import human_bytes, size_range


def esc(s: Any) -> str:
    """Text placed inside plotly figures (plotly interprets some tags)."""
    return html.escape(str(s), quote=True)


COLORWAY = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf", "#393b79", "#ad494a", "#637939", "#8c6d31", "#843c39", "#7b4173",
    "#3182bd", "#e6550d", "#31a354", "#756bb1", "#636363", "#fd8d3c", "#74c476", "#9e9ac8",
]  # fmt: skip


def _fig(
    data: list[dict[str, Any]], title: str, xtitle: str, ytitle: str, **layout: Any
) -> dict[str, Any]:
    """A figure with the report's defaults: margins that grow to fit the tick labels, the
    legend below the x-axis title, 24 distinct colours, hover on the nearest point."""
    lay: dict[str, Any] = {
        "title": {"text": esc(title), "x": 0.02, "xanchor": "left"},
        "xaxis": {"title": {"text": esc(xtitle), "standoff": 8}, "automargin": True},
        "yaxis": {"title": {"text": esc(ytitle), "standoff": 8}, "automargin": True},
        "margin": {"t": 60, "l": 70, "r": 30, "b": 40},
        "legend": {
            "orientation": "h",
            "x": 0,
            "xanchor": "left",
            "y": -0.3,
            "yanchor": "top",
        },
        "colorway": COLORWAY,
        "hovermode": "closest",
        "height": 460,
        "modebar": {"orientation": "v"},
    }
    for k, v in layout.items():
        if isinstance(v, dict) and isinstance(lay.get(k), dict):
            lay[k].update(v)
        else:
            lay[k] = v
    return {"data": data, "layout": lay}


def bytes_axis(lo: float, hi: float) -> dict[str, Any]:
    """A log axis of bytes with ticks at powers of two labelled in KiB / MiB / GiB."""
    lo_e = max(int(np.floor(np.log2(max(lo, 1.0)))), 0)
    hi_e = int(np.ceil(np.log2(max(hi, 2.0))))
    step = max(1, (hi_e - lo_e + 7) // 8)
    vals = [float(2**e) for e in range(lo_e, hi_e + 1, step)]
    return {
        "type": "log",
        "tickvals": vals,
        "ticktext": [human_bytes(v) for v in vals],
    }


def log_axis(lo: float, hi: float) -> dict[str, Any]:
    """A log axis with ticks at 1, 2 and 5 of each decade, every one labelled with its value
    (plotly's own ticks label the minor ones by their first digit: '5, 2, 100, 5, 2')."""
    lo, hi = max(lo, 1e-12), max(hi, lo * 1.0001)
    first, last = int(np.floor(np.log10(lo))), int(np.ceil(np.log10(hi)))
    steps = (1, 2, 5) if last - first <= 4 else (1,)
    vals = [m * 10.0**e for e in range(first, last + 1) for m in steps]
    vals = [v for v in vals if lo / 1.5 <= v <= hi * 1.5]
    return {
        "type": "log",
        "range": [np.log10(lo) - 0.05, np.log10(hi) + 0.05],
        "tickvals": vals,
        "ticktext": [f"{v:,.10g}" for v in vals],
    }


def count_axis(top: float) -> dict[str, Any]:
    """A linear axis of counts: whole-number ticks only."""
    raw = max(top / 5.0, 1.0)
    mag = 10 ** int(np.floor(np.log10(raw)))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    return {"tickformat": ",d", "dtick": step, "rangemode": "tozero"}


def _ref_line(y: float) -> dict[str, Any]:
    return {
        "type": "line",
        "xref": "paper",
        "x0": 0,
        "x1": 1,
        "y0": y,
        "y1": y,
        "line": {"dash": "dot", "color": "#888", "width": 1},
    }


def _name(a: dict[str, Any]) -> str:
    return esc(f"{a.get('fs')} #{a['id']}")


@register_section("summary", order=10)
def summary(data: ReportData) -> Section:
    rows = []
    for a in data.latest():
        tr = data.trends.get(str(a.get("fs")), {})
        fs = a.get("free_space", {})
        tools = a.get("tools", {})
        dyn = a.get("disk_model", {}).get("dynamic_layout_score", {})
        rows.append(
            [
                a.get("fs"),
                a["id"],
                # as `fsage snapshots` lists it, to the second
                None if a.get("taken_at") is None else str(a["taken_at"])[:19].replace("T", " "),
                a.get("kind"),
                a["files"],
                a["layout_score"],
                change_text(tr.get("total_change")),
                change_text(tr.get("change_per_month")),
                dyn.get("path"),
                fs.get("blocks_free"),
                a.get("largest_free_extent"),
                fs.get("free_chunks"),
                None if tools.get("e4defrag_score") is None else f"{tools['e4defrag_score']:.2f}",
                tools.get("xfs_frag_factor"),
            ]
        )
    return Section(
        "Summary",
        tables=[
            Table(
                [
                    "file system",
                    "snapshot",
                    "taken at (UTC)",
                    "kind",
                    "files",
                    "layout score",
                    "total change (first to last scored snapshot)",
                    "change / month (7 days or more)",
                    "dynamic score (path order)",
                    "free blocks",
                    "largest free extent",
                    "free 1 MiB chunks",
                    "e4defrag score",
                    "xfs_db frag %",
                ],
                rows,
                "Latest snapshot of each file system. Layout score: block-weighted share of blocks "
                "that follow their predecessor (seed 000 §4.1).",
            )
        ],
        notes=[trend_note(fs, t) for fs, t in data.trends.items()],
    )


@register_section("score-by-size", order=20)
def score_by_size(data: ReportData) -> Section | None:
    traces = []
    values: list[float | None] = []
    sizes: list[float] = []
    for a in _first_and_last(data):
        rows = a.get("by_size") or []
        if not rows:
            continue
        bs = int(a.get("block_size") or 4096)
        values += [r["layout_score"] for r in rows]
        sizes += [r["max_blocks"] * bs for r in rows]
        traces.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "name": _name(a),
                "x": [r["max_blocks"] * bs for r in rows],
                "y": [r["layout_score"] for r in rows],
                "text": [
                    f"{_name(a)}<br>files of {size_range(r['min_blocks'], r['max_blocks'], bs)}"
                    f" of data<br>{r['files']:,} files, layout score "
                    + ("-" if r["layout_score"] is None else f"{r['layout_score']:.4f}")
                    for r in rows
                ],
                "hoverinfo": "text",
            }
        )
    if not traces:
        return None
    return Section(
        "Layout score by file size",
        figures=[
            _fig(
                traces,
                "Layout score vs file size (Seltzer et al., USENIX 1995, Figure 5)",
                "file size (largest in the size class)",
                "layout score",
                xaxis=bytes_axis(min(sizes), max(sizes)),
                yaxis=score_axis(values),
                shapes=[_ref_line(1.0)],
            )
        ],
        notes=[
            "Size classes are powers of two of a file's blocks of data, labelled in bytes "
            "('8 KiB-16 KiB': over 8 KiB, up to 16 KiB, as fsage analyze labels them); the x "
            "axis is in bytes so that file systems of different block sizes line up. The dotted "
            f"line is a perfect layout (1.0); the score axis spans at least {MIN_SCORE_SPAN}, so "
            "that a spread of a few thousandths does not look like a fall."
        ],
    )


def _first_and_last(data: ReportData) -> list[dict[str, Any]]:
    by_fs: dict[str, list[dict[str, Any]]] = {}
    for a in data.analyses:
        by_fs.setdefault(str(a.get("fs")), []).append(a)
    out = []
    for items in by_fs.values():
        items.sort(key=lambda a: (a.get("taken_at") or "", a["id"]))
        out.extend([items[0]] if len(items) == 1 else [items[0], items[-1]])
    return out


# A layout-score axis spans at least this much: zoomed closer, a spread of a few thousandths
# (one file more or less in a size class, a night's churn) fills the plot and reads as a fall.
MIN_SCORE_SPAN = 0.05


def _score_range(values: list[float | None]) -> list[float]:
    """A y range zoomed to the data (a fall from 1.000 to 0.991 must not look flat), padded,
    never above 1.005, and never narrower than ``MIN_SCORE_SPAN``."""
    vals = [v for v in values if v is not None]
    if not vals:
        return [0.0, 1.02]
    lo, hi = min(vals), max(vals)
    pad = max((hi - lo) * 0.15, 0.002)
    top = min(hi + pad, 1.0 + pad * 0.25)
    return [max(min(lo - pad, top - MIN_SCORE_SPAN), 0.0), top]


def score_axis(values: list[float | None]) -> dict[str, Any]:
    """The y axis of a layout score: zoomed to the data, with as many decimals as the ticks
    need to differ."""
    lo, hi = _score_range(values)
    step = (hi - lo) / 6
    digits = max(3, int(np.ceil(-np.log10(step))) if step > 0 else 3)
    return {"range": [lo, hi], "tickformat": f".{digits}f"}


def _clocks(snaps: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Per snapshot id, its x on each clock: the time, and the file system's cumulative
    operations and GiB written."""
    ops = cumulative([s.get("op_count") for s in snaps])
    written = cumulative([s.get("bytes_written") for s in snaps])
    return {
        s["id"]: {"time": s["taken_at"], "ops": o, "bytes": None if b is None else b / 2**30}
        for s, o, b in zip(snaps, ops, written, strict=True)
    }


CLOCKS = {
    "time": ("snapshot time (UTC)", "date"),
    "ops": ("operations done on the file system (every aging run and replay, in turn)", "linear"),
    "bytes": ("GiB written to the file system (every aging run and replay, in turn)", "linear"),
}


def _hover(s: dict[str, Any], fs: str, extra: str = "") -> str:
    ops = s.get("op_count")
    written = s.get("bytes_written")
    parts = [
        f"{esc(fs)} snapshot {s['id']}",
        f"taken {str(s['taken_at'])[:19]} UTC",
        "layout score " + ("-" if s["layout_score"] is None else f"{s['layout_score']:.4f}"),
    ]
    if ops is not None:
        parts.append(f"{ops:,} ops done")
    if written is not None:
        parts.append(f"{human_bytes(written)} written")
    if extra:
        parts.append(esc(extra))
    return "<br>".join(parts)


# Snapshots taken closer together than this (one snapshot, or file systems snapshot one after
# the other) are drawn on an axis of a day: plotly would tick seconds or microseconds, and two
# file systems read a second apart would look like a history.
SHORT_SPAN = dt.timedelta(hours=1)


def _one_instant(times: list[list[Any]], clock: str) -> dict[str, Any]:
    """A time axis whose snapshots were all taken within ``SHORT_SPAN`` spans a day around
    them, labelled by date and minute."""
    stamps = [dt.datetime.fromisoformat(str(t)) for ts in times for t in ts if t is not None]
    if clock != "time" or not stamps or max(stamps) - min(stamps) >= SHORT_SPAN:
        return {}
    day = dt.timedelta(hours=12)
    fmt = "%Y-%m-%d %H:%M:%S"
    return {"range": [(min(stamps) - day).strftime(fmt), (max(stamps) + day).strftime(fmt)],
            "tickformat": "%b %d %H:%M"}  # fmt: skip


# A directory table lists the subtrees holding the most data, not every one: a tree such as
# /usr/share/doc has hundreds of top-level directories, and the page would run for metres.
MAX_DIR_ROWS = 40


def largest_dirs(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str]:
    """The root and the ``MAX_DIR_ROWS`` subtrees of ``rows`` with the most data blocks (in
    their order), and a caption's note of what was left out ("" if nothing)."""
    if len(rows) <= MAX_DIR_ROWS + 1:
        return rows, ""
    keep = {id(r) for r in sorted(rows[1:], key=lambda r: -(r.get("blocks") or 0))[:MAX_DIR_ROWS]}
    shown = [r for i, r in enumerate(rows) if i == 0 or id(r) in keep]
    return shown, (
        f" (the {MAX_DIR_ROWS} of {len(rows) - 1} subtrees holding the most data; "
        "every one: fsage analyze --by dir)"
    )


def trend_note(fs: str, t: dict[str, Any]) -> str:
    return f"{fs}: {trend_line(t)}"


@register_section("score-over-time", order=30)
def score_over_time(data: ReportData) -> Section | None:
    traces: list[dict[str, Any]] = []
    xs: dict[str, list[list[Any]]] = {c: [] for c in CLOCKS}
    values: list[float | None] = []
    for fs, t in data.trends.items():
        snaps = t["snapshots"]
        at = _clocks(snaps)
        values += [s["layout_score"] for s in snaps]
        traces.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "name": esc(fs),
                "y": [s["layout_score"] for s in snaps],
                "text": [_hover(s, fs) for s in snaps],
                "hoverinfo": "text",
            }
        )
        for c in CLOCKS:
            xs[c].append([at[s["id"]][c] for s in snaps])
        rec = t.get("recreations") or []
        if rec:
            by_id = {s["id"]: s for s in snaps}
            values += [r["layout_score"] for r in rec]
            traces.append(
                {
                    "type": "scatter",
                    "mode": "markers",
                    "marker": {"symbol": "diamond-open", "size": 11},
                    "name": esc(f"{fs}: recreation (fsage replay)"),
                    "y": [r["layout_score"] for r in rec],
                    "text": [
                        _hover(
                            {**r, "taken_at": r["taken_at"]},
                            str(r.get("fs")),
                            f"recreates snapshot {r['recreation_of']} "
                            f"(score {r['original_layout_score']:.4f})"
                            if r["original_layout_score"] is not None
                            else f"recreates snapshot {r['recreation_of']}",
                        )
                        for r in rec
                    ],
                    "hoverinfo": "text",
                }
            )
            # drawn at the x of the snapshot it recreates
            for c in CLOCKS:
                xs[c].append(
                    [at[r["recreation_of"]][c] if r["recreation_of"] in by_id else None
                     for r in rec]
                )  # fmt: skip
    if not traces:
        return None
    ops_clock = any(t.get("clock") == "ops" for t in data.trends.values())
    default = "ops" if ops_clock else "time"
    for tr, x in zip(traces, xs[default], strict=True):
        tr["x"] = x
    layout: dict[str, Any] = {
        "yaxis": score_axis(values),
        "xaxis": {"type": CLOCKS[default][1], **_one_instant(xs["time"], default)},
        "shapes": [_ref_line(1.0)],
    }
    if ops_clock:
        layout["updatemenus"] = [
            {
                "type": "buttons",
                "direction": "right",
                "x": 1,
                "xanchor": "right",
                "y": 1.0,
                "yanchor": "bottom",
                "pad": {"b": 4},
                "showactive": True,
                "active": list(CLOCKS).index(default),
                "buttons": [
                    {
                        "label": label,
                        "method": "update",
                        "args": [
                            {"x": xs[c]},
                            {"xaxis.title.text": CLOCKS[c][0], "xaxis.type": CLOCKS[c][1]},
                        ],
                    }
                    for c, label in (("time", "time"), ("ops", "ops done"), ("bytes", "written"))
                ],
            }
        ]
    notes = [trend_note(fs, t) for fs, t in data.trends.items()]
    notes.append(
        "A change per month is given only for histories spanning 7 days or more, negative "
        f"when the score falls ({SEED000_TREND}). The dotted line is a perfect layout (1.0); "
        f"the score axis spans at least {MIN_SCORE_SPAN}, so that a night's wobble does not "
        "look like a fall."
    )
    if ops_clock:
        notes.append(
            "Operations and bytes count on from one aging run or replay of a file system to "
            "the next (each run counts its own from 0): the x axis is the file system's life."
        )
    return Section(
        "Layout score over time",
        figures=[
            _fig(
                traces,
                "Layout score per snapshot",
                CLOCKS[default][0],
                "layout score",
                **layout,
            )
        ],
        notes=notes,
    )


def _free_label(min_blocks: int, bs: int) -> str:
    """The label `analyze` gives the free-extent bucket that starts at ``min_blocks``."""
    last = min_blocks >= 1 << MAX_BUCKET
    return free_extent_label(min_blocks, None if last else 2 * min_blocks - 1, bs)


@register_section("compare", order=15)
def compare(data: ReportData) -> Section | None:
    cmp = data.extra.get("compare")
    if not cmp:
        return None
    a, b = cmp["a"], cmp["b"]

    def label(x: dict[str, Any]) -> str:
        return esc(f"{x['fs']} #{x['id']} ({str(x['taken_at'])[:10]})")

    score_traces = []
    free_traces = []
    values: list[float | None] = []
    for side in (a, b):
        bs = int(side.get("block_size") or 4096)
        rows = side.get("by_size") or []
        values += [r["layout_score"] for r in rows]
        score_traces.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "name": label(side),
                "x": [size_range(r["min_blocks"], r["max_blocks"], bs) for r in rows],
                "y": [r["layout_score"] for r in rows],
                "customdata": [r["files"] for r in rows],
                "hovertemplate": "files of %{x}: layout score %{y:.4f}, %{customdata:,} "
                "files<extra>" + label(side) + "</extra>",
            }
        )
        free = side.get("free_extents") or []
        free_traces.append(
            {
                "type": "bar",
                "name": label(side),
                "x": [_free_label(r["min_blocks"], bs) for r in free],
                "y": [r["blocks"] * bs / 2**20 for r in free],
                "hovertemplate": "free extents of %{x}: %{y:.1f} MiB<extra>"
                + label(side)
                + "</extra>",
            }
        )
    lo = _score_range(values)[0]
    f = cmp["files"]
    table = Table(
        ["", label(a), label(b)],
        [
            ["files", a["files"], b["files"]],
            ["layout score", a["layout_score"], b["layout_score"]],
            [
                "free space",
                human_bytes(a["blocks_free"] * (a["block_size"] or 0)),
                human_bytes(b["blocks_free"] * (b["block_size"] or 0)),
            ],
            ["largest free extent (blocks)", a["largest_free_extent"], b["largest_free_extent"]],
        ],
        "The two snapshots compared.",
    )
    moved = Table(
        ["files in both", "moved to other blocks", "blocks of moved files", "unchanged",
         f"only in #{a['id']}", f"only in #{b['id']}"],
        [[f["in_both"], f["moved"], f["moved_blocks"], f["unchanged"], f["only_in_a"],
          f["only_in_b"]]],
        "Regular files with the same inode and generation in both snapshots; moved: their "
        "extents differ.",
    )  # fmt: skip
    return Section(
        f"Snapshot #{a['id']} compared with #{b['id']}",
        figures=[
            _fig(
                score_traces,
                "Layout score by file size",
                "file size (largest in the size class)",
                "layout score",
                xaxis={"type": "category"},
                yaxis={"range": [lo, 1.0 + (1.0 - lo) * 0.05], "tickformat": ".3f"},
                shapes=[_ref_line(1.0)],
            ),
            _fig(
                free_traces,
                "Free space by extent size",
                "free extent size (e2freefrag's buckets)",
                "free space (MiB)",
                xaxis={"type": "category", "tickangle": -30},
                barmode="group",
                legend={"y": -0.45},
            ),
        ],
        tables=[table, moved],
    )
