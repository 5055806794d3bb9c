"""The cleaning procedure of seed 003 (§3.3: the cleaner module's Cleaner class): a pass
chooses segments (by the policies of :mod:`fsage.lfs.cleaner`), moves their live blocks to the
end of the log, or into the dead blocks of well-used segments (hole-plugging), as one
operation, and a checkpoint makes the emptied segments clean.
"""

from __future__ import annotations

import os

from fsage.lfs import cleaner as cl
from fsage.lfs import format as fmt
from fsage.lfs.common import LfsOpError, now_ms
from fsage.lfs.format import BT_DATA, BT_INDIRECT, INO_INOVEC, BlockRec, LfsNoSpace
from fsage.lfs.state import Inode, LfsState


class _CleaningMixin(LfsState):
    """Garbage collection of :class:`fsage.lfs.fs.LFS`."""

    def _low_water(self) -> int:
        # Cleaning starts before deletes have to dip into the segments kept for them.
        return max(self._lw, self._reserve() + 2)

    def _log_head(self) -> tuple[int, int]:
        """The segment being written and its successor: never clean."""
        return self.cur_seg, self.next_seg

    def clean_now(self, want: int | None = None) -> int:
        """Run garbage collection until ``want`` more segments are clean (default: twice the
        low-water mark). Returns the number of segments freed."""
        if self._txn is not None or self._cleaning:
            return 0  # never inside an operation (see ``atomic``)
        target = len(self.clean) + (want or 2 * self._low_water())
        start = best = len(self.clean)
        stalls = 0
        # Stop after three passes that bring the clean count to no new high: passes that
        # free one segment and fill another would otherwise go on for ever.
        while len(self.clean) < target and stalls < 3:
            got = self._gc_pass(target - len(self.clean))
            if got < 0:
                break  # the pass cost more than it freed: do not eat into the reserve
            if len(self.clean) > best:
                best, stalls = len(self.clean), 0
            else:
                stalls += 1
        return len(self.clean) - start

    def _gc_pass(self, want: int) -> int:
        first = self.geo.first_log_segment
        if any(
            self.live[s] == 0 and s not in self.clean and s not in (self.cur_seg, self.next_seg)
            for s in range(first, self.geo.segments)
        ):
            self._checkpoint()  # segments that emptied on their own become clean first
        else:
            self._commit()
        before = len(self.clean)
        cands = [
            s
            for s in range(self.geo.first_log_segment, self.geo.segments)
            if s not in self.clean and s != self.cur_seg and s != self.next_seg and self.live[s] > 0
        ]
        # Room for the live blocks moved: what is left of the current segment and of the next
        # one (already taken from the clean set) and all clean segments but one (the segment
        # after those needs it). The pass also commits metadata for what it moved (indirect
        # and inode-table blocks, up to one per block moved for small files): the live blocks
        # moved get half of the room.
        room_blocks = (
            (self.ndata - self.cur_pos)
            + (self.ndata if self.next_seg >= 0 else 0)
            + max(0, len(self.clean) - 1) * self.ndata
            - 8
        ) // 2
        if not cands or room_blocks < 1:
            return 0
        room = room_blocks / self.ndata
        policy = self.policy
        if policy != "greedy" and len(self.clean) <= self._reserve() + 1:
            # Near the reserve the emptiest segments first, copied whole (whatever their age,
            # and holes in the others are no room): the pass must free segments with the
            # little room there is, as deletes depend on it.
            policy = "greedy"
        p = cl.plan(
            policy,
            cands,
            self.live,
            self.mtime,
            now_ms(),
            capacity=self.ndata,
            blocks_per_segment=self.geo.blocks_per_segment,
            block_size=self.bs,
            want_segments=max(1, want),
            room_segments=room,
            disk=self.opts.disk,
            cached=frozenset(self._seg_cache),
        )
        if p is None or not p.sources:
            return 0
        self._cleaning = True
        try:
            # One operation: a pass that runs out of room is undone (the blocks it moved
            # stay where they were) and frees nothing.
            with self.atomic():
                self._cleaning = True
                if p.mechanism == "clean":
                    self.counters.cleaning_passes += 1
                    for s in p.sources:
                        self._relocate_segment(s, None)
                else:
                    self.counters.holeplug_passes += 1
                    holes = self._find_holes(p.targets)
                    self._holeplug = True
                    try:
                        for s in p.sources:
                            self._relocate_segment(s, holes)
                    finally:
                        self._holeplug = False
                    self._write_plugged()
                # What the pass moved reaches the log inside it (the checkpoint below then
                # needs no clean segment), and near the reserve the pass must not lose: the
                # segments it empties, clean at that checkpoint, are at least as many as
                # those it took. Else it is undone, and the clean segments kept for deletes
                # stay. (Its blocks count as the commit's, not the cleaner's, as when the
                # checkpoint made it: the write-cost metrics stay as defined.)
                self._cleaning = False
                try:
                    self._commit()
                finally:
                    self._cleaning = True
                emptied = sum(
                    1 for s in p.sources if self.live[s] == 0 and s not in self._log_head()
                )
                if len(self.clean) + emptied < min(before, self._reserve() + 1):
                    raise LfsNoSpace(f"{self.path}: a cleaning pass that would take the reserve")
        except LfsNoSpace:
            return 0
        finally:
            self._cleaning = False
        self._checkpoint()
        freed = len(self.clean) - before
        self.counters.segments_freed += max(0, freed)
        return freed

    def _block_live(self, seg: int, blk: int, rec: BlockRec) -> tuple[Inode, int] | None:
        """If block (seg, blk) is live: the owning inode and the file offset / node key."""
        addr = fmt.sbn(seg, blk)
        if rec.btype not in (BT_DATA, BT_INDIRECT):
            return None
        if rec.ino in self.sys:
            inode = self.sys[rec.ino]
        else:
            if not self._bitmap_get(rec.ino):
                return None
            vec = self._sysdata[INO_INOVEC]
            voff = rec.ino * fmt.INOVEC_SLOT
            if voff + 16 > len(vec) or fmt.U32.unpack_from(vec, voff)[0] != rec.version:
                return None
            inode = self._iget(rec.ino)
        if rec.btype == BT_DATA:
            if rec.offset * self.bs >= max(inode.size, 1) and inode.ino not in self.sys:
                return None
            try:
                return (inode, rec.offset) if self._get_ptr(inode, rec.offset) == addr else None
            except LfsOpError:
                return None
        try:
            slot, path = self._path(rec.offset)
        except LfsOpError:
            return None
        key = (rec.level, rec.offset)
        keys = [(lv, f) for lv, f, _ in path]
        if key not in keys:
            return None
        pos = keys.index(key)
        if pos == 0:
            return (inode, -1) if inode.ptr[slot] == addr else None
        parent_addr = inode.ptr[slot]
        node = None
        for lv, f, idx in path[:pos]:
            node = inode.tree.get((lv, f))
            if node is None:
                if not parent_addr:
                    return None
                node = self._load_node(inode, (lv, f), parent_addr)
            parent_addr = node.ptrs[idx]
        return (inode, -1) if parent_addr == addr else None

    def _segment_bytes(self, seg: int) -> bytes:
        cached = self._seg_cache.get(seg)
        if cached is not None:
            self.counters.clean_segs_cached += 1
            return cached
        if self._holeplug:
            self.counters.holeplug_segs_read += 1
        else:
            self.counters.clean_segs_read += 1
        return os.pread(self.fd, self.geo.segment_size, self.geo.seg_offset(seg))

    def _relocate_segment(self, seg: int, holes: list[int] | None) -> None:
        self._keep_sys()  # live blocks of system files move too
        summ = fmt.read_summary(self.fd, self.geo, seg)
        raw = self._segment_bytes(seg)
        for blk, rec in enumerate(summ.recs):
            if rec is None:
                continue
            owner = self._block_live(seg, blk, rec)
            if owner is None:
                continue
            inode, off = owner
            data = raw[blk * self.bs : (blk + 1) * self.bs]
            # a damaged block is not moved under a fresh checksum: the cleaning fails instead
            self._verify_block(fmt.sbn(seg, blk), data, summ.crcs[blk])
            if rec.btype == BT_INDIRECT:
                node = self._load_node(inode, (rec.level, rec.offset), fmt.sbn(seg, blk))
                node.dirty = True
                inode.tree_dirty = True
                if inode.ino in self.sys:
                    continue
                self._mark(inode)
                continue
            if holes is not None and holes:
                addr = holes.pop()
                self._plug(addr, data, rec)
            else:
                addr = self._put(data, BlockRec(BT_DATA, 0, rec.ino, rec.version, off, rec.ctime))
            self._set_ptr(inode, off, addr)
            if inode.ino in self.sys:
                continue

    # hole-plugging: blocks go into dead slots of well-used segments, one write each
    def _find_holes(self, targets: list[int]) -> list[int]:
        holes: list[int] = []
        self._plug_summ = {}
        for seg in targets:
            summ = fmt.read_summary(self.fd, self.geo, seg)
            self._plug_summ[seg] = summ
            for blk in range(self.ndata):
                rec = summ.recs[blk]
                if rec is None or self._block_live(seg, blk, rec) is None:
                    holes.append(fmt.sbn(seg, blk))
        holes.reverse()
        return holes

    def _plug(self, addr: int, data: bytes, rec: BlockRec) -> None:
        seg, blk = fmt.sbn_split(addr)
        os.pwrite(self.fd, data, self.geo.addr_offset(addr))
        summ = self._plug_summ[seg]
        seq = max((r.seq for r in summ.recs if r is not None), default=-1) + 1
        summ.recs[blk] = BlockRec(
            BT_DATA, min(seq, fmt.SEQ_MAX), rec.ino, rec.version, rec.offset, rec.ctime
        )
        summ.crcs[blk] = fmt.block_crc(data)
        self._sum_crcs.pop(seg, None)
        self.live[seg] += 1
        self.mtime[seg] = max(self.mtime[seg], rec.ctime)
        self.counters.holeplug_blocks += 1
        self._seg_cache.pop(seg, None)

    def _write_plugged(self) -> None:
        for seg, summ in self._plug_summ.items():
            # The plugged blocks replaced dead ones, the newest among them perhaps: the
            # segment's data time is that of the blocks its summary now describes.
            self.mtime[seg] = max((r.ctime for r in summ.recs if r is not None), default=0)
            raw = fmt.pack_summary(
                self.geo, summ.recs, summ.next_seg, summ.stamp, summ.flags, summ.crcs
            )
            self._sum_crcs.pop(seg, None)
            os.pwrite(self.fd, raw, self.geo.seg_offset(seg) + self.ndata * self.bs)
        self._plug_summ = {}
