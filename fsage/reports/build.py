"""Gather what the report draws from a store."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fsage.analyzer.history import analyze_many, select_snapshots, trends
from fsage.db.store import Store
from fsage.reports.html import ReportData

# The full-detail parts for the newest snapshot of each file system; older snapshots only need
# what the over-time figures use.
LATEST_PARTS = {"size", "free", "tools", "locality", "model", "dist", "dir"}
HISTORY_PARTS = {"size", "free"}

ExtraProvider = Callable[[Store, "str | None"], Any]
_EXTRA_PROVIDERS: dict[str, ExtraProvider] = {}


def register_extra(name: str) -> Callable[[ExtraProvider], ExtraProvider]:
    """Add a provider of ``ReportData.extra[name]``: called with the store and the file-system
    name the report is for (None: all); a None result leaves the key out. Components with
    tables of their own (aging runs, benchmarks) use this to feed their report sections."""

    def deco(fn: ExtraProvider) -> ExtraProvider:
        _EXTRA_PROVIDERS[name] = fn
        return fn

    return deco


def report_data_from_store(
    store: Store,
    fs_name: str | None = None,
    progress: Callable[[int], None] | None = None,
    compare: tuple[int, int] | None = None,
) -> ReportData:
    """What the report draws; ``compare`` adds two chosen snapshots side by side."""
    rows = select_snapshots(store, fs_name, history=True)
    latest_ids = {r.id for r in select_snapshots(store, fs_name)}
    older = [r for r in rows if r.id not in latest_ids]
    newest = [r for r in rows if r.id in latest_ids]
    analyses = analyze_many(store, older, HISTORY_PARTS, path_order=False, progress=progress)
    analyses += analyze_many(store, newest, LATEST_PARTS, dir_depth=1, progress=progress)
    analyses.sort(key=lambda a: a["id"])
    title = "fsage layout report" + (f": {fs_name}" if fs_name else "")
    extra: dict[str, Any] = {}
    for name, provide in _EXTRA_PROVIDERS.items():
        value = provide(store, fs_name)
        if value is not None:
            extra[name] = value
    if compare is not None:
        from fsage.analyzer.compare import compare_snapshots

        extra["compare"] = compare_snapshots(store, *compare)
    return ReportData(analyses=analyses, trends=trends(analyses), title=title, extra=extra)


from fsage.reports import sections_locality as _sections_locality  # noqa: E402, F401
