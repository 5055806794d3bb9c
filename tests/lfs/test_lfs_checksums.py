"""Format version 2's checksums: a byte flipped in any kind of block in the log (file data,
an indirect block, a directory, the inode table, map and vector) or in a segment summary is
found by fsck, refuses a mount, and a read of a damaged data block gives EIO, never other
bytes. Oracles: where the test flipped the byte, the content it wrote, the kernel's errno."""

from __future__ import annotations

import errno
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from fsage.cli import main
from fsage.errors import FsageError
from fsage.lfs import format as fmt
from fsage.lfs import lfs_pb2
from fsage.lfs.fs import LFS, mkfs
from fsage.lfs.fsck import fsck
from fsage.lfs.mount import fuse_available
from tests.lfs.test_lfs_damage_mount import _unmount

REPO = Path(__file__).resolve().parents[2]
BS = 1024
KINDS = ("data", "indirect", "directory", "inode table", "inode map", "inode vector", "summary")


def build(path: Path) -> dict[str, bytes]:
    mkfs(path, size=4 << 20, blocks_per_segment=32, block_size=BS)
    files = {
        "big": bytes(range(256)) * (20 * BS // 256),  # 20 blocks: singly indirect
        "d/small": b"s" * (3 * BS + 5),
        "d/other": b"o" * (2 * BS),
    }
    with LFS.open(path) as fs:
        fs.mkdir("d")
        for i in range(40):  # a directory of more than one block
            fs.create(f"d/n{i:03d}-{'x' * 40}")
        for name, data in files.items():
            fs.create(name)
            fs.write(name, 0, data)
    return files


def target(path: Path, kind: str) -> tuple[int, str]:
    """(octet offset in the image, what fsck must name) of a byte of block ``kind``."""
    with LFS.open(path, readonly=True) as fs:
        geo = fs.geo
        if kind == "summary":
            seg = max(s for s in range(geo.first_log_segment, geo.segments) if fs.live[s])
            off = geo.seg_offset(seg) + geo.data_blocks_per_segment * BS + 7
            return off, f"summary of segment {seg}: checksum mismatch"
        if kind == "data":
            ino, want = fs.stat("big").ino, -1
        elif kind == "indirect":
            ino, want = fs.stat("big").ino, 0
        elif kind == "directory":
            ino, want = fs.stat("d").ino, -1
        else:
            sysino = {
                "inode table": fmt.INO_INOTBL,
                "inode map": fmt.INO_INOMAP,
                "inode vector": fmt.INO_INOVEC,
            }[kind]
            ino, want = sysino, -1
        addr = next(a for a, k, _ in fs.file_blocks(ino) if k == want)
    seg, blk = fmt.sbn_split(addr)
    return geo.addr_offset(addr) + 100, f"segment {seg} block {blk}: checksum mismatch"


def flip(path: Path, off: int) -> None:
    with open(path, "r+b") as f:
        b = os.pread(f.fileno(), 1, off)
        os.pwrite(f.fileno(), bytes([b[0] ^ 0x5A]), off)


@pytest.mark.parametrize("kind", KINDS)
def test_a_flipped_byte_is_named_by_fsck(tmp_path: Path, kind: str) -> None:
    img = tmp_path / "c.img"
    build(img)
    assert fsck(img).ok
    off, named = target(img, kind)
    flip(img, off)
    result = CliRunner().invoke(main, ["lfs", "fsck", str(img)])
    assert result.exit_code == 1, result.output
    assert named in result.output, result.output
    assert "Traceback" not in result.output


def test_a_damaged_data_block_is_not_read(tmp_path: Path) -> None:
    img = tmp_path / "c.img"
    files = build(img)
    off, _ = target(img, "data")
    flip(img, off)
    with LFS.open(img, readonly=True) as fs:
        with pytest.raises(fmt.LfsChecksumError):
            fs.read("big", 0, len(files["big"]))
        assert fs.read("d/small", 0, 1 << 20) == files["d/small"]


def test_a_version_1_image_is_refused_in_one_line(tmp_path: Path) -> None:
    img = tmp_path / "v1.img"
    mkfs(img, size=4 << 20, blocks_per_segment=32, block_size=BS)
    with open(img, "r+b") as f:
        raw = os.pread(f.fileno(), BS, 2 * BS)
        sb = lfs_pb2.Superblock()
        sb.ParseFromString(raw[4 : 4 + int.from_bytes(raw[:4], "big")])
        sb.version = 1
        os.pwrite(f.fileno(), fmt.encode_pb(sb), 2 * BS)
    with pytest.raises(FsageError, match="version 1") as info:
        LFS.open(img)
    assert "\n" not in str(info.value)


def _mount(img: Path, mp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fsage", "lfs", "mount", str(img), str(mp), *args],
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.skipif(fuse_available() is not None, reason=f"no FUSE here: {fuse_available()}")
def test_a_damaged_data_block_refuses_the_mount_and_reads_eio_when_forced(
    tmp_path: Path,
) -> None:
    img, mp = tmp_path / "c.img", tmp_path / "mnt"
    mp.mkdir()
    files = build(img)
    off, named = target(img, "data")
    flip(img, off)
    out = _mount(img, mp)
    assert out.returncode != 0
    assert len(out.stderr.strip().splitlines()) == 1 and named in out.stderr, out.stderr
    out = _mount(img, mp, "--force")
    assert out.returncode == 0, out.stderr
    m = re.search(r"\(pid (\d+)\)", out.stdout)
    assert m, out.stdout
    try:
        with pytest.raises(OSError) as info:
            (mp / "big").read_bytes()
        assert info.value.errno == errno.EIO
        for name in ("d/small", "d/other"):
            assert (mp / name).read_bytes() == files[name]
    finally:
        _unmount(mp, int(m.group(1)))
