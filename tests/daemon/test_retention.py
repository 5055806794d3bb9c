"""Retention: which snapshot ids go, worked out by hand for small histories."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from fsage.snapshotter.retention import Retention, select_deletions, select_keep


def nightly(
    days: int, start: datetime = datetime(2024, 1, 1, 2, 30, tzinfo=UTC)
) -> list[tuple[int, datetime]]:
    """Snapshot i (1-based) taken at 02:30 UTC on day i-1 after ``start``."""
    return [(i + 1, start + timedelta(days=i)) for i in range(days)]


def test_daily_keeps_the_last_n_days() -> None:
    snaps = nightly(10)
    assert select_deletions(snaps, Retention(daily=3), UTC) == [1, 2, 3, 4, 5, 6, 7]


def test_newest_of_each_day_is_the_one_kept() -> None:
    day = datetime(2024, 1, 1, tzinfo=UTC)
    snaps = [
        (1, day + timedelta(hours=1)),
        (2, day + timedelta(hours=5)),
        (3, day + timedelta(days=1, hours=1)),
        (4, day + timedelta(days=1, hours=9)),
        (5, day + timedelta(days=2, hours=3)),
    ]
    assert select_keep(snaps, Retention(daily=2), UTC) == {4, 5}
    assert select_deletions(snaps, Retention(daily=2), UTC) == [1, 2, 3]


def test_monthly_and_daily_together() -> None:
    # Nightly from 2024-01-01 to 2024-04-09 (100 days): ids 1..100.
    snaps = nightly(100)
    keep = select_keep(snaps, Retention(daily=5, monthly=3), UTC)
    # Last 5 days: Apr 5-9 = ids 96..100. Newest of each of the last 3 months:
    # April -> 100 (already), March 31 -> id 91, February 29 -> id 60.
    assert keep == {96, 97, 98, 99, 100, 91, 60}


def test_the_newest_is_always_kept_and_nothing_asked_keeps_only_it() -> None:
    snaps = nightly(4)
    assert select_deletions(snaps, Retention(), UTC) == [1, 2, 3]
    assert select_deletions([], Retention(daily=3), UTC) == []


def test_periods_count_only_days_that_have_snapshots() -> None:
    # Three snapshots a month apart: daily=2 keeps the two newest, not just the last one.
    snaps = [
        (1, datetime(2024, 1, 1, tzinfo=UTC)),
        (2, datetime(2024, 2, 1, tzinfo=UTC)),
        (3, datetime(2024, 3, 1, tzinfo=UTC)),
    ]
    assert select_deletions(snaps, Retention(daily=2), UTC) == [1]


def test_last_weekly_yearly_hourly() -> None:
    snaps = nightly(21)  # 2024-01-01 (Mon) .. 2024-01-21 (Sun)
    assert select_deletions(snaps, Retention(last=4), UTC) == list(range(1, 18))
    # ISO weeks: Jan 1-7, 8-14, 15-21 -> newest of each: 7, 14, 21; weekly=2 keeps 14 and 21.
    assert select_keep(snaps, Retention(weekly=2), UTC) == {14, 21}
    assert select_keep(snaps, Retention(yearly=5), UTC) == {21}
    t0 = datetime(2024, 1, 1, tzinfo=UTC)
    hours = [(i + 1, t0 + timedelta(minutes=20 * i)) for i in range(9)]
    # Hours 00 (ids 1-3), 01 (4-6), 02 (7-9): hourly=2 keeps 6 and 9.
    assert select_keep(hours, Retention(hourly=2), UTC) == {6, 9}


def test_days_are_days_of_the_given_time_zone() -> None:
    # 23:30 UTC on Jan 1 is already Jan 2 in Berlin: there, snapshots 1 and 2 share a day.
    snaps = [
        (1, datetime(2024, 1, 1, 23, 30, tzinfo=UTC)),
        (2, datetime(2024, 1, 2, 10, 0, tzinfo=UTC)),
    ]
    assert select_deletions(snaps, Retention(daily=2), UTC) == []
    assert select_deletions(snaps, Retention(daily=2), ZoneInfo("Europe/Berlin")) == [1]


def test_protected_ids_are_neither_deleted_nor_counted() -> None:
    snaps = nightly(6)
    assert select_deletions(snaps, Retention(daily=2), UTC, protected={2, 6}) == [1, 3]


def test_describe() -> None:
    assert Retention(daily=14, monthly=12).describe() == "daily 14, monthly 12"
    assert Retention().describe() == "only the newest"
