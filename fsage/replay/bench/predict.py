"""Predicted vs actual relative performance from layout scores (seed 002's table).

Seed 002 fits relative performance (a fraction of the performance on an empty file system)
against layout score by linear regression, then predicts each recreated file system's
performance from the layout score of its *old* files and sets it beside the performance actually
measured on the *benchmark* files:

    bench layout | old layout | diff | pred read | actual read | pred write | actual write

Here the points of the fit are the stored benchmark runs of one suite: x = the layout score of
the files a result measured (seed 002 uses the 64 KB files: ``file_size``), y = the result over
the baseline. A run made with its own baseline (an empty file system of the same mkfs
parameters, run in turn with it: ``fsage bench --baseline``) is relative to that one, the
median of its rounds' paired ratios, as bench printed it. Other runs are relative to the best
result among separate runs on an empty file system (no old files); without such a run, the
best result of all, and the output says so. The fit is
``numpy.polyfit(x, y, 1)``.

Only comparable runs are fitted: the same suite, the same parameters (data set, files per
directory, fsync, transactions...; the seed aside) and the same file size; where the stored
runs fall into several such groups, the largest is used and the others are named. A fit needs
at least :data:`MIN_POINTS` runs spanning layout scores :data:`MIN_RANGE` apart, else the output
says why there is none. Each prediction carries the 95 % confidence interval of the fitted
mean at its layout score (Student's t with n - 2 degrees of freedom), and no prediction is made
outside the layout scores the fit observed (the row says "outside"). The date of a row is that
of the snapshot the benchmarked file system recreates (or is), not the day the run was made.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fsage.errors import UsageError
from fsage.replay.bench.run import StoredResult, stored_results

MIN_POINTS = 5
MIN_RANGE = 0.1
#: Points any straight line needs (fit_line alone; predictions need MIN_POINTS).
_LINE_POINTS = 3
#: Two-sided 95 % quantiles of Student's t by degrees of freedom (beyond 30: the normal's).
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
        9: 2.262, 10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120,
        17: 2.110, 18: 2.101, 19: 2.093, 20: 2.086, 22: 2.074, 24: 2.064, 26: 2.056, 28: 2.048,
        30: 2.042}  # fmt: skip
#: Run parameters that do not make runs incomparable.
_IGNORED_PARAMS = frozenset({"seed", "file_sizes", "size", "repeat"})


def t95(df: int) -> float:
    if df <= 0:
        return float("inf")
    if df in _T95:
        return _T95[df]
    if df > 30:
        return 1.960 + 2.4 / df  # within 0.003 of the quantile above 30 degrees of freedom
    lower = max(k for k in _T95 if k < df)
    return _T95[lower]  # the next smaller tabulated df: a slightly wider interval


DEFAULT_FILE_SIZE = 64 * 1024  # seed 002's table is for the benchmark's 64 KB files


@dataclass
class Fit:
    slope: float
    intercept: float
    r: float  # correlation coefficient of the points
    points: int
    x_min: float = 0.0
    x_max: float = 1.0
    x_mean: float = 0.0
    sxx: float = 0.0  # sum of squared deviations of x
    residual_sd: float = 0.0  # standard error of the regression (n - 2 degrees of freedom)

    def __call__(self, x: float) -> float:
        return self.intercept + self.slope * x

    def ci(self, x: float) -> float:
        """Half-width of the 95 % confidence interval of the fitted mean at ``x``."""
        if self.points <= 2 or self.sxx <= 0:
            return float("inf")
        se = self.residual_sd * float(
            np.sqrt(1.0 / self.points + (x - self.x_mean) ** 2 / self.sxx)
        )
        return t95(self.points - 2) * se

    def covers(self, x: float) -> bool:
        return self.x_min - 1e-12 <= x <= self.x_max + 1e-12

    def to_json(self) -> dict[str, Any]:
        return {
            "slope": self.slope,
            "intercept": self.intercept,
            "r": self.r,
            "points": self.points,
            "x_min": self.x_min,
            "x_max": self.x_max,
            "residual_sd": self.residual_sd,
        }


def fit_line(x: list[float], y: list[float]) -> Fit | None:
    """Least-squares line through (x, y); None with fewer than 3 points or one x."""
    if len(x) < _LINE_POINTS or len(set(x)) < 2:
        return None
    xa, ya = np.asarray(x, float), np.asarray(y, float)
    slope, intercept = np.polyfit(xa, ya, 1)
    r = float(np.corrcoef(xa, ya)[0, 1]) if np.std(ya) > 0 else 0.0
    resid = ya - (intercept + slope * xa)
    sd = float(np.sqrt((resid**2).sum() / (len(x) - 2))) if len(x) > 2 else 0.0
    xm = float(xa.mean())
    return Fit(float(slope), float(intercept), r, len(x), float(xa.min()), float(xa.max()), xm,
               float(((xa - xm) ** 2).sum()), sd)  # fmt: skip


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
    read_ci: float | None = None
    write_ci: float | None = None
    outside: bool = False  # the old layout lies outside the fitted range: no prediction
    #: The paired rounds' verdict where the run had its own baseline ("inconclusive": its
    #: interval includes 1).
    read_verdict: str | None = None
    write_verdict: str | None = None
    #: What each actual value is relative to: "own baseline", "empty fs" (the best separate
    #: run on an empty file system) or "best run" (no empty file system at all).
    read_base: str | None = None
    write_base: str | None = None

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
            "read_ci95": self.read_ci,
            "actual_read": self.actual_read,
            "pred_write": self.pred_write,
            "write_ci95": self.write_ci,
            "actual_write": self.actual_write,
            "outside_fitted_range": self.outside,
            "read_verdict": self.read_verdict,
            "write_verdict": self.write_verdict,
            "read_relative_to": self.read_base,
            "write_relative_to": self.write_base,
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
    #: Per metric without a fit: how many comparable runs it had and the span of their layout
    #: scores (``no_fit_note`` says it).
    no_fit: dict[str, tuple[int, float]] = field(default_factory=dict)
    #: Per metric, the runs whose value is relative to the best of them, for want of a run on
    #: an empty file system (``best_relative_note`` says it).
    best_relative: dict[str, list[int]] = field(default_factory=dict)
    #: Per metric, whether every row's value is relative to a run on an empty file system (its
    #: run's own baseline, or the best separate one); else some rows are relative to the best
    #: run (``Row.read_base``/``write_base`` say which).
    baseline_empty_fs: dict[str, bool] = field(default_factory=dict)

    HEADERS = (
        "run", "fs", "date", "bench layout", "old layout", "diff",
        "pred read", "± 95%", "actual read", "pred write", "± 95%", "actual write",
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
                "outside" if r.outside else r.pred_read,
                r.read_ci,
                _actual_cell(r.actual_read, r.read_verdict),
                "outside" if r.outside else r.pred_write,
                r.write_ci,
                _actual_cell(r.actual_write, r.write_verdict),
            ]
            for r in self.rows
        ]

    def to_json(self) -> dict[str, Any]:
        return {
            "suite": self.suite,
            "file_size": self.file_size,
            "baseline": self.baseline,
            "baseline_empty_fs": self.baseline_empty_fs,
            "read_fit": None if self.read_fit is None else self.read_fit.to_json(),
            "write_fit": None if self.write_fit is None else self.write_fit.to_json(),
            "rows": [r.to_json() for r in self.rows],
            "notes": self.notes,
            "no_fit": {m: list(v) for m, v in self.no_fit.items()},
            "best_relative": self.best_relative,
        }


def _actual_cell(value: float | None, verdict: str | None) -> float | str | None:
    """An actual relative value, marked where its run's paired interval includes 1."""
    if value is None or verdict != "inconclusive":
        return value
    return f"{value:.3f} (inconclusive)"


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
    if suite == "scan":
        raise UsageError(
            "scan runs are judged by their aged/clean ratio, not predicted from layout scores: "
            "fsage bench results --suite scan"
        )
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
            raise UsageError(
                f"no {suite} results for {file_size}-byte files (stored: "
                + ", ".join(str(h) for h in sorted(have))
                + "); give one of those with --file-size"
            )
        allres = [r for r in allres if r.params.get("file_size") == file_size]
    elif not sized:
        file_size = None
    groups: dict[str, list[StoredResult]] = {}
    for r in allres:
        groups.setdefault(_comparable_key(r), []).append(r)
    if len(groups) > 1:
        ranked = sorted(groups.items(), key=lambda kv: -len({r.run_id for r in kv[1]}))
        allres = ranked[0][1]
        left = sorted({r.run_id for _, rs in ranked[1:] for r in rs})
        notes.append(
            f"runs {', '.join(map(str, left))} left out: other parameters than the "
            f"{len({r.run_id for r in allres})} runs fitted ({ranked[0][0]})"
        )
    by_run: dict[int, dict[str, StoredResult]] = {}
    for r in allres:
        if r.metric in ("read", "write"):
            by_run.setdefault(r.run_id, {})[r.metric] = r
    baseline: dict[str, float | None] = {}
    empty_fs: dict[str, bool] = {}
    best_relative: dict[str, list[int]] = {}
    for metric in ("read", "write"):
        # a run that carries its own baseline (an empty file system run beside it, in rounds)
        # is relative to that one; the others to the best separate run on an empty file system
        vals = [(m[metric], _old_files(m[metric])) for m in by_run.values() if metric in m]
        bare = [r for r, _ in vals if _own_relative(r) is None]
        empty = [r.value for r, n in vals if n == 0 and _own_relative(r) is None]
        # every value relative to an empty file system: its own baseline, or the separate run
        empty_fs[metric] = bool(empty) or (bool(vals) and not bare)
        if empty:
            baseline[metric] = max(empty)
        elif bare:
            baseline[metric] = max(r.value for r in bare)
            best_relative[metric] = [r.run_id for r in bare]
            notes.append(best_relative_note(metric, best_relative[metric]))
        else:
            baseline[metric] = None
    rows: list[Row] = []
    for run_id, m in sorted(by_run.items()):
        any_r = next(iter(m.values()))
        rows.append(
            Row(
                run_id=run_id,
                fs_name=any_r.fs_name,
                date=_snapshot_date(store, any_r) or any_r.started_at[:10],
                bench_layout=any_r.layout_score_bench_files,
                old_layout=any_r.layout_score_old_files,
                actual_read=_rel(m.get("read"), baseline.get("read")),
                actual_write=_rel(m.get("write"), baseline.get("write")),
                read_verdict=_verdict(m.get("read")),
                write_verdict=_verdict(m.get("write")),
                read_base=_base_of(m.get("read"), empty_fs["read"]),
                write_base=_base_of(m.get("write"), empty_fs["write"]),
            )
        )
    fits: dict[str, Fit | None] = {}
    no_fit: dict[str, tuple[int, float]] = {}
    for metric in ("read", "write"):
        pts = [
            (r.bench_layout, getattr(r, f"actual_{metric}"))
            for r in rows
            if r.bench_layout is not None and getattr(r, f"actual_{metric}") is not None
        ]
        xs = [p[0] for p in pts]
        span = max(xs) - min(xs) if xs else 0.0
        if len(pts) < MIN_POINTS or span < MIN_RANGE:
            fits[metric] = None
            no_fit[metric] = (len(pts), span)
            notes.append(no_fit_note(metric, len(pts), span))
            continue
        fits[metric] = fit_line(xs, [p[1] for p in pts])
    rf, wf = fits["read"], fits["write"]
    for row in rows:
        if row.old_layout is None:
            continue
        x = row.old_layout
        if (rf is not None and not rf.covers(x)) or (wf is not None and not wf.covers(x)):
            row.outside = True
            continue
        if rf is not None:
            row.pred_read, row.read_ci = rf(x), rf.ci(x)
        if wf is not None:
            row.pred_write, row.write_ci = wf(x), wf.ci(x)
    if any(r.outside for r in rows):
        notes.append(
            "rows marked outside: their old files' layout score lies outside the scores the fit "
            "observed, and a fit is not extrapolated"
        )
    return Prediction(
        suite, file_size, rows, fits["read"], fits["write"], baseline, notes, no_fit,
        best_relative, empty_fs,
    )  # fmt: skip


def no_fit_note(metrics: str, count: int, span: float) -> str:
    """Why ``metrics`` (read, write or both) have no fit against layout score."""
    return (
        f"no fit of {metrics} performance against layout score: {count} comparable runs with "
        f"a layout score and a {metrics} result spanning {span:.3f}; need {MIN_POINTS} "
        f"spanning {MIN_RANGE} or more"
    )


def best_relative_note(metric: str, runs: list[int]) -> str:
    """Why ``runs``' ``metric`` is relative to the best of them."""
    return (
        f"no {metric} run on an empty file system for runs {', '.join(map(str, runs))} (no "
        f"baseline of their own): their {metric} is relative to the best of them"
    )


def _comparable_key(r: StoredResult) -> str:
    import json

    return json.dumps(
        {k: v for k, v in sorted(r.run_params.items()) if k not in _IGNORED_PARAMS},
        default=str,
        sort_keys=True,
    )


def _snapshot_date(store: Any, r: StoredResult) -> str | None:
    """The date of the snapshot the run's file system recreates (or of its own snapshot)."""
    if r.snapshot_id is None:
        return None
    row = store.con.execute(
        "SELECT s.taken_at, o.taken_at FROM snapshots s LEFT JOIN snapshots o "
        "ON o.id = s.recreation_of WHERE s.id = ?",
        (r.snapshot_id,),
    ).fetchone()
    if row is None:
        return None
    return str(row[1] or row[0])[:10]


def _old_files(r: StoredResult) -> int | None:
    old = (r.layout or {}).get("old")
    return None if old is None else int(old.get("files", 0))


def _own_relative(r: StoredResult) -> float | None:
    """The result over its own run's baseline (paired rounds), where the run had one."""
    rel = r.params.get("relative")
    return None if rel is None or r.params.get("baseline") is None else float(rel)


def _base_of(r: StoredResult | None, empty_fs: bool) -> str | None:
    if r is None:
        return None
    if _own_relative(r) is not None:
        return "own baseline"
    return "empty fs" if empty_fs else "best run"


def _verdict(r: StoredResult | None) -> str | None:
    return None if r is None else r.params.get("verdict")


def _rel(r: StoredResult | None, base: float | None) -> float | None:
    if r is None:
        return None
    own = _own_relative(r)
    if own is not None:
        return own
    if not base:
        return None
    return r.value / base
