"""Cron expressions and intervals: exact next-run times, croniter as an independent oracle."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from fsage.snapshotter.schedule import CronSchedule, Interval, ScheduleError, parse_duration

UTC_ZONE = ZoneInfo("UTC")


def nxt(expr: str, after: datetime, tz: ZoneInfo = UTC_ZONE) -> datetime:
    sched = CronSchedule.parse(expr, tz)
    return datetime.fromtimestamp(sched.next_run(after.timestamp()), tz)


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC_ZONE)  # type: ignore[misc]


@pytest.mark.parametrize(
    ("expr", "after", "expected"),
    [
        # The default: nightly at 02:30.
        ("30 2 * * *", utc(2024, 1, 1, 0, 0), utc(2024, 1, 1, 2, 30)),
        ("30 2 * * *", utc(2024, 1, 1, 2, 30), utc(2024, 1, 2, 2, 30)),
        ("30 2 * * *", utc(2024, 12, 31, 3, 0), utc(2025, 1, 1, 2, 30)),
        # Steps, ranges, lists.
        ("*/15 * * * *", utc(2024, 1, 1, 10, 14, 59), utc(2024, 1, 1, 10, 15)),
        ("*/15 * * * *", utc(2024, 1, 1, 10, 45), utc(2024, 1, 1, 11, 0)),
        ("5-20/5 9 * * *", utc(2024, 1, 1, 9, 15), utc(2024, 1, 1, 9, 20)),
        ("0 8,12,18 * * *", utc(2024, 1, 1, 12, 0), utc(2024, 1, 1, 18, 0)),
        ("10/20 * * * *", utc(2024, 1, 1, 0, 31), utc(2024, 1, 1, 0, 50)),
        # Names; 2024-01-01 is a Monday.
        ("0 0 * * fri", utc(2024, 1, 1), utc(2024, 1, 5)),
        ("0 0 * * mon-fri", utc(2024, 1, 5, 1), utc(2024, 1, 8)),
        ("0 0 1 jun *", utc(2024, 1, 1), utc(2024, 6, 1)),
        ("0 0 * * 7", utc(2024, 1, 1), utc(2024, 1, 7)),  # 7 is Sunday too
        # Both day fields restricted: either matches (Friday the 5th comes before the 13th).
        ("0 0 13 * fri", utc(2024, 1, 1), utc(2024, 1, 5)),
        ("0 0 13 * fri", utc(2024, 1, 12, 1), utc(2024, 1, 13)),
        # Only one restricted (the other starts with *): both must hold.
        ("0 0 13 * *", utc(2024, 1, 14), utc(2024, 2, 13)),
        ("0 0 */2 * fri", utc(2024, 1, 1), utc(2024, 1, 5)),
        # Leap day.
        ("0 0 29 feb *", utc(2024, 3, 1), utc(2028, 2, 29)),
        # Nicknames.
        ("@hourly", utc(2024, 1, 1, 10, 1), utc(2024, 1, 1, 11, 0)),
        ("@weekly", utc(2024, 1, 1), utc(2024, 1, 7)),
        ("@yearly", utc(2024, 1, 1), utc(2025, 1, 1)),
    ],
)
def test_next_run_exact(expr: str, after: datetime, expected: datetime) -> None:
    assert nxt(expr, after) == expected


def test_daylight_saving_gap_runs_at_the_jump_and_repeated_hour_runs_once() -> None:
    berlin = ZoneInfo("Europe/Berlin")
    # 2024-03-31: 02:00 CET jumps to 03:00 CEST; 02:30 does not exist that night.
    after = datetime(2024, 3, 30, 12, tzinfo=berlin)
    got = nxt("30 2 * * *", after, berlin)
    assert got == datetime(2024, 3, 31, 3, 0, tzinfo=berlin)
    assert got.utcoffset() == timedelta(hours=2)
    assert nxt("30 2 * * *", got, berlin) == datetime(2024, 4, 1, 2, 30, tzinfo=berlin)
    # 2024-10-27: 02:00-03:00 happens twice; 02:30 runs once, in its first (CEST) occurrence.
    sched = CronSchedule.parse("30 2 * * *", berlin)
    t = sched.next_run(datetime(2024, 10, 26, 12, tzinfo=berlin).timestamp())
    assert datetime.fromtimestamp(t, UTC) == datetime(2024, 10, 27, 0, 30, tzinfo=UTC)
    t2 = sched.next_run(t)
    assert datetime.fromtimestamp(t2, UTC) == datetime(2024, 10, 28, 1, 30, tzinfo=UTC)


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("30 2 * *", "expected 5 fields (minute hour day-of-month month day-of-week), found 4"),
        ("61 2 * * *", "field 1 (minute) '61': 61 is out of range 0-59"),
        ("30 24 * * *", "field 2 (hour) '24': 24 is out of range 0-23"),
        ("30 2 0 * *", "field 3 (day of month) '0': 0 is out of range 1-31"),
        ("30 2 * foo *", "field 4 (month) 'foo': 'foo' is not a number 1-12 or a name"),
        ("30 2 * * 8", "field 5 (day of week) '8': 8 is out of range 0-7"),
        ("*/0 2 * * *", "field 1 (minute) '*/0': step '0' in '*/0' is not a positive number"),
        ("30 5-2 * * *", "field 2 (hour) '5-2': range '5-2' runs backwards"),
        ("30 2,,3 * * *", "field 2 (hour) '2,,3': empty list item in '2,,3'"),
        ("0 0 31 feb *", "never matches any date"),
    ],
)
def test_bad_expressions_name_the_field(expr: str, message: str) -> None:
    with pytest.raises(ScheduleError) as err:
        CronSchedule.parse(expr)
    assert str(err.value).startswith(f"schedule {expr!r}: ")
    assert message in str(err.value)


ORACLE_EXPRESSIONS = [
    "30 2 * * *",
    "*/7 * * * *",
    "0 */5 * * *",
    "15,45 1-5 * * *",
    "0 0 1,15 * *",
    "0 12 * * mon,wed,fri",
    "0 0 13 * 5",
    "5 4 * * sun",
    "0 22 * * 1-5",
    "23 0-20/2 * * *",
    "0 0 1 */3 *",
    "0 9 1-7 * 1",
    "59 23 31 dec *",
    "0 0 29 2 *",
]


@pytest.mark.parametrize("expr", ORACLE_EXPRESSIONS)
def test_agrees_with_croniter(expr: str) -> None:
    croniter = pytest.importorskip("croniter").croniter
    rng = random.Random(expr)
    sched = CronSchedule.parse(expr, UTC_ZONE)
    for _ in range(40):
        start = utc(2023, 1, 1) + timedelta(seconds=rng.randrange(3 * 365 * 86400))
        ours = sched.next_run(start.timestamp())
        theirs = croniter(expr, start).get_next(datetime)
        assert datetime.fromtimestamp(ours, UTC_ZONE) == theirs, (expr, start)


def test_interval_runs_on_multiples_of_its_length() -> None:
    every = Interval.parse("2s")
    assert every.seconds == 2.0
    assert every.next_run(1000.0) == 1002.0
    assert every.next_run(1001.3) == 1002.0
    hourly = Interval.parse("1h")
    assert hourly.next_run(utc(2024, 1, 1, 10, 5).timestamp()) == utc(2024, 1, 1, 11).timestamp()


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("2s", 2.0), ("500ms", 0.5), ("5m", 300.0), ("1.5h", 5400.0), ("1d", 86400.0), (7, 7.0)],
)
def test_durations(text: str | int, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["2x", "-1s", "", "s"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError, match="is not a duration"):
        parse_duration(text)


def test_interval_floor() -> None:
    with pytest.raises(ScheduleError, match=r"shorter than 0\.1 s"):
        Interval.parse("50ms")
