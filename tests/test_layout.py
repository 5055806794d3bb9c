"""FileTable's in-place and zero-copy operations agree with their copying counterparts."""

from __future__ import annotations

from dataclasses import fields

import numpy as np

from fsage.layout import FILE_COLUMNS, FileTable


def table(rows: int, seed: int = 0) -> FileTable:
    rng = np.random.default_rng(seed)
    ext = rng.integers(0, 4, rows)
    meta = rng.integers(0, 2, rows)
    ext_off = np.concatenate([[0], np.cumsum(ext)]).astype(np.uint64)
    meta_off = np.concatenate([[0], np.cumsum(meta)]).astype(np.uint64)
    n_ext, n_meta = int(ext.sum()), int(meta.sum())
    cols = {c: rng.integers(0, 1000, rows).astype(t) for c, t in FILE_COLUMNS.items()}
    cols["ino"] = np.arange(1, rows + 1, dtype=np.uint64)
    return FileTable(
        **cols,
        ext_off=ext_off,
        ext_logical=rng.integers(0, 99, n_ext).astype(np.uint64),
        ext_physical=rng.integers(0, 99, n_ext).astype(np.uint64),
        ext_length=rng.integers(1, 9, n_ext).astype(np.uint64),
        ext_flags=rng.integers(0, 2, n_ext).astype(np.uint32),
        meta_off=meta_off,
        meta_physical=rng.integers(0, 99, n_meta).astype(np.uint64),
        meta_kind=rng.integers(1, 5, n_meta).astype(np.uint8),
    )


def assert_same(a: FileTable, b: FileTable) -> None:
    for f in fields(FileTable):
        np.testing.assert_array_equal(getattr(a, f.name), getattr(b, f.name), err_msg=f.name)


def test_reorder_head_matches_take() -> None:
    t = table(12)
    order = np.array([3, 0, 4, 1, 2])
    want = t.take(np.concatenate([order, np.arange(5, 12)]))
    t.reorder_head(order)
    assert_same(t, want)


def test_concat_of_adjacent_slices_is_a_view() -> None:
    t = table(20, seed=1)
    joined = FileTable.concat([t.slice(0, 7), t.slice(7, 20)])
    assert_same(joined, t)
    assert np.shares_memory(joined.ino, t.ino)
    assert np.shares_memory(joined.ext_physical, t.ext_physical)
    # Not adjacent: a copy, still right.
    gap = FileTable.concat([t.slice(0, 7), t.slice(8, 20)])
    assert_same(gap, t.take(np.r_[0:7, 8:20]))
    assert not np.shares_memory(gap.ino, t.ino)
    # Swapped: a copy in the order asked for.
    swapped = FileTable.concat([t.slice(7, 20), t.slice(0, 7)])
    assert_same(swapped, t.take(np.r_[7:20, 0:7]))
