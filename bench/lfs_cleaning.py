"""Seed 001 Figure 5-4: overall write cost of cleaning, hole-plugging and adaptive for the
random-update workload (256 KB segments, 8 KB blocks, 15 ms access, 5 MB/s, greedy).

Two runs of the same workload, side by side:

- sim: the segment-level simulator (``fsage.lfs.sim.random_update``), data blocks only, like
  the thesis's simulator; U from 50% to 99%.
- LFS: the file system itself (``fsage.lfs.sim.random_update_lfs``) on an image, smaller (256
  segments, 64 MB, by default) and at fewer U points: every block the log writes counts
  (indirect and inode-table blocks too), cleaned segments are read whole (no cache). The LFS
  keeps max(4, 2% of the log) + 2 segments clean in reserve, so it cannot hold data at 99%:
  such points print "full". On small images that reserve is a large share of the free
  space, few holes are left outside it and hole-plugging (hence adaptive) has little to
  work with: use at least 256 segments.

Expected shape (seed 001 §5.4.1): cleaning beats hole-plugging up to about 85% utilization;
at 99% cleaning is above 50 and hole-plugging below 15; adaptive follows the cheaper.

Where the simulator differs from the thesis's figure, and why (measured with this script's
simulator, overall write cost of greedy cleaning / hole-plugging):

- Cleaning at 99% depends on the simulated disk's size: 69.5 on 512 segments, 61.7 on 2,048
  (thesis: 64.5). The log keeps two segments clean (one for new data, one for the cleaner's
  output); at 99% the whole free space is 5 segments on 512 and 20 on 2,048, so the reserve
  raises the utilization of the segments left to clean to 0.994 on the small disk (0.992 were
  one segment held).
  The thesis does not give its disk size.
- The crossover stays between 0.80 and 0.85 under every change tried: seeds 1 and 2, 10 or 20
  updates per block, cleaning 1, 2 or 8 segments at a time, the cleaner writing whole output
  segments instead of one request per pass, 512 or 2,048 segments, a sync every 4 or every 32
  writes. At 0.85 cleaning costs 10.5-10.9 and hole-plugging 9.8-10.0 (sync every 4). The
  thesis has cleaning below 10 there. About 3.3 of the cleaning figure is the new data
  alone: a sync every fourth 8 KB write is a 32 KB request that pays a whole 15 ms access.
  Pricing a plugged block lower (the thesis describes one seek per target segment and half a
  rotation per block; this model charges a full access per block) would make hole-plugging
  cheaper and move the crossover earlier, not later. What makes cleaning dearer here than in
  the thesis at 0.85 is not found among the parameters above; the thesis gives no figures
  for its pricing of partial segment writes, the likeliest place for the difference.

    PYTHONPATH=. python3 bench/lfs_cleaning.py [--segments 512] [--lfs-segments 256]
    PYTHONPATH=. python3 bench/lfs_cleaning.py --no-lfs

Seed 001 Figure 5-3 (``--figure 5-3``): overall write cost of greedy cleaning against segment
size (8 KB to 1 MB) on a simulated disk of fixed size at 85% utilization. Expected (§5.2.2):
lowest for single-block (8 KB) segments, where every segment empties on its own and no
cleaning is needed; above one block, little benefit from smaller segments.

    PYTHONPATH=. python3 bench/lfs_cleaning.py --figure 5-3 [--disk-mb 32]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from fsage.lfs.format import LfsNoSpace
from fsage.lfs.sim import random_update, random_update_lfs

UTILIZATIONS = (0.50, 0.60, 0.70, 0.75, 0.80, 0.85, 0.90, 0.95, 0.97, 0.99)
LFS_UTILIZATIONS = (0.50, 0.70, 0.80, 0.85, 0.90, 0.93, 0.95, 0.99)
MECHANISMS = ("clean", "holeplug", "adaptive")

Row = dict[str, float | None]


def _cheaper(costs: Row) -> str:
    c, h = costs["clean"], costs["holeplug"]
    if c is None or h is None:
        return "-"
    return "cleaning" if c <= h else "hole-plug"


def _fmt(v: float | None) -> str:
    return f"{v:9.2f}" if v is not None else f"{'full':>9}"


def _check(name: str, rows: dict[float, Row]) -> list[str]:
    """The expected shape, point by point; returns the lines to print."""
    out = []
    pts = sorted(u for u, r in rows.items() if r["clean"] is not None and r["holeplug"] is not None)
    if not pts:
        return [f"{name}: no point where both mechanisms ran"]
    clean_wins = [u for u in pts if rows[u]["clean"] <= rows[u]["holeplug"]]  # type: ignore[operator]
    hp_wins = [u for u in pts if u not in clean_wins]
    last_clean = max(clean_wins) if clean_wins else None
    first_hp = min(hp_wins) if hp_wins else None
    out.append(
        f"{name}: cleaning cheaper up to {last_clean if last_clean is not None else '-'}; "
        f"hole-plugging cheaper from {first_hp if first_hp is not None else '-'} "
        "(seed 001: crossover about 0.85)"
    )
    top = max(pts)
    c, h = rows[top]["clean"], rows[top]["holeplug"]
    assert c is not None and h is not None
    ok99 = c > 50 and h < 15
    out.append(
        f"{name}: at {top:.2f} cleaning {c:.1f}, hole-plugging {h:.1f} "
        f"(seed 001 at 0.99: cleaning > 50 [64.5], hole-plugging < 15)"
        + (": as expected" if top >= 0.99 and ok99 else "")
    )
    worst = 0.0
    for u in pts:
        a = rows[u]["adaptive"]
        if a is None:
            continue
        cheaper = min(rows[u]["clean"], rows[u]["holeplug"])  # type: ignore[type-var]
        worst = max(worst, a / cheaper)  # type: ignore[operator]
    out.append(f"{name}: adaptive / cheaper mechanism, worst point: {worst:.3f}")
    return out


SEGMENT_KB = (8, 16, 32, 64, 128, 256, 512, 1024)


def figure_5_3(disk_mb: int, utilization: float, updates_per_block: int, seed: int) -> None:
    t = time.perf_counter()
    rows = []
    for kb in SEGMENT_KB:
        seg = kb * 1024
        r = random_update(
            utilization,
            "clean",
            segments=(disk_mb << 20) // seg,
            segment_size=seg,
            updates_per_block=updates_per_block,
            seed=seed,
        )
        rows.append((kb, r.metrics["write_cost"], r.metrics["overall_write_cost"]))
    print(
        f"random update at U={utilization:g}, {disk_mb} MB simulated disk, 8 KB blocks, "
        f"15 ms / 5 MB/s, greedy cleaning; {updates_per_block} updates per block "
        f"({time.perf_counter() - t:.0f} s)"
    )
    print(f"{'segment':>8} | {'write cost':>10} {'overall':>9}")
    for kb, wc, owc in rows:
        print(f"{kb:>6}KB | {wc:10.2f} {owc:9.2f}")
    best = min(rows, key=lambda r: r[2])[0]
    print(
        f"lowest overall write cost at {best} KB segments (seed 001: 8 KB, single-block segments)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--figure", choices=("5-3", "5-4"), default="5-4")
    ap.add_argument("--disk-mb", type=int, default=32, help="Figure 5-3: simulated disk size")
    ap.add_argument("--segments", type=int, default=512, help="simulated disk, 256 KB segments")
    ap.add_argument("--lfs-segments", type=int, default=256, help="LFS image, 256 KB segments")
    ap.add_argument(
        "--lfs-utilizations",
        default=",".join(f"{u:g}" for u in LFS_UTILIZATIONS),
        help="comma-separated U points for the LFS run",
    )
    ap.add_argument("--no-lfs", action="store_true", help="only the simulator")
    ap.add_argument("--updates-per-block", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where the LFS image goes")
    args = ap.parse_args()
    if args.figure == "5-3":
        figure_5_3(args.disk_mb, 0.85, args.updates_per_block, args.seed)
        return

    sim: dict[float, Row] = {}
    lfs: dict[float, Row] = {}
    lfs_util: dict[float, float] = {}
    lfs_u = () if args.no_lfs else tuple(float(x) for x in args.lfs_utilizations.split(","))
    t_sim = t_lfs = 0.0
    for u in sorted(set(UTILIZATIONS) | set(lfs_u)):
        if u in UTILIZATIONS:
            t = time.perf_counter()
            sim[u] = {
                m: random_update(
                    u,
                    m,
                    segments=args.segments,
                    updates_per_block=args.updates_per_block,
                    seed=args.seed,
                ).metrics["overall_write_cost"]
                for m in MECHANISMS
            }
            t_sim += time.perf_counter() - t
        if u in lfs_u:
            t = time.perf_counter()
            row: Row = {}
            with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
                for m in MECHANISMS:
                    try:
                        r = random_update_lfs(
                            u,
                            m,
                            Path(tmp) / "fig54.img",
                            segments=args.lfs_segments,
                            updates_per_block=args.updates_per_block,
                            seed=args.seed,
                        )
                    except LfsNoSpace:
                        row[m] = None
                    else:
                        row[m] = r.metrics["overall_write_cost"]
                        lfs_util[u] = r.utilization
            lfs[u] = row
            t_lfs += time.perf_counter() - t

    print(
        "random update, 256 KB segments, 8 KB blocks, 15 ms / 5 MB/s; overall write cost "
        f"(EQ 4-6); {args.updates_per_block} updates per block, sync every 4th write"
    )
    print(
        f"sim: {args.segments} segments ({t_sim:.0f} s)"
        + ("" if args.no_lfs else f";  LFS: {args.lfs_segments}-segment image ({t_lfs:.0f} s)")
    )
    head = f"{'util':>5} | {'cleaning':>9} {'hole-plug':>9} {'adaptive':>9} {'cheaper':>9}"
    if not args.no_lfs:
        head += f" | {'cleaning':>9} {'hole-plug':>9} {'adaptive':>9} {'cheaper':>9} {'live':>6}"
    print(f"{'':5} | {'sim':^39}" + ("" if args.no_lfs else f" | {'LFS':^46}"))
    print(head)
    for u in sorted(set(sim) | set(lfs)):
        line = f"{u:5.2f} |"
        if u in sim:
            s = sim[u]
            line += " " + " ".join(_fmt(s[m]) for m in MECHANISMS) + f" {_cheaper(s):>9}"
        else:
            line += " " + " ".join(f"{'':>9}" for _ in range(4))
        if not args.no_lfs:
            line += " |"
            if u in lfs:
                lr = lfs[u]
                live = lfs_util.get(u)
                line += " " + " ".join(_fmt(lr[m]) for m in MECHANISMS) + f" {_cheaper(lr):>9}"
                line += f" {live:6.3f}" if live is not None else f" {'-':>6}"
        print(line)
    print()
    for text in _check("sim", sim):
        print(text)
    if not args.no_lfs:
        for text in _check("LFS", lfs):
            print(text)


if __name__ == "__main__":
    main()
