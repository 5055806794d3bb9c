"""The ``link`` op (a new name for an existing file) on every executor that has it: the kernel
(stat) and e2fsprogs (debugfs link counts, e2fsck) are the oracles."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from fsage.ager.images import make_image
from fsage.ager.posix import PosixExecutor
from fsage.errors import WorkloadError
from fsage.workload import Executor, Op, OpFailedError

from .helpers import debugfs, fsck_clean

MIB = 1 << 20


def _offline(image: Path) -> Executor:
    pytest.importorskip("fsage._ext2fs")
    from fsage import _ext2fs  # type: ignore[attr-defined,unused-ignore]

    if not hasattr(_ext2fs, "writer_link"):
        pytest.skip("fsage._ext2fs built without writer_link")
    from fsage.ager.offline import OfflineExtExecutor

    return OfflineExtExecutor(image)


def _stat(image: Path, path: str) -> tuple[int, int, int]:
    """(inode, link count, size) of ``path`` as debugfs reports them."""
    out = debugfs(image, f'stat "/{path}"')
    ino = re.search(r"Inode: (\d+)", out)
    links = re.search(r"Links: (\d+)", out)
    size = re.search(r"Size: (\d+)", out)
    assert ino and links and size, out
    return int(ino.group(1)), int(links.group(1)), int(size.group(1))


# ---------------------------------------------------------------------------- posix


def test_posix_link_gives_the_same_inode_another_name(tmp_path: Path) -> None:
    root = tmp_path / "t"
    root.mkdir()
    ex = PosixExecutor(root)
    ex.apply(Op("mkdir", "d"))
    ex.apply(Op("create", "a", size=10_000))
    assert ex.apply(Op("link", "a", dest="d/b")) == 0
    ex.apply(Op("link", "d/b", dest="c"))
    a, b, c = (os.lstat(root / p) for p in ("a", "d/b", "c"))
    assert a.st_ino == b.st_ino == c.st_ino
    assert a.st_nlink == 3 and a.st_size == 10_000
    ex.apply(Op("delete", "a"))
    assert os.lstat(root / "c").st_nlink == 2
    ex.apply(Op("append", "c", size=100))
    assert os.lstat(root / "d/b").st_size == 10_100
    ex.close()


def test_posix_bad_links_fail_clearly(tmp_path: Path) -> None:
    root = tmp_path / "t"
    root.mkdir()
    ex = PosixExecutor(root)
    ex.apply(Op("mkdir", "d"))
    ex.apply(Op("create", "a", size=1))
    ex.apply(Op("create", "b", size=2))
    with pytest.raises(OpFailedError, match=r"^link 'd': Operation not permitted$"):
        ex.apply(Op("link", "d", dest="e"))
    with pytest.raises(OpFailedError, match=r"^link 'a': File exists$"):
        ex.apply(Op("link", "a", dest="b"))
    with pytest.raises(OpFailedError, match=r"^link 'nope': No such file or directory$"):
        ex.apply(Op("link", "nope", dest="x"))
    assert os.lstat(root / "a").st_nlink == 1 and os.lstat(root / "b").st_size == 2
    assert not (root / "e").exists() and not (root / "x").exists()
    ex.close()


def test_posix_link_does_not_follow_a_symlink(tmp_path: Path) -> None:
    root = tmp_path / "t"
    root.mkdir()
    outside = tmp_path / "outside"
    outside.write_bytes(b"x")
    (root / "s").symlink_to(outside)
    ex = PosixExecutor(root)
    ex.apply(Op("link", "s", dest="s2"))
    assert os.path.islink(root / "s2")
    assert os.lstat(root / "s2").st_ino == os.lstat(root / "s").st_ino
    assert os.stat(outside).st_nlink == 1
    ex.close()


def test_unsafe_link_destinations_are_refused() -> None:
    for dest in ("../x", "a/../../x", "/etc/x", "", "a//b"):
        with pytest.raises(WorkloadError, match="unsafe path"):
            Op.from_json({"op": "link", "path": "a", "dest": dest})
    with pytest.raises(WorkloadError, match="unsafe path"):
        Op.from_json({"op": "link", "path": "../a", "dest": "b"})
    op = Op.from_json({"op": "link", "path": "a", "dest": "d/b"})
    assert op.to_json() == '{"op":"link","path":"a","dest":"d/b"}'


# ---------------------------------------------------------------------------- offline


def test_offline_link_counts_and_fsck(tmp_path: Path) -> None:
    img = make_image(tmp_path / "e.img", "ext4", 32 * MIB)
    ex = _offline(img)
    ex.apply(Op("mkdir", "d"))
    ex.apply(Op("create", "a", size=20_000))
    ex.apply(Op("link", "a", dest="d/b"))
    ex.apply(Op("link", "d/b", dest="c"))
    ex.apply(Op("create", "solo", size=5))
    ex.apply(Op("link", "solo", dest="solo2"))
    ex.apply(Op("delete", "solo"))
    ex.close()
    fsck_clean(img)
    ino, links, size = _stat(img, "a")
    assert links == 3 and size == 20_000
    assert _stat(img, "d/b") == (ino, 3, 20_000)
    assert _stat(img, "c") == (ino, 3, 20_000)
    assert debugfs(img, f"ncheck {ino}").count(f"{ino}\t") == 3
    assert _stat(img, "solo2")[1:] == (1, 5)
    gone = subprocess.run(["debugfs", "-R", "stat /solo", str(img)], capture_output=True, text=True)
    assert "File not found" in gone.stderr
    # debugfs ls -l lists the new name under the same inode.
    listing = debugfs(img, "ls -l /d")
    row = next(line for line in listing.splitlines() if line.rstrip().endswith(" b"))
    assert row.split()[0] == str(ino)


def test_offline_links_grow_the_directory_and_unlink_keeps_the_data(tmp_path: Path) -> None:
    img = tmp_path / "e.img"
    with open(img, "wb") as fh:
        fh.truncate(16 * MIB)
    subprocess.run(
        ["mke2fs", "-F", "-q", "-t", "ext4", "-b", "1024", str(img)],
        check=True, capture_output=True,
    )  # fmt: skip
    ex = _offline(img)
    ex.apply(Op("mkdir", "many"))
    ex.apply(Op("create", "f", size=3000))
    names = [f"many/{'n' * 200}-{i:03d}" for i in range(40)]
    for name in names:
        ex.apply(Op("link", "f", dest=name))
    for name in names[:30]:
        ex.apply(Op("delete", name))
    ex.apply(Op("delete", "f"))
    ex.close()
    fsck_clean(img)
    assert _stat(img, names[-1])[1:] == (10, 3000)
    dir_size = _stat(img, "many")[2]
    assert dir_size >= 40 * 212 // 1024 * 1024  # the directory grew past one block
    blocks = debugfs(img, f'blocks "/{names[30]}"').split()
    assert len(blocks) == 3  # 3000 bytes in 1 KiB blocks, still held


def test_offline_bad_links_fail_clearly(tmp_path: Path) -> None:
    img = make_image(tmp_path / "e.img", "ext4", 32 * MIB)
    ex = _offline(img)
    ex.apply(Op("mkdir", "d"))
    ex.apply(Op("create", "a", size=1))
    ex.apply(Op("create", "b", size=2))
    with pytest.raises(OpFailedError, match=r"^link 'd': link: Operation not permitted$"):
        ex.apply(Op("link", "d", dest="e"))
    with pytest.raises(OpFailedError, match=r"^link 'a': link: File exists$"):
        ex.apply(Op("link", "a", dest="b"))
    with pytest.raises(OpFailedError, match=r"^link 'nope': link: No such file or directory$"):
        ex.apply(Op("link", "nope", dest="x"))
    with pytest.raises(OpFailedError, match=r"^link 'a': link: No such file or directory$"):
        ex.apply(Op("link", "a", dest="missing/x"))
    with pytest.raises(OpFailedError, match=r"^link 'a': link: Not a directory$"):
        ex.apply(Op("link", "a", dest="b/x"))
    ex.close()
    fsck_clean(img)
    assert _stat(img, "a")[1] == 1
    assert _stat(img, "b")[1:] == (1, 2)
