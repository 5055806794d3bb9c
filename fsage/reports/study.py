"""The report of an aging study: per file system, how its scan, layout and free space change
step by step; the rank order of the file systems fresh and aged; a table a paper could print,
with modeled read times on seed 000's and seed 001's disks and a modern HDD beside the measured
ones."""

from __future__ import annotations

import csv
import html
import io
from pathlib import Path
from typing import Any

from fsage.reports.html import ReportData, Section, Table, cell_text, render, write_html
from fsage.study.store import StudyRow

#: Columns of the paper table: (key, header).
COLUMNS = [
    ("fs", "file system"),
    ("step", "step"),
    ("files", "files"),
    ("gib", "data (GiB)"),
    ("aged_s_per_gib", "scan aged (s/GiB)"),
    ("clean_s_per_gib", "scan clean (s/GiB)"),
    ("ratio", "aged/clean (of the rounds)"),
    ("ratio_interval", "aged/clean interval"),
    ("rounds", "rounds"),
    ("verdict", "verdict"),
    ("layout_score", "layout score"),
    ("dynamic_score", "dynamic layout score (trace)"),
    ("modeled_dynamic_score", "dynamic layout score (modeled)"),
    ("nospace_ops", "ops skipped (full)"),
    ("free_share", "free"),
    ("largest_free_mib", "largest free extent (MiB)"),
    ("dsp3105_aged_s", "DSP 3105 aged (s)"),
    ("dsp3105_clean_s", "DSP 3105 clean (s)"),
    ("dsp3105_ratio", "DSP 3105 aged/clean"),
    ("hdd_aged_s", "HDD aged (s)"),
    ("hdd_clean_s", "HDD clean (s)"),
    ("hdd_ratio", "HDD aged/clean"),
]
#: Seed 001's disks (fsage.analyzer.diskmodel), each known by its average access time and
#: bandwidth: (model, label).
SEED001_DISKS = [
    ("lfs-15ms", "15 ms, 5 MB/s"),
    ("sprite-17.5ms", "Sprite 17.5 ms, 1.3 MB/s"),
    ("lfs-10ms", "10 ms, 15 MB/s"),
    ("hp97560", "HP97560"),
    ("hpc3323a", "HPC3323A"),
]
COLUMNS += [
    (f"{m}_{part}", f"{label} {what}")
    for m, label in SEED001_DISKS
    for part, what in (("aged_s", "aged (s)"), ("clean_s", "clean (s)"), ("ratio", "aged/clean"))
]
_MODELED_PREFIXES = tuple(f"{m}_" for m in ("dsp3105", "hdd", *(d for d, _ in SEED001_DISKS)))
#: The paper table's columns as printed: measured, then modeled beside the measured scan (one
#: table of all of them is wider than a page).
MEASURED_TABLE = [k for k, _ in COLUMNS if not k.startswith(_MODELED_PREFIXES)]
MODELED_TABLE = [
    "fs", "step", "aged_s_per_gib", "ratio", "verdict",
    *(k for k, _ in COLUMNS if k.startswith(("dsp3105_", "hdd_"))),
]  # fmt: skip
SEED001_TABLE = [
    "fs", "step", "ratio",
    *(f"{m}_{part}" for m, _ in SEED001_DISKS for part in ("aged_s", "ratio")),
]  # fmt: skip
#: How the rank orders are named in the report.
RANK_LABELS = {
    "scan_clean_vs_aged": "scan (s/GiB): clean copy vs aged tree, last step",
    "modeled_hdd_clean_vs_aged": "modeled HDD read (s): clean copy vs aged tree, last step",
    "scan_aged_s_per_gib": "scan of the aged tree (s/GiB): first vs last step",
    "modeled_hdd_aged_s": "modeled HDD read of the aged tree (s): first vs last step",
}


PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]


def _untraced_notes(rows: list[dict[str, Any]]) -> list[str]:
    """Which file systems' steps have no block trace (a gap in the trace figure)."""
    missing: dict[str, set[int]] = {}
    steps: dict[str, set[int]] = {}
    for r in rows:
        steps.setdefault(r["fs"], set()).add(int(r["step"]))
        if r["dynamic_score"] is None:
            missing.setdefault(r["fs"], set()).add(int(r["step"]))
    notes = []
    for fs, gone in sorted(missing.items()):
        if gone == steps[fs]:
            notes.append(f"{fs}: no block trace.")
        else:
            which = ", ".join(str(n) for n in sorted(gone))
            notes.append(f"{fs}: no block trace at step{'s' if len(gone) > 1 else ''} {which}.")
    return notes


def _has(rows: list[dict[str, Any]], key: str) -> bool:
    return any(r.get(key) is not None for r in rows)


def table_row(r: dict[str, Any]) -> dict[str, Any]:
    """One stored result as a row of the paper table (the keys of :data:`COLUMNS`)."""
    scan = r.get("scan") or {}
    tr = scan.get("trace") or {}
    mod = r.get("modeled") or {}
    total = r.get("blocks_total") or 0
    bs = r.get("block_size") or 0
    largest = r.get("largest_free_extent")
    return {
        "fs": r["fs"],
        "step": r["step"],
        "files": scan.get("files"),
        "gib": (scan.get("bytes") or 0) / 2**30,
        "aged_s_per_gib": scan.get("aged_s_per_gib"),
        "clean_s_per_gib": scan.get("clean_s_per_gib"),
        "ratio": scan.get("ratio"),
        "ratio_interval": _interval(scan.get("ci_low"), scan.get("ci_high")),
        "ratio_low": scan.get("ci_low"),
        "ratio_high": scan.get("ci_high"),
        "rounds": scan.get("rounds", len(scan.get("aged_values") or []) or None),
        "verdict": scan.get("verdict"),
        "layout_score": r.get("layout_score"),
        "dynamic_score": tr.get("score"),
        "modeled_dynamic_score": (r.get("locality") or {}).get("dynamic_layout_score_path"),
        "nospace_ops": (r.get("age") or {}).get("nospace"),
        "free_share": (r.get("blocks_free") or 0) / total if total else None,
        # a reader without a free-extent map (btrfs) counts free blocks but lists no extents:
        # its largest is unknown, not 0
        "largest_free_mib": largest * bs / 2**20
        if largest is not None and bs and (largest or not r.get("blocks_free"))
        else None,
        "dsp3105_aged_s": (mod.get("dsp3105") or {}).get("aged_seconds"),
        "dsp3105_clean_s": (mod.get("dsp3105") or {}).get("clean_seconds"),
        "dsp3105_ratio": (mod.get("dsp3105") or {}).get("ratio"),
        "hdd_aged_s": (mod.get("hdd") or {}).get("aged_seconds"),
        "hdd_clean_s": (mod.get("hdd") or {}).get("clean_seconds"),
        "hdd_ratio": (mod.get("hdd") or {}).get("ratio"),
        **{
            f"{m}_{part}": (mod.get(m) or {}).get(key)
            for m, _ in SEED001_DISKS
            for part, key in _MODEL_PARTS
        },
        **_scan_intervals(scan),
    }


_MODEL_PARTS = (("aged_s", "aged_seconds"), ("clean_s", "clean_seconds"), ("ratio", "ratio"))


def _scan_intervals(scan: dict[str, Any]) -> dict[str, float | None]:
    """95 % intervals of the aged and clean scans' seconds per GiB, from the step's rounds."""
    from fsage.study.rounds import mean_interval

    gib = (scan.get("bytes") or 0) / 2**30
    out: dict[str, float | None] = {}
    for side in ("aged", "clean"):
        low, high = mean_interval(scan.get(f"{side}_values") or [])
        out[f"{side}_s_per_gib_low"] = low / gib if low is not None and gib else None
        out[f"{side}_s_per_gib_high"] = high / gib if high is not None and gib else None
    return out


def _interval(low: float | None, high: float | None) -> str | None:
    return None if low is None or high is None else f"{low:.2f}-{high:.2f}"


def _full_steps(rows: list[dict[str, Any]], key: str) -> dict[int, dict[str, float]]:
    have: dict[int, dict[str, float]] = {}
    for r in rows:
        if r.get(key) is not None:
            have.setdefault(r["step"], {})[r["fs"]] = r[key]
    return have


Span = tuple[float, float] | None


def _spans(rows: list[dict[str, Any]], key: str) -> dict[int, dict[str, Span]]:
    """Per step and file system, the 95 % interval of ``key`` (None: none, a modeled value)."""
    out: dict[int, dict[str, Span]] = {}
    for r in rows:
        lo, hi = r.get(f"{key}_low"), r.get(f"{key}_high")
        out.setdefault(r["step"], {})[r["fs"]] = None if lo is None or hi is None else (lo, hi)
    return out


def _overlap(x: Span, y: Span) -> bool:
    return x is not None and y is not None and x[0] <= y[1] and y[0] <= x[1]


def judge_orders(
    fresh: list[str], aged: list[str], fresh_span: dict[str, Span], aged_span: dict[str, Span]
) -> dict[str, Any]:
    """Whether the order changed: a pair of file systems that swapped places is a change only
    where their intervals lie apart both fresh and aged (a swap of two whose intervals overlap
    is within the scans' noise); a value without an interval (modeled) is taken as exact."""
    pos = {fs: i for i, fs in enumerate(aged)}
    swaps = []
    for i, a in enumerate(fresh):
        for b in fresh[i + 1 :]:
            if pos[a] > pos[b]:
                apart = not _overlap(fresh_span.get(a), fresh_span.get(b)) and not _overlap(
                    aged_span.get(a), aged_span.get(b)
                )
                swaps.append({"pair": [a, b], "beyond_noise": apart})
    if not swaps:
        verdict = "same"
    elif any(w["beyond_noise"] for w in swaps):
        verdict = "changed"
    else:
        verdict = "same within noise"
    return {"fresh": fresh, "aged": aged, "changed": verdict == "changed", "verdict": verdict,
            "swaps": swaps}  # fmt: skip


_NO_ORDER: dict[str, Any] = {"fresh": [], "aged": [], "changed": False, "verdict": "same",
                             "swaps": []}  # fmt: skip


def _clean_vs_aged(rows: list[dict[str, Any]], clean_key: str, aged_key: str) -> dict[str, Any]:
    """Geriatrix's question: the file systems fastest first on the same tree fresh (the clean
    copy) and aged, at the last step where the most file systems were measured."""
    clean, aged = _full_steps(rows, clean_key), _full_steps(rows, aged_key)
    steps = [k for k in aged if k in clean]
    if not steps:
        return dict(_NO_ORDER)
    most = max(len(set(aged[k]) & set(clean[k])) for k in steps)
    last = max(k for k in steps if len(set(aged[k]) & set(clean[k])) == most)
    both = set(aged[last]) & set(clean[last])
    fresh = sorted(both, key=lambda fs: (clean[last][fs], fs))
    old = sorted(both, key=lambda fs: (aged[last][fs], fs))
    spans_c, spans_a = _spans(rows, clean_key), _spans(rows, aged_key)
    return {"first_step": last, "last_step": last,
            **judge_orders(fresh, old, spans_c.get(last, {}), spans_a.get(last, {}))}  # fmt: skip


def _ranks(rows: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """File systems fastest first by ``key``, fresh (the first step) and aged (the last step
    at which as many file systems as fresh were measured: one that left the study would
    otherwise change the order by its absence), over the file systems measured at both."""
    have = _full_steps(rows, key)
    if not have:
        return dict(_NO_ORDER)
    first = min(have)
    full = [k for k in have if len(have[k]) >= len(have[first])]
    if len(full) > 1:
        last = max(full)
    else:  # none later measured them all: the latest of those measuring the most
        later = [k for k in have if k != first] or [first]
        last = max(later, key=lambda k: (len(set(have[k]) & set(have[first])), k))
    both = set(have[first]) & set(have[last])

    def order(step: int) -> list[str]:
        return sorted(both, key=lambda fs: (have[step][fs], fs))

    spans = _spans(rows, key)
    return {
        "first_step": first,
        "last_step": last,
        **judge_orders(order(first), order(last), spans.get(first, {}), spans.get(last, {})),
    }


def study_table(row: StudyRow) -> dict[str, Any]:
    """The study as JSON: its parameters, one row per step and file system, the rank orders."""
    rows = [table_row(r) for r in row.results if "error" not in r]
    failures = [
        {"fs": r["fs"], "step": r["step"], "error": r["error"]} for r in row.results if "error" in r
    ]
    return {
        "failures": failures,
        "study": row.id,
        "params": row.params,
        "created_at": row.created_at,
        "finished_at": row.finished_at,
        "rows": rows,
        "rank_order": {
            "scan_clean_vs_aged": _clean_vs_aged(rows, "clean_s_per_gib", "aged_s_per_gib"),
            "modeled_hdd_clean_vs_aged": _clean_vs_aged(rows, "hdd_clean_s", "hdd_aged_s"),
            "scan_aged_s_per_gib": _ranks(rows, "aged_s_per_gib"),
            "modeled_hdd_aged_s": _ranks(rows, "hdd_aged_s"),
        },
    }


def study_csv(row: StudyRow) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([k for k, _ in COLUMNS])
    for r in study_table(row)["rows"]:
        w.writerow(["" if r[k] is None else r[k] for k, _ in COLUMNS])
    return buf.getvalue()


def study_text(row: StudyRow) -> str:
    t = study_table(row)
    keys = [
        "fs",
        "step",
        "aged_s_per_gib",
        "ratio",
        "layout_score",
        "dynamic_score",
        "modeled_dynamic_score",
        "free_share",
        "hdd_ratio",
    ]
    heads = dict(COLUMNS)
    cells = [[heads[k] for k in keys]] + [[cell_text(r[k]) for k in keys] for r in t["rows"]]
    widths = [max(len(c[i]) for c in cells) for i in range(len(keys))]
    lines = [f"study {row.id}: {_describe(row.params)}"]
    lines += ["  ".join(c.rjust(w) for c, w in zip(line, widths, strict=True)) for line in cells]
    for name, rk in t["rank_order"].items():
        if rk["fresh"]:
            lines.append(
                f"rank by {RANK_LABELS.get(name, name)}: {' < '.join(rk['fresh'])} -> "
                f"{' < '.join(rk['aged'])} (step {rk['first_step']} -> {rk['last_step']})"
                + f" ({_verdict_text(rk)})"
            )
    for f in t["failures"]:
        lines.append(f"{f['fs']} left the study at step {f['step']}: {f['error']}")
    return "\n".join(lines)


def _verdict_text(rk: dict[str, Any]) -> str:
    """How an order's change reads: the swaps within noise named."""
    verdict = str(rk.get("verdict") or ("changed" if rk.get("changed") else "same"))
    swaps = rk.get("swaps") or []
    noise = [" / ".join(w["pair"]) for w in swaps if not w["beyond_noise"]]
    real = [" / ".join(w["pair"]) for w in swaps if w["beyond_noise"]]
    if verdict == "changed":
        more = f"; within noise: {', '.join(noise)}" if noise else ""
        return f"changed: {', '.join(real)}{more}"
    if verdict == "same within noise":
        return f"same within noise: {', '.join(noise)} overlap at 95 %"
    return verdict


def _describe(p: dict[str, Any]) -> str:
    return (
        f"{', '.join(p.get('filesystems', []))}; workload {p.get('workload')}; "
        f"{(p.get('size') or 0) / 2**20:,.0f} MiB images; {p.get('steps')} steps; "
        f"seed {p.get('seed')}"
        + (f"; ext inodes {p['inodes']:,} (mkfs -N)" if p.get("inodes") else "")
    )


def _series_figure(
    rows: list[dict[str, Any]],
    key: str,
    title: str,
    ytitle: str,
    *,
    dash_key: str | None = None,
    one: bool = False,
    interval: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """``key`` against step, one colour per file system (``dash_key``: the clean copy's, dotted
    with open markers; ``one``: a ratio, drawn with its no-effect line at 1; ``interval``: the
    keys of its interval's ends, drawn as error bars)."""
    data: list[dict[str, Any]] = []
    names = sorted({r["fs"] for r in rows})
    for i, fs in enumerate(names):
        mine = sorted((r for r in rows if r["fs"] == fs), key=lambda r: r["step"])
        color = PALETTE[i % len(PALETTE)]  # one colour per file system in every figure
        # intervals drawn side by side, not over each other at the same step
        shift = (i - (len(names) - 1) / 2) * 0.08 if interval else 0.0
        data.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "line": {"color": color},
                "name": html.escape(fs),
                "x": [r["step"] + shift for r in mine],
                "y": [r[key] for r in mine],
                **({"error_y": _error_bars(mine, key, *interval)} if interval else {}),
            }
        )
        if dash_key is not None:
            data.append(
                {
                    "type": "scatter",
                    "mode": "lines+markers",
                    "line": {"dash": "dot", "color": color},
                    "marker": {"symbol": "circle-open", "color": color},
                    "name": html.escape(f"{fs} (clean copy)"),
                    "x": [r["step"] for r in mine],
                    "y": [r[dash_key] for r in mine],
                }
            )
    # a ratio of 1 is "no aging": drawn, so that a reader does not take 0 as the reference
    shapes = [{"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": 1, "y1": 1,
               "line": {"color": "#555", "width": 1, "dash": "dash"}}] if one else []  # fmt: skip
    return {
        "data": data,
        "layout": {
            "shapes": shapes,
            "title": {"text": html.escape(title)},
            "xaxis": {"title": {"text": "step"}, "dtick": 1},
            "yaxis": {"title": {"text": html.escape(ytitle)}, "rangemode": "tozero"},
            "height": 420,
            "margin": {"l": 70, "r": 20, "t": 50, "b": 50},
        },
    }


def _error_bars(rows: list[dict[str, Any]], key: str, low: str, high: str) -> dict[str, Any]:
    """Plotly error bars from each row's interval (none where a row has no interval)."""

    def span(r: dict[str, Any], end: str) -> float | None:
        v, e = r.get(key), r.get(end)
        return None if v is None or e is None else abs(float(e) - float(v))

    return {
        "type": "data",
        "symmetric": False,
        "array": [span(r, high) for r in rows],
        "arrayminus": [span(r, low) for r in rows],
        "thickness": 1,
        "width": 3,
    }


def study_sections(row: StudyRow) -> list[Section]:
    t = study_table(row)
    rows = t["rows"]
    secs = [
        Section(
            "Scan of the aged tree against its clean copy",
            figures=[
                _series_figure(
                    rows,
                    "aged_s_per_gib",
                    "Cold path-order scan",
                    "seconds per GiB",
                    dash_key="clean_s_per_gib",
                ),
                _series_figure(
                    rows,
                    "ratio",
                    "Aged/clean scan ratio (of the step's paired rounds, with its interval)",
                    "aged / clean",
                    one=True,
                    interval=("ratio_low", "ratio_high"),
                ),
            ],
            notes=[
                "Each step: the aged file system and a copy of its tree made by fsage on a "
                "fresh file system of the same kind and size, read cold in path order "
                "(caches dropped, loop devices with direct I/O)."
            ],
            id="scan",
        ),
        Section(
            "Layout",
            figures=[
                _series_figure(rows, "layout_score", "Layout score", "layout score"),
                *(
                    [
                        _series_figure(
                            rows,
                            "dynamic_score",
                            "Dynamic layout score of the aged scan's block trace",
                            "dynamic layout score (trace)",
                        )
                    ]
                    if _has(rows, "dynamic_score")
                    else []
                ),
                _series_figure(
                    rows,
                    "modeled_dynamic_score",
                    "Modeled dynamic layout score (path order)",
                    "modeled score",
                ),
            ],
            notes=_untraced_notes(rows)
            if _has(rows, "dynamic_score")
            else ["No block traces: the study ran without --trace."],
            id="layout",
        ),
        Section(
            "Free space",
            figures=[
                _series_figure(rows, "free_share", "Free space", "share of blocks free"),
                _series_figure(rows, "largest_free_mib", "Largest free extent", "MiB"),
            ],
            notes=[
                f"{fs}: its snapshot counts free blocks but has no free-extent map (its "
                "largest free extent is not shown)."
                for fs in sorted({r["fs"] for r in rows if r["largest_free_mib"] is None})
            ],
            id="free",
        ),
        Section(
            "Modeled read time of the scan",
            figures=[
                _series_figure(
                    rows,
                    "hdd_ratio",
                    "Modeled aged/clean ratio, modern HDD",
                    "aged / clean (HDD model)",
                    one=True,
                ),
                _series_figure(
                    rows,
                    "dsp3105_ratio",
                    "Modeled aged/clean ratio, DSP 3105",
                    "aged / clean (DSP 3105 model)",
                    one=True,
                ),
                *(
                    [
                        _series_figure(
                            rows,
                            "lfs-15ms_ratio",
                            "Modeled aged/clean ratio, seed 001's 15 ms / 5 MB/s disk",
                            "aged / clean (15 ms, 5 MB/s model)",
                            one=True,
                        )
                    ]
                    if _has(rows, "lfs-15ms_ratio")
                    else []
                ),
            ],
            notes=[
                "A VM's disk is not a spinning one: the requests of each snapshot's "
                "path-order scan timed on seed 000's DSP 3105, seed 001's disks (known by "
                "their average access time and bandwidth) and a 7200 RPM HDD.",
                *(
                    []
                    if _has(rows, "lfs-15ms_ratio")
                    else ["This study was measured before seed 001's disks were modeled."]
                ),
            ],
            id="modeled",
        ),
    ]
    heads = dict(COLUMNS)
    rank_rows = []
    for name, rk in t["rank_order"].items():
        if rk["fresh"]:
            rank_rows.append(
                [
                    RANK_LABELS.get(name, name),
                    f"{rk['first_step']}: " + " < ".join(rk["fresh"]),
                    f"{rk['last_step']}: " + " < ".join(rk["aged"]),
                    _verdict_text(rk),
                ]
            )
    secs.append(
        Section(
            "Rank order, fastest first",
            tables=[Table(["by", "fresh (step)", "aged (step)", "changed"], rank_rows)],
            notes=[
                "Fresh vs aged on the same files: the clean copy made in the step against the "
                "aged tree (Geriatrix's question); and the aged tree at the first step against "
                "the last. A swap of two file systems counts as a change only where their scans' "
                "95 % intervals (t intervals of the step's rounds) lie apart both fresh and aged; "
                "where they overlap the order is the same within noise. Modeled orders have no "
                "noise.",
                *(
                    f"{f['fs']} left the study at step {f['step']}: {f['error']}"
                    for f in t["failures"]
                ),
            ],
            id="rank",
        )
    )
    secs.append(
        Section(
            "Table",
            tables=[
                Table([heads[k] for k in keys], [[r[k] for k in keys] for r in rows], caption)
                for keys, caption in (
                    (MEASURED_TABLE, "Measured on this machine"),
                    (MODELED_TABLE, "Modeled on disks beside the measured scan"),
                    (SEED001_TABLE, "Modeled on seed 001's disks (aged tree, and aged/clean)"),
                )
            ],
            notes=[
                "Modeled: the requests of each snapshot's path-order read of the aged tree and "
                "of its clean copy, timed on seed 000's DSP 3105, seed 001's disks and a "
                "modern 7200 RPM HDD."
            ],
            id="table",
        )
    )
    return secs


def study_html(row: StudyRow, path: Path | str) -> int:
    """The study's report as one self-contained HTML file, written whole ('-': standard
    output); returns the number of figures."""
    data = ReportData(
        analyses=[{"fs": r["fs"]} for r in row.results],
        trends={},
        title=f"fsage study {row.id}: {_describe(row.params)}",
    )
    secs = study_sections(row)
    write_html(path, render(data, secs))
    return sum(len(s.figures) for s in secs)
