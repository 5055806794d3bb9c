"""The live reader: the layout of a mounted directory tree, read through FIEMAP.

``read_live_layout(path)`` walks a mounted tree (ext4, xfs, btrfs or any other file system on a
block device whose driver answers FIEMAP) and yields a :class:`fsage.layout.Layout` of kind
``live:<fstype>``. Its numpy-free first half (mountinfo, the checks before the walk, the C
walk itself, and the walk ``fsage snapshot DIR`` starts before its imports) is in
``fsage.snapshotter.livewalk``. What it does, and the choices behind it:

* **Which file systems.** The file system type comes from ``/proc/self/mountinfo``. Pseudo file
  systems have no block layout and are refused with a :class:`SourceError`: every type that
  ``/proc/filesystems`` marks ``nodev`` (proc, sysfs, tmpfs, ramfs, devtmpfs, devpts, cgroup,
  cgroup2, overlay, nfs, fuse, 9p, virtiofs, zfs, ...) plus a built-in list for when that file
  cannot be read. A file system that answers FIEMAP with "not supported" on every regular
  file is refused as well; where only some files are refused, those are recorded without
  extents and a note names them.
* **The walk.** In C (``fsage._live``, built by setup.py): getdents64 on each directory, its
  entries taken in inode order (the inodes are then read as they lie, not in hash order),
  ``openat``/``statx``/ioctls relative to the directory's descriptor (so any name survives
  and paths may exceed PATH_MAX), pending directories on an explicit stack (no depth limit, at
  most three descriptors open per thread), interrupted calls retried, the GIL released.
  ``workers`` threads take directories from that one stack, so a lopsided tree keeps them all
  busy; each has its own descriptor table, which spares the kernel a shared lock on every
  open and close. The C walk merges extents, sorts the records by inode and hands back the
  columns of the FileTable as buffers that numpy wraps without a copy or a per-file Python
  object. Where the extension is not built, the same walk runs in Python
  (``os.scandir`` on byte paths, forked workers); ``engine=`` picks one, and the tests hold
  the two to the same Layout. Directories on another device (another mount, a btrfs
  subvolume) and mount points listed in mountinfo are not entered; they are counted in
  ``layout.notes``. A hard-linked inode is recorded once, with every name in the link table.
  Entries that vanish or change type between the listing and their opening are skipped and
  noted as such.
* **Paths.** The layout's root is the root of the mount. When ``path`` is a directory below
  it, the directories from the mount root down to ``path`` are recorded too (each with the one
  name on the way), so paths read from the mount root (``/sub/dir/file``) and
  ``facts.extra["subtree"]`` names the part that was walked.
* **Extents.** ``FS_IOC_FIEMAP`` on every regular file and every directory (where the file
  system maps directories; xfs and btrfs do not, and those directories get no extents), with
  ``FIEMAP_FLAG_SYNC`` off unless ``sync=True`` (so dirty data shows as delalloc). Files with
  more extents than one buffer holds are read in several calls. The C walk first asks for the
  extents up to the file's size and asks for the rest only when those cover fewer bytes than
  stat's block count (space allocated past the end, such as ``fallocate --keep-size``, is
  then read too); the Python walk asks for everything at once. Adjacent extents (logically
  and physically contiguous, same flags) are merged. Byte offsets become blocks of
  ``statvfs().f_frsize``; an extent that does not fill its last block is rounded up. FIEMAP
  flags map to ``EXTENT_UNWRITTEN``, ``EXTENT_DELALLOC``, ``EXTENT_INLINE`` (data-inline,
  data-tail), ``EXTENT_SHARED`` and ``EXTENT_ENCODED`` (encoded, data-encrypted). On btrfs,
  physical addresses are in btrfs's logical address space (before its chunk mapping), which
  ``facts.extra["physical_space"]`` says.
* **Free space.** ``FS_IOC_GETFSMAP`` where the file system has it (ext4, xfs); records owned by
  ``FMR_OWN_FREE`` on the data device are the free extents (adjacent records merged). Where
  the call is refused (older kernels kept it to CAP_SYS_ADMIN on xfs) or missing (btrfs),
  ``facts.free_space_known`` is False, the free extents are empty and a note says why.
* **Without root.** Whatever cannot be opened (a file without read permission, a directory
  without read or search permission) is left out of the layout together with what lies below
  it; ``layout.notes`` gives the count and the first few paths.
* **Facts.** ``kind`` is ``live:<fstype>``; ``uuid`` comes from ``FS_IOC_GETFSUUID`` (Linux 6.5+,
  unprivileged), else ``blkid`` on the mounted device, else ``statfs().f_fsid`` written as
  ``fsid:<16 hex digits>`` (``facts.extra["uuid_source"]`` says which); ``label`` from
  ``FS_IOC_GETFSLABEL`` where answered; the block count is the device's as GETFSMAP maps it
  (metadata included, as the offline readers and e2freefrag count it: statvfs on ext4 leaves
  out the space the file system keeps for its own metadata), else statvfs's; free blocks
  (as the file system reports them) and inode counts from ``statvfs``.
* **Per file.** ino, generation (``FS_IOC_GETVERSION`` where supported, else 0), mode, nlink,
  uid, gid, size, times in nanoseconds; crtime from statx's birth time where the file system
  keeps one (C walk; ext4, xfs and btrfs do), else 0 (the Python walk has it only through
  ``st_birthtime``, which Python offers on Linux from 3.13). ``facts.extra["walk"]`` says
  which walk read the tree.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from fsage.errors import SourceError
from fsage.layout import (
    EXTENT_DELALLOC,
    EXTENT_ENCODED,
    EXTENT_INLINE,
    EXTENT_SHARED,
    EXTENT_UNWRITTEN,
    FILE_COLUMNS,
    FileTable,
    FreeExtents,
    FsFacts,
    Layout,
    LinkTable,
)
from fsage.snapshotter.livewalk import (
    LFS_FSTYPE,
    PSEUDO_FS_TYPES,
    CWalk,
    MountInfo,
    WalkScope,
    c_walker_available,
    find_mount,
    is_pseudo_fs,
    read_mountinfo,
    run_c_walk,
    scope_of,
    take_background_walk,
)

__all__ = [
    "LFS_FSTYPE",
    "PSEUDO_FS_TYPES",
    "MountInfo",
    "c_walker_available",
    "fiemap_extents",
    "find_mount",
    "getfsmap_free",
    "is_pseudo_fs",
    "of_inodes_in_use",
    "read_live_layout",
    "read_mountinfo",
]

# ioctl request numbers (asm-generic encoding, as on x86-64 and arm64).
FS_IOC_FIEMAP = 0xC020660B
FS_IOC_GETFSMAP = 0xC0C0583B
FS_IOC_GETVERSION = 0x80087601
FS_IOC_GETFSUUID = 0x80111500
FS_IOC_GETFSLABEL = 0x81009431

FIEMAP_FLAG_SYNC = 0x1
FIEMAP_MAX_OFFSET = 0xFFFFFFFFFFFFFFFF

FIEMAP_EXTENT_LAST = 0x1
FIEMAP_EXTENT_UNKNOWN = 0x2
FIEMAP_EXTENT_DELALLOC = 0x4
FIEMAP_EXTENT_ENCODED = 0x8
FIEMAP_EXTENT_DATA_ENCRYPTED = 0x80
FIEMAP_EXTENT_NOT_ALIGNED = 0x100
FIEMAP_EXTENT_DATA_INLINE = 0x200
FIEMAP_EXTENT_DATA_TAIL = 0x400
FIEMAP_EXTENT_UNWRITTEN = 0x800
FIEMAP_EXTENT_MERGED = 0x1000
FIEMAP_EXTENT_SHARED = 0x2000

FMR_OF_SPECIAL_OWNER = 0x10
FMR_OF_LAST = 0x20
FMR_OWN_FREE = 1
FMH_OF_DEV_T = 0x1

# struct fiemap (32 bytes) followed by struct fiemap_extent[] (56 bytes each).
_FIEMAP_HEAD = struct.Struct("<QQIIII")
_FIEMAP_EXT_SIZE = 56
FIEMAP_EXTENT_DTYPE = np.dtype(
    {
        "names": ["logical", "physical", "length", "flags"],
        "formats": ["<u8", "<u8", "<u8", "<u4"],
        "offsets": [0, 8, 16, 40],
        "itemsize": _FIEMAP_EXT_SIZE,
    }
)
# struct fsmap_head (192 bytes incl. two key records) followed by struct fsmap[] (64 bytes).
_FSMAP_HEAD_SIZE = 192
_FSMAP_REC = struct.Struct("<IIQQQQ24x")
FSMAP_DTYPE = np.dtype(
    {
        "names": ["device", "flags", "physical", "owner", "offset", "length"],
        "formats": ["<u4", "<u4", "<u8", "<u8", "<u8", "<u8"],
        "offsets": [0, 4, 8, 16, 24, 32],
        "itemsize": 64,
    }
)

_SKIPPED_SHOWN = 5  # paths named in a note; the rest are counted


def fiemap_extents(fd: int, *, sync: bool = False, batch: int = 256) -> npt.NDArray[np.void]:
    """All FIEMAP extents of an open file, unmerged, as a FIEMAP_EXTENT_DTYPE array (bytes)."""
    buf = bytearray(_FIEMAP_HEAD.size + _FIEMAP_EXT_SIZE * batch)
    raw = bytearray()
    _fiemap_into(fd, buf, batch, FIEMAP_FLAG_SYNC if sync else 0, raw)
    return np.frombuffer(bytes(raw), FIEMAP_EXTENT_DTYPE)


def _fiemap_into(fd: int, buf: bytearray, batch: int, flags: int, out: bytearray) -> int:
    """Append the raw fiemap_extent records of ``fd`` to ``out``; return how many.

    On an error nothing is appended and the OSError propagates.
    """
    start = 0
    total = 0
    mark = len(out)
    while True:
        _FIEMAP_HEAD.pack_into(buf, 0, start, FIEMAP_MAX_OFFSET - start, flags, 0, batch, 0)
        try:
            fcntl.ioctl(fd, FS_IOC_FIEMAP, buf, True)
        except OSError:
            del out[mark:]
            raise
        mapped = int.from_bytes(buf[20:24], "little")
        if mapped == 0:
            return total
        end = 32 + _FIEMAP_EXT_SIZE * mapped
        out += buf[32:end]
        total += mapped
        last = end - _FIEMAP_EXT_SIZE
        if mapped < batch or int.from_bytes(buf[last + 40 : last + 44], "little") & (
            FIEMAP_EXTENT_LAST
        ):
            return total
        logical = int.from_bytes(buf[last : last + 8], "little")
        length = int.from_bytes(buf[last + 16 : last + 24], "little")
        start = logical + length
        if start >= FIEMAP_MAX_OFFSET:
            return total


def merge_extents(
    raw: npt.NDArray[np.void], counts: npt.NDArray[np.int64], block_size: int
) -> tuple[
    npt.NDArray[np.uint64],
    npt.NDArray[np.uint64],
    npt.NDArray[np.uint64],
    npt.NDArray[np.uint64],
    npt.NDArray[np.uint32],
]:
    """Merge raw FIEMAP extents per file and convert them to blocks.

    ``counts[i]`` raw extents belong to file ``i``, in order. Returns the new CSR offsets
    (len n+1) and the logical, physical, length (blocks) and fsage flag columns.
    """
    n_files = int(counts.shape[0])
    off = np.zeros(n_files + 1, np.uint64)
    if raw.shape[0] == 0:
        z = np.zeros(0, np.uint64)
        return off, z, z.copy(), z.copy(), np.zeros(0, np.uint32)
    owner = np.repeat(np.arange(n_files, dtype=np.int64), counts)
    logical = raw["logical"].astype(np.uint64)
    physical = raw["physical"].astype(np.uint64)
    length = raw["length"].astype(np.uint64)
    rflags = raw["flags"].astype(np.uint32) & np.uint32(
        ~(FIEMAP_EXTENT_LAST | FIEMAP_EXTENT_MERGED) & 0xFFFFFFFF
    )
    joins = np.zeros(raw.shape[0], bool)
    joins[1:] = (
        (owner[1:] == owner[:-1])
        & (logical[1:] == logical[:-1] + length[:-1])
        & (physical[1:] == physical[:-1] + length[:-1])
        & (rflags[1:] == rflags[:-1])
        & ((rflags[1:] & (FIEMAP_EXTENT_NOT_ALIGNED | FIEMAP_EXTENT_UNKNOWN)) == 0)
    )
    heads = np.flatnonzero(~joins)
    m_logical = logical[heads]
    m_physical = physical[heads]
    m_length = np.add.reduceat(length, heads).astype(np.uint64)
    m_rflags = rflags[heads]
    bs = np.uint64(block_size)
    first = m_logical // bs
    last = (m_logical + m_length + bs - np.uint64(1)) // bs
    blocks = last - first
    flags = np.zeros(heads.shape[0], np.uint32)
    for fiemap_bits, fsage_bit in (
        (FIEMAP_EXTENT_UNWRITTEN, EXTENT_UNWRITTEN),
        (FIEMAP_EXTENT_DELALLOC, EXTENT_DELALLOC),
        (FIEMAP_EXTENT_DATA_INLINE | FIEMAP_EXTENT_DATA_TAIL, EXTENT_INLINE),
        (FIEMAP_EXTENT_SHARED, EXTENT_SHARED),
        (FIEMAP_EXTENT_ENCODED | FIEMAP_EXTENT_DATA_ENCRYPTED, EXTENT_ENCODED),
    ):
        flags[(m_rflags & np.uint32(fiemap_bits)) != 0] |= np.uint32(fsage_bit)
    per_file = np.bincount(owner[heads], minlength=n_files)
    np.cumsum(per_file, out=off[1:])
    return off, first, m_physical // bs, blocks, flags


def _encode_dev(dev: int) -> int:
    major, minor = os.major(dev), os.minor(dev)
    return (minor & 0xFF) | (major << 8) | ((minor & ~0xFF) << 12)


def getfsmap_free(
    fd: int, block_size: int, dev: int, *, batch: int = 1024
) -> tuple[FreeExtents | None, int | None, str]:
    """Free extents from FS_IOC_GETFSMAP and the blocks of the device they are on (the end
    of its last record: metadata included, as the on-disk block count; statvfs leaves out
    what the file system keeps for itself), or (None, None, reason) where it cannot be
    had."""
    buf = bytearray(_FSMAP_HEAD_SIZE + 64 * batch)
    struct.pack_into("<IIII", buf, 0, 0, 0, batch, 0)
    # High key: all ones but the length (xfs refuses a high key with a length).
    all_ones = FIEMAP_MAX_OFFSET
    _FSMAP_REC.pack_into(buf, 128, 0xFFFFFFFF, 0xFFFFFFFF, all_ones, all_ones, all_ones, 0)
    chunks: list[npt.NDArray[np.void]] = []
    oflags = 0
    while True:
        try:
            fcntl.ioctl(fd, FS_IOC_GETFSMAP, buf, True)
        except OSError as e:
            if e.errno in (errno.EPERM, errno.EACCES):
                return None, None, "GETFSMAP needs CAP_SYS_ADMIN on this file system"
            if e.errno in (errno.ENOTTY, errno.EOPNOTSUPP, errno.EINVAL):
                return None, None, "the file system has no GETFSMAP"
            return None, None, f"GETFSMAP failed: {e.strerror}"
        oflags, _count, entries = struct.unpack_from("<III", buf, 4)
        if entries == 0:
            break
        recs = np.frombuffer(
            bytes(buf[_FSMAP_HEAD_SIZE : _FSMAP_HEAD_SIZE + 64 * entries]), FSMAP_DTYPE
        )
        chunks.append(recs)
        if int(recs["flags"][-1]) & FMR_OF_LAST:
            break
        # Continue after the last record: it becomes the low key.
        last = _FSMAP_HEAD_SIZE + 64 * (entries - 1)
        buf[64:128] = buf[last : last + 64]
    recs = np.concatenate(chunks) if chunks else np.zeros(0, FSMAP_DTYPE)
    free = recs[((recs["flags"] & FMR_OF_SPECIAL_OWNER) != 0) & (recs["owner"] == FMR_OWN_FREE)]
    if free.shape[0]:
        # A set, not np.unique: numpy 2's unique imports numpy.ma, a tenth of a second.
        devices = set(free["device"].tolist())
        if len(devices) > 1:
            want = _encode_dev(dev) if oflags & FMH_OF_DEV_T else int(free["device"][0])
            if want not in devices:
                want = int(free["device"][0])
            free = free[free["device"] == want]
            recs = recs[recs["device"] == want]
    ends = recs["physical"].astype(np.uint64) + recs["length"].astype(np.uint64)
    device_blocks = int(ends.max()) // block_size if ends.shape[0] else None
    bs = np.uint64(block_size)
    start = free["physical"].astype(np.uint64) // bs
    length = free["length"].astype(np.uint64) // bs
    keep = length > 0
    start, length = start[keep], length[keep]
    order = np.argsort(start, kind="stable")
    start, length = start[order], length[order]
    if start.shape[0] > 1:
        joins = np.zeros(start.shape[0], bool)
        joins[1:] = start[1:] == start[:-1] + length[:-1]
        heads = np.flatnonzero(~joins)
        length = np.add.reduceat(length, heads).astype(np.uint64)
        start = start[heads]
    return FreeExtents(start.astype(np.uint64), length.astype(np.uint64)), device_blocks, ""


def _fs_uuid(fd: int, mount: MountInfo, vfs: os.statvfs_result) -> tuple[str, str]:
    buf = bytearray(17)
    try:
        fcntl.ioctl(fd, FS_IOC_GETFSUUID, buf, True)
        n = buf[0]
        if 0 < n <= 16 and any(buf[1 : 1 + n]):
            h = bytes(buf[1 : 1 + n]).hex()
            if n == 16:
                h = f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
            return h, "FS_IOC_GETFSUUID"
    except OSError:
        pass
    if mount.source.startswith("/dev/"):
        import subprocess  # only for this fallback: Linux < 6.5

        try:
            res = subprocess.run(
                ["blkid", "-c", "/dev/null", "-s", "UUID", "-o", "value", mount.source],
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            )
            if res.returncode == 0 and res.stdout.strip():
                return res.stdout.strip(), "blkid"
        except (OSError, subprocess.SubprocessError):
            pass
    return f"fsid:{vfs.f_fsid & 0xFFFFFFFFFFFFFFFF:016x}", "f_fsid"


def _fs_label(fd: int) -> str:
    buf = bytearray(256)
    try:
        fcntl.ioctl(fd, FS_IOC_GETFSLABEL, buf, True)
    except OSError:
        return ""
    return bytes(buf).split(b"\0", 1)[0].decode("utf-8", "replace")


_NO_FIEMAP = frozenset({errno.EOPNOTSUPP, errno.ENOTTY, errno.EINVAL})


def _reason(err: int | None) -> str:
    """Why a path was left out, for the notes."""
    if err in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):
        return "vanished or changed during the walk"
    if err in (errno.EACCES, errno.EPERM):
        return "permission denied"
    return os.strerror(err) if err else "unknown error"


_HAS_BIRTHTIME = hasattr(os.stat_result, "st_birthtime_ns")
_DirTask = tuple[bytes, bytes, int | None, bytes | None]  # path, rel, parent ino, name
_META_COLS = 11  # ino, generation, mode, nlink, uid, gid, size, atime, mtime, ctime, crtime


@dataclass
class _Walk:
    """Accumulates records while walking; one instance per read."""

    dev: int
    submounts: set[bytes]
    sync: bool
    batch: int
    progress: Callable[[int], None] | None = None
    meta: list[int] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    raw: bytearray = field(default_factory=bytearray)
    l_parent: list[int] = field(default_factory=list)
    l_ino: list[int] = field(default_factory=list)
    l_name: list[bytes] = field(default_factory=list)
    seen: set[int] = field(default_factory=set)  # inodes with several links, once recorded
    skipped: list[tuple[bytes, str]] = field(default_factory=list)
    not_crossed: list[bytes] = field(default_factory=list)
    no_fiemap: list[tuple[bytes, str]] = field(default_factory=list)  # recorded without extents
    fiemap_ok: int = 0  # regular files FIEMAP answered
    dir_fiemap: bool = True
    getversion: bool = True
    fiemap_checked: bool = False

    def __post_init__(self) -> None:
        self.buf = bytearray(_FIEMAP_HEAD.size + _FIEMAP_EXT_SIZE * self.batch)
        self.gbuf = bytearray(8)
        self.fflags = FIEMAP_FLAG_SYNC if self.sync else 0

    def _generation(self, fd: int) -> int:
        if not self.getversion:
            return 0
        try:
            fcntl.ioctl(fd, FS_IOC_GETVERSION, self.gbuf, True)
        except OSError:
            self.getversion = False
            return 0
        return int.from_bytes(self.gbuf[:4], "little")

    def _record(self, st: os.stat_result, gen: int, nraw: int) -> None:
        self.meta += (
            st.st_ino,
            gen,
            st.st_mode,
            st.st_nlink,
            st.st_uid,
            st.st_gid,
            st.st_size,
            st.st_atime_ns,
            st.st_mtime_ns,
            st.st_ctime_ns,
            getattr(st, "st_birthtime_ns", 0) if _HAS_BIRTHTIME else 0,
        )
        self.counts.append(nraw)
        n = len(self.counts)
        if self.progress is not None and n & 0xFFF == 0:
            self.progress(n)

    def _fiemap(self, fd: int, st: os.stat_result, is_dir: bool, rel: bytes) -> int:
        if not is_dir and st.st_size == 0 and st.st_blocks == 0:
            return 0
        if is_dir and not self.dir_fiemap:
            return 0
        try:
            return _fiemap_into(fd, self.buf, self.batch, self.fflags, self.raw)
        except OSError as e:
            if is_dir and e.errno in _NO_FIEMAP:
                self.dir_fiemap = False
            else:
                self.no_fiemap.append((rel, _reason(e.errno)))
            return 0

    def open_dir(
        self,
        path: bytes,
        rel: bytes,
        parent: int | None,
        name: bytes | None,
        *,
        check_dev: bool = True,
    ) -> tuple[int, int] | None:
        """Open and record a directory; return (fd, ino), or None if it is skipped."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError as e:
            self._skip(rel, e)
            return None
        try:
            st = os.fstat(fd)
            if check_dev and (st.st_dev != self.dev or rel in self.submounts):
                self.not_crossed.append(rel)
                os.close(fd)
                return None
            gen = self._generation(fd)
            n = self._fiemap(fd, st, True, rel)
        except BaseException:
            os.close(fd)
            raise
        self._record(st, gen, n)
        if parent is not None and name is not None:
            self._link(parent, st.st_ino, name)
        return fd, st.st_ino

    def _link(self, parent: int, ino: int, name: bytes) -> None:
        self.l_parent.append(parent)
        self.l_ino.append(ino)
        self.l_name.append(name)

    def _skip(self, rel: bytes, e: OSError) -> None:
        self.skipped.append((rel, _reason(e.errno)))

    def _other(self, entry: os.DirEntry[bytes], rel: bytes, dino: int) -> None:
        """Record a directory entry that is neither a directory nor a regular file."""
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError as e:
            self._skip(rel + b"/" + entry.name, e)
            return
        if st.st_nlink > 1:
            if st.st_ino in self.seen:
                self._link(dino, st.st_ino, entry.name)
                return
            self.seen.add(st.st_ino)
        self._record(st, 0, 0)
        self._link(dino, st.st_ino, entry.name)

    def walk(
        self,
        top: bytes,
        top_rel: bytes,
        parent: int | None,
        name: bytes | None,
        defer: list[_DirTask] | None = None,
    ) -> None:
        """Walk the tree below ``top`` (recording ``top`` itself under ``parent``/``name``).

        With ``defer``, only ``top`` is read and its subdirectories are appended to ``defer``.
        """
        stack: list[_DirTask] = [(top, top_rel, parent, name)]
        sub_dirs = stack if defer is None else defer
        # The per-file path is inlined and its names bound locally: it runs once per file.
        o_flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
        ioctl = fcntl.ioctl
        fstat = os.fstat
        close = os.close
        opn = os.open
        seen = self.seen
        meta_extend = self.meta.extend
        counts_append = self.counts.append
        lp_append = self.l_parent.append
        li_append = self.l_ino.append
        ln_append = self.l_name.append
        raw = self.raw
        buf = self.buf
        gbuf = self.gbuf
        batch = self.batch
        fflags = self.fflags
        pack_head = _FIEMAP_HEAD.pack_into
        unpack_u32 = struct.Struct("<I").unpack_from
        is_reg = stat.S_ISREG
        ext_size = _FIEMAP_EXT_SIZE
        max_off = FIEMAP_MAX_OFFSET
        req_fiemap = FS_IOC_FIEMAP
        req_version = FS_IOC_GETVERSION
        birth = _HAS_BIRTHTIME
        progress = self.progress
        while stack:
            path, rel, par, nm = stack.pop()
            opened = self.open_dir(path, rel, par, nm)
            if opened is None:
                continue
            dfd, dino = opened
            try:
                try:
                    it = os.scandir(path)
                except OSError as e:
                    self._skip(rel + b"/", e)
                    continue
                with it:
                    for entry in sorted(it, key=_inode_of):  # as the C walk
                        ename = entry.name
                        try:
                            if entry.is_dir(follow_symlinks=False):
                                sub_dirs.append((entry.path, rel + b"/" + ename, dino, ename))
                                continue
                            if not entry.is_file(follow_symlinks=False):
                                self._other(entry, rel, dino)
                                continue
                        except OSError as e:
                            self._skip(rel + b"/" + ename, e)
                            continue
                        eino = entry.inode()
                        if eino in seen:
                            lp_append(dino)
                            li_append(eino)
                            ln_append(ename)
                            continue
                        try:
                            fd = opn(ename, o_flags, dir_fd=dfd)
                        except OSError as e:
                            self._skip(rel + b"/" + ename, e)
                            continue
                        n = 0
                        try:
                            st = fstat(fd)
                            if not is_reg(st.st_mode):
                                self._skip(rel + b"/" + ename, OSError(errno.ENOENT, ""))
                                continue
                            gen = 0
                            if self.getversion:
                                try:
                                    ioctl(fd, req_version, gbuf, True)
                                    gen = unpack_u32(gbuf)[0]
                                except OSError:
                                    self.getversion = False
                            if st.st_size or st.st_blocks:
                                pack_head(buf, 0, 0, max_off, fflags, 0, batch, 0)
                                try:
                                    ioctl(fd, req_fiemap, buf, True)
                                    n = unpack_u32(buf, 20)[0]
                                    if n == batch:
                                        n = _fiemap_into(fd, buf, batch, fflags, raw)
                                    elif n:
                                        raw += buf[32 : 32 + ext_size * n]
                                    self.fiemap_ok += 1
                                except OSError as e:
                                    n = 0
                                    if e.errno not in _NO_FIEMAP:
                                        self._skip(rel + b"/" + ename, e)
                                        continue
                                    self.no_fiemap.append((rel + b"/" + ename, _reason(e.errno)))
                        finally:
                            close(fd)
                        ino = st.st_ino
                        if st.st_nlink > 1:
                            if ino in seen:  # another name was recorded while we looked
                                if n:
                                    del raw[len(raw) - n * ext_size :]
                                lp_append(dino)
                                li_append(ino)
                                ln_append(ename)
                                continue
                            seen.add(ino)
                        meta_extend(
                            (
                                ino,
                                gen,
                                st.st_mode,
                                st.st_nlink,
                                st.st_uid,
                                st.st_gid,
                                st.st_size,
                                st.st_atime_ns,
                                st.st_mtime_ns,
                                st.st_ctime_ns,
                                st.st_birthtime_ns if birth else 0,  # type: ignore[attr-defined]
                            )
                        )
                        counts_append(n)
                        lp_append(dino)
                        li_append(ino)
                        ln_append(ename)
                        if progress is not None and not len(self.counts) & 0xFFF:
                            progress(len(self.counts))
            finally:
                close(dfd)


@dataclass
class _Part:
    """What one walk (or one worker) saw: the columns, ready to concatenate."""

    meta: npt.NDArray[np.int64]  # (n, _META_COLS)
    counts: npt.NDArray[np.int64]
    raw: npt.NDArray[np.void]  # FIEMAP_EXTENT_DTYPE, unmerged
    links: LinkTable
    skipped: list[tuple[bytes, str]]
    not_crossed: list[bytes]
    no_fiemap: list[tuple[bytes, str]]
    fiemap_ok: int


def _part(w: _Walk) -> _Part:
    return _Part(
        np.array(w.meta, dtype=np.int64).reshape(len(w.counts), _META_COLS),
        np.array(w.counts, dtype=np.int64),
        np.frombuffer(bytes(w.raw), FIEMAP_EXTENT_DTYPE),
        LinkTable.from_lists(w.l_parent, w.l_ino, w.l_name),
        w.skipped,
        w.not_crossed,
        w.no_fiemap,
        w.fiemap_ok,
    )


_WORKER_WALK: _Walk | None = None  # the template a forked worker copies its settings from


def _inode_of(entry: os.DirEntry[bytes]) -> int:
    return entry.inode()


def _walk_tasks(tasks: list[_DirTask]) -> _Part:
    tpl = _WORKER_WALK
    assert tpl is not None
    w = _Walk(dev=tpl.dev, submounts=tpl.submounts, sync=tpl.sync, batch=tpl.batch)
    w.dir_fiemap, w.getversion = tpl.dir_fiemap, tpl.getversion
    for task in tasks:
        w.walk(*task)
    return _part(w)


def _walk_parallel(w: _Walk, tasks: list[_DirTask], workers: int) -> list[_Part]:
    """Walk ``tasks`` (whole subtrees) in ``workers`` forked processes."""
    import multiprocessing

    global _WORKER_WALK
    # Go down a level or two until there are enough subtrees to share out.
    for _ in range(2):
        if len(tasks) >= 2 * workers:
            break
        deeper: list[_DirTask] = []
        for task in tasks:
            w.walk(*task, defer=deeper)
        tasks = deeper
    if not tasks:
        return []
    n_chunks = min(len(tasks), 8 * workers)
    chunks = [tasks[i::n_chunks] for i in range(n_chunks)]
    _WORKER_WALK = w
    try:
        ctx = multiprocessing.get_context("fork")
        with ctx.Pool(workers) as pool:
            parts = []
            for part in pool.imap_unordered(_walk_tasks, chunks):
                parts.append(part)
                if w.progress is not None:
                    w.progress(len(w.counts) + sum(len(p.counts) for p in parts))
            return parts
    finally:
        _WORKER_WALK = None


def _concat_links(tables: list[LinkTable]) -> LinkTable:
    if len(tables) == 1:
        return tables[0]
    offs: list[npt.NDArray[np.uint64]] = []
    base = 0
    for t in tables:
        offs.append(t.name_off[:-1] + np.uint64(base))
        base += len(t.names)
    offs.append(np.array([base], np.uint64))
    return LinkTable(
        np.concatenate([t.parent for t in tables]).astype(np.uint64),
        np.concatenate([t.ino for t in tables]).astype(np.uint64),
        np.concatenate(offs).astype(np.uint64),
        b"".join(t.names for t in tables),
    )


def _merge_parts(parts: list[_Part]) -> _Part:
    """Concatenate parts; an inode several parts recorded (hard links) is kept once."""
    if len(parts) == 1:
        return parts[0]
    meta = np.concatenate([p.meta for p in parts])
    counts = np.concatenate([p.counts for p in parts])
    raw = np.concatenate([p.raw for p in parts])
    _, first = np.unique(meta[:, 0], return_index=True)
    if first.shape[0] < meta.shape[0]:
        keep = np.zeros(meta.shape[0], bool)
        keep[first] = True
        ext_keep = np.repeat(keep, counts)
        raw = raw[ext_keep]
        meta, counts = meta[keep], counts[keep]
    return _Part(
        meta,
        counts,
        raw,
        _concat_links([p.links for p in parts]),
        [x for p in parts for x in p.skipped],
        [x for p in parts for x in p.not_crossed],
        [x for p in parts for x in p.no_fiemap],
        sum(p.fiemap_ok for p in parts),
    )


@dataclass
class _Seen:
    """What a walk saw, ready for the Layout: files sorted by inode, one record each."""

    files: FileTable
    links: LinkTable
    skipped: list[tuple[bytes, str]]
    not_crossed: list[bytes]
    no_fiemap: list[tuple[bytes, str]]
    fiemap_ok: int
    root_ino: int


def _files_of(part: _Part, block_size: int) -> FileTable:
    """The Python walk's columns as a FileTable (extents merged, in blocks), sorted by inode."""
    meta, counts = part.meta, part.counts
    n = int(counts.shape[0])
    ext_off, e_log, e_phys, e_len, e_flags = merge_extents(part.raw, counts, block_size)
    return FileTable(
        ino=meta[:, 0].astype(np.uint64),
        generation=meta[:, 1].astype(np.uint32),
        mode=meta[:, 2].astype(np.uint32),
        nlink=meta[:, 3].astype(np.uint32),
        uid=meta[:, 4].astype(np.uint32),
        gid=meta[:, 5].astype(np.uint32),
        size=meta[:, 6].astype(np.uint64),
        atime=meta[:, 7].copy(),
        mtime=meta[:, 8].copy(),
        ctime=meta[:, 9].copy(),
        crtime=meta[:, 10].copy(),
        flags=np.zeros(n, np.uint32),
        damaged=np.zeros(n, np.uint32),
        ext_off=ext_off,
        ext_logical=e_log,
        ext_physical=e_phys,
        ext_length=e_len,
        ext_flags=e_flags,
        meta_off=np.zeros(n + 1, np.uint64),
        meta_physical=np.zeros(0, np.uint64),
        meta_kind=np.zeros(0, np.uint8),
    ).sorted_by_ino()


def _listed(items: list[bytes]) -> str:
    shown = ", ".join(os.fsdecode(r or b"/") for r in items[:_SKIPPED_SHOWN])
    more = f" and {len(items) - _SKIPPED_SHOWN} more" if len(items) > _SKIPPED_SHOWN else ""
    return shown + more


def _by_reason(pairs: list[tuple[bytes, str]]) -> dict[str, list[bytes]]:
    out: dict[str, list[bytes]] = {}
    for rel, reason in pairs:
        out.setdefault(reason, []).append(rel)
    return out


def _notes(w: _Seen, extra_notes: list[str]) -> list[str]:
    notes = []
    for reason, rels in _by_reason(sorted(w.skipped)).items():
        noun = "path" if len(rels) == 1 else "paths"
        notes.append(f"skipped {len(rels)} {noun} ({reason}): {_listed(rels)}")
    if w.not_crossed:
        notes.append(
            f"did not cross {len(w.not_crossed)} mount point(s) or subvolume(s): "
            f"{_listed(sorted(w.not_crossed))}"
        )
    for reason, rels in _by_reason(sorted(w.no_fiemap)).items():
        noun = "file" if len(rels) == 1 else "files"
        notes.append(
            f"recorded {len(rels)} {noun} without extents (FIEMAP: {reason}): {_listed(rels)}"
        )
    return notes + extra_notes


def _c_files(res: dict[str, Any]) -> FileTable:
    """The FileTable over the columns fsage._live.walk returned (no copies)."""
    n = len(res["ino"]) // 8
    cols: dict[str, Any] = {
        name: np.frombuffer(res[name], dtype)
        for name, dtype in FILE_COLUMNS.items()
        if name not in ("flags", "damaged")
    }
    return FileTable(
        **cols,
        flags=np.zeros(n, np.uint32),
        damaged=np.zeros(n, np.uint32),
        ext_off=np.frombuffer(res["ext_off"], np.uint64),
        ext_logical=np.frombuffer(res["ext_logical"], np.uint64),
        ext_physical=np.frombuffer(res["ext_physical"], np.uint64),
        ext_length=np.frombuffer(res["ext_length"], np.uint64),
        ext_flags=np.frombuffer(res["ext_flags"], np.uint32),
        meta_off=np.zeros(n + 1, np.uint64),
        meta_physical=np.zeros(0, np.uint64),
        meta_kind=np.zeros(0, np.uint8),
    )


def _c_links(res: dict[str, Any]) -> LinkTable:
    return LinkTable(
        np.frombuffer(res["l_parent"], np.uint64),
        np.frombuffer(res["l_ino"], np.uint64),
        np.frombuffer(res["name_off"], np.uint64),
        res["names"],
    )


def _walk_python(sc: WalkScope) -> _Seen:
    """The walk in Python (os.scandir, fcntl.ioctl); the fallback and the tests' oracle."""
    w = _Walk(
        dev=sc.dev, submounts=sc.submounts, sync=sc.sync, batch=sc.batch, progress=sc.progress
    )
    comps = sc.comps
    if comps:
        # The directories from the mount root down to the given one, each with its one name.
        parent: int | None = None
        walked = sc.mount_point
        for i, comp in enumerate([b"", *comps[:-1]]):
            walked = os.path.join(walked, comp) if comp else walked
            relp = b"/" + b"/".join(comps[:i]) if i else b""
            opened = w.open_dir(walked, relp, parent, comp or None, check_dev=False)
            if opened is None:
                raise SourceError(f"{sc.path}: cannot open {os.fsdecode(walked)}")
            os.close(opened[0])
            parent = opened[1]
        top: _DirTask = (sc.real, sc.sub, parent, comps[-1])
    else:
        top = (sc.mount_point, b"", None, None)
    first = len(w.counts)
    if sc.workers > 1:
        deferred: list[_DirTask] = []
        w.walk(*top, defer=deferred)
        parts = _walk_parallel(w, deferred, sc.workers)
    else:
        w.walk(*top)
        parts = []
    if not w.counts:
        raise SourceError(f"{sc.path}: cannot open the mount root {os.fsdecode(sc.mount_point)}")
    if len(w.counts) == first:
        raise SourceError(f"{sc.path}: cannot open this directory")
    root_ino = int(w.meta[0])
    seen = _merge_parts([_part(w), *parts])
    return _Seen(
        _files_of(seen, sc.block_size),
        seen.links,
        seen.skipped,
        seen.not_crossed,
        seen.no_fiemap,
        seen.fiemap_ok,
        root_ino,
    )


def _walk_c(sc: WalkScope) -> _Seen:
    """The walk in C: the one started in the background for this scope, or a new one."""
    started = take_background_walk(sc)
    return _seen_of_c(started.result() if started is not None else run_c_walk(sc))


def _seen_of_c(walk: CWalk) -> _Seen:
    results = walk.results
    files = FileTable.concat([_c_files(r) for r in results])
    if len(results) > 1:
        files = files.sorted_by_ino()
    return _Seen(
        files,
        _concat_links([_c_links(r) for r in results]),
        [(rel, _reason(err)) for r in results for rel, err in r["skipped"]],
        [rel for r in results for rel in r["not_crossed"]],
        [(rel, _reason(err)) for r in results for rel, err in r["no_fiemap"]],
        sum(int(r["fiemap_ok"]) for r in results),
        walk.root_ino,
    )


def of_inodes_in_use(
    progress: Callable[[int, int], None], path: Path | bytes, expected: int | None = None
) -> Callable[[int], None]:
    """``read_live_layout``'s ``progress(done)`` as ``progress(done, total)``, the total being
    the inodes in use on the file system (statvfs) when ``path`` is its mount point; for a
    directory below it, whose share of them nothing tells ahead, ``expected`` (what the last
    snapshot of that directory read), else 0: not known."""
    real = os.path.realpath(os.fsencode(path))
    if find_mount(real).mount_point == real:
        vfs = os.statvfs(path)
        in_use = max(int(vfs.f_files) - int(vfs.f_ffree), 0)
    else:
        in_use = expected or 0

    def report(done: int) -> None:
        progress(done, in_use)

    return report


def read_live_layout(
    path: Path,
    *,
    sync: bool = False,
    fiemap_batch: int = 256,
    workers: int = 0,
    progress: Callable[[int], None] | None = None,
    engine: str = "auto",
) -> Layout:
    """Read the layout of the mounted tree at ``path`` (see the module docstring).

    ``workers`` > 1 walks in that many threads (C walk; they share the pending directories)
    or forked processes (Python walk: the top levels are read first, then the subdirectories
    are shared out); the result is the same as with one (but for the order of the link
    table). ``workers=0`` (the default)
    is one thread per CPU this process may run on, up to 4, for the C walk and 1 for the
    Python walk. ``progress`` is called now and then with the number of inodes read
    so far. ``engine`` is "c" (fsage._live), "python" or "auto" (C where it is built).
    """
    scope = scope_of(
        path,
        sync=sync,
        fiemap_batch=fiemap_batch,
        workers=workers,
        progress=progress,
        engine=engine,
    )
    mount, vfs, block_size = scope.mount, scope.vfs, scope.block_size
    mp, sub = scope.mount_point, scope.sub
    seen = (_walk_c if scope.engine == "c" else _walk_python)(scope)
    if seen.no_fiemap and not seen.fiemap_ok:
        rel, reason = seen.no_fiemap[0]
        raise SourceError(
            f"{os.fsdecode(rel)}: the file system does not answer FIEMAP "
            f"({reason}); the live reader cannot map its files"
        )
    extra_notes: list[str] = []
    try:
        fd = os.open(scope.real, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as e:
        raise SourceError(f"{path}: {e.strerror}") from None
    try:
        free, device_blocks, why = getfsmap_free(fd, block_size, scope.dev)
        uuid, uuid_source = _fs_uuid(fd, mount, vfs)
        label = _fs_label(fd)
    finally:
        os.close(fd)
    if free is None:
        extra_notes.append(f"free space unknown: {why}")

    files = seen.files
    links = seen.links

    scale = block_size
    facts = FsFacts(
        kind=f"live:{mount.fstype}",
        uuid=uuid,
        label=label,
        block_size=block_size,
        # The on-disk block count, as the offline readers and e2freefrag give it, where
        # GETFSMAP maps the device; else what statvfs counts (without the metadata).
        blocks_total=device_blocks or int(vfs.f_blocks) * int(vfs.f_frsize or block_size) // scale,
        blocks_free=int(vfs.f_bfree) * int(vfs.f_frsize or block_size) // scale,
        inodes_total=int(vfs.f_files),
        inodes_free=int(vfs.f_ffree),
        extra={
            "mount_point": os.fsdecode(mp),
            "mount_root": os.fsdecode(mount.root),
            "source": mount.source,
            "mount_options": mount.options,
            "super_options": mount.super_options,
            "subtree": os.fsdecode(sub) if sub else "/",
            "uuid_source": uuid_source,
            "blocks_available": int(vfs.f_bavail),
            "fiemap_sync": sync,
            "skipped": len(seen.skipped),
            "no_fiemap": len(seen.no_fiemap),
            "walk": scope.engine,
            "not_crossed": len(seen.not_crossed),
            "physical_space": ("btrfs logical addresses" if mount.fstype == "btrfs" else "device"),
        },
        free_space_known=free is not None,
    )
    return Layout(
        facts=facts,
        files=files,
        links=links,
        free=free if free is not None else FreeExtents.empty(),
        root_ino=seen.root_ino,
        notes=_notes(seen, extra_notes),
    )
