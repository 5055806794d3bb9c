"""Summarize an aging study for Conway's question: does the aged/clean scan ratio rise with
steps, per file system, measured on this machine and modeled on a spinning disk?

For each file system: the ratio and dynamic layout score per step, and the trend of the
measured ratio, the modeled HDD and DSP 3105 ratios and the layout score against step
(Spearman's rank correlation and a least-squares slope per 10 steps; with the share of steps
whose measured ratio was decided). Then where the study's time went (age, snapshot, clean copy,
scan) and the rank orders fresh vs aged.

    python3 bench/study_trend.py --db study.db --study 1 [--per-step]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fsage.db.store import Store
from fsage.reports.study import RANK_LABELS, study_table
from fsage.study.store import load_study


def spearman(x: list[float], y: list[float]) -> float | None:
    if len(x) < 3:
        return None
    rx = np.argsort(np.argsort(x)).astype(float)
    ry = np.argsort(np.argsort(y)).astype(float)
    if rx.std() == 0 or ry.std() == 0:
        return None
    return float(np.corrcoef(rx, ry)[0, 1])


def slope10(x: list[float], y: list[float]) -> float | None:
    if len(x) < 2:
        return None
    return float(np.polyfit(x, y, 1)[0]) * 10


def trend(rows: list[dict[str, Any]], key: str) -> str:
    pts = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
    xs, ys = [float(p[0]) for p in pts], [float(p[1]) for p in pts]
    rho, sl = spearman(xs, ys), slope10(xs, ys)
    if rho is None or sl is None:
        return f"{key}: too few steps"
    return f"{key}: first {ys[0]:.3f} last {ys[-1]:.3f} rho {rho:+.2f} slope/10 steps {sl:+.3f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", type=Path, required=True)
    ap.add_argument("--study", type=int, default=1)
    ap.add_argument("--per-step", action="store_true", help="print every step's row")
    args = ap.parse_args()
    with Store.open(args.db, readonly=True) as store:
        row = load_study(store, args.study)
    t = study_table(row)
    rows = t["rows"]
    for fs in row.params.get("filesystems", []):
        mine = sorted((r for r in rows if r["fs"] == fs), key=lambda r: r["step"])
        if not mine:
            continue
        decided = sum(1 for r in mine if r["verdict"] in ("slower", "faster", "same"))
        print(f"== {fs}: {len(mine)} steps, {decided} with a decided aged/clean verdict")
        for key in ("ratio", "hdd_ratio", "dsp3105_ratio", "layout_score", "dynamic_score"):
            print("  " + trend(mine, key))
        if args.per_step:
            for r in mine:
                dyn = "-" if r["dynamic_score"] is None else f"{r['dynamic_score']:.3f}"
                print(
                    f"  step {r['step']:3d} ratio {r['ratio']:.3f} "
                    f"[{r['ratio_interval'] or '-'}] {r['verdict']:12s} dyn {dyn} "
                    f"layout {r['layout_score']:.3f} hdd {r['hdd_ratio']:.3f} "
                    f"s/GiB {r['aged_s_per_gib']:.1f}"
                )
    parts: dict[str, float] = {}
    for r in row.results:
        for k, v in (r.get("seconds") or {}).items():
            parts[k] = parts.get(k, 0.0) + float(v)
        parts["age"] = parts.get("age", 0.0) + float((r.get("age") or {}).get("seconds") or 0.0)
    print("seconds by part (summed over steps and file systems): "
          + ", ".join(f"{k} {v:.0f}" for k, v in sorted(parts.items())))  # fmt: skip
    for name, rk in t["rank_order"].items():
        if rk["fresh"]:
            change = "changed" if rk["changed"] else "same"
            print(f"rank, {RANK_LABELS.get(name, name)}: {' < '.join(rk['fresh'])} -> "
                  f"{' < '.join(rk['aged'])} ({change})")  # fmt: skip
    for f in t["failures"]:
        print(f"{f['fs']} left the study at step {f['step']}: {f['error']}")


if __name__ == "__main__":
    main()
