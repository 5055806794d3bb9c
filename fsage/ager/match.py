"""Age a mounted file system until its layout matches a target (``fsage age T --match``).

The target is a layout: files and layout score per size bucket (seed 000 buckets of blocks),
the free-space histogram (free blocks per log2 extent length, e2freefrag's buckets) and the
fullness — taken from a stored snapshot or a JSON file. The matcher

1. fills the target with files drawn from the target's size buckets (file counts scaled to
   the capacity) up to the target's fullness, each written whole;
2. then, in rounds, reads the mounted tree with fsage's live reader and steers:
   - a size bucket whose score is above the target's gets files rewritten as interleaved,
     fsync'ed appends of several files at once (their blocks alternate on disk);
   - a bucket below the target gets its most fragmented files rewritten whole;
   - free-extent sizes the target has more of get holes of those sizes: punched into the
     middle of large contiguous files (exact free extents; not on btrfs, which frees a
     punched range only with its whole extent), else contiguous files of that size that
     touch no free extent deleted; as many blocks are then allocated from the largest free
     extent when the target has less free space in extents of its size (the fill already
     leaves holes shaped like the target's free extents: it writes spacer files of those
     sizes, the large ones first, and deletes them once the rest is written);
   - where the live reader cannot see free space (btrfs: no GETFSMAP), free space is not
     judged, the run stops once the size buckets match, and it is never called matched.
3. It stops when every size bucket holding at least ``MIN_FILES`` files in the target is
   within ``SCORE_TOL`` of the target's score and the free-space histograms are within total
   variation ``FREE_TV``; or at the time limit, or when rounds stop making progress, and then
   reports the closest state reached (the size buckets first, then the distance) per bucket
   and why it could not get closer.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fsage.ager.offline import OFFLINE_NOTICE
from fsage.ager.posix import punch_hole
from fsage.analyzer.analysis import bucket_range, size_bucket
from fsage.analyzer.freespace import MAX_BUCKET, merge_runs
from fsage.analyzer.scores import file_scores
from fsage.errors import UsageError, WorkloadError
from fsage.layout import Layout
from fsage.text import size_range
from fsage.workload import Op, OpFailedError

SCORE_TOL = 0.02
FREE_TV = 0.1
MIN_FILES = 50
AREA = "fsage-match"  # the matcher's files live under this directory of the target
PER_DIR = 256
STALL_ROUNDS = 6
#: Fills tried in all: a fill whose rounds stall is cleared and drawn again.
FILLS = 3


@dataclass
class LayoutTarget:
    """What a layout is matched on (see the module doc)."""

    block_size: int
    blocks_total: int
    fullness: float
    #: size bucket k -> (files, layout score or None); k = 0: one-block files.
    buckets: dict[int, tuple[int, float | None]]
    #: log2 free-extent bucket -> free blocks.
    free: dict[int, int]
    source: str = ""

    def free_fractions(self) -> dict[int, float]:
        total = sum(self.free.values())
        return {k: v / total for k, v in self.free.items()} if total else {}

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "block_size": self.block_size,
            "blocks_total": self.blocks_total,
            "fullness": self.fullness,
            "size_buckets": [
                {
                    "min_blocks": bucket_range(k)[0],
                    "max_blocks": bucket_range(k)[1],
                    "files": n,
                    "layout_score": s,
                }
                for k, (n, s) in sorted(self.buckets.items())
            ],
            "free_extents": [
                {"min_blocks": 1 << k, "blocks": b} for k, b in sorted(self.free.items())
            ],
        }

    @classmethod
    def from_json(cls, data: Any, source: str = "JSON target") -> LayoutTarget:
        """The form ``to_json`` writes; ``fsage analyze --format json`` output also works
        (its ``by_size`` and ``free`` parts)."""
        try:
            rows = data.get("size_buckets", data.get("by_size"))
            free = data.get("free_extents")
            if free is None and isinstance(data.get("free"), dict):
                free = data["free"].get("free_extents")
            summary = data.get("summary", {})
            bs = int(data.get("block_size", summary.get("block_size", 4096)))
            total = int(data.get("blocks_total", summary.get("blocks_total", 0)))
            fullness = float(data.get("fullness", summary.get("fullness", 0.0)))
            buckets: dict[int, tuple[int, float | None]] = {}
            for r in rows or []:
                k = int(size_bucket(np.array([int(r["max_blocks"])]))[0])
                score = r.get("layout_score")
                buckets[k] = (int(r["files"]), None if score is None else float(score))
            free_h: dict[int, int] = {}
            for r in free or []:
                k = min(int(r["min_blocks"]).bit_length() - 1, MAX_BUCKET)
                free_h[k] = free_h.get(k, 0) + int(r["blocks"])
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise UsageError(f"{source}: not a layout target ({exc})") from None
        if not buckets or not 0.0 < fullness < 1.0:
            raise UsageError(
                f"{source}: a layout target needs size_buckets and a fullness in (0, 1)"
            )
        return cls(bs, total, fullness, buckets, free_h, source)


@dataclass
class _State:
    """A measured layout, with per-file arrays for choosing what to rewrite."""

    target: LayoutTarget  # the measured layout in target form
    ino: np.ndarray
    blocks: np.ndarray
    cont: np.ndarray
    den: np.ndarray
    frags: np.ndarray
    first: np.ndarray
    bucket: np.ndarray
    free_start: np.ndarray
    free_len: np.ndarray
    cont_k: dict[int, int] = field(default_factory=dict)
    den_k: dict[int, int] = field(default_factory=dict)
    #: False where the reader cannot see free space (btrfs has no GETFSMAP).
    free_known: bool = True


def measure(layout: Layout, source: str = "") -> _State:
    files = layout.files
    reg = files.is_regular()
    sc = file_scores(files)
    blocks = sc.blocks[reg]
    cont = sc.contiguous[reg]
    den = sc.denominator[reg]
    k = size_bucket(blocks)
    buckets: dict[int, tuple[int, float | None]] = {}
    cont_k: dict[int, int] = {}
    den_k: dict[int, int] = {}
    for b in np.unique(k[k >= 0]).tolist():
        sel = k == b
        c, d = int(cont[sel].sum()), int(den[sel].sum())
        buckets[int(b)] = (int(sel.sum()), c / d if d else None)
        cont_k[int(b)], den_k[int(b)] = c, d
    fs, fl = merge_runs(layout.free)
    fk = np.minimum(np.frexp(fl.astype(np.float64))[1] - 1, MAX_BUCKET) if fl.size else fl
    free = {int(b): int(fl[fk == b].sum()) for b in np.unique(fk).tolist()}
    f = layout.facts
    # The free count the file system reports, as the fill's fullness reads it (statvfs on a
    # mount: ext4's reservations for open files count as free, as they are once it is
    # unmounted and read offline; xfs's reserve pool, free in its map, does not).
    used = f.blocks_total - f.blocks_free
    tgt = LayoutTarget(
        f.block_size, f.blocks_total, used / f.blocks_total if f.blocks_total else 0.0,
        buckets, free, source,
    )  # fmt: skip
    return _State(
        tgt, files.ino[reg].astype(np.int64), blocks, cont, den, sc.fragments[reg],
        sc.first_block[reg], k, fs, fl, cont_k, den_k, bool(f.free_space_known),
    )  # fmt: skip


def target_from_layout(layout: Layout, source: str) -> LayoutTarget:
    return measure(layout, source).target


def load_target(spec: str, db: Path | None) -> LayoutTarget:
    """A snapshot id (with ``db``) or a JSON target file."""
    if spec.isdigit():
        if db is None:
            raise UsageError("--match SNAPSHOT_ID needs --db")
        from fsage.db.store import Store

        with Store.open(db) as store:
            layout = store.load_layout(int(spec))
        return target_from_layout(layout, f"snapshot {spec} of {db}")
    path = Path(spec)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"{spec}: neither a snapshot id nor a JSON target file") from None
    except RecursionError:
        raise UsageError(f"{spec}: cannot read the JSON target (nested too deeply)") from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"{spec}: cannot read the JSON target ({exc})") from None
    return LayoutTarget.from_json(data, str(path))


# ---------------------------------------------------------------------------- comparing


def free_tv(a: dict[int, float], b: dict[int, float]) -> float:
    """Total-variation distance between two free-space histograms (fractions of blocks)."""
    keys = set(a) | set(b)
    return 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in keys)


def compare(target: LayoutTarget, now: LayoutTarget, free_known: bool = True) -> dict[str, Any]:
    """``now`` against ``target``; ``free_known`` False: the free space of ``now`` could
    not be read, so it is not judged and the state is never called matched."""
    rows = []
    for k, (n, s) in sorted(target.buckets.items()):
        if k == 0 or s is None:
            continue
        cn, cs = now.buckets.get(k, (0, None))
        judged = n >= MIN_FILES
        ok = cs is not None and abs(cs - s) <= SCORE_TOL
        rows.append(
            {
                "bucket": k,
                "min_blocks": bucket_range(k)[0],
                "max_blocks": bucket_range(k)[1],
                "label": size_range(*bucket_range(k), target.block_size),
                "target_files": n,
                "target_score": s,
                "files": cn,
                "score": cs,
                "judged": judged,
                "ok": ok or not judged,
            }
        )
    tv = free_tv(target.free_fractions(), now.free_fractions()) if free_known else None
    free_ok = tv is not None and tv <= FREE_TV
    return {
        "buckets": rows,
        "free_tv": tv,
        "free_ok": free_ok,
        "free_known": free_known,
        "buckets_ok": all(r["ok"] for r in rows),
        "fullness": now.fullness,
        "target_fullness": target.fullness,
        "matched": all(r["ok"] for r in rows) and free_ok,
    }


# ---------------------------------------------------------------------------- matching


@dataclass
class MatchResult:
    target: str
    source: str
    matched: bool = False
    elapsed: float = 0.0
    rounds: int = 0
    files_written: int = 0
    bytes_written: int = 0
    stop: str = ""
    report: dict[str, Any] = field(default_factory=dict)
    closest: dict[str, Any] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    #: Aged through the offline writer (libext2fs's allocator, not the kernel's).
    offline: bool = False

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _bucket_excess(rep: dict[str, Any]) -> float:
    """The worst judged size bucket's distance beyond its tolerance (0: all within)."""
    worst = 0.0
    for r in rep["buckets"]:
        if r["judged"]:
            d = 1.0 if r["score"] is None else abs(r["score"] - r["target_score"])
            worst = max(worst, d - SCORE_TOL)
    return worst


def _distance(rep: dict[str, Any]) -> float:
    """How far a state is from the target: the larger of the worst judged bucket's excess
    over its tolerance and the free-space histogram's excess over its own."""
    worst = _bucket_excess(rep)
    free = 0.0 if rep["free_tv"] is None else rep["free_tv"] - FREE_TV
    return float(max(worst, free, 0.0))


class Disk:
    """Where the matcher's files live: the ops it needs, on paths relative to its area
    (``AREA`` at the top of the target). ``MountedDisk`` runs them through the kernel,
    ``OfflineDisk`` through libext2fs on an unmounted ext image."""

    bs: int
    #: Blocks of the file system, counted as ``measure`` counts them (fullness, scaling).
    total: int
    #: False where punching a hole does not free a free extent of its size.
    can_punch: bool = True
    can_fallocate: bool = True
    #: True where ``allocate`` places blocks where it is told (the kernel takes no hint).
    can_place: bool = False
    #: Blocks of each region no free extent crosses (xfs allocation groups); 0: none.
    group_blocks: int = 0
    groups: int = 0

    #: The region kept free of new files (``keep_group_empty``), if any.
    kept_empty: int | None = None

    def keep_group_empty(self, group: int) -> None:
        """Put no new directory (so, on xfs, no new file's data) in region ``group``."""

    def mkdir(self, rel: str) -> None:
        raise NotImplementedError

    def create(self, rel: str, size: int, at_once: bool = False) -> int:
        """A new file of ``size`` bytes written whole; returns its inode. ``at_once``: its
        blocks allocated in one piece, after those of every file written before it."""
        raise NotImplementedError

    def interleave(self, items: list[tuple[str, int]], chunk: int) -> list[int]:
        """New files whose blocks are allocated ``chunk`` blocks at a time in turn (pieces of
        the files alternate on disk); returns their inodes."""
        raise NotImplementedError

    def unlink(self, rel: str) -> None:
        raise NotImplementedError

    def punch(self, rel: str, offset: int, length: int) -> bool:
        """Free the blocks of ``[offset, offset + length)``; False (and ``can_punch`` off)
        where punching is not supported."""
        raise NotImplementedError

    def allocate(self, rel: str, size: int, near: int | None = None) -> int | None:
        """A new file with ``size`` bytes allocated, not written (fallocate), from block
        ``near`` on where the allocator takes a hint; None (and ``can_fallocate`` off) where
        not supported."""
        raise NotImplementedError

    def fullness(self) -> float:
        raise NotImplementedError

    def commit(self) -> None:
        """Make what was done visible to the allocator and the reader (freed blocks reused
        only once their deletes are committed)."""

    def layout(self) -> Layout:
        raise NotImplementedError

    def close(self) -> None:
        pass


class MountedDisk(Disk):
    """A mounted directory: POSIX calls, snapshots by fsage's live reader."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.area = root / AREA
        vfs = os.statvfs(root)
        self.bs = vfs.f_frsize
        # Fullness as the snapshots measure it (the live reader's and the offline reader's
        # alike): used blocks, metadata included, of the device's blocks where GETFSMAP
        # gives them. statvfs leaves ext4's metadata out of both: a target read offline
        # would be matched on a different scale.
        self.total = _device_blocks(root, self.bs) or vfs.f_blocks
        self._buf = b"\xa5" * (1 << 20)
        # btrfs frees a punched range only when no part of its extent is still referenced:
        # holes there are made by deleting whole files.
        self.can_punch = _fs_type(root) != "btrfs"
        self.area.mkdir(exist_ok=True)
        self._avoid: int | None = None
        self._ino_shift = 0
        self._group_dirs: dict[int, str] = {}
        self._tries = 0
        # While a group is kept empty: blocks the matcher's files hold per group (by their
        # directory's group) against what each group can hold, to fill them evenly.
        self._room: list[int] = []
        self._placed: list[int] = []
        self._dir_group: dict[str, int] = {}
        self._file_blocks: dict[str, tuple[int, int]] = {}
        if _fs_type(root) == "xfs":
            geom = _xfs_geometry(root)
            if geom is not None:
                self.group_blocks, self.groups, self._ino_shift, log_group, log_blocks = geom
                self._room = [self.group_blocks] * self.groups
                if 0 <= log_group < self.groups:
                    self._room[log_group] -= log_blocks
                self._placed = [0] * self.groups

    def keep_group_empty(self, group: int) -> None:
        self._avoid = self.kept_empty = group

    def _group_dir(self, group: int) -> str | None:
        """A directory (relative to the area) whose inode is in allocation group ``group``:
        new directories go to the groups in turn."""
        if group in self._group_dirs:
            return self._group_dirs[group]
        for _ in range(4 * self.groups):
            rel = f".g{len(self._group_dirs)}-{self._tries}"
            self._tries += 1
            (self.area / rel).mkdir()
            g = os.stat(self.area / rel).st_ino >> self._ino_shift
            self._group_dirs.setdefault(int(g), rel)
            if g == group:
                return rel
        return None

    def mkdir(self, rel: str) -> None:
        """On xfs a new directory goes to the next allocation group in turn, and the files
        made in it to the same group (until it is full: then to the next group). While one
        is kept empty, new directories go to the least filled of the others (the group
        after a full one would take its overflow): one landing elsewhere is left aside
        (empty, under another name) and another one made."""
        path = self.area / rel
        if self._avoid is None:
            path.mkdir(exist_ok=True)
            return
        others = [g for g in range(self.groups) if g != self._avoid]
        best = min(others, key=lambda g: self._placed[g] / max(self._room[g], 1))
        fallback = None
        for attempt in range(4 * self.groups + 1):
            tmp = self.area / f".{rel}.{attempt}"
            tmp.mkdir()
            g = os.stat(tmp).st_ino >> self._ino_shift
            if g == best:
                tmp.rename(path)
                self._dir_group[rel] = g
                return
            if g != self._avoid and fallback is None:
                fallback = (tmp, g)
        if fallback is not None:
            fallback[0].rename(path)
            self._dir_group[rel] = fallback[1]
            return
        path.mkdir(exist_ok=True)  # the allocator does not rotate: take what it gives

    def _place(self, rel: str, size: int) -> None:
        g = self._dir_group.get(rel.partition("/")[0])
        if g is not None:
            blocks = -(-size // self.bs)
            self._placed[g] += blocks
            self._file_blocks[rel] = (g, blocks)

    def _open(self, rel: str) -> tuple[int, int]:
        fd = os.open(self.area / rel, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        return fd, os.fstat(fd).st_ino

    def _write(self, fd: int, n: int) -> None:
        while n > 0:
            n -= os.write(fd, self._buf[: min(n, len(self._buf))])

    def create(self, rel: str, size: int, at_once: bool = False) -> int:
        """``at_once``: the kernel writes a large file back a few MiB at a time, interleaved
        with the other files written, so it is split: the writes before it are synced
        first and it is fsync'ed whole."""
        if at_once:
            os.sync()
        fd, ino = self._open(rel)
        try:
            self._write(fd, size)
            if at_once:
                os.fsync(fd)
        finally:
            os.close(fd)
        self._place(rel, size)
        return ino

    def interleave(self, items: list[tuple[str, int]], chunk: int) -> list[int]:
        """fallocate each piece in turn, so it is placed at once next to the other files'
        pieces, then write the data; where fallocate is not supported, write each piece and
        fsync it."""
        opened = [self._open(rel) for rel, _ in items]
        fds = [fd for fd, _ in opened]
        sizes = [size for _, size in items]
        step = chunk * self.bs
        try:
            for off in range(0, max(sizes), step):
                for fd, size in zip(fds, sizes, strict=True):
                    if off < size:
                        n = min(step, size - off)
                        if self.can_fallocate:
                            try:
                                os.posix_fallocate(fd, off, n)
                                continue
                            except OSError:
                                self.can_fallocate = False
                        os.lseek(fd, off, os.SEEK_SET)
                        self._write(fd, n)
                        os.fsync(fd)
            for fd, size in zip(fds, sizes, strict=True):
                os.lseek(fd, 0, os.SEEK_SET)
                self._write(fd, size)
        finally:
            for fd in fds:
                os.close(fd)
        for rel, size in items:
            self._place(rel, size)
        return [ino for _, ino in opened]

    def unlink(self, rel: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.area / rel)
        g, blocks = self._file_blocks.pop(rel, (-1, 0))
        if g >= 0:
            self._placed[g] -= blocks

    def punch(self, rel: str, offset: int, length: int) -> bool:
        try:
            fd = os.open(self.area / rel, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            punch_hole(fd, offset, length)
        except OSError:
            self.can_punch = False  # not supported here: holes by deleting files
            return False
        finally:
            os.close(fd)
        return True

    def allocate(self, rel: str, size: int, near: int | None = None) -> int | None:
        """On xfs, ``near`` chooses the allocation group: the file is made in a directory of
        the group holding block ``near`` (xfs allocates a new file's data in its inode's
        group, its inode in its directory's), then moved to ``rel``."""
        if near is not None and self.groups and self.group_blocks:
            holder = self._group_dir(near // self.group_blocks)
            if holder is not None:
                tmp = f"{holder}/{rel.replace('/', '_')}"
                ino = self.allocate(tmp, size)
                if ino is not None:
                    os.rename(self.area / tmp, self.area / rel)
                return ino
        fd, ino = self._open(rel)
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError:
            self.can_fallocate = False
            return None
        finally:
            os.close(fd)
        self._place(rel, size)
        return ino

    def fullness(self) -> float:
        v = os.statvfs(self.root)
        return (self.total - v.f_bfree) / self.total

    def commit(self) -> None:
        os.sync()

    def layout(self) -> Layout:
        from fsage.snapshotter.live import read_live_layout

        os.sync()
        return read_live_layout(self.root)


class OfflineDisk(Disk):
    """An unmounted ext image: ops through the offline writer (libext2fs, whose allocator
    places each block near the file's previous one, at once: no delayed allocation), and
    snapshots by the offline reader after a flush. Interleaved files are written a piece at
    a time in turn, which alternates their blocks."""

    can_place = True

    def __init__(self, image: Path) -> None:
        from fsage.ager.offline import OfflineExtExecutor
        from fsage.snapshotter.ext import read_ext_layout

        self.image = image
        self._read = read_ext_layout
        # Fullness as ``measure`` sees it: all blocks of the image, metadata counted as used
        # (the writer's statfs-like figures leave the metadata out of both counts, so only
        # their difference, the free blocks, is taken from them).
        self.total = read_ext_layout(image).facts.blocks_total
        self.x = OfflineExtExecutor(image)
        self.bs = self.x.capacity_blocks()[0]
        try:
            self.x.apply(Op("mkdir", AREA))
        except OpFailedError:
            self.x.close()
            raise

    def _path(self, rel: str) -> str:
        return f"{AREA}/{rel}"

    def mkdir(self, rel: str) -> None:
        with contextlib.suppress(OpFailedError):  # exists already
            self.x.apply(Op("mkdir", self._path(rel)))

    def create(self, rel: str, size: int, at_once: bool = False) -> int:
        path = self._path(rel)
        self.x.apply(Op("create", path, size))
        return self.x.stat(path)[0]

    def interleave(self, items: list[tuple[str, int]], chunk: int) -> list[int]:
        paths = [self._path(rel) for rel, _ in items]
        inos = []
        for path in paths:
            self.x.apply(Op("create", path, 0))
            inos.append(self.x.stat(path)[0])
        step = chunk * self.bs
        for off in range(0, max(size for _, size in items), step):
            for path, (_, size) in zip(paths, items, strict=True):
                if off < size:
                    self.x.apply(Op("append", path, min(step, size - off)))
        return inos

    def unlink(self, rel: str) -> None:
        with contextlib.suppress(OpFailedError):  # gone already
            self.x.apply(Op("delete", self._path(rel)))

    def punch(self, rel: str, offset: int, length: int) -> bool:
        self.x.apply(Op("punch", self._path(rel), length, offset))
        return True

    def allocate(self, rel: str, size: int, near: int | None = None) -> int | None:
        path = self._path(rel)
        self.x.apply(Op("create", path, 0))
        if near is None:
            self.x.apply(Op("fallocate", path, size, 0))
        else:
            self.x.fallocate_from(path, 0, size, near)
        return self.x.stat(path)[0]

    def fullness(self) -> float:
        _, cap_total, cap_used = self.x.capacity_blocks()
        free = cap_total - cap_used
        return (self.total - free) / self.total if self.total else 0.0

    def commit(self) -> None:
        self.x.flush()

    def layout(self) -> Layout:
        self.x.flush()
        return self._read(self.image)

    def close(self) -> None:
        self.x.close()


class Matcher:
    def __init__(
        self,
        disk: Disk,
        target: LayoutTarget,
        *,
        seed: int = 0,
        time_limit: float = 600.0,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.disk = disk
        self.target = target
        self.rng = random.Random(seed)
        self.time_limit = time_limit
        self.say = say or (lambda s: None)
        self.bs = disk.bs
        self.total = disk.total
        self.paths: dict[int, str] = {}  # inode -> path (relative to the area)
        self.sizes: dict[str, int] = {}
        self.serial = 0
        self.files_written = 0
        self.bytes_written = 0

    # -- primitives

    def _new_path(self) -> str:
        i = self.serial
        self.serial += 1
        d = f"d{i // PER_DIR:05d}"
        if i % PER_DIR == 0:
            self.disk.mkdir(d)
        return f"{d}/f{i:08d}"

    def _written(self, rel: str, ino: int, size: int) -> None:
        self.paths[ino] = rel
        self.sizes[rel] = size
        self.files_written += 1
        self.bytes_written += size

    def write_whole(self, rel: str, size: int, at_once: bool = False) -> None:
        self._written(rel, self.disk.create(rel, size, at_once), size)

    def write_interleaved(self, items: list[tuple[str, int]], chunk: int) -> None:
        for (rel, size), ino in zip(items, self.disk.interleave(items, chunk), strict=True):
            self._written(rel, ino, size)

    def delete(self, ino: int) -> str | None:
        rel = self.paths.pop(ino, None)
        if rel is None:
            return None
        self.disk.unlink(rel)
        self.sizes.pop(rel, None)
        return rel

    def fullness(self) -> float:
        return self.disk.fullness()

    def snapshot(self) -> _State:
        return measure(self.disk.layout())

    # -- fill

    def _draw_blocks(self, k: int) -> int:
        lo, hi = bucket_range(k)
        return self.rng.randint(lo, hi)

    def _size_of(self, blocks: int) -> int:
        return (blocks - 1) * self.bs + self.rng.randint(1, self.bs)

    def _keep_a_group_empty(self) -> None:
        """Where free extents are bounded by regions (xfs allocation groups) and files are
        spread over all of them, each region keeps a share of the free space: a target whose
        largest free extents are larger than that share is reached only by keeping one region
        free of new files (the last: the first holds the log)."""
        d = self.disk
        want = self.target.free_fractions()
        if not d.groups or d.groups < 2 or not want:
            return
        free_after = (1.0 - self.target.fullness) * self.total
        top = max(want)
        if not (
            want[top] * free_after >= 1 << top > free_after / d.groups
            and 1 << top <= d.group_blocks
        ):
            return
        d.keep_group_empty(d.groups - 1)

    def fill(self) -> None:
        """Write the target's files, a share ``1 - score`` of each bucket's files with their
        blocks interleaved (score about 0) and the rest whole (about 1), mixed with spacer
        files sized like the target's free extents (all but the largest bucket, which the
        unwritten rest of the disk gives); top up to the target's fullness (with the spacers
        still there), then delete the spacers."""
        t = self.target
        self._keep_a_group_empty()
        scale = self.total / t.blocks_total if t.blocks_total else 1.0
        plan: list[tuple[str, int]] = []
        for k, (n, score) in t.buckets.items():
            count = max(0, round(n * scale))
            frag = round(count * (1.0 - score)) if score is not None and k >= 1 else 0
            plan += [("frag", k)] * frag + [("whole", k)] * (count - frag)
        free_after = (1.0 - t.fullness) * self.total
        want = t.free_fractions()
        if want:
            top = max(want, key=lambda k: want[k])
            for k, f in want.items():
                if k == top:
                    continue
                left = round(f * free_after)  # a hole of exactly 1 << k blocks is kept
                while left >= 1 << k:
                    b = min(self.rng.randint(1 << k, (1 << (k + 1)) - 1), int(left))
                    plan.append(("spacer", b))
                    left -= b
        self.rng.shuffle(plan)
        # Large spacers go first, while the disk is empty: written among the other files, the
        # allocator finds no free extent of their size in their group and splits them (an
        # 8,200-block spacer as 6,144 + 2,070 blocks), leaving two smaller holes. Each is
        # followed by a whole file, so that two of them never make one hole.
        big = [i for i, (kind, v) in enumerate(plan) if kind == "spacer" and v * self.bs >= 1 << 20]
        walls = iter([i for i, (kind, _) in enumerate(plan) if kind == "whole"])
        first: list[int] = []
        for i in big:
            first += [i] + [w for w in [next(walls, None)] if w is not None]
        taken = set(first)
        plan = [plan[i] for i in first] + [item for i, item in enumerate(plan) if i not in taken]
        pending: dict[int, list[tuple[str, int]]] = {}
        spacers: list[str] = []
        for i, (kind, v) in enumerate(plan):
            if kind == "spacer":
                rel = self._new_path()
                # A large spacer split by writeback would leave smaller holes than asked.
                self.write_whole(rel, v * self.bs, at_once=v * self.bs >= 1 << 20)
                spacers.append(rel)
            elif kind == "whole":
                self.write_whole(self._new_path(), self._size_of(self._draw_blocks(v)))
            else:
                group = pending.setdefault(v, [])
                group.append((self._new_path(), self._draw_blocks(v) * self.bs))
                if len(group) == 4:
                    self.write_interleaved(group, 1)
                    group.clear()
            if i % 2048 == 2047 and self.fullness() >= 0.97:
                break  # the target is smaller than this file system expected
        for group in pending.values():
            if group:
                self.write_interleaved(group, 1)
        self.disk.commit()
        # Top up with whole files of the buckets whose files are contiguous in the target
        # (whole files would raise the others' scores), before the spacers go: the allocator
        # would put the top-up files into the spacers' holes first.
        spacer_share = sum(self.sizes[rel] for rel in spacers) / self.bs / max(self.total, 1)
        keys = [k for k in t.buckets if k >= 1 and (t.buckets[k][1] or 1.0) >= 0.95]
        keys = keys or [k for k in t.buckets if k >= 1]
        weights = [t.buckets[k][0] for k in keys]
        goal = min(t.fullness + spacer_share, 0.97)
        n = 0
        while keys and self.fullness() < goal - 0.002:
            k = self.rng.choices(keys, weights)[0]
            room = int((goal - self.fullness()) * self.total) + 1
            self.write_whole(self._new_path(), self._size_of(min(self._draw_blocks(k), room)))
            n += 1
            if n % 256 == 0:
                self.disk.commit()
        self.disk.commit()
        for rel in spacers:
            self.disk.unlink(rel)
            self.sizes.pop(rel, None)
        self.paths = {ino: rel for ino, rel in self.paths.items() if rel in self.sizes}
        self.disk.commit()

    def clear(self) -> None:
        """Delete every file of the matcher's (its directories stay, emptied)."""
        for rel in list(self.sizes):
            self.disk.unlink(rel)
        self.paths.clear()
        self.sizes.clear()
        self.disk.commit()

    # -- steering

    def steer_scores(self, st: _State) -> dict[str, str]:
        actions: dict[str, str] = {}
        by_bucket = st.bucket
        for k, (n, s) in self.target.buckets.items():
            if k == 0 or s is None or n < MIN_FILES:
                continue
            cs = st.target.buckets.get(k, (0, None))[1]
            if cs is None or abs(cs - s) <= SCORE_TOL * 0.5:
                continue
            den = st.den_k.get(k, 0)
            idx = np.flatnonzero(by_bucket == k)
            idx = np.array([i for i in idx.tolist() if int(st.ino[i]) in self.paths], np.int64)
            if idx.size == 0:
                actions[f"bucket {k}"] = "no files of fsage's in this bucket to rewrite"
                continue
            if cs > s:
                need = (cs - s) * den
                order_list = idx[st.cont[idx] > 0].tolist()
                self.rng.shuffle(order_list)
                chunk = 1
                victims: list[tuple[str, int]] = []
                done = 0.0
                for i in order_list:
                    if done >= 0.8 * need:
                        break
                    rel = self.delete(int(st.ino[i]))
                    if rel is None:
                        continue
                    b = int(st.blocks[i])
                    victims.append((rel, b * self.bs))
                    done += max(0.0, float(st.cont[i]) - (b - math.ceil(b / chunk)))
                # Freed blocks are reused only once the deletes are committed: commit them so
                # that the rewritten files take the holes the old ones leave.
                self.disk.commit()
                for g in range(0, len(victims), 4):
                    self.write_interleaved(victims[g : g + 4], chunk)
                actions[f"bucket {k}"] = f"fragmented by interleaving ({done:.0f} of {need:.0f})"
            else:
                need = (s - cs) * den
                gap = st.den[idx] - st.cont[idx]
                order = idx[np.argsort(-gap, kind="stable")]
                done = 0.0
                redo: list[tuple[str, int]] = []
                for i in order.tolist():
                    if done >= 0.8 * need or st.den[i] == st.cont[i]:
                        break
                    rel = self.delete(int(st.ino[i]))
                    if rel is None:
                        continue
                    redo.append((rel, int(st.blocks[i]) * self.bs))
                    done += float(st.den[i] - st.cont[i])
                self.disk.commit()
                for rel, size in redo:
                    self.write_whole(rel, size)
                actions[f"bucket {k}"] = (
                    f"rewrote fragmented files whole ({done:.0f} of {need:.0f})"
                )
        return actions

    def steer_free(self, st: _State) -> str:
        """Shape the free space toward the target's histogram. For each extent-size bucket
        short of free blocks, holes of that size: punched into the middle of contiguous
        files of the matcher's (a hole inside one extent is a free extent of exactly its
        length; a big file takes a few), else whole contiguous files of that size that touch
        no free extent deleted. As many blocks as the holes freed are then allocated
        (fallocate) as filler files, which take them from the large free extents the target
        has too much of, so the fullness stays where the fill put it."""
        want = self.target.free_fractions()
        have = st.target.free_fractions()
        tv = free_tv(want, have)
        if tv <= FREE_TV * 0.6:
            return ""
        free_total = int(st.free_len.sum())
        ends = set((st.free_start + st.free_len).tolist())
        starts = set(st.free_start.tolist())
        short = sorted(k for k in want if want[k] > have.get(k, 0.0))
        ours = np.array([int(i) in self.paths for i in st.ino.tolist()], bool)
        solo = (st.frags == 1) & ours
        used = np.zeros(st.ino.size, bool)  # files punched or deleted this round
        punched = deleted = 0
        missed: list[str] = []  # hole sizes short that no file of the matcher's could give
        for k in short:
            need = (want[k] - have.get(k, 0.0)) * free_total
            lo, hi = 1 << k, (1 << (k + 1)) - 1
            got = 0
            if self.disk.can_punch:
                # The largest contiguous files first: a hole costs a file one break in its
                # layout, which a file of many blocks hardly notices (one hole per 100 blocks
                # at most).
                idx = np.flatnonzero(solo & ~used & (st.blocks >= lo + 2))
                idx = idx[np.argsort(-st.blocks[idx], kind="stable")]
                for i in idx.tolist():
                    if got >= 0.9 * need or not self.disk.can_punch:
                        break
                    got += self._punch_holes(st, i, lo, hi, need - got)
                    used[i] = True
            if got < 0.9 * need:
                idx = np.flatnonzero(solo & ~used & (st.blocks >= lo) & (st.blocks <= hi))
                idx = idx[self.rng.sample(range(idx.size), idx.size)] if idx.size else idx
                for i in idx.tolist():
                    if got >= 0.9 * need:
                        break
                    a, b = int(st.first[i]), int(st.first[i] + st.blocks[i])
                    if a in ends or b in starts:
                        continue  # would join a free extent, not make a hole
                    if self.delete(int(st.ino[i])) is None:
                        continue
                    used[i] = True
                    got += int(st.blocks[i])
                    deleted += int(st.blocks[i])
                    ends.add(b)
                    starts.add(a)
            punched += got
            if got == 0:
                missed.append(f"{lo}-{hi}")
        punched -= deleted
        self.disk.commit()
        # Give back as many blocks from the largest free extent (and those still short of the
        # target's fullness) when the target has too much free space in extents of its size,
        # never so many that what is left of it drops below its bucket, or below the target's
        # largest bucket when the target has none as large.
        filled = 0
        cut = ""
        if st.free_len.size:
            i = int(np.argmax(st.free_len))
            top = int(st.free_len[i])
            kt = min(top.bit_length() - 1, MAX_BUCKET)
            excess = (have.get(kt, 0.0) - want.get(kt, 0.0)) * free_total
            wanted = [k for k, f in want.items() if f > 0]
            floor = min(kt, max(wanted)) if wanted else kt
            room = top - (1 << floor) - 1
            lacking = int((self.target.fullness - st.target.fullness) * self.total)
            give = punched + deleted + max(lacking, 0)
            if kt > floor and self.disk.can_place and top > 2 << floor:
                # The target has no free extent this large: cut it in two with the filler
                # placed in its middle, both halves as large as the target's largest.
                n = max(1, min(give, top - (2 << floor)))
                filled = self._fill_large(n, int(st.free_start[i]) + (top - n) // 2)
                cut = f" (in its middle: cut in two, the target has no free extent of {top})"
            else:
                filled = self._fill_large(
                    max(min(give, int(excess), room), 0), int(st.free_start[i])
                )
            if self.disk.can_place or self.disk.groups:
                filled += self._shrink_extents(st, want, have, give - filled, free_total)
            if self.disk.kept_empty is not None and give > filled:
                # The largest free extent is the group kept empty, which the target wants as
                # large: the blocks punched go back where the allocator puts a new file (its
                # directory's group, never the one kept empty).
                filled += self._fill_large(give - filled, None)
        why = (
            f"; no contiguous file of the matcher's can give holes of {', '.join(missed)} blocks"
            if missed
            else ""
        )
        return (
            f"{punched} blocks punched and {deleted} deleted as holes of the sizes short, "
            f"{filled} blocks of the largest free extent filled{cut}{why}"
        )

    def _punch_holes(self, st: _State, i: int, lo: int, hi: int, need: float) -> int:
        """Punch holes of ``lo``-``hi`` blocks into file ``i`` (one extent), each bounded by
        the file's own blocks, at most one per 100 blocks; returns the blocks freed."""
        rel = self.paths.get(int(st.ino[i]))
        if rel is None:
            return 0
        n = int(st.blocks[i])
        holes = max(1, n // 100)
        got = 0
        # Holes at evenly spaced places, each at least one block from the next.
        span = n // holes
        for h in range(holes):
            if got >= need:
                break
            room = span - 2
            if room < lo:
                break
            length = self.rng.randint(lo, min(hi, room))
            off = h * span + 1 + self.rng.randint(0, room - length)
            if not self.disk.punch(rel, off * self.bs, length * self.bs):
                break
            got += length
        return got

    def _shrink_extents(
        self,
        st: _State,
        want: dict[int, float],
        have: dict[int, float],
        spare: int,
        free_total: int,
    ) -> int:
        """Where the filler can be placed (offline: at a block; xfs: in an allocation group),
        drop the next largest free extents of a size the target has too much of into the
        size below, which it has too little of, by filling their ends: as many as ``spare``
        blocks (and half a percent of fullness more) pay for. Returns the blocks allocated."""
        have = dict(have)
        spare += int(0.005 * self.total)
        done = 0
        for j in np.argsort(-st.free_len, kind="stable")[1:9].tolist():
            e = int(st.free_len[j])
            k = min(e.bit_length() - 1, MAX_BUCKET)
            if k == 0 or have.get(k, 0.0) - want.get(k, 0.0) <= 0.01:
                continue
            if want.get(k - 1, 0.0) <= have.get(k - 1, 0.0):
                continue
            need = e - ((1 << k) - 1)  # what is left falls in bucket k - 1
            if need > spare:
                continue
            got = self._fill_large(need, int(st.free_start[j]))
            spare -= got
            done += got
            have[k] = have.get(k, 0.0) - e / free_total
            have[k - 1] = have.get(k - 1, 0.0) + (e - got) / free_total
        return done

    def _fill_large(self, blocks: int, start: int | None) -> int:
        """Allocate ``blocks`` blocks as filler files of at most 64 MiB (fallocate: the
        kernel's allocator serves a large request from the large free extents; the offline
        one is told to start at ``start``, the largest free extent); returns the blocks
        allocated."""
        done = 0
        step = (64 << 20) // self.bs
        while done < blocks and self.disk.can_fallocate:
            n = min(step, blocks - done)
            rel = self._new_path()
            ino = self.disk.allocate(rel, n * self.bs, None if start is None else start + done)
            if ino is None:
                break
            self.paths[ino] = rel
            self.sizes[rel] = n * self.bs
            self.files_written += 1
            done += n
        self.disk.commit()
        return done

    # -- the loop

    def run(self) -> MatchResult:
        t0 = time.perf_counter()
        res = MatchResult(target="", source=self.target.source)
        self.say(f"fsage: filling to {self.target.fullness:.3f} with the target's file sizes")
        self.fill()
        best: tuple[float, dict[str, Any]] | None = None
        # The closest state reported: the size buckets first (a state with them matched beats
        # one nearer in free space only), then the distance.
        closest: tuple[tuple[float, float], dict[str, Any]] | None = None
        stalled = 0
        fills = 1
        last_actions: dict[str, str] = {}
        while True:
            st = self.snapshot()
            rep = compare(self.target, st.target, st.free_known)
            res.rounds += 1
            dist = _distance(rep)
            tv = "unknown" if rep["free_tv"] is None else f"{rep['free_tv']:.3f}"
            self.say(
                f"fsage: round {res.rounds}: distance {dist:.3f}, free-space TV {tv}, "
                f"fullness {st.target.fullness:.3f}, {time.perf_counter() - t0:.0f} s"
            )
            rank = (_bucket_excess(rep), dist)
            better = closest is None or rank[0] < closest[0][0] - 1e-4
            if closest is None or rank < closest[0]:
                closest = (rank, rep)
            if best is None or dist < best[0] - 1e-4:
                best = (dist, rep)
                better = True
            # Progress in the size buckets or in the distance as a whole keeps the rounds going.
            stalled = 0 if better else stalled + 1
            if rep["matched"]:
                res.matched, res.stop = True, "matched"
                break
            if not st.free_known and rep["buckets_ok"]:
                res.stop = "size buckets matched; free space unknown on this file system"
                break
            if time.perf_counter() - t0 > self.time_limit:
                res.stop = f"time limit ({self.time_limit:.0f} s)"
                break
            if stalled >= STALL_ROUNDS and fills < FILLS:
                # Holes punched cannot always be given back on the kernel's allocator (it
                # takes no hint where to put the filler), and the free extents a fill leaves
                # vary from run to run: a stalled fill is cleared and drawn again.
                fills += 1
                self.say(f"fsage: no progress in {STALL_ROUNDS} rounds: fill {fills} of {FILLS}")
                self.clear()
                self.fill()
                best, stalled = None, 0
                continue
            if stalled >= STALL_ROUNDS:
                res.stop = f"no progress in {STALL_ROUNDS} rounds of each of {FILLS} fills"
                break
            last_actions = self.steer_scores(st)
            free_action = self.steer_free(st) if st.free_known else ""
            if free_action:
                last_actions["free space"] = free_action
        assert best is not None and closest is not None
        res.report = rep
        res.closest = closest[1]
        res.reasons = _reasons(closest[1], last_actions) if not res.matched else {}
        res.elapsed = time.perf_counter() - t0
        res.files_written = self.files_written
        res.bytes_written = self.bytes_written
        return res


def _xfs_geometry(root: Path) -> tuple[int, int, int, int, int] | None:
    """(blocks per allocation group, groups, inode-number bits below the group number, the
    group holding the internal log (-1: external), the log's blocks) of the xfs mounted at
    ``root`` (XFS_IOC_FSGEOMETRY_V1), or None."""
    import fcntl
    import struct

    ioc = (2 << 30) | (112 << 16) | (ord("X") << 8) | 100  # _IOR('X', 100, 112 bytes)
    buf = bytearray(112)
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.ioctl(fd, ioc, buf)
        finally:
            os.close(fd)
    except OSError:
        return None
    block, _rt, agblocks, agcount, log_blocks, _sect, inode = struct.unpack_from("<7I", buf)
    (log_start,) = struct.unpack_from("<Q", buf, 56)  # an AG-encoded block number
    if not (agblocks and agcount and block and inode):
        return None
    agblklog = (agblocks - 1).bit_length()  # log2 rounded up, as the superblock keeps it
    inopblog = (block // inode).bit_length() - 1
    log_group = log_start >> agblklog if log_start else -1
    return agblocks, agcount, agblklog + inopblog, log_group, log_blocks


def _device_blocks(root: Path, block_size: int) -> int | None:
    """The blocks of the device under ``root`` (GETFSMAP), None where it cannot be had."""
    from fsage.snapshotter.live import getfsmap_free

    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return getfsmap_free(fd, block_size, os.fstat(fd).st_dev)[1]
    finally:
        os.close(fd)


def _fs_type(root: Path) -> str:
    """The file system type mounted at (or holding) ``root``, from /proc/self/mounts."""
    best, kind = "", ""
    real = os.path.realpath(root)
    try:
        with open("/proc/self/mounts", encoding="utf-8") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) < 3:
                    continue
                mnt = parts[1].replace("\\040", " ")
                inside = real == mnt or real.startswith(mnt.rstrip("/") + "/")
                if inside and len(mnt) >= len(best):
                    best, kind = mnt, parts[2]
    except OSError:
        return ""
    return kind


def _reasons(rep: dict[str, Any], actions: dict[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for r in rep["buckets"]:
        if r["ok"]:
            continue
        key = f"bucket {r['bucket']}"
        if r["score"] is None:
            out[key] = "no files of this size reached"
        else:
            way = "above" if r["score"] > r["target_score"] else "below"
            last = actions.get(key, "no rewrite possible")
            out[key] = f"still {way} target after the last round ({last})"
    if not rep.get("free_known", True):
        out["free space"] = (
            "not judged: the live reader cannot see this file system's free space (no GETFSMAP)"
        )
    elif not rep["free_ok"]:
        out["free space"] = actions.get(
            "free space", "no contiguous file of a needed hole size touches no free extent"
        )
    return out


@contextlib.contextmanager
def _disk(path: Path, mode: str) -> Iterator[Disk]:
    """Where the match runs: a directory as it is; an image loop-mounted (``mode`` "mount",
    or "auto" as root with loop devices), else an ext image through the offline writer."""
    from fsage.ager.images import can_loop_mount, image_kind, mount, mount_dir, umount

    if mode not in ("auto", "mount", "offline"):
        raise UsageError(f"unknown mode {mode!r}")
    if path.is_dir():
        if mode == "offline":
            raise UsageError("--offline needs an image file, not a directory")
        if (path / AREA).exists():
            raise UsageError(f"{path / AREA} exists: an earlier match left it; remove it first")
        yield MountedDisk(path)
        return
    kind = image_kind(path)
    if kind not in ("ext", "xfs", "btrfs"):
        raise UsageError(f"{path}: not a directory or an ext2/3/4, xfs or btrfs image")
    if mode == "offline" or (mode == "auto" and not can_loop_mount()):
        if kind != "ext":
            raise UsageError(
                f"{path}: a {kind} image can only be matched mounted (needs root and loop devices)"
            )
        try:
            disk = OfflineDisk(path)
        except OpFailedError:
            raise UsageError(f"{path}: /{AREA} exists: an earlier match left it") from None
        try:
            yield disk
        finally:
            disk.close()
        return
    if not can_loop_mount():
        raise UsageError(f"{path}: matching an image mounted needs root and loop devices")
    mnt = mount_dir("match")
    try:
        mount(path, mnt)
        try:
            if (mnt / AREA).exists():
                raise UsageError(f"{path}: /{AREA} exists: an earlier match left it")
            yield MountedDisk(mnt)
        finally:
            os.sync()
            umount(mnt)
    finally:
        with contextlib.suppress(OSError):
            mnt.rmdir()


def match_layout(
    path: Path,
    target: LayoutTarget,
    *,
    seed: int = 0,
    time_limit: float = 600.0,
    mode: str = "auto",
    say: Callable[[str], None] | None = None,
) -> MatchResult:
    """Age the mounted directory or image ``path`` until its layout matches ``target``
    (``mode``: see ``_disk``)."""
    if not path.exists():
        raise UsageError(f"{path}: no such file or directory")
    if not math.isfinite(time_limit) or time_limit <= 0:
        raise UsageError("the time limit must be a positive number of seconds")
    with _disk(path, mode) as disk:
        if isinstance(disk, OfflineDisk) and say is not None:
            say(f"fsage: {OFFLINE_NOTICE}")
        try:
            res = Matcher(disk, target, seed=seed, time_limit=time_limit, say=say).run()
        except OSError as exc:
            raise WorkloadError(f"matching {path}: {exc}") from None
        except WorkloadError as exc:
            raise WorkloadError(f"matching {path}: {exc}") from None
    res.target = str(path)
    res.offline = isinstance(disk, OfflineDisk)
    return res
