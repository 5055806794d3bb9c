"""Report sections for benchmark results and the layout-score prediction table (seed 002).

The ``bench`` extra provider reads the tables ``bench_runs`` and ``bench_results``; it returns
None when there are no runs, so the section is left out of reports without benchmarks.
"""

from __future__ import annotations

from typing import Any

from fsage.reports.build import register_extra
from fsage.reports.html import ReportData, Section, Table, register_section
from fsage.reports.sections import _ref_line, esc

MAIN_METRICS = ("read", "write", "transactions", "tps", "time")
#: How each metric's points are drawn in the prediction figure: distinct shapes and sizes, so
#: that a read point at the same place as a write point stays visible around it.
MARKERS = {
    "read": {"color": "#1f77b4", "symbol": "circle-open", "size": 14, "line": {"width": 2}},
    "write": {"color": "#d62728", "symbol": "x", "size": 8},
}


@register_extra("bench")
def bench_extra(store: Any, fs_name: str | None) -> dict[str, Any] | None:
    from fsage.replay.bench.predict import predict
    from fsage.replay.bench.run import stored_results

    results = stored_results(store)
    if fs_name is not None:
        results = [r for r in results if r.fs_name == fs_name]
    if not results:
        return None
    runs: dict[int, dict[str, Any]] = {}
    for r in results:
        run = runs.setdefault(
            r.run_id,
            {
                "run_id": r.run_id,
                "suite": r.suite,
                "fs": r.fs_name,
                "date": r.started_at,
                "cold": r.cold,
                "scan": r.run_params.get("scan") if r.suite == "scan" else None,
                "results": [],
            },
        )
        run["results"].append(
            {
                "metric": r.metric,
                "value": r.value,
                "unit": r.unit,
                "file_size": r.params.get("file_size"),
                "bench_layout": r.layout_score_bench_files,
                "old_layout": r.layout_score_old_files,
            }
        )
    suites = sorted({r.suite for r in results})
    # each run's 95% interval of its paired ratio to its own baseline, for the error bars
    intervals = {
        (r.run_id, r.metric, r.params.get("file_size")): r.params.get("relative_ci")
        for r in results
    }
    predictions = []
    for suite in suites:
        if suite == "scan":  # judged by its aged/clean ratio (its own table), not predicted
            continue
        # One table per file size the runs used: predict asks for one size, and a database
        # may hold runs of several (the report shows them all rather than fail on one).
        sizes: list[int | None] = sorted(  # type: ignore[assignment]
            {
                int(r.params["file_size"])
                for r in results
                if r.suite == suite and r.params.get("file_size") is not None
            }
        )
        for size in sizes or [None]:
            pred = predict(store, suite, file_size=size, fs_name=fs_name)
            if pred.rows:
                predictions.append(_with_intervals(pred.to_json(), intervals))
    return {"runs": list(runs.values()), "predictions": predictions}


def _with_intervals(pred: dict[str, Any], intervals: dict[Any, Any]) -> dict[str, Any]:
    """The prediction's rows with ``read_interval`` and ``write_interval``: the 95% interval
    of the run's paired ratio, where its value is relative to its own baseline (None else)."""
    for row in pred["rows"]:
        for metric in ("read", "write"):
            ci = None
            if row.get(f"{metric}_relative_to") == "own baseline":
                ci = intervals.get((row["run_id"], metric, pred["file_size"]))
            row[f"{metric}_interval"] = None if not ci else [float(ci[0]), float(ci[1])]
    return pred


def _fit_line(fit: dict[str, Any] | None, name: str, color: str) -> list[dict[str, Any]]:
    if not fit:
        return []
    return [
        {
            "type": "scatter",
            "mode": "lines",
            "name": esc(f"{name} fit"),
            # Only over the layout scores the fit observed: a fit is not extrapolated.
            "x": [fit.get("x_min", 0.0), fit.get("x_max", 1.0)],
            "y": [
                fit["intercept"] + fit["slope"] * fit.get("x_min", 0.0),
                fit["intercept"] + fit["slope"] * fit.get("x_max", 1.0),
            ],
            "line": {"dash": "dot", "color": color},
        }
    ]


@register_section("benchmarks", order=80)
def bench_section(data: ReportData) -> Section | None:
    bench = data.extra.get("bench")
    if not bench or not bench.get("runs"):
        return None
    from fsage.text import human_bytes

    # one line per suite, metric and file size: the runs summarised, not every row
    groups: dict[tuple[str, str, Any, str], list[tuple[str, float, Any, Any]]] = {}
    for run in bench["runs"]:
        for res in run["results"]:
            if res["metric"] not in MAIN_METRICS:
                continue
            key = (run["suite"], res["metric"], res["file_size"], res["unit"])
            groups.setdefault(key, []).append(
                (str(run["date"])[:19], float(res["value"]), res["bench_layout"], res["old_layout"])
            )
    rows = []
    for (suite, metric, size, unit), vals in sorted(
        groups.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] or 0)
    ):
        vals.sort()
        nums = [v[1] for v in vals]
        last = vals[-1]
        rows.append(
            [
                suite,
                metric,
                "-" if not size else human_bytes(size),
                len(vals),
                f"{last[1]:.4g} {unit}",
                f"{min(nums):.4g} - {max(nums):.4g} {unit}",
                last[2],
                last[3],
                last[0],
            ]
        )
    tables = [
        Table(
            [
                "suite",
                "metric",
                "file size",
                "runs",
                "latest",
                "range over runs",
                "bench layout (latest)",
                "old layout (latest)",
                "latest run",
            ],
            rows,
            caption="Benchmark results summarised per suite, metric and file size, with the "
            "layout scores of the benchmark's files and of the files already there in the "
            "latest run. Every value: fsage bench results --format csv.",
        )
    ]
    figures = []
    notes = []
    for pred in bench.get("predictions", []):
        has_base = _has_baseline(pred)
        what = f"{pred['suite']}" + (
            f", {pred['file_size']:,}-byte files" if pred["file_size"] else ""
        )
        tables.append(
            Table(
                [
                    "run",
                    "fs",
                    "date",
                    "bench layout",
                    "old layout",
                    "diff",
                    "pred read",
                    "actual read",
                    "pred write",
                    "actual write",
                ],
                [
                    [
                        r["run_id"],
                        r["fs"],
                        r["date"],
                        r["bench_layout"],
                        r["old_layout"],
                        r["diff"],
                        r["pred_read"],
                        _actual(r, "read", has_base),
                        r["pred_write"],
                        _actual(r, "write", has_base),
                    ]
                    for r in pred["rows"]
                ],
                caption=f"Predicted vs actual relative performance ({what}; seed 002's table).",
            )
        )
        traces: list[dict[str, Any]] = []
        undrawn: dict[str, str] = {}
        for metric in ("read", "write"):
            pts = [
                (
                    r["bench_layout"],
                    r[f"actual_{metric}"],
                    r["run_id"],
                    r.get(f"{metric}_verdict") == "inconclusive",
                    r.get(f"{metric}_interval"),
                )
                for r in pred["rows"]
                if r["bench_layout"] is not None
                and r[f"actual_{metric}"] is not None
                and _relative_to_empty(r, metric, has_base)
            ]
            if not pts:
                # relative to the best run, that run would sit at 1.000: nothing to draw
                if any(
                    r[f"actual_{metric}"] is not None and _relative_to_empty(r, metric, has_base)
                    for r in pred["rows"]
                ):
                    # the run had its baseline: its files had no layout score to draw against
                    undrawn[metric] = "its files have no layout score (a one-block file has none)"
                else:
                    undrawn[metric] = "no baseline (no run on an empty file system)"
                continue
            color = MARKERS[metric]["color"]
            traces += _points(metric, [p for p in pts if not p[3]], decided=True)
            traces += _points(metric, [p for p in pts if p[3]], decided=False)
            traces += _fit_line(pred.get(f"{metric}_fit"), metric, str(color))
        for note in _prediction_notes(pred, what, has_base, undrawn):
            if note not in notes:
                notes.append(note)
        if not traces:
            continue
        figures.append(
            {
                "data": traces,
                "layout": {
                    "title": {"text": esc(f"Relative performance vs layout score ({what})")},
                    "xaxis": {
                        "title": {"text": "layout score of the benchmark's files"},
                        "range": [0, 1.02],
                    },
                    "yaxis": {
                        "title": {"text": "fraction of empty-fs performance"},
                        "range": _relative_range(traces),
                    },
                    # the empty file system's own performance, which every point is a fraction of
                    "shapes": [_ref_line(1.0)],
                    "margin": {"t": 50, "l": 60, "r": 20, "b": 60},
                    "legend": {"orientation": "h"},
                },
            }
        )
        if RELATIVE_NOTE not in notes:
            notes.append(RELATIVE_NOTE)
    if not rows:
        tables.pop(0)  # only scan runs: their own table says it all
    scan_table, scan_figure = _scan_parts(bench["runs"])
    if scan_table is not None:
        tables.insert(0 if not rows else 1, scan_table)
    if scan_figure is not None:
        figures.insert(0, scan_figure)
    return Section("Benchmarks", figures=figures, tables=tables, notes=notes)


NO_BASELINE = "no baseline"


RELATIVE_NOTE = (
    "Relative performance: each run's median of its rounds' paired ratios (the run over the "
    "empty file system run in turn with it); the error bars are its 95% interval, and the "
    "dotted line at 1.0 is the empty file system's own performance."
)

#: A point: layout score, relative value, run id, inconclusive, 95% interval (or None).
Point = tuple[Any, Any, Any, bool, "list[float] | None"]


def _points(metric: str, pts: list[Point], decided: bool) -> list[dict[str, Any]]:
    """One metric's runs as a marker trace with their 95% intervals as error bars; runs whose
    spread was wider than their effect are drawn faded and named inconclusive, so a reader
    does not take them for measured points."""
    if not pts:
        return []
    marker = dict(MARKERS[metric])
    if not decided:
        marker["opacity"] = 0.35
    trace: dict[str, Any] = {
        "type": "scatter",
        "mode": "markers",
        "name": esc(metric if decided else f"{metric} (inconclusive)"),
        "x": [p[0] for p in pts],
        "y": [p[1] for p in pts],
        "text": [esc(f"run {p[2]}" + ("" if decided else ", inconclusive")) for p in pts],
        "marker": marker,
    }
    if any(p[4] for p in pts):
        trace["error_y"] = {
            "type": "data",
            "symmetric": False,
            # a run without an interval gets no bar (null), not one of length 0
            "array": [None if not p[4] else p[4][1] - p[1] for p in pts],
            "arrayminus": [None if not p[4] else p[1] - p[4][0] for p in pts],
            "color": marker["color"],
            "thickness": 1.5,
            "width": 6,
        }
    return [trace]


def _relative_range(traces: list[dict[str, Any]]) -> list[float]:
    """The y range of the relative-performance figure: every point with its whole interval,
    and 1.0 (the empty file system) however far the points are from it, padded."""
    ys = [1.0]
    for t in traces:
        ys += [y for y in t["y"] if y is not None]
        err = t.get("error_y")
        if err:
            for y, up, down in zip(t["y"], err["array"], err["arrayminus"], strict=True):
                if up is not None and down is not None:
                    ys += [y + up, y - down]
    lo, hi = min(ys), max(ys)
    pad = max((hi - lo) * 0.08, 0.02)
    return [max(lo - pad, 0.0), hi + pad]


def _prediction_notes(
    pred: dict[str, Any], what: str, has_base: dict[str, bool], undrawn: dict[str, str]
) -> list[str]:
    """The notes of one prediction table, each said once: what read and write share in one
    note, and in the words of the table (a run without a baseline is "no baseline" there, so
    predict's "relative to the best of them" is not repeated here)."""
    from fsage.replay.bench.predict import best_relative_note, no_fit_note

    no_fit = {m: (int(n), float(span)) for m, (n, span) in (pred.get("no_fit") or {}).items()}
    # said below in the table's words, read and write together: predict's own notes of them
    restated = {no_fit_note(m, n, span) for m, (n, span) in no_fit.items()}
    restated |= {
        best_relative_note(m, runs) for m, runs in (pred.get("best_relative") or {}).items()
    }
    notes = [f"{what}: {n}" for n in pred["notes"] if n not in restated]
    rows = pred["rows"]
    for metrics, (n, span) in _shared(no_fit, "or"):
        notes.append(f"{what}: {no_fit_note(metrics, n, span)}")
    for metrics, why in _shared(undrawn):
        notes.append(f"{what}: {metrics}: {why}, so no relative performance is drawn")
    bare: dict[str, tuple[int, ...]] = {}
    for metric in ("read", "write"):
        runs = tuple(r["run_id"] for r in rows if r[f"actual_{metric}"] is not None
                     and not _relative_to_empty(r, metric, has_base))  # fmt: skip
        if runs and metric not in undrawn:  # else the note above says it for every run
            bare[metric] = runs
    for metrics, runs in _shared(bare, "or"):
        notes.append(
            f"{what}: run{'s' if len(runs) > 1 else ''} {', '.join(map(str, runs))}: no "
            f"baseline (no run on an empty file system beside {'them' if len(runs) > 1 else 'it'}"
            f"): the table gives no relative {metrics} and the figure draws none"
        )
    return notes


def _shared(by_metric: dict[str, Any], joined: str = "and") -> list[tuple[str, Any]]:
    """Read's and write's values as (metrics, value) pairs: one pair "read and write" (or
    ``joined``) where the two are the same, so that a note is not said twice."""
    if set(by_metric) == {"read", "write"} and by_metric["read"] == by_metric["write"]:
        return [(f"read {joined} write", by_metric["read"])]
    return [(m, by_metric[m]) for m in ("read", "write") if m in by_metric]


def _relative_to_empty(row: dict[str, Any], metric: str, has_base: dict[str, bool]) -> bool:
    """Whether a row's actual value is relative to an empty file system: its run's own
    baseline, or a separate empty-fs run (older JSON without the per-row field: the flag)."""
    of = row.get(f"{metric}_relative_to")
    if of is None:
        return has_base[metric]
    return bool(of in ("own baseline", "empty fs"))


def _actual(row: dict[str, Any], metric: str, has_base: dict[str, bool]) -> Any:
    if not _relative_to_empty(row, metric, has_base):
        return NO_BASELINE
    value = row[f"actual_{metric}"]
    if value is not None and row.get(f"{metric}_verdict") == "inconclusive":
        return f"{value:.3f} (inconclusive)"
    return value


def _has_baseline(pred: dict[str, Any]) -> dict[str, bool]:
    """Per metric, whether the prediction's relative values are relative to a run on an empty
    file system (older JSON without the flag: only where a baseline value exists)."""
    flags = pred.get("baseline_empty_fs")
    base = pred.get("baseline") or {}
    if isinstance(flags, dict):
        return {m: bool(flags.get(m)) for m in ("read", "write")}
    return {m: base.get(m) is not None for m in ("read", "write")}


def _ratio_cell(scan: dict[str, Any]) -> str:
    v = scan.get("aged_clean")
    if not v:
        return "no clean copy"
    lo, hi = v.get("ci_low"), v.get("ci_high")
    ci = "" if lo is None or hi is None else f" (95% interval {lo:.3f}-{hi:.3f})"
    if v.get("ratio") is None:
        paired = v.get("paired_ratio")
        return "inconclusive" + ("" if paired is None else f": {paired:.3f}{ci}")
    return f"{v['ratio']:.3f}{ci}"


def _scan_parts(runs: list[dict[str, Any]]) -> tuple[Table | None, dict[str, Any] | None]:
    """The scan runs: a table of aged and clean times with the aged/clean ratio (or
    "inconclusive"), and a figure of the two medians per run with their range."""
    scans = [r for r in runs if r.get("scan")]
    if not scans:
        return None, None
    rows = []
    for run in scans:
        sc = run["scan"]
        aged, clean = sc.get("aged") or {}, sc.get("clean") or {}
        rows.append(
            [
                run["run_id"],
                run["fs"],
                str(run["date"])[:19],
                sc.get("path"),
                aged.get("files"),
                _mib(aged.get("bytes")),
                _secs(aged),
                _secs(clean),
                aged.get("mb_per_s"),
                clean.get("mb_per_s"),
                _ratio_cell(sc),
                (aged.get("trace") or {}).get("score"),
                (clean.get("trace") or {}).get("score"),
            ]
        )
    table = Table(
        ["run", "fs", "date", "path", "files", "MiB", "aged s", "clean s", "aged MB/s",
         "clean MB/s", "aged/clean", "traced score aged", "traced score clean"],
        rows,
        caption="Scans: a cold read of the tree in path order on the file system and on a "
        "clean copy of the same tree made in the same run (same mkfs parameters), in rounds, "
        "alternately; median seconds with the spread of the repeats. aged/clean: the median "
        "of the rounds' paired ratios with its 95% sign-test interval, 'inconclusive' where "
        "the interval includes 1.",
    )  # fmt: skip
    traces: list[dict[str, Any]] = []
    for name, color in (("aged", "#d62728"), ("clean", "#2ca02c")):
        xs, ys, lo, hi = [], [], [], []
        for run in scans:
            side = run["scan"].get(name)
            if not side:
                continue
            vals = [float(v) for v in side.get("values") or [side["seconds"]]]
            xs.append(esc(f"run {run['run_id']}"))
            ys.append(float(side["seconds"]))
            hi.append(max(vals) - float(side["seconds"]))
            lo.append(float(side["seconds"]) - min(vals))
        if xs:
            traces.append(
                {
                    "type": "bar",
                    "name": name,
                    "x": xs,
                    "y": ys,
                    "marker": {"color": color},
                    "error_y": {"type": "data", "symmetric": False, "array": hi, "arrayminus": lo},
                }
            )
    figure = {
        "data": traces,
        "layout": {
            "title": {"text": "Scan time, aged vs clean copy (median, bars: range of repeats)"},
            "barmode": "group",
            "yaxis": {"title": {"text": "seconds"}, "rangemode": "tozero"},
            "margin": {"t": 50, "l": 60, "r": 20, "b": 60},
            "legend": {"orientation": "h"},
        },
    }
    return table, figure


def _mib(n: Any) -> float | None:
    return None if n is None else float(n) / 2**20


def _secs(side: dict[str, Any]) -> str:
    if not side:
        return "-"
    return f"{side['seconds']:.3f} (spread {side.get('spread', 0.0):.1%})"
