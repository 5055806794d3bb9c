"""A benchmark run as fsage keeps it: ``BenchRun``, and the tables ``bench_runs`` and
``bench_results`` it is stored in and read back from."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from fsage.db import rowcheck
from fsage.replay.bench.layoutscore import BenchLayout
from fsage.replay.bench.suites import Result


@dataclass
class BenchRun:
    suite: str
    target: str
    via: str
    fs_name: str
    started_at: str
    seconds: float
    cold: bool
    params: dict[str, Any]
    results: list[Result]
    layout: BenchLayout | None
    notes: list[str] = field(default_factory=list)
    run_id: int | None = None
    fs_id: int | None = None
    snapshot_id: int | None = None

    @property
    def layout_score_bench_files(self) -> float | None:
        return None if self.layout is None or self.layout.bench is None else self.layout.bench.score

    @property
    def layout_score_old_files(self) -> float | None:
        return None if self.layout is None or self.layout.old is None else self.layout.old.score

    def result_scores(self, r: Result) -> tuple[float | None, float | None]:
        """Layout scores for one result: of the files it measured where they are a group of
        the run's files, else of the run's files."""
        if self.layout is not None and r.group:
            return self.layout.group_scores(r.group)
        return self.layout_score_bench_files, self.layout_score_old_files

    def results_json(self) -> list[dict[str, Any]]:
        out = []
        for r in self.results:
            bench, old = self.result_scores(r)
            out.append(
                {
                    "suite": self.suite,
                    "params": {**_public(self.params), **r.params},
                    "metric": r.metric,
                    "value": r.value,
                    "unit": r.unit,
                    "layout_score_bench_files": bench,
                    "layout_score_old_files": old,
                }
            )
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "suite": self.suite,
            "target": self.target,
            "via": self.via,
            "fs_name": self.fs_name,
            "fs_id": self.fs_id,
            "snapshot_id": self.snapshot_id,
            "started_at": self.started_at,
            "seconds": self.seconds,
            "cold": self.cold,
            "params": _public(self.params),
            "layout_score_bench_files": self.layout_score_bench_files,
            "layout_score_old_files": self.layout_score_old_files,
            "layout": None if self.layout is None else self.layout.to_json(),
            "notes": self.notes,
            "results": self.results_json(),
        }


def _public(params: dict[str, Any]) -> dict[str, Any]:
    """Params without the bulky raw texts (postmark's configuration and output)."""
    return {k: v for k, v in params.items() if k not in ("config", "output")}


def store_run(store: Any, run: BenchRun, uuid: str | None = None, named: bool = False) -> int:
    """Insert ``run`` and its results; link it to the file system of the same UUID (and that
    file system's newest snapshot) when the store knows one, and, unless ``named`` (--name
    given), record it under that file system's name."""
    con = store.con
    if uuid:
        row = con.execute(
            "SELECT id, name FROM filesystems WHERE uuid = ? ORDER BY id LIMIT 1", (uuid,)
        ).fetchone()
        if row is not None:
            run.fs_id = int(row[0])
            if not named:
                run.fs_name = str(row[1])
            snap = con.execute(
                "SELECT MAX(id) FROM snapshots WHERE fs_id = ?", (run.fs_id,)
            ).fetchone()
            run.snapshot_id = None if snap is None or snap[0] is None else int(snap[0])
    with store.transaction() as tx:
        cur = tx.execute(
            "INSERT INTO bench_runs (suite, target, fs_name, fs_id, snapshot_id, started_at, "
            "finished_at, seconds, params, cold, layout_score_bench_files, "
            "layout_score_old_files, layout, notes) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                run.suite,
                run.target,
                run.fs_name,
                run.fs_id,
                run.snapshot_id,
                run.started_at,
                datetime.now(UTC).isoformat(timespec="seconds"),
                run.seconds,
                json.dumps(run.params, default=str),
                int(run.cold),
                run.layout_score_bench_files,
                run.layout_score_old_files,
                json.dumps(None if run.layout is None else run.layout.to_json()),
                json.dumps(run.notes),
            ),
        )
        run_id = int(cur.lastrowid or 0)
        for r in run.results:
            bench, old = run.result_scores(r)
            tx.execute(
                "INSERT INTO bench_results (run_id, metric, value, unit, params, "
                "layout_score_bench_files, layout_score_old_files) VALUES (?,?,?,?,?,?,?)",
                (run_id, r.metric, float(r.value), r.unit, json.dumps(r.params), bench, old),
            )
    run.run_id = run_id
    return run_id


@dataclass
class StoredResult:
    run_id: int
    suite: str
    fs_name: str | None
    target: str
    started_at: str
    cold: bool
    run_params: dict[str, Any]
    layout: dict[str, Any] | None
    metric: str
    value: float
    unit: str
    params: dict[str, Any]
    layout_score_bench_files: float | None
    layout_score_old_files: float | None
    snapshot_id: int | None = None


def has_bench_tables(con: Any) -> bool:
    row = con.execute(
        "SELECT 1 FROM sqlite_master WHERE type='table' AND name='bench_results'"
    ).fetchone()
    return row is not None


def stored_results(store: Any, suite: str | None = None) -> list[StoredResult]:
    """Every stored result (with its run's facts), oldest run first."""
    con = store.con
    if not has_bench_tables(con):
        return []
    rowcheck.verify_all(con, ("bench_runs", "bench_results"))
    sql = (
        "SELECT r.id, r.suite, r.fs_name, r.target, r.started_at, r.cold, r.params, r.layout, "
        "x.metric, x.value, x.unit, x.params, x.layout_score_bench_files, "
        "x.layout_score_old_files, r.snapshot_id FROM bench_results x "
        "JOIN bench_runs r ON r.id = x.run_id"
    )
    args: tuple[Any, ...] = ()
    if suite is not None:
        sql += " WHERE r.suite = ?"
        args = (suite,)
    sql += " ORDER BY r.id, x.rowid"
    out = []
    for row in con.execute(sql, args):
        out.append(
            StoredResult(
                run_id=int(row[0]),
                suite=str(row[1]),
                fs_name=row[2],
                target=str(row[3]),
                started_at=str(row[4]),
                cold=bool(row[5]),
                run_params=json.loads(row[6] or "{}"),
                layout=json.loads(row[7]) if row[7] else None,
                metric=str(row[8]),
                value=float(row[9]),
                unit=str(row[10]),
                params=json.loads(row[11] or "{}"),
                layout_score_bench_files=row[12],
                layout_score_old_files=row[13],
                snapshot_id=None if row[14] is None else int(row[14]),
            )
        )
    return out
