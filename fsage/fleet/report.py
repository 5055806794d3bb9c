"""`fsage fleet report`: the fleet analysis drawn in one self-contained HTML file (plotly inlined,
rendered by ``fsage.reports.html`` like the snapshot report)."""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from fsage.analyzer.history import change_text
from fsage.fleet.query import (
    MIN_SPAN_DAYS,
    ONE_SCORED,
    SHORT_SPAN,
    Rows,
    by_size,
    filesystems,
    free_bucket_fields,
    free_histogram,
    opened,
    outliers,
    size_bucket_fields,
    trend_rows,
)
from fsage.reports.html import ReportData, Section, Table, render, write_html
from fsage.reports.sections import _fig, esc, score_axis

MAX_TRACES = 12


def _label(r: dict[str, Any]) -> str:
    return f"{r['host']}/{r['fs']}"


# The smallest loss of layout score the figure calls a decline: a tenth of a percent of the
# blocks, or twice the file system's own scatter around its trend line if that is more.
MIN_LOSS = 0.001
# The score axis of the trend figure spans at least this much, so that a wobble of a few
# millionths never fills the plot.
MIN_SPAN = 0.01


def _rate_axis(rates: list[float]) -> dict[str, Any]:
    """The change-per-month axis: around the data and 0, never narrower than a loss of
    ``MIN_LOSS`` a month either way (rates of a few millionths must not fill the plot)."""
    lo, hi = min([*rates, 0.0]), max([*rates, 0.0])
    pad = max((hi - lo) * 0.1, (2 * MIN_LOSS - (hi - lo)) / 2, 0.0)
    return {"range": [lo - pad, hi + pad], "zeroline": False}


def _scatter(pts: list[dict[str, Any]]) -> float:
    """The standard deviation of a history's layout scores around its least-squares line
    over time (0 for fewer than 3 points): what a loss must exceed to be measured."""
    ys = [p["layout_score"] for p in pts if p["layout_score"] is not None]
    if len(ys) < 3:
        return 0.0
    xs = np.array([dt.datetime.fromisoformat(p["taken_at"]).timestamp() for p in pts
                   if p["layout_score"] is not None])  # fmt: skip
    y = np.array(ys)
    if np.ptp(xs) == 0:
        return float(y.std())
    slope, icept = np.polyfit(xs - xs[0], y, 1)
    return float(np.std(y - (slope * (xs - xs[0]) + icept), ddof=2) if len(ys) > 3 else 0.0)


def _every_size(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The size buckets from the smallest to the largest with files, the empty ones too (no
    files, no score): a categorical axis must not put 1-2 MiB next to 4-8 MiB."""
    have = {r["bucket"]: r for r in rows}
    if not have:
        return []
    return [have.get(b) or {"bucket": b, **size_bucket_fields(b), "filesystems": 0, "files": 0,
                            "layout_score": None, "worst_layout_score": None,
                            "mean_change_per_month": None}
            for b in range(min(have), max(have) + 1)]  # fmt: skip


def _every_free(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """e2freefrag's buckets from the smallest to the largest free extent, the empty ones too
    (drawn as 0), so that the axis doubles at every step as e2freefrag's table does."""
    have = {r["min_bytes"]: r for r in rows}
    if not have:
        return []
    out, b = [], min(have)
    while b <= max(have):
        out.append(have.get(b) or {**free_bucket_fields(b, b), "filesystems": 0,
                                   "free_extents": 0, "free_bytes": 0,
                                   "share_of_free_space": 0.0})  # fmt: skip
        b *= 2
    return out


def _measured(r: dict[str, Any]) -> bool:
    """Whether a file system's history has a change to measure (two snapshots or more)."""
    return r["total_change"] is not None and (r["snapshots"] or 0) >= 2


Noise = dict[tuple[str, str], float]


def _declines(
    fss: list[dict[str, Any]], noise: Noise
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The file systems whose layout score fell by a measurable amount, biggest loss first;
    how many others were left out, by reason (``noise``: each measured one's scatter)."""
    shown: list[dict[str, Any]] = []
    left = {"one snapshot": 0, "rising": 0, "within noise": 0}
    for r in fss:
        key = (r["host"], r["fs"])
        change = r["total_change"]
        if not _measured(r):
            left["one snapshot"] += 1
            continue
        if abs(change) < max(MIN_LOSS, 2 * noise[key]):
            left["within noise"] += 1
        elif change > 0:
            left["rising"] += 1
        else:
            shown.append(r)
    shown.sort(key=lambda r: (r["total_change"], r["host"], r["fs"]))
    return shown, left


def _noise(fss: list[dict[str, Any]], trend: Rows) -> tuple[Noise, dict[str, int]]:
    """The scatter of every measured history (``_scatter``) and the snapshots of each file
    system, from the trend's rows in their order (by host and file system): one history
    is held at a time."""
    want = {(r["host"], r["fs"]) for r in fss if _measured(r)}
    noise: Noise = {}
    counts: dict[str, int] = {}
    key: tuple[str, str] | None = None
    pts: list[dict[str, Any]] = []
    for p in itertools.chain(trend, [None]):
        k = None if p is None else (p["host"], p["fs"])
        if k != key:
            if key in want:
                noise[key] = _scatter(pts)
            key, pts = k, []
        if p is not None:
            counts[_label(p)] = counts.get(_label(p), 0) + 1
            if k in want:
                pts.append(p)
    for k in want - noise.keys():  # no trend rows at all
        noise[k] = 0.0
    return noise, counts


def _when(p: dict[str, Any]) -> dt.datetime:
    return dt.datetime.fromisoformat(str(p["taken_at"]))


def _apart(histories: list[list[dict[str, Any]]]) -> bool:
    """Whether the histories lie in periods so far apart that one date axis would squeeze
    them (together they span more than twice the longest of them, and more than a week)."""
    spans = [(_when(h[0]), _when(h[-1])) for h in histories if h]
    if len(spans) < 2:
        return False
    longest = max(b - a for a, b in spans)
    together = max(b for _, b in spans) - min(a for a, _ in spans)
    return together > max(2 * longest, dt.timedelta(days=7))


def _trend_section(t: dict[str, list[dict[str, Any]]], noise: Noise | None = None) -> Section:
    fss = t["filesystems"]
    by_fs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for p in t["trend"]:
        by_fs.setdefault((p["host"], p["fs"]), []).append(p)
    if noise is None:
        noise = {(r["host"], r["fs"]): _scatter(by_fs.get((r["host"], r["fs"]), []))
                 for r in fss if _measured(r)}  # fmt: skip
    declining, left = _declines(fss, noise)
    shown = declining[:MAX_TRACES]
    drawn = [by_fs.get((r["host"], r["fs"]), []) for r in shown]
    relative = _apart(drawn)
    traces = []
    ys: list[float] = []
    for r, pts in zip(shown, drawn, strict=True):
        ys += [p["layout_score"] for p in pts if p["layout_score"] is not None]
        t0 = _when(pts[0]) if pts else None
        traces.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "name": esc(f"{_label(r)} ({r['total_change']:+.4f})"),
                "x": [
                    (_when(p) - t0).total_seconds() / 86400 if relative and t0 else p["taken_at"]
                    for p in pts
                ],
                "y": [p["layout_score"] for p in pts],
                "text": [f"snapshot {p['snapshot_id']}, {str(p['taken_at'])[:10]}" for p in pts],
                "hovertemplate": esc(_label(r))
                + "<br>layout score %{y:.4f}<br>%{text}<extra></extra>",
            }
        )
    plural = "" if len(shown) == 1 else "s"
    headline = (
        f"The {len(shown)} file system{plural} of {len(fss)} whose layout score fell the most "
        "from their first to their latest snapshot (the change is in the legend). "
        if shown
        else ""
    )
    notes = [
        f"{headline}A loss is drawn "
        f"when it is at least {MIN_LOSS} and twice the history's own scatter around its trend "
        f"line. Change per month (least-squares slope) is given for histories of "
        f"{MIN_SPAN_DAYS} days or more; shorter ones are ranked by their total change."
    ]
    if relative:
        notes.append("These histories lie in different periods, so each is drawn from its own "
                     "first snapshot (its dates are in the hover).")  # fmt: skip
    if len(declining) > len(shown):
        notes.append(f"{len(declining) - len(shown)} more declining file systems are in the "
                     "table only.")  # fmt: skip
    why = {
        "one snapshot": "have one snapshot (no change to measure)",
        "rising": "have a layout score that rose measurably",
        "within noise": f"changed by less than {MIN_LOSS} or less than twice their scatter",
    }
    out = [f"{n} {why[k]}" for k, n in left.items() if n]
    if out:
        notes.append("Not drawn: " + "; ".join(out) + ".")
    figures = []
    if traces:
        lo, hi = min(ys), max(ys)
        span = max(hi - lo, MIN_SPAN, 4 * max((noise.get((r["host"], r["fs"]), 0.0)
                                                 for r in shown), default=0.0))  # fmt: skip
        mid = (lo + hi) / 2
        top = min(mid + span * 0.55, 1.0 + span * 0.05)
        figures.append(
            _fig(
                traces,
                "Layout score, file systems with the biggest measured losses",
                "days since the file system's first snapshot" if relative else "date",
                "layout score",
                yaxis={"range": [top - span * 1.1, top], "tickformat": ".3f"},
                legend={"orientation": "v", "x": 1.02, "y": 1},
                margin={"r": 260},
            )
        )
    else:
        notes.append("No file system lost a measurable share of its layout score: nothing "
                     "to draw.")  # fmt: skip
    # changes with two significant digits, as analyze and the report give them: a loss of
    # 0.0003 must not read 0.000
    top50 = [
        [r["host"], r["fs"], r["snapshots"], r["span_days"], r["layout_score"],
         change_text(r["total_change"]), change_text(r["change_per_month"]), r["free_fraction"]]
        for r in fss[:50]
    ]  # fmt: skip
    return Section(
        "Layout score over time",
        figures=figures,
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
                top50,
                caption="File systems by change per month, fastest decline first; those "
                "whose history is too short for a rate follow, biggest total loss first (first "
                "50; the figure ranks by total loss)",
            )
        ],
        notes=notes,
        id="fleet-trend",
    )


def _scatter_notes(fss: list[dict[str, Any]], rated: list[dict[str, Any]]) -> list[str]:
    """What the scatter leaves out and why: a reader counting its dots must not take them
    for the whole fleet."""
    if not rated:
        return [f"No history spans {MIN_SPAN_DAYS} days yet."]
    why: dict[str, int] = {}
    for r in fss:
        if r["change_per_month"] is None:
            reason = r.get("no_rate_reason") or (
                ONE_SCORED if (r["snapshots"] or 0) < 2 else SHORT_SPAN
            )
        elif r["layout_score"] is None:
            reason = "no layout score (no file of two blocks or more)"
        else:
            continue
        why[reason] = why.get(reason, 0) + 1
    if not why:
        return []
    left = "; ".join(f"{n} ({reason})" for reason, n in why.items())
    return [f"{len(rated)} of {len(fss)} file systems drawn; not drawn: {left}."]


def sections(t: dict[str, list[dict[str, Any]]], noise: Noise | None = None) -> list[Section]:
    """The report's sections; ``t["trend"]`` holds every history, or (with ``noise``, the
    scatter of each: ``_noise``) those of the file systems the trend figure draws."""
    fss = t["filesystems"]
    out = [_trend_section(t, noise)]
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
                    xaxis=score_axis([r["layout_score"] for r in rated]),
                    yaxis=_rate_axis([r["change_per_month"] for r in rated]),
                )
            ]
            if rated
            else [],
            notes=_scatter_notes(fss, rated),
            id="fleet-scatter",
        )
    )
    size = _every_size(t["size"])
    labels = [r["label"] for r in size]
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
                    yaxis=score_axis(
                        [r["layout_score"] for r in size] + [r["worst_layout_score"] for r in size]
                    ),
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
                            change_text(r["mean_change_per_month"]),
                        ]
                        for lab, r in zip(labels, size, strict=True)
                        if r["files"]
                    ],
                )
            ],
            id="fleet-size",
        )
    )
    free = _every_free(t["free"])
    flabels = [r["label"] for r in free]
    extents = sum(r["free_extents"] for r in free) or 1
    out.append(
        Section(
            "Free-space fragmentation across the fleet",
            figures=[
                _fig(
                    [
                        {
                            "type": "bar",
                            "x": flabels,
                            "name": "share of the free space",
                            "y": [r["share_of_free_space"] for r in free],
                        },
                        {
                            "type": "bar",
                            "x": flabels,
                            "name": "share of the free extents",
                            "y": [r["free_extents"] / extents for r in free],
                        },
                    ],
                    "Free space by free-extent size, latest snapshot of each device",
                    "free extent size (e2freefrag's buckets)",
                    "share",
                    xaxis={"type": "category", "tickangle": -30},
                    yaxis={"tickformat": ".0%", "rangemode": "tozero"},
                    barmode="group",
                    legend={"y": -0.4},
                    margin={"b": 120},
                )
            ],
            notes=[
                "A device mounted as several file systems (/, /usr and /usr/share of one "
                "disk) holds one free space: it is counted once, through its newest snapshot. "
                "Large extents hold most of the free space, small ones are most of the "
                "extents: both shares are drawn."
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
                    ["host", "fs", "metric", "value", "fleet mean", "z", "direction"],
                    [
                        [
                            r["host"],
                            r["fs"],
                            r["metric"],
                            r["value"],
                            r["fleet_mean"],
                            r["z"],
                            r["direction"],
                        ]
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


def write_fleet_report(
    root: Path,
    output: Path,
    *,
    on_damage: str = "refuse",
    warn: Callable[[str], None] | None = None,
    advise: Callable[[str], None] | None = None,
) -> int:
    """Write the report atomically and private ('-': standard output); returns the number of
    figures."""
    skipped: list[str] = []

    def note(line: str) -> None:
        skipped.append(line)
        if warn is not None:
            warn(line)

    with opened(root, on_damage, note, advise=advise) as con:
        fss = filesystems(con)
        t = {"filesystems": fss, "size": by_size(con), "free": free_histogram(con),
             "outliers": outliers(con)}  # fmt: skip
        # the histories a chunk at a time, then those of the file systems drawn
        noise, counts = _noise(fss, trend_rows(con))
        drawn = [(r["host"], r["fs"]) for r in _declines(fss, noise)[0][:MAX_TRACES]]
        t["trend"] = list(trend_rows(con, drawn))
    secs = sections(t, noise)
    if skipped:
        secs.insert(0, Section("Damaged files left out", notes=skipped, id="fleet-damaged"))
    # the page counts snapshots and file systems: one shared entry per file system's snapshot
    per_fs = {label: {"fs": label} for label in counts}
    data = ReportData(
        analyses=[per_fs[label] for label, n in counts.items() for _ in range(n)],
        trends={},
        title="fsage fleet report",
    )
    write_html(output, render(data, secs))
    return sum(len(s.figures) for s in secs)
