"""What PostMark costs the LFS's FUSE server: the requests the kernel sends, by kind, and the
server's CPU time, beside PostMark on ext4 in the same run.

The image is mounted in this process (``fsage.lfs.mount.mount``, foreground) with every
request counted on its way to the adapter; PostMark (seed 003's Table 1 setup: 500 files, 500
transactions, 500 B–9.77 KB, 100 subdirectories, seed 42) runs in a fresh directory of the
mount, on the Table 1 geometry (50,000 sectors, 64 KB segments) in /dev/shm. Requests that
libfuse answers itself (forget, flush, ...) do not reach Python and are not counted.

    sudo PYTHONPATH=. python3 bench/lfs_requests.py [--runs 3] [--profile 30]

(``PYTHONPATH=.``: the mount runs in this process, so this checkout's fsage must be the one
imported.)
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import os
import pstats
import resource
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fsage.ager.images import can_loop_mount, loop_mount
from fsage.lfs import mount as lfs_mount
from fsage.lfs.fs import mkfs
from fsage.replay.bench.postmark import VARIANTS

SECTORS = 50_000
BPS = 16  # blocks per segment: 64 KB segments of 4 KB blocks

#: The adapter's request handlers (``fsage/_fuse.c`` calls them by these names).
HANDLERS = [
    "lookup",
    "getattr",
    "setattr",
    "readlink",
    "mknod",
    "mkdir",
    "unlink",
    "rmdir",
    "symlink",
    "rename",
    "link",
    "open",
    "create",
    "read",
    "write",
    "release",
    "fsync",
    "opendir",
    "readdir",
    "releasedir",
    "fsyncdir",
    "statfs",
]


def counting_operations(
    counts: collections.Counter[str], cpu_ns: collections.Counter[str]
) -> type[lfs_mount.LfsOperations]:
    """LfsOperations that count each request by kind, and the CPU time its handler takes."""
    namespace: dict[str, Any] = {}
    clock = time.thread_time_ns
    for name in HANDLERS:
        handler = getattr(lfs_mount.LfsOperations, name)

        def counted(
            self: Any, *args: Any, _handler: Callable[..., Any] = handler, _n: str = name
        ) -> Any:
            counts[_n] += 1
            t = clock()
            try:
                return _handler(self, *args)
            finally:
                cpu_ns[_n] += clock() - t

        namespace[name] = counted
    return type("CountingOperations", (lfs_mount.LfsOperations,), namespace)


def _cpu_self() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _cpu_children() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def postmark(where: Path) -> tuple[float, float]:
    """PostMark in a fresh directory of ``where``: (wall seconds, its CPU seconds)."""
    d = where / "postmark"
    d.mkdir()
    with tempfile.NamedTemporaryFile("w", suffix=".pm") as fh:
        fh.write(VARIANTS["seed003"].script("."))
        fh.flush()
        c0, t0 = _cpu_children(), time.perf_counter()
        p = subprocess.run(
            ["postmark", fh.name], cwd=d, capture_output=True, stdin=subprocess.DEVNULL
        )
        wall, cpu = time.perf_counter() - t0, _cpu_children() - c0
    shutil.rmtree(d)
    if p.returncode not in (0, -8):  # -8: its report divides by whole seconds (SIGFPE)
        raise SystemExit(f"postmark failed on {where} (exit {p.returncode})")
    return wall, cpu


def lfs_run(tmp: Path, profile: bool = False, writeback: bool = True) -> dict[str, Any]:
    img, mp = tmp / "lfs.img", tmp / "mnt"
    mp.mkdir()
    mkfs(img, segments=SECTORS * 512 // (BPS * 4096), blocks_per_segment=BPS)
    counts: collections.Counter[str] = collections.Counter()
    cpu_ns: collections.Counter[str] = collections.Counter()
    out: dict[str, Any] = {}
    mounted = threading.Event()

    def workload() -> None:
        try:
            mounted.wait(30)
            while not os.path.ismount(mp):
                time.sleep(0.01)
            counts.clear()
            cpu_ns.clear()
            cpu0 = _cpu_self()
            out["wall"], out["postmark_cpu"] = postmark(mp)
            out["server_cpu"] = _cpu_self() - cpu0  # this thread only waits meanwhile
            out["requests"] = dict(counts)
            out["handler_cpu"] = {k: v / 1e9 for k, v in cpu_ns.items()}
        finally:
            subprocess.run(["fusermount3", "-u", str(mp)], check=False)

    real = lfs_mount.LfsOperations
    lfs_mount.LfsOperations = counting_operations(counts, cpu_ns)
    thread = threading.Thread(target=workload)
    thread.start()
    # The requests are served on this thread (the C loop calls back into it): a profiler
    # turned on here sees every handler (and the mount's own start and close).
    profiler = cProfile.Profile() if profile else None
    try:
        if profiler:
            profiler.enable()
        lfs_mount.mount(img, mp, writeback=writeback, ready=lambda pid: mounted.set())
    finally:
        if profiler:
            profiler.disable()
            out["profile"] = profiler
        lfs_mount.LfsOperations = real
        thread.join()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument(
        "--no-writeback", action="store_true", help="without the kernel's writeback cache"
    )
    ap.add_argument(
        "--profile", type=int, metavar="N", help="profile the server: its N costliest functions"
    )
    args = ap.parse_args()
    why = lfs_mount.fuse_available()
    if why is not None or not can_loop_mount() or shutil.which("postmark") is None:
        raise SystemExit(f"needs FUSE, root with loop devices and postmark ({why or 'ok'})")
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    for run in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="fsage-lfsreq-", dir=shm) as t:
            lfs = lfs_run(Path(t), profile=bool(args.profile), writeback=not args.no_writeback)
            ext_img = Path(t) / "ext4.img"
            with open(ext_img, "wb") as f:
                f.truncate(SECTORS * 512)
            subprocess.run(
                ["mke2fs", "-q", "-t", "ext4", "-b", "4096", "-F", str(ext_img)], check=True
            )
            with loop_mount(ext_img) as emp:
                ext_wall, ext_cpu = postmark(emp)
        n = sum(lfs["requests"].values())
        kinds = ", ".join(
            f"{k} {v}" for k, v in sorted(lfs["requests"].items(), key=lambda kv: -kv[1])
        )
        cpu = lfs["postmark_cpu"] + lfs["server_cpu"]
        print(f"run {run + 1}: {n} requests ({kinds})")
        server = lfs["server_cpu"]
        print(
            f"  LFS: wall {lfs['wall']:.3f} s, CPU {cpu:.3f} s (PostMark "
            f"{lfs['postmark_cpu']:.3f}, server {server:.3f} = "
            f"{server / max(n, 1) * 1e6:.1f} us/request)"
        )
        hc = lfs["handler_cpu"]
        costly = sorted(hc, key=lambda k: -hc[k])
        print(
            f"  handlers: {sum(hc.values()):.3f} s CPU in Python; by kind, us per request: "
            + ", ".join(f"{k} {hc[k] / lfs['requests'][k] * 1e6:.0f}" for k in costly)
        )
        print(
            f"  ext4: wall {ext_wall:.3f} s, CPU {ext_cpu:.3f} s; LFS/ext4: wall "
            f"{lfs['wall'] / ext_wall:.1f}x, CPU {cpu / max(ext_cpu, 1e-3):.1f}x"
        )
        if args.profile:
            stats = pstats.Stats(lfs["profile"])
            stats.sort_stats("tottime").print_stats(args.profile)
            stats.sort_stats("cumulative").print_stats(args.profile)


if __name__ == "__main__":
    main()
