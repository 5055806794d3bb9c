"""Symlinks, FIFOs, sockets and device nodes made by the offline writer (libext2fs), and the
errors the data ops share, with e2fsprogs as the oracle: debugfs reads back what was made and
e2fsck finds the image clean."""

from __future__ import annotations

import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

from fsage.workload import Executor, Op, OpFailedError

from .helpers import debugfs, fsck_clean

MIB = 1 << 20


def make_image(path: Path, kind: str, size: int, *, block_size: int = 4096) -> Path:
    with open(path, "wb") as fh:
        fh.truncate(size)
    subprocess.run(["mke2fs", "-F", "-q", "-t", kind, "-b", str(block_size), str(path)],
                   check=True, capture_output=True)  # fmt: skip
    return path


def _offline(image: Path) -> Executor:
    pytest.importorskip("fsage._ext2fs")
    from fsage.ager.offline import OfflineExtExecutor

    return OfflineExtExecutor(image)


def _field(out: str, pattern: str) -> str:
    m = re.search(pattern, out)
    assert m, out
    return m.group(1)


@pytest.mark.parametrize("block_size", [1024, 4096])
def test_offline_symlinks_fast_and_slow(tmp_path: Path, e2fsprogs: None, block_size: int) -> None:
    img = make_image(tmp_path / "s.img", "ext4", 16 * MIB, block_size=block_size)
    ex = _offline(img)
    ex.apply(Op("mkdir", "d"))
    ex.apply(Op("symlink", "d/short", dest="../target"))
    ex.apply(Op("symlink", "long", size=300))  # past the 60 bytes of a fast symlink
    ex.apply(Op("symlink", "d/longest", size=block_size - 1))
    with pytest.raises(OpFailedError):
        ex.apply(Op("symlink", "d/short", dest="other"))  # the name is taken
    with pytest.raises(OpFailedError):
        ex.apply(Op("symlink", "nodir/x", dest="y"))
    ex.close()
    fsck_clean(img)
    short = debugfs(img, "stat /d/short")
    assert "Type: symlink" in short
    assert _field(short, r'Fast link dest: "([^"]*)"') == "../target"
    long_ = debugfs(img, "stat /long")
    assert "Type: symlink" in long_ and _field(long_, r"Size: (\d+)") == "300"
    # A slow symlink has a data block of its own.
    assert int(_field(long_, r"Blockcount: (\d+)")) == block_size // 512
    assert _field(debugfs(img, "stat /d/longest"), r"Size: (\d+)") == str(block_size - 1)
    listing = debugfs(img, "ls -l /d")
    assert "short" in listing and "longest" in listing


def test_offline_special_files(tmp_path: Path, e2fsprogs: None) -> None:
    img = make_image(tmp_path / "n.img", "ext4", 16 * MIB)
    ex = _offline(img)
    for kind in ("fifo", "socket", "char", "block"):
        ex.apply(Op("mknod", f"n-{kind}", label=kind))
    with pytest.raises(OpFailedError):
        ex.apply(Op("mknod", "n-fifo", label="fifo"))
    ex.close()
    fsck_clean(img)
    types = {"fifo": "FIFO", "socket": "socket", "char": "character special",
             "block": "block special"}  # fmt: skip
    for kind, name in types.items():
        out = debugfs(img, f"stat /n-{kind}")
        assert f"Type: {name}" in out, out
        assert _field(out, r"Links: (\d+)") == "1"


def test_offline_device_numbers(tmp_path: Path, e2fsprogs: None) -> None:
    pytest.importorskip("fsage._ext2fs")
    from fsage import _ext2fs  # type: ignore[attr-defined,unused-ignore]

    img = make_image(tmp_path / "d.img", "ext4", 16 * MIB)
    h = _ext2fs.writer_open(os.fsencode(img))
    _ext2fs.writer_mknod(h, b"null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    _ext2fs.writer_mknod(h, b"big", stat.S_IFBLK | 0o600, os.makedev(259, 300))
    with pytest.raises(_ext2fs.Ext2fsError):
        _ext2fs.writer_mknod(h, b"plain", stat.S_IFREG | 0o644, 0)  # not a special file
    _ext2fs.writer_close(h)
    fsck_clean(img)
    # debugfs prints "Device major/minor number: MAJ:MIN (hex ...)" for device inodes.
    dev = r"Device major/minor number: (\d+:\d+)"
    major, minor = _field(debugfs(img, "stat /null"), dev).split(":")
    assert (int(major), int(minor)) == (1, 3)
    major, minor = _field(debugfs(img, "stat /big"), dev).split(":")
    assert (int(major), int(minor)) == (259, 300)


def test_offline_symlinks_fill_a_directory(tmp_path: Path, e2fsprogs: None) -> None:
    """Enough links to overflow a directory's first block: the directory grows."""
    img = make_image(tmp_path / "g.img", "ext4", 16 * MIB, block_size=1024)
    ex = _offline(img)
    ex.apply(Op("mkdir", "d"))
    for i in range(200):
        ex.apply(Op("symlink", f"d/link-with-a-longish-name-{i:04d}", size=20 + i))
        if i % 50 == 0:
            ex.apply(Op("mknod", f"d/fifo-with-a-longish-name-{i:04d}", label="fifo"))
    ex.close()
    fsck_clean(img)
    listing = debugfs(img, "ls /d")
    assert listing.count("link-with-a-longish-name-") == 200
    assert listing.count("fifo-with-a-longish-name-") == 4
    assert int(_field(debugfs(img, "stat /d"), r"Size: (\d+)")) > 1024


def test_offline_data_ops_share_their_errors(tmp_path: Path, e2fsprogs: None) -> None:
    """write, truncate, punch and fallocate resolve their path the same way: a missing file,
    a directory and a symlink are refused alike, and nothing changes."""
    img = make_image(tmp_path / "e.img", "ext4", 16 * MIB)
    ex = _offline(img)
    ex.apply(Op("mkdir", "d"))
    ex.apply(Op("symlink", "l", dest="d"))
    ex.apply(Op("create", "f", size=8192))
    for path in ("missing", "d", "l", "d/x/y"):
        for op in (Op("overwrite", path, offset=0, size=10), Op("truncate", path, size=1),
                   Op("punch", path, offset=0, size=4096),
                   Op("fallocate", path, offset=0, size=4096)):  # fmt: skip
            with pytest.raises(OpFailedError):
                ex.apply(op)
    ex.apply(Op("punch", "f", offset=0, size=4096))
    ex.close()
    fsck_clean(img)
    out = debugfs(img, "stat /f")
    assert _field(out, r"Size: (\d+)") == "8192"
    assert int(_field(out, r"Blockcount: (\d+)")) == 8
