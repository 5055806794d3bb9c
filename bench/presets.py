"""Measure what each write-pattern preset does to a real ext4: age a loop-mounted image
(fill to 0.8, then churn), snapshot it, then write the same files (same paths and sizes, whole,
in path order, no churn) into a fresh image made the same way and snapshot that. Prints per
preset and block size the layout score by file-size range and the free-space fragmentation of
both (needs root and loop devices).

    python3 bench/presets.py [--size-mib 2048] [--block-sizes 4096,1024] [--churn 2]
        [--presets desktop,news,vcs,database] [--churn-for news=0.5] [--out rows.jsonl]

A preset can ask for its own mke2fs usage type (``MKFS_TYPES``: news is made with ``-T news``);
the fresh image is made the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fsage.ager.images import can_loop_mount, loop_mount
from fsage.ager.posix import PosixExecutor
from fsage.ager.profile import get_preset
from fsage.ager.run import AgeOptions, age, shape_profile
from fsage.analyzer.analysis import analyze_layout
from fsage.snapshotter import read_source
from fsage.workload import Op

KIB, MIB = 1 << 10, 1 << 20
#: mke2fs usage type (``-T``) per preset. A news spool is made with mke2fs's own ``news`` type
#: (one inode per 4 KiB): with the default one per 16 KiB its ~3 KiB articles use up the inodes
#: of a 2 GiB file system at 0.43 full, and the fill can never reach 0.8.
MKFS_TYPES = {"news": "news"}
#: File-size ranges of the table (bytes, upper bound inclusive).
RANGES = ((64 * KIB, "<=64K"), (1 * MIB, "64K-1M"), (16 * MIB, "1M-16M"), (1 << 62, ">16M"))


def mkfs(path: Path, size: int, bs: int, usage: str | None = None) -> None:
    with open(path, "wb") as fh:
        fh.truncate(size)
    argv = ["mkfs.ext4", "-F", "-q", "-b", str(bs)] + (["-T", usage] if usage else [])
    subprocess.run([*argv, str(path)], check=True)


def summary(img: Path) -> dict[str, Any]:
    a = analyze_layout(read_source(img), parts=("size", "free"))
    bs = int(a["block_size"])
    contiguous = [0.0] * len(RANGES)
    pairs = [0] * len(RANGES)
    files = [0] * len(RANGES)
    for b in a["by_size"]:
        if b["layout_score"] is None:
            continue
        top = int(b["max_blocks"]) * bs
        i = next(k for k, (hi, _l) in enumerate(RANGES) if top <= hi or k == len(RANGES) - 1)
        den = int(b["blocks"]) - int(b["files"])
        contiguous[i] += float(b["layout_score"]) * den
        pairs[i] += den
        files[i] += int(b["files"])
    free = a["free_space"]
    small = sum(
        int(e["blocks"]) for e in a["free_extents"] if (int(e["max_blocks"]) + 1) * bs <= MIB
    )
    return {
        "layout_score": a["layout_score"],
        "by_range": {
            label: (None if not pairs[i] else round(contiguous[i] / pairs[i], 3), files[i])
            for i, (_hi, label) in enumerate(RANGES)
        },
        "files": a["files"],
        "free_extents": free["free_extent_count"],
        "avg_free_extent_kib": round(free["average_free_extent"] * bs / KIB, 1),
        "free_in_small_extents": round(small / max(1, free["blocks_free"]), 3),
    }


def tree(img: Path) -> tuple[list[str], list[tuple[str, int]], tuple[int, int]]:
    """The directories and (file, size) of the mounted image, and its (used, total) inodes."""
    dirs: list[str] = []
    files: list[tuple[str, int]] = []
    with loop_mount(img) as mnt:
        st = os.statvfs(mnt)
        inodes = (st.f_files - st.f_ffree, st.f_files)
        for dirpath, dirnames, filenames in os.walk(mnt):
            rel = os.path.relpath(dirpath, mnt)
            rel = "" if rel == "." else rel
            if not rel:
                dirnames[:] = [d for d in dirnames if d != "lost+found"]
            dirs.extend(f"{rel}/{d}" if rel else d for d in dirnames)
            for f in filenames:
                st = os.lstat(os.path.join(dirpath, f))
                files.append((f"{rel}/{f}" if rel else f, st.st_size))
    return sorted(dirs), sorted(files), inodes


def measure(preset: str, bs: int, size: int, churn: float, work: Path) -> dict[str, Any]:
    img = work / f"{preset}-{bs}.img"
    usage = MKFS_TYPES.get(preset)
    mkfs(img, size, bs, usage)
    prof = shape_profile(get_preset(preset), fill=0.8, churn=churn)
    t0 = time.perf_counter()
    res = age(img, AgeOptions(profile=prof, seed=1, mode="mount"))
    aged_s = time.perf_counter() - t0
    aged = summary(img)
    dirs, files, inodes = tree(img)
    for p in work.glob(img.name + ".fsage-age*"):
        p.unlink()
    img.unlink()
    fresh_img = work / f"fresh-{preset}-{bs}.img"
    mkfs(fresh_img, size, bs, usage)
    with loop_mount(fresh_img) as mnt, PosixExecutor(mnt) as ex:
        for d in dirs:
            ex.apply(Op("mkdir", d))
        for p, s in files:
            ex.apply(Op("create", p, size=s))
    fresh = summary(fresh_img)
    fresh_img.unlink()
    return {
        "preset": preset,
        "block_size": bs,
        "size_mib": size // MIB,
        "churn": churn,
        "mkfs_type": usage,
        "inodes_used_total": inodes,
        "ops": res.ops,
        "written_mib": round(res.bytes_written / MIB),
        "fullness": round(res.fullness, 3),
        "aging_s": round(aged_s, 1),
        "aged": aged,
        "fresh": fresh,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mib", type=int, default=2048)
    ap.add_argument("--block-sizes", default="4096,1024")
    ap.add_argument("--presets", default="desktop,news,vcs,database")
    ap.add_argument("--churn", type=float, default=2.0)
    ap.add_argument("--churn-for", action="append", default=[], help="PRESET=CHURN")
    ap.add_argument("--workdir", default=None, help="Where the images go (default: a tmp dir).")
    ap.add_argument("--out", type=Path, default=None, help="Append one JSON line per row.")
    args = ap.parse_args()
    if not can_loop_mount():
        sys.exit("bench/presets.py needs root and loop devices")
    churn_for = {k: float(v) for k, v in (x.split("=", 1) for x in args.churn_for)}
    work = Path(tempfile.mkdtemp(prefix="fsage-presets-", dir=args.workdir))
    try:
        for bs in (int(x) for x in args.block_sizes.split(",")):
            for preset in args.presets.split(","):
                churn = churn_for.get(preset, args.churn)
                row = measure(preset, bs, args.size_mib * MIB, churn, work)
                line = json.dumps(row, sort_keys=True)
                print(line, flush=True)
                if args.out is not None:
                    with open(args.out, "a", encoding="utf-8") as fh:
                        fh.write(line + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
