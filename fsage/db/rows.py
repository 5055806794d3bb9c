"""Snapshot rows as the store reads them: the SELECT behind them, the check against their
checksum, and the summary a new snapshot reports.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from fsage.db.checksum import (
    FS_COLUMNS,
    SNAPSHOT_COLUMNS,
    DamagedError,
    matches,
    row_crc,
)
from fsage.text import shown


@dataclass(frozen=True)
class SnapshotRow:
    id: int
    fs_name: str
    uuid: str
    kind: str
    taken_at: datetime
    source: str
    block_size: int
    files: int
    dirs: int
    extents: int
    blocks_used: int
    blocks_free: int
    free_extents: int
    damaged: int
    new_files: int
    changed_files: int
    deleted_files: int
    seconds: float
    op_count: int | None
    bytes_written: int | None
    label: str | None
    recreation_of: int | None
    regular_files: int | None = None  # "files" in fsage's output; ``files`` counts inodes

    def to_json(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["taken_at"] = self.taken_at.isoformat()
        out["fs"] = out.pop("fs_name")
        return {"id": out.pop("id"), "fs": out.pop("fs"), **out}


@dataclass(frozen=True)
class SnapshotSummary:
    snapshot_id: int
    fs_name: str
    files: int
    extents: int
    free_extents: int
    new_files: int
    changed_files: int
    deleted_files: int
    damaged: int
    seconds: float
    regular_files: int = 0

    def to_json(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["id"] = out.pop("snapshot_id")
        out["fs"] = out.pop("fs_name")
        out["inodes"] = out.pop("files")
        out["files"] = out.pop("regular_files")
        return {"id": out.pop("id"), "fs": out.pop("fs"), **out}

    def line(self) -> str:
        damaged = f", {self.damaged} damaged" if self.damaged else ""
        return (
            f"snapshot {self.snapshot_id} of {shown(self.fs_name)}: {self.regular_files} files "
            f"({self.files} inodes), "
            f"{self.extents} extents, {self.free_extents} free extents; "
            f"{self.new_files} new, {self.changed_files} changed, {self.deleted_files} deleted"
            f"{damaged}; {self.seconds:.2f} s"
        )


SNAPSHOT_SELECT = """
    SELECT s.id, f.name, f.uuid, s.kind, s.taken_at, s.source,
           json_extract(s.facts, '$.block_size'), s.files, s.dirs, s.extents, s.blocks_used,
           s.blocks_free, s.free_extents, s.damaged, s.new_files, s.changed_files,
           s.deleted_files, s.seconds, s.op_count, s.bytes_written, s.label, s.recreation_of,
           s.regular_files, s.crc, {columns}
    FROM snapshots s JOIN filesystems f ON f.id = s.fs_id
""".format(columns=", ".join([f"s.{c}" for c in SNAPSHOT_COLUMNS] + [f"f.{c}" for c in FS_COLUMNS]))


CRC_COVERED = SNAPSHOT_SELECT.split("s.crc, ", 1)[1]  # what a snapshot's checksum covers


SHOWN_FIELDS = 23  # the SnapshotRow fields SNAPSHOT_SELECT starts with


def row_to_snapshot(row: tuple[Any, ...]) -> SnapshotRow:
    """A snapshot row as read, once it matches its checksum."""
    values = list(row[:SHOWN_FIELDS])
    crc, covered = row[SHOWN_FIELDS], row[SHOWN_FIELDS + 1 :]
    if not matches(crc, row_crc(covered)):
        raise DamagedError(f"snapshot {values[0]} is damaged (its row does not match its checksum)")
    try:
        values[4] = datetime.fromisoformat(values[4])
    except (TypeError, ValueError):
        raise DamagedError(f"snapshot {values[0]} is damaged (its time does not parse)") from None
    return SnapshotRow(*values)
