"""Analyses read from a store: one snapshot, the latest of each file system, or a whole history
with its trends (seed 000 §4.3: layout score per snapshot, decline per month)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from fsage.analyzer.analysis import DEFAULT_MODELS, PARTS, analyze_layout
from fsage.db.store import SnapshotRow, Store
from fsage.errors import StoreError

DAYS_PER_MONTH = 365.25 / 12


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


def trends(analyses: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per file system: layout score series, least-squares decline per month, files created /
    changed / deleted per day between snapshots, free-space histogram over time."""
    by_fs: dict[str, list[dict[str, Any]]] = {}
    for a in analyses:
        by_fs.setdefault(str(a.get("fs")), []).append(a)
    out: dict[str, dict[str, Any]] = {}
    for fs, items in by_fs.items():
        items = sorted(items, key=lambda a: (a["taken_at"] or "", a["snapshot_id"] or 0))
        times = np.array([_days(a["taken_at"]) for a in items], np.float64)
        scores = [a["layout_score"] for a in items]
        series = [
            {
                "snapshot_id": a["snapshot_id"],
                "taken_at": a["taken_at"],
                "layout_score": a["layout_score"],
                "files": a["files"],
                "blocks_free": a["blocks_free"],
                "largest_free_extent": a.get("largest_free_extent"),
                "free_extents": a.get("free_extents"),
            }
            for a in items
        ]
        rates = []
        for prev, cur, t0, t1 in zip(items[:-1], items[1:], times[:-1], times[1:], strict=True):
            days = float(t1 - t0)
            rates.append(
                {
                    "snapshot_id": cur["snapshot_id"],
                    "days": days,
                    "created_per_day": cur.get("new_files", 0) / days if days > 0 else None,
                    "changed_per_day": cur.get("changed_files", 0) / days if days > 0 else None,
                    "deleted_per_day": cur.get("deleted_files", 0) / days if days > 0 else None,
                    "from_snapshot": prev["snapshot_id"],
                }
            )
        out[fs] = {
            "snapshots": series,
            "decline_per_month": decline_per_month(times, scores),
            "total_decline": (
                scores[0] - scores[-1]
                if len(scores) > 1 and scores[0] is not None and scores[-1] is not None
                else None
            ),
            "activity": rates,
        }
    return out


def decline_per_month(
    days: Sequence[float] | np.ndarray, scores: Sequence[float | None]
) -> float | None:
    """Least-squares slope of layout score against time, as a decline per month (positive when
    the score falls). None with fewer than two scored snapshots or no elapsed time."""
    pts = [(float(t), s) for t, s in zip(days, scores, strict=True) if s is not None]
    if len(pts) < 2:
        return None
    t = np.array([p[0] for p in pts])
    y = np.array([p[1] for p in pts], np.float64)
    if np.ptp(t) == 0:
        return None
    slope = float(np.polyfit(t, y, 1)[0])
    return -slope * DAYS_PER_MONTH


def _days(iso: str | None) -> float:
    if not iso:
        return 0.0
    from datetime import datetime

    return datetime.fromisoformat(iso).timestamp() / 86400.0
