"""The standard report sections: summary, layout score vs size and over time, free space,
fragments per file, modeled read throughput, file-size distribution."""

from __future__ import annotations

import datetime as dt
import html
from typing import Any

import numpy as np

from fsage.analyzer.analysis import bucket_fields
from fsage.analyzer.freespace import MAX_BUCKET, free_extent_label
from fsage.analyzer.history import SEED000_TREND, change_text, trend_line
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


def _bytes(blocks: int | None, block_size: int | None) -> str | None:
    """A count of blocks in bytes, as a reader compares file systems of any block size."""
    return None if blocks is None or not block_size else human_bytes(blocks * block_size)


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
                # bytes: the file systems' blocks may differ in size
                _bytes(fs.get("blocks_free"), a.get("block_size")),
                _bytes(a.get("largest_free_extent"), a.get("block_size")),
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
                    "free space",
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


def every_size_class(rows: list[dict[str, Any]], block_size: int) -> list[dict[str, Any]]:
    """An analysis's ``by_size`` rows with the size classes between them that hold no files
    put back (no files, no score): a line drawn through the rows alone would join 16 KiB to
    2 MiB as if the classes between had scores."""
    have = {int(r["max_blocks"]).bit_length() - 1: r for r in rows}
    if not have:
        return []
    return [
        have.get(k) or {**bucket_fields(k, block_size), "files": 0, "blocks": 0,
                        "layout_score": None}
        for k in range(min(have), max(have) + 1)
    ]  # fmt: skip


@register_section("score-by-size", order=20)
def score_by_size(data: ReportData) -> Section | None:
    traces = []
    values: list[float | None] = []
    sizes: list[float] = []
    for a in _first_and_last(data):
        bs = int(a.get("block_size") or 4096)
        rows = every_size_class(a.get("by_size") or [], bs)
        if not rows:
            continue
        values += [r["layout_score"] for r in rows]
        sizes += [r["max_blocks"] * bs for r in rows]
        traces.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "name": _name(a),
                "x": [r["max_blocks"] * bs for r in rows],
                "y": [r["layout_score"] for r in rows],
                # an empty class is a gap in the line, not a segment across it
                "connectgaps": False,
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
                yaxis=score_axis(values, perfect_line=True),
                shapes=[_ref_line(1.0)],
            )
        ],
        notes=[
            "Size classes are powers of two of a file's blocks of data, labelled in bytes "
            "('8 KiB-16 KiB': over 8 KiB, up to 16 KiB, as fsage analyze labels them); the x "
            "axis is in bytes so that file systems of different block sizes line up. The dotted "
            f"line is a perfect layout (1.0); the score axis spans at least {MIN_SCORE_SPAN}, so "
            "that a spread of a few thousandths does not look like a fall. A size class without "
            "files breaks the line."
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


def _score_range(values: list[float | None], perfect_line: bool = False) -> list[float]:
    """A y range zoomed to the data (a fall from 1.000 to 0.991 must not look flat), padded,
    never above 1.005 for data near 1, and never narrower than ``MIN_SCORE_SPAN``. With
    ``perfect_line`` it reaches over 1.0, where the figure draws the perfect layout."""
    vals = [v for v in values if v is not None]
    if not vals:
        return [0.0, 1.02]
    lo, hi = min(vals), max(vals)
    pad = max((hi - lo) * 0.15, 0.002)
    top = min(hi + pad, 1.0 + pad * 0.25)
    if perfect_line:
        # a flat history at 0.99 would stop the axis at 0.995: the line the notes describe
        # must be on the plot, a little below its top edge
        top = max(top, 1.0 + max(pad * 0.25, MIN_SCORE_SPAN * 0.04))
    return [max(min(lo - pad, top - MIN_SCORE_SPAN), 0.0), top]


def score_axis(values: list[float | None], perfect_line: bool = False) -> dict[str, Any]:
    """The axis of a layout score: zoomed to the data, with as many decimals as the ticks need
    to differ; with ``perfect_line``, 1.0 on it (the figure draws its dotted line there)."""
    lo, hi = _score_range(values, perfect_line)
    step = (hi - lo) / 6
    digits = max(3, int(np.ceil(-np.log10(step))) if step > 0 else 3)
    return {"range": [lo, hi], "tickformat": f".{digits}f"}


def _clocks(snaps: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Per snapshot id, its x on each clock: the time, and the file system's cumulative
    operations and GiB written."""
    return {
        s["id"]: {"time": s["taken_at"], "ops": s.get("ops_done"), "bytes": s.get("gib_written")}
        for s in snaps
    }


CLOCKS = {
    "time": ("snapshot time (UTC)", "date"),
    "ops": ("operations done on the file system (every aging run and replay, in turn)", "linear"),
    "bytes": ("GiB written to the file system (every aging run and replay, in turn)", "linear"),
}


def score_clock(data: ReportData) -> str:
    """The x quantity of the score-over-time plot (a key of ``CLOCKS``): the file system's
    operations when any history is an aged one, the snapshot time otherwise."""
    return "ops" if any(t.get("clock") == "ops" for t in data.trends.values()) else "time"


def _hover(s: dict[str, Any], fs: str, extra: str = "") -> str:
    """A snapshot's hover text. Its counts are the file system's (the x axis), with the run's
    own beside them where they differ; a recreation has only its replay's."""
    parts = [
        f"{esc(fs)} snapshot {s['id']}",
        f"taken {str(s['taken_at'])[:19]} UTC",
        "layout score " + ("-" if s["layout_score"] is None else f"{s['layout_score']:.4f}"),
    ]
    run_ops, run_bytes = s.get("op_count"), s.get("bytes_written")
    if "recreation_of" in s:
        if run_ops is not None:
            parts.append(f"{run_ops:,} ops replayed")
        if run_bytes is not None:
            parts.append(f"{human_bytes(run_bytes)} written by the replay")
    else:
        ops, gib = s.get("ops_done"), s.get("gib_written")
        if ops is not None:
            own = f" ({run_ops:,} in this run)" if run_ops is not None and run_ops != ops else ""
            parts.append(f"{ops:,} ops done{own}")
        if gib is not None:
            own_bytes = (
                f" ({human_bytes(run_bytes)} in this run)"
                if run_bytes is not None and run_bytes != round(gib * 2**30)
                else ""
            )
            parts.append(f"{human_bytes(gib * 2**30)} written{own_bytes}")
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
    default = score_clock(data)
    ops_clock = default == "ops"
    for tr, x in zip(traces, xs[default], strict=True):
        tr["x"] = x
    layout: dict[str, Any] = {
        "yaxis": score_axis(values, perfect_line=True),
        # 0 operations is where the record starts, not a value to read the others against
        "xaxis": {
            "type": CLOCKS[default][1],
            "zeroline": False,
            **_one_instant(xs["time"], default),
        },
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


def free_bucket_label(byte_lo: int, block_size: int) -> str:
    """The label of the free-extent bucket of extents from ``byte_lo`` bytes, on a file system
    of ``block_size``; a bucket below the block size (it holds no extents there, but keeps its
    place on an axis shared with file systems of smaller blocks) in bytes."""
    if byte_lo >= block_size:
        return _free_label(byte_lo // block_size, block_size)
    return free_extent_label(byte_lo, 2 * byte_lo - 1, 1)


def free_share_bars(
    rows: dict[int, dict[str, Any]],
    keys: list[int],
    labels: list[str],
    block_size: int,
    side: str | None = None,
    colour: str | None = None,
) -> list[dict[str, Any]]:
    """Two bars a free-extent bucket: its share of the free space and its share of the free
    extents (one large extent often holds nearly all the space, and its bar alone would leave
    the small buckets unseen). ``rows``: the buckets' rows by the values of ``keys`` (one a
    label, in axis order, empty buckets too); ``side``: a compared snapshot's name (its legend
    group and ``colour``, its extents' bars hatched)."""
    space = sum(r["blocks"] for r in rows.values()) or 1
    count = sum(r["count"] for r in rows.values()) or 1
    tips = [
        f"free extents of {lbl}: {rows[k]['count']:,} extents, "
        f"{human_bytes(rows[k]['blocks'] * block_size)}"
        if k in rows
        else f"free extents of {lbl}: none"
        for k, lbl in zip(keys, labels, strict=True)
    ]
    bars = []
    for what, key, total, pattern in (
        ("free space", "blocks", space, ""),
        ("free extents", "count", count, "/"),
    ):
        bar: dict[str, Any] = {
            "type": "bar",
            "name": f"{side}: share of the {what}" if side else f"share of the {what}",
            "x": labels,
            "y": [rows[k][key] / total if k in rows else 0 for k in keys],
            "text": tips,
            "textposition": "none",
            "hovertemplate": f"%{{text}}<br>%{{y:.1%}} of the {what}<extra>{side or ''}</extra>",
        }
        if side is not None:
            bar["legendgroup"] = side
            bar["marker"] = {"color": colour, "pattern": {"shape": pattern}}
        bars.append(bar)
    return bars
