"""How often does `fsage age --match` stall short of a fragmented ext4 target?

Builds ``--targets`` targets the way tests/ager/test_match.py does (a 512 MiB ext4 image on a
loop device, filled to 0.7 by a fragmenting workload: small files allocated a block at a time
four by four, larger files whole, 30% of the larger ones deleted; the kernel's allocator makes
each target different), reads each offline, and matches a fresh image of the same size to it
with ``--seeds`` seeds each. Prints per target how many seeds matched, then the runs that
stalled (their reason and free-space distance) and the totals. The test needs one of two seeds
to match a target.

Needs root and loop devices:

    python3 bench/match_stalls.py --targets 50 --seeds 2 --dir /tmp
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from fsage.ager.images import loop_mount, make_image  # noqa: E402
from fsage.ager.match import match_layout, target_from_layout  # noqa: E402
from fsage.snapshotter import read_source  # noqa: E402
from tests.ager.test_match import _fragment  # noqa: E402  (the test's own workload)

MIB = 1 << 20


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--targets", type=int, default=20, help="fragmented targets to build")
    ap.add_argument("--seeds", type=int, default=2, help="matcher seeds per target")
    ap.add_argument("--dir", default=None, help="where the images go (default: $TMPDIR)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fsage-bench-match-", dir=args.dir))
    runs = stalls = both = 0
    t0 = time.perf_counter()
    try:
        for t in range(args.targets):
            src = make_image(work / "target.img", "ext4", 512 * MIB)
            with loop_mount(src) as mnt:
                _fragment(mnt, 0.7, seed=3)
            target = target_from_layout(read_source(src), f"target {t}")
            src.unlink()
            matched = 0
            for seed in range(1, args.seeds + 1):
                img = make_image(work / "aged.img", "ext4", 512 * MIB)
                res = match_layout(img, target, seed=seed, time_limit=1500.0)
                img.unlink()
                runs += 1
                if res.matched:
                    matched += 1
                    continue
                stalls += 1
                tv = res.closest.get("free_tv")
                print(
                    f"  target {t} seed {seed}: NOT matched ({res.stop}); closest free-space "
                    f"distance {tv if tv is None else f'{tv:.3f}'}, {res.rounds} rounds"
                )
            both += matched == 0
            print(f"target {t}: {matched} of {args.seeds} seeds matched", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"{stalls} of {runs} runs stalled; {both} of {args.targets} targets matched by no seed "
        f"({time.perf_counter() - t0:.0f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
