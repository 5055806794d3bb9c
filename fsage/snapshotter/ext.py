"""The ext2/3/4 reader: a Layout from an image file or block device, through fsage._ext2fs.

The C scanner walks the inode table and hands back columnar batches; this module only views
them as numpy arrays and assembles the Layout.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from fsage import _ext2fs
from fsage.errors import SourceError
from fsage.layout import (
    DAMAGE_CROSS_LINKED,
    DAMAGE_DIRECTORY,
    FILE_COLUMNS,
    META_XATTR,
    FileTable,
    FreeExtents,
    FsFacts,
    Layout,
    LinkTable,
)
from fsage.text import from_disk

# The inode scan and the directory pass run on this many threads at most (each thread reads
# through a libext2fs handle of its own; more than a few only contend for the same disk).
MAX_SCAN_THREADS = 4
ROOT_INO = 2

# Features that only ext4 knows; with none of them an fs with a journal is ext3, else ext2.
EXT4_ONLY_FEATURES = {
    "extent",
    "flex_bg",
    "64bit",
    "huge_file",
    "dir_nlink",
    "extra_isize",
    "metadata_csum",
    "inline_data",
    "bigalloc",
    "uninit_bg",
    "mmp",
    "encrypt",
    "casefold",
    "large_dir",
    "ea_inode",
    "project",
    "quota",
    "verity",
}

EXT_MAGIC_OFFSET = 1024 + 56
EXT_MAGIC = b"\x53\xef"


def has_ext_magic(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            fh.seek(EXT_MAGIC_OFFSET)
            return fh.read(2) == EXT_MAGIC
    except OSError:
        return False


def ext_kind(features: list[str]) -> str:
    if EXT4_ONLY_FEATURES.intersection(features):
        return "ext4"
    return "ext3" if "has_journal" in features else "ext2"


def read_ext_layout(path: Path, progress: Callable[[int, int], None] | None = None) -> Layout:
    """Scan an ext2/3/4 image or device read-only into a Layout.

    ``progress(done, total)`` is called about ten times a second during the inode scan: the
    inodes in use scanned so far, of those the group descriptors count.
    """
    try:
        scanner = _ext2fs.Scanner(str(path))
    except _ext2fs.Ext2fsError as exc:
        raise SourceError(f"{path}: not a readable ext2/3/4 file system ({exc.args[2]})") from None
    try:
        raw_facts = scanner.facts()
        _check_size(path, raw_facts["blocks_count"] * raw_facts["block_size"])
        threads = scan_threads()
        try:
            files, special = _batch_to_tables(scanner.scan(threads, progress))
            raw_links = scanner.links(threads)
        except _ext2fs.Ext2fsError as exc:
            raise SourceError(f"{path}: {exc.args[1]}: {exc.args[2]}") from None
        free_start, free_length = scanner.free_extents()
        failed_reads = scanner.io_errors()
    finally:
        scanner.close()

    if failed_reads:
        raise SourceError(
            f"{path}: {failed_reads} read(s) of the source failed during the scan (an I/O error"
            " or a short read); nothing recorded"
        )
    _mark_cross_linked(_fixed_metadata(raw_facts), files, special)
    links = _links(raw_links)
    damaged_dirs = np.frombuffer(raw_links["damaged_dirs"], np.uint64)
    if damaged_dirs.size:
        hit = np.isin(files.ino, damaged_dirs)
        files.damaged[hit] |= DAMAGE_DIRECTORY  # a view: marks the joined table's column too
    _check_root(path, files)
    facts = _facts(raw_facts)
    free = FreeExtents(np.frombuffer(free_start, np.uint64), np.frombuffer(free_length, np.uint64))
    # The superblock's free count lags behind the bitmaps on a mounted fs; trust the bitmap.
    facts.blocks_free = free.blocks
    return Layout(
        facts=facts, files=files, links=links, free=free, special=special, root_ino=ROOT_INO
    )


def scan_threads() -> int:
    """Threads for the scan: the CPUs this process may use, up to MAX_SCAN_THREADS
    (``FSAGE_SCAN_THREADS`` overrides)."""
    wanted = os.environ.get("FSAGE_SCAN_THREADS", "").strip()
    if wanted:
        if not wanted.isdigit():
            raise SourceError(f"FSAGE_SCAN_THREADS must be a whole number, not {wanted!r}")
        return max(1, int(wanted))
    return max(1, min(len(os.sched_getaffinity(0)), MAX_SCAN_THREADS))


def _check_size(path: Path, expected: int) -> None:
    """An image file shorter than its superblock says is truncated: refuse it."""
    st = path.stat()
    if stat.S_ISREG(st.st_mode) and st.st_size < expected:
        raise SourceError(f"{path}: truncated image ({st.st_size} of {expected} bytes)")


def _fixed_metadata(raw: dict[str, Any]) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64]]:
    """(start, length) of the blocks the file system keeps outside any inode: superblocks,
    descriptor blocks (reserved ones included), bitmaps and inode tables."""
    pairs = np.frombuffer(raw["fixed_meta"], np.uint64).reshape(-1, 2)
    groups = raw["groups"]
    table_blocks = -(-raw["inodes_per_group"] * raw["inode_size"] // raw["block_size"])
    bitmaps = np.concatenate(
        [
            np.frombuffer(groups["block_bitmap"], np.uint64),
            np.frombuffer(groups["inode_bitmap"], np.uint64),
        ]
    )
    tables = np.frombuffer(groups["inode_table"], np.uint64)
    start = np.concatenate([pairs[:, 0], bitmaps, tables])
    length = np.concatenate(
        [
            pairs[:, 1],
            np.ones(bitmaps.size, np.uint64),
            np.full(tables.size, table_blocks, np.uint64),
        ]
    )
    keep = length > 0
    return start[keep], length[keep]


def _mark_cross_linked(
    fixed: tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64]], *tables: FileTable
) -> None:
    """Flag every inode that maps a block another inode (or another of its own extents), or
    the file system's own metadata (``fixed``), maps too, as e2fsck's "multiply-claimed
    blocks" does: a corrupt pointer into someone else's blocks must not pass for a healthy
    file. Xattr blocks are shared by design."""
    starts, ends, owners = [fixed[0]], [fixed[0] + fixed[1]], [np.full(fixed[0].size, -1)]
    for t, table in enumerate(tables):
        n = len(table)
        if n == 0:
            continue
        rows = np.arange(n, dtype=np.int64)
        ext_rows = np.repeat(rows, np.diff(table.ext_off).astype(np.int64))
        meta = table.meta_kind != META_XATTR
        meta_rows = np.repeat(rows, np.diff(table.meta_off).astype(np.int64))[meta]
        starts += [table.ext_physical, table.meta_physical[meta]]
        ends += [table.ext_physical + table.ext_length, table.meta_physical[meta] + 1]
        owners += [ext_rows + (t << 40), meta_rows + (t << 40)]
    if not starts:
        return
    start = np.concatenate(starts).astype(np.uint64)
    if start.size < 2:
        return
    end = np.concatenate(ends).astype(np.uint64)
    owner = np.concatenate(owners)
    order = np.argsort(start, kind="stable")
    start, end, owner = start[order], end[order], owner[order]
    reach = np.maximum.accumulate(end)
    hit = np.flatnonzero(start[1:] < reach[:-1]) + 1
    if hit.size == 0:
        return
    # Reserved inodes are not flagged (the resize inode holds the reserved descriptor
    # blocks, which are the file system's too); a file that overlaps one is.
    special = len(tables) - 1  # the last table holds the reserved inodes
    # The owners involved, each once (sorted by hand: numpy 2's np.unique imports numpy.ma,
    # a tenth of a second of start-up, and every image has hits: the resize inode's).
    both = np.sort(np.concatenate([owner[hit], owner[hit - 1]]))
    who = both[np.concatenate([[True], both[1:] != both[:-1]])]
    for w in who[(who >= 0) & ((who >> 40) != special)].tolist():
        table = tables[w >> 40]
        table.damaged[w & ((1 << 40) - 1)] |= DAMAGE_CROSS_LINKED


def _check_root(path: Path, files: FileTable) -> None:
    """Without a usable root directory there is no tree to record: refuse the image."""
    hit = np.flatnonzero(files.ino == ROOT_INO)
    if hit.size == 0 or files.damaged[hit[0]] or not files.is_dir()[hit[0]]:
        raise SourceError(f"{path}: the root directory inode is damaged; run e2fsck")


def _batch_to_tables(batch: dict[str, bytearray]) -> tuple[FileTable, FileTable]:
    """User files and reserved inodes of a batch: two views of one table, reserved inodes
    first, so that the store joins them again without a copy."""
    cols: dict[str, Any] = {
        name: np.frombuffer(batch[name], dtype) for name, dtype in FILE_COLUMNS.items()
    }
    ext_count = np.frombuffer(batch["ext_count"], np.uint32)
    meta_count = np.frombuffer(batch["meta_count"], np.uint32)
    ext_off = np.zeros(ext_count.size + 1, np.uint64)
    np.cumsum(ext_count, out=ext_off[1:])
    meta_off = np.zeros(meta_count.size + 1, np.uint64)
    np.cumsum(meta_count, out=meta_off[1:])
    table = FileTable(
        **cols,
        ext_off=ext_off,
        ext_logical=np.frombuffer(batch["ext_logical"], np.uint64),
        ext_physical=np.frombuffer(batch["ext_physical"], np.uint64),
        ext_length=np.frombuffer(batch["ext_length"], np.uint64),
        ext_flags=np.frombuffer(batch["ext_flags"], np.uint32),
        meta_off=meta_off,
        meta_physical=np.frombuffer(batch["meta_physical"], np.uint64),
        meta_kind=np.frombuffer(batch["meta_kind"], np.uint8),
    )
    special = np.frombuffer(batch["special"], np.uint8).astype(bool)
    if not special.any():
        return table, FileTable.empty()
    # Reserved inodes have the lowest numbers, among them the root directory: only the rows up
    # to the last reserved one need reordering, in place.
    head = int(np.flatnonzero(special)[-1]) + 1
    order = np.argsort(~special[:head], kind="stable")
    table.reorder_head(order)
    k = int(np.count_nonzero(special))
    return table.slice(k, len(table)), table.slice(0, k)


def _links(raw: dict[str, bytes]) -> LinkTable:
    name_len = np.frombuffer(raw["name_len"], np.uint32)
    off = np.zeros(name_len.size + 1, np.uint64)
    np.cumsum(name_len, out=off[1:])
    return LinkTable(
        parent=np.frombuffer(raw["parent"], np.uint64),
        ino=np.frombuffer(raw["ino"], np.uint64),
        name_off=off,
        names=raw["names"],
    )


def _facts(raw: dict[str, Any]) -> FsFacts:
    label = from_disk(bytes(raw["label"]).split(b"\0", 1)[0])
    groups_raw = {k: np.frombuffer(v, np.uint64).tolist() for k, v in raw["groups"].items()}
    keys = list(groups_raw)
    groups = [{k: int(groups_raw[k][i]) for k in keys} for i in range(len(groups_raw["start"]))]
    features: list[str] = list(raw["features"])
    flex = 1 << raw["log_groups_per_flex"] if "flex_bg" in features else 0
    mkfs: dict[str, Any] = {
        "block_size": raw["block_size"],
        "cluster_size": raw["cluster_size"] if "bigalloc" in features else None,
        "blocks_count": raw["blocks_count"],
        "inodes_count": raw["inodes_count"],
        "inode_size": raw["inode_size"],
        "blocks_per_group": raw["blocks_per_group"],
        "flex_bg_size": flex or None,
        "features": features,
        "reserved_blocks": raw["reserved_blocks"],
        "reserved_gdt_blocks": raw["reserved_gdt_blocks"],
        "desc_size": raw["desc_size"],
        "journal_blocks": raw["journal_blocks"] or None,
        "label": label,
        "uuid": raw["uuid"],
        "hash_seed": raw["hash_seed"],
        "default_hash_version": raw["default_hash_version"],
        "raid_stride": raw["raid_stride"],
        "raid_stripe_width": raw["raid_stripe_width"],
        "rev_level": raw["rev_level"],
        "creator_os": raw["creator_os"],
        "first_data_block": raw["first_data_block"],
    }
    extra = {
        k: raw[k]
        for k in (
            "inodes_per_group",
            "blocks_per_group",
            "clusters_per_group",
            "inode_size",
            "first_ino",
            "group_count",
            "cluster_size",
            "log_groups_per_flex",
            "journal_inum",
            "journal_blocks",
            "state",
            "errors",
            "min_extra_isize",
            "reserved_blocks",
        )
    }
    return FsFacts(
        kind=ext_kind(features),
        uuid=raw["uuid"],
        label=label,
        block_size=raw["block_size"],
        blocks_total=raw["blocks_count"],
        blocks_free=raw["free_blocks"],
        inodes_total=raw["inodes_count"],
        inodes_free=raw["free_inodes"],
        first_data_block=raw["first_data_block"],
        features=features,
        groups=groups,
        mkfs=mkfs,
        times={
            "mkfs": raw["mkfs_time"],
            "write": raw["write_time"],
            "mount": raw["mount_time"],
            "lastcheck": raw["lastcheck_time"],
        },
        extra=extra,
    )
