"""How file records travel to and from SQLite: per-file digests and packed blobs.

Digests are computed for every file with numpy (no per-file Python work), so an incremental
snapshot can tell which files changed before it builds a blob for any of them.

``atime`` is stored but left out of the digest: reading a file is not a change of layout, and
counting it would store every file read since yesterday again. A rebuilt snapshot therefore
shows the atime a file had when its current version was first recorded.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from fsage.layout import FILE_COLUMNS, FileTable, LinkTable

U64 = npt.NDArray[np.uint64]

EXTENT_DTYPE = np.dtype([("l", "<u8"), ("p", "<u8"), ("n", "<u8"), ("f", "<u8")])
META_DTYPE = np.dtype([("p", "<u8"), ("k", "<u8")])
# Every inode field but the number, plus whether it is a reserved (special) inode.
INODE_FIELDS = [c for c in FILE_COLUMNS if c != "ino"]
INODE_DTYPE = np.dtype(
    [(c, np.dtype(FILE_COLUMNS[c]).newbyteorder("<")) for c in INODE_FIELDS] + [("special", "<u4")]
)

# Columns that take part in the digest (all but atime, see the module docstring).
DIGEST_COLUMNS = [c for c in FILE_COLUMNS if c not in ("ino", "atime")]

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_K = np.uint64(0x9E3779B97F4A7C15)


def _mix(x: U64) -> U64:
    """splitmix64's finaliser: a cheap, well-spread 64-bit hash of each element."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * _M1
        x = (x ^ (x >> np.uint64(27))) * _M2
        return x ^ (x >> np.uint64(31))


def _combine(h: U64, v: U64) -> U64:
    with np.errstate(over="ignore"):
        return _mix(h * _K + v)


def _segment_sums(values: U64, off: U64) -> U64:
    """Sum of ``values[off[i]:off[i+1]]`` for each i (0 for empty segments), wrapping mod 2**64."""
    n = len(off) - 1
    out = np.zeros(n, np.uint64)
    if values.size == 0 or n == 0:
        return out
    starts = off[:-1].astype(np.int64)
    nonempty = np.diff(off) > 0
    with np.errstate(over="ignore"):
        out[nonempty] = np.add.reduceat(values, starts[nonempty])
    return out


def link_order(files: FileTable, links: LinkTable) -> tuple[npt.NDArray[np.int64], U64]:
    """Links sorted by owning file, and CSR offsets of each file's links.

    Links whose inode is not among ``files`` (entries pointing at free inodes) are dropped.
    """
    order = np.lexsort((links.parent, links.ino))
    ino_sorted = links.ino[order]
    pos = np.searchsorted(files.ino, ino_sorted)
    pos_clipped = np.minimum(pos, max(len(files) - 1, 0))
    known = (pos < len(files)) & (files.ino[pos_clipped] == ino_sorted) if len(files) else pos < 0
    order = order[known]
    counts = np.bincount(pos[known], minlength=len(files)).astype(np.uint64)
    off = np.zeros(len(files) + 1, np.uint64)
    np.cumsum(counts, out=off[1:])
    return order.astype(np.int64), off


def _name_hashes(links: LinkTable) -> U64:
    """A polynomial hash of each name, vectorised over the name bytes."""
    n = len(links)
    if n == 0:
        return np.zeros(0, np.uint64)
    raw = np.frombuffer(links.names, np.uint8).astype(np.uint64)
    lengths = np.diff(links.name_off).astype(np.int64)
    if raw.size == 0:
        return np.zeros(n, np.uint64)
    pos = np.arange(raw.size, dtype=np.int64) - np.repeat(
        links.name_off[:-1].astype(np.int64), lengths
    )
    maxlen = int(lengths.max())
    powers = np.ones(maxlen + 1, np.uint64)
    with np.errstate(over="ignore"):
        for i in range(1, maxlen + 1):
            powers[i] = powers[i - 1] * np.uint64(1099511628211)
        terms = (raw + np.uint64(1)) * powers[pos]
    return _mix(_segment_sums(terms, links.name_off) + lengths.astype(np.uint64))


def file_digests(
    files: FileTable, links: LinkTable, order: npt.NDArray[np.int64], link_off: U64
) -> U64:
    h = _mix(files.ino.astype(np.uint64))
    for col in DIGEST_COLUMNS:
        h = _combine(h, getattr(files, col).astype(np.uint64))
    ext = _combine(
        _combine(_combine(_mix(files.ext_logical), files.ext_physical), files.ext_length),
        files.ext_flags.astype(np.uint64),
    )
    h = _combine(h, _segment_sums(ext, files.ext_off))
    h = _combine(h, np.diff(files.ext_off))
    meta = _combine(_mix(files.meta_physical), files.meta_kind.astype(np.uint64))
    h = _combine(h, _segment_sums(meta, files.meta_off))
    names = _combine(_name_hashes(links)[order], links.parent[order])
    h = _combine(h, _segment_sums(names, link_off))
    return h


def extent_blobs(files: FileTable, rows: Sequence[int]) -> list[bytes]:
    packed = np.empty(files.ext_logical.size, EXTENT_DTYPE)
    packed["l"], packed["p"], packed["n"], packed["f"] = (
        files.ext_logical,
        files.ext_physical,
        files.ext_length,
        files.ext_flags,
    )
    raw = packed.tobytes()
    size = EXTENT_DTYPE.itemsize
    off = files.ext_off.tolist()
    return [raw[off[i] * size : off[i + 1] * size] for i in rows]


def meta_blobs(files: FileTable, rows: Sequence[int]) -> list[bytes]:
    packed = np.empty(files.meta_physical.size, META_DTYPE)
    packed["p"], packed["k"] = files.meta_physical, files.meta_kind
    raw = packed.tobytes()
    size = META_DTYPE.itemsize
    off = files.meta_off.tolist()
    return [raw[off[i] * size : off[i + 1] * size] for i in rows]


def inode_blobs(
    files: FileTable, special: npt.NDArray[np.bool_], rows: npt.NDArray[np.int64]
) -> list[bytes]:
    packed = np.empty(len(rows), INODE_DTYPE)
    for c in INODE_FIELDS:
        packed[c] = getattr(files, c)[rows]
    packed["special"] = special[rows]
    raw = packed.tobytes()
    size = INODE_DTYPE.itemsize
    return [raw[i : i + size] for i in range(0, len(raw), size)]


def link_blobs(
    links: LinkTable, order: npt.NDArray[np.int64], link_off: U64, rows: Sequence[int]
) -> tuple[list[bytes], list[bytes]]:
    """Per file: its links' parent inodes (u64) and their names, each ended by a NUL
    (names in every supported file system exclude NUL)."""
    parents = links.parent[order].astype("<u8").tobytes()
    name_off = links.name_off.tolist()
    names = links.names
    joined = b"".join(names[name_off[k] : name_off[k + 1]] + b"\0" for k in order.tolist())
    lengths = np.diff(links.name_off)[order] + np.uint64(1)
    byte_off = np.zeros(len(order) + 1, np.uint64)
    np.cumsum(lengths, out=byte_off[1:])
    off = link_off.tolist()
    boff = byte_off.tolist()
    out_parents = [parents[off[i] * 8 : off[i + 1] * 8] for i in rows]
    out_names = [joined[boff[off[i]] : boff[off[i + 1]]] for i in rows]
    return out_parents, out_names


def unpack_extents(blobs: Sequence[bytes]) -> tuple[U64, npt.NDArray[np.void]]:
    counts = np.fromiter((len(b) for b in blobs), np.uint64, len(blobs)) // np.uint64(
        EXTENT_DTYPE.itemsize
    )
    off = np.zeros(len(blobs) + 1, np.uint64)
    np.cumsum(counts, out=off[1:])
    return off, np.frombuffer(b"".join(blobs), EXTENT_DTYPE)


def unpack_meta(blobs: Sequence[bytes]) -> tuple[U64, npt.NDArray[np.void]]:
    counts = np.fromiter((len(b) for b in blobs), np.uint64, len(blobs)) // np.uint64(
        META_DTYPE.itemsize
    )
    off = np.zeros(len(blobs) + 1, np.uint64)
    np.cumsum(counts, out=off[1:])
    return off, np.frombuffer(b"".join(blobs), META_DTYPE)


def unpack_inodes(blobs: Sequence[bytes]) -> npt.NDArray[np.void]:
    return np.frombuffer(b"".join(blobs), INODE_DTYPE)


def unpack_links(
    inos: npt.NDArray[np.uint64], parents: Sequence[bytes], names: Sequence[bytes]
) -> LinkTable:
    counts = np.fromiter((len(p) for p in parents), np.int64, len(parents)) // 8
    parent = np.frombuffer(b"".join(parents), "<u8").astype(np.uint64)
    joined = b"".join(names)
    split = joined.split(b"\0")[:-1] if joined else []
    lengths = np.fromiter((len(n) for n in split), np.uint64, len(split))
    name_off = np.zeros(len(split) + 1, np.uint64)
    np.cumsum(lengths, out=name_off[1:])
    return LinkTable(
        parent=parent,
        ino=np.repeat(inos, counts).astype(np.uint64),
        name_off=name_off,
        names=joined.replace(b"\0", b""),
    )
