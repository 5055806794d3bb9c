"""Report sections for LFS aging runs: segment utilization and write cost against utilization.

The provider ``extra["lfs"]`` (registered with ``register_extra``) reads two things from the
store: the aging runs on LFS images (table ``aging_runs``, with seed 001's write-cost metrics
and the segment utilization histogram at the end of each run) and, for the newest LFS snapshot
of each file system, the segment usage table the LFS reader keeps in ``facts.groups`` (live
blocks per segment). Both sections are left out when there is no LFS data.

- ``lfs-segments``: the segment utilization histogram of the newest LFS snapshot of each file
  system (or, with no LFS snapshot, of the newest LFS aging run).
- ``lfs-write-cost``: overall write cost (seed 001 EQ 4-6) against utilization, one point per
  aging run at its utilization, one curve per cleaning policy — seed 001 Figure 5-4. Like the
  thesis it counts the ops after the initial fill (``metrics["after_fill"]``) when the run
  recorded them.
"""

from __future__ import annotations

import html
from typing import Any

from fsage.ager.run import aging_runs
from fsage.analyzer.segments import segment_utilization
from fsage.db.store import Store
from fsage.reports.build import register_extra
from fsage.reports.html import ReportData, Section, Table, register_section

BINS = 10


def _esc(s: Any) -> str:
    return html.escape(str(s), quote=True)


def _fig(data: list[dict[str, Any]], title: str, xtitle: str, ytitle: str) -> dict[str, Any]:
    return {
        "data": data,
        "layout": {
            "title": {"text": _esc(title)},
            "xaxis": {"title": {"text": _esc(xtitle)}},
            "yaxis": {"title": {"text": _esc(ytitle)}},
            "margin": {"t": 50, "l": 60, "r": 20, "b": 60},
        },
    }


@register_extra("lfs")
def lfs_extra(store: Store, fs_name: str | None) -> dict[str, Any] | None:
    """``{"runs": [aging run JSON...], "snapshots": [{id, fs, taken_at, capacity,
    live, histogram, fraction}...]}`` or None when the store has no LFS data."""
    runs = [r.to_json() for r in aging_runs(store, fs_name, kind="lfs")]
    newest: dict[str, Any] = {}
    for row in store.snapshots(fs_name):
        if row.kind == "lfs":
            newest[row.fs_name] = row
    snaps = []
    for row in newest.values():
        usage = segment_utilization(store.load_layout(row.id).facts.to_json(), bins=BINS)
        if usage is None:
            continue
        snaps.append(
            {
                "id": row.id,
                "fs": row.fs_name,
                "taken_at": row.taken_at.isoformat(),
                **usage,
            }
        )
    if not runs and not snaps:
        return None
    return {"runs": runs, "snapshots": snaps}


def _bucket_labels(hist: list[dict[str, Any]]) -> list[str]:
    return [f"{h['low']:.0%}-{h['high']:.0%}" for h in hist]


@register_section("lfs-segments", order=62)
def lfs_segments(data: ReportData) -> Section | None:
    lfs = data.extra.get("lfs")
    if not lfs:
        return None
    sources: list[tuple[str, list[dict[str, Any]], float]] = []
    for s in lfs.get("snapshots", []):
        sources.append((f"{s['fs']} #{s['id']}", s["histogram"], s["fraction"]))
    if not sources:
        for r in reversed(lfs.get("runs", [])):
            util = r.get("utilization") or {}
            if util.get("histogram"):
                label = f"{r.get('fs') or r['target']} run {r['id']}"
                sources.append((label, util["histogram"], float(util.get("fraction", 0.0))))
                break
    if not sources:
        return None
    labels = _bucket_labels(sources[0][1])
    traces = [
        {
            "type": "bar",
            "name": _esc(name),
            "x": labels,
            "y": [h["segments"] for h in hist],
        }
        for name, hist, _ in sources
    ]
    fig = _fig(traces, "Segment utilization", "live fraction of the segment", "segments")
    rows = [[lab, *(hist[i]["segments"] for _, hist, _ in sources)] for i, lab in enumerate(labels)]
    notes = [
        f"{name}: {frac:.1%} of the log's data blocks live, "
        f"{sum(h['segments'] for h in hist)} log segments"
        for name, hist, frac in sources
    ]
    return Section(
        "LFS segment utilization",
        figures=[fig],
        tables=[Table(["utilization", *(n for n, _, _ in sources)], rows)],
        notes=notes,
    )


METRIC_COLUMNS = (
    ("write_cost", "write cost (EQ 1)"),
    ("cleaner_overhead", "cleaner overhead (EQ 2)"),
    ("transfer_inefficiency", "transfer inefficiency (EQ 3)"),
    ("overall_write_cost", "overall write cost (EQ 4-6)"),
)


def _where(run: dict[str, Any]) -> str:
    return str(run.get("fs") or run["target"])


@register_section("lfs-write-cost", order=63)
def lfs_write_cost(data: ReportData) -> Section | None:
    lfs = data.extra.get("lfs")
    if not lfs:
        return None
    points: dict[str, list[tuple[float, float, dict[str, Any]]]] = {}
    for r in lfs.get("runs", []):
        m, u = r.get("metrics") or {}, r.get("utilization") or {}
        # Seed 001 counts the updates after the initial fill: use that part when recorded.
        pm = m.get("after_fill") or m
        if "overall_write_cost" not in pm or "fraction" not in u:
            continue
        if not pm.get("segs_written_new_data"):
            continue  # nothing written: no write cost to show
        policy = str(m.get("policy", "?"))
        points.setdefault(policy, []).append((float(u["fraction"]), pm["overall_write_cost"], r))
    if not points:
        return None
    traces = []
    rows = []
    for policy in sorted(points):
        pts = sorted(points[policy], key=lambda p: (p[0], p[2]["id"]))
        traces.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "name": _esc(policy),
                "x": [p[0] for p in pts],
                "y": [p[1] for p in pts],
                "text": [
                    _esc(f"run {p[2]['id']} on {p[2].get('fs') or p[2]['target']}") for p in pts
                ],
            }
        )
        for frac, _, r in pts:
            m = r["metrics"]
            pm = m.get("after_fill") or m
            c = pm.get("counters") or {}
            rows.append(
                [
                    r["id"],
                    _where(r),
                    policy,
                    round(frac, 3),
                    "after fill" if "after_fill" in m else "whole run",
                    *(pm.get(k) for k, _ in METRIC_COLUMNS),
                    pm.get("segs_written_new_data"),
                    pm.get("segs_read_clean"),
                    pm.get("segs_written_clean"),
                    c.get("holeplug_blocks"),
                    m.get("overall_write_cost"),
                ]
            )
    fig = _fig(
        traces,
        "Overall write cost against utilization (seed 001 Figure 5-4)",
        "utilization (live fraction of the log)",
        "overall write cost",
    )
    fig["layout"]["xaxis"]["tickformat"] = ".0%"
    disk = next((p[2]["metrics"].get("disk") for pts in points.values() for p in pts), None) or {}
    notes = [
        "One point per aging run on an LFS image, at the utilization its log had at the end of "
        "the run; one curve per cleaning policy. Like seed 001, the metrics count the ops "
        "after the workload's fill phase when it had one (else the whole run; the last column "
        "is the whole run's). Write cost counts segments moved (EQ 1); "
        "overall write cost prices every request on the disk model "
        f"({1000 * float(disk.get('access_s', 0.015)):g} ms access, "
        f"{float(disk.get('bandwidth_bps', 5e6)) / 1e6:g} MB/s)."
    ]
    headers = [
        "run",
        "fs",
        "policy",
        "utilization",
        "ops counted",
        *(label for _, label in METRIC_COLUMNS),
        "segs new",
        "segs read by cleaner",
        "segs written by cleaner",
        "blocks hole-plugged",
        "overall write cost, whole run",
    ]
    return Section(
        "LFS write cost against utilization",
        figures=[fig],
        tables=[Table(headers, rows)],
        notes=notes,
    )
