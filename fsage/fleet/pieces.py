"""Parquet output cut into files of a bounded number of row groups.

A Parquet writer keeps every row group's column metadata until it closes (about 870 bytes a
column, 22 KB a row group of file versions), so one file of a large export run or compaction
held memory that grew with the rows. Such output goes to pieces instead: ``NAME.parquet``,
then ``NAME_0001.parquet`` and on (``_`` sorts after ``.``, so the pieces list in order).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def piece_name(first: str, k: int) -> str:
    """The name of the ``k``-th piece of the output whose first piece is ``first``."""
    if k == 0:
        return first
    stem, _, ext = first.partition(".")
    return f"{stem}_{k:04d}.{ext}"


def first_piece(name: str) -> str:
    """The name of the first piece of the output ``name`` belongs to."""
    stem, _, ext = name.partition(".")
    return f"{stem.split('_')[0]}.{ext}"


class PieceWriter:
    """Tables written in row groups of ``group`` rows (the last of each table may be
    shorter), a piece holding ``per_file`` of them; ``open_piece(k)`` gives the writer of the
    ``k``-th piece, when it has rows to write. Only the open piece's writer is kept: a closed
    one still holds its file's metadata."""

    def __init__(self, open_piece: Callable[[int], Any], group: int, per_file: int) -> None:
        self.open_piece = open_piece
        self.group = group
        self.per_file = per_file
        self.writer = open_piece(0)
        self.pieces = 1
        self.groups = 0  # in the open piece

    def write(self, table: Any) -> None:
        """``table``'s rows (an empty table an empty row group, as a writer is given it)."""
        if table.num_rows == 0:
            self.writer.write_table(table)
            return
        for lo in range(0, table.num_rows, self.group):
            if self.groups == self.per_file:
                self.writer.close()
                self.writer = self.open_piece(self.pieces)
                self.pieces += 1
                self.groups = 0
            self.writer.write_table(table.slice(lo, self.group), row_group_size=self.group)
            self.groups += 1

    def close(self) -> None:
        self.writer.close()
