"""Benchmark convergence mode's generation (no executor): ops/s of the generator alone for a
Geriatrix profile on a modelled capacity, fill and churn separately, wall and CPU time, and
where it converged (or that it did not). Target: >= 5,000 ops/s.

Without --profile it uses Geriatrix's agrawal profile on 2 GiB (0.8 full), written to a
temporary directory; its age histogram needs many ops to converge (about 50 times the fill's
ops), so --churn bounds the run.

    python3 bench/age_converge.py [--profile DIR] [--capacity-gib 2] [--churn 60] [--seed 1]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.geriatrix import write_agrawal
from fsage.ager.generator import Generator
from fsage.ager.profile import load_profile
from fsage.cli.age import convergence_lines

TARGET = 5000.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", type=Path, help="Geriatrix profile directory (default agrawal)")
    ap.add_argument("--capacity-gib", type=float, default=2.0)
    ap.add_argument("--fill", type=float, default=0.8)
    ap.add_argument("--churn", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="fsage-bench-") as tmp:
        pdir = args.profile
        if pdir is None:
            pdir = write_agrawal(Path(tmp))
        prof = load_profile(str(pdir)).with_overrides(fill=args.fill, churn=args.churn)
    cap = int(args.capacity_gib * 2**30)
    gen = Generator(prof, args.seed, cap)
    w0, c0 = time.perf_counter(), time.process_time()
    fill_at: tuple[int, float, float] | None = None
    n = 0
    for _op in gen.ops():
        n += 1
        if fill_at is None and gen.stats.phase != "fill":
            fill_at = (n, time.perf_counter() - w0, time.process_time() - c0)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    fn, fw, fc = fill_at or (n, wall, cpu)
    print(f"profile {prof.name}, capacity {args.capacity_gib:g} GiB, fill {prof.fill}")
    print(f"  fill : {fn:>9,} ops  {fn / fw:>8,.0f} ops/s wall  {fn / fc:>8,.0f} ops/s CPU")
    cn = n - fn
    if cn:
        cw, cc = wall - fw, cpu - fc
        print(f"  churn: {cn:>9,} ops  {cn / cw:>8,.0f} ops/s wall  {cn / cc:>8,.0f} ops/s CPU")
    print(f"  all  : {n:>9,} ops  {n / wall:>8,.0f} ops/s wall  {n / cpu:>8,.0f} ops/s CPU")
    print(f"  ratio to the {TARGET:,.0f} ops/s target (CPU): {n / cpu / TARGET:.2f}")
    print(f"  files {len(gen.files):,}, directories {len(gen.all_dirs) - 1:,}")
    written = gen.stats.bytes_written / 2**20
    print(f"  written {written:,.0f} MiB (fill {(gen.stats.fill_bytes or 0) / 2**20:,.0f} MiB)")
    for line in convergence_lines(gen.convergence_report()):
        print(f"  {line}")


if __name__ == "__main__":
    main()
