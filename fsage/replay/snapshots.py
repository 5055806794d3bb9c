"""Which recorded snapshots a replay covers: snapshot ids and dates as the user gives them
(``--until``, ``--from``), resolved against one file system's snapshots in the store."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, date, datetime, time
from typing import Any

from fsage.errors import StoreError, UsageError
from fsage.layout import Layout


def to_ns(when: datetime) -> int:
    return int(when.timestamp()) * 10**9 + when.microsecond * 1000


def parse_when(spec: str) -> int | datetime:
    """A snapshot id (an integer) or a date/time (ISO 8601; naive means UTC). A date alone
    means the end of that day, so ``--until 2024-05-01`` includes that day's snapshots."""
    s = spec.strip()
    if s.isdigit():
        return int(s)
    try:
        if len(s) == 10:
            d = date.fromisoformat(s)
            return datetime.combine(d, time.max, tzinfo=UTC)
        dt = datetime.fromisoformat(s)
    except ValueError:
        raise UsageError(
            f"{spec!r} is neither a snapshot id nor a date (YYYY-MM-DD[THH:MM])"
        ) from None
    return dt if dt.tzinfo is not None else dt.replace(tzinfo=UTC)


def resolve_snapshot(rows: list[Any], fs_name: str, spec: str, store: Any, what: str) -> Any:
    """The snapshot of ``fs_name`` that ``spec`` (an id or a date) names."""
    if not rows:
        raise StoreError(f"file system {fs_name!r} has no snapshots")
    when = parse_when(spec)
    if isinstance(when, int):
        for r in rows:
            if r.id == when:
                return r
        other = store.snapshot(when)  # raises StoreError when there is no such snapshot
        raise UsageError(
            f"{what} snapshot {when} belongs to file system {other.fs_name!r}, not {fs_name!r}"
        )
    chosen = [r for r in rows if r.taken_at <= when]
    if not chosen:
        raise UsageError(
            f"{what} {spec}: before the first snapshot of {fs_name!r} "
            f"({rows[0].taken_at.isoformat(timespec='seconds')})"
        )
    return chosen[-1]


def history(
    store: Any, fs_name: str, until: str | None, since: str | None = None
) -> tuple[list[Any], Any | None]:
    """(snapshots to replay, in order; the starting snapshot or None for an empty start).

    ``until`` (default: the latest) and ``since`` are snapshot ids or dates of ``fs_name``.
    """
    rows = store.snapshots(fs_name)  # StoreError for an unknown name
    rows = sorted(rows, key=lambda r: r.id)
    if not rows:
        raise StoreError(f"file system {fs_name!r} has no snapshots")
    end = resolve_snapshot(rows, fs_name, until, store, "--until") if until else rows[-1]
    start = None
    if since is not None:
        start = resolve_snapshot(rows, fs_name, since, store, "--from")
        if start.id >= end.id:
            raise UsageError(f"--from snapshot {start.id} is not before --until snapshot {end.id}")
    chain = [r for r in rows if (start is None or r.id > start.id) and r.id <= end.id]
    return chain, start


def iter_layouts(store: Any, chain: list[Any]) -> Iterator[tuple[Any, Layout]]:
    for snap in chain:
        yield snap, store.load_layout(snap.id)
