"""Snapshot deltas: infer the operations between consecutive snapshots of one file system.

Between two snapshots A and B (``Layout``s of one file system), a file is known by its identity
``(inode, generation, creation time)``: the same identity under a new name is a rename, a new
identity is a create, an identity that is gone a delete. For a file present in both:

* **grow**: it got longer and its old blocks stayed where they were -> ``append``;
* **shrink**: it got shorter, old blocks in place -> ``truncate``;
* **rewrite**: blocks it already had moved (the file was rewritten, e.g. opened with O_TRUNC
  and written again) -> ``truncate`` to 0 then ``append`` the new size, so the recreated file
  system's allocator chooses blocks again as the original's did (an in-place ``overwrite``
  never moves blocks on ext4). A file whose extents changed without a size change is a rewrite;
* **overwrite**: same size and same blocks (or holes filled) but a newer modification time ->
  ``overwrite`` of the whole file (which bytes changed is not recorded).

Attribute changes are ``setattr`` ops, right after the data of the file they concern (as tar
sets the archive's time and mode once it has written a file): a new file whose modification
time predates its creation (its ``crtime``; where none is recorded, the previous snapshot's
time) gets that time and its mode, a new file of another mode than a ``create``'s its mode; a
file whose data changed with a modification time from before the interval gets the time back
(and its mode if that changed), a file with the same blocks and size whose time went back
(``touch -d``) a ``setattr`` instead of an ``overwrite``, and a mode change alone a ``setattr``
at the file's change time. ``DeltaBuilder(setattr=False)`` leaves them all out.

A file with several names (hard links) is made under its first name (by path) and given the
others with ``link`` ops right after; between snapshots its names are compared as sets: a name
that went away while another came is a ``rename`` (names paired in path order), a name that
came is a ``link`` (at the file's change time), a name that went away is a ``delete`` of that
name only (the file stays while it has other names), and the file is gone when all its names
are. The namespace model holds one node per name; which node carries the file's identity is
bookkeeping (it is moved to a kept name, never an op).

Directories appear (``mkdir``), disappear (``delete`` of an empty directory) or move
(``rename``). These are the inter-day activity of Smith & Seltzer's aging method; the short-lived
files no snapshot can see (intra-day activity) can be added from parameters (``IntraDay``), and
the workload header says so.

Ordering inside an interval follows the recorded times: a create at the file's creation time
(``crtime``; its modification time where the file system records no creation time), a size or
content change at its ``mtime``, a rename at its ``ctime``. Times outside the interval (files
unpacked with preserved times) are clamped into it. Deletes have no recorded time. A file
whose name a new file took (rewrite by a new inode, as editors, package managers and tar do) is
deleted just before that new file is created (``replaced_at_create``); any other delete is
placed at the start of the interval (``deletes="first"``), so the space it frees is there for
every create after it, or at the parent directory's last modification (``deletes="parent"``),
an upper bound of the real time. Removed directories go at the end of the interval, once
empty. Any op whose precondition does not hold yet (its directory not made, its name still
taken, its directory not empty) waits for the op that makes it hold; a cycle of renames is
broken through a temporary name.

Recorded names are never trusted: a name that is empty, '.', '..', holds '/' or NUL, or is
longer than 255 bytes cannot be carried by the op vocabulary; the entry (and what lies below
it) is skipped and counted (and so is a second name of a directory: a damaged tree). Symlinks
are made with a target of the recorded length (``symlink``; snapshots keep the length, which
decides whether the target sits in the inode or in a block, not the text), FIFOs, sockets and
device nodes with ``mknod`` (device number 0), and a sparse regular file as a ``create`` of
nothing, an ``overwrite`` of each piece that holds blocks and a ``truncate`` to its size, so
its holes stay holes. Paths in the ops (and link and rename destinations) always pass
``check_relpath``.

Modules: a snapshot's entries are read in ``fsage.replay.entries``, the replayed namespace is
``fsage.replay.namespace``, plans are run in order by ``fsage.replay.schedule``, and the
snapshots a replay covers are chosen in ``fsage.replay.snapshots``.
"""

from __future__ import annotations

import contextlib
import gc
import math
import random
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from fsage.errors import UsageError, WorkloadError
from fsage.layout import Layout
from fsage.replay.entries import (
    _SPECIAL,
    DeltaStats,
    Key,
    _blocks_moved,
    _entries,
    _Entry,
    _extent_lists,
    _runs,
    _sparse_pieces,
)
from fsage.replay.namespace import _Namespace
from fsage.replay.schedule import _PHASE, Scheduling, _Attrs, _Plan
from fsage.replay.snapshots import history, iter_layouts, parse_when, resolve_snapshot, to_ns
from fsage.workload import CREATE_MODE, Op, WorkloadHeader

DAY_NS = 86_400 * 10**9


@dataclass(frozen=True)
class IntraDay:
    """Short-lived files the snapshots cannot see: per interval, about ``files_per_day`` times
    its length in days of files are created at uniformly drawn times and deleted after an
    exponentially drawn lifetime (mean ``lifetime_s``, cut at the interval's end). Sizes come
    from ``size`` (a ``HybridSize`` as JSON), or from a fit to the later snapshot's sizes."""

    files_per_day: float
    lifetime_s: float = 3600.0
    seed: int = 0
    size: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if not self.files_per_day >= 0 or not math.isfinite(self.files_per_day):
            raise UsageError("intra-day files per day must be a number >= 0")
        if not self.lifetime_s > 0:
            raise UsageError("intra-day lifetime must be positive")

    def to_json(self) -> dict[str, Any]:
        return {
            "files_per_day": self.files_per_day,
            "lifetime_s": self.lifetime_s,
            "seed": self.seed,
            "size": self.size if self.size is not None else "fitted to each later snapshot",
        }


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector: inferring an interval allocates several
    objects per file and drops no cycle that must go before it ends, while the collector's
    passes over the growing heap cost about a fifth of the inference's CPU."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class DeltaBuilder(Scheduling):
    """Turns a sequence of snapshots into one op stream, interval by interval.

    ``interval(None, first, ...)`` populates an empty file system with the first snapshot (its
    creates in creation order, then inode order); each later ``interval(prev, next, ...)``
    appends the inferred operations and a ``snapshot`` marker. ``start_from(layout)`` adopts a
    snapshot as the starting state without any op (a stream that starts at that snapshot).
    """

    def __init__(
        self,
        *,
        intra: IntraDay | None = None,
        deletes: str = "first",
        replaced_at_create: bool = True,
        setattr: bool = True,
    ) -> None:
        if deletes not in ("first", "parent"):
            raise UsageError(f"unknown delete placement {deletes!r} (first or parent)")
        self.intra = intra
        self.deletes = deletes
        self.replaced_at_create = replaced_at_create
        #: Replay the attribute changes the snapshots show (``setattr`` ops).
        self.setattr = setattr
        self.stats = DeltaStats()
        self.ns = _Namespace()
        self._rng = random.Random(intra.seed if intra else 0)
        self._seq = 0
        self._tmp = 0
        self._last: tuple[Layout, dict[Key, _Entry]] | None = None
        self._lo = 0
        # Extra names of hard-linked files: file key -> the namespace nodes of its other
        # names (synthetic keys), and back.
        self._aliases: dict[Key, list[Key]] = {}
        self._alias_of: dict[Key, Key] = {}

    # -- public ------------------------------------------------------------------------

    def start_from(self, layout: Layout) -> None:
        entries = self._entries_of(layout)
        for e in sorted(entries.values(), key=lambda e: e.links[0].path.count("/")):
            lk = e.links[0]
            if lk.parent in self.ns.nodes and lk.name not in self.ns.nodes[lk.parent].kids:
                self.ns.add(e.key, lk.parent, lk.name, e.is_dir)
        for e in entries.values():
            if e.key not in self.ns.nodes:
                continue
            for lk in e.links[1:]:
                if lk.parent in self.ns.nodes and lk.name not in self.ns.nodes[lk.parent].kids:
                    alias = self._new_key()
                    self.ns.add(alias, lk.parent, lk.name, False)
                    self._add_alias(e.key, alias)
        self._last = (layout, entries)

    def interval(
        self,
        old: Layout | None,
        new: Layout,
        *,
        start_ns: int | None,
        end_ns: int,
        label: str = "",
    ) -> list[Op]:
        """Ops that take the file system from ``old`` (None: empty) to ``new``."""
        with _collector_paused():
            return self._interval(old, new, start_ns=start_ns, end_ns=end_ns, label=label)

    def _interval(
        self, old: Layout | None, new: Layout, *, start_ns: int | None, end_ns: int, label: str
    ) -> list[Op]:
        old_entries: dict[Key, _Entry] = {}
        if old is not None:
            old_entries = dict(self._entries_of(old))
        new_entries = self._entries_of(new)
        self._last = (new, new_entries)
        lo = start_ns if start_ns is not None else -(2**62)
        hi = max(end_ns, lo)
        self._lo = lo
        plans = self._plan(old, old_entries, new, new_entries, lo, hi)
        intra_files = 0
        if self.intra is not None and start_ns is not None and hi > lo:
            intra_files = self._plan_intra(plans, new, new_entries, old_entries, lo, hi)
        ops = self._schedule(plans)
        if label:
            ops.append(Op("snapshot", label=label))
        self.stats.ops += len(ops)
        self.stats.bytes += sum(op.size for op in ops if op.op in ("create", "append", "overwrite"))
        info: dict[str, Any] = {"label": label, "ops": len(ops)}
        if self.intra is not None:
            info["intra_day_files"] = intra_files
        self.stats.intervals.append(info)
        return ops

    # -- planning ----------------------------------------------------------------------

    def _entries_of(self, layout: Layout) -> dict[Key, _Entry]:
        if self._last is not None and self._last[0] is layout:
            return self._last[1]
        return _entries(layout, self.stats)

    def _new_key(self) -> Key:
        self._tmp += 1
        return (-1000 - self._tmp, 0, 0)

    def _add_alias(self, key: Key, alias: Key) -> None:
        self._aliases.setdefault(key, []).append(alias)
        self._alias_of[alias] = key

    def _drop_alias(self, alias: Key) -> None:
        key = self._alias_of.pop(alias, None)
        if key is None:
            return
        rest = [a for a in self._aliases.get(key, []) if a != alias]
        if rest:
            self._aliases[key] = rest
        else:
            self._aliases.pop(key, None)

    def _rekey_aliases(self, old: Key, new: Key) -> None:
        aliases = self._aliases.pop(old, None)
        if aliases:
            self._aliases[new] = aliases
            for a in aliases:
                self._alias_of[a] = new

    def _new_plan(self, t: int, kind: str, key: Key, **kw: Any) -> _Plan:
        self._seq += 1
        return _Plan(t, _PHASE[kind], self._seq, kind, key, **kw)

    def _plan(
        self,
        old: Layout | None,
        olds: dict[Key, _Entry],
        new: Layout,
        news: dict[Key, _Entry],
        lo: int,
        hi: int,
    ) -> list[_Plan]:
        ns = self.ns
        bs = max(int(new.facts.block_size), 1)

        def clamp(t: int) -> int:
            return min(max(t, lo), hi)

        def born(e: _Entry) -> int:
            return e.crtime if e.crtime > 0 else min(e.mtime, e.ctime)

        plans: list[_Plan] = []
        self._retire_reused(plans, old, olds, new, news, bs, hi)
        nodes = ns.nodes
        made = [e for e in news.values() if e.key not in nodes]
        extents = _extent_lists(new)
        # Creations in creation order, then inode order (seq follows the sort).
        for e in sorted(made, key=lambda e: (born(e), e.key[0])):
            lk = e.links[0]
            t = clamp(born(e))
            ftype = e.ftype
            runs: list[tuple[int, int]] | None = None
            attrs: _Attrs | None = None
            if e.is_dir:
                kind = inferred = "mkdir"
            else:
                kind = "create"
                if ftype == stat.S_IFLNK:
                    inferred = "symlink"
                elif ftype in _SPECIAL:
                    inferred = "special"
                else:
                    inferred = kind
                    runs = _sparse_pieces(new, e, bs, extents)
                    attrs = self._created_attrs(e, lo)
            self._seq += 1
            plans.append(
                _Plan(t, _PHASE[kind], self._seq, kind, e.key, lk.parent, lk.name, e.size,
                      inferred, None, ftype, runs, attrs)
            )  # fmt: skip
            for extra in e.links[1:]:
                plans.append(
                    self._new_plan(
                        t,
                        "link",
                        self._new_key(),
                        parent=extra.parent,
                        name=extra.name,
                        inferred="link",
                        of=e.key,
                    )
                )
        # A name a new file takes over (rewrite by a new inode: editors, package managers,
        # tar) is freed when the new file comes, as those tools unlink just before creating.
        taken_at: dict[tuple[Key, str], int] = {}
        for e in made:
            if not e.is_dir:
                lk = e.links[0]
                taken_at.setdefault((lk.parent, lk.name), clamp(born(e)))
        for key, node in list(nodes.items()):
            if key[0] < 0 or key in news:  # synthetic (the root, lost+found too) or kept
                continue
            if node.is_dir:
                # Removed directories go last, deepest first (the ns path depth breaks ties).
                p = self._new_plan(hi, "rmdir", key, inferred="rmdir")
                p.seq = -ns.path(key).count("/")  # deeper first among equal times
                plans.append(p)
            else:
                t = lo
                if self.replaced_at_create and node.parent is not None:
                    t = taken_at.get((node.parent, node.name), lo)
                if t == lo and self.deletes == "parent" and node.parent is not None:
                    pe = news.get(node.parent)
                    if pe is not None and lo < pe.mtime <= hi:
                        t = pe.mtime
                for alias in self._aliases.get(key, []):
                    plans.append(self._new_plan(t, "delete", alias, inferred="unlink"))
                plans.append(self._new_plan(t, "delete", key, inferred="delete"))
        aliases = self._aliases
        for key, e in news.items():
            cur = nodes.get(key)
            if cur is None:
                continue
            lk = e.links[0]
            if len(e.links) > 1 or cur.name != lk.name or cur.parent != lk.parent or key in aliases:
                self._plan_names(plans, e, clamp(e.ctime))  # else: one name, already right
            if e.is_dir or old is None or e.ftype != stat.S_IFREG:
                continue
            o = olds.get(key)
            if o is None:
                continue
            self._plan_content(plans, old, o, new, e, bs, clamp)
        return plans

    def _created_attrs(self, e: _Entry, lo: int) -> _Attrs | None:
        """What a new regular file's data leaves to set: a modification time from before the
        file existed (its creation time, else the interval's start) was set explicitly, as tar
        sets the archive's, together with the mode; a mode other than a create's, alone."""
        if not self.setattr:
            return None
        birth = e.crtime if e.crtime > 0 else lo
        if e.mtime < birth:
            return _Attrs(e.perm, e.mtime)
        return _Attrs(e.perm) if e.perm != CREATE_MODE else None

    def _plan_names(self, plans: list[_Plan], e: _Entry, t: int) -> None:
        """Renames, links and removed names that take the names the file has in the namespace
        to the names it has in the snapshot (one name each for a directory)."""
        ns = self.ns
        key = e.key
        held = [key, *self._aliases.get(key, [])]
        want = [(lk.parent, lk.name) for lk in e.links]
        wanted = set(want)
        kept = [k for k in held if ns.position(k) in wanted]
        if kept and key not in kept:
            # The node with the file's identity loses its name while another name stays: let
            # it carry a kept name instead (no op), so the file is never without it.
            ns.swap(key, kept[0])
        have = {ns.position(k) for k in held}
        removed = [k for k in held if ns.position(k) not in wanted]  # the file's own first
        added = [w for w in want if w not in have]
        for k, (parent, name) in zip(removed, added, strict=False):
            plans.append(
                self._new_plan(t, "rename", k, parent=parent, name=name, inferred="rename")
            )
        for parent, name in added[len(removed) :]:
            plans.append(
                self._new_plan(
                    t, "link", self._new_key(), parent=parent, name=name, inferred="link", of=key
                )
            )
        for k in removed[len(added) :]:
            plans.append(self._new_plan(t, "delete", k, inferred="unlink"))

    def _retire_reused(
        self,
        plans: list[_Plan],
        old: Layout | None,
        olds: dict[Key, _Entry],
        new: Layout,
        news: dict[Key, _Entry],
        bs: int,
        hi: int,
    ) -> None:
        """An identity that now names something else is a delete plus a create: the old node
        takes a synthetic key (and is removed), the new entry is created under the real one.

        That is the case when the type changed (file <-> directory), and, where the file system
        records neither generation nor creation time (e.g. images written by libext2fs), when a
        regular file changed name and its blocks moved too: an inode reused by a new file.
        """
        ns = self.ns
        for key, e in news.items():
            node = ns.nodes.get(key)
            if node is None:
                continue
            reused = node.is_dir != e.is_dir
            if not reused and not e.is_dir and key[1] == 0 and key[2] == 0 and old is not None:
                o = olds.get(key)
                names = {(lk.parent, lk.name) for lk in e.links}
                held = [key, *self._aliases.get(key, [])]
                renamed = all(ns.position(k) not in names for k in held)
                if o is not None and renamed:
                    limit = -(-min(o.size, e.size) // bs)
                    reused = _blocks_moved(_runs(old, o.row), _runs(new, e.row), limit) or (
                        o.size != e.size
                    )
            if not reused:
                continue
            ghost = self._new_key()
            ns.rekey(key, ghost)
            self._rekey_aliases(key, ghost)
            if node.is_dir:
                plans.append(self._new_plan(hi, "rmdir", ghost, inferred="rmdir"))
            else:
                for alias in self._aliases.get(ghost, []):
                    plans.append(self._new_plan(self._lo, "delete", alias, inferred="unlink"))
                plans.append(self._new_plan(self._lo, "delete", ghost, inferred="delete"))
            olds.pop(key, None)

    def _plan_content(
        self,
        plans: list[_Plan],
        old: Layout,
        o: _Entry,
        new: Layout,
        e: _Entry,
        bs: int,
        clamp: Any,
    ) -> None:
        old_runs, new_runs = _runs(old, o.row), _runs(new, e.row)
        same_ext = old_runs == new_runs
        mode = e.perm if self.setattr and e.perm != o.perm else None
        content: _Plan | None = None
        mtime: int | None = None
        if not (same_ext and o.size == e.size and o.mtime == e.mtime):
            limit = -(-min(o.size, e.size) // bs)
            t = clamp(e.mtime)
            # A modification time from before the interval was set, not left by a write (as
            # tar sets the archive's after writing a file).
            if self.setattr and e.mtime < self._lo:
                mtime = e.mtime
            if _blocks_moved(old_runs, new_runs, limit):
                content = self._new_plan(t, "rewrite", e.key, size=e.size, inferred="rewrite")
            elif e.size > o.size:
                content = self._new_plan(t, "append", e.key, size=e.size - o.size, inferred="grow")
            elif e.size < o.size:
                content = self._new_plan(t, "truncate", e.key, size=e.size, inferred="shrink")
            elif same_ext and self.setattr and (mtime is not None or e.mtime < o.mtime):
                mtime = e.mtime  # same blocks and size, the time set back (touch -d): no write
            elif e.size and (not same_ext or o.mtime != e.mtime):
                content = self._new_plan(t, "overwrite", e.key, size=e.size, inferred="overwrite")
        if mode is None and mtime is None:
            if content is not None:
                plans.append(content)
            return
        if content is None:  # attributes alone (chmod, touch), at the file's change time
            content = self._new_plan(clamp(e.ctime), "setattr", e.key, inferred="setattr")
        content.attrs = _Attrs(mode, mtime)
        plans.append(content)

    def _plan_intra(
        self,
        plans: list[_Plan],
        new: Layout,
        news: dict[Key, _Entry],
        olds: dict[Key, _Entry],
        lo: int,
        hi: int,
    ) -> int:
        from fsage.ager.distributions import HybridSize, fit_sizes

        assert self.intra is not None
        rng = self._rng
        expected = self.intra.files_per_day * (hi - lo) / DAY_NS
        count = int(expected) + (1 if rng.random() < expected - int(expected) else 0)
        if count == 0:
            return 0
        if self.intra.size is not None:
            dist = HybridSize.from_json(self.intra.size)
        else:
            try:
                dist = fit_sizes(new)
            except WorkloadError:
                dist = HybridSize(mu=9.0, sigma=1.5)
        # Directories there for the whole interval: in the namespace now and in the snapshot.
        stable = sorted(k for k, n in self.ns.nodes.items() if n.is_dir and (k in news or k[0] < 0))
        free_blocks = int(new.facts.blocks_free) * int(new.facts.block_size)
        cap = max(free_blocks // 4, 0)
        for _ in range(count):
            parent = rng.choice(stable)
            key = self._new_key()
            name = f".fsage-intra-{self._tmp}"
            t0 = lo + int(rng.random() * (hi - lo))
            life = int(rng.expovariate(1.0 / self.intra.lifetime_s) * 1e9)
            t1 = min(t0 + max(life, 1), hi)
            size = dist.sample(rng, cap=cap)
            p = self._new_plan(t0, "create", key, parent=parent, name=name, size=size)
            p.inferred = "intra_create"
            plans.append(p)
            plans.append(self._new_plan(t1, "delete", key, inferred="intra_delete"))
        return count


def snapshot_deltas(
    store: Any,
    fs_name: str,
    *,
    until: str | None = None,
    since: str | None = None,
    intra: IntraDay | None = None,
    deletes: str = "first",
    setattr: bool = True,
) -> tuple[WorkloadHeader, list[Op], DeltaStats]:
    """The op stream that takes ``fs_name`` from snapshot ``since`` (None: an empty file
    system, so the stream first populates the first snapshot) to snapshot ``until``."""
    chain, start = history(store, fs_name, until, since)
    builder = DeltaBuilder(intra=intra, deletes=deletes, setattr=setattr)
    ops: list[Op] = []
    prev: Layout | None = None
    prev_t: int | None = None
    if start is not None:
        prev = store.load_layout(start.id)
        builder.start_from(prev)
        prev_t = to_ns(start.taken_at)
    for _snap, _layout, interval in interval_ops(builder, iter_layouts(store, chain), prev, prev_t):
        ops.extend(interval)
    header = make_header(fs_name, start, chain, builder, intra, deletes)
    return header, ops, builder.stats


def interval_ops(
    builder: DeltaBuilder,
    snapshots: Iterable[tuple[Any, Layout]],
    prev: Layout | None = None,
    prev_t: int | None = None,
) -> Iterator[tuple[Any, Layout, list[Op]]]:
    """For each (snapshot, its layout) in order, the ops that lead to it from the one before:
    from ``prev``, taken at ``prev_t``, for the first (None: an empty file system). Each
    interval ends on a snapshot marker labelled with the snapshot's id and time."""
    for snap, layout in snapshots:
        t = to_ns(snap.taken_at)
        ops = builder.interval(
            prev,
            layout,
            start_ns=prev_t,
            end_ns=t,
            label=f"snapshot {snap.id} {snap.taken_at.isoformat(timespec='seconds')}",
        )
        yield snap, layout, ops
        prev, prev_t = layout, t


def intra_day_summary(intra: IntraDay, stats: DeltaStats) -> dict[str, Any]:
    """The intra-day parameters with the short-lived files added in each interval."""
    return {
        **intra.to_json(),
        "files_added": [iv.get("intra_day_files", 0) for iv in stats.intervals],
    }


def make_header(
    fs_name: str,
    start: Any | None,
    chain: list[Any],
    builder: DeltaBuilder,
    intra: IntraDay | None,
    deletes: str,
) -> WorkloadHeader:
    stats = builder.stats
    params: dict[str, Any] = {
        "fs": fs_name,
        "from": start.id if start is not None else None,
        "until": chain[-1].id if chain else None,
        "snapshots": [s.id for s in chain],
        "deletes": deletes,
        "setattr": builder.setattr,
        "inferred": dict(stats.inferred),
        "skipped": stats.skipped_counts(),
        "intra_day": None,
    }
    if intra is not None:
        params["intra_day"] = intra_day_summary(intra, stats)
    return WorkloadHeader(
        generator="fsage replay deltas",
        params=params,
        seed=intra.seed if intra is not None else None,
    )


# The snapshot choice lives in fsage.replay.snapshots; importable from here as before.
__all__ = [
    "DeltaBuilder",
    "DeltaStats",
    "IntraDay",
    "history",
    "interval_ops",
    "intra_day_summary",
    "iter_layouts",
    "make_header",
    "parse_when",
    "resolve_snapshot",
    "snapshot_deltas",
    "to_ns",
]
