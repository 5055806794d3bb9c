"""Recreate a recorded file system as it was at a chosen snapshot, and check the result.

``recreate`` makes a fresh image with the mkfs parameters recorded in the first snapshot
(block and cluster size, blocks and inodes count, inode size, blocks per group, flex_bg size,
features, reserved and reserved-GDT blocks, descriptor size, journal size, label, hash seed,
RAID hints), populates it with the first snapshot's files, replays the deltas up to the chosen
snapshot (``fsage.replay.deltas``) through the ager's executors — loop-mounted through the
kernel when fsage runs as root with loop devices, offline through libext2fs otherwise (with a
notice: its allocator is not the kernel's) — snapshots the result into the database marked as a
recreation of the chosen snapshot, and computes the fidelity (``fsage.replay.fidelity``).

The recreation gets a new UUID (mke2fs draws one): with the original's, two images of one UUID
would exist and the store would file the recreation as another snapshot of the original. It is
recorded under its own name, ``<fs>-recreated-<snapshot id>`` by default.

The image is built beside the target under a temporary name and renamed into place when
complete, so a failure (or Ctrl-C) leaves nothing behind: the mount is undone, the partial
image removed, an existing target (``force``) untouched.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import uuid as uuidlib
from collections.abc import Callable, Generator, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fsage.ager.images import run_tool
from fsage.errors import SourceError, StoreError, UnsafeTargetError, UsageError
from fsage.layout import Layout
from fsage.private import private_opener
from fsage.replay.closedloop import Budget, Steerer
from fsage.replay.deltas import (
    DeltaBuilder,
    IntraDay,
    history,
    interval_ops,
    intra_day_summary,
    to_ns,
)
from fsage.replay.fidelity import Fidelity, NoiseFloor, fidelity, geometry
from fsage.replay.loopdev import LoopDevice
from fsage.workload import (
    Executor,
    NoSpaceError,
    Op,
    OpFailedError,
    WorkloadHeader,
    write_workload,
)

#: Features mke2fs cannot be asked for: states, not choices.
_STATE_FEATURES = frozenset({"needs_recovery", "orphan_present", "journal_dev", "snapshot_bitmap"})
_HASH_ALGS = {0: "legacy", 1: "half_md4", 2: "tea"}
_FAILED_EXAMPLES = 5
#: How each snapshot interval ends before the next one starts (``--interval-end``).
INTERVAL_ENDS = ("remount", "drop-caches", "sync", "none")
DEFAULT_INTERVAL_END = "remount"


@dataclass
class RecreateOptions:
    db: Path
    fs_name: str
    target: Path
    until: str | None = None
    mode: str = "auto"  # auto | mount | offline
    force: bool = False
    intra: IntraDay | None = None
    deletes: str = "first"
    interval_end: str = DEFAULT_INTERVAL_END
    noise_floor: NoiseFloor | None = None
    name: str | None = None
    progress: bool = False
    setattr: bool = True  # replay attribute changes (setattr ops)
    #: Steer each interval toward its snapshot with inferred churn (``fsage.replay.closedloop``).
    closed_loop: bool = False
    budget: Budget | None = None
    seed: int = 0
    #: Write every op run (visible and inferred, with the snapshot markers) here as a Workload.
    journal: Path | None = None
    #: Store the recreation in the database as a recreation of the snapshot.
    record: bool = True


@dataclass
class RecreateResult:
    target: str
    fs: str
    snapshot_id: int
    snapshot_taken_at: str
    snapshots_replayed: list[int]
    recreation_snapshot_id: int
    recreation_fs: str
    mode: str
    description: str
    interval_end: str = ""
    ops: int = 0
    bytes_written: int = 0
    nospace: int = 0
    failed: int = 0
    failed_examples: list[str] = field(default_factory=list)
    deltas: dict[str, Any] = field(default_factory=dict)
    intra_day: dict[str, Any] | None = None
    notices: list[str] = field(default_factory=list)
    elapsed: float = 0.0
    #: Where the time went (seconds, wall): inferring the ops (overlapped with the interval
    #: ends) and the part of it the replay waited for, running the ops, ending the intervals,
    #: the final unmount, reading the recreation back.
    timings: dict[str, float] = field(default_factory=dict)
    fidelity: Fidelity | None = None
    #: The churn inferred per interval (closed loop only).
    closed_loop: dict[str, Any] | None = None
    journal: str | None = None

    def to_json(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["fidelity"] = self.fidelity.to_json() if self.fidelity else None
        return out


# ---------------------------------------------------------------------------- mkfs


def _mib(nbytes: int) -> int:
    return max(1, round(nbytes / (1 << 20)))


def mkfs_argv(mkfs: dict[str, Any], image: Path) -> tuple[list[str], list[str]]:
    """The mke2fs command that makes an empty file system of the recorded geometry, and
    notices about what it cannot reproduce exactly."""
    notes: list[str] = []
    bs = int(mkfs["block_size"])
    blocks = int(mkfs["blocks_count"])
    feats = [f for f in mkfs.get("features", []) if f not in _STATE_FEATURES]
    unknown = [f for f in feats if f.upper().startswith("FEATURE_")]
    if unknown:
        notes.append(f"features mke2fs does not know are left out: {', '.join(unknown)}")
        feats = [f for f in feats if f not in unknown]
    argv = ["mke2fs", "-F", "-q", "-b", str(bs)]
    if mkfs.get("cluster_size") and "bigalloc" in feats:
        argv += ["-C", str(int(mkfs["cluster_size"]))]
    argv += ["-N", str(int(mkfs["inodes_count"])), "-I", str(int(mkfs["inode_size"]))]
    bpg = int(mkfs["blocks_per_group"])
    if mkfs.get("cluster_size") and "bigalloc" in feats:
        bpg //= max(int(mkfs["cluster_size"]) // bs, 1)  # with bigalloc, -g counts clusters
    argv += ["-g", str(bpg)]
    if mkfs.get("flex_bg_size") and "flex_bg" in feats:
        argv += ["-G", str(int(mkfs["flex_bg_size"]))]
    argv += ["-O", ",".join(["none", *feats])]
    if "has_journal" in feats and mkfs.get("journal_blocks"):
        jbytes = int(mkfs["journal_blocks"]) * bs
        if jbytes % (1 << 20):
            notes.append(f"journal of {jbytes} bytes rounded to {_mib(jbytes)} MiB")
        argv += ["-J", f"size={_mib(jbytes)}"]
    reserved = int(mkfs.get("reserved_blocks") or 0)
    argv += ["-m", f"{reserved * 100.0 / blocks:.6f}" if blocks else "0"]
    ext: list[str] = []
    if "64bit" in feats and mkfs.get("desc_size"):
        ext.append(f"desc_size={int(mkfs['desc_size'])}")  # mke2fs wants it first
    rgdt = int(mkfs.get("reserved_gdt_blocks") or 0)
    if "resize_inode" in feats and rgdt:
        desc = int(mkfs.get("desc_size") or 32) if "64bit" in feats else 32
        per_block = bs // max(desc, 1)
        # mke2fs: rsv = ceil(ceil(resize / g) / per_block) - ceil(ceil(blocks / g) / per_block),
        # with g the -g value as given (clusters per group under bigalloc).
        groups = -(-blocks // bpg)
        desc_blocks = -(-groups // per_block)
        ext.append(f"resize={(rgdt + desc_blocks) * per_block * bpg}")
    if mkfs.get("hash_seed") and _is_uuid(str(mkfs["hash_seed"])):
        ext.append(f"hash_seed={mkfs['hash_seed']}")
    if mkfs.get("raid_stride"):
        ext.append(f"stride={int(mkfs['raid_stride'])}")
    if mkfs.get("raid_stripe_width"):
        ext.append(f"stripe_width={int(mkfs['raid_stripe_width'])}")
    ext.append("nodiscard")
    argv += ["-E", ",".join(ext)]
    label = str(mkfs.get("label") or "")
    if label:
        argv += ["-L", label[:16]]
    argv += [str(image), str(blocks)]
    return argv, notes


def _is_uuid(s: str) -> bool:
    try:
        return uuidlib.UUID(s).int != 0
    except ValueError:
        return False


def make_filesystem(image: Path, original: Layout) -> list[str]:
    """Make ``image`` (a new sparse file) hold an empty file system of ``original``'s geometry;
    returns notices (what differs)."""
    from fsage.snapshotter import read_source

    mkfs = original.facts.mkfs
    with open(image, "wb", opener=private_opener) as fh:  # it will hold the recorded names
        fh.truncate(int(mkfs["blocks_count"]) * int(mkfs["block_size"]))
    argv, notes = mkfs_argv(mkfs, image)
    run_tool(argv, f"making the file system on {image}")
    made = read_source(image).facts.mkfs
    tune: list[str] = []
    if made.get("reserved_blocks") != mkfs.get("reserved_blocks"):
        tune += ["-r", str(int(mkfs.get("reserved_blocks") or 0))]
    hv = mkfs.get("default_hash_version")
    if hv != made.get("default_hash_version") and hv in _HASH_ALGS:
        tune += ["-E", f"hash_alg={_HASH_ALGS[int(hv)]}"]
    if tune:
        run_tool(["tune2fs", *tune, str(image)], f"adjusting {image}")
    got = geometry(read_source(image))
    want = geometry(original)
    diff = [f"{k} {want[k]} vs {got[k]}" for k in want if want[k] != got[k]]
    if diff:
        notes.append("the recreated geometry differs: " + "; ".join(diff))
    return notes


# ---------------------------------------------------------------------------- targets


def _check_target(target: Path, force: bool) -> None:
    if target.is_symlink():
        raise UnsafeTargetError(f"{target} is a symlink; give the image's real path")
    if target.exists():
        if not target.is_file():
            raise UnsafeTargetError(f"{target} exists and is not a regular file; refusing")
        if not force:
            raise UsageError(f"{target} exists; use --force to replace it")
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"{parent}: no such directory")


class _Session:
    """The executor a replay writes through, and how an interval is put on disk.

    A night between two snapshots ends with the day's data and metadata on disk (the
    allocator of the next day sees it allocated, not as delayed allocations in the page
    cache). ``end_interval`` does that: ``sync`` (``syncfs``), ``drop-caches`` (``syncfs``,
    then the kernel's clean page, dentry and inode caches dropped), ``remount`` (unmount and
    mount again: what ``fsage age`` does at every snapshot, here with the system calls on the
    one loop device the replay keeps (``fsage.replay.loopdev``); offline, the image is closed
    and reopened), ``none`` (nothing: the whole replay stays in the page cache as long as it fits).
    """

    def __init__(self, image: Path, mode: str, fstype: str = "ext4") -> None:
        from fsage.ager.images import can_loop_mount, mount_dir

        self.image = image
        self.mnt: Path | None = None
        self.loop: LoopDevice | None = None
        self.ex: Executor
        #: Mounted, but unmounted for ops run offline (``executor_for``).
        self.unmounted = False
        if mode == "mount" or (mode == "auto" and can_loop_mount()):
            if not can_loop_mount():
                raise UsageError("--mount needs root and /dev/loop-control")

            self.mode = "mount"
            self.mnt = mount_dir("replay")
            try:
                self.loop = LoopDevice(image, fstype)
                self.loop.mount(self.mnt)
                self._open()
            except BaseException:  # a signal (Ctrl-C, SIGTERM) too: nothing left mounted
                self._unmount()
                raise
        else:
            self.mode = "offline"
            self._open()

    def executor_for(self, op: Op) -> Executor:
        """The executor ``op`` runs on. An op with a goal block (``allocate-near``) runs
        offline (the kernel's allocator takes no goal): a mounted image is unmounted for it
        and stays so for the ops after it, until the next interval end or read mounts it."""
        if op.op == "allocate-near" and self.mnt is not None and not self.unmounted:
            from fsage.ager.offline import OfflineExtExecutor

            assert self.loop is not None
            self.ex.close()
            self.loop.umount(self.mnt)
            self.unmounted = True
            self.loop.wait_released()  # a lazy unmount: not offline before it is gone
            self.ex = OfflineExtExecutor(self.image)
        return self.ex

    def _remount_after_offline(self) -> bool:
        """Close the offline executor of ``executor_for`` and mount the image again; False if
        it was not unmounted for one."""
        if not self.unmounted:
            return False
        assert self.loop is not None and self.mnt is not None
        self.ex.close()
        self.unmounted = False
        self.loop.mount(self.mnt)
        self._open()
        return True

    def _open(self) -> None:
        if self.mnt is not None:
            from fsage.ager.posix import EXT4_WRITEBACK_SHARE, PosixExecutor

            # Written back when ext4 would: earlier, each writeback allocates before the
            # interval's later deletes free their blocks, and large files fragment.
            self.ex = PosixExecutor(self.mnt, writeback_share=EXT4_WRITEBACK_SHARE)
        else:
            from fsage.ager.offline import OfflineExtExecutor

            self.ex = OfflineExtExecutor(self.image)

    def end_interval(self, how: str) -> None:
        if self._remount_after_offline() or how == "none":
            return
        if self.mnt is None:  # offline: the library writes everything at close
            if how == "remount":
                self.ex.close()
                self._open()
            else:
                flush = getattr(self.ex, "flush", None)
                if flush is not None:
                    flush()
            return
        from fsage.ager.posix import PosixExecutor

        ex = self.ex
        assert isinstance(ex, PosixExecutor) and self.loop is not None
        if how == "remount":
            ex.close()
            self.loop.umount(self.mnt)
            self.loop.mount(self.mnt)
            self._open()
            return
        ex.sync()
        if how == "drop-caches":
            drop_caches()

    def read_unmounted(self) -> Layout:
        """The file system as the offline reader sees it with everything written so far on
        disk: unmounted (offline: closed) for the read, then mounted (opened) again, as a
        ``remount`` interval end does; a snapshot marker journals it."""
        from fsage.snapshotter.ext import read_ext_layout

        self.ex.close()
        if self.mnt is None:
            try:
                return read_ext_layout(self.image)
            finally:
                self._open()
        assert self.loop is not None
        self.loop.umount(self.mnt)
        self.unmounted = False
        try:
            return read_ext_layout(self.image)
        finally:
            self.loop.mount(self.mnt)
            self._open()

    def close(self) -> None:
        try:
            self.ex.close()
        finally:
            self._unmount()

    def _unmount(self) -> None:
        """Unmount and detach what the session mounted, and remove its mount point."""
        if self.mnt is None:
            return
        try:
            if self.loop is not None:
                try:
                    if os.path.ismount(self.mnt):
                        self.loop.umount(self.mnt)
                finally:
                    self.loop.detach()
                    self.loop = None
        finally:
            with contextlib.suppress(OSError):
                self.mnt.rmdir()
            self.mnt = None


def drop_caches() -> None:
    """Drop the kernel's clean page cache, dentries and inodes (root only; dirty data is
    written first by the caller)."""
    try:
        with open("/proc/sys/vm/drop_caches", "w", encoding="ascii") as fh:
            fh.write("3\n")
    except OSError as exc:
        raise UsageError(f"cannot drop caches: {exc.strerror}") from None


@contextlib.contextmanager
def _executor(image: Path, mode: str, fstype: str = "ext4") -> Iterator[_Session]:
    sess = _Session(image, mode, fstype)
    try:
        yield sess
    finally:
        sess.close()


@dataclass
class OpCounts:
    """What running an op stream did: ops run, bytes written, ops skipped for lack of space,
    ops that failed (and the first few failures)."""

    ops: int = 0
    bytes_written: int = 0
    nospace: int = 0
    failed: int = 0
    failed_examples: list[str] = field(default_factory=list)


def run_op_stream(
    image: Path,
    ops: Iterable[Op],
    *,
    mode: str = "auto",
    interval_end: str = DEFAULT_INTERVAL_END,
    fstype: str = "ext4",
) -> OpCounts:
    """Run ``ops`` onto the file system on ``image`` the way a replay runs them (one loop
    device for the whole stream, or offline), ending an interval with ``interval_end`` at each
    snapshot marker but the last."""
    ops = list(ops)
    marks = sum(op.op == "snapshot" for op in ops)
    counts = OpCounts()
    seen = 0
    with _executor(image, mode, fstype) as sess:
        for op in ops:
            if op.op == "snapshot":
                seen += 1
                if seen < marks:
                    sess.end_interval(interval_end)
                continue
            _apply(sess.executor_for(op), op, counts)
    return counts


# ---------------------------------------------------------------------------- the run


def recreate(opts: RecreateOptions, echo: Callable[[str], None] | None = None) -> RecreateResult:
    """Recreate ``opts.fs_name`` as of ``opts.until`` on ``opts.target`` (see the module doc)."""
    from fsage.ager.images import can_loop_mount, clear_stale_mounts
    from fsage.ager.offline import OFFLINE_NOTICE
    from fsage.db.store import Store
    from fsage.snapshotter import read_source

    say = echo or (lambda s: None)
    if opts.mode not in ("auto", "mount", "offline"):
        raise UsageError(f"unknown mode {opts.mode!r}")
    if opts.interval_end not in INTERVAL_ENDS:
        raise UsageError(f"unknown interval end {opts.interval_end!r}")
    target = Path(opts.target)
    _check_target(target, opts.force)
    t0 = time.perf_counter()
    with Store.open(opts.db) as store:
        chain, _ = history(store, opts.fs_name, opts.until)
        final = chain[-1]
        first_layout = store.load_layout(chain[0].id)
        kind = first_layout.facts.kind
        if not kind.startswith("ext"):
            raise UsageError(
                f"{opts.fs_name} is a {kind} file system; recreation supports ext2/3/4 only"
            )
        if not first_layout.facts.mkfs.get("blocks_count"):
            raise UsageError(f"snapshot {chain[0].id} does not record its mkfs parameters")
        base_name = f"{opts.fs_name}-recreated-{final.id}"
        name = opts.name or _free_name(store, base_name)
        notices: list[str] = []
        if opts.mode == "offline" or (opts.mode == "auto" and not can_loop_mount()):
            if opts.mode == "auto":
                notices.append("not root or no loop devices: replaying onto the image offline")
            notices.append(OFFLINE_NOTICE)
        for n in notices:
            say(f"fsage: {n}")

        part = target.with_name(f".{target.name}.fsage-part")
        clear_stale_mounts(part, lambda s: say(f"fsage: {s}"))  # a killed replay's
        with contextlib.suppress(FileNotFoundError):
            part.unlink()
        try:
            notes = make_filesystem(part, first_layout)
            for n in notes:
                say(f"fsage: {n}")
            notices.extend(notes)
            journal: list[Op] | None = [] if opts.journal is not None else None
            res, final_layout = _replay(chain, part, opts, first_layout, say, journal)
            res.notices = notices + res.notices
            t_read = time.perf_counter()
            recreated = read_source(part)
            res.timings["read_back"] = time.perf_counter() - t_read
            if opts.journal is not None and journal is not None:
                header = WorkloadHeader(
                    generator="fsage replay" + (" closed-loop" if opts.closed_loop else ""),
                    params={"fs": opts.fs_name, "snapshots": [s.id for s in chain],
                            "interval_end": opts.interval_end, "closed_loop": res.closed_loop},
                    seed=opts.seed,
                )  # fmt: skip
                write_workload(opts.journal, header, journal)
                res.journal = str(opts.journal)
            os.replace(part, target)
        except BaseException:
            with contextlib.suppress(OSError):
                part.unlink()
            raise
        summ = None
        try:
            for attempt in range(8 if opts.record else 0):
                try:
                    summ = store.add_snapshot(
                        recreated,
                        name=name,
                        source=str(target),
                        op_count=res.ops,
                        bytes_written=res.bytes_written,
                        label=f"recreation of snapshot {final.id}",
                        recreation_of=final.id,
                    )
                    break
                except StoreError:
                    # A replay running beside this one may have taken the name this one chose
                    # at its start: a name fsage chose is chosen again, a given one is not.
                    taken = name in {f["name"] for f in store.filesystems()}
                    if opts.name or not taken or attempt == 7:
                        raise
                    name = _free_name(store, base_name)
        except BaseException:
            with contextlib.suppress(OSError):
                target.unlink()
            raise
    res.target = str(target)
    res.fs = opts.fs_name
    res.snapshot_id = final.id
    res.snapshot_taken_at = final.taken_at.isoformat()
    res.snapshots_replayed = [s.id for s in chain]
    if summ is not None:
        res.recreation_snapshot_id = summ.snapshot_id
        res.recreation_fs = summ.fs_name
    res.fidelity = fidelity(final_layout, recreated)
    res.fidelity.judge(opts.noise_floor)
    res.elapsed = time.perf_counter() - t0
    return res


def _free_name(store: Any, base: str) -> str:
    known = {f["name"] for f in store.filesystems()}
    name, n = base, 1
    while name in known:
        n += 1
        name = f"{base}-{n}"
    return name


@dataclass
class _Interval:
    index: int
    snapshot: Any
    layout: Layout
    ops: list[Op]
    seconds: float  # spent inferring them (wall)


def _intervals(
    db: Path, chain: list[Any], first_layout: Layout, builder: DeltaBuilder
) -> Generator[_Interval, None, None]:
    """Each snapshot of ``chain`` with the ops that lead to it from the one before, inferred
    when the replay asks for it; reads through its own connection."""
    from fsage.db.store import Store

    with Store.open(db, readonly=True) as store:
        layouts = (
            (snap, first_layout if i == 0 else store.load_layout(snap.id))
            for i, snap in enumerate(chain)
        )
        t0 = time.perf_counter()
        for i, (snap, layout, ops) in enumerate(interval_ops(builder, layouts)):
            yield _Interval(i, snap, layout, ops, time.perf_counter() - t0)
            t0 = time.perf_counter()


def _replay(
    chain: list[Any],
    image: Path,
    opts: RecreateOptions,
    first_layout: Layout,
    say: Callable[[str], None],
    journal: list[Op] | None = None,
) -> tuple[RecreateResult, Layout]:
    builder = DeltaBuilder(intra=opts.intra, deletes=opts.deletes, setattr=opts.setattr)
    progress = opts.progress
    res: RecreateResult
    final: Layout | None = None
    last_draw = 0.0
    with _executor(image, opts.mode, first_layout.facts.kind) as sess:
        res = RecreateResult(
            target=str(opts.target), fs=opts.fs_name, snapshot_id=chain[-1].id,
            snapshot_taken_at="", snapshots_replayed=[], recreation_snapshot_id=0,
            recreation_fs="", mode=sess.mode, description=sess.ex.description,
            interval_end=opts.interval_end,
        )  # fmt: skip
        #: deltas: inferring the ops (reading the snapshots included), on the worker thread;
        #: waiting_for_deltas: the part of it the replay waited for.
        spent = {"deltas": 0.0, "waiting_for_deltas": 0.0, "ops": 0.0, "interval_ends": 0.0}
        steerer: Steerer | None = None
        if opts.closed_loop:
            spent["steering"] = 0.0

            def run(op: Op) -> int:
                if journal is not None:
                    journal.append(op)
                # Counted as any op, and raised on: the steerer must not rename a temporary
                # that a full disk left short over the file it stands for.
                nospace, failed = res.nospace, res.failed
                _apply(sess.executor_for(op), op, res)
                if res.nospace != nospace:
                    raise NoSpaceError(f"{op.op} {op.path}: no space left")
                if res.failed != failed:
                    raise OpFailedError(f"{op.op} {op.path}: failed")
                return 0

            steerer = Steerer(run, sess.read_unmounted, opts.budget, opts.seed)
        prev: Layout | None = None
        prev_ns: int | None = None
        intervals = _intervals(opts.db, chain, first_layout, builder)
        # The next interval is inferred on one worker thread (its database connection lives
        # there) while this one ends: the end is system calls (syncfs, umount2, mount) that run
        # without the interpreter lock. Never while ops run: every op's return needs the lock,
        # and waited for the inferring thread op by op.
        infer = ThreadPoolExecutor(1, thread_name_prefix="fsage-replay-deltas")
        try:
            t_wait = time.perf_counter()
            upcoming = infer.submit(next, intervals, None)
            while (iv := upcoming.result()) is not None:
                t_ops = time.perf_counter()
                spent["waiting_for_deltas"] += t_ops - t_wait
                spent["deltas"] += iv.seconds
                ops = iv.ops
                marker = ops[-1] if ops and ops[-1].op == "snapshot" else None
                if marker is not None:
                    ops = ops[:-1]
                if journal is not None:
                    journal.extend(ops)
                before = res.bytes_written
                for j, op in enumerate(ops):
                    _apply(sess.ex, op, res)
                    if progress and j & 63 == 0:
                        now = time.perf_counter()
                        if now - last_draw > 0.5:
                            last_draw = now
                            sys.stderr.write(
                                f"\r  snapshot {iv.index + 1}/{len(chain)}  op {j}/{len(ops)}  "
                                f"{res.bytes_written / 2**20:,.0f} MiB written "
                            )
                            sys.stderr.flush()
                t_end = time.perf_counter()
                spent["ops"] += t_end - t_ops
                if steerer is not None:
                    churn = steerer.steer(
                        iv.snapshot.id,
                        iv.layout,
                        prev,
                        prev_ns,
                        res.bytes_written - before,
                        last=iv.index + 1 == len(chain),
                    )
                    say(_churn_line(churn))
                    t_steered = time.perf_counter()
                    spent["steering"] += t_steered - t_end
                    t_end = t_steered
                if marker is not None:
                    if journal is not None:
                        journal.append(marker)
                    _apply(sess.ex, marker, res)
                prev, prev_ns = iv.layout, to_ns(iv.snapshot.taken_at)
                upcoming = infer.submit(next, intervals, None)
                # Steering that ended on a measurement has just unmounted and mounted it again.
                again = steerer is not None and steerer.remounted and opts.interval_end == "remount"
                if iv.index + 1 < len(chain) and not again:
                    sess.end_interval(opts.interval_end)
                t_wait = time.perf_counter()
                spent["interval_ends"] += t_wait - t_end
                final = iv.layout
        finally:
            infer.submit(intervals.close).result()
            infer.shutdown()
        if progress:
            sys.stderr.write("\n")
        t_close = time.perf_counter()
    spent["final_unmount"] = time.perf_counter() - t_close
    res.timings = spent
    if steerer is not None:
        res.closed_loop = steerer.to_json()
    assert final is not None
    res.deltas = builder.stats.to_json()
    if opts.intra is not None:
        res.intra_day = intra_day_summary(opts.intra, builder.stats)
        say(
            f"fsage: intra-day activity added: {sum(res.intra_day['files_added'])} short-lived "
            f"files over {len(chain) - 1} intervals"
        )
    if res.nospace:
        res.notices.append(f"{res.nospace} ops skipped for lack of space")
    if res.failed:
        res.notices.append(f"{res.failed} ops failed on the target (first: {res.failed_examples})")
    return res, final


def _churn_line(c: Any) -> str:
    return (
        f"fsage: snapshot {c.snapshot}: {c.inferred_bytes / 2**20:,.1f} MiB of unseen churn "
        f"inferred ({c.visible_bytes / 2**20:,.1f} MiB visible), distance "
        f"{c.distance_before:.3f} -> {c.distance_after:.3f}, {c.stopped}" + _offline_part(c.offline)
    )


def _offline_part(offline: dict[str, int] | None) -> str:
    """The files the closed loop placed offline (where the kernel's rounds stalled), and how
    many the next measurement found where they were put."""
    if not offline or not offline.get("plugs"):
        return ""
    return f"; {offline['plugs']:,} files placed offline ({offline.get('landed', 0):,} landed)"


def _apply(ex: Executor, op: Op, res: RecreateResult | OpCounts) -> None:
    res.ops += 1
    try:
        res.bytes_written += ex.apply(op)
    except NoSpaceError:
        res.nospace += 1
    except OpFailedError as exc:
        res.failed += 1
        if len(res.failed_examples) < _FAILED_EXAMPLES:
            res.failed_examples.append(str(exc))


__all__ = [
    "OpCounts",
    "RecreateOptions",
    "RecreateResult",
    "SourceError",
    "make_filesystem",
    "mkfs_argv",
    "recreate",
    "run_op_stream",
]
