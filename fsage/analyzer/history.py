"""Analyses read from a store: one snapshot, the latest of each file system, or a whole history
with its trends (seed 000 §4.3: layout score per snapshot and its change per month).

Every command and the report name a trend the same way, with the same sign: a *change* of the
layout score (negative when it falls), over the snapshots that have a score (TREND_RULE)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from fsage.analyzer.analysis import DEFAULT_MODELS, PARTS, analyze_layout
from fsage.db.store import SnapshotRow, Store
from fsage.errors import StoreError
from fsage.text import decimal

DAYS_PER_MONTH = 365.25 / 12

TREND_RULE = (
    "Trends (first and last layout score, total change, change per month) are taken, in "
    "analyze, fleet and the report alike, over the snapshots that have a layout score: a "
    "snapshot of an empty file system, or of one that holds only files under 2 blocks, has "
    "none and is left out. "
    "A change is negative when the score falls; a change per month (least-squares slope) needs "
    "two scored snapshots 7 days or more apart."
)

#: The yardstick the trends are read against, in the same signed wording.
SEED000_TREND = (
    "Seltzer et al., 'File System Logging versus Clustering', USENIX 1995, section 4.3: "
    "a change of -0.016 per month at worst, -0.00725 on average"
)


def select_snapshots(
    store: Store, fs_name: str | None = None, snapshot_id: int | None = None, history: bool = False
) -> list[SnapshotRow]:
    """The snapshots to analyze: one by id, every one of a file system (history), or the latest
    of each file system."""
    if snapshot_id is not None:
        row = store.snapshot(snapshot_id)
        if fs_name is not None and row.fs_name != fs_name:
            raise StoreError(f"snapshot {snapshot_id} belongs to {row.fs_name!r}, not {fs_name!r}")
        return [row]
    rows = store.snapshots(fs_name)
    if not rows:
        raise StoreError(f"no snapshots in {store.path}" + (f" for {fs_name!r}" if fs_name else ""))
    if history:
        return rows
    latest: dict[str, SnapshotRow] = {}
    for r in rows:
        latest[r.fs_name] = r
    return sorted(latest.values(), key=lambda r: r.id)


def analyze_snapshot(
    store: Store,
    row: SnapshotRow,
    parts: Iterable[str] = PARTS,
    models: Sequence[str] = DEFAULT_MODELS,
    dir_depth: int = 2,
    path_order: bool = True,
) -> dict[str, Any]:
    layout = store.load_layout(row.id)
    out = analyze_layout(
        layout,
        snapshot_id=row.id,
        taken_at=row.taken_at,
        parts=parts,
        models=models,
        dir_depth=dir_depth,
        path_order=path_order,
    )
    out["fs"] = row.fs_name
    out["label"] = row.label
    out["new_files"] = row.new_files
    out["changed_files"] = row.changed_files
    out["deleted_files"] = row.deleted_files
    out["op_count"] = row.op_count
    out["bytes_written"] = row.bytes_written
    out["recreation_of"] = row.recreation_of
    from fsage.trace import traces

    out["traces"] = [t.to_json() for t in traces(store, snapshot_id=row.id)]
    return out


def analyze_many(
    store: Store,
    rows: Sequence[SnapshotRow],
    parts: Iterable[str] = PARTS,
    models: Sequence[str] = DEFAULT_MODELS,
    dir_depth: int = 2,
    path_order: bool = True,
    progress: Callable[[int], None] | None = None,
) -> list[dict[str, Any]]:
    parts = set(parts)
    out = []
    for r in rows:
        out.append(analyze_snapshot(store, r, parts, models, dir_depth, path_order))
        if progress:
            progress(1)
    return out


MIN_RATE_DAYS = 7.0
"""A rate per month needs at least this much time between the first and last snapshot."""
MIN_ACTIVITY_DAYS = 1.0
"""Files created / deleted per day need snapshots at least a day apart."""
GIB = 1 << 30


def trends(analyses: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per file system: the layout score series, the total change from the first to the last
    scored snapshot, and rates where they mean something (see TREND_RULE).

    A change per month (least squares) needs scored snapshots spanning at least
    ``MIN_RATE_DAYS`` days; otherwise it is None and ``change_per_month_reason`` says why.
    Snapshots of an aging run or a replay carry their own clock (operations done, bytes
    written): the change per thousand operations and per GiB written is given where every
    snapshot has that clock.
    Files created / changed / deleted per day between two snapshots are given only when they
    are at least ``MIN_ACTIVITY_DAYS`` apart, and per thousand operations where ops are known.
    A recreation (``fsage replay``) is listed under ``recreations`` of the file system whose
    snapshot it recreates, beside that snapshot, instead of as a file system of its own.
    """
    by_id = {a["id"]: a for a in analyses}
    by_fs: dict[str, list[dict[str, Any]]] = {}
    recreations: list[dict[str, Any]] = []
    for a in analyses:
        orig = by_id.get(a.get("recreation_of"))
        if orig is not None:
            recreations.append(a)
        else:
            by_fs.setdefault(str(a.get("fs")), []).append(a)
    out: dict[str, dict[str, Any]] = {}
    for fs, items in by_fs.items():
        out[fs] = _fs_trend(items)
    for a in sorted(recreations, key=lambda a: a["id"] or 0):
        orig = by_id[a["recreation_of"]]
        out[str(orig.get("fs"))]["recreations"].append(
            {
                "id": a["id"],
                "fs": a.get("fs"),
                "recreation_of": orig["id"],
                "taken_at": a["taken_at"],
                "original_taken_at": orig["taken_at"],
                "original_layout_score": orig["layout_score"],
                "layout_score": a["layout_score"],
                "op_count": a.get("op_count"),
                "bytes_written": a.get("bytes_written"),
                "files": a["files"],
                "blocks_free": a["blocks_free"],
            }
        )
    return out


def cumulative(values: list[int | None]) -> list[int | None]:
    """A run's own count (operations done, bytes written) as the file system's: each aging
    run or replay counts from 0, so where a count falls below the one before, a new run began
    and the earlier runs' totals are added to it. Snapshots without a count keep None."""
    out: list[int | None] = []
    offset = 0
    last: int | None = None
    for v in values:
        if v is None:
            out.append(None)
            continue
        if last is not None and v < last:
            offset += last
        last = v
        out.append(offset + v)
    return out


def _fs_trend(items: list[dict[str, Any]]) -> dict[str, Any]:
    items = sorted(items, key=lambda a: (a["taken_at"] or "", a["id"] or 0))
    times = np.array([_days(a["taken_at"]) for a in items], np.float64)
    scores = [a["layout_score"] for a in items]
    ops = [a.get("op_count") for a in items]
    written = [a.get("bytes_written") for a in items]
    # An aging run's first snapshot is often taken before it starts (no clock): the rates per
    # operation use the snapshots that have one.
    has_ops = sum(o is not None for o in ops) > 1
    has_bytes = sum(b is not None for b in written) > 1
    # ops_done and gib_written count over the file system's life (the report's axis, analyze's
    # table); op_count and bytes_written are the run's own counts, as `fsage snapshots` gives them
    series = [
        {
            "id": a["id"],
            "taken_at": a["taken_at"],
            "layout_score": a["layout_score"],
            "files": a["files"],
            "block_size": a.get("block_size"),
            "blocks_free": a["blocks_free"],
            "largest_free_extent": a.get("largest_free_extent"),
            "free_extents": a.get("free_extents"),
            "ops_done": done,
            "gib_written": None if life_bytes is None else life_bytes / GIB,
            "op_count": a.get("op_count"),
            "bytes_written": a.get("bytes_written"),
        }
        for a, done, life_bytes in zip(items, cumulative(ops), cumulative(written), strict=True)
    ]
    activity = []
    for prev, cur, t0, t1 in zip(items[:-1], items[1:], times[:-1], times[1:], strict=True):
        days = float(t1 - t0)
        row: dict[str, Any] = {
            "id": cur["id"],
            "from_id": prev["id"],
            "days": days,
            "created": cur.get("new_files", 0),
            "changed": cur.get("changed_files", 0),
            "deleted": cur.get("deleted_files", 0),
        }
        per_day = days >= MIN_ACTIVITY_DAYS
        for k in ("created", "changed", "deleted"):
            row[f"{k}_per_day"] = row[k] / days if per_day else None
        row["per_day_reason"] = (
            None if per_day else f"snapshots {_span_text(days)} apart (less than a day)"
        )
        o0, o1 = prev.get("op_count"), cur.get("op_count")
        dops = o1 - o0 if o0 is not None and o1 is not None else 0
        for k in ("created", "changed", "deleted"):
            row[f"{k}_per_kop"] = row[k] * 1000.0 / dops if dops > 0 else None
        activity.append(row)
    scored = [i for i, s in enumerate(scores) if s is not None]
    span = float(times[scored[-1]] - times[scored[0]]) if len(scored) > 1 else 0.0
    first = scores[scored[0]] if scored else None
    last = scores[scored[-1]] if scored else None
    total = last - first if first is not None and last is not None and len(scored) > 1 else None
    rate: float | None = None
    if len(scored) < 2:
        reason: str | None = "one scored snapshot" if scored else "no scored snapshot"
    elif span < MIN_RATE_DAYS:
        reason = (
            f"scored snapshots span {_span_text(span)} (a rate per month needs "
            f"{MIN_RATE_DAYS:g} days)"
        )
    else:
        rate = change_per_month(times, scores)
        reason = None
    return {
        "snapshots": series,
        "scored_snapshots": len(scored),
        "first_scored_id": items[scored[0]]["id"] if scored else None,
        "last_scored_id": items[scored[-1]]["id"] if scored else None,
        "span_days": span,
        "first_layout_score": first,
        "last_layout_score": last,
        "total_change": total,
        "change_per_month": rate,
        "change_per_month_reason": reason,
        "clock": "ops" if has_ops else "time",
        # over the file system's life: each run counts from 0, the slope counts on
        "change_per_kop": _slope(cumulative(ops), scores, 1000.0) if has_ops else None,
        "change_per_gib_written": (
            _slope(cumulative(written), scores, float(GIB)) if has_bytes else None
        ),
        "activity": activity,
        "recreations": [],
    }


def _slope(x: Sequence[int | None], y: Sequence[float | None], unit: float) -> float | None:
    """Least-squares change of y per ``unit`` of x; None without two points or any spread."""
    pts = [(float(a), b) for a, b in zip(x, y, strict=True) if a is not None and b is not None]
    if len(pts) < 2:
        return None
    xs = np.array([p[0] for p in pts])
    if np.ptp(xs) == 0:
        return None
    return float(np.polyfit(xs, np.array([p[1] for p in pts]), 1)[0]) * unit


def _fmt_score(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def change_text(v: float | None) -> str:
    """A change of layout score with its sign and two significant digits at least (-0.00041,
    +0.000048, -0.0123): small monthly rates do not round to zero."""
    if v is None:
        return "-"
    digits = 4
    if v != 0:
        digits = min(8, max(4, 1 - int(np.floor(np.log10(abs(v))))))
    return decimal(v, digits, signed=True)


def trend_line(t: dict[str, Any]) -> str:
    """The trend of one file system in one sentence (also used by the report)."""
    parts = [
        f"layout score {_fmt_score(t['first_layout_score'])} -> "
        f"{_fmt_score(t['last_layout_score'])} (total change {change_text(t['total_change'])}) "
        f"over {_span_text(t['span_days'])}"
    ]
    d = t["change_per_month"]
    if d is not None:
        parts.append(f"change per month {change_text(d)}")
    else:
        parts.append(f"no change per month: {t['change_per_month_reason']}")
    if t.get("change_per_kop") is not None:
        parts.append(f"change per 1,000 operations {change_text(t['change_per_kop'])}")
    if t.get("change_per_gib_written") is not None:
        parts.append(f"per GiB written {change_text(t['change_per_gib_written'])}")
    return "; ".join(parts)


def _span_text(days: float) -> str:
    s = days * 86400.0
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    if days < 2:
        return f"{s / 3600:.1f} h"
    return f"{days:.1f} days"


def change_per_month(
    days: Sequence[float] | np.ndarray, scores: Sequence[float | None]
) -> float | None:
    """Least-squares slope of layout score against time, per month (negative when the score
    falls). None with fewer than two scored snapshots or no elapsed time."""
    pts = [(float(t), s) for t, s in zip(days, scores, strict=True) if s is not None]
    if len(pts) < 2:
        return None
    t = np.array([p[0] for p in pts])
    y = np.array([p[1] for p in pts], np.float64)
    if np.ptp(t) == 0:
        return None
    slope = float(np.polyfit(t, y, 1)[0])
    return slope * DAYS_PER_MONTH


def _days(iso: str | None) -> float:
    if not iso:
        return 0.0
    from datetime import datetime

    return datetime.fromisoformat(iso).timestamp() / 86400.0
