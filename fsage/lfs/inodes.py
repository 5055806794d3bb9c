"""The inode map and the inode table of seed 003 (§2.5.1 inode, §2.6 system files: inode bitmap
16, inode vector 17, inode table 18): in-memory inodes, their allocation, loading and storing.
"""

from __future__ import annotations

from collections.abc import Iterator

from fsage.lfs import format as fmt
from fsage.lfs import lfs_pb2
from fsage.lfs.common import _NAMED_SYSTEM, LfsOpError, now_ms, reserve_segments
from fsage.lfs.format import (
    INO_INOMAP,
    INO_INOTBL,
    INO_INOVEC,
    N_BLKPTR,
    S_IFDIR,
    S_IFLNK,
    S_IFMT,
    S_IFREG,
    LfsError,
)
from fsage.lfs.state import Inode, LfsState, _clone_inode


def _simp(inode: Inode) -> lfs_pb2.InodeSimp:
    return lfs_pb2.InodeSimp(size=inode.size, blkptr=list(inode.ptr), ver=inode.version)


class _InodeMixin(LfsState):
    """Inode map and inode table of :class:`fsage.lfs.fs.LFS`."""

    def _bitmap_get(self, ino: int) -> bool:
        m = self._sysdata[INO_INOMAP]
        return ino // 8 < len(m) and bool(m[ino // 8] >> (ino % 8) & 1)

    def _bitmap_set(self, ino: int, on: bool) -> None:
        m = self._sysdata[INO_INOMAP]
        byte = ino // 8
        if byte >= len(m):
            m.extend(bytes(self.bs))
            self.sys[INO_INOMAP].size = len(m)
        self._jsys(INO_INOMAP, byte // self.bs)
        if on:
            m[byte] |= 1 << (ino % 8)
        else:
            m[byte] &= ~(1 << (ino % 8)) & 0xFF
        self._sys_dirty[INO_INOMAP].add(byte // self.bs)

    def _used_inos(self) -> Iterator[int]:
        m = self._sysdata[INO_INOMAP]
        for byte, v in enumerate(m):
            if v:
                for bit in range(8):
                    ino = byte * 8 + bit
                    if v >> bit & 1 and (ino >= fmt.FIRST_USER_INO or ino in _NAMED_SYSTEM):
                        yield ino

    def _reserve(self) -> int:
        """Clean segments writes leave for deletes (:func:`~fsage.lfs.common.reserve_segments`)
        for the largest directory, one block larger (the next create may grow it)."""
        if self._dir_max < 0:
            self._dir_max = self._largest_dir_blocks()
        return reserve_segments(self._dir_max + 1, self.P, self.ndata)

    def _largest_dir_blocks(self) -> int:
        """Blocks of the largest directory, from the inode table (cached inodes as they are)."""
        most = 0
        tbl = self._sysdata[INO_INOTBL]
        ent = lfs_pb2.InodeTblEntry()
        for ino in self._used_inos():
            cached = self._icache.get(ino)
            if cached is not None:
                mode, size = cached.mode, cached.size
            else:
                off = ino * fmt.INODE_SLOT
                ent.Clear()
                if off + 4 > len(tbl) or fmt.parse_prefixed(
                    tbl, ent, fmt.INODE_SLOT - 4, offset=off, empty_ok=False
                ):
                    continue  # a damaged slot: what reads it says so
                mode, size = ent.mode, ent.size
            if mode & S_IFMT == S_IFDIR:
                most = max(most, -(-size // self.bs))
        return most

    def _iget(self, ino: int) -> Inode:
        if self._txn is not None and ino not in self._txn.inodes:
            self._touch(ino)
        inode = self._icache.get(ino)
        if inode is not None:
            return inode
        if not self._bitmap_get(ino):
            raise LfsOpError(f"inode {ino} is not in use")
        tbl = self._sysdata[INO_INOTBL]
        off = ino * fmt.INODE_SLOT
        if (INO_INOTBL, off // self.bs) in self.damaged_sys:
            raise LfsError(f"{self.path}: inode table slot {ino} is in a damaged block")
        if off + 4 > len(tbl):
            raise LfsError(f"{self.path}: inode {ino} beyond the inode table")
        ent = lfs_pb2.InodeTblEntry()
        why = fmt.parse_prefixed(tbl, ent, fmt.INODE_SLOT - 4, offset=off, empty_ok=False)
        if why is not None:
            raise LfsError(f"{self.path}: inode table slot {ino} is damaged ({why})")
        vec = self._sysdata[INO_INOVEC]
        voff = ino * fmt.INOVEC_SLOT
        version = fmt.U32.unpack_from(vec, voff)[0] if voff + 16 <= len(vec) else 0
        inode = Inode(ino, ent.mode, version)
        inode.nlink = ent.nlink
        inode.uid, inode.gid = ent.uid, ent.gid
        inode.size, inode.blocks = ent.size, ent.blocks
        inode.mtime, inode.ctime = ent.mtime, ent.ctime
        if voff + 16 <= len(vec):
            _, inode.dircrc, inode.atime = fmt.INOVEC.unpack_from(vec, voff)
        if ent.HasField("body"):
            inode.body = bytes(ent.body)
        else:
            if len(ent.blkptr) != N_BLKPTR:
                raise LfsError(f"{self.path}: inode {ino} has {len(ent.blkptr)} block pointers")
            inode.ptr = list(ent.blkptr)
            for a in inode.ptr:
                self._check_addr(a, f"inode {ino}")
        if inode.mode & S_IFMT not in (S_IFDIR, S_IFREG, S_IFLNK):
            raise LfsError(f"{self.path}: inode {ino} has unsupported mode {inode.mode:o}")
        self._icache[ino] = inode
        return inode

    def _touch(self, ino: int) -> None:
        """Inside an operation, before inode ``ino`` (or its directory table) first changes:
        keep what rollback needs to put it back."""
        sp = self._txn
        if sp is None or ino in sp.inodes:
            return
        inode = self._icache.get(ino)
        if inode is None or not (inode.dirty or ino in self._dirty_dirs):
            sp.inodes[ino] = (None, None)  # the inode table and the directory file have it
            return
        d = self._dirs.get(ino)
        sp.inodes[ino] = (_clone_inode(inode), None if d is None else dict(d))

    def _mark(self, inode: Inode) -> None:
        if inode.ino in self.sys:
            return
        inode.dirty = True
        self._dirty[inode.ino] = inode

    def _alloc_inode(self, mode: int) -> Inode:
        ino = self._free_hint
        m = self._sysdata[INO_INOMAP]
        while self._bitmap_get(ino):
            # Whole bytes of inodes in use are stepped over at once.
            ino = (ino // 8 + 1) * 8 if m[ino // 8] == 0xFF else ino + 1
        self._free_hint = ino + 1
        self._touch(ino)
        vec = self._sysdata[INO_INOVEC]
        voff = ino * fmt.INOVEC_SLOT
        version = (fmt.U32.unpack_from(vec, voff)[0] if voff + 16 <= len(vec) else 0) + 1
        self._bitmap_set(ino, True)
        inode = Inode(ino, mode, version & 0xFFFFFFFF)
        t = now_ms()
        inode.mtime = inode.ctime = inode.atime = t
        self._icache[ino] = inode
        self._mark(inode)
        return inode

    def _free_inode(self, inode: Inode) -> None:
        self._free_from(inode, 0)
        self._commit_tree(inode)
        self._bitmap_set(inode.ino, False)
        self._free_hint = min(self._free_hint, inode.ino)
        inode.nlink = 0
        inode.mode = 0
        self._mark(inode)

    def _store_inode(self, inode: Inode) -> None:
        ino = inode.ino
        tbl = self._sysdata[INO_INOTBL]
        vec = self._sysdata[INO_INOVEC]
        off = ino * fmt.INODE_SLOT
        voff = ino * fmt.INOVEC_SLOT
        while len(tbl) < off + fmt.INODE_SLOT:
            tbl.extend(bytes(self.bs))
        while len(vec) < voff + fmt.INOVEC_SLOT:
            vec.extend(bytes(self.bs))
        self.sys[INO_INOTBL].size = len(tbl)
        self.sys[INO_INOVEC].size = len(vec)
        if inode.mode == 0:
            slot = bytes(fmt.INODE_SLOT)
        else:
            ent = lfs_pb2.InodeTblEntry(
                mode=inode.mode,
                nlink=inode.nlink,
                uid=inode.uid,
                gid=inode.gid,
                size=inode.size,
                blocks=inode.blocks,
                mtime=inode.mtime,
                ctime=inode.ctime,
                blkptr=list(inode.ptr),
            )
            if inode.body is not None:
                ent.body = inode.body
            slot = fmt.encode_pb(ent).ljust(fmt.INODE_SLOT, b"\0")
        if tbl[off : off + fmt.INODE_SLOT] != slot:
            self._jsys(INO_INOTBL, off // self.bs)
            tbl[off : off + fmt.INODE_SLOT] = slot
            self._sys_dirty[INO_INOTBL].add(off // self.bs)
        crc = inode.dircrc if inode.mode & S_IFMT == S_IFDIR else 0
        vrec = fmt.INOVEC.pack(inode.version, crc, inode.atime)
        if vec[voff : voff + 16] != vrec:
            self._jsys(INO_INOVEC, voff // self.bs)
            vec[voff : voff + 16] = vrec
            self._sys_dirty[INO_INOVEC].add(voff // self.bs)
        inode.dirty = False
