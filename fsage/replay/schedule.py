"""Scheduling of the delta planner's plans: each inferred op becomes a ``_Plan`` (time, phase,
what it does), and ``Scheduling._schedule`` runs them in time order against the replayed
namespace, each waiting for what it needs (its directory made, its name free, its directory
empty), breaking a cycle of renames through a temporary name."""

from __future__ import annotations

import heapq
import stat
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from fsage.replay.entries import _SPECIAL, LOST_FOUND, ROOT, DeltaStats, Key
from fsage.replay.namespace import _Namespace
from fsage.workload import SYMLINK_MAX, Op, check_relpath

# Phases break ties between ops at the same time.
_PHASE = {
    "delete": 0,
    "mkdir": 1,
    "rename": 2,
    "create": 3,
    "link": 3,
    "append": 4,
    "truncate": 4,
    "rewrite": 4,
    "overwrite": 4,
    "setattr": 4,
    "rmdir": 5,
}


@dataclass(order=True, slots=True)
class _Plan:
    time: int
    phase: int
    seq: int
    kind: str = field(compare=False)
    key: Key = field(compare=False)
    parent: Key = field(compare=False, default=ROOT)
    name: str = field(compare=False, default="")
    size: int = field(compare=False, default=0)
    inferred: str = field(compare=False, default="")
    of: Key | None = field(compare=False, default=None)  # link: the file given a new name
    ftype: int = field(compare=False, default=stat.S_IFREG)  # create: what it makes
    runs: list[tuple[int, int]] | None = field(compare=False, default=None)  # sparse create:
    # the (offset, bytes) pieces with data; the rest of the file's size is holes
    attrs: _Attrs | None = field(compare=False, default=None)  # set right after the data


@dataclass(frozen=True)
class _Attrs:
    """What a ``setattr`` op sets: permission bits, modification time (None: left)."""

    mode: int | None = None
    mtime_ns: int | None = None

    def op(self, path: str) -> Op:
        return Op("setattr", path, mode=self.mode, mtime_ns=self.mtime_ns)


#: A plan in the scheduling heap: (time, phase, seq, plan).
_Queued = tuple[int, int, int, _Plan]


class Scheduling:
    """The scheduling part of ``DeltaBuilder``, which holds the state declared here."""

    ns: _Namespace
    stats: DeltaStats
    _tmp: int
    # DeltaBuilder's bookkeeping of hard links' extra names.
    _add_alias: Callable[[Key, Key], None]
    _drop_alias: Callable[[Key], None]

    def _schedule(self, plans: list[_Plan]) -> list[Op]:
        """Run the plans in time order against the namespace, each waiting for what it needs."""
        ns = self.ns
        nodes = ns.nodes
        inferred = self.stats.inferred
        pending = {p.key for p in plans if p.kind in ("mkdir", "create", "link")}
        todo = Counter(p.key for p in plans)
        # Ordered by (time, phase, seq): seq is unique, so the plans themselves are never
        # compared (a dataclass comparison per heap step costs more than the rest of a step).
        heap: list[_Queued] = [(p.time, p.phase, p.seq, p) for p in plans]
        heapq.heapify(heap)
        waiting: dict[tuple[str, Key], list[_Plan]] = {}
        out: list[Op] = []

        def set_attrs(p: _Plan, path: str) -> None:
            """The attributes the file's data leaves to set, right after it (as tar does)."""
            if p.attrs is not None:
                out.append(p.attrs.op(path))
                inferred["setattr"] += 1

        def drop(p: _Plan) -> None:
            todo[p.key] -= 1
            self.stats.skip("unresolved", p.key)

        def blocker(p: _Plan) -> tuple[str, Key] | bool | None:
            """An event to wait for; None when the plan can run; False when it never can."""
            kind = p.kind
            if kind == "delete":  # the common cases first, as the general rule below has them
                return None if p.key in nodes else ("key", p.key) if p.key in pending else False
            if kind == "create" or kind == "mkdir":
                dir_node = nodes.get(p.parent)
                if dir_node is None:
                    return ("key", p.parent) if p.parent in pending else False
                if not dir_node.is_dir:
                    return False
                other = dir_node.kids.get(p.name)
                return ("moved", other) if other is not None and other != p.key else None
            if kind == "link":
                assert p.of is not None
                need = [p.of, p.parent]
            else:
                need = [p.key] + ([p.parent] if kind == "rename" else [])
            for k in need:
                if k not in nodes:
                    return ("key", k) if k in pending else False
            if kind in ("rename", "link"):
                if not nodes[p.parent].is_dir:
                    return False
                if kind == "rename":
                    node = nodes[p.key]
                    if (node.parent, node.name) == (p.parent, p.name):
                        return None
                    if ns.inside(p.parent, p.key):
                        # Moving a directory below itself: wait for the target parent to leave.
                        return ("moved", p.parent) if p.parent != p.key else False
                other = nodes[p.parent].kids.get(p.name)
                if other is not None and other != p.key:
                    return ("moved", other)
            if kind == "rmdir" and nodes[p.key].kids:
                return ("empty", p.key)
            return None

        def execute(p: _Plan) -> list[tuple[str, Key]]:
            todo[p.key] -= 1
            kind = p.kind
            if kind == "create" or kind == "mkdir":
                path = ns.child_path(p.parent, p.name)
                check_relpath(path)
                ns.add(p.key, p.parent, p.name, kind == "mkdir")
                pending.discard(p.key)
                ftype = p.ftype
                if kind == "mkdir":
                    out.append(Op("mkdir", path))
                elif ftype == stat.S_IFLNK:
                    out.append(Op("symlink", path, size=min(max(p.size, 1), SYMLINK_MAX)))
                elif ftype in _SPECIAL:
                    out.append(Op("mknod", path, label=_SPECIAL[ftype]))
                elif p.runs is not None:
                    # A sparse file: its data pieces where they were, holes elsewhere.
                    out.append(Op("create", path))
                    for off, n in p.runs:
                        out.append(Op("overwrite", path, offset=off, size=n))
                    if not p.runs or p.runs[-1][0] + p.runs[-1][1] < p.size:
                        out.append(Op("truncate", path, size=p.size))
                else:
                    out.append(Op("create", path, size=p.size))
                inferred[p.inferred] += 1
                set_attrs(p, path)
                return [("key", p.key)]
            if kind == "link":
                assert p.of is not None
                dest = ns.child_path(p.parent, p.name)
                check_relpath(dest)
                out.append(Op("link", ns.path(p.of), dest=dest))
                ns.add(p.key, p.parent, p.name, False)
                pending.discard(p.key)
                self._add_alias(p.of, p.key)
                inferred[p.inferred] += 1
                return [("key", p.key)]
            path = ns.path(p.key)
            if kind == "rename":
                node = ns.nodes[p.key]
                if (node.parent, node.name) == (p.parent, p.name):
                    return []
                dest = ns.child_path(p.parent, p.name)
                old_parent = ns.move(p.key, p.parent, p.name)
                out.append(Op("rename", path, dest=dest))
                inferred[p.inferred] += 1
                ev = [("moved", p.key)]
                if not ns.nodes[old_parent].kids:
                    ev.append(("empty", old_parent))
                return ev
            if kind in ("delete", "rmdir"):
                parent = ns.remove(p.key)
                self._drop_alias(p.key)
                out.append(Op("delete", path))
                inferred[p.inferred] += 1
                ev = [("moved", p.key)]
                if not ns.nodes[parent].kids:
                    ev.append(("empty", parent))
                return ev
            if kind == "rewrite":
                out.append(Op("truncate", path, size=0))
                if p.size:
                    out.append(Op("append", path, size=p.size))
            elif kind == "overwrite":
                out.append(Op("overwrite", path, size=p.size))
            elif kind != "setattr":
                out.append(Op(kind, path, size=p.size))
            if kind != "setattr":
                inferred[p.inferred] += 1
            set_attrs(p, path)
            return []

        while heap or waiting:
            if not heap:
                if not self._break_cycle(waiting, todo, out, heap):
                    for plist in waiting.values():
                        for p in plist:
                            drop(p)
                    waiting.clear()
                continue
            p = heapq.heappop(heap)[3]
            b = blocker(p)
            if b is False:
                drop(p)
                continue
            if b is not None:
                assert isinstance(b, tuple)
                waiting.setdefault(b, []).append(p)
                continue
            events = execute(p)
            if waiting:  # mostly nothing waits: no event to look up
                for ev in events:
                    for w in waiting.pop(ev, ()):
                        heapq.heappush(heap, (w.time, w.phase, w.seq, w))
        return out

    def _break_cycle(
        self,
        waiting: dict[tuple[str, Key], list[_Plan]],
        todo: dict[Key, int],
        out: list[Op],
        heap: list[_Queued],
    ) -> bool:
        """Move one name holder that others wait for (and that has its own op still to come)
        to a temporary name in its directory; False when no such holder exists."""
        ns = self.ns
        for ev in sorted(waiting):
            what, key = ev
            if what != "moved" or key not in ns.nodes or todo.get(key, 0) <= 0:
                continue
            node = ns.nodes[key]
            if node.parent is None or key in (LOST_FOUND,):
                continue
            parent = node.parent
            while True:
                self._tmp += 1
                name = f".fsage-replay-tmp-{self._tmp}"
                if name not in ns.nodes[parent].kids:
                    break
            path = ns.path(key)
            dest = ns.child_path(parent, name)
            ns.move(key, parent, name)
            out.append(Op("rename", path, dest=dest))
            for w in waiting.pop(ev, ()):
                heapq.heappush(heap, (w.time, w.phase, w.seq, w))
            return True
        return False
