"""Where ``fsage age --match`` writes: a mounted tree through the kernel, or an unmounted ext
image through the offline writer (libext2fs), behind the few ops the matcher needs.

The Disk classes are thin adapters: each of their ops is a Workload op run by the executor
every other aging uses (``PosixExecutor``, ``OfflineExtExecutor``) and journaled once it took
effect, so a match is an op stream ``fsage age OTHER --ops`` runs again. They only read the
file system themselves (inode numbers, fullness, snapshots)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from fsage.ager.match_xfs import path_neighbours
from fsage.ager.posix import PosixExecutor
from fsage.ager.runjournal import _Journal, _stepper
from fsage.ager.targets import lift_ext4_reserve
from fsage.errors import UsageError
from fsage.layout import FsFacts, Layout
from fsage.workload import Executor, NoSpaceError, Op, OpFailedError

AREA = "fsage-match"  # the matcher's files live under this directory of the target


class Disk:
    """Where the matcher's files live: the ops it needs, on paths relative to its area
    (``AREA`` at the top of the target). ``MountedDisk`` runs them through the kernel,
    ``OfflineDisk`` through libext2fs on an unmounted ext image."""

    bs: int
    #: The file system's kind as a layout names it ("ext4", "xfs", ...; "ext" offline).
    kind: str = ""
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
    #: The executor the ops run on.
    x: Executor
    #: ext4's reserve of blocks set aside on this mount (``lift_ext4_reserve``), when fsage
    #: changed it: a parameter of the journal that a replay applies.
    reserve: int | None = None

    def _start_journal(self) -> None:
        #: The ops that took effect, as Workload ops on paths from the file system's top: a
        #: stream ``fsage age --ops`` runs again.
        self.ops: list[Op] = []
        self._live: set[str] = set()
        self._step: Callable[[Op], int] = self._apply
        self._on_commit: Callable[[], None] | None = None

    def _apply(self, op: Op) -> int:
        return self.x.apply(op)

    def attach(self, journal: _Journal, on_commit: Callable[[], None] | None = None) -> None:
        """Journal every op to ``journal`` (a run's record) as it takes effect, in the same
        call where the executor can (a killed match leaves every completed op in it);
        ``on_commit``: called after each commit (to keep the record)."""
        self._step = _stepper(self.x, journal)
        self._on_commit = on_commit

    def _committed(self) -> None:
        if self._on_commit is not None:
            self._on_commit()

    def area_tree(self) -> list[tuple[str, bool]]:
        """(path from the top, is a directory) of everything in the matcher's area, as the
        file system holds it."""
        raise NotImplementedError

    def knows(self, path: str) -> None:
        """``path`` (from the top) is in the journal already (a resumed match's)."""
        self._live.add(path)

    def _run(self, op: Op) -> None:
        """Run ``op`` on the executor and journal it (only once it took effect)."""
        self._step(op)
        if op.op == "delete":
            self._live.discard(op.path)
        elif op.op in ("create", "mkdir"):
            self._live.add(op.path)
        elif op.op == "rename":
            self._live.discard(op.path)
            self._live.add(op.dest)
        self.ops.append(op)

    def _gone(self, path: str) -> bool:
        """True when ``path`` never took effect (its create ran out of space and was undone):
        nothing to delete or punch, and no op for it in the journal."""
        return path not in self._live

    def prepare(self) -> None:
        """Make the matcher's area: the first write, once the target has been accepted."""
        raise NotImplementedError

    def keep_group_empty(self, group: int) -> None:
        """Put no new directory (so, on xfs, no new file's data) in region ``group``."""

    #: Directories are made when their first file is written, not ahead (``balance_groups``).
    lazy_dirs: bool = False

    def group_capacity(self) -> list[int]:
        """Blocks each region (xfs allocation group) can hold, its log left out; []: none."""
        return []

    def balance_groups(self, rooms: list[int]) -> None:
        """Put each new directory in the region furthest below its share ``rooms`` (blocks)
        of the files written (see ``match_xfs``)."""

    def expect(self, blocks: dict[str, int]) -> None:
        """The blocks each directory (relative to the area) is to hold, counted in its region
        from when it is made (``balance_groups``)."""

    def precreate(self, rels: list[str]) -> None:
        """Make the files at ``rels`` (relative to the area) empty, in that order, before
        they are written in another (see ``MountedDisk.precreate``); nothing where their
        inodes would not follow the order."""

    def drop_precreated(self) -> int:
        """Delete the files ``precreate`` made that were never written; how many."""
        return 0

    def made_ahead(self, rels: list[str]) -> None:
        """The files at ``rels`` are on disk, empty, as ``precreate`` made them (a resumed
        fill's): written in place and, never written, deleted by ``drop_precreated``."""

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
        self.x.close()


class MountedDisk(Disk):
    """A mounted directory: ops through ``PosixExecutor`` (the kernel's allocator), snapshots
    by fsage's live reader."""

    def __init__(self, root: Path, geometry: FsFacts | None = None) -> None:
        self._start_journal()
        self.root = root
        self.geometry = geometry
        self.area = root / AREA
        vfs = os.statvfs(root)
        self.bs = vfs.f_frsize
        # Fullness as the snapshots measure it (the live reader's and the offline reader's
        # alike): used blocks, metadata included, of the device's blocks where GETFSMAP
        # gives them. statvfs leaves ext4's metadata out of both: a target read offline
        # would be matched on a different scale.
        self.total = _device_blocks(root, self.bs) or vfs.f_blocks
        # btrfs frees a punched range only when no part of its extent is still referenced:
        # holes there are made by deleting whole files.
        self.kind = _fs_type(root)
        self.can_punch = self.kind != "btrfs"
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
        #: Files made empty ahead of their writes (``precreate``), not written yet.
        self._reserved: set[str] = set()
        if self.kind == "xfs":
            geom = _xfs_geometry(root)
            if geom is not None:
                self.group_blocks, self.groups, self._ino_shift, log_group, log_blocks = geom
                self._room = [self.group_blocks] * self.groups
                if 0 <= log_group < self.groups:
                    self._room[log_group] -= log_blocks
                self._placed = [0] * self.groups
        self._cap = list(self._room)
        #: Empty directories made in a group other than the one wanted (``balance_groups``).
        self._spare: dict[int, list[str]] = {}
        #: Blocks each directory is to hold (``expect``) and those not written yet per group.
        self._expected: dict[str, int] = {}
        self._due = [0] * self.groups
        self.x = PosixExecutor(root)

    def prepare(self) -> None:
        self._run(Op("mkdir", AREA))

    def _p(self, rel: str) -> str:
        return f"{AREA}/{rel}"

    def _ino(self, rel: str) -> int:
        return os.lstat(self.area / rel).st_ino

    def keep_group_empty(self, group: int) -> None:
        self._avoid = self.kept_empty = group

    def group_capacity(self) -> list[int]:
        return list(self._cap)

    def balance_groups(self, rooms: list[int]) -> None:
        # Placed by the blocks written in them, so made when their first file is.
        self._room, self._avoid, self.lazy_dirs = list(rooms), -1, True

    def expect(self, blocks: dict[str, int]) -> None:
        # Counted in its group once made, until written: a directory's files come
        # scattered over the fill, and groups judged by what was written so far took in
        # more directories than they could hold (the log's group 18 % over its share).
        self._expected.update(blocks)

    def _group_dir(self, group: int) -> str | None:
        """A directory (relative to the area) whose inode is in allocation group ``group``:
        new directories go to the groups in turn."""
        if group in self._group_dirs:
            return self._group_dirs[group]
        for _ in range(4 * self.groups):
            rel = f".g{len(self._group_dirs)}-{self._tries}"
            self._tries += 1
            self._run(Op("mkdir", self._p(rel)))
            g = self._ino(rel) >> self._ino_shift
            self._group_dirs.setdefault(int(g), rel)
            if g == group:
                return rel
        return None

    def mkdir(self, rel: str) -> None:
        """On xfs a new directory goes to the next allocation group in turn, and the files
        made in it to the same group (until it is full: then to the next group). While one
        is kept empty, new directories go to the least filled of the others (the group
        after a full one would take its overflow): one landing elsewhere is left aside
        (empty, under another name) and another one made. With ``balance_groups``, to the
        group furthest below its share that neither path-order neighbour is in; one landing
        elsewhere is kept for a later directory of its group."""
        path = self.area / rel
        if self._avoid is None:
            if not path.exists():
                self._run(Op("mkdir", self._p(rel)))
            return
        others = [g for g in range(self.groups) if g != self._avoid]
        if self.lazy_dirs:
            near = {self._dir_group.get(n) for n in path_neighbours(rel)}
            others = [g for g in others if g not in near] or others
        best = min(others, key=lambda g: (self._placed[g] + self._due[g]) / max(self._room[g], 1))
        fallback = None
        self._due[best] += self._expected.get(rel, 0)
        if self._spare.get(best):  # one made for another directory, in this group
            self._run(Op("rename", self._p(self._spare[best].pop()), dest=self._p(rel)))
            self._dir_group[rel] = best
            return
        for attempt in range(4 * self.groups + 1):
            tmp = f".{rel}.{attempt}"
            self._run(Op("mkdir", self._p(tmp)))
            g = self._ino(tmp) >> self._ino_shift
            if self.lazy_dirs and g != best:
                # Kept for a later directory of its group (removed if none takes it).
                self._spare.setdefault(g, []).append(tmp)
                continue
            if g == best:
                self._run(Op("rename", self._p(tmp), dest=self._p(rel)))
                self._dir_group[rel] = g
                return
            if g != self._avoid and fallback is None:
                fallback = (tmp, g)
        if fallback is not None:
            self._run(Op("rename", self._p(fallback[0]), dest=self._p(rel)))
            self._dir_group[rel] = fallback[1]
            return
        if not path.exists():  # the allocator does not rotate: take what it gives
            self._run(Op("mkdir", self._p(rel)))

    def precreate(self, rels: list[str]) -> None:
        """Each file of ``rels`` made empty, in that order, to take its inode now (see
        ``match_locality``); a later ``create`` of it keeps that inode (it writes the
        file without truncating it). Files deleted to be rewritten and made again this
        way, in path order, take back the inodes they had (ext4 hands out a group's lowest
        free inode), so a rewrite keeps the inode order. ext4 only: on xfs the inode order
        came closer to a 512 MiB git target's (inode_switches / inode_window 0.275 / 0.76:
        0.257 / 0.78 made ahead, 0.203 / 0.872 not), but its consecutive files' adjacency,
        already off (0.13 against 0.04), went to 0.14-0.29 with how the files were then
        written. The fill commits after, so that its writes are written back in their own
        order, not the creates'."""
        if self.kind not in ("ext4", "ext3", "ext2"):
            return
        for rel in rels:
            try:
                self._run(Op("create", self._p(rel), 0))
            except NoSpaceError:
                break  # out of inodes: the rest take theirs when written
            self._reserved.add(rel)

    def made_ahead(self, rels: list[str]) -> None:
        self._reserved.update(rels)

    def drop_precreated(self) -> int:
        for tmp in sorted(t for spare in self._spare.values() for t in spare):
            self._run(Op("delete", self._p(tmp)))  # directories no directory took
        self._spare.clear()
        self._expected.clear()  # the files the fill left out
        self._due = [0] * self.groups
        left = sorted(self._reserved)
        for rel in left:
            self.unlink(rel)
        return len(left)

    def _place(self, rel: str, size: int) -> None:
        top = rel.partition("/")[0]
        g = self._dir_group.get(top)
        if g is not None:
            blocks = -(-size // self.bs)
            self._placed[g] += blocks
            self._file_blocks[rel] = (g, blocks)
            due = min(self._expected.get(top, 0), blocks)
            if due:
                self._expected[top] -= due
                self._due[g] -= due

    def create(self, rel: str, size: int, at_once: bool = False) -> int:
        """``at_once``: the kernel writes a large file back a few MiB at a time, interleaved
        with the other files written, so it is split: the writes before it are synced
        first and it is fsync'ed whole."""
        p = self._p(rel)
        made = rel in self._reserved
        self._reserved.discard(rel)
        if at_once:
            self._run(Op("sync"))
        # A file made ahead is written without truncating it: ext4 allocates the blocks of a
        # file truncated to nothing and written again when it is closed (auto_da_alloc), in
        # write order, where the fill counts on delayed allocation.
        self._run(Op("append" if made else "create", p, size))
        if at_once:
            self._run(Op("fsync", p))
        self._place(rel, size)
        return self._ino(rel)

    def interleave(self, items: list[tuple[str, int]], chunk: int) -> list[int]:
        """fallocate each piece in turn, so it is placed at once next to the other files'
        pieces, then write the data; where fallocate is not supported, write each piece and
        fsync it."""
        inos = []
        for rel, _ in items:
            if rel not in self._reserved:  # made ahead: not truncated (see ``create``)
                self._run(Op("create", self._p(rel), 0))
            self._reserved.discard(rel)
            inos.append(self._ino(rel))
        step = chunk * self.bs
        for off in range(0, max(size for _, size in items), step):
            for rel, size in items:
                if off >= size:
                    continue
                n = min(step, size - off)
                if self.can_fallocate:
                    try:
                        self._run(Op("fallocate", self._p(rel), n, off))
                        continue
                    except OpFailedError:  # not supported here (ENOSPC is NoSpaceError)
                        self.can_fallocate = False
                self._run(Op("append", self._p(rel), n))
                self._run(Op("fsync", self._p(rel)))
        for rel, size in items:
            self._run(Op("overwrite", self._p(rel), size, 0))
            self._place(rel, size)
        return inos

    def unlink(self, rel: str) -> None:
        self._reserved.discard(rel)
        if not self._gone(self._p(rel)):
            with contextlib.suppress(OpFailedError):  # gone already
                self._run(Op("delete", self._p(rel)))
        g, blocks = self._file_blocks.pop(rel, (-1, 0))
        if g >= 0:
            self._placed[g] -= blocks

    def punch(self, rel: str, offset: int, length: int) -> bool:
        if self._gone(self._p(rel)):
            return False
        try:
            self._run(Op("punch", self._p(rel), length, offset))
        except OpFailedError:
            self.can_punch = False  # not supported here: holes by deleting files
            return False
        return True

    def allocate(self, rel: str, size: int, near: int | None = None) -> int | None:
        """On xfs, ``near`` chooses the allocation group: the file is made in a directory of
        the group holding block ``near`` (xfs allocates a new file's data in its inode's
        group, its inode in its directory's), then moved to ``rel``. Elsewhere the kernel
        takes no hint: a plain fallocate."""
        if near is not None and self.groups and self.group_blocks:
            holder = self._group_dir(near // self.group_blocks)
            if holder is not None:
                tmp = f"{holder}/{rel.replace('/', '_')}"
                ino = self.allocate(tmp, size)
                if ino is not None:
                    self._run(Op("rename", self._p(tmp), dest=self._p(rel)))
                return ino
        p = self._p(rel)
        self._run(Op("create", p, 0))
        try:
            self._run(Op("fallocate", p, size, 0))
        except OpFailedError:  # not supported here (ENOSPC is NoSpaceError)
            self.can_fallocate = False
            self._run(Op("delete", p))
            return None
        self._place(rel, size)
        return self._ino(rel)

    def fullness(self) -> float:
        v = os.statvfs(self.root)
        return (self.total - v.f_bfree) / self.total

    def commit(self) -> None:
        self._run(Op("sync"))
        self._committed()

    def area_tree(self) -> list[tuple[str, bool]]:
        out: list[tuple[str, bool]] = []
        if not os.path.lexists(self.area):
            return out
        out.append((AREA, True))
        for dirpath, dirnames, filenames in os.walk(self.area):
            rel = os.path.relpath(dirpath, self.root)
            out += [(f"{rel}/{d}", True) for d in dirnames]
            out += [(f"{rel}/{f}", False) for f in filenames]
        return out

    def layout(self) -> Layout:
        from fsage.snapshotter.live import read_live_layout

        os.sync()
        layout = read_live_layout(self.root)
        if self.geometry is not None:
            # The live reader does not see where the inode tables are; a loop-mounted ext
            # image's were read from it before mounting (mkfs puts them; they never move),
            # so that a path-order read is modeled as the offline reader's is.
            f = layout.facts
            f.groups = self.geometry.groups
            for k, v in self.geometry.extra.items():
                f.extra.setdefault(k, v)
            for k, v in self.geometry.mkfs.items():
                f.mkfs.setdefault(k, v)
        return layout


class OfflineDisk(Disk):
    """An unmounted ext image: ops through the offline writer (libext2fs, whose allocator
    places each block near the file's previous one, at once: no delayed allocation), and
    snapshots by the offline reader after a flush. Interleaved files are written a piece at
    a time in turn, which alternates their blocks."""

    can_place = True
    kind = "ext"

    def __init__(self, image: Path) -> None:
        from fsage.ager.offline import OfflineExtExecutor

        self._start_journal()
        from fsage.snapshotter.ext import read_ext_layout

        self.image = image
        self._read = read_ext_layout
        # Fullness as ``measure`` sees it: all blocks of the image, metadata counted as used
        # (the writer's statfs-like figures leave the metadata out of both counts, so only
        # their difference, the free blocks, is taken from them).
        self.total = read_ext_layout(image).facts.blocks_total
        self.x = self.ext = OfflineExtExecutor(image)
        self.bs = self.x.capacity_blocks()[0]

    def prepare(self) -> None:
        try:
            self._run(Op("mkdir", AREA))
        except OpFailedError:
            raise UsageError(f"{self.image}: /{AREA} exists: an earlier match left it") from None

    def _path(self, rel: str) -> str:
        return f"{AREA}/{rel}"

    def mkdir(self, rel: str) -> None:
        with contextlib.suppress(OpFailedError):  # exists already
            self._run(Op("mkdir", self._path(rel)))

    def create(self, rel: str, size: int, at_once: bool = False) -> int:
        path = self._path(rel)
        self._run(Op("create", path, size))
        return self.ext.stat(path)[0]

    def interleave(self, items: list[tuple[str, int]], chunk: int) -> list[int]:
        paths = [self._path(rel) for rel, _ in items]
        inos = []
        for path in paths:
            self._run(Op("create", path, 0))
            inos.append(self.ext.stat(path)[0])
        step = chunk * self.bs
        for off in range(0, max(size for _, size in items), step):
            for path, (_, size) in zip(paths, items, strict=True):
                if off < size:
                    self._run(Op("append", path, min(step, size - off)))
        return inos

    def unlink(self, rel: str) -> None:
        if not self._gone(self._path(rel)):
            with contextlib.suppress(OpFailedError):  # gone already
                self._run(Op("delete", self._path(rel)))

    def punch(self, rel: str, offset: int, length: int) -> bool:
        if self._gone(self._path(rel)):
            return False
        self._run(Op("punch", self._path(rel), length, offset))
        return True

    def allocate(self, rel: str, size: int, near: int | None = None) -> int | None:
        path = self._path(rel)
        self._run(Op("create", path, 0))
        if near is None:
            self._run(Op("fallocate", path, size, 0))
        else:
            self._run(Op("allocate-near", path, size, 0, label=str(near)))
        return self.ext.stat(path)[0]

    def fullness(self) -> float:
        _, cap_total, cap_used = self.x.capacity_blocks()
        free = cap_total - cap_used
        return (self.total - free) / self.total if self.total else 0.0

    def commit(self) -> None:
        self._run(Op("sync"))  # the offline executor flushes on sync
        self._committed()

    def area_tree(self) -> list[tuple[str, bool]]:
        layout = self.layout()
        isdir = layout.files.is_dir()
        index = {int(ino): i for i, ino in enumerate(layout.files.ino)}
        out = []
        for ino, paths in layout.paths().items():
            for p in paths:
                rel = p.lstrip("/")
                if rel == AREA or rel.startswith(AREA + "/"):
                    out.append((rel, bool(isdir[index[int(ino)]])))
        return out

    def layout(self) -> Layout:
        self.ext.flush()
        return self._read(self.image)


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


def probe(path: Path) -> tuple[str, int]:
    """(kind, block size) of the directory or image ``path``, read without mounting it (an
    image's superblock), so that a target can be refused before anything is written."""
    from fsage.ager.images import image_kind

    if path.is_dir():
        return _fs_type(path), os.statvfs(path).f_frsize
    kind = image_kind(path) or ""
    # Where each kind's superblock keeps its block size: ext (1024 << s_log_block_size at
    # byte 1048, little-endian), xfs (sb_blocksize at byte 4, big-endian), btrfs (sectorsize
    # at byte 0x10090, little-endian).
    where = {"ext": (1048, "<I"), "xfs": (4, ">I"), "btrfs": (0x10090, "<I")}.get(kind)
    if where is None:
        return kind, 0
    import struct

    with open(path, "rb") as fh:
        fh.seek(where[0])
        (value,) = struct.unpack(where[1], fh.read(4))
    return kind, 1024 << value if kind == "ext" else value


@contextlib.contextmanager
def _closing(disk: Disk) -> Iterator[Disk]:
    try:
        yield disk
    finally:
        disk.close()


@contextlib.contextmanager
def open_disk(path: Path, mode: str, resume: bool = False) -> Iterator[Disk]:
    """Where the match runs: a directory as it is; an image loop-mounted (``mode`` "mount",
    or "auto" as root with loop devices), else an ext image through the offline writer.
    ``resume``: the matcher's area of a killed match is expected (and an image it left
    mounted is unmounted first)."""
    from fsage.ager.images import (
        can_loop_mount,
        clear_stale_mounts,
        image_kind,
        mount,
        mount_dir,
        umount,
    )

    if mode not in ("auto", "mount", "offline"):
        raise UsageError(f"unknown mode {mode!r}")
    if path.is_dir():
        if mode == "offline":
            raise UsageError("--offline needs an image file, not a directory")
        if (path / AREA).exists() and not resume:
            raise UsageError(f"{path / AREA} exists: an earlier match left it; remove it first")
        with _closing(MountedDisk(path)) as disk:
            yield disk
        return
    kind = image_kind(path)
    if kind not in ("ext", "xfs", "btrfs"):
        raise UsageError(f"{path}: not a directory or an ext2/3/4, xfs or btrfs image")
    clear_stale_mounts(path)  # a killed match's mount
    if mode == "offline" or (mode == "auto" and not can_loop_mount()):
        if kind != "ext":
            raise UsageError(
                f"{path}: a {kind} image can only be matched mounted (needs root and loop devices)"
            )
        with _closing(OfflineDisk(path)) as disk:
            yield disk
        return
    if not can_loop_mount():
        raise UsageError(f"{path}: matching an image mounted needs root and loop devices")
    geometry = None
    if kind == "ext":
        from fsage.snapshotter.ext import read_ext_layout

        geometry = read_ext_layout(path).facts
    mnt = mount_dir("match")
    try:
        mount(path, mnt)
        try:
            if (mnt / AREA).exists() and not resume:
                raise UsageError(f"{path}: /{AREA} exists: an earlier match left it")
            reserve = lift_ext4_reserve(mnt) if kind == "ext" else None
            with _closing(MountedDisk(mnt, geometry)) as disk:
                disk.reserve = reserve
                yield disk
        finally:
            os.sync()
            umount(mnt)
    finally:
        with contextlib.suppress(OSError):
            mnt.rmdir()
