"""The standard report sections: summary, layout score vs size and over time, free space,
fragments per file, modeled read throughput, file-size distribution."""

from __future__ import annotations

import html
from typing import Any

from fsage.analyzer.fit import SizeFit
from fsage.analyzer.history import trend_line
from fsage.reports.html import ReportData, Section, Table, register_section


def esc(s: Any) -> str:
    """Text placed inside plotly figures (plotly interprets some tags)."""
    return html.escape(str(s), quote=True)


def _fig(
    data: list[dict[str, Any]], title: str, xtitle: str, ytitle: str, **layout: Any
) -> dict[str, Any]:
    lay: dict[str, Any] = {
        "title": {"text": esc(title)},
        "xaxis": {"title": {"text": esc(xtitle)}},
        "yaxis": {"title": {"text": esc(ytitle)}},
        "margin": {"t": 50, "l": 60, "r": 20, "b": 60},
        "legend": {"orientation": "h"},
    }
    for k, v in layout.items():
        if isinstance(v, dict) and isinstance(lay.get(k), dict):
            lay[k].update(v)
        else:
            lay[k] = v
    return {"data": data, "layout": lay}


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
                a.get("taken_at"),
                a.get("kind"),
                a["files"],
                a["layout_score"],
                tr.get("total_change"),
                tr.get("decline_per_month"),
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
                    "taken at",
                    "kind",
                    "files",
                    "layout score",
                    "total change (first to last snapshot)",
                    "decline / month (spans of 7 days or more)",
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
    for a in _first_and_last(data):
        rows = a.get("by_size") or []
        if not rows:
            continue
        traces.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "name": _name(a),
                "x": [r["max_blocks"] for r in rows],
                "y": [r["layout_score"] for r in rows],
                "text": [
                    f"{r['min_blocks']}-{r['max_blocks']} blocks, {r['files']} files" for r in rows
                ],
            }
        )
    if not traces:
        return None
    return Section(
        "Layout score by file size",
        figures=[
            _fig(
                traces,
                "Layout score vs file size (seed 000 Figure 5)",
                "file size (blocks, bucket top)",
                "layout score",
                xaxis={"type": "log"},
                yaxis={"range": [0, 1.05]},
            )
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


def _score_range(values: list[float | None]) -> list[float]:
    """A y range zoomed to the data (a fall from 1.000 to 0.991 must not look flat), padded,
    never above 1.005."""
    vals = [v for v in values if v is not None]
    if not vals:
        return [0.0, 1.02]
    lo, hi = min(vals), max(vals)
    pad = max((hi - lo) * 0.15, 0.002)
    return [max(lo - pad, 0.0), min(hi + pad, 1.005)]


def _clock_x(s: dict[str, Any], clock: str) -> Any:
    if clock == "time":
        return s["taken_at"]
    if clock == "ops":
        return s.get("op_count")
    b = s.get("bytes_written")
    return None if b is None else b / 2**30


CLOCKS = {
    "time": ("snapshot time (UTC)", "date"),
    "ops": ("operations done by the aging run or replay", "linear"),
    "bytes": ("GiB written by the aging run or replay", "linear"),
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


def human_bytes(n: float | int | None) -> str:
    """Bytes in binary units (KiB, MiB, GiB, TiB), as a person reads them."""
    if n is None:
        return "-"
    v = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(v) < 1024 or unit == "TiB":
            return f"{v:.0f} {unit}" if unit == "B" else f"{v:.1f} {unit}"
        v /= 1024
    return f"{v:.1f} TiB"


def trend_note(fs: str, t: dict[str, Any]) -> str:
    return f"{fs}: {trend_line(t)}"


@register_section("score-over-time", order=30)
def score_over_time(data: ReportData) -> Section | None:
    traces: list[dict[str, Any]] = []
    xs: dict[str, list[list[Any]]] = {c: [] for c in CLOCKS}
    values: list[float | None] = []
    for fs, t in data.trends.items():
        snaps = t["snapshots"]
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
            xs[c].append([_clock_x(s, c) for s in snaps])
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
                    [
                        _clock_x(by_id[r["recreation_of"]], c)
                        if r["recreation_of"] in by_id
                        else None
                        for r in rec
                    ]
                )
    if not traces:
        return None
    ops_clock = any(t.get("clock") == "ops" for t in data.trends.values())
    default = "ops" if ops_clock else "time"
    for tr, x in zip(traces, xs[default], strict=True):
        tr["x"] = x
    layout: dict[str, Any] = {
        "yaxis": {"range": _score_range(values), "tickformat": ".3f"},
        "xaxis": {"type": CLOCKS[default][1]},
        "shapes": [
            {
                "type": "line",
                "xref": "paper",
                "x0": 0,
                "x1": 1,
                "y0": 1,
                "y1": 1,
                "line": {"dash": "dot", "color": "#888", "width": 1},
            }
        ],
    }
    if ops_clock:
        layout["updatemenus"] = [
            {
                "type": "buttons",
                "direction": "right",
                "x": 1,
                "xanchor": "right",
                "y": 1.12,
                "yanchor": "bottom",
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
        "A rate per month is given only for histories spanning 7 days or more. Seltzer et al., "
        "'File System Logging versus Clustering: A Performance Comparison', USENIX 1995 "
        "(seed 000), section 4.3, saw layout scores fall by 0.016 per month in the worst case "
        "and 0.00725 on average. The dotted line is a perfect layout (1.0)."
    )
    return Section(
        "Layout score over time",
        figures=[
            _fig(
                traces,
                "Layout score per snapshot",
                CLOCKS[default][0],
                "layout score (1 = every block follows its predecessor)",
                **layout,
            )
        ],
        notes=notes,
    )


@register_section("free-space", order=40)
def free_space(data: ReportData) -> Section | None:
    figs = []
    for fs, t in data.trends.items():
        snaps = [s for s in t["snapshots"] if s.get("free_extents") is not None]
        if not snaps:
            continue
        ks = sorted({(b["min_blocks"], b["label"]) for s in snaps for b in s["free_extents"]})
        labels = [esc(lbl) for _, lbl in ks]
        if len(snaps) == 1:
            cnt = {b["min_blocks"]: b["blocks"] for b in snaps[0]["free_extents"]}
            figs.append(
                _fig(
                    [
                        {
                            "type": "bar",
                            "name": esc(fs),
                            "x": labels,
                            "y": [cnt.get(k, 0) for k, _ in ks],
                        }
                    ],
                    f"Free space by extent size — {fs}",
                    "free extent size (e2freefrag buckets)",
                    "free blocks",
                )
            )
            continue
        z = []
        for k, _ in ks:
            row = []
            for s in snaps:
                total = sum(b["blocks"] for b in s["free_extents"]) or 1
                row.append(
                    next((b["blocks"] for b in s["free_extents"] if b["min_blocks"] == k), 0)
                    / total
                )
            z.append(row)
        figs.append(
            _fig(
                [
                    {
                        "type": "heatmap",
                        "x": [s["taken_at"] for s in snaps],
                        "y": labels,
                        "z": z,
                        "colorscale": "Viridis",
                        "colorbar": {"title": {"text": "share of free"}},
                    }
                ],
                f"Free-space histogram over time — {fs}",
                "snapshot time",
                "free extent size (e2freefrag buckets)",
            )
        )
    if not figs:
        return None
    return Section(
        "Free-space fragmentation",
        figures=figs,
        notes=["Buckets as e2freefrag prints them: [2^k, 2^(k+1)) blocks."],
    )


@register_section("fragments", order=50)
def fragments(data: ReportData) -> Section | None:
    traces = []
    for a in data.latest():
        rows = a.get("fragments_per_file") or []
        if rows:
            traces.append(
                {
                    "type": "bar",
                    "name": _name(a),
                    "x": [
                        str(r["min_fragments"])
                        if r["min_fragments"] == r["max_fragments"]
                        else f"{r['min_fragments']}-{r['max_fragments']}"
                        for r in rows
                    ],
                    "y": [r["files"] for r in rows],
                }
            )
    if not traces:
        return None
    return Section(
        "Fragments per file",
        figures=[
            _fig(
                traces,
                "Files by number of fragments",
                "fragments (runs after merging adjacent extents)",
                "files",
                yaxis={"type": "log"},
                barmode="group",
            )
        ],
    )


@register_section("disk-model", order=60)
def disk_model(data: ReportData) -> Section | None:
    traces = []
    dyn_notes = []
    for a in data.latest():
        dm = a.get("disk_model")
        if not dm:
            continue
        for mname, m in dm["models"].items():
            rows = m["by_size"]
            for order, dash in (("inode", "solid"), ("path", "dash")):
                key = f"{order}_mb_per_s"
                if not rows or key not in rows[0]:
                    continue
                traces.append(
                    {
                        "type": "scatter",
                        "mode": "lines+markers",
                        "name": esc(f"{a.get('fs')} {mname} {order} order"),
                        "line": {"dash": dash},
                        "x": [r["max_blocks"] for r in rows],
                        "y": [r[key] for r in rows],
                    }
                )
        dyn = dm.get("dynamic_layout_score", {})
        dyn_notes.append(
            f"{a.get('fs')}: dynamic layout score "
            + ", ".join(f"{k} order {'-' if v is None else f'{v:.3f}'}" for k, v in dyn.items())
        )
    if not traces:
        return None
    return Section(
        "Modeled read throughput",
        figures=[
            _fig(
                traces,
                "Modeled throughput reading every file of a size class",
                "file size (blocks, bucket top)",
                "MB/s",
                xaxis={"type": "log"},
                yaxis={"type": "log"},
            )
        ],
        notes=[
            *dyn_notes,
            "Service time = positioning (seek + rotation) + transfer; a request "
            "that starts where the previous ended pays transfer only.",
        ],
    )


@register_section("size-distribution", order=70)
def size_distribution(data: ReportData) -> Section | None:
    figs = []
    tables = []
    for a in data.latest():
        sd = a.get("size_distribution")
        if not sd or not sd["histogram"]:
            continue
        hist = sd["histogram"]
        x = [f"{r['min_bytes']}" for r in hist]
        traces: list[dict[str, Any]] = [
            {
                "type": "bar",
                "name": "files",
                "x": x,
                "y": [r["files"] for r in hist],
            }
        ]
        fit = sd.get("fit")
        if fit:
            sf = SizeFit(
                fit["files"],
                fit["lognormal_mu"],
                fit["lognormal_sigma"],
                fit["tail_threshold"],
                fit["tail_fraction"],
                fit["pareto_alpha"],
            )
            edges = [float(r["min_bytes"]) - 0.5 for r in hist] + [hist[-1]["max_bytes"] + 0.5]
            exp = sf.expected_counts(edges)
            traces.append(
                {
                    "type": "scatter",
                    "mode": "lines+markers",
                    "name": "lognormal body + Pareto tail",
                    "x": x,
                    "y": exp,
                }
            )
            tables.append(
                Table(
                    [
                        "file system",
                        "files",
                        "lognormal mu",
                        "lognormal sigma",
                        "tail threshold (B)",
                        "tail share",
                        "Pareto alpha",
                    ],
                    [
                        [
                            a.get("fs"),
                            fit["files"],
                            fit["lognormal_mu"],
                            fit["lognormal_sigma"],
                            fit["tail_threshold"],
                            fit["tail_fraction"],
                            fit["pareto_alpha"],
                        ]
                    ],
                )
            )
        figs.append(
            _fig(
                traces,
                f"File sizes — {a.get('fs')}",
                "size (bytes, log2 bucket start)",
                "files",
                xaxis={"type": "category"},
            )
        )
    if not figs:
        return None
    return Section("File-size distribution", figures=figs, tables=tables)


@register_section("by-directory", order=80)
def by_directory(data: ReportData) -> Section | None:
    tables = []
    for a in data.latest():
        rows = a.get("by_dir")
        if rows:
            tables.append(
                Table(
                    ["directory", "files", "data blocks", "layout score"],
                    [[r["path"], r["files"], r["blocks"], r["layout_score"]] for r in rows],
                    f"{a.get('fs')} snapshot {a['id']}: aggregate layout score of each "
                    "directory subtree",
                )
            )
    if not tables:
        return None
    return Section("Layout score by directory", tables=tables)
