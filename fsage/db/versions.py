"""File versions in version chunks: what each snapshot recorded and when each version ended.

A snapshot that stores N changed or new files writes one chunk (a row of ``version_chunks``
with its N versions column by column in a row of ``chunk_blobs``, see ``codec``) instead of N
rows, and one
``version_ends`` row per older chunk that holds versions it superseded (the row numbers, and the
last snapshot in which they were valid). A version is valid in snapshot S when its chunk's
``first_snap`` <= S and it has no end before S. Snapshot ids increase with time within a file
system, so comparisons by id stay right when snapshots in between are deleted.

Each chunk counts its ``live`` versions (not ended yet) and, once none is, the last snapshot that
still sees one (``dead_after``), so finding the current versions or rebuilding a snapshot reads
only the chunks that can matter. The counters live apart from the blobs because SQLite rewrites
a whole row, blobs and all, to change one field of it.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from fsage.db import codec
from fsage.db.checksum import DamagedError, blob_crc, matches
from fsage.layout import FILE_COLUMNS, FileTable, LinkTable, concat_offsets, csr_take

I64 = npt.NDArray[np.int64]

# Largest chunk: keeps each blob well below SQLite's 1 GB limit on huge file systems.
CHUNK_MAX_ROWS = 1_000_000


@dataclass
class Current:
    """The versions valid in the newest snapshot of a file system, in ino order."""

    ino: npt.NDArray[np.uint64]
    generation: I64
    digest: I64
    chunk: I64
    row: I64

    def __len__(self) -> int:
        return int(self.ino.shape[0])


# The chunks holding a snapshot's versions: (fs_id, snap_id, snap_id) as parameters.
_CHUNKS_OF_SNAPSHOT = (
    "SELECT id, first_snap, n FROM version_chunks WHERE fs_id = ? AND first_snap <= ?"
    " AND (dead_after IS NULL OR dead_after >= ?) ORDER BY id"
)


def _damaged(first_snap: int, what: str) -> DamagedError:
    return DamagedError(f"the file versions recorded by snapshot {first_snap} are damaged ({what})")


def _ended_rows(con: sqlite3.Connection, query: str, args: tuple[int, ...]) -> dict[int, I64]:
    """``query`` yields (chunk id, rows, rows_crc, the chunk's first_snap, its n)."""
    out: dict[int, list[npt.NDArray[np.uint32]]] = {}
    for chunk_id, blob, crc, first_snap, n in con.execute(query, args):
        if not isinstance(blob, bytes) or len(blob) % 4 or not matches(crc, blob_crc(blob)):
            raise _damaged(first_snap, "a list of ended versions does not match its checksum")
        rows = np.frombuffer(blob, "<u4")
        if rows.size and int(rows.max()) >= n:
            raise _damaged(first_snap, "a list of ended versions names rows it does not have")
        out.setdefault(int(chunk_id), []).append(rows)
    return {k: np.concatenate(v).astype(np.int64) for k, v in out.items()}


def _checked(blob: object, crc: object, first_snap: int, part: str) -> bytes:
    """A chunk blob as read, once it matches its checksum."""
    if not isinstance(blob, bytes) or not matches(crc, blob_crc(blob)):
        raise _damaged(first_snap, f"the chunk's {part} do not match their checksum")
    return blob


# The ended versions of the chunks a snapshot sees, that ended before it.
_ENDED_BEFORE = (
    "SELECT e.chunk_id, e.rows, e.rows_crc, c.first_snap, c.n FROM version_ends e"
    " JOIN version_chunks c ON c.id = e.chunk_id"
    " WHERE c.fs_id = ? AND c.first_snap <= ? AND e.last_snap < ?"
)


def _column_reader(
    con: sqlite3.Connection, stack: contextlib.ExitStack, chunk_id: int, part: str, first: int
) -> codec.ColumnReader:
    """A reader of some columns of one blob of a chunk, each checked as it is read: the keys
    (small) read whole against their checksum, the body's columns one by one against theirs;
    a blob written before checksums read unchecked."""
    what = f"the file versions recorded by snapshot {first}"
    if part == "keys":
        row = con.execute(
            "SELECT keys, keys_crc FROM chunk_blobs WHERE chunk_id = ?", (chunk_id,)
        ).fetchone()
        if row is None:
            raise _damaged(first, "the chunk's blobs are missing")
        blob = _checked(row[0], row[1], first, "keys") if row[1] is not None else row[0]
        return codec.ColumnReader(blob, codec.KEY_COLUMNS, what=what)
    row = con.execute(
        "SELECT body_column_crcs FROM chunk_blobs WHERE chunk_id = ?", (chunk_id,)
    ).fetchone()
    if row is None:
        raise _damaged(first, "the chunk's blobs are missing")
    if row[0] is not None and not isinstance(row[0], bytes):
        raise _damaged(first, "its column checksums are not a blob")
    blob = stack.enter_context(con.blobopen("chunk_blobs", "body", chunk_id, readonly=True))
    return codec.ColumnReader(blob, codec.BODY_COLUMNS, row[0], what)


@contextlib.contextmanager
def _decoding(first_snap: int) -> Iterator[None]:
    """A chunk that does not decode (one written before checksums, or damaged so that its
    checksum agrees by chance) is reported as damaged."""
    try:
        yield
    except (ValueError, IndexError, OverflowError, MemoryError) as exc:
        raise _damaged(first_snap, f"the chunk does not decode: {exc}") from None


def _with_blobs(
    con: sqlite3.Connection, query: str, args: tuple[int, ...], blobs: str
) -> Iterator[tuple[int, int, int, tuple[Any, ...]]]:
    """(id, first_snap, n, the ``blobs`` columns of its chunk_blobs row) of each chunk that
    ``query`` selects, the blobs read one chunk at a time: ordering a join of the blobs makes
    SQLite copy every blob into a temporary B-tree (several times their size in memory)."""
    for chunk_id, first_snap, n in con.execute(query, args).fetchall():
        row = con.execute(f"SELECT {blobs} FROM chunk_blobs WHERE chunk_id = ?", (chunk_id,))
        found = row.fetchone()
        if found is None:
            raise _damaged(first_snap, "the chunk's blobs are missing")
        out, found = (chunk_id, first_snap, n, tuple(found)), None
        yield out  # (no reference kept here: the reader drops the blobs once decoded)
        del out


def current(con: sqlite3.Connection, fs_id: int) -> Current:
    chunks = _with_blobs(
        con,
        "SELECT id, first_snap, n FROM version_chunks WHERE fs_id = ? AND live > 0 ORDER BY id",
        (fs_id,),
        "keys, keys_crc",
    )
    ended = _ended_rows(
        con,
        "SELECT e.chunk_id, e.rows, e.rows_crc, c.first_snap, c.n FROM version_ends e"
        " JOIN version_chunks c ON c.id = e.chunk_id WHERE c.fs_id = ? AND c.live > 0",
        (fs_id,),
    )
    parts = []
    for chunk_id, first_snap, n, (blob, crc) in chunks:
        raw = _checked(blob, crc, first_snap, "keys")
        with _decoding(first_snap):
            keys = codec.chunk_keys(raw)
            codec.check_count(keys, n)
        gone = ended.get(chunk_id)
        if gone is None:
            rows = np.arange(len(keys.ino), dtype=np.int64)
        else:
            alive = np.ones(len(keys.ino), bool)
            alive[gone] = False
            rows = np.flatnonzero(alive)
            keys = codec.Keys(keys.ino[rows], keys.generation[rows], keys.digest[rows])
        parts.append((keys, np.full(len(rows), chunk_id, np.int64), rows))
    if not parts:
        empty = np.zeros(0, np.int64)
        return Current(np.zeros(0, np.uint64), empty, empty, empty, empty)
    ino = np.concatenate([p[0].ino for p in parts])
    order = np.argsort(ino, kind="stable")
    return Current(
        ino=ino[order],
        generation=np.concatenate([p[0].generation for p in parts]).astype(np.int64)[order],
        digest=np.concatenate([p[0].digest for p in parts])[order],
        chunk=np.concatenate([p[1] for p in parts])[order],
        row=np.concatenate([p[2] for p in parts])[order],
    )


def write_chunk(
    con: sqlite3.Connection, fs_id: int, snap_id: int, n: int, blobs: dict[str, bytes]
) -> int:
    """Store a chunk of ``n`` versions (``codec.pack_chunk``) recorded by ``snap_id``."""
    cur = con.execute(
        "INSERT INTO version_chunks(fs_id, first_snap, n, live) VALUES (?, ?, ?, ?)",
        (fs_id, snap_id, n, n),
    )
    assert cur.lastrowid is not None
    con.execute(
        "INSERT INTO chunk_blobs(chunk_id, keys, body, keys_crc, body_crc, body_column_crcs)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        (
            cur.lastrowid,
            blobs["keys"],
            blobs["body"],
            blob_crc(blobs["keys"]),
            blob_crc(blobs["body"]),
            codec.column_crcs(blobs["body"], codec.BODY_COLUMNS),
        ),
    )
    return cur.lastrowid


def end_versions(
    con: sqlite3.Connection,
    fs_id: int,
    last_snap: int,
    chunk: I64,
    row: I64,
    checksum: bool = True,
) -> None:
    """Mark versions (chunk, row) as last valid in ``last_snap`` (``checksum``: False in the
    migrations that precede checksums)."""
    if chunk.size == 0:
        return
    order = np.lexsort((row, chunk))
    chunk, row = chunk[order], row[order]
    ids, starts = np.unique(chunk, return_index=True)
    bounds = [*starts.tolist(), len(chunk)]
    for k, chunk_id in enumerate(ids.tolist()):
        rows = row[bounds[k] : bounds[k + 1]].astype("<u4").tobytes()
        if checksum:
            con.execute(
                "INSERT INTO version_ends(chunk_id, fs_id, last_snap, rows, rows_crc)"
                " VALUES (?, ?, ?, ?, ?)",
                (chunk_id, fs_id, last_snap, rows, blob_crc(rows)),
            )
        else:
            con.execute(
                "INSERT INTO version_ends(chunk_id, fs_id, last_snap, rows) VALUES (?, ?, ?, ?)",
                (chunk_id, fs_id, last_snap, rows),
            )
        con.execute(
            "UPDATE version_chunks SET live = live - ?,"
            " dead_after = CASE WHEN live = ? THEN ? ELSE dead_after END WHERE id = ?",
            (len(rows) // 4, len(rows) // 4, last_snap, chunk_id),
        )


def versions_at(con: sqlite3.Connection, fs_id: int, snap_id: int) -> codec.Versions:
    """Every version valid in snapshot ``snap_id``, in ino order."""
    both, alive = chunk_versions_at(con, fs_id, snap_id)
    rows = np.flatnonzero(alive)
    order = rows[np.argsort(both.files.ino[rows], kind="stable")]
    if np.array_equal(order, np.arange(len(both.files))):
        return both
    return both.take(order)


def chunk_versions_at(
    con: sqlite3.Connection, fs_id: int, snap_id: int
) -> tuple[codec.Versions, npt.NDArray[np.bool_]]:
    """The versions of every chunk snapshot ``snap_id`` sees, in chunk order, and which of
    them are valid in it (a reader takes those it wants in one go)."""
    chunks = _with_blobs(
        con,
        _CHUNKS_OF_SNAPSHOT,
        (fs_id, snap_id, snap_id),
        "keys, body, keys_crc, body_crc",
    )
    ended = _ended_rows(con, _ENDED_BEFORE, (fs_id, snap_id, snap_id))
    parts, alive = [], []
    for chunk_id, first_snap, n, (keys, body, keys_crc, body_crc) in chunks:
        blobs = {
            "keys": _checked(keys, keys_crc, first_snap, "keys"),
            "body": _checked(body, body_crc, first_snap, "columns"),
        }
        with _decoding(first_snap):
            v = codec.unpack_chunk(blobs)
            codec.check_count(v, n)
        valid = np.ones(len(v.files), bool)
        gone = ended.get(chunk_id)
        if gone is not None:
            valid[gone] = False
        parts.append(v)
        alive.append(valid)
    return codec.concat_versions(parts), (np.concatenate(alive) if alive else np.zeros(0, bool))


def valid_versions(con: sqlite3.Connection, fs_id: int, snap_id: int) -> codec.Versions:
    """The versions valid in snapshot ``snap_id``: reserved inodes first, then the others,
    each in ino order (as a snapshot's own chunk holds them). Assembled a column at a time,
    each chunk's column let go once taken: the snapshot is held about once, not as its
    chunks, their concatenation and a copy of that in order."""
    parts, rows = _chunks_at(con, fs_id, snap_id)
    if not parts:
        return codec.concat_versions([])
    key = np.concatenate([p.files.ino[r] for p, r in zip(parts, rows, strict=True)])
    special = np.concatenate([p.special[r] for p, r in zip(parts, rows, strict=True)])
    order = np.lexsort((key, ~special))
    del key
    whole = len(parts) == 1 and rows[0].size == len(parts[0].files)
    if whole and np.array_equal(order, np.arange(order.size)):
        return parts[0]  # one chunk, all of it valid and in order: no copy at all
    cols: dict[str, npt.NDArray[Any]] = {}
    for name in FILE_COLUMNS:
        cols[name] = _gathered([getattr(p.files, name) for p in parts], rows, order)
        for p in parts:  # let go of the chunk's column
            setattr(p.files, name, np.zeros(0, FILE_COLUMNS[name]))
    for off_name, children in (
        ("ext_off", ("ext_logical", "ext_physical", "ext_length", "ext_flags")),
        ("meta_off", ("meta_physical", "meta_kind")),
    ):
        taken = [csr_take(getattr(p.files, off_name), r) for p, r in zip(parts, rows, strict=True)]
        idx, cols[off_name] = csr_take(concat_offsets([t[1] for t in taken]), order)
        for child in children:
            part_cols = [getattr(p.files, child)[t[0]] for p, t in zip(parts, taken, strict=True)]
            cols[child] = np.concatenate(part_cols)[idx]
            del part_cols
            for p in parts:
                setattr(p.files, child, getattr(p.files, child)[:0])
        for p in parts:
            setattr(p.files, off_name, getattr(p.files, off_name)[:1])
        del taken, idx
    # each kept link renumbered to its file's place in the result
    place = np.empty(order.size, np.int64)
    place[order] = np.arange(order.size, dtype=np.int64)
    links, link_rows, base = [], [], 0
    for p, r in zip(parts, rows, strict=True):
        rank = np.full(len(p.special) + 1, -1, np.int64)  # the extra slot maps -1 to -1
        rank[r] = np.arange(r.size, dtype=np.int64) + base
        mine = rank[p.link_row]
        keep = mine >= 0
        links.append(codec.select_links(p.links, keep))
        p.links = LinkTable.empty()
        link_rows.append(place[mine[keep]])
        base += r.size
    joined = links[0] if len(links) == 1 else _joined_links(links)
    return codec.Versions(FileTable(**cols), special[order], np.concatenate(link_rows), joined)


def _joined_links(links: list[LinkTable]) -> LinkTable:
    """The links of several chunks, one after the other, each chunk's let go as taken."""
    offsets = concat_offsets([x.name_off for x in links])
    names = b"".join(x.names for x in links)
    parent = np.concatenate([x.parent for x in links])
    ino = np.concatenate([x.ino for x in links])
    links.clear()
    return LinkTable(parent=parent, ino=ino, name_off=offsets, names=names)


def _gathered(columns: list[npt.NDArray[Any]], rows: list[I64], order: I64) -> npt.NDArray[Any]:
    """The valid ``rows`` of each chunk's column, one after the other, in ``order``."""
    return np.concatenate([c[r] for c, r in zip(columns, rows, strict=True)])[order]


def _chunks_at(
    con: sqlite3.Connection, fs_id: int, snap_id: int
) -> tuple[list[codec.Versions], list[I64]]:
    """The chunks snapshot ``snap_id`` sees and the rows of each valid in it."""
    both, alive = [], []
    for chunk_id, first_snap, n, (keys, body, keys_crc, body_crc) in _with_blobs(
        con,
        _CHUNKS_OF_SNAPSHOT,
        (fs_id, snap_id, snap_id),
        "keys, body, keys_crc, body_crc",
    ):
        blobs = {
            "keys": _checked(keys, keys_crc, first_snap, "keys"),
            "body": _checked(body, body_crc, first_snap, "columns"),
        }
        del keys, body
        with _decoding(first_snap):
            v = codec.unpack_chunk(blobs)
            codec.check_count(v, n)
        del blobs
        both.append(v)
        alive.append(chunk_id)
    ended = _ended_rows(con, _ENDED_BEFORE, (fs_id, snap_id, snap_id))
    rows = []
    for v, chunk_id in zip(both, alive, strict=True):
        valid = np.ones(len(v.files), bool)
        gone = ended.get(chunk_id)
        if gone is not None:
            valid[gone] = False
        rows.append(np.flatnonzero(valid).astype(np.int64))
    return both, rows


def forget_snapshot(
    con: sqlite3.Connection, fs_id: int, snap_id: int, older: int | None, newest: bool
) -> None:
    """Adjust versions for the deletion of ``snap_id`` (its row is deleted by the caller).

    A snapshot in the middle needs nothing (see the module docstring). Deleting the newest drops
    the chunks it wrote and the ends it recorded, so the versions it superseded are current
    again. Afterwards, chunks no remaining snapshot can see are dropped.
    """
    if newest:
        # Everything recorded after the snapshot that is now the newest (some of it perhaps by
        # snapshots deleted earlier) goes; what was valid in that one is current again.
        doomed = [r[0] for r in con.execute(
            "SELECT id FROM version_chunks WHERE fs_id = ? AND first_snap > ?",
            (fs_id, older if older is not None else -1),
        )]  # fmt: skip
        _drop_chunks(con, doomed)
        if older is not None:
            restored = con.execute(
                "SELECT chunk_id, SUM(LENGTH(rows)) / 4 FROM version_ends"
                " WHERE fs_id = ? AND last_snap >= ? GROUP BY chunk_id",
                (fs_id, older),
            ).fetchall()
            for chunk_id, count in restored:
                con.execute(
                    "UPDATE version_chunks SET live = live + ?, dead_after = NULL WHERE id = ?",
                    (count, chunk_id),
                )
            con.execute(
                "DELETE FROM version_ends WHERE fs_id = ? AND last_snap >= ?", (fs_id, older)
            )
    invisible = [r[0] for r in con.execute(
        "SELECT c.id FROM version_chunks c WHERE c.fs_id = ? AND c.dead_after IS NOT NULL"
        " AND NOT EXISTS (SELECT 1 FROM snapshots s WHERE s.fs_id = c.fs_id"
        "  AND s.id != ? AND s.id BETWEEN c.first_snap AND c.dead_after)",
        (fs_id, snap_id),
    )]  # fmt: skip
    _drop_chunks(con, invisible)


def _drop_chunks(con: sqlite3.Connection, ids: list[int]) -> None:
    for chunk_id in ids:
        con.execute("DELETE FROM version_ends WHERE chunk_id = ?", (chunk_id,))
        con.execute("DELETE FROM chunk_blobs WHERE chunk_id = ?", (chunk_id,))
        con.execute("DELETE FROM version_chunks WHERE id = ?", (chunk_id,))


def stored_versions(con: sqlite3.Connection) -> int:
    """How many file versions the database holds (for tests and benchmarks)."""
    return int(con.execute("SELECT COALESCE(SUM(n), 0) FROM version_chunks").fetchone()[0])


# Columns a listing shows of each file, besides its inode number.
LISTED_COLUMNS = ("mode", "size", "damaged")
LISTED_EXTENTS = ("ext_logical", "ext_physical", "ext_length")


def listed_subtree(
    con: sqlite3.Connection,
    fs_id: int,
    snap_id: int,
    resolve: Callable[[LinkTable], npt.NDArray[np.uint64] | None],
) -> tuple[LinkTable, dict[str, npt.NDArray[Any]]]:
    """The names of snapshot ``snap_id`` and the listed columns of the files ``resolve``
    picks from them (None: every file), without reading the other columns (see
    ``codec.ColumnReader``).

    The names come in the order a rebuilt snapshot has them (``versions_at``); the files are
    user files (not reserved inodes), in ino order, with ``ext_off`` offsets into their
    extents."""
    chunk_rows = con.execute(
        _CHUNKS_OF_SNAPSHOT,
        (fs_id, snap_id, snap_id),
    ).fetchall()
    ended = _ended_rows(con, _ENDED_BEFORE, (fs_id, snap_id, snap_id))
    with contextlib.ExitStack() as stack:
        chunks = []
        parents, inos, lens, names = [], [], [], []
        for chunk_id, first_snap, n in chunk_rows:
            with _decoding(first_snap):
                keys = _column_reader(con, stack, chunk_id, "keys", first_snap)
                body = _column_reader(con, stack, chunk_id, "body", first_snap)
                codec.check_count(keys, n)
                codec.check_count(body, n)
            ino = keys["ino"].astype(np.uint64, copy=False)
            alive = np.ones(ino.size, bool)
            gone = ended.get(chunk_id)
            if gone is not None:
                alive[gone] = False
            link_row = body["link_rows"].astype(np.int64)
            keep = alive[link_row]
            name_lens = body["name_lens"].astype(np.int64)
            parents.append(body["link_parents"].astype(np.uint64, copy=False)[keep])
            inos.append(ino[link_row[keep]])
            lens.append(name_lens[keep])
            raw = body["names"]
            names.append(raw if keep.all() else raw[np.repeat(keep, name_lens)])
            chunks.append((ino, alive, body))
        lengths = np.concatenate(lens) if lens else np.zeros(0, np.int64)
        off = np.zeros(lengths.size + 1, np.int64)
        np.cumsum(lengths, out=off[1:])  # in the lengths' own type: no cast per value
        links = LinkTable(
            np.concatenate(parents) if parents else np.zeros(0, np.uint64),
            np.concatenate(inos) if inos else np.zeros(0, np.uint64),
            off.view(np.uint64),
            b"".join(n.tobytes() for n in names),
        )
        wanted = resolve(links)
        parts: list[dict[str, npt.NDArray[Any]]] = []
        for ino, alive, body in chunks:
            if wanted is None:
                rows = np.flatnonzero(alive & (body["special"] == 0))
            else:  # reserved inodes told apart among the few picked only
                rows = np.flatnonzero(alive & np.isin(ino, wanted))
                rows = rows[body.take("special", rows) == 0]
            if rows.size == 0:
                continue
            counts = body["ext_counts"]
            if rows.size <= 4:  # a few files: their offsets alone
                ext_off = np.zeros(ino.size + 1, np.uint64)
                for r in rows.tolist():
                    ext_off[r] = counts[:r].sum(dtype=np.uint64)
                    ext_off[r + 1] = ext_off[r] + np.uint64(counts[r])
            else:
                ext_off = np.zeros(ino.size + 1, np.uint64)
                np.cumsum(counts, dtype=np.uint64, out=ext_off[1:])
            part: dict[str, npt.NDArray[Any]] = {"ino": ino[rows]}
            a, b = int(rows[0]), int(rows[-1]) + 1
            if rows.size == b - a and rows.size > 4096:  # one run (user files after reserved)
                e0, e1 = int(ext_off[a]), int(ext_off[b])
                part["ext_off"] = ext_off[a : b + 1] - np.uint64(e0)
                for c in LISTED_COLUMNS:
                    part[c] = body[c][a:b].astype(FILE_COLUMNS[c])
                for c in LISTED_EXTENTS:
                    part[c] = body[c][e0:e1].astype(np.uint64)
                parts.append(part)
                continue
            ext_idx, part["ext_off"] = csr_take(ext_off, rows)
            for c in LISTED_COLUMNS:
                part[c] = body.take(c, rows).astype(FILE_COLUMNS[c])
            for c in LISTED_EXTENTS:
                part[c] = body.take(c, ext_idx).astype(np.uint64)
            parts.append(part)
    return links, _ino_ordered(parts)


def _ino_ordered(parts: list[dict[str, npt.NDArray[Any]]]) -> dict[str, npt.NDArray[Any]]:
    """The parts' files as one set of columns in ino order (the first of equal inos kept, as
    a rebuilt snapshot's lookups by ino find it)."""
    cols = ("ino", *LISTED_COLUMNS)
    if not parts:
        out = {c: np.zeros(0, FILE_COLUMNS[c]) for c in cols}
        out.update({c: np.zeros(0, np.uint64) for c in LISTED_EXTENTS})
        out["ext_off"] = np.zeros(1, np.uint64)
        return out
    ino = np.concatenate([p["ino"] for p in parts])
    if len(parts) == 1 and bool(np.all(ino[1:] > ino[:-1])):
        return parts[0]
    order = np.argsort(ino, kind="stable")
    first = np.ones(order.size, bool)
    first[1:] = ino[order][1:] != ino[order][:-1]
    order = order[first]
    ext_off = concat_offsets([p["ext_off"] for p in parts])
    ext_idx, new_off = csr_take(ext_off, order)
    out = {c: np.concatenate([p[c] for p in parts])[order] for c in cols}
    out.update({c: np.concatenate([p[c] for p in parts])[ext_idx] for c in LISTED_EXTENTS})
    out["ext_off"] = new_off
    return out


def valid_versions_by_column(con: sqlite3.Connection, fs_id: int, snap_id: int) -> codec.Versions:
    """``valid_versions``, with each chunk's body read from SQLite a column at a time
    (``codec.ColumnReader``): neither the compressed blobs nor the decoded chunks are held
    whole beside the result, only one column of each chunk at a time. A snapshot with a
    chunk written before per-column checksums is read whole (``valid_versions``)."""
    chunk_rows = con.execute(
        _CHUNKS_OF_SNAPSHOT,
        (fs_id, snap_id, snap_id),
    ).fetchall()
    if not chunk_rows:
        return codec.concat_versions([])
    ended = _ended_rows(con, _ENDED_BEFORE, (fs_id, snap_id, snap_id))
    with contextlib.ExitStack() as stack:
        chunks: list[_ByColumn] = []
        for chunk_id, first_snap, n in chunk_rows:
            with _decoding(first_snap):
                keys = _column_reader(con, stack, chunk_id, "keys", first_snap)
                body = _column_reader(con, stack, chunk_id, "body", first_snap)
                codec.check_count(keys, n)
                codec.check_count(body, n)
            if body.crcs is None:
                return valid_versions(con, fs_id, snap_id)
            valid = np.ones(n, bool)
            gone = ended.get(chunk_id)
            if gone is not None:
                valid[gone] = False
            chunks.append(_ByColumn(keys, body, first_snap, n, np.flatnonzero(valid)))
        return _assembled(chunks)


@dataclass
class _ByColumn:
    keys: codec.ColumnReader
    body: codec.ColumnReader
    first_snap: int
    n: int
    rows: I64  # the versions valid in the snapshot

    def column(self, name: str, dtype: type[np.generic]) -> npt.NDArray[Any]:
        with _decoding(self.first_snap):
            source = self.keys if name in ("ino", "generation") else self.body
            return source[name].astype(dtype, copy=False)

    def offsets(self, counts: str, children: tuple[str, ...]) -> npt.NDArray[np.uint64]:
        off = np.zeros(self.n + 1, np.uint64)
        np.cumsum(self.column(counts, np.uint64), out=off[1:])
        for child in children:  # as check_count checks a chunk decoded whole
            if self.body.counts[child] != int(off[-1]):
                raise _damaged(self.first_snap, f"{counts} disagree with column {child}")
        return off


_CHILD_TYPES: dict[str, type[np.generic]] = {
    "ext_logical": np.uint64, "ext_physical": np.uint64, "ext_length": np.uint64,
    "ext_flags": np.uint32, "meta_physical": np.uint64, "meta_kind": np.uint8,
}  # fmt: skip


def _assembled(chunks: list[_ByColumn]) -> codec.Versions:
    """The valid versions of ``chunks`` in the order ``valid_versions`` gives them."""
    key = np.concatenate([c.column("ino", np.uint64)[c.rows] for c in chunks])
    special = np.concatenate([c.column("special", np.bool_)[c.rows] for c in chunks])
    order = np.lexsort((key, ~special))
    del key
    in_order = bool(np.array_equal(order, np.arange(order.size)))
    whole = len(chunks) == 1 and chunks[0].rows.size == chunks[0].n

    def gathered(parts: list[npt.NDArray[Any]], rows: list[I64]) -> npt.NDArray[Any]:
        if whole and in_order:
            return parts[0]
        joined = np.concatenate([p[r] for p, r in zip(parts, rows, strict=True)])
        return joined if in_order else joined[order]

    all_rows = [c.rows for c in chunks]
    cols: dict[str, npt.NDArray[Any]] = {
        name: gathered([c.column(name, dtype) for c in chunks], all_rows)
        for name, dtype in FILE_COLUMNS.items()
    }
    for off_name, counts, children in (
        ("ext_off", "ext_counts", ("ext_logical", "ext_physical", "ext_length", "ext_flags")),
        ("meta_off", "meta_counts", ("meta_physical", "meta_kind")),
    ):
        offs = [c.offsets(counts, children) for c in chunks]
        if whole and in_order:
            cols[off_name] = offs[0]
            for child in children:
                cols[child] = chunks[0].column(child, _CHILD_TYPES[child])
            continue
        taken = [csr_take(off, c.rows) for off, c in zip(offs, chunks, strict=True)]
        del offs
        idx, cols[off_name] = csr_take(concat_offsets([t[1] for t in taken]), order)
        for child in children:
            dtype = _CHILD_TYPES[child]
            parts = [c.column(child, dtype)[t[0]] for c, t in zip(chunks, taken, strict=True)]
            cols[child] = np.concatenate(parts)[idx]
            del parts
        del taken, idx
    place = np.empty(order.size, np.int64)
    place[order] = np.arange(order.size, dtype=np.int64)
    # each chunk's names of valid versions taken straight from its columns, then joined once
    parents, inos, lens, names, link_rows = [], [], [], [], []
    base = 0
    for c in chunks:
        with _decoding(c.first_snap):
            link_row = c.column("link_rows", np.int64)
            if link_row.size and int(link_row.max()) >= c.n:
                raise ValueError("a name of a version the chunk does not hold")
            name_lens = c.column("name_lens", np.uint32)
            raw = c.body["names"]
            if name_lens.size != link_row.size or raw.size != int(name_lens.sum(dtype=np.uint64)):
                raise ValueError("name columns disagree")
        rank = np.full(c.n + 1, -1, np.int64)  # the extra slot maps -1 to -1
        rank[c.rows] = np.arange(c.rows.size, dtype=np.int64) + base
        mine = rank[link_row]
        del rank
        keep = mine >= 0
        every = bool(keep.all())
        parent = c.column("link_parents", np.uint64)
        parents.append(parent if every else parent[keep])
        inos.append(c.column("ino", np.uint64)[link_row if every else link_row[keep]])
        lens.append(name_lens if every else name_lens[keep])
        names.append(raw if every else raw[np.repeat(keep, name_lens.astype(np.int64))])
        link_rows.append(place[mine if every else mine[keep]])
        del link_row, name_lens, raw, mine, keep, parent
        base += c.rows.size
    del place
    name_off = np.zeros(sum(x.size for x in lens) + 1, np.uint64)
    np.cumsum(np.concatenate(lens), out=name_off[1:])
    joined = LinkTable(
        parent=parents[0] if len(parents) == 1 else np.concatenate(parents),
        ino=inos[0] if len(inos) == 1 else np.concatenate(inos),
        name_off=name_off,
        names=b"".join(x.data for x in names),
    )
    del parents, inos, lens, names
    return codec.Versions(FileTable(**cols), special[order], np.concatenate(link_rows), joined)
