"""When the snapshot daemon runs a target: cron expressions and fixed intervals.

A cron expression has the five classic fields, separated by blanks::

    minute (0-59)  hour (0-23)  day-of-month (1-31)  month (1-12, jan-dec)  day-of-week (0-7)

Each field is ``*``, a value, a range ``a-b``, a step ``*/n``, ``a-b/n`` or ``a/n`` (from a to
the field's end), or a comma-separated list of these. Months may be named jan-dec and days
of week sun-sat; day of week 0 and 7 are both Sunday.
When both day of month and day of week are restricted (neither starts with ``*``), a day
matches if either does — the rule of cron(8). The nicknames ``@yearly``, ``@annually``,
``@monthly``, ``@weekly``, ``@daily``, ``@midnight`` and ``@hourly`` are accepted too.

Times are wall-clock times in a time zone (the machine's local zone unless one is given).
A wall-clock time skipped by a daylight-saving jump runs at the first instant after the jump;
one that happens twice runs once, at its first occurrence.

An :class:`Interval` (``every = "2s"``) runs at every multiple of its length since the Unix
epoch (so ``every = "1h"`` runs on the hour, UTC); it is meant for tests and short cycles.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime, tzinfo
from typing import Protocol

from fsage.errors import UsageError

DEFAULT_SCHEDULE = "30 2 * * *"

FIELD_NAMES = ("minute", "hour", "day of month", "month", "day of week")
_RANGES = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))
_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
_NAMES: tuple[dict[str, int], ...] = (
    {},
    {},
    {},
    {m: i + 1 for i, m in enumerate(_MONTHS)},
    {d: i for i, d in enumerate(_DAYS)},
)
_NICKNAMES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}


class ScheduleError(UsageError):
    """A schedule that cannot be parsed."""


class Schedule(Protocol):
    """Anything that says when the next run after a given instant is."""

    @property
    def text(self) -> str:
        """The schedule as written."""
        ...

    def next_run(self, after: float) -> float:
        """The first run time strictly after ``after`` (both Unix timestamps)."""
        ...

    def runs_per_day(self) -> int:
        """How many runs a day brings at most."""
        ...


def _parse_value(token: str, index: int) -> int:
    names = _NAMES[index]
    low, high = _RANGES[index]
    if token.lower() in names:
        return names[token.lower()]
    if not token.isdigit():
        expected = f"a number {low}-{high}"
        if names:
            expected += f" or a name ({', '.join(sorted(names, key=names.__getitem__)[:3])}...)"
        raise ValueError(f"{token!r} is not {expected}")
    value = int(token)
    if not low <= value <= high:
        raise ValueError(f"{value} is out of range {low}-{high}")
    return value


def _check_field(text: str, index: int) -> frozenset[int]:
    """The values a field allows; ValueError saying what is wrong with it."""
    low, high = _RANGES[index]
    values: set[int] = set()
    if not text:
        raise ValueError("empty field")
    for part in text.split(","):
        if not part:
            raise ValueError(f"empty list item in {text!r}")
        base, slash, step_text = part.partition("/")
        step = 1
        if slash:
            if not step_text.isdigit() or int(step_text) == 0:
                raise ValueError(f"step {step_text!r} in {part!r} is not a positive number")
            step = int(step_text)
        if base == "*":
            start, stop = low, high
        elif "-" in base:
            a, _, b = base.partition("-")
            start, stop = _parse_value(a, index), _parse_value(b, index)
            if start > stop:
                raise ValueError(f"range {base!r} runs backwards")
        else:
            start = _parse_value(base, index)
            stop = high if slash else start
        values.update(range(start, stop + 1, step))
    if index == 4 and 7 in values:
        values.discard(7)
        values.add(0)
    return frozenset(values)


def cron_fields(expression: str) -> list[frozenset[int]]:
    """The values each of the five fields of a checked expression allows (day of week 0-6,
    Sunday 0)."""
    return [_check_field(f, i) for i, f in enumerate(expression.split())]


@dataclass(frozen=True)
class CronSchedule:
    """A five-field cron expression, evaluated by croniter in ``tz`` (None: local time).

    fsage checks each field first, so that a mistake is reported with the field's name and
    position; croniter then computes the run times on wall-clock time, and fsage maps them to
    instants (daylight-saving gaps and repeated hours, see the module docstring).
    """

    text: str
    expression: str  # the five fields (nicknames expanded)
    tz: tzinfo | None = None
    # cron(8): a day matches either day field only when both are restricted (neither
    # starts with "*"); otherwise both must match.
    day_or: bool = True

    @classmethod
    def parse(cls, text: str, tz: tzinfo | None = None) -> CronSchedule:
        """Parse ``text``; ScheduleError naming the field and its position otherwise."""
        expr = _NICKNAMES.get(text.strip().lower(), text)
        fields = expr.split()
        if len(fields) != 5:
            raise ScheduleError(
                f"schedule {text!r}: expected 5 fields (minute hour day-of-month month"
                f" day-of-week), found {len(fields)}"
            )
        for i, field in enumerate(fields):
            try:
                _check_field(field, i)
            except ValueError as exc:
                raise ScheduleError(
                    f"schedule {text!r}: field {i + 1} ({FIELD_NAMES[i]}) {field!r}: {exc}"
                ) from None
        day_or = not fields[2].startswith("*") and not fields[4].startswith("*")
        sched = cls(text=text, expression=" ".join(fields), tz=tz, day_or=day_or)
        try:
            sched.next_wall(datetime(2000, 1, 1))
        except ScheduleError:
            raise ScheduleError(f"schedule {text!r}: never matches any date") from None
        except ValueError as exc:  # anything else croniter refuses
            raise ScheduleError(f"schedule {text!r}: {exc}") from None
        return sched

    def next_wall(self, after: datetime) -> datetime:
        """The first matching wall-clock minute strictly after the naive ``after``."""
        from croniter import CroniterBadDateError, CroniterError, croniter

        try:
            it = croniter(self.expression, after.replace(tzinfo=None), day_or=self.day_or)
            nxt = it.get_next(datetime)
        except CroniterBadDateError:
            raise ScheduleError(f"schedule {self.text!r}: never matches any date") from None
        except CroniterError as exc:
            raise ValueError(str(exc)) from None
        assert isinstance(nxt, datetime)
        return nxt

    def next_run(self, after: float) -> float:
        wall = datetime.fromtimestamp(after, self.tz).replace(tzinfo=None)
        while True:
            nxt = self.next_wall(wall)
            ts = _wall_to_timestamp(nxt, self.tz)
            if ts > after:
                return ts
            # The second pass through a repeated (daylight-saving) hour: already run.
            wall = nxt

    def runs_per_day(self) -> int:
        """The most runs on any one day of a sample week (for retention checks)."""
        wall = datetime(2001, 1, 1)  # a Monday
        counts: dict[object, int] = {}
        while wall < datetime(2001, 1, 8):
            wall = self.next_wall(wall)
            counts[wall.date()] = counts.get(wall.date(), 0) + 1
        return max(counts.values(), default=1)


def _wall_to_timestamp(wall: datetime, tz: tzinfo | None) -> float:
    """Unix time of a wall-clock time; a time skipped by a DST jump maps to the jump itself."""
    early = wall.replace(tzinfo=tz, fold=0) if tz is not None else wall.replace(fold=0)
    ts = early.timestamp()
    if datetime.fromtimestamp(ts, tz).replace(tzinfo=None) == wall:
        return ts
    # In a gap: the fold=1 reading lies before the jump; walk forward to the first instant
    # whose wall clock is past ``wall`` (jumps happen on whole minutes).
    probe = early.replace(fold=1).timestamp()
    probe -= probe % 60
    while datetime.fromtimestamp(probe, tz).replace(tzinfo=None) < wall:
        probe += 60
    return probe


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(text: str | float) -> float:
    """``"2s"``, ``"500ms"``, ``"5m"``, ``"1.5h"``, ``"1d"`` or a number of seconds."""
    if isinstance(text, bool):
        raise ValueError(f"{text!r} is not a duration")
    if isinstance(text, int | float):
        value = float(text)
    else:
        m = _DURATION.match(text)
        if not m:
            raise ValueError(f"{text!r} is not a duration (like 30s, 500ms, 5m, 2h, 1d)")
        value = float(m.group(1)) * _UNIT[m.group(2)]
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{text!r} is not a duration of zero or more seconds")
    return value


@dataclass(frozen=True)
class Interval:
    """Runs at every multiple of ``seconds`` since the Unix epoch."""

    text: str
    seconds: float

    @classmethod
    def parse(cls, text: str | float) -> Interval:
        try:
            seconds = parse_duration(text)
        except ValueError as exc:
            raise ScheduleError(f"every: {exc}") from None
        if seconds < 0.1:
            raise ScheduleError(f"every: {text!r} is shorter than 0.1 s")
        return cls(text=str(text), seconds=seconds)

    def next_run(self, after: float) -> float:
        n = math.floor(after / self.seconds) + 1
        return n * self.seconds

    def runs_per_day(self) -> int:
        return max(1, math.ceil(86400 / self.seconds))
