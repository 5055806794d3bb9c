"""Checksums of what fsage stores, verified when it is read back.

SQLite checks the structure of its pages, not the bytes of the values in them: a flipped bit
in a chunk blob or a free map reads back without complaint and changes every answer drawn
from it. Each chunk blob, each list of ended versions and each snapshot row therefore carries
a CRC-32 (migration 9), and a reader that finds one that does not match names the damaged
snapshot instead of answering. Rows written before migration 9 have none (NULL) and are read
unchecked.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable

from fsage.errors import StoreError

# The columns of a snapshot row its checksum covers: all but the free map (it has its own, so
# that listing snapshots does not read every free map) and recreation_of (set to NULL when
# the snapshot it names is deleted); with them, its file system's row (never changed once
# written), whose name and uuid every listing shows.
FS_COLUMNS = ("name", "uuid", "kind")
SNAPSHOT_COLUMNS = (
    "id", "fs_id", "taken_at", "source", "kind", "facts", "files", "dirs", "extents",
    "blocks_used", "blocks_free", "free_extents", "damaged", "new_files", "changed_files",
    "deleted_files", "seconds", "notes", "op_count", "bytes_written", "label", "regular_files",
)  # fmt: skip

_TAG = struct.Struct("<cQ")


class DamagedError(StoreError):
    """What the database holds does not match its checksum, or cannot be decoded."""


def blob_crc(blob: bytes) -> int:
    return zlib.crc32(blob)


def row_crc(values: Iterable[object]) -> int:
    """The CRC-32 of a row's values, each with its type and length, so that neither a changed
    type nor a shifted boundary goes unseen."""
    crc = 0
    for v in values:
        if v is None:
            data, tag = b"", b"n"
        elif isinstance(v, bool | int):
            data, tag = str(int(v)).encode(), b"i"
        elif isinstance(v, float):
            data, tag = v.hex().encode(), b"f"
        elif isinstance(v, str):
            data, tag = v.encode("utf-8", "surrogatepass"), b"s"
        elif isinstance(v, bytes | bytearray | memoryview):
            data, tag = bytes(v), b"b"
        else:
            raise TypeError(f"no checksum for a value of type {type(v).__name__}")
        crc = zlib.crc32(data, zlib.crc32(_TAG.pack(tag, len(data)), crc))
    return crc


def matches(stored: object, actual: int) -> bool:
    """Whether a stored checksum (None: written before checksums) agrees."""
    return stored is None or stored == actual
