"""Parquet output cut into pieces of a bounded number of row groups (fsage.fleet.pieces)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fsage.fleet.pieces import PieceWriter, first_piece, piece_name

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def test_piece_names_sort_in_order_and_lead_back_to_the_first() -> None:
    names = [piece_name("c000003.parquet", k) for k in range(12)]
    assert names[:2] == ["c000003.parquet", "c000003_0001.parquet"]
    assert sorted(names) == names
    assert {first_piece(n) for n in names} == {"c000003.parquet"}
    run = piece_name("s0000000001-0000000004.parquet", 2)
    assert run == "s0000000001-0000000004_0002.parquet"
    assert first_piece(run) == "s0000000001-0000000004.parquet"


def test_pieces_hold_whole_row_groups_and_every_row_in_order(tmp_path: Path) -> None:
    """Tables of any size: each piece at most ``per_file`` row groups, all of ``group`` rows
    but each table's last; read back in piece order, the rows as written; no piece opened
    without rows, and an empty table an empty row group (not counted)."""
    schema = pa.schema([("v", pa.int64())])
    opened: list[Path] = []

    def open_piece(k: int) -> object:
        opened.append(tmp_path / piece_name("t.parquet", k))
        return pq.ParquetWriter(opened[-1], schema)

    out = PieceWriter(open_piece, group=10, per_file=3)
    rng = np.random.default_rng(4)
    at, sizes = 0, [int(n) for n in rng.integers(0, 45, 9)] + [0, 30]
    for n in sizes:
        out.write(pa.table({"v": np.arange(at, at + n)}, schema=schema))
        at += n
    out.close()
    files = sorted(tmp_path.glob("*.parquet"))
    assert files == opened and len(files) > 2
    groups = [pq.ParquetFile(f).metadata for f in files]
    full = [sum(m.row_group(i).num_rows > 0 for i in range(m.num_row_groups)) for m in groups]
    assert max(full) == 3, full  # an empty table's row group goes where the rows stand
    sizes_read = [m.row_group(i).num_rows for m in groups for i in range(m.num_row_groups)]
    assert all(0 <= n <= 10 for n in sizes_read) and 0 in sizes_read
    got = np.concatenate([pq.read_table(f).column("v").to_numpy() for f in files])
    assert got.tolist() == list(range(at))
