"""The path-order walk of the modeled reads against a plain recursive walk: directories before
their entries, entries by name in byte order, a file with several names at its first link's
place, files no directory reaches left out."""

from __future__ import annotations

import random
import stat

import numpy as np

from fsage.analyzer.dynamic import walk_order
from fsage.layout import Layout

from .layouts import layout, table

ROOT = 2
NAMES = [
    b"a",
    b"a-x",
    "\U0001f600".encode(),
    b"a.b",
    b"ab",
    b"Z",
    b"z",
    "\u00e9".encode(),
    b"\xff\xfe",
    b"a\x01",
    b"b",
]


def random_tree(seed: int) -> Layout:
    """Directories and files under odd names (prefixes of each other, non-UTF-8, control
    bytes), hard links, and an inode nothing names."""
    rnd = random.Random(seed)
    dirs = [ROOT]
    links: list[tuple[int, int, bytes]] = []
    modes = {ROOT: stat.S_IFDIR | 0o755}
    ino = 12
    for _ in range(120):
        parent = rnd.choice(dirs)
        taken = {n for p, _, n in links if p == parent}
        free = [n for n in NAMES if n not in taken] + [f"n{ino}".encode()]
        name = rnd.choice(free)
        is_dir = rnd.random() < 0.3
        modes[ino] = (stat.S_IFDIR | 0o755) if is_dir else (stat.S_IFREG | 0o644)
        links.append((parent, ino, name))
        if is_dir:
            dirs.append(ino)
        ino += 1
    regular = [i for i, m in modes.items() if stat.S_ISREG(m)]
    for k in range(8):  # second names, in other directories
        target = rnd.choice(regular)
        links.append((rnd.choice(dirs), target, f"link{k}".encode()))
    modes[ino] = stat.S_IFREG | 0o644  # named by no directory
    rnd.shuffle(links)
    inos = sorted(modes)
    files = table([[(0, 100 + i, 1)] for i in inos], inos=inos, modes=[modes[i] for i in inos])
    return layout(files, links=links)


def reference_walk(lay: Layout) -> list[int]:
    """Inode numbers in the order a recursive walk by name meets them (each once)."""
    kids: dict[int, list[tuple[bytes, int]]] = {}
    first_link: dict[int, int] = {}
    for k, i in enumerate(lay.links.ino.tolist()):
        if i != ROOT:
            first_link.setdefault(i, k)
    for i, k in first_link.items():
        kids.setdefault(int(lay.links.parent[k]), []).append((lay.links.name(k), i))
    out: list[int] = []

    def visit(d: int) -> None:
        out.append(d)
        for _, child in sorted(kids.get(d, [])):
            visit(child)

    visit(ROOT)
    return out


def test_walk_order_is_a_recursive_walk_by_name_bytes() -> None:
    for seed in range(5):
        lay = random_tree(seed)
        everything = np.ones(len(lay.files), bool)
        got = lay.files.ino[walk_order(lay, everything)].tolist()
        assert got == reference_walk(lay), seed


def test_ranges_are_the_concatenated_aranges() -> None:
    from fsage.analyzer.dynamic import ranges

    rng = np.random.default_rng(2)
    lo = rng.integers(0, 1000, 300)
    hi = lo + rng.integers(0, 4, 300)  # empty ranges among them
    want = [v for a, b in zip(lo.tolist(), hi.tolist(), strict=True) for v in range(a, b)]
    assert ranges(lo, hi).tolist() == want
    assert ranges(lo[:0], hi[:0]).tolist() == []
