"""Segments and the log of seed 003 (§2.3.2 checkpoint, §2.4 log segment and §2.4.1 segment
summary; the log module of §3.2): the segment buffer, units and their commit, checkpoints and
roll-forward.
"""

from __future__ import annotations

import contextlib
import os
import time

from fsage.lfs import format as fmt
from fsage.lfs import lfs_pb2
from fsage.lfs.common import _MAX_PENDING, now_ms
from fsage.lfs.format import (
    BT_DATA,
    BT_DIRCH,
    INO_INOMAP,
    INO_INOTBL,
    INO_INOVEC,
    BlockRec,
    LfsError,
    LfsNoSpace,
)
from fsage.lfs.inodes import _simp
from fsage.lfs.state import LfsState


class _LogMixin(LfsState):
    """Segments, the log, checkpoints and roll-forward of :class:`fsage.lfs.fs.LFS`."""

    def _roll_forward(self, seg: int) -> list[int]:
        """Seed 003 §2.4.1: follow next-segment pointers from the checkpoint's next segment
        while each summary's timestamp grows; apply the system-file blocks of complete units."""
        rolled: list[int] = []
        committed = 0
        last = self.cp_stamp
        pending: list[tuple[int, int, int]] = []
        seen: set[int] = set()
        geo = self.geo
        while geo.first_log_segment <= seg < geo.segments and seg not in seen:
            seen.add(seg)
            try:
                summ = fmt.read_summary(self.fd, geo, seg)
            except LfsError:
                break
            if summ.stamp <= last:
                break
            last = summ.stamp
            rolled.append(seg)
            recs = sorted(
                ((r.seq, i, r) for i, r in enumerate(summ.recs) if r is not None),
                key=lambda t: t[0],
            )
            has_commit = bool(summ.flags & fmt.SEGFLAG_COMMIT)
            count = summ.flags & fmt.SEGFLAG_COUNT
            applied = False
            for sq, blk, r in recs:
                if has_commit and not applied and sq >= count:
                    self._apply_rolled(pending, seg)
                    applied = True
                if r.btype == BT_DATA and r.ino in self.sys:
                    pending.append((r.ino, r.offset, fmt.sbn(seg, blk)))
            if has_commit:
                if not applied:
                    self._apply_rolled(pending, seg)
                committed = len(rolled)
                self._last_stamp = max(self._last_stamp, summ.stamp)
            seg = summ.next_seg
        return rolled[:committed]

    def _apply_rolled(self, pending: list[tuple[int, int, int]], seg: int) -> None:
        for ino, off, addr in pending:
            inode = self.sys[ino]
            if off > 1 << 24:
                raise LfsError(f"{self.path}: summary of segment {seg}: offset {off}")
            self._set_ptr(inode, off, addr, account=False)
            inode.size = max(inode.size, (off + 1) * self.bs)
            if inode.size > self.geo.image_size:
                raise LfsError(f"{self.path}: segment {seg}: system file too large")
        pending.clear()

    def _recount_live(self, rolled: list[int]) -> None:
        """After roll-forward: live blocks per segment from a walk of every reachable block."""
        live = [0] * self.geo.segments
        for ino in fmt.SYSTEM_FILES:
            for addr, _, _ in self._walk(self.sys[ino]):
                live[addr >> 32] += 1
        for ino in self._used_inos():
            inode = self._iget(ino)
            for addr, _, _ in self._walk(inode):
                live[addr >> 32] += 1
        self.live = live
        for seg in rolled:
            # the newest data creation time its blocks carry (the summary's own stamp is when
            # the segment was written, a little later)
            summ = fmt.read_summary(self.fd, self.geo, seg)
            newest = max((r.ctime for r in summ.recs if r is not None), default=0)
            self.mtime[seg] = max(self.mtime[seg], newest)

    # ------------------------------------------------------------------ segments
    def _stamp(self) -> int:
        self._last_stamp = max(now_ms(), self._last_stamp + 1)
        return self._last_stamp

    def _alloc_segment(self) -> int:
        if not self.clean:
            raise LfsNoSpace(f"{self.path}: no clean segment left (the file system is full)")
        # The first clean segment after the current one (the log is written in order, so
        # usually the very next), else the first one.
        clean = self.clean
        seg = next((s for s in range(self.cur_seg + 1, self.geo.segments) if s in clean), None)
        if seg is None:
            seg = min(clean)
        self._keep_clean()
        self.clean.discard(seg)
        self.mtime[seg] = 0  # a reused segment's data time starts over (seed 003 §2.3.2)
        return seg

    def _start_segment(self, seg: int) -> None:
        self.cur_seg = seg
        self.cur_pos = 0
        self.flushed_pos = 0
        self.seq = 0
        self.buf = bytearray(self.geo.segment_size)
        self.recs: list[BlockRec | None] = [None] * self.ndata
        self.crcs = [0] * self.ndata
        self._sum_crcs.pop(seg, None)
        self.next_seg = -1
        self._seg_flags = 0
        self._last_flush_commit = False

    def _resume_segment(self, seg: int) -> None:
        summ = fmt.read_summary(self.fd, self.geo, seg)
        self._start_segment(seg)
        used = [i for i, r in enumerate(summ.recs) if r is not None]
        self.cur_pos = self.flushed_pos = (max(used) + 1) if used else 0
        self.recs = list(summ.recs)
        self.crcs = list(summ.crcs)
        self.seq = max((r.seq for r in summ.recs if r is not None), default=-1) + 1
        self._seg_flags = summ.flags
        self.buf[: self.cur_pos * self.bs] = os.pread(
            self.fd, self.cur_pos * self.bs, self.geo.seg_offset(seg)
        )
        # reads of these blocks come from the buffer from now on: checked once, here
        for pos in used:
            block = memoryview(self.buf)[pos * self.bs : (pos + 1) * self.bs]
            self._verify_block(fmt.sbn(seg, pos), block, self.crcs[pos])

    def _put(self, data: bytes | bytearray | memoryview, rec: BlockRec) -> int:
        if self.cur_pos >= self.ndata or self.seq > fmt.SEQ_MAX:
            self._seal()
        pos = self.cur_pos
        off = pos * self.bs
        n = len(data)
        self.buf[off : off + n] = data
        if n < self.bs:
            self.buf[off + n : off + self.bs] = self._zero[: self.bs - n]
        rec.seq = self.seq
        self.seq += 1
        self.recs[pos] = rec
        self.cur_pos = pos + 1
        seg = self.cur_seg
        if rec.btype != BT_DIRCH:  # change records are dead once their unit is committed
            self.live[seg] += 1
        if rec.ctime > self.mtime[seg]:
            self.mtime[seg] = rec.ctime
        if self._cleaning:
            self.counters.clean_blocks_written += 1
        else:
            self.counters.new_blocks += 1
        return (seg << 32) | pos

    def _die(self, addr: int) -> None:
        if addr:
            self.live[addr >> 32] -= 1

    def _flush(self, commit: bool) -> None:
        """Write the buffered blocks and the summary of the current segment."""
        if self.cur_pos == self.flushed_pos and (not commit or self._last_flush_commit):
            return
        self._last_flush_commit = commit
        if self.next_seg < 0:
            self.next_seg = self._alloc_segment()
        base = self.geo.seg_offset(self.cur_seg)
        a, b = self.flushed_pos * self.bs, self.cur_pos * self.bs
        if commit:
            self._seg_flags = fmt.SEGFLAG_COMMIT | self.seq
        # Blocks since the last flush may have been changed in place (write buffering) up to
        # now: their checksums are taken as they are written.
        self._crc_range(self.flushed_pos, self.cur_pos)
        summ = fmt.pack_summary(
            self.geo, self.recs, self.next_seg, self._stamp(), self._seg_flags, self.crcs
        )
        end = self.ndata * self.bs
        if b == end and b > a:  # a full segment: its blocks and summary in one write
            os.pwritev(self.fd, [memoryview(self.buf)[a:b], summ], base + a)
        else:
            if b > a:
                os.pwrite(self.fd, memoryview(self.buf)[a:b], base + a)
            os.pwrite(self.fd, summ, base + end)
        if b > a:
            if self._cleaning:
                self.counters.clean_requests += 1
            else:
                self.counters.new_requests += 1
        self.flushed_pos = self.cur_pos

    def _seal(self) -> None:
        """The current segment is full: write it and move to the next one."""
        self._flush(commit=False)
        self._seg_cache[self.cur_seg] = bytes(self.buf)
        while len(self._seg_cache) > self.opts.cache_segments:
            self._seg_cache.popitem(last=False)
        if self._cleaning:
            self.counters.clean_segments += 1
        else:
            self.counters.new_segments += 1
        self._segs_since_cp += 1
        if self.next_seg < 0:  # never flushed: it has no successor yet
            self.next_seg = self._alloc_segment()
        self._start_segment(self.next_seg)

    def _crc_range(self, a: int, b: int) -> None:
        bs, buf, crcs = self.bs, self.buf, self.crcs
        for pos in range(a, b):
            crcs[pos] = fmt.block_crc(memoryview(buf)[pos * bs : (pos + 1) * bs])

    def _block_crcs(self, seg: int) -> list[int]:
        """The block checksums the summary of ``seg`` on disk keeps (a few summaries are kept
        in memory; a segment written again drops its own)."""
        plugged = self._plug_summ.get(seg)  # hole-plugging: its summary is rewritten last
        if plugged is not None:
            return plugged.crcs
        crcs = self._sum_crcs.get(seg)
        if crcs is None:
            crcs = fmt.read_summary(self.fd, self.geo, seg).crcs
            self._sum_crcs[seg] = crcs
            if len(self._sum_crcs) > 64:
                self._sum_crcs.popitem(last=False)
        return crcs

    def _verify_block(self, addr: int, data: bytes | bytearray | memoryview, crc: int) -> None:
        if fmt.block_crc(data) != crc:
            seg, blk = addr >> 32, addr & 0xFFFFFFFF
            raise fmt.LfsChecksumError(
                f"{self.path}: segment {seg} block {blk}: checksum mismatch (damaged block)"
            )

    def _read_block(self, addr: int) -> bytes:
        seg, blk = addr >> 32, addr & 0xFFFFFFFF
        if seg == self.cur_seg and blk < self.cur_pos and not self.closed:
            return bytes(self.buf[blk * self.bs : (blk + 1) * self.bs])
        cached = self._seg_cache.get(seg)
        if cached is not None:
            return cached[blk * self.bs : (blk + 1) * self.bs]
        data = os.pread(self.fd, self.bs, self.geo.addr_offset(addr))
        if len(data) < self.bs:
            raise LfsError(f"{self.path}: truncated image: block {addr:#x} cut off")
        crcs = self._block_crcs(seg)
        self._verify_block(addr, data, crcs[blk] if blk < len(crcs) else 0)
        return data

    # ------------------------------------------------------------------ commit / checkpoint
    def _commit(self) -> None:
        """End a unit: everything changed so far reaches the log, the last write flagged."""
        self._keep_for_commit()
        self._pending_since: float | None = None
        self._write_dirch()
        for dino in sorted(self._dirty_dirs):
            if self._bitmap_get(dino):
                self._write_dir(dino)
        self._dirty_dirs.clear()
        while self._dirty:
            batch = list(self._dirty.values())
            self._dirty.clear()
            for inode in batch:
                self._commit_tree(inode)
            for inode in batch:
                self._store_inode(inode)
                if inode.mode == 0:
                    self._icache.pop(inode.ino, None)
                    self._dirs.pop(inode.ino, None)
        for sino in fmt.SYSTEM_FILES:
            inode = self.sys[sino]
            data = self._sysdata[sino]
            inode.size = len(data)
            for blk in sorted(self._sys_dirty[sino]):
                piece = data[blk * self.bs : (blk + 1) * self.bs]
                addr = self._put(piece, BlockRec(BT_DATA, 0, sino, inode.version, blk, now_ms()))
                self._set_ptr(inode, blk, addr)
            self._sys_dirty[sino].clear()
            self._commit_tree(inode)
        self._flush(commit=True)
        if len(self._icache) > 8192:
            self._icache = {k: v for k, v in self._icache.items() if v.dirty}
            self._dirs = {k: v for k, v in self._dirs.items() if k in self._icache}

    def _checkpoint(self) -> None:
        self._commit()
        if self.cur_pos > 0:
            # Seed 003 §2.3.2: next_seg is the next segment to be written after this
            # checkpoint, so the partly written one is closed (roll-forward starts after it).
            self._seal()
        stamp = self._stamp()
        cp = lfs_pb2.Checkpoint(
            timestamp=stamp,
            next_seg=self.cur_seg,
            inode_inomap=_simp(self.sys[INO_INOMAP]),
            inode_inovec=_simp(self.sys[INO_INOVEC]),
            inode_inotbl=_simp(self.sys[INO_INOTBL]),
        )
        which = 1 - self.cp_which
        segusage = fmt.segusage_octets(self.live, self.mtime)
        fmt.write_checkpoint(self.fd, self.geo, which, cp, segusage)
        self.cp_which = which
        self.cp_stamp = stamp
        self.cp_next = self.cur_seg
        self._segs_since_cp = 0
        self._last_cp_time = time.monotonic()
        # Segments emptied since the last checkpoint become clean only now.
        self._keep_clean()
        for s in range(self.geo.first_log_segment, self.geo.segments):
            if self.live[s] == 0 and s != self.cur_seg and s != self.next_seg:
                self.clean.add(s)
        self.clean.discard(self.cur_seg)

    def _end_op(self) -> None:
        """An operation's changes are done (in memory): they wait there for the next commit
        (``_commit_due``), which an operation outside any group makes at once."""
        if self._pending_since is None:
            self._pending_since = time.monotonic()
        if self._txn is None:
            self._commit()
            self._after_op()

    def _pending_blocks(self) -> int:
        """A generous estimate of the metadata blocks the next commit writes."""
        sd = self._sys_dirty
        return (
            3 * (len(self._dirty) + len(self._dirty_dirs))
            + len(self._dirch) // 16
            + len(sd[INO_INOMAP])
            + len(sd[INO_INOVEC])
            + len(sd[INO_INOTBL])
        )

    def _commit_due(self) -> bool:
        """Whether the changes waiting in memory are committed now: always with a
        ``commit_interval`` of 0; else when they are older than it, when their metadata
        would take more than ``_MAX_PENDING`` blocks, or when clean segments run short (so
        that a commit never needs more room than there is: twice the estimate is kept)."""
        if self._pending_since is None:
            return False
        interval = self.opts.commit_interval
        if interval <= 0 or time.monotonic() - self._pending_since >= interval:
            return True
        est = self._pending_blocks()
        return est > _MAX_PENDING or len(self.clean) < self._lw + 3 + 2 * est // self.ndata

    def _after_op(self) -> None:
        """Checkpoint and clean when due: never inside an operation, so that an operation that
        fails can be undone (segments it emptied are not reused before it ends)."""
        # The operation is done: a checkpoint or cleaning that finds no room says so at the
        # next operation that needs it (a sync, a write), not as this one's failure.
        with contextlib.suppress(LfsNoSpace):
            if (
                self._segs_since_cp >= self.cp_interval
                or time.monotonic() - self._last_cp_time >= self.opts.checkpoint_seconds
            ):
                self._checkpoint()
            if not self._cleaning and len(self.clean) < self._low_water():
                self.clean_now()

    # ------------------------------------------------------------------ space
    def _ensure_space(self, nblocks: int) -> None:
        need = -(-nblocks // self.ndata) + 2
        if self._txn is not None:
            return  # made before the operation began (``atomic``); no cleaning inside it
        if self._cleaning or len(self.clean) >= need + self._low_water():
            return
        self.clean_now(want=need + self._low_water() - len(self.clean))
        if len(self.clean) < need + self._reserve():
            raise LfsNoSpace(
                f"{self.path}: no space left ({len(self.clean)} clean segments, "
                f"{need} needed and {self._reserve()} kept for deletes and cleaning)"
            )
