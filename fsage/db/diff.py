"""What changed between a snapshot and the versions the store holds: new, changed and deleted
files, and the rows to store.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from fsage.db import versions
from fsage.layout import FileTable, Layout


@dataclass
class FileDiff:
    new: int
    changed: int
    deleted: int
    superseded: npt.NDArray[np.int64]  # rows of the current versions that end now
    write_rows: npt.NDArray[np.int64]  # rows of the new table to store as new versions


def compare_files(
    now: versions.Current,
    ino: npt.NDArray[np.uint64],
    generation: npt.NDArray[np.uint32],
    digests: npt.NDArray[np.int64],
    counted: npt.NDArray[np.bool_],
) -> FileDiff:
    """Classify files against the current versions of the previous snapshot.

    A reused inode number (different generation) counts as one deletion and one creation.
    Only rows flagged ``counted`` (user files, not reserved inodes) enter the counts.
    """
    if len(now) == 0:
        everything = np.arange(len(ino), dtype=np.int64)
        return FileDiff(int(np.count_nonzero(counted)), 0, 0, np.zeros(0, np.int64), everything)
    pos = np.searchsorted(now.ino, ino)
    pos_c = np.minimum(pos, len(now) - 1)
    found = (pos < len(now)) & (now.ino[pos_c] == ino)
    same_gen = found & (now.generation[pos_c] == generation.astype(np.int64))
    same = found & (now.digest[pos_c] == digests)
    changed = same_gen & ~same
    recreated = found & ~same_gen
    new = ~found | recreated
    gone = np.ones(len(now), bool)
    gone[pos_c[found]] = False
    # Reserved inodes keep their numbers below the first user inode, so none is "gone" here.
    return FileDiff(
        new=int(np.count_nonzero(new & counted)),
        changed=int(np.count_nonzero(changed & counted)),
        deleted=int(np.count_nonzero(gone)) + int(np.count_nonzero(recreated & counted)),
        superseded=np.concatenate([np.flatnonzero(gone), pos_c[found & ~same]]),
        write_rows=np.flatnonzero(~same),
    )


def rows_of(table: FileTable, rows: npt.NDArray[np.int64]) -> FileTable:
    """``table.take(rows)``; views of its arrays when the rows are consecutive (a snapshot's
    user files follow its reserved inodes in one chunk: no copy of every column)."""
    if (
        rows.size
        and int(rows[-1]) - int(rows[0]) + 1 == rows.size
        and bool(np.all(rows[1:] > rows[:-1]))
    ):
        return table.slice(int(rows[0]), int(rows[-1]) + 1)
    return table.take(rows)


def all_files(layout: Layout) -> tuple[FileTable, npt.NDArray[np.bool_]]:
    """Reserved inodes then user files as one table, with a flag for the former.

    Not in ino order (the root directory, a user file, comes after the reserved inodes): nothing
    downstream needs it, and readers that hand over both as parts of one table are joined
    without a copy.
    """
    if len(layout.special) == 0:  # the live reader's layouts: no copy of every column
        return layout.files, np.zeros(len(layout.files), bool)
    both = FileTable.concat([layout.special, layout.files])
    special = np.zeros(len(both), bool)
    special[: len(layout.special)] = True
    return both, special
