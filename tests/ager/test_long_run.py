"""A long op stream with renames, links and deep trees on a real loop-mounted ext4.

The stream touches thousands of directories, so the mounted executor's descriptor cache evicts
all the time; renames and links resolve two directories per op. The oracle is the kernel's own
view of the tree after a fresh mount (names, sizes, inode numbers and link counts) and e2fsck.
"""

from __future__ import annotations

import os
import random
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from fsage.ager.images import loop_mount, run_tool
from fsage.ager.run import AgeOptions, age
from fsage.workload import Op, WorkloadHeader, write_workload

pytestmark = [pytest.mark.needs_root, pytest.mark.slow]


class _Dir:
    __slots__ = ("children", "idx", "name", "parent")

    def __init__(self, name: str, parent: _Dir | None) -> None:
        self.name = name
        self.parent = parent
        self.children: dict[str, _Dir | _Entry] = {}
        self.idx = -1

    def path(self) -> str:
        parts: list[str] = []
        d: _Dir | None = self
        while d is not None and d.parent is not None:
            parts.append(d.name)
            d = d.parent
        return "/".join(reversed(parts))

    def depth(self) -> int:
        n, d = 0, self.parent
        while d is not None:
            n, d = n + 1, d.parent
        return n


class _Entry:
    """One name of a file; ``inode`` is shared by hard links."""

    __slots__ = ("idx", "inode", "name", "parent")

    def __init__(self, name: str, parent: _Dir, inode: list[int]) -> None:
        self.name = name
        self.parent = parent
        self.inode = inode  # [id, size, nlink]
        self.idx = -1

    def path(self) -> str:
        p = self.parent.path()
        return f"{p}/{self.name}" if p else self.name


class _Model:
    """The namespace a stream should leave, with O(1) random picks."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.root = _Dir("", None)
        self.dirs: list[_Dir] = [self.root]
        self.root.idx = 0
        self.entries: list[_Entry] = []
        self.inodes = 0
        self.n = 0

    def _name(self, d: _Dir, prefix: str) -> str:
        self.n += 1
        name = f"{prefix}{self.n:x}"
        assert name not in d.children
        return name

    @staticmethod
    def _add(lst: list, item: _Dir | _Entry) -> None:  # type: ignore[type-arg]
        item.idx = len(lst)
        lst.append(item)

    @staticmethod
    def _remove(lst: list, item: _Dir | _Entry) -> None:  # type: ignore[type-arg]
        last = lst.pop()
        if last is not item:
            lst[item.idx] = last
            last.idx = item.idx

    def _deep_dir(self) -> _Dir:
        # Deep trees: most picks go to the deeper of two random directories.
        a = self.dirs[self.rng.randrange(len(self.dirs))]
        b = self.dirs[self.rng.randrange(len(self.dirs))]
        return a if a.depth() >= b.depth() else b

    def ops(self, count: int) -> Iterator[Op]:
        rng = self.rng
        while count > 0:
            r = rng.random()
            if r < 0.08 or len(self.dirs) < 20:
                parent = self._deep_dir()
                if parent.depth() >= 24:
                    continue
                d = _Dir(self._name(parent, "d"), parent)
                parent.children[d.name] = d
                self._add(self.dirs, d)
                yield Op("mkdir", d.path())
            elif r < 0.40 or not self.entries:
                parent = self._deep_dir()
                size = rng.choice((0, 1, 700, 4096, 5000, 12288, 40000))
                e = _Entry(self._name(parent, "f"), parent, [self.inodes, size, 1])
                self.inodes += 1
                parent.children[e.name] = e
                self._add(self.entries, e)
                yield Op("create", e.path(), size=size)
            elif r < 0.55:
                e = self.entries[rng.randrange(len(self.entries))]
                yield Op("delete", e.path())
                del e.parent.children[e.name]
                self._remove(self.entries, e)
                e.inode[2] -= 1
            elif r < 0.72:
                e = self.entries[rng.randrange(len(self.entries))]
                src = e.path()
                dest_dir = self._deep_dir()
                del e.parent.children[e.name]
                e.name, e.parent = self._name(dest_dir, "r"), dest_dir
                dest_dir.children[e.name] = e
                yield Op("rename", src, dest=e.path())
            elif r < 0.88:
                e = self.entries[rng.randrange(len(self.entries))]
                dest_dir = self._deep_dir()
                new = _Entry(self._name(dest_dir, "l"), dest_dir, e.inode)
                e.inode[2] += 1
                dest_dir.children[new.name] = new
                self._add(self.entries, new)
                yield Op("link", e.path(), dest=new.path())
            elif r < 0.93:
                e = self.entries[rng.randrange(len(self.entries))]
                e.inode[1] += 3000
                yield Op("append", e.path(), size=3000)
            elif r < 0.98:
                # Rename a directory under another one (never into its own subtree).
                d = self.dirs[rng.randrange(1, len(self.dirs))]
                dest = self._deep_dir()
                a: _Dir | None = dest
                while a is not None and a is not d:
                    a = a.parent
                if a is d or d.depth() + dest.depth() > 30:
                    continue
                assert d.parent is not None
                src = d.path()
                del d.parent.children[d.name]
                d.name, d.parent = self._name(dest, "m"), dest
                dest.children[d.name] = d
                yield Op("rename", src, dest=d.path())
            else:
                d = self.dirs[rng.randrange(1, len(self.dirs))]
                if d.children:
                    continue
                assert d.parent is not None
                yield Op("delete", d.path())
                del d.parent.children[d.name]
                self._remove(self.dirs, d)
            count -= 1

    def expected(self) -> tuple[set[str], dict[str, tuple[int, int, int]]]:
        dirs = {d.path() for d in self.dirs if d.parent is not None}
        files = {e.path(): (e.inode[0], e.inode[1], e.inode[2]) for e in self.entries}
        return dirs, files


def test_long_stream_with_renames_links_and_deep_trees(tmp_path: Path) -> None:
    model = _Model(14)
    ops_file = tmp_path / "long.jsonl"
    count = write_workload(ops_file, WorkloadHeader("test/long-run", seed=14), model.ops(100_000))
    assert count == 100_000
    want_dirs, want_files = model.expected()
    assert len(want_dirs) > 2000  # far more directories than the descriptor cache holds
    assert max(p.count("/") for p in want_dirs) >= 12

    img = tmp_path / "long.img"
    with open(img, "wb") as fh:
        fh.truncate(1 << 30)
    run_tool(["mkfs.ext4", "-F", "-q", "-N", "200000", str(img)], "mkfs")
    res = age(img, AgeOptions(ops_file=ops_file, mode="mount"))
    assert res.finished and res.ops == count and res.skipped == 0 and res.nospace == 0

    fsck = subprocess.run(["e2fsck", "-fn", str(img)], capture_output=True, text=True)
    assert fsck.returncode == 0, fsck.stdout + fsck.stderr

    got_dirs: set[str] = set()
    got_files: dict[str, os.stat_result] = {}
    with loop_mount(img) as mnt:
        for dirpath, dirnames, filenames in os.walk(mnt):
            rel = os.path.relpath(dirpath, mnt)
            if rel == ".":
                rel = ""
                dirnames.remove("lost+found")
            for d in dirnames:
                got_dirs.add(f"{rel}/{d}" if rel else d)
            for f in filenames:
                p = f"{rel}/{f}" if rel else f
                got_files[p] = os.lstat(os.path.join(dirpath, f))
    assert got_dirs == want_dirs
    assert set(got_files) == set(want_files)
    ino_of: dict[int, int] = {}
    for p, (ident, size, nlink) in want_files.items():
        st = got_files[p]
        assert (st.st_size, st.st_nlink) == (size, nlink), p
        assert ino_of.setdefault(ident, st.st_ino) == st.st_ino, p  # links share an inode
    assert len(set(ino_of.values())) == len(ino_of)
    assert sum(1 for _i, _s, n in want_files.values() if n > 1) > 1000
