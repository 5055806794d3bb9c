"""Reading some columns of a chunk blob, or some values of a column, gives what unpacking the
whole blob gives (fsage/_columns.c writes the blobs)."""

from __future__ import annotations

import numpy as np

from fsage.db import codec


def test_columns_and_values_read_alone_match_the_whole_blob() -> None:
    rng = np.random.default_rng(5)
    n = 10_000
    arrays = {
        "a": rng.integers(0, 2**40, n).astype(np.uint64),  # 5-byte values
        "b": np.full(n, 7, np.uint32),  # width 0: every value is the base
        "c": rng.integers(-(2**40), 2**40, n).astype(np.int64),  # signed, around a negative base
        "d": np.cumsum(rng.integers(0, 5, n)).astype(np.uint64),  # stored as differences
        "e": rng.integers(0, 256, n).astype(np.uint8),
    }
    columns: list[tuple[str, type[np.generic], bool]] = [
        ("a", np.uint64, False),
        ("b", np.uint32, False),
        ("c", np.int64, False),
        ("d", np.uint64, True),
        ("e", np.uint8, False),
    ]
    from fsage import _ext2fs

    blob = _ext2fs.pack_columns([(arrays[k], delta) for k, _, delta in columns])
    whole = codec._unpack(blob, columns)
    reader = codec.ColumnReader(blob, columns)
    for name, dtype, _ in columns:
        assert np.array_equal(reader[name], whole[name]) and reader[name].dtype == dtype
        assert np.array_equal(whole[name], arrays[name])
        for rows in (np.array([0, n - 1, 17, 17, 4000]), rng.integers(0, n, 5000)):
            got = reader.take(name, rows.astype(np.int64))  # few values, then many
            assert got.dtype == dtype and np.array_equal(got, arrays[name][rows]), name
