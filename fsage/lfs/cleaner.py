"""Cleaning policies, the disk model and the write-cost metrics of seed 001 chapter 5.

Everything here works on plain arrays (live blocks and newest-data time per segment), so the
file system (``fsage.lfs.fs``) and the random-update simulator (``fsage.lfs.sim``) share it.

Policies (chosen at mkfs or open time):

- ``greedy``: clean the least utilized segments.
- ``cost-benefit``: Sprite/BSD-LFS; clean the segments with the largest
  ``(1 - u) * age / (1 + u)``, where age is the age in seconds of the segment's newest data
  (seed 002, "Section 4 Cleaner Measurements"; BSD-LFS measures seconds).
- ``cost-age-cache``: cost-benefit where a segment still completely in the cache costs only
  the write of its live blocks, ``(1 - u) * age / u`` (seed 001 §5.5).
- ``hole-plugging``: live blocks of the least utilized segments fill the holes of the most
  utilized ones (seed 001 §5.4.1).
- ``adaptive``: at each opportunity, the cheaper of greedy cleaning and hole-plugging by the
  cost-benefit estimates of seed 001 EQ 7 and EQ 8 (§5.4.2).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

POLICIES = ("greedy", "cost-benefit", "cost-age-cache", "hole-plugging", "adaptive")


@dataclass(frozen=True)
class DiskModel:
    """Seed 001 §5.2.2: a request costs the average access time plus transfer at one rate."""

    access_s: float = 0.015
    bandwidth_bps: float = 5e6  # octets per second (seed 001 uses MB = 10^6 octets)

    def request_time(self, octets: float, requests: float = 1.0) -> float:
        return requests * self.access_s + octets / self.bandwidth_bps


@dataclass
class Counters:
    """What the log did, in requests and blocks, so any disk model can price it."""

    new_blocks: int = 0  # blocks written for new data (user data and its metadata)
    new_requests: int = 0  # write requests that carried them (full or partial segments)
    new_segments: int = 0  # segments completed by new data
    clean_segs_read: int = 0  # segments the cleaner read from disk
    clean_segs_cached: int = 0  # segments the cleaner found in the cache (no read)
    clean_blocks_written: int = 0  # live blocks the cleaner rewrote at the log's end
    clean_requests: int = 0  # write requests that carried them
    clean_segments: int = 0  # segments completed by the cleaner
    holeplug_segs_read: int = 0  # segments read to be broken up into patches
    holeplug_blocks: int = 0  # blocks written into holes (one request each)
    segments_freed: int = 0
    cleaning_passes: int = 0
    holeplug_passes: int = 0
    buffered_overwrites: int = 0  # writes into a block still in the segment buffer (no new block)

    def to_json(self) -> dict[str, int]:
        return asdict(self)

    def add(self, other: Counters) -> None:
        for k, v in asdict(other).items():
            setattr(self, k, getattr(self, k) + v)

    def subtract(self, other: Counters) -> None:
        for k, v in asdict(other).items():
            setattr(self, k, getattr(self, k) - v)


def write_cost_metrics(
    c: Counters, *, block_size: int, blocks_per_segment: int, disk: DiskModel
) -> dict[str, float]:
    """Seed 001 EQ 1-6 from the counters.

    Segment counts are in segments' worth of blocks (partial segments count fractionally):
    SegsWrittenNewData = new_blocks / blocks_per_segment, SegsReadClean = segments read by the
    cleaner (and by hole-plugging), SegsWrittenClean = cleaner blocks / blocks_per_segment.

    - write_cost (EQ 1) = (new + read + written by cleaner) / new
    - cleaner_overhead (EQ 2) = (read + written by cleaner) / new
    - transfer_inefficiency (EQ 3) = (access + seg/bw) / (seg/bw), for full segments
    - overall_write_cost (EQ 4/6) = total transfer time / time to write the new data at full
      bandwidth; transfer time counts every request: partial segment writes, segment reads,
      and one request per hole-plugged block.
    - write_cost_x_ti (EQ 5) = write_cost * transfer_inefficiency (all transfers whole segments)
    """
    seg_bytes = block_size * blocks_per_segment
    new_segs = c.new_blocks / blocks_per_segment
    read_segs = c.clean_segs_read + c.holeplug_segs_read
    written_clean = c.clean_blocks_written / blocks_per_segment
    ti = disk.request_time(seg_bytes) / (seg_bytes / disk.bandwidth_bps)
    if new_segs == 0:
        return {
            "segs_written_new_data": 0.0,
            "segs_read_clean": float(read_segs),
            "segs_written_clean": written_clean,
            "blocks_hole_plugged": float(c.holeplug_blocks),
            "write_cost": 1.0,
            "cleaner_overhead": 0.0,
            "transfer_inefficiency": ti,
            "write_cost_x_ti": ti,
            "overall_write_cost": 0.0,
        }
    # Hole-plugging writes are counted in blocks: express them as segments for EQ 1 too.
    hp_segs = c.holeplug_blocks / blocks_per_segment
    write_cost = (new_segs + read_segs + written_clean + hp_segs) / new_segs
    overhead = (read_segs + written_clean + hp_segs) / new_segs
    total = (
        disk.request_time(c.new_blocks * block_size, c.new_requests)
        + disk.request_time(read_segs * seg_bytes, read_segs)
        + disk.request_time(c.clean_blocks_written * block_size, c.clean_requests)
        + disk.request_time(c.holeplug_blocks * block_size, c.holeplug_blocks)
    )
    ideal = c.new_blocks * block_size / disk.bandwidth_bps
    return {
        "segs_written_new_data": new_segs,
        "segs_read_clean": float(read_segs),
        "segs_written_clean": written_clean,
        "blocks_hole_plugged": float(c.holeplug_blocks),
        "write_cost": write_cost,
        "cleaner_overhead": overhead,
        "transfer_inefficiency": ti,
        "write_cost_x_ti": write_cost * ti,
        "overall_write_cost": total / ideal,
    }


def utilization_histogram(
    live: Sequence[int], capacity: int, segments: Sequence[int] | None = None, bins: int = 10
) -> list[dict[str, Any]]:
    """Segments by utilization (live / capacity) in ``bins`` equal buckets; bucket ``i`` holds
    ``i/bins <= u < (i+1)/bins``, the last one includes u = 1. Plain data for tables/JSON."""
    counts = [0] * bins
    idx = range(len(live)) if segments is None else segments
    for s in idx:
        u = live[s] / capacity if capacity else 0.0
        counts[min(bins - 1, int(u * bins))] += 1
    return [{"low": i / bins, "high": (i + 1) / bins, "segments": counts[i]} for i in range(bins)]


@dataclass
class Plan:
    """One garbage-collection opportunity: what to process and by which mechanism."""

    mechanism: str  # "clean" or "holeplug"
    sources: list[int]
    targets: list[int] = field(default_factory=list)  # hole-plugging: segments with holes
    estimate: float = 0.0  # seconds per octet freed (EQ 7 / EQ 8)


def _score_order(
    policy: str,
    candidates: Sequence[int],
    live: Sequence[int],
    mtime_ms: Sequence[int],
    now_ms: int,
    capacity: int,
    cached: frozenset[int],
) -> list[int]:
    if policy in ("greedy", "hole-plugging", "adaptive"):
        return sorted(candidates, key=lambda s: (live[s], s))

    def benefit(s: int) -> float:
        u = live[s] / capacity
        if u <= 0.0:
            return float("inf")
        age = max(0.0, (now_ms - mtime_ms[s]) / 1000.0) + 1e-3
        cost = u if (policy == "cost-age-cache" and s in cached) else 1.0 + u
        return (1.0 - u) * age / cost

    return sorted(candidates, key=lambda s: (-benefit(s), s))


def plan_cleaning(
    policy: str,
    candidates: Sequence[int],
    live: Sequence[int],
    mtime_ms: Sequence[int],
    now_ms: int,
    capacity: int,
    want_segments: int,
    room_segments: float,
    cached: frozenset[int] = frozenset(),
) -> list[int]:
    """Segments to clean: in policy order, until the free space they yield makes
    ``want_segments`` segments, without moving more live blocks than ``room_segments`` hold."""
    order = _score_order(policy, candidates, live, mtime_ms, now_ms, capacity, cached)
    chosen: list[int] = []
    moved = 0
    freed = 0
    for s in order:
        if live[s] >= capacity:
            continue
        if moved + live[s] > room_segments * capacity:
            continue
        chosen.append(s)
        moved += live[s]
        freed += capacity - live[s]
        if freed >= want_segments * capacity:
            break
    return chosen


def plan_holeplug(
    candidates: Sequence[int],
    live: Sequence[int],
    capacity: int,
    want_segments: int,
) -> tuple[list[int], list[int]]:
    """Sources: the least utilized segments (``want_segments`` of them); targets: the most
    utilized segments with holes, enough holes for the sources' live blocks."""
    order = sorted(candidates, key=lambda s: (live[s], s))
    sources = [s for s in order[:want_segments] if live[s] < capacity]
    need = sum(live[s] for s in sources)
    src = set(sources)
    targets: list[int] = []
    holes = 0
    for s in sorted(candidates, key=lambda s: (-live[s], s)):
        if holes >= need:
            break
        if s in src or live[s] >= capacity:
            continue
        targets.append(s)
        holes += capacity - live[s]
    if holes < need:
        # Not enough holes outside the sources: plug with fewer sources.
        while sources and holes < sum(live[s] for s in sources):
            sources.pop()
    return sources, targets


def estimate_cleaning(
    sources: Sequence[int],
    live: Sequence[int],
    capacity: int,
    blocks_per_segment: int,
    block_size: int,
    disk: DiskModel,
    cached: frozenset[int] = frozenset(),
) -> float:
    """Seed 001 EQ 7: (CandidatesRead + LiveBlocks / BlocksPerSeg) x TransferTimeSeg over
    EmptyBlocks x BlockSize (seconds per octet freed)."""
    seg_t = disk.request_time(block_size * blocks_per_segment)
    reads = sum(1 for s in sources if s not in cached)
    live_blocks = sum(live[s] for s in sources)
    empty = sum(capacity - live[s] for s in sources)
    if empty <= 0:
        return float("inf")
    return (reads + live_blocks / blocks_per_segment) * seg_t / (empty * block_size)


def estimate_holeplug(
    sources: Sequence[int],
    live: Sequence[int],
    blocks_per_segment: int,
    block_size: int,
    disk: DiskModel,
) -> float:
    """Seed 001 EQ 8: CandidatesRead x TransferTimeSeg + LiveBlocks x TransferTimeBlock over
    CandidatesRead x SegmentSize (seconds per octet freed)."""
    if not sources:
        return float("inf")
    seg_bytes = block_size * blocks_per_segment
    t = len(sources) * disk.request_time(seg_bytes) + sum(
        live[s] for s in sources
    ) * disk.request_time(block_size)
    return t / (len(sources) * seg_bytes)


def plan(
    policy: str,
    candidates: Sequence[int],
    live: Sequence[int],
    mtime_ms: Sequence[int],
    now_ms: int,
    *,
    capacity: int,
    blocks_per_segment: int,
    block_size: int,
    want_segments: int,
    room_segments: float,
    disk: DiskModel,
    cached: frozenset[int] = frozenset(),
) -> Plan | None:
    """Choose what to do at one garbage-collection opportunity, or None if nothing helps."""
    clean: Plan | None = None
    hole: Plan | None = None
    if policy != "hole-plugging":
        sel = "greedy" if policy == "adaptive" else policy
        src = plan_cleaning(
            sel,
            candidates,
            live,
            mtime_ms,
            now_ms,
            capacity,
            want_segments,
            room_segments,
            cached,
        )
        if src and sum(capacity - live[s] for s in src) > 0:
            est = estimate_cleaning(
                src, live, capacity, blocks_per_segment, block_size, disk, cached
            )
            clean = Plan("clean", src, estimate=est)
    if policy in ("hole-plugging", "adaptive"):
        src, tgt = plan_holeplug(candidates, live, capacity, want_segments)
        if src:
            est = estimate_holeplug(src, live, blocks_per_segment, block_size, disk)
            hole = Plan("holeplug", src, tgt, estimate=est)
    if clean is None:
        return hole
    if hole is None:
        return clean
    return clean if clean.estimate <= hole.estimate else hole
