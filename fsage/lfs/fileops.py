"""The file operations of :class:`fsage.lfs.fs.LFS`: create, write, read, truncate, unlink,
mkdir, rmdir, rename, symlink, link, stat, readdir and the attribute changes of the FUSE layer,
each one operation that is committed whole or not at all.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from fsage.lfs import format as fmt
from fsage.lfs.common import LfsOpError, now_ms
from fsage.lfs.dirs import _dir_file_size
from fsage.lfs.format import (
    BT_DATA,
    N_DIRECT,
    S_IFDIR,
    S_IFLNK,
    S_IFMT,
    S_IFREG,
    BlockRec,
)
from fsage.lfs.state import Inode, LfsState


@dataclass
class Stat:
    ino: int
    mode: int
    nlink: int
    uid: int
    gid: int
    size: int
    blocks: int
    mtime_ms: int
    ctime_ms: int
    atime_ms: int
    version: int


def _plain(name: str) -> bool:
    """A name that linking can take without failing part way: valid UTF-8 (the directory
    change record's protocol buffer needs it) of at most 255 octets."""
    try:
        return len(name.encode("utf-8")) <= 255
    except UnicodeEncodeError:
        return False


class _FileOpsMixin(LfsState):
    """File and directory operations of :class:`fsage.lfs.fs.LFS`."""

    # ------------------------------------------------------------------ public API
    # Each operation on a name has a form that takes the directory's inode and the name
    # (``*_at``, what the FUSE layer calls) and one that takes a path.
    def create(self, path: str, mode: int = 0o644) -> int:
        return self.create_at(*self._parent(path), mode)

    def create_at(self, dino: int, name: str, mode: int = 0o644) -> int:
        if name in self._dir(dino):
            raise LfsOpError(f"file exists: {name!r}")
        if _plain(name) and self._in_memory_ok():
            # Nothing below can fail once the directory's inode is at hand: no savepoint.
            self._iget(dino)
            ino = self._create(dino, name, mode)
            self._changed_in_memory()
            return ino
        with self.atomic(1):
            ino = self._create(dino, name, mode)
            self._end_op()
        return ino

    def _create(self, dino: int, name: str, mode: int) -> int:
        inode = self._alloc_inode(S_IFREG | (mode & 0o7777))
        inode.nlink = 1
        self._link(dino, name, inode.ino)
        return inode.ino

    def _regular(self, ino: int, what: str) -> Inode:
        inode = self._iget(ino)
        if inode.mode & S_IFMT != S_IFREG:
            raise LfsOpError(f"not a regular file: {what!r}")
        return inode

    def _in_memory_ok(self) -> bool:
        """Whether an operation whose changes stay in memory may skip its savepoint: it is
        not inside a group, no commit is due and the clean segments are not running short
        (so what it changes waits for a later commit, as everything buffered does). A commit
        that is due is made first, as ``sync`` would, before the operation changes anything:
        made inside the operation's savepoint instead, it would have to keep every inode
        waiting for it."""
        if (
            self._txn is not None
            or self.opts.commit_interval <= 0
            or len(self.clean) < 3 + self._lw
        ):
            return False
        if not self._commit_due():
            return True
        self._commit()
        return len(self.clean) >= 3 + self._lw and not self._commit_due()

    def write(self, path: str, offset: int, data: bytes | bytearray | memoryview) -> int:
        return self._write(self._regular(self._lookup(path), path), offset, data)

    def write_ino(self, ino: int, offset: int, data: bytes | bytearray | memoryview) -> int:
        """``write`` to inode ``ino``."""
        return self._write(self._regular(ino, f"inode {ino}"), offset, data)

    def _write(self, inode: Inode, offset: int, data: bytes | bytearray | memoryview) -> int:
        mv = memoryview(data)
        n = mv.nbytes
        # _in_memory_ok first: the commit it may make moves the segment buffer on.
        if n and self._in_memory_ok():
            more = (offset + n - 1) // self.bs - offset // self.bs  # blocks past the first
            if self.cur_pos + more < self.ndata and self.seq + more <= fmt.SEQ_MAX:
                if self._icache.get(inode.ino) is not inode:  # that commit dropped it
                    inode = self._iget(inode.ino)
                self._write_buffered(inode, offset, mv)
                return n
        nblk = -(-len(mv) // self.bs) + 1
        with self.atomic(nblk + nblk // 64 + 2):
            inode = self._iget(inode.ino)
            self._write_data(inode, offset, mv)  # one unit, however long
            inode.mtime = inode.ctime = now_ms()
            self._end_op()
        return len(mv)

    def _write_buffered(self, inode: Inode, offset: int, mv: memoryview) -> None:
        """A write whose new blocks all fit in the segment buffer, when no commit is due:
        everything that can fail (reading the block map and the old blocks it changes in
        part) comes before the first change, and the rest is in memory, so no savepoint is
        needed (the kernel's writeback cache sends a small file's pages as one such write)."""
        bs = self.bs
        end = offset + mv.nbytes
        first, last = offset // bs, (end - 1) // bs
        ct = time.time_ns() // 1_000_000
        # Per block: (block, offset in it, the piece of mv, its old address, whether that is
        # in the segment buffer and may be changed there, the old content if it is rewritten
        # in part and is not). Puts of earlier blocks leave what was in the buffer there.
        plan: list[tuple[int, int, memoryview, int, bool, bytes | None]] = []
        for blk in range(first, last + 1):
            lo = offset if blk == first else blk * bs
            hi = end if blk == last else (blk + 1) * bs
            # (past the direct blocks, _get_ptr reads and keeps the indirect blocks on the way)
            old = inode.ptr[blk] if blk < N_DIRECT else self._get_ptr(inode, blk)
            in_buffer = old != 0 and self._buffered(old, inode, blk)
            base = None
            if hi - lo < bs and old and not in_buffer:
                self._check_addr(old, f"inode {inode.ino} block pointer")
                base = self._read_block(old)
            if first == last:  # one block (most small writes): no plan to go through
                if in_buffer:
                    self._overwrite_in_buffer(old, lo - blk * bs, mv, ct)
                else:
                    self._write_block(inode, blk, lo - blk * bs, mv, old, in_buffer, base, ct)
                break
            plan.append((blk, lo - blk * bs, mv[lo - offset : hi - offset], old, in_buffer, base))
        for step in plan:
            self._write_block(inode, *step, ct)
        if end > inode.size:
            inode.size = end
        inode.mtime = inode.ctime = ct
        self._mark(inode)
        self._changed_in_memory()

    def _write_block(
        self,
        inode: Inode,
        blk: int,
        within: int,
        piece: memoryview,
        old: int,
        in_buffer: bool,
        base: bytes | None,
        ct: int,
    ) -> None:
        """One block of ``_write_buffered``: changed in the segment buffer, or put anew."""
        if in_buffer:
            self._overwrite_in_buffer(old, within, piece, ct)
            return
        if piece.nbytes == self.bs:
            data: bytes | bytearray | memoryview = piece
        else:
            block = bytearray(base) if base is not None else bytearray(self.bs)
            block[within : within + piece.nbytes] = piece
            data = block
        addr = self._put(data, BlockRec(BT_DATA, 0, inode.ino, inode.version, blk, ct))
        self._set_ptr(inode, blk, addr)

    def _changed_in_memory(self) -> None:
        """The end of an operation that took no savepoint (``_in_memory_ok``)."""
        if self._pending_since is None:
            self._pending_since = time.monotonic()
        self._after_op()

    def writev(
        self, path: str, pieces: Sequence[tuple[int, bytes | bytearray | memoryview]]
    ) -> int:
        """Several writes ``(offset, data)`` to one file as one unit: they reach the log
        together, with one commit, as writes followed by a sync would. Pieces are limited to
        what one cleaning step can make room for (32 segments); returns the octets written."""
        inode = self._iget(self._lookup(path))
        if inode.mode & S_IFMT != S_IFREG:
            raise LfsOpError(f"not a regular file: {path!r}")
        nblocks = sum(-(-len(d) // self.bs) + 1 for _, d in pieces)
        if nblocks > 32 * self.ndata:
            raise LfsOpError(f"writev of {nblocks} blocks: at most {32 * self.ndata}")
        with self.atomic(nblocks + 2):
            inode = self._iget(inode.ino)
            for off, d in pieces:
                self._write_data(inode, off, d)
            inode.mtime = inode.ctime = now_ms()
            self._end_op()
        return sum(len(d) for _, d in pieces)

    def append(self, path: str, data: bytes | bytearray | memoryview) -> int:
        return self.write(path, self.stat(path).size, data)

    def read(self, path: str, offset: int = 0, size: int = -1) -> bytes:
        return self._read(self._lookup(path), offset, size, path)

    def read_ino(self, ino: int, offset: int = 0, size: int = -1) -> bytes:
        """``read`` of inode ``ino``."""
        return self._read(ino, offset, size, f"inode {ino}")

    def _read(self, ino: int, offset: int, size: int, what: str) -> bytes:
        inode = self._iget(ino)
        if inode.mode & S_IFMT == S_IFDIR:
            raise LfsOpError(f"is a directory: {what!r}")
        if size < 0:
            size = inode.size
        return self._read_data(inode, offset, size)

    def truncate(self, path: str, size: int) -> None:
        self._truncate(self._regular(self._lookup(path), path), size)

    def truncate_ino(self, ino: int, size: int) -> None:
        """``truncate`` of inode ``ino``."""
        self._truncate(self._regular(ino, f"inode {ino}"), size)

    def _truncate(self, inode: Inode, size: int) -> None:
        # Shrinking frees blocks: like a delete it may use the clean segments kept back.
        with self.atomic(4 if size > inode.size else 0):
            inode = self._iget(inode.ino)
            if size > inode.size:
                inode.size = size  # a hole; reads give zeros
                inode.mtime = inode.ctime = now_ms()
                self._mark(inode)
            else:
                self._truncate_inode(inode, size)
            self._end_op()

    def unlink(self, path: str) -> None:
        self.unlink_at(*self._parent(path))

    def unlink_at(self, dino: int, name: str) -> None:
        if name not in self._dir(dino):
            raise LfsOpError(f"no such file: {name!r}")
        inode = self._iget(self._dirs[dino][name])
        if inode.mode & S_IFMT == S_IFDIR:
            raise LfsOpError(f"is a directory: {name!r}")
        if (
            inode.body is not None or not (any(inode.ptr[N_DIRECT:]) or inode.tree)
        ) and self._in_memory_ok():
            # No indirect blocks to read or write: nothing below can fail once the
            # directory's inode is at hand, so no savepoint.
            self._iget(dino)
            self._unlink(dino, name, inode.ino)
            self._changed_in_memory()
            return
        with self.atomic():
            self._unlink(dino, name, inode.ino)
            self._end_op()

    def _unlink(self, dino: int, name: str, ino: int) -> None:
        self._unlink_name(dino, name)
        inode = self._iget(ino)
        inode.nlink -= 1
        inode.ctime = now_ms()
        if inode.nlink <= 0:
            self._free_inode(inode)
        else:
            self._mark(inode)

    def mkdir(self, path: str, mode: int = 0o755) -> int:
        return self.mkdir_at(*self._parent(path), mode)

    def mkdir_at(self, dino: int, name: str, mode: int = 0o755) -> int:
        if name in self._dir(dino):
            raise LfsOpError(f"file exists: {name!r}")
        with self.atomic(1):
            inode = self._alloc_inode(S_IFDIR | (mode & 0o7777))
            inode.nlink = 2
            self._dirs[inode.ino] = {}
            self._dirty_dirs.add(inode.ino)
            self._link(dino, name, inode.ino)
            parent = self._iget(dino)
            parent.nlink += 1
            self._end_op()
        return inode.ino

    def rmdir(self, path: str) -> None:
        self.rmdir_at(*self._parent(path))

    def rmdir_at(self, dino: int, name: str) -> None:
        if name not in self._dir(dino):
            raise LfsOpError(f"no such directory: {name!r}")
        inode = self._iget(self._dirs[dino][name])
        if inode.mode & S_IFMT != S_IFDIR:
            raise LfsOpError(f"not a directory: {name!r}")
        if self._dir(inode.ino):
            raise LfsOpError(f"directory not empty: {name!r}")
        with self.atomic():
            self._unlink_name(dino, name)
            parent = self._iget(dino)
            parent.nlink -= 1
            self._dirty_dirs.discard(inode.ino)
            self._free_inode(self._iget(inode.ino))
            self._end_op()

    def rename(self, src: str, dst: str) -> None:
        sd, sname = self._parent(src)
        if sname not in self._dirs[sd]:
            raise LfsOpError(f"no such file or directory: {src!r}")
        dd, dname = self._parent(dst)
        ino = self._dirs[sd][sname]
        inode = self._iget(ino)
        is_dir = inode.mode & S_IFMT == S_IFDIR
        if is_dir:
            # Refuse moving a directory below itself.
            sp, dp = self._parts(src), self._parts(dst)
            if dp[: len(sp)] == sp:
                raise LfsOpError(f"cannot move {src!r} inside itself")
        if (sd, sname) == (dd, dname):
            return
        with self.atomic(1):
            self._rename(sd, sname, dd, dname, ino, is_dir, dst)
            self._end_op()

    def _rename(
        self, sd: int, sname: str, dd: int, dname: str, ino: int, is_dir: bool, dst: str
    ) -> None:
        if dname in self._dir(dd):
            victim = self._iget(self._dir(dd)[dname])
            if victim.mode & S_IFMT == S_IFDIR:
                if not is_dir or self._dir(victim.ino):
                    raise LfsOpError(f"cannot replace directory {dst!r}")
                self._unlink_name(dd, dname)
                self._iget(dd).nlink -= 1
                self._dirty_dirs.discard(victim.ino)
                self._free_inode(victim)
            else:
                if is_dir:
                    raise LfsOpError(f"cannot replace file {dst!r} with a directory")
                self._unlink_name(dd, dname)
                victim.nlink -= 1
                if victim.nlink <= 0:
                    self._free_inode(victim)
                else:
                    self._mark(victim)
        self._unlink_name(sd, sname)
        self._link(dd, dname, ino)
        if is_dir and sd != dd:
            self._iget(sd).nlink -= 1
            self._iget(dd).nlink += 1
            self._mark(self._iget(sd))
            self._mark(self._iget(dd))
        inode = self._iget(ino)
        inode.ctime = now_ms()
        self._mark(inode)

    def symlink(self, target: str, path: str) -> int:
        dino, name = self._parent(path)
        if name in self._dirs[dino]:
            raise LfsOpError(f"file exists: {path!r}")
        raw = target.encode("utf-8", "surrogateescape")
        with self.atomic(len(raw) // self.bs + 1):
            inode = self._alloc_inode(S_IFLNK | 0o777)
            inode.nlink = 1
            if len(raw) <= fmt.BODY_MAX:
                inode.body = raw
                inode.size = len(raw)
            else:
                self._write_data(inode, 0, raw)
            self._link(dino, name, inode.ino)
            self._end_op()
        return inode.ino

    def readlink(self, path: str) -> str:
        inode = self._iget(self._lookup(path))
        if inode.mode & S_IFMT != S_IFLNK:
            raise LfsOpError(f"not a symbolic link: {path!r}")
        return self._read_data(inode, 0, inode.size).decode("utf-8", "surrogateescape")

    def link(self, existing: str, path: str) -> None:
        inode = self._iget(self._lookup(existing))
        if inode.mode & S_IFMT == S_IFDIR:
            raise LfsOpError("hard links to directories are not allowed")
        dino, name = self._parent(path)
        if name in self._dirs[dino]:
            raise LfsOpError(f"file exists: {path!r}")
        with self.atomic():
            inode = self._iget(inode.ino)
            inode.nlink += 1
            inode.ctime = now_ms()
            self._mark(inode)
            self._link(dino, name, inode.ino)
            self._end_op()

    def stat(self, path: str) -> Stat:
        return self.stat_ino(self._lookup(path))

    def lookup(self, dino: int, name: str) -> Stat | None:
        """The attributes of ``name`` in directory ``dino``; None if it has no such name."""
        ino = self._dir(dino).get(name)
        return None if ino is None else self.stat_ino(ino)

    def stat_ino(self, ino: int) -> Stat:
        i = self._iget(ino)
        size, blocks = i.size, i.blocks
        if ino in self._dirty_dirs:  # what the next commit will write (``_write_dir``)
            size = _dir_file_size(self._dirs[ino])
            blocks = -(-size // self.bs)
        return Stat(
            i.ino,
            i.mode,
            i.nlink,
            i.uid,
            i.gid,
            size,
            blocks,
            i.mtime,
            i.ctime,
            i.atime,
            i.version,
        )

    def exists(self, path: str) -> bool:
        try:
            self._lookup(path)
        except LfsOpError:
            return False
        return True

    def readdir(self, path: str = "") -> list[tuple[str, int]]:
        ino = self._lookup(path)
        if self._iget(ino).mode & S_IFMT != S_IFDIR:
            raise LfsOpError(f"not a directory: {path!r}")
        return list(self._dir(ino).items())

    # ------------------------------------------------------------------ for the FUSE layer
    # (fsage/lfs/mount.py): attribute changes that POSIX has and the operations above do not.
    def setattr(
        self,
        path: str,
        mode: int | None = None,
        uid: int | None = None,
        gid: int | None = None,
        atime_ms: int | None = None,
        mtime_ms: int | None = None,
    ) -> Stat:
        """chmod (permission bits of ``mode``), chown and utimens in one unit; the change
        time becomes now. Returns the new attributes."""
        return self.setattr_ino(self._lookup(path), mode, uid, gid, atime_ms, mtime_ms)

    def setattr_ino(
        self,
        ino: int,
        mode: int | None = None,
        uid: int | None = None,
        gid: int | None = None,
        atime_ms: int | None = None,
        mtime_ms: int | None = None,
        size: int | None = None,
    ) -> Stat:
        """``setattr`` of inode ``ino``; with ``size``, a truncate too, in the same
        operation (both or neither)."""
        self._iget(ino)  # the only step that can fail, before any change
        change = (mode, uid, gid, atime_ms, mtime_ms)
        if size is not None:
            inode = self._regular(ino, f"inode {ino}")
            with self.atomic(4 if size > inode.size else 0):
                self._truncate(inode, size)
                self._set_attrs(self._iget(ino), *change)
            return self.stat_ino(ino)
        if self._in_memory_ok():
            # Got again: a commit made first may have dropped the inode from the cache.
            self._set_attrs(self._iget(ino), *change)
            self._changed_in_memory()
        else:
            with self.atomic(1):
                self._set_attrs(self._iget(ino), *change)
                self._end_op()
        return self.stat_ino(ino)

    def _set_attrs(
        self,
        inode: Inode,
        mode: int | None,
        uid: int | None,
        gid: int | None,
        atime_ms: int | None,
        mtime_ms: int | None,
    ) -> None:
        if mode is not None:
            inode.mode = (inode.mode & S_IFMT) | (mode & 0o7777)
        if uid is not None:
            inode.uid = uid
        if gid is not None:
            inode.gid = gid
        if atime_ms is not None:
            inode.atime = atime_ms
        if mtime_ms is not None:
            inode.mtime = mtime_ms
        inode.ctime = now_ms()
        self._mark(inode)
