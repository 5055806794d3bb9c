"""The directories' prefixes of an export's first paths (``fsage.fleet.export_prefixes``),
against the layout's own path derivation (``derive_paths``), and what they hold."""

from __future__ import annotations

import random
import tracemalloc

import numpy as np
import pytest

from fsage.fleet.export_prefixes import Prefixes
from fsage.fleet.export_rows import FirstPaths
from fsage.layout import LinkTable, derive_paths


def _tree(seed: int) -> LinkTable:
    """A random tree under inode 2 with what a damaged or odd one holds: a directory with
    two names, a loop, an orphaned subtree, names that are not UTF-8, files with several
    names."""
    rng = random.Random(seed)
    dirs = [2]
    parents, inos, names = [], [], []
    next_ino = 10
    for _ in range(rng.randrange(5, 60)):
        parent = rng.choice(dirs)
        parents.append(parent)
        inos.append(next_ino)
        names.append(rng.choice([b"d", b"e\xff", "\u00e9".encode(), b"z", b"a"]) + b"%d" % next_ino)
        dirs.append(next_ino)
        next_ino += 1
    for _ in range(rng.randrange(0, 4)):  # a second name of a directory (or a loop)
        parents.append(rng.choice(dirs))
        inos.append(rng.choice(dirs[1:]))
        names.append(b"again%d" % rng.randrange(100))
    parents.append(999)  # an orphaned subtree
    inos.append(1000)
    names.append(b"lost")
    dirs.append(1000)
    for _ in range(rng.randrange(20, 200)):
        parents.append(rng.choice(dirs))
        inos.append(rng.choice([next_ino, rng.randrange(10, next_ino + 1)]))
        names.append(rng.choice([b"f", b"g\xfe\xff", b"h"]) + b"%d" % rng.randrange(1000))
        next_ino += 1
    order = list(range(len(parents)))
    rng.shuffle(order)  # link order is not tree order
    return LinkTable.from_lists(
        [parents[i] for i in order], [inos[i] for i in order], [names[i] for i in order]
    )


@pytest.mark.parametrize("seed", range(40))
def test_first_paths_are_the_smallest_paths_derive_paths_finds(seed: int) -> None:
    links = _tree(seed)
    want = derive_paths(links, 2)
    inos = np.unique(np.concatenate([links.ino.astype(np.int64), [2, 5000]]))
    got = FirstPaths(links, root_ino=2).first(inos)
    assert got == [min(want[i]) if i in want else None for i in inos.tolist()]


def test_a_directory_costs_its_path_and_a_few_numbers() -> None:
    """100k directories (a tree of ~2M files): the prefixes held are their path bytes and
    24 bytes each, not a dict of strings (~150 bytes a directory more)."""
    n = 100_000
    parent = np.where(np.arange(n) < 100, 2, 10 + np.arange(n) // 1000).astype(np.int64)
    ino = (10 + np.arange(n)).astype(np.int64)
    raw = [b"dir%d" % i for i in range(n)]
    lens = np.array([len(r) for r in raw], np.int64)
    off = np.zeros(n + 1, np.int64)
    np.cumsum(lens, out=off[1:])
    names = b"".join(raw)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        p = Prefixes.walk(parent, ino, off[:-1], off[1:], names, 2)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(p) == n + 1
    assert p.get(10 + 1234) == "/dir1/dir1234"
    assert p.get(7) is None
    path_bytes = len(p.buf)
    assert held <= path_bytes + 40 * (n + 1), (held, path_bytes)
