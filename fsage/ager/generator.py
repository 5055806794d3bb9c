"""The workload generator: turns a profile and a seed into an op stream.

The generator keeps its own model of the target: the namespace (directories, files with size,
birth op and depth) and the blocks in use (file data rounded up to blocks, one block per
directory) out of ``capacity // block_size``. A generated stream therefore depends only on the
profile, the seed and the capacity — never on the target it later runs on. When aging a target
directly (``fsage age --profile``), a ``probe`` (the executor's statvfs) replaces the model's
fullness so that the fill target is met on the real file system; on a mounted ext4, xfs or
btrfs image the probe only anchors the model, which then also counts the file system's
metadata (``meta``, see ``fsage.ager.genmodel``). ``nospace`` tells the generator that an op
failed for lack of space, and it turns to deletes; when a modelled btrfs refused it well short
of what statvfs calls its size (it counts its metadata reserve as free), the used blocks of
the probe after it become the capacity the generator steers by (``full_at``), so that the
fill is of what the target can hold.

Phases (mode ``hybrid``): fill until fullness reaches ``profile.fill`` (creates, with a create
probability that falls as the fs fills, and deletes), then churn in ``profile.mix`` until
``profile.churn`` × capacity bytes have been written or ``ops_limit`` ops issued. A delete picks
a random non-empty directory and a victim from its sorted listing (seed 004), so the same file is
deleted on every file system.

Mode ``convergence`` (Geriatrix profiles, see ``fsage.ager.profile``) first makes the
profile's directory tree, fills with creates only, then churns with creates and deletes steered
toward the target histograms of size, age and depth: a create takes the size bucket and depth
furthest below target, a delete takes a file from the age bucket furthest above target,
preferring over-represented sizes and depths. Relative (Geriatrix) ages are measured against
the run's planned end (``age_plan``, fixed when the fill ends): until then a bucket's count is
what it will be at that end (its live files plus the creates still to come in its window).
The histograms are kept incrementally (a count per bucket; ages through a Fenwick tree over
birth order), so an op costs O(buckets · log n). It stops when every histogram passes a
chi-square test at ``profile.confidence`` (checked every ``check_every`` ops), or when the
churn budget or op limit is spent — and then says it did not converge.

Modules: the convergence steering is ``fsage.ager.converge``, the ``random-update`` and
``prefragment`` streams ``fsage.ager.synthetic``, the model's records ``fsage.ager.genmodel``,
the chi-square test ``fsage.ager.chisquare``.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Callable, Iterator

from fsage.ager.chisquare import MIN_EXPECTED, chi2_sf, chi_square_test
from fsage.ager.converge import Converging
from fsage.ager.genmodel import META_MODELS, GenStats, _AgeIndex, _Bag, _blocks, _File
from fsage.ager.patterns import PATTERN_KINDS, run_pattern
from fsage.ager.profile import Profile
from fsage.ager.synthetic import SyntheticStreams
from fsage.errors import WorkloadError
from fsage.workload import Op, WorkloadHeader

_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789"
#: The 36 × 36 pairs of name characters; a name is five of them.
_PAIRS = [a + b for a in _CHARS for b in _CHARS]

#: (block size, total blocks, used blocks), like ``Executor.capacity_blocks``.
Probe = Callable[[], tuple[int, int, int]]

DATA_OPS = frozenset({"create", "append", "overwrite"})
#: Ops counted as writes for the fsync and sync cadence.
_WRITES = DATA_OPS | {"truncate"}
#: Ops between two statvfs probes of a live target (see ``Generator.capacity_blocks``).
PROBE_EVERY = 32


def meta_kind(target_kind: str) -> str | None:
    """The metadata model (``META_MODELS``) of a target kind (``mounted-ext``, ...), or None.
    A kernel's used-block count after the same ops differs from run to run (journal commits,
    writeback, xfs's speculative preallocation, btrfs's transaction commits): a mounted image
    of a modelled kind is steered by the model, the probe only anchoring it."""
    kind = target_kind.removeprefix("mounted-")
    return kind if target_kind.startswith("mounted-") and kind in META_MODELS else None


class Generator(Converging, SyntheticStreams):
    """Yields ops for ``profile`` against a target of ``capacity`` bytes (see module doc)."""

    def __init__(
        self,
        profile: Profile,
        seed: int,
        capacity: int,
        *,
        probe: Probe | None = None,
        block_size: int | None = None,
        probe_every: int | None = PROBE_EVERY,
        ext_meta: bool = False,
        meta: str | None = None,
    ) -> None:
        self.profile = profile
        self.seed = seed
        self.bs = block_size or profile.block_size
        if capacity < 16 * self.bs:
            raise WorkloadError(f"capacity {capacity} bytes is too small to age")
        self.capacity = capacity
        self.total_blocks = capacity // self.bs
        self.rng = random.Random(seed)
        self.probe = probe
        #: None: the probe only anchors the model, at the start and after ENOSPC (see
        #: ``capacity_blocks``).
        self.probe_every = probe_every
        self._probe_next = 0
        self._anchored = False
        self._probed = (0, 0)
        self._probed_model = 0
        #: Used blocks at which a modelled btrfs last refused an op (from the probe after it),
        #: when that is well short of what statvfs calls its size (btrfs counts the room it
        #: keeps for metadata as free): the capacity steered by. None: statvfs's. A pure
        #: function of the probes and the ops, so a resumed run (probes replayed) learns the
        #: same. Other kinds are full where statvfs says (a refusal well before is a quota's
        #: or a passing one, and would shrink the run for good).
        self.full_at: int | None = None
        self._learn = False
        self.stats = GenStats()
        # Namespace model. The root directory is "" at depth 0.
        self.files: dict[str, _File] = {}
        self.file_bag = _Bag()
        self.dir_depth: dict[str, int] = {"": 0}
        self.dir_names: dict[str, set[str]] = {"": set()}
        self.dir_files: dict[str, list[str]] = {"": []}
        self.dirs_by_depth: dict[int, list[str]] = {0: [""]}
        self.all_dirs: list[str] = [""]
        self.nonempty = _Bag()
        self.used_blocks = 0
        #: The metadata blocks of a mounted file system steered by the model: ``meta`` names
        #: its kind (a key of ``META_MODELS``); ``ext_meta`` is ``meta="ext"``.
        kind = meta or ("ext" if ext_meta else None)
        if kind is not None and kind not in META_MODELS:
            raise WorkloadError(f"no model of {kind!r} metadata (one of {', '.join(META_MODELS)})")
        self.meta = META_MODELS[kind](self.bs) if kind is not None else None
        self._force_deletes = 0
        self._settle_band = 0.0  # while settling by the model alone (``_settle``)
        self._undo: Callable[[], None] | None = None
        self._writes = 0
        # Convergence mode: files per size bucket and depth bucket, files by birth.
        self._size_bags: list[_Bag] = []
        if profile.size_hist is not None:
            self._size_bags = [_Bag() for _ in profile.size_hist.edges]
        self._depth_counts: list[int] = []
        self._depth_parents: list[list[str]] = []
        self._dir_plan: list[str] = []
        if profile.depth_hist is not None:
            self._depth_counts = [0] * len(profile.depth_hist.edges)
            self._plan_dirs(profile)
        self._ages = _AgeIndex() if profile.age_hist is not None else None
        self._age_cache: list[int] = []
        self._age_cache_at = -(1 << 62)
        #: Relative ages: the op count Geriatrix plans its run for (fixed when the fill ends,
        #: ``age_ops_needed``); the age bucket edges are fractions of it, in ops. None before.
        self.age_plan: int | None = None
        wc, wd = profile.mix.get("create", 0.0), profile.mix.get("delete", 0.0)
        self._create_rate = wc / sum(profile.mix.values()) if wc + wd > 0 else 0.5
        hs, hd, ha = profile.size_hist, profile.depth_hist, profile.age_hist
        self._size_frac = hs.fractions if hs is not None else []
        self._size_vals = [int(e) for e in hs.edges] if hs is not None else []
        self._depth_frac = hd.fractions if hd is not None else []
        self._age_frac = ha.fractions if ha is not None else []
        mix = profile.mix
        # In the order of their names: a stream depends on the mix, not on the order a profile
        # lists it in (a profile read back from a run's record lists it sorted).
        self._mix_kinds = sorted(k for k in mix if mix[k] > 0)
        self._mix_cum: list[float] = []
        acc = 0.0
        for k in self._mix_kinds:
            acc += mix[k]
            self._mix_cum.append(acc)

    # ---------------------------------------------------------------- header

    def header(self) -> WorkloadHeader:
        return WorkloadHeader(
            generator=f"fsage.ager/{self.profile.mode}",
            params={
                "profile": self.profile.to_json(),
                "capacity": self.capacity,
                "block_size": self.bs,
            },
            seed=self.seed,
        )

    # ---------------------------------------------------------------- capacity

    def capacity_blocks(self, fresh: bool = False) -> tuple[int, int]:
        """(total blocks, used blocks): the probe's when aging directly, else the model's.
        The probe (a statvfs) runs every ``PROBE_EVERY`` ops, after an op ran out of space,
        or when ``fresh``; in between, the model's change since the last probe is added to
        the probed figure (what the ops did is known; the probe corrects what the model
        does not see, such as metadata blocks). With ``probe_every`` None the probe only
        anchors the model, at the first call and after ENOSPC: a kernel's count after the
        same ops varies by a few blocks from run to run, and a stream steered by it would
        not be the same twice (``ext_meta`` then models ext4's metadata blocks)."""
        if self.probe is not None:
            every = self.probe_every
            if not self._anchored or (
                every is not None and (fresh or self.stats.ops >= self._probe_next)
            ):
                bs, total, used = self.probe()
                # Express the real figures in model blocks so caps stay in bytes.
                self._probed = (total * bs // self.bs, (used * bs + self.bs - 1) // self.bs)
                if self._learn:
                    self._learn = False
                    full = self._probed[1]
                    self.full_at = full if full < self._probed[0] * 97 // 100 else None
                if self.full_at is not None:  # full there: steer as if 99% full there
                    self._probed = (min(self._probed[0], self.full_at * 100 // 99), self._probed[1])
                self._probed_model = self.used_blocks
                self._probe_next = self.stats.ops + (every or 0)
                self._anchored = True
            total, used = self._probed
            return total, max(0, used + self.used_blocks - self._probed_model)
        return self.total_blocks, self.used_blocks

    def fullness(self, fresh: bool = False) -> float:
        total, used = self.capacity_blocks(fresh)
        return used / total if total else 1.0

    def _free_bytes(self) -> int:
        """Largest size a new file or append may have: in the fill phase, what is left to the
        fill target (so the fill stops at it); in churn, up to halfway between the target and
        a full fs; never beyond 99% full."""
        total, used = self.capacity_blocks()
        fill = self.profile.fill
        if self._settle_band:  # the settle: a create may not pass the band
            limit = fill + self._settle_band
        elif self.stats.phase == "fill":
            limit = fill + 0.005
        else:
            limit = fill + (1.0 - fill) / 2
        room = min(int(limit * total), total - max(1, total // 100)) - used
        return max(0, room) * self.bs

    def adopt(self, entries: list[tuple[str, bool, int]]) -> None:
        """Take an existing tree into the model: (relative path, is_dir, size) entries, e.g.
        what an interrupted run left. Ages restart at the current op."""
        for path, is_dir, size in sorted(entries):
            parent, _, name = path.rpartition("/")
            if parent not in self.dir_depth:
                continue  # below a directory the model could not take (not reachable)
            if is_dir:
                self._add_dir(parent, name, path)
            else:
                self._add_file(parent, name, size)

    def reserve(self, entries: list[tuple[str, bool, int]]) -> None:
        """Keep clear of an existing tree without taking it into the model: its names are
        never made again (a second run of the same seed on an aged target would otherwise
        remake the first run's names), and its directories can hold new files where a profile
        names them (spool groups, Geriatrix's planned tree), but its files are never deleted
        or rewritten and its directories are never picked at random."""
        for path, is_dir, _size in sorted(entries):
            parent, _, name = path.rpartition("/")
            names = self.dir_names.get(parent)
            if names is None:
                continue  # below a directory that could not be taken
            names.add(name)
            if self.meta is not None:
                self.used_blocks += self.meta.entry(parent, name, True)
            if is_dir and path not in self.dir_depth:
                self.dir_depth[path] = self.dir_depth[parent] + 1
                self.dir_names[path] = set()
                self.dir_files[path] = []

    # ---------------------------------------------------------------- feedback

    def nospace(self, op: Op) -> None:
        """``op`` (the last one yielded) failed with ENOSPC and was undone on the target:
        forget it in the model and turn to deletes for a while."""
        self.stats.nospace += 1
        # The target is fuller than the model thought: probe again, and learn where it is
        # full (``full_at``).
        self._probe_next = 0
        self._anchored = False
        self._learn = self.meta is not None and self.meta.cow
        if self._undo is not None:
            self._undo()
            self._undo = None
        if op.op in DATA_OPS:
            self.stats.bytes_written -= op.size
        self._force_deletes = 16

    # ---------------------------------------------------------------- the stream

    def ops(self) -> Iterator[Op]:
        mode = self.profile.mode
        if mode == "random-update":
            body = self._random_update()
        elif mode == "prefragment":
            body = self._prefragment()
        else:
            body = self._hybrid()
        limit = self.profile.ops_limit
        st = self.stats
        counts = st.counts
        syncs = bool(self.profile.fsync_every or self.profile.sync_every)
        if limit is not None and st.ops >= limit:  # a run resumed where its limit stopped it
            st.stopped_by = "ops-limit"
            return
        for op in body:
            # Counted here, not in a generator per op: this runs for every op.
            kind = op.op
            st.ops += 1
            counts[kind] = counts.get(kind, 0) + 1
            written = kind in _WRITES
            if written and kind != "truncate":
                st.bytes_written += op.size
            if self.meta is not None and (kind == "punch" or kind == "overwrite"):
                self._holes(op)
            yield op
            if limit is not None and st.ops >= limit:
                st.stopped_by = "ops-limit"
                return
            if written:
                self._writes += 1
                if syncs:
                    for out in self._syncs(op):
                        yield out
                        if limit is not None and st.ops >= limit:
                            st.stopped_by = "ops-limit"
                            return
        if not st.stopped_by:
            st.stopped_by = {"random-update": "updates", "prefragment": "prefragment"}.get(
                mode, "churn"
            )

    def _holes(self, op: Op) -> None:
        """A punch frees the blocks it covers whole; an overwrite allocates those of its range
        that were punched out (a model of blocks in use, ``ext_meta``; each adds an extent)."""
        rec = self.files.get(op.path)
        if rec is None:
            return
        bs = self.bs
        if op.op == "punch":
            end = min(op.offset + op.size, rec.size) // bs
            new = set(range(-(-op.offset // bs), end))
            if rec.holes is None:
                rec.holes = set()
            new -= rec.holes
            rec.holes |= new
            self.used_blocks -= len(new)
            assert self.meta is not None
            if self.meta.cow:  # the extent around a hole is still referenced: kept whole
                self._pin(rec, len([b for b in new if b < rec.base]))
        else:
            assert self.meta is not None
            end = -(-min(op.offset + op.size, rec.size) // bs)
            filled = rec.holes.intersection(range(op.offset // bs, end)) if rec.holes else set()
            if self.meta.cow:  # written anew; the old blocks stay while their extent is used
                first = op.offset // bs
                self._pin(rec, max(0, min(end, rec.base) - first) - len(filled))
            elif not filled:
                return
            if filled:
                assert rec.holes is not None
                rec.holes -= filled
                self.used_blocks += len(filled)
        self.used_blocks += self.meta.regrow(rec.grows, rec.grows + 1)
        rec.grows += 1

    def _pin(self, rec: _File, blocks: int) -> None:
        """Copy-on-write keeps ``blocks`` of ``rec``'s old data allocated (``BtrfsMeta``):
        blocks of the extent its first write made, which stays whole while any of it is
        used. The smaller extents of appends and overwrites are taken to be replaced whole by
        what overwrites them, and freed."""
        add = max(0, min(blocks, rec.base - rec.pinned))
        rec.pinned += add
        self.used_blocks += add

    def _syncs(self, op: Op) -> Iterator[Op]:
        """The fsync and sync that follow the ``_writes``-th write ``op`` (see ``ops``)."""
        st = self.stats
        p = self.profile
        if p.fsync_every and self._writes % p.fsync_every == 0 and op.path in self.files:
            self._undo = None
            st.ops += 1
            st.counts["fsync"] = st.counts.get("fsync", 0) + 1
            yield Op("fsync", op.path)
        if p.sync_every and self._writes % p.sync_every == 0:
            self._undo = None
            st.ops += 1
            st.counts["sync"] = st.counts.get("sync", 0) + 1
            yield Op("sync")

    # ---- hybrid and convergence

    def _hybrid(self) -> Iterator[Op]:
        p = self.profile
        st = self.stats
        churn_budget = p.churn * self.total_blocks * self.bs
        converging = p.mode == "convergence"
        next_check = 0
        if converging:
            yield from self._make_planned_dirs()
        while True:
            f = self.fullness()
            if st.phase == "fill":
                if f >= p.fill:
                    st.phase = "churn"
                    st.fill_ops, st.fill_bytes = st.ops, st.bytes_written
                    next_check = st.ops
                    if converging:
                        self.age_plan = self.age_ops_needed()
                    if churn_budget <= 0 and not converging:
                        st.stopped_by = "fill"
                        return
                    continue
                if self._force_deletes and self.files:
                    self._force_deletes -= 1
                    yield self._delete()
                    continue
                if converging:  # the fill is creates only (Geriatrix)
                    yield self._create()
                    continue
                p_create = 1.0 - 0.4 * f / p.fill
                if not self.files or self.rng.random() < p_create:
                    yield self._create()
                else:
                    yield self._delete()
                continue
            # churn
            assert st.fill_bytes is not None
            if converging and self.age_plan is None and p.age_relative:
                # Resumed in the churn (the record keeps no plan): plan from the files now.
                self.age_plan = self.age_ops_needed()
            if converging and st.ops >= next_check:
                next_check = st.ops + p.check_every
                if self.converged():
                    st.converged_at = st.ops
                    st.stopped_by = "converged"
                    return
            if st.bytes_written - st.fill_bytes >= churn_budget:
                if not converging:
                    # The churn drifts around the fill target: end on it, as asked.
                    yield from self._settle()
                st.stopped_by = "churn"
                return
            if self._force_deletes and self.files:
                self._force_deletes -= 1
                yield self._delete()
                continue
            kind = self._mix_kinds[
                bisect.bisect_right(self._mix_cum, self.rng.random() * self._mix_cum[-1])
            ]
            if kind in ("create", "delete"):
                wc, wd = p.mix.get("create", 0.0), p.mix.get("delete", 0.0)
                share = wc / (wc + wd)
                # Steer toward the fill target: more creates below it, more deletes above.
                p_create = min(0.95, max(0.05, share + 4.0 * (p.fill - f)))
                kind = "create" if self.rng.random() < p_create else "delete"
            if not self.files or (kind == "create" and f >= 0.99):
                kind = "create" if not self.files else "delete"
            if kind == "create":
                yield self._create()
            elif kind == "delete":
                yield self._delete()
            elif kind == "append":
                yield self._append()
            elif kind == "overwrite":
                yield self._overwrite()
            elif kind == "truncate":
                yield self._truncate()
            elif kind in PATTERN_KINDS:
                # A write pattern of real use: a burst of ops (fsage.ager.patterns). Above
                # the fill target, deletes bring the fullness back to it first.
                if f > p.fill + 0.01:
                    while self.files and self.fullness() > p.fill:
                        yield self._delete()
                else:
                    yield from run_pattern(self, kind)
            else:
                yield self._rename()

    def _settle(self) -> Iterator[Op]:
        """After the churn: delete (above the fill target) or create (below it) until the
        fullness is within half a percent of ``profile.fill``. Steered by the model alone
        (``probe_every`` None), within a quarter of a percent, its creates no larger than
        the band leaves room for: the model's own error stays within the half percent."""
        fill = self.profile.fill
        band = 0.0025 if self.probe is not None and self.probe_every is None else 0.005
        if band < 0.005:
            self._settle_band = band
        try:
            for _ in range(1_000_000):
                f = self.fullness(fresh=True)
                if f > fill + band and self.files:
                    yield self._delete()
                elif f < fill - band and not self._force_deletes:
                    yield self._create()
                else:
                    return
        finally:
            self._settle_band = 0.0

    # ---- namespace helpers

    def _new_name(self, parent: str) -> str:
        """A random 10-character name not in ``parent``: five pairs of characters drawn from
        one 52-bit random number (one call to the generator per name)."""
        names = self.dir_names[parent]
        pairs = _PAIRS
        while True:
            x = self.rng.getrandbits(52)
            name = (
                pairs[x % 1296]
                + pairs[x // 1296 % 1296]
                + pairs[x // 1679616 % 1296]
                + pairs[x // 2176782336 % 1296]
                + pairs[x // 2821109907456 % 1296]
            )
            if name not in names:
                return name

    @staticmethod
    def _join(parent: str, name: str) -> str:
        return f"{parent}/{name}" if parent else name

    def _pick_parent(self) -> str:
        w = self.profile.depth_weights
        if w:
            depths = [d for d in sorted(self.dirs_by_depth) if d < len(w) and w[d] > 0]
            if depths:
                d = self.rng.choices(depths, weights=[w[x] for x in depths])[0]
                level = self.dirs_by_depth[d]
                return level[self.rng.randrange(len(level))]
        return self.all_dirs[self.rng.randrange(len(self.all_dirs))]

    def _add_dir(self, parent: str, name: str, path: str) -> None:
        """Enter a new directory in the model (one block for its first directory block)."""
        depth = self.dir_depth[parent] + 1
        self.dir_names[parent].add(name)
        self.dir_depth[path] = depth
        self.dir_names[path] = set()
        self.dir_files[path] = []
        self.dirs_by_depth.setdefault(depth, []).append(path)
        self.all_dirs.append(path)
        self.used_blocks += 1
        if self.meta is not None:
            m = self.meta
            self.used_blocks += m.entry(parent, name, True) + m.new_dir() + m.inode(True)

    def _mkdir(self, parent: str) -> Op:
        name = self._new_name(parent)
        path = self._join(parent, name)
        self._add_dir(parent, name, path)

        self._undo = lambda: self._drop_dir(path)
        return Op("mkdir", path)

    def _drop_dir(self, path: str) -> None:
        """Forget an empty directory (the reverse of ``_add_dir``)."""
        parent, _, name = path.rpartition("/")
        self.dir_names[parent].discard(name)
        self.dirs_by_depth[self.dir_depth.pop(path)].remove(path)
        del self.dir_names[path], self.dir_files[path]
        self.all_dirs.remove(path)
        self.used_blocks -= 1
        if self.meta is not None:
            m = self.meta
            self.used_blocks += m.drop_dir(path) + m.entry(parent, name, False) + m.inode(False)

    def _add_file(self, parent: str, name: str, size: int, keep: _File | None = None) -> str:
        """Enter a file; ``keep``: the record of the same file before a rename or an undo
        (its birth and age slot carry over)."""
        path = self._join(parent, name)
        depth = self.dir_depth[parent]
        rec = _File(size, self.stats.ops if keep is None else keep.born, parent, depth)
        if self._ages is not None:
            if keep is None or keep.slot < 0:
                rec.slot = self._ages.add(rec.born, path)
            else:
                rec.slot = keep.slot
                self._ages.revive(rec.slot, path)
        if self._depth_counts:
            assert self.profile.depth_hist is not None
            rec.dbucket = self.profile.depth_hist.bucket(depth)
            self._depth_counts[rec.dbucket] += 1
        self.files[path] = rec
        self.file_bag.add(path)
        self.dir_names[parent].add(name)
        bisect.insort(self.dir_files[parent], name)
        self.nonempty.add(parent)
        self.used_blocks += _blocks(size, self.bs)
        if self.meta is not None:
            m = self.meta
            if keep is not None:
                rec.grows, rec.holes, rec.pinned = keep.grows, keep.holes, keep.pinned
                rec.base = keep.base
                self.used_blocks += rec.pinned - len(rec.holes or ())
            else:
                rec.base = _blocks(size, self.bs)
            self.used_blocks += m.entry(parent, name, True) + m.regrow(0, rec.grows) + m.inode(True)
        self._rebucket(path, rec)
        return path

    def _drop_file(self, path: str) -> _File:
        rec = self.files.pop(path)
        self.file_bag.remove(path)
        name = path.rsplit("/", 1)[-1]
        self.dir_names[rec.parent].discard(name)
        lst = self.dir_files[rec.parent]
        del lst[bisect.bisect_left(lst, name)]
        if not lst:
            self.nonempty.remove(rec.parent)
        self.used_blocks -= _blocks(rec.size, self.bs)
        if self.meta is not None:
            m = self.meta
            self.used_blocks += m.entry(rec.parent, name, False) + len(rec.holes or ())
            self.used_blocks += m.regrow(rec.grows, 0) + m.inode(False) - rec.pinned
        if rec.bucket >= 0:
            self._size_bags[rec.bucket].remove(path)
        if rec.dbucket >= 0:
            self._depth_counts[rec.dbucket] -= 1
        if self._ages is not None and rec.slot >= 0:
            self._ages.remove(rec.slot)
        return rec

    def _dropper(self, path: str) -> Callable[[], None]:
        def undo() -> None:
            self._drop_file(path)

        return undo

    def _resize(self, path: str, size: int) -> None:
        rec = self.files[path]
        self.used_blocks += _blocks(size, self.bs) - _blocks(rec.size, self.bs)
        if self.meta is not None:
            grows = rec.grows + 1 if size > rec.size > 0 else rec.grows if size else 0
            self.used_blocks += self.meta.regrow(rec.grows, grows)
            rec.grows = grows
            if rec.holes and size < rec.size:  # holes cut off were not counted as used
                cut = {b for b in rec.holes if b >= _blocks(size, self.bs)}
                rec.holes -= cut
                self.used_blocks += len(cut)
            if self.meta.cow and size < rec.size:
                if size == 0:  # every extent let go
                    self.used_blocks -= rec.pinned
                    rec.pinned = rec.base = 0
                else:  # the first extent, across the new end, is kept whole
                    old = min(rec.base, _blocks(rec.size, self.bs))
                    self._pin(rec, old - _blocks(size, self.bs))
            elif self.meta.cow and rec.size == 0:  # written into an empty file: its first write
                rec.base = _blocks(size, self.bs)
        rec.size = size
        self._rebucket(path, rec)

    def _rebucket(self, path: str, rec: _File) -> None:
        h = self.profile.size_hist
        if h is None:
            return
        b = h.bucket(rec.size)
        if b != rec.bucket:
            if rec.bucket >= 0:
                self._size_bags[rec.bucket].remove(path)
            self._size_bags[b].add(path)
            rec.bucket = b

    # ---- ops

    def _create(self) -> Op:
        p = self.profile
        if p.mode == "convergence":
            return self._create_converging()
        parent = self._pick_parent()
        depth = self.dir_depth[parent]
        if depth < p.max_depth - 1 and self.rng.random() < p.dir_prob:
            return self._mkdir(parent)
        size = p.sizes.sample(self.rng, cap=self._free_bytes())
        return self._create_file(parent, size)

    def _create_file(self, parent: str, size: int) -> Op:
        name = self._new_name(parent)
        path = self._add_file(parent, name, size)

        def undo() -> None:
            self._drop_file(path)

        self._undo = undo
        return Op("create", path, size=size)

    def _delete(self) -> Op:
        if self.profile.mode == "convergence":
            path = self._victim_converging()
        else:
            parent = self.nonempty.pick(self.rng)
            names = self.dir_files[parent]
            path = self._join(parent, names[self.rng.randrange(len(names))])
        rec = self._drop_file(path)

        def undo() -> None:
            self._add_file(rec.parent, path.rsplit("/", 1)[-1], rec.size, keep=rec)

        self._undo = undo
        return Op("delete", path)

    def _append(self) -> Op:
        path = self.file_bag.pick(self.rng)
        rec = self.files[path]
        old = rec.size
        size = max(1, self.profile.sizes.sample(self.rng, cap=self._free_bytes()) // 4)
        self._resize(path, old + size)
        self._undo = lambda: self._resize(path, old)
        return Op("append", path, size=size)

    def _overwrite(self) -> Op:
        path = self.file_bag.pick(self.rng)
        rec = self.files[path]
        if rec.size == 0:
            return self._append()
        offset = self.rng.randrange(rec.size)
        size = max(1, min(rec.size - offset, self.profile.sizes.sample(self.rng)))
        self._undo = None
        return Op("overwrite", path, size=size, offset=offset)

    def _truncate(self) -> Op:
        path = self.file_bag.pick(self.rng)
        old = self.files[path].size
        new = self.rng.randrange(old + 1) if old else 0
        self._resize(path, new)
        self._undo = lambda: self._resize(path, old)
        return Op("truncate", path, size=new)

    def _rename(self) -> Op:
        path = self.file_bag.pick(self.rng)
        parent = self._pick_parent()
        name = self._new_name(parent)
        rec = self._drop_file(path)
        dest = self._add_file(parent, name, rec.size, keep=rec)

        def undo() -> None:
            self._drop_file(dest)
            self._add_file(rec.parent, path.rsplit("/", 1)[-1], rec.size, keep=rec)

        self._undo = undo
        return Op("rename", path, dest=dest)


def generate(
    profile: Profile, seed: int, capacity: int, *, block_size: int | None = None
) -> tuple[WorkloadHeader, Iterator[Op]]:
    """A deterministic op stream for ``profile`` on a target of ``capacity`` bytes."""
    gen = Generator(profile, seed, capacity, block_size=block_size)
    return gen.header(), gen.ops()


# The goodness-of-fit test lives in fsage.ager.chisquare; importable from here as before.
__all__ = [
    "DATA_OPS",
    "MIN_EXPECTED",
    "GenStats",
    "Generator",
    "Probe",
    "chi2_sf",
    "chi_square_test",
    "generate",
    "meta_kind",
]
