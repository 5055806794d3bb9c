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
import fcntl
import json
import os
import random
import signal
import socket
import sqlite3
import sys
import time
import tomllib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, tzinfo
from pathlib import Path
from types import FrameType
from typing import Any, TextIO
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from fsage.db.store import Store
from fsage.errors import FsageError, UsageError
from fsage.snapshotter.retention import PERIODS, Retention, select_deletions
from fsage.snapshotter.schedule import (
    DEFAULT_SCHEDULE,
    CronSchedule,
    Interval,
    Schedule,
    ScheduleError,
    parse_duration,
)

# Test hook: hold this many seconds inside the snapshot transaction (after the snapshot row is
# inserted, before commit), announcing it on the log, so tests can kill the daemon there.
TEST_HOLD_ENV = "FSAGE_DAEMON_TEST_HOLD"


class ConfigError(UsageError):
    """A configuration file with problems; ``problems`` holds one line per problem."""

    def __init__(self, path: Path, problems: Sequence[str]) -> None:
        self.path = path
        self.problems = [f"{path}: {p}" for p in problems]
        super().__init__("\n".join(self.problems))


class DaemonLockedError(FsageError):
    """Another daemon holds the database's lock."""


# ---------------------------------------------------------------- configuration


@dataclass(frozen=True)
class Target:
    name: str
    source: Path
    schedule: Schedule
    jitter: float
    retention: Retention | None


@dataclass(frozen=True)
class DaemonConfig:
    path: Path
    database: Path
    targets: list[Target]
    timezone: tzinfo | None = None
    timezone_name: str | None = None
    export_dir: Path | None = None
    export_host: str | None = None


_TOP_KEYS = {
    "database",
    "schedule",
    "every",
    "timezone",
    "jitter",
    "retention",
    "target",
    "export_dir",
    "export_host",
}
_TARGET_KEYS = {"name", "source", "schedule", "every", "jitter", "retention"}


def load_config(path: Path | str) -> DaemonConfig:
    """Read and validate a configuration file; ConfigError listing every problem found."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"{path}: no such configuration file") from None
    except OSError as exc:
        raise UsageError(f"{path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(path, ["not UTF-8 text"]) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(path, [f"not valid TOML: {exc}"]) from None
    return parse_config(data, path)


def parse_config(data: dict[str, Any], path: Path) -> DaemonConfig:
    problems: list[str] = []
    base = path.resolve().parent
    for key in sorted(set(data) - _TOP_KEYS):
        problems.append(f"unknown key {key!r} (known: {', '.join(sorted(_TOP_KEYS))})")

    database: Path | None = None
    db_value = data.get("database")
    if db_value is None:
        problems.append("missing key 'database' (the SQLite file, e.g. database = \"fsage.db\")")
    elif not isinstance(db_value, str) or not db_value:
        problems.append("database: expected a path (a non-empty string)")
    else:
        database = base / Path(db_value).expanduser()

    tz: tzinfo | None = None
    tz_name = data.get("timezone")
    if tz_name is not None:
        if not isinstance(tz_name, str):
            problems.append('timezone: expected a time zone name such as "UTC"')
            tz_name = None
        else:
            try:
                tz = ZoneInfo(tz_name)
            except (ZoneInfoNotFoundError, ValueError):
                problems.append(f"timezone: unknown time zone {tz_name!r}")
                tz_name = None

    export_dir: Path | None = None
    raw_export = data.get("export_dir")
    if raw_export is not None:
        if not isinstance(raw_export, str) or not raw_export:
            problems.append("export_dir: expected a directory path (a non-empty string)")
        else:
            export_dir = base / Path(raw_export).expanduser()
    export_host = data.get("export_host")
    if export_host is not None and (
        not isinstance(export_host, str) or not export_host.strip() or "/" in export_host
    ):
        problems.append("export_host: expected a host name (a non-empty string without '/')")
        export_host = None

    default_schedule = _schedule(data, "", tz, problems) or CronSchedule.parse(DEFAULT_SCHEDULE, tz)
    default_jitter = _jitter(data, "", problems)
    default_retention = _retention(data, "", problems)

    targets: list[Target] = []
    raw_targets = data.get("target")
    if raw_targets is None:
        problems.append("no [[target]] (each needs a name and a source)")
        raw_targets = []
    elif not isinstance(raw_targets, list) or not all(isinstance(t, dict) for t in raw_targets):
        problems.append("target: expected [[target]] tables")
        raw_targets = []
    seen: set[str] = set()
    for i, raw in enumerate(raw_targets, 1):
        name = raw.get("name")
        where = f"target {i}"
        if name is None:
            problems.append(f"{where}: missing key 'name'")
        elif not isinstance(name, str) or not name.strip() or not name.isprintable():
            problems.append(f"{where}: name: expected a non-empty printable string")
            name = None
        else:
            where = f"target {i} ({name!r})"
            if name in seen:
                problems.append(f"{where}: a target named {name!r} is already defined")
            seen.add(name)
        for key in sorted(set(raw) - _TARGET_KEYS):
            problems.append(
                f"{where}: unknown key {key!r} (known: {', '.join(sorted(_TARGET_KEYS))})"
            )
        source = raw.get("source")
        source_path: Path | None = None
        if source is None:
            problems.append(f"{where}: missing key 'source' (an image, device or mounted path)")
        elif not isinstance(source, str) or not source:
            problems.append(f"{where}: source: expected a path (a non-empty string)")
        else:
            source_path = base / Path(source).expanduser()
        prefix = f"{where}: "
        sched = _schedule(raw, prefix, tz, problems) or default_schedule
        jitter = _jitter(raw, prefix, problems) if "jitter" in raw else default_jitter
        retention = _retention(raw, prefix, problems) if "retention" in raw else default_retention
        if "retention" not in raw and retention is not None:
            _check_inherited_retention(sched, retention, prefix, problems)
        if name is not None and source_path is not None:
            targets.append(Target(name, source_path, sched, jitter, retention))
    if problems:
        raise ConfigError(path, problems)
    assert database is not None
    return DaemonConfig(path, database, targets, tz, tz_name, export_dir, export_host)


def _check_inherited_retention(
    schedule: Schedule, retention: Retention, prefix: str, problems: list[str]
) -> None:
    """A target run several times a day keeps only one a day under an inherited policy of
    days, weeks...: say so rather than delete its intra-day snapshots."""
    try:
        per_day = schedule.runs_per_day()
    except ScheduleError:
        return
    if per_day <= 1 or retention.hourly or retention.last:
        return
    problems.append(
        f"{prefix}runs {per_day} times a day but inherits the top-level retention "
        f"({retention.describe()}), which keeps one snapshot a day and would delete the "
        f"others; give the target its own, e.g. retention = {{ hourly = {per_day * 7}, "
        f"daily = {retention.daily or 14} }}"
    )


def _schedule(
    table: dict[str, Any], prefix: str, tz: tzinfo | None, problems: list[str]
) -> Schedule | None:
    cron, every = table.get("schedule"), table.get("every")
    if cron is not None and every is not None:
        problems.append(f"{prefix}give either 'schedule' or 'every', not both")
        return None
    try:
        if cron is not None:
            if not isinstance(cron, str):
                problems.append(f"{prefix}schedule: expected a cron expression in a string")
                return None
            return CronSchedule.parse(cron, tz)
        if every is not None:
            if not isinstance(every, str | int | float) or isinstance(every, bool):
                problems.append(f'{prefix}every: expected a duration such as "30s" or "6h"')
                return None
            return Interval.parse(every)
    except ScheduleError as exc:
        problems.append(f"{prefix}{exc}")
    return None


def _jitter(table: dict[str, Any], prefix: str, problems: list[str]) -> float:
    value = table.get("jitter", 0)
    try:
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise ValueError(f"{value!r} is not a duration")
        return parse_duration(value)
    except ValueError as exc:
        problems.append(f"{prefix}jitter: {exc}")
        return 0.0


def _retention(table: dict[str, Any], prefix: str, problems: list[str]) -> Retention | None:
    raw = table.get("retention")
    if raw is None:
        return None
    if not isinstance(raw, dict):
        problems.append(f"{prefix}retention: expected a table such as {{ daily = 14 }}")
        return None
    counts: dict[str, int] = {}
    for key, value in raw.items():
        if key not in PERIODS:
            problems.append(f"{prefix}retention: unknown key {key!r} (known: {', '.join(PERIODS)})")
        elif isinstance(value, bool) or not isinstance(value, int) or value < 0:
            problems.append(f"{prefix}retention: {key}: expected a whole number of 0 or more")
        else:
            counts[key] = value
    return Retention(**counts)


def describe_schedule(schedule: Schedule) -> str:
    if isinstance(schedule, Interval):
        return f"every {schedule.text}"
    return f"cron {schedule.text!r}"


# ---------------------------------------------------------------- lock


def lock_path(database: Path) -> Path:
    return database.with_name(database.name + ".lock")


class DatabaseLock:
    """An exclusive flock on ``<database>.lock``; the file holds the holder's pid."""

    def __init__(self, database: Path) -> None:
        self.database = database
        self.path = lock_path(database)
        self.fd: int | None = None

    def acquire(self, wait: float = 1.0, stopped: Callable[[], bool] | None = None) -> None:
        """Take the lock, waiting up to ``wait`` seconds for another holder (``stopped``:
        gives up at once when it says so)."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise FsageError(f"cannot create lock file {self.path}: {exc.strerror}") from None
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                # `fsage status` may hold a shared lock for an instant: retry briefly.
                if time.monotonic() >= deadline or (stopped is not None and stopped()):
                    pid = _read_pid(fd)
                    os.close(fd)
                    holder = f" (pid {pid})" if pid else ""
                    raise DaemonLockedError(
                        f"another fsage daemon{holder} is using {self.database}"
                        f" (lock {self.path} is held)"
                    ) from None
                time.sleep(0.05)
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as exc:  # a full disk, a quota: one line, not a traceback
            os.close(fd)
            raise FsageError(
                f"cannot write the pid into the lock file {self.path}: {exc.strerror}"
            ) from None
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing drops the flock; the file stays (unlinking races)
            self.fd = None

    def __enter__(self) -> DatabaseLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode().strip()
        return int(text) if text else None
    except (OSError, ValueError):
        return None


def lock_holder(database: Path) -> int | None:
    """The pid of the daemon holding the database's lock (0 if unknown), or None if free."""
    path = lock_path(database)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_pid(fd) or 0
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


# ---------------------------------------------------------------- logging

_PRIORITY = {"error": 3, "warning": 4, "info": 6, "debug": 7}


def _journal_stream(stream: TextIO) -> bool:
    value = os.environ.get("JOURNAL_STREAM")
    if not value:
        return False
    try:
        dev, ino = (int(x) for x in value.split(":"))
        st = os.fstat(stream.fileno())
    except (ValueError, OSError):
        return True  # set but unreadable: still under systemd
    return (st.st_dev, st.st_ino) == (dev, ino)


class Log:
    """One line per event: ``<6>text`` under journald; elsewhere a time stamp then
    ``info: text`` (local time on a terminal, ISO 8601 with the UTC offset otherwise)."""

    def __init__(self, stream: TextIO | None = None, style: str | None = None) -> None:
        self.stream = stream or sys.stderr
        if style is None:
            if _journal_stream(self.stream):
                style = "journal"
            elif self.stream.isatty():
                style = "tty"
            else:
                style = "plain"
        self.style = style

    def emit(self, level: str, text: str) -> None:
        text = " ".join(text.split("\n"))
        if self.style == "journal":
            line = f"<{_PRIORITY[level]}>{text}"
        elif self.style == "tty":
            line = f"{datetime.now().strftime('%Y-%m-%d %H:%M:%S')} {level}: {text}"
        else:  # cron mail, log files: the time with its offset
            line = f"{datetime.now().astimezone().isoformat(timespec='seconds')} {level}: {text}"
        try:
            self.stream.write(line + "\n")
            self.stream.flush()
        except (OSError, ValueError):
            pass  # a closed stderr must not stop the daemon

    def info(self, text: str) -> None:
        self.emit("info", text)

    def warning(self, text: str) -> None:
        self.emit("warning", text)

    def error(self, text: str) -> None:
        self.emit("error", text)


def sd_notify(message: str) -> None:
    """Tell systemd (Type=notify) about the daemon's state; nothing outside systemd."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.sendto(message.encode(), address)
    except OSError:
        pass


# ---------------------------------------------------------------- signals


class DaemonStop(BaseException):
    """Raised by the SIGTERM/SIGINT handler inside interruptible work (a BaseException, so
    ``except Exception`` in the work does not swallow it and the store's transaction rolls
    back)."""


class Stopper:
    """Turns SIGTERM/SIGINT into a stop request; raises DaemonStop while armed."""

    def __init__(self) -> None:
        self.requested: str | None = None
        self._armed = False
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        first = self.requested is None
        self.requested = signal.Signals(signum).name
        if self._armed and first:
            self._armed = False
            raise DaemonStop(self.requested)

    @contextlib.contextmanager
    def armed(self) -> Iterator[None]:
        """Within this block a stop request raises DaemonStop at once."""
        if self.requested:
            raise DaemonStop(self.requested)
        self._armed = True
        try:
            yield
        finally:
            self._armed = False

    def sleep(self, seconds: float) -> bool:
        """Sleep; False if a stop was requested before or during the sleep."""
        try:
            with self.armed():
                if seconds > 0:
                    time.sleep(seconds)
        except DaemonStop:
            return False
        return True


# ---------------------------------------------------------------- runs


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


# ---------------------------------------------------------------- status


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
