"""The LFS damage corpus through the mount: counts of what ``fsage lfs mount`` does with
images damaged in each metadata area (the newest checkpoint's head and usage table, segment
summaries, inode map, inode table, inode vector, directory blocks), mounted plainly and with
``--force``. Outcomes: refused (one line), same (every file reads as written), errors (some
reads fail, none wrong), wrong, traceback. The corpus and the judging are
``tests/lfs/test_lfs_damage_mount.py``'s; the test runs one mutant per area, this script many.

    PYTHONPATH=. python3 bench/lfs_damage.py [--per-area 10] [--seed 7] [-v]

Exit status 1 when any mutant gave wrong data or a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from tests.lfs.test_lfs_damage_mount import AREAS, run_corpus  # noqa: E402

OUTCOMES = ("refused", "same", "errors", "wrong", "traceback")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-area", type=int, default=10, help="mutants per area")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("-v", "--verbose", action="store_true", help="a line per mount")
    args = ap.parse_args()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fsage-lfs-damage-") as d:
        counts, bad = run_corpus(
            Path(d), args.per_area, args.seed, say=print if args.verbose else None
        )
    rows = []
    for area in AREAS:
        for mode in ("plain", "--force"):
            rows.append(
                {"area": area, "mode": mode, **{o: counts[(area, mode, o)] for o in OUTCOMES}}
            )
    print(f"{'area':<14} {'mode':<8} " + " ".join(f"{o:>9}" for o in OUTCOMES))
    for r in rows:
        print(f"{r['area']:<14} {r['mode']:<8} " + " ".join(f"{r[o]:>9}" for o in OUTCOMES))
    total = {o: sum(r[o] for r in rows) for o in OUTCOMES}
    print(f"{'all':<14} {'':<8} " + " ".join(f"{total[o]:>9}" for o in OUTCOMES))
    print(json.dumps({"per_area": args.per_area, "seed": args.seed, "total": total,
                      "seconds": round(time.perf_counter() - t0, 1)}))  # fmt: skip
    for line in bad:
        print(line, file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
