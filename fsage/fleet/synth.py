"""Synthetic nightly histories for the fleet benchmark and tests.

Each file system starts with ``files`` regular files (sizes from a log-normal distribution, in
one directory per 1,000 files) laid out mostly contiguously, then ages: every night a share of
the files is deleted, new files are created and some are rewritten, and files written later are
more fragmented (the fragmentation probability grows with the night's index), so layout scores
decline over the history as on an aging file system. Unchanged files keep their exact extents
from night to night, so the store and the export see them as the same version.
"""

from __future__ import annotations

import datetime as dt
import stat
import uuid as uuidlib

import numpy as np
import numpy.typing as npt

from fsage.db.store import Store
from fsage.layout import FileTable, FreeExtents, FsFacts, Layout, LinkTable

I64 = npt.NDArray[np.int64]
BLOCK = 4096
PER_DIR = 1000
# Subdirectories a directory holds (0: every directory under the root). A tree of them gives
# paths as long as a real tree's (at 8, some 6 levels for 300k directories).
FANOUT = 0


class _Allocator:
    """Next fit over the file system's free space: new files take the free blocks after a
    cursor, in order, wrapping at the end of the file system, with small skips before a file
    and larger ones between the pieces of a fragmented file. A piece that meets allocated
    space continues in the next free extent, as a real allocator's would."""

    def __init__(self, rng: np.random.Generator, start: int) -> None:
        self.rng = rng
        self.cursor = start
        self.free_start: I64 = np.array([start], np.int64)
        self.free_len: I64 = np.array([2**62], np.int64)  # until the size is known

    def set_free(self, start: I64, length: I64) -> None:
        """The free extents (sorted by start) that the next files are placed in."""
        self.free_start, self.free_len = start.astype(np.int64), length.astype(np.int64)

    def _from_cursor(self) -> tuple[I64, I64]:
        """The free extents in the order next fit visits them: from the cursor to the end,
        then from the start of the file system back to the cursor."""
        s, ln = self.free_start, self.free_len
        k = int(np.searchsorted(s + ln, self.cursor, side="right"))
        head_s, head_l = s[k:].copy(), ln[k:].copy()
        tail_s, tail_l = s[:k], ln[:k]
        if head_s.size and head_s[0] < self.cursor:  # the cursor is inside this extent
            before = self.cursor - head_s[0]
            tail_s = np.append(tail_s, head_s[0])
            tail_l = np.append(tail_l, before)
            head_s[0] += before
            head_l[0] -= before
        return np.concatenate([head_s, tail_s]), np.concatenate([head_l, tail_l])

    def place(self, blocks: I64, frag: float) -> tuple[I64, I64, I64, I64]:
        """Extents (owner offsets, logical, physical, length) of new files of ``blocks``."""
        n = blocks.size
        pieces = 1 + self.rng.binomial(np.maximum(blocks - 1, 0), frag / 8.0)
        pieces = np.minimum(np.maximum(pieces, 1), np.maximum(blocks, 1))
        pieces[blocks == 0] = 0
        off = np.zeros(n + 1, np.int64)
        np.cumsum(pieces, out=off[1:])
        owner = np.repeat(np.arange(n), pieces)
        idx = np.arange(off[-1]) - off[:-1][owner]  # piece index within its file
        base = blocks[owner] // pieces[owner]
        length = base + np.where(idx == pieces[owner] - 1, blocks[owner] % pieces[owner], 0)
        logical = idx * base
        gap = np.where(idx == 0, self.rng.integers(0, 4, owner.size), 0)
        gap += np.where(idx > 0, self.rng.integers(1, 16, owner.size), 0)
        if not owner.size:
            return off, logical, np.zeros(0, np.int64), length
        # Lay the pieces out in free-space coordinates (free blocks counted from the cursor),
        # then map them back to physical runs, split where a free extent ends.
        fs, fl = self._from_cursor()
        fend = np.cumsum(fl)
        fbeg = fend - fl
        b = np.cumsum(gap + length)
        a = b - length
        if int(b[-1]) > int(fend[-1]):
            raise ValueError("synthetic file system full: lower the churn or the file count")
        first = np.searchsorted(fend, a, side="right")
        last = np.searchsorted(fbeg, b, side="left")  # exclusive
        count = last - first
        sub_piece = np.repeat(np.arange(owner.size), count)
        within = np.arange(int(count.sum())) - (np.cumsum(count) - count)[sub_piece]
        ext = first[sub_piece] + within  # the free extent each run of a piece lies in
        lo = np.maximum(a[sub_piece], fbeg[ext])
        hi = np.minimum(b[sub_piece], fend[ext])
        physical = fs[ext] + (lo - fbeg[ext])
        run = hi - lo
        sub_logical = logical[sub_piece] + (lo - a[sub_piece])
        per_file = np.bincount(owner[sub_piece], minlength=n)
        sub_off = np.zeros(n + 1, np.int64)
        np.cumsum(per_file, out=sub_off[1:])
        self.cursor = int(physical[-1] + run[-1])
        # What the next call may use: the free space after the last piece (the skips between
        # pieces stay free on disk but are not offered again until the next night).
        used = int(b[-1])
        k = int(np.searchsorted(fend, used, side="right"))
        rest_s, rest_l = fs[k:].copy(), fl[k:].copy()
        if rest_s.size and int(fbeg[k]) < used:
            cut = used - int(fbeg[k])
            rest_s[0] += cut
            rest_l[0] -= cut
        order = np.argsort(rest_s, kind="stable")
        self.set_free(rest_s[order], rest_l[order])
        return (
            sub_off,
            sub_logical.astype(np.int64),
            physical.astype(np.int64),
            run.astype(np.int64),
        )


def _free_extents(table: FileTable, blocks_total: int) -> tuple[I64, I64]:
    """The gaps between the extents of ``table``'s files: the free space, sorted."""
    start = table.ext_physical.astype(np.int64)
    length = table.ext_length.astype(np.int64)
    order = np.argsort(start, kind="stable")
    start, length = start[order], length[order]
    end = np.maximum.accumulate(start + length)
    gap_start = np.concatenate([[0], end])
    gap_end = np.concatenate([start, [blocks_total]])
    keep = gap_end > gap_start
    return gap_start[keep], gap_end[keep] - gap_start[keep]


def _new_files(
    rng: np.random.Generator,
    alloc: _Allocator,
    inos: I64,
    frag: float,
    now_ns: int,
    block: int = BLOCK,
) -> FileTable:
    n = inos.size
    size = np.minimum(rng.lognormal(9.5, 2.0, n), 2**30).astype(np.int64)
    blocks = (size + block - 1) // block
    off, logical, physical, length = alloc.place(blocks, frag)
    z32, t = np.zeros(n, np.uint32), np.full(n, now_ns, np.int64)
    return FileTable(
        ino=inos.astype(np.uint64),
        generation=rng.integers(1, 2**31, n).astype(np.uint32),
        mode=np.full(n, stat.S_IFREG | 0o644, np.uint32),
        nlink=np.ones(n, np.uint32),
        uid=z32.copy(),
        gid=z32.copy(),
        size=size.astype(np.uint64),
        atime=t.copy(),
        mtime=t.copy(),
        ctime=t.copy(),
        crtime=t.copy(),
        flags=z32.copy(),
        damaged=z32.copy(),
        ext_off=off.astype(np.uint64),
        ext_logical=logical.astype(np.uint64),
        ext_physical=physical.astype(np.uint64),
        ext_length=length.astype(np.uint64),
        ext_flags=np.zeros(length.size, np.uint32),
        meta_off=np.zeros(n + 1, np.uint64),
        meta_physical=np.zeros(0, np.uint64),
        meta_kind=np.zeros(0, np.uint8),
    )


def _dirs(ndirs: int, block: int = BLOCK) -> FileTable:
    """The root (ino 2) and ``ndirs`` directories below it (ino 3...), one block each."""
    n = ndirs + 1
    z32, z64 = np.zeros(n, np.uint32), np.zeros(n, np.int64)
    return FileTable(
        ino=np.array([2, *range(3, 3 + ndirs)], np.uint64),
        generation=z32.copy(),
        mode=np.full(n, stat.S_IFDIR | 0o755, np.uint32),
        nlink=np.full(n, 2, np.uint32),
        uid=z32.copy(),
        gid=z32.copy(),
        size=np.full(n, block, np.uint64),
        atime=z64.copy(),
        mtime=z64.copy(),
        ctime=z64.copy(),
        crtime=z64.copy(),
        flags=z32.copy(),
        damaged=z32.copy(),
        ext_off=np.arange(n + 1, dtype=np.uint64),
        ext_logical=np.zeros(n, np.uint64),
        ext_physical=np.arange(100, 100 + n, dtype=np.uint64),
        ext_length=np.ones(n, np.uint64),
        ext_flags=np.zeros(n, np.uint32),
        meta_off=np.zeros(n + 1, np.uint64),
        meta_physical=np.zeros(0, np.uint64),
        meta_kind=np.zeros(0, np.uint8),
    )


def _dir_parents(ndirs: int) -> I64:
    """The parent inode of each directory (ino 3...): the root, or with ``FANOUT`` a tree in
    which directory i holds directories ``FANOUT * (i + 1)`` to ``FANOUT * (i + 2) - 1``."""
    i = np.arange(ndirs, dtype=np.int64)
    if FANOUT <= 0:
        return np.full(ndirs, 2, np.int64)
    return np.where(i < FANOUT, 2, 3 + i // FANOUT - 1)


def _numbered(prefix: bytes, numbers: I64) -> tuple[npt.NDArray[np.uint64], bytes]:
    """The names ``prefix`` + each number in decimal, as a LinkTable holds them (offsets and
    the bytes one after the other), made without a Python object a name (a history of 45M
    files took some 150 bytes a file in lists of names and numbers)."""
    n = numbers.size
    digits = np.ones(n, np.int64)
    for k in range(1, 19):
        digits += numbers >= 10**k
    width = int(digits.max()) if n else 1
    grid = np.empty((n, len(prefix) + width), np.uint8)
    grid[:, : len(prefix)] = np.frombuffer(prefix, np.uint8)
    rest = numbers.copy()
    for col in range(len(prefix) + width - 1, len(prefix) - 1, -1):
        grid[:, col] = ord("0") + rest % 10
        rest //= 10
    # the digits are right-aligned: each row keeps its prefix and its last ``digits`` columns
    column = np.arange(grid.shape[1])
    first = len(prefix) + width - digits
    keep = (column < len(prefix))[None, :] | (column[None, :] >= first[:, None])
    off = np.zeros(n + 1, np.uint64)
    np.cumsum(len(prefix) + digits, out=off[1:])
    return off, grid[keep].tobytes()


def _layout(everything: FileTable, ndirs: int, facts: FsFacts, first_ino: int) -> Layout:
    """``everything``: the root, the ``ndirs`` directories, then the regular files."""
    fino = everything.ino[ndirs + 1 :].astype(np.int64)
    parent = 3 + ((fino - first_ino) // PER_DIR) % max(ndirs, 1)
    d_off, d_names = _numbered(b"d", np.arange(ndirs, dtype=np.int64))
    f_off, f_names = _numbered(b"f", fino)
    links = LinkTable(
        np.concatenate([_dir_parents(ndirs), parent]).astype(np.uint64),
        np.concatenate([np.arange(3, 3 + ndirs, dtype=np.int64), fino]).astype(np.uint64),
        np.concatenate([d_off, f_off[1:] + d_off[-1]]),
        d_names + f_names,
    )
    gap_start, gap_len = _free_extents(everything, facts.blocks_total)
    free = FreeExtents(gap_start.astype(np.uint64), gap_len.astype(np.uint64))
    used = int(everything.ext_length.astype(np.int64).sum())
    facts = FsFacts(**{**facts.__dict__, "blocks_free": max(facts.blocks_total - used, 0)})
    return Layout(facts=facts, files=everything, links=links, free=free)


def synthetic_history(
    store: Store,
    name: str,
    *,
    files: int,
    snapshots: int,
    seed: int,
    churn: float = 0.02,
    start: dt.datetime | None = None,
    interval: dt.timedelta = dt.timedelta(days=1),
    skip: int = 0,
    block_size: int = BLOCK,
    uuid: str | None = None,
) -> list[int]:
    """Record ``snapshots`` nightly snapshots of an aging synthetic file system; their ids.

    The first ``skip`` nights are generated but not recorded: a second call with the same
    seed and ``skip`` = the first call's ``snapshots`` continues the same history. ``uuid``
    (default: one drawn from the seed) lets several names share one device, as /, /usr and
    /usr/share of one mounted file system do."""
    rng = np.random.default_rng(seed)
    start = start or dt.datetime(2025, 1, 1, 2, 30, tzinfo=dt.UTC)
    ndirs = max(1, files // PER_DIR)
    first_ino = 3 + ndirs + 8
    dirs = _dirs(ndirs, block_size)
    alloc = _Allocator(rng, 1000 + ndirs)
    now_ns = int(start.timestamp()) * 10**9
    inos = np.arange(first_ino, first_ino + files)
    current = _new_files(rng, alloc, inos, 0.05, now_ns, block_size)
    blocks_total = int(max(alloc.cursor * 3, 1 << 16))
    facts = FsFacts(
        kind="ext4",
        uuid=uuid or str(uuidlib.UUID(int=int(rng.integers(0, 2**63)) << 64 | seed)),
        label=name,
        block_size=block_size,
        blocks_total=blocks_total,
        blocks_free=0,
        inodes_total=files * 4,
        inodes_free=files * 3,
    )
    next_ino = first_ino + files
    # The directories' rows first (their inode numbers are below every file's), held in one
    # table with the files: a night then holds at most two copies of the file system (the
    # history of 44.8M files did not fit 24 GiB with a copy for each step).
    nd = len(dirs)
    current = FileTable.concat([dirs, current])
    del dirs
    ids = []
    for night in range(snapshots):
        when = start + night * interval
        now_ns = int(when.timestamp()) * 10**9
        if night:
            frag = min(0.9, 0.05 + night / 30)
            n = len(current) - nd
            k = round(n * churn)
            gone = rng.choice(n, size=min(k, n), replace=False)
            keep = np.ones(n, bool)
            keep[gone] = False
            rewrite = np.flatnonzero(keep & (rng.random(n) < churn / 2))
            keep[rewrite] = False
            new_inos = np.arange(next_ino, next_ino + k)
            next_ino += k
            rewritten_ino = current.ino[nd + rewrite].astype(np.int64)
            rewritten_generation = current.generation[nd + rewrite]
            kept = current.take(np.concatenate([np.arange(nd), nd + np.flatnonzero(keep)]))
            del current, keep, gone, rewrite
            # deleted and rewritten files' blocks are free for tonight's files
            alloc.set_free(*_free_extents(kept, blocks_total))
            redone = _new_files(rng, alloc, rewritten_ino, frag, now_ns, block_size)
            redone.generation[:] = rewritten_generation
            born = _new_files(rng, alloc, new_inos, frag, now_ns, block_size)
            joined = FileTable.concat([kept, redone, born])
            del kept, redone, born
            current = joined.sorted_by_ino()
            del joined
        if night < skip:
            continue
        layout = _layout(current, nd - 1, facts, first_ino)
        ids.append(store.add_snapshot(layout, name=name, source=f"synthetic:{name}",
                                      taken_at=when).snapshot_id)  # fmt: skip
        del layout
    return ids
