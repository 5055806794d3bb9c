"""A mount directory and its device, read one after the other, record one unchanged file system.

The image (1 KiB blocks) holds what the mount cannot show or shows differently from the inode
table: inode flags beyond EXTENTS_FL (noatime, nodump, an indexed directory), slow and fast
symlinks, sparse files with extent-tree blocks, hard links, a FIFO; the journal and resize
inodes. The live walks' inode flags are checked against debugfs, and the snapshots of the
device and of the mount directory against each other.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import require_tools
from images import debugfs, stat_inodes
from snapshotter.loops import mounted_loop
from snapshotter.snapcli import snapshot_cli

from fsage.db.store import Store
from fsage.snapshotter.live import c_walker_available, read_live_layout

pytestmark = [pytest.mark.needs_root]

_COUNTS = re.compile(r"(\d+) new, (\d+) changed, (\d+) deleted")
_FLAGS = re.compile(r"Flags: (0x[0-9a-f]+)")
EXT4_EXTENTS_FL = 0x80000


def _tree(root: Path, rng: random.Random) -> None:
    """What mke2fs -d puts on the image."""
    (root / "a" / "b").mkdir(parents=True)
    for i in range(60):
        d = rng.choice([root, root / "a", root / "a" / "b"])
        (d / f"f{i}").write_bytes(rng.randbytes(int(rng.lognormvariate(8, 1.5)) % 300_000))
    for i in range(4):
        with open(root / f"sparse{i}", "wb") as fh:  # more extents than the inode holds
            for off in range(0, 40 << 20, 2 << 20):
                fh.seek(off)
                fh.write(rng.randbytes(3000))
    for i in range(8):
        os.symlink("t" * 20, root / "a" / f"fast{i}")
        os.symlink("s" * 200, root / "a" / f"slow{i}")
    (root / "linked").write_bytes(rng.randbytes(5000))
    os.link(root / "linked", root / "a" / "hard")
    os.mkfifo(root / "fifo")


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """The image mounted read-only: (device, mount point)."""
    require_tools("mke2fs", "losetup", "mount", "debugfs", "chattr")
    tmp = tmp_path_factory.mktemp("flags")
    tree = tmp / "tree"
    tree.mkdir()
    _tree(tree, random.Random(28))
    img = tmp / "fs.img"
    subprocess.run(["truncate", "-s", "96M", str(img)], check=True)
    mkfs = ["mke2fs", "-q", "-F", "-t", "ext4", "-b", "1024", "-L", "flags", "-d", str(tree)]
    subprocess.run([*mkfs, str(img)], check=True)
    mnt = tmp / "mnt"
    with mounted_loop(img, mnt) as dev:
        # Flags that only the kernel sets here: noatime, nodump, an indexed directory.
        subprocess.run(["chattr", "+A", str(mnt / "linked"), str(mnt / "a")], check=True)
        subprocess.run(["chattr", "+d", str(mnt / "sparse0"), str(mnt / "a" / "b")], check=True)
        (mnt / "wide").mkdir()
        for i in range(200):
            (mnt / "wide" / f"entry-with-a-long-name-{i:04d}").touch()
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        yield dev, mnt


def _debugfs_flags(dev: str, inos: list[int]) -> dict[int, int]:
    outs = debugfs(Path(dev), [f"stat <{i}>" for i in inos])
    found = {}
    for ino, text in zip(inos, outs, strict=True):
        m = _FLAGS.search(text)
        assert m is not None, text
        found[ino] = int(m.group(1), 16)
    return found


@pytest.mark.parametrize("engine", ["c", "python"])
def test_live_walk_reads_the_inode_flags(image: tuple[str, Path], engine: str) -> None:
    if engine == "c" and not c_walker_available():
        pytest.skip("the C walk is not built")
    dev, mnt = image
    files = read_live_layout(mnt, engine=engine).files
    kinds = files.mode & 0o170000
    opened = np.flatnonzero((kinds == 0o100000) | (kinds == 0o040000))
    told = _debugfs_flags(dev, [int(files.ino[i]) for i in opened])
    got = {int(files.ino[i]): int(files.flags[i]) for i in opened}
    assert got == told
    # The sample is worth something: every file has EXTENTS_FL, some have more.
    assert all(f & EXT4_EXTENTS_FL for f in told.values())
    assert len({f for f in told.values()}) >= 3


def _snapshot(db: Path, source: str | Path) -> tuple[tuple[int, int, int], str]:
    snap = snapshot_cli(db, source)
    return snap.counts, snap.name


def test_device_and_mount_directory_record_the_same_files(
    image: tuple[str, Path], tmp_path: Path
) -> None:
    dev, mnt = image
    db = tmp_path / "x.db"
    (new, *rest), name = _snapshot(db, dev)
    assert new > 200 and rest == [0, 0]
    assert _snapshot(db, mnt) == ((0, 0, 0), name)
    assert _snapshot(db, dev) == ((0, 0, 0), name)
    with Store.open(db) as store:
        snaps = store.snapshots()
        assert [s.fs_name for s in snaps] == [name] * 3
        live = store.load_layout(snaps[1].id)
    # What makes the two reads differ is there: slow symlinks' blocks, extent-tree blocks,
    # reserved inodes; they are as debugfs tells.
    files = live.files
    links = [int(i) for i in files.ino[(files.mode & 0o170000) == 0o120000]]
    with_meta = [int(i) for i in files.ino[np.flatnonzero(np.diff(files.meta_off))]]
    told = stat_inodes(Path(dev), links + with_meta)
    assert sum(bool(told[i].extents) for i in links) == 8
    assert len(with_meta) >= 4 and all(told[i].meta for i in with_meta)
    assert {7, 8} <= {int(i) for i in live.special.ino}


_NOTICE = re.compile(r"(\d+) of the (\d+) (changed|new|deleted)")


def test_without_the_device_the_notice_names_every_change(
    image: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the device cannot be read (no root), the mount's view is recorded as it is, and
    a line after the counts says that every change is one the mount cannot see."""
    from click.testing import CliRunner

    import fsage.snapshotter.livedevice as livedevice
    from fsage.cli import main

    dev, mnt = image
    db = tmp_path / "n.db"
    monkeypatch.setattr(livedevice, "device_of", lambda _mount: None)
    runner = CliRunner()
    assert runner.invoke(main, ["snapshot", dev, "--db", str(db)]).exit_code == 0
    res = runner.invoke(main, ["snapshot", str(mnt), "--db", str(db)])
    assert res.exit_code == 0, res.output
    m = _COUNTS.search(res.stdout)
    assert m is not None
    new, changed, deleted = (int(x) for x in m.groups())
    named = {what: (int(n), int(total)) for n, total, what in _NOTICE.findall(res.stderr)}
    assert "cannot see" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert named.get("changed", (0, 0)) == (changed, changed)
    assert named.get("deleted", (0, 0)) == (deleted, deleted)
    assert new == 0 and "new" not in named
    # The changes are those debugfs shows the mount cannot: symlinks with a block, inodes
    # with extent-tree blocks; the deleted, the reserved inodes the offline read records.
    with Store.open(db) as store:
        files = store.load_layout(store.snapshots()[0].id).files
    told = stat_inodes(Path(dev), [int(i) for i in files.ino])
    links = {i for i, s in told.items() if s.kind == "symlink"}
    unseen = {i for i in links if told[i].extents} | {i for i, s in told.items() if s.meta}
    assert changed == len(unseen) > 0
    assert deleted == 2  # the resize inode and the journal
