"""``fsage age``: pick the executor for a target, run a generated or recorded op stream on it,
take snapshots along the way, and keep a resumable record.

Targets:
- a directory (typically a mounted file system): POSIX calls;
- an ext image: loop-mounted and aged through the kernel when fsage runs as root with loop
  devices (the realistic allocator), else offline through libext2fs (with a notice);
- an LFS image: ``fsage.lfs.executor.LfsExecutor``, when that module exists.

The record (a JSON file: ``.fsage-age`` inside a directory target, ``<image>.fsage-age`` beside an
image) holds the op index reached and, for generated workloads, the generator's state; Ctrl-C
stops between two ops, so the target is consistent and the record exact, and ``--resume``
continues from it. After a kill, ``--resume`` takes what ran since the record from the journal
and checks a directory target's tree against the journal's (``fsage.ager.reconcile``), for the
op that was running may have taken effect without its journal line.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import os
import signal
import stat
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from fsage.ager.generator import DATA_OPS, Generator
from fsage.ager.images import (
    can_loop_mount,
    clear_stale_mounts,
    image_kind,
    mount,
    mount_dir,
    umount,
)
from fsage.ager.offline import OFFLINE_NOTICE, OfflineExtExecutor
from fsage.ager.posix import (
    IGNORED_NAMES,
    MARKER,
    InFlightError,
    PosixExecutor,
    check_target_dir,
    record_path_for,
)
from fsage.ager.profile import Profile
from fsage.ager.reconcile import (
    Difference,
    Node,
    Tree,
    difference,
    disk_tree,
    durable_prefix,
    journal_tree,
    load_tree,
    save_tree,
    tree_change,
)
from fsage.ager.resume import ProbeLog, ReplayError, probes_path, replay, tree_entries
from fsage.db import rowcheck
from fsage.errors import FsageError, UnsafeTargetError, UsageError, WorkloadError
from fsage.layout import Layout
from fsage.private import private_opener, write_private_text
from fsage.workload import (
    Executor,
    NoSpaceError,
    Op,
    OpFailedError,
    WorkloadHeader,
    read_workload,
)

if TYPE_CHECKING:
    from fsage.db.store import Store

RECORD_EVERY = 1000


@dataclass
class AgeOptions:
    profile: Profile | None = None
    ops_file: Path | None = None
    #: None: 0 for a new run, the record's seed for --resume.
    seed: int | None = None
    mode: str = "auto"  # auto | mount | offline
    force: bool = False
    resume: bool = False
    fsync: bool = False
    #: "write" (real data) or "fallocate" (blocks allocated, not written; mounted and offline
    #: ext targets).
    #: None: "write" for a new run, the record's for --resume.
    data: str | None = None
    db: Path | None = None
    snapshot_every: int = 0
    name: str | None = None
    progress: bool = False
    #: Cleaning policy of an LFS target (default: the one chosen at mkfs).
    policy: str | None = None
    #: A new generated run takes the files already on the target into its model, so that its
    #: churn deletes and rewrites them too (otherwise it ages only the files it makes).
    adopt: bool = False


@dataclass
class AgeResult:
    target: str
    description: str
    ops: int = 0
    bytes_written: int = 0
    skipped: int = 0
    nospace: int = 0
    fullness: float = 0.0
    elapsed: float = 0.0
    interrupted: bool = False
    resumed_from: int = 0
    finished: bool = False
    phase: str = ""
    #: What ended the run: fill, churn, ops-limit, converged, written, updates, prefragment
    #: (generated workloads), end-of-stream (--ops), interrupted.
    stopped_by: str = ""
    #: The op stream actually run (JSON Lines with a header): ``fsage age X --ops`` replays it.
    journal: str | None = None
    #: Process CPU time during the run, and the share of the run's wall time (snapshots left
    #: out) spent outside the executor's ops: generating, dispatching, keeping the record.
    cpu_user_s: float = 0.0
    cpu_system_s: float = 0.0
    own_share: float = 0.0
    snapshots: list[int] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    convergence: dict[str, Any] | None = None
    run_id: int | None = None  # the aging_runs row, when run with a database
    #: What the run (all of it, across resumes) changed on disk: ``TreeChange.to_json``;
    #: None when the tree it started on is not known.
    changes: dict[str, int] | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


# ---------------------------------------------------------------------------- targets


class Target:
    """An executor plus how to snapshot the target and where its record lives."""

    executor: Executor
    record_path: Path
    source: Path  # what read_source reads for a snapshot
    notices: list[str]
    kind: str = "dir"  # recorded in aging_runs: dir, mounted-<fs>, offline-ext, lfs

    def layout(self) -> Layout:
        from fsage.snapshotter import read_source

        return read_source(self.source)

    def walk(self) -> list[tuple[str, bool, int]]:
        """(relative path, is_dir, size) of everything in the target, for resuming."""
        return _layout_entries(self.layout())

    def tree_root(self) -> Path | None:
        """The directory the ops run in, when the target is one (a resume then checks the
        tree below it against the journal)."""
        return None

    def counters_mark(self) -> Any:
        """What ``run_metrics`` needs to report the part of a run after this moment."""
        return None

    def max_fill(self) -> float | None:
        """The highest fullness the target can reach, when it keeps room back (LFS)."""
        return None

    def run_metrics(
        self, fill_mark: tuple[int, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """(metrics, utilization) recorded with the aging run; the executor is open.
        ``fill_mark``: (op index, ``counters_mark()``) taken when a generated workload's fill
        phase ended."""
        return {}, {"fullness": self.executor.fullness()}

    def close(self) -> None:
        self.executor.close()


def _layout_entries(layout: Layout) -> list[tuple[str, bool, int]]:
    paths = layout.paths()
    files = layout.files
    out: list[tuple[str, bool, int]] = []
    isdir = files.is_dir()
    isreg = files.is_regular()
    for i in range(len(files)):
        ino = int(files.ino[i])
        if not (isdir[i] or isreg[i]):
            continue
        for p in paths.get(ino, []):
            rel = p.lstrip("/")
            if rel and rel.split("/")[0] not in ("lost+found", MARKER):
                out.append((rel, bool(isdir[i]), int(files.size[i])))
    return out


class DirTarget(Target):
    def __init__(self, path: Path, opts: AgeOptions) -> None:
        real = Path(os.path.realpath(path))
        self.record_path = record_path_for(real)
        self.source = check_target_dir(path, force=opts.force, record=self.record_path)
        self.executor = PosixExecutor(self.source, fsync=opts.fsync, data=opts.data or "write")
        self.notices = []

    def walk(self) -> list[tuple[str, bool, int]]:
        return _walk_dir(self.source)

    def tree_root(self) -> Path | None:
        return self.source


def _walk_dir(root: Path) -> list[tuple[str, bool, int]]:
    out: list[tuple[str, bool, int]] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        rel = os.path.relpath(dirpath, root)
        rel = "" if rel == "." else rel
        if not rel:
            dirnames[:] = [d for d in dirnames if d != "lost+found"]
        for d in dirnames:
            st = os.lstat(os.path.join(dirpath, d))
            if stat.S_ISDIR(st.st_mode):
                out.append((f"{rel}/{d}" if rel else d, True, 0))
        for f in filenames:
            if not rel and f == MARKER:
                continue
            st = os.lstat(os.path.join(dirpath, f))
            if stat.S_ISREG(st.st_mode):
                out.append((f"{rel}/{f}" if rel else f, False, st.st_size))
    return out


class MountedImageTarget(Target):
    """An image loop-mounted on a temporary directory; snapshots unmount, read, remount."""

    def __init__(self, image: Path, opts: AgeOptions) -> None:
        self.source = image
        self.record_path = image.with_name(image.name + ".fsage-age")
        self.kind = f"mounted-{image_kind(image) or 'image'}"
        self.mnt = mount_dir("age")
        self.opts = opts
        self.notices = [f"loop-mounted {image} on {self.mnt}; ops run through the kernel"]
        self._mounted = False
        try:
            mount(image, self.mnt)
            self._mounted = True
            check_target_dir(self.mnt, force=opts.force, record=self.record_path)
            self.executor = PosixExecutor(self.mnt, fsync=opts.fsync, data=opts.data or "write")
        except BaseException:
            self._unmount()
            raise

    def _unmount(self) -> None:
        if self._mounted:
            os.sync()
            umount(self.mnt)
            self._mounted = False
        with contextlib.suppress(OSError):
            self.mnt.rmdir()

    def layout(self) -> Layout:
        from fsage.snapshotter import read_source

        self.executor.close()
        umount(self.mnt)
        self._mounted = False
        try:
            return read_source(self.source)
        finally:
            mount(self.source, self.mnt)
            self._mounted = True
            self.executor = PosixExecutor(
                self.mnt, fsync=self.opts.fsync, data=self.opts.data or "write"
            )

    def walk(self) -> list[tuple[str, bool, int]]:
        return _walk_dir(self.mnt)

    def tree_root(self) -> Path | None:
        return self.mnt

    def close(self) -> None:
        try:
            self.executor.close()
        finally:
            self._unmount()


class ReopenTarget(Target):
    """An image written by a library executor; snapshots close it, read the image, reopen."""

    def __init__(
        self,
        image: Path,
        factory: Callable[[Path], Executor],
        notice: str,
        kind: str = "offline-ext",
    ) -> None:
        self.source = image
        self.record_path = image.with_name(image.name + ".fsage-age")
        self.factory = factory
        self.executor = factory(image)
        self.notices = [notice]
        self.kind = kind

    def _closed(self) -> None:
        """Hook: the executor was just closed (before a snapshot reopens it)."""

    def layout(self) -> Layout:
        from fsage.snapshotter import read_source

        self.executor.close()
        self._closed()
        try:
            return read_source(self.source)
        finally:
            self.executor = self.factory(self.source)


class LfsTarget(ReopenTarget):
    """An LFS image; the cleaner's counters are carried across the reopens of snapshots, so
    the run's write cost covers every op of the run."""

    def __init__(self, image: Path, policy: str | None = None) -> None:
        from fsage.lfs.cleaner import Counters
        from fsage.lfs.executor import LfsExecutor

        def factory(p: Path) -> LfsExecutor:
            return LfsExecutor(p, policy=policy)

        super().__init__(image, factory, "LFS image: ops run through fsage's LFS", "lfs")
        self.carried = Counters()

    def _closed(self) -> None:
        from fsage.lfs.executor import LfsExecutor

        if isinstance(self.executor, LfsExecutor):
            self.carried.add(self.executor.counters)

    def max_fill(self) -> float | None:
        from fsage.lfs.executor import LfsExecutor

        if isinstance(self.executor, LfsExecutor):
            return self.executor.fs.max_fullness()
        return None

    def counters_mark(self) -> Any:
        from fsage.lfs.cleaner import Counters
        from fsage.lfs.executor import LfsExecutor

        total = Counters()
        total.add(self.carried)
        if isinstance(self.executor, LfsExecutor):
            total.add(self.executor.counters)
        return total

    def run_metrics(
        self, fill_mark: tuple[int, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Seed 001 EQ 1-6 over the whole run and, when the workload had a fill phase, over
        the ops after it (``metrics["after_fill"]``: seed 001 counts the updates only)."""
        from fsage.lfs.cleaner import Counters
        from fsage.lfs.executor import LfsExecutor, lfs_metrics

        if not isinstance(self.executor, LfsExecutor):  # pragma: no cover - by construction
            return super().run_metrics(fill_mark)
        metrics, util = self.executor.aging_metrics(self.carried)
        util["fullness"] = self.executor.fullness()
        if fill_mark is not None and isinstance(fill_mark[1], Counters):
            after = self.counters_mark()
            after.subtract(fill_mark[1])
            part = lfs_metrics(self.executor.fs, after, self.executor.disk)
            part["from_op"] = fill_mark[0]
            metrics["after_fill"] = part
        return metrics, util


def open_target(path: Path, opts: AgeOptions) -> Target:
    """Choose how to reach ``path`` (see module doc)."""
    stale: list[str] = []
    tgt = _open_target(path, opts, stale)
    tgt.notices[:0] = stale
    return tgt


def _open_target(path: Path, opts: AgeOptions, stale: list[str]) -> Target:
    if opts.mode not in ("auto", "mount", "offline"):
        raise UsageError(f"unknown mode {opts.mode!r}")
    real = Path(os.path.realpath(path))
    if real == Path("/"):
        raise UnsafeTargetError("refusing to age '/'")
    if not path.exists():
        raise UsageError(f"{path}: no such file or directory")
    if opts.policy is not None and (path.is_dir() or image_kind(real) != "lfs"):
        raise UsageError("--policy chooses the cleaning policy of an LFS image")
    if path.is_dir():
        if opts.mode == "offline":
            raise UsageError("--offline needs an image file, not a directory")
        return DirTarget(path, opts)
    kind = image_kind(real)
    if kind is None:
        raise UsageError(
            f"{path}: not a directory or a recognised image (ext2/3/4, xfs, btrfs, LFS)"
        )
    if opts.data not in (None, "write", "fallocate"):
        raise UsageError(f"unknown data mode {opts.data!r} (write or fallocate)")
    # whichever way it is written, an image still mounted by a killed run must not be
    stale.extend(clear_stale_mounts(real))
    if kind == "lfs":
        if opts.data == "fallocate":
            raise UsageError("an LFS image is aged with --data write (a log has no fallocate)")
        return LfsTarget(real, opts.policy)
    if opts.mode == "offline" or (opts.mode == "auto" and not can_loop_mount()):
        if kind != "ext":
            raise UsageError(
                f"{path}: a {kind} image can only be aged mounted (needs root and loop devices)"
            )
        tgt = ReopenTarget(
            real, functools.partial(OfflineExtExecutor, data=opts.data or "write"), OFFLINE_NOTICE
        )
        if opts.mode == "auto":
            tgt.notices.insert(0, "not root or no loop devices: aging the image offline")
        return tgt
    if not can_loop_mount():
        raise UsageError("--mount needs root and /dev/loop-control")
    return MountedImageTarget(real, opts)


# ---------------------------------------------------------------------------- record


def _read_record(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_record(path: Path, data: dict[str, Any]) -> None:
    if path.is_symlink():
        raise UnsafeTargetError(f"{path} is a symlink")
    tmp = path.with_name(path.name + ".part")
    try:
        write_private_text(tmp, json.dumps(data, sort_keys=True) + "\n")
        tmp.replace(path)
    except OSError as exc:
        raise FsageError(f"cannot write the run's record {path}: {exc.strerror}") from None


def _rng_state_to_json(state: Any) -> list[Any]:
    version, internal, gauss = state
    return [version, list(internal), gauss]


def _rng_state_from_json(data: list[Any]) -> Any:
    return (data[0], tuple(data[1]), data[2])


# ---------------------------------------------------------------------------- the run


class _Interrupt:
    def __init__(self) -> None:
        self.hit = False
        self._old: Any = None

    def __enter__(self) -> _Interrupt:
        import threading

        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGINT, self._handler)
        return self

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        if self.hit:  # a second Ctrl-C: stop now
            raise KeyboardInterrupt
        self.hit = True

    def __exit__(self, *exc: object) -> None:
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)


def shape_profile(
    profile: Profile,
    *,
    fill: float | None = None,
    churn: float | None = None,
    ops_limit: int | None = None,
) -> Profile:
    """``profile`` with the options a user gave explicitly. A --fill or --churn given without
    --ops-limit lifts the profile's own op limit (hfs-aging's 10,000 ops), so the run stops on
    what was asked, not on a limit the user did not choose."""
    shaped = profile.with_overrides(fill=fill, churn=churn, ops_limit=ops_limit)
    if ops_limit is None and (fill is not None or churn is not None):
        shaped = replace(shaped, ops_limit=None)
    return shaped


def age(
    target_path: Path, opts: AgeOptions, echo: Callable[[str], None] | None = None
) -> AgeResult:
    """Age ``target_path`` with a generated (``opts.profile``) or recorded (``opts.ops_file``)
    workload; see the module doc. With ``opts.resume`` the workload comes from the record, and
    a profile, op stream or seed given as well must be the record's."""
    if not opts.resume and (opts.profile is None) == (opts.ops_file is None):
        raise UsageError("give exactly one of a profile or an op stream")
    if opts.profile is not None and opts.ops_file is not None:
        raise UsageError("give exactly one of a profile or an op stream")
    say = echo or (lambda s: None)
    if opts.resume:
        # The workload, seed and way of reaching the target are the interrupted run's.
        real = Path(os.path.realpath(target_path))
        record = _read_record(record_path_for(real))
        if record.get("finished") is False:
            opts = _workload_from_record(Path(target_path), opts, record)
            rec_data = str(record.get("data", "write"))
            if opts.data is not None and opts.data != rec_data:
                raise UsageError(f"{target_path}: the interrupted run ran with --data {rec_data}")
            opts = replace(opts, data=rec_data)
    opts = replace(opts, data=opts.data or "write")
    tgt = open_target(Path(target_path), opts)
    try:
        res = _run(tgt, Path(target_path), opts, say)
    except BaseException:
        # The first error is the one shown: closing after it may fail too (a full log).
        with contextlib.suppress(Exception):
            tgt.close()
        raise
    tgt.close()
    return res


def _workload_from_record(path: Path, opts: AgeOptions, record: dict[str, Any]) -> AgeOptions:
    """The options of the interrupted run in ``record``; refuse anything given that differs."""
    ident = record.get("ident") or {}
    if ident.get("kind") == "ops":
        rec_ops = Path(str(ident.get("ops_file")))
        if opts.profile is not None:
            raise UsageError(
                f"{path}: the interrupted run ran the op stream {rec_ops}, not a profile"
            )
        if opts.ops_file is not None and Path(os.path.realpath(opts.ops_file)) != Path(
            os.path.realpath(rec_ops)
        ):
            raise UsageError(f"{path}: the interrupted run ran the op stream {rec_ops}")
        return replace(opts, ops_file=rec_ops, mode=_record_mode(path, opts, record))
    if ident.get("kind") != "profile" or "profile" not in ident:
        raise UsageError(f"{path}: the record of the interrupted run is unreadable")
    rec_profile = Profile.from_json(ident["profile"], name=str(ident["profile"].get("name", "")))
    if opts.ops_file is not None:
        raise UsageError(f"{path}: the interrupted run generated profile {rec_profile.name}")
    if opts.profile is not None:
        given = json.loads(json.dumps(opts.profile.to_json()))
        if given != ident["profile"]:
            diff = sorted(
                k
                for k in set(given) | set(ident["profile"])
                if given.get(k) != ident["profile"].get(k)
            )
            raise UsageError(
                f"{path}: the interrupted run used profile {rec_profile.name} with other "
                f"settings ({', '.join(diff)}); resume without --profile and its options"
            )
    rec_seed = int(ident.get("seed", 0))
    if opts.seed is not None and opts.seed != rec_seed:
        raise UsageError(f"{path}: the interrupted run used seed {rec_seed}")
    return replace(opts, profile=rec_profile, seed=rec_seed, mode=_record_mode(path, opts, record))


def _record_mode(path: Path, opts: AgeOptions, record: dict[str, Any]) -> str:
    """The interrupted run's --mount/--offline choice (an image aged offline is not resumed
    through the kernel's allocator, nor the other way round)."""
    rec_mode = str(record.get("mode", opts.mode))
    if opts.mode != "auto" and rec_mode not in ("auto", opts.mode):
        raise UsageError(f"{path}: the interrupted run ran {rec_mode}, not {opts.mode}")
    return rec_mode if opts.mode == "auto" else opts.mode


class _Journal:
    """The op stream actually run, one JSON line per op that took effect, written as it runs
    (one ``write`` per op, so a killed run leaves every completed op in it)."""

    def __init__(self, path: Path, header: WorkloadHeader | None, keep_bytes: int | None) -> None:
        self.path = path
        try:
            if header is not None:
                flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW
                fd = private_opener(path, flags)
                os.write(fd, (header.to_json() + "\n").encode())
            else:
                fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError as exc:
            raise FsageError(f"cannot write the journal {path}: {exc.strerror}") from None
        self.fd = fd
        if keep_bytes is not None:
            os.ftruncate(fd, keep_bytes)
        self._end = os.lseek(fd, 0, os.SEEK_END)

    @property
    def bytes(self) -> int:
        """Where the journal ends: lines are appended at the descriptor's offset (by ``add``
        or by an executor's ``journaled`` apply)."""
        if self.fd >= 0:
            self._end = os.lseek(self.fd, 0, os.SEEK_CUR)
        return self._end

    @staticmethod
    def tail(path: Path, from_byte: int) -> tuple[list[Op], int]:
        """The complete op lines after ``from_byte`` (what ran after the record's last mark)
        and the byte offset where they end (a torn last line is dropped)."""
        with open(path, "rb") as fh:
            fh.seek(from_byte)
            data = fh.read()
        end = data.rfind(b"\n") + 1
        ops = [
            Op.from_json(json.loads(line), f"{path}: ")
            for line in data[:end].splitlines()
            if line.strip()
        ]
        return ops, from_byte + end

    def add(self, op: Op) -> None:
        line = _op_line(op)
        try:
            os.write(self.fd, line)
        except OSError as exc:
            raise FsageError(f"cannot write the journal {self.path}: {exc.strerror}") from None

    def close(self) -> None:
        if self.fd >= 0:
            self._end = os.lseek(self.fd, 0, os.SEEK_CUR)
            os.close(self.fd)
            self.fd = -1


def _stepper(ex: Executor, journal: _Journal, ahead: bool = False) -> Callable[[Op], int]:
    """Run an op on ``ex``, then journal it (only once it took effect): on a directory
    target both in one C call, and with ``ahead`` on a worker thread while the next op is
    generated (see ``PosixExecutor.journaled``)."""
    if isinstance(ex, PosixExecutor):
        return ex.journaled(journal, ahead=ahead)

    def step(op: Op) -> int:
        n = ex.apply(op)
        journal.add(op)
        return n

    return step


def _drain(ex: Executor) -> None:
    """Wait for the ops an executor runs ahead (raises InFlightError if one failed)."""
    if isinstance(ex, PosixExecutor):
        ex.drain()


def _lost_in_flight(ex: Executor) -> InFlightError | None:
    """After an error: wait for the ops run ahead; the failure among them, if any."""
    try:
        _drain(ex)
    except InFlightError as exc:
        return exc
    except Exception:  # the first error is the one shown
        return None
    return None


def _busy(ex: Executor) -> float | None:
    """Seconds the executor spent running ops, when it measures them itself."""
    return ex.busy_s if isinstance(ex, PosixExecutor) else None


def _op_line(op: Op) -> bytes:
    """A journal line: ``op.to_json()`` and a newline."""
    return (op.to_json() + "\n").encode()


def _start_tree_path(journal: Path) -> Path:
    """Where the tree a journal started on is kept (when it was not empty)."""
    return journal.with_name(journal.name.removesuffix(".ops.jsonl") + ".start.json")


def _start_tree(tgt: Target) -> tuple[Tree, dict[str, int]]:
    """The tree a new run starts on, with inode numbers where the target is a directory tree
    (elsewhere each path its own number: the reader's walk shows no hard links)."""
    root = tgt.tree_root()
    if root is not None:
        return disk_tree(root, skip=IGNORED_NAMES)
    entries = tgt.walk()
    tree: Tree = {p: Node("d") if is_dir else Node("f", size) for p, is_dir, size in entries}
    return tree, {p: i for i, p in enumerate(sorted(tree), 1)}


def _save_start_tree(journal: Path, tree: Tree, inodes: dict[str, int]) -> None:
    """Keep the tree a new journal starts on beside it, when not empty: a resume after a kill
    replays the journal, and the generator, from it."""
    if tree:
        save_tree(_start_tree_path(journal), tree, inodes)


def _compare_with_journal(
    tgt: Target,
    journal: Path,
    opts: AgeOptions,
    res: AgeResult,
    say: Callable[[str], None],
) -> tuple[Difference | None, Tree]:
    """How the tree on disk differs from the one the journal replays to, and that tree;
    (None, {}) when the target is not a directory tree."""
    root = tgt.tree_root()
    if root is None:
        return None, {}
    with open(journal, "rb") as fh:
        header_end = len(fh.readline())
    ops, _ = _Journal.tail(journal, header_end)  # every complete line: what took effect
    try:
        base = load_tree(_start_tree_path(journal))
        journaled = journal_tree(base, ops, allocate_only=opts.data == "fallocate")
    except WorkloadError as exc:
        res.notices.append(f"the journal could not be checked against the target: {exc}")
        say(f"fsage: {res.notices[-1]}")
        return None, {}
    disk, inodes = disk_tree(root, skip=IGNORED_NAMES)
    return difference(journaled, disk, inodes), journaled


def _lfs_durable(
    tgt: Target,
    journal: Path,
    ran_after: list[Op],
    keep: int | None,
    res: AgeResult,
    say: Callable[[str], None],
) -> tuple[list[Op], int | None, list[Op] | None]:
    """The journal cut back to the ops the LFS image holds: a killed LFS run loses the ops of
    its segment buffer, journaled but never written, and those run again. Returns the ops
    that ran after the record and the journal's length, or, when the image lost ops journaled
    before the record too, every op it holds, the length, and the ops lost before the record."""
    with open(journal, "rb") as fh:
        fh.readline()
        lines = fh.read().splitlines(keepends=True)
    header_end = journal.stat().st_size - sum(map(len, lines))
    every, _ = _Journal.tail(journal, header_end)
    mark = len(every) - len(ran_after)  # journaled before the record
    image: Tree = {p: Node("d") if is_dir else Node("f", size) for p, is_dir, size in tgt.walk()}
    k = durable_prefix(load_tree(_start_tree_path(journal)), every, image)
    if k is None:
        raise FsageError(
            f"{tgt.source}: the killed run's LFS image holds none of the states its journal "
            "passes through: it cannot be resumed"
        )
    if k == len(every):
        return ran_after, keep, None
    res.notices.append(
        f"{len(every) - k} ops journaled after the last segment the LFS image holds were lost "
        "with the kill: they run again"
    )
    say(f"fsage: {res.notices[-1]}")
    cut = header_end + sum(map(len, lines[:k]))
    if k >= mark:
        return ran_after[: k - mark], cut, None
    return every[:k], cut, every[k:mark]


def _journaled_ops(journal: Path, end: int) -> list[Op]:
    """The ops of ``journal`` up to byte ``end`` (where the resumed run goes on from)."""
    with open(journal, "rb") as fh:
        header_end = len(fh.readline())
    ops, stop = _Journal.tail(journal, header_end)
    if stop > end:  # cut back (an LFS image lost the ops after ``end``)
        with open(journal, "rb") as fh:
            fh.seek(header_end)
            kept = fh.read(end - header_end)
        ops = ops[: kept.count(b"\n")]
    return ops


def _changes(journal: Path, opts: AgeOptions) -> dict[str, int] | None:
    """What the run journaled in ``journal`` changed on disk, from the tree it started on."""
    try:
        base = load_tree(_start_tree_path(journal))
        with open(journal, "rb") as fh:
            header_end = len(fh.readline())
        ops, _ = _Journal.tail(journal, header_end)
        return tree_change(base, ops, allocate_only=opts.data == "fallocate").to_json()
    except (OSError, WorkloadError):  # a start not kept (a recorded stream on an image)
        return None


def _setup(gen: Generator, tree: Tree, adopt: bool) -> None:
    """Give a new generator the tree its run starts on: to age with its own files
    (``adopt``), or to keep clear of."""
    if adopt:
        gen.adopt(tree_entries(tree, regular_only=True))
    else:
        gen.reserve(tree_entries(tree, regular_only=False))


def _data_bytes(ops: list[Op]) -> int:
    """The bytes ``ops`` write (as ``bytes_written`` counts them)."""
    return sum(o.size for o in ops if o.op in DATA_OPS)


def _as_named_by(found: Difference, op: Op | None) -> Op | None:
    """``found.op`` under ``op``'s name of the file, when the file written has several (hard
    links: every name of it differs)."""
    if op is None or found.op is None or op.path not in found.paths or op.op == "create":
        return found.op
    return replace(found.op, path=op.path) if found.op.op in ("append", "truncate") else found.op


def _in_part(op: Op, effect: Op | None) -> bool:
    """True when ``effect`` (a change found on disk) is what ``op`` leaves when it stops
    part-way: a file created or appended to but not to its full length."""
    return (
        effect is not None
        and op.op in ("create", "append")
        and effect.path == op.path
        and effect.op in ("create", "append", "truncate")
    )


def _describe(op: Op) -> str:
    text = f"{op.op} {op.path!r}" + (f" to {op.dest!r}" if op.dest else "")
    if op.op in DATA_OPS or op.op == "truncate":
        text += f", {op.size:,} bytes"
    return text


def _journal_path(record_path: Path) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    return record_path.with_name(f"{record_path.name}.{stamp}.ops.jsonl")


def _run(tgt: Target, path: Path, opts: AgeOptions, say: Callable[[str], None]) -> AgeResult:
    res = AgeResult(target=str(path), description=tgt.executor.description)
    res.notices.extend(tgt.notices)
    for n in res.notices:
        say(f"fsage: {n}")
    record = _read_record(tgt.record_path)
    unfinished = bool(record) and record.get("finished") is False
    if opts.resume and not unfinished:
        raise UsageError(f"{path}: no interrupted run to resume")
    if unfinished and not opts.resume and not opts.force:
        raise UsageError(
            f"{path}: an earlier run stopped at op {record.get('ops_done')}; "
            "use --resume to continue it or --force to start another"
        )
    if not opts.resume:
        record = {}
    seed = opts.seed or 0

    gen: Generator | None = None
    ident: dict[str, Any]
    ops: Iterator[Op]
    header: WorkloadHeader
    start = int(record.get("ops_done", 0)) if opts.resume else 0
    bytes_written = int(record.get("bytes_written", 0)) if opts.resume else 0
    # After a run killed between two records, the journal holds the ops that ran after the
    # last one: they are not run again.
    ran_after: list[Op] = []
    journal_keep: int | None = None
    old_journal = Path(record["journal"]) if opts.resume and record.get("journal") else None
    if old_journal is not None and old_journal.is_file():
        ran_after, journal_keep = _Journal.tail(old_journal, int(record.get("journal_bytes", 0)))
    elif old_journal is not None:
        old_journal = None
    # A run killed while an op ran may have left that op's effect, whole or in part, without
    # its journal line: the tree on disk is checked against the one the journal replays to.
    unclean = opts.resume and not record.get("clean", False)
    if unclean and old_journal is not None and tgt.kind == "offline-ext":
        raise FsageError(
            f"{path}: the offline run was killed: libext2fs keeps the image's bitmaps, group "
            "descriptors and inodes in memory until it closes, so the image holds neither its "
            "journal's ops nor those of its record (check it with e2fsck -fn); it cannot be "
            "resumed: age a fresh image"
        )
    if unclean and old_journal is not None and tgt.kind == "lfs":
        ran_after, journal_keep, back = _lfs_durable(
            tgt, old_journal, ran_after, journal_keep, res, say
        )
        if back is not None:  # the image lost ops journaled before the record too
            if opts.ops_file is not None:  # the stream is skipped from its start
                start, bytes_written = 0, 0
            else:  # the generator goes on from the tree on disk
                start -= len(back)
                bytes_written -= _data_bytes(back)
                ran_after = []
    bytes_written += _data_bytes(ran_after)
    found: Difference | None = None
    journaled: Tree = {}
    if unclean and old_journal is not None:
        found, journaled = _compare_with_journal(tgt, old_journal, opts, res, say)
    # A new run's journal, and the tree it starts on (a generated run keeps clear of it).
    new_journal = _journal_path(tgt.record_path)
    start_tree: Tree = {}
    start_inodes: dict[str, int] = {}
    if old_journal is None and (opts.ops_file is None or tgt.tree_root() is not None):
        start_tree, start_inodes = _start_tree(tgt)
    plog: ProbeLog | None = None
    #: The stream goes on as it would have without the stop (a recorded stream, or a
    #: generator replayed through the journal).
    exact_resume = False
    repair: Op | None = None  # the op that took effect unjournaled: journaled, not run again
    undo: Op | None = None  # what takes back the part of an op that took effect in part
    rerun: Op | None = None  # the next op, which took effect in part: it runs again
    if opts.ops_file is not None:
        bs, total, _ = tgt.executor.capacity_blocks()
        header, ops = read_workload(opts.ops_file, capacity=bs * total)
        ident = {"kind": "ops", "ops_file": str(opts.ops_file), "header": header.to_json()}
        if opts.resume and record.get("ident", {}).get("header") != ident["header"]:
            raise UsageError(f"{path}: the op stream {opts.ops_file} changed since the run stopped")
        ops = itertools.islice(ops, start, None)
        start += _skip_ran(ops, ran_after)
        exact_resume = True
    else:
        assert opts.profile is not None
        profile = opts.profile
        bs, total, _ = tgt.executor.capacity_blocks()

        def probe() -> tuple[int, int, int]:
            return tgt.executor.capacity_blocks()

        reach = tgt.max_fill()
        if reach is not None and profile.fill > reach:
            raise UsageError(
                f"{path}: fill {profile.fill:g} cannot be reached: the clean segments the log "
                f"keeps back leave at most {reach:.3f} (use --fill {reach - 0.005:.2f} or less)"
            )
        journal_file = old_journal if old_journal is not None else new_journal
        plog_path = probes_path(journal_file)
        ident = {"kind": "profile", "profile": profile.to_json(), "seed": seed}
        adopt = bool(record.get("ident", {}).get("adopt")) if opts.resume else opts.adopt
        if adopt:
            ident["adopt"] = True
        exact = not opts.resume or (old_journal is not None and ProbeLog.usable(plog_path))
        if exact:
            plog = ProbeLog(plog_path, probe, resume=opts.resume)
            gen = Generator(profile, seed, total * bs, probe=plog, block_size=bs)
            if opts.resume:
                assert old_journal is not None and journal_keep is not None
                _setup(gen, load_tree(_start_tree_path(old_journal)), adopt)
                try:
                    ops = replay(gen, _journaled_ops(old_journal, journal_keep))
                except ReplayError as exc:
                    plog.close()
                    plog = None
                    res.notices.append(
                        f"the run cannot go on as it would have without the stop ({exc}): its "
                        "generator goes on from the tree on disk"
                    )
                    say(f"fsage: {res.notices[-1]}")
                    exact = False
                else:
                    start = gen.stats.ops
                    exact_resume = True
            else:
                _setup(gen, start_tree, adopt)
                ops = gen.ops()
        if not exact:
            # No probes kept (a run an older fsage began), or a journal the generator does not
            # make: it takes the tree on disk and the random state of the last record.
            gen = Generator(profile, seed, total * bs, probe=probe, block_size=bs)
            gen.adopt(tgt.walk())
            st = record.get("gen", {})
            start += len(ran_after)
            if found is not None and found.op is not None:
                repair = found.op  # the generator takes the tree on disk as it is
                start += 1
                bytes_written += _data_bytes([repair])
            gen.stats.ops = start
            gen.stats.bytes_written = bytes_written
            gen.stats.phase = st.get("phase", "fill")
            gen.stats.fill_ops = st.get("fill_ops")
            gen.stats.fill_bytes = st.get("fill_bytes")
            gen.rng.setstate(_rng_state_from_json(st["rng"]))
            ops = gen.ops()
        assert gen is not None
        header = gen.header()
    if exact_resume and found is not None and found.op is not None:
        # The stream says which op was running: the difference is that op, whole or in
        # part (then it runs again, after what it appended is cut off).
        nxt = next(ops, None)
        effect = _as_named_by(found, nxt)
        if nxt is not None and nxt == effect:
            repair = nxt
            start += 1
            bytes_written += _data_bytes([nxt])
        elif nxt is not None and _in_part(nxt, effect):
            rerun = nxt
            if nxt.op == "append":
                undo = Op("truncate", nxt.path, size=journaled[nxt.path].size)
        if nxt is not None and repair is None:
            ops = itertools.chain([nxt], ops)
    res.resumed_from = start
    # A run killed between an op and its journal line, on a target whose tree could not be
    # checked against the journal: that op may have taken effect; a namespace op that then
    # fails as already done is counted as done.
    settled = found is not None and (not found.paths or repair is not None or rerun is not None)
    in_flight = unclean and not settled
    kill_notice = ""
    if found is not None and found.paths and not settled:
        kill_notice = (
            f"the target differs from its journal by more than the op running when the run "
            f"was killed can have done ({len(found.paths)} paths, e.g. {found.paths[0]!r}): "
            "the journal will not replay to it exactly"
        )
    elif repair is not None:
        kill_notice = (
            f"the op running when the run was killed ({_describe(repair)}) had taken effect "
            "without its journal line: journaled now, not run again"
        )
    elif rerun is not None:
        kill_notice = (
            f"the op running when the run was killed ({_describe(rerun)}) had taken effect "
            "in part: it runs again" + (" on the file's length before it" if undo else "")
        )
    if opts.resume:
        say(f"fsage: resuming at op {start}")
        if gen is not None and exact_resume:
            res.notices.append(
                f"the generator ran again through the journal (op {res.resumed_from:,}): the "
                "run goes on with the ops it would have made without the stop"
            )
            say(f"fsage: {res.notices[-1]}")
        if ran_after:
            res.notices.append(
                f"the run had stopped without a clean record: {len(ran_after)} ops it ran "
                "after its last record were taken from its journal"
            )
            say(f"fsage: {res.notices[-1]}")
        if kill_notice:
            res.notices.append(kill_notice)
            say(f"fsage: {kill_notice}")

    if old_journal is not None:
        journal = _Journal(old_journal, None, journal_keep)
        if undo is not None:
            tgt.executor.apply(undo)
        if repair is not None:
            journal.add(repair)
    else:
        jheader = WorkloadHeader(
            generator="fsage.age/journal",
            params={"workload": ident, "target": str(path), "source_header": header.to_json()},
            seed=seed if gen is not None else header.seed,
        )
        journal = _Journal(new_journal, jheader, None)
        _save_start_tree(journal.path, start_tree, start_inodes)
    res.journal = str(journal.path)

    store_cm: Any = contextlib.nullcontext(None)
    if opts.db is not None:
        from fsage.db.store import Store

        store_cm = Store.open(opts.db, create=True)
    # The store's rule names the file system (its label, else its uuid, or the name it was
    # recorded under), as `fsage snapshot` does; --name, also from the resumed run's record.
    name: str | None = opts.name or record.get("name")
    start_bytes = bytes_written
    params: dict[str, Any] = {
        "workload": ident,
        "mode": opts.mode,
        "snapshot_every": opts.snapshot_every,
        "name": name,
        "resumed_from": start,
        "fsync": opts.fsync,
        "data": opts.data,
        "description": tgt.executor.description,
        "journal": str(journal.path),
    }

    done = start
    # How the target was reached (recorded so --resume reaches it the same way).
    tgt_mode = "offline" if tgt.kind == "offline-ext" else "auto"
    if tgt.kind.startswith("mounted"):
        tgt_mode = "mount"

    def save(finished: bool, clean: bool = False) -> None:
        _drain(tgt.executor)  # every op counted has run, and is in the journal
        data: dict[str, Any] = {
            "ident": ident,
            "ops_done": done,
            "bytes_written": bytes_written,
            "finished": finished,
            "clean": clean or finished,
            "mode": tgt_mode,
            "data": opts.data,
            "journal": str(journal.path),
            "journal_bytes": journal.bytes,
            "updated": time.time(),
        }
        if name is not None:
            data["name"] = name
        if gen is not None:
            data["gen"] = {
                "phase": gen.stats.phase,
                "fill_ops": gen.stats.fill_ops,
                "fill_bytes": gen.stats.fill_bytes,
                "rng": _rng_state_to_json(gen.rng.getstate()),
            }
        _write_record(tgt.record_path, data)

    t0 = time.perf_counter()
    cpu0 = os.times()
    apply_s = 0.0
    snap_s = 0.0
    last_draw = t0
    progress = opts.progress
    # A generated workload's ops run ahead on a directory target's worker thread (never the
    # first op after an unclean stop, which may have run already: it runs here).
    ahead = gen is not None
    step = _stepper(tgt.executor, journal, ahead and not in_flight)
    busy_before = 0.0  # by executors replaced at snapshots
    last_snap = [-1]
    clock = time.perf_counter
    with store_cm as store, _Interrupt() as intr:

        def snapshot(label: str) -> None:
            nonlocal step, snap_s, busy_before, name
            if store is None:
                return
            ts = clock()
            _drain(tgt.executor)
            old, busy = tgt.executor, _busy(tgt.executor)
            layout = tgt.layout()
            if tgt.executor is not old:  # reopened: its count starts again
                busy_before += busy or 0.0
            step = _stepper(tgt.executor, journal, ahead)
            summ = store.add_snapshot(
                layout, name=name, op_count=done, bytes_written=bytes_written, label=label
            )
            res.snapshots.append(int(summ.snapshot_id))
            name = summ.fs_name
            last_snap[0] = done
            snap_s += clock() - ts

        def timing() -> dict[str, Any]:
            wall = clock() - t0
            cpu1 = os.times()
            res.cpu_user_s = cpu1.user - cpu0.user
            res.cpu_system_s = cpu1.system - cpu0.system
            work = wall - snap_s
            # The executor's time: its own count of the time ops ran where it keeps one (ops
            # run ahead overlap generating: the time in its calls would not show them), else
            # the time in its calls.
            busy = _busy(tgt.executor)
            executor_s = apply_s if busy is None else busy_before + busy
            res.own_share = (work - executor_s) / work if work > 0 else 0.0
            return {
                "elapsed_s": wall,
                "snapshot_s": snap_s,
                "executor_s": executor_s,
                "cpu_user_s": res.cpu_user_s,
                "cpu_system_s": res.cpu_system_s,
                "own_share": res.own_share,
            }

        save(False)
        fill_mark: tuple[int, Any] | None = None  # (op index, counters) when the fill ended
        run_id = None
        if store is not None:
            run_id = _start_aging_run(store, tgt, path, params)
            res.run_id = run_id
        try:
            if store is not None and start == 0:
                snapshot("start")
            for op in ops:
                if fill_mark is None and gen is not None and gen.stats.phase != "fill":
                    fill_mark = (done, tgt.counters_mark())
                ta = clock()
                try:
                    bytes_written += step(op)
                except NoSpaceError:
                    res.nospace += 1
                    if gen is not None:
                        gen.nospace(op)
                    else:
                        res.skipped += 1
                except OpFailedError:
                    if in_flight and op.op in ("mkdir", "delete", "rename", "link"):
                        res.notices.append(f"{op.op} {op.path!r} had already run before the stop")
                        say(f"fsage: {res.notices[-1]}")
                        journal.add(op)
                    elif gen is not None or not res.nospace:
                        raise
                    else:
                        res.skipped += 1  # a recorded stream after a skipped op: keep going
                apply_s += clock() - ta
                if in_flight:
                    in_flight = False
                    step = _stepper(tgt.executor, journal, ahead)
                done += 1
                if op.op == "snapshot" or (opts.snapshot_every and done % opts.snapshot_every == 0):
                    snapshot(op.label or f"op {done}")
                if done % RECORD_EVERY == 0:
                    save(False)
                if progress and done & 63 == 0:
                    now = clock()
                    if now - last_draw > 0.5:
                        last_draw = now
                        rate = (done - start) / (now - t0)
                        full = tgt.executor.fullness()
                        sys.stderr.write(
                            f"\r  {done} ops  {rate:,.0f} ops/s  fullness {full:.3f}  "
                            f"{bytes_written / 2**20:,.0f} MiB written "
                        )
                        sys.stderr.flush()
                if intr.hit:
                    break
            res.interrupted = intr.hit
            res.finished = not intr.hit
            res.ops = done
            res.bytes_written = bytes_written
            if res.interrupted:
                res.stopped_by = "interrupted"
            elif gen is not None:
                res.stopped_by = gen.stats.stopped_by
            else:
                res.stopped_by = "end-of-stream"
            if hasattr(tgt.executor, "sync"):
                tgt.executor.sync()
            save(res.finished, clean=True)
            if store is not None and not res.interrupted and last_snap[0] != done:
                snapshot("end")
        except BaseException as exc:
            # The record says exactly where the run stopped: the op that failed (or was
            # interrupted) did not take effect, and --resume runs it again. Ops run ahead
            # that failed or were queued after a failure did not run either.
            lost = exc if isinstance(exc, InFlightError) else _lost_in_flight(tgt.executor)
            if lost is not None:
                done -= lost.lost_ops
                bytes_written -= lost.lost_bytes
            with contextlib.suppress(Exception):
                save(False, clean=True)
            journal.close()
            if plog is not None:
                plog.close()
            if store is not None and run_id is not None:
                status = "failed" if isinstance(exc, Exception) else "interrupted"
                fail_metrics: dict[str, Any] | None = None
                fail_util: dict[str, Any] | None = None
                with contextlib.suppress(Exception):  # what the run did up to the error
                    fail_metrics, fail_util = tgt.run_metrics(fill_mark)
                    fail_metrics = {
                        "elapsed_s": time.perf_counter() - t0,
                        "nospace": res.nospace,
                        "skipped": res.skipped,
                        **fail_metrics,
                    }
                with contextlib.suppress(Exception):
                    _finish_aging_run(
                        store,
                        run_id,
                        name=name,
                        status=status,
                        ops=done - start,
                        bytes_written=bytes_written - start_bytes,
                        snapshots=res.snapshots,
                        metrics={**timing(), **(fail_metrics or {})},
                        utilization=fail_util,
                        notes=[f"{type(exc).__name__}: {exc}"],
                    )
            raise
        journal.close()
        if plog is not None:
            plog.close()
        res.changes = _changes(journal.path, opts)
        times = timing()
        if gen is not None and _limit_notice(res, gen, tgt):
            say(f"fsage: {res.notices[-1]}")
        if store is not None and run_id is not None:
            metrics, utilization = tgt.run_metrics(fill_mark)
            metrics = {
                **times,
                "nospace": res.nospace,
                "skipped": res.skipped,
                "stopped_by": res.stopped_by,
                **metrics,
            }
            _finish_aging_run(
                store,
                run_id,
                name=name,
                status="interrupted" if res.interrupted else "finished",
                ops=done - start,
                bytes_written=bytes_written - start_bytes,
                snapshots=res.snapshots,
                metrics=metrics,
                utilization=utilization,
                notes=res.notices,
            )
    if progress:
        sys.stderr.write("\n")
    res.elapsed = time.perf_counter() - t0
    res.fullness = tgt.executor.fullness()
    if gen is not None:
        res.phase = gen.stats.phase
        if gen.profile.mode == "convergence":
            res.convergence = gen.convergence_report()
    return res


def _skip_ran(ops: Iterator[Op], ran: list[Op]) -> int:
    """Consume the stream's ops up to the last of ``ran`` (the ops the journal shows ran after
    the record's mark, in order; ops between them that are not in the journal ran out of space
    or were skipped then); returns how many were consumed."""
    n = 0
    i = 0
    while i < len(ran):
        op = next(ops, None)
        if op is None:
            raise WorkloadError("the journal holds ops that are not in the op stream")
        n += 1
        if op == ran[i]:
            i += 1
    return n


def _limit_notice(res: AgeResult, gen: Generator, tgt: Target) -> bool:
    """Say when a limit other than the fill and churn asked for ended the run."""
    p = gen.profile
    if res.stopped_by == "ops-limit":
        full = tgt.executor.fullness()
        res.notices.append(
            f"stopped by the op limit of {p.ops_limit:,} ops"
            + (
                f" before the fill target {p.fill:.2f} was reached (fullness {full:.3f})"
                if gen.stats.phase == "fill"
                else ""
            )
            + "; give --ops-limit, or --fill/--churn without it, to age further"
        )
        return True
    return False


# ---------------------------------------------------------------------------- aging runs


def _now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _start_aging_run(store: Store, tgt: Target, path: Path, params: dict[str, Any]) -> int:
    with store.transaction() as con:
        cur = con.execute(
            "INSERT INTO aging_runs(target, kind, started_at, params) VALUES (?, ?, ?, ?)",
            (str(path), tgt.kind, _now_iso(), json.dumps(params, sort_keys=True, default=str)),
        )
        assert cur.lastrowid is not None
        return cur.lastrowid


def _finish_aging_run(
    store: Store,
    run_id: int,
    *,
    name: str | None,
    status: str,
    ops: int,
    bytes_written: int,
    snapshots: list[int],
    metrics: dict[str, Any] | None = None,
    utilization: dict[str, Any] | None = None,
    notes: list[str] | None = None,
) -> None:
    with store.transaction() as con:
        row = con.execute("SELECT id FROM filesystems WHERE name = ?", (name,)).fetchone()
        con.execute(
            "UPDATE aging_runs SET fs_id = ?, finished_at = ?, status = ?, ops = ?,"
            " bytes_written = ?, first_snap = ?, last_snap = ?, metrics = ?, utilization = ?,"
            " notes = ? WHERE id = ?",
            (
                int(row[0]) if row is not None and snapshots else None,
                _now_iso(),
                status,
                ops,
                bytes_written,
                min(snapshots) if snapshots else None,
                max(snapshots) if snapshots else None,
                json.dumps(metrics or {}, sort_keys=True, allow_nan=False, default=_json_default),
                json.dumps(utilization or {}, sort_keys=True, allow_nan=False),
                json.dumps(notes or []),
                run_id,
            ),
        )


def _json_default(obj: object) -> Any:
    return str(obj)


@dataclass
class AgingRun:
    """One row of ``aging_runs`` (see migration 2 in ``fsage.db.schema``)."""

    id: int
    fs: str | None
    target: str
    kind: str
    status: str
    started_at: str
    finished_at: str | None
    params: dict[str, Any]
    ops: int
    bytes_written: int
    first_snap: int | None
    last_snap: int | None
    metrics: dict[str, Any]
    utilization: dict[str, Any]
    notes: list[str]

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def aging_runs(store: Store, fs_name: str | None = None, kind: str | None = None) -> list[AgingRun]:
    """The aging runs recorded in ``store``, oldest first; only those of file system
    ``fs_name`` and/or target kind ``kind`` (e.g. ``lfs``) when given."""
    sql = (
        "SELECT r.id, f.name, r.target, r.kind, r.status, r.started_at, r.finished_at,"
        " r.params, r.ops, r.bytes_written, r.first_snap, r.last_snap, r.metrics,"
        " r.utilization, r.notes FROM aging_runs r LEFT JOIN filesystems f ON f.id = r.fs_id"
    )
    where: list[str] = []
    args: list[Any] = []
    rowcheck.verify(store.con, "aging_runs")
    if fs_name is not None:
        store.snapshots(fs_name)  # an unknown name is an error, as elsewhere
        where.append("f.name = ?")
        args.append(fs_name)
    if kind is not None:
        where.append("r.kind = ?")
        args.append(kind)
    if where:
        sql += " WHERE " + " AND ".join(where)
    out = []
    for row in store.con.execute(sql + " ORDER BY r.id", args):
        out.append(
            AgingRun(
                id=int(row[0]),
                fs=row[1],
                target=row[2],
                kind=row[3],
                status=row[4],
                started_at=row[5],
                finished_at=row[6],
                params=_loads(row[7], {}),
                ops=int(row[8]),
                bytes_written=int(row[9]),
                first_snap=row[10],
                last_snap=row[11],
                metrics=_loads(row[12], {}),
                utilization=_loads(row[13], {}),
                notes=_loads(row[14], []),
            )
        )
    return out


def _loads(text: str | None, empty: Any) -> Any:
    try:
        value = json.loads(text) if text else empty
    except ValueError:
        return empty
    return value if isinstance(value, type(empty)) else empty


__all__ = [
    "AgeOptions",
    "AgeResult",
    "AgingRun",
    "FsageError",
    "WorkloadError",
    "age",
    "aging_runs",
    "open_target",
]
