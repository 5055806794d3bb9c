"""Bring a killed run's journal back into agreement with the tree on disk.

An executor journals an op once it took effect, so a run killed (SIGKILL, not Ctrl-C) while an
op was running can leave that op's effect on the target, whole or in part, without its journal
line. ``--resume`` then compares the tree the journal replays to (from the tree the journal
started on) with the tree on disk: names, types and sizes. What one op can have left (a file
or directory made, removed, renamed or linked, a file grown or shrunk) comes back as that op,
to be journaled or completed; a bigger difference is reported and left alone.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from fsage.errors import WorkloadError
from fsage.private import write_private_text
from fsage.workload import Op, symlink_target


@dataclass
class Node:
    """What a tree holds at a path. Hard links share one node, so a write through one name
    shows under all of them."""

    kind: str  # d(irectory), f(ile), l (symlink), o(ther special file)
    size: int = 0  # a file's length, a symlink's target's
    extra: str = ""  # a symlink's target, a special file's kind (fifo, socket, char, block)


#: path relative to the target -> node
Tree = dict[str, Node]

_SPECIAL_LABELS = {stat.S_IFIFO: "fifo", stat.S_IFSOCK: "socket", stat.S_IFCHR: "char"}
_SPECIAL_LABELS[stat.S_IFBLK] = "block"


def disk_tree(root: Path, skip: Iterable[str] = ()) -> tuple[Tree, dict[str, int]]:
    """The tree below ``root`` (``skip``: names left out at its top, e.g. lost+found) and the
    inode number of each path, without following symlinks."""
    skipped = set(skip)
    tree: Tree = {}
    inodes: dict[str, int] = {}
    nodes: dict[int, Node] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        prefix = "" if rel == "." else rel + "/"
        if not prefix:
            dirnames[:] = [d for d in dirnames if d not in skipped]
            filenames = [f for f in filenames if f not in skipped]
        for name in dirnames + filenames:
            st = os.lstat(os.path.join(dirpath, name))
            path = prefix + name
            inodes[path] = st.st_ino
            if stat.S_ISDIR(st.st_mode):
                tree[path] = Node("d")
            elif st.st_ino in nodes and stat.S_ISREG(st.st_mode):
                tree[path] = nodes[st.st_ino]  # another name of a file already seen
            elif stat.S_ISREG(st.st_mode):
                tree[path] = nodes[st.st_ino] = Node("f", st.st_size)
            elif stat.S_ISLNK(st.st_mode):
                target = os.readlink(os.path.join(dirpath, name))
                tree[path] = Node("l", st.st_size, target)
            else:
                tree[path] = Node("o", 0, _SPECIAL_LABELS.get(stat.S_IFMT(st.st_mode), ""))
    return tree, inodes


def save_tree(path: Path, tree: Tree, inodes: dict[str, int]) -> None:
    """Write ``tree`` (the tree a journal starts on) as JSON: {path: [kind, size, extra,
    inode]}."""
    data = {p: [n.kind, n.size, n.extra, inodes.get(p, 0)] for p, n in tree.items()}
    tmp = path.with_name(path.name + ".part")
    write_private_text(tmp, json.dumps(data, sort_keys=True) + "\n")  # it names files
    tmp.replace(path)


def load_tree(path: Path) -> Tree:
    """The tree ``save_tree`` wrote (an empty tree when there is no such file)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise WorkloadError(f"cannot read {path}: {exc}") from None
    tree: Tree = {}
    nodes: dict[int, Node] = {}
    for p, (kind, size, extra, ino) in data.items():
        if kind != "f":
            tree[p] = Node(kind, size, extra)
        elif ino in nodes:
            tree[p] = nodes[ino]  # another name of the same file
        else:
            tree[p] = nodes[ino] = Node(kind, size)
    return tree


def _subtree(tree: Tree, path: str) -> list[str]:
    head = path + "/"
    return [p for p in tree if p == path or p.startswith(head)]


def apply_op(tree: Tree, op: Op, *, allocate_only: bool = False) -> None:
    """What ``op`` does to the names, types and sizes of ``tree`` when it takes effect (as the
    mounted-directory executor runs it); raises WorkloadError for an op that cannot have."""
    kind = op.op
    try:
        if kind == "mkdir":
            tree[op.path] = Node("d")
        elif kind == "create":
            node = tree.get(op.path)
            if node is not None and node.kind == "f":
                node.size = op.size  # rewritten in place (O_TRUNC): other names see it too
            else:
                tree[op.path] = Node("f", op.size)
        elif kind == "append":
            tree[op.path].size += op.size
        elif kind == "truncate":
            tree[op.path].size = op.size
        elif kind in ("overwrite", "fallocate", "allocate-near"):
            node = tree[op.path]
            if kind != "overwrite" or not allocate_only:
                node.size = max(node.size, op.offset + op.size)
        elif kind == "delete":
            del tree[op.path]
        elif kind == "rename":
            tree.pop(op.dest, None)  # replaced: a file, or an empty directory
            if tree[op.path].kind == "d":  # what it holds moves too (a scan: rare)
                for p in _subtree(tree, op.path):
                    tree[op.dest + p[len(op.path) :]] = tree.pop(p)
            else:
                tree[op.dest] = tree.pop(op.path)
        elif kind == "link":
            tree[op.dest] = tree[op.path]
        elif kind == "symlink":
            target = symlink_target(op)
            tree[op.path] = Node("l", len(os.fsencode(target)), target)
        elif kind == "mknod":
            tree[op.path] = Node("o", 0, op.label)
    except KeyError:
        raise WorkloadError(f"the journal's {kind} {op.path!r} finds nothing there") from None


def journal_tree(base: Tree, ops: Iterable[Op], *, allocate_only: bool = False) -> Tree:
    """``base`` after ``ops`` (a copy: ``base`` is left as it was)."""
    copies: dict[int, Node] = {}
    tree: Tree = {p: copies.setdefault(id(n), replace(n)) for p, n in base.items()}
    for op in ops:
        apply_op(tree, op, allocate_only=allocate_only)
    return tree


def _same(a: Node | None, b: Node | None) -> bool:
    return a == b  # kind, size and target alike (or both absent)


@dataclass
class Difference:
    """How the tree on disk differs from the journal's."""

    #: The op that turns the journal's tree into the one on disk, when one op can.
    op: Op | None
    #: Paths that differ (none: the trees agree).
    paths: list[str]


def difference(journaled: Tree, disk: Tree, inodes: dict[str, int]) -> Difference:
    """The one op that takes ``journaled`` to ``disk``, if there is one (``inodes``: the
    inode number of each path on disk, to tell a hard link from a new file)."""
    paths = sorted(
        p for p in journaled.keys() | disk.keys() if not _same(journaled.get(p), disk.get(p))
    )
    if not paths:
        return Difference(None, [])
    missing = [p for p in paths if p not in disk]
    extra = [p for p in paths if p not in journaled]
    changed = [p for p in paths if p in disk and p in journaled]
    roots_missing = [p for p in missing if p.rpartition("/")[0] not in missing]
    roots_extra = [p for p in extra if p.rpartition("/")[0] not in extra]
    op: Op | None = None
    if len(roots_missing) == 1 and len(roots_extra) + len(changed) == 1:
        # a rename: the missing subtree, moved, is what appeared (or replaced a file)
        src = roots_missing[0]
        dest = (roots_extra or changed)[0]
        moved = journal_tree(journaled, [Op("rename", src, dest=dest)])
        if all(_same(moved.get(p), disk.get(p)) for p in paths + _subtree(disk, dest)):
            op = Op("rename", src, dest=dest)
    elif not missing and not changed and len(extra) == 1:
        (path,) = extra
        node = disk[path]
        twin = [p for p, ino in inodes.items() if ino == inodes[path] and p != path]
        if node.kind == "f" and twin and twin[0] in journaled:
            op = Op("link", twin[0], dest=path)
        elif node.kind == "f":
            op = Op("create", path, size=node.size)
        elif node.kind == "d":
            op = Op("mkdir", path)
        elif node.kind == "l":
            op = Op("symlink", path, size=node.size, dest=node.extra)
        elif node.extra:
            op = Op("mknod", path, label=node.extra)
    elif len(missing) == 1 and not extra and not changed:
        op = Op("delete", missing[0])
    elif changed and not missing and not extra and len({inodes[p] for p in changed}) == 1:
        path = changed[0]  # a file written through one of its names shows under all of them
        was, now = journaled[path], disk[path]
        if was.kind == now.kind == "f":
            grown = now.size - was.size
            op = (
                Op("append", path, size=grown) if grown > 0 else Op("truncate", path, size=now.size)
            )
    return Difference(op, paths)


def durable_prefix(base: Tree, ops: list[Op], image: Tree, first: int = 0) -> int | None:
    """The largest ``k >= first`` such that ``base`` after ``ops[:k]`` has the directories and
    files of ``image`` (names, sizes; other kinds left out), or None.

    An image whose writer keeps the ops it ran in memory until it writes them out (a log's
    segment buffer) holds, after a kill, the ops up to some point of its journal: that point.
    """
    tree = journal_tree(base, ops[:first])

    def plain(node: Node | None) -> bool:
        return node is not None and node.kind in "df"

    count = sum(plain(n) for n in tree.values())  # directories and files, kept up per op
    found = None
    for k in range(first, len(ops) + 1):
        if count == len(image) and {p: n for p, n in tree.items() if plain(n)} == image:
            found = k
        if k == len(ops):
            break
        op = ops[k]
        names = {op.path, op.dest} - {""}
        count -= sum(plain(tree.get(p)) for p in names)
        try:
            apply_op(tree, op)
        except WorkloadError:
            break
        count += sum(plain(tree.get(p)) for p in names)
    return found


@dataclass
class TreeChange:
    """What a run changed on disk, from the tree it started on to the one its journal leaves
    (the names a ``find`` before and after would see), and how its ops came to that."""

    files_created: int = 0  # paths that hold a file after the run and none before
    bytes_created: int = 0  # their sizes
    files_deleted: int = 0
    bytes_deleted: int = 0
    files_grown: int = 0
    bytes_grown: int = 0  # what they gained
    files_shrunk: int = 0
    bytes_shrunk: int = 0
    dirs_created: int = 0
    dirs_deleted: int = 0
    files_before: int = 0  # the files the run found on the target
    ops: int = 0
    deletes: int = 0
    #: Deletes of files (or directories) the run had made itself: they leave no trace.
    deletes_of_own: int = 0
    #: Creates of a name that held a file already: the file was rewritten in place.
    rewrites: int = 0

    def to_json(self) -> dict[str, int]:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["net_files"] = self.files_created - self.files_deleted
        out["net_bytes"] = (
            self.bytes_created + self.bytes_grown - self.bytes_deleted - self.bytes_shrunk
        )
        return out


def tree_change(base: Tree, ops: Iterable[Op], *, allocate_only: bool = False) -> TreeChange:
    """What ``ops`` change from ``base`` (see ``TreeChange``); raises WorkloadError for an op
    that cannot have taken effect on it."""
    copies: dict[int, Node] = {}
    tree: Tree = {p: copies.setdefault(id(n), replace(n)) for p, n in base.items()}
    ch = TreeChange(files_before=sum(n.kind != "d" for n in base.values()))
    own: set[str] = set()
    for op in ops:
        ch.ops += 1
        kind = op.op
        if kind in ("create", "mkdir", "symlink", "mknod"):
            node = tree.get(op.path)
            if kind == "create" and node is not None and node.kind == "f":
                ch.rewrites += 1
            else:
                own.add(op.path)
        elif kind == "delete":
            ch.deletes += 1
            if op.path in own:
                ch.deletes_of_own += 1
                own.discard(op.path)
        elif kind == "rename" and op.path in own:
            own.discard(op.path)
            own.add(op.dest)
        elif kind == "link":
            own.add(op.dest)
        apply_op(tree, op, allocate_only=allocate_only)
    for path in base.keys() | tree.keys():
        was, now = base.get(path), tree.get(path)
        if was == now:
            continue
        if was is not None and now is not None and was.kind == now.kind:
            if now.kind == "f" and now.size > was.size:
                ch.files_grown += 1
                ch.bytes_grown += now.size - was.size
            elif now.kind == "f" and now.size < was.size:
                ch.files_shrunk += 1
                ch.bytes_shrunk += was.size - now.size
            continue
        if was is not None:  # gone, or replaced by another kind
            if was.kind == "d":
                ch.dirs_deleted += 1
            else:
                ch.files_deleted += 1
                ch.bytes_deleted += was.size if was.kind == "f" else 0
        if now is not None:
            if now.kind == "d":
                ch.dirs_created += 1
            else:
                ch.files_created += 1
                ch.bytes_created += now.size if now.kind == "f" else 0
    return ch


__all__ = [
    "Difference",
    "Tree",
    "TreeChange",
    "apply_op",
    "difference",
    "disk_tree",
    "durable_prefix",
    "journal_tree",
    "load_tree",
    "save_tree",
    "tree_change",
]
