"""Segment utilization of a log-structured file system's snapshot (seed 001 §5.2): live blocks
per log segment from the segment usage table the LFS reader keeps in ``facts.groups``."""

from __future__ import annotations

from typing import Any

BINS = 10


def segment_utilization(facts: dict[str, Any], bins: int = BINS) -> dict[str, Any] | None:
    """``{"capacity", "live", "fraction", "histogram"}`` for an LFS snapshot's facts (as JSON),
    or None when the facts hold no segment usage table (any other kind of file system)."""
    groups = facts.get("groups") or []
    geo = (facts.get("extra") or {}).get("geometry") or {}
    if facts.get("kind") != "lfs" or not groups or not geo:
        return None
    from fsage.lfs.cleaner import utilization_histogram  # only LFS snapshots need the LFS code

    first = int(facts.get("first_data_block", 0))
    capacity = int(geo["blocks_per_segment"]) - int(geo["summary_blocks"])
    live = [int(g["live_blocks"]) for g in groups if int(g["start"]) >= first]
    return {
        "capacity": capacity,
        "live": live,
        "fraction": sum(live) / (capacity * len(live)) if live and capacity else 0.0,
        "histogram": utilization_histogram(live, capacity, bins=bins),
    }
