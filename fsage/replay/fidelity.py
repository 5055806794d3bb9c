"""How faithful a recreation is: the recorded snapshot against the recreated file system.

* files and bytes matched by path (a regular file matches when the recreation has a regular
  file at the same path with the same size), directories matched by path;
* the layout score of each (block-weighted aggregate, seed 000 §4.1), overall and per size
  bucket (seed 000 Figure 5 buckets);
* the distance between the free-space histograms (e2freefrag's log2 buckets) twice: by free
  blocks, the total variation distance of the block-weighted distributions (half their L1
  distance, 0 = the same, 1 = disjoint), also as an earth mover's distance in buckets (how
  many doublings of extent size the free space would have to move, on average, to match); and
  by free extents, the extents per bucket that would have to appear or go over all extents of
  both (0 = the same count in every bucket, 1 = none in common). One large free extent holding
  most of the free blocks decides the first; the second sees how many pieces the free space
  is in, and how many in each size;
* locality: the path-order dynamic layout score of each (the modeled one of
  ``fsage.analyzer.dynamic``: a cold recursive read of the tree, inodes and metadata included);
* the scan that layout stands for: that read's modeled time on a modern HDD and seed 000's
  disk, the original's, the recreation's and a plain copy's, and the scan criterion
  (``fsage.replay.fidelity_scan``);
* the geometry: the mkfs parameters of both, and whether they agree;
* symlinks (same path, same target length) and other inodes (device nodes, FIFOs, sockets:
  same path, same type) matched;
* the verdict (``Fidelity.judge``, rules and tolerances in ``fsage.replay.verdict``): every
  count matches and every judged distance is within its tolerance.
"""

from __future__ import annotations

import stat
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fsage.analyzer.analysis import bucket_range, size_bucket
from fsage.analyzer.dynamic import Requests
from fsage.analyzer.freespace import MAX_BUCKET, free_space
from fsage.analyzer.scores import aggregate_score, file_scores
from fsage.layout import Layout
from fsage.replay.fidelity_scan import COPY_FROM_FLOOR, ScanModel, path_reads, scan_model

# The verdict's names, kept importable from here.
from fsage.replay.verdict import (
    DEFAULT_RULE,
    DYNAMIC,
    FREE_BLOCKS,
    FREE_EXTENTS,
    FREE_TOLERANCE,
    MIN_BUCKET_FILES,
    MIN_TOLERANCE,
    RULES,
    SCAN_JUDGED,
    SOUND_RUNS,
    NoiseFloor,
    Verdict,
    bucket_tolerance,
    floor_allowance,
    free_tolerance,
    judge_distances,
    tolerance,
)
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
    #: How far the free-extent counts per bucket are (``_count_distance``).
    free_extents_distance: float = 0.0
    dynamic_score_original: float | None = None
    dynamic_score_recreated: float | None = None
    #: The modeled cold path-order scans and the scan criterion (None: not modeled).
    scan: ScanModel | None = None
    verdict: Verdict | None = None

    def distances(self) -> dict[str, float]:
        """Every distance a verdict can judge, by key: "bucket:MIN_BLOCKS" (recreated minus
        original layout score), ``DYNAMIC`` (likewise, path-order dynamic layout score),
        ``FREE_BLOCKS`` and ``FREE_EXTENTS`` (total variation distances)."""
        out: dict[str, float] = {}
        for r in self.by_size:
            so, sr = r["layout_score_original"], r["layout_score_recreated"]
            if so is not None and sr is not None:
                out[f"bucket:{r['min_blocks']}"] = sr - so
        out[FREE_BLOCKS] = self.free_tv_distance
        out[FREE_EXTENTS] = self.free_extents_distance
        if self.dynamic_score_original is not None and self.dynamic_score_recreated is not None:
            out[DYNAMIC] = self.dynamic_score_recreated - self.dynamic_score_original
        return out

    def judged(self) -> dict[str, str]:
        """The distances a verdict judges, with their labels: size buckets holding at least
        ``MIN_BUCKET_FILES`` files of the original, both free-space distances, and the dynamic
        layout score when the original has one and at least as many files."""
        out = {
            f"bucket:{r['min_blocks']}": f"files of {r['label']}"
            for r in self.by_size
            if r["files_original"] >= MIN_BUCKET_FILES
        }
        out[FREE_BLOCKS] = "free space by blocks"
        out[FREE_EXTENTS] = "free space by extents"
        if self.dynamic_score_original is not None and self.files_original >= MIN_BUCKET_FILES:
            out[DYNAMIC] = "path-order dynamic layout score"
        return out

    def judge(
        self,
        floor: NoiseFloor | None = None,
        rule: str = DEFAULT_RULE,
        copy: dict[str, float] | None = None,
    ) -> Verdict:
        """The verdict against ``floor`` (None: no measured floor, so the fixed minimum
        tolerances) under ``rule`` (see ``RULES``), with a plain copy's distances to the
        original (``copy``, else the floor's) as the yardstick; fills each size row's difference
        and tolerance and sets ``verdict``."""

        yardstick = copy if copy is not None else (floor.copy if floor else None)

        def noise(key: str) -> float:
            return floor_allowance(floor, key, yardstick)

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
        dist, judged = self.distances(), self.judged()
        for r in self.by_size:
            key = f"bucket:{r['min_blocks']}"
            diff = dist.get(key)
            r["difference"] = diff
            r["noise_floor"] = floor.noise(key) if floor else None
            r["tolerance"] = tolerance(key, noise(key))
            r["judged"] = key in judged
            r["within"] = (
                None if key not in judged else diff is not None and abs(diff) <= r["tolerance"]
            )
        v = judge_distances(dist, judged, floor, rule, copy)
        v.reasons[:0] = reasons
        if self.scan is not None:
            if floor is not None and floor.copy_scan is not None:
                self.scan.copy, self.scan.copy_source = floor.copy_scan, COPY_FROM_FLOOR
            missed = self.scan.reason()
            v.scan = self.scan.status()
            if missed is not None and SCAN_JUDGED:
                v.reasons.append(missed)
        v.faithful = not v.reasons
        self.verdict = v
        return v

    @property
    def layout_score_difference(self) -> float | None:
        if self.layout_score_original is None or self.layout_score_recreated is None:
            return None
        return self.layout_score_recreated - self.layout_score_original

    def to_json(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["layout_score_difference"] = self.layout_score_difference
        out["verdict"] = self.verdict.to_json() if self.verdict else None
        out["scan"] = self.scan.to_json() if self.scan else None
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
            f"{sc(self.layout_score_recreated)}; path-order dynamic layout score original "
            f"{sc(self.dynamic_score_original)}, recreated {sc(self.dynamic_score_recreated)}",
            f"free space: distance {self.free_tv_distance:.3f} by blocks (total variation), "
            f"{self.free_extents_distance:.3f} by extents per bucket; earth mover's distance "
            f"{self.free_emd_buckets:.3f} buckets; free extents "
            f"{self.free_original['free_extent_count']} vs "
            f"{self.free_recreated['free_extent_count']}",
            "geometry: " + ("same" if self.geometry_matches else "DIFFERS: " + self._geo_diff()),
        ]
        if self.scan is not None:
            out.append(self.scan.line())
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


Hist = np.ndarray[Any, np.dtype[np.float64]]


def _free_hist(layout: Layout) -> tuple[Hist, Hist, dict[str, Any]]:
    """(free blocks per log2 bucket, free extents per bucket, the free-space summary)."""
    f = layout.facts
    fs = free_space(layout.free, f.block_size, f.blocks_total, f.first_data_block)
    blocks = np.zeros(MAX_BUCKET + 1, np.float64)
    counts = np.zeros(MAX_BUCKET + 1, np.float64)
    for k, count, nblocks in fs.buckets:
        blocks[k] = nblocks
        counts[k] = count
    return blocks, counts, fs.to_json()


def free_distances(a: Layout, b: Layout) -> tuple[float, float]:
    """(total variation distance, earth mover's distance in log2 buckets) between the
    block-weighted free-extent histograms of ``a`` and ``b``; 0 when both have no free space."""
    ha, _, _ = _free_hist(a)
    hb, _, _ = _free_hist(b)
    return _distances(ha, hb)


def _distances(ha: Hist, hb: Hist) -> tuple[float, float]:
    sa, sb = float(ha.sum()), float(hb.sum())
    if sa == 0 and sb == 0:
        return 0.0, 0.0
    if sa == 0 or sb == 0:
        return 1.0, float(MAX_BUCKET)
    pa, pb = ha / sa, hb / sb
    tv = 0.5 * float(np.abs(pa - pb).sum())
    emd = float(np.abs(np.cumsum(pa) - np.cumsum(pb)).sum())
    return tv, emd


def _count_distance(ca: Hist, cb: Hist) -> float:
    """How far two free-extent counts per bucket are: the extents that would have to appear
    or go, bucket by bucket, over all extents of both (Bray-Curtis: 0 = the same count in
    every bucket, 1 = no bucket in common). Unlike a distance between the two distributions it
    sees totals: 33 free extents against 427 spread alike are 0.86 apart, not 0."""
    total = float(ca.sum() + cb.sum())
    return float(np.abs(ca - cb).sum()) / total if total else 0.0


def dynamic_score(layout: Layout) -> float | None:
    """The modeled path-order dynamic layout score (``fsage.analyzer.dynamic``): a cold
    recursive read of the whole tree, directories and regular files, inodes and metadata
    included; None when nothing would be read."""
    score = path_reads(layout).score()["score"]
    return None if score is None else float(score)


def geometry(layout: Layout) -> dict[str, Any]:
    m = layout.facts.mkfs
    out = {k: m.get(k) for k in GEOMETRY_KEYS}
    if isinstance(out["features"], list):
        out["features"] = sorted(out["features"])
    return out


def fidelity(
    original: Layout,
    recreated: Layout,
    *,
    dynamic: tuple[float | None, float | None] | None = None,
    scan: bool = True,
) -> Fidelity:
    """Compare a recorded snapshot with its recreation (see the module doc). ``dynamic``: their
    path-order dynamic layout scores when already known; ``scan``: model their scans and the
    contiguous bound of the original's tree (a floor's plain copy joins them at
    ``Fidelity.judge``)."""
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
    ha, ca_, ja = _free_hist(original)
    hb, cb_, jb = _free_hist(recreated)
    tv, emd = _distances(ha, hb)
    reads = (path_reads(original), path_reads(recreated)) if scan or dynamic is None else None
    if dynamic is not None:
        dyn_a, dyn_b = dynamic
    else:
        assert reads is not None
        dyn_a, dyn_b = (_score_of(r) for r in reads)
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
        free_extents_distance=_count_distance(ca_, cb_),
        dynamic_score_original=dyn_a,
        dynamic_score_recreated=dyn_b,
        scan=scan_model(original, recreated, reads) if scan else None,
    )


def _score_of(reads: Requests) -> float | None:
    score = reads.score()["score"]
    return None if score is None else float(score)


def noise_between(layouts: list[Layout], note: str = "") -> NoiseFloor:
    """The noise floor from several runs of one op stream: the largest pairwise difference of
    layout score per size bucket and of dynamic layout score, and the largest pairwise
    free-space distances."""
    dyn = [dynamic_score(lay) for lay in layouts]
    pairs = [
        fidelity(layouts[i], layouts[j], dynamic=(dyn[i], dyn[j]), scan=False).distances()
        for i in range(len(layouts))
        for j in range(i + 1, len(layouts))
    ]
    return floor_from_distances(NoiseFloor(runs=len(layouts), note=note), pairs)


def floor_from_distances(floor: NoiseFloor, pairs: list[dict[str, float]]) -> NoiseFloor:
    """Fill ``floor`` from the distances of every pair of runs (``Fidelity.distances()``):
    the largest per size bucket and of dynamic layout score, every pair's free-space
    distances and their largest."""
    for d in pairs:
        for key, v in d.items():
            if key.startswith("bucket:"):
                k = int(key.split(":")[1])
                floor.by_bucket[k] = max(floor.by_bucket.get(k, 0.0), abs(v))
        floor.dynamic = max(floor.dynamic, abs(d.get(DYNAMIC, 0.0)))
        floor.free_tv_pairs.append(d[FREE_BLOCKS])
        floor.free_extents_pairs.append(d[FREE_EXTENTS])
    floor.free_tv = max(floor.free_tv_pairs, default=0.0)
    floor.free_extents = max(floor.free_extents_pairs, default=0.0)
    return floor


__all__ = [
    "DEFAULT_RULE",
    "DYNAMIC",
    "FREE_BLOCKS",
    "FREE_EXTENTS",
    "FREE_TOLERANCE",
    "GEOMETRY_KEYS",
    "MIN_BUCKET_FILES",
    "MIN_TOLERANCE",
    "RULES",
    "SCAN_JUDGED",
    "SOUND_RUNS",
    "Fidelity",
    "NoiseFloor",
    "Verdict",
    "bucket_tolerance",
    "dynamic_score",
    "fidelity",
    "floor_from_distances",
    "free_distances",
    "free_tolerance",
    "geometry",
    "judge_distances",
    "noise_between",
    "tolerance",
]
