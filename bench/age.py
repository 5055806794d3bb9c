"""Benchmark the ager: mounted executor on a loop-mounted ext4 with hfs-surge (ops/s, MB/s,
share of wall time in fsage's own Python vs system calls), and the offline executor's ops/s.

fsage's overhead is measured by running the same op stream through a null executor (all of
fsage's work, no system calls) and comparing with the mounted run; target: <= 30% of wall.

    python3 bench/age.py [--size-mib 512] [--churn 1.0]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import contextlib

from fsage.ager.generator import Generator
from fsage.ager.images import can_loop_mount, make_image, test_fs
from fsage.ager.posix import PosixExecutor
from fsage.ager.profile import get_preset
from fsage.workload import Executor, NoSpaceError, Op, read_workload, write_workload


class NullExecutor(Executor):
    description = "null"

    def apply(self, op: Op) -> int:
        return op.size if op.op in ("create", "append", "overwrite") else 0

    def capacity_blocks(self) -> tuple[int, int, int]:
        return 4096, 1, 0


def run(ex: Executor, ops_file: Path) -> tuple[int, int, float]:
    _h, ops = read_workload(ops_file)
    n = written = 0
    t0 = time.perf_counter()
    for op in ops:
        with contextlib.suppress(NoSpaceError):
            written += ex.apply(op)
        n += 1
    if isinstance(ex, PosixExecutor):
        ex.sync()
    return n, written, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mib", type=int, default=512)
    ap.add_argument("--churn", type=float, default=1.0)
    args = ap.parse_args()
    size = args.size_mib << 20
    with tempfile.TemporaryDirectory(prefix="fsage-bench-") as tmp:
        tmpd = Path(tmp)
        ops_file = tmpd / "ops.jsonl"
        prof = get_preset("hfs-surge").with_overrides(fill=0.8, churn=args.churn)
        t0 = time.perf_counter()
        # Capacity as statvfs will report it for this image (ext4 keeps ~5% for metadata).
        gen = Generator(prof, 1, int(size * 0.93))
        count = write_workload(ops_file, gen.header(), gen.ops())
        gen_s = time.perf_counter() - t0
        print(f"generate: {count} ops in {gen_s:.2f}s = {count / gen_s:,.0f} ops/s")

        n, w, null_s = run(NullExecutor(), ops_file)
        print(f"fsage alone (read stream + dispatch, null executor): {n / null_s:,.0f} ops/s")

        if can_loop_mount():
            with test_fs("ext4", size, workdir=tmpd) as (_img, mnt):
                c0 = os.times()
                n, w, wall = run(PosixExecutor(mnt), ops_file)
                c1 = os.times()
            print(
                f"mounted ext4 (loop): {n} ops, {w / 2**20:,.0f} MiB in {wall:.2f}s = "
                f"{n / wall:,.0f} ops/s, {w / 2**20 / wall:,.1f} MiB/s"
            )
            share = null_s / wall
            user = c1.user - c0.user
            print(
                f"CPU during the mounted run: user {user:.2f}s ({user / wall:.1%} of wall, "
                f"fsage's Python incl. the executor's own code), system "
                f"{c1.system - c0.system:.2f}s"
            )
            print(
                f"share of wall time in fsage's op loop (null-executor estimate): {share:.1%} "
                f"(system calls and kernel: {1 - share:.1%}; target <= 30%: "
                f"{'met' if share <= 0.30 else 'NOT met'})"
            )
        else:
            print("mounted executor: skipped (needs root and loop devices)")

        try:
            from fsage.ager.offline import OfflineExtExecutor

            img = make_image(tmpd / "off.img", "ext4", size)
            ex = OfflineExtExecutor(img)
            n, w, wall = run(ex, ops_file)
            t1 = time.perf_counter()
            ex.close()
            wall += time.perf_counter() - t1
            print(
                f"offline ext4 (libext2fs): {n} ops, {w / 2**20:,.0f} MiB in {wall:.2f}s = "
                f"{n / wall:,.0f} ops/s, {w / 2**20 / wall:,.1f} MiB/s"
            )
            os.unlink(img)
        except Exception as exc:
            print(f"offline executor: skipped ({exc})")


if __name__ == "__main__":
    main()
