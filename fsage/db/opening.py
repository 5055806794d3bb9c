"""Opening a database safely: WAL mode, read-only and private files, refusing a database that
is not fsage's or is damaged before anything is written, and one line for SQLite's errors.
"""

from __future__ import annotations

import os
import sqlite3
import urllib.parse
from pathlib import Path

from fsage.db.schema import LATEST_VERSION, current_version
from fsage.errors import StoreError
from fsage.private import PRIVATE_MODE, file_mode
from fsage.text import shown

_MIGRATION_COLUMNS = ["version", "name", "applied_at"]


def use_wal(con: sqlite3.Connection, path: Path) -> bool:
    """Put the database in WAL mode; False, leaving it as it is, while another connection holds
    a new database in its first transaction (SQLite does not wait for that lock here): that
    one switches at its end, or this one after its own first transaction."""
    try:
        mode = con.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    except sqlite3.OperationalError as exc:
        if exc.sqlite_errorcode in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
            return False
        raise
    if mode != "wal":
        raise StoreError(f"{path}: cannot use WAL mode ({mode})")
    return True


def db_uri(path: Path, **params: str) -> str:
    query = "&".join(f"{k}={v}" for k, v in params.items())
    return f"file:{urllib.parse.quote(str(path.resolve()))}?{query}"


def refuse_foreign(path: Path) -> None:
    """Refuse a database that is not fsage's before anything is written to it: one that holds
    tables but not fsage's ``schema_migrations``, or not an SQLite database at all."""
    try:
        con = sqlite3.connect(db_uri(path, mode="ro"), uri=True)
    except sqlite3.Error as exc:
        raise StoreError(f"{path}: cannot use the database ({exc})") from None
    try:
        try:
            tables, columns = schema_of(con)
        except sqlite3.OperationalError:
            # A WAL database whose -shm cannot be made here: look at the file as it is.
            con.close()
            con = sqlite3.connect(db_uri(path, mode="ro", immutable="1"), uri=True)
            tables, columns = schema_of(con)
    except sqlite3.OperationalError as exc:  # I/O, a lock: not the file's fault
        raise StoreError(f"{path}: cannot use the database ({exc})") from None
    except sqlite3.DatabaseError as exc:
        if is_corrupt(exc):  # an SQLite database whose schema cannot be read: damaged
            raise database_failure(path, exc) from None
        raise StoreError(f"{path}: not an fsage database ({exc}); left untouched") from None
    finally:
        con.close()
    if tables and columns != _MIGRATION_COLUMNS:
        shown_tables = ", ".join(shown(t) for t in sorted(tables)[:5])
        more = ", ..." if len(tables) > 5 else ""
        raise StoreError(
            f"{path}: not an fsage database (it holds the tables {shown_tables}{more});"
            " left untouched"
        )


def schema_of(con: sqlite3.Connection) -> tuple[list[str], list[str]]:
    """The tables of a database, and the columns of its schema_migrations table."""
    tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    columns = [r[1] for r in con.execute("PRAGMA table_info(schema_migrations)")]
    return tables, columns


def is_writable(path: Path) -> bool:
    """Whether a WAL connection can write here: the file, and the directory for -wal/-shm."""
    return os.access(path, os.W_OK) and os.access(path.parent, os.W_OK | os.X_OK)


def open_readonly(path: Path) -> sqlite3.Connection:
    """A read-only connection to a database that cannot be written; through its WAL where it
    can be read, else the file as it is (immutable: no lock, no -shm)."""
    con = sqlite3.connect(db_uri(path, mode="ro"), uri=True, isolation_level=None)
    try:
        version = current_version(con)
    except sqlite3.OperationalError:
        con.close()
        con = sqlite3.connect(
            db_uri(path, mode="ro", immutable="1"), uri=True, isolation_level=None
        )
        version = current_version(con)
    if version != LATEST_VERSION:
        con.close()
        raise StoreError(
            f"{path}: read-only database of schema version {version} (this fsage reads"
            f" {LATEST_VERSION}); copy it somewhere writable so that it can be migrated"
        )
    return con


def create_private(path: Path) -> None:
    """An empty database file (SQLite takes an empty file for a new database) that only its
    owner can read, whatever the umask; SQLite gives -wal and -shm the same mode."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, file_mode())
    try:
        if file_mode() == PRIVATE_MODE:
            os.fchmod(fd, PRIVATE_MODE)
    finally:
        os.close(fd)


def check_text(what: str, text: str) -> None:
    """A name or note given by the user is stored as text: it must be valid UTF-8."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise StoreError(f"{what} {shown(text)!r} is not valid UTF-8") from None


RECOVER_HINT = "restore it from a backup, or recover what it holds with sqlite3's .recover"


def is_corrupt(exc: sqlite3.DatabaseError) -> bool:
    """SQLite read a database whose pages are damaged (SQLITE_CORRUPT), as opposed to a file
    that is no database at all (SQLITE_NOTADB)."""
    return (getattr(exc, "sqlite_errorcode", 0) & 0xFF) == sqlite3.SQLITE_CORRUPT


def database_failure(path: Path, exc: BaseException) -> StoreError:
    """One line for an error SQLite raised while using the database at ``path``."""
    if isinstance(exc, sqlite3.OperationalError):  # I/O, a full disk, permissions, a lock
        return StoreError(f"{path}: cannot use the database ({exc})")
    if isinstance(exc, sqlite3.DatabaseError):
        return StoreError(f"{path}: the database is damaged ({exc}); {RECOVER_HINT}")
    return StoreError(f"{path}: {exc}")


def refuse_damaged(con: sqlite3.Connection, path: Path) -> None:
    """Raise unless the database passes PRAGMA quick_check (the structure of every page,
    without integrity_check's cross-checks of indexes against tables)."""
    try:
        problems = [r[0] for r in con.execute("PRAGMA quick_check(3)")]
    except sqlite3.DatabaseError as exc:
        problems = [str(exc)]
    if problems != ["ok"]:
        # one line: the first problem named (a report starts "*** in database main ***")
        lines = [ln for p in problems for ln in str(p).splitlines() if not ln.startswith("***")]
        raise StoreError(
            f"{path}: the database is damaged ({shown(lines[0] if lines else '?')});"
            f" nothing was written to it ({RECOVER_HINT})"
        )


#: The database this process opened last (a list of at most one): the CLI names it in the
#: one line it prints for an SQLite error raised outside a ``with Store.open(...)`` block.
OPENED: list[Path] = []


def failure_of_latest(exc: BaseException) -> StoreError:
    """One line for an SQLite error raised while using the database opened last."""
    return database_failure(OPENED[-1] if OPENED else Path("the database"), exc)
