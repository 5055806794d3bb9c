# mypy: disable-error-code="type-arg"
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Checkpoint(_message.Message):
    __slots__ = ["inode_inomap", "inode_inotbl", "inode_inovec", "next_seg", "segusage", "timestamp"]
    INODE_INOMAP_FIELD_NUMBER: _ClassVar[int]
    INODE_INOTBL_FIELD_NUMBER: _ClassVar[int]
    INODE_INOVEC_FIELD_NUMBER: _ClassVar[int]
    NEXT_SEG_FIELD_NUMBER: _ClassVar[int]
    SEGUSAGE_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    inode_inomap: InodeSimp
    inode_inotbl: InodeSimp
    inode_inovec: InodeSimp
    next_seg: int
    segusage: _containers.RepeatedCompositeFieldContainer[SegUsageRec]
    timestamp: int
    def __init__(self, timestamp: _Optional[int] = ..., next_seg: _Optional[int] = ..., inode_inomap: _Optional[_Union[InodeSimp, _Mapping]] = ..., inode_inovec: _Optional[_Union[InodeSimp, _Mapping]] = ..., inode_inotbl: _Optional[_Union[InodeSimp, _Mapping]] = ..., segusage: _Optional[_Iterable[_Union[SegUsageRec, _Mapping]]] = ...) -> None: ...

class DirChRec(_message.Message):
    __slots__ = ["ino", "name", "op"]
    class Operation(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = []
    ADD: DirChRec.Operation
    INO_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    NONE: DirChRec.Operation
    OP_FIELD_NUMBER: _ClassVar[int]
    REMOVE: DirChRec.Operation
    ino: int
    name: str
    op: DirChRec.Operation
    def __init__(self, ino: _Optional[int] = ..., name: _Optional[str] = ..., op: _Optional[_Union[DirChRec.Operation, str]] = ...) -> None: ...

class DirFile(_message.Message):
    __slots__ = ["list"]
    LIST_FIELD_NUMBER: _ClassVar[int]
    list: _containers.RepeatedCompositeFieldContainer[DirFileRec]
    def __init__(self, list: _Optional[_Iterable[_Union[DirFileRec, _Mapping]]] = ...) -> None: ...

class DirFileRec(_message.Message):
    __slots__ = ["ino", "name"]
    INO_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ino: int
    name: str
    def __init__(self, ino: _Optional[int] = ..., name: _Optional[str] = ...) -> None: ...

class InodeSimp(_message.Message):
    __slots__ = ["blkptr", "size", "ver"]
    BLKPTR_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    VER_FIELD_NUMBER: _ClassVar[int]
    blkptr: _containers.RepeatedScalarFieldContainer[int]
    size: int
    ver: int
    def __init__(self, size: _Optional[int] = ..., blkptr: _Optional[_Iterable[int]] = ..., ver: _Optional[int] = ...) -> None: ...

class InodeTblEntry(_message.Message):
    __slots__ = ["blkptr", "blocks", "body", "ctime", "gid", "mode", "mtime", "nlink", "size", "uid"]
    BLKPTR_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    CTIME_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    MTIME_FIELD_NUMBER: _ClassVar[int]
    NLINK_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    blkptr: _containers.RepeatedScalarFieldContainer[int]
    blocks: int
    body: bytes
    ctime: int
    gid: int
    mode: int
    mtime: int
    nlink: int
    size: int
    uid: int
    def __init__(self, mode: _Optional[int] = ..., nlink: _Optional[int] = ..., uid: _Optional[int] = ..., gid: _Optional[int] = ..., size: _Optional[int] = ..., blocks: _Optional[int] = ..., mtime: _Optional[int] = ..., ctime: _Optional[int] = ..., blkptr: _Optional[_Iterable[int]] = ..., body: _Optional[bytes] = ...) -> None: ...

class SegUsageRec(_message.Message):
    __slots__ = ["mtime", "nblks_live"]
    MTIME_FIELD_NUMBER: _ClassVar[int]
    NBLKS_LIVE_FIELD_NUMBER: _ClassVar[int]
    mtime: int
    nblks_live: int
    def __init__(self, nblks_live: _Optional[int] = ..., mtime: _Optional[int] = ...) -> None: ...

class Superblock(_message.Message):
    __slots__ = ["checkpoint_interval", "checkpoint_seg", "cleaning_policy", "first_logseg", "nblk_seg", "nblk_segsummary", "noctet_sector", "nsector_blk", "nseg_checkpoint", "nseg_disk", "uuid", "version"]
    CHECKPOINT_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_SEG_FIELD_NUMBER: _ClassVar[int]
    CLEANING_POLICY_FIELD_NUMBER: _ClassVar[int]
    FIRST_LOGSEG_FIELD_NUMBER: _ClassVar[int]
    NBLK_SEGSUMMARY_FIELD_NUMBER: _ClassVar[int]
    NBLK_SEG_FIELD_NUMBER: _ClassVar[int]
    NOCTET_SECTOR_FIELD_NUMBER: _ClassVar[int]
    NSECTOR_BLK_FIELD_NUMBER: _ClassVar[int]
    NSEG_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    NSEG_DISK_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    checkpoint_interval: int
    checkpoint_seg: _containers.RepeatedScalarFieldContainer[int]
    cleaning_policy: str
    first_logseg: int
    nblk_seg: int
    nblk_segsummary: int
    noctet_sector: int
    nsector_blk: int
    nseg_checkpoint: int
    nseg_disk: int
    uuid: str
    version: int
    def __init__(self, version: _Optional[int] = ..., noctet_sector: _Optional[int] = ..., nsector_blk: _Optional[int] = ..., nblk_seg: _Optional[int] = ..., nseg_disk: _Optional[int] = ..., first_logseg: _Optional[int] = ..., checkpoint_seg: _Optional[_Iterable[int]] = ..., nblk_segsummary: _Optional[int] = ..., nseg_checkpoint: _Optional[int] = ..., cleaning_policy: _Optional[str] = ..., checkpoint_interval: _Optional[int] = ..., uuid: _Optional[str] = ...) -> None: ...
