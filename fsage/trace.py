"""Block traces: the requests the kernel issued while a command read a file system, and
Conway et al.'s dynamic layout score of them (FAST'17, section 3; see fsage.analyzer.dynamic).

A trace comes from

* ``blktrace`` on the device (debugfs mounted at /sys/kernel/debug; fsage mounts it when it is
  not) turned into text by ``blkparse``;
* the kernel's ``blk`` tracer through tracefs, when blktrace cannot open its relay files (some
  kernels refuse them: the same events, in the same text form);
* or a ``blkparse`` text file made elsewhere (``fsage trace import``).

The score counts read requests as the device driver received them (action ``D``, "issued"; ``Q``
when a trace has no ``D`` events), in the order they were issued: 1 - (requests not starting
where the previous ended) / (blocks read). Sectors are converted to file-system blocks of the
snapshot's block size, relative to the start of the partition. A block is counted at its first
read only: a cold read reads every block once unless the page cache drops it meanwhile (memory
pressure, another process's ``drop_caches``), and such a re-read says nothing of the layout (the
modeled score reads each block once too); the blocks read again are counted apart
(``reread_blocks``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from fsage.analyzer.dynamic import request_score
from fsage.db import rowcheck
from fsage.db.store import Store
from fsage.errors import FsageError, SourceError, StoreError, UsageError

I64 = np.ndarray[Any, np.dtype[np.int64]]
SECTOR = 512
DEBUGFS = Path("/sys/kernel/debug")
TRACEFS_DIRS = (Path("/sys/kernel/tracing"), DEBUGFS / "tracing")
TRACE_BUFFER_KB = 65536
#: Where the device is unknown (an imported text), the largest sector a trace may name: 64 PiB
#: of 512-byte sectors, beyond any device fsage reads.
MAX_SECTOR = 2**47
#: The longest request a trace may hold, in sectors (1 GiB): block layers split requests far
#: below this (``max_sectors_kb``), so a longer one is a damaged line.
MAX_REQUEST_SECTORS = 2**21
#: Blocks a trace may read in all: scoring keeps a few integers per block read.
MAX_TRACE_BLOCKS = 2**26

# blkparse's default line: "8,0  3  1  0.000000000  697  D  RS 1234 + 8 [cat]"; the kernel's
# blk tracer: "cat-697 [003] d..1. 12.345: 8,0  D  RS 1234 + 8 [cat]".
_EVENT = re.compile(
    r"(?<![\w.])(\d+),(\d+)\s+(?:\d+\s+\d+\s+\d+\.\d+\s+\d+\s+)?([A-Z]{1,2})\s+([A-Z]+)\s+"
    r"(\d+)\s+\+\s+(\d+)"
)


class TraceError(FsageError):
    """A trace cannot be recorded or read."""


@dataclass
class Event:
    major: int
    minor: int
    action: str
    rwbs: str
    sector: int
    sectors: int


@dataclass
class Trace:
    """Read requests of one trace, in issue order, in sectors."""

    sector: np.ndarray[Any, np.dtype[np.int64]]
    sectors: np.ndarray[Any, np.dtype[np.int64]]
    action: str
    device: str | None = None
    notes: list[str] = field(default_factory=list)

    def blocks(
        self, block_size: int, offset_sectors: int = 0
    ) -> tuple[np.ndarray[Any, np.dtype[np.int64]], np.ndarray[Any, np.dtype[np.int64]]]:
        """(start block, blocks) of every request."""
        per = block_size // SECTOR
        first = (self.sector - offset_sectors) // per
        last = (self.sector - offset_sectors + self.sectors - 1) // per
        return first.astype(np.int64), (last - first + 1).astype(np.int64)

    def score(self, block_size: int, offset_sectors: int = 0) -> dict[str, Any]:
        """Conway's score of the first reads of every block (see the module doc), with
        ``reread_blocks``: the block reads left out as re-reads."""
        if block_size % SECTOR or block_size <= 0:
            raise UsageError(f"block size {block_size} is not a multiple of {SECTOR} bytes")
        start, length = self.blocks(block_size, offset_sectors)
        if int(start.min(initial=0)) < 0:
            raise TraceError(
                f"requests start before the partition ({offset_sectors:,} sectors in): "
                "check --offset-sectors"
            )
        total = int(length.sum())
        if total > MAX_TRACE_BLOCKS:
            raise TraceError(
                f"the trace reads {total:,} blocks, more than fsage scores at once "
                f"({MAX_TRACE_BLOCKS:,}): trace a shorter read"
            )
        first_start, first_length = first_reads(start, length)
        out = request_score(first_start, first_length)
        out["reread_blocks"] = int(length.sum() - first_length.sum())
        out["block_size"] = block_size
        return out


def first_reads(start: I64, length: I64) -> tuple[I64, I64]:
    """Requests (first block, blocks) in issue order, cut down to the blocks no earlier
    request read: a request part of which was read before keeps its other parts, each a
    request of its own."""
    if start.size == 0:
        return start, length
    ends = np.cumsum(length)
    req = np.repeat(np.arange(start.size), length)
    block = np.repeat(start, length) + np.arange(int(ends[-1])) - np.repeat(ends - length, length)
    keep = np.zeros(block.size, bool)
    keep[np.unique(block, return_index=True)[1]] = True
    block, req = block[keep], req[keep]
    if block.size == 0:
        return block, block
    new = np.ones(block.size, bool)
    new[1:] = (req[1:] != req[:-1]) | (block[1:] != block[:-1] + 1)
    at = np.flatnonzero(new)
    return block[at], np.diff(np.append(at, block.size))


def parse_events(lines: Iterable[str]) -> Iterator[tuple[int, Event]]:
    """(line number from 1, event) of every event line."""
    for number, line in enumerate(lines, 1):
        m = _EVENT.search(line)
        if m:
            maj, mnr, action, rwbs, sector, n = m.groups()
            yield number, Event(int(maj), int(mnr), action, rwbs, int(sector), int(n))


def check_request(ev: Event, number: int, source: str, device_sectors: int | None = None) -> None:
    """TraceError naming the line when a request lies beyond the device (or, the device
    unknown, beyond :data:`MAX_SECTOR`) or is longer than any request a block layer issues."""
    limit = MAX_SECTOR if device_sectors is None else device_sectors
    what = "the device's" if device_sectors is not None else "any device's"
    if ev.sectors > MAX_REQUEST_SECTORS:
        raise TraceError(
            f"{source} line {number}: a request of {ev.sectors:,} sectors is longer than any "
            f"block layer issues ({MAX_REQUEST_SECTORS:,} sectors at most)"
        )
    if ev.sector + ev.sectors > limit:
        raise TraceError(
            f"{source} line {number}: sector {ev.sector:,} + {ev.sectors:,} lies beyond "
            f"{what} {limit:,} sectors"
        )


def parse_blkparse(
    lines: Iterable[str],
    device: tuple[int, int] | None = None,
    action: str | None = None,
    *,
    source: str = "the trace",
    device_sectors: int | None = None,
) -> Trace:
    """The read requests of a blkparse (or blk tracer) text: of ``device`` (major, minor) when
    given, at ``action`` (default: ``D``, else ``Q``). Requests are checked against the
    device's size in sectors when known (:func:`check_request`); ``source`` names the text in
    errors."""
    by_action: dict[str, list[tuple[int, int]]] = {}
    devices: set[tuple[int, int]] = set()
    for number, ev in parse_events(lines):
        if "R" not in ev.rwbs or ev.sectors <= 0:
            continue
        if device is not None and (ev.major, ev.minor) != device:
            continue
        check_request(ev, number, source, device_sectors)
        devices.add((ev.major, ev.minor))
        by_action.setdefault(ev.action, []).append((ev.sector, ev.sectors))
    if len(devices) > 1:
        names = ", ".join(f"{a},{b}" for a, b in sorted(devices))
        raise TraceError(f"the trace holds reads of several devices ({names}): choose one")
    chosen = action or ("D" if "D" in by_action else "Q")
    rows = by_action.get(chosen, [])
    if not rows:
        what = f" of device {device[0]},{device[1]}" if device else ""
        raise TraceError(f"no read requests (action {chosen}){what} in the trace")
    arr = np.array(rows, np.int64)
    dev = next(iter(devices))
    return Trace(arr[:, 0].copy(), arr[:, 1].copy(), chosen, f"{dev[0]},{dev[1]}")


# ---------- recording --------------------------------------------------------------------


@dataclass
class BlockDevice:
    path: Path
    name: str  # kernel name, e.g. loop3 or sda1
    major: int
    minor: int
    start_sector: int  # of a partition within its disk, else 0

    @property
    def size_sectors(self) -> int | None:
        """The device's size in 512-byte sectors (of its disk's numbering: a partition's
        requests are traced at their place on the disk), or None when /sys does not say."""
        try:
            size = int((Path("/sys/class/block") / self.name / "size").read_text())
        except (OSError, ValueError):
            return None
        return self.start_sector + size

    @property
    def queue_name(self) -> str:
        """The disk whose request queue carries this device's requests."""
        sysdir = Path("/sys/class/block") / self.name
        if (sysdir / "partition").exists():
            return sysdir.resolve().parent.name
        return self.name


def resolve_device(target: Path) -> BlockDevice:
    """A block device, or the device a mounted directory lives on."""
    try:
        st = os.stat(target)
    except OSError as exc:
        raise SourceError(f"{target}: {exc.strerror}") from None
    if stat.S_ISBLK(st.st_mode):
        major, minor = os.major(st.st_rdev), os.minor(st.st_rdev)
        path = target
    elif stat.S_ISDIR(st.st_mode):
        major, minor = os.major(st.st_dev), os.minor(st.st_dev)
        path = target
    else:
        raise UsageError(f"{target} is neither a block device nor a mounted directory")
    sysdev = Path(f"/sys/dev/block/{major}:{minor}")
    if not sysdev.exists():
        raise TraceError(f"{target} is not on a block device ({major}:{minor})")
    sysdir = sysdev.resolve()
    start = 0
    if (sysdir / "partition").exists():
        start = int((sysdir / "start").read_text())
    return BlockDevice(path, sysdir.name, major, minor, start)


def ensure_debugfs() -> None:
    """blktrace needs debugfs at /sys/kernel/debug: mount it when it is not."""
    if (DEBUGFS / "block").is_dir() or (DEBUGFS / "tracing").is_dir():
        return
    p = subprocess.run(
        ["mount", "-t", "debugfs", "debugfs", str(DEBUGFS)], capture_output=True, text=True
    )
    if p.returncode != 0:
        raise TraceError(f"cannot mount debugfs at {DEBUGFS}: {p.stderr.strip()}")


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


@dataclass
class Recording:
    text: str
    tool: str  # "blktrace" or "blk tracer"
    seconds: float
    exit_code: int


def record(dev: BlockDevice, command: Sequence[str], cold: bool = True) -> Recording:
    """Run ``command`` with block tracing on ``dev``; the trace as blkparse text."""
    if not command:
        raise UsageError("no command to trace (give it after --)")
    return record_call(dev, lambda: _run(command), cold=cold)


def record_call(
    dev: BlockDevice, call: Callable[[], tuple[int, float]], cold: bool = True
) -> Recording:
    """Run ``call`` (returning its exit code and seconds) with block tracing on ``dev``; the
    trace as blkparse text. fsage's own reads (the ``scan`` suite) are traced this way."""
    if os.geteuid() != 0:
        raise TraceError("tracing block requests needs root")
    ensure_debugfs()
    if cold:
        drop_caches()
    if shutil.which("blktrace") and shutil.which("blkparse"):
        with tempfile.TemporaryDirectory(prefix="fsage-trace-") as tmp:
            got = _record_blktrace(dev, call, Path(tmp))
            if got is not None:
                return got
        if cold:
            drop_caches()
    return _record_tracer(dev, call)


def _run(command: Sequence[str]) -> tuple[int, float]:
    t0 = time.monotonic()
    try:
        p = subprocess.run(list(command), stdout=subprocess.DEVNULL)
    except OSError as exc:
        raise TraceError(f"cannot run {command[0]}: {exc.strerror}") from None
    return p.returncode, time.monotonic() - t0


def _record_blktrace(
    dev: BlockDevice, call: Callable[[], tuple[int, float]], tmp: Path
) -> Recording | None:
    """None when blktrace cannot trace here (the caller falls back to the blk tracer)."""
    proc = subprocess.Popen(
        ["blktrace", "-d", f"/dev/{dev.name}", "-o", "trace", "-D", str(tmp)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    # blktrace has started when its per-CPU files exist; it exits at once when it cannot
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return None
        if any(tmp.glob("trace.blktrace.*")):
            break
        time.sleep(0.05)
    else:
        proc.kill()
        proc.wait()
        return None
    time.sleep(0.2)
    try:
        code, secs = call()
    finally:
        os.sync()
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    p = subprocess.run(
        ["blkparse", "-i", "trace", "-D", str(tmp)], capture_output=True, text=True, check=False
    )
    if p.returncode != 0:
        raise TraceError(f"blkparse failed: {p.stderr.strip()[:200]}")
    return Recording(p.stdout, "blktrace", secs, code)


def _tracefs() -> Path:
    for d in TRACEFS_DIRS:
        if (d / "current_tracer").exists():
            return d
    raise TraceError("neither blktrace nor the kernel's blk tracer (tracefs) is available")


def _record_tracer(dev: BlockDevice, call: Callable[[], tuple[int, float]]) -> Recording:
    from fsage.tracerlock import TracerBusyError, tracer_holder

    try:
        with tracer_holder() as dead:
            return _record_tracer_held(dev, call, dead)
    except TracerBusyError as exc:
        raise TraceError(str(exc)) from None


def _record_tracer_held(
    dev: BlockDevice, call: Callable[[], tuple[int, float]], dead: str | None
) -> Recording:
    """``_record_tracer`` once fsage holds the tracer; ``dead``: the command of an fsage trace
    that was killed holding it (what it left on is taken over)."""
    t = _tracefs()
    if "blk" not in (t / "available_tracers").read_text().split():
        raise TraceError("the kernel has no blk tracer and blktrace cannot trace here")
    current = (t / "current_tracer").read_text().strip()
    if current not in ("nop", "blk"):
        raise TraceError(f"the kernel tracer is in use ({current}); not taking it over")
    if current == "blk" and (t / "tracing_on").read_text().strip() == "1" and dead is None:
        # one blk tracer per machine, on with no fsage holder recorded: someone else's trace
        # (`echo nop > current_tracer` in tracefs frees it)
        raise TraceError("the kernel's blk tracer is in use by another trace; not taking it over")
    for d in Path("/sys/class/block").glob("*/trace/enable") if dead else ():
        # what the killed trace left enabled would mix its device's requests into this one
        with contextlib.suppress(OSError):
            if d.read_text().strip() == "1":
                d.write_text("0\n")
    enable = Path("/sys/class/block") / dev.queue_name / "trace" / "enable"
    if not enable.exists():
        raise TraceError(f"{dev.name} cannot be traced ({enable} missing)")
    old_kb = (t / "buffer_size_kb").read_text().split()[0]
    try:
        _tracefs_write(t, "tracing_on", "0")
        _tracefs_write(t, "current_tracer", "blk")
        _tracefs_write(t, "buffer_size_kb", str(TRACE_BUFFER_KB))
        _tracefs_write(t, "trace", "")
        _tracefs_write(enable.parent, "enable", "1")
        _tracefs_write(t, "tracing_on", "1")
        code, secs = call()
        os.sync()
        _tracefs_write(t, "tracing_on", "0")
        text = (t / "trace").read_text(errors="replace")
        lost = _overruns(t)
    finally:
        with contextlib.suppress(OSError):
            enable.write_text("0\n")
            (t / "tracing_on").write_text("0\n")
            (t / "trace").write_text("\n")
            (t / "current_tracer").write_text("nop\n")
            (t / "buffer_size_kb").write_text(f"{old_kb}\n")
    if lost:
        raise TraceError(f"the trace buffer overflowed ({lost} events lost); trace a shorter read")
    return Recording(text, "blk tracer", secs, code)


def _tracefs_write(directory: Path, name: str, value: str) -> None:
    """One setting of the tracer; EBUSY and the like as a TraceError (the tracer is one per
    machine, and another trace may hold it)."""
    try:
        (directory / name).write_text(f"{value}\n")
    except OSError as exc:
        raise TraceError(
            f"the kernel's blk tracer refused {name} = {value!r}: {exc.strerror} "
            "(another trace running?)"
        ) from None


def _overruns(t: Path) -> int:
    total = 0
    for stats in (t / "per_cpu").glob("cpu*/stats"):
        for line in stats.read_text().splitlines():
            if line.startswith("overrun:"):
                total += int(line.split()[1])
    return total


def mountpoint_of(dev: BlockDevice) -> Path | None:
    """Where ``dev`` is mounted (its first mount in /proc/self/mountinfo), or None."""
    want = f"{dev.major}:{dev.minor}"
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            f = line.split()
            if len(f) > 4 and f[2] == want and f[3] == "/":
                return Path(f[4].replace("\\040", " "))
    return None


def file_bytes_under(root: Path) -> int:
    """Bytes allocated to the regular files under ``root`` (st_blocks), on its file system
    only, without following symbolic links."""
    total = 0
    top = os.lstat(root).st_dev
    stack = [os.fsencode(root)]
    while stack:
        d = stack.pop()
        with contextlib.suppress(OSError), os.scandir(d) as it:
            for e in it:
                with contextlib.suppress(OSError):
                    st = e.stat(follow_symlinks=False)
                    if st.st_dev != top:
                        continue
                    if stat.S_ISDIR(st.st_mode):
                        stack.append(e.path)
                    elif stat.S_ISREG(st.st_mode):
                        total += st.st_blocks * 512
    return total


#: A trace reading less than this share of what the files hold did not read most of them.
SHORT_READ_SHARE = 0.5


def short_read_warning(read_bytes: int, file_bytes: int, where: Path) -> str | None:
    """A warning when a traced command read far fewer bytes than the files under ``where``
    hold (its score then says little of their layout), else None."""
    if file_bytes <= 0 or read_bytes >= SHORT_READ_SHARE * file_bytes:
        return None
    return (
        f"the command read {read_bytes / 2**20:,.1f} MiB while the files under {where} hold "
        f"{file_bytes / 2**20:,.1f} MiB: it skipped most of their data, so the score says "
        "little of their layout (GNU tar writing to /dev/null reads no file data: "
        "tar cf - . | cat >/dev/null does)"
    )


# ---------- storing ----------------------------------------------------------------------


@dataclass
class TraceRow:
    id: int
    snapshot_id: int | None
    fs: str | None
    taken_at: str
    source: str
    device: str | None
    command: str
    block_size: int
    requests: int
    discontiguous: int
    blocks: int
    score: float | None
    modeled_score: float | None
    #: Block reads left out of the score as re-reads of blocks read before (see module doc).
    reread_blocks: int = 0

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def modeled_score(store: Store, snapshot_id: int) -> float | None:
    """The modeled path-order dynamic score of a snapshot (fsage.analyzer.dynamic)."""
    from fsage.analyzer.analysis import SnapshotAnalyzer
    from fsage.analyzer.dynamic import modeled_reads, walk_order

    layout = store.load_layout(snapshot_id)
    a = SnapshotAnalyzer(layout)
    reads = modeled_reads(layout, a.scores, walk_order(layout, a.regular | a.dirs))
    score: float | None = reads.score()["score"]
    return score


def save_trace(
    store: Store,
    result: dict[str, Any],
    *,
    snapshot_id: int | None,
    source: str,
    device: str | None,
    command: str,
    params: dict[str, Any] | None = None,
) -> TraceRow:
    modeled = modeled_score(store, snapshot_id) if snapshot_id is not None else None
    now = datetime.now(UTC).isoformat()
    with store.transaction() as con:
        cur = con.execute(
            "INSERT INTO traces(snapshot_id, taken_at, source, device, command, block_size,"
            " requests, discontiguous, blocks, score, modeled_score, params)"
            " VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                snapshot_id,
                now,
                source,
                device,
                command,
                result["block_size"],
                result["requests"],
                result["discontiguous"],
                result["blocks"],
                result["score"],
                modeled,
                json.dumps({**(params or {}), "reread_blocks": result.get("reread_blocks", 0)}),
            ),
        )
        assert cur.lastrowid is not None
        tid = cur.lastrowid
    return traces(store, trace_id=tid)[0]


def traces(
    store: Store,
    snapshot_id: int | None = None,
    fs_name: str | None = None,
    trace_id: int | None = None,
) -> list[TraceRow]:
    sql = (
        "SELECT t.id, t.snapshot_id, f.name, t.taken_at, t.source, t.device, t.command,"
        " t.block_size, t.requests, t.discontiguous, t.blocks, t.score, t.modeled_score,"
        " t.params"
        " FROM traces t LEFT JOIN snapshots s ON s.id = t.snapshot_id"
        " LEFT JOIN filesystems f ON f.id = s.fs_id WHERE 1=1"
    )
    args: list[Any] = []
    if snapshot_id is not None:
        sql += " AND t.snapshot_id = ?"
        args.append(snapshot_id)
    if fs_name is not None:
        sql += " AND f.name = ?"
        args.append(fs_name)
    if trace_id is not None:
        sql += " AND t.id = ?"
        args.append(trace_id)
    rowcheck.verify(store.con, "traces")
    rows = []
    for r in store.con.execute(sql + " ORDER BY t.id", args):
        row = TraceRow(*r[:-1])
        row.reread_blocks = _reread_blocks(r[-1])
        rows.append(row)
    return rows


def _reread_blocks(params: str | None) -> int:
    try:
        value = json.loads(params or "{}").get("reread_blocks", 0)
    except (ValueError, AttributeError):
        return 0
    return value if isinstance(value, int) else 0


def snapshot_for(store: Store, snapshot_id: int | None, fs_name: str | None) -> int | None:
    """The snapshot a trace belongs to: given, the latest of ``fs_name``, or none."""
    if snapshot_id is not None:
        store.snapshot(snapshot_id)
        return snapshot_id
    if fs_name is not None:
        row = store.latest_snapshot(fs_name)
        if row is None:
            raise StoreError(f"no snapshots of {fs_name!r} in {store.path}")
        return row.id
    return None


def block_size_of(store: Store, snapshot_id: int | None, given: int | None) -> int:
    if given is not None:
        return given
    if snapshot_id is not None:
        return store.snapshot(snapshot_id).block_size
    raise UsageError("give --block-size, or --snapshot / --fs to take the snapshot's")
