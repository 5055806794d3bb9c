"""A damaged LFS file is recorded as damaged and the snapshot goes on (issue 13 item 3):
zeroed and garbled indirect blocks and inode table entries, and a mutation run over every
metadata area of LFS images."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from fsage.errors import FsageError
from fsage.lfs import format as fmt
from fsage.lfs.fs import LFS, linear_block, mkfs
from fsage.lfs.fsck import fsck
from fsage.lfs.reader import read_lfs_layout


def build(path: Path) -> dict[str, int]:
    """Three files with singly indirect blocks, small files, directories and a symlink."""
    mkfs(path, segments=40, blocks_per_segment=64, block_size=1024)
    inos: dict[str, int] = {}
    with LFS.open(path) as fs:
        fs.mkdir("d")
        for name, nblk in (("a", 141), ("d/b", 136), ("c", 52)):
            inos[name] = fs.create(name)
            fs.write(name, 0, bytes([len(name)]) * (nblk * 1024))
        for i in range(20):
            inos[f"s{i}"] = fs.create(f"d/s{i}")
            fs.write(f"d/s{i}", 0, b"s" * (300 * i + 1))
        fs.symlink("d/s1", "ln")
    return inos


def blocks_by_ino(layout: object) -> dict[int, tuple[int, int]]:
    files = layout.files  # type: ignore[attr-defined]
    out = {}
    for i, ino in enumerate(files.ino):
        lo, hi = int(files.ext_off[i]), int(files.ext_off[i + 1])
        out[int(ino)] = (int(files.ext_length[lo:hi].sum()), int(files.damaged[i]))
    return out


def indirect_addrs(path: Path, ino: int) -> list[tuple[int, int]]:
    with LFS.open(path, readonly=True) as fs:
        geo = fs.geo
        return [
            (geo.addr_offset(a), linear_block(geo, a))
            for a, kind, _ in fs.file_blocks(ino)
            if kind >= 0
        ]


def test_healthy_image_has_no_damage(tmp_path: Path) -> None:
    img = tmp_path / "a.img"
    inos = build(img)
    got = blocks_by_ino(read_lfs_layout(img))
    assert got[inos["a"]] == (141, 0) and got[inos["d/b"]] == (136, 0) and got[inos["c"]] == (52, 0)
    assert not any(d for _, d in got.values())


@pytest.mark.parametrize("how", ["zeroed", "garbled"])
def test_damaged_indirect_blocks(tmp_path: Path, how: str) -> None:
    img = tmp_path / "a.img"
    inos = build(img)
    rng = random.Random(3)
    with open(img, "r+b") as f:
        for name in ("a", "d/b", "c"):
            for off, _ in indirect_addrs(img, inos[name]):
                f.seek(off)
                f.write(bytes(1024) if how == "zeroed" else rng.randbytes(1024))
    assert not fsck(img).ok
    layout = read_lfs_layout(img)  # the snapshot goes on
    got = blocks_by_ino(layout)
    for name in ("a", "d/b", "c"):
        assert got[inos[name]][1] == 1, name
    assert got[inos["s3"]] == (1, 0)
    assert layout.damaged_files == 3


@pytest.mark.parametrize("how", ["zeroed", "garbled", "outside"])
def test_damaged_inode_table_entries(tmp_path: Path, how: str) -> None:
    img = tmp_path / "a.img"
    inos = build(img)
    with LFS.open(img, readonly=True) as fs:
        tbl = fs.inode(fmt.INO_INOTBL)
        geo = fs.geo
        slot_addr = {}
        for name in ("c", "s5"):
            off = inos[name] * fmt.INODE_SLOT
            addr = fs._get_ptr(tbl, off // geo.block_size)
            slot_addr[name] = geo.addr_offset(addr) + off % geo.block_size
    with open(img, "r+b") as f:
        for name, pos in slot_addr.items():
            f.seek(pos)
            raw = bytearray(f.read(fmt.INODE_SLOT))
            if how == "zeroed":
                raw = bytearray(fmt.INODE_SLOT)
            elif how == "garbled":
                raw[4:60] = random.Random(name).randbytes(56)
            else:  # a direct block pointer outside the log
                i = raw.find(b"\x11", 4)  # field 2 (blkptr), fixed64
                raw[i + 1 : i + 9] = (9999 << 32 | 5).to_bytes(8, "little")
            f.seek(pos)
            f.write(raw)
    assert not fsck(img).ok
    got = blocks_by_ino(read_lfs_layout(img))
    assert got[inos["c"]][1] == 1 and got[inos["s5"]][1] == 1
    # The inode table blocks' checksums fail: every inode they hold is damaged (its slot
    # cannot be trusted), every other one is read whole.
    bad = {inos[n] * fmt.INODE_SLOT // geo.block_size for n in ("c", "s5")}
    for name, ino in inos.items():
        assert got[ino][1] == (ino * fmt.INODE_SLOT // geo.block_size in bad), name
    assert any(ino * fmt.INODE_SLOT // geo.block_size not in bad for ino in inos.values())


def _areas(img: Path) -> dict[str, list[tuple[int, int]]]:
    """(offset, length) of each metadata area of an image."""
    with LFS.open(img, readonly=True) as fs:
        geo = fs.geo
        bs = geo.block_size
        out: dict[str, list[tuple[int, int]]] = {
            "superblock": [(bs, 2 * bs)],
            "checkpoints": [(geo.seg_offset(s), geo.segment_size) for s in (1, 2)],
            "summaries": [
                (geo.seg_offset(s) + geo.data_blocks_per_segment * bs, geo.summary_blocks * bs)
                for s in range(geo.first_log_segment, geo.segments)
                if fs.live[s]
            ],
            "inode blocks": [],
            "indirect blocks": [],
            "directories": [],
        }
        for a, kind, _ in fs.file_blocks(fmt.INO_INOTBL):
            out["inode blocks" if kind == -1 else "indirect blocks"].append(
                (geo.addr_offset(a), bs)
            )
        for ino in fs.inodes():
            for a, kind, _ in fs.file_blocks(ino):
                if kind >= 0:
                    out["indirect blocks"].append((geo.addr_offset(a), bs))
                elif fs.is_dir(ino):
                    out["directories"].append((geo.addr_offset(a), bs))
    return out


_INO_RE = re.compile(r"inode (\d+)")


@pytest.mark.slow
def test_mutants_are_refused_or_recorded_with_damage(tmp_path: Path) -> None:
    """Mutants of every metadata area: each one is refused with a one-line error or read;
    no traceback, no hang, and no file fsck names as damaged is recorded healthy."""
    base = tmp_path / "base.img"
    build(base)
    areas = _areas(base)
    raw = base.read_bytes()
    rng = random.Random(13)
    counts = {"mutants": 0, "refused": 0, "read": 0, "with_damage": 0}
    img = tmp_path / "m.img"
    per_area = 50
    for area, spans in areas.items():
        for _ in range(per_area):
            data = bytearray(raw)
            off, n = rng.choice(spans)
            kind = rng.randrange(3)
            if kind == 0:
                data[off : off + n] = bytes(n)
            elif kind == 1:
                for _ in range(rng.randint(1, 8)):
                    data[off + rng.randrange(n)] = rng.randrange(256)
            else:
                a = off + rng.randrange(n)
                b = min(off + n, a + rng.randint(4, 64))
                data[a:b] = rng.randbytes(b - a)
            img.write_bytes(bytes(data))
            counts["mutants"] += 1
            try:
                layout = read_lfs_layout(img)
            except FsageError as exc:
                assert "\n" not in str(exc)
                counts["refused"] += 1
                continue
            counts["read"] += 1
            rep = fsck(img)
            files = layout.files
            damaged = {int(i) for i, d in zip(files.ino, files.damaged, strict=True) if d}
            damaged |= {
                int(i) for i, d in zip(layout.special.ino, layout.special.damaged, strict=True) if d
            }
            recorded = {int(i) for i in files.ino} | {int(i) for i in layout.special.ino}
            if damaged:
                counts["with_damage"] += 1
            for line in rep.problems:
                named = {int(m) for m in _INO_RE.findall(line)} & recorded
                if not named or "link count" in line or "no name" in line:
                    continue  # a problem of the namespace, not of a file's blocks
                if "block count" in line or "beyond size" in line or "outside the log" in line:
                    assert named & damaged, (area, line)
                elif "claimed by" in line or "summary" in line:
                    assert named & damaged or not named, (area, line)
    print(counts)
    assert counts["mutants"] == per_area * len(areas)
    assert counts["read"] > 50 and counts["with_damage"] > 20
