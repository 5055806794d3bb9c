"""A mounted ext file system read through its mount and read offline yields the same records.

One image holds what tells the two readers apart: fast and slow symlinks (which cannot be
opened for FIEMAP or GETVERSION), hard links, sparse files, small and large xattrs (an xattr
block), inline data, files of many extents (extent-tree blocks), preallocated and punched
ranges, a FIFO and a device node. Snapshotted by its device through the mount, frozen, and
unmounted, in every order, nothing may show as new, changed or deleted; the records of the
inodes only the inode table knows about are checked against debugfs.
"""

from __future__ import annotations

import os
import random
import re
import socket
import stat
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from conftest import require_tools
from images import e2freefrag, stat_inodes
from snapshotter.loops import mounted_loop
from snapshotter.snapcli import snapshot_cli

from fsage.db.store import Store
from fsage.layout import Layout

pytestmark = [pytest.mark.needs_root, pytest.mark.slow]

_COUNTS = re.compile(r"(\d+) new, (\d+) changed, (\d+) deleted")


@dataclass
class Mounted:
    image: Path
    device: str
    mnt: Path


def _tree(root: Path, rng: random.Random) -> None:
    """What mke2fs -d puts on the image before it is mounted."""
    (root / "a" / "b").mkdir(parents=True)
    for i in range(120):
        d = rng.choice([root, root / "a", root / "a" / "b"])
        (d / f"f{i}").write_bytes(rng.randbytes(int(rng.lognormvariate(9, 1.8)) % 900_000))
    (root / "tiny").mkdir()
    for i in range(400):  # inline data
        (root / "tiny" / f"t{i}").write_bytes(b"x" * (i % 55))
    for i in range(15):
        os.symlink("t" * 12, root / "a" / f"fast{i}")
        os.symlink("s" * 300, root / "a" / f"slow{i}")
    (root / "linked").write_bytes(rng.randbytes(20000))
    os.link(root / "linked", root / "a" / "hard1")
    os.link(root / "linked", root / "a" / "b" / "hard2")
    with open(root / "sparse", "wb") as fh:
        fh.truncate(24 << 20)
        for off in range(0, 24 << 20, 3 << 20):
            fh.seek(off)
            fh.write(rng.randbytes(9000))
    for i in range(6):
        (root / f"x{i}").write_text("v")
        os.setxattr(root / f"x{i}", "user.note", b"n" * (i * 400))
    os.mkfifo(root / "fifo")
    os.mknod(root / "null", 0o600 | 0o020000, os.makedev(1, 3))


def _kernel_writes(mnt: Path, rng: random.Random) -> None:
    """What the mounted kernel adds: interleaved appends (many extents, extent-tree
    blocks), preallocation, a punched hole, new symlinks, small files, deletions."""
    (mnt / "k").mkdir()
    handles = [open(mnt / "k" / f"inter{i}", "wb") for i in range(6)]  # noqa: SIM115
    for j in range(120):
        for fh in handles:
            fh.write(rng.randbytes(4096))
            fh.flush()
            if j % 20 == 0:
                os.fsync(fh.fileno())
    for fh in handles:
        fh.close()
    with open(mnt / "k" / "falloc", "wb") as fh:
        os.posix_fallocate(fh.fileno(), 0, 6 << 20)
        fh.write(b"y" * 70000)
    (mnt / "k" / "punch").write_bytes(rng.randbytes(1 << 20))
    subprocess.run(
        ["fallocate", "-p", "-o", "65536", "-l", "300000", str(mnt / "k" / "punch")], check=True
    )
    (mnt / "k" / "keep").touch()
    subprocess.run(["fallocate", "-n", "-l", "3M", str(mnt / "k" / "keep")], check=True)
    for i in range(20):
        os.symlink("z" * (1 + i * 13), mnt / "k" / f"sym{i}")
        (mnt / "k" / f"small{i}").write_text("q" * i)
    os.setxattr(mnt / "k" / "small3", "user.big", b"b" * 3000)
    # special files the kernel makes get a generation of their own (mke2fs -d's have 0), and
    # the mount's walk cannot open them for it
    os.mkfifo(mnt / "k" / "fifo")
    os.mknod(mnt / "k" / "zero", 0o600 | stat.S_IFCHR, os.makedev(1, 5))
    os.mknod(mnt / "k" / "loopdev", 0o600 | stat.S_IFBLK, os.makedev(7, 200))
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(mnt / "k" / "sock"))
    for i in range(0, 120, 9):
        for d in (mnt, mnt / "a", mnt / "a" / "b"):
            if (d / f"f{i}").exists():
                (d / f"f{i}").unlink()


@pytest.fixture
def mounted(tmp_path: Path) -> Iterator[Mounted]:
    require_tools("mke2fs", "losetup", "mount", "debugfs", "e2freefrag", "fallocate")
    rng = random.Random(28)
    tree = tmp_path / "tree"
    tree.mkdir()
    _tree(tree, rng)
    image = tmp_path / "fs.img"
    subprocess.run(["truncate", "-s", "160M", str(image)], check=True)
    subprocess.run(
        [
            "mke2fs",
            "-q",
            "-F",
            "-t",
            "ext4",
            "-b",
            "4096",
            "-O",
            "inline_data",
            "-d",
            str(tree),
            str(image),
        ],
        check=True,
    )
    mnt = tmp_path / "mnt"
    with mounted_loop(image, mnt) as dev:
        _kernel_writes(mnt, rng)
        os.sync()
        yield Mounted(image, dev, mnt)


def _snapshot(db: Path, source: str, *extra: str) -> tuple[int, int, int]:
    return snapshot_cli(db, source, *extra).counts


def _latest(db: Path) -> Layout:
    with Store.open(db) as store:
        return store.load_layout(store.snapshots()[-1].id)


def test_mounted_and_frozen_reads_record_the_same_files(mounted: Mounted, tmp_path: Path) -> None:
    m = mounted
    db = tmp_path / "one.db"
    first = _snapshot(db, m.device, "--freeze")
    assert first[0] > 600 and first[1:] == (0, 0)
    assert _snapshot(db, m.device) == (0, 0, 0)  # through the mount point
    assert _snapshot(db, m.device, "--freeze") == (0, 0, 0)

    # The other order, after more writes, into another database.
    (m.mnt / "k" / "later").write_bytes(b"l" * 50000)
    os.symlink("w" * 200, m.mnt / "k" / "laterlink")
    os.sync()
    db2 = tmp_path / "two.db"
    _snapshot(db2, m.device)
    assert _snapshot(db2, m.device, "--freeze") == (0, 0, 0)
    assert _snapshot(db2, m.device) == (0, 0, 0)
    live = _latest(db2)

    # The inodes the mount cannot answer for, against debugfs.
    files = live.files
    kinds = files.mode & 0o170000
    links = [int(i) for i in files.ino[kinds == 0o120000]]
    special = [int(i) for i in files.ino[np.isin(kinds, (0o010000, 0o020000, 0o060000, 0o140000))]]
    tiny = [int(i) for i, s in zip(files.ino, files.size, strict=True) if 0 < s < 55][:40]
    with_meta = [int(i) for i in files.ino[np.flatnonzero(np.diff(files.meta_off))]]
    told = stat_inodes(Path(m.device), links + special + tiny + with_meta)
    row = {int(ino): i for i, ino in enumerate(files.ino)}
    slow = 0
    for ino in links + tiny + with_meta:
        i = row[ino]
        want = told[ino]
        assert int(files.generation[i]) == want.generation, ino
        a, b = int(files.ext_off[i]), int(files.ext_off[i + 1])
        got = list(
            zip(files.ext_logical[a:b], files.ext_physical[a:b], files.ext_length[a:b], strict=True)
        )
        assert got == [(lo, ph, n) for lo, ph, n, _u in want.extents], ino
        slow += bool(want.extents) and ino in links
        ma, mb = int(files.meta_off[i]), int(files.meta_off[i + 1])
        meta = sorted(int(p) for p in files.meta_physical[ma:mb])
        assert meta == sorted(
            [p for _k, p in want.meta] + ([want.file_acl] if want.file_acl else [])
        )
    assert slow >= 15  # the slow symlinks have their target's block
    assert len(special) == 6  # mke2fs's FIFO and device, the kernel's four
    for ino in special:
        assert int(files.generation[row[ino]]) == told[ino].generation, ino
    assert sum(told[i].generation != 0 for i in special) >= 4
    assert any(told[i].inline_size is not None for i in tiny)
    assert any(told[i].file_acl for i in with_meta) and any(told[i].meta for i in with_meta)

    # Unmounted, the image read offline is the same file system in the same state; its free
    # space is the block bitmap's, as e2freefrag counts it.
    subprocess.run(["umount", str(m.mnt)], check=True)
    try:
        assert _snapshot(db2, str(m.image)) == (0, 0, 0)
        assert live.facts.blocks_free == e2freefrag(m.image).free_blocks
    finally:
        subprocess.run(["mount", m.device, str(m.mnt)], check=True)
