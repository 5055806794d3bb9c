"""Seed 001 Figure 5-4: overall write cost of cleaning, hole-plugging and adaptive for the
random-update workload (256 KB segments, 8 KB blocks, 15 ms access, 5 MB/s, greedy).

Expected shape (seed 001 §5.4.1): cleaning beats hole-plugging up to about 85% utilization;
at 99% cleaning is above 50 and hole-plugging below 15; adaptive follows the cheaper.

    PYTHONPATH=. python3 bench/lfs_cleaning.py [--segments 512]
"""

from __future__ import annotations

import argparse
import time

from fsage.lfs.sim import random_update

UTILIZATIONS = (0.50, 0.60, 0.70, 0.75, 0.80, 0.85, 0.90, 0.95, 0.97, 0.99)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--segments", type=int, default=512, help="disk size in 256 KB segments")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    print(f"random update, {args.segments} x 256 KB segments, 8 KB blocks, 15 ms / 5 MB/s")
    print(f"{'util':>5} {'cleaning':>9} {'hole-plug':>9} {'adaptive':>9} {'cheaper':>9}  secs")
    for u in UTILIZATIONS:
        t = time.perf_counter()
        costs = [
            random_update(u, m, segments=args.segments, seed=args.seed).metrics[
                "overall_write_cost"
            ]
            for m in ("clean", "holeplug", "adaptive")
        ]
        cheaper = "cleaning" if costs[0] <= costs[1] else "hole-plug"
        print(
            f"{u:5.2f} {costs[0]:9.2f} {costs[1]:9.2f} {costs[2]:9.2f} {cheaper:>9}"
            f"  {time.perf_counter() - t:4.1f}"
        )


if __name__ == "__main__":
    main()
