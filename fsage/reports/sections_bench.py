"""Report sections for benchmark results and the layout-score prediction table (seed 002).

The ``bench`` extra provider reads the tables ``bench_runs`` and ``bench_results``; it returns
None when there are no runs, so the section is left out of reports without benchmarks.
"""

from __future__ import annotations

from typing import Any

from fsage.reports.build import register_extra
from fsage.reports.html import ReportData, Section, Table, register_section
from fsage.reports.sections import esc

MAIN_METRICS = ("read", "write", "transactions", "tps", "time")


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
    predictions = []
    for suite in suites:
        pred = predict(store, suite, fs_name=fs_name)
        if pred.rows:
            predictions.append(pred.to_json())
    return {"runs": list(runs.values()), "predictions": predictions}


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
                        r["actual_read"],
                        r["pred_write"],
                        r["actual_write"],
                    ]
                    for r in pred["rows"]
                ],
                caption=f"Predicted vs actual relative performance ({what}; seed 002's table).",
            )
        )
        notes += [f"{pred['suite']}: {n}" for n in pred["notes"]]
        traces: list[dict[str, Any]] = []
        for metric, color in (("read", "#1f77b4"), ("write", "#d62728")):
            pts = [
                (r["bench_layout"], r[f"actual_{metric}"], r["run_id"])
                for r in pred["rows"]
                if r["bench_layout"] is not None and r[f"actual_{metric}"] is not None
            ]
            traces.append(
                {
                    "type": "scatter",
                    "mode": "markers",
                    "name": esc(metric),
                    "x": [p[0] for p in pts],
                    "y": [p[1] for p in pts],
                    "text": [esc(f"run {p[2]}") for p in pts],
                    "marker": {"color": color},
                }
            )
            traces += _fit_line(pred.get(f"{metric}_fit"), metric, color)
        figures.append(
            {
                "data": traces,
                "layout": {
                    "title": {"text": esc(f"Relative performance vs layout score ({what})")},
                    "xaxis": {
                        "title": {"text": "layout score of the benchmark's files"},
                        "range": [0, 1.02],
                    },
                    "yaxis": {"title": {"text": "fraction of empty-fs performance"}},
                    "margin": {"t": 50, "l": 60, "r": 20, "b": 60},
                    "legend": {"orientation": "h"},
                },
            }
        )
    return Section("Benchmarks", figures=figures, tables=tables, notes=notes)
