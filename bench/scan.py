"""The scan suite against the reference tools, measured in the same run.

On an ext image (made and aged here with ``--age PROFILE``, or given with ``--image``) this
runs ``fsage bench IMAGE --suite scan`` (aged tree and clean copy, alternately) and then, on
the same image attached the same way (read-only loop device with direct I/O, remounted and
caches dropped before each read), the reads a user would time by hand:

* ``tar cf - . | cat >/dev/null`` (GNU tar in path order of its own: readdir order);
* ``find . -type f -print0 | sort -z | xargs -0 cat >/dev/null`` (path order by name).

Printed: the medians and spreads, fsage's aged scan over each reference (near 1: the scan
costs what reading the tree costs), and the aged/clean verdict. Needs root and loop devices:

    python3 bench/scan.py --age mail --size 512M --churn 1.5 --repeat 6 --workdir /tmp
    python3 bench/scan.py --image aged.img --repeat 6
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fsage.ager.images import can_loop_mount
from fsage.replay.bench.scan import ScanImage

REFERENCES = {
    "tar | cat": "tar cf - . | cat >/dev/null",
    "find | sort | cat": "find . -type f -print0 | sort -z | xargs -0 -r cat >/dev/null",
}


def fsage(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fsage", *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(__file__).resolve().parent.parent,
    )


def age(workdir: Path, profile: str, size: str, churn: float, seed: int) -> Path:
    image = workdir / f"scan-bench-{profile}.img"
    subprocess.run(["truncate", "-s", size, str(image)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-b", "4096", str(image)], check=True)
    t0 = time.perf_counter()
    p = fsage("age", str(image), "--profile", profile, "--fill", "0.7", "--churn", str(churn),
              "--seed", str(seed), "--mount")  # fmt: skip
    if p.returncode != 0:
        sys.exit(f"aging failed: {p.stderr.strip()}")
    print(f"aged {image} with {profile} in {time.perf_counter() - t0:.0f} s")
    return image


def reference(image: Path, repeat: int) -> dict[str, list[float]]:
    """Each reference command ``repeat`` times, cold, alternating between them."""
    out: dict[str, list[float]] = {k: [] for k in REFERENCES}
    img = ScanImage(image, "ext", lambda s: print(s, file=sys.stderr))
    try:
        img.mount()
        for _ in range(repeat):
            for name, cmd in REFERENCES.items():
                img.cold()
                t0 = time.perf_counter()
                subprocess.run(["sh", "-c", cmd], cwd=img.mnt, check=True)
                out[name].append(time.perf_counter() - t0)
    finally:
        img.close()
    return out


def spread(values: list[float]) -> float:
    med = statistics.median(values)
    return (max(values) - min(values)) / med if med else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--image", type=Path, help="An aged ext image to scan (kept).")
    ap.add_argument("--age", metavar="PROFILE", help="Make and age an image with this preset.")
    ap.add_argument("--size", default="512M", help="Size of the image --age makes.")
    ap.add_argument("--churn", type=float, default=1.5, help="Churn of the aging (--age).")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp"))
    ap.add_argument("--repeat", type=int, default=6, help="Rounds (6 give a 95%% interval).")
    ap.add_argument(
        "--budget", type=float, default=0.0,
        help="Seconds of further rounds until the interval is 10%% wide (0: --repeat rounds).",
    )  # fmt: skip
    args = ap.parse_args()
    if not can_loop_mount():
        sys.exit("needs root and loop devices")
    if (args.image is None) == (args.age is None):
        sys.exit("give --image or --age")
    image = args.image or age(args.workdir, args.age, args.size, args.churn, args.seed)
    print(f"load average {os.getloadavg()[0]:.1f} at the start")
    p = fsage("bench", str(image), "--suite", "scan", "--repeat", str(args.repeat), "--trace",
              "--budget", str(args.budget), "--format", "json")  # fmt: skip
    if p.returncode != 0:
        sys.exit(f"fsage bench failed: {p.stderr.strip()}")
    scan: dict[str, Any] = json.loads(p.stdout)["params"]["scan"]
    refs = reference(image, args.repeat)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    rows = [("fsage scan, aged", scan["aged"]["values"])]
    if scan.get("clean"):
        rows.append(("fsage scan, clean copy", scan["clean"]["values"]))
    rows += [(name, vals) for name, vals in refs.items()]
    mib = scan["aged"]["bytes"] / 2**20
    print(f"{scan['aged']['files']:,} files, {mib:,.1f} MiB, {args.repeat} cold reads each")
    print(f"{'read':<24} {'median s':>9} {'spread':>7} {'MiB/s':>7}")
    for name, vals in rows:
        med = statistics.median(vals)
        print(f"{name:<24} {med:9.2f} {spread(vals):7.1%} {mib / med:7.1f}")
    aged = statistics.median(scan["aged"]["values"])
    for name, vals in refs.items():
        print(f"fsage scan / {name}: {aged / statistics.median(vals):.2f}")
    verdict = scan.get("aged_clean")
    if verdict:
        ratio = verdict["ratio"]
        lo, hi = verdict.get("ci_low"), verdict.get("ci_high")
        ci = "no interval" if lo is None or hi is None else f"95% interval {lo:.3f}-{hi:.3f}"
        print(
            "aged/clean: " + ("inconclusive" if ratio is None else f"{ratio:.3f}")
            + f" (paired ratio {verdict.get('paired_ratio', 0.0):.3f}, {ci}; "
            f"{verdict['reason']}; aged slower in {verdict['aged_slower_rounds']} of "
            f"{verdict['rounds']} rounds)"
        )  # fmt: skip
    for side in ("aged", "clean"):
        tr = (scan.get(side) or {}).get("trace")
        if tr:
            print(f"traced dynamic layout score, {side}: {tr['score']:.4f}")


if __name__ == "__main__":
    main()
