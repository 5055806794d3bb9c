"""Benchmark: the live reader against ``find DIR -type f -print0 | xargs -0 filefrag``.

For each file system asked for (ext4 by default; ``--fs ext4,xfs``) builds a loop-mounted
image holding ``--files`` small files (lognormal sizes, 500 per directory), syncs it, then
times both readers over the same tree, ``--rounds`` times, alternating, and reports medians.
First, what a user feels — whole commands, as processes:

* ``find DIR -type f -print0 | xargs -0 filefrag -e`` against ``fsage snapshot DIR --db NEW``
  (interpreter start-up, imports, the walk and the store's transaction all counted; a new
  database each run, so every file is stored). The target is fsage >= 2x faster. fsage's
  modules are compiled to bytecode first, as an installed fsage's are (PYTHONDONTWRITEBYTECODE
  would otherwise have every run compile them); then a process that only starts Python and
  runs the same C walk (no click, numpy or store: the floor of a command written in Python),
  a process that also imports click and writes the snapshot's bytes to a new database (the
  bound of a store without numpy), the command again into a database that already holds the
  tree (a nightly run with nothing new), and the CPU seconds of the interpreter alone and
  with the command's imports, to show what start-up costs.

Then the library call alone, to see where the time goes:

* ``find | xargs filefrag``, output to /dev/null (what a shell script would do);
* ``fsage`` = ``read_live_layout`` (the library call ``fsage snapshot DIR`` makes: walk, FIEMAP,
  merge, GETFSMAP, facts) with the C walk, one thread and as many threads as it uses by
  default (one per CPU, up to 4; ``--workers`` overrides); with
  ``--python``, the pure-Python walk once per round as well.

CPU seconds (user + system, every process or thread) are reported beside the wall-clock time:
on a machine shared with other work the wall-clock ratio moves with the load, the CPU ratio
much less. Each fsage run is a fresh ``python3`` process so that its peak RSS (``ru_maxrss``, which
includes the interpreter and numpy, about 30 MiB) is its own; the time is taken inside that
process around the library call, so interpreter start-up is not counted. filefrag's peak RSS is
the largest of the pipeline's processes.

Caches: ``--cache warm`` (default) runs every reader once untimed first and never drops caches;
``--cache cold`` writes 3 to /proc/sys/vm/drop_caches before every timed run (both readers
then read inodes and extent trees from the loop device's backing file). Needs root.

    sudo python3 bench/live.py --files 200000 --fs ext4,xfs --cache warm
    python3 bench/live.py --tree /home --whole-only   # a tree that is already there
    python3 bench/live.py --files 100000 --whole-only --baseline ../main   # before/after

After the whole commands, the CPU seconds of each phase of ``fsage snapshot DIR`` run one
after the other (interpreter, imports, read, store), and of find and filefrag apart: where
the time goes, and what no overlap can hide.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

MKFS = {
    "ext4": lambda n: ["mkfs.ext4", "-q", "-F", "-N", str(n + 50_000)],
    "xfs": lambda n: ["mkfs.xfs", "-q", "-f"],
}

CHILD = """
import json, resource, sys, time
from pathlib import Path
from fsage.snapshotter.live import read_live_layout
r0 = resource.getrusage(resource.RUSAGE_SELF)
t = time.perf_counter()
layout = read_live_layout(Path(sys.argv[1]), workers=int(sys.argv[2]), engine=sys.argv[3])
el = time.perf_counter() - t
r1 = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({
    "seconds": el,
    "cpu": r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime,
    "files": len(layout.files),
    "extents": int(layout.files.ext_length.shape[0]),
    "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
}))
"""


# A process that starts the interpreter and runs the command's C walk, nothing else.
WALK_ONLY = """
import sys
from fsage.snapshotter import livewalk
livewalk.run_c_walk(livewalk.scope_of(sys.argv[1], engine="c"))
"""

# The least a command in Python without numpy could do: start the walk as `fsage snapshot`
# does, import click and the command line meanwhile, then write as many bytes as the snapshot
# takes in a new database (as the store makes one: its page size, a rollback journal, synced).
# No digests, packing or comparison: a bound on what a store free of numpy could reach.
WALK_AND_WRITE = """
import os, sqlite3, sys
from fsage.snapshotter import livewalk
livewalk.start_background_walk(sys.argv[1])
import fsage.cli
walk = livewalk.take_background_walk(livewalk.scope_of(sys.argv[1], engine="c"))
walk.result()
con = sqlite3.connect(sys.argv[2], isolation_level=None)
con.execute("PRAGMA page_size=16384")
con.execute("PRAGMA synchronous=NORMAL")
con.execute("CREATE TABLE chunk(body BLOB)")
con.execute("BEGIN IMMEDIATE")
con.execute("INSERT INTO chunk VALUES (?)", (os.urandom(int(sys.argv[3])),))
con.execute("COMMIT")
con.close()
os._exit(0)
"""

# The whole command's phases one after the other, CPU seconds of each (all threads).
PHASES = """
import json, os, resource, sys
from pathlib import Path
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
out = {"interpreter": cpu()}
from fsage.launch import keep_freed_memory
keep_freed_memory()  # as `python3 -m fsage snapshot` does
c = cpu()
import fsage.cli, fsage.cli.snapshot, fsage.db.store, fsage.snapshotter.live
out["imports"] = cpu() - c
from fsage.snapshotter import livewalk
from fsage.snapshotter.live import read_live_layout
from fsage.db.store import Store
c = cpu()
livewalk.run_c_walk(livewalk.scope_of(Path(sys.argv[1])))
out["C walk"] = cpu() - c
c = cpu()
layout = read_live_layout(Path(sys.argv[1]))
out["read"] = cpu() - c
c = cpu()
store = Store.open(Path(sys.argv[2]), create=True)
out["store open"] = cpu() - c
c = cpu()
store.add_snapshot(layout, source=sys.argv[1])
out["add_snapshot"] = cpu() - c
c = cpu()
store.close()
out["close"] = cpu() - c
print(json.dumps(out))
"""


def populate(root: Path, n: int, seed: int) -> int:
    rnd = random.Random(seed)
    total = 0
    chunk = bytes(range(256)) * 4096
    per_dir = 500
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    dfd = -1
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


def drop_caches() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def time_filefrag(mnt: Path) -> tuple[float, float, int]:
    """Seconds, CPU seconds (all processes) and peak RSS (KiB) of the largest one."""
    t = time.perf_counter()
    proc = subprocess.Popen(
        ["sh", "-c", f"find '{mnt}' -type f -print0 | xargs -0 filefrag > /dev/null"]
    )
    _, status, usage = os.wait4(proc.pid, 0)
    el = time.perf_counter() - t
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"filefrag pipeline failed with {proc.returncode}")
    return el, usage.ru_utime + usage.ru_stime, int(usage.ru_maxrss)


def time_command(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """Wall and CPU seconds (the process and everything it waited for) of one command."""
    t = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    el = time.perf_counter() - t
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"{' '.join(argv)} failed")
    return el, usage.ru_utime + usage.ru_stime


def command_env(tree: Path = ROOT) -> dict[str, str]:
    """The environment of the timed fsage processes: the source tree ``tree`` (this one by
    default; its C extensions built in place), with its modules compiled to bytecode first
    (as ``pip install`` does), so that start-up is not timed compiling them where
    PYTHONDONTWRITEBYTECODE is set."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", str(tree / "fsage")], check=True, env=env
    )
    return env


def start_up(rounds: int, env: dict[str, str]) -> str:
    """Median CPU seconds of the interpreter alone and of the imports ``fsage snapshot DIR``
    makes before it reads anything (not counted above: part of the whole command)."""
    bare = [time_command([sys.executable, "-c", "pass"], env)[1] for _ in range(rounds)]
    no_site = [time_command([sys.executable, "-S", "-c", "pass"], env)[1] for _ in range(rounds)]
    code = "import fsage.cli.snapshot, fsage.snapshotter.live"
    imports = [time_command([sys.executable, "-c", code], env)[1] for _ in range(rounds)]
    return (
        f"  start-up: interpreter {statistics.median(bare):.3f} s CPU (without site-packages' "
        f".pth files, python3 -S: {statistics.median(no_site):.3f}), with the snapshot "
        f"path's imports {statistics.median(imports):.3f} s CPU"
    )


def whole_commands(
    mnt: Path, work: Path, rounds: int, cold: bool, baseline: Path | None = None
) -> None:
    """``fsage snapshot DIR`` as a process against ``find | xargs filefrag -e`` (and, with
    ``baseline``, against another checkout's fsage, interleaved: before/after on a shared
    machine)."""
    env = command_env()
    base_env = command_env(baseline) if baseline is not None else None
    ff_cmd = ["sh", "-c", f"find '{mnt}' -type f -print0 | xargs -0 filefrag -e > /dev/null"]
    ff: list[tuple[float, float]] = []
    fs: list[tuple[float, float]] = []
    before: list[tuple[float, float]] = []
    walks: list[tuple[float, float]] = []
    nightly: list[tuple[float, float]] = []
    # A nightly run: a snapshot into a database that already holds this tree's (nothing new).
    kept = work / "kept.db"
    subprocess.run(
        [sys.executable, "-m", "fsage", "snapshot", str(mnt), "--db", str(kept)],
        env=env, check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    # The floor of a command in Python: a process that starts the interpreter and runs the same
    # C walk, and nothing else (no click, numpy or store).
    walk_cmd = [sys.executable, "-c", WALK_ONLY, str(mnt)]
    bound_db = work / "bound.db"
    bound_cmd = [
        sys.executable, "-c", WALK_AND_WRITE, str(mnt), str(bound_db), str(kept.stat().st_size)
    ]  # fmt: skip
    bounds: list[tuple[float, float]] = []

    def snapshot(run_env: dict[str, str], out: list[tuple[float, float]]) -> None:
        db = work / "whole.db"
        if cold:
            drop_caches()
        out.append(
            time_command(
                [sys.executable, "-m", "fsage", "snapshot", str(mnt), "--db", str(db)], run_env
            )
        )
        for p in work.glob("whole.db*"):
            p.unlink()

    for _ in range(rounds):
        if cold:
            drop_caches()
        ff.append(time_command(ff_cmd))
        snapshot(env, fs)
        if base_env is not None:
            snapshot(base_env, before)
        if cold:
            drop_caches()
        walks.append(time_command(walk_cmd, env))
        if cold:
            drop_caches()
        bounds.append(time_command(bound_cmd, env))
        for p in work.glob("bound.db*"):
            p.unlink()
        if cold:
            drop_caches()
        nightly.append(
            time_command(
                [sys.executable, "-m", "fsage", "snapshot", str(mnt), "--db", str(kept)], env
            )
        )
    f_wall, f_cpu = _medians(ff)
    s_wall, s_cpu = _medians(fs)
    print(
        f"WHOLE COMMAND  fsage snapshot DIR: {s_wall:.3f} s (CPU {s_cpu:.3f} s)  vs  "
        f"find | xargs filefrag -e: {f_wall:.3f} s (CPU {f_cpu:.3f} s)  ->  "
        f"fsage {f_wall / s_wall:.2f}x faster (CPU {f_cpu / s_cpu:.2f}x; target >= 2x)"
    )
    print(f"  runs: fsage {_runs([w for w, _ in fs])}; filefrag {_runs([w for w, _ in ff])}")
    print(f"  CPU runs: fsage {_runs([c for _, c in fs])}; filefrag {_runs([c for _, c in ff])}")
    for what, runs in (
        ("floor: a Python process that only runs the walk", walks),
        ("bound without numpy: the walk, click, and the snapshot's bytes written", bounds),
        ("again into a database that holds the tree (a nightly run, nothing new)", nightly),
    ):
        wall, cpu_s = _medians(runs)
        print(
            f"  {what}: {wall:.3f} s (CPU {cpu_s:.3f} s), filefrag/this {f_wall / wall:.2f}x "
            f"(runs {_runs([w for w, _ in runs])})"
        )
    if before:
        b_wall, b_cpu = _medians(before)
        print(
            f"  baseline {baseline}: {b_wall:.3f} s (CPU {b_cpu:.3f} s), filefrag/baseline "
            f"{f_wall / b_wall:.2f}x (CPU {f_cpu / b_cpu:.2f}x); this fsage takes "
            f"{s_wall / b_wall:.2f} of its time, {s_cpu / b_cpu:.2f} of its CPU "
            f"(runs {_runs([w for w, _ in before])}; CPU {_runs([c for _, c in before])})"
        )
    print(start_up(rounds, env))
    cpu_phases(mnt, work, rounds, env)


def cpu_phases(mnt: Path, work: Path, rounds: int, env: dict[str, str]) -> None:
    """Median CPU seconds of each phase of the command, one after the other (the command
    overlaps the imports with the walk), and of find and filefrag apart."""
    runs: list[dict[str, float]] = []
    for i in range(rounds):
        db = work / f"phases-{i}.db"
        out = subprocess.run(
            [sys.executable, "-c", PHASES, str(mnt), str(db)],
            check=True,
            capture_output=True,
            text=True,
            env=env,
        ).stdout
        runs.append(json.loads(out))
        for p in work.glob(f"phases-{i}.db*"):
            p.unlink()
    listing = work / "files.list"
    find_cpu, ff_cpu = [], []
    for _ in range(rounds):
        find_cpu.append(
            time_command(["sh", "-c", f"find '{mnt}' -type f -print0 > '{listing}'"])[1]
        )
        ff_cpu.append(
            time_command(["sh", "-c", f"xargs -0 filefrag -e < '{listing}' > /dev/null"])[1]
        )
    listing.unlink()
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    total = sum(v for k, v in med.items() if k != "C walk")
    parts = ", ".join(f"{k} {v:.3f}" for k, v in med.items() if k != "C walk")
    find_med, ff_med = statistics.median(find_cpu), statistics.median(ff_cpu)
    print(
        f"  CPU by phase, one after the other: fsage {parts} (the C walk alone "
        f"{med['C walk']:.3f}); total {total:.3f} s"
    )
    print(
        f"  CPU of the pipeline's parts: find {find_med:.3f}, xargs filefrag -e {ff_med:.3f}; "
        f"total {find_med + ff_med:.3f} s"
    )


def time_fsage(mnt: Path, workers: int, engine: str) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(mnt), str(workers), engine],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    ).stdout
    doc: dict[str, float] = json.loads(out)
    return doc


def _medians(runs: list[tuple[float, float]]) -> tuple[float, float]:
    """Median wall and CPU seconds of (wall, CPU) runs."""
    return statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs)


def _runs(xs: list[float]) -> str:
    return ", ".join(f"{x:.3f}" for x in xs)


def bench_fs(fstype: str, args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix=f"fsage-bench-live-{fstype}-", dir=args.dir))
    image, mnt = work / f"{fstype}.img", work / "mnt"
    mnt.mkdir()
    mounted = False
    try:
        size_mib = max(512, args.files * 12 // 1024 + 512)
        with open(image, "wb") as f:
            f.truncate(size_mib << 20)
        subprocess.run([*MKFS[fstype](args.files), str(image)], check=True)
        subprocess.run(["mount", "-o", "loop", str(image), str(mnt)], check=True)
        mounted = True
        t = time.perf_counter()
        total = populate(mnt, args.files, args.seed)
        os.sync()
        print(
            f"\n== {fstype}: {size_mib} MiB image, {args.files} files, "
            f"{total / 2**20:.0f} MiB of data, built in {time.perf_counter() - t:.1f} s; "
            f"caches {args.cache}"
        )
        bench_tree(mnt, work, args)
    finally:
        if mounted:
            subprocess.run(["umount", str(mnt)], check=False)
        shutil.rmtree(work, ignore_errors=True)


def bench_tree(mnt: Path, work: Path, args: argparse.Namespace) -> None:
    """Every measurement, on the mounted tree ``mnt`` (scratch files in ``work``)."""
    configs: list[tuple[str, int, str]] = [("fsage C walk, 1 thread", 1, "c")]
    threads = args.workers or min(4, len(os.sched_getaffinity(0)))
    if threads > 1:
        configs.append((f"fsage C walk, {threads} threads", threads, "c"))
    if args.python:
        configs.append(("fsage Python walk, 1 process", 1, "python"))
    if args.cache == "warm":
        time_filefrag(mnt)  # warm-up: dentries, inodes and extent caches
        for _, workers, engine in configs:
            time_fsage(mnt, workers, engine)
    whole_commands(mnt, work, args.rounds, args.cache == "cold", args.baseline)
    if args.whole_only:
        return
    print("library call only (no start-up, no store):")
    ff: list[float] = []
    ff_cpu: list[float] = []
    ff_rss = 0
    res: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in configs}
    for _ in range(args.rounds):
        if args.cache == "cold":
            drop_caches()
        el, cpu, rss = time_filefrag(mnt)
        ff.append(el)
        ff_cpu.append(cpu)
        ff_rss = max(ff_rss, rss)
        for name, workers, engine in configs:
            if args.cache == "cold":
                drop_caches()
            res[name].append(time_fsage(mnt, workers, engine))
    f_med = statistics.median(ff)
    f_cpu = statistics.median(ff_cpu)
    first = res[configs[0][0]][0]
    print(f"tree: {int(first['files'])} inodes, {int(first['extents'])} extents")
    print(
        f"{'find | xargs filefrag':32s}: median {f_med:7.3f} s  CPU {f_cpu:6.3f} s  "
        f"peak RSS {ff_rss / 1024:6.1f} MiB  (runs {_runs(ff)})"
    )
    for name, runs in res.items():
        secs = [r["seconds"] for r in runs]
        med = statistics.median(secs)
        cpu = statistics.median(r["cpu"] for r in runs)
        peak = max(r["maxrss_kib"] for r in runs)
        print(
            f"{name:32s}: median {med:7.3f} s  CPU {cpu:6.3f} s  peak RSS "
            f"{peak / 1024:6.1f} MiB  (runs {_runs(secs)})  filefrag/fsage: time "
            f"{f_med / med:.2f}x, CPU {f_cpu / cpu:.2f}x (target >= 2x)"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=200_000)
    ap.add_argument("--fs", default="ext4", help="comma-separated: ext4, xfs")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--workers", type=int, default=0, help="threads, second fsage run (0: its default)"
    )
    ap.add_argument("--cache", choices=("warm", "cold"), default="warm")
    ap.add_argument("--python", action="store_true", help="also time the pure-Python walk")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dir", type=Path, default=Path("/tmp"), help="where the images go")
    ap.add_argument(
        "--tree",
        type=Path,
        help="time this mounted directory (read-only use) instead of building images",
    )
    ap.add_argument(
        "--whole-only", action="store_true", help="only the whole commands and their phases"
    )
    ap.add_argument(
        "--baseline",
        type=Path,
        help="another checkout of fsage (extensions built in place): its whole command is "
        "timed too, interleaved, for before/after ratios on a shared machine",
    )
    args = ap.parse_args()
    if os.geteuid() != 0 and args.tree is None:
        print("bench/live.py needs root (it loop-mounts images)", file=sys.stderr)
        return 2
    kinds = [k.strip() for k in args.fs.split(",") if k.strip()]
    for k in kinds:
        if k not in MKFS:
            print(f"bench/live.py: unknown file system {k!r}", file=sys.stderr)
            return 2
    print(f"fsage bench/live.py: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
    if args.tree is not None:
        work = Path(tempfile.mkdtemp(prefix="fsage-bench-live-", dir=args.dir))
        try:
            print(f"\n== {args.tree}; caches {args.cache}")
            bench_tree(args.tree, work, args)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    for k in kinds if args.tree is None else []:
        bench_fs(k, args)
    self_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"\n(bench driver peak RSS {self_rss / 1024:.1f} MiB, not counted above)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
