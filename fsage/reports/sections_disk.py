"""The report's sections on the disk: free-space fragmentation, the disk map, fragments per
file, modeled read throughput, the file-size distribution and the score by directory."""

from __future__ import annotations

import datetime as dt
from typing import Any

import numpy as np

from fsage.analyzer.dynamic import reads_text
from fsage.analyzer.fit import SizeFit
from fsage.reports.html import ReportData, Section, Table, register_section
from fsage.reports.sections import (
    CLOCKS,
    COLORWAY,
    _clocks,
    _fig,
    _name,
    bytes_axis,
    count_axis,
    esc,
    free_bucket_label,
    free_share_bars,
    largest_dirs,
    log_axis,
    score_clock,
)
from fsage.text import human_bytes, size_range

# Viridis stretched at the low end, white for none: one bucket often holds most of the free
# space, and on a linear scale every other bucket would be the same dark colour as an empty one.
SHARE_SCALE = [
    [0.0, "#ffffff"], [1e-6, "#440154"], [0.02, "#3b528b"], [0.1, "#21918c"],
    [0.3, "#5ec962"], [1.0, "#fde725"],
]  # fmt: skip


def _largest_share(data: ReportData) -> float:
    """The largest share of the free space in one bucket, over every file system's
    snapshots: the top of the one colour scale the heatmaps share."""
    top = 0.0
    for t in data.trends.values():
        for s in t["snapshots"]:
            rows = s.get("free_extents") or []
            total = sum(b["blocks"] for b in rows)
            if total:
                top = max(top, max(b["blocks"] for b in rows) / total)
    return top or 1.0


def _byte_buckets(data: ReportData) -> list[int]:
    """The free-extent buckets in bytes, every one from the smallest to the largest with
    extents in any snapshot of any file system, empty ones too: a gap would put 1 MiB next to
    16 MiB as if they were neighbours, and with one axis for every file system the figures of
    file systems of other block sizes or free space line up."""
    seen = {
        b["min_blocks"] * int(s.get("block_size") or 4096)
        for t in data.trends.values()
        for s in t["snapshots"]
        for b in s.get("free_extents") or []
    }
    if not seen:
        return []
    return [1 << e for e in range(min(seen).bit_length() - 1, max(seen).bit_length())]


def heatmap_columns(
    snaps: list[dict[str, Any]], clock: str
) -> tuple[list[tuple[dict[str, Any], Any, str]], str, str]:
    """The columns of a free-space heatmap on the x the score plot draws the history on
    (``clock``): (snapshot, x, hover line) per column, the axis title and the axis type. A
    history with a snapshot lacking an operation count goes on the time axis, and its title
    says why. Snapshots at one x are one column, the later one's."""
    uncounted = [s["id"] for s in snaps if s.get("ops_done") is None]
    if clock == "ops" and not uncounted:
        key = "ops"
        xtitle = CLOCKS[key][0]
    else:
        key = "time"
        xtitle = CLOCKS[key][0]
        if clock == "ops":
            xtitle += (
                f", not operations as in the score plot: snapshot {uncounted[0]} has no "
                "operation count"
            )
    at = _clocks(snaps)
    columns: list[tuple[dict[str, Any], Any, str]] = []
    for s in snaps:
        x = at[s["id"]][key]
        where = f"snapshot {s['id']}, {str(s['taken_at'])[:19]} UTC"
        if s.get("ops_done") is not None:
            where += f", {s['ops_done']:,} ops done"
        if columns and columns[-1][1] == x:
            # the end of one aging run and the start of the next: one column, the later
            same = "count of operations" if key == "ops" else "time"
            where += f" (snapshot {columns[-1][0]['id']} has the same {same}: not drawn)"
            columns.pop()
        columns.append((s, x, where))
    return columns, xtitle, CLOCKS[key][1]


def _score_plot_span(data: ReportData, key: str) -> list[Any] | None:
    """The x range of every history on the score plot's ``key`` clock, padded a little as
    plotly pads the plot's own: each heatmap spans it too, so that its columns sit under the
    scores of the same snapshots whichever file system's they are."""
    xs = [
        x
        for t in data.trends.values()
        for x in (c[key] for c in _clocks(t["snapshots"]).values())
        if x is not None
    ]
    if len(set(map(str, xs))) < 2:
        return None
    if key != "time":
        lo, hi = float(min(xs)), float(max(xs))
        pad = (hi - lo) * 0.03
        return [lo - pad, hi + pad]
    times = [dt.datetime.fromisoformat(str(x)).replace(tzinfo=None) for x in xs]
    t0, t1 = min(times), max(times)
    margin = (t1 - t0) * 0.03
    return [str(t0 - margin), str(t1 + margin)]


@register_section("free-space", order=40)
def free_space(data: ReportData) -> Section | None:
    figs = []
    clock = score_clock(data)
    zmax = _largest_share(data)
    buckets = _byte_buckets(data)
    for fs, t in data.trends.items():
        snaps = [s for s in t["snapshots"] if s.get("free_extents") is not None]
        if not snaps:
            continue
        bs = int(snaps[-1].get("block_size") or 4096)
        # a bucket below this file system's block size has no extents (k 0) but keeps its place
        ks = [b // bs for b in buckets]
        labels = [free_bucket_label(b, bs) for b in buckets]
        if len(snaps) == 1:
            rows = {b["min_blocks"]: b for b in snaps[0]["free_extents"]}
            figs.append(
                _fig(
                    free_share_bars(rows, ks, labels, bs),
                    f"Free space by extent size — {fs}",
                    "free extent size (e2freefrag's buckets)",
                    "share",
                    xaxis={"type": "category"},
                    yaxis={"tickformat": ".0%", "rangemode": "tozero"},
                    barmode="group",
                )
            )
            continue
        columns, xtitle, xtype = heatmap_columns(snaps, clock)
        z = []
        hover = []
        for k, lbl in zip(ks, labels, strict=True):
            row = []
            hrow = []
            for s, _, where in columns:
                total = sum(b["blocks"] for b in s["free_extents"]) or 1
                blocks = next((b["blocks"] for b in s["free_extents"] if b["min_blocks"] == k), 0)
                row.append(blocks / total)
                hrow.append(
                    f"{where}<br>free extents of {lbl}: "
                    f"{human_bytes(blocks * bs)}, {blocks / total:.1%} of free space"
                )
            z.append(row)
            hover.append(hrow)
        span = _score_plot_span(data, "ops" if xtype == "linear" else "time")
        figs.append(
            _fig(
                [
                    {
                        "type": "heatmap",
                        "x": [x for _, x, _ in columns],
                        "y": labels,
                        "z": z,
                        "text": hover,
                        "hoverinfo": "text",
                        "colorscale": SHARE_SCALE,
                        "zmin": 0,
                        "zmax": zmax,
                        "colorbar": {
                            "title": {"text": "share of<br>free space"},
                            "tickformat": ".0%",
                        },
                    }
                ],
                f"Free space by extent size, per snapshot — {fs}",
                xtitle,
                "free extent size",
                xaxis={"type": xtype, "zeroline": False, **({"range": span} if span else {})},
                yaxis={"type": "category"},
            )
        )
    if not figs:
        return None
    return Section(
        "Free-space fragmentation",
        figures=figs,
        notes=[
            "Free extents bucketed as e2freefrag buckets them: [2^k, 2^(k+1)) blocks, shown in "
            "bytes; buckets without extents are drawn empty. The heatmaps of every file system "
            "share one colour scale (0 to the largest share of any bucket), so that colours "
            "compare across file systems; white is a size without free extents, and the scale "
            "is stretched at the low end so that a bucket with a few percent of the free space "
            "stands out from an empty one. A heatmap's x axis is the score plot's (operations "
            "done, or snapshot time), so that a column sits under its score; of snapshots at "
            "one count of operations (the end of one aging run and the start of the next) the "
            "later is drawn."
        ],
    )


@register_section("disk-map", order=45)
def disk_map(data: ReportData) -> Section | None:
    figs = []
    for a in data.latest():
        m = (a.get("free_space") or {}).get("map")
        if not m or not m["start"]:
            continue
        bs = int(a.get("block_size") or 4096)
        n = len(m["start"])
        cols = min(n, 64, max(8, int(np.ceil(np.sqrt(n * 4)))))  # no empty columns
        rows = -(-n // cols)
        z: list[list[float | None]] = [[None] * cols for _ in range(rows)]
        text: list[list[str]] = [[""] * cols for _ in range(rows)]
        unit = m["unit"]
        for i, (st, ln, fr) in enumerate(zip(m["start"], m["length"], m["free"], strict=True)):
            r, c = divmod(i, cols)
            used = 1.0 - fr / ln if ln else 0.0
            z[r][c] = used
            text[r][c] = (
                f"{unit} {i}: blocks {st:,}-{st + ln - 1:,}<br>{used:.1%} used, "
                f"{human_bytes(fr * bs)} free of {human_bytes(ln * bs)}"
            )
        figs.append(
            _fig(
                [
                    {
                        "type": "heatmap",
                        "z": z,
                        "text": text,
                        "hoverinfo": "text",
                        "zmin": 0,
                        "zmax": 1,
                        "colorscale": [[0, "#f7fbff"], [0.5, "#6baed6"], [1, "#08306b"]],
                        "colorbar": {"title": {"text": "used"}, "tickformat": ".0%"},
                        "xgap": 1,
                        "ygap": 1,
                    }
                ],
                f"Disk map — {a.get('fs')} snapshot {a['id']}: space used per {unit.split()[-1]}",
                f"{unit} (left to right, then next row; {cols} per row)",
                f"first {unit.split()[-1]} of the row",
                yaxis={
                    "autorange": "reversed",
                    "tickvals": list(range(rows)),
                    "ticktext": [str(r * cols) for r in range(rows)],
                    "ticks": "",
                },
                xaxis={"showticklabels": False, "ticks": ""},
                height=max(260, 120 + rows * 18),
            )
        )
    if not figs:
        return None
    return Section(
        "Disk map",
        figures=figs,
        notes=[
            "Each cell is a block group (ext), a segment (LFS) or an equal range of the disk; "
            "dark is full, light is free. Hover for the block range and free space."
        ],
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
                    "hovertemplate": "%{y:,} files with %{x} fragments<extra></extra>",
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
                "files (log scale)",
                xaxis={"type": "category"},
                yaxis={"type": "log", "tickformat": ",d", "dtick": 1},
                barmode="group",
            )
        ],
    )


# Legend entries a row below the plot holds at the narrowest the report is read (print);
# the figure grows by a row's height for each further row, so the plot keeps its height.
LEGEND_PER_ROW = 4
LEGEND_ROW_PX = 22


@register_section("disk-model", order=60)
def disk_model(data: ReportData) -> Section | None:
    traces = []
    dyn_notes = []
    sizes: list[float] = []
    rates: list[float] = []
    entries = 0
    # One colour and one legend entry per file system and disk model, which shows and hides
    # both its read orders; the order is the dash, named once in the legend's title. A legend
    # entry per trace ran to a scrolling column that hid the later file systems.
    for a in data.latest():
        dm = a.get("disk_model")
        if not dm:
            continue
        bs = int(a.get("block_size") or 4096)
        for mname, m in dm["models"].items():
            rows = m["by_size"]
            group = esc(f"{a.get('fs')}: {mname}")
            colour = COLORWAY[entries % len(COLORWAY)]
            shown = False
            for order, dash in (("inode", "solid"), ("path", "dash")):
                key = f"{order}_mb_per_s"
                if not rows or key not in rows[0]:
                    continue
                sizes += [r["max_blocks"] * bs for r in rows]
                rates += [r[key] for r in rows if r[key]]
                traces.append(
                    {
                        "type": "scatter",
                        "mode": "lines+markers",
                        "name": group,
                        "legendgroup": group,
                        "showlegend": not shown,
                        "line": {"dash": dash, "color": colour},
                        "x": [r["max_blocks"] * bs for r in rows],
                        "y": [r[key] for r in rows],
                        "text": [
                            esc(f"{a.get('fs')}: {mname} ({m['description']}), {order} order")
                            + "<br>files of "
                            + size_range(r["min_blocks"], r["max_blocks"], bs)
                            + ": "
                            + f"{r[f'{order}_files']:,} files, "
                            + ("-" if r[key] is None else f"{r[key]:.2f} MB/s")
                            for r in rows
                        ],
                        "hoverinfo": "text",
                    }
                )
                shown = True
            entries += shown
        dyn_notes.append(
            f"{a.get('fs')}: dynamic layout score of a modeled cold read (Conway et al., FAST'17) "
            + reads_text(dm.get("dynamic_reads", {}))
        )
        for tr in a.get("traces") or []:
            dyn_notes.append(
                f"{a.get('fs')}: traced read ({tr['command']}): dynamic layout score "
                + ("-" if tr["score"] is None else f"{tr['score']:.4f}")
            )
    if not traces:
        return None
    legend_rows = -(-entries // LEGEND_PER_ROW)
    return Section(
        "Modeled read throughput",
        figures=[
            _fig(
                traces,
                "Modeled throughput reading every file of a size class",
                "file size (largest in the size class)",
                "throughput (MB/s, log scale)",
                xaxis=bytes_axis(min(sizes), max(sizes)),
                yaxis=log_axis(min(rates, default=0.1), max(rates, default=1.0)),
                legend={
                    "title": {
                        "text": "solid: inode order, dashed: path order",
                        "side": "top",
                    },
                },
                height=460 + LEGEND_ROW_PX * max(legend_rows - 1, 0),
            )
        ],
        notes=[
            *dyn_notes,
            "One colour per file system and disk model; solid lines read files in inode "
            "order, dashed in path order. Service time = positioning (seek + rotation) + "
            "transfer; a request that starts where the previous ended pays transfer only. "
            "MB = 10^6 bytes.",
        ],
    )


def _every_bucket(hist: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A power-of-two histogram with its empty buckets between the first and the last put
    back (with 0 files): the axis then runs evenly, as a size axis must."""
    have = {r["min_bytes"]: r for r in hist}
    lo, hi = hist[0]["min_bytes"], hist[-1]["min_bytes"]
    out = []
    for e in range(lo.bit_length() - 1, hi.bit_length()):
        b = 1 << e
        out.append(have.get(b, {"min_bytes": b, "max_bytes": 2 * b - 1, "files": 0}))
    return out


@register_section("size-distribution", order=70)
def size_distribution(data: ReportData) -> Section | None:
    figs = []
    tables = []
    for a in data.latest():
        sd = a.get("size_distribution")
        if not sd or not sd["histogram"]:
            continue
        hist = _every_bucket(sd["histogram"])
        x = [f"{human_bytes(r['min_bytes'])}-{human_bytes(r['max_bytes'] + 1)}" for r in hist]
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
                        "tail threshold",
                        "tail share",
                        "Pareto alpha",
                    ],
                    [
                        [
                            a.get("fs"),
                            fit["files"],
                            fit["lognormal_mu"],
                            fit["lognormal_sigma"],
                            human_bytes(fit["tail_threshold"]),
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
                "file size (powers of two)",
                "files",
                xaxis={"type": "category", "tickangle": -45},
                legend={"y": -0.55},
                yaxis=count_axis(max(r["files"] for r in hist)),
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
            rows, left_out = largest_dirs(rows)
            tables.append(
                Table(
                    ["directory", "files", "data blocks", "layout score"],
                    [[r["path"], r["files"], r["blocks"], r["layout_score"]] for r in rows],
                    f"{a.get('fs')} snapshot {a['id']}: aggregate layout score of each "
                    f"directory subtree{left_out}",
                )
            )
    if not tables:
        return None
    return Section("Layout score by directory", tables=tables)
