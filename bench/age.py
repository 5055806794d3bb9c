"""Benchmark the ager the way `fsage age` runs: one profile on one image size, aged through a
loop-mounted ext4 with real data (``--data write``) and with blocks only allocated
(``--data fallocate``, Geriatrix's mode), then offline through libext2fs in both modes.

Per run: ops/s, MiB/s (bytes written, or allocated in fallocate mode), and fsage's own share of
the wall time — the time outside the executor's ops (generating, dispatching, keeping the
record and the journal), as ``fsage age`` records it (``own_share`` in ``fsage runs``) — with the
process's user and system CPU time (both threads: on a mounted target a generated workload's
ops run on the executor's worker thread while the next ones are generated, and the own share is
the share of the wall time in which no op was running) and the load average.
Targets: in fallocate mode at least Geriatrix's ops/s on the same image (its source is not part
of this repository, so its figure is quoted: ~8.3k ops/s with its agrawal profile on a 2 GiB
loop-mounted ext4); in write mode fsage's own share <= 30%.

The default profile is Geriatrix's own ``agrawal`` profile (size, age and depth distributions,
aged in fsage's convergence mode, as Geriatrix ages), filled to 0.8 and churned once; any other
profile fsage reads can be given (``--profile impressions``: Agrawal et al.'s size
distribution in fsage's hybrid mode).

    python3 bench/age.py [--size-mib 2048] [--profile impressions] [--churn 1.0]
        [--workdir DIR] [--no-offline] [--modes write,fallocate] [--repeat N]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.geriatrix import write_agrawal
from fsage.ager.images import can_loop_mount, make_image
from fsage.ager.profile import load_profile
from fsage.ager.run import AgeOptions, AgeResult, age, shape_profile

#: Geriatrix (ATC'18) with its agrawal profile on a 2 GiB loop-mounted ext4, measured on the
#: machine this benchmark was written for; quoted, not rerun (its source is not at hand).
GERIATRIX_OPS_S = 8300.0


def line(what: str, res: AgeResult) -> str:
    wall = res.elapsed
    cpu = res.cpu_user_s + res.cpu_system_s
    return (
        f"{what}: {res.ops:,} ops, {res.bytes_written / 2**20:,.0f} MiB in {wall:.1f}s = "
        f"{res.ops / wall:,.0f} ops/s, {res.bytes_written / 2**20 / wall:,.1f} MiB/s; "
        f"fsage's own share {res.own_share:.1%}; CPU user {res.cpu_user_s:.1f}s, "
        f"system {res.cpu_system_s:.1f}s ({res.ops / cpu if cpu else 0.0:,.0f} ops per CPU "
        f"second: wall time on a busy machine includes waiting for a CPU); "
        f"fullness {res.fullness:.3f}, ended by {res.stopped_by}"
    )


def _median(runs: list[AgeResult] | None) -> AgeResult | None:
    """The run of median wall ops/s (wall rates on a shared machine vary run to run)."""
    if not runs:
        return None
    ranked = sorted(runs, key=lambda r: r.ops / r.elapsed)
    mid = ranked[len(ranked) // 2]
    if len(ranked) > 1:
        rates = ", ".join(f"{r.ops / r.elapsed:,.0f}" for r in ranked)
        print(f"{len(ranked)} runs, {rates} ops/s: the median run is compared")
    return mid


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mib", type=int, default=2048)
    ap.add_argument("--profile", default="agrawal", help="agrawal (Geriatrix's) or a profile")
    ap.add_argument("--fill", type=float, default=0.8)
    ap.add_argument("--churn", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workdir", default=None, help="Where the images go (default: a tmp dir).")
    ap.add_argument("--no-offline", action="store_true")
    ap.add_argument("--modes", default="write,fallocate", help="Data modes to run.")
    ap.add_argument(
        "--repeat", type=int, default=1, help="Runs of each (the median run is compared)."
    )
    args = ap.parse_args()
    size = args.size_mib << 20
    if args.profile == "agrawal":
        with tempfile.TemporaryDirectory(prefix="fsage-bench-") as pdir:
            loaded = load_profile(str(write_agrawal(Path(pdir))))
    else:
        loaded = load_profile(args.profile)
    prof = shape_profile(loaded, fill=args.fill, churn=args.churn)
    print(
        f"profile {args.profile if args.profile == 'agrawal' else prof.name}, "
        f"fill {prof.fill}, churn {prof.churn}, seed {args.seed}, "
        f"{args.size_mib} MiB ext4 (4 KiB blocks); load average {os.getloadavg()[0]:.1f} "
        f"on {os.cpu_count()} CPUs"
    )
    results: dict[str, list[AgeResult]] = {}
    with tempfile.TemporaryDirectory(prefix="fsage-bench-", dir=args.workdir) as tmp:
        tmpd = Path(tmp)
        modes = (["mount"] if can_loop_mount() else []) + ([] if args.no_offline else ["offline"])
        if not can_loop_mount():
            print("mounted runs: skipped (needs root and loop devices)")
        runs = [(m, d) for m in modes for d in args.modes.split(",")] * max(1, args.repeat)
        for mode, data in runs:
            img = make_image(tmpd / f"{mode}-{data}.img", "ext4", size)
            try:
                res = age(img, AgeOptions(profile=prof, seed=args.seed, mode=mode, data=data))
            except Exception as exc:  # an offline build without the writer, say
                print(f"{mode} --data {data}: skipped ({exc})")
                continue
            finally:
                for p in tmpd.glob(img.name + ".fsage-age*"):
                    p.unlink()
                with contextlib.suppress(OSError):
                    img.unlink()
            where = "loop-mounted ext4" if mode == "mount" else "offline ext4"
            what = f"{where} --data {data}"
            print(f"{line(what, res)}; load average {os.getloadavg()[0]:.1f}", flush=True)
            results.setdefault(f"{mode}-{data}", []).append(res)
    fa = _median(results.get("mount-fallocate"))
    if fa is not None:
        rate = fa.ops / fa.elapsed
        print(
            f"fallocate mode vs Geriatrix (quoted {GERIATRIX_OPS_S:,.0f} ops/s): "
            f"{rate:,.0f} ops/s = {rate / GERIATRIX_OPS_S:.2f}x "
            f"({'met' if rate >= GERIATRIX_OPS_S else 'NOT met'})"
        )
    wr = _median(results.get("mount-write"))
    if wr is not None:
        print(
            f"write mode: fsage's own share {wr.own_share:.1%} of wall time "
            f"(target <= 30%: {'met' if wr.own_share <= 0.30 else 'NOT met'})"
        )


if __name__ == "__main__":
    main()
