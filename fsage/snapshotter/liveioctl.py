"""The ioctls the live reader rests on, decoded into numpy columns: a file's extents
(``FS_IOC_FIEMAP``, merged into blocks with fsage's extent flags), the free space and device
size (``FS_IOC_GETFSMAP``), and the file system's identity (``FS_IOC_GETFSUUID``, blkid or
``f_fsid``; ``FS_IOC_GETFSLABEL``). What each returns and why is described in
``fsage.snapshotter.live``.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct

import numpy as np
import numpy.typing as npt

from fsage.layout import (
    EXTENT_DELALLOC,
    EXTENT_ENCODED,
    EXTENT_INLINE,
    EXTENT_SHARED,
    EXTENT_UNWRITTEN,
    FreeExtents,
)
from fsage.snapshotter.livewalk import (
    MountInfo,
)

# ioctl request numbers (asm-generic encoding, as on x86-64 and arm64).
FS_IOC_FIEMAP = 0xC020660B
FS_IOC_GETFSMAP = 0xC0C0583B
FS_IOC_GETVERSION = 0x80087601
FS_IOC_GETFLAGS = 0x80086601  # _IOR('f', 1, long); the kernel writes an int
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
FIEMAP_HEAD = struct.Struct("<QQIIII")
FIEMAP_EXT_SIZE = 56
FIEMAP_EXTENT_DTYPE = np.dtype(
    {
        "names": ["logical", "physical", "length", "flags"],
        "formats": ["<u8", "<u8", "<u8", "<u4"],
        "offsets": [0, 8, 16, 40],
        "itemsize": FIEMAP_EXT_SIZE,
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


def fiemap_extents(fd: int, *, sync: bool = False, batch: int = 256) -> npt.NDArray[np.void]:
    """All FIEMAP extents of an open file, unmerged, as a FIEMAP_EXTENT_DTYPE array (bytes)."""
    buf = bytearray(FIEMAP_HEAD.size + FIEMAP_EXT_SIZE * batch)
    raw = bytearray()
    fiemap_into(fd, buf, batch, FIEMAP_FLAG_SYNC if sync else 0, raw)
    return np.frombuffer(bytes(raw), FIEMAP_EXTENT_DTYPE)


def fiemap_into(fd: int, buf: bytearray, batch: int, flags: int, out: bytearray) -> int:
    """Append the raw fiemap_extent records of ``fd`` to ``out``; return how many.

    On an error nothing is appended and the OSError propagates.
    """
    start = 0
    total = 0
    mark = len(out)
    while True:
        FIEMAP_HEAD.pack_into(buf, 0, start, FIEMAP_MAX_OFFSET - start, flags, 0, batch, 0)
        try:
            fcntl.ioctl(fd, FS_IOC_FIEMAP, buf, True)
        except OSError:
            del out[mark:]
            raise
        mapped = int.from_bytes(buf[20:24], "little")
        if mapped == 0:
            return total
        end = 32 + FIEMAP_EXT_SIZE * mapped
        out += buf[32:end]
        total += mapped
        last = end - FIEMAP_EXT_SIZE
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


def fs_uuid(fd: int, mount: MountInfo, vfs: os.statvfs_result) -> tuple[str, str]:
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


def fs_label(fd: int) -> str:
    buf = bytearray(256)
    try:
        fcntl.ioctl(fd, FS_IOC_GETFSLABEL, buf, True)
    except OSError:
        return ""
    return bytes(buf).split(b"\0", 1)[0].decode("utf-8", "replace")
