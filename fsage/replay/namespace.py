"""The replayed file system as the delta op stream leaves it: one node per name, keyed by file
identity (``fsage.replay.entries.Key``), with paths of directories cached."""

from __future__ import annotations

from dataclasses import dataclass, field

from fsage.replay.entries import LOST_FOUND, LOST_FOUND_NAME, ROOT, Key


@dataclass(slots=True)
class _Node:
    key: Key
    parent: Key | None
    name: str
    is_dir: bool
    kids: dict[str, Key] = field(default_factory=dict)


class _Namespace:
    """The replayed file system as the op stream leaves it."""

    def __init__(self) -> None:
        self.nodes: dict[Key, _Node] = {ROOT: _Node(ROOT, None, "", True)}
        # Paths of directories, as asked for; forgotten whenever a directory moves or goes
        # (rare), so a file's path is one lookup and a join instead of a walk to the root.
        self._dir_paths: dict[Key, str] = {}
        self.add(LOST_FOUND, ROOT, LOST_FOUND_NAME, True)

    def add(self, key: Key, parent: Key, name: str, is_dir: bool) -> None:
        self.nodes[key] = _Node(key, parent, name, is_dir)
        self.nodes[parent].kids[name] = key

    def remove(self, key: Key) -> Key:
        node = self.nodes.pop(key)
        if node.is_dir:
            self._dir_paths.clear()
        assert node.parent is not None
        del self.nodes[node.parent].kids[node.name]
        return node.parent

    def rekey(self, old: Key, new: Key) -> None:
        node = self.nodes.pop(old)
        if node.is_dir:
            self._dir_paths.clear()
        node.key = new
        self.nodes[new] = node
        assert node.parent is not None
        self.nodes[node.parent].kids[node.name] = new
        for kid in node.kids.values():
            self.nodes[kid].parent = new

    def swap(self, a: Key, b: Key) -> None:
        """Exchange the names of two non-directory nodes (bookkeeping only)."""
        na, nb = self.nodes[a], self.nodes[b]
        assert na.parent is not None and nb.parent is not None
        na.parent, na.name, nb.parent, nb.name = nb.parent, nb.name, na.parent, na.name
        self.nodes[na.parent].kids[na.name] = a
        self.nodes[nb.parent].kids[nb.name] = b

    def position(self, key: Key) -> tuple[Key | None, str]:
        node = self.nodes[key]
        return node.parent, node.name

    def move(self, key: Key, parent: Key, name: str) -> Key:
        node = self.nodes[key]
        assert node.parent is not None
        if node.is_dir:
            self._dir_paths.clear()
        old = node.parent
        del self.nodes[old].kids[node.name]
        node.parent, node.name = parent, name
        self.nodes[parent].kids[name] = key
        return old

    def path(self, key: Key) -> str:
        node = self.nodes[key]
        if node.parent is None:
            return ""
        return self.child_path(node.parent, node.name)

    def _dir_path(self, key: Key) -> str:
        p = self._dir_paths.get(key)
        if p is None:
            p = self._dir_paths[key] = self.path(key)
        return p

    def child_path(self, parent: Key, name: str) -> str:
        p = self._dir_path(parent)
        return f"{p}/{name}" if p else name

    def inside(self, key: Key, ancestor: Key) -> bool:
        """True when ``key`` is ``ancestor`` or lies below it."""
        k: Key | None = key
        while k is not None:
            if k == ancestor:
                return True
            k = self.nodes[k].parent
        return False
