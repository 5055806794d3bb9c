"""The ``aging_runs`` table: one row per ``fsage age`` run recorded with a database (its
parameters, outcome, metrics and snapshots), written as the run starts and ends. A run resumed
with ``--resume`` continues its row: the row's ops, bytes, snapshots, times and notes are the
whole run's, and ``params["resumed_at"]`` lists the ops it was resumed at."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fsage.db import rowcheck

if TYPE_CHECKING:
    from fsage.db.store import Store


def _now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _start_aging_run(store: Store, kind: str, path: Path, params: dict[str, Any]) -> int:
    """A new row for a run on ``path`` (``kind``: how it reaches it, ``Target.kind``; a match
    prefixes it with ``match-``)."""
    with store.transaction() as con:
        cur = con.execute(
            "INSERT INTO aging_runs(target, kind, started_at, params) VALUES (?, ?, ?, ?)",
            (str(path), kind, _now_iso(), json.dumps(params, sort_keys=True, default=str)),
        )
        assert cur.lastrowid is not None
        return cur.lastrowid


def _finish_aging_run(
    store: Store,
    run_id: int,
    *,
    name: str | None,
    status: str,
    ops: int,
    bytes_written: int,
    snapshots: list[int],
    metrics: dict[str, Any] | None = None,
    utilization: dict[str, Any] | None = None,
    notes: list[str] | None = None,
) -> None:
    with store.transaction() as con:
        row = con.execute("SELECT id FROM filesystems WHERE name = ?", (name,)).fetchone()
        con.execute(
            "UPDATE aging_runs SET fs_id = ?, finished_at = ?, status = ?, ops = ?,"
            " bytes_written = ?, first_snap = ?, last_snap = ?, metrics = ?, utilization = ?,"
            " notes = ? WHERE id = ?",
            (
                int(row[0]) if row is not None and snapshots else None,
                _now_iso(),
                status,
                ops,
                bytes_written,
                min(snapshots) if snapshots else None,
                max(snapshots) if snapshots else None,
                json.dumps(metrics or {}, sort_keys=True, allow_nan=False, default=_json_default),
                json.dumps(utilization or {}, sort_keys=True, allow_nan=False),
                json.dumps(notes or []),
                run_id,
            ),
        )


def _json_default(obj: object) -> Any:
    return str(obj)


@dataclass
class AgingRun:
    """One row of ``aging_runs`` (see migration 2 in ``fsage.db.schema``)."""

    id: int
    fs: str | None
    target: str
    kind: str
    status: str
    started_at: str
    finished_at: str | None
    params: dict[str, Any]
    ops: int
    bytes_written: int
    first_snap: int | None
    last_snap: int | None
    metrics: dict[str, Any]
    utilization: dict[str, Any]
    notes: list[str]

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def aging_runs(store: Store, fs_name: str | None = None, kind: str | None = None) -> list[AgingRun]:
    """The aging runs recorded in ``store``, oldest first; only those of file system
    ``fs_name`` and/or target kind ``kind`` (e.g. ``lfs``) when given."""
    sql = (
        "SELECT r.id, f.name, r.target, r.kind, r.status, r.started_at, r.finished_at,"
        " r.params, r.ops, r.bytes_written, r.first_snap, r.last_snap, r.metrics,"
        " r.utilization, r.notes FROM aging_runs r LEFT JOIN filesystems f ON f.id = r.fs_id"
    )
    where: list[str] = []
    args: list[Any] = []
    rowcheck.verify(store.con, "aging_runs")
    if fs_name is not None:
        store.snapshots(fs_name)  # an unknown name is an error, as elsewhere
        where.append("f.name = ?")
        args.append(fs_name)
    if kind is not None:
        where.append("r.kind = ?")
        args.append(kind)
    if where:
        sql += " WHERE " + " AND ".join(where)
    out = []
    for row in store.con.execute(sql + " ORDER BY r.id", args):
        out.append(
            AgingRun(
                id=int(row[0]),
                fs=row[1],
                target=row[2],
                kind=row[3],
                status=row[4],
                started_at=row[5],
                finished_at=row[6],
                params=_loads(row[7], {}),
                ops=int(row[8]),
                bytes_written=int(row[9]),
                first_snap=row[10],
                last_snap=row[11],
                metrics=_loads(row[12], {}),
                utilization=_loads(row[13], {}),
                notes=_loads(row[14], []),
            )
        )
    return out


def _loads(text: str | None, empty: Any) -> Any:
    try:
        value = json.loads(text) if text else empty
    except ValueError:
        return empty
    return value if isinstance(value, type(empty)) else empty


#: Metrics that add up over the parts of a resumed run (the rest are the last part's, or, on
#: an LFS image, the whole run's through ``Target.carry_counters``).
_SUMMED = ("elapsed_s", "snapshot_s", "executor_s", "cpu_user_s", "cpu_system_s", "nospace",
           "skipped")  # fmt: skip


def _resumable_run(store: Store, run_id: int | None, journal: Path, kind: str) -> AgingRun | None:
    """The row of the interrupted run a resume continues: the one its record names (else,
    for a record of an older fsage, the last one that ran the same journal), when it is
    there, on the same kind of target and not finished."""
    rows = aging_runs(store)
    if run_id is not None:
        rows = [r for r in rows if r.id == run_id]
    else:
        rows = [r for r in rows if r.params.get("journal") == str(journal)][-1:]
    for r in rows:
        if r.kind == kind and r.status != "finished":
            return r
    return None


def _reopen_aging_run(store: Store, run: AgingRun, at: int) -> None:
    """Mark ``run`` running again, resumed at op ``at``."""
    run.params["resumed_at"] = [*run.params.get("resumed_at", []), at]
    with store.transaction() as con:
        con.execute(
            "UPDATE aging_runs SET status = 'running', finished_at = NULL, params = ? WHERE id = ?",
            (json.dumps(run.params, sort_keys=True, default=str), run.id),
        )


def _missed_snapshot(store: Store, run: AgingRun | None, at: int, every: int | None) -> bool:
    """Whether the interrupted ``run``, resumed at op ``at``, stopped on its snapshot cadence
    (``every`` ops) before that op's snapshot was taken (killed between the two)."""
    if run is None or not every or at == 0 or at % every:
        return False
    if run.last_snap is None:
        return True
    return store.snapshot(run.last_snap).op_count != at


def _merged_metrics(earlier: dict[str, Any], part: dict[str, Any]) -> dict[str, Any]:
    """The metrics of a resumed run: ``part``'s, with the times and counts that add up summed
    over ``earlier`` (what the row held) and fsage's own share of the whole."""
    out = dict(part)
    for key in _SUMMED:
        if isinstance(earlier.get(key), int | float) and isinstance(part.get(key), int | float):
            out[key] = earlier[key] + part[key]
    work = out.get("elapsed_s", 0.0) - out.get("snapshot_s", 0.0)
    if "executor_s" in out and work > 0:
        out["own_share"] = (work - out["executor_s"]) / work
    return out
