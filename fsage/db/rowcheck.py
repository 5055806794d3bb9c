"""Checksums of the rows of fsage's record tables (aging runs, collection runs, the daemon's
plans, bench runs and results, traces, studies), verified when they are read.

Each of these tables carries a ``crc`` column (migration 11): the CRC-32 (``checksum.row_crc``)
of the row's values. SQLite triggers keep it: every INSERT or UPDATE of a covered column sets
it through the SQL function ``fsage_row_crc``, which every connection fsage writes through
registers (``register``), so that no writer of these tables can forget it. A connection
without the function (the ``sqlite3`` shell) cannot write these tables: a change made outside
fsage would otherwise read as damage. A reader calls ``verify`` before it trusts the rows, and
a row that does not match is named in one line. Rows written before migration 11 are given
their checksum by the migration.

Columns that name a snapshot are left out: deleting the snapshot sets them to NULL
(``store._SNAPSHOT_REFERENCES``), which would otherwise read as damage.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fsage.db.checksum import DamagedError, row_crc
from fsage.text import shown

FUNCTION = "fsage_row_crc"


@dataclass(frozen=True)
class Covered:
    table: str
    columns: tuple[str, ...]  # in checksum order
    name: Callable[[dict[str, object]], str]  # the row as a user knows it, from its values


def _cols(names: str) -> tuple[str, ...]:
    return tuple(names.split())


def _q(v: object) -> str:
    return shown(str(v))


TABLES: tuple[Covered, ...] = (
    Covered(
        "aging_runs",
        _cols(
            "id fs_id target kind started_at finished_at status params ops "
            "bytes_written metrics utilization notes"
        ),
        lambda r: f"aging run {r['id']}",
    ),
    Covered(
        "collection_runs",
        _cols("id target source started_at finished_at status error seconds pruned trigger pid"),
        lambda r: f"collection run {r['id']}",
    ),
    Covered(
        "daemon_targets",
        _cols("target source schedule next_run updated_at pid"),
        lambda r: f"the daemon's plan for target {_q(r['target'])}",
    ),
    Covered(
        "bench_runs",
        _cols(
            "id suite target fs_name fs_id started_at finished_at seconds params "
            "cold layout_score_bench_files layout_score_old_files layout notes"
        ),
        lambda r: f"bench run {r['id']}",
    ),
    Covered(
        "bench_results",
        _cols("run_id metric value unit params layout_score_bench_files layout_score_old_files"),
        lambda r: f"a result of bench run {r['run_id']} ({_q(r['metric'])})",
    ),
    Covered(
        "traces",
        _cols(
            "id taken_at source device command block_size requests discontiguous "
            "blocks score modeled_score params"
        ),
        lambda r: f"trace {r['id']}",
    ),
    Covered(
        "studies",
        _cols("id created_at out_dir params finished_at"),
        lambda r: f"study {r['id']}",
    ),
    Covered(
        "study_results",
        _cols(
            "id study_id step fs layout_score dynamic_score aged_seconds "
            "clean_seconds aged_clean_ratio blocks_free metrics"
        ),
        lambda r: f"the result of study {r['study_id']}, step {r['step']}, {_q(r['fs'])}",
    ),
)
_BY_TABLE = {t.table: t for t in TABLES}


def _lenient(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def _row_crc(*values: object) -> int:
    return row_crc(values)


def register(con: sqlite3.Connection) -> None:
    """Make the triggers' function known to ``con`` (every connection that may write)."""
    con.create_function(FUNCTION, -1, _row_crc, deterministic=True)


def migration_sql() -> str:
    """Migration 11: the crc columns and the triggers that keep them."""
    out = []
    for t in TABLES:
        new = ", ".join(f"NEW.{c}" for c in t.columns)
        seal = f"BEGIN UPDATE {t.table} SET crc = {FUNCTION}({new}) WHERE rowid = NEW.rowid; END;"
        out += [
            f"ALTER TABLE {t.table} ADD COLUMN crc INTEGER;",
            f"CREATE TRIGGER {t.table}_crc_insert AFTER INSERT ON {t.table} {seal}",
            f"CREATE TRIGGER {t.table}_crc_update AFTER UPDATE OF {', '.join(t.columns)}"
            f" ON {t.table} {seal}",
        ]
    return "\n".join(out)


def seal_existing(con: sqlite3.Connection) -> None:
    """Migration 11's step: the rows already there get their checksum (they are trusted as
    they are, as the quick check that precedes every migration found them)."""
    for t in TABLES:
        con.execute(f"UPDATE {t.table} SET crc = {FUNCTION}({', '.join(t.columns)})")


def verify(
    con: sqlite3.Connection, table: str, where: str = "", args: Sequence[object] = ()
) -> None:
    """Check the rows of ``table`` (those ``where`` selects, with ``args``) against their
    checksums; raise DamagedError naming the first that does not match. A database from
    before migration 11 (read-only, not migrated) has no checksums to check."""
    t = _BY_TABLE[table]
    cols = ", ".join(t.columns)
    factory = con.text_factory
    # Damaged text may not be UTF-8: read it so that it fails its checksum, not the decoder.
    con.text_factory = _lenient
    try:
        rows = con.execute(f"SELECT {cols}, crc FROM {table} {where}", tuple(args)).fetchall()
    except sqlite3.OperationalError as exc:
        if "no such column: crc" in str(exc) or "no such table" in str(exc):
            return
        raise
    finally:
        con.text_factory = factory
    for *values, crc in rows:
        if crc is not None and crc == row_crc(values):
            continue
        row = dict(zip(t.columns, values, strict=True))
        what = "has no checksum" if crc is None else "does not match its checksum"
        raise DamagedError(f"{_path(con)}{t.name(row)} is damaged (its row {what})")


def _path(con: sqlite3.Connection) -> str:
    """The database's file, as the start of an error line ("" for one in memory)."""
    for _, name, file in con.execute("PRAGMA database_list"):
        if name == "main" and file:
            return f"{file}: "
    return ""


def verify_all(con: sqlite3.Connection, tables: Sequence[str]) -> None:
    for table in tables:
        verify(con, table)
