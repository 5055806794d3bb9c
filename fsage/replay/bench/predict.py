"""Predicted vs actual relative performance from layout scores (seed 002's table).

Seed 002 fits relative performance (a fraction of the performance on an empty file system)
against layout score by linear regression, then predicts each recreated file system's
performance from the layout score of its *old* files and sets it beside the performance actually
measured on the *benchmark* files:

    bench layout | old layout | diff | pred read | actual read | pred write | actual write

Here the points of the fit are the stored benchmark runs of one suite: x = the layout score of
the files a result measured (seed 002 uses the 64 KB files: ``file_size``), y = the result over
the baseline. The baseline is the best result among runs on an empty file system (no old files);
without such a run, the best result of all, and the output says so. The fit is
``numpy.polyfit(x, y, 1)``; it needs at least :data:`MIN_POINTS` runs with a layout score and two
different scores.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fsage.replay.bench.run import StoredResult, stored_results

MIN_POINTS = 3
DEFAULT_FILE_SIZE = 64 * 1024  # seed 002's table is for the benchmark's 64 KB files


@dataclass
class Fit:
    slope: float
    intercept: float
    r: float  # correlation coefficient of the points
    points: int

    def __call__(self, x: float) -> float:
        return self.intercept + self.slope * x

    def to_json(self) -> dict[str, Any]:
        return {
            "slope": self.slope,
            "intercept": self.intercept,
            "r": self.r,
            "points": self.points,
        }


def fit_line(x: list[float], y: list[float]) -> Fit | None:
    """Least-squares line through (x, y); None with fewer than MIN_POINTS points or one x."""
    if len(x) < MIN_POINTS or len(set(x)) < 2:
        return None
    xa, ya = np.asarray(x, float), np.asarray(y, float)
    slope, intercept = np.polyfit(xa, ya, 1)
    r = float(np.corrcoef(xa, ya)[0, 1]) if np.std(ya) > 0 else 0.0
    return Fit(float(slope), float(intercept), r, len(x))


@dataclass
class Row:
    run_id: int
    fs_name: str | None
    date: str
    bench_layout: float | None
    old_layout: float | None
    actual_read: float | None
    actual_write: float | None
    pred_read: float | None = None
    pred_write: float | None = None

    @property
    def diff(self) -> float | None:
        if self.bench_layout is None or self.old_layout is None:
            return None
        return self.bench_layout - self.old_layout

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "fs": self.fs_name,
            "date": self.date,
            "bench_layout": self.bench_layout,
            "old_layout": self.old_layout,
            "diff": self.diff,
            "pred_read": self.pred_read,
            "actual_read": self.actual_read,
            "pred_write": self.pred_write,
            "actual_write": self.actual_write,
        }


@dataclass
class Prediction:
    suite: str
    file_size: int | None
    rows: list[Row]
    read_fit: Fit | None
    write_fit: Fit | None
    baseline: dict[str, float | None]
    notes: list[str] = field(default_factory=list)

    HEADERS = (
        "run", "fs", "date", "bench layout", "old layout", "diff",
        "pred read", "actual read", "pred write", "actual write",
    )  # fmt: skip

    def table_rows(self) -> list[list[Any]]:
        return [
            [
                r.run_id,
                r.fs_name,
                r.date,
                r.bench_layout,
                r.old_layout,
                r.diff,
                r.pred_read,
                r.actual_read,
                r.pred_write,
                r.actual_write,
            ]
            for r in self.rows
        ]

    def to_json(self) -> dict[str, Any]:
        return {
            "suite": self.suite,
            "file_size": self.file_size,
            "baseline": self.baseline,
            "read_fit": None if self.read_fit is None else self.read_fit.to_json(),
            "write_fit": None if self.write_fit is None else self.write_fit.to_json(),
            "rows": [r.to_json() for r in self.rows],
            "notes": self.notes,
        }


def _pick_suite(results: list[StoredResult]) -> str | None:
    """The suite with the most runs that have read and write results."""
    counts: dict[str, set[int]] = {}
    for r in results:
        if r.metric in ("read", "write"):
            counts.setdefault(r.suite, set()).add(r.run_id)
    if not counts:
        return None
    order = ["seq", "create-read", "seq-fsync", "postmark"]

    def key(kv: tuple[str, set[int]]) -> tuple[int, int]:
        rank = order.index(kv[0]) if kv[0] in order else len(order)
        return len(kv[1]), -rank

    return max(counts.items(), key=key)[0]


def predict(
    store: Any,
    suite: str | None = None,
    file_size: int | None = DEFAULT_FILE_SIZE,
    fs_name: str | None = None,
) -> Prediction:
    """Seed 002's table over the stored runs of ``suite`` (default: the suite with the most
    runs that measured read and write)."""
    allres = stored_results(store, suite)
    if suite is None:
        suite = _pick_suite(allres) or "seq"
        allres = [r for r in allres if r.suite == suite]
    if fs_name is not None:
        allres = [r for r in allres if r.fs_name == fs_name]
    notes: list[str] = []
    sized = [r for r in allres if r.params.get("file_size") is not None]
    if sized and file_size is not None:
        have = {int(r.params["file_size"]) for r in sized}
        if file_size not in have:
            fallback = max(have)
            notes.append(f"no results for {file_size}-byte files; using {fallback}-byte files")
            file_size = fallback
        allres = [r for r in allres if r.params.get("file_size") == file_size]
    elif not sized:
        file_size = None
    by_run: dict[int, dict[str, StoredResult]] = {}
    for r in allres:
        if r.metric in ("read", "write"):
            by_run.setdefault(r.run_id, {})[r.metric] = r
    baseline: dict[str, float | None] = {}
    for metric in ("read", "write"):
        vals = [(m[metric], _old_files(m[metric])) for m in by_run.values() if metric in m]
        empty = [r.value for r, n in vals if n == 0]
        if empty:
            baseline[metric] = max(empty)
        elif vals:
            baseline[metric] = max(r.value for r, _ in vals)
            notes.append(
                f"no {metric} run on an empty file system: {metric} is relative to the best run"
            )
        else:
            baseline[metric] = None
    rows: list[Row] = []
    for run_id, m in sorted(by_run.items()):
        any_r = next(iter(m.values()))
        rows.append(
            Row(
                run_id=run_id,
                fs_name=any_r.fs_name,
                date=any_r.started_at[:10],
                bench_layout=any_r.layout_score_bench_files,
                old_layout=any_r.layout_score_old_files,
                actual_read=_rel(m.get("read"), baseline["read"] if baseline else None),
                actual_write=_rel(m.get("write"), baseline.get("write")),
            )
        )
    fits: dict[str, Fit | None] = {}
    for metric in ("read", "write"):
        pts = [
            (r.bench_layout, getattr(r, f"actual_{metric}"))
            for r in rows
            if r.bench_layout is not None and getattr(r, f"actual_{metric}") is not None
        ]
        fits[metric] = fit_line([p[0] for p in pts], [p[1] for p in pts])
        if fits[metric] is None:
            notes.append(
                f"too few runs to fit {metric} performance against layout score: "
                f"{len(pts)} with a layout score and a {metric} result, need {MIN_POINTS} "
                "with at least two different scores"
            )
    rf, wf = fits["read"], fits["write"]
    for row in rows:
        if row.old_layout is None:
            continue
        row.pred_read = rf(row.old_layout) if rf is not None else None
        row.pred_write = wf(row.old_layout) if wf is not None else None
    return Prediction(suite, file_size, rows, fits["read"], fits["write"], baseline, notes)


def _old_files(r: StoredResult) -> int | None:
    old = (r.layout or {}).get("old")
    return None if old is None else int(old.get("files", 0))


def _rel(r: StoredResult | None, base: float | None) -> float | None:
    if r is None or not base:
        return None
    return r.value / base
