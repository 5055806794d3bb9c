"""Convergence mode of the workload generator (Geriatrix profiles; see ``fsage.ager.generator``):
the planned directory tree, creates and deletes steered toward the target histograms of size,
age and depth, and the chi-square report that says whether they are met."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator
from typing import Any

from fsage.ager.chisquare import chi_square_test
from fsage.ager.genmodel import GenStats, _AgeIndex, _Bag, _File
from fsage.ager.profile import Profile
from fsage.workload import Op


class Converging:
    """The convergence-mode part of ``Generator``, which holds the state declared here."""

    profile: Profile
    stats: GenStats
    rng: random.Random
    files: dict[str, _File]
    file_bag: _Bag
    dir_depth: dict[str, int]
    age_plan: int | None
    _force_deletes: int
    _size_bags: list[_Bag]
    _size_frac: list[float]
    _size_vals: list[int]
    _depth_counts: list[int]
    _depth_frac: list[float]
    _depth_parents: list[list[str]]
    _dir_plan: list[str]
    _ages: _AgeIndex | None
    _age_frac: list[float]
    _age_cache: list[int]
    _age_cache_at: int
    _create_rate: float
    # Generator's namespace model and ops.
    _join: Callable[[str, str], str]
    _add_dir: Callable[[str, str, str], None]
    _pick_parent: Callable[[], str]
    _mkdir: Callable[[str], Op]
    _free_bytes: Callable[[], int]
    _create_file: Callable[[str, int], Op]
    _delete: Callable[[], Op]
    _undo: Callable[[], None] | None

    def _plan_dirs(self, p: Profile) -> None:
        """The directory tree of the depth histogram, Geriatrix's shape: files at depth ``d``
        go to ``k`` sibling directories ``d1/.../d<d-1>/d1 .. d<k>`` (or, for ``k`` = 0, the
        one directory ``d1/.../d<d>``); the chain ``d1/d2/...`` joins the depths."""
        hd = p.depth_hist
        assert hd is not None
        plan: list[str] = []
        seen: set[str] = set()

        def need(path: str) -> None:
            if path and path not in seen:
                seen.add(path)
                plan.append(path)

        for i, edge in enumerate(hd.edges):
            depth = math.floor(edge)
            low = hd.edges[i - 1] if i else -1.0
            if depth <= low or depth < 0 or hd.weights[i] <= 0:
                self._depth_parents.append([])
                continue
            if depth == 0:
                self._depth_parents.append([""])
                continue
            chain = "/".join(f"d{j}" for j in range(1, depth))
            for j in range(1, depth):
                need("/".join(f"d{x}" for x in range(1, j + 1)))
            k = p.depth_dirs[i] if p.depth_dirs is not None else 1
            names = [f"d{depth}"] if k == 0 else [f"d{j}" for j in range(1, k + 1)]
            level = [self._join(chain, n) for n in names]
            for d in level:
                need(d)
            self._depth_parents.append(level)
        self._dir_plan = plan

    def _make_planned_dirs(self) -> Iterator[Op]:
        for path in self._dir_plan:
            if path in self.dir_depth:
                continue  # adopted from an earlier run
            parent, _, name = path.rpartition("/")
            self._add_dir(parent, name, path)
            self._undo = None
            yield Op("mkdir", path)

    @staticmethod
    def _argmax(values: list[float]) -> int:
        """Index of the largest value (the first of equals)."""
        return values.index(max(values))

    def _create_converging(self) -> Op:
        p = self.profile
        hs = p.size_hist
        assert hs is not None
        n = len(self.files) + 1
        if p.depth_hist is not None:
            d = [
                f * n - c if lv else -math.inf
                for f, c, lv in zip(
                    self._depth_frac, self._depth_counts, self._depth_parents, strict=True
                )
            ]
            b = self._argmax(d)
            level = self._depth_parents[b] if d[b] > -math.inf else [""]
            parent = level[self.rng.randrange(len(level))]
        elif self.rng.random() < p.dir_prob:
            return self._mkdir(self._pick_parent())
        else:
            parent = self._pick_parent()
        # Every file of a size bucket has the bucket's size (Geriatrix); the bucket furthest
        # below its share among those that fit.
        room = self._free_bytes()
        sizes = self._size_vals
        d = [
            f * n - len(bag.items) if sz <= room and f > 0 else -math.inf
            for f, bag, sz in zip(self._size_frac, self._size_bags, sizes, strict=True)
        ]
        b = self._argmax(d)
        if self._age_cache and self._age_horizon() == self.stats.ops:
            self._age_cache[0] += 1  # born now: the youngest bucket (a projection has it)
        if d[b] == -math.inf:
            if self.files:
                self._force_deletes = max(self._force_deletes, 1)
                return self._delete()
            b = 0
        return self._create_file(parent, sizes[b])

    def _age_scale(self, now: int) -> float:
        """Ops per unit of the age edges: 1 for ages in ops; for relative ages the planned
        end (Geriatrix's edges are fractions of the run it plans), or the ops so far until
        the plan is fixed (the fill, which deletes nothing)."""
        if not self.profile.age_relative:
            return 1.0
        return float(self.age_plan) if self.age_plan else float(now)

    def _age_horizon(self) -> int:
        """The op at which deletions aim to have the target ages: the planned end until it
        is reached, then the current op."""
        now = self.stats.ops
        return max(now, self.age_plan or 0) if self.profile.age_relative else now

    def _age_bounds(self, at: int) -> list[float]:
        """Birth-op bounds of the age buckets as seen at op ``at``: bucket i holds files
        born in [bounds[i+1], bounds[i]) (the last from op -inf)."""
        h = self.profile.age_hist
        assert h is not None
        scale = self._age_scale(self.stats.ops)
        return [at + 1.0] + [at - e * scale for e in h.edges[:-1]] + [-math.inf]

    def age_ops_needed(self, files: int | None = None) -> int | None:
        """The fewest ops (counted from the stream's first) after which a relative age
        histogram can hold ``files`` live files (default: the live files now), as Geriatrix
        plans its run: bucket i spans a share ``w_i`` of the ops so far and must hold a share
        ``f_i`` of the files, all born inside it; churn creates one file every other op, so
        the ops so far must be at least ``2 * f_i * files / w_i`` for every bucket but the
        oldest (which old files fill). None when there is no relative age histogram."""
        h = self.profile.age_hist
        if h is None or not self.profile.age_relative:
            return None
        n = len(self.files) if files is None else files
        need = 0.0
        low = 0.0
        for edge, frac in zip(h.edges[:-1], h.fractions[:-1], strict=True):
            width = edge - low
            low = edge
            if frac > 0 and width > 0:
                need = max(need, 2.0 * frac * n / width)
        return math.ceil(need)

    def _age_counts(self) -> list[int]:
        ages = self._ages
        assert ages is not None
        before = [ages.born_before(x) for x in self._age_bounds(self.stats.ops)]
        return [before[i] - before[i + 1] for i in range(len(before) - 1)]

    def _steering_age_counts(self) -> list[int]:
        """Age counts for steering, as they will be at the horizon (``_age_horizon``): the
        live files of each bucket's birth window, plus the files the creates still to come
        inside the window will add. Exact every 16 ops, kept up by the ops in between."""
        now = self.stats.ops
        if now - self._age_cache_at >= 16:
            ages = self._ages
            assert ages is not None
            bounds = self._age_bounds(self._age_horizon())
            before = [ages.born_before(x) for x in bounds]
            counts = [before[i] - before[i + 1] for i in range(len(before) - 1)]
            for i in range(len(counts)):
                ahead = min(bounds[i], self._age_horizon() + 1.0) - max(bounds[i + 1], now + 1.0)
                if ahead > 0:
                    counts[i] += int(ahead * self._create_rate)
            self._age_cache = counts
            self._age_cache_at = now
        return self._age_cache

    def _victim_converging(self) -> str:
        p = self.profile
        hs = p.size_hist
        assert hs is not None
        n = len(self.files)
        size_over = [
            len(bag.items) - f * n for f, bag in zip(self._size_frac, self._size_bags, strict=True)
        ]
        depth_over = [c - f * n for f, c in zip(self._depth_frac, self._depth_counts, strict=True)]

        files = self.files

        def excess(path: str) -> tuple[float, str]:
            rec = files[path]
            e = size_over[rec.bucket] if rec.bucket >= 0 else 0.0
            return (e + (depth_over[rec.dbucket] if rec.dbucket >= 0 else 0.0), path)

        ages = self._ages
        if ages is not None and p.age_hist is not None:
            counts = self._steering_age_counts()
            bounds = self._age_bounds(self._age_horizon())
            last = self.stats.ops + 1.0  # births so far
            over = [
                c - f * n if c > 0 else -math.inf
                for f, c in zip(self._age_frac, counts, strict=True)
            ]
            # The bucket furthest above its share that holds a live file now (one whose
            # window is still to come has only projected files).
            first = count = 0
            for b in sorted(range(len(over)), key=lambda i: -over[i]):
                if over[b] == -math.inf:
                    break
                first = ages.born_before(bounds[b + 1])
                count = ages.born_before(min(bounds[b], last)) - first  # exact
                if count > 0:
                    break
            cands = ages.sample(first, count, min(4, count), self.rng) if count > 0 else []
            counts[b] -= 1
        else:
            b = self._argmax(
                [
                    x if len(bag) else -math.inf
                    for x, bag in zip(size_over, self._size_bags, strict=True)
                ]
            )
            bag = self._size_bags[b]
            cands = [bag.pick(self.rng) for _ in range(min(4, len(bag)))]
        if not cands:
            return self.file_bag.pick(self.rng)
        return max(cands, key=excess)

    def histogram_counts(self) -> dict[str, list[int]]:
        """Current counts per bucket of the profile's target histograms (kept incrementally)."""
        p = self.profile
        out: dict[str, list[int]] = {}
        if p.size_hist is not None:
            out["size"] = [len(b) for b in self._size_bags]
        if p.age_hist is not None:
            out["age"] = self._age_counts()
        if p.depth_hist is not None:
            out["depth"] = list(self._depth_counts)
        return out

    def convergence_report(self) -> dict[str, Any]:
        """Per target histogram: ideal vs actual per bucket and a chi-square test of the counts;
        ``converged`` when every histogram passes at ``profile.confidence``."""
        p = self.profile
        hists = {"size": p.size_hist, "age": p.age_hist, "depth": p.depth_hist}
        out: dict[str, Any] = {}
        for key, counts in self.histogram_counts().items():
            hist = hists[key]
            assert hist is not None
            out[key] = chi_square_test(hist.fractions, counts, p.confidence, p.tolerance)
            out[key]["edges"] = list(hist.edges)
        return {
            "converged": bool(out) and all(h["passed"] for h in out.values()),
            "age_reachable_at": self.age_plan or self.age_ops_needed(),
            "age_planned_end": self.age_plan,
            "confidence": p.confidence,
            "tolerance": p.tolerance,
            "ops": self.stats.ops,
            "age_relative": p.age_relative,
            "histograms": out,
        }

    def converged(self) -> bool:
        return bool(self.convergence_report()["converged"])
