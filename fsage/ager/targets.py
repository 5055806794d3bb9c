"""The targets ``fsage age`` runs ops on: an executor plus how to snapshot the target and where
its record lives (a directory: POSIX calls; an ext image: loop-mounted through the kernel, or
offline through libext2fs; an LFS image: fsage's LFS), and the options that choose them."""

from __future__ import annotations

import contextlib
import functools
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fsage.ager.images import (
    can_loop_mount,
    clear_stale_mounts,
    image_kind,
    mount,
    mount_dir,
    umount,
)
from fsage.ager.offline import OFFLINE_NOTICE, OfflineExtExecutor
from fsage.ager.posix import MARKER, PosixExecutor, check_target_dir, record_path_for
from fsage.ager.profile import Profile
from fsage.errors import UnsafeTargetError, UsageError
from fsage.layout import Layout
from fsage.workload import Executor


@dataclass
class AgeOptions:
    profile: Profile | None = None
    ops_file: Path | None = None
    #: None: 0 for a new run, the record's seed for --resume.
    seed: int | None = None
    mode: str = "auto"  # auto | mount | offline
    force: bool = False
    resume: bool = False
    #: None: off for a new run, the record's for --resume.
    fsync: bool | None = None
    #: "write" (real data) or "fallocate" (blocks allocated, not written; mounted and offline
    #: ext targets).
    #: None: "write" for a new run, the record's for --resume.
    data: str | None = None
    #: None: the record's for --resume (a new run: none).
    db: Path | None = None
    #: None: 0 (snapshots only at the start and end) for a new run, the record's for --resume.
    snapshot_every: int | None = None
    name: str | None = None
    progress: bool = False
    #: Cleaning policy of an LFS target (default: the one chosen at mkfs).
    policy: str | None = None
    #: A new generated run takes the files already on the target into its model, so that its
    #: churn deletes and rewrites them too (otherwise it ages only the files it makes).
    adopt: bool = False
    #: --fill, --churn or --ops-limit given with --resume but no profile (by Profile field):
    #: each must be what the interrupted run's profile had.
    shape: dict[str, float] = field(default_factory=dict)


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

    def set_reserve(self, clusters: int) -> str:
        """Give ext4's reserve the value an op stream was run with (``lift_ext4_reserve``);
        returns a notice where this target cannot."""
        return (
            f"the op stream ran with ext4's reserve set to {clusters} clusters on a mount of "
            "fsage's own; this target keeps its own, so near full the replay may differ"
        )

    def run_metrics(
        self, fill_mark: tuple[int, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """(metrics, utilization) recorded with the aging run; the executor is open.
        ``fill_mark``: (op index, ``counters_mark()``) taken when a generated workload's fill
        phase ended."""
        return {}, {"fullness": self.executor.fullness()}

    def carry_counters(self, earlier: dict[str, Any]) -> tuple[int, Any] | None:
        """Take in what the earlier part of a resumed run counted (the metrics recorded for
        it), so that ``run_metrics`` cover the whole run; returns that part's fill mark, when
        its fill ended there."""
        return None

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
        self.executor = PosixExecutor(
            self.source, fsync=bool(opts.fsync), data=opts.data or "write"
        )
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


#: The header parameter of an op stream that says what ext4's reserve was while it ran.
RESERVE_PARAM = "ext4_reserved_clusters"


def lift_ext4_reserve(root: Path, clusters: int = 0) -> int | None:
    """Set ext4's reserve of the file system mounted at ``root`` to ``clusters``; returns it,
    or None where there is no such knob (not ext4, no sysfs, not root).

    ext4 keeps 2% of the blocks (at most 4,096) from every writer, root included, so that
    delayed allocation never finds a full disk at writeback. A match fills to the target's
    fullness with the target's free space held in spacers at once: with that 2% held back it
    runs out of space 2% short. The knob belongs to the mount (nothing of it is written to the
    image), so only a mount of fsage's own has it changed, and the journal records it: a
    replay on another mount of fsage's sets it the same, or near full it would differ."""
    st = os.stat(root)
    dev = os.path.realpath(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}")
    knob = Path("/sys/fs/ext4") / os.path.basename(dev) / "reserved_clusters"
    try:
        knob.write_text(str(clusters))
    except OSError:
        return None
    return clusters


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
        #: ext4's reserve set on each mount (``set_reserve``); None: the kernel's own.
        self.reserve: int | None = None
        try:
            mount(image, self.mnt)
            self._mounted = True
            check_target_dir(self.mnt, force=opts.force, record=self.record_path)
            self.executor = PosixExecutor(
                self.mnt, fsync=bool(opts.fsync), data=opts.data or "write"
            )
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
            if self.reserve is not None:
                lift_ext4_reserve(self.mnt, self.reserve)
            self.executor = PosixExecutor(
                self.mnt, fsync=bool(self.opts.fsync), data=self.opts.data or "write"
            )

    def walk(self) -> list[tuple[str, bool, int]]:
        return _walk_dir(self.mnt)

    def set_reserve(self, clusters: int) -> str:
        if image_kind(self.source) != "ext":
            return ""
        self.reserve = clusters
        if lift_ext4_reserve(self.mnt, clusters) is None:
            return super().set_reserve(clusters)
        return ""

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

    def set_reserve(self, clusters: int) -> str:
        return ""  # a library's allocator keeps no reserve of the kernel's

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

    def carry_counters(self, earlier: dict[str, Any]) -> tuple[int, Any] | None:
        from fsage.lfs.cleaner import Counters

        def counters(data: Any) -> Counters | None:
            if not isinstance(data, dict):
                return None
            known = Counters.__dataclass_fields__
            return Counters(**{k: int(v) for k, v in data.items() if k in known})

        before = counters(earlier.get("counters"))
        if before is None:  # a part killed before it was recorded counted nothing here
            return None
        self.carried.add(before)
        after_fill = earlier.get("after_fill") or {}
        since = counters(after_fill.get("counters"))
        if since is None or "from_op" not in after_fill:
            return None
        before.subtract(since)  # the counters when the fill ended
        return int(after_fill["from_op"]), before

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
