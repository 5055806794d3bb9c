"""Two snapshots side by side: layout score by size class, free space, and the files that
moved (the same inode, generation and data, placed on other blocks) between them."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from fsage.analyzer.history import analyze_snapshot
from fsage.db.store import Store
from fsage.layout import FileTable

U64 = npt.NDArray[np.uint64]

_MIX = np.uint64(0x9E3779B97F4A7C15)


def _placement(files: FileTable) -> U64:
    """A hash per file of its extents' (logical, physical, length): equal placements, equal
    hashes (a different placement colliding is a 2^-64 chance)."""
    n = len(files)
    with np.errstate(over="ignore"):
        h = (
            files.ext_logical.astype(np.uint64) * _MIX
            ^ (files.ext_physical.astype(np.uint64) + np.uint64(0x632BE59BD9B4E019)) * _MIX
            ^ files.ext_length.astype(np.uint64) * np.uint64(0xBF58476D1CE4E5B9)
        ) * _MIX
        off = files.ext_off.astype(np.int64)
        out = np.zeros(n, np.uint64)
        counts = off[1:] - off[:-1]
        has = np.flatnonzero(counts > 0)
        if has.size:
            out[has] = np.add.reduceat(h, off[:-1][has])
    return out


def compare_snapshots(store: Store, a_id: int, b_id: int) -> dict[str, Any]:
    """The comparison ``fsage report --compare A B`` draws."""
    rows = [store.snapshot(a_id), store.snapshot(b_id)]
    sides = [analyze_snapshot(store, r, {"size", "free"}) for r in rows]
    la, lb = (store.load_layout(r.id) for r in rows)
    fa, fb = la.files, lb.files
    reg_a, reg_b = fa.is_regular(), fb.is_regular()
    ia = fa.ino.astype(np.int64)
    ib = fb.ino.astype(np.int64)
    pos = np.searchsorted(ia, ib)
    pos_c = np.minimum(pos, max(len(fa) - 1, 0))
    same = (pos < len(fa)) & (ia[pos_c] == ib) if len(fa) else np.zeros(len(fb), bool)
    same &= fa.generation[pos_c] == fb.generation
    same &= reg_b & reg_a[pos_c]
    hb, ha = _placement(fb), _placement(fa)
    moved = same & (ha[pos_c] != hb)
    blocks_b = fb.data_blocks.astype(np.int64)
    in_both = int(same.sum())
    return {
        "a": _side(sides[0]),
        "b": _side(sides[1]),
        "files": {
            "in_both": in_both,
            "moved": int(moved.sum()),
            "moved_blocks": int(blocks_b[moved].sum()),
            "unchanged": in_both - int(moved.sum()),
            "only_in_a": int(reg_a.sum()) - in_both,
            "only_in_b": int(reg_b.sum()) - in_both,
        },
    }


def _side(a: dict[str, Any]) -> dict[str, Any]:
    return {
        k: a.get(k)
        for k in (
            "id",
            "fs",
            "taken_at",
            "block_size",
            "files",
            "layout_score",
            "blocks_free",
            "by_size",
            "free_extents",
            "largest_free_extent",
        )
    }
