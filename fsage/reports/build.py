"""Gather what the report draws from a store."""

from __future__ import annotations

from collections.abc import Callable

from fsage.analyzer.history import analyze_many, select_snapshots, trends
from fsage.db.store import Store
from fsage.reports.html import ReportData

# The full-detail parts for the newest snapshot of each file system; older snapshots only need
# what the over-time figures use.
LATEST_PARTS = {"size", "free", "tools", "locality", "model", "dist", "dir"}
HISTORY_PARTS = {"size", "free"}


def report_data_from_store(
    store: Store,
    fs_name: str | None = None,
    progress: Callable[[int], None] | None = None,
) -> ReportData:
    rows = select_snapshots(store, fs_name, history=True)
    latest_ids = {r.id for r in select_snapshots(store, fs_name)}
    older = [r for r in rows if r.id not in latest_ids]
    newest = [r for r in rows if r.id in latest_ids]
    analyses = analyze_many(store, older, HISTORY_PARTS, path_order=False, progress=progress)
    analyses += analyze_many(store, newest, LATEST_PARTS, dir_depth=1, progress=progress)
    analyses.sort(key=lambda a: a["snapshot_id"])
    title = "fsage layout report" + (f": {fs_name}" if fs_name else "")
    return ReportData(analyses=analyses, trends=trends(analyses), title=title)
