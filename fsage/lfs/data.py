"""File data of seed 003 (§2.5.2 indirect pointer block, §2.5.3 data block; the file module of
§3.4): a file's block map (direct and indirect pointers) and reading, writing and truncating its
content.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Iterator

from fsage.lfs import format as fmt
from fsage.lfs.common import LfsOpError, now_ms
from fsage.lfs.format import (
    BT_DATA,
    BT_INDIRECT,
    N_DIRECT,
    S_IFMT,
    S_IFREG,
    BlockRec,
)
from fsage.lfs.state import Inode, LfsState, _Node


class _DataMixin(LfsState):
    """File block maps and data of :class:`fsage.lfs.fs.LFS`."""

    def _path(self, off: int) -> tuple[int, list[tuple[int, int, int]]]:
        """Root slot and the (level, first offset, index) of each indirect node on the way."""
        P = self.P
        if off < N_DIRECT:
            return off, []
        o = off - N_DIRECT
        if o < P:
            return 12, [(0, N_DIRECT, o)]
        o -= P
        base2 = N_DIRECT + P
        if o < P * P:
            i = o // P
            return 13, [(1, base2, i), (0, base2 + i * P, o % P)]
        o -= P * P
        base3 = base2 + P * P
        if o < P * P * P:
            i = o // (P * P)
            j = (o // P) % P
            return 14, [
                (2, base3, i),
                (1, base3 + i * P * P, j),
                (0, base3 + i * P * P + j * P, o % P),
            ]
        raise LfsOpError(f"file offset {off} blocks is beyond the triply indirect pointer")

    def _load_node(self, inode: Inode, key: tuple[int, int], addr: int) -> _Node:
        node = inode.tree.get(key)
        if node is None:
            self._check_addr(addr, f"inode {inode.ino} indirect pointer")
            raw = self._read_block(addr)
            ptrs = list(struct.unpack(f">{self.P}Q", raw[: 8 * self.P]))
            node = _Node(ptrs, addr)
            inode.tree[key] = node
        return node

    def _get_ptr(self, inode: Inode, off: int) -> int:
        if off < N_DIRECT:
            return inode.ptr[off]
        slot, path = self._path(off)
        addr = inode.ptr[slot]
        for level, first, idx in path:
            node = inode.tree.get((level, first))
            if node is None:
                if addr == 0:
                    return 0
                node = self._load_node(inode, (level, first), addr)
            addr = node.ptrs[idx]
        return addr

    def _set_ptr(self, inode: Inode, off: int, new: int, account: bool = True) -> int:
        if off < N_DIRECT:
            old = inode.ptr[off]
            inode.ptr[off] = new
        else:
            slot, path = self._path(off)
            addr = inode.ptr[slot]
            node = None
            for level, first, idx in path:
                key = (level, first)
                node = inode.tree.get(key)
                if node is None:
                    node = self._load_node(inode, key, addr) if addr else _Node([0] * self.P, 0)
                    inode.tree[key] = node
                node.dirty = True
                addr = node.ptrs[idx]
            assert node is not None
            old = node.ptrs[path[-1][2]]
            node.ptrs[path[-1][2]] = new
            inode.tree_dirty = True
        if old and account:
            self._die(old)
        if old and not new:
            inode.blocks -= 1
        elif new and not old:
            inode.blocks += 1
        self._mark(inode)
        return old

    def _commit_tree(self, inode: Inode) -> None:
        """Write dirty indirect blocks, leaves first; parents and the inode get the addresses."""
        if not inode.tree_dirty:
            return
        # Level by level: writing a node dirties its parent, which must then be written in
        # this commit too (the cleaner moves a node alone; a parent left pointing at the old
        # place would see it reused once its segment is cleaned).
        for key in (
            k
            for level in range(3)
            for k in sorted(k for k, n in inode.tree.items() if n.dirty and k[0] == level)
        ):
            node = inode.tree[key]
            level, first = key
            self._die(node.addr)
            if any(node.ptrs):
                raw = struct.pack(f">{self.P}Q", *node.ptrs)
                node.addr = self._put(
                    raw, BlockRec(BT_INDIRECT, 0, inode.ino, inode.version, first, 0, level)
                )
                node.dirty = False
                new = node.addr
            else:
                del inode.tree[key]
                new = 0
            slot, path = self._path(first)
            pos = [(lv, f) for lv, f, _ in path].index(key)
            if pos == 0:
                inode.ptr[slot] = new
            else:
                plv, pfirst, _ = path[pos - 1]
                pidx = path[pos - 1][2]
                parent = inode.tree[(plv, pfirst)]
                parent.ptrs[pidx] = new
                parent.dirty = True
        inode.tree_dirty = False

    def _walk(self, inode: Inode) -> Iterator[tuple[int, int, int]]:
        """Every block of a file: (address, kind, offset); kind -1 is data, 0-2 an indirect
        block of that level (offset = the file offset of its first block pointer)."""
        if inode.body is not None:
            return
        for i in range(N_DIRECT):
            if inode.ptr[i]:
                yield inode.ptr[i], -1, i
        P = self.P
        roots = ((12, 0, N_DIRECT), (13, 1, N_DIRECT + P), (14, 2, N_DIRECT + P + P * P))
        for slot, level, first in roots:
            if inode.ptr[slot] or (level, first) in inode.tree:
                yield from self._walk_node(inode, level, first, inode.ptr[slot])

    def _walk_node(
        self, inode: Inode, level: int, first: int, addr: int
    ) -> Iterator[tuple[int, int, int]]:
        """An indirect block and what is below it, as the block map stands in memory: nodes
        changed since the last commit (not yet written, or written at ``node.addr`` before
        the change) are walked from memory."""
        node = self._load_node(inode, (level, first), addr)
        if node.addr:
            yield node.addr, level, first
        span = self.P**level
        for i, a in enumerate(node.ptrs):
            if level == 0:
                if a:
                    self._check_addr(a, f"inode {inode.ino} block pointer")
                    yield a, -1, first + i
            elif a or (level - 1, first + i * span) in inode.tree:
                yield from self._walk_node(inode, level - 1, first + i * span, a)

    def _free_from(self, inode: Inode, first_block: int) -> None:
        """Drop every data block at file offset >= first_block."""
        for addr, kind, off in list(self._walk(inode)):
            if kind == -1 and off >= first_block:
                self._set_ptr(inode, off, 0)
                del addr

    # ------------------------------------------------------------------ file content
    def _read_whole(self, inode: Inode) -> bytearray:
        out = bytearray(inode.size)
        nblk = -(-inode.size // self.bs)
        for off in range(nblk):
            a = self._get_ptr(inode, off)
            if a:
                self._check_addr(a, f"system file {inode.ino}")
                try:
                    chunk = self._read_block(a)
                except fmt.LfsChecksumError as exc:
                    if not self.readonly:
                        raise
                    # read-only (fsck, a snapshot): the inodes this block holds are damaged,
                    # the others are read
                    self.damaged_sys[(inode.ino, off)] = str(exc)
                    chunk = bytes(self.bs)
                end = min(inode.size, (off + 1) * self.bs)
                out[off * self.bs : end] = chunk[: end - off * self.bs]
        return out

    def _write_data(self, inode: Inode, offset: int, data: bytes | bytearray | memoryview) -> None:
        bs = self.bs
        mv = memoryview(data)
        n = len(mv)
        pos = 0
        ct = now_ms()
        ino, ver = inode.ino, inode.version
        while pos < n:
            fo = offset + pos
            blk, within = divmod(fo, bs)
            take = min(bs - within, n - pos)
            old = self._get_ptr(inode, blk)
            if old >> 32 == self.cur_seg and self._overwrite_buffered(
                old, inode, blk, within, mv[pos : pos + take], ct
            ):
                pos += take
                continue
            if take == bs:
                piece: bytes | bytearray | memoryview = mv[pos : pos + bs]
            else:
                base = bytearray(self._read_block(old)) if old else bytearray(bs)
                if not old and blk * bs >= inode.size:
                    base = bytearray(bs)
                base[within : within + take] = mv[pos : pos + take]
                piece = base
            addr = self._put(piece, BlockRec(BT_DATA, 0, ino, ver, blk, ct))
            self._set_ptr(inode, blk, addr)
            pos += take
        if offset + n > inode.size:
            inode.size = offset + n
        self._mark(inode)

    def _buffered(self, addr: int, inode: Inode, blk: int) -> bool:
        """Whether ``addr``, block ``blk`` of ``inode``, may be changed in place in the segment
        buffer (``_overwrite_buffered``)."""
        pos = addr & 0xFFFFFFFF
        if (
            addr == 0
            or addr >> 32 != self.cur_seg
            or not (self.flushed_pos <= pos < self.cur_pos)
            or self._cleaning
        ):
            return False
        rec = self.recs[pos]
        return not (
            rec is None
            or rec.btype != BT_DATA
            or rec.ino != inode.ino
            or rec.offset != blk
            or rec.version != inode.version
        )

    def _overwrite_buffered(
        self,
        addr: int,
        inode: Inode,
        blk: int,
        within: int,
        piece: bytes | bytearray | memoryview,
        ctime: int,
    ) -> bool:
        """Write buffering: a data block of this file that is still in the segment buffer
        (put since the last flush, so no committed unit refers to it) is changed in place
        instead of taking a new block."""
        if not self._buffered(addr, inode, blk):
            return False
        self._overwrite_in_buffer(addr, within, piece, ctime)
        return True

    def _overwrite_in_buffer(
        self, addr: int, within: int, piece: bytes | bytearray | memoryview, ctime: int
    ) -> None:
        """``_overwrite_buffered`` of a block ``_buffered`` said may be changed in place."""
        pos = addr & 0xFFFFFFFF
        rec = self.recs[pos]
        assert rec is not None
        sp = self._txn
        start = pos * self.bs
        if sp is not None and sp.cur_seg == self.cur_seg and pos < sp.cur_pos:
            # The savepoint shares this record and this block: keep both as they were.
            if pos not in sp.buf_blocks:
                sp.buf_blocks[pos] = bytes(self.buf[start : start + self.bs])
            rec = dataclasses.replace(rec)
            self.recs[pos] = rec
        self.buf[start + within : start + within + len(piece)] = piece
        rec.ctime = ctime
        if ctime > self.mtime[self.cur_seg]:
            self.mtime[self.cur_seg] = ctime
        self.counters.buffered_overwrites += 1

    def _read_data(self, inode: Inode, offset: int, size: int) -> bytes:
        if inode.body is not None:
            return inode.body[offset : offset + size]
        end = min(inode.size, offset + size)
        if offset >= end:
            return b""
        bs = self.bs
        parts = []
        pos = offset
        traced: list[int] | None = None  # regular files' data only, not directories'
        if self.read_trace is not None and inode.mode & S_IFMT == S_IFREG:
            traced = []
        while pos < end:
            blk, within = divmod(pos, bs)
            take = min(bs - within, end - pos)
            a = self._get_ptr(inode, blk)
            if a:
                self._check_addr(a, f"inode {inode.ino} block pointer")
                parts.append(self._read_block(a)[within : within + take])
                if traced is not None:
                    traced.append(self.geo.addr_offset(a))
            else:
                parts.append(bytes(take))
            pos += take
        if traced and self.read_trace is not None:
            self.read_trace(traced)
        return b"".join(parts)

    def _truncate_inode(self, inode: Inode, size: int) -> None:
        bs = self.bs
        if size < inode.size:
            keep = -(-size // bs)
            self._free_from(inode, keep)
            if size % bs:
                last = self._get_ptr(inode, size // bs)
                if last:
                    data = bytearray(self._read_block(last))
                    data[size % bs :] = bytes(bs - size % bs)
                    addr = self._put(
                        data, BlockRec(BT_DATA, 0, inode.ino, inode.version, size // bs, now_ms())
                    )
                    self._set_ptr(inode, size // bs, addr)
        inode.size = size
        inode.mtime = inode.ctime = now_ms()
        self._mark(inode)
