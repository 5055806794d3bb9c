"""Atomic operations of the LFS (seed 003 §3.2: the log module's transaction support; §3.6:
directory changes are made inside one): a savepoint taken before an operation, and the
rollback that leaves the file system exactly as it was when the operation fails.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from fsage.lfs import format as fmt
from fsage.lfs.format import LfsNoSpace
from fsage.lfs.state import LfsState, Savepoint, _clone_inode


class _SavepointMixin(LfsState):
    """Savepoints and rollback of :class:`fsage.lfs.fs.LFS`."""

    @contextlib.contextmanager
    def atomic(self, nblocks: int = 0) -> Iterator[None]:
        """Run a group of operations as one: room for ``nblocks`` blocks is made first
        (cleaning if needed, ``LfsNoSpace`` if it cannot be made, with nothing changed);
        if anything inside fails, the file system is left exactly as it was before (the
        blocks written meanwhile are dead and the current segment's summary is rewritten
        without them). Checkpoints and cleaning wait until the group ends. Nested groups
        join the outermost one."""
        if self._txn is not None:
            if nblocks:
                self._ensure_space(nblocks)
            yield
            return
        if nblocks:
            self._ensure_space(nblocks)
        self._txn = self._savepoint()
        try:
            yield
            if self._commit_due():
                self._commit()
            if nblocks and len(self.clean) < self._reserve():
                raise LfsNoSpace(
                    f"{self.path}: no space left (the operation would take the "
                    f"{self._reserve()} clean segments kept for deletes and cleaning)"
                )
        except BaseException:
            sp, self._txn = self._txn, None
            if not self.closed:
                self._rollback(sp)
            raise
        self._txn = None
        self._after_op()

    def _savepoint(self) -> Savepoint:
        return Savepoint(
            live=list(self.live),
            mtime=list(self.mtime),
            free_hint=self._free_hint,
            cur_seg=self.cur_seg,
            cur_pos=self.cur_pos,
            flushed_pos=self.flushed_pos,
            seq=self.seq,
            buf=self.buf,  # blocks below cur_pos are never changed in a segment's buffer
            recs=list(self.recs),
            crcs=list(self.crcs),
            next_seg=self.next_seg,
            seg_flags=self._seg_flags,
            last_flush_commit=self._last_flush_commit,
            segs_since_cp=self._segs_since_cp,
            dirty_dirs=set(self._dirty_dirs),
            sys_len={ino: len(d) for ino, d in self._sysdata.items()},
            sys_dirty={k: set(v) for k, v in self._sys_dirty.items()},
            pending_since=self._pending_since,
            dirty_count=len(self._dirty),
            dirch_count=len(self._dirch),
        )

    def _keep_clean(self) -> None:
        """Before the clean set changes inside an operation."""
        sp = self._txn
        if sp is not None and sp.clean is None:
            sp.clean = set(self.clean)

    def _keep_sys(self) -> None:
        """Before a system file's block map changes inside an operation."""
        sp = self._txn
        if sp is not None and sp.sys is None:
            sp.sys = {ino: _clone_inode(i) for ino, i in self.sys.items()}

    def _keep_for_commit(self) -> None:
        """Before a commit inside an operation: it empties the lists of pending changes and
        writes the system files."""
        sp = self._txn
        if sp is None:
            return
        self._keep_sys()
        if sp.dirty is None:
            sp.dirty = list(self._dirty)[: sp.dirty_count]
        if sp.dirch is None:
            sp.dirch = self._dirch[: sp.dirch_count]
        for ino in list(self._dirty):  # the commit changes their trees: keep them first
            self._touch(ino)

    def _jsys(self, sino: int, blk: int) -> None:
        """Before a system-file block changes inside an operation: keep its old content."""
        sp = self._txn
        if sp is not None and (sino, blk) not in sp.sys_blocks:
            data = self._sysdata[sino]
            sp.sys_blocks[(sino, blk)] = bytes(data[blk * self.bs : (blk + 1) * self.bs])

    def _rollback(self, sp: Savepoint) -> None:
        clean_before = self.clean if sp.clean is None else sp.clean
        for seg in [s for s in self._seg_cache if s in clean_before or s == sp.cur_seg]:
            del self._seg_cache[seg]
        # Pending changes from before the operation: the first ones of what is pending now.
        dirty = sp.dirty if sp.dirty is not None else list(self._dirty)[: sp.dirty_count]
        self._dirch = sp.dirch if sp.dirch is not None else self._dirch[: sp.dirch_count]
        self.live, self.mtime = sp.live, sp.mtime
        if sp.clean is not None:
            self.clean = sp.clean
        if sp.sys is not None:
            self.sys = sp.sys
        for sino, n in sp.sys_len.items():
            del self._sysdata[sino][n:]
        for (sino, blk), old in sp.sys_blocks.items():
            data = self._sysdata[sino]
            if blk * self.bs < len(data):
                data[blk * self.bs : blk * self.bs + len(old)] = old[: len(data) - blk * self.bs]
        self._sys_dirty = sp.sys_dirty
        for sino in fmt.SYSTEM_FILES:
            self.sys[sino].size = len(self._sysdata[sino])
        # Inodes and directories the operation touched are put back as they were (or read
        # again from the inode table); changes made before it still wait for their commit.
        for ino, (inode, d) in sp.inodes.items():
            if inode is None:
                self._icache.pop(ino, None)
            else:
                self._icache[ino] = inode
            if d is None:
                self._dirs.pop(ino, None)
            else:
                self._dirs[ino] = d
        self._dirty = {ino: self._icache[ino] for ino in dirty}
        self._dirty_dirs = sp.dirty_dirs
        self._pending_since = sp.pending_since
        self._free_hint = sp.free_hint
        self._plug_summ = {}
        self._holeplug = False
        self._cleaning = False
        self.cur_seg, self.cur_pos, self.flushed_pos = sp.cur_seg, sp.cur_pos, sp.flushed_pos
        self.seq, self.buf, self.recs, self.crcs = sp.seq, sp.buf, sp.recs, sp.crcs
        for pos, old in sp.buf_blocks.items():
            self.buf[pos * self.bs : (pos + 1) * self.bs] = old
        self.next_seg, self._seg_flags = sp.next_seg, sp.seg_flags
        self._segs_since_cp = sp.segs_since_cp
        # The summary on disk may describe blocks of the undone operation: write it again,
        # newer than any summary the operation wrote, so roll-forward stops here.
        if self.next_seg < 0 and self.clean:
            self.next_seg = self._alloc_segment()
        if self.next_seg < 0:
            # No successor and none to take: the operation wrote nothing of this segment
            # (a write allocates the successor first), so its summary on disk stands.
            self._last_flush_commit = sp.last_flush_commit
            return
        base = self.geo.seg_offset(self.cur_seg)
        a, b = self.flushed_pos * self.bs, self.cur_pos * self.bs
        if b > a:
            os.pwrite(self.fd, memoryview(self.buf)[a:b], base + a)
            self._crc_range(self.flushed_pos, self.cur_pos)
            self.flushed_pos = self.cur_pos
        summ = fmt.pack_summary(
            self.geo, self.recs, self.next_seg, self._stamp(), self._seg_flags, self.crcs
        )
        os.pwrite(self.fd, summ, base + self.ndata * self.bs)
        self._last_flush_commit = sp.last_flush_commit
