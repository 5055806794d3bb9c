"""Benchmark: the live reader against ``find DIR -type f -print0 | xargs -0 filefrag``.

Builds a loop-mounted ext4 holding ``--files`` small files (lognormal sizes, 500 per
directory), syncs it, then times both readers over the same tree. Caches are warm: each
reader runs once as a warm-up, then each (fsage with 1 and with 2 worker processes) is timed
``--rounds`` times, alternating, and the median is reported. The live reader is timed
in-process (the library call, as ``fsage snapshot`` makes it); filefrag's output goes to
/dev/null. Needs root (mount).

    sudo python3 bench/live.py --files 200000
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fsage.snapshotter.live import read_live_layout


def populate(root: Path, n: int, seed: int) -> int:
    rnd = random.Random(seed)
    total = 0
    chunk = bytes(range(256)) * 4096
    per_dir = 500
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    for i in range(n):
        if i % per_dir == 0:
            d = root / f"d{i // (per_dir * 100):03d}" / f"e{(i // per_dir) % 100:02d}"
            d.mkdir(parents=True)
            dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        size = min(int(rnd.lognormvariate(7.6, 1.4)), len(chunk))
        fd = os.open(f"f{i}", flags, 0o644, dir_fd=dfd)
        os.write(fd, chunk[:size])
        os.close(fd)
        total += size
        if i % per_dir == per_dir - 1 or i == n - 1:
            os.close(dfd)
    return total


def time_filefrag(mnt: Path) -> float:
    t = time.perf_counter()
    subprocess.run(
        f"find '{mnt}' -type f -print0 | xargs -0 filefrag > /dev/null",
        shell=True,
        check=True,
    )
    return time.perf_counter() - t


def time_fsage(mnt: Path, workers: int = 1) -> tuple[float, int, int]:
    t = time.perf_counter()
    layout = read_live_layout(mnt, workers=workers)
    el = time.perf_counter() - t
    return el, len(layout.files), int(layout.files.ext_length.shape[0])


def _runs(xs: list[float]) -> str:
    return "runs " + ", ".join(f"{x:.3f}" for x in xs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dir", type=Path, default=Path("/tmp"), help="where the image goes")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench/live.py needs root (it loop-mounts an ext4 image)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="fsage-bench-live-", dir=args.dir))
    image, mnt = work / "ext4.img", work / "mnt"
    mnt.mkdir()
    mounted = False
    try:
        size_mib = max(256, args.files * 12 // 1024 + 256)
        with open(image, "wb") as f:
            f.truncate(size_mib << 20)
        subprocess.run(
            ["mkfs.ext4", "-q", "-F", "-N", str(args.files + 50_000), str(image)], check=True
        )
        subprocess.run(["mount", "-o", "loop", str(image), str(mnt)], check=True)
        mounted = True
        t = time.perf_counter()
        total = populate(mnt, args.files, args.seed)
        os.sync()
        print(
            f"built ext4 {size_mib} MiB with {args.files} files, {total / 2**20:.0f} MiB of data"
            f" in {time.perf_counter() - t:.1f} s"
        )
        time_filefrag(mnt)  # warm-up: dentries, inodes and extent caches
        time_fsage(mnt)
        ff: list[float] = []
        fs: dict[int, list[float]] = {1: [], 2: []}
        files = extents = 0
        for _ in range(args.rounds):
            ff.append(time_filefrag(mnt))
            for workers, runs in fs.items():
                el, files, extents = time_fsage(mnt, workers)
                runs.append(el)
        f_med = statistics.median(ff)
        print(f"fsage live reader: {files} inodes, {extents} extents")
        print(f"find | xargs filefrag   : median {f_med:.3f} s  ({_runs(ff)})")
        for workers, runs in fs.items():
            s_med = statistics.median(runs)
            print(
                f"fsage live, {workers} worker(s): median {s_med:.3f} s  ({_runs(runs)})"
                f"  ratio filefrag/fsage {f_med / s_med:.2f}x (target >= 2x)"
            )
    finally:
        if mounted:
            subprocess.run(["umount", str(mnt)], check=False)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
