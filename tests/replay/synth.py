"""Synthetic Layouts for the delta tests: a few files and directories described by hand."""

from __future__ import annotations

import stat
from dataclasses import dataclass, field

import numpy as np

from fsage.layout import FileTable, FreeExtents, FsFacts, Layout, LinkTable

BS = 4096
S = 10**9  # one second in ns


@dataclass
class F:
    """One inode: ``links`` are (parent ino, name) pairs; ``ext`` (logical, physical, length)."""

    ino: int
    links: list[tuple[int, bytes]]
    size: int = 0
    kind: str = "file"  # file | dir | symlink | fifo
    gen: int = 1
    mtime: int = 0
    ctime: int = 0
    crtime: int = 0
    ext: list[tuple[int, int, int]] = field(default_factory=list)


def layout(entries: list[F]) -> Layout:
    """A Layout holding the root (ino 2) plus ``entries``."""
    root = F(2, [], kind="dir", gen=0)
    allf = sorted([root, *entries], key=lambda f: f.ino)
    modes = {
        "file": stat.S_IFREG | 0o644,
        "dir": stat.S_IFDIR | 0o755,
        "symlink": stat.S_IFLNK | 0o777,
        "fifo": stat.S_IFIFO | 0o644,
    }
    n = len(allf)
    ext_off = np.zeros(n + 1, np.uint64)
    ext_off[1:] = np.cumsum([len(f.ext) for f in allf])
    ext = [e for f in allf for e in f.ext]
    files = FileTable(
        ino=np.array([f.ino for f in allf], np.uint64),
        generation=np.array([f.gen for f in allf], np.uint32),
        mode=np.array([modes[f.kind] for f in allf], np.uint32),
        nlink=np.array([max(len(f.links), 1) for f in allf], np.uint32),
        uid=np.zeros(n, np.uint32),
        gid=np.zeros(n, np.uint32),
        size=np.array([f.size for f in allf], np.uint64),
        atime=np.zeros(n, np.int64),
        mtime=np.array([f.mtime for f in allf], np.int64),
        ctime=np.array([f.ctime or f.mtime for f in allf], np.int64),
        crtime=np.array([f.crtime for f in allf], np.int64),
        flags=np.zeros(n, np.uint32),
        damaged=np.zeros(n, np.uint32),
        ext_off=ext_off,
        ext_logical=np.array([e[0] for e in ext], np.uint64),
        ext_physical=np.array([e[1] for e in ext], np.uint64),
        ext_length=np.array([e[2] for e in ext], np.uint64),
        ext_flags=np.zeros(len(ext), np.uint32),
        meta_off=np.zeros(n + 1, np.uint64),
        meta_physical=np.zeros(0, np.uint64),
        meta_kind=np.zeros(0, np.uint8),
    )
    links = [(p, f.ino, name) for f in allf for p, name in f.links]
    lt = LinkTable.from_lists([x[0] for x in links], [x[1] for x in links], [x[2] for x in links])
    facts = FsFacts(
        kind="ext4", uuid="00000000-0000-0000-0000-000000000001", label="synth",
        block_size=BS, blocks_total=1 << 16, blocks_free=1 << 15,
    )  # fmt: skip
    return Layout(facts=facts, files=files, links=lt, free=FreeExtents.empty())
