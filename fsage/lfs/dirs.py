"""Directories and the directory change journal of seed 003 (§2.7 directory, §2.7.3 directory
change record; the dir module of §3.5): directory files, path lookup and the change records
(``BT_DIRCH``) that keep directory operations atomic across roll-forward.
"""

from __future__ import annotations

import functools

from fsage.lfs import format as fmt
from fsage.lfs import lfs_pb2
from fsage.lfs.common import LfsOpError, now_ms
from fsage.lfs.format import (
    BT_DIRCH,
    INO_ROOT,
    S_IFDIR,
    S_IFMT,
    BlockRec,
    LfsError,
)
from fsage.lfs.state import LfsState


def _varint_len(n: int) -> int:
    return max(1, -(-n.bit_length() // 7))


def _dir_file_size(d: dict[str, int]) -> int:
    """Octets of a directory file holding ``d`` (seed 003 §2.7: a length-prefixed DirFile of
    DirFileRec{ino, name}), without encoding it."""
    total = 4
    for name, ino in d.items():
        n = len(name.encode("utf-8", "surrogateescape"))
        rec = 2 + _varint_len(ino) + _varint_len(n) + n
        total += 1 + _varint_len(rec) + rec
    return total


#: Varints below 128 are one octet: those octets, made once.
_SMALL_VARINT = tuple(bytes([i]) for i in range(128))


def _varint(n: int) -> bytes:
    if n < 128:
        return _SMALL_VARINT[n]
    out = bytearray()
    while n >= 128:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


@functools.lru_cache(maxsize=1 << 16)
def _dir_entry(name: str, ino: int) -> bytes:
    """One entry of a directory file: field 1 of DirFile, a DirFileRec{ino = 1, name = 2}."""
    raw = name.encode("utf-8")
    rec = b"".join((b"\x08", _varint(ino), b"\x12", _varint(len(raw)), raw))
    return b"\x0a" + _varint(len(rec)) + rec


def _encode_dir(d: dict[str, int]) -> bytes:
    """A directory file holding ``d``: the octets ``encode_pb(DirFile(list=[DirFileRec(ino,
    name), ...]))`` gives, from entries encoded once (a commit writes every directory changed
    since the last one, most of whose entries it wrote before; building the messages again
    was most of a commit's time)."""
    body = b"".join([_dir_entry(name, ino) for name, ino in d.items()])
    return fmt.U32.pack(len(body)) + body


class _DirMixin(LfsState):
    """Directories and their change journal of :class:`fsage.lfs.fs.LFS`."""

    def _dir(self, ino: int) -> dict[str, int]:
        d = self._dirs.get(ino)
        if d is None:
            inode = self._iget(ino)
            if inode.mode & S_IFMT != S_IFDIR:
                raise LfsOpError(f"inode {ino} is not a directory")
            if inode.size > self.geo.image_size:
                raise LfsError(f"{self.path}: directory {ino} claims {inode.size} octets")
            raw = self._read_data(inode, 0, inode.size)
            if inode.dircrc and fmt.dir_checksum(raw) != inode.dircrc:
                raise LfsError(f"{self.path}: directory {ino} is damaged (checksum mismatch)")
            d = {}
            if raw:
                msg = lfs_pb2.DirFile()
                why = fmt.parse_prefixed(raw, msg, len(raw))
                if why is not None:
                    raise LfsError(f"{self.path}: directory {ino} is damaged ({why})")
                for rec in msg.list:
                    d[rec.name] = rec.ino
            self._dirs[ino] = d
        return d

    def _dir_change(self, dino: int, name: str, ino: int, op: lfs_pb2.DirChRec.Operation) -> None:
        del dino
        self._dirch.append(fmt.encode_pb(lfs_pb2.DirChRec(ino=ino, name=name, op=op)))

    def _write_dirch(self) -> None:
        if not self._dirch:
            return
        block = bytearray()
        for rec in self._dirch:
            if len(rec) + 1 > self.bs:
                continue  # a name this long cannot be journalled; the directory still is
            if len(block) + len(rec) + 1 > self.bs:
                self._put(bytes(block), BlockRec(BT_DIRCH, 0))
                block = bytearray()
            block += rec
        if block:
            self._put(bytes(block), BlockRec(BT_DIRCH, 0))
        self._dirch.clear()

    def _write_dir(self, ino: int) -> None:
        inode = self._iget(ino)
        raw = _encode_dir(self._dirs[ino])
        bs = self.bs
        inode.dircrc = fmt.dir_checksum(raw)
        if self._dir_max >= 0:  # the reserve for deletes follows the largest directory
            self._dir_max = max(self._dir_max, -(-len(raw) // bs))
        # Only the blocks that changed are written again; a directory of one block changed
        # (it is written because it did), so it is not read back to compare.
        old = self._read_data(inode, 0, inode.size) if len(raw) > bs else b""
        for blk in range(-(-len(raw) // bs)):
            piece = raw[blk * bs : (blk + 1) * bs]
            if old[blk * bs : (blk + 1) * bs] != piece:
                self._write_data(inode, blk * bs, piece)
        if len(raw) < inode.size:
            # Writing the directory file out is no change of the directory: its times stay.
            times = inode.mtime, inode.ctime
            self._truncate_inode(inode, len(raw))
            inode.mtime, inode.ctime = times
        inode.size = len(raw)

    def _lookup(self, path: str, follow_last: bool = False) -> int:
        del follow_last
        ino = INO_ROOT
        for part in self._parts(path):
            d = self._dir(ino)
            if part not in d:
                raise LfsOpError(f"no such file or directory: {path!r}")
            ino = d[part]
        return ino

    @staticmethod
    def _parts(path: str) -> list[str]:
        parts = [p for p in path.strip("/").split("/") if p]
        for p in parts:
            if p in (".", ".."):
                raise LfsOpError(f"path components '.' and '..' are not supported: {path!r}")
        return parts

    def _parent(self, path: str) -> tuple[int, str]:
        parts = self._parts(path)
        if not parts:
            raise LfsOpError("the root directory has no parent")
        dino = INO_ROOT
        for part in parts[:-1]:
            d = self._dir(dino)
            if part not in d:
                raise LfsOpError(f"no such directory: {path!r}")
            dino = d[part]
            if self._iget(dino).mode & S_IFMT != S_IFDIR:
                raise LfsOpError(f"not a directory: {part!r} in {path!r}")
        self._dir(dino)
        return dino, parts[-1]

    def _link(self, dino: int, name: str, ino: int) -> None:
        if len(name.encode("utf-8", "surrogateescape")) > 255:
            raise LfsOpError(f"name too long: {name[:40]!r}...")
        self._touch(dino)
        self._dir(dino)[name] = ino
        self._dirty_dirs.add(dino)
        self._dir_change(dino, name, ino, lfs_pb2.DirChRec.ADD)
        d = self._iget(dino)
        d.mtime = d.ctime = now_ms()
        self._mark(d)

    def _unlink_name(self, dino: int, name: str) -> int:
        self._touch(dino)
        ino = self._dir(dino).pop(name)
        self._dirty_dirs.add(dino)
        self._dir_change(dino, name, ino, lfs_pb2.DirChRec.REMOVE)
        d = self._iget(dino)
        d.mtime = d.ctime = now_ms()
        self._mark(d)
        return ino
