"""The floor under PostMark through FUSE: what any FUSE server can reach on this kernel, beside
ext4 on a loop device and fsage's LFS mount, in the same run.

The floor is ``bench/fuse_floor.c``, an in-memory file system in C over libfuse3's low-level
API with fsage's mount options and kernel caching (names, negative names and attributes kept a
day, keep_cache, no readdirplus, no auto_inval_data, no flush handler), compiled here with gcc
and ``pkg-config fuse3``. Its variants: the kernel's writeback cache off and on, max_write
128 KB (the kernel's old default) and 1 MB (libfuse's default, the most this kernel allows),
and no open/release requests at all (open answered ENOSYS). Whatever time the best variant
still takes is the kernel's FUSE path: no server does better.

PostMark is seed 003's Table 1 run (500 files, 500 transactions, 500 B–9.77 KB, 100
subdirectories, seed 42) on images in /dev/shm, every file system in each of ``--runs``
rounds (fresh images each round); medians are printed, wall and CPU (PostMark with the
kernel's work for it, plus the FUSE server's), and the requests each server saw by kind (for
fsage from one extra counted run, ``bench/lfs_requests.py``; libfuse answers forget for fsage
itself, so fsage's counts lack it).

    sudo PYTHONPATH=. python3 bench/lfs_floor.py [--runs 5]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.lfs_table1 import SECTORS, SERVER_PID, lfs_mounted, mkfs_ext4, mkfs_lfs, run_postmark
from fsage.ager.images import can_loop_mount, loop_mount
from fsage.lfs.mount import fuse_available

SOURCE = Path(__file__).with_name("fuse_floor.c")

#: Floor variants: label -> fuse_floor flags. "writeback" is fsage's own configuration.
VARIANTS = {
    "no writeback cache": (),
    "writeback": ("--writeback",),
    "writeback, max_write 128 KB": ("--writeback", "--max-write", str(128 << 10)),
    "writeback, no open/release": ("--writeback", "--no-open"),
}
#: The variant the Table 1 line reports: fsage's configuration.
SAME_AS_FSAGE = "writeback"


def build_floor(dest: Path) -> Path:
    """Compile fuse_floor.c into ``dest``; the binary's path."""
    flags = subprocess.run(
        ["pkg-config", "--cflags", "--libs", "fuse3"], capture_output=True, text=True, check=True
    ).stdout.split()
    binary = dest / "fuse_floor"
    subprocess.run(["gcc", "-O2", "-o", str(binary), str(SOURCE), *flags], check=True)
    return binary


@contextlib.contextmanager
def floor_mounted(binary: Path, flags: tuple[str, ...], result: dict[str, Any]) -> Iterator[Path]:
    """The floor mounted on a fresh directory; on exit unmounted, and what it printed (the
    requests by kind, the negotiated sizes) put into ``result``."""
    mp = Path(tempfile.mkdtemp(prefix="fsage-floor-mnt-"))
    proc = subprocess.Popen(
        [str(binary), *flags, str(mp), "fsname=floor,subtype=floor"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 10
        while not os.path.ismount(mp):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"fuse_floor did not mount (exit {proc.poll()})")
            time.sleep(0.01)
        SERVER_PID[mp] = proc.pid
        yield mp
    finally:
        SERVER_PID.pop(mp, None)
        subprocess.run(["fusermount3", "-u", str(mp)], check=False, capture_output=True)
        out, _ = proc.communicate(timeout=30)
        if out.strip():
            result.update(json.loads(out.strip().splitlines()[-1]))
        with contextlib.suppress(OSError):
            mp.rmdir()


def floor_postmark(binary: Path, flags: tuple[str, ...]) -> dict[str, Any]:
    """PostMark on a fresh floor mount: run_postmark's figures plus the floor's requests."""
    served: dict[str, Any] = {}
    with floor_mounted(binary, flags, served) as mp:
        res = run_postmark(mp)
    res.update(served)
    return res


def fsage_postmark(tmp: Path) -> dict[str, Any]:
    img = tmp / "lfs.disk"
    mkfs_lfs(img, SECTORS)
    try:
        with lfs_mounted(img) as mp:
            return run_postmark(mp)
    finally:
        img.unlink()


def ext4_postmark(tmp: Path) -> dict[str, Any]:
    img = tmp / "ext4.disk"
    mkfs_ext4(img, SECTORS)
    try:
        with loop_mount(img) as mp:
            return run_postmark(mp)
    finally:
        img.unlink()


def _median(rows: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--no-fsage", action="store_true", help="only ext4 and the floor")
    args = ap.parse_args()
    why = fuse_available()
    if why is not None or not can_loop_mount() or shutil.which("postmark") is None:
        raise SystemExit(f"needs FUSE, root with loop devices and postmark ({why or 'ok'})")
    if shutil.which("gcc") is None or shutil.which("pkg-config") is None:
        raise SystemExit("needs gcc and pkg-config (libfuse3-dev)")
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    rows: dict[str, list[dict[str, Any]]] = {"ext4": [], **{v: [] for v in VARIANTS}}
    if not args.no_fsage:
        rows["fsage LFS"] = []
    with tempfile.TemporaryDirectory(prefix="fsage-floor-", dir=shm) as t:
        tmp = Path(t)
        binary = build_floor(tmp)
        print(f"load average before: {os.getloadavg()[0]:.2f}", flush=True)
        for _ in range(args.runs):
            rows["ext4"].append(ext4_postmark(tmp))
            for label, flags in VARIANTS.items():
                rows[label].append(floor_postmark(binary, flags))
            if not args.no_fsage:
                rows["fsage LFS"].append(fsage_postmark(tmp))
        counted: dict[str, int] = {}
        if not args.no_fsage:
            from bench.lfs_requests import lfs_run

            counted = lfs_run(tmp)["requests"]
        print(f"load average after: {os.getloadavg()[0]:.2f}")
    print_report(rows, counted, args.runs)


def print_report(
    rows: dict[str, list[dict[str, Any]]], fsage_counts: dict[str, int], runs: int
) -> None:
    ext_wall, ext_cpu = _median(rows["ext4"], "wall"), _median(rows["ext4"], "cpu")
    print(
        "\nPostMark (seed 003: 500 files, 500 transactions, 100 subdirectories), images in "
        f"/dev/shm; medians of {runs} runs"
    )
    head = ("", "wall s", "x ext4", "CPU s", "x ext4", "server CPU", "requests", "us/req")
    print("{:34} {:>7} {:>7} {:>7} {:>7} {:>10} {:>9} {:>7}".format(*head))
    for label, rs in rows.items():
        wall, cpu = _median(rs, "wall"), _median(rs, "cpu")
        srv = _median(rs, "server_cpu")
        reqs = rs[-1].get("requests")
        n = sum(reqs.values()) if reqs else (sum(fsage_counts.values()) if label != "ext4" else 0)
        name = "floor: " + label if label in VARIANTS else label
        print(
            f"{name:34} {wall:7.3f} {wall / ext_wall:7.1f} {cpu:7.3f} {cpu / ext_cpu:7.1f} "
            f"{srv if label != 'ext4' else 0:10.3f} {n or '-':>9} "
            f"{(srv / n * 1e6) if n else 0:7.1f}"
        )
    floor = rows[SAME_AS_FSAGE]
    best = min(VARIANTS, key=lambda v: _median(rows[v], "wall"))
    fw = _median(floor, "wall")
    print(
        f"\nany FUSE server ({SAME_AS_FSAGE}, fsage's configuration): {fw:.3f} s = "
        f"{fw / ext_wall:.1f} x ext4; best variant ({best}): "
        f"{_median(rows[best], 'wall'):.3f} s = {_median(rows[best], 'wall') / ext_wall:.1f} x ext4"
    )
    if "fsage LFS" in rows:
        lw, lc = _median(rows["fsage LFS"], "wall"), _median(rows["fsage LFS"], "cpu")
        print(
            f"fsage LFS: {lw:.3f} s = {lw / ext_wall:.1f} x ext4 = {lw / fw:.1f} x the floor "
            f"(CPU {lc / _median(floor, 'cpu'):.1f} x the floor's)"
        )
    kinds: dict[str, dict[str, int]] = {v: rows[v][-1].get("requests", {}) for v in VARIANTS}
    if fsage_counts:
        kinds["fsage LFS"] = fsage_counts
    names = sorted(
        {k for c in kinds.values() for k in c}, key=lambda k: -kinds[SAME_AS_FSAGE].get(k, 0)
    )
    print("\nrequests by kind (last run)")
    print(f"{'':12}" + "".join(f"{label[:18]:>20}" for label in kinds))
    for k in names:
        print(f"{k:12}" + "".join(f"{c.get(k, 0) or '-':>20}" for c in kinds.values()))
    sizes = rows[SAME_AS_FSAGE][-1]
    print(
        f"negotiated: max_write {sizes.get('max_write')}, max_readahead "
        f"{sizes.get('max_readahead')}, max_read {sizes.get('max_read')} (0: no limit)"
    )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
