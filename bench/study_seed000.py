"""Seed 000's comparison from a study of the LFS and ext4 under one aging workload: the layout
score by file size after the last step, the scan of the aged tree against its clean copy
(measured, and modeled on seed 000's DSP 3105), beside seed 000's own figures (its Figure 5:
FFS's two-block files 0.37, eight-block files 0.74; file systems 0.84 and 0.62 whose read
performance differed by 50-75 %; aging costing FFS 10-15 %; LFS's files contiguous).

    python3 bench/study_seed000.py --db study.db --study 1 [--study 2 ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fsage.db.store import Store
from fsage.reports.study import table_row
from fsage.study.store import load_study

#: Seed 000's layout scores by file size in blocks (FFS, Figure 5 of section 4).
SEED000_BY_BLOCKS = {2: 0.37, 8: 0.74}


def _by_size(r: dict[str, Any], blocks: int) -> float | None:
    for b in r.get("by_size") or []:
        if b["min_blocks"] <= blocks <= b["max_blocks"] and b.get("layout_score") is not None:
            return float(b["layout_score"])
    return None


def _f(v: float | None, fmt: str = ".3f") -> str:
    return "-" if v is None else format(v, fmt)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", type=Path, required=True)
    ap.add_argument("--study", type=int, action="append", required=True)
    args = ap.parse_args()
    print("seed 000 (FFS, real file systems): 2-block files 0.37, 8-block 0.74; file systems "
          "0.84 vs 0.62 read 50-75 % apart; aging costs FFS 10-15 %")  # fmt: skip
    head = ("study", "fs", "step", "layout", "2-blk", "8-blk", "scan aged s/GiB", "aged/clean",
            "interval", "DSP3105 aged s", "DSP3105 a/c", "HDD a/c")  # fmt: skip
    print(" | ".join(head))
    with Store.open(args.db, readonly=True) as store:
        for sid in args.study:
            row = load_study(store, sid)
            ok = [r for r in row.results if "error" not in r]
            for fs in row.params.get("filesystems", []):
                mine = [r for r in ok if r["fs"] == fs]
                if not mine:
                    bad = [r for r in row.results if r["fs"] == fs]
                    print(f"{sid} | {fs} | - | left the study: {bad[-1]['error'] if bad else '?'}")
                    continue
                last = max(mine, key=lambda r: r["step"])
                t = table_row(last)
                cells = [str(sid), fs, str(last["step"]), _f(t["layout_score"]),
                         _f(_by_size(last, 2)), _f(_by_size(last, 8)),
                         _f(t["aged_s_per_gib"], ".1f"), _f(t["ratio"]),
                         t["ratio_interval"] or "-", _f(t["dsp3105_aged_s"], ".1f"),
                         _f(t["dsp3105_ratio"]), _f(t["hdd_ratio"])]  # fmt: skip
                print(" | ".join(cells))
            print(f"{sid}: workload {row.params.get('workload')}, "
                  f"{(row.params.get('size') or 0) >> 20} MiB")  # fmt: skip


if __name__ == "__main__":
    main()
