"""A study's rows in the database: the study, and one row per step and file system."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fsage.db import rowcheck
from fsage.db.store import Store
from fsage.errors import StoreError


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def create_study(store: Store, out: Path, params: dict[str, Any]) -> int:
    with store.transaction() as tx:
        cur = tx.execute(
            "INSERT INTO studies(created_at, out_dir, params) VALUES (?, ?, ?)",
            (_now(), str(out), json.dumps(params, sort_keys=True)),
        )
        return int(cur.lastrowid or 0)


def finish_study(store: Store, study_id: int) -> None:
    with store.transaction() as tx:
        tx.execute("UPDATE studies SET finished_at = ? WHERE id = ?", (_now(), study_id))


def measured(store: Store, study_id: int) -> set[tuple[int, str]]:
    """(step, file system) pairs whose results are stored."""
    rows = store.con.execute(
        "SELECT step, fs FROM study_results WHERE study_id = ?", (study_id,)
    ).fetchall()
    return {(int(r[0]), str(r[1])) for r in rows}


def failed(store: Store, study_id: int) -> set[str]:
    """File systems a step failed on (the study went on without them)."""
    rows = store.con.execute(
        "SELECT fs FROM study_results WHERE study_id = ? AND json_extract(metrics, '$.error')"
        " IS NOT NULL",
        (study_id,),
    ).fetchall()
    return {str(r[0]) for r in rows}


def save_result(store: Store, study_id: int, step: int, fs: str, metrics: dict[str, Any]) -> None:
    """One step's results for one file system, in one transaction (replacing a partial one)."""
    scan = metrics.get("scan") or {}
    trace = scan.get("trace") or {}
    with store.transaction() as tx:
        tx.execute(
            "INSERT OR REPLACE INTO study_results(study_id, step, fs, snapshot_id, layout_score,"
            " dynamic_score, aged_seconds, clean_seconds, aged_clean_ratio, blocks_free, metrics)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                study_id,
                step,
                fs,
                metrics.get("snapshot_id"),
                metrics.get("layout_score"),
                trace.get("score"),
                scan.get("aged_seconds"),
                scan.get("clean_seconds"),
                scan.get("ratio"),
                metrics.get("blocks_free"),
                json.dumps(metrics, sort_keys=True, default=str),
            ),
        )


@dataclass
class StudyRow:
    id: int
    created_at: str
    out_dir: str
    params: dict[str, Any]
    finished_at: str | None
    results: list[dict[str, Any]]  # each: step, fs and the stored metrics

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "created_at": self.created_at,
            "out_dir": self.out_dir,
            "params": self.params,
            "finished_at": self.finished_at,
            "results": self.results,
        }


def load_study(store: Store, study_id: int) -> StudyRow:
    try:
        row = store.con.execute(
            "SELECT id, created_at, out_dir, params, finished_at FROM studies WHERE id = ?",
            (study_id,),
        ).fetchone()
    except sqlite3.OperationalError as exc:  # an older database without the studies table
        if "no such table" not in str(exc):
            raise  # damage, a lock: said as any database error is
        raise StoreError(f"no study {study_id} in this database ({exc})") from None
    if row is None:
        raise StoreError(f"no study {study_id} in this database")
    rowcheck.verify(store.con, "studies", "WHERE id = ?", (study_id,))
    rowcheck.verify(store.con, "study_results", "WHERE study_id = ?", (study_id,))
    res = store.con.execute(
        "SELECT step, fs, metrics FROM study_results WHERE study_id = ? ORDER BY step, id",
        (study_id,),
    ).fetchall()
    results = [{"step": int(r[0]), "fs": str(r[1]), **json.loads(r[2])} for r in res]
    return StudyRow(int(row[0]), row[1], row[2], json.loads(row[3]), row[4], results)


def list_studies(store: Store) -> list[dict[str, Any]]:
    rowcheck.verify_all(store.con, ("studies", "study_results"))
    rows = store.con.execute(
        "SELECT s.id, s.created_at, s.out_dir, s.params, s.finished_at,"
        " (SELECT COUNT(*) FROM study_results r WHERE r.study_id = s.id)"
        " FROM studies s ORDER BY s.id"
    ).fetchall()
    return [
        {
            "id": int(r[0]),
            "created_at": r[1],
            "out_dir": r[2],
            "params": json.loads(r[3]),
            "finished_at": r[4],
            "results": int(r[5]),
        }
        for r in rows
    ]
