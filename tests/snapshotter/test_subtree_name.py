"""A directory below a mount point, snapshotted without --name, is a file system of its own.

It must not land under the name of the whole file system (which would then record most of
its files as deleted, and all of them as new again on the next whole read), and the same
directory read again must land under the same name, with nothing new, changed or deleted.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import require_tools
from snapshotter.loops import mounted_loop
from snapshotter.snapcli import snapshot_cli

from fsage.db.store import Store

pytestmark = [pytest.mark.needs_root]

_LINE = re.compile(r"snapshot \d+ of (.+): .*; (\d+) new, (\d+) changed, (\d+) deleted")


@pytest.fixture
def mounted(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    require_tools("mke2fs", "losetup", "mount")
    tree = tmp_path / "tree"
    for d in ("docs/x", "docs/y", "src"):
        (tree / d).mkdir(parents=True)
    for i in range(40):
        (tree / ("docs/x", "docs/y", "src")[i % 3] / f"f{i}").write_bytes(b"d" * (i * 997))
    img = tmp_path / "fs.img"
    subprocess.run(["truncate", "-s", "32M", str(img)], check=True)
    mkfs = ["mke2fs", "-q", "-F", "-t", "ext4", "-L", "sub", "-d", str(tree), str(img)]
    subprocess.run(mkfs, check=True)
    with mounted_loop(img, tmp_path / "mnt") as dev:
        subprocess.run(["mount", "-o", "remount,ro", str(tmp_path / "mnt")], check=True)
        yield dev, tmp_path / "mnt"


def _snapshot(db: Path, source: Path | str) -> tuple[str, int, int, int]:
    snap = snapshot_cli(db, source)
    return (snap.name, *snap.counts)


def _inodes_below(path: Path) -> int:
    return 1 + sum(len(dirs) + len(files) for _r, dirs, files in os.walk(path))


def test_subtree_has_its_own_stable_name(mounted: tuple[str, Path], tmp_path: Path) -> None:
    dev, mnt = mounted
    db = tmp_path / "x.db"
    whole, new, *_ = _snapshot(db, dev)
    assert new >= _inodes_below(mnt)
    sub, n_new, changed, deleted = _snapshot(db, mnt / "docs" / "x")
    assert sub != whole
    # The directories from the root down to it are recorded too, with it and what it holds.
    assert (n_new, changed, deleted) == (_inodes_below(mnt / "docs" / "x") + 2, 0, 0)
    assert _snapshot(db, mnt / "docs" / "x") == (sub, 0, 0, 0)
    assert _snapshot(db, dev) == (whole, 0, 0, 0)
    assert _snapshot(db, mnt / "docs" / "y")[0] not in (sub, whole)
    with Store.open(db) as store:
        names = [s.fs_name for s in store.snapshots()]
    assert names.count(whole) == 2 and names.count(sub) == 2


def test_subtree_first_then_the_whole_file_system(
    mounted: tuple[str, Path], tmp_path: Path
) -> None:
    dev, mnt = mounted
    db = tmp_path / "y.db"
    sub = _snapshot(db, mnt / "src")[0]
    whole, new, changed, deleted = _snapshot(db, dev)
    assert whole != sub and new >= _inodes_below(mnt) and (changed, deleted) == (0, 0)
    assert _snapshot(db, mnt / "src") == (sub, 0, 0, 0)
