"""Seed 003's Table 1, and seed 000's LFS-vs-FFS comparisons, on fsage's LFS mounted through
FUSE (``fsage lfs mount``) and on ext4 on a loop device, in the same run.

Table 1 (seed 003 §4), both file systems on images in /dev/shm (the paper's memdisk,
/run/shm): the paper's geometry (50,000 sectors; LFS segments of 64 KB, 4 KB blocks; ext4 with
4 KB blocks), and its test cases as shell loops, timed from outside:

* mkfs — ``fsage lfs mkfs`` (a Python process) against ``mke2fs -t ext4``;
* touch+ls — ``for i in $(seq 1 100); do touch $D/$i; ls $D > /dev/null; done``;
* echo+cat — ``for i in $(seq 1 100); do echo '0123456789ABCDEF' >$D/$i; cat $D/$i; done``;
* dd — ``for i in $(seq 1 16); do dd if=/dev/zero of=$D/$i bs=1024 count=1024; done``;
* postmark — Debian's postmark: 500 files, 500 transactions, 500 B–9.77 KB, 100
  subdirectories, seed 42 (its own report counts whole seconds, so the wall time is given too).

Each case runs in a fresh directory, removed afterwards. Target: LFS ≤ 2× ext4 on PostMark
(the paper's LFS took 41 s, ext4 1 s). PostMark's CPU time is given too (PostMark's own, with
the kernel's work for it, plus the FUSE server's): on a shared machine wall times of a few
hundredths of a second say more about the other processes than about the file system.

``--seq``: seed 000 Figures 1–2 (read and write throughput by file size, 1 KB–4 MB) with
``fsage bench --suite seq``; ``--tpcb``: Figure 4 (TPC-B transactions/s against utilization)
with ``fsage bench --suite tpcb``, the LFS at each utilization with its cleaner and, as the
paper does for "no cleaner", on an image large enough that the cleaner never runs. These use
fsage's default LFS geometry (1 MB segments) on images in the temporary directory.

PostMark also runs on ``bench/fuse_floor.c`` (``bench/lfs_floor.py``: the least any FUSE server
costs, with fsage's mount options): the line "any FUSE server" is the floor under the LFS.

    sudo PYTHONPATH=. python3 bench/lfs_table1.py [--seq] [--tpcb] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fsage.ager.images import can_loop_mount, loop_mount
from fsage.lfs.mount import fuse_available
from fsage.replay.bench.postmark import VARIANTS

REPO = Path(__file__).resolve().parent.parent
SECTORS = 50_000  # the paper's disks: 50,000 512-octet sectors
LFS_BPS = 16  # 64 KB segments of 4 KB blocks (mklfs -l65536 -b8)
DEFAULT_BPS = 256  # fsage's default: 1 MB segments (seed 000's comparisons)

CASES = {
    "touch+ls": "for i in $(seq 1 100); do touch $D/$i; ls $D > /dev/null; done",
    "echo+cat": "for i in $(seq 1 100); do echo '0123456789ABCDEF' >$D/$i; cat $D/$i; done",
    "dd": "for i in $(seq 1 16); do dd if=/dev/zero of=$D/$i bs=1024 count=1024 2>/dev/null; done",
}


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _timed(argv: list[str], **kw: Any) -> tuple[float, subprocess.CompletedProcess[str]]:
    t = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, **kw)
    return time.perf_counter() - t, proc


def mkfs_lfs(image: Path, sectors: int, bps: int = LFS_BPS) -> float:
    segs = sectors * 512 // (bps * 4096)
    cmd = [sys.executable, "-m", "fsage", "lfs", "mkfs", str(image), "--segments", str(segs)]
    dt, p = _timed([*cmd, "--blocks-per-segment", str(bps)], env=_env())
    if p.returncode:
        raise SystemExit(f"fsage lfs mkfs failed: {p.stderr.strip()}")
    return dt


def mkfs_ext4(image: Path, sectors: int) -> float:
    with open(image, "wb") as f:
        f.truncate(sectors * 512)
    dt, p = _timed(["mke2fs", "-q", "-t", "ext4", "-b", "4096", "-F", str(image)])
    if p.returncode:
        raise SystemExit(f"mke2fs failed: {p.stderr.strip()}")
    return dt


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) the threads of process ``pid`` have used so far: from
    schedstat (nanoseconds) where the kernel keeps it, else /proc/PID/stat (10 ms ticks: a
    FUSE server's whole share of one PostMark run is a few ticks)."""
    try:
        return (
            sum(
                int(t.joinpath("schedstat").read_text().split()[0])
                for t in Path(f"/proc/{pid}/task").iterdir()
            )
            / 1e9
        )
    except (OSError, ValueError, IndexError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


#: The process serving each FUSE mount point (``lfs_mounted``).
SERVER_PID: dict[Path, int] = {}


@contextlib.contextmanager
def lfs_mounted(image: Path, *args: str) -> Iterator[Path]:
    """``fsage lfs mount`` (daemon); on exit ``fusermount3 -u`` and wait for the checkpoint."""
    mp = Path(tempfile.mkdtemp(prefix="fsage-lfs-mnt-"))
    p = subprocess.run(
        [sys.executable, "-m", "fsage", "lfs", "mount", str(image), str(mp), *args],
        capture_output=True,
        text=True,
        env=_env(),
        check=False,
    )
    if p.returncode:
        mp.rmdir()
        raise SystemExit(f"fsage lfs mount failed: {p.stderr.strip()}")
    m = re.search(r"\(pid (\d+)\)", p.stdout)
    pid = int(m.group(1)) if m else 0
    SERVER_PID[mp] = pid
    try:
        yield mp
    finally:
        SERVER_PID.pop(mp, None)
        subprocess.run(["fusermount3", "-u", str(mp)], check=False)
        for _ in range(600):
            if not pid or not Path(f"/proc/{pid}").exists():
                break
            time.sleep(0.05)
        with contextlib.suppress(OSError):
            mp.rmdir()


def run_case(mp: Path, name: str) -> float:
    d = mp / f"t1-{name.replace('+', '-')}"
    d.mkdir()
    try:
        dt, p = _timed(["bash", "-c", CASES[name]], env={**os.environ, "D": str(d)})
        if p.returncode:
            raise SystemExit(f"{name} failed on {mp}: {p.stderr.strip()[-200:]}")
        return dt
    finally:
        shutil.rmtree(d)


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_postmark(mp: Path) -> dict[str, Any]:
    """PostMark in a fresh directory of ``mp``: wall time, and CPU time of PostMark (with the
    kernel's work for it) plus that of the process serving the mount, if any: on a loaded
    machine the CPU time is the figure to compare."""
    d = mp / "t1-postmark"
    d.mkdir()
    script = VARIANTS["seed003"].script(".")
    server = SERVER_PID.get(mp, 0)
    with tempfile.NamedTemporaryFile("w", suffix=".pm") as fh:
        fh.write(script)
        fh.flush()
        cpu0, srv0 = _children_cpu(), process_cpu(server) if server else 0.0
        dt, p = _timed(["postmark", fh.name], cwd=d, stdin=subprocess.DEVNULL)
        cpu1, srv1 = _children_cpu(), process_cpu(server) if server else 0.0
    left = list(d.iterdir())
    shutil.rmtree(d)
    if p.returncode not in (0, -signal.SIGFPE) or left:
        raise SystemExit(f"postmark failed on {mp} (exit {p.returncode}): {p.stdout[-300:]}")
    out: dict[str, Any] = {
        "wall": dt,
        "cpu": cpu1 - cpu0 + srv1 - srv0,
        "postmark_cpu": cpu1 - cpu0,
        "server_cpu": srv1 - srv0,
    }
    m = re.search(r"(\d+) seconds total", p.stdout)
    t = re.search(r"(\d+) seconds of transactions", p.stdout)
    out["total"] = int(m.group(1)) if m else None
    out["transactions"] = int(t.group(1)) if t else None
    if p.returncode:
        out["note"] = "postmark's report died of SIGFPE (transactions under one second)"
    return out


def table1(tmp: Path) -> dict[str, dict[str, Any]]:
    res: dict[str, dict[str, Any]] = {"lfs": {}, "ext4": {}}
    lfs_img, ext_img = tmp / "lfs.disk", tmp / "ext4.disk"
    res["lfs"]["mkfs"] = mkfs_lfs(lfs_img, SECTORS)
    res["ext4"]["mkfs"] = mkfs_ext4(ext_img, SECTORS)
    with lfs_mounted(lfs_img) as lmp, loop_mount(ext_img) as emp:
        for fs, mp in (("lfs", lmp), ("ext4", emp)):
            for case in CASES:
                res[fs][case] = run_case(mp, case)
            res[fs]["postmark"] = run_postmark(mp)
    # The floor: the same PostMark on a minimal in-memory FUSE server in C with fsage's mount
    # options (bench/lfs_floor.py); what it takes is the kernel's FUSE path.
    from bench.lfs_floor import SAME_AS_FSAGE, VARIANTS, build_floor, floor_postmark

    res["floor"] = {"postmark": floor_postmark(build_floor(tmp), VARIANTS[SAME_AS_FSAGE])}
    return res


def print_table1(res: dict[str, dict[str, Any]]) -> None:
    print("Seed 003 Table 1 (seconds; images in /dev/shm; paper: LFS / ext4)")
    paper = {
        "mkfs": "0.169 / 0.058",
        "touch+ls": "0.536 / 0.368",
        "echo+cat": "0.515 / 0.140",
        "dd": "7.987 / 0.102",
    }
    print(f"{'test case':22} {'LFS (FUSE)':>11} {'ext4':>9} {'ratio':>7}   paper")
    for case in ("mkfs", *CASES):
        a, b = res["lfs"][case], res["ext4"][case]
        print(f"{case:22} {a:11.3f} {b:9.3f} {a / b:7.2f}   {paper[case]}")
    lp, ep = res["lfs"]["postmark"], res["ext4"]["postmark"]
    print(
        f"{'postmark: wall':22} {lp['wall']:11.3f} {ep['wall']:9.3f} "
        f"{lp['wall'] / ep['wall']:7.2f}   (target <= 2)"
    )
    print(
        f"{'postmark: CPU':22} {lp['cpu']:11.3f} {ep['cpu']:9.3f} "
        f"{lp['cpu'] / max(ep['cpu'], 1e-3):7.2f}   (PostMark + the FUSE server)"
    )
    print(
        f"{'  of which PostMark':22} {lp['postmark_cpu']:11.3f} {ep['postmark_cpu']:9.3f} "
        f"{'':7}   (with the kernel's work for it)"
    )
    print(f"{'  of which the server':22} {lp['server_cpu']:11.3f} {'-':>9}")
    fp = res["floor"]["postmark"]
    print(
        f"any FUSE server: {fp['wall']:.3f} s = {fp['wall'] / ep['wall']:.1f} x ext4, CPU "
        f"{fp['cpu']:.3f} s = {fp['cpu'] / max(ep['cpu'], 1e-3):.1f} x (bench/fuse_floor.c: in "
        f"memory, fsage's mount options); fsage's LFS {lp['wall'] / fp['wall']:.1f} x that, "
        f"CPU {lp['cpu'] / max(fp['cpu'], 1e-3):.1f} x"
    )
    for key, label, pap in (
        ("total", "total", "41 / 1"),
        ("transactions", "transaction", "26 / 1"),
    ):
        a, b = lp.get(key), ep.get(key)
        print(
            f"{'postmark: ' + label:22} {a if a is not None else '-':>11} "
            f"{b if b is not None else '-':>9} {'':>7}   {pap} (postmark's whole seconds)"
        )
    for fs in ("lfs", "ext4"):
        if res[fs]["postmark"].get("note"):
            print(f"note ({fs}): {res[fs]['postmark']['note']}")


# ---------------------------------------------------------------------------- seed 000


def bench_json(mp: Path, *args: str) -> dict[str, Any]:
    p = subprocess.run(
        [sys.executable, "-m", "fsage", "bench", "run", str(mp), *args, "--format", "json"],
        capture_output=True,
        text=True,
        env=_env(),
        check=False,
    )
    if p.returncode:
        raise SystemExit(f"fsage bench {' '.join(args)} on {mp}: {p.stderr.strip()}")
    out: dict[str, Any] = json.loads(p.stdout)
    return out


def _results(doc: dict[str, Any]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = doc.get("results", [])
    return rows


def seq_tables(tmp: Path, size_mb: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    lfs_img, ext_img = tmp / "seq-lfs.img", tmp / "seq-ext4.img"
    sectors = (4 * size_mb * 13 + 64) * 2048  # 13 file sizes; the log a quarter full
    mkfs_lfs(lfs_img, sectors, DEFAULT_BPS)
    mkfs_ext4(ext_img, sectors)
    args = ("--suite", "seq", "--size", f"{size_mb}M")
    with lfs_mounted(lfs_img) as lmp:
        out["lfs"] = bench_json(lmp, *args)
    with loop_mount(ext_img) as emp:
        out["ext4"] = bench_json(emp, *args)
    return out


def print_seq(out: dict[str, Any]) -> None:
    def table(doc: dict[str, Any]) -> dict[tuple[str, int], float]:
        return {
            (r["metric"], int(r["params"]["file_size"])): r["value"] / 1024
            for r in _results(doc)
            if r.get("unit") == "KB/s" and "file_size" in r["params"]
        }

    lt, et = table(out["lfs"]), table(out["ext4"])
    print("\nSeed 000 Figures 1-2: sequential throughput by file size (MB/s; cold)")
    head = ("file size", "read LFS", "read ext4", "write LFS", "write ext4")
    print("{:>10} {:>9} {:>10} {:>10} {:>11}".format(*head))
    for s in sorted({k[1] for k in lt}):
        label = f"{s // 1024} KB" if s < 1 << 20 else f"{s >> 20} MB"
        print(
            f"{label:>10} {lt.get(('read', s), 0):9.1f} {et.get(('read', s), 0):10.1f} "
            f"{lt.get(('write', s), 0):10.1f} {et.get(('write', s), 0):11.1f}"
        )


def tpcb_table(tmp: Path, utils: list[float], tx: int) -> list[dict[str, Any]]:
    rows = []
    size_mb = 128
    account_mb = 8
    for u in utils:
        row: dict[str, Any] = {"utilization": u}
        for fs in ("lfs", "lfs-no-cleaner", "ext4"):
            img = tmp / f"tpcb-{fs}.img"
            big = fs == "lfs-no-cleaner"
            sectors = (size_mb * 8 if big else size_mb) * 2048
            if fs == "ext4":
                mkfs_ext4(img, sectors)
            else:
                mkfs_lfs(img, sectors, DEFAULT_BPS)
            ctx = loop_mount(img) if fs == "ext4" else lfs_mounted(img)
            doc: dict[str, Any] = {}
            try:
                with ctx as mp:
                    # Utilization of what the file system offers (statvfs), the account file
                    # included; the no-cleaner image offers 8 times the space and is filled
                    # to the same octets, so its cleaner never has to run.
                    v = os.statvfs(mp)
                    offered = v.f_blocks * v.f_frsize // (8 if big else 1)
                    used = (v.f_blocks - v.f_bfree) * v.f_frsize
                    _fill(mp / "filler", max(0, int(offered * u) - used - (account_mb << 20)))
                    args = ("--size", f"{account_mb}M", "--transactions", str(tx))
                    doc = bench_json(mp, "--suite", "tpcb", *args)
            except (OSError, SystemExit) as exc:  # a full file system is a result too
                row[f"{fs}_error"] = str(exc)
            img.unlink()
            tps = [r["value"] for r in _results(doc) if r["metric"] == "tps"]
            row[fs] = tps[0] if tps else None
        rows.append(row)
    return rows


def _fill(path: Path, n: int) -> None:
    chunk = os.urandom(1 << 20)
    with open(path, "wb") as f:
        while n > 0:
            f.write(chunk[: min(n, len(chunk))])
            n -= len(chunk)


def print_tpcb(rows: list[dict[str, Any]]) -> None:
    print("\nSeed 000 Figure 4: TPC-B transactions/s against utilization (128 MB file systems)")
    print(f"{'utilization':>11} {'LFS cleaner':>12} {'LFS no cleaner':>15} {'ext4':>8}")
    for r in rows:
        vals = [r.get(k) for k in ("lfs", "lfs-no-cleaner", "ext4")]
        cells = [f"{v:.0f}" if isinstance(v, (int, float)) else "-" for v in vals]
        print(f"{r['utilization']:11.2f} {cells[0]:>12} {cells[1]:>15} {cells[2]:>8}")
        for k in ("lfs", "lfs-no-cleaner", "ext4"):
            if r.get(f"{k}_error"):
                print(f"  {k} at {r['utilization']:.2f}: {r[f'{k}_error'][:160]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seq", action="store_true", help="seed 000 Figures 1-2 too")
    ap.add_argument("--seq-size", type=int, default=8, help="MB per file size (seq)")
    ap.add_argument("--tpcb", action="store_true", help="seed 000 Figure 4 too")
    ap.add_argument("--tpcb-tx", type=int, default=2000, help="transactions per TPC-B run")
    ap.add_argument(
        "--utils", default="0.3,0.5,0.7,0.8", help="TPC-B utilizations (comma-separated)"
    )
    ap.add_argument("--no-table1", action="store_true", help="only the seed 000 tables")
    ap.add_argument("--json", type=Path, help="write every figure here")
    args = ap.parse_args()
    why = fuse_available()
    if why is not None or not can_loop_mount() or shutil.which("postmark") is None:
        raise SystemExit(f"needs FUSE, root with loop devices and postmark ({why or 'ok'})")
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    report: dict[str, Any] = {}
    if not args.no_table1:
        with tempfile.TemporaryDirectory(prefix="fsage-t1-", dir=shm) as t:
            report["table1"] = table1(Path(t))
            print_table1(report["table1"])
    if args.seq:
        with tempfile.TemporaryDirectory(prefix="fsage-seq-") as t:
            report["seq"] = seq_tables(Path(t), args.seq_size)
            print_seq(report["seq"])
    if args.tpcb:
        with tempfile.TemporaryDirectory(prefix="fsage-tpcb-") as t:
            utils = [float(u) for u in args.utils.split(",")]
            report["tpcb"] = tpcb_table(Path(t), utils, args.tpcb_tx)
            print_tpcb(report["tpcb"])
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
