"""Synthetic Layouts for the delta tests (a few files and directories described by hand) and a
namespace model that replays op streams with POSIX-like checks."""

from __future__ import annotations

import stat
from dataclasses import dataclass, field

import numpy as np

from fsage.layout import FileTable, FreeExtents, FsFacts, Layout, LinkTable
from fsage.replay.deltas import DeltaBuilder
from fsage.workload import Op, check_relpath

BS = 4096
S = 10**9  # one second in ns


@dataclass
class F:
    """One inode: ``links`` are (parent ino, name) pairs; ``ext`` (logical, physical, length)."""

    ino: int
    links: list[tuple[int, bytes]]
    size: int = 0
    kind: str = "file"  # file | dir | symlink | fifo
    gen: int = 1
    mtime: int = 0
    ctime: int = 0
    crtime: int = 0
    ext: list[tuple[int, int, int]] = field(default_factory=list)
    perm: int | None = None  # permission bits; None: the kind's usual ones


def _mode(f: F, usual: int) -> int:
    return usual if f.perm is None else stat.S_IFMT(usual) | f.perm


def layout(entries: list[F]) -> Layout:
    """A Layout holding the root (ino 2) plus ``entries``."""
    root = F(2, [], kind="dir", gen=0)
    allf = sorted([root, *entries], key=lambda f: f.ino)
    modes = {
        "file": stat.S_IFREG | 0o644,
        "dir": stat.S_IFDIR | 0o755,
        "symlink": stat.S_IFLNK | 0o777,
        "fifo": stat.S_IFIFO | 0o644,
    }
    n = len(allf)
    ext_off = np.zeros(n + 1, np.uint64)
    ext_off[1:] = np.cumsum([len(f.ext) for f in allf])
    ext = [e for f in allf for e in f.ext]
    files = FileTable(
        ino=np.array([f.ino for f in allf], np.uint64),
        generation=np.array([f.gen for f in allf], np.uint32),
        mode=np.array([_mode(f, modes[f.kind]) for f in allf], np.uint32),
        nlink=np.array([max(len(f.links), 1) for f in allf], np.uint32),
        uid=np.zeros(n, np.uint32),
        gid=np.zeros(n, np.uint32),
        size=np.array([f.size for f in allf], np.uint64),
        atime=np.zeros(n, np.int64),
        mtime=np.array([f.mtime or f.crtime for f in allf], np.int64),  # unset: as made
        ctime=np.array([f.ctime or f.mtime or f.crtime for f in allf], np.int64),
        crtime=np.array([f.crtime for f in allf], np.int64),
        flags=np.zeros(n, np.uint32),
        damaged=np.zeros(n, np.uint32),
        ext_off=ext_off,
        ext_logical=np.array([e[0] for e in ext], np.uint64),
        ext_physical=np.array([e[1] for e in ext], np.uint64),
        ext_length=np.array([e[2] for e in ext], np.uint64),
        ext_flags=np.zeros(len(ext), np.uint32),
        meta_off=np.zeros(n + 1, np.uint64),
        meta_physical=np.zeros(0, np.uint64),
        meta_kind=np.zeros(0, np.uint8),
    )
    links = [(p, f.ino, name) for f in allf for p, name in f.links]
    lt = LinkTable.from_lists([x[0] for x in links], [x[1] for x in links], [x[2] for x in links])
    facts = FsFacts(
        kind="ext4", uuid="00000000-0000-0000-0000-000000000001", label="synth",
        block_size=BS, blocks_total=1 << 16, blocks_free=1 << 15,
    )  # fmt: skip
    return Layout(facts=facts, files=files, links=lt, free=FreeExtents.empty())


class Model:
    """A POSIX-like namespace that checks each op's preconditions: names -> inode numbers,
    inode -> size (files) or None (directories)."""

    def __init__(self) -> None:
        self.names: dict[str, int] = {"lost+found": 0}
        self.inodes: dict[int, int | None] = {0: None}
        self._next = 1

    def _parent_ok(self, p: str) -> None:
        head = p.rpartition("/")[0]
        assert head == "" or self.inodes.get(self.names.get(head, -1), 0) is None, p

    def _drop(self, p: str) -> None:
        ino = self.names.pop(p)
        if ino not in self.names.values():
            del self.inodes[ino]

    def apply(self, op: Op) -> None:
        if op.op in ("sync", "snapshot", "fsync"):
            return
        p = check_relpath(op.path)
        if op.op in ("mkdir", "create"):
            self._parent_ok(p)
            assert p not in self.names, f"{p} exists"
            self.names[p] = self._next
            self.inodes[self._next] = None if op.op == "mkdir" else op.size
            self._next += 1
        elif op.op == "link":
            check_relpath(op.dest)
            assert p in self.names and self.inodes[self.names[p]] is not None, p
            assert op.dest not in self.names, f"{op.dest} exists"
            self._parent_ok(op.dest)
            self.names[op.dest] = self.names[p]
        elif op.op == "setattr":
            assert p in self.names, f"setattr of missing {p}"
        elif op.op == "delete":
            assert p in self.names, f"delete of missing {p}"
            if self.inodes[self.names[p]] is None:
                assert not any(k.startswith(p + "/") for k in self.names), f"{p} not empty"
            self._drop(p)
        elif op.op == "rename":
            check_relpath(op.dest)
            assert p in self.names and op.dest not in self.names, (p, op.dest)
            self._parent_ok(op.dest)
            assert not op.dest.startswith(p + "/")
            moved = {k: v for k, v in self.names.items() if k == p or k.startswith(p + "/")}
            for k in moved:
                del self.names[k]
            for k, v in moved.items():
                self.names[op.dest + k[len(p) :]] = v
        else:
            ino = self.names[p]
            size = self.inodes[ino]
            assert size is not None, f"{op.op} on directory {p}"
            if op.op == "append":
                self.inodes[ino] = size + op.size
            elif op.op == "truncate":
                self.inodes[ino] = op.size
            elif op.op == "overwrite":
                self.inodes[ino] = max(size, op.offset + op.size)
            else:
                raise AssertionError(op.op)

    def run(self, ops: list[Op]) -> Model:
        for op in ops:
            self.apply(op)
        return self

    @property
    def t(self) -> dict[str, int | None]:
        """Each name with its file's size (None: a directory)."""
        return {name: self.inodes[ino] for name, ino in self.names.items()}

    def view(self) -> set[tuple[tuple[str, ...], int | None]]:
        """Each inode as (its sorted names, size), mkfs's lost+found left out."""
        groups: dict[int, list[str]] = {}
        for name, ino in self.names.items():
            if ino:
                groups.setdefault(ino, []).append(name)
        return {(tuple(sorted(v)), self.inodes[k]) for k, v in groups.items()}


#: The root's lost+found, as every synthetic ext layout has it.
LF = F(11, [(2, b"lost+found")], kind="dir", gen=0)


def two_intervals(a: list[F], b: list[F], **kw: object) -> tuple[list[Op], list[Op], DeltaBuilder]:
    """The ops a ``DeltaBuilder(**kw)`` infers for an empty file system becoming ``a`` (the
    first interval, ending at 100 s) and ``a`` becoming ``b`` (the second, ending at 200 s)."""
    bld = DeltaBuilder(**kw)  # type: ignore[arg-type]
    la, lb = layout([LF, *a]), layout([LF, *b])
    first = bld.interval(None, la, start_ns=None, end_ns=100 * S, label="s1")
    second = bld.interval(la, lb, start_ns=100 * S, end_ns=200 * S, label="s2")
    return first, second, bld


def body(ops: list[Op]) -> list[str]:
    """The ops as JSON lines, snapshot markers left out."""
    return [op.to_json() for op in ops if op.op != "snapshot"]
