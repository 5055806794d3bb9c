"""One snapshot exported a part at a time (``fsage.db.parts``): its file versions, their
ends and its figures, with memory bounded by a part (its rows and extents over all chunks)
and a few numbers a directory (the path walk's; the directories' paths are in a SQLite
scratch file), not by the snapshot. The rows are those of the whole-snapshot path
(``export._export_snapshot``), in the same order.

Between snapshots the keys of the open versions (inode, generation, digest, first snapshot)
live in a file (``Keys``), read back a window at a time as the parts come in inode order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from fsage import paged
from fsage.analyzer import spill
from fsage.analyzer.pathwalk import bucket_starts
from fsage.analyzer.spill import Buckets
from fsage.analyzer.streamed import StreamedFigures, free_figures
from fsage.db.parts import Names, SnapshotParts
from fsage.db.store import SnapshotRow
from fsage.fleet.export_metrics import rows_of_figures, snapshot_row
from fsage.fleet.export_prefixes import DiskPrefixes
from fsage.fleet.export_rows import diff_keys, files_table
from fsage.fleet.pieces import PieceWriter
from fsage.fleet.ranked import RankedInodes
from fsage.layout import Layout, LinkTable

I64 = npt.NDArray[np.int64]

KEY = np.dtype([("ino", "<i8"), ("generation", "<i8"), ("digest", "<i8"), ("first", "<i8")])
LINK = np.dtype([("seq", "<i8"), ("ino", "<i8"), ("parent", "<i8"), ("valid", "u1")])
# Parts (or pieces of names) between two heap trims (a trim costs a walk over the heap, and
# the pages it gives back are faulted in again: not after every part). Without them in the
# names phase, at 22.4M files its freed pieces held 64 MiB by its end.
TRIM_PARTS = 8


def _no_trim() -> None:
    pass


# Free extents written at a time, in a row group each (Parquet's default of 1M compresses
# better, by a quarter of the table's bytes, but holds 60 MB more at 1.25M free extents).
FREE_ROWS = 1 << 16
# Progress: the share of a snapshot's time taken by its opening (its chunks checked), by that
# and its free map (read twice: its figures, then its rows), by those and its names, and by
# those and its parts (the path-order walk the rest). The first snapshot of 11.2M files
# (bench/fleet_memory.py's) took 99 s: 1.7 to open, 5.6 in its free map, 8.9 in its names,
# 55 in its parts, 28 in the walk.
OPEN_SHARE = 0.02
FREE_SHARE = 0.08
NAMES_SHARE = 0.16
PARTS_SHARE = 0.7
# File versions converted to Arrow and written at a time.
FILES_CHUNK = 65536
# Row groups of one file of a run (``fsage.fleet.pieces``): a whole run's row-group metadata,
# in many small pieces between the parts' arrays, raised the peak by 28 MiB over the first
# snapshot's parts at 22.4M files; 64 row groups a file kept it at 11.
FILE_GROUPS = 64


class RowGroups:
    """Parquet files fed tables of any size: rows are written in row groups of ``size``
    (tables of a part each would make many small ones, a larger file), the last one of a
    ``flush`` smaller; a file holds ``per_file`` row groups, then ``open_file(k)`` gives the
    writer of the ``k``-th next one (only when it has rows to write).

    ``write_table`` writes whole row groups as soon as it has them. ``hold`` keeps the rows
    until ``settle``, called between two parts: whole row groups are written then, when the
    part's arrays are gone, and the rest waits in a file (Arrow IPC) for the next parts. A
    later snapshot adds a few rows a part, so a row group's rows would otherwise stay in
    memory over many parts, beside each one's arrays (18 MiB at 64k files)."""

    def __init__(self, pa: Any, open_file: Callable[[int], Any], size: int = FILES_CHUNK,
                 per_file: int | None = None) -> None:  # fmt: skip
        self.pa = pa
        self.files = PieceWriter(open_file, size, per_file or FILE_GROUPS)
        self.size = size
        self.pending: list[Any] = []
        self.rows = 0
        self.waiting: Path | None = None  # rows written to disk by ``settle``
        self.out: Any = None  # its writer, open until they are read back: each row is
        # written once however many parts it waits over
        self.schema: Any = None

    def write_table(self, table: Any) -> None:
        self.hold(table)
        if self.rows >= self.size:
            self._write_whole()

    def hold(self, table: Any) -> None:
        self.pending.append(table)
        self.rows += table.num_rows
        self.schema = table.schema

    def settle(self, path: Path) -> None:
        """Write the whole row groups held, and the rows left over to ``path``."""
        if not self.pending:
            return
        if self.rows >= self.size:
            self._write_whole()
        if not self.pending:
            return
        if self.out is None:
            self.out = self.pa.ipc.new_stream(str(path), self.schema)
            self.waiting = path
        for t in self.pending:
            self.out.write_table(t)
        self.pending = []

    def _unwait(self) -> list[Any]:
        """The rows waiting on disk, read into the C heap (where the last part's arrays
        were freed: numpy's allocator, not Arrow's own pool), the file removed."""
        if self.waiting is None:
            return []
        self.out.close()
        self.out = None
        pool = self.pa.system_memory_pool()
        with self.pa.OSFile(str(self.waiting), memory_pool=pool) as f:
            table = self.pa.ipc.open_stream(f, memory_pool=pool).read_all()
        self.waiting.unlink()
        self.waiting = None
        return [table]

    def _write_whole(self) -> None:
        joined = self.pa.concat_tables([*self._unwait(), *self.pending])
        whole = self.rows - self.rows % self.size
        self.files.write(joined.slice(0, whole))
        self.pending = [joined.slice(whole)] if whole < self.rows else []
        self.rows -= whole

    def flush(self) -> None:
        held = [*self._unwait(), *self.pending]
        if held:
            self.files.write(self.pa.concat_tables(held))
        self.pending, self.rows = [], 0

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self.files.close()


class Keys:
    """The open versions' keys in inode order, in a file: written in order, read in order."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.n = 0
        path.write_bytes(b"")
        self.at = 0
        self.buf = np.zeros(0, KEY)

    @classmethod
    def of(cls, path: Path, keys: dict[str, I64]) -> Keys:
        k = cls(path)
        rec = np.zeros(keys["ino"].size, KEY)
        for name in KEY.names or ():
            rec[name] = keys[name]
        k.add(rec)
        return k

    def add(self, rec: npt.NDArray[Any]) -> None:
        if rec.size:
            with open(self.path, "ab") as f:
                rec.tofile(f)
            self.n += int(rec.size)

    def upto(self, hi: int | None) -> dict[str, I64]:
        """The next records whose inode is below ``hi`` (None: all that are left)."""
        parts = []
        while True:
            if self.buf.size == 0:
                if self.at >= self.n:
                    break
                with open(self.path, "rb") as f:
                    f.seek(self.at * KEY.itemsize)
                    self.buf = np.fromfile(f, KEY, min(spill.WINDOW, self.n - self.at))
                self.at += int(self.buf.size)
            cut = self.buf.size if hi is None else int(np.searchsorted(self.buf["ino"], hi))
            parts.append(self.buf[:cut])
            self.buf = self.buf[cut:]
            if self.buf.size:
                break
        rec = np.concatenate(parts) if parts else np.zeros(0, KEY)
        return {
            "ino": rec["ino"].copy(),
            "generation": rec["generation"].copy(),
            "digest": rec["digest"].copy(),
            "first": rec["first"].copy(),
        }


class _PartPaths:
    """``FirstPaths`` of a part's files from its names (sorted by inode, then link order)."""

    def __init__(self, links: npt.NDArray[Any], off: Any, names: bytes, prefix: DiskPrefixes,
                 root_ino: int) -> None:  # fmt: skip
        self.links, self.off, self.names = links, off, names
        self.prefix, self.root_ino = prefix, root_ino

    def first(self, inos: I64) -> list[str | None]:
        ino = self.links["ino"]
        lo = np.searchsorted(ino, inos, side="left").tolist()
        hi = np.searchsorted(ino, inos, side="right").tolist()
        heads = self.prefix.heads(self.links["parent"])
        off = self.off.tolist()
        out: list[str | None] = []
        for i, a, b in zip(inos.tolist(), lo, hi, strict=True):
            found = ["/"] if i == self.root_ino else []
            for r in range(a, b):
                head = heads[r]
                if head is not None:
                    name = self.names[off[r] : off[r + 1]].decode("utf-8", "surrogateescape")
                    found.append(f"{head}/{name}")
            out.append(min(found) if found else None)
        return out


def _parents(sp: SnapshotParts, trim: Callable[[], None] = _no_trim) -> tuple[RankedInodes, bool]:
    """Every inode that names an entry, as a set that ranks its members, and whether the
    snapshot has any name.

    Those among the user files' inode numbers are marked a bit a number, as ``sp.exists``
    marks the files (the pieces' inodes gathered and made unique took three to four times
    eight bytes a directory at once); the few others (reserved inodes, names in directories
    the snapshot does not hold) are gathered."""
    bits = sp.inode_bits()
    base, n = bits.base, bits.n
    other: list[I64] = []
    any_name = False
    for k, parent in enumerate(sp.parents()):
        if k % TRIM_PARTS == TRIM_PARTS - 1:
            trim()
        any_name = any_name or parent.size > 0
        p = parent.astype(np.int64)
        inside = (p >= base) & (p < base + n)
        bits.add(np.unique(p[inside]))
        if not inside.all():
            other.append(np.unique(p[~inside]))
            if len(other) > 8:
                other = [np.unique(np.concatenate(other))]
    outside = np.unique(np.concatenate(other)) if other else np.zeros(0, np.int64)
    return RankedInodes(bits, outside), any_name


def _names_by_part(
    sp: SnapshotParts, tmp: Path, parents: RankedInodes, trim: Callable[[], None] = _no_trim
) -> tuple[Buckets, DiskPrefixes, npt.NDArray[np.bool_], npt.NDArray[np.uint32]]:
    """The user files' names bucketed by part (``LINK`` records), the names whose inode
    names entries (on disk, for their prefixes), which of ``parents`` (by rank) some other
    name names, and how many names each of them holds."""
    out = Buckets(tmp, "links", LINK, names=True)
    counts = paged.zeros(parents.size, np.uint32)
    dirs = DiskPrefixes(tmp / "prefixes.sqlite")
    # a byte a directory: the inodes themselves, gathered and made unique at the end, took
    # four times eight
    named = paged.zeros(parents.size, bool)
    for k, n in enumerate(sp.names()):
        if k % TRIM_PARTS == TRIM_PARTS - 1:
            trim()
        ino = n.ino.astype(np.int64)
        parent = n.parent.astype(np.int64)
        if parents.size:
            hit = np.flatnonzero(parents(ino))
            off = n.name_off.astype(np.int64)
            dirs.add(n.seq[hit], parent[hit], ino[hit], off[:-1][hit], off[1:][hit], n.names)
            del off
            other = ino[hit] != parent[hit]
            named[parents.rank(ino[hit][other])] = True
        user = np.flatnonzero(n.user)
        rec = np.zeros(user.size, LINK)
        rec["seq"] = n.seq[user]
        rec["ino"] = ino[user]
        rec["parent"] = parent[user]
        rec["valid"] = (parent[user] != ino[user]) & sp.exists(n.parent[user])
        if parents.size:  # the entries of each directory, for the walk's buckets
            by = parent[user][rec["valid"] != 0]
            by = by[parents(by)]
            # the piece's own directories (a count for every directory would be allocated
            # and cleared again for each piece)
            at, times = np.unique(parents.rank(by), return_counts=True)
            counts[at] += times.astype(np.uint32)
        sub = _subset(n, user)
        out.add(sp.part_of(n.ino[user]) + 1, rec, sub.name_off, sub.names)
    return out, dirs, named, counts


def _subset(n: Names, rows: I64) -> Names:
    """The names of ``rows`` (ascending); ``n`` itself when those are all of them."""
    if rows.size == n.seq.size:
        return n
    lens = (n.name_off[1:] - n.name_off[:-1])[rows]
    off = np.zeros(rows.size + 1, np.uint64)
    np.cumsum(lens, out=off[1:])
    from fsage.analyzer.dynamic import ranges

    raw = np.frombuffer(n.names, np.uint8)
    sub = raw[ranges(n.name_off[:-1][rows].astype(np.int64), n.name_off[1:][rows].astype(np.int64))]
    return Names(n.seq[rows], n.parent[rows], n.ino[rows], n.user[rows], off, sub.tobytes())


def export_snapshot(
    pa: Any,
    sch: dict[str, Any],
    large: dict[str, Any],
    host: str,
    row: SnapshotRow,
    held: list[Layout],
    sp: SnapshotParts,
    prev: Keys,
    cur: Keys,
    ended_at: int,
    tmp: Path,
    tick: Callable[[float], None],
    trim: Callable[[], None],
) -> tuple[dict[str, Any], Any, int]:
    """Write one snapshot's file versions and their ends, keep its keys in ``cur``; return
    its snapshot row, its figures' rows and how many versions it added. ``tick(share)``: the
    share of the snapshot done (from ``OPEN_SHARE``, its opening's), along its free map, after
    its names, after each part and along the walk."""
    fs = row.fs_name
    head = held.pop()
    # the free map first, a window at a time: it is as large as the free extents are many
    span = FREE_SHARE - OPEN_SHARE
    free = free_figures(head, lambda: sp.free_windows(lambda d: tick(OPEN_SHARE + span * d / 2)))
    windows = sp.free_windows(lambda d: tick(OPEN_SHARE + span * (1 + d) / 2))
    _write_free_windows(pa, sch, large, host, fs, row.id, windows)
    large["free_extents"].flush()  # its last row group now, not held over the parts
    snap = snapshot_row(host, row, head)
    trim()
    tick(FREE_SHARE)
    parents, any_name = _parents(sp, trim)
    trim()  # freed memory given back between phases: the heap of one is not the next one's
    tick((FREE_SHARE + NAMES_SHARE) / 2)
    root_ino = head.root_ino
    links, prefix, named, entries = _names_by_part(sp, tmp, parents, trim)
    trim()  # the names' pieces, freed
    prefix.finish(root_ino)
    root = -1
    if sp.exists(np.array([root_ino], np.uint64))[0] and (
        not any_name or parents(np.array([root_ino], np.int64))[0]
    ):
        root = root_ino
    else:  # the one directory with entries that no other one names
        tops = parents.select(np.flatnonzero(~named))
        if tops.size == 1 and sp.exists(tops.astype(np.uint64))[0]:
            root = int(tops[0])
    del named
    trim()
    tick(NAMES_SHARE)
    cuts = parents.select(bucket_starts(entries))
    del entries
    figures = StreamedFigures(head, sp.all_inos(), root, cuts, parents, tmp, free)
    trim()
    bounds = sp.bounds.tolist()
    versions = 0
    nparts = max(len(bounds), 1)
    for n, (k, part) in enumerate(sp.parts()):
        if n % TRIM_PARTS == TRIM_PARTS - 1:
            trim()
        tick(NAMES_SHARE + (PARTS_SHARE - NAMES_SHARE) * n / nparts)
        files = part.files
        ino = files.ino.astype(np.int64)
        rec, off, names = links.load(k + 1)
        by = np.argsort(rec["ino"], kind="stable")
        rec = rec[by]
        lens = (off[1:] - off[:-1])[by]
        raw = np.frombuffer(names, np.uint8)
        from fsage.analyzer.dynamic import ranges

        names = raw[ranges(off[:-1][by].astype(np.int64), off[1:][by].astype(np.int64))].tobytes()
        off = np.zeros(by.size + 1, np.uint64)
        np.cumsum(lens, out=off[1:])
        # each file's first name whose directory is a file of the snapshot
        cand = np.flatnonzero(rec["valid"] != 0)
        c_ino, at = np.unique(rec["ino"][cand], return_index=True)
        first_name = cand[at]
        parent = np.full(ino.size, -1, np.int64)
        name_row = np.zeros(ino.size, np.int64)
        where = np.searchsorted(ino, c_ino)
        parent[where] = rec["parent"][first_name]
        name_row[where] = first_name
        layout = Layout(facts=head.facts, files=files, links=LinkTable.empty(), free=head.free)
        hi = bounds[k + 1] if k + 1 < len(bounds) else None
        old = prev.upto(hi)
        new_rows, keys, ended = diff_keys(old, ino, part.generation, part.digest)
        _write_ends(pa, sch, large, host, fs, old, ended, ended_at, hold=True)
        paths = _PartPaths(rec, off, names, prefix, root_ino)
        for lo in range(0, new_rows.size, FILES_CHUNK):
            table = files_table(
                pa, sch["files"], host, fs, row.id, layout,
                new_rows[lo : lo + FILES_CHUNK], part.digest, paths,
            )  # fmt: skip
            large["files"].hold(table)
            del table
        versions += int(new_rows.size)
        keys["first"][new_rows] = row.id
        out = np.zeros(ino.size, KEY)
        for name in KEY.names or ():
            out[name] = keys[name]
        cur.add(out)
        figures.add(layout, parent, name_row, off, names)
        # none of a part's arrays outlive it: the next part is read in while these would
        # still be bound, and the peak would hold two parts
        del layout, files, part, rec, names, ino, by, lens, raw, off, cand, c_ino, at
        del first_name, parent, name_row, where, old, new_rows, keys, ended, paths, out
        settle(large, tmp)
    old = prev.upto(None)
    _write_ends(pa, sch, large, host, fs, old, np.arange(old["ino"].size), ended_at, hold=True)
    settle(large, tmp)
    # what only the parts needed goes before the walk: the directories' paths and which
    # inodes name entries
    prefix.close()
    del prefix, old, parents
    figures.parts_done()
    trim()
    tick(PARTS_SHARE)
    found = figures.finish(trim, lambda done: tick(PARTS_SHARE + (1 - PARTS_SHARE) * done))
    tick(1.0)
    return snap, rows_of_figures(host, row, found), versions


def settle(large: dict[str, Any], tmp: Path) -> None:
    """Between parts: the files' and their ends' whole row groups written, the rest on disk."""
    for name in ("files", "file_ends"):
        large[name].settle(tmp / f"waiting-{name}.arrows")


def _write_ends(pa: Any, sch: dict[str, Any], large: dict[str, Any], host: str, fs: str,
                prev: dict[str, I64], ended: I64, ended_at: int,
                hold: bool = False) -> None:  # fmt: skip
    ends = large["file_ends"]
    (ends.hold if hold else ends.write_table)(
        pa.table(
            {
                "host": pa.array([host] * ended.size, pa.string()),
                "fs": pa.array([fs] * ended.size, pa.string()),
                "ino": prev["ino"][ended],
                "first_snapshot": prev["first"][ended],
                "last_snapshot": np.full(ended.size, ended_at, np.int64),
            },
            schema=sch["file_ends"],
        )
    )


def _write_free(pa: Any, sch: dict[str, Any], large: dict[str, Any], host: str, fs: str,
                snap_id: int, layout: Layout) -> None:  # fmt: skip
    free = layout.free
    _write_free_windows(pa, sch, large, host, fs, snap_id, (
        (free.start[lo : lo + FREE_ROWS], free.length[lo : lo + FREE_ROWS])
        for lo in range(0, max(len(free.start), 1), FREE_ROWS)
    ))  # fmt: skip


def _write_free_windows(pa: Any, sch: dict[str, Any], large: dict[str, Any], host: str,
                        fs: str, snap_id: int,
                        windows: Iterable[tuple[Any, Any]]) -> None:  # fmt: skip
    wrote = False
    for w_start, w_length in windows:
        if w_start.size == 0 and wrote:
            continue
        wrote = True
        start = w_start.astype(np.int64)
        large["free_extents"].write_table(
            pa.table(
                {
                    "host": pa.repeat(pa.scalar(host, pa.string()), start.size),
                    "fs": pa.repeat(pa.scalar(fs, pa.string()), start.size),
                    "snapshot_id": np.full(start.size, snap_id, np.int64),
                    "start": start,
                    "length": w_length.astype(np.int64),
                },
                schema=sch["free_extents"],
            )
        )
    if not wrote:  # an empty free map writes an empty table, as the whole path does
        _write_free_windows(pa, sch, large, host, fs, snap_id, [(np.zeros(0), np.zeros(0))])
