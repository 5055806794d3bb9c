"""Benchmark replay on a real history, and its fidelity.

The history: successive released versions of source trees (sdists from PyPI, fetched with
``pip download --no-deps --no-binary :all: --no-build-isolation PKG==VERSION`` (which needs
``wheel``) into ``--sdists``, or already there),
unpacked in order over one directory per project on a loop-mounted ext4, a snapshot after each
batch (``fsage.replay.unpack``), the file system sized so the last state fills it to ``--fill``.

Then, for the last snapshot and one in the middle: the noise floor (the op stream run twice
with ``fsage age --ops``), ``fsage replay`` with each ``--interval-end`` asked for (and,
with ``--intra``, intra-day activity added), fidelity per size bucket and the verdict; and the
replay time against writing the bytes the replay wrote once, sequentially (1 MiB writes, one
file, fsync: what ``dd bs=1M conv=fsync`` does) on a fresh file system of the same geometry,
in the same run. Target: replay <= 2x the sequential write. Beside them, the floor: the same
op stream as bare system calls (``bench/syscall_floor.c``, compiled with gcc at run time), on a
fresh file system of the same geometry, each interval ended the same way ("floor: system calls
alone N x"); what the replay takes above it is what fsage adds.

    python3 bench/replay.py --sdists /tmp/sdists [--block-size 4096] [--fill 0.8]
        [--ends remount,sync,drop-caches,none] [--intra 2000] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from syscall_floor import replay_ops, syscall_floor

from fsage.ager.images import can_loop_mount, loop_mount
from fsage.db.store import Store
from fsage.replay.deltas import IntraDay
from fsage.replay.fidelity import Fidelity, NoiseFloor
from fsage.replay.noise import noise_floor
from fsage.replay.recreate import RecreateOptions, make_filesystem, recreate
from fsage.replay.unpack import history_size, unpack_history

_SDIST = re.compile(r"^(?P<name>[A-Za-z0-9_.\-]+?)-(?P<version>\d[^-]*)\.tar\.gz$")


def _version_key(v: str) -> tuple[Any, ...]:
    from packaging.version import Version

    return (Version(v),)


def batches_from(sdists: Path, snapshots: int) -> list[list[tuple[str, Path]]]:
    """Batch i holds the i-th release (by version) of every project that has one."""
    by_project: dict[str, list[tuple[str, Path]]] = {}
    for p in sorted(sdists.iterdir()):
        m = _SDIST.match(p.name)
        if m:
            by_project.setdefault(m["name"].lower(), []).append((m["version"], p))
    if not by_project:
        sys.exit(f"no sdists (NAME-VERSION.tar.gz) in {sdists}")
    out: list[list[tuple[str, Path]]] = []
    for name, rel in sorted(by_project.items()):
        rel.sort(key=lambda r: _version_key(r[0]))
        for i, (_v, p) in enumerate(rel[:snapshots]):
            while len(out) <= i:
                out.append([])
            out[i].append((name, p))
    return out


def download(versions: list[str], dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for spec in versions:
        subprocess.run(
            # --no-build-isolation: pip would otherwise install the sdist's build requirements
            # into a fresh environment just to read its metadata (slow, and it hung here).
            [
                "pip",
                "download",
                "-q",
                "--no-deps",
                "--no-binary",
                ":all:",
                "--no-build-isolation",
                spec,
                "-d",
                str(dest),
            ],
            check=True,
        )


def sequential_write(image_like: Path, nbytes: int, tmp: Path) -> float:
    """Seconds to write ``nbytes`` once, sequentially (1 MiB writes), on a fresh file system of
    ``image_like``'s geometry (mkfs not timed). More bytes than half the free space are
    written in turns: the file is synced and truncated to nothing, and the writing goes on."""
    from fsage.snapshotter import read_source

    img = tmp / "seq.img"
    make_filesystem(img, read_source(image_like))
    buf = os.urandom(1 << 20)
    with loop_mount(img) as mnt:
        t0 = time.perf_counter()
        st = os.statvfs(mnt)
        cap = max(st.f_bavail * st.f_frsize // 2, len(buf))
        fd = os.open(mnt / "seq", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            left, in_file = nbytes, 0
            while left > 0:
                if in_file >= cap:
                    os.fsync(fd)
                    os.ftruncate(fd, 0)
                    os.lseek(fd, 0, os.SEEK_SET)
                    in_file = 0
                n = os.write(fd, buf[: min(left, len(buf), cap - in_file)])
                left -= n
                in_file += n
            os.fsync(fd)
        finally:
            os.close(fd)
        elapsed = time.perf_counter() - t0
    img.unlink()
    return elapsed


def _cpu() -> tuple[float, float]:
    """CPU seconds (user, system) of this process and its waited-for children so far. The
    kernel's own writeback and loop threads are not counted (for either side)."""
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + b.ru_utime, a.ru_stime + b.ru_stime


def _timed_replay(
    db: Path,
    fs_name: str,
    sid: int,
    end: str,
    intra: IntraDay | None,
    floor: NoiseFloor | None,
    tmp: Path,
) -> dict[str, Any]:
    """One replay of snapshot ``sid`` and, right after it, the sequential write of the bytes
    it wrote on a fresh file system of the same geometry: times, CPU, fidelity."""
    target = tmp / "rec.img"
    cpu0 = _cpu()
    res = recreate(
        RecreateOptions(
            db=db,
            fs_name=fs_name,
            target=target,
            until=str(sid),
            mode="mount",
            force=True,
            interval_end=end,
            intra=intra,
            noise_floor=floor,
            name=None,  # a free name: a history may be benched again
        )
    )
    assert res.fidelity is not None
    cpu1 = _cpu()
    seq = sequential_write(target, res.bytes_written, tmp)
    cpu2 = _cpu()
    floor = syscall_floor(replay_ops(db, fs_name, str(sid), intra), target, end, tmp)
    target.unlink()
    driver = sum(res.timings.get(k, 0.0) for k in _DRIVER_PARTS)
    return {
        "floor_seconds": floor["seconds"],
        "floor_cpu_seconds": floor["cpu_seconds"],
        "floor": floor,
        "floor_ratio": floor["seconds"] / seq,
        "driver_seconds": driver,
        "driver_ratio": driver / seq,
        "replay_seconds": res.elapsed,
        "replay_timings": res.timings,
        "replay_cpu_seconds": sum(cpu1) - sum(cpu0),
        "replay_user_seconds": cpu1[0] - cpu0[0],
        "replay_system_seconds": cpu1[1] - cpu0[1],
        "sequential_seconds": seq,
        "sequential_cpu_seconds": sum(cpu2) - sum(cpu1),
        "ratio": res.elapsed / seq,
        "bytes_written": res.bytes_written,
        "ops": res.ops,
        "fid": res.fidelity,
    }


#: The parts of a replay's time that the system-call floor covers (the rest: mkfs, reading
#: the recreation back, storing it, the fidelity).
_DRIVER_PARTS = ("waiting_for_deltas", "ops", "interval_ends", "final_unmount")


def fit_size(need: int, inodes: int, bs: int, fill: float) -> int:
    """Bytes of a file system whose blocks left after mkfs hold ``need`` at ``fill``."""
    from fsage.ager.images import run_tool
    from fsage.snapshotter import read_source

    n = max(inodes, 16384)
    # The first probe must hold the inode tables and a journal, or mkfs itself fails (a small
    # history at 1 KiB blocks); later probes correct the size by what mkfs left usable.
    size = int(need / fill) + n * 256 + (8 << 20)
    with tempfile.TemporaryDirectory() as t:
        img = Path(t) / "probe.img"
        for _ in range(3):
            with open(img, "wb") as fh:
                fh.truncate(size)
            run_tool(["mkfs.ext4", "-F", "-q", "-b", str(bs), "-N", str(n),
                      str(img)], "probe")  # fmt: skip
            f = read_source(img).facts
            usable = f.blocks_free * bs
            size += int(need / fill) - usable
    return -(-size // (1 << 20)) * (1 << 20)


def rows(fid: Fidelity) -> list[dict[str, Any]]:
    return [
        {
            "blocks": f"{r['min_blocks']}-{r['max_blocks']}",
            "files": r["files_original"],
            "original": r["layout_score_original"],
            "recreated": r["layout_score_recreated"],
            "noise_floor": r.get("noise_floor"),
            "tolerance": r.get("tolerance"),
            "judged": r.get("judged"),
            "within": r.get("within"),
        }
        for r in fid.by_size
    ]


def show(title: str, fid: Fidelity, table: bool = True) -> None:
    v = fid.verdict
    print(
        f"  {title}: layout score original {fid.layout_score_original:.3f}, recreated "
        f"{fid.layout_score_recreated:.3f}; free extents {fid.free_original['free_extent_count']}"
        f" vs {fid.free_recreated['free_extent_count']}, free distance "
        f"{fid.free_tv_distance:.3f} (tolerance {v.free_tolerance if v else 0:.3f}); "
        f"{'FAITHFUL' if v and v.faithful else 'NOT FAITHFUL'}"
    )
    if not table:
        return
    print(
        f"    {'blocks':>12} {'files':>6} {'orig':>6} {'rec':>6} {'diff':>7} {'noise':>6} "
        f"{'tol':>6}"
    )
    for r in fid.by_size:
        so, sr = r["layout_score_original"], r["layout_score_recreated"]
        d = "-" if so is None or sr is None else f"{sr - so:+.3f}"
        nf = r.get("noise_floor")
        mark = "" if not r.get("judged") else ("  ok" if r.get("within") else "  OUT")
        print(
            f"    {r['min_blocks']:>5}-{r['max_blocks']:<6} {r['files_original']:>6} "
            f"{'-' if so is None else f'{so:.3f}':>6} {'-' if sr is None else f'{sr:.3f}':>6} "
            f"{d:>7} {'-' if nf is None else f'{nf:.3f}':>6} {r.get('tolerance', 0):>6.3f}{mark}"
        )


def _build(
    args: argparse.Namespace, tmp: Path, report: dict[str, Any]
) -> tuple[Path, str, list[int]]:
    """Unpack the history of ``--sdists`` in ``tmp``: (database, file system name, ids)."""
    if args.download:
        download(args.download, args.sdists)
    batches = batches_from(args.sdists, args.snapshots)
    bs = args.block_size
    members = [m for m in args.members.split(",") if m]
    need, inodes = history_size(batches, bs, members)
    size = fit_size(need, inodes * 2, bs, args.fill)
    report.update(block_size=bs, snapshots=len(batches), size=size,
                  projects=sorted({n for b in batches for n, _ in b}))  # fmt: skip
    db = tmp / "h.db"
    print(
        f"history: {len(batches)} batches of {report['projects']}, ext4 {bs} B blocks, "
        f"{size >> 20} MiB (estimated last state {need >> 20} MiB, {inodes} inodes)"
    )
    t0 = time.perf_counter()
    hist = unpack_history(batches, tmp / "orig.img", db, "orig", block_size=bs, size=size,
                          inodes=max(inodes * 2, 16384), members=members,
                          echo=print)  # fmt: skip
    report["unpack_seconds"] = time.perf_counter() - t0
    report["fullness"] = hist.fullness
    return db, "orig", hist.snapshot_ids


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sdists", type=Path, default=None, help="directory of sdists")
    ap.add_argument(
        "--history",
        type=Path,
        default=None,
        help="a history bench/replay_histories.py built (its --out) instead of --sdists",
    )
    ap.add_argument("--download", nargs="*", default=[], help="PKG==VERSION to fetch first")
    ap.add_argument("--snapshots", type=int, default=30)
    ap.add_argument(
        "--members",
        default="*/docs/*,*/django/contrib/admin/*",
        help="comma-separated tar patterns to unpack ('' = everything)",
    )
    ap.add_argument("--block-size", type=int, default=4096)
    ap.add_argument("--fill", type=float, default=0.8)
    ap.add_argument("--ends", default="remount", help="comma-separated --interval-end values")
    ap.add_argument("--intra", type=float, default=0.0, help="also replay with N files/day")
    ap.add_argument("--intra-lifetime", type=float, default=3600.0, help="their mean life, s")
    ap.add_argument("--at", default="last,middle", help="which snapshots to recreate")
    ap.add_argument("--repeat", type=int, default=1, help="replays of each kind (medians)")
    ap.add_argument("--noise-runs", type=int, default=2, help="0: no noise floor (timing only)")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if not can_loop_mount():
        sys.exit("bench/replay.py needs root and loop devices")
    if (args.sdists is None) == (args.history is None):
        sys.exit("give one of --sdists and --history")
    report: dict[str, Any] = {"runs": []}
    with tempfile.TemporaryDirectory(prefix="fsage-bench-replay-", dir=args.workdir) as t:
        tmp = Path(t)
        if args.history is not None:
            info = json.loads((args.history / "history.json").read_text())
            db, fs_name, ids = args.history / "h.db", info["name"], info["snapshot_ids"]
            report.update(block_size=info["block_size"], snapshots=len(ids), size=info["size"],
                          projects=[fs_name], fullness=info["fullness"])  # fmt: skip
            print(f"history {args.history}: {len(ids)} snapshots of {fs_name}")
        else:
            db, fs_name, ids = _build(args, tmp, report)
        targets = {"last": ids[-1], "middle": ids[len(ids) // 2 - 1]}
        for which in args.at.split(","):
            sid = targets[which]
            t0 = time.perf_counter()
            floor: NoiseFloor | None = None
            if args.noise_runs:
                floor, _ = noise_floor(db, fs_name, str(sid), runs=args.noise_runs, workdir=tmp)
            noise_s = time.perf_counter() - t0
            if floor is not None:
                print(
                    f"\nsnapshot {sid} ({which}): noise floor from {floor.runs} runs of "
                    f"`fsage age --ops` ({noise_s:.0f} s): free {floor.free_tv:.3f}, buckets "
                    + ", ".join(f"{k}:{v:.3f}" for k, v in sorted(floor.by_bucket.items()))
                )
            variants: list[tuple[str, IntraDay | None]] = [(e, None) for e in args.ends.split(",")]
            if args.intra:
                variants.append((args.ends.split(",")[0], IntraDay(files_per_day=args.intra)))
            for end, intra in variants:
                label = f"--interval-end {end}"
                if intra:
                    label += f" --intra-files-per-day {args.intra:g}"
                runs = [_timed_replay(db, fs_name, sid, end, intra, floor, tmp)
                        for _ in range(args.repeat)]  # fmt: skip
                med = {k: statistics.median(r[k] for r in runs)
                       for k in ("replay_seconds", "sequential_seconds", "ratio",
                                 "replay_cpu_seconds", "replay_user_seconds",
                                 "replay_system_seconds", "sequential_cpu_seconds",
                                 "floor_seconds", "floor_cpu_seconds", "floor_ratio",
                                 "driver_seconds", "driver_ratio")}  # fmt: skip
                first = runs[0]
                each = ", ".join(f"{r['ratio']:.2f}" for r in runs)
                print(
                    f"\n  replay {label}: {first['ops']} ops, "
                    f"{first['bytes_written'] / 2**20:,.0f} MiB; medians of {len(runs)}: replay "
                    f"{med['replay_seconds']:.2f} s, sequential write of the same bytes "
                    f"{med['sequential_seconds']:.2f} s, ratio {med['ratio']:.2f}x (target <= "
                    f"2x; each run: {each}); CPU (user + "
                    f"system, fsage and its children) {med['replay_cpu_seconds']:.2f} s (user "
                    f"{med['replay_user_seconds']:.2f} s, system "
                    f"{med['replay_system_seconds']:.2f} s) vs "
                    f"{med['sequential_cpu_seconds']:.2f} s; best ratio "
                    f"{min(r['ratio'] for r in runs):.2f}x; of the replay: "
                    + ", ".join(
                        f"{k} {statistics.median(r['replay_timings'][k] for r in runs):.2f} s"
                        for k in first["replay_timings"]
                    )
                )
                print(
                    f"  floor: system calls alone {med['floor_ratio']:.2f}x (the same ops as "
                    f"bare system calls, bench/syscall_floor.c: {med['floor_seconds']:.2f} s, "
                    f"CPU {med['floor_cpu_seconds']:.2f} s); the replay's ops, interval ends "
                    f"and final unmount {med['driver_seconds']:.2f} s = "
                    f"{med['driver_ratio']:.2f}x; each run: "
                    + ", ".join(f"{r['floor_ratio']:.2f}" for r in runs)
                )
                for i, r in enumerate(runs):
                    show(f"snapshot {sid}, run {i + 1}", r["fid"], table=i == 0)
                for r in runs:
                    fid = r.pop("fid")
                    report["runs"].append(
                        {
                            "snapshot": sid,
                            "which": which,
                            "interval_end": end,
                            "intra_files_per_day": args.intra if intra else 0,
                            **r,
                            "noise_floor": floor.to_json() if floor else None,
                            "noise_seconds": noise_s,
                            "fidelity": fid.to_json(),
                            "buckets": rows(fid),
                        }
                    )
        with Store.open(db):
            pass
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
