"""The Layout model: what every reader yields and what the store records.

A Layout is columnar. Per-file columns are numpy arrays of equal length; a file's extents and
metadata blocks live in shared arrays addressed by CSR offsets (file ``i`` owns extents
``ext_off[i]:ext_off[i+1]``). Names are a separate link table (parent, ino, name) because a
file can have several (hard links); paths are derived from it once, never looked up per inode.

Units: block numbers and lengths are in file-system blocks of ``facts.block_size``; times are
integer nanoseconds since the epoch; sizes are bytes.
"""

from __future__ import annotations

import itertools
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import numpy.typing as npt

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]
U32 = npt.NDArray[np.uint32]
U8 = npt.NDArray[np.uint8]

# Extent flags (bit set), shared by every reader.
EXTENT_UNWRITTEN = 1  # allocated but not written (ext4 uninit, FIEMAP unwritten)
EXTENT_DELALLOC = 2
EXTENT_INLINE = 4  # data lives in the inode / metadata, not in its own blocks
EXTENT_SHARED = 8  # reflinked / snapshotted
EXTENT_ENCODED = 16  # compressed or encrypted
EXTENT_FLAG_NAMES = {
    EXTENT_UNWRITTEN: "unwritten",
    EXTENT_DELALLOC: "delalloc",
    EXTENT_INLINE: "inline",
    EXTENT_SHARED: "shared",
    EXTENT_ENCODED: "encoded",
}

# Metadata block kinds.
META_EXTENT_NODE = 1  # an extent-tree index or leaf block below the inode
META_IND = 2  # single indirect block
META_DIND = 3  # double indirect block
META_TIND = 4  # triple indirect block
META_XATTR = 5  # extended-attribute block
META_KIND_NAMES = {
    META_EXTENT_NODE: "extent-node",
    META_IND: "indirect",
    META_DIND: "double-indirect",
    META_TIND: "triple-indirect",
    META_XATTR: "xattr",
}

# Damage bits recorded per file; the scan records them and goes on.
DAMAGE_INODE_CHECKSUM = 1
DAMAGE_GARBAGE_INODE = 2
DAMAGE_EXTENT_TREE = 4
DAMAGE_BLOCK_MAP = 8
DAMAGE_BLOCK_OUT_OF_RANGE = 16
DAMAGE_DIRECTORY = 32
DAMAGE_BLOCK_COUNT = 64  # the inode's block count disagrees with the blocks it maps
DAMAGE_CROSS_LINKED = 128  # a block it maps is mapped by another inode too
DAMAGE_NAMES = {
    DAMAGE_INODE_CHECKSUM: "inode-checksum",
    DAMAGE_GARBAGE_INODE: "garbage-inode",
    DAMAGE_EXTENT_TREE: "extent-tree",
    DAMAGE_BLOCK_MAP: "block-map",
    DAMAGE_BLOCK_OUT_OF_RANGE: "block-out-of-range",
    DAMAGE_DIRECTORY: "directory",
    DAMAGE_BLOCK_COUNT: "block-count",
    DAMAGE_CROSS_LINKED: "cross-linked",
}


@dataclass
class FsFacts:
    """File-system level facts; ``mkfs`` holds what is needed to make an identical empty fs."""

    kind: str  # "ext2", "ext3", "ext4", "lfs", "live:xfs", ...
    uuid: str
    label: str
    block_size: int
    blocks_total: int
    blocks_free: int
    inodes_total: int = 0
    inodes_free: int = 0
    first_data_block: int = 0
    features: list[str] = field(default_factory=list)
    # One row per allocation group / segment: {"start", "length", ...reader-specific keys}.
    groups: list[dict[str, int]] = field(default_factory=list)
    mkfs: dict[str, Any] = field(default_factory=dict)
    times: dict[str, int] = field(default_factory=dict)  # seconds since the epoch
    extra: dict[str, Any] = field(default_factory=dict)
    # False where the reader could not see free space (e.g. live reader without GETFSMAP).
    free_space_known: bool = True

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FsFacts:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


FILE_COLUMNS: dict[str, type[np.generic]] = {
    "ino": np.uint64,
    "generation": np.uint32,
    "mode": np.uint32,
    "nlink": np.uint32,
    "uid": np.uint32,
    "gid": np.uint32,
    "size": np.uint64,
    "atime": np.int64,
    "mtime": np.int64,
    "ctime": np.int64,
    "crtime": np.int64,
    "flags": np.uint32,
    "damaged": np.uint32,
}


@dataclass
class FileTable:
    """Columnar file records with their extents and metadata blocks."""

    ino: U64
    generation: U32
    mode: U32
    nlink: U32
    uid: U32
    gid: U32
    size: U64
    atime: I64
    mtime: I64
    ctime: I64
    crtime: I64
    flags: U32
    damaged: U32
    ext_off: U64  # len n+1
    ext_logical: U64
    ext_physical: U64
    ext_length: U64
    ext_flags: U32
    meta_off: U64  # len n+1
    meta_physical: U64
    meta_kind: U8

    @classmethod
    def empty(cls) -> FileTable:
        cols: dict[str, Any] = {k: np.zeros(0, dtype=t) for k, t in FILE_COLUMNS.items()}
        return cls(
            **cols,
            ext_off=np.zeros(1, np.uint64),
            ext_logical=np.zeros(0, np.uint64),
            ext_physical=np.zeros(0, np.uint64),
            ext_length=np.zeros(0, np.uint64),
            ext_flags=np.zeros(0, np.uint32),
            meta_off=np.zeros(1, np.uint64),
            meta_physical=np.zeros(0, np.uint64),
            meta_kind=np.zeros(0, np.uint8),
        )

    def __len__(self) -> int:
        return int(self.ino.shape[0])

    @property
    def extent_counts(self) -> U64:
        return np.diff(self.ext_off)

    @property
    def data_blocks(self) -> U64:
        """Allocated data blocks per file (sum of extent lengths; holes excluded)."""
        out = np.zeros(len(self), np.uint64)
        if self.ext_length.size:
            owner = np.repeat(np.arange(len(self)), self.extent_counts.astype(np.int64))
            np.add.at(out, owner, self.ext_length)
        return out

    def is_regular(self) -> npt.NDArray[np.bool_]:
        return np.asarray((self.mode & 0o170000) == stat.S_IFREG, dtype=bool)

    def is_dir(self) -> npt.NDArray[np.bool_]:
        return np.asarray((self.mode & 0o170000) == stat.S_IFDIR, dtype=bool)

    def extents_of(self, i: int) -> npt.NDArray[np.uint64]:
        """Extents of file ``i`` as an (n, 4) array: logical, physical, length, flags."""
        a, b = int(self.ext_off[i]), int(self.ext_off[i + 1])
        return np.stack(
            [
                self.ext_logical[a:b],
                self.ext_physical[a:b],
                self.ext_length[a:b],
                self.ext_flags[a:b].astype(np.uint64),
            ],
            axis=1,
        )

    def take(self, index: npt.NDArray[np.int64]) -> FileTable:
        """A new table with the files at ``index`` (in that order)."""
        index = np.asarray(index, dtype=np.int64)
        cols: dict[str, Any] = {k: getattr(self, k)[index] for k in FILE_COLUMNS}
        ext_idx, ext_off = csr_take(self.ext_off, index)
        meta_idx, meta_off = csr_take(self.meta_off, index)
        return FileTable(
            **cols,
            ext_off=ext_off,
            ext_logical=self.ext_logical[ext_idx],
            ext_physical=self.ext_physical[ext_idx],
            ext_length=self.ext_length[ext_idx],
            ext_flags=self.ext_flags[ext_idx],
            meta_off=meta_off,
            meta_physical=self.meta_physical[meta_idx],
            meta_kind=self.meta_kind[meta_idx],
        )

    def reorder_head(self, order: npt.NDArray[np.int64]) -> None:
        """Put the first ``len(order)`` rows in that order, in place (the rest stay put)."""
        head = len(order)
        for k in FILE_COLUMNS:
            col = getattr(self, k)
            col[:head] = col[:head][order]
        for off_name, children in (
            ("ext_off", ("ext_logical", "ext_physical", "ext_length", "ext_flags")),
            ("meta_off", ("meta_physical", "meta_kind")),
        ):
            off = getattr(self, off_name)
            idx, new_off = csr_take(off[: head + 1], order)
            for name in children:
                col = getattr(self, name)
                col[: idx.size] = col[idx]
            off[: head + 1] = new_off

    def slice(self, start: int, stop: int) -> FileTable:
        """Rows ``start:stop`` as views of this table's arrays (no copy)."""
        cols: dict[str, Any] = {k: getattr(self, k)[start:stop] for k in FILE_COLUMNS}
        e0, e1 = int(self.ext_off[start]), int(self.ext_off[stop])
        m0, m1 = int(self.meta_off[start]), int(self.meta_off[stop])
        return FileTable(
            **cols,
            ext_off=self.ext_off[start : stop + 1] - np.uint64(e0),
            ext_logical=self.ext_logical[e0:e1],
            ext_physical=self.ext_physical[e0:e1],
            ext_length=self.ext_length[e0:e1],
            ext_flags=self.ext_flags[e0:e1],
            meta_off=self.meta_off[start : stop + 1] - np.uint64(m0),
            meta_physical=self.meta_physical[m0:m1],
            meta_kind=self.meta_kind[m0:m1],
        )

    @staticmethod
    def concat(tables: Sequence[FileTable]) -> FileTable:
        if not tables:
            return FileTable.empty()
        if len(tables) == 1:
            return tables[0]
        if len(tables) == 2:
            joined = FileTable._join_adjacent(tables[0], tables[1])
            if joined is not None:
                return joined
        cols: dict[str, Any] = {
            k: np.concatenate([getattr(t, k) for t in tables]) for k in FILE_COLUMNS
        }
        return FileTable(
            **cols,
            ext_off=concat_offsets([t.ext_off for t in tables]),
            ext_logical=np.concatenate([t.ext_logical for t in tables]),
            ext_physical=np.concatenate([t.ext_physical for t in tables]),
            ext_length=np.concatenate([t.ext_length for t in tables]),
            ext_flags=np.concatenate([t.ext_flags for t in tables]),
            meta_off=concat_offsets([t.meta_off for t in tables]),
            meta_physical=np.concatenate([t.meta_physical for t in tables]),
            meta_kind=np.concatenate([t.meta_kind for t in tables]),
        )

    @staticmethod
    def _join_adjacent(a: FileTable, b: FileTable) -> FileTable | None:
        """``a`` then ``b`` without a copy, when they are consecutive slices of one table."""
        cols: dict[str, Any] = {}
        for f in fields(FileTable):
            if f.name in ("ext_off", "meta_off"):
                continue
            view = _adjacent_view(getattr(a, f.name), getattr(b, f.name))
            if view is None:
                return None
            cols[f.name] = view
        return FileTable(
            **cols,
            ext_off=concat_offsets([a.ext_off, b.ext_off]),
            meta_off=concat_offsets([a.meta_off, b.meta_off]),
        )

    def sorted_by_ino(self) -> FileTable:
        order = np.argsort(self.ino, kind="stable")
        if np.all(order == np.arange(len(self))):
            return self
        return self.take(order)


@dataclass
class LinkTable:
    """Directory entries: ``ino`` is named ``name`` inside directory ``parent``."""

    parent: U64
    ino: U64
    name_off: U64  # len n+1, offsets into ``names``
    names: bytes

    @classmethod
    def empty(cls) -> LinkTable:
        return cls(np.zeros(0, np.uint64), np.zeros(0, np.uint64), np.zeros(1, np.uint64), b"")

    def __len__(self) -> int:
        return int(self.ino.shape[0])

    def name(self, i: int) -> bytes:
        return self.names[int(self.name_off[i]) : int(self.name_off[i + 1])]

    def iter_names(self) -> Iterator[bytes]:
        off = self.name_off.tolist()
        names = self.names
        for a, b in itertools.pairwise(off):
            yield names[a:b]

    def decoded(self, encoding: str = "utf-8", errors: str = "surrogateescape") -> list[str]:
        """Every name as text, decoded in one pass: a ``/`` (which no name holds) is put
        after each name, the bytes are decoded once and split there. An undecodable byte is
        escaped on its own either way, so each name decodes as it would alone. (``latin-1``
        gives text that sorts as the bytes do.)"""
        n = len(self)
        if n == 0:
            return []
        raw = np.frombuffer(self.names, np.uint8)
        sep_at = self.name_off[1:].astype(np.int64) + np.arange(n, dtype=np.int64)
        buf = np.full(raw.size + n, ord("/"), np.uint8)
        keep = np.ones(buf.size, bool)
        keep[sep_at] = False
        buf[keep] = raw
        return buf.tobytes().decode(encoding, errors).split("/")[:n]

    @staticmethod
    def from_lists(parent: Sequence[int], ino: Sequence[int], names: Sequence[bytes]) -> LinkTable:
        lengths = np.fromiter((len(n) for n in names), np.uint64, len(names))
        off = np.zeros(len(names) + 1, np.uint64)
        np.cumsum(lengths, out=off[1:])
        return LinkTable(
            np.asarray(parent, np.uint64), np.asarray(ino, np.uint64), off, b"".join(names)
        )

    def take(self, index: npt.NDArray[np.int64]) -> LinkTable:
        index = np.asarray(index, np.int64)
        names = [self.name(int(i)) for i in index]
        return LinkTable.from_lists(self.parent[index].tolist(), self.ino[index].tolist(), names)


@dataclass
class FreeExtents:
    start: U64
    length: U64

    @classmethod
    def empty(cls) -> FreeExtents:
        return cls(np.zeros(0, np.uint64), np.zeros(0, np.uint64))

    def __len__(self) -> int:
        return int(self.start.shape[0])

    @property
    def blocks(self) -> int:
        return int(self.length.sum())


@dataclass
class Layout:
    """Everything one reader saw of one file system at one moment."""

    facts: FsFacts
    files: FileTable  # user-visible inodes (root directory included), sorted by ino
    links: LinkTable
    free: FreeExtents
    special: FileTable = field(default_factory=FileTable.empty)  # reserved inodes (journal...)
    root_ino: int = 2
    # Reader notes (things skipped, unreadable paths...) for the summary line.
    notes: list[str] = field(default_factory=list)

    def paths(self) -> dict[int, list[str]]:
        """All paths of every named inode, from the root, starting with '/'."""
        return derive_paths(self.links, self.root_ino)

    @property
    def blocks_free(self) -> int:
        """Free blocks, one value wherever fsage shows them: the free map's where the reader
        has one (the free-extent histogram sums to it), else the reader's own count (kept in
        ``facts.blocks_free``: a superblock's, or statvfs's, which takes ext4's preallocations
        for files being written as free)."""
        if self.facts.free_space_known:
            return int(self.free.blocks)
        return int(self.facts.blocks_free)

    @property
    def damaged_files(self) -> int:
        return int(np.count_nonzero(self.files.damaged)) + int(
            np.count_nonzero(self.special.damaged)
        )


def derive_paths(links: LinkTable, root_ino: int) -> dict[int, list[str]]:
    """Map ino -> sorted list of its paths, resolving each directory once.

    Names are decoded with surrogateescape so that arbitrary bytes survive a round trip.
    Entries unreachable from the root (orphaned subtrees, loops in a damaged tree) get no path.
    """
    children: dict[int, list[tuple[int, str]]] = {}
    off = links.name_off.tolist()
    raw = links.names
    rows = zip(links.parent.tolist(), links.ino.tolist(), itertools.pairwise(off), strict=True)
    for parent, ino, (a, b) in rows:
        name = raw[a:b].decode("utf-8", "surrogateescape")
        children.setdefault(parent, []).append((ino, name))
    out: dict[int, list[str]] = {root_ino: ["/"]}
    stack = [(root_ino, "")]
    visited = {root_ino}
    while stack:
        dir_ino, prefix = stack.pop()
        for ino, name in children.get(dir_ino, ()):
            path = f"{prefix}/{name}"
            out.setdefault(ino, []).append(path)
            if ino in children and ino not in visited:
                visited.add(ino)
                stack.append((ino, path))
    for paths in out.values():
        paths.sort()
    return out


def _adjacent_view(a: npt.NDArray[Any], b: npt.NDArray[Any]) -> npt.NDArray[Any] | None:
    """One view of ``a`` followed by ``b`` when both are consecutive slices of one 1-D array."""
    if len(a) == 0 and a.dtype == b.dtype:
        return b
    if len(b) == 0 and a.dtype == b.dtype:
        return a
    base = a.base
    if not isinstance(base, np.ndarray) or b.base is not base or base.ndim != 1:
        return None
    if a.dtype != base.dtype or b.dtype != base.dtype:
        return None
    if not (a.flags.c_contiguous and b.flags.c_contiguous):
        return None
    start_a = a.__array_interface__["data"][0]
    start_b = b.__array_interface__["data"][0]
    if start_a + a.nbytes != start_b:
        return None
    first = (start_a - base.__array_interface__["data"][0]) // base.itemsize
    return base[first : first + len(a) + len(b)]


def concat_offsets(offs: Sequence[U64]) -> U64:
    parts = [offs[0]]
    base = offs[0][-1]
    for o in offs[1:]:
        parts.append(o[1:] + base)
        base = base + o[-1]
    return np.concatenate(parts).astype(np.uint64)


def csr_take(off: U64, index: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.int64], U64]:
    """Indices into the child array and new offsets for taking rows ``index`` of a CSR."""
    starts = off[:-1][index].astype(np.int64)
    counts = (off[1:][index] - off[:-1][index]).astype(np.int64)
    new_off = np.zeros(len(index) + 1, np.uint64)
    np.cumsum(counts, out=new_off[1:])
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, np.int64), new_off
    # For each child slot, its row's start plus its position within the row.
    row_of_slot = np.repeat(np.arange(len(index)), counts)
    pos = np.arange(total, dtype=np.int64) - new_off[:-1].astype(np.int64)[row_of_slot]
    return starts[row_of_slot] + pos, new_off
