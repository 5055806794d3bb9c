"""The snapshot daemon: snapshot configured targets on a schedule, record every attempt.

Configuration (TOML; relative paths are relative to the configuration file)::

    database = "/var/lib/fsage/fsage.db"
    schedule = "30 2 * * *"        # cron expression (default); or: every = "6h"
    timezone = "Europe/Berlin"     # for the schedule and retention periods (default: local)
    jitter = "10m"                 # random delay of up to this much before each run
    export_dir = "/srv/fsage-export"  # after each snapshot: fsage export (Parquet) there
    export_host = "web1"           # host name in the export (default: this machine's)
    [retention]                    # default: keep everything
    daily = 14
    monthly = 12
    [[target]]
    name = "home"
    source = "/dev/sdb1"
    [[target]]
    name = "scratch"
    source = "/srv/scratch"
    every = "1h"                   # per-target schedule, jitter and retention override the top
    retention = { hourly = 48, daily = 14 }

Behaviour:

- One daemon per database: an exclusive ``flock`` on ``<database>.lock``, held for the life
  of the process (``--once`` too). A second daemon exits at once with an error naming the
  holder's pid.
- A run of a target reads the source and records it with ``Store.add_snapshot`` (one
  transaction). Every attempt, successful or not, becomes a row of ``collection_runs`` with
  its error text; a failing target does not stop the others.
- After a successful snapshot, the target's retention policy deletes old snapshots of its
  file system (labelled snapshots, and those referenced by aging or benchmark runs or by a
  recreation, are kept).
- SIGTERM or SIGINT while a snapshot is being read or written raises inside the work, so the
  store's transaction rolls back: the run is recorded as ``interrupted`` and nothing of it is
  left (if the signal lands after the commit, the snapshot is kept and the run recorded as
  ``ok``). While idle the daemon exits at once. Either way the exit status is 0.
- A target that runs more than once a day and inherits the top-level retention must have
  ``hourly`` or ``last`` in it (or its own ``retention``): a policy of days would delete
  every intra-day snapshot; the configuration check says so.
- With ``export_dir``, each successful snapshot is exported (``fsage export``, Parquet) to
  that directory afterwards; a failed export is logged and does not fail the run.
- Log lines: one per event on stderr. Under systemd (``JOURNAL_STREAM``) they carry syslog
  ``<N>`` priority prefixes and no time stamp (the journal has its own); elsewhere a time
  stamp (ISO 8601, local time with its UTC offset) and the level.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from fsage.db.store import Store
from fsage.errors import FsageError, UsageError
from fsage.imagelock import ImageBusyError, image_lock
from fsage.snapshotter.daemonconfig import (
    ConfigError,
    DaemonConfig,
    Target,
    describe_schedule,
    load_config,
)
from fsage.snapshotter.daemonlock import (
    DaemonLockedError,
    DatabaseLock,
    lock_holder,
)
from fsage.snapshotter.daemonlog import (
    DaemonStop,
    Log,
    Stopper,
    sd_notify,
)
from fsage.snapshotter.daemonstatus import (
    DaemonStatus,
    TargetStatus,
    daemon_status,
)
from fsage.snapshotter.retention import select_deletions

# Test hook: hold this many seconds inside the snapshot transaction (after the snapshot row is
# inserted, before commit), announcing it on the log, so tests can kill the daemon there.
TEST_HOLD_ENV = "FSAGE_DAEMON_TEST_HOLD"


@dataclass
class RunResult:
    target: str
    status: str  # ok | failed | interrupted
    snapshot_id: int | None = None
    error: str | None = None
    pruned: list[int] = field(default_factory=list)
    seconds: float = 0.0
    recorded: bool = False
    record_error: str | None = None
    line: str = ""
    exported: int | None = None
    export_error: str | None = None


def error_text(exc: BaseException) -> str:
    """One line for the log and the collection_runs table."""
    if isinstance(exc, FsageError):
        return str(exc)
    if isinstance(exc, sqlite3.Error):
        return f"database error: {exc}"
    if isinstance(exc, OSError):
        where = f"{exc.filename}: " if exc.filename else ""
        return f"{where}{exc.strerror or exc}"
    if isinstance(exc, MemoryError):
        return "out of memory"
    return f"{type(exc).__name__}: {exc}"


def disk_note(database: Path, low: int = 1 << 20) -> str:
    """A note for error messages when the file system holding the database is (nearly) full."""
    try:
        st = os.statvfs(database.parent)
    except OSError:
        return ""
    free = st.f_bavail * st.f_frsize
    if free >= low:
        return ""
    return f" (the file system holding {database} is full: {free // 1024} KiB free)"


def _utc(ts: float | None = None) -> str:
    when = datetime.now(UTC) if ts is None else datetime.fromtimestamp(ts, UTC)
    return when.isoformat(timespec="seconds")


class Daemon:
    """Runs targets of a configuration, once or on their schedules."""

    def __init__(
        self,
        config: DaemonConfig,
        log: Log | None = None,
        stopper: Stopper | None = None,
        use_jitter: bool = True,
        rng: random.Random | None = None,
        lock_wait: float = 1.0,
    ) -> None:
        self.config = config
        # How long to wait for the database's lock (a timer's run waits out another's).
        self.lock_wait = lock_wait
        self.log = log or Log()
        self.stopper = stopper or Stopper()
        self.use_jitter = use_jitter
        self.rng = rng or random.Random()
        self.hold = float(os.environ.get(TEST_HOLD_ENV, "0") or 0)

    # ------------------------------------------------------------ one target

    def run_target(self, target: Target, trigger: str = "schedule") -> RunResult:
        """Snapshot one target, apply its retention, record the attempt. Never raises an
        Exception (a failure is in the result); the process may still get DaemonStop only
        from outside this call."""
        result = RunResult(target.name, "failed")
        started_at = _utc()
        t0 = time.monotonic()
        try:
            store = Store.open(self.config.database, create=True)
        except Exception as exc:
            result.error = error_text(exc) + disk_note(self.config.database)
            result.seconds = time.monotonic() - t0
            result.record_error = "the database cannot be opened"
            return result
        try:
            self._snapshot(store, target, result, t0)
            if result.status == "ok" and target.retention is not None:
                self._retain(store, target, result)
            result.seconds = time.monotonic() - t0
            self._record(store, target, result, started_at, trigger)
        finally:
            store.close()
        if result.status == "ok" and self.config.export_dir is not None:
            self._export(target, result)
        return result

    def _export(self, target: Target, result: RunResult) -> None:
        """Export the target's new snapshots; a failure is logged, the run stays ok."""
        assert self.config.export_dir is not None
        try:
            from fsage.fleet.export import export_parquet

            with self.stopper.armed():
                summary = export_parquet(
                    self.config.database,
                    self.config.export_dir,
                    host=self.config.export_host,
                    fs_names=[target.name],
                )
            result.exported = summary.new_snapshots
        except (DaemonStop, Exception) as exc:
            result.export_error = (
                f"stopped by {self.stopper.requested}" if self.stopper.requested
                else error_text(exc)
            )  # fmt: skip

    def _snapshot(self, store: Store, target: Target, result: RunResult, t0: float) -> None:
        from fsage.snapshotter import read_source

        before = store.con.execute("SELECT COALESCE(MAX(id), 0) FROM snapshots").fetchone()[0]
        if self.hold > 0:
            store.con.set_trace_callback(self._hold_callback(store, target))
        failure: BaseException | None = None
        try:
            with self.stopper.armed():
                # Shared, as `fsage snapshot IMG` takes it: a writer holding the image (an
                # aging, an LFS mount) makes this run fail in one line, and the next retry.
                with image_lock(target.source, exclusive=False):
                    layout = read_source(target.source)
                summary = store.add_snapshot(
                    layout, name=target.name, source=str(target.source), started=t0
                )
            result.status = "ok"
            result.snapshot_id = summary.snapshot_id
            result.line = summary.line()
        except (DaemonStop, Exception) as exc:
            failure = exc
        finally:
            store.con.set_trace_callback(None)
            store.con.set_progress_handler(None, 0)
        if store.con.in_transaction:  # only if a second signal hit the rollback itself
            store.con.execute("ROLLBACK")
        if failure is None:
            return
        if not self.stopper.requested:
            result.error = error_text(failure) + disk_note(self.config.database)
            if isinstance(failure, ImageBusyError):
                result.error += "; nothing recorded, tried again at the next run"
            return
        result.status = "interrupted"
        result.error = f"stopped by {self.stopper.requested}"
        # A signal just after the commit: the snapshot is whole and kept.
        row = store.con.execute(
            "SELECT s.id FROM snapshots s JOIN filesystems f ON f.id = s.fs_id"
            " WHERE f.name = ? AND s.id > ? AND s.source = ? ORDER BY s.id DESC",
            (target.name, before, str(target.source)),
        ).fetchone()
        if row is not None:
            result.status, result.error = "ok", None
            result.snapshot_id = int(row[0])
            result.line = f"snapshot {row[0]} of {target.name} committed before the stop"

    def _hold_callback(self, store: Store, target: Target) -> Callable[[str], None]:
        """The test hook: pause inside the snapshot transaction. A stop during the pause
        aborts the next statement (a raise inside an SQLite callback would be ignored)."""

        def callback(statement: str) -> None:
            if not statement.lstrip().upper().startswith("INSERT INTO SNAPSHOTS"):
                return
            self.log.info(f"target {target.name}: test hold inside the snapshot transaction")
            deadline = time.monotonic() + self.hold
            with contextlib.suppress(DaemonStop):
                while time.monotonic() < deadline and not self.stopper.requested:
                    time.sleep(0.02)
            if self.stopper.requested:
                store.con.set_progress_handler(lambda: 1, 1)

        return callback

    def _retain(self, store: Store, target: Target, result: RunResult) -> None:
        assert target.retention is not None
        try:
            con = store.con
            rows = con.execute(
                "SELECT s.id, s.taken_at, s.label FROM snapshots s"
                " JOIN filesystems f ON f.id = s.fs_id WHERE f.name = ?",
                (target.name,),
            ).fetchall()
            referenced = {
                int(r[0])
                for r in con.execute(
                    "SELECT recreation_of FROM snapshots WHERE recreation_of IS NOT NULL"
                    " UNION SELECT first_snap FROM aging_runs WHERE first_snap IS NOT NULL"
                    " UNION SELECT last_snap FROM aging_runs WHERE last_snap IS NOT NULL"
                    " UNION SELECT snapshot_id FROM bench_runs WHERE snapshot_id IS NOT NULL"
                )
            }
            protected = referenced | {int(r[0]) for r in rows if r[2] is not None}
            snaps = [(int(r[0]), datetime.fromisoformat(r[1])) for r in rows]
            doomed = select_deletions(snaps, target.retention, self.config.timezone, protected)
            if doomed:
                store.delete_snapshots(doomed)
                result.pruned = doomed
        except Exception as exc:
            # The snapshot itself is committed: the run stays ok, the problem is on record.
            result.error = f"retention failed: {error_text(exc)}"

    def _record(
        self, store: Store, target: Target, result: RunResult, started_at: str, trigger: str
    ) -> None:
        try:
            with store.transaction() as con:
                con.execute(
                    "INSERT INTO collection_runs(target, source, started_at, finished_at,"
                    " status, error, snapshot_id, seconds, pruned, trigger, pid)"
                    " VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                    (
                        target.name,
                        str(target.source),
                        started_at,
                        _utc(),
                        result.status,
                        result.error,
                        result.snapshot_id,
                        result.seconds,
                        json.dumps(result.pruned),
                        trigger,
                        os.getpid(),
                    ),
                )
            result.recorded = True
        except Exception as exc:
            result.record_error = error_text(exc) + disk_note(self.config.database)

    def _report(self, result: RunResult) -> None:
        name = result.target
        if result.status == "ok":
            self.log.info(f"target {name}: {result.line}")
            if result.pruned:
                ids = ", ".join(map(str, result.pruned))
                self.log.info(f"target {name}: retention deleted snapshots {ids}")
            if result.error:
                self.log.warning(f"target {name}: {result.error}")
            if result.exported is not None:
                self.log.info(f"target {name}: exported {result.exported} snapshot(s)")
            if result.export_error:
                self.log.warning(f"target {name}: export failed: {result.export_error}")
        elif result.status == "interrupted":
            self.log.warning(
                f"target {name}: interrupted ({result.error}); the snapshot was rolled back"
            )
        else:
            self.log.error(f"target {name}: failed: {result.error}")
        if result.record_error:
            self.log.error(f"target {name}: run not recorded: {result.record_error}")

    # ------------------------------------------------------------ plans

    def _plan(self, target: Target, now: float) -> float:
        due = target.schedule.next_run(now)
        if self.use_jitter and target.jitter > 0:
            due += self.rng.uniform(0, target.jitter)
        return due

    def _write_plans(self, plans: dict[str, float | None], replace_all: bool) -> None:
        try:
            with Store.open(self.config.database, create=True) as store, store.transaction() as con:
                if replace_all:
                    con.execute("DELETE FROM daemon_targets")
                for t in self.config.targets:
                    if t.name not in plans:
                        continue
                    due = plans[t.name]
                    con.execute(
                        "INSERT OR REPLACE INTO daemon_targets(target, source, schedule,"
                        " next_run, updated_at, pid) VALUES (?,?,?,?,?,?)",
                        (
                            t.name,
                            str(t.source),
                            describe_schedule(t.schedule),
                            None if due is None else _utc(due),
                            _utc(),
                            os.getpid(),
                        ),
                    )
        except Exception as exc:
            self.log.warning(f"cannot record the next run times: {error_text(exc)}")

    # ------------------------------------------------------------ modes

    def _start(self) -> DatabaseLock:
        db = self.config.database
        if not db.parent.is_dir():
            raise FsageError(f"{db.parent}: no such directory (for the database {db})")
        lock = DatabaseLock(db)
        lock.acquire(self.lock_wait, lambda: bool(self.stopper.requested))
        try:
            Store.open(db, create=True).close()
        except FsageError as exc:
            lock.release()
            raise FsageError(f"{exc}{disk_note(db)}") from None
        except BaseException:
            lock.release()
            raise
        return lock

    def run_once(self, names: Sequence[str] = ()) -> int:
        """Run the chosen targets (all by default) now; 1 if any failed, else 0."""
        targets = self._select(names)
        self.stopper.install()
        try:
            lock = self._start()
            try:
                return self._once(targets)
            finally:
                lock.release()
        finally:
            self.stopper.uninstall()

    def _once(self, targets: list[Target]) -> int:
        jitter = max((t.jitter for t in targets), default=0.0) if self.use_jitter else 0.0
        if jitter > 0:
            delay = self.rng.uniform(0, jitter)
            self.log.info(f"waiting {delay:.1f} s (jitter) before running")
            if not self.stopper.sleep(delay):
                self.log.info(f"stopped by {self.stopper.requested} before any run")
                return 0
        failed = 0
        for target in targets:
            if self.stopper.requested:
                break
            result = self.run_target(target, trigger="once")
            self._report(result)
            failed += result.status == "failed"
        self._write_plans({t.name: None for t in targets}, replace_all=False)
        if self.stopper.requested:
            self.log.info(f"stopped by {self.stopper.requested}")
            return 0
        if failed:
            self.log.error(f"{failed} of {len(targets)} targets failed")
            return 1
        return 0

    def run_forever(self) -> int:
        """Run every target on its schedule until SIGTERM/SIGINT; returns 0."""
        self.stopper.install()
        try:
            lock = self._start()
            try:
                self._loop()
            finally:
                lock.release()
        finally:
            self.stopper.uninstall()
        return 0

    def _loop(self) -> None:
        cfg = self.config
        now = time.time()
        due = {t.name: self._plan(t, now) for t in cfg.targets}
        self._write_plans(dict(due), replace_all=True)
        self.log.info(
            f"daemon started: pid {os.getpid()}, database {cfg.database},"
            f" {len(cfg.targets)} target(s)"
        )
        for t in cfg.targets:
            self.log.info(
                f"target {t.name}: {t.source}, {describe_schedule(t.schedule)},"
                f" next run {_local(due[t.name])}"
            )
        sd_notify("READY=1")
        while not self.stopper.requested:
            now = time.time()
            ready = sorted(
                (t for t in cfg.targets if due[t.name] <= now), key=lambda t: due[t.name]
            )
            if not ready:
                wait = min(due.values()) - now
                # Re-check at least every 30 s: the wall clock may jump (suspend, NTP).
                if not self.stopper.sleep(min(wait, 30.0)):
                    break
                continue
            for target in ready:
                if self.stopper.requested:
                    break
                result = self.run_target(target)
                self._report(result)
                due[target.name] = self._plan(target, time.time())
                self._write_plans({target.name: due[target.name]}, replace_all=False)
        sd_notify("STOPPING=1")
        self.log.info(f"daemon stopping on {self.stopper.requested}")

    def _select(self, names: Sequence[str]) -> list[Target]:
        if not names:
            return list(self.config.targets)
        known = {t.name: t for t in self.config.targets}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise UsageError(
                f"no target named {', '.join(map(repr, unknown))} in {self.config.path}"
                f" (known: {', '.join(known)})"
            )
        return [known[n] for n in names]


def _local(ts: float) -> str:
    return datetime.fromtimestamp(ts).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")


__all__ = [
    "ConfigError",
    "Daemon",
    "DaemonConfig",
    "DaemonLockedError",
    "DaemonStatus",
    "DatabaseLock",
    "Log",
    "Target",
    "TargetStatus",
    "daemon_status",
    "load_config",
    "lock_holder",
]
