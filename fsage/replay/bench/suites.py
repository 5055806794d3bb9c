"""The benchmark suites. Each writes only inside its own directory on the target
(:attr:`BenchTarget.bench_dir`) and returns its measurements as :class:`Result` rows.

* ``seq`` / ``seq-fsync`` (seed 000 §2, §2.3): a data set (32 MB by default) as files of each size
  from 1 KB to 4 MB, at most 100 files per subdirectory; written, then read in creation order,
  cold before each phase. ``seq-fsync`` fsyncs each file after writing it.
* ``create-read`` (seed 002): the same with 25 files per directory — create, then read.
* ``postmark``: Debian's ``postmark`` with a generated configuration (:mod:`.postmark`).
* ``tpcb`` (seed 000 §3): an account file of 100-byte records in 4 KB blocks; each transaction
  reads a random account's block, updates the balance, writes the block back and appends a
  50-byte history record. Branch and teller records stay in memory (they are in the seed's
  configuration too) and are written at the end.
* ``hfs-aging`` (seed 004 §6.4): the ager's ``hfs-aging-10k/20k/40k`` profiles run in the
  benchmark's directory through the kernel; time and I/O counts.
"""

from __future__ import annotations

import os
import random
import struct
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fsage.errors import FsageError, UsageError
from fsage.replay.bench.paired import StoppingRule
from fsage.replay.bench.postmark import (
    DEFAULT_VARIANT,
    POSTMARK,
    VARIANTS,
    parse_report,
)
from fsage.replay.bench.target import BenchTarget, DiskStats, read_proc_io

KIB = 1024
MIB = 1024 * KIB
SEQ_SIZES = [KIB << i for i in range(13)]  # 1 KB .. 4 MB
SEQ_DEFAULT_DATA = 32 * MIB
HFS_VARIANTS = {"10k": "hfs-aging-10k", "20k": "hfs-aging-20k", "40k": "hfs-aging-40k"}


def check_variant(opts: BenchOptions) -> str | None:
    """The variant ``opts`` asks of its suite (its default when none is given), or None for a
    suite without variants; UsageError for one the suite does not have. Checked before the
    target is touched, and again by the suite."""
    tables: dict[str, dict[str, Any]] = {"postmark": dict(VARIANTS), "hfs-aging": HFS_VARIANTS}
    table = tables.get(opts.suite)
    if table is None:
        return None
    variant = opts.variant or (DEFAULT_VARIANT if opts.suite == "postmark" else "10k")
    if variant not in table:
        raise UsageError(f"unknown {opts.suite} variant {variant!r} ({', '.join(table)})")
    return variant


TPCB_RECORD = 100
TPCB_BLOCK = 4096
TPCB_PER_BLOCK = TPCB_BLOCK // TPCB_RECORD  # 40 records in a 4 KB block
TPCB_HISTORY = 50
TPCB_DEFAULT_TX = 10_000
TPCB_DEFAULT_MAX = 32 * MIB


@dataclass
class BenchOptions:
    suite: str
    size: int | None = None  # data set / account bytes; files (postmark); ops (hfs-aging)
    variant: str | None = None  # postmark: seed003|50k|100k|150k; hfs-aging: 10k|20k|40k
    transactions: int | None = None  # postmark, tpcb
    file_sizes: list[int] | None = None  # seq, seq-fsync, create-read
    seed: int = 42
    keep: bool = False
    name: str | None = None
    repeat: int = 1  # rounds at least; results are the medians
    #: With a reference (the baseline, the scan's clean copy), rounds go on until the paired
    #: ratio's interval is this wide relative to its median, or ``budget`` seconds are spent
    #: (see :mod:`.paired`); ``max_repeat`` rounds at most.
    ci_width: float = 0.10
    budget: float = 0.0
    #: Stop as soon as every paired ratio's verdict (higher/lower) is decided.
    until_decided: bool = False
    max_repeat: int = 30
    baseline: bool = False  # also run it on an empty file system of the same mkfs parameters
    path: str | None = None  # scan: the tree to read, inside the file system (default: all)
    trace: bool = False  # scan: trace each scan's block requests


def stopping_rule(opts: BenchOptions) -> StoppingRule:
    """The rounds ``opts`` asks for: at least ``repeat``, then until the interval is within
    ``ci_width`` or ``budget`` seconds are spent (or, ``until_decided``, every verdict is
    decided), ``max_repeat`` at most."""
    n = max(opts.repeat, 1)
    return StoppingRule(n, opts.ci_width, opts.budget, max(opts.max_repeat, n),
                        decided=opts.until_decided)  # fmt: skip


@dataclass
class Result:
    metric: str
    value: float
    unit: str
    params: dict[str, Any] = field(default_factory=dict)
    group: str | None = None  # directory below the run's own directory these files are in


@dataclass
class SuiteOutput:
    results: list[Result]
    params: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    keeps_files: bool = True  # False: the suite's files are gone (postmark deletes its own)


Say = Callable[[str], None]


def size_label(n: int) -> str:
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return f"{n}B"


def parse_size(text: str) -> int:
    """'32M', '64K', '4096', '1G' -> bytes (powers of 1024)."""
    t = text.strip().upper().removesuffix("B")
    mult = 1
    for unit, m in (("K", KIB), ("M", MIB), ("G", 1 << 30)):
        if t.endswith(unit):
            t, mult = t[:-1], m
            break
    try:
        value = float(t) * mult
    except ValueError:
        raise UsageError(f"not a size: {text!r} (e.g. 4096, 64K, 32M)") from None
    if value <= 0:
        raise UsageError(f"not a positive size: {text!r}")
    return int(value)


def _write_all(fd: int, buf: memoryview) -> None:
    while buf:
        n = os.write(fd, buf)
        buf = buf[n:]


def _read_all(fd: int, bufsize: int) -> int:
    got = 0
    while True:
        chunk = os.read(fd, bufsize)
        if not chunk:
            return got
        got += len(chunk)


def _cold(tgt: BenchTarget, notes: list[str]) -> bool:
    return tgt.cold()


# ---------------------------------------------------------------------- seq / create-read


def _files_phase(
    tgt: BenchTarget, opts: BenchOptions, say: Say, *, per_dir: int, fsync: bool, label: str
) -> SuiteOutput:
    total = opts.size or SEQ_DEFAULT_DATA
    sizes = sorted(set(opts.file_sizes or SEQ_SIZES))
    too_big = [s for s in sizes if s > total]
    sizes = [s for s in sizes if s <= total]
    notes = []
    if too_big:
        notes.append(
            f"file sizes above the {size_label(total)} data set skipped: "
            + ", ".join(size_label(s) for s in too_big)
        )
    if not sizes:
        raise UsageError(f"no file size fits in a {size_label(total)} data set")
    need = sum((total // s) * s for s in sizes)
    free = tgt.free_bytes()
    st = tgt.statvfs()
    free_inodes = int(st.f_favail) if st.f_files else 1 << 62  # 0 files: no inode limit
    if opts.size is None:
        # The default set is scaled down (halved until it fits in 80 % of the free space and
        # of the free inodes), so it runs on a small recreation too; the size is recorded.
        scaled = total
        while scaled > max(sizes) and (
            _set_bytes(scaled, sizes) > free * 0.8
            or _set_inodes(scaled, sizes, per_dir) > free_inodes * 0.8
        ):
            scaled //= 2
        if scaled != total:
            notes.append(
                f"data set scaled down from {size_label(total)} to {size_label(scaled)} per file "
                f"size to fit {free / MIB:.1f} MiB and {free_inodes:,} inodes free"
            )
            say(f"fsage: {notes[-1]}")
            total = scaled
            need = _set_bytes(total, sizes)
    if _set_inodes(total, sizes, per_dir) > free_inodes:
        raise UsageError(
            f"{tgt.path}: the {label} data set needs {_set_inodes(total, sizes, per_dir):,} "
            f"inodes but {free_inodes:,} are free; use --size or --file-size"
        )
    if need > free * 0.95:
        raise UsageError(
            f"{tgt.path}: the {label} data set needs {need / MIB:.1f} MiB "
            f"({size_label(total)} for each of {len(sizes)} file sizes) but "
            f"{free / MIB:.1f} MiB are free; use --size or --file-size"
        )
    rng = random.Random(opts.seed)
    data = memoryview(rng.randbytes(max(sizes)))
    readbuf = 1 * MIB
    results: list[Result] = []
    base = tgt.bench_dir
    for s in sizes:
        n = total // s
        group = f"{label}-{size_label(s)}"
        gdir = base / group
        gdir.mkdir()
        paths = [gdir / f"d{i // per_dir:04d}" / f"f{i % per_dir:03d}" for i in range(n)]
        _cold(tgt, notes)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
        t0 = time.perf_counter()
        for i, p in enumerate(paths):
            if i % per_dir == 0:
                p.parent.mkdir()
            fd = os.open(p, flags, 0o644)
            try:
                _write_all(fd, data[:s])
                if fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
        os.sync()
        t_write = time.perf_counter() - t0
        _cold(tgt, notes)
        t0 = time.perf_counter()
        got = 0
        for p in paths:
            fd = os.open(p, os.O_RDONLY)
            try:
                got += _read_all(fd, readbuf)
            finally:
                os.close(fd)
        t_read = time.perf_counter() - t0
        if got != n * s:
            raise FsageError(f"{label}: read {got} bytes back, wrote {n * s}")
        common = {"file_size": s, "files": n, "files_per_dir": per_dir}
        kb = n * s / KIB
        results.append(Result("write", kb / t_write, "KB/s", {**common, "seconds": t_write}, group))
        results.append(Result("read", kb / t_read, "KB/s", {**common, "seconds": t_read}, group))
        if label == "create-read":
            results.append(
                Result("creates", n / t_write, "files/s", {**common, "seconds": t_write}, group)
            )
        say(
            f"  {size_label(s):>4}: {n} files, write {kb / 1024 / t_write:,.1f} MB/s, "
            f"read {kb / 1024 / t_read:,.1f} MB/s"
        )
    params = {
        "data_size": total,
        "file_sizes": sizes,
        "files_per_dir": per_dir,
        "fsync": fsync,
        "seed": opts.seed,
    }
    return SuiteOutput(results, params, notes)


def _set_bytes(total: int, sizes: list[int]) -> int:
    return sum((total // s) * s for s in sizes)


def _set_inodes(total: int, sizes: list[int], per_dir: int) -> int:
    """Files, their directories and one directory per file size."""
    return sum(total // s + -(-(total // s) // per_dir) + 1 for s in sizes)


def run_seq(tgt: BenchTarget, opts: BenchOptions, say: Say) -> SuiteOutput:
    return _files_phase(tgt, opts, say, per_dir=100, fsync=False, label="seq")


def run_seq_fsync(tgt: BenchTarget, opts: BenchOptions, say: Say) -> SuiteOutput:
    return _files_phase(tgt, opts, say, per_dir=100, fsync=True, label="seq-fsync")


def run_create_read(tgt: BenchTarget, opts: BenchOptions, say: Say) -> SuiteOutput:
    return _files_phase(tgt, opts, say, per_dir=25, fsync=False, label="create-read")


# ---------------------------------------------------------------------- postmark


def _io_results(
    before: DiskStats | None, after: DiskStats | None, params: dict[str, Any]
) -> list[Result]:
    if before is None or after is None:
        return []
    d = after - before
    ios = d.read_ios + d.write_ios
    out = [
        Result("read_ios", d.read_ios, "requests", params),
        Result("write_ios", d.write_ios, "requests", params),
        Result("read_bytes", d.read_sectors * 512, "bytes", params),
        Result("write_bytes", d.write_sectors * 512, "bytes", params),
    ]
    if ios:
        out.append(Result("avg_io_time", (d.read_ms + d.write_ms) / ios, "ms", params))
    return out


def _device_note(tgt: BenchTarget) -> str | None:
    if tgt.image is not None:
        return None
    return (
        "I/O counts are those of the whole block device holding the directory: "
        "other activity on that device counts too"
    )


def run_postmark(tgt: BenchTarget, opts: BenchOptions, say: Say) -> SuiteOutput:
    import shutil
    from dataclasses import replace

    if shutil.which(POSTMARK) is None:
        raise UsageError("the postmark suite needs Debian's postmark (apt-get install postmark)")
    variant = check_variant(opts)
    assert variant is not None
    cfg = VARIANTS[variant]
    if opts.size:
        cfg = replace(cfg, files=opts.size)
    if opts.transactions:
        cfg = replace(cfg, transactions=opts.transactions)
    cfg = replace(cfg, seed=opts.seed)
    notes: list[str] = []
    pm_dir = tgt.bench_dir / "postmark"
    pm_dir.mkdir()
    # postmark keeps the location in a short fixed buffer: run it in the directory.
    script = cfg.script(".")
    _cold(tgt, notes)
    ds0 = tgt.diskstats()
    with tempfile.NamedTemporaryFile("w", prefix="fsage-postmark-", suffix=".cfg") as fh:
        fh.write(script)
        fh.flush()
        t0 = time.perf_counter()
        proc = subprocess.run(
            [POSTMARK, fh.name],
            capture_output=True,
            text=True,
            errors="replace",
            stdin=subprocess.DEVNULL,
            cwd=pm_dir,
            check=False,
        )
        os.sync()
        wall = time.perf_counter() - t0
    ds1 = tgt.diskstats()
    if proc.returncode == -8:
        # SIGFPE: postmark divides by the transaction phase's whole seconds. Another size
        # would not compare with other runs; the user picks one.
        raise FsageError(
            f"postmark died of SIGFPE: its {cfg.transactions} transactions took under one "
            "second (it divides by whole seconds); give more with --transactions"
        )
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
        raise FsageError(f"postmark failed (exit {proc.returncode}): {tail[0]}")
    rep = parse_report(proc.stdout)
    p = {"variant": variant}
    results = [
        Result("transactions", rep.transactions_per_second, "transactions/s", p),
        Result("read", rep.read_kb_per_second, "KB/s", p),
        Result("write", rep.write_kb_per_second, "KB/s", p),
        Result("total_time", rep.seconds_total, "s", p),
        Result("transaction_time", rep.seconds_transactions, "s", p),
        Result("created", rep.created_per_second, "files/s", p),
        Result("deletion_rate", rep.deleted_per_second, "files/s", p),
        Result("wall_time", wall, "s", p),
    ]
    results += _io_results(ds0, ds1, p)
    note = _device_note(tgt)
    if note and ds0 is not None:
        notes.append(note)
    notes.append(
        "postmark deletes its files before it exits: there is no layout score for the "
        "benchmark's own files"
    )
    if wall < 5:
        notes.append(
            f"postmark ran for {wall:.2f} s and times in whole seconds: its rates are coarse; "
            "wall_time is fsage's own timing"
        )
    say(
        f"  postmark {variant}: {rep.transactions_per_second:.0f} transactions/s, "
        f"read {rep.read_kb_per_second:.1f} KB/s, write {rep.write_kb_per_second:.1f} KB/s"
    )
    params = {"variant": variant, **cfg.to_json(), "config": script, "output": proc.stdout}
    return SuiteOutput(results, params, notes, keeps_files=False)


# ---------------------------------------------------------------------- tpcb

_ACCOUNT = struct.Struct("<IIq")  # account id, branch id, balance; the rest of 100 bytes is filler
_HIST = struct.Struct("<IIIqd")  # account, teller, branch, delta, time; padded to 50 bytes


def run_tpcb(tgt: BenchTarget, opts: BenchOptions, say: Say) -> SuiteOutput:
    notes: list[str] = []
    util = tgt.utilization()
    free = tgt.free_bytes()
    # A fixed size (not a share of the free space), so runs on different file systems and
    # at different ages compare.
    account_bytes = opts.size or TPCB_DEFAULT_MAX
    notes.append(
        f"account file of {account_bytes / MIB:.1f} MiB at the file system's utilization {util:.3f}"
    )
    nblocks = account_bytes // TPCB_BLOCK
    if nblocks < 1:
        raise UsageError("the tpcb account file needs at least one 4 KB block")
    if nblocks * TPCB_BLOCK > free * 0.95:
        raise UsageError(
            f"{tgt.path}: an account file of {nblocks * TPCB_BLOCK / MIB:.1f} MiB does not fit "
            f"in {free / MIB:.1f} MiB free"
        )
    accounts = nblocks * TPCB_PER_BLOCK
    tellers, branches = 100, 10
    ntx = opts.transactions or TPCB_DEFAULT_TX
    d = tgt.bench_dir / "tpcb"
    d.mkdir()
    account_path, history_path = d / "account", d / "history"
    # Load: write the account file block by block, every balance zero.
    t0 = time.perf_counter()
    fd = os.open(account_path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        chunk = 256
        for first in range(0, nblocks, chunk):
            buf = bytearray(TPCB_BLOCK * min(chunk, nblocks - first))
            for b in range(len(buf) // TPCB_BLOCK):
                base_id = (first + b) * TPCB_PER_BLOCK
                for r in range(TPCB_PER_BLOCK):
                    acct = base_id + r
                    _ACCOUNT.pack_into(
                        buf, b * TPCB_BLOCK + r * TPCB_RECORD, acct, acct % branches, 0
                    )
            _write_all(fd, memoryview(buf))
        os.fsync(fd)
    finally:
        os.close(fd)
    load = time.perf_counter() - t0
    rng = random.Random(opts.seed)
    teller_bal = [0] * tellers
    branch_bal = [0] * branches
    _cold(tgt, notes)
    fd = os.open(account_path, os.O_RDWR)
    hfd = os.open(history_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
    total_delta = 0
    try:
        t0 = time.perf_counter()
        for _ in range(ntx):
            acct = rng.randrange(accounts)
            teller = rng.randrange(tellers)
            branch = acct % branches
            delta = rng.randint(-99999, 99999)
            off = (acct // TPCB_PER_BLOCK) * TPCB_BLOCK
            block = bytearray(os.pread(fd, TPCB_BLOCK, off))
            roff = (acct % TPCB_PER_BLOCK) * TPCB_RECORD
            aid, bid, bal = _ACCOUNT.unpack_from(block, roff)
            if aid != acct:
                raise FsageError(f"tpcb: account block {off // TPCB_BLOCK} holds the wrong record")
            _ACCOUNT.pack_into(block, roff, aid, bid, bal + delta)
            os.pwrite(fd, block, off)
            teller_bal[teller] += delta
            branch_bal[branch] += delta
            total_delta += delta
            rec = _HIST.pack(acct, teller, branch, delta, time.time())
            os.write(hfd, rec.ljust(TPCB_HISTORY, b"\0"))
        os.fsync(fd)
        os.fsync(hfd)
        elapsed = time.perf_counter() - t0
    finally:
        os.close(fd)
        os.close(hfd)
    small = bytearray(TPCB_RECORD * (tellers + branches))
    for i, v in enumerate(teller_bal + branch_bal):
        struct.pack_into("<Iq", small, i * TPCB_RECORD, i, v)
    (d / "teller_branch").write_bytes(bytes(small))
    # Consistency: the account balances add up to the history's deltas.
    balance = 0
    with open(account_path, "rb") as fh:
        while blk := fh.read(TPCB_BLOCK * 256):
            for b in range(0, len(blk), TPCB_BLOCK):
                for r in range(TPCB_PER_BLOCK):
                    balance += _ACCOUNT.unpack_from(blk, b + r * TPCB_RECORD)[2]
    hist = history_path.stat().st_size
    if balance != total_delta or hist != ntx * TPCB_HISTORY:
        raise FsageError("tpcb: account balances do not add up to the history")
    p = {"transactions": ntx, "accounts": accounts}
    results = [
        Result("tps", ntx / elapsed, "transactions/s", {**p, "seconds": elapsed}),
        Result("load_time", load, "s", p),
    ]
    say(f"  tpcb: {ntx} transactions on {accounts} accounts, {ntx / elapsed:,.0f} TPS")
    params = {
        "account_bytes": nblocks * TPCB_BLOCK,
        "accounts": accounts,
        "record": TPCB_RECORD,
        "block": TPCB_BLOCK,
        "transactions": ntx,
        "utilization": util,
        "seed": opts.seed,
        "balance_check": "ok",
    }
    return SuiteOutput(results, params, notes)


# ---------------------------------------------------------------------- hfs-aging


def run_hfs_aging(tgt: BenchTarget, opts: BenchOptions, say: Say) -> SuiteOutput:
    from fsage.ager.profile import get_preset
    from fsage.ager.run import AgeOptions, age

    variant = check_variant(opts)
    assert variant is not None
    profile = get_preset(HFS_VARIANTS[variant]).with_overrides(ops_limit=opts.size)
    notes: list[str] = []
    d = tgt.bench_dir / "hfs-aging"
    d.mkdir()
    _cold(tgt, notes)
    ds0 = tgt.diskstats()
    io0 = read_proc_io()
    t0 = time.perf_counter()
    res = age(d, AgeOptions(profile=profile, seed=opts.seed, mode="auto"))
    os.sync()
    elapsed = time.perf_counter() - t0
    ds1 = tgt.diskstats()
    io1 = read_proc_io()
    p = {"variant": variant, "ops": res.ops}
    results = [
        Result("time", elapsed, "s", p),
        Result("ops_per_second", res.ops / elapsed if elapsed else 0.0, "ops/s", p),
        Result("bytes_written", res.bytes_written, "bytes", p),
    ]
    results += _io_results(ds0, ds1, p)
    for key in ("read_bytes", "write_bytes", "syscr", "syscw"):
        if key in io0 and key in io1:
            unit = "bytes" if key.endswith("bytes") else "calls"
            results.append(Result(f"process_{key}", io1[key] - io0[key], unit, p))
    note = _device_note(tgt)
    if note and ds0 is not None:
        notes.append(note)
    if res.nospace:
        notes.append(f"{res.nospace} ops ran out of space")
    say(f"  hfs-aging {variant}: {res.ops} ops in {elapsed:.2f} s")
    params = {
        "variant": variant,
        "profile": profile.name,
        "ops_limit": profile.ops_limit,
        "ops": res.ops,
        "seed": opts.seed,
    }
    return SuiteOutput(results, params, notes)


SUITES: dict[str, Callable[[BenchTarget, BenchOptions, Say], SuiteOutput]] = {
    "seq": run_seq,
    "seq-fsync": run_seq_fsync,
    "create-read": run_create_read,
    "postmark": run_postmark,
    "tpcb": run_tpcb,
    "hfs-aging": run_hfs_aging,
}
