"""Where a study's time went, per file system: the measurement parts (snapshot, clean copy,
scan), the scan rounds each step took and why they stopped, the seconds the scans themselves
read against the scanning's whole time (the rest is the fixed cost of each round: unmounting,
dropping caches, mounting, an LFS server's start), and the verdicts.

    python3 bench/study_time.py --db study.db --study 1
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fsage.db.store import Store
from fsage.study.store import load_study


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", type=Path, required=True)
    ap.add_argument("--study", type=int, required=True)
    a = ap.parse_args()
    with Store.open(a.db, readonly=True) as store:
        row = load_study(store, a.study)
    by_fs: dict[str, list[dict]] = {}
    for r in row.results:
        if "error" not in r:
            by_fs.setdefault(r["fs"], []).append(r)
    print(f"study {row.id}: {row.params.get('workload')}, {row.params.get('steps')} steps")
    head = ("fs", "steps", "rounds", "per step", "scan s", "reading s", "fixed s/scan",
            "clean copy s", "snapshot s", "verdicts")  # fmt: skip
    print("  ".join(f"{h:>12}" for h in head))
    total = Counter[str]()
    for fs, rows in by_fs.items():
        rounds = sum(int(r["scan"].get("rounds") or 0) for r in rows)
        scan_s = sum(float(r["seconds"].get("scan", 0.0)) for r in rows)
        read_s = sum(sum(r["scan"]["aged_values"]) + sum(r["scan"]["clean_values"]) for r in rows)
        copy_s = sum(float(r["seconds"].get("clean_copy", 0.0)) for r in rows)
        snap_s = sum(float(r["seconds"].get("snapshot", 0.0)) for r in rows)
        verdicts = Counter(str(r["scan"].get("verdict")) for r in rows)
        fixed = (scan_s - read_s) / (2 * rounds) if rounds else 0.0
        total.update({"scan": scan_s, "read": read_s, "copy": copy_s, "snap": snap_s})
        cells = [fs, len(rows), rounds, f"{rounds / len(rows):.1f}", f"{scan_s:.0f}",
                 f"{read_s:.0f}", f"{fixed:.2f}", f"{copy_s:.0f}", f"{snap_s:.0f}",
                 ", ".join(f"{k} {v}" for k, v in sorted(verdicts.items()))]  # fmt: skip
        print("  ".join(f"{c!s:>12}" for c in cells))
        stops = Counter(str(r["scan"].get("stopped", "")).split(" (")[0] for r in rows)
        print(f"{'':>12}  stopped: " + "; ".join(f"{k} x{v}" for k, v in stops.most_common()))
        cold = [n for r in rows for n in r["scan"].get("notes", []) if "not cold" in n]
        if cold:
            print(f"{'':>12}  {len(cold)} rounds not cold, e.g. {cold[0]}")
    print(
        f"all: scan {total['scan']:.0f} s (reading {total['read']:.0f} s), clean copies "
        f"{total['copy']:.0f} s, snapshots {total['snap']:.0f} s"
    )


if __name__ == "__main__":
    main()
