"""Read an LFS image into a ``fsage.layout.Layout``.

Block numbers: a segment-block number ``(seg << 32) | blk`` becomes the linear block
``seg * blocks_per_segment + blk`` (``fs.linear_block``), so a file's extents are runs of
consecutive blocks within a segment and the Layout's block numbers count from the start of the
image in file-system blocks. ``facts.groups`` is the segment usage table, one row per segment:
start (linear block), length (blocks per segment), live_blocks, age_ms (now minus the newest
data time; -1 for a segment never written). ``free`` is the clean log segments' data blocks.
"""

from __future__ import annotations

import os

import numpy as np

from fsage.layout import (
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
from fsage.lfs.fs import LFS, linear_block, now_ms

_META_KIND = {0: META_IND, 1: META_DIND, 2: META_TIND}


def read_lfs_layout(path: str | os.PathLike[str]) -> Layout:
    fs = LFS.open(path, readonly=True)
    try:
        with fmt.damaged_as_error(str(path)):
            return _layout(fs)
    finally:
        fs.close()


def _layout(fs: LFS) -> Layout:
    geo = fs.geo
    bpsg = geo.blocks_per_segment
    t = now_ms()
    cols: dict[str, list[int]] = {
        k: []
        for k in (
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
    }
    ext_off = [0]
    el: list[int] = []
    ep: list[int] = []
    en: list[int] = []
    meta_off = [0]
    mp: list[int] = []
    mk: list[int] = []
    parents: list[int] = []
    lino: list[int] = []
    lnames: list[bytes] = []
    used = 0
    for ino in fs.inodes():
        inode = fs.inode(ino)
        data: list[tuple[int, int]] = []
        for addr, kind, off in fs.file_blocks(ino):
            used += 1
            if kind == -1:
                data.append((off, linear_block(geo, addr)))
            else:
                mp.append(linear_block(geo, addr))
                mk.append(_META_KIND[kind])
        data.sort()
        for off, phys in data:
            if el and len(el) > ext_off[-1] and el[-1] + en[-1] == off and ep[-1] + en[-1] == phys:
                en[-1] += 1
            else:
                el.append(off)
                ep.append(phys)
                en.append(1)
        ext_off.append(len(el))
        meta_off.append(len(mp))
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
            ("damaged", 0),
        ):
            cols[k].append(v)
        if fs.is_dir(ino):
            for name, child in fs.directory(ino).items():
                parents.append(ino)
                lino.append(child)
                lnames.append(name.encode("utf-8", "surrogateescape"))
    for sino in fmt.SYSTEM_FILES:
        used += sum(1 for _ in fs.file_blocks(sino))
    from fsage.layout import FILE_COLUMNS

    files = FileTable(
        **{k: np.asarray(v, dtype=FILE_COLUMNS[k]) for k, v in cols.items()},
        ext_off=np.asarray(ext_off, np.uint64),
        ext_logical=np.asarray(el, np.uint64),
        ext_physical=np.asarray(ep, np.uint64),
        ext_length=np.asarray(en, np.uint64),
        ext_flags=np.zeros(len(el), np.uint32),
        meta_off=np.asarray(meta_off, np.uint64),
        meta_physical=np.asarray(mp, np.uint64),
        meta_kind=np.asarray(mk, np.uint8),
    ).sorted_by_ino()
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
        uuid="",
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
        root_ino=fmt.INO_ROOT,
        notes=list(fs.notes),
    )
