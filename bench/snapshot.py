#!/usr/bin/env python3
"""Snapshot speed and size against e2fsprogs, measured in the same run.

Builds (or reuses, under bench/.cache/) an ext4 image with FILES files of lognormal sizes and
prints:
  full snapshot time / e2fsck -fn time            (target <= 3)
  incremental snapshot (1% changed) / e2fsck -fn   (target <= 1.5)
  find | xargs filefrag over every file / full snapshot   (target >= 5; needs root to mount)
  database bytes per file, peak memory of the snapshot process (target < 1 GiB)

Every timing is the best of --repeat warm runs (the image is read once first so that all tools
see the same page cache; see cache_as_read).

Usage: python3 bench/snapshot.py [--files 500000] [--repeat 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / "bench" / ".cache"
sys.path.insert(0, str(REPO))


def run_timed(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, int]:
    """Wall seconds and peak RSS (bytes) of a command; raises if it fails."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - t0
    code = os.waitstatus_to_exitcode(status)
    # e2fsck -n exits 4 when it finds (harmless) uncorrected things such as a dirty fs
    if code not in (0, 4) or (code == 4 and argv[0] != "e2fsck"):
        err = proc.stderr.read().decode() if proc.stderr else ""
        raise SystemExit(f"{argv[0]} failed ({code}): {err.strip()}")
    return elapsed, usage.ru_maxrss * 1024


def best(argv: list[str], repeat: int, env: dict[str, str] | None = None) -> tuple[float, int]:
    runs = [run_timed(argv, env) for _ in range(repeat)]
    return min(r[0] for r in runs), max(r[1] for r in runs)


def cache_as_read(image: Path) -> None:
    """Leave the whole image in the page cache as reading it leaves it, for every tool alike.

    Pages that were just written (the copy, debugfs's changes) stay small pages; pages read
    back are cached in large folios, which read back about a third faster. Without this the
    first tools to run after a copy are timed on a cache state no long-lived image has.
    """
    os.sync()
    fd = os.open(image, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    subprocess.run(["cat", str(image)], stdout=subprocess.DEVNULL, check=True)


def build_image(files: int, seed: int) -> Path:
    image = CACHE / f"ext4-{files}-{seed}.img"
    if image.exists():
        return image
    CACHE.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    # Lognormal sizes (median ~1.1 KiB, long tail), capped, so 500k files fit in a few GiB.
    sizes = np.minimum(rng.lognormal(7.0, 1.6, files).astype(np.int64), 4 << 20)
    print(f"building {files} files ({sizes.sum() / 2**30:.2f} GiB) ...", file=sys.stderr)
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        root = Path(tmp)
        payload = random.Random(seed).randbytes(4 << 20)
        for i, size in enumerate(sizes.tolist()):
            d = root / f"d{i // 1000:04d}"
            if i % 1000 == 0:
                d.mkdir()
            with open(d / f"f{i:07d}", "wb") as fh:
                fh.write(payload[:size])
        total = int(sizes.sum())
        image_mib = int(total * 1.5) // (1 << 20) + 1024
        part = image.with_suffix(".part")
        subprocess.run(
            ["mke2fs", "-q", "-F", "-t", "ext4", "-N", str(files + 50_000), "-d", str(root),
             str(part), f"{image_mib}M"],
            check=True,
        )  # fmt: skip
        part.rename(image)
    return image


def change_one_percent(image: Path, files: int, seed: int, workdir: Path) -> None:
    """Delete 0.5% of the files and add as many new ones, offline through debugfs."""
    rng = random.Random(seed)
    n = max(files // 200, 1)
    victims = rng.sample(range(files), n)
    blob = workdir / "new.bin"
    blob.write_bytes(random.Random(seed).randbytes(6000))
    cmds = [f"write {blob} /d{i // 1000:04d}/new{i:07d}" for i in range(n)]
    cmds += [f"rm /d{i // 1000:04d}/f{i:07d}" for i in victims]
    script = workdir / "changes.cmds"
    script.write_text("\n".join(cmds) + "\n")
    subprocess.run(["debugfs", "-w", "-f", str(script), str(image)], check=True,
                   capture_output=True)  # fmt: skip


def filefrag_time(image: Path, repeat: int) -> float | None:
    if os.geteuid() != 0 or not Path("/dev/loop-control").exists():
        return None
    mnt = Path(tempfile.mkdtemp(prefix="fsage-bench-"))
    try:
        subprocess.run(["mount", "-o", "loop,ro", str(image), str(mnt)], check=True)
        try:
            cmd = f"find {mnt} -type f -print0 | xargs -0 filefrag > /dev/null"
            return best(["sh", "-c", cmd], repeat)[0]
        finally:
            subprocess.run(["umount", str(mnt)], check=True)
    finally:
        mnt.rmdir()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", type=int, default=500_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args()

    base = build_image(args.files, args.seed)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        work = Path(tmp)
        image = work / "work.img"
        shutil.copyfile(base, image)  # the incremental step modifies it
        # Flush the copy's gigabytes now (otherwise the snapshots' fsync waits behind them)
        # and read them back.
        cache_as_read(image)
        fsck, _ = best(["e2fsck", "-fn", str(image)], args.repeat)

        full_times = []
        peak = 0
        for i in range(args.repeat):
            db = work / f"full{i}.db"
            t, rss = run_timed(
                [sys.executable, "-m", "fsage", "snapshot", str(image), "--db", str(db)], env
            )
            full_times.append(t)
            peak = max(peak, rss)
        full = min(full_times)
        db = work / "full0.db"
        with sqlite3.connect(db) as con:
            n_files = int(con.execute("SELECT files FROM snapshots").fetchone()[0])
        db_bytes = db.stat().st_size + sum(
            p.stat().st_size for p in work.glob("full0.db-*") if p.exists()
        )

        change_one_percent(image, args.files, args.seed, work)
        cache_as_read(image)
        fsck2, _ = best(["e2fsck", "-fn", str(image)], args.repeat)
        inc_times = []
        for i in range(args.repeat):
            inc_db = work / f"inc{i}.db"
            shutil.copyfile(db, inc_db)
            t, rss = run_timed(
                [sys.executable, "-m", "fsage", "snapshot", str(image), "--db", str(inc_db)], env
            )
            inc_times.append(t)
            peak = max(peak, rss)
        inc = min(inc_times)
        frag = filefrag_time(image, 1)

    figures = {
        "files": n_files,
        "e2fsck_s": round(fsck, 3),
        "full_snapshot_s": round(full, 3),
        "full_over_e2fsck": round(full / fsck, 2),
        "incremental_snapshot_s": round(inc, 3),
        "incremental_over_e2fsck": round(inc / fsck2, 2),
        "filefrag_s": None if frag is None else round(frag, 3),
        "filefrag_over_full": None if frag is None else round(frag / full, 1),
        "db_bytes_per_file": round(db_bytes / max(n_files, 1), 1),
        "peak_rss_mib": round(peak / 2**20, 1),
    }
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    print(f"files:                                 {n_files}")
    print(f"e2fsck -fn:                            {fsck:.2f} s")
    print(f"full snapshot:                         {full:.2f} s   = {full / fsck:.2f}x e2fsck"
          "   (target <= 3)")  # fmt: skip
    print(f"incremental snapshot (1% changed):     {inc:.2f} s   = {inc / fsck2:.2f}x e2fsck"
          "   (target <= 1.5)")  # fmt: skip
    if frag is None:
        print("find | xargs filefrag:                 skipped (needs root and loop devices)")
    else:
        print(f"find | xargs filefrag:                 {frag:.2f} s   = {frag / full:.1f}x the "
              "full snapshot   (target >= 5)")  # fmt: skip
    print(f"database bytes per file:               {db_bytes / max(n_files, 1):.0f}")
    print(f"peak memory of a snapshot:             {peak / 2**20:.0f} MiB   (target < 1024)")


if __name__ == "__main__":
    main()
