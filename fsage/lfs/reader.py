"""Read an LFS image into a ``fsage.layout.Layout``.

Block numbers: a segment-block number ``(seg << 32) | blk`` becomes the linear block
``seg * blocks_per_segment + blk`` (``fs.linear_block``), so a file's extents are runs of
consecutive blocks within a segment and the Layout's block numbers count from the start of the
image in file-system blocks. ``facts.groups`` is the segment usage table, one row per segment:
start (linear block), length (blocks per segment), live_blocks, age_ms (now minus the newest
data time; -1 for a segment never written). ``free`` is the clean log segments' data blocks.
``files`` holds the user's inodes (the root directory included); the inode bitmap, inode
vector and inode table files (16, 17, 18) and the unlinked directory (20) go to ``special``
with their blocks. ``facts.uuid`` is the superblock's UUID (fsage's field 102).
"""

from __future__ import annotations

import os
import stat

import numpy as np

from fsage.layout import (
    FILE_COLUMNS,
    META_DIND,
    META_IND,
    META_TIND,
    FileTable,
    FreeExtents,
    FsFacts,
    Layout,
    LinkTable,
)
from fsage.lfs import format as fmt
from fsage.lfs.format import LfsError
from fsage.lfs.fs import LFS, Inode, LfsOpError, linear_block, now_ms

_META_KIND = {0: META_IND, 1: META_DIND, 2: META_TIND}


def read_lfs_layout(path: str | os.PathLike[str], *, lock: bool = True) -> Layout:
    """The layout of the LFS image ``path``, under its shared lock (``lock=False``: the
    caller answers for the image being still, as for a mount's own image)."""
    fs = LFS.open(path, readonly=True, lock=lock)
    try:
        with fmt.damaged_as_error(str(path)):
            return _layout(fs)
    finally:
        fs.close()


class _Table:
    """Columns of a FileTable being built, one inode at a time."""

    def __init__(self) -> None:
        self.cols: dict[str, list[int]] = {k: [] for k in _COLUMNS}
        self.ext_off = [0]
        self.el: list[int] = []
        self.ep: list[int] = []
        self.en: list[int] = []
        self.meta_off = [0]
        self.mp: list[int] = []
        self.mk: list[int] = []

    def add(self, fs: LFS, ino: int, summaries: _Summaries) -> int:
        """Append inode ``ino``; returns the number of blocks it holds. A file whose inode
        does not decode, whose pointers lead outside the log or to blocks the segment
        summaries give to another file or offset, or whose block count or size disagrees
        with its pointers is recorded as damaged, with the blocks that could be read."""
        geo = fs.geo
        damaged = 0
        try:
            inode = fs.inode(ino)
        except (LfsError, LfsOpError):
            inode = Inode(ino)
            damaged = 1
        data: list[tuple[int, int]] = []
        used = 0
        if not damaged:
            try:
                for addr, kind, off in fs.file_blocks(ino):
                    if not summaries.agrees(addr, inode, kind, off):
                        damaged = 1
                        continue
                    used += 1
                    if kind == -1:
                        data.append((off, linear_block(geo, addr)))
                    else:
                        self.mp.append(linear_block(geo, addr))
                        self.mk.append(_META_KIND[kind])
            except (LfsError, LfsOpError):
                damaged = 1
            if stat.S_ISDIR(inode.mode):
                try:
                    fs.directory(ino)
                except (LfsError, LfsOpError):
                    damaged = 1
            if (
                inode.body is None
                and ino not in fmt.SYSTEM_FILES
                and (
                    len(data) != inode.blocks
                    or (data and max(data)[0] * geo.block_size >= max(inode.size, 1))
                )
            ):
                damaged = 1
        data.sort()
        el, ep, en = self.el, self.ep, self.en
        for off, phys in data:
            if len(el) > self.ext_off[-1] and el[-1] + en[-1] == off and ep[-1] + en[-1] == phys:
                en[-1] += 1
            else:
                el.append(off)
                ep.append(phys)
                en.append(1)
        self.ext_off.append(len(el))
        self.meta_off.append(len(self.mp))
        ns = 1_000_000
        for k, v in (
            ("ino", ino),
            ("generation", inode.version),
            ("mode", inode.mode),
            ("nlink", inode.nlink),
            ("uid", inode.uid),
            ("gid", inode.gid),
            ("size", inode.size),
            ("atime", inode.atime * ns),
            ("mtime", inode.mtime * ns),
            ("ctime", inode.ctime * ns),
            ("crtime", 0),
            ("flags", 0),
            ("damaged", damaged),
        ):
            self.cols[k].append(v)
        return used

    def table(self) -> FileTable:
        return FileTable(
            **{k: np.asarray(v, dtype=FILE_COLUMNS[k]) for k, v in self.cols.items()},
            ext_off=np.asarray(self.ext_off, np.uint64),
            ext_logical=np.asarray(self.el, np.uint64),
            ext_physical=np.asarray(self.ep, np.uint64),
            ext_length=np.asarray(self.en, np.uint64),
            ext_flags=np.zeros(len(self.el), np.uint32),
            meta_off=np.asarray(self.meta_off, np.uint64),
            meta_physical=np.asarray(self.mp, np.uint64),
            meta_kind=np.asarray(self.mk, np.uint8),
        ).sorted_by_ino()


_COLUMNS = (
    "ino",
    "generation",
    "mode",
    "nlink",
    "uid",
    "gid",
    "size",
    "atime",
    "mtime",
    "ctime",
    "crtime",
    "flags",
    "damaged",
)

#: Inodes that are the file system's own, not the user's: the inode bitmap, inode vector and
#: inode table files (16, 17, 18) and the unlinked directory (20). They go to
#: ``Layout.special`` so that the analyzer does not count them as user files.
SPECIAL_INOS = (*fmt.SYSTEM_FILES, fmt.INO_UNLINKED)


class _Summaries:
    """Segment summaries, read once each: does a pointer's block belong where it is used?"""

    def __init__(self, fs: LFS) -> None:
        self.fs = fs
        self.segs: dict[int, fmt.Summary | None] = {}

    def agrees(self, addr: int, inode: Inode, kind: int, off: int) -> bool:
        seg, blk = fmt.sbn_split(addr)
        if seg not in self.segs:
            try:
                self.segs[seg] = fmt.read_summary(self.fs.fd, self.fs.geo, seg)
            except LfsError:
                self.segs[seg] = None
        summ = self.segs[seg]
        if summ is None or blk >= len(summ.recs):
            return False
        rec = summ.recs[blk]
        if rec is None or rec.ino != inode.ino or rec.offset != off:
            return False
        if inode.ino not in fmt.SYSTEM_FILES and rec.version != inode.version:
            return False
        if kind == -1:
            return rec.btype == fmt.BT_DATA
        return rec.btype == fmt.BT_INDIRECT and rec.level == kind


def _name_bytes(name: str | bytes) -> bytes:
    # A name that is not valid UTF-8 on disk may come out of the protobuf decoder as bytes.
    return name if isinstance(name, bytes) else name.encode("utf-8", "surrogateescape")


def _entries(fs: LFS, ino: int) -> dict[str, int]:
    """A directory's entries; none when it cannot be read (the directory is then damaged)."""
    try:
        return fs.directory(ino) if fs.is_dir(ino) else {}
    except (LfsError, LfsOpError):
        return {}


def _layout(fs: LFS) -> Layout:
    geo = fs.geo
    bpsg = geo.blocks_per_segment
    t = now_ms()
    user = _Table()
    special = _Table()
    parents: list[int] = []
    lino: list[int] = []
    lnames: list[bytes] = []
    used = 0
    summaries = _Summaries(fs)
    for ino in fs.inodes():
        if ino in SPECIAL_INOS:
            continue
        used += user.add(fs, ino, summaries)
        for name, child in _entries(fs, ino).items():
            parents.append(ino)
            lino.append(child)
            lnames.append(_name_bytes(name))
    for sino in SPECIAL_INOS:
        used += special.add(fs, sino, summaries)
    # Open-but-unlinked files are named in the unlinked directory; keep those links (they
    # do not reach the root, so such files get no path).
    for name, child in _entries(fs, fmt.INO_UNLINKED).items():
        parents.append(fmt.INO_UNLINKED)
        lino.append(child)
        lnames.append(_name_bytes(name))
    files = user.table()
    groups = []
    free_start: list[int] = []
    free_len: list[int] = []
    for seg in range(geo.segments):
        mt = fs.mtime[seg]
        groups.append(
            {
                "start": seg * bpsg,
                "length": bpsg,
                "live_blocks": fs.live[seg] if seg >= geo.first_log_segment else 0,
                "age_ms": (t - mt) if mt else -1,
            }
        )
        if seg >= geo.first_log_segment and fs.live[seg] == 0 and seg in fs.clean:
            free_start.append(seg * bpsg)
            free_len.append(geo.data_blocks_per_segment)
    total = geo.log_segments * geo.data_blocks_per_segment
    facts = FsFacts(
        kind="lfs",
        uuid=geo.uuid,
        label="",
        block_size=geo.block_size,
        blocks_total=total,
        blocks_free=total - sum(fs.live[geo.first_log_segment :]),
        inodes_total=0,
        inodes_free=0,
        first_data_block=geo.first_log_segment * bpsg,
        features=["lfs-seed003"],
        groups=groups,
        mkfs={
            "segments": geo.segments,
            "blocks_per_segment": bpsg,
            "block_size": geo.block_size,
            "sector_size": geo.sector_size,
            "cleaning_policy": geo.cleaning_policy,
            "checkpoint_interval": geo.checkpoint_interval,
        },
        times={"checkpoint": fs.cp_stamp // 1000},
        extra={"geometry": geo.to_json(), "used_blocks": used, "rolled_forward": fs.rolled_forward},
    )
    return Layout(
        facts=facts,
        files=files,
        links=LinkTable.from_lists(parents, lino, lnames),
        free=FreeExtents(np.asarray(free_start, np.uint64), np.asarray(free_len, np.uint64)),
        special=special.table(),
        root_ino=fmt.INO_ROOT,
        notes=list(fs.notes),
    )
