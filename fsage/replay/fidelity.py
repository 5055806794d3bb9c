"""How faithful a recreation is: the recorded snapshot against the recreated file system.

* files and bytes matched by path (a regular file matches when the recreation has a regular
  file at the same path with the same size), directories matched by path;
* the layout score of each (block-weighted aggregate, seed 000 §4.1), overall and per size
  bucket (seed 000 Figure 5 buckets);
* the distance between the free-space histograms (e2freefrag's log2 buckets, weighted by
  free blocks): total variation distance (half the L1 distance of the two distributions, 0 =
  the same, 1 = disjoint) and earth mover's distance in buckets (how many doublings of extent
  size the free space would have to move, on average, to match);
* the geometry: the mkfs parameters of both, and whether they agree.
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

    @property
    def layout_score_difference(self) -> float | None:
        if self.layout_score_original is None or self.layout_score_recreated is None:
            return None
        return self.layout_score_recreated - self.layout_score_original

    def to_json(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["layout_score_difference"] = self.layout_score_difference
        return out

    def lines(self) -> list[str]:
        """A short human summary."""

        def sc(v: float | None) -> str:
            return "-" if v is None else f"{v:.3f}"

        out = [
            f"files matched {self.files_matched}/{self.files_original} "
            f"(recreation has {self.files_recreated}); bytes matched "
            f"{self.bytes_matched:,}/{self.bytes_original:,}; directories matched "
            f"{self.dirs_matched}/{self.dirs_original}",
            f"layout score original {sc(self.layout_score_original)}, recreated "
            f"{sc(self.layout_score_recreated)}",
            f"free space: total variation distance {self.free_tv_distance:.3f}, earth mover's "
            f"distance {self.free_emd_buckets:.3f} buckets; free extents "
            f"{self.free_original['free_extent_count']} vs "
            f"{self.free_recreated['free_extent_count']}",
            "geometry: " + ("same" if self.geometry_matches else "DIFFERS: " + self._geo_diff()),
        ]
        return out

    def _geo_diff(self) -> str:
        return ", ".join(f"{k} {a} vs {b}" for k, (a, b) in self.geometry.items() if a != b)


def _path_sizes(layout: Layout) -> tuple[dict[str, int], set[str]]:
    """Regular files (path -> size) and directories (paths), relative, mkfs's own left out."""
    files = layout.files
    mode = files.mode.tolist()
    size = files.size.tolist()
    row = {int(i): r for r, i in enumerate(files.ino.tolist())}
    regular: dict[str, int] = {}
    dirs: set[str] = set()
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
                regular[rel] = int(size[r])
            elif fmt == stat.S_IFDIR:
                dirs.add(rel)
    return regular, dirs


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
    fa, da = _path_sizes(original)
    fb, db = _path_sizes(recreated)
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


__all__ = ["GEOMETRY_KEYS", "Fidelity", "fidelity", "free_distances", "geometry"]
