"""The daemon's configuration: the TOML file read and checked into targets with their
schedules, jitter and retention (the format is described in ``fsage.snapshotter.daemon``).
"""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import tzinfo
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from fsage.errors import UsageError
from fsage.snapshotter.retention import PERIODS, Retention
from fsage.snapshotter.schedule import (
    DEFAULT_SCHEDULE,
    CronSchedule,
    Interval,
    Schedule,
    ScheduleError,
    parse_duration,
)


class ConfigError(UsageError):
    """A configuration file with problems; ``problems`` holds one line per problem."""

    def __init__(self, path: Path, problems: Sequence[str]) -> None:
        self.path = path
        self.problems = [f"{path}: {p}" for p in problems]
        super().__init__("\n".join(self.problems))


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
