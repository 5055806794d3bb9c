"""`fsage fleet report`: the fleet analysis drawn in one self-contained HTML file (plotly inlined,
rendered by ``fsage.reports.html`` like the snapshot report)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fsage.analyzer.freespace import free_extent_label
from fsage.fleet.query import MIN_SPAN_DAYS, fleet_tables
from fsage.private import write_private_text
from fsage.reports.html import ReportData, Section, Table, render
from fsage.reports.sections import _fig, esc
from fsage.text import size_range

MAX_TRACES = 12


def _label(r: dict[str, Any]) -> str:
    return f"{r['host']}/{r['fs']}"


def sections(t: dict[str, list[dict[str, Any]]]) -> list[Section]:
    fss, trend = t["filesystems"], t["trend"]
    out = []
    shown = [r for r in fss if r["change_per_month"] is not None][:MAX_TRACES] or fss[:MAX_TRACES]
    keys = {(r["host"], r["fs"]) for r in shown}
    traces = []
    for r in shown:
        pts = [p for p in trend if (p["host"], p["fs"]) == (r["host"], r["fs"])]
        traces.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "name": esc(_label(r)),
                "x": [p["taken_at"] for p in pts],
                "y": [p["layout_score"] for p in pts],
                "text": [f"snapshot {p['snapshot_id']}" for p in pts],
                "hovertemplate": "%{x}<br>layout score %{y:.4f}<br>%{text}<extra></extra>",
            }
        )
    notes = [
        f"The {len(shown)} file systems declining fastest (of {len(fss)}); change per month is "
        f"the least-squares slope, given for histories of {MIN_SPAN_DAYS} days or more."
    ]
    if len(keys) < len(fss):
        notes.append(f"{len(fss) - len(keys)} file systems are not drawn; see the table.")
    top = [
        [
            r["host"],
            r["fs"],
            r["snapshots"],
            r["span_days"],
            r["layout_score"],
            r["total_change"],
            r["change_per_month"],
            r["free_fraction"],
        ]
        for r in fss[:50]
    ]
    out.append(
        Section(
            "Layout score over time",
            figures=[
                _fig(
                    traces,
                    "Layout score, fastest-declining file systems",
                    "date",
                    "layout score",
                    legend={"orientation": "v", "x": 1.02, "y": 1},
                    margin={"r": 210},
                )
            ],
            tables=[
                Table(
                    [
                        "host",
                        "fs",
                        "snapshots",
                        "span (days)",
                        "layout score",
                        "total change",
                        "change per month",
                        "free fraction",
                    ],
                    top,
                    caption="File systems, fastest decline first (first 50)",
                )
            ],
            notes=notes,
            id="fleet-trend",
        )
    )
    rated = [r for r in fss if r["change_per_month"] is not None and r["layout_score"] is not None]
    out.append(
        Section(
            "Where each file system stands",
            figures=[
                _fig(
                    [
                        {
                            "type": "scatter",
                            "mode": "markers",
                            "x": [r["layout_score"] for r in rated],
                            "y": [r["change_per_month"] for r in rated],
                            "text": [esc(_label(r)) for r in rated],
                            "hovertemplate": "%{text}<br>layout score %{x:.4f}"
                            "<br>change per month %{y:.4f}<extra></extra>",
                            "name": "file system",
                        }
                    ],
                    "Latest layout score and change per month",
                    "latest layout score",
                    "change per month",
                    shapes=[
                        {
                            "type": "line",
                            "xref": "paper",
                            "x0": 0,
                            "x1": 1,
                            "y0": 0,
                            "y1": 0,
                            "line": {"dash": "dot", "color": "#888"},
                        }
                    ],
                )
            ]
            if rated
            else [],
            notes=[] if rated else [f"No history spans {MIN_SPAN_DAYS} days yet."],
            id="fleet-scatter",
        )
    )
    size = t["size"]
    labels = [size_range(r["min_blocks"], r["max_blocks"], r["block_size"]) for r in size]
    out.append(
        Section(
            "Layout score by file size across the fleet",
            figures=[
                _fig(
                    [
                        {
                            "type": "scatter",
                            "mode": "lines+markers",
                            "name": "fleet (weighted by bytes)",
                            "x": labels,
                            "y": [r["layout_score"] for r in size],
                        },
                        {
                            "type": "scatter",
                            "mode": "markers",
                            "name": "worst file system",
                            "x": labels,
                            "y": [r["worst_layout_score"] for r in size],
                        },
                    ],
                    "Layout score by size bucket, latest snapshots",
                    "file size (over the first, up to the second)",
                    "layout score",
                    xaxis={"type": "category"},
                    legend={"orientation": "h", "y": -0.3, "yanchor": "top"},
                    margin={"b": 120},
                )
            ],
            tables=[
                Table(
                    [
                        "file size",
                        "file systems",
                        "files",
                        "layout score",
                        "worst",
                        "mean change per month",
                    ],
                    [
                        [
                            lab,
                            r["filesystems"],
                            r["files"],
                            r["layout_score"],
                            r["worst_layout_score"],
                            r["mean_change_per_month"],
                        ]
                        for lab, r in zip(labels, size, strict=True)
                    ],
                )
            ],
            id="fleet-size",
        )
    )
    free = t["free"]
    flabels = [free_extent_label(r["min_blocks"], r["max_blocks"], r["block_size"]) for r in free]
    out.append(
        Section(
            "Free-space fragmentation across the fleet",
            figures=[
                _fig(
                    [
                        {
                            "type": "bar",
                            "x": flabels,
                            "name": "share of free space",
                            "y": [r["share_of_free_blocks"] for r in free],
                        }
                    ],
                    "Free space by free-extent size, latest snapshots",
                    "free extent size (e2freefrag's buckets)",
                    "share of free space",
                    xaxis={"type": "category"},
                    yaxis={"tickformat": ".0%"},
                )
            ],
            id="fleet-free",
        )
    )
    outl = t["outliers"]
    out.append(
        Section(
            "Outliers",
            tables=[
                Table(
                    ["host", "fs", "metric", "value", "fleet mean", "z"],
                    [
                        [r["host"], r["fs"], r["metric"], r["value"], r["fleet_mean"], r["z"]]
                        for r in outl
                    ],
                )
            ]
            if outl
            else [],
            notes=["File systems 2 or more standard deviations from the fleet's mean."]
            + ([] if outl else ["None."]),
            id="fleet-outliers",
        )
    )
    return out


def write_fleet_report(root: Path, output: Path) -> int:
    """Write the report atomically; returns the number of figures."""
    t = fleet_tables(root, ("filesystems", "trend", "size", "free", "outliers"))
    secs = sections(t)
    data = ReportData(
        analyses=[{"fs": _label(p), "snapshot_id": p["snapshot_id"]} for p in t["trend"]],
        trends={},
        title="fsage fleet report",
    )
    text = render(data, secs)
    tmp = output.with_name(output.name + ".tmp")
    write_private_text(tmp, text)
    tmp.replace(output)
    return sum(len(s.figures) for s in secs)
