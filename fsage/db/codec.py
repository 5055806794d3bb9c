"""How file records travel to and from SQLite: per-file digests and version chunks.

A version chunk holds the versions of files one snapshot recorded, column by column (inode
fields, extents, metadata blocks, names), each column narrowed to the bytes its values need
(``fsage/_columns.c``), with no per-file Python work.

Digests are computed for every file in one C pass (``file_digests_numpy`` defines them), so an
incremental snapshot can tell which files changed before it packs any of them.

``atime`` is stored but left out of the digest: reading a file is not a change of layout, and
counting it would store every file read since yesterday again. A rebuilt snapshot therefore
shows the atime a file had when its current version was first recorded.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from fsage import _ext2fs
from fsage.db.checksum import DamagedError
from fsage.layout import FILE_COLUMNS, FileTable, LinkTable, concat_offsets

U64 = npt.NDArray[np.uint64]

# Every inode field but the number.
INODE_FIELDS = [c for c in FILE_COLUMNS if c != "ino"]

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
    """Links grouped by owning file (in the order of ``files``), and CSR offsets of each file's
    links.

    Links whose inode is not among ``files`` (entries pointing at free inodes) are dropped.
    """
    row = link_files(files, links)
    known = np.flatnonzero(row >= 0)
    order = known[np.lexsort((links.parent[known], row[known]))]
    counts = np.bincount(row[known], minlength=len(files)).astype(np.uint64)
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
    """The row in ``files`` (any order, inode numbers unique) of each link's inode; -1 where
    no file has it (an entry pointing at a free inode)."""
    if len(files) == 0:
        return np.full(len(links), -1, np.int64)
    top = int(files.ino.max())
    if top <= 4 * len(files) + 4096:
        # Dense inode numbers (ext4 and the like): a table indexed by inode, where a binary
        # search per link would miss the cache on every step (0.08 s for 500k links).
        table = np.full(top + 2, -1, np.int64)
        table[files.ino] = np.arange(len(files), dtype=np.int64)
        return table[np.minimum(links.ino, np.uint64(top + 1))]
    order = np.argsort(files.ino, kind="stable")  # fast: nearly sorted
    pos = np.searchsorted(files.ino, links.ino, sorter=order)
    clipped = order[np.minimum(pos, len(files) - 1)]
    return np.where(files.ino[clipped] == links.ino, clipped, -1).astype(np.int64)


def _u64(values: npt.NDArray[Any]) -> U64:
    """The values as a contiguous u64 array; 8-byte integers are viewed, not copied."""
    if values.dtype.itemsize == 8:
        return np.ascontiguousarray(values).view(np.uint64)
    return values.astype(np.uint64)


def _u32_or_u64(values: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """The values as the C digest reads them: 4- and 8-byte integers as they are (it widens
    them as astype(uint64) would), others widened to u64."""
    if values.dtype.itemsize in (4, 8):
        return np.ascontiguousarray(values)
    return values.astype(np.uint64)


def file_digests(files: FileTable, links: LinkTable, link_file: npt.NDArray[np.int64]) -> U64:
    """One 64-bit digest per file (see the module docstring), computed in C."""
    raw = _ext2fs.file_digests(
        [_u64(files.ino)] + [_u32_or_u64(getattr(files, c)) for c in DIGEST_COLUMNS],
        _u64(files.ext_off),
        _u64(files.ext_logical),
        _u64(files.ext_physical),
        _u64(files.ext_length),
        _u32_or_u64(files.ext_flags),
        _u64(files.meta_off),
        _u64(files.meta_physical),
        _u64(files.meta_kind),
        _u64(link_file),
        _u64(links.parent),
        _u64(links.name_off),
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


# A chunk is two blobs of narrowed columns (fsage/_columns.c): ``keys``, all that the current
# state needs to tell changed files (read for every snapshot), and ``body``, the rest.
# (name, dtype, delta): delta columns are stored as differences of consecutive values.
KEY_COLUMNS: list[tuple[str, type[np.generic], bool]] = [
    ("ino", np.uint64, True),
    ("generation", np.uint32, False),
    ("digest", np.int64, False),
]
BODY_COLUMNS: list[tuple[str, type[np.generic], bool]] = [
    *((c, FILE_COLUMNS[c], False) for c in INODE_FIELDS if c != "generation"),
    ("special", np.uint8, False),  # a reserved inode
    ("ext_counts", np.uint32, False),  # extents per version
    ("ext_logical", np.uint64, False),
    ("ext_physical", np.uint64, False),
    ("ext_length", np.uint64, False),
    ("ext_flags", np.uint32, False),
    ("meta_counts", np.uint32, False),  # metadata blocks per version
    ("meta_physical", np.uint64, False),
    ("meta_kind", np.uint8, False),
    ("link_rows", np.uint32, True),  # per name: the version (row of the chunk) it names
    ("link_parents", np.uint64, False),  # the directory inode holding each name
    ("name_lens", np.uint32, False),
    ("names", np.uint8, False),  # the names' bytes, back to back
]
CHUNK_BLOBS = ("keys", "body")

Arrays = dict[str, npt.NDArray[Any]]


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
    return select_links(links, keep), link_row[keep]


def select_links(links: LinkTable, keep: npt.NDArray[np.bool_]) -> LinkTable:
    """The links flagged ``keep``."""
    if keep.all():
        return links
    lengths = np.diff(links.name_off).astype(np.int64)
    raw = np.frombuffer(links.names, np.uint8)[np.repeat(keep, lengths)]
    return LinkTable(
        parent=links.parent[keep],
        ino=links.ino[keep],
        name_off=_offsets(lengths[keep]),
        names=raw.tobytes(),
    )


def _renumber(
    n: int, rows: npt.NDArray[np.int64], link_row: npt.NDArray[np.int64]
) -> npt.NDArray[np.int64]:
    """Each link's row after taking ``rows`` of ``n`` (-1: its file was not taken)."""
    new = np.full(n + 1, -1, np.int64)  # the extra slot maps -1 to -1
    new[rows] = np.arange(len(rows), dtype=np.int64)
    return new[link_row]


def chunk_arrays(
    files: FileTable,
    special: npt.NDArray[np.bool_],
    digests: npt.NDArray[np.int64],
    links: LinkTable,
    link_row: npt.NDArray[np.int64],
) -> Arrays:
    """The columns of a chunk holding ``files``; ``link_row``: the row of each link's file."""
    arrays: Arrays = {"ino": files.ino, "generation": files.generation, "digest": digests}
    for c in INODE_FIELDS:
        arrays[c] = getattr(files, c)
    arrays.update(
        special=special,
        ext_counts=np.diff(files.ext_off),
        ext_logical=files.ext_logical,
        ext_physical=files.ext_physical,
        ext_length=files.ext_length,
        ext_flags=files.ext_flags,
        meta_counts=np.diff(files.meta_off),
        meta_physical=files.meta_physical,
        meta_kind=files.meta_kind,
        link_rows=link_row,
        link_parents=links.parent,
        name_lens=np.diff(links.name_off),
        names=np.frombuffer(links.names, np.uint8),
    )
    return arrays


def pack_arrays(arrays: Arrays) -> dict[str, bytes]:
    """The chunk blobs of ``chunk_arrays()``."""

    def pack(columns: list[tuple[str, type[np.generic], bool]]) -> bytes:
        return _ext2fs.pack_columns(
            [(np.ascontiguousarray(arrays[name]), delta) for name, _, delta in columns]
        )

    return {"keys": pack(KEY_COLUMNS), "body": pack(BODY_COLUMNS)}


def pack_chunk(
    files: FileTable,
    special: npt.NDArray[np.bool_],
    digests: npt.NDArray[np.int64],
    links: LinkTable,
    link_file: npt.NDArray[np.int64],
    rows: npt.NDArray[np.int64] | None = None,
) -> dict[str, bytes]:
    """The chunk blobs of ``rows`` of ``files`` (all of them when None); ``link_file`` comes
    from ``link_files()``."""
    link_row = link_file
    if rows is not None:
        link_row = _renumber(len(files), rows, link_file)
        files, special, digests = files.take(rows), special[rows], digests[rows]
    links, link_row = _select_links(links, link_row, link_row >= 0)
    return pack_arrays(chunk_arrays(files, special, digests, links, link_row))


# Body columns with one value per version (the others hold extents, metadata blocks, names).
_PER_VERSION = {"special", "ext_counts", "meta_counts", *INODE_FIELDS}


def column_crcs(blob: bytes, columns: list[tuple[str, type[np.generic], bool]]) -> bytes:
    """The CRC-32 of each column of a packed blob (its header and values), as u32: a reader
    of a few columns checks those alone (``ColumnReader``)."""
    reader = ColumnReader(blob, columns)
    return np.array([zlib.crc32(blob[a:b]) for a, b in reader.spans], "<u4").tobytes()


def check_count(decoded: object, n: int) -> None:
    """Raise ValueError unless a decoded chunk (Keys, Versions or a ColumnReader) holds ``n``
    versions whose columns agree with each other: a chunk that decodes into arrays of
    different lengths would otherwise fail later as an IndexError, or not at all."""
    if isinstance(decoded, Keys):
        lengths = {len(decoded.ino), len(decoded.generation), len(decoded.digest)}
        if lengths != {n}:
            raise ValueError(f"{n} versions, key columns of {sorted(lengths)}")
    elif isinstance(decoded, Versions):
        f = decoded.files
        lengths = {len(getattr(f, c)) for c in FILE_COLUMNS} | {len(decoded.special)}
        if lengths != {n}:
            raise ValueError(f"{n} versions, columns of {sorted(lengths)}")
        ext = {len(f.ext_logical), len(f.ext_physical), len(f.ext_length), len(f.ext_flags)}
        meta = {len(f.meta_physical), len(f.meta_kind)}
        links = decoded.links
        if ext != {int(f.ext_off[-1])} or meta != {int(f.meta_off[-1])}:
            raise ValueError("extent or metadata counts disagree with their columns")
        if len(links.names) != int(links.name_off[-1]) or len(links.parent) != len(
            decoded.link_row
        ):
            raise ValueError("name columns disagree")
        if decoded.link_row.size and int(decoded.link_row.max()) >= n:
            raise ValueError("a name of a version the chunk does not hold")
    elif isinstance(decoded, ColumnReader):
        wrong = [c for c, k in decoded.counts.items() if k != n and c in decoded.per_version]
        if wrong:
            raise ValueError(f"{n} versions, column {wrong[0]} of {decoded.counts[wrong[0]]}")


def _unpack(blob: bytes, columns: list[tuple[str, type[np.generic], bool]]) -> Arrays:
    sizes = [np.dtype(dtype).itemsize for _, dtype, _ in columns]
    raw = _ext2fs.unpack_columns(blob, sizes)
    return {
        name: np.frombuffer(buf, dtype) for (name, dtype, _), buf in zip(columns, raw, strict=True)
    }


@dataclass
class Keys:
    """What the current state keeps of each version of a chunk."""

    ino: U64
    generation: npt.NDArray[np.uint32]
    digest: npt.NDArray[np.int64]


def chunk_keys(blob: bytes) -> Keys:
    k = _unpack(blob, KEY_COLUMNS)
    return Keys(k["ino"], k["generation"], k["digest"])


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


def versions_of(arrays: Arrays) -> Versions:
    """The versions a chunk's columns hold."""
    ino = arrays["ino"].astype(np.uint64, copy=False)
    files = FileTable(
        **{c: arrays[c].astype(FILE_COLUMNS[c], copy=False) for c in FILE_COLUMNS},
        ext_off=_offsets(arrays["ext_counts"]),
        ext_logical=arrays["ext_logical"].astype(np.uint64, copy=False),
        ext_physical=arrays["ext_physical"].astype(np.uint64, copy=False),
        ext_length=arrays["ext_length"].astype(np.uint64, copy=False),
        ext_flags=arrays["ext_flags"].astype(np.uint32, copy=False),
        meta_off=_offsets(arrays["meta_counts"]),
        meta_physical=arrays["meta_physical"].astype(np.uint64, copy=False),
        meta_kind=arrays["meta_kind"].astype(np.uint8, copy=False),
    )
    link_row = arrays["link_rows"].astype(np.int64)
    links = LinkTable(
        parent=arrays["link_parents"].astype(np.uint64, copy=False),
        ino=ino[link_row],
        name_off=_offsets(arrays["name_lens"]),
        names=arrays["names"].tobytes(),
    )
    return Versions(files, arrays["special"].astype(bool), link_row, links)


def unpack_chunk(blobs: dict[str, bytes]) -> Versions:
    keys = _unpack(blobs["keys"], KEY_COLUMNS)
    return versions_of({**keys, **_unpack(blobs["body"], BODY_COLUMNS)})


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


_HEADER = struct.Struct("<QqqBB")  # count, first, base, width, flags (fsage/_columns.c)


class ColumnReader:
    """Some columns of a chunk blob, read from SQLite without the rest: the column headers
    are read one by one to find where each column lies, and only the wanted columns' bytes
    are read and unpacked. ``blob`` is an open ``sqlite3.Blob`` (or bytes)."""

    def __init__(
        self,
        blob: Any,
        columns: list[tuple[str, type[np.generic], bool]],
        crcs: bytes | None = None,
        what: str = "a chunk",
    ) -> None:
        """``crcs``: the CRC-32 of each column (``column_crcs``), checked as each is read;
        ``what``: whose columns they are, for the error when one does not match."""
        self.blob = blob
        self.what = what
        self.crcs = None if crcs is None else np.frombuffer(crcs, "<u4")
        if self.crcs is not None and len(self.crcs) != len(columns):
            raise ValueError(f"{len(self.crcs)} column checksums for {len(columns)} columns")
        self.columns = {name: (dtype, i) for i, (name, dtype, _) in enumerate(columns)}
        self.spans: list[tuple[int, int]] = []
        self.counts: dict[str, int] = {}
        self.per_version = {c for c, _, _ in KEY_COLUMNS} | _PER_VERSION
        pos, size = 0, len(blob)
        for name, _, _ in columns:
            if pos + _HEADER.size > size:
                raise ValueError("chunk blob cut short")
            n, _first, _base, width, _flags = _HEADER.unpack(bytes(blob[pos : pos + _HEADER.size]))
            end = pos + _HEADER.size + n * width
            self.spans.append((pos, end))
            self.counts[name] = n
            pos = end
        if pos != size:
            raise ValueError("chunk blob longer than its columns")

    def __getitem__(self, name: str) -> npt.NDArray[Any]:
        dtype, i = self.columns[name]
        a, b = self.spans[i]
        packed = bytes(self.blob[a:b])
        if self.crcs is not None and zlib.crc32(packed) != int(self.crcs[i]):
            raise DamagedError(
                f"{self.what} are damaged (column {name} does not match its checksum)"
            )
        (raw,) = _ext2fs.unpack_columns(packed, [np.dtype(dtype).itemsize])
        return np.frombuffer(raw, dtype)

    def take(self, name: str, rows: npt.NDArray[np.int64]) -> npt.NDArray[Any]:
        """``self[name][rows]``, reading only those values when they are few (a column of
        differences has to be read whole)."""
        dtype, i = self.columns[name]
        a, _ = self.spans[i]
        _n, _first, base, width, flags = _HEADER.unpack(bytes(self.blob[a : a + _HEADER.size]))
        if flags & 1 or rows.size > 4096 or self.crcs is not None:  # checked: read whole
            return self[name][rows]
        start = a + _HEADER.size
        blob = self.blob
        raw = [
            int.from_bytes(blob[start + r * width : start + (r + 1) * width], "little")
            for r in rows.tolist()
        ]
        values = np.array(raw, np.uint64) + np.uint64(base % (1 << 64))
        return (
            values.view(np.int64).astype(dtype)
            if np.dtype(dtype).kind == "i"
            else values.astype(dtype)
        )
