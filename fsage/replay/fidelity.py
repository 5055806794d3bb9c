"""How faithful a recreation is: the recorded snapshot against the recreated file system.

* files and bytes matched by path (a regular file matches when the recreation has a regular
  file at the same path with the same size), directories matched by path;
* the layout score of each (block-weighted aggregate, seed 000 §4.1), overall and per size
  bucket (seed 000 Figure 5 buckets);
* the distance between the free-space histograms (e2freefrag's log2 buckets, weighted by
  free blocks): total variation distance (half the L1 distance of the two distributions, 0 =
  the same, 1 = disjoint) and earth mover's distance in buckets (how many doublings of extent
  size the free space would have to move, on average, to match);
* the geometry: the mkfs parameters of both, and whether they agree;
* symlinks (same path, same target length) and other inodes (device nodes, FIFOs, sockets:
  same path, same type) matched;
* a verdict (``Verdict``): the recreation is faithful when every count matches, in every size
  bucket holding at least ``MIN_BUCKET_FILES`` files of the original the layout scores differ by
  at most the tolerance (the noise floor of that bucket, or ``MIN_TOLERANCE``, whichever is
  larger) and the free-space total variation distance is within the free-space noise floor +
  ``FREE_TOLERANCE``. The noise floor (``NoiseFloor``) is how far two runs of the same op
  stream on the same kernel land from each other (``fsage.replay.noise``): ext4's allocator is
  not deterministic, so no recreation can be asked to come closer than that.
"""

from __future__ import annotations

import stat
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fsage.analyzer.analysis import bucket_range, size_bucket
from fsage.analyzer.freespace import MAX_BUCKET, free_space
from fsage.analyzer.scores import aggregate_score, file_scores
from fsage.layout import Layout
from fsage.text import size_range

#: mkfs parameters that define the geometry (label, UUID and hash seed are not geometry).
GEOMETRY_KEYS = (
    "block_size",
    "cluster_size",
    "blocks_count",
    "inodes_count",
    "inode_size",
    "blocks_per_group",
    "flex_bg_size",
    "features",
    "reserved_blocks",
    "reserved_gdt_blocks",
    "desc_size",
    "journal_blocks",
    "first_data_block",
)
#: Paths left out of the comparison: made by mkfs, not by the recorded activity.
IGNORED_TOP = frozenset({"lost+found"})
EXAMPLES = 10
#: Size buckets with fewer files of the original than this are shown but not judged.
MIN_BUCKET_FILES = 50
#: The smallest tolerance of a bucket's layout score.
MIN_TOLERANCE = 0.02
#: Added to the free-space noise floor to get its tolerance.
FREE_TOLERANCE = 0.1
#: Runs of the op stream a floor should rest on (``fsage noise-floor``'s default); a verdict
#: against fewer says its floor is noisy. bench/verdict.py, at the last snapshots of four release
#: histories: floors of 3 runs resampled from 10 judged replays that land as close to the
#: original as reruns do faithful in 63-93% of cases, floors of 5 in 77-100%.
SOUND_RUNS = 5


def bucket_tolerance(noise: float) -> float:
    """A size bucket's layout-score tolerance given its noise."""
    return max(noise, MIN_TOLERANCE)


def free_tolerance(noise: float) -> float:
    """The free-space distance's tolerance given its noise."""
    return noise + FREE_TOLERANCE


#: Where a verdict's tolerances come from (``Fidelity.judge``): ``spread``, the runs' largest
#: distance between each other (the issue's rule); ``original``, the runs' largest distance to
#: the original snapshot ("is the recreation as close to the original as a rerun of its op
#: stream is?"; needs a floor measured with the original, see ``NoiseFloor.add_original``).
RULES = ("spread", "original")
DEFAULT_RULE = "spread"


@dataclass
class NoiseFloor:
    """How far runs of one op stream land from each other: per size bucket (its smallest
    block count) the largest layout-score difference seen, and the largest free-space total
    variation distance; every pair's free-space distance (how wide the floor is); and, when
    measured, each run's distance to the original snapshot."""

    by_bucket: dict[int, float] = field(default_factory=dict)
    free_tv: float = 0.0
    runs: int = 0
    note: str = ""
    free_tv_pairs: list[float] = field(default_factory=list)
    #: The snapshot the runs were compared with (None: not compared).
    original_snapshot: int | None = None
    #: Per size bucket the largest layout-score difference of a run to the original.
    to_original_by_bucket: dict[int, float] = field(default_factory=dict)
    #: Each run's free-space distance to the original.
    to_original_free_tv: list[float] = field(default_factory=list)

    def bucket(self, min_blocks: int) -> float:
        return self.by_bucket.get(int(min_blocks), 0.0)

    def add_original(self, original: Layout, runs: list[Layout], snapshot_id: int) -> None:
        """Measure each run's distance to ``original`` (for the ``original`` rule)."""
        self.original_snapshot = int(snapshot_id)
        self.to_original_by_bucket, self.to_original_free_tv = {}, []
        for run in runs:
            f = fidelity(original, run)
            _max_bucket_diffs(f, self.to_original_by_bucket)
            self.to_original_free_tv.append(f.free_tv_distance)

    def tolerances(self, rule: str) -> tuple[dict[int, float], float]:
        """(layout-score noise per size bucket, free-space noise) under ``rule``."""
        if rule not in RULES:
            raise ValueError(f"unknown rule {rule!r}")
        if rule == "spread":
            return self.by_bucket, self.free_tv
        if self.original_snapshot is None:
            from fsage.errors import UsageError

            raise UsageError(
                "this noise floor has no distances to the original snapshot: measure it again "
                "with `fsage noise-floor` (which now records them) to judge by the original"
            )
        return self.to_original_by_bucket, max(self.to_original_free_tv, default=0.0)

    def free_tv_without_one(self) -> tuple[float, float] | None:
        """The free-space floor the runs would give with any one of them left out, smallest
        and largest: how much a single run decides the floor (None below 3 runs, or for a
        floor stored without its pairs). The pairs are in ``noise_between``'s order."""
        n = self.runs
        if n < 3 or len(self.free_tv_pairs) != n * (n - 1) // 2:
            return None
        pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
        floors = [
            max(d for (i, j), d in zip(pairs, self.free_tv_pairs, strict=True) if k not in (i, j))
            for k in range(n)
        ]
        return min(floors), max(floors)

    def describe(self, rule: str = DEFAULT_RULE) -> str:
        """How many runs the floor rests on and how wide their free-space distances spread."""
        if rule == "original" and self.to_original_free_tv:
            xs, what = self.to_original_free_tv, f"runs to snapshot {self.original_snapshot}"
        else:
            xs, what = self.free_tv_pairs, "between runs"
        spread = f"{min(xs):.3f}-{max(xs):.3f}" if xs else f"{self.free_tv:.3f}"
        few = " (few: the floor is itself noisy)" if self.runs < SOUND_RUNS else ""
        return f"{self.runs} runs{few}; free-space distance {what} {spread}"

    def labelled(self, block_size: int) -> list[tuple[str, float]]:
        """(file-size label in bytes, layout-score difference) per bucket, smallest first."""
        out = []
        for lo, diff in sorted(self.by_bucket.items()):
            hi = bucket_range(int(size_bucket(np.array([lo]))[0]))[1]
            out.append((size_range(lo, hi, block_size), diff))
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "by_bucket": {str(k): v for k, v in sorted(self.by_bucket.items())},
            "free_tv": self.free_tv,
            "runs": self.runs,
            "note": self.note,
            "free_tv_pairs": self.free_tv_pairs,
            "free_tv_without_one": self.free_tv_without_one(),
            "original_snapshot": self.original_snapshot,
            "to_original_by_bucket": {
                str(k): v for k, v in sorted(self.to_original_by_bucket.items())
            },
            "to_original_free_tv": self.to_original_free_tv,
        }

    @classmethod
    def from_json(cls, data: Any) -> NoiseFloor:
        from fsage.errors import UsageError

        try:
            if "noise_floor" in data:
                data = data["noise_floor"]
            orig = data.get("original_snapshot")
            return cls(
                by_bucket={int(k): float(v) for k, v in data["by_bucket"].items()},
                free_tv=float(data["free_tv"]),
                runs=int(data.get("runs", 0)),
                note=str(data.get("note", "")),
                free_tv_pairs=[float(x) for x in data.get("free_tv_pairs", [])],
                original_snapshot=None if orig is None else int(orig),
                to_original_by_bucket={
                    int(k): float(v) for k, v in data.get("to_original_by_bucket", {}).items()
                },
                to_original_free_tv=[float(x) for x in data.get("to_original_free_tv", [])],
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            raise UsageError("not a noise floor (see fsage noise-floor)") from None


@dataclass
class Verdict:
    faithful: bool
    reasons: list[str]
    free_tolerance: float
    noise_floor: NoiseFloor | None
    rule: str = DEFAULT_RULE

    def to_json(self) -> dict[str, Any]:
        return {
            "faithful": self.faithful,
            "reasons": self.reasons,
            "free_tolerance": self.free_tolerance,
            "rule": self.rule,
            "basis": self.basis(),
            "noise_floor": self.noise_floor.to_json() if self.noise_floor else None,
        }

    def basis(self) -> str:
        """What the tolerances rest on."""
        if self.noise_floor is None:
            return "no measured noise floor: fixed tolerances"
        return f"{self.rule} of {self.noise_floor.describe(self.rule)}"

    def line(self) -> str:
        if self.faithful:
            head = "verdict: FAITHFUL (within tolerance in every judged bucket)"
        else:
            head = "verdict: NOT FAITHFUL: " + "; ".join(self.reasons)
        return f"{head} [{self.basis()}]"


@dataclass
class Fidelity:
    files_original: int
    files_recreated: int
    files_matched: int
    bytes_original: int
    bytes_recreated: int
    bytes_matched: int
    dirs_original: int
    dirs_recreated: int
    dirs_matched: int
    symlinks_original: int
    symlinks_recreated: int
    symlinks_matched: int
    others_original: int
    others_recreated: int
    others_matched: int
    layout_score_original: float | None
    layout_score_recreated: float | None
    by_size: list[dict[str, Any]]
    free_tv_distance: float
    free_emd_buckets: float
    free_original: dict[str, Any]
    free_recreated: dict[str, Any]
    geometry: dict[str, list[Any]]
    geometry_matches: bool
    missing: list[str] = field(default_factory=list)  # examples: in the original only
    extra: list[str] = field(default_factory=list)  # examples: in the recreation only
    size_differs: list[str] = field(default_factory=list)
    verdict: Verdict | None = None

    def judge(self, floor: NoiseFloor | None = None, rule: str = DEFAULT_RULE) -> Verdict:
        """The verdict against ``floor`` (None: no measured floor, so the fixed minimum
        tolerances) under ``rule`` (see ``RULES``); fills each size row's difference and
        tolerance and sets ``verdict``."""
        noise, free_noise = floor.tolerances(rule) if floor else ({}, 0.0)
        reasons: list[str] = []
        for what, a, m in (
            ("files", self.files_original, self.files_matched),
            ("bytes", self.bytes_original, self.bytes_matched),
            ("directories", self.dirs_original, self.dirs_matched),
            ("symlinks", self.symlinks_original, self.symlinks_matched),
            ("other inodes", self.others_original, self.others_matched),
        ):
            if a != m:
                reasons.append(f"{what} matched {m:,} of {a:,}")
        for what, a, b in (
            ("files", self.files_original, self.files_recreated),
            ("symlinks", self.symlinks_original, self.symlinks_recreated),
            ("other inodes", self.others_original, self.others_recreated),
        ):
            if b > a:
                reasons.append(f"{b - a:,} {what} in the recreation only")
        for r in self.by_size:
            so, sr = r["layout_score_original"], r["layout_score_recreated"]
            bucket_noise = noise.get(int(r["min_blocks"]), 0.0)
            tol = bucket_tolerance(bucket_noise)
            diff = None if so is None or sr is None else sr - so
            judged = r["files_original"] >= MIN_BUCKET_FILES
            r["difference"] = diff
            r["tolerance"] = tol
            r["noise_floor"] = bucket_noise if floor else None
            r["judged"] = judged
            r["within"] = None if not judged else (diff is not None and abs(diff) <= tol)
            if judged and not r["within"]:
                got = "no score" if diff is None else f"{diff:+.3f}"
                reasons.append(f"files of {r['label']}: score {got}, tolerance {tol:.3f}")
        free_tol = free_tolerance(free_noise)
        if self.free_tv_distance > free_tol:
            reasons.append(
                f"free-space distance {self.free_tv_distance:.3f} > tolerance {free_tol:.3f}"
            )
        self.verdict = Verdict(not reasons, reasons, free_tol, floor, rule)
        return self.verdict

    @property
    def layout_score_difference(self) -> float | None:
        if self.layout_score_original is None or self.layout_score_recreated is None:
            return None
        return self.layout_score_recreated - self.layout_score_original

    def to_json(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["layout_score_difference"] = self.layout_score_difference
        out["verdict"] = self.verdict.to_json() if self.verdict else None
        return out

    def lines(self) -> list[str]:
        """A short human summary."""

        def sc(v: float | None) -> str:
            return "-" if v is None else f"{v:.3f}"

        out = [
            f"files matched {self.files_matched}/{self.files_original} "
            f"(recreation has {self.files_recreated}); bytes matched "
            f"{self.bytes_matched:,}/{self.bytes_original:,}; directories matched "
            f"{self.dirs_matched}/{self.dirs_original}; symlinks matched "
            f"{self.symlinks_matched}/{self.symlinks_original}; others matched "
            f"{self.others_matched}/{self.others_original}",
            f"layout score original {sc(self.layout_score_original)}, recreated "
            f"{sc(self.layout_score_recreated)}",
            f"free space: total variation distance {self.free_tv_distance:.3f}, earth mover's "
            f"distance {self.free_emd_buckets:.3f} buckets; free extents "
            f"{self.free_original['free_extent_count']} vs "
            f"{self.free_recreated['free_extent_count']}",
            "geometry: " + ("same" if self.geometry_matches else "DIFFERS: " + self._geo_diff()),
        ]
        if self.verdict is not None:
            out.append(self.verdict.line())
        return out

    def _geo_diff(self) -> str:
        return ", ".join(f"{k} {a} vs {b}" for k, (a, b) in self.geometry.items() if a != b)


@dataclass
class _Names:
    regular: dict[str, int]  # path -> size
    dirs: set[str]
    symlinks: dict[str, int]  # path -> target length
    others: dict[str, int]  # path -> file type (S_IFMT)


def _path_sizes(layout: Layout) -> _Names:
    """Regular files, directories, symlinks and other inodes by relative path, mkfs's own
    left out."""
    files = layout.files
    mode = files.mode.tolist()
    size = files.size.tolist()
    row = {int(i): r for r, i in enumerate(files.ino.tolist())}
    out = _Names({}, set(), {}, {})
    for ino, paths in layout.paths().items():
        r = row.get(ino)
        if r is None:
            continue
        fmt = stat.S_IFMT(mode[r])
        for p in paths:
            rel = p.lstrip("/")
            if not rel or rel in IGNORED_TOP:
                continue
            if fmt == stat.S_IFREG:
                out.regular[rel] = int(size[r])
            elif fmt == stat.S_IFDIR:
                out.dirs.add(rel)
            elif fmt == stat.S_IFLNK:
                out.symlinks[rel] = int(size[r])
            else:
                out.others[rel] = fmt
    return out


def _by_size(layout: Layout) -> dict[int, tuple[int, int, int]]:
    """size bucket -> (files, contiguous, denominator) over regular files."""
    s = file_scores(layout.files)
    reg = layout.files.is_regular()
    k = size_bucket(s.blocks)
    out: dict[int, tuple[int, int, int]] = {}
    sel = reg & (k >= 1)
    for b in np.unique(k[sel]).tolist():
        m = sel & (k == b)
        out[int(b)] = (int(m.sum()), int(s.contiguous[m].sum()), int(s.denominator[m].sum()))
    return out


def _overall(layout: Layout) -> float | None:
    s = file_scores(layout.files)
    reg = layout.files.is_regular()
    return aggregate_score(s.contiguous[reg], s.denominator[reg])


def _free_hist(layout: Layout) -> tuple[np.ndarray[Any, np.dtype[np.float64]], dict[str, Any]]:
    f = layout.facts
    fs = free_space(layout.free, f.block_size, f.blocks_total, f.first_data_block)
    h = np.zeros(MAX_BUCKET + 1, np.float64)
    for k, _count, blocks in fs.buckets:
        h[k] = blocks
    return h, fs.to_json()


def free_distances(a: Layout, b: Layout) -> tuple[float, float]:
    """(total variation distance, earth mover's distance in log2 buckets) between the
    block-weighted free-extent histograms of ``a`` and ``b``; 0 when both have no free space."""
    ha, _ = _free_hist(a)
    hb, _ = _free_hist(b)
    return _distances(ha, hb)


def _distances(
    ha: np.ndarray[Any, np.dtype[np.float64]], hb: np.ndarray[Any, np.dtype[np.float64]]
) -> tuple[float, float]:
    sa, sb = float(ha.sum()), float(hb.sum())
    if sa == 0 and sb == 0:
        return 0.0, 0.0
    if sa == 0 or sb == 0:
        return 1.0, float(MAX_BUCKET)
    pa, pb = ha / sa, hb / sb
    tv = 0.5 * float(np.abs(pa - pb).sum())
    emd = float(np.abs(np.cumsum(pa) - np.cumsum(pb)).sum())
    return tv, emd


def geometry(layout: Layout) -> dict[str, Any]:
    m = layout.facts.mkfs
    out = {k: m.get(k) for k in GEOMETRY_KEYS}
    if isinstance(out["features"], list):
        out["features"] = sorted(out["features"])
    return out


def fidelity(original: Layout, recreated: Layout) -> Fidelity:
    """Compare a recorded snapshot with its recreation (see the module doc)."""
    names_a, names_b = _path_sizes(original), _path_sizes(recreated)
    fa, da, fb, db = names_a.regular, names_a.dirs, names_b.regular, names_b.dirs
    matched = [p for p, s in fa.items() if fb.get(p) == s]
    missing = sorted(p for p in fa if p not in fb)
    extra = sorted(p for p in fb if p not in fa)
    differs = sorted(p for p, s in fa.items() if p in fb and fb[p] != s)

    ba, bb = _by_size(original), _by_size(recreated)
    rows = []
    for k in sorted(set(ba) | set(bb)):
        lo, hi = bucket_range(k)
        na, ca, dna = ba.get(k, (0, 0, 0))
        nb, cb, dnb = bb.get(k, (0, 0, 0))
        rows.append(
            {
                "min_blocks": lo,
                "max_blocks": hi,
                "label": size_range(lo, hi, original.facts.block_size),
                "files_original": na,
                "files_recreated": nb,
                "layout_score_original": ca / dna if dna else None,
                "layout_score_recreated": cb / dnb if dnb else None,
            }
        )
    ha, ja = _free_hist(original)
    hb, jb = _free_hist(recreated)
    tv, emd = _distances(ha, hb)
    ga, gb = geometry(original), geometry(recreated)
    geo = {k: [ga[k], gb[k]] for k in GEOMETRY_KEYS}
    return Fidelity(
        files_original=len(fa),
        files_recreated=len(fb),
        files_matched=len(matched),
        bytes_original=sum(fa.values()),
        bytes_recreated=sum(fb.values()),
        bytes_matched=sum(fa[p] for p in matched),
        dirs_original=len(da),
        dirs_recreated=len(db),
        dirs_matched=len(da & db),
        symlinks_original=len(names_a.symlinks),
        symlinks_recreated=len(names_b.symlinks),
        symlinks_matched=sum(
            1 for p, n in names_a.symlinks.items() if names_b.symlinks.get(p) == n
        ),
        others_original=len(names_a.others),
        others_recreated=len(names_b.others),
        others_matched=sum(1 for p, t in names_a.others.items() if names_b.others.get(p) == t),
        layout_score_original=_overall(original),
        layout_score_recreated=_overall(recreated),
        by_size=rows,
        free_tv_distance=tv,
        free_emd_buckets=emd,
        free_original=ja,
        free_recreated=jb,
        geometry=geo,
        geometry_matches=all(a == b for a, b in geo.values()),
        missing=missing[:EXAMPLES],
        extra=extra[:EXAMPLES],
        size_differs=differs[:EXAMPLES],
    )


def _max_bucket_diffs(f: Fidelity, into: dict[int, float]) -> None:
    """Raise ``into``'s per-bucket layout-score differences to those of ``f`` where larger."""
    for r in f.by_size:
        so, sr = r["layout_score_original"], r["layout_score_recreated"]
        if so is None or sr is None:
            continue
        k = int(r["min_blocks"])
        into[k] = max(into.get(k, 0.0), abs(sr - so))


def noise_between(layouts: list[Layout], note: str = "") -> NoiseFloor:
    """The noise floor from several runs of one op stream: the largest pairwise layout-score
    difference per size bucket and the largest pairwise free-space distance."""
    floor = NoiseFloor(runs=len(layouts), note=note)
    for i in range(len(layouts)):
        for j in range(i + 1, len(layouts)):
            f = fidelity(layouts[i], layouts[j])
            _max_bucket_diffs(f, floor.by_bucket)
            floor.free_tv_pairs.append(f.free_tv_distance)
    floor.free_tv = max(floor.free_tv_pairs, default=0.0)
    return floor


__all__ = [
    "DEFAULT_RULE",
    "FREE_TOLERANCE",
    "GEOMETRY_KEYS",
    "MIN_BUCKET_FILES",
    "MIN_TOLERANCE",
    "RULES",
    "SOUND_RUNS",
    "Fidelity",
    "NoiseFloor",
    "Verdict",
    "bucket_tolerance",
    "fidelity",
    "free_distances",
    "free_tolerance",
    "geometry",
    "noise_between",
]
