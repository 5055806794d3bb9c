"""Which snapshots of a daemon target to keep: the newest, and the newest of each recent period.

``Retention(daily=14, monthly=12)`` keeps the newest snapshot of each of the 14 most recent
days that have a snapshot, the newest of each of the 12 most recent months that have one, and
always the newest snapshot of all. Periods count only days (hours, weeks...) that *have* a
snapshot, so a daemon that was stopped for a month does not lose its history on restart.
``last`` keeps the N newest snapshots whatever their time. Periods are calendar periods in the
given time zone (local time unless one is given); weeks start on Monday (ISO weeks).

The selection is a pure function of (id, time) pairs: :func:`select_deletions`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields
from datetime import datetime, tzinfo

PERIODS = ("last", "hourly", "daily", "weekly", "monthly", "yearly")


@dataclass(frozen=True)
class Retention:
    """How many of each period to keep; 0 keeps none for that period."""

    last: int = 0
    hourly: int = 0
    daily: int = 0
    weekly: int = 0
    monthly: int = 0
    yearly: int = 0

    def describe(self) -> str:
        parts = [f"{f.name} {getattr(self, f.name)}" for f in fields(self) if getattr(self, f.name)]
        return ", ".join(parts) or "only the newest"


def _period_keys(tz: tzinfo | None) -> dict[str, Callable[[datetime], object]]:
    def local(t: datetime) -> datetime:
        return t.astimezone(tz)

    return {
        "hourly": lambda t: local(t).strftime("%Y-%m-%d %H"),
        "daily": lambda t: local(t).date(),
        "weekly": lambda t: local(t).isocalendar()[:2],
        "monthly": lambda t: (local(t).year, local(t).month),
        "yearly": lambda t: local(t).year,
    }


def select_keep(
    snapshots: Iterable[tuple[int, datetime]], policy: Retention, tz: tzinfo | None = None
) -> set[int]:
    """The ids to keep among (id, taken_at) pairs; ``taken_at`` must carry a time zone."""
    newest_first: Sequence[tuple[int, datetime]] = sorted(
        snapshots, key=lambda s: (s[1], s[0]), reverse=True
    )
    keep: set[int] = set()
    if not newest_first:
        return keep
    keep.add(newest_first[0][0])
    keep.update(sid for sid, _ in newest_first[: policy.last])
    for period, key in _period_keys(tz).items():
        wanted = getattr(policy, period)
        seen: set[object] = set()
        for sid, taken in newest_first:
            if len(seen) >= wanted:
                break
            k = key(taken)
            if k not in seen:
                seen.add(k)
                keep.add(sid)
    return keep


def select_deletions(
    snapshots: Iterable[tuple[int, datetime]],
    policy: Retention,
    tz: tzinfo | None = None,
    protected: Iterable[int] = (),
) -> list[int]:
    """The ids to delete, ascending; ``protected`` ids are never deleted (nor counted)."""
    protect = set(protected)
    candidates = [(sid, t) for sid, t in snapshots if sid not in protect]
    keep = select_keep(candidates, policy, tz)
    return sorted(sid for sid, _ in candidates if sid not in keep)
