"""A snapshot as replay sees it: its replayable entries keyed by identity, with validated names
(``_entries``), their block runs and sparse pieces, and the counts of what was inferred and
skipped (``DeltaStats``). See ``fsage.replay.deltas`` for how the entries become ops."""

from __future__ import annotations

import stat
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fsage.layout import Layout
from fsage.workload import CREATE_MODE, MODE_BITS

#: Identity of a file: (inode, generation, creation time ns). Synthetic entries (the root, the
#: mkfs-made lost+found, intra-day files, temporaries) use negative inode numbers.
Key = tuple[int, int, int]
ROOT: Key = (-1, 0, 0)
LOST_FOUND: Key = (-2, 0, 0)
LOST_FOUND_NAME = "lost+found"
NAME_MAX = 255
#: Inode types the op vocabulary makes: directories, regular files (``create``), symlinks
#: (``symlink``, a target of the recorded length) and special files (``mknod``).
_SPECIAL = {
    stat.S_IFIFO: "fifo",
    stat.S_IFSOCK: "socket",
    stat.S_IFCHR: "char",
    stat.S_IFBLK: "block",
}
_MADE_TYPES = frozenset({stat.S_IFDIR, stat.S_IFREG, stat.S_IFLNK, *_SPECIAL})
_IFMT = 0o170000  # stat.S_IFMT as a mask, applied inline in the per-file loops

INFERRED_KINDS = (
    "mkdir",
    "create",
    "grow",
    "shrink",
    "rewrite",
    "overwrite",
    "rename",
    "link",
    "unlink",
    "delete",
    "rmdir",
    "intra_create",
    "intra_delete",
    "symlink",
    "special",
    "setattr",
)


@dataclass
class DeltaStats:
    """What was inferred (op counts by kind), what was skipped and why, bytes written."""

    inferred: dict[str, int] = field(default_factory=lambda: dict.fromkeys(INFERRED_KINDS, 0))
    skipped: dict[str, set[Key]] = field(default_factory=dict)
    ops: int = 0
    bytes: int = 0
    intervals: list[dict[str, Any]] = field(default_factory=list)

    def skip(self, reason: str, key: Key) -> None:
        self.skipped.setdefault(reason, set()).add(key)

    def skipped_counts(self) -> dict[str, int]:
        return {k: len(v) for k, v in sorted(self.skipped.items())}

    def to_json(self) -> dict[str, Any]:
        return {
            "ops": self.ops,
            "bytes": self.bytes,
            "inferred": dict(self.inferred),
            "skipped": self.skipped_counts(),
            "intervals": self.intervals,
        }


@dataclass(slots=True)
class _Link:
    parent: Key
    name: str
    path: str


@dataclass(slots=True)
class _Entry:
    key: Key
    is_dir: bool
    row: int
    size: int
    mtime: int
    ctime: int
    crtime: int
    links: list[_Link]  # valid names, sorted by path; the first is the primary
    ftype: int = stat.S_IFREG  # S_IFMT of the inode
    perm: int = CREATE_MODE  # permission bits


def _entries(layout: Layout, stats: DeltaStats) -> dict[Key, _Entry]:
    """Replayable entries of ``layout`` with their validated names, keyed by identity.

    Walks the link table from the root; a link with an unsafe name is skipped (and what lies
    below it is unreachable). The root-level lost+found is the one mkfs makes: it is never
    made, moved or removed, but what it holds is replayed like anything else.
    """
    files = layout.files
    # Whole columns as Python lists once: indexing numpy arrays per file costs more than the
    # rest of the walk.
    ino = files.ino.tolist()
    gen = files.generation.tolist()
    crt = files.crtime.tolist()
    mode = files.mode.tolist()
    size = files.size.tolist()
    mtime = files.mtime.tolist()
    ctime = files.ctime.tolist()
    row_of = dict(zip(ino, range(len(ino)), strict=True))  # a repeated inode: its last row
    root = layout.root_ino
    children: dict[int, list[tuple[int, bytes]]] = {}
    links = layout.links
    off = links.name_off.tolist()
    names = links.names
    for p, c, a, b in zip(
        links.parent.tolist(), links.ino.tolist(), off[:-1], off[1:], strict=True
    ):
        kids = children.get(p)
        if kids is None:
            kids = children[p] = []
        kids.append((c, names[a:b]))

    out: dict[Key, _Entry] = {}
    dkey: dict[int, Key] = {root: ROOT}
    stack: list[tuple[int, str]] = [(root, "")]
    seen_dirs = {root}
    # A name the op vocabulary can carry: 1..NAME_MAX bytes, not '.' or '..', no '/' or NUL
    # (those two bytes are looked for name by name only when the name table holds any).
    clean = b"/" not in names and b"\0" not in names
    while stack:
        d, prefix = stack.pop()
        parent = dkey[d]
        for c, raw in children.get(d, ()):
            r = row_of.get(c)
            if r is None or c == root:
                continue
            key = (c, gen[r], crt[r])
            if not (
                0 < len(raw) <= NAME_MAX
                and raw != b"."
                and raw != b".."
                and (clean or (b"/" not in raw and b"\0" not in raw))
            ):
                stats.skip("unsafe_name", key)
                continue
            name = raw.decode("utf-8", "surrogateescape")
            path = f"{prefix}/{name}" if prefix else name
            m = mode[r]
            fmt = m & _IFMT
            if fmt == stat.S_IFDIR:
                if d == root and name == LOST_FOUND_NAME:
                    dkey[c] = LOST_FOUND
                    if c not in seen_dirs:
                        seen_dirs.add(c)
                        stack.append((c, path))
                    continue
                if c in seen_dirs:  # a second name for a directory: a damaged tree
                    stats.skip("directory_loop", key)
                    continue
                seen_dirs.add(c)
                dkey[c] = key
                stack.append((c, path))
            elif fmt not in _MADE_TYPES:
                stats.skip("special_file", key)
                continue
            e = out.get(key)
            if e is None:
                e = out[key] = _Entry(
                    key, fmt == stat.S_IFDIR, r, size[r], mtime[r], ctime[r], crt[r], [], fmt,
                    m & MODE_BITS,
                )  # fmt: skip
            e.links.append(_Link(parent, name, path))
    for e in out.values():
        if len(e.links) > 1:
            e.links.sort(key=lambda lk: lk.path)
    return out


def _runs(layout: Layout, row: int) -> list[tuple[int, int, int]]:
    """Block mapping of one file as maximal (logical, physical, length) runs."""
    f = layout.files
    a, b = int(f.ext_off[row]), int(f.ext_off[row + 1])
    if a == b:
        return []
    lg = f.ext_logical[a:b].tolist()
    ph = f.ext_physical[a:b].tolist()
    ln = f.ext_length[a:b].tolist()
    out: list[tuple[int, int, int]] = []
    for lo, p, n in sorted(zip(lg, ph, ln, strict=True)):
        if n <= 0:
            continue
        if out and out[-1][0] + out[-1][2] == lo and out[-1][1] + out[-1][2] == p:
            out[-1] = (out[-1][0], out[-1][1], out[-1][2] + n)
        else:
            out.append((lo, p, n))
    return out


#: A layout's extent offsets, logical starts and lengths as Python lists (read file by file).
_ExtentLists = tuple[list[int], list[int], list[int]]


def _extent_lists(layout: Layout) -> _ExtentLists:
    f = layout.files
    return f.ext_off.tolist(), f.ext_logical.tolist(), f.ext_length.tolist()


def _sparse_pieces(
    layout: Layout, e: _Entry, bs: int, extents: _ExtentLists
) -> list[tuple[int, int]] | None:
    """The (byte offset, bytes) pieces of a sparse regular file that hold blocks, or None when
    the file has no hole (or may keep its data in the inode). ``extents``: the layout's."""
    if e.size <= 0:
        return None
    nblocks = -(-e.size // bs)
    ext_off, ext_logical, ext_length = extents
    a = ext_off[e.row]
    if ext_off[e.row + 1] - a == 1 and ext_logical[a] == 0 and ext_length[a] >= nblocks:
        return None  # one extent from the start past the end: the usual file, no hole
    runs = _runs(layout, e.row)
    covered = sum(min(lo + n, nblocks) - lo for lo, _p, n in runs if lo < nblocks)
    if covered >= nblocks:
        return None
    if not runs:
        # No block at all: all hole, unless the data is in the inode (inline data) or the
        # layout does not say which features the file system has.
        feats = layout.facts.mkfs.get("features")
        if not feats or "inline_data" in feats:
            return None
    pieces: list[tuple[int, int]] = []
    for lo, _p, n in runs:
        if lo >= nblocks:
            continue
        start = lo * bs
        end = min((lo + n) * bs, e.size)
        if pieces and pieces[-1][0] + pieces[-1][1] == start:
            pieces[-1] = (pieces[-1][0], end - pieces[-1][0])
        else:
            pieces.append((start, end - start))
    return pieces


def _blocks_moved(
    old: list[tuple[int, int, int]], new: list[tuple[int, int, int]], limit: int
) -> bool:
    """True when a block the file had below logical ``limit`` is no longer where it was."""
    starts = [r[0] for r in new]
    for lo, p, n in old:
        if lo >= limit:
            break
        n = min(n, limit - lo)
        i = int(np.searchsorted(starts, lo, side="right")) - 1
        if i < 0:
            return True
        nlo, np_, nn = new[i]
        if lo + n > nlo + nn or p - lo != np_ - nlo:
            return True
    return False
