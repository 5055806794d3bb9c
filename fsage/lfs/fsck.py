"""Check an LFS image against everything seed 003 lets one check.

Summaries against block pointers, live counts against the segment usage table, the directory
tree and link counts, the inode bitmap, and block counts and sizes. Each problem is one line.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from fsage.lfs import format as fmt
from fsage.lfs.format import S_IFDIR, S_IFMT, LfsError
from fsage.lfs.fs import LFS, LfsOpError


@dataclass
class FsckReport:
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    files: int = 0
    directories: int = 0
    blocks: int = 0
    #: Segments whose usage-table time is newer than their blocks (a read-write mount sets
    #: it from the blocks: ``LFS.fix_usage_times``).
    times: list[int] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def only_times(self) -> bool:
        """Whether every problem is a usage-table time (which a mount repairs)."""
        return len(self.problems) == len(self.times) > 0

    def to_json(self) -> dict[str, object]:
        return {
            "ok": self.ok,
            "problems": self.problems,
            "notes": self.notes,
            "files": self.files,
            "directories": self.directories,
            "blocks": self.blocks,
        }


#: The latest time in milliseconds that nanoseconds in 64 signed bits hold (April 2262): the
#: kernel's and the mount's times end there.
MAX_TIME_MS = (2**63 - 1) // 1_000_000


def fsck(path: str | os.PathLike[str]) -> FsckReport:
    """Open read-only (checkpoint choice and roll-forward as a mount would) and check."""
    rep = FsckReport()
    try:
        fs = LFS.open(path, readonly=True)
    except fmt.LfsChecksumError as exc:
        # a damaged block the open needs (inode table, map, a summary): named, not a crash
        rep.problems.append(f"cannot open: {exc}")
        return rep
    try:
        rep.notes.extend(fs.notes)
        rep.problems.extend(fs.damaged_sys.values())
        if fs.rolled_forward:
            rep.notes.append(f"rolled forward over {fs.rolled_forward} segment(s)")
        with fmt.damaged_as_error(str(path)):
            _check(fs, rep)
    finally:
        fs.close()
    return rep


def _check(fs: LFS, rep: FsckReport) -> None:
    geo = fs.geo
    p = rep.problems
    owner: dict[int, tuple[int, int, int]] = {}
    live = [0] * geo.segments

    def claim(ino: int, addr: int, kind: int, off: int) -> None:
        if not geo.valid_data_addr(addr):
            p.append(f"inode {ino}: block pointer {addr:#x} outside the log")
            return
        if addr in owner:
            o = owner[addr]
            p.append(f"block {addr:#x} claimed by inode {o[0]} and inode {ino}")
            return
        owner[addr] = (ino, kind, off)
        live[addr >> 32] += 1

    for sino in fmt.SYSTEM_FILES:
        try:
            for addr, kind, off in fs.file_blocks(sino):
                claim(sino, addr, kind, off)
        except LfsError as exc:
            p.append(f"system file {sino}: {exc}")
    inos = list(fs.inodes())
    modes: dict[int, int] = {}
    nlink: dict[int, int] = {}
    for ino in inos:
        try:
            inode = fs.inode(ino)
        except (LfsError, LfsOpError) as exc:
            p.append(f"inode {ino}: {exc}")
            continue
        modes[ino] = inode.mode
        nlink[ino] = inode.nlink
        for what, ms in (("mtime", inode.mtime), ("ctime", inode.ctime), ("atime", inode.atime)):
            if ms > MAX_TIME_MS:  # nothing fsage writes (the kernel's times end in 2262)
                p.append(f"inode {ino}: {what} {ms} ms is past what a time can be (2262)")
        data = 0
        maxoff = -1
        try:
            for addr, kind, off in fs.file_blocks(ino):
                claim(ino, addr, kind, off)
                if kind == -1:
                    data += 1
                    maxoff = max(maxoff, off)
        except LfsError as exc:
            p.append(f"inode {ino}: {exc}")
            continue
        if data != inode.blocks:
            p.append(f"inode {ino}: block count {inode.blocks} but {data} data blocks")
        if maxoff >= 0 and maxoff * geo.block_size >= inode.size:
            p.append(f"inode {ino}: data block at offset {maxoff} beyond size {inode.size}")
    rep.blocks = len(owner)
    # Summaries must describe every reachable block as the pointers do.
    by_seg: dict[int, list[int]] = {}
    for addr in owner:
        by_seg.setdefault(addr >> 32, []).append(addr)
    for seg, addrs in sorted(by_seg.items()):
        try:
            summ = fmt.read_summary(fs.fd, geo, seg)
        except LfsError as exc:
            p.append(str(exc))
            continue
        segraw = os.pread(fs.fd, geo.data_blocks_per_segment * geo.block_size, geo.seg_offset(seg))
        for addr in sorted(addrs):
            ino, kind, off = owner[addr]
            blk = addr & 0xFFFFFFFF
            rec = summ.recs[blk]
            want_type = fmt.BT_DATA if kind == -1 else fmt.BT_INDIRECT
            if rec is None:
                p.append(f"segment {seg} block {blk}: summary says unused, inode {ino} uses it")
                continue
            block = segraw[blk * geo.block_size : (blk + 1) * geo.block_size]
            if fmt.block_crc(block) != summ.crcs[blk]:
                p.append(
                    f"segment {seg} block {blk}: checksum mismatch (inode {ino} offset {off}): "
                    "the block is damaged"
                )
            version = fs.inode(ino).version
            if (
                (rec.btype, rec.ino, rec.offset) != (want_type, ino, off)
                or (rec.version != version)
                or (kind >= 0 and rec.level != kind)
            ):
                p.append(
                    f"segment {seg} block {blk}: summary (type {rec.btype:x}, inode {rec.ino}, "
                    f"version {rec.version}, offset {rec.offset}) does not match inode {ino} "
                    f"offset {off}"
                )
    # Live counts against the segment usage table.
    if not fs.rolled_forward:
        for seg in range(geo.first_log_segment, geo.segments):
            if fs.live[seg] != live[seg]:
                p.append(
                    f"segment {seg}: usage table says {fs.live[seg]} live blocks, "
                    f"{live[seg]} reachable"
                )
    _check_summaries(fs, rep)
    for seg in range(geo.first_log_segment):
        if live[seg]:
            p.append(f"segment {seg} is a system segment but holds {live[seg]} file blocks")
    # Bitmap: system inodes always in use.
    for ino in range(fmt.FIRST_USER_INO):
        if not fs._bitmap_get(ino):
            p.append(f"inode bitmap: system inode {ino} marked free")
    # Directory tree and link counts.
    names: dict[int, int] = {}
    subdirs: dict[int, int] = {}
    parents: dict[int, list[int]] = {}
    seen = {fmt.INO_ROOT}
    stack = [fmt.INO_ROOT]
    for d in (fmt.INO_ROOT, fmt.INO_UNLINKED):
        if modes.get(d, 0) & S_IFMT != S_IFDIR:
            p.append(f"inode {d} is not a directory")
            return
    if fmt.INO_UNLINKED not in stack:
        stack.append(fmt.INO_UNLINKED)
        seen.add(fmt.INO_UNLINKED)
    while stack:
        d = stack.pop()
        try:
            entries = fs.directory(d)
        except (LfsError, LfsOpError) as exc:
            p.append(f"directory {d}: {exc}")
            continue
        rep.directories += 1
        for name, ino in entries.items():
            if ino not in modes:
                p.append(f"directory {d}: entry {name!r} names free inode {ino}")
                continue
            names[ino] = names.get(ino, 0) + 1
            if modes[ino] & S_IFMT == S_IFDIR:
                subdirs[d] = subdirs.get(d, 0) + 1
                parents.setdefault(ino, []).append(d)
                if ino in seen:
                    p.append(f"directory {ino} has more than one parent")
                    continue
                seen.add(ino)
                stack.append(ino)
            else:
                rep.files += 1
    for ino, mode in modes.items():
        if ino in (fmt.INO_ROOT, fmt.INO_UNLINKED):
            want = 2 + subdirs.get(ino, 0)
        elif mode & S_IFMT == S_IFDIR:
            want = 2 + subdirs.get(ino, 0)
            if ino not in seen:
                p.append(f"directory {ino} is not reachable from the root")
        else:
            want = names.get(ino, 0)
            if want == 0:
                p.append(f"inode {ino} is in use but has no name")
        if nlink[ino] != want:
            p.append(f"inode {ino}: link count {nlink[ino]}, expected {want}")


def _check_summaries(fs: LFS, rep: FsckReport) -> None:
    """What seed 003 forbids in a written segment's summary and its usage record: a next
    segment outside the log (roll-forward would follow it there), and a usage-table time
    newer than every block the segment holds (the table keeps the newest data creation
    time)."""
    geo = fs.geo
    for seg in range(geo.first_log_segment, geo.segments):
        try:
            summ = fmt.read_summary(fs.fd, geo, seg)
        except LfsError:
            continue  # said above for segments that hold blocks
        if not summ.stamp:
            continue  # never written (zeros)
        recs = [r for r in summ.recs if r is not None and r.btype != fmt.BT_SUMMARY]
        if not geo.first_log_segment <= summ.next_seg < geo.segments:
            rep.problems.append(
                f"segment {seg}: summary names segment {summ.next_seg} as the next one, "
                f"outside the log ({geo.first_log_segment}-{geo.segments - 1})"
            )
        newest = max((r.ctime for r in recs), default=0)
        if fs.live[seg] > 0 and fs.mtime[seg] > newest:
            rep.times.append(seg)
            rep.problems.append(
                f"segment {seg}: usage table time {fs.mtime[seg]} ms is newer than its "
                f"newest block ({newest} ms)"
            )
