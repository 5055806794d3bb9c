"""Throughput of the fsage LFS library: 1 MB sequential files, 1 KB sequential writes,
4 KB random updates, cleaning.

Reference in the same run: the same bytes written with os.pwrite to a plain file on the same
disk (the ceiling for a library that writes whole segments). Targets: >= 50 MB/s sequential,
in 1 MB files and in 1 KB writes (16 files of 1 MB, seed 003's dd case); write amplification
<= 1.2 on the 1 KB case, measured as the octets the process handed to write system calls
(``wchar`` of /proc/self/io, the checkpoint on close included) over the octets written.

    PYTHONPATH=. python3 bench/lfs.py [--dir /tmp]
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
from pathlib import Path

from fsage.lfs.fs import LFS, mkfs

MB = 1 << 20


def _wchar() -> int:
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("wchar:"):
                return int(line.split()[1])
    raise SystemExit("no wchar in /proc/self/io")


def small_writes(
    img: Path, files: int, size: int = 1024
) -> tuple[float, float, float, float, float]:
    """``files`` files of 1 MB in ``size``-octet sequential writes on a fresh image, then
    close: (MB/s, MB per CPU second, write amplification, and the same two rates through an
    os.write loop)."""
    mkfs(img, size=256 * MB, cleaning_policy="greedy")
    chunk = random.Random(3).randbytes(size)
    w0 = _wchar()
    t, c = time.perf_counter(), time.process_time()
    fs = LFS.open(img)
    for i in range(files):
        name = f"s{i}"
        fs.create(name)
        for off in range(0, MB, size):
            fs.write(name, off, chunk)
    fs.close()
    dt, cpu = time.perf_counter() - t, time.process_time() - c
    wa = (_wchar() - w0) / (files * MB)
    ref = img.with_suffix(".ref")
    fd = os.open(ref, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    t, c = time.perf_counter(), time.process_time()
    for _ in range(files * MB // size):
        os.write(fd, chunk)
    os.close(fd)
    ref_dt, ref_cpu = time.perf_counter() - t, time.process_time() - c
    ref.unlink()
    return files / dt, files / cpu, wa, files / ref_dt, files / ref_cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--files", type=int, default=64, help="1 MB files to write")
    ap.add_argument("--small-files", type=int, default=16, help="1 MB files in 1 KB writes")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        kb_rate, kb_cpu, kb_wa, kb_ref, kb_ref_cpu = small_writes(
            Path(tmp) / "small.img", args.small_files
        )
        img = Path(tmp) / "bench.img"
        mkfs(img, size=256 * MB, cleaning_policy="greedy")
        data = random.Random(1).randbytes(MB)

        fs = LFS.open(img)
        t = time.perf_counter()
        for i in range(args.files):
            fs.create(f"f{i}")
            fs.write(f"f{i}", 0, data)
        fs.sync()
        seq = args.files / (time.perf_counter() - t)

        ref = Path(tmp) / "ref.bin"
        fd = os.open(ref, os.O_RDWR | os.O_CREAT)
        t = time.perf_counter()
        for i in range(args.files):
            os.pwrite(fd, data, i * MB)
        ref_seq = args.files / (time.perf_counter() - t)
        os.close(fd)

        rng = random.Random(2)
        n = 5000
        small = data[:4096]
        t = time.perf_counter()
        for _ in range(n):
            i = rng.randrange(args.files)
            fs.write(f"f{i}", rng.randrange(256) * 4096, small)
        rnd = n * 4096 / MB / (time.perf_counter() - t)

        # Cleaning: delete every other file, then make the cleaner free 32 segments.
        for i in range(0, args.files, 2):
            fs.unlink(f"f{i}")
        fs.checkpoint()
        before = fs.counters.clean_blocks_written
        read_before = fs.counters.clean_segs_read
        t = time.perf_counter()
        freed = fs.clean_now(want=32)
        dt = time.perf_counter() - t
        moved = (fs.counters.clean_blocks_written - before) * fs.geo.block_size / MB
        read = (fs.counters.clean_segs_read - read_before) * fs.geo.segment_size / MB
        fs.close()
    print(
        f"sequential 1 MB files : {seq:8.1f} MB/s  (plain pwrite {ref_seq:8.1f} MB/s, "
        f"ratio {seq / ref_seq:.3f}; target >= 50)"
    )
    print(
        f"sequential 1 KB writes: {kb_rate:8.1f} MB/s  (plain write {kb_ref:8.1f} MB/s, "
        f"ratio {kb_rate / kb_ref:.3f}; target >= 50)\n"
        f"  per CPU second      : {kb_cpu:8.1f} MB/s  (plain write {kb_ref_cpu:8.1f} MB/s); "
        f"write amplification {kb_wa:.3f} (target <= 1.2)"
    )
    print(f"random 4 KB updates   : {rnd:8.1f} MB/s  ({n / (n * 4096 / MB / rnd):.0f} updates/s)")
    print(
        f"cleaning              : {freed} segments freed in {dt:.2f} s, read {read:.0f} MB "
        f"({read / dt if dt else 0:.1f} MB/s), rewrote {moved:.1f} MB live"
    )


if __name__ == "__main__":
    main()
