"""A snapshot read in bounded parts: its files in inode ranges, its names chunk by chunk.

``versions.valid_versions`` rebuilds a whole snapshot at once; a reader that only needs to
go over the files once (``fsage export``) holds far less reading it a part at a time. The
chunks' columns are fixed-width (``fsage/_columns.c``), so a range of rows of a column is read
from SQLite without the rest; each column is checked against its checksum once, in pieces,
before any part is handed out (a damaged chunk fails before anything is made of it).

What is held for the whole read: per chunk row, whether it is a user file (a bit), and the
valid rows that are not (reserved inodes); per inode number from the snapshot's lowest user
file, a bit (is it a user file); every ``rows``-th user file's inode (the part boundaries)
and a value of each column of differences every ``MARK_ROWS`` rows. A chunk's user files come
in inode order, so a part is found again from its rows a window at a time; a chunk whose user
files are not in inode order is read whole (``load_layout``). A part holds at most ``rows``
files of each chunk that has files in its inode range. The free map is inflated a piece at a
time (``free_windows``).
"""

from __future__ import annotations

import contextlib
import sqlite3
import struct
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from fsage import _ext2fs, paged
from fsage.db import codec
from fsage.db.checksum import DamagedError, blob_crc, matches
from fsage.db.versions import (
    _CHUNKS_OF_SNAPSHOT,
    _ENDED_BEFORE,
    _damaged,
    _decoding,
    _ended_rows,
)
from fsage.layout import FILE_COLUMNS, FileTable, concat_offsets, csr_take

I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]

#: Rows of one part (at most, about): its files and the gone versions between them, over all
#: chunks (a part reads each chunk's rows from its first file to its last). The export's
#: peak grows with the parts it has read (the C heap's free pieces between a part's arrays):
#: with parts of 32k rows against 16k, 107 against 95 MiB anonymous at 11.2M files for the
#: same CPU time (196 against 199 s), 123 against 105 at 44.8M.
PART_ROWS = 1 << 14
#: Extents of one part (about, at most): a part of very fragmented files is cut smaller.
PART_EXTENTS = 1 << 16
#: How far a part may pass those before it is cut in two (its rows count gone versions too).
SLACK = 1.25
#: Names of a chunk read at a time by ``names()``.
NAME_ROWS = 1 << 16
#: Rows between two values of a column of differences kept for reading it from anywhere,
#: and the rows of a chunk read at a time when its files are gone over.
MARK_ROWS = 1 << 16
#: Bytes of a column checksummed at a time.
CRC_PIECE = 1 << 20

_HEADER = struct.Struct("<QqqBB")


@dataclass
class Part:
    """User files of one inode range, in inode order, with the keys the store recorded."""

    files: FileTable
    generation: I64
    digest: I64


@dataclass
class Names:
    """Some of a snapshot's names in link order (``seq``: the place in it) and the rows of
    the files they name: ``ino`` the inode, ``user`` False for reserved inodes."""

    seq: I64
    parent: U64
    ino: U64
    user: npt.NDArray[np.bool_]
    name_off: U64
    names: bytes


class _Column:
    """Ranges of rows of one fixed-width column of a chunk blob."""

    def __init__(self, reader: codec.ColumnReader, name: str) -> None:
        dtype, i = reader.columns[name]
        self.dtype = np.dtype(dtype)
        self.blob = reader.blob
        a, _ = reader.spans[i]
        head = bytes(self.blob[a : a + _HEADER.size])
        self.n, self.first, _base, self.width, flags = _HEADER.unpack(head)
        self.delta = bool(flags & 1)
        # as a column of values (the differences themselves, for a column of differences)
        self.head = head[:25] + bytes([flags & ~1])
        self.start = a + _HEADER.size
        self.marks: U64 | None = None

    def rows(self, lo: int, hi: int) -> npt.NDArray[Any]:
        if self.delta:
            raise ValueError("a column of differences is read in order (differences)")
        return self._raw(lo, hi, self.dtype)

    def _raw(self, lo: int, hi: int, dtype: np.dtype[Any]) -> npt.NDArray[Any]:
        if not 0 <= lo <= hi <= self.n:
            raise ValueError("rows outside the column")
        w = self.width
        raw = bytes(self.blob[self.start + lo * w : self.start + hi * w])
        head = struct.pack("<Q", hi - lo) + self.head[8:]
        (out,) = _ext2fs.unpack_columns(head + raw, [dtype.itemsize])
        return np.frombuffer(out, dtype)

    def differences(self, step: int) -> Iterator[tuple[int, npt.NDArray[Any]]]:
        """(first row, values) of a column of differences, ``step`` rows at a time: each
        value the previous one plus its stored difference, the first one stored whole (as
        ``_columns.c`` decodes them, modulo 2**64)."""
        prev = np.uint64(0)
        for lo in range(0, self.n, step):
            hi = min(lo + step, self.n)
            d = self._raw(lo, hi, np.dtype(np.uint64)).copy()
            if lo == 0:
                d[0] = np.uint64(self.first % (1 << 64))
            else:
                d[0] += prev
            values = np.cumsum(d, dtype=np.uint64)
            prev = values[-1]
            yield lo, values.astype(self.dtype)

    def values(self, lo: int, hi: int) -> npt.NDArray[Any]:
        """Rows ``lo``..``hi`` of any column: one of differences is summed from the value
        remembered at the last multiple of ``MARK_ROWS`` before ``lo``."""
        if not self.delta:
            return self.rows(lo, hi)
        if lo >= hi:
            return np.zeros(0, self.dtype)
        if self.marks is None:  # one pass, a value every MARK_ROWS rows
            self.marks = np.array([v[0] for _, v in self.differences(MARK_ROWS)], np.uint64).astype(
                np.uint64
            )
        k = lo // MARK_ROWS
        base = k * MARK_ROWS
        d = self._raw(base, hi, np.dtype(np.uint64)).copy()
        d[0] = self.marks[k]
        return np.cumsum(d, dtype=np.uint64)[lo - base :].astype(self.dtype)


def _verify(
    blob: Any, spans: list[tuple[int, int]], crcs: npt.NDArray[np.uint32], what: str
) -> None:
    for (a, b), want in zip(spans, crcs.tolist(), strict=True):
        crc = 0
        for lo in range(a, b, CRC_PIECE):
            crc = zlib.crc32(bytes(blob[lo : min(lo + CRC_PIECE, b)]), crc)
        if crc != want:
            raise DamagedError(f"{what} are damaged (a column does not match its checksum)")


def _blob_crc(blob: Any) -> int:
    crc = 0
    for lo in range(0, len(blob), CRC_PIECE):
        crc = zlib.crc32(bytes(blob[lo : lo + CRC_PIECE]), crc)
    return crc


class _Bits:
    """A bit per row (or per inode number), packed: a byte holds eight. Bit ``i`` is the
    ``i - base``-th: a chunk's user files are a range of inode numbers, not all of them from 0
    (the chunks of a large snapshot would each hold bits for every inode below theirs)."""

    def __init__(self, bits: npt.NDArray[np.uint8], n: int, base: int = 0) -> None:
        self.bits, self.n, self.base = bits, n, base

    @classmethod
    def ones(cls, n: int) -> _Bits:
        return cls(paged.full((n + 7) >> 3, 0xFF), n)

    def clear(self, at: I64) -> None:
        np.bitwise_and.at(self.bits, at >> 3, ~(np.uint8(0x80) >> (at & 7).astype(np.uint8)))

    def get(self, lo: int, hi: int) -> npt.NDArray[np.bool_]:
        """Bits ``lo``..``hi``."""
        got = np.unpackbits(self.bits[lo >> 3 : (hi + 7) >> 3])[lo & 7 : (lo & 7) + hi - lo]
        return got.astype(bool)

    def put(self, lo: int, values: npt.NDArray[np.bool_]) -> None:
        """Bits from ``lo`` (a multiple of 8) on."""
        self.bits[lo >> 3 : (lo >> 3) + ((values.size + 7) >> 3)] = np.packbits(values)

    def at(self, i: I64) -> npt.NDArray[np.bool_]:
        """Bits ``i`` (False outside)."""
        i = i - self.base
        ok = (i >= 0) & (i < self.n)
        if self.n == 0:
            return ok
        j = np.where(ok, i, 0)
        bit = (self.bits[j >> 3] >> (7 - (j & 7)).astype(np.uint8)) & np.uint8(1)
        out: npt.NDArray[np.bool_] = ok & (bit != 0)
        return out

    def add(self, i: I64) -> None:
        """Set the bits ``i`` (ascending), growing to hold them (cleared bits between)."""
        if i.size == 0:
            return
        if self.n == 0:  # the first bits set: counted from the byte that holds the lowest
            self.base = int(i[0]) & ~7
        i = i - self.base
        if int(i[0]) < 0:
            raise ValueError("bits below the first ones set")
        top = int(i[-1]) + 1
        if top > self.n:
            size = max(top, 2 * self.n)
            grown = paged.zeros((size + 7) >> 3)
            grown[: self.bits.size] = self.bits
            if self.n & 7:  # the bits past the old end are not set
                grown[self.n >> 3] &= np.uint8((0xFF << (8 - (self.n & 7))) & 0xFF)
            self.bits, self.n = grown, size
        np.bitwise_or.at(self.bits, i >> 3, np.uint8(0x80) >> (i & 7).astype(np.uint8))

    @classmethod
    def union(cls, every: list[_Bits]) -> _Bits:
        """The bits set in any of ``every`` (their bases are multiples of 8)."""
        some = [b for b in every if b.n]
        if not some:
            return cls.ones(0)
        base = min(b.base for b in some)
        top = max(b.base + 8 * b.bits.size for b in some)
        out = cls(paged.zeros((top - base + 7) >> 3), top - base, base)
        for b in some:
            at = (b.base - base) >> 3
            out.bits[at : at + b.bits.size] |= b.bits
            paged.release(b.bits)
        paged.release(out.bits)
        return out


class _Chunk:
    def __init__(
        self,
        con: sqlite3.Connection,
        stack: contextlib.ExitStack,
        row: tuple[int, int, int],
        gone: I64 | None,
        rows: int,
    ) -> None:
        chunk_id, first_snap, n = row
        self.first_snap, self.n = first_snap, n
        self.cols: dict[str, _Column] = {}
        what = f"the file versions recorded by snapshot {first_snap}"
        found = con.execute(
            "SELECT keys_crc, body_column_crcs FROM chunk_blobs WHERE chunk_id = ?", (chunk_id,)
        ).fetchone()
        if found is None:
            raise _damaged(first_snap, "the chunk's blobs are missing")
        keys_crc, body_crcs = found
        if keys_crc is None or not isinstance(body_crcs, bytes):
            raise _Unsupported  # written before per-column checksums
        keys = stack.enter_context(con.blobopen("chunk_blobs", "keys", chunk_id, readonly=True))
        body = stack.enter_context(con.blobopen("chunk_blobs", "body", chunk_id, readonly=True))
        if not matches(keys_crc, _blob_crc(keys) & 0xFFFFFFFF):
            raise _damaged(first_snap, "the chunk's keys do not match their checksum")
        with _decoding(first_snap):
            self.keys = codec.ColumnReader(keys, codec.KEY_COLUMNS, what=what)
            self.body = codec.ColumnReader(body, codec.BODY_COLUMNS, body_crcs, what)
            codec.check_count(self.keys, n)
            codec.check_count(self.body, n)
            assert self.body.crcs is not None
            _verify(body, self.body.spans, self.body.crcs, what)
            # per row: a user file (a bit); the valid rows that are not user files (reserved
            # inodes, a few) apart; per inode number: a user file. Validity is known from
            # those two, so no bit per row is kept for it (a bit per row per chunk grows with
            # the files times the chunks).
            valid = _Bits.ones(n)
            if gone is not None and gone.size:
                valid.clear(gone.astype(np.int64))
            self.user = _Bits.ones(n)
            self.inos = _Bits.ones(0)
            inos, special = self.col("ino"), self.col("special")
            marks: list[U64] = []
            others: list[I64] = []
            count, last = 0, -1
            for lo in range(0, n, MARK_ROWS):
                hi = min(lo + MARK_ROWS, n)
                ino = inos.values(lo, hi).astype(np.uint64, copy=False)
                v = valid.get(lo, hi)
                reserved = special.values(lo, hi) != 0
                u = v & ~reserved
                self.user.put(lo, u)
                others.append(np.flatnonzero(v & reserved).astype(np.int64) + lo)
                sel = ino[u]
                if sel.size and (int(sel[0]) <= last or bool(np.any(sel[1:] <= sel[:-1]))):
                    raise _Unsupported  # files not in inode order: read the snapshot whole
                last = int(sel[-1]) if sel.size else last
                marks.append(sel[(-count) % rows :: rows])
                count += int(sel.size)
                self.inos.add(sel.astype(np.int64))
            del valid
            # out of the resident set until read: a snapshot of many chunks would hold every
            # chunk's bits at once while the next ones are made
            paged.release(self.user.bits, self.inos.bits)
            self.count = count
            self.others: I64 = np.concatenate(others) if others else np.zeros(0, np.int64)
            self.marks: U64 = np.concatenate(marks) if marks else np.zeros(0, np.uint64)
        self.rewind()

    def rewind(self) -> None:
        """Back to the chunk's first row, for another pass over its parts."""
        self.cursor = (0, 0, 0)  # a row, and where its extents and metadata blocks start
        self.at = 0  # the first row not yet handed out in a part
        # the inode of the first user file from ``at`` on, once a part has stopped before it
        # (None: not known): a part below it takes nothing of the chunk without reading it
        # (every part asked every chunk, each answer a window of its inodes decoded, so a
        # part cost more the more chunks the snapshot had)
        self.next_ino: int | None = None

    def valid_at(self, rows: I64) -> npt.NDArray[np.bool_]:
        """Whether rows ``rows`` hold valid versions: user files, or the others kept."""
        out = self.user.at(rows)
        if self.others.size:
            out |= np.isin(rows, self.others)
        return out

    def selected(self) -> Iterator[U64]:
        """The user files' inodes in order, a window at a time."""
        inos = self.col("ino")
        for lo in range(0, self.n, MARK_ROWS):
            hi = min(lo + MARK_ROWS, self.n)
            yield inos.values(lo, hi).astype(np.uint64, copy=False)[self.user.get(lo, hi)]

    def take(self, hi: int | None) -> tuple[I64, U64]:
        """The rows and inodes of the user files from where the last part ended up to inode
        ``hi`` (None: to the end); rows in inode order, so a part is a range of rows."""
        if hi is not None and self.next_ino is not None and self.next_ino >= hi:
            return np.zeros(0, np.int64), np.zeros(0, np.uint64)
        self.next_ino = None
        inos = self.col("ino")
        rows: list[I64] = []
        found: list[U64] = []
        while self.at < self.n:
            end = min((self.at // MARK_ROWS + 1) * MARK_ROWS, self.n)
            ino = inos.values(self.at, end).astype(np.uint64, copy=False)
            # the user files are in inode order (the others, reserved inodes, need not be)
            u = np.flatnonzero(self.user.get(self.at, end))
            j = u.size if hi is None else int(np.searchsorted(ino[u], np.uint64(hi)))
            keep = u[:j]
            cut = ino.size if j == u.size else int(u[j])
            rows.append(keep + self.at)
            found.append(ino[keep])
            self.at += cut
            if cut < ino.size:
                self.next_ino = int(ino[u[j]])
                break
        if not rows:
            return np.zeros(0, np.int64), np.zeros(0, np.uint64)
        return np.concatenate(rows).astype(np.int64), np.concatenate(found)

    def col(self, name: str) -> _Column:
        if name not in self.cols:
            reader = self.keys if name in ("ino", "generation", "digest") else self.body
            self.cols[name] = _Column(reader, name)
        return self.cols[name]

    def _offsets_at(self, row: int) -> tuple[int, int]:
        at, e, m = self.cursor
        if row < at:
            at, e, m = 0, 0, 0
        if row > at:
            e += int(self.col("ext_counts").rows(at, row).sum(dtype=np.uint64))
            m += int(self.col("meta_counts").rows(at, row).sum(dtype=np.uint64))
        self.cursor = (row, e, m)
        return e, m

    def piece(self, rows: I64) -> tuple[FileTable, I64, I64]:
        """The files at ``rows`` (in that order), their generations and digests."""
        with _decoding(self.first_snap):
            r0, r1 = int(rows.min()), int(rows.max()) + 1
            local = rows - r0
            cols: dict[str, Any] = {}
            for name, dtype in FILE_COLUMNS.items():
                if name == "ino":
                    continue
                cols[name] = self.col(name).rows(r0, r1).astype(dtype, copy=False)[local]
            e0, m0 = self._offsets_at(r0)
            ext_counts = self.col("ext_counts").rows(r0, r1).astype(np.uint64)
            meta_counts = self.col("meta_counts").rows(r0, r1).astype(np.uint64)
            self.cursor = (r1, e0 + int(ext_counts.sum()), m0 + int(meta_counts.sum()))
            out: dict[str, Any] = {}
            extents = ("ext_logical", "ext_physical", "ext_length", "ext_flags")
            for off_name, counts, base, children in (
                ("ext_off", ext_counts, e0, extents),
                ("meta_off", meta_counts, m0, ("meta_physical", "meta_kind")),
            ):
                off = np.zeros(counts.size + 1, np.uint64)
                np.cumsum(counts, out=off[1:])
                idx, out[off_name] = csr_take(off, local)
                for child in children:
                    values = self.col(child).rows(base, base + int(off[-1]))
                    out[child] = values.astype(_CHILD_TYPES[child], copy=False)[idx]
            gen = self.col("generation").rows(r0, r1).astype(np.int64)[local]
            digest = self.col("digest").rows(r0, r1).astype(np.int64)[local]
        return FileTable(ino=np.zeros(0, np.uint64), **cols, **out), gen, digest


def _at_rows(col: _Column, rows: I64) -> U64:
    """``col``'s values at ``rows``, reading only the rows between the first and the last."""
    if rows.size == 0:
        return np.zeros(0, np.uint64)
    r0 = int(rows.min())
    return col.values(r0, int(rows.max()) + 1).astype(np.uint64, copy=False)[rows - r0]


_CHILD_TYPES: dict[str, type[np.generic]] = {
    "ext_logical": np.uint64, "ext_physical": np.uint64, "ext_length": np.uint64,
    "ext_flags": np.uint32, "meta_physical": np.uint64, "meta_kind": np.uint8,
}  # fmt: skip


class _FreeMap:
    """A snapshot's free map (zlib of u64 (start, length) pairs), inflated a piece at a time
    from its blob: as large as its free extents are many, it is never held whole."""

    def __init__(self, con: sqlite3.Connection, stack: contextlib.ExitStack, snap_id: int,
                 crc: int | None) -> None:  # fmt: skip
        self.blob = stack.enter_context(
            con.blobopen("snapshots", "free_map", snap_id, readonly=True)
        )
        if not matches(crc, _blob_crc(self.blob) & 0xFFFFFFFF):
            raise DamagedError("its free map does not match its checksum")

    def windows(self, done: Callable[[float], None] | None = None) -> Iterator[tuple[U64, U64]]:
        """The pairs a window at a time; ``done(share)``: the share of the blob read, after
        each piece of it (a large free map takes a while, before any file is read)."""
        inflate = zlib.decompressobj()
        rest = b""
        size = len(self.blob)
        for lo in range(0, size, CRC_PIECE):
            if done is not None and lo:
                done(lo / size)
            data = bytes(self.blob[lo : min(lo + CRC_PIECE, size)])
            while data:  # inflated a piece of at most CRC_PIECE bytes at a time
                raw = rest + inflate.decompress(data, CRC_PIECE)
                data = inflate.unconsumed_tail
                whole = len(raw) - len(raw) % 16
                rest = raw[whole:]
                if whole:
                    pairs = np.frombuffer(raw[:whole], "<u8").reshape(-1, 2)
                    yield pairs[:, 0].astype(np.uint64), pairs[:, 1].astype(np.uint64)
                del raw
        rest += inflate.flush()
        whole = len(rest) - len(rest) % 16
        if whole:
            pairs = np.frombuffer(rest[:whole], "<u8").reshape(-1, 2)
            yield pairs[:, 0].astype(np.uint64), pairs[:, 1].astype(np.uint64)
        if len(rest) % 16 or not inflate.eof:
            raise DamagedError("its free map is damaged (not whole pairs)")


class _Unsupported(Exception):
    """A chunk written before per-column checksums: read the snapshot whole instead."""


class SnapshotParts:
    """A snapshot's files a part at a time (``parts``) and its names (``names``); open with
    ``open_parts`` (None when the snapshot has a chunk older than per-column checksums)."""

    def __init__(self, chunks: list[_Chunk], rows: int, free: _FreeMap | None = None) -> None:
        self.chunks = chunks
        self.free = free
        # one bit per inode number for the snapshot, not one set per chunk: a later chunk's
        # few files span the inode numbers as widely as the first chunk's many
        self.inos = _Bits.union([c.inos for c in chunks])
        for c in chunks:
            c.inos = _Bits.ones(0)
        self.files = sum(c.count for c in chunks)
        # part boundaries: every ``rows``-th inode of each chunk, so that a part holds at most
        # ``rows`` files of any chunk
        every = [c.marks for c in chunks if c.marks.size]
        self.bounds: U64 = np.unique(np.concatenate(every)) if every else np.zeros(0, np.uint64)
        # ... and cut again where the chunks together would give a part more rows or extents
        # (a later snapshot's many chunks, gone versions between files, fragmented files)
        self.bounds = self._refined(rows)

    def _refined(self, rows: int) -> U64:
        """The bounds again, so that a part's rows over every chunk (its files and the gone
        versions between them, which it reads) stay near ``rows`` and its extents near
        ``PART_EXTENTS``. Each file weighs the larger of its rows' and its extents' share
        (from the chunk's previous file to it); a range of weight over ``SLACK`` is cut into
        parts of equal weight, and ranges are merged into the part before them while it
        stays at most one (with the gone rows between: the bounds of many chunks make
        ranges of a few files)."""
        bounds = self.bounds.tolist()
        out: list[int] = []
        cuts: list[U64] = []
        acc: float | None = None  # the weight of the part being built
        for c in self.chunks:
            c.rewind()
        for k in range(len(bounds)):
            hi = bounds[k + 1] if k + 1 < len(bounds) else None
            inos, weights, lead = [], [], 0.0
            for c in self.chunks:
                at = c.at
                taken, ino = c.take(hi)
                if taken.size == 0:
                    continue
                ext = c.col("ext_counts").rows(at, int(taken[-1]) + 1).astype(np.int64)
                upto = np.cumsum(ext)  # extents of the rows from the cursor, inclusive
                first = int(taken[0]) - at
                before = int(upto[first] - ext[first])  # extents of the rows before it
                # the rows before the first file are read only by a part merged with the last
                lead += max(first / rows, before / PART_EXTENTS)
                span = np.diff(taken, prepend=taken[0] - 1)
                span_ext = np.diff(upto[taken - at], prepend=before)
                inos.append(ino)
                # the larger share: a range of ordinary files is cut by rows alone
                weights.append(np.maximum(span / rows, span_ext / PART_EXTENTS))
            if not inos:
                continue  # nothing in the range: it goes with the part before
            w = np.concatenate(weights)
            whole = float(w.sum())
            if acc is not None and acc + lead + whole <= 1:
                acc += lead + whole  # one part with the ranges before it
                continue
            out.append(bounds[k])
            acc = whole
            if whole <= SLACK:
                continue
            # ceil(whole) parts of equal weight: a file begins the next one where the weight
            # before it passes the next share (no sliver of a part at the range's end)
            ino = np.concatenate(inos)
            order = np.argsort(ino, kind="stable")
            w = w[order]
            pieces = np.ceil(whole)
            piece = np.floor((np.cumsum(w) - w) * (pieces / whole)).astype(np.int64)
            cuts.append(ino[order][np.flatnonzero(np.diff(piece, prepend=0) > 0)])
            acc = whole / pieces
        for c in self.chunks:
            c.rewind()
        if not out:
            return self.bounds
        return np.unique(np.concatenate([np.array(out, np.uint64), *cuts]))

    def exists(self, ino: U64) -> npt.NDArray[np.bool_]:
        """Which of ``ino`` are user files of the snapshot."""
        return self.inos.at(ino.astype(np.int64))

    def inode_bits(self) -> _Bits:
        """No bit set, one for each of the inode numbers the user files lie among (``base``
        the lowest, ``n`` of them), as ``exists`` keeps its own."""
        return _Bits(paged.zeros(self.inos.bits.size), self.inos.n, self.inos.base)

    def free_windows(
        self, done: Callable[[float], None] | None = None
    ) -> Iterator[tuple[U64, U64]]:
        """The free map's (start, length) pairs in stored order, a window at a time;
        ``done(share)``: the share of it read, as it is read."""
        if self.free is not None:
            yield from self.free.windows(done)

    def part_of(self, ino: U64) -> I64:
        """The part whose inode range holds each of ``ino`` (-1: before the first)."""
        return (np.searchsorted(self.bounds, ino, side="right") - 1).astype(np.int64)

    def all_inos(self) -> Iterator[U64]:
        """Every user file's inode, a window of a chunk at a time (not in order across
        chunks)."""
        for c in self.chunks:
            yield from c.selected()

    def parts(self) -> Iterator[tuple[int, Part]]:
        """(k, the files of the k-th inode range) for every range that has any."""
        bounds = self.bounds.tolist()
        for c in self.chunks:
            c.rewind()
        for k in range(len(bounds)):
            hi = bounds[k + 1] if k + 1 < len(bounds) else None
            tables, gens, digests = [], [], []
            for c in self.chunks:
                rows, ino = c.take(hi)
                if rows.size == 0:
                    continue
                t, g, d = c.piece(rows)
                t.ino = ino
                tables.append(t)
                gens.append(g)
                digests.append(d)
            if not tables:
                continue
            files = FileTable.concat(tables) if len(tables) > 1 else tables[0]
            gen = np.concatenate(gens)
            digest = np.concatenate(digests)
            if len(tables) > 1:
                order = np.argsort(files.ino, kind="stable")
                files, gen, digest = files.take(order), gen[order], digest[order]
            # a suspended generator keeps its locals: the concatenated lists go (a second
            # copy of the part); the last chunk's piece (the part itself when it is one
            # chunk's) stays bound until the next is read. Released here as well, the export's
            # peak rose (93 against 89 MiB anonymous at 2.8M files) and it took 10 % more
            # CPU: glibc placed the next part's arrays worse.
            box = [Part(files, gen, digest)]
            del tables, gens, digests, files, gen, digest
            yield k, box.pop()

    def parents(self) -> Iterator[U64]:
        """The directory of every name of a valid version, a piece at a time."""
        for c in self.chunks:
            with _decoding(c.first_snap):
                parents = c.col("link_parents")
                for lo, rows in c.col("link_rows").differences(NAME_ROWS):
                    rows = rows.astype(np.int64)
                    if rows.size and int(rows.max()) >= c.n:
                        raise ValueError("a name of a version the chunk does not hold")
                    yield parents.rows(lo, lo + rows.size)[c.valid_at(rows)]

    def names(self) -> Iterator[Names]:
        """The snapshot's names in link order (a chunk's, ``NAME_ROWS`` at a time): every
        name of a valid version, reserved inodes' included, as a rebuilt layout has them."""
        seq = 0
        for c in self.chunks:
            with _decoding(c.first_snap):
                inos = c.col("ino")
                lens, parents = c.col("name_lens"), c.col("link_parents")
                names = c.col("names")
                link_rows = c.col("link_rows")
                if lens.n != link_rows.n or parents.n != link_rows.n:
                    raise ValueError("name columns disagree")
                pos = 0
                for lo, rows_u in link_rows.differences(NAME_ROWS):
                    rows = rows_u.astype(np.int64)
                    hi = lo + rows.size
                    if rows.size and int(rows.max()) >= c.n:
                        raise ValueError("a name of a version the chunk does not hold")
                    ln = lens.rows(lo, hi).astype(np.uint64)
                    end = pos + int(ln.sum())
                    if end > names.n:
                        raise ValueError("name columns disagree")
                    raw = names.rows(pos, end)
                    pos = end
                    keep = c.valid_at(rows)
                    if not keep.all():
                        raw = raw[np.repeat(keep, ln.astype(np.int64))]
                        ln = ln[keep]
                    off = np.zeros(ln.size + 1, np.uint64)
                    np.cumsum(ln, out=off[1:])
                    yield Names(
                        seq=np.arange(seq + lo, seq + hi, dtype=np.int64)[keep],
                        parent=parents.rows(lo, hi).astype(np.uint64)[keep],
                        ino=_at_rows(inos, rows[keep]),
                        user=c.user.at(rows[keep]),
                        name_off=off,
                        names=raw.tobytes(),
                    )
                if pos != names.n:
                    raise ValueError("name columns disagree")
                seq += link_rows.n


@contextlib.contextmanager
def open_parts(
    con: sqlite3.Connection,
    fs_id: int,
    snap_id: int,
    rows: int | None = None,
    done: Callable[[float], None] | None = None,
) -> Iterator[SnapshotParts | None]:
    """The snapshot's parts, its chunks' blobs held open (the caller holds a read
    transaction for as long as it reads them); ``done(share)``: the share of the chunks'
    rows checked, after each chunk (a snapshot of many takes a while before its first part)."""
    chunk_rows = con.execute(_CHUNKS_OF_SNAPSHOT, (fs_id, snap_id, snap_id)).fetchall()
    every = sum(int(r[2]) for r in chunk_rows)
    checked = 0
    (free_crc,) = con.execute("SELECT free_crc FROM snapshots WHERE id = ?", (snap_id,)).fetchone()
    ended = _ended_rows(con, _ENDED_BEFORE, (fs_id, snap_id, snap_id))
    with contextlib.ExitStack() as stack:
        try:
            chunks = []
            for r in chunk_rows:
                # each chunk's ended rows let go once its bits are made: not held over the read
                gone = ended.pop(int(r[0]), None)
                chunks.append(_Chunk(con, stack, tuple(r), gone, rows or PART_ROWS))
                del gone
                checked += int(r[2])
                if done is not None and every:
                    done(checked / every)
        except _Unsupported:
            yield None
            return
        free = _FreeMap(con, stack, snap_id, free_crc)
        yield SnapshotParts(chunks, rows or PART_ROWS, free)


def join_names(parts: list[Names]) -> Names:
    if len(parts) == 1:
        return parts[0]
    if not parts:
        empty = np.zeros(0, np.uint64)
        return Names(
            np.zeros(0, np.int64), empty, empty, np.zeros(0, bool), np.zeros(1, np.uint64), b""
        )
    return Names(
        np.concatenate([p.seq for p in parts]),
        np.concatenate([p.parent for p in parts]),
        np.concatenate([p.ino for p in parts]),
        np.concatenate([p.user for p in parts]),
        concat_offsets([p.name_off for p in parts]),
        b"".join(p.names for p in parts),
    )


__all__ = ["PART_ROWS", "Names", "Part", "SnapshotParts", "blob_crc", "join_names", "open_parts"]
