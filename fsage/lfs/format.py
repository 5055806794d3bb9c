"""The on-disk format of the log-structured file system of seed 003 ("LFS on FUSE", §2).

Everything here is pure encoding: geometry and its constraints, the magic number scan, the
superblock and checkpoint protocol buffers, segment summaries and segment-block numbers.
Numbers are big-endian, timestamps are milliseconds since the epoch (§2.1).

fsage writes format version 2: seed 003's layout with checksums in the segment summary.

- The summary area grows from 24 + 24 N_blk to 24 + 28 N_blk octets (rounded up to blocks):
  after the block records and the 24-octet per-segment metadata comes a table of N_blk
  big-endian CRC-32s, one per data block of the segment (``block_crc``: never 0; 0 marks an
  unused slot and the summary blocks' own).
- Octets 8-11 of the per-segment metadata (reserved in seed 003) hold the CRC-32 of all the
  summary blocks with those four octets zero.

Every block in the log is covered, so file data, directories, indirect blocks and the system
files (inode map, inode vector, inode table) all are. They are checked where read: a mount
gives EIO for a damaged block, fsck names it, and a mount is refused while fsck finds one.
Version 1 images carry no checksums and are refused (``read_geometry``).
"""

from __future__ import annotations

import contextlib
import math
import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

from google.protobuf.message import DecodeError, Message

from fsage.errors import SourceError
from fsage.lfs import lfs_pb2
from fsage.text import disk_text

MAGIC = bytes.fromhex(
    "f67ff2207a499a8a0a6ad1e327c6b21d42e1e790b13205fc257589bc1f7ab305"
    "4f6c8dd5e7c23be9db76150f94a7fac27d01ddfcf273715dad7f88fd5c209232"
    "938065762118d1abf6541cf5548de4b6cf1b3544a12d908f6ec074c6a3e051f3"
    "c103a44e0ca99d3d8d7d8f3fea4d6a53991a94da982a91038a3e7d3ff1bc7513"
    "6643d8341934b64a1714543c9a186cf964d5eb6afe2c72d5e01139597b0395a2"
    "e6a03dee6f032615d2dbe1eecc54f775b4e194b092415d13f6c13267729de3c3"
    "53976f79344fb1204f40c2ba189fec1c9253f6a6849d5bc94bbc08e57913dd46"
    "618898fd63f6366a63dd702563a3d0a4364ae2648d82a6bb0a0cbc2284f4854f"
)
assert len(MAGIC) == 256

# Version 2 is fsage's: segment summaries carry a CRC-32 of themselves and one per block
# (``pack_summary``). Version 1 images (seed 003's plain format) have neither and are refused.
VERSION = 2
MAGIC_SCAN_SECTORS = 1025  # §2.3.1: give up after the first 1025 sectors
MAX_SECTOR_SIZE = 4096  # largest sector size the scan allows for (scan window 1025 x 4096)

# Block types in the segment summary (§2.4.1).
BT_SUMMARY = 0x0
BT_DIRCH = 0x4
BT_INDIRECT = 0x5
BT_DATA = 0xF
SEQ_UNUSED = 0x0FFF
SEQ_MAX = 0x0FFE

# Reserved inode numbers (§2.6, §2.7).
INO_ROOT = 2
INO_INOMAP = 16
INO_INOVEC = 17
INO_INOTBL = 18
INO_UNLINKED = 20
FIRST_USER_INO = 64  # inodes 0-63 are reserved for system files
SYSTEM_FILES = (INO_INOMAP, INO_INOVEC, INO_INOTBL)

N_DIRECT = 12
N_BLKPTR = 15  # 12 direct, singly, doubly, triply indirect
INODE_SLOT = 256  # octets per inode in the inode table (§2.6.3)
INOVEC_SLOT = 16  # octets per inode in the inode vector (§2.6.2)
# fsage's use of the reserved octets 4-7 of an inode vector slot: for a directory, a checksum
# of its file (``dir_checksum``), so that a garbled name is found rather than shown; 0 (what
# images made without it hold) means none is kept.
INOVEC = struct.Struct(">IIQ")  # version, directory checksum, atime
BODY_MAX = 40  # a file body of at most 40 octets may live in the inode (§2.6.3)

S_IFMT = 0o170000
S_IFDIR = 0o040000
S_IFREG = 0o100000
S_IFLNK = 0o120000

# fsage's use of the reserved octets 4-7 of the per-segment summary metadata: bit 31 set means
# a unit was committed in this segment, and the low 31 bits count the sequence numbers the last
# commit covers (records with a smaller sequence belong to complete units; every record written
# before them in earlier segments too). A unit is everything one operation changed: data,
# directories, indirect blocks, inode table. Roll-forward only applies complete units, so a
# write cut off in the middle of a unit, even one that spans segments, opens to the state
# before it. A reader of the plain format that ignores these octets still sees a valid log.
SEGFLAG_COMMIT = 1 << 31
SEGFLAG_COUNT = SEGFLAG_COMMIT - 1

U32 = struct.Struct(">I")
U64 = struct.Struct(">Q")
# next segment, fsage flags, summary CRC-32 (version 2), reserved, timestamp
SEG_META = struct.Struct(">III4xQ")
BLOCK_REC = struct.Struct(">HBxIIIQ")  # type|seq, octet 2, reserved, ino, ver, offset, ctime


def dir_checksum(raw: bytes | bytearray) -> int:
    """A directory file's checksum as the inode vector keeps it: CRC-32, never 0."""
    return zlib.crc32(raw) or 1


def sbn(segment: int, block: int) -> int:
    """Segment-block number: ``(segment << 32) | block`` (§2.1)."""
    return (segment << 32) | block


def sbn_split(addr: int) -> tuple[int, int]:
    return addr >> 32, addr & 0xFFFFFFFF


class LfsError(SourceError):
    """An LFS image is not valid, damaged, or cannot hold the request."""


class LfsNoSpace(LfsError):
    """The log has no clean segment left even after cleaning."""


class LfsChecksumError(LfsError):
    """A block read from the image does not match the checksum its segment summary keeps."""


@contextlib.contextmanager
def damaged_as_error(where: str) -> Iterator[None]:
    """Turn a decoding failure deep in a damaged image into one clear LfsError."""
    try:
        yield
    except (
        struct.error,
        IndexError,
        KeyError,
        ValueError,
        OverflowError,
        RecursionError,
        MemoryError,
        UnicodeError,
    ) as exc:
        raise LfsError(f"{where}: damaged image ({type(exc).__name__}: {exc})") from None


@dataclass(frozen=True)
class Geometry:
    """Static metrics from the superblock plus the quantities derived from them."""

    sector_size: int
    sectors_per_block: int
    blocks_per_segment: int
    segments: int
    first_log_segment: int
    checkpoint_segments: tuple[int, int]
    segments_per_checkpoint: int
    summary_blocks: int
    cleaning_policy: str = "greedy"
    checkpoint_interval: int = 8
    uuid: str = ""  # fsage's superblock field 102; "" in images made without it

    @property
    def block_size(self) -> int:
        return self.sector_size * self.sectors_per_block

    @property
    def segment_size(self) -> int:
        return self.block_size * self.blocks_per_segment

    @property
    def data_blocks_per_segment(self) -> int:
        return self.blocks_per_segment - self.summary_blocks

    @property
    def pointers_per_block(self) -> int:
        return self.block_size // 8

    @property
    def image_size(self) -> int:
        return self.segments * self.segment_size

    @property
    def log_segments(self) -> int:
        return self.segments - self.first_log_segment

    def seg_offset(self, segment: int) -> int:
        return segment * self.segment_size

    def addr_offset(self, addr: int) -> int:
        seg, blk = sbn_split(addr)
        return seg * self.segment_size + blk * self.block_size

    def valid_data_addr(self, addr: int) -> bool:
        seg, blk = sbn_split(addr)
        return self.first_log_segment <= seg < self.segments and blk < self.data_blocks_per_segment

    def to_json(self) -> dict[str, object]:
        return {
            "sector_size": self.sector_size,
            "sectors_per_block": self.sectors_per_block,
            "block_size": self.block_size,
            "blocks_per_segment": self.blocks_per_segment,
            "segment_size": self.segment_size,
            "segments": self.segments,
            "first_log_segment": self.first_log_segment,
            "checkpoint_segments": list(self.checkpoint_segments),
            "segments_per_checkpoint": self.segments_per_checkpoint,
            "summary_blocks": self.summary_blocks,
            "cleaning_policy": self.cleaning_policy,
            "checkpoint_interval": self.checkpoint_interval,
            "uuid": self.uuid,
        }


def summary_blocks_for(blocks_per_segment: int, block_size: int) -> int:
    """N_segsummaryblk = ceil((24 + 28 N_blk) / LEN_blk): seed 003's 24 + 24 N_blk (§2.4)
    plus version 2's table of a 4-octet CRC-32 per block after the per-segment metadata."""
    return math.ceil((24 + 28 * blocks_per_segment) / block_size)


def block_crc(data: bytes | bytearray | memoryview) -> int:
    """A block's checksum as its segment summary keeps it: CRC-32, never 0 (0: no block)."""
    return zlib.crc32(data) or 1


def checkpoint_len_max(segments: int) -> int:
    """Largest encoded checkpoint including its 4-octet length.

    Seed 003 gives 4 + 461 + 14 N_seg; a SegUsageRec is 14 octets of fields plus two octets
    of tag and length inside the repeated field, and three InodeSimp of 15 fixed64 pointers take
    456 octets, so fsage reserves 4 + 470 + 16 N_seg: the exact size of a checkpoint whose
    fields all hold their largest values (a test checks it against the encoder).
    """
    return 4 + 470 + 16 * segments


def make_geometry(
    *,
    sector_size: int,
    sectors_per_block: int,
    blocks_per_segment: int,
    segments: int,
    disk_sectors: int | None = None,
    cleaning_policy: str = "greedy",
    checkpoint_interval: int = 8,
) -> Geometry:
    """Check constraints (1)-(5) of seed 003 §2.2 and lay out the system segments."""
    block_size = sector_size * sectors_per_block
    if (
        disk_sectors is not None
        and segments * blocks_per_segment * sectors_per_block > disk_sectors
    ):
        raise LfsError(
            f"constraint (1): {segments} segments x {blocks_per_segment} blocks x "
            f"{sectors_per_block} sectors exceeds the disk's {disk_sectors} sectors"
        )
    if not 16 <= segments <= 2**20:
        raise LfsError(f"constraint (2): segment count {segments} not in 16..{2**20}")
    if not 8 <= blocks_per_segment <= 2**12:
        raise LfsError(f"constraint (3): blocks per segment {blocks_per_segment} not in 8..4096")
    # Constraint (4) is printed as 1024 <= N_sector/blk, but the magic number at block 1 must
    # be found within the first 1025 sectors (§2.3.1), which is only possible when block 1
    # starts at sector 1024 or earlier: the bound is an upper one, 1 <= N_sector/blk <= 1024.
    if not 1 <= sectors_per_block <= 1024:
        raise LfsError(f"constraint (4): sectors per block {sectors_per_block} not in 1..1024")
    if block_size < 512:
        raise LfsError(f"constraint (5): block size {block_size} is below 512 octets")
    if sector_size < 256 or sector_size > MAX_SECTOR_SIZE:
        # The magic number is the first 256 octets of a sector.
        raise LfsError(f"sector size {sector_size} not in 256..{MAX_SECTOR_SIZE}")
    if block_size % 8:
        raise LfsError(f"block size {block_size} is not a multiple of 8")
    summary = summary_blocks_for(blocks_per_segment, block_size)
    cp_blocks = math.ceil(checkpoint_len_max(segments) / block_size) + 1  # + duplicate stamp
    cp_segs = math.ceil(cp_blocks / blocks_per_segment)
    first_log = 1 + 2 * cp_segs
    if segments - first_log < 8:
        raise LfsError(
            f"{segments} segments leave {segments - first_log} log segments; at least 8 needed"
        )
    if blocks_per_segment - summary < 2:
        raise LfsError("segment too small for its summary")
    if checkpoint_interval < 1:
        raise LfsError("checkpoint interval must be at least 1 segment")
    from fsage.lfs.cleaner import POLICIES  # local: cleaner imports this module

    if cleaning_policy not in POLICIES:
        raise LfsError(
            f"unknown cleaning policy {cleaning_policy!r} (one of {', '.join(POLICIES)})"
        )
    return Geometry(
        sector_size=sector_size,
        sectors_per_block=sectors_per_block,
        blocks_per_segment=blocks_per_segment,
        segments=segments,
        first_log_segment=first_log,
        checkpoint_segments=(1, 1 + cp_segs),
        segments_per_checkpoint=cp_segs,
        summary_blocks=summary,
        cleaning_policy=cleaning_policy,
        checkpoint_interval=checkpoint_interval,
    )


def encode_pb(msg: Message) -> bytes:
    """``msg`` as seed 003 stores protocol buffers: a 4-octet big-endian length, then it."""
    data: bytes = msg.SerializeToString()
    return U32.pack(len(data)) + data


def parse_prefixed(
    raw: bytes | bytearray | memoryview,
    msg: Message,
    limit: int,
    *,
    offset: int = 0,
    empty_ok: bool = True,
) -> str | None:
    """Decode into ``msg`` the length-prefixed message (``encode_pb``) at ``offset`` of
    ``raw``; its length must be at most ``limit`` (and not 0 unless ``empty_ok``) and fit in
    ``raw``. Returns None, or why it cannot be decoded."""
    if len(raw) < offset + 4:
        return "cut off"
    (n,) = U32.unpack_from(raw, offset)
    if n > limit or n > len(raw) - offset - 4 or (n == 0 and not empty_ok):
        return f"bad length {n}"
    try:
        msg.ParseFromString(bytes(raw[offset + 4 : offset + 4 + n]))
    except DecodeError:
        return "does not decode"
    return None


def superblock_bytes(geo: Geometry) -> bytes:
    sb = lfs_pb2.Superblock(
        version=VERSION,
        noctet_sector=geo.sector_size,
        nsector_blk=geo.sectors_per_block,
        nblk_seg=geo.blocks_per_segment,
        nseg_disk=geo.segments,
        first_logseg=geo.first_log_segment,
        checkpoint_seg=list(geo.checkpoint_segments),
        nseg_checkpoint=geo.segments_per_checkpoint,
        nblk_segsummary=geo.summary_blocks,
        cleaning_policy=geo.cleaning_policy,
        checkpoint_interval=geo.checkpoint_interval,
    )
    if geo.uuid:
        sb.uuid = geo.uuid
    return encode_pb(sb)


def find_magic(fd: int) -> int:
    """Byte offset of block 1: the first sector (of the first 1025) that starts with MAGIC.

    The sector size is unknown before the superblock is read, so candidate offsets are every
    multiple of 256 octets up to 1024 sectors of the largest sector size; the superblock is
    then checked to say the same block size. Returns 0 when there is no magic number.
    """
    window = os.pread(fd, (MAGIC_SCAN_SECTORS - 1) * MAX_SECTOR_SIZE + len(MAGIC), 0)
    pos = window.find(MAGIC, 1)
    while pos != -1:
        if pos % 256 == 0:
            return pos
        pos = window.find(MAGIC, pos + 1)
    return 0


def is_lfs_image(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` holds the LFS magic number where seed 003 says to scan for it."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        return find_magic(fd) > 0
    except OSError:
        return False
    finally:
        os.close(fd)


def read_geometry(fd: int, image_size: int, where: str) -> Geometry:
    """Scan for the magic number, decode and check the superblock in block 2."""
    block_size = find_magic(fd)
    if not block_size:
        raise LfsError(f"{where}: not an LFS image (no magic number in the first 1025 sectors)")
    raw = os.pread(fd, block_size, 2 * block_size)
    if len(raw) < 4:
        raise LfsError(f"{where}: truncated image (no superblock)")
    sb = lfs_pb2.Superblock()
    why = parse_prefixed(raw, sb, len(raw))
    if why is not None:
        raise LfsError(f"{where}: the superblock in block 2 is damaged ({why})")
    required = (
        "version",
        "noctet_sector",
        "nsector_blk",
        "nblk_seg",
        "nseg_disk",
        "first_logseg",
        "nseg_checkpoint",
        "nblk_segsummary",
    )
    missing = [f for f in required if not sb.HasField(f)]
    if missing:
        raise LfsError(f"{where}: superblock lacks {', '.join(missing)}")
    if sb.version == 1:
        raise LfsError(
            f"{where}: LFS format version 1 (no checksums); this fsage reads version "
            f"{VERSION} only: copy the files out with the fsage that made it"
        )
    if sb.version != VERSION:
        raise LfsError(f"{where}: unsupported LFS version {sb.version}")
    if sb.noctet_sector * sb.nsector_blk != block_size:
        raise LfsError(
            f"{where}: superblock block size {sb.noctet_sector}x{sb.nsector_blk} does not "
            f"match the magic number at octet {block_size}"
        )
    if len(sb.checkpoint_seg) != 2:
        raise LfsError(f"{where}: superblock lists {len(sb.checkpoint_seg)} checkpoints, not 2")
    policy = sb.cleaning_policy if sb.HasField("cleaning_policy") else "greedy"
    interval = sb.checkpoint_interval if sb.HasField("checkpoint_interval") else 8
    try:
        expect = make_geometry(
            sector_size=sb.noctet_sector,
            sectors_per_block=sb.nsector_blk,
            blocks_per_segment=sb.nblk_seg,
            segments=sb.nseg_disk,
            cleaning_policy=policy,
            checkpoint_interval=max(1, interval),
        )
    except LfsError as exc:
        raise LfsError(f"{where}: superblock: {exc}") from None
    cps = tuple(sb.checkpoint_seg)
    geo = Geometry(
        sector_size=sb.noctet_sector,
        sectors_per_block=sb.nsector_blk,
        blocks_per_segment=sb.nblk_seg,
        segments=sb.nseg_disk,
        first_log_segment=sb.first_logseg,
        checkpoint_segments=(cps[0], cps[1]),
        segments_per_checkpoint=sb.nseg_checkpoint,
        summary_blocks=sb.nblk_segsummary,
        cleaning_policy=policy,
        checkpoint_interval=max(1, interval),
        # protobuf hands back bytes for a string field that is not UTF-8: one rule for both
        uuid=disk_text(sb.uuid) if sb.HasField("uuid") else "",
    )
    if geo.summary_blocks != expect.summary_blocks:
        raise LfsError(f"{where}: superblock summary block count {geo.summary_blocks} is wrong")
    need = math.ceil(
        (math.ceil(checkpoint_len_max(geo.segments) / block_size) + 1) / geo.blocks_per_segment
    )
    regions = sorted(cps)
    if (
        geo.segments_per_checkpoint < need
        or regions[0] < 1
        or regions[0] + geo.segments_per_checkpoint > regions[1]
        or regions[1] + geo.segments_per_checkpoint > geo.first_log_segment
        or geo.first_log_segment + 8 > geo.segments
    ):
        raise LfsError(f"{where}: superblock checkpoint regions or first log segment invalid")
    if image_size < geo.image_size:
        raise LfsError(
            f"{where}: truncated image ({image_size} octets, the superblock says {geo.image_size})"
        )
    return geo


# --- segment summaries ------------------------------------------------------------------


@dataclass
class BlockRec:
    """Per-block metadata of one block in a segment summary (§2.4.1, §2.5.2, §2.5.3)."""

    btype: int
    seq: int
    ino: int = 0
    version: int = 0
    offset: int = 0
    ctime: int = 0
    level: int = 0  # indirect blocks: 0 block pointers, 1 singly, 2 doubly indirect pointers

    def pack(self) -> bytes:
        return BLOCK_REC.pack(
            (self.btype << 12) | (self.seq & 0x0FFF),
            (self.level & 3) << 6,
            self.ino,
            self.version,
            self.offset,
            self.ctime,
        )


UNUSED_REC = BlockRec(BT_SUMMARY, SEQ_UNUSED)


def pack_summary(
    geo: Geometry,
    recs: list[BlockRec | None],
    next_seg: int,
    stamp: int,
    flags: int,
    crcs: list[int],
) -> bytes:
    """The summary blocks of a segment: records, the 24-octet per-segment metadata, then
    ``crcs`` (``block_crc`` of each data block, 0 for an unused one). The metadata's CRC-32
    covers all the summary blocks with its own four octets zero."""
    nblk = geo.blocks_per_segment
    out = bytearray(geo.summary_blocks * geo.block_size)
    unused = UNUSED_REC.pack()
    data_blocks = geo.data_blocks_per_segment
    for i in range(nblk):
        if i >= data_blocks:
            continue  # records of the summary blocks themselves are all zeros
        rec = recs[i] if i < len(recs) else None
        out[24 * i : 24 * i + 24] = rec.pack() if rec is not None else unused
    table = 24 * nblk + 24
    for i in range(min(data_blocks, len(recs), len(crcs))):
        if recs[i] is not None:
            U32.pack_into(out, table + 4 * i, crcs[i])
    SEG_META.pack_into(out, 24 * nblk, next_seg, flags, 0, stamp)
    U32.pack_into(out, 24 * nblk + 8, zlib.crc32(out))
    return bytes(out)


@dataclass
class Summary:
    recs: list[BlockRec | None]  # None: unused slot (sequence 0x0FFF) or a summary block
    next_seg: int
    flags: int
    stamp: int
    crcs: list[int]  # block_crc of each data block; 0 for an unused one


def unpack_summary(geo: Geometry, raw: bytes, where: str = "segment summary") -> Summary:
    """Decode a summary; LfsError when its CRC-32 does not match (damaged, or a segment
    never written)."""
    nblk = geo.blocks_per_segment
    next_seg, flags, crc, stamp = SEG_META.unpack_from(raw, 24 * nblk)
    check = bytearray(raw)
    U32.pack_into(check, 24 * nblk + 8, 0)
    if zlib.crc32(check) != crc:
        raise LfsChecksumError(f"{where}: checksum mismatch (damaged, or never written)")
    recs: list[BlockRec | None] = []
    for i in range(geo.data_blocks_per_segment):
        tseq, b2, ino, ver, off, ctime = BLOCK_REC.unpack_from(raw, 24 * i)
        seq = tseq & 0x0FFF
        if seq == SEQ_UNUSED:
            recs.append(None)
            continue
        recs.append(BlockRec(tseq >> 12, seq, ino, ver, off, ctime, b2 >> 6))
    table = 24 * nblk + 24
    crcs = [U32.unpack_from(raw, table + 4 * i)[0] for i in range(geo.data_blocks_per_segment)]
    return Summary(recs, next_seg, flags, stamp, crcs)


def read_summary(fd: int, geo: Geometry, segment: int) -> Summary:
    off = geo.seg_offset(segment) + geo.data_blocks_per_segment * geo.block_size
    raw = os.pread(fd, geo.summary_blocks * geo.block_size, off)
    if len(raw) < geo.summary_blocks * geo.block_size:
        raise LfsError(f"truncated image: summary of segment {segment} is cut off")
    return unpack_summary(geo, raw, f"summary of segment {segment}")


# --- checkpoints ------------------------------------------------------------------------


def checkpoint_region(geo: Geometry, which: int) -> tuple[int, int]:
    """(first octet, octet length) of checkpoint region ``which`` (0 or 1)."""
    seg = geo.checkpoint_segments[which]
    return geo.seg_offset(seg), geo.segments_per_checkpoint * geo.segment_size


#: A segment usage record as Checkpoint encodes it (field 6, length 14): SegUsageRec's
#: nblks_live (field 1, fixed32) and mtime (field 2, fixed64), both always present.
_SEGUSAGE_FIELD = struct.Struct("<BBBIBQ")


def segusage_octets(live: list[int], mtime: list[int]) -> bytes:
    """The segment usage table as Checkpoint's encoded field 6: the octets
    ``SegUsageRec(nblks_live=max(0, live), mtime=mtime)`` records give, packed without
    building a message per segment (a checkpoint's costliest part, and it has one per
    segment of the disk)."""
    pack = _SEGUSAGE_FIELD.pack
    return b"".join(
        [pack(0x32, 14, 0x0D, max(0, lv), 0x11, mt) for lv, mt in zip(live, mtime, strict=True)]
    )


def write_checkpoint(
    fd: int, geo: Geometry, which: int, cp: lfs_pb2.Checkpoint, segusage: bytes = b""
) -> None:
    """The protocol buffer at the region's start, then the timestamp duplicated in the first
    eight octets of the last block of the region's last segment (§2.3.2). ``segusage``: the
    segment usage table already encoded (``segusage_octets``), for a ``cp`` without one (its
    field comes last, so the octets are those of the whole message)."""
    start, length = checkpoint_region(geo, which)
    body = cp.SerializeToString() + segusage
    data = U32.pack(len(body)) + body
    if len(data) > length - geo.block_size:
        raise LfsError("checkpoint does not fit its region")
    os.pwrite(fd, data, start)
    os.pwrite(fd, U64.pack(cp.timestamp), start + length - geo.block_size)


def read_checkpoint(fd: int, geo: Geometry, which: int) -> tuple[lfs_pb2.Checkpoint | None, str]:
    """The checkpoint in region ``which`` if it is valid, else None and the reason."""
    start, length = checkpoint_region(geo, which)
    raw = os.pread(fd, length, start)
    if len(raw) < length:
        return None, "region cut off"
    cp = lfs_pb2.Checkpoint()
    # The last block holds the duplicate timestamp.
    why = parse_prefixed(raw, cp, length - geo.block_size - 4, empty_ok=False)
    if why is not None:
        return None, why
    if not cp.HasField("timestamp"):
        return None, "no timestamp"
    (dup,) = U64.unpack_from(raw, length - geo.block_size)
    if dup != cp.timestamp:
        return None, "timestamp does not match the duplicate in the last block"
    if len(cp.segusage) != geo.segments:
        return None, f"segment usage table has {len(cp.segusage)} records, not {geo.segments}"
    for name in ("inode_inomap", "inode_inovec", "inode_inotbl"):
        if not cp.HasField(name) or len(getattr(cp, name).blkptr) != N_BLKPTR:
            return None, f"{name} missing or without {N_BLKPTR} block pointers"
    if not geo.first_log_segment <= cp.next_seg < geo.segments:
        return None, f"next segment {cp.next_seg} outside the log"
    return cp, ""


def preferred_checkpoint(
    fd: int, geo: Geometry, where: str
) -> tuple[int, lfs_pb2.Checkpoint, list[str]]:
    """Seed 003 §2.3.2: the only valid checkpoint, or the newer of two valid ones."""
    found: list[tuple[int, lfs_pb2.Checkpoint]] = []
    notes: list[str] = []
    for which in (0, 1):
        cp, why = read_checkpoint(fd, geo, which)
        if cp is None:
            notes.append(f"checkpoint {which} invalid: {why}")
        else:
            found.append((which, cp))
    if not found:
        raise LfsError(f"{where}: both checkpoints are invalid ({'; '.join(notes)})")
    which, cp = max(found, key=lambda t: t[1].timestamp)
    return which, cp, notes
