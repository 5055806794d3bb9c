"""The SQLite store of snapshots.

A file system is known by its UUID and a user-given name. Each snapshot stores only the files
whose layout or metadata changed since the previous snapshot of that file system, as one version
chunk (``fsage.db.versions``), and marks the versions they supersede as ended; any snapshot can
be rebuilt exactly. A snapshot is one transaction; the database runs in WAL mode (a new one
from the end of its first transaction) so that readers never block the writer.
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import sqlite3
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from fsage import scratch
from fsage.db import codec, parts, rowcheck, versions
from fsage.db.checksum import (
    DamagedError,
    blob_crc,
    matches,
    row_crc,
)
from fsage.db.diff import (
    all_files,
    compare_files,
    rows_of,
)
from fsage.db.opening import (
    OPENED,
    check_text,
    create_private,
    database_failure,
    failure_of_latest,
    is_corrupt,
    is_writable,
    open_readonly,
    refuse_damaged,
    refuse_foreign,
    use_wal,
)
from fsage.db.rows import (
    CRC_COVERED,
    SNAPSHOT_SELECT,
    SnapshotRow,
    SnapshotSummary,
    row_to_snapshot,
)
from fsage.db.schema import LATEST_VERSION, current_version, migrate
from fsage.errors import StoreError, UsageError
from fsage.layout import FreeExtents, FsFacts, Layout, LinkTable
from fsage.text import shown

BUSY_TIMEOUT_MS = 60_000
PAGE_SIZE = 16384
#: A database's files: itself, its rollback journal (a new database's first writes) or its
#: write-ahead log and shared memory.
DATABASE_SUFFIXES = ("", "-journal", "-wal", "-shm")

# Columns of other tables that name a snapshot; set to NULL when it is deleted.
_SNAPSHOT_REFERENCES = [
    ("snapshots", "recreation_of"),
    ("aging_runs", "first_snap"),
    ("aging_runs", "last_snap"),
    ("collection_runs", "snapshot_id"),
    ("bench_runs", "snapshot_id"),
    ("traces", "snapshot_id"),
]


def default_fs_name(facts: FsFacts) -> str:
    """The name a file system is recorded under when none is given and the database has none
    for its UUID: its label, else ``fs-`` and the first 8 digits of its UUID (numbered on
    insert when another file system has it); for a read of part of it (a directory below its
    mount, a bind mount), that name (or the whole file system's name in the database), a
    colon and the part's path: ``home:/alice/src``."""
    base = shown(facts.label) or f"fs-{shown(facts.uuid)[:8]}"
    scope = read_scope(facts)
    return base if scope == "/" else f"{base}:{shown(scope)}"


def read_scope(facts: FsFacts) -> str:
    """The part of the file system a layout covers, as a path from its root: "/" for all of
    it (any offline read, a mount of its root read from there)."""
    return _scope_of_extra(facts.extra or {})


def _scope_of_extra(extra: dict[str, Any]) -> str:
    root = str(extra.get("mount_root") or "/")
    sub = str(extra.get("subtree") or "/")
    return posixpath.normpath(posixpath.join("/", root.lstrip("/"), sub.lstrip("/")))


def _scope_of_facts(facts_json: str | None) -> str:
    """``read_scope`` of a stored snapshot's facts; "/" for none or unreadable ones."""
    try:
        extra = json.loads(facts_json or "{}").get("extra")
    except (ValueError, AttributeError):
        return "/"
    return _scope_of_extra(extra) if isinstance(extra, dict) else "/"


def parse_taken_at(spec: str) -> datetime:
    """A snapshot time given by the user (ISO 8601 date or date and time; naive means UTC)."""
    try:
        when = datetime.fromisoformat(spec.strip())
    except ValueError:
        raise UsageError(
            f"--taken-at {spec!r} is not an ISO 8601 time (YYYY-MM-DD[THH:MM[:SS]][+HH:MM])"
        ) from None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


class Store:
    """Open with ``Store.open(path)``; use as a context manager."""

    def __init__(
        self, con: sqlite3.Connection, path: Path, created: bool = False, wal: bool = True
    ) -> None:
        self.con = con
        self.path = path
        self.created = created  # this open made the database
        self._wal = wal  # in WAL mode; if not, it takes it after its first transaction
        self._checked = created  # quick_check passed (a new database has nothing to check)

    @classmethod
    def open(cls, path: Path | str, create: bool = False, readonly: bool = False) -> Store:
        """Open (``create``: or make) the database at ``path``.

        A file that is not an fsage database is refused untouched. A new database is created
        readable by its owner only (its -wal and -shm files take the same mode), whatever the
        umask. ``readonly``: the caller only reads, so a database that cannot be written (on
        read-only media, immutable, or in a directory this user cannot write) is opened
        read-only instead of refused.
        """
        path = Path(path)
        OPENED[:] = [path]  # one entry, however many runs a daemon makes
        if not path.exists() and not create:
            raise StoreError(
                f"no database at {path} (take a snapshot first: fsage snapshot SOURCE --db {path})"
            )
        if path.is_dir():
            raise StoreError(f"{path} is a directory, not a database file")
        new = False
        if not path.exists():
            try:
                create_private(path)
                new = True
            except FileExistsError:  # made by someone else meanwhile: open it as it is
                pass
            except OSError as exc:
                raise StoreError(f"{path}: cannot create the database ({exc.strerror})") from None
        try:
            return cls._connect(path, new, readonly)
        except BaseException:
            if new:  # nothing left behind by a database that could not be made
                for suffix in DATABASE_SUFFIXES:
                    with contextlib.suppress(OSError):
                        os.unlink(f"{path}{suffix}")
            raise

    @classmethod
    def _connect(cls, path: Path, new: bool, readonly: bool) -> Store:
        try:
            if not new:
                refuse_foreign(path)
                if readonly and not is_writable(path):
                    return cls(open_readonly(path), path)
            con = sqlite3.connect(path, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000)
            con.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            rowcheck.register(con)  # the triggers that checksum record rows call it
            con.execute("PRAGMA synchronous=NORMAL")
            con.execute("PRAGMA foreign_keys=ON")
            scratch.sqlite_temp_files(con)
            if new:
                # Large pages: a snapshot writes tens of MB of blobs, and SQLite's cost goes
                # with the number of pages (a new database only; it must precede WAL).
                con.execute(f"PRAGMA page_size={PAGE_SIZE}")
            # A new database takes WAL after its first transaction (_wal_after_first_write).
            if not new and current_version(con) < LATEST_VERSION:
                refuse_damaged(con, path)  # a migration writes: not into a damaged database
            wal = not new and use_wal(con, path)
            migrate(con)
        except sqlite3.OperationalError as exc:  # I/O, a full disk, permissions, a lock
            raise StoreError(f"{path}: cannot use the database ({exc})") from None
        except sqlite3.DatabaseError as exc:
            if is_corrupt(exc):
                raise database_failure(path, exc) from None
            raise StoreError(f"{path}: not an fsage database ({exc})") from None
        except OSError as exc:
            raise StoreError(f"{path}: {exc.strerror}") from None
        return cls(con, path, created=new, wal=wal)

    def _wal_after_first_write(self) -> None:
        """A new database makes its schema and its first transaction (usually a whole
        snapshot) with a rollback journal, which writes their pages once where WAL writes them
        twice (to the log, then to the database at the checkpoint that closing makes): at
        100k files, 11 ms less for the whole `fsage snapshot DIR`. It takes WAL after that
        first transaction, so that readers never block the writer from then on; a database
        left in rollback mode (a kill in between, or another connection in the way of the
        switch) takes it at its next open. A connection that found a database in another's
        first transaction does the same."""
        if not self._wal:
            with contextlib.suppress(sqlite3.Error):
                self._wal = self.con.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal"

    def close(self) -> None:
        self._wal_after_first_write()
        self.con.close()

    def abandon(self) -> None:
        """Close after a failure; a database this open created is removed again while it
        holds no snapshot (another command may have written one meanwhile), so that a first
        snapshot that failed leaves nothing behind."""
        try:
            empty = self.con.execute("SELECT 1 FROM snapshots LIMIT 1").fetchone() is None
        except sqlite3.Error:
            empty = False
        if self.created and empty:
            self.con.close()  # not switched to WAL: about to be removed
            for suffix in DATABASE_SUFFIXES:
                with contextlib.suppress(OSError):
                    os.unlink(f"{self.path}{suffix}")
        else:
            self.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, kind: object, exc: object, tb: object) -> None:
        try:
            self.close()
        except sqlite3.Error:
            if exc is None:
                raise
        if isinstance(exc, sqlite3.Error):
            raise self.failure(exc) from None

    def failure(self, exc: BaseException) -> StoreError:
        """The one line to report an error SQLite raised while using this database."""
        return database_failure(self.path, exc)

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE ... COMMIT; anything raised (or a kill) leaves the database as it was."""
        self.con.execute("BEGIN IMMEDIATE")
        try:
            if not self._checked:
                self._quick_check()
            yield self.con
        except BaseException:
            self.con.execute("ROLLBACK")
            raise
        self.con.execute("COMMIT")
        self._wal_after_first_write()

    def _quick_check(self) -> None:
        """Refuse to write into a database SQLite finds damaged (PRAGMA quick_check: every
        page's structure, without the index cross-checks of integrity_check), once per open;
        under the write lock, so that what was checked is what is written into."""
        refuse_damaged(self.con, self.path)
        self._checked = True

    @contextmanager
    def _reading(self) -> Iterator[None]:
        """One read transaction, so that queries in it see one state while a writer commits."""
        if self.con.in_transaction:
            yield
            return
        self.con.execute("BEGIN")
        try:
            yield
        finally:
            self.con.execute("COMMIT")

    # ---------- queries ----------

    def filesystems(self) -> list[dict[str, Any]]:
        rows = self.con.execute(
            "SELECT f.name, f.uuid, f.kind, f.created_at, COUNT(s.id), MAX(s.taken_at) "
            "FROM filesystems f LEFT JOIN snapshots s ON s.fs_id = f.id "
            "GROUP BY f.id ORDER BY f.name"
        ).fetchall()
        keys = ("name", "uuid", "kind", "created_at", "snapshots", "last_snapshot")
        return [dict(zip(keys, r, strict=True)) for r in rows]

    def snapshots(self, fs_name: str | None = None) -> list[SnapshotRow]:
        with self._naming_damage(None):
            return self._snapshots(fs_name)

    def _snapshots(self, fs_name: str | None) -> list[SnapshotRow]:
        if fs_name is None:
            rows = self.con.execute(SNAPSHOT_SELECT + " ORDER BY s.id").fetchall()
        else:
            self._fs_id(fs_name)
            rows = self.con.execute(
                SNAPSHOT_SELECT + " WHERE f.name = ? ORDER BY s.id", (fs_name,)
            ).fetchall()
        return [row_to_snapshot(r) for r in rows]

    def snapshot(self, snapshot_id: int) -> SnapshotRow:
        row = self.con.execute(SNAPSHOT_SELECT + " WHERE s.id = ?", (snapshot_id,)).fetchone()
        if row is None:
            raise StoreError(f"no snapshot {snapshot_id} in {self.path}")
        with self._naming_damage(None):
            return row_to_snapshot(row)

    def latest_snapshot(self, fs_name: str) -> SnapshotRow | None:
        snaps = self.snapshots(fs_name)
        return snaps[-1] if snaps else None

    def _fs_id(self, fs_name: str) -> int:
        row = self.con.execute("SELECT id FROM filesystems WHERE name = ?", (fs_name,)).fetchone()
        if row is None:
            known = ", ".join(r[0] for r in self.con.execute("SELECT name FROM filesystems"))
            raise StoreError(f"no file system named {fs_name!r} (known: {known or 'none'})")
        return int(row[0])

    # ---------- writing ----------

    def _resolve_fs(self, facts: FsFacts, name: str | None) -> tuple[int, str]:
        con = self.con
        # Labels and uuids are read from disk and need not be UTF-8: stored as shown.
        uuid = shown(facts.uuid)
        if name is not None:
            check_text("--name", name)
            row = con.execute("SELECT id, uuid FROM filesystems WHERE name = ?", (name,)).fetchone()
            if row is not None:
                if row[1] != uuid:
                    raise StoreError(
                        f"file system name {shown(name)!r} belongs to UUID {row[1]}, but this "
                        f"source has UUID {uuid}; choose another --name"
                    )
                return int(row[0]), name
        else:
            # A file system and each part of it read alone (a directory below its mount) are
            # histories of their own: a record is the part its first snapshot covered.
            scope = read_scope(facts)
            whole: str | None = None  # the name of the whole file system, if recorded
            for fs_id, fs_name, first in con.execute(
                "SELECT f.id, f.name, (SELECT s.facts FROM snapshots s WHERE s.fs_id = f.id"
                " ORDER BY s.id LIMIT 1) FROM filesystems f WHERE f.uuid = ? ORDER BY f.id",
                (uuid,),
            ).fetchall():
                part = _scope_of_facts(first)
                if part == scope:
                    return int(fs_id), str(fs_name)
                if part == "/" and whole is None:
                    whole = str(fs_name)
            name = default_fs_name(facts) if whole is None else f"{whole}:{shown(scope)}"
            base, n = name, 1
            while con.execute("SELECT 1 FROM filesystems WHERE name = ?", (name,)).fetchone():
                n += 1
                name = f"{base}-{n}"
        cur = con.execute(
            "INSERT INTO filesystems(name, uuid, kind, created_at) VALUES (?, ?, ?, ?)",
            (name, uuid, facts.kind, datetime.now(UTC).isoformat()),
        )
        assert cur.lastrowid is not None
        return cur.lastrowid, name

    def add_snapshot(
        self,
        layout: Layout,
        name: str | None = None,
        source: str = "",
        taken_at: datetime | None = None,
        op_count: int | None = None,
        bytes_written: int | None = None,
        label: str | None = None,
        recreation_of: int | None = None,
        started: float | None = None,
    ) -> SnapshotSummary:
        """Record a Layout as a new snapshot, storing only what changed since the last one.

        ``started`` (a time.monotonic() value) lets the reported seconds include the read.
        """
        t0 = started if started is not None else time.monotonic()
        taken = taken_at or datetime.now(UTC)
        if taken.tzinfo is None:
            raise StoreError("snapshot time must carry a time zone")
        source = shown(source)  # a path given on the command line need not be UTF-8
        if label is not None:
            check_text("--label", label)
        everything, is_special = all_files(layout)
        link_file = codec.link_files(everything, layout.links)
        digests = codec.file_digests(everything, layout.links, link_file).view(np.int64)
        free = layout.free
        free_blocks = layout.blocks_free
        free_blob = zlib.compress(
            np.stack([free.start, free.length], axis=1).astype("<u8").tobytes(), 1
        )

        with self.transaction() as con:
            fs_id, fs_name = self._resolve_fs(layout.facts, name)
            last = con.execute(
                "SELECT id, taken_at FROM snapshots WHERE fs_id = ? ORDER BY id DESC LIMIT 1",
                (fs_id,),
            ).fetchone()
            if last is not None and datetime.fromisoformat(last[1]) > taken:
                raise StoreError(
                    f"{fs_name} already has a snapshot taken at {last[1]}, later than "
                    f"{taken.isoformat()}; snapshots of a file system are recorded in time order"
                )
            with self._naming_damage(last[0] if last is not None else None):
                now = versions.current(con, fs_id)
            user = ~is_special
            diff = compare_files(now, everything.ino, everything.generation, digests, user)
            n_files = int(np.count_nonzero(user))
            n_regular = int(np.count_nonzero(everything.is_regular() & user))
            dirs = int(np.count_nonzero(everything.is_dir() & user))
            extents = int(np.diff(everything.ext_off)[user].sum())
            snap_id = self._next_snapshot_id(con)
            con.execute(
                "INSERT INTO snapshots(id, fs_id, taken_at, source, kind, facts, files, dirs,"
                " extents, blocks_used, blocks_free, free_extents, damaged, new_files,"
                " changed_files, deleted_files, seconds, free_map, notes, op_count,"
                " bytes_written, label, recreation_of, regular_files)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    snap_id,
                    fs_id,
                    taken.astimezone(UTC).isoformat(),
                    source,
                    layout.facts.kind,
                    json.dumps(layout.facts.to_json()),
                    n_files,
                    dirs,
                    extents,
                    layout.facts.blocks_total - free_blocks,
                    free_blocks,
                    len(free),
                    layout.damaged_files,
                    diff.new,
                    diff.changed,
                    diff.deleted,
                    0.0,
                    free_blob,
                    json.dumps(layout.notes),
                    op_count,
                    bytes_written,
                    label,
                    recreation_of,
                    n_regular,
                ),
            )
            if last is not None:
                gone = diff.superseded
                versions.end_versions(con, fs_id, last[0], now.chunk[gone], now.row[gone])
            rows = diff.write_rows
            for k in range(0, max(len(rows), 1), versions.CHUNK_MAX_ROWS):
                part = rows[k : k + versions.CHUNK_MAX_ROWS]
                if len(part) == 0:
                    break
                whole = len(part) == len(everything)
                blobs = codec.pack_chunk(
                    everything, is_special, digests, layout.links, link_file,
                    None if whole else part,
                )  # fmt: skip
                versions.write_chunk(con, fs_id, snap_id, len(part), blobs)
            seconds = time.monotonic() - t0
            con.execute("UPDATE snapshots SET seconds = ? WHERE id = ?", (seconds, snap_id))
            # The checksum of the row as SQLite gives it back, as readers will see it.
            covered = con.execute(
                "SELECT " + CRC_COVERED + " WHERE s.id = ?", (snap_id,)
            ).fetchone()
            con.execute(
                "UPDATE snapshots SET crc = ?, free_crc = ? WHERE id = ?",
                (row_crc(covered), blob_crc(free_blob), snap_id),
            )
        return SnapshotSummary(
            snapshot_id=snap_id,
            fs_name=fs_name,
            files=n_files,
            extents=extents,
            free_extents=len(free),
            new_files=diff.new,
            changed_files=diff.changed,
            deleted_files=diff.deleted,
            damaged=layout.damaged_files,
            seconds=seconds,
            regular_files=n_regular,
        )

    def _next_snapshot_id(self, con: sqlite3.Connection) -> int:
        """One more than any id ever given, so that a deleted snapshot's id is never reused."""
        (given,) = con.execute(
            "SELECT MAX(COALESCE((SELECT MAX(id) FROM snapshots), 0),"
            " COALESCE((SELECT value FROM store_meta WHERE key = 'last_snapshot_id'), 0))"
        ).fetchone()
        con.execute(
            "INSERT OR REPLACE INTO store_meta(key, value) VALUES ('last_snapshot_id', ?)",
            (given + 1,),
        )
        return int(given) + 1

    # ---------- deleting ----------

    def delete_snapshots(self, ids: Iterable[int]) -> int:
        """Delete snapshots (for retention) in one transaction; returns how many.

        Every other snapshot still rebuilds exactly: validity intervals are compared by
        snapshot id, so a deleted snapshot in the middle needs no change to the versions around
        it; deleting the newest makes the versions it superseded current again. Versions no
        remaining snapshot can see are dropped. References from other tables become NULL.
        """
        wanted = sorted(set(ids), reverse=True)  # newest first: each deletion sees the rest
        with self.transaction() as con:
            for snap_id in wanted:
                self._delete_snapshot(con, snap_id)
        return len(wanted)

    def _delete_snapshot(self, con: sqlite3.Connection, snap_id: int) -> None:
        row = con.execute("SELECT fs_id FROM snapshots WHERE id = ?", (snap_id,)).fetchone()
        if row is None:
            raise StoreError(f"no snapshot {snap_id} in {self.path}")
        fs_id = int(row[0])
        newer = con.execute(
            "SELECT 1 FROM snapshots WHERE fs_id = ? AND id > ?", (fs_id, snap_id)
        ).fetchone()
        older = con.execute(
            "SELECT MAX(id) FROM snapshots WHERE fs_id = ? AND id < ?", (fs_id, snap_id)
        ).fetchone()[0]
        for table, column in _SNAPSHOT_REFERENCES:
            con.execute(f"UPDATE {table} SET {column} = NULL WHERE {column} = ?", (snap_id,))
        versions.forget_snapshot(con, fs_id, snap_id, older, newest=newer is None)
        con.execute("DELETE FROM snapshots WHERE id = ?", (snap_id,))

    # ---------- rebuilding ----------

    def load_layout(self, snapshot_id: int, *, by_column: bool = False) -> Layout:
        """Rebuild a snapshot exactly: every file, its extents and names, free space, facts.
        ``by_column``: read the stored chunks a column at a time (the same layout, with a
        lower peak of memory: ``versions.valid_versions_by_column``)."""
        with self._naming_damage(snapshot_id), self._reading():
            self.snapshot(snapshot_id)  # its row checked
            fs_id, facts_json, free_blob, notes, free_crc = self.con.execute(
                "SELECT fs_id, facts, free_map, notes, free_crc FROM snapshots WHERE id = ?",
                (snapshot_id,),
            ).fetchone()
            if not isinstance(free_blob, bytes) or not matches(free_crc, blob_crc(free_blob)):
                raise DamagedError("its free map does not match its checksum")
            read = versions.valid_versions_by_column if by_column else versions.valid_versions
            stored = read(self.con, fs_id, snapshot_id)
            alive = np.ones(len(stored.files), bool)
            return self._layout_of(stored, alive, facts_json, free_blob, notes)

    def _layout_of(
        self,
        stored: codec.Versions,
        alive: npt.NDArray[np.bool_],
        facts_json: str,
        free_blob: bytes,
        notes: str,
    ) -> Layout:
        # the valid versions in ino order, user files and reserved inodes each taken once
        table = stored.files
        rows = np.flatnonzero(alive)
        rows = rows[np.argsort(table.ino[rows], kind="stable")]
        special = stored.special[rows]
        links = stored.links
        if not alive.all():
            links = codec.select_links(links, alive[stored.link_row])
        pairs = np.frombuffer(zlib.decompress(free_blob), "<u8").reshape(-1, 2)
        facts = FsFacts.from_json(json.loads(facts_json))
        return Layout(
            facts=facts,
            files=rows_of(table, rows[~special]),
            links=links,
            free=FreeExtents(pairs[:, 0].astype(np.uint64), pairs[:, 1].astype(np.uint64)),
            special=rows_of(table, rows[special]),
            notes=list(json.loads(notes)),
        )

    @contextmanager
    def snapshot_parts(
        self,
        snapshot_id: int,
        rows: int | None = None,
        done: Callable[[float], None] | None = None,
    ) -> Iterator[tuple[list[Layout], parts.SnapshotParts | None]]:
        """A snapshot read a part at a time (``fsage.db.parts``), in one read transaction:
        its layout without files, names or free map (facts, notes; the parts give the free
        map a window at a time) and its parts; None for the parts when a chunk predates
        per-column checksums (``load_layout`` reads it). ``done(share)``: the share of its
        chunks checked as they are opened."""
        what = f"{self.path}: snapshot {snapshot_id}"
        with self._reading(), contextlib.ExitStack() as stack:
            with self._naming_damage(snapshot_id):
                self.snapshot(snapshot_id)  # its row checked
                fs_id, facts_json, notes = self.con.execute(
                    "SELECT fs_id, facts, notes FROM snapshots WHERE id = ?", (snapshot_id,)
                ).fetchone()
                empty = codec.concat_versions([])
                # no free map here: the parts read it a piece at a time (``free_windows``)
                no_free = zlib.compress(b"")
                head = self._layout_of(empty, np.zeros(0, bool), facts_json, no_free, notes)
                found = stack.enter_context(
                    parts.open_parts(self.con, fs_id, snapshot_id, rows, done)
                )
            held = [head]
            del head
            try:
                yield held, found
            except DamagedError as exc:  # a part read as the caller goes: the caller's
                # own errors pass as they are
                raise StoreError(f"{what} cannot be read: {exc}") from None

    def listed_subtree(
        self, snapshot_id: int, resolve: Callable[[LinkTable], npt.NDArray[np.uint64] | None]
    ) -> tuple[LinkTable, dict[str, npt.NDArray[Any]]]:
        """A snapshot's names, and what a listing shows of the files ``resolve`` picks from
        them (None: all), reading no other column (see ``versions.listed_subtree``)."""
        with self._naming_damage(snapshot_id), self._reading():
            self.snapshot(snapshot_id)  # its row checked
            (fs_id,) = self.con.execute(
                "SELECT fs_id FROM snapshots WHERE id = ?", (snapshot_id,)
            ).fetchone()
            return versions.listed_subtree(self.con, fs_id, snapshot_id, resolve)

    @contextmanager
    def _naming_damage(self, snapshot_id: int | None) -> Iterator[None]:
        """Report what cannot be read as one line naming the database and the snapshot."""
        what = f"{self.path}: snapshot {snapshot_id}" if snapshot_id else f"{self.path}"
        try:
            yield
        except DamagedError as exc:
            raise StoreError(f"{what} cannot be read: {exc}") from None
        except (ValueError, IndexError, OverflowError, KeyError, TypeError, zlib.error) as exc:
            # What its checksums passed and still does not decode: damage sealed in when they
            # were added to an older database, or a reader's fault; not called damage for sure
            # (a user could throw away a sound database).
            raise StoreError(
                f"{what} cannot be read: it matches its checksums but does not decode ({exc!r});"
                " damage from before they were kept, or a fault in fsage (please report it)"
            ) from None


__all__ = [
    "DATABASE_SUFFIXES",
    "SnapshotRow",
    "SnapshotSummary",
    "Store",
    "database_failure",
    "default_fs_name",
    "failure_of_latest",
    "parse_taken_at",
    "read_scope",
]
