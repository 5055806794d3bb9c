"""Checksums of the record rows (migration 11): rows already there when a database is migrated
get theirs, every later write keeps them, and a write that would not is refused."""

from __future__ import annotations

import sqlite3
import zlib
from pathlib import Path

import pytest

from fsage.db import rowcheck
from fsage.db.checksum import DamagedError
from fsage.db.store import Store


def _as_before_migration_11(db: Path) -> None:
    """Make ``db`` what a database of schema 10 is: no crc columns, no triggers."""
    con = sqlite3.connect(db)
    for t in rowcheck.TABLES:
        con.execute(f"DROP TRIGGER {t.table}_crc_insert")
        con.execute(f"DROP TRIGGER {t.table}_crc_update")
        con.execute(f"ALTER TABLE {t.table} DROP COLUMN crc")
    con.execute("DELETE FROM schema_migrations WHERE version = 11")
    con.commit()
    con.close()


def test_rows_written_before_migration_11_are_sealed_by_it(tmp_path: Path) -> None:
    db = tmp_path / "x.db"
    with Store.open(db, create=True) as store:
        store.con.execute(
            "INSERT INTO aging_runs(target, kind, started_at, params) VALUES (?, ?, ?, ?)",
            ("/srv/t", "dir", "2026-01-01T00:00:00+00:00", '{"seed": 3}'),
        )
        store.con.execute(
            "INSERT INTO traces(taken_at, source, command, block_size, requests,"
            " discontiguous, blocks) VALUES ('2026-01-01', 'blktrace', 'cat', 4096, 3, 1, 9)"
        )
    _as_before_migration_11(db)
    with Store.open(db) as store:
        assert store.con.execute("SELECT MAX(version) FROM schema_migrations").fetchone() == (11,)
        # the checksum is the CRC-32 of the values as checksum.row_crc frames them: recomputed
        # here from the row, independently of the trigger's function
        row = store.con.execute(
            "SELECT id, fs_id, target, kind, started_at, finished_at, status, params, ops,"
            " bytes_written, metrics, utilization, notes, crc FROM aging_runs"
        ).fetchone()
        crc = 0
        for v in row[:-1]:
            tag, data = (
                (b"n", b"") if v is None else (b"i", str(v).encode()) if isinstance(v, int)
                else (b"s", v.encode())
            )  # fmt: skip
            crc = zlib.crc32(data, zlib.crc32(tag + len(data).to_bytes(8, "little"), crc))
        assert row[-1] == crc
        for t in rowcheck.TABLES:
            rowcheck.verify(store.con, t.table)
        # an update keeps it
        store.con.execute("UPDATE aging_runs SET status = 'finished', ops = 7")
        rowcheck.verify(store.con, "aging_runs")


def test_a_write_without_fsage_is_refused_and_a_changed_value_is_seen(tmp_path: Path) -> None:
    db = tmp_path / "x.db"
    with Store.open(db, create=True) as store:
        store.con.execute(
            "INSERT INTO aging_runs(target, kind, started_at) VALUES ('/t', 'dir', '2026')"
        )
    con = sqlite3.connect(db)  # as the sqlite3 shell would: no fsage function
    with pytest.raises(sqlite3.OperationalError, match=rowcheck.FUNCTION):
        con.execute("UPDATE aging_runs SET ops = 99")
    # the trigger cannot stop a change it does not see: one made with it dropped
    con.execute("DROP TRIGGER aging_runs_crc_update")
    con.execute("UPDATE aging_runs SET ops = 99")
    con.commit()
    con.close()
    with Store.open(db) as store, pytest.raises(DamagedError, match="aging run 1 is damaged"):
        rowcheck.verify(store.con, "aging_runs")
