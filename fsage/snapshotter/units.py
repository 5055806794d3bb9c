"""Installing the systemd units and the cron lines that run the daemon, with the real paths.

A configuration's targets can have schedules of their own, so there is one timer (and one
service, running the targets of that schedule) per distinct schedule and jitter: ``fsage.timer``
and ``fsage.service`` when every target shares one, else ``fsage-<first target>.timer`` and
``.service`` per schedule. Cron gets one line per schedule likewise. A schedule that no
calendar expression can say (``every = "7m"``) leaves the long-running daemon,
``fsage-daemon.service``, which keeps every schedule itself; it is written in every case, to
be used instead of the timers, never with them.

The templates (``fsage/snapshotter/units/``) name the fsage executable ``@FSAGE@`` and the
configuration ``@CONFIG@``; they are written with the command that runs this fsage (the
console script beside the running interpreter, else ``python3 -m fsage``) and the
configuration's absolute path, so that ``systemd-analyze verify`` accepts them as written.
"""

from __future__ import annotations

import re
import shlex
import shutil
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from fsage.errors import FsageError
from fsage.snapshotter.daemonconfig import DaemonConfig, Target
from fsage.snapshotter.schedule import CronSchedule, Interval, Schedule, cron_fields

DAEMON_UNIT = "fsage-daemon.service"
CRON = "fsage.cron"
_DAYS = ("Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat")


@dataclass(frozen=True)
class TimerGroup:
    """The targets that run together: one schedule, one jitter, one timer."""

    stem: str  # the unit name without .timer / .service
    targets: tuple[str, ...]
    schedule: Schedule
    jitter: float
    calendar: tuple[str, ...]  # OnCalendar= values; empty when no calendar can say it

    @property
    def timer(self) -> str:
        return f"{self.stem}.timer"

    @property
    def service(self) -> str:
        return f"{self.stem}.service"


def fsage_command() -> str:
    """The command line that runs this fsage, for ExecStart= and cron."""
    beside = Path(sys.executable).parent / "fsage"
    if beside.is_file():
        return shlex.quote(str(beside))
    found = shutil.which("fsage")
    if found and "shims" not in Path(found).parts:  # version-manager shims need a shell
        return shlex.quote(str(Path(found).resolve()))
    return f"{shlex.quote(sys.executable)} -m fsage"


def _runs(values: list[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for v in sorted(values):
        if out and out[-1][1] == v - 1:
            out[-1] = (out[-1][0], v)
        else:
            out.append((v, v))
    return out


def _field(values: frozenset[int], full: range, width: int = 2) -> str:
    if values == frozenset(full):
        return "*"
    return ",".join(
        f"{a:0{width}d}" if a == b else f"{a:0{width}d}..{b:0{width}d}"
        for a, b in _runs(list(values))
    )


def _weekdays(values: frozenset[int]) -> str:
    if len(values) == 7:
        return ""
    monday_first = [(v - 1) % 7 for v in values]  # Mon 0 .. Sun 6: systemd's order
    names = [_DAYS[(v + 1) % 7] for v in range(7)]
    return ",".join(
        names[a] if a == b else f"{names[a]}..{names[b]}" for a, b in _runs(monday_first)
    )


def calendar_of(schedule: Schedule, timezone: str | None = None) -> tuple[str, ...]:
    """The OnCalendar= values that fire when ``schedule`` does (several are a union), or ()
    when none can: an interval that does not divide a day into whole steps."""
    if isinstance(schedule, Interval):
        return _interval_calendar(schedule.seconds)
    if not isinstance(schedule, CronSchedule):
        return ()
    minute, hour, dom, month, dow = cron_fields(schedule.expression)
    zone = f" {timezone}" if timezone else ""
    time = f"{_field(hour, range(24))}:{_field(minute, range(60))}:00"
    mon = _field(month, range(1, 13))
    days = _field(dom, range(1, 32))
    week = _weekdays(dow)
    if schedule.day_or:  # cron(8): either day field matches
        return (f"*-{mon}-{days} {time}{zone}", f"{week} *-{mon}-* {time}{zone}")
    # One of the day fields starts with "*": both must match (a "*/2" one included).
    return ((f"{week} " if week else "") + f"*-{mon}-{days} {time}{zone}",)


def _interval_calendar(seconds: float) -> tuple[str, ...]:
    """Multiples of ``seconds`` since the epoch (UTC), as the daemon runs them."""
    s = int(seconds)
    if s != seconds or s <= 0 or 86400 % s:
        return ()
    if s % 3600 == 0:
        return (f"*-*-* 00/{s // 3600}:00:00 UTC",)
    if s % 60 == 0 and 3600 % s == 0:
        return (f"*-*-* *:00/{s // 60}:00 UTC",)
    if s < 60 and 60 % s == 0:
        return (f"*-*-* *:*:00/{s} UTC",)
    return ()


def _cron_line_schedule(schedule: Schedule) -> str | None:
    """The five cron fields that fire when ``schedule`` does, or None."""
    if isinstance(schedule, CronSchedule):
        return schedule.expression
    if isinstance(schedule, Interval):
        s = int(schedule.seconds)
        if s != schedule.seconds or s <= 0 or 86400 % s or s % 60:
            return None
        if s % 3600 == 0:
            return "0 * * * *" if s == 3600 else f"0 */{s // 3600} * * *"
        if 3600 % s == 0:
            return f"*/{s // 60} * * * *"
    return None


def _stem(name: str, taken: set[str]) -> str:
    base = "fsage-" + (re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-.") or "target")
    stem, n = base, 1
    while stem in taken:
        n += 1
        stem = f"{base}-{n}"
    taken.add(stem)
    return stem


def timer_groups(config: DaemonConfig) -> list[TimerGroup]:
    """The targets of ``config`` grouped by schedule and jitter, in configuration order."""
    groups: dict[tuple[str, str, float], list[Target]] = {}
    for t in config.targets:
        kind = "every" if isinstance(t.schedule, Interval) else "cron"
        groups.setdefault((kind, t.schedule.text, t.jitter), []).append(t)
    taken: set[str] = set()
    out = []
    for members in groups.values():
        first = members[0]
        stem = "fsage" if len(groups) == 1 else _stem(first.name, taken)
        out.append(
            TimerGroup(
                stem=stem,
                targets=tuple(t.name for t in members),
                schedule=first.schedule,
                jitter=first.jitter,
                calendar=calendar_of(first.schedule, config.timezone_name),
            )
        )
    return out


def describe_units(config: DaemonConfig) -> list[str]:
    """What --install-units writes and what runs each target, one line each."""
    groups = timer_groups(config)
    lines = []
    untimed = [g for g in groups if not g.calendar]
    if untimed:
        lines.append(
            f"systemd: no timers ({_schedule_text(untimed[0].schedule)} has no calendar"
            f" form): run {DAEMON_UNIT}, which keeps every schedule itself"
        )
        return lines
    for g in groups:
        jitter = f", up to {_seconds(g.jitter)} later" if g.jitter else ""
        lines.append(
            f"systemd: {g.timer} runs {', '.join(g.targets)} at {_schedule_text(g.schedule)}"
            f" (OnCalendar={' and '.join(g.calendar)}{jitter})"
        )
    lines.append(f"systemd: or, instead of the timers, {DAEMON_UNIT} keeps every schedule itself")
    return lines


def _schedule_text(schedule: Schedule) -> str:
    if isinstance(schedule, Interval):
        return f"every {schedule.text}"
    return f"cron {schedule.text!r}"


def _seconds(s: float) -> str:
    return f"{s / 60:g} min" if s >= 60 else f"{s:g} s"


def _template(name: str) -> str:
    return resources.files("fsage.snapshotter").joinpath("units", name).read_text("utf-8")


def _arg(text: str) -> str:
    """One argument of ExecStart=: shell-quoted, with systemd's specifiers and variables
    escaped."""
    return shlex.quote(text).replace("%", "%%").replace("$", "$$")


def render_unit(
    name: str, config: Path, command: str | None = None, group: TimerGroup | None = None
) -> str:
    if group is None:
        text = _template(name)
    else:  # a timer group's units, whatever their names
        text = _template("fsage.timer" if name.endswith(".timer") else "fsage.service")
    text = text.replace("@FSAGE@", command or fsage_command()).replace(
        "@CONFIG@", shlex.quote(str(config.resolve()))
    )
    if group is None:
        return text
    if group.stem == "fsage":
        which = "every target"
    else:
        which = ("target " if len(group.targets) == 1 else "targets ") + ", ".join(group.targets)
    targets = (
        "" if group.stem == "fsage" else "".join(f" --target {_arg(t)}" for t in group.targets)
    )
    return (
        text.replace("@CALENDAR@", "\n".join(f"OnCalendar={c}" for c in group.calendar))
        .replace("@DELAY@", f"{group.jitter:g}s")
        .replace("@SCHEDULE@", _schedule_text(group.schedule))
        .replace("@SERVICE@", group.service)
        .replace("@TIMER@", group.timer)
        .replace("@TARGETS@", targets)
        .replace("@WHICH@", which)
    )


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def install_cron(
    path: Path, config_path: Path, config: DaemonConfig, command: str | None = None
) -> Path:
    """Write the cron lines (for /etc/cron.d/), one per schedule, to ``path``."""
    lines = []
    run = f"{command or fsage_command()} daemon --config {shlex.quote(str(config_path.resolve()))}"
    groups = timer_groups(config)
    for g in groups:
        when = _cron_line_schedule(g.schedule)
        if when is None:
            raise FsageError(
                f"{config_path}: {_schedule_text(g.schedule)} (target {g.targets[0]}) has no"
                " cron form; run the daemon as a service (--install-units) instead"
            )
        only = "" if len(groups) == 1 else "".join(f" --target {shlex.quote(t)}" for t in g.targets)
        lines.append(f"{when}  root  {run} --once --wait-for-lock 6h{only}")
    if config.timezone_name:
        lines.insert(
            0,
            f"# schedules in the machine's time zone (the configuration's: {config.timezone_name})",
        )
    try:
        _write(path, _template(CRON).replace("@LINES@", "\n".join(lines)))
    except OSError as exc:
        raise FsageError(f"{path}: cannot write the cron file ({exc.strerror})") from None
    return path


def install_units(
    directory: Path, config_path: Path, config: DaemonConfig, command: str | None = None
) -> list[Path]:
    """Write the units to ``directory`` (created): a timer and a service per schedule (none
    when a schedule has no calendar form) and fsage-daemon.service; returns the files."""
    groups = timer_groups(config)
    timed = all(g.calendar for g in groups)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        written = []
        for g in groups if timed else []:
            for name in (g.timer, g.service):
                _write(directory / name, render_unit(name, config_path, command, g))
                written.append(directory / name)
        _write(directory / DAEMON_UNIT, render_unit(DAEMON_UNIT, config_path, command))
        written.append(directory / DAEMON_UNIT)
    except OSError as exc:
        raise FsageError(f"{directory}: cannot write the units ({exc.strerror})") from None
    return written
