"""The random-update workload of seed 001 §5.2.1.1 on a segment-level model of the log.

This is the experiment behind seed 001 Figure 5-4: fill the disk sequentially to utilization
U, then make ten times as many random block updates as blocks written, with a sync after every
fourth write. Like the thesis's simulator (§5.2.2) it tracks only data blocks: segment headers
and file metadata are not reflected in disk traffic, writes go through a one-segment write
buffer (a write to a block still in the buffer replaces it), a sync writes the buffer as a
partial segment write and the log goes on filling the same segment, and garbage collection
runs in the foreground when no empty segment is left. Selection and the cleaning/hole-plugging
choice are the file system's own (``fsage.lfs.cleaner``).
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass

from fsage.lfs import cleaner as cl


@dataclass
class SimResult:
    utilization: float
    mechanism: str
    counters: cl.Counters
    metrics: dict[str, float]


class _Log:
    def __init__(
        self, nseg: int, spb: int, policy: str, disk: cl.DiskModel, block_size: int, batch: int
    ) -> None:
        self.nseg, self.spb, self.policy, self.disk = nseg, spb, policy, disk
        self.block_size = block_size
        self.batch = batch
        self.owner = [-1] * (nseg * spb)
        self.live = [0] * nseg
        self.mtime = [0] * nseg
        self.clean = list(range(nseg - 1, -1, -1))
        self.loc: list[int] = []
        self.c = cl.Counters()
        self.cur = self.clean.pop()
        self.pos = 0
        self.flushed = 0
        self.buffered: dict[int, int] = {}  # block -> slot address, not yet on disk
        self.gc_out = -1
        self.gc_pos = 0
        self.gc_pending = 0
        self.clock = 0

    # -- new data
    def write(self, b: int) -> None:
        self.clock += 1
        slot = self.buffered.get(b)
        if slot is not None:
            return  # rewritten in the write buffer
        if self.pos == self.spb:
            self.flush()
            self.cur = self._take()
            self.pos = self.flushed = 0
            self.c.new_segments += 1
        addr = self.cur * self.spb + self.pos
        self.pos += 1
        self._move(b, addr)
        self.buffered[b] = addr

    def _move(self, b: int, addr: int) -> None:
        if b < len(self.loc):
            old = self.loc[b]
            if old >= 0:
                self.owner[old] = -1
                self.live[old // self.spb] -= 1
            self.loc[b] = addr
        else:
            self.loc.append(addr)
        self.owner[addr] = b
        seg = addr // self.spb
        self.live[seg] += 1
        self.mtime[seg] = self.clock

    def flush(self) -> None:
        n = self.pos - self.flushed
        if n > 0:
            self.c.new_blocks += n
            self.c.new_requests += 1
        self.flushed = self.pos
        self.buffered.clear()

    def _take(self) -> int:
        if len(self.clean) < 2:
            self.gc()
        if not self.clean:
            raise RuntimeError("simulated disk full")
        return self.clean.pop()

    # -- garbage collection
    def gc(self) -> None:
        for _ in range(1000):
            # Segments whose blocks were all overwritten are clean without cleaning.
            clean = set(self.clean)
            self.clean.extend(
                s
                for s in range(self.nseg)
                if self.live[s] == 0 and s != self.cur and s != self.gc_out and s not in clean
            )
            if len(self.clean) >= 2:
                return
            clean = set(self.clean)
            cands = [
                s
                for s in range(self.nseg)
                if s != self.cur and s != self.gc_out and self.live[s] > 0 and s not in clean
            ]
            plan = cl.plan(
                self.policy,
                cands,
                self.live,
                self.mtime,
                self.clock,
                capacity=self.spb,
                blocks_per_segment=self.spb,
                block_size=self.block_size,
                want_segments=self.batch,
                room_segments=self.nseg,
                disk=self.disk,
            )
            if plan is None:
                return
            if plan.mechanism == "clean":
                self.c.cleaning_passes += 1
                self._clean(plan.sources)
            else:
                self.c.holeplug_passes += 1
                self._holeplug(plan.sources, plan.targets)

    def _gc_slot(self) -> int:
        if self.gc_out < 0 or self.gc_pos == self.spb:
            if self.gc_out >= 0:
                self._gc_flush()
                self.c.clean_segments += 1
            self.gc_out = self.clean.pop()
            self.gc_pos = 0
        addr = self.gc_out * self.spb + self.gc_pos
        self.gc_pos += 1
        self.gc_pending += 1
        return addr

    def _gc_flush(self) -> None:
        if self.gc_pending:
            self.c.clean_blocks_written += self.gc_pending
            self.c.clean_requests += 1
            self.gc_pending = 0

    def _clean(self, sources: list[int]) -> None:
        for s in sources:
            self.c.clean_segs_read += 1
            base = s * self.spb
            for i in range(self.spb):
                b = self.owner[base + i]
                if b >= 0:
                    keep = self.mtime[s]
                    self._move(b, self._gc_slot())
                    self.mtime[self.gc_out] = max(self.mtime[self.gc_out], keep)
            self.clean.append(s)
            self.c.segments_freed += 1
        self._gc_flush()
        if self.gc_out >= 0 and self.gc_pos == self.spb:
            self.c.clean_segments += 1
            self.gc_out = -1

    def _holeplug(self, sources: list[int], targets: list[int]) -> None:
        holes = [
            t * self.spb + i
            for t in targets
            for i in range(self.spb)
            if self.owner[t * self.spb + i] < 0
        ]
        for s in sources:
            self.c.holeplug_segs_read += 1
            base = s * self.spb
            for i in range(self.spb):
                b = self.owner[base + i]
                if b >= 0:
                    self._move(b, holes.pop())
                    self.c.holeplug_blocks += 1
            self.clean.append(s)
            self.c.segments_freed += 1


def random_update(
    utilization: float,
    mechanism: str,
    *,
    segments: int = 256,
    segment_size: int = 256 * 1024,
    block_size: int = 8192,
    disk: cl.DiskModel | None = None,
    updates_per_block: int = 10,
    sync_every: int = 4,
    batch: int = 2,
    seed: int = 1,
) -> SimResult:
    """One point of Figure 5-4. ``mechanism``: ``clean`` (greedy cleaning), ``holeplug`` or
    ``adaptive``; counters cover the update phase only (the initial fill is not counted)."""
    disk = disk or cl.DiskModel()
    policy = {"clean": "greedy", "holeplug": "hole-plugging", "adaptive": "adaptive"}[mechanism]
    spb = segment_size // block_size
    log = _Log(segments, spb, policy, disk, block_size, batch)
    nblocks = int(utilization * segments * spb)
    for b in range(nblocks):
        log.write(b)
    log.flush()
    log.c = cl.Counters()
    rng = random.Random(seed)
    rand = rng.randrange
    for i in range(updates_per_block * nblocks):
        log.write(rand(nblocks))
        if (i + 1) % sync_every == 0:
            log.flush()
    log.flush()
    metrics = cl.write_cost_metrics(log.c, block_size=block_size, blocks_per_segment=spb, disk=disk)
    return SimResult(utilization, mechanism, log.c, metrics)


def random_update_lfs(
    utilization: float,
    mechanism: str,
    image: str | os.PathLike[str],
    *,
    segments: int = 128,
    segment_size: int = 256 * 1024,
    block_size: int = 8192,
    disk: cl.DiskModel | None = None,
    updates_per_block: int = 10,
    sync_every: int = 4,
    seed: int = 1,
) -> SimResult:
    """The same workload through the file system itself (``fsage.lfs.fs``) on ``image``
    (created, or overwritten): one file of ``utilization`` x the log's data blocks written
    sequentially, then ten times as many random one-block updates, every ``sync_every`` of
    them written as one unit (``LFS.writev``: writes, then a sync). Unlike the simulator this
    counts everything the log writes — indirect blocks, inode-table blocks and segment
    summaries' segments — and the cleaner's reads of whole segments (no segment cache).
    The policy is the mechanism's (``greedy``, ``hole-plugging`` or ``adaptive``); counters
    cover the update phase only. ``SimResult.utilization`` is the live fraction at the end.
    Raises ``LfsNoSpace`` when the log cannot hold the data at this utilization."""
    from fsage.lfs.fs import LFS, mkfs

    disk = disk or cl.DiskModel()
    policy = {"clean": "greedy", "holeplug": "hole-plugging", "adaptive": "adaptive"}[mechanism]
    mkfs(
        image,
        segments=segments,
        blocks_per_segment=segment_size // block_size,
        block_size=block_size,
        cleaning_policy=policy,
    )
    fs = LFS.open(image, disk=disk, cache_segments=0)
    try:
        geo = fs.geo
        capacity, _ = fs.usage()
        nblocks = int(utilization * capacity)
        block = bytes(range(256)) * (block_size // 256)
        fs.create("data")
        chunk = 16 * geo.data_blocks_per_segment
        for first in range(0, nblocks, chunk):
            n = min(chunk, nblocks - first)
            fs.write("data", first * block_size, block * n)
        fs.checkpoint()
        fs.counters = cl.Counters()
        rand = random.Random(seed).randrange
        pieces: list[tuple[int, bytes]] = []
        for _ in range(updates_per_block * nblocks):
            pieces.append((rand(nblocks) * block_size, block))
            if len(pieces) == sync_every:
                fs.writev("data", pieces)
                pieces = []
        if pieces:
            fs.writev("data", pieces)
        c = fs.counters
        total, live = fs.usage()
        metrics = cl.write_cost_metrics(
            c, block_size=block_size, blocks_per_segment=geo.data_blocks_per_segment, disk=disk
        )
        return SimResult(live / total, mechanism, c, metrics)
    finally:
        fs.close()
