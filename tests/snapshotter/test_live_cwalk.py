"""The C walk (fsage._live) against the Python walk and against odd trees: paths beyond
PATH_MAX, a directory of thousands of entries, files vanishing mid-walk, many threads on a wide
tree, a low descriptor limit, and the arguments and constants it takes from Python.
"""

from __future__ import annotations

import dataclasses
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from snapshotter.livefs import MARKS, Mounted, file_extents, mount, same_layout, scratch_dir, umount

from fsage.layout import (
    EXTENT_DELALLOC,
    EXTENT_ENCODED,
    EXTENT_INLINE,
    EXTENT_SHARED,
    EXTENT_UNWRITTEN,
    Layout,
)
from fsage.snapshotter.live import c_walker_available, read_live_layout

pytestmark = MARKS


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    with scratch_dir() as d:
        yield d


def _scratch(workdir: Path, name: str) -> Mounted:
    if not c_walker_available():
        pytest.skip("fsage._live is not built")
    return mount(workdir, "ext4", name)


def test_c_walk_deep_tree_beyond_path_max(workdir: Path) -> None:
    """A chain of directories whose path is longer than PATH_MAX: the C walk opens it piece by
    piece; the Python walk (paths) cannot and says so."""
    m = _scratch(workdir, "-deep")
    try:
        comp = "d" * 200
        depth = 30  # 30 * 201 bytes > 4096
        fd = os.open(m.mnt, os.O_RDONLY | os.O_DIRECTORY)
        for _ in range(depth):
            os.mkdir(comp, dir_fd=fd)
            nfd = os.open(comp, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nfd
        leaf = os.open("leaf", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(leaf, b"L" * 20000)
        os.fsync(leaf)
        leaf_ino = os.fstat(leaf).st_ino
        os.close(leaf)
        os.close(fd)
        c = read_live_layout(m.mnt, engine="c", workers=1)
        py = read_live_layout(m.mnt, engine="python")
    finally:
        umount(m)
    want = "/" + "/".join([comp] * depth) + "/leaf"
    assert c.paths()[leaf_ino] == [want]
    row = int(np.flatnonzero(c.files.ino == leaf_ino)[0])
    ext = file_extents(c, row)
    assert sum(e[2] for e in ext) == 5 and ext[0][0] == 0
    assert not c.facts.extra["skipped"]
    assert leaf_ino not in py.paths()
    assert any("File name too long" in n for n in py.notes)


def test_c_walk_huge_directory_and_hard_links(workdir: Path) -> None:
    """One directory needing several getdents64 calls; hard links across directories."""
    m = _scratch(workdir, "-huge")
    try:
        big = m.mnt / "big"
        big.mkdir()
        names = [f"entry-with-a-longish-name-{i:06d}" for i in range(9000)]
        for n in names:
            (big / n).touch()
        (m.mnt / "h").mkdir()
        (m.mnt / "h/a").write_bytes(b"a" * 10000)
        for i in range(3):
            os.link(m.mnt / "h/a", big / f"link{i}")
        os.sync()
        read_live_layout(m.mnt, engine="python")
        py = read_live_layout(m.mnt, engine="python")
        c = read_live_layout(m.mnt, engine="c", workers=1)
        c2 = read_live_layout(m.mnt, engine="c", workers=2)
        ino = os.stat(m.mnt / "h/a").st_ino
        # A progress callback that raises ends the walk with its exception, with one worker
        # thread or several.
        for workers in (1, 2):
            seen: list[int] = []

            def progress(n: int, seen: list[int] = seen) -> None:
                seen.append(n)
                raise KeyError("enough")

            with pytest.raises(KeyError, match="enough"):
                read_live_layout(m.mnt, engine="c", workers=workers, progress=progress)
            assert len(seen) == 1
            assert seen[0] == 4096 if workers == 1 else 4096 <= seen[0] < 9000
    finally:
        umount(m)
    same_layout(py, c)
    got = {p for ps in c.paths().values() for p in ps}
    assert {f"/big/{n}" for n in names} <= got
    assert c.paths()[ino] == ["/big/link0", "/big/link1", "/big/link2", "/h/a"]
    assert int(np.count_nonzero(c.files.ino == ino)) == 1
    assert int(np.count_nonzero(c.links.ino == ino)) == 4
    assert len(c.files) == 9000 + 4 + (1 if "/lost+found" in got else 0)  # h/a, /, big, h
    assert c2.paths() == c.paths()
    assert np.array_equal(c2.files.ino, c.files.ino)
    assert np.array_equal(c2.files.ext_physical, c.files.ext_physical)


def test_c_walk_files_vanishing_mid_walk(workdir: Path) -> None:
    """Files deleted after their directory was listed are skipped and noted, not fatal."""
    m = _scratch(workdir, "-vanish")
    try:
        v = m.mnt / "v"
        v.mkdir()
        total = 6000
        for i in range(total):
            (v / f"f{i}").touch()
        os.sync()
        deleted: list[int] = []

        def progress(n: int) -> None:  # the C walk calls this after 4096 records
            if not deleted:
                for p in v.iterdir():
                    p.unlink()
                deleted.append(n)

        layout = read_live_layout(m.mnt, engine="c", workers=1, progress=progress)
    finally:
        umount(m)
    assert deleted == [4096]
    in_v = [p for ps in layout.paths().values() for p in ps if p.startswith("/v/")]
    vanished = layout.facts.extra["skipped"]
    assert vanished > 0
    assert len(in_v) + vanished == total
    (note,) = [n for n in layout.notes if n.startswith("skipped")]
    assert note.startswith(f"skipped {vanished} paths (vanished or changed during the walk): /v/f")


def test_c_walk_rejects_bad_tasks() -> None:
    if not c_walker_available():
        pytest.skip("fsage._live is not built")
    from fsage import _live

    kw: dict[str, Any] = dict(
        mode=_live.MODE_WALK,
        dev=0,
        submounts=[],
        sync=False,
        batch=8,
        dir_fiemap=True,
        getversion=True,
        block_size=4096,
    )
    with pytest.raises(ValueError, match="start with '/'"):
        _live.walk(b"/", [(b"etc", None)], **kw)
    with pytest.raises(ValueError, match="bad mode or batch"):
        _live.walk(b"/", [(b"", None)], **{**kw, "batch": 0})
    with pytest.raises(FileNotFoundError):
        _live.walk(b"/nonexistent-fsage-dir", [(b"", None)], **kw)
    for threads in (0, _live.MAX_THREADS + 1):
        with pytest.raises(ValueError, match="threads must be between"):
            _live.walk(b"/", [(b"", None)], **{**kw, "threads": threads})
    with pytest.raises(TypeError, match="block_size"):
        _live.walk(b"/", [(b"", None)], **{**kw, "block_size": 0})


def test_c_walk_extent_flags_are_fsages() -> None:
    """The C walk converts FIEMAP flags to fsage's own; its constants must be layout.py's."""
    if not c_walker_available():
        pytest.skip("fsage._live is not built")
    from fsage import _live

    assert (
        _live.EXTENT_UNWRITTEN,
        _live.EXTENT_DELALLOC,
        _live.EXTENT_INLINE,
        _live.EXTENT_SHARED,
        _live.EXTENT_ENCODED,
    ) == (EXTENT_UNWRITTEN, EXTENT_DELALLOC, EXTENT_INLINE, EXTENT_SHARED, EXTENT_ENCODED)


def test_c_walk_threads_share_a_wide_tree(workdir: Path) -> None:
    """Many directories read by several threads at once, with hard links whose names lie in
    directories different threads read: each inode is recorded once, with every name, and the
    layout is the one a single thread reads."""
    m = _scratch(workdir, "-wide")
    try:
        rnd = random.Random(3)
        for d in range(60):
            sub = m.mnt / f"d{d:02d}" / f"e{d % 7}"
            sub.mkdir(parents=True)
            for f in range(30):
                (sub / f"f{f}").write_bytes(rnd.randbytes(rnd.randrange(1, 40000)))
        shared = m.mnt / "d00/e0/f0"
        for d in range(1, 60, 3):
            os.link(shared, m.mnt / f"d{d:02d}/e{d % 7}/link")
        os.sync()
        read_live_layout(m.mnt, engine="python")  # directories' atime settles (relatime)
        py = read_live_layout(m.mnt, engine="python")
        one = read_live_layout(m.mnt, engine="c", workers=1)
        many = [read_live_layout(m.mnt, engine="c", workers=w) for w in (2, 3, 8)]
        ino = os.stat(shared).st_ino
    finally:
        umount(m)
    same_layout(py, one)

    def link_set(layout: Layout) -> set[tuple[int, int, bytes]]:
        t = layout.links
        return {
            (int(t.parent[i]), int(t.ino[i]), t.names[int(t.name_off[i]) : int(t.name_off[i + 1])])
            for i in range(len(t))
        }

    for got in many:
        for col in dataclasses.fields(one.files):
            name = col.name
            assert np.array_equal(getattr(got.files, name), getattr(one.files, name)), name
        assert link_set(got) == link_set(one)
        assert len(got.links) == len(one.links)
        assert int(np.count_nonzero(got.files.ino == ino)) == 1
        assert len(got.paths()[ino]) == 1 + len(range(1, 60, 3))
    assert len(one.files) >= 60 * 30


def test_c_walk_under_a_low_descriptor_limit(workdir: Path) -> None:
    """Files are closed in runs; with few descriptors allowed the run is closed early instead
    of files being skipped."""
    m = _scratch(workdir, "-nofile")
    try:
        d = m.mnt / "many"
        d.mkdir()
        for i in range(300):
            (d / f"f{i}").write_bytes(b"x" * 100)
        os.sync()
        code = (
            "import resource, sys\n"
            "from pathlib import Path\n"
            "from fsage.snapshotter.live import read_live_layout\n"
            "resource.setrlimit(resource.RLIMIT_NOFILE, (40, 40))\n"
            "layout = read_live_layout(Path(sys.argv[1]), engine='c', workers=2)\n"
            "print(len(layout.files), layout.facts.extra['skipped'])\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", code, str(m.mnt)], check=True, capture_output=True, text=True
        ).stdout.split()
    finally:
        umount(m)
    assert int(out[1]) == 0
    assert int(out[0]) >= 302  # the files, "/" and "/many"
