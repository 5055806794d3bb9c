"""Typed stub of libfuse3's low-level loop over a Python object (fsage/_fuse.c)."""

SET_MODE: int
SET_UID: int
SET_GID: int
SET_SIZE: int
SET_ATIME: int
SET_MTIME: int
SET_ATIME_NOW: int
SET_MTIME_NOW: int
SET_CTIME: int
RENAME_NOREPLACE: int
RENAME_EXCHANGE: int

class Session:
    def __init__(
        self, ops: object, mountpoint: str, options: str, writeback: bool = True
    ) -> None: ...
    def loop(self) -> int: ...
    def unmount(self) -> None: ...
    def fd(self) -> int: ...
    def inval_inode(self, ino: int) -> None: ...
    def inval_entry(self, parent: int, name: bytes) -> None: ...
