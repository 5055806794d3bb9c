"""How file records travel to and from SQLite: per-file digests and version chunks.

A version chunk holds the versions of files one snapshot recorded, column by column: one blob
per column (keys, inode fields, extents, metadata blocks, names), packed and unpacked by numpy
with no per-file Python work.

Digests are computed for every file with numpy (no per-file Python work), so an incremental
snapshot can tell which files changed before it builds a blob for any of them.

``atime`` is stored but left out of the digest: reading a file is not a change of layout, and
counting it would store every file read since yesterday again. A rebuilt snapshot therefore
shows the atime a file had when its current version was first recorded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from fsage import _ext2fs
from fsage.layout import FILE_COLUMNS, FileTable, LinkTable, concat_offsets

U64 = npt.NDArray[np.uint64]

EXTENT_DTYPE = np.dtype([("l", "<u8"), ("p", "<u8"), ("n", "<u8"), ("f", "<u4")])
META_DTYPE = np.dtype([("p", "<u8"), ("k", "u1")])
# What tells versions apart when a snapshot is compared with the current state.
KEY_DTYPE = np.dtype([("ino", "<u8"), ("generation", "<u4"), ("digest", "<i8")])
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


def link_files(files: FileTable, links: LinkTable) -> npt.NDArray[np.int64]:
    """The row in ``files`` (sorted by ino) of each link's inode; -1 where no file has it
    (an entry pointing at a free inode)."""
    pos = np.searchsorted(files.ino, links.ino)
    if len(files) == 0:
        return np.full(len(links), -1, np.int64)
    clipped = np.minimum(pos, len(files) - 1)
    return np.where(files.ino[clipped] == links.ino, clipped, -1).astype(np.int64)


def file_digests(files: FileTable, links: LinkTable, link_file: npt.NDArray[np.int64]) -> U64:
    """One 64-bit digest per file (see the module docstring), computed in C."""
    cols = [files.ino.astype(np.uint64)]
    cols += [np.ascontiguousarray(getattr(files, c), dtype=np.uint64) for c in DIGEST_COLUMNS]
    raw = _ext2fs.file_digests(
        cols,
        files.ext_off.astype(np.uint64),
        files.ext_logical.astype(np.uint64),
        files.ext_physical.astype(np.uint64),
        files.ext_length.astype(np.uint64),
        files.ext_flags.astype(np.uint64),
        files.meta_off.astype(np.uint64),
        files.meta_physical.astype(np.uint64),
        files.meta_kind.astype(np.uint64),
        link_file.astype(np.uint64),
        links.parent.astype(np.uint64),
        links.name_off.astype(np.uint64),
        links.names,
    )
    return np.frombuffer(raw, np.uint64)


def file_digests_numpy(
    files: FileTable, links: LinkTable, order: npt.NDArray[np.int64], link_off: U64
) -> U64:
    """The digest's definition in numpy (the C version must agree; the tests check it)."""
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


CHUNK_COLUMNS = (
    "keys",  # KEY_DTYPE per version, in ino order
    "inodes",  # INODE_DTYPE per version
    "ext_counts",  # u32 extents per version
    "extents",  # EXTENT_DTYPE rows
    "meta_counts",  # u32 metadata blocks per version
    "meta",  # META_DTYPE rows
    "link_rows",  # u32 per name: the version (row of the chunk) it names
    "link_parents",  # u64 directory inode of each name
    "name_lens",  # u16 length of each name
    "names",  # the names' bytes, back to back
)


def _offsets(counts: npt.NDArray[np.integer[Any]]) -> U64:
    off = np.zeros(len(counts) + 1, np.uint64)
    np.cumsum(counts, out=off[1:])
    return off


def _select_links(
    links: LinkTable, link_row: npt.NDArray[np.int64], keep: npt.NDArray[np.bool_]
) -> tuple[LinkTable, npt.NDArray[np.int64]]:
    """The links flagged ``keep``, with their rows."""
    if keep.all():
        return links, link_row
    lengths = np.diff(links.name_off).astype(np.int64)
    raw = np.frombuffer(links.names, np.uint8)[np.repeat(keep, lengths)]
    kept = LinkTable(
        parent=links.parent[keep],
        ino=links.ino[keep],
        name_off=_offsets(lengths[keep]),
        names=raw.tobytes(),
    )
    return kept, link_row[keep]


def _renumber(
    n: int, rows: npt.NDArray[np.int64], link_row: npt.NDArray[np.int64]
) -> npt.NDArray[np.int64]:
    """Each link's row after taking ``rows`` of ``n`` (-1: its file was not taken)."""
    new = np.full(n + 1, -1, np.int64)  # the extra slot maps -1 to -1
    new[rows] = np.arange(len(rows), dtype=np.int64)
    return new[link_row]


def pack_chunk(
    files: FileTable,
    special: npt.NDArray[np.bool_],
    digests: npt.NDArray[np.int64],
    links: LinkTable,
    link_file: npt.NDArray[np.int64],
    rows: npt.NDArray[np.int64] | None = None,
) -> dict[str, bytes]:
    """The chunk blobs of ``rows`` of ``files`` (all of them when None), which must be in ino
    order; ``link_file`` comes from ``link_files()``."""
    link_row = link_file
    if rows is not None:
        link_row = _renumber(len(files), rows, link_file)
        files, special, digests = files.take(rows), special[rows], digests[rows]
    links, link_row = _select_links(links, link_row, link_row >= 0)
    keys = np.empty(len(files), KEY_DTYPE)
    keys["ino"], keys["generation"], keys["digest"] = files.ino, files.generation, digests
    inodes = np.empty(len(files), INODE_DTYPE)
    for c in INODE_FIELDS:
        inodes[c] = getattr(files, c)
    inodes["special"] = special
    ext = np.empty(files.ext_logical.size, EXTENT_DTYPE)
    ext["l"], ext["p"], ext["n"], ext["f"] = (
        files.ext_logical,
        files.ext_physical,
        files.ext_length,
        files.ext_flags,
    )
    meta = np.empty(files.meta_physical.size, META_DTYPE)
    meta["p"], meta["k"] = files.meta_physical, files.meta_kind
    return {
        "keys": keys.tobytes(),
        "inodes": inodes.tobytes(),
        "ext_counts": np.diff(files.ext_off).astype("<u4").tobytes(),
        "extents": ext.tobytes(),
        "meta_counts": np.diff(files.meta_off).astype("<u4").tobytes(),
        "meta": meta.tobytes(),
        "link_rows": link_row.astype("<u4").tobytes(),
        "link_parents": links.parent.astype("<u8").tobytes(),
        "name_lens": np.diff(links.name_off).astype("<u2").tobytes(),
        "names": links.names,
    }


def chunk_keys(blob: bytes) -> npt.NDArray[np.void]:
    return np.frombuffer(blob, KEY_DTYPE)


@dataclass
class Versions:
    """Unpacked file versions: the files (reserved inodes flagged) and their names, each
    name with the row of the file it names."""

    files: FileTable
    special: npt.NDArray[np.bool_]
    link_row: npt.NDArray[np.int64]
    links: LinkTable

    def take(self, rows: npt.NDArray[np.int64]) -> Versions:
        link_row = _renumber(len(self.files), rows, self.link_row)
        links, link_row = _select_links(self.links, link_row, link_row >= 0)
        return Versions(self.files.take(rows), self.special[rows], link_row, links)


def unpack_chunk(blobs: dict[str, bytes]) -> Versions:
    keys = chunk_keys(blobs["keys"])
    inodes = np.frombuffer(blobs["inodes"], INODE_DTYPE)
    ext = np.frombuffer(blobs["extents"], EXTENT_DTYPE)
    meta = np.frombuffer(blobs["meta"], META_DTYPE)
    ino = keys["ino"].astype(np.uint64)
    values = {c: inodes[c].astype(FILE_COLUMNS[c]) for c in INODE_FIELDS}
    files = FileTable(
        ino=ino,
        **values,
        ext_off=_offsets(np.frombuffer(blobs["ext_counts"], "<u4")),
        ext_logical=ext["l"].astype(np.uint64),
        ext_physical=ext["p"].astype(np.uint64),
        ext_length=ext["n"].astype(np.uint64),
        ext_flags=ext["f"].astype(np.uint32),
        meta_off=_offsets(np.frombuffer(blobs["meta_counts"], "<u4")),
        meta_physical=meta["p"].astype(np.uint64),
        meta_kind=meta["k"].astype(np.uint8),
    )
    link_row = np.frombuffer(blobs["link_rows"], "<u4").astype(np.int64)
    links = LinkTable(
        parent=np.frombuffer(blobs["link_parents"], "<u8").astype(np.uint64),
        ino=ino[link_row],
        name_off=_offsets(np.frombuffer(blobs["name_lens"], "<u2")),
        names=blobs["names"],
    )
    return Versions(files, inodes["special"].astype(bool), link_row, links)


def concat_versions(parts: list[Versions]) -> Versions:
    if not parts:
        return Versions(
            FileTable.empty(), np.zeros(0, bool), np.zeros(0, np.int64), LinkTable.empty()
        )
    if len(parts) == 1:
        return parts[0]
    links = [p.links for p in parts]
    base = np.cumsum([0] + [len(p.files) for p in parts[:-1]])
    return Versions(
        FileTable.concat([p.files for p in parts]),
        np.concatenate([p.special for p in parts]),
        np.concatenate([p.link_row + b for p, b in zip(parts, base, strict=True)]),
        LinkTable(
            parent=np.concatenate([x.parent for x in links]),
            ino=np.concatenate([x.ino for x in links]),
            name_off=concat_offsets([x.name_off for x in links]),
            names=b"".join(x.names for x in links),
        ),
    )
