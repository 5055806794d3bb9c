"""``fsage daemon --status``: per target its last success, last failure and next run, read
from the database (and the configuration) without disturbing a running daemon.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fsage.db import rowcheck
from fsage.db.store import Store
from fsage.snapshotter.daemonconfig import DaemonConfig, describe_schedule
from fsage.snapshotter.daemonlock import lock_holder


@dataclass
class TargetStatus:
    target: str
    source: str | None = None
    schedule: str | None = None
    last_success_at: datetime | None = None
    last_success_snapshot: int | None = None
    last_failure_at: datetime | None = None
    last_failure_error: str | None = None
    last_status: str | None = None
    next_run: datetime | None = None
    runs: int = 0
    failures: int = 0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in self.__dict__.items():
            out[key] = value.isoformat() if isinstance(value, datetime) else value
        return out


@dataclass
class DaemonStatus:
    database: Path
    daemon_pid: int | None
    targets: list[TargetStatus]

    def to_json(self) -> dict[str, Any]:
        return {
            "database": str(self.database),
            "daemon_running": self.daemon_pid is not None,
            "daemon_pid": self.daemon_pid or None,
            "targets": [t.to_json() for t in self.targets],
        }


def _parse_utc(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


def daemon_status(
    database: Path, config: DaemonConfig | None = None, now: float | None = None
) -> DaemonStatus:
    """Per target: last success, last failure, next run. Reads the database only."""
    now = time.time() if now is None else now
    pid = lock_holder(database)
    statuses: dict[str, TargetStatus] = {}
    if config is not None:
        for t in config.targets:
            statuses[t.name] = TargetStatus(
                t.name,
                str(t.source),
                describe_schedule(t.schedule),
                next_run=datetime.fromtimestamp(t.schedule.next_run(now), UTC),
            )
    if config is not None and not database.exists():
        return DaemonStatus(database, pid, list(statuses.values()))
    with Store.open(database, readonly=True) as store:
        con = store.con
        rowcheck.verify_all(con, ("daemon_targets", "collection_runs"))
        plans = con.execute(
            "SELECT target, source, schedule, next_run, pid FROM daemon_targets ORDER BY rowid"
        ).fetchall()
        for name, source, sched, next_run, plan_pid in plans:
            st = statuses.get(name)
            if st is None:
                if config is not None:
                    continue  # a target of another configuration
                st = statuses[name] = TargetStatus(name, source, sched)
            # The running daemon's own plan (jitter included) beats a fresh computation.
            if pid is not None and plan_pid == pid and next_run is not None:
                st.next_run = _parse_utc(next_run)
        rows = con.execute(
            "SELECT target, source, status, COUNT(*), SUM(status = 'failed') FROM collection_runs"
            " GROUP BY target ORDER BY MIN(id)"
        ).fetchall()
        for name, source, _status, runs, failures in rows:
            st = statuses.get(name)
            if st is None:
                if config is not None:
                    continue
                st = statuses[name] = TargetStatus(name, source)
            st.runs, st.failures = int(runs), int(failures or 0)
            last = con.execute(
                "SELECT status FROM collection_runs WHERE target = ? ORDER BY id DESC LIMIT 1",
                (name,),
            ).fetchone()
            st.last_status = last[0]
            ok = con.execute(
                "SELECT finished_at, snapshot_id FROM collection_runs"
                " WHERE target = ? AND status = 'ok' ORDER BY id DESC LIMIT 1",
                (name,),
            ).fetchone()
            if ok is not None:
                st.last_success_at, st.last_success_snapshot = _parse_utc(ok[0]), ok[1]
            bad = con.execute(
                "SELECT finished_at, error FROM collection_runs"
                " WHERE target = ? AND status != 'ok' ORDER BY id DESC LIMIT 1",
                (name,),
            ).fetchone()
            if bad is not None:
                st.last_failure_at, st.last_failure_error = _parse_utc(bad[0]), bad[1]
    return DaemonStatus(database, pid, list(statuses.values()))
