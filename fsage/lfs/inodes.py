"""The inode map and the inode table of seed 003 (§2.5.1 inode, §2.6 system files: inode bitmap
16, inode vector 17, inode table 18): in-memory inodes, their allocation, loading and storing.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import TYPE_CHECKING

from google.protobuf.message import DecodeError

from fsage.lfs import format as fmt
from fsage.lfs import lfs_pb2
from fsage.lfs.common import _NAMED_SYSTEM, LfsOpError, now_ms
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

if TYPE_CHECKING:
    from fsage.lfs.fs import LFS


class _Node:
    __slots__ = ("addr", "dirty", "ptrs")

    def __init__(self, ptrs: list[int], addr: int) -> None:
        self.ptrs = ptrs
        self.addr = addr
        self.dirty = False


class Inode:
    __slots__ = (
        "atime",
        "blocks",
        "body",
        "ctime",
        "dirty",
        "gid",
        "ino",
        "mode",
        "mtime",
        "nlink",
        "ptr",
        "size",
        "tree",
        "tree_dirty",
        "uid",
        "version",
    )

    def __init__(self, ino: int, mode: int = 0, version: int = 0) -> None:
        self.ino = ino
        self.mode = mode
        self.nlink = 0
        self.uid = 0
        self.gid = 0
        self.size = 0
        self.blocks = 0
        self.mtime = 0
        self.ctime = 0
        self.atime = 0
        self.ptr = [0] * N_BLKPTR
        self.body: bytes | None = None
        self.version = version
        self.tree: dict[tuple[int, int], _Node] = {}
        self.tree_dirty = False
        self.dirty = False


def _simp(inode: Inode) -> lfs_pb2.InodeSimp:
    return lfs_pb2.InodeSimp(size=inode.size, blkptr=list(inode.ptr), ver=inode.version)


def _clone_inode(inode: Inode) -> Inode:
    c = Inode(inode.ino, inode.mode, inode.version)
    for name in Inode.__slots__:
        setattr(c, name, getattr(inode, name))
    c.ptr = list(inode.ptr)
    c.tree = {}
    for key, node in inode.tree.items():
        n = _Node(list(node.ptrs), node.addr)
        n.dirty = node.dirty
        c.tree[key] = n
    return c


class _InodeMixin:
    """Inode map and inode table of :class:`fsage.lfs.fs.LFS`."""

    def _bitmap_get(self: LFS, ino: int) -> bool:  # type: ignore[misc]  # self is the LFS that mixes this in
        m = self._sysdata[INO_INOMAP]
        return ino // 8 < len(m) and bool(m[ino // 8] >> (ino % 8) & 1)

    def _bitmap_set(self: LFS, ino: int, on: bool) -> None:  # type: ignore[misc]  # self is the LFS that mixes this in
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

    def _used_inos(self: LFS) -> Iterator[int]:  # type: ignore[misc]  # self is the LFS that mixes this in
        m = self._sysdata[INO_INOMAP]
        for byte, v in enumerate(m):
            if v:
                for bit in range(8):
                    ino = byte * 8 + bit
                    if v >> bit & 1 and (ino >= fmt.FIRST_USER_INO or ino in _NAMED_SYSTEM):
                        yield ino

    def _iget(self: LFS, ino: int) -> Inode:  # type: ignore[misc]  # self is the LFS that mixes this in
        if self._txn is not None and ino not in self._txn.inodes:
            self._touch(ino)
        inode = self._icache.get(ino)
        if inode is not None:
            return inode
        if not self._bitmap_get(ino):
            raise LfsOpError(f"inode {ino} is not in use")
        tbl = self._sysdata[INO_INOTBL]
        off = ino * fmt.INODE_SLOT
        if off + 4 > len(tbl):
            raise LfsError(f"{self.path}: inode {ino} beyond the inode table")
        (n,) = fmt.U32.unpack_from(tbl, off)
        if n == 0 or n > fmt.INODE_SLOT - 4:
            raise LfsError(f"{self.path}: inode table slot {ino} is damaged (length {n})")
        ent = lfs_pb2.InodeTblEntry()
        try:
            ent.ParseFromString(bytes(tbl[off + 4 : off + 4 + n]))
        except DecodeError:
            raise LfsError(f"{self.path}: inode table slot {ino} does not decode") from None
        vec = self._sysdata[INO_INOVEC]
        voff = ino * fmt.INOVEC_SLOT
        version = fmt.U32.unpack_from(vec, voff)[0] if voff + 16 <= len(vec) else 0
        inode = Inode(ino, ent.mode, version)
        inode.nlink = ent.nlink
        inode.uid, inode.gid = ent.uid, ent.gid
        inode.size, inode.blocks = ent.size, ent.blocks
        inode.mtime, inode.ctime = ent.mtime, ent.ctime
        inode.atime = fmt.U64.unpack_from(vec, voff + 8)[0] if voff + 16 <= len(vec) else 0
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

    def _touch(self: LFS, ino: int) -> None:  # type: ignore[misc]  # self is the LFS that mixes this in
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

    def _mark(self: LFS, inode: Inode) -> None:  # type: ignore[misc]  # self is the LFS that mixes this in
        if inode.ino in self.sys:
            return
        inode.dirty = True
        self._dirty[inode.ino] = inode

    def _alloc_inode(self: LFS, mode: int) -> Inode:  # type: ignore[misc]  # self is the LFS that mixes this in
        ino = self._free_hint
        while self._bitmap_get(ino):
            ino += 1
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

    def _free_inode(self: LFS, inode: Inode) -> None:  # type: ignore[misc]  # self is the LFS that mixes this in
        self._free_from(inode, 0)
        self._commit_tree(inode)
        self._bitmap_set(inode.ino, False)
        self._free_hint = min(self._free_hint, inode.ino)
        inode.nlink = 0
        inode.mode = 0
        self._mark(inode)

    def _store_inode(self: LFS, inode: Inode) -> None:  # type: ignore[misc]  # self is the LFS that mixes this in
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
        vrec = struct.pack(">I4xQ", inode.version, inode.atime)
        if vec[voff : voff + 16] != vrec:
            self._jsys(INO_INOVEC, voff // self.bs)
            vec[voff : voff + 16] = vrec
            self._sys_dirty[INO_INOVEC].add(voff // self.bs)
        inode.dirty = False
