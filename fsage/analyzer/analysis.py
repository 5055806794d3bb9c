"""One snapshot's analysis: everything ``fsage analyze`` prints and the report draws.

The aggregate layout scores cover regular files (seed 000 measured files); directories are
scored separately under ``directories_layout_score``. Every number is computed with numpy over
the Layout's columns; the only Python loops are over buckets, directories near the top of the
tree and disk-model presets.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from fsage.analyzer.diskmodel import PRESETS, DiskModel
from fsage.analyzer.dynamic import (
    Requests,
    depths_below,
    directory_scans,
    modeled_reads,
    modeled_score,
    preorder_sizes,
    ranges,
    root_index,
    score_distribution,
    subtree_scans,
    walk_order,
)
from fsage.analyzer.fit import fit_sizes
from fsage.analyzer.freespace import free_space, group_map
from fsage.analyzer.locality import (
    GAP_BUCKETS,
    blocks_per_group,
    gap_buckets,
    gap_distribution,
    groups_per_flex,
    last_block,
    locality,
    neighbour_gaps,
    parent_index,
)
from fsage.analyzer.scores import (
    FileScores,
    aggregate_score,
    e4defrag_counts,
    e4defrag_score,
    file_scores,
    filefrag_extents,
    xfs_frag_counts,
)
from fsage.analyzer.segments import segment_utilization
from fsage.layout import Layout
from fsage.text import size_range

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]

DAY_NS = 86_400 * 10**9
AGE_BUCKETS: list[tuple[float, float, str]] = [
    (0, 1, "< 1 day"),
    (1, 7, "1-7 days"),
    (7, 30, "1-4 weeks"),
    (30, 91, "1-3 months"),
    (91, 365, "3-12 months"),
    (365, 730, "1-2 years"),
    (730, float("inf"), "> 2 years"),
]
DEFAULT_MODELS = ("dsp3105", "hdd", "ssd")
PARTS = frozenset({"size", "free", "tools", "locality", "model", "dir", "age", "dist"})


def size_bucket(blocks: I64) -> I64:
    """Seed 000 Figure 5 buckets: k = ceil(log2 blocks) — 2 -> 1, 3-4 -> 2, 5-8 -> 3, ...;
    one-block files are bucket 0 (no score), empty files -1."""
    b = np.asarray(blocks, np.int64)
    out = np.full(b.shape, -1, np.int64)
    pos = b > 0
    _, exp = np.frexp((b[pos] - 1).astype(np.float64))
    out[pos] = np.where(b[pos] == 1, 0, exp)
    return out


def bucket_range(k: int) -> tuple[int, int]:
    if k <= 0:
        return (1, 1)
    return ((1 << (k - 1)) + 1, 1 << k)


def bucket_fields(k: int, block_size: int) -> dict[str, Any]:
    """A file-size bucket as every analysis row gives it: its blocks of data, the same in
    bytes (both bounds included), and its label in bytes (``fsage.text.size_range``)."""
    lo, hi = bucket_range(k)
    return {
        "min_blocks": lo,
        "max_blocks": hi,
        "min_bytes": (lo - 1) * block_size + 1,
        "max_bytes": hi * block_size,
        "label": size_range(lo, hi, block_size),
    }


def _grouped_scores(
    key: I64, scores: FileScores, sel: npt.NDArray[np.bool_], nkeys: int
) -> tuple[I64, I64, I64, I64]:
    """Per key: files, blocks, contiguous, denominator over the selected files."""
    k = key[sel]
    files = np.bincount(k, minlength=nkeys).astype(np.int64)
    blocks = np.rint(np.bincount(k, weights=scores.blocks[sel], minlength=nkeys)).astype(np.int64)
    cont = np.rint(np.bincount(k, weights=scores.contiguous[sel], minlength=nkeys)).astype(np.int64)
    den = np.rint(np.bincount(k, weights=scores.denominator[sel], minlength=nkeys)).astype(np.int64)
    return files, blocks, cont, den


def _ratio(a: int, b: int) -> float | None:
    return a / b if b else None


def _csr_order(off: I64, order: I64) -> I64:
    """Indices into a CSR child array that visit rows in ``order``."""
    return ranges(off[:-1][order], off[1:][order])


class SnapshotAnalyzer:
    """Computes the parts of a snapshot analysis on demand, sharing intermediate arrays."""

    def __init__(
        self,
        layout: Layout,
        *,
        snapshot_id: int | None = None,
        taken_at: dt.datetime | None = None,
    ) -> None:
        self.layout = layout
        self.snapshot_id = snapshot_id
        self.taken_at = taken_at
        self.bs = layout.facts.block_size
        self.scores = file_scores(layout.files)
        self.regular = layout.files.is_regular()
        self.dirs = layout.files.is_dir()
        self._paths_order: I64 | None = None
        self._preorder: tuple[I64, I64] | None = None
        self._parent: I64 | None = None
        self._path_reads: Requests | None = None
        self._path_score: dict[str, Any] | None = None
        self._gaps: tuple[I64, I64] | None = None
        self._dir_scans: tuple[I64, I64, I64, I64] | None = None

    # -- parts ---------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        s, reg = self.scores, self.regular
        facts = self.layout.facts
        multi = reg & (s.blocks >= 2)
        return {
            "id": self.snapshot_id,
            "taken_at": self.taken_at.isoformat() if self.taken_at else None,
            "kind": facts.kind,
            "block_size": self.bs,
            "blocks_total": facts.blocks_total,
            # one value for free blocks (the free map's; see Layout.blocks_free), the
            # reader's own counter (superblock, statfs) beside it
            "blocks_free": self.layout.blocks_free,
            "blocks_free_reported": facts.blocks_free,
            "inodes": len(self.layout.files),
            "files": int(reg.sum()),
            "directories": int(self.dirs.sum()),
            "data_blocks": int(s.blocks[reg].sum()),
            "layout_score": aggregate_score(s.contiguous[reg], s.denominator[reg]),
            "directories_layout_score": aggregate_score(
                s.contiguous[self.dirs], s.denominator[self.dirs]
            ),
            "scored_files": int(multi.sum()),
            "fragmented_files": int((multi & (s.contiguous < s.denominator)).sum()),
            "mean_file_score": (
                float(np.mean(s.contiguous[multi] / s.denominator[multi])) if multi.any() else None
            ),
            "fragments_per_file": (
                float(s.fragments[reg & (s.blocks > 0)].mean())
                if (reg & (s.blocks > 0)).any()
                else None
            ),
        }

    def by_size(self) -> list[dict[str, Any]]:
        s, reg = self.scores, self.regular
        k = size_bucket(s.blocks)
        sel = reg & (k >= 1)
        if not sel.any():
            return []
        nk = int(k[sel].max()) + 1
        files, blocks, cont, den = _grouped_scores(k, s, sel, nk)
        out = []
        for i in range(1, nk):
            if files[i] == 0:
                continue
            out.append(
                {
                    **bucket_fields(i, self.bs),
                    "files": int(files[i]),
                    "blocks": int(blocks[i]),
                    "layout_score": _ratio(int(cont[i]), int(den[i])),
                }
            )
        return out

    def fragments_histogram(self) -> list[dict[str, Any]]:
        s, reg = self.scores, self.regular
        sel = reg & (s.blocks > 0)
        k = size_bucket(s.fragments[sel])
        counts = np.bincount(k, minlength=1) if k.size else np.zeros(0, np.int64)
        return [
            {
                "min_fragments": bucket_range(i)[0],
                "max_fragments": bucket_range(i)[1],
                "files": int(c),
            }
            for i, c in enumerate(counts.tolist())
            if c
        ]

    def free(self) -> dict[str, Any]:
        f = self.layout.facts
        fs = free_space(self.layout.free, f.block_size, f.blocks_total, f.first_data_block)
        out = fs.to_json()
        out["free_space_known"] = f.free_space_known
        out["map"] = group_map(self.layout.free, f.groups, f.blocks_total)
        return out

    def tools(self) -> dict[str, Any]:
        files = self.layout.files
        s, reg = self.scores, self.regular
        ff = filefrag_extents(files)
        withblk = reg & (s.blocks > 0)
        e4sel = withblk & (files.size > 0)
        bpg = blocks_per_group(self.layout) or 0
        now, best, blk = e4defrag_counts(_subset(s, e4sel), bpg, groups_per_flex(self.layout))
        kinds = reg | self.dirs | ((files.mode & 0o170000) == 0o120000)
        actual, ideal = xfs_frag_counts(files, kinds)
        return {
            "filefrag_extents_total": int(ff[withblk].sum()),
            "filefrag_extents_mean": float(ff[withblk].mean()) if withblk.any() else None,
            "filefrag_extents_max": int(ff[withblk].max()) if withblk.any() else None,
            "e4defrag_extents_now": now,
            "e4defrag_extents_best": best,
            "e4defrag_score": e4defrag_score(now, best, blk),
            "xfs_frag_actual": actual,
            "xfs_frag_ideal": ideal,
            "xfs_frag_factor": (actual - ideal) * 100.0 / actual if actual else 0.0,
        }

    def locality(self, meta: bool = True) -> dict[str, Any]:
        """``meta``: False skips the metadata-to-data distances (``locality``), the one part
        that reads the files' extents once the scores are known."""
        out = locality(self.layout, self.scores.first_block, self.regular, self.parent(), meta=meta)
        # the directories' scans before the gaps: their temporaries and the gaps not held at once
        _, _, disc, blocks = self.directory_scans()
        gap, _ = self.gaps()
        out["neighbour_distance"] = gap_distribution(gap, self.bs, blocks_per_group(self.layout))
        out["directory_scan"] = score_distribution(disc, blocks)
        out["dynamic_layout_score_path"] = self.path_score()["score"]
        return out

    def gaps(self) -> tuple[I64, I64]:
        """Between consecutive regular files of a directory in path order: the gap in blocks
        and the directory (``neighbour_gaps``)."""
        if self._gaps is None:
            runs = self.scores.runs
            last = last_block(runs.off, runs.start, runs.length)
            self._gaps = neighbour_gaps(
                self.scores.first_block, last, self.preorder(), self.parent(), self.regular
            )
        return self._gaps

    def directory_scans(self) -> tuple[I64, I64, I64, I64]:
        """Every directory's own modeled scan (``directory_scans``)."""
        if self._dir_scans is None:
            self._dir_scans = directory_scans(
                self.layout, self.scores, self.preorder(), self.parent(), self.regular
            )
        return self._dir_scans

    def path_reads(self) -> Requests:
        """The modeled requests of a cold path-order scan of every directory and file."""
        if self._path_reads is None:
            walk = walk_order(self.layout, self.regular | self.dirs, self.preorder())
            self._path_reads = modeled_reads(self.layout, self.scores, walk)
        return self._path_reads

    def path_score(self) -> dict[str, Any]:
        """``path_reads().score()``, without holding every request."""
        if self._path_score is None:
            if self._path_reads is not None:
                self._path_score = self._path_reads.score()
            else:
                walk = walk_order(self.layout, self.regular | self.dirs, self.preorder())
                self._path_score = modeled_score(self.layout, self.scores, walk)
        return self._path_score

    def parent(self) -> I64:
        """Every file's parent directory (``parent_index``)."""
        if self._parent is None:
            self._parent = parent_index(self.layout)
        return self._parent

    def preorder(self) -> I64:
        """Every file's place in a depth-first walk by name (-1: unreachable)."""
        return self._preorder_sizes()[0]

    def _preorder_sizes(self) -> tuple[I64, I64]:
        if self._preorder is None:
            self._preorder = preorder_sizes(self.layout)
        return self._preorder

    def path_order(self) -> I64:
        """Regular files with blocks, in the order of a depth-first walk by name."""
        if self._paths_order is None:
            sel = self.regular & (self.scores.blocks > 0)
            self._paths_order = walk_order(self.layout, sel, self.preorder())
        return self._paths_order

    def inode_order(self) -> I64:
        return np.flatnonzero(self.regular & (self.scores.blocks > 0)).astype(np.int64)

    def read_time(self, order: I64, model: DiskModel) -> tuple[float, int, int]:
        """(ms, bytes, requests) to read the files at ``order`` one after the other."""
        runs = self.scores.runs
        idx = _csr_order(runs.off, order)
        start = runs.start[idx] * self.bs
        length = runs.length[idx] * self.bs
        ms = float(model.service_ms(start, length).sum())
        size = self.layout.files.size[order].astype(np.int64)
        nbytes = int(np.minimum(size, self.scores.blocks[order] * self.bs).sum())
        return ms, nbytes, int(idx.size)

    def dynamic_score(self, order: I64) -> float | None:
        """Conway et al.: 1 - requests not starting where the previous ended / blocks read."""
        runs = self.scores.runs
        idx = _csr_order(runs.off, order)
        if idx.size == 0:
            return None
        start, length = runs.start[idx], runs.length[idx]
        jumps = 1 + int(np.count_nonzero(start[1:] != start[:-1] + length[:-1]))
        return 1.0 - jumps / int(length.sum())

    def model(self, models: Sequence[str] = DEFAULT_MODELS, paths: bool = True) -> dict[str, Any]:
        s = self.scores
        k = size_bucket(s.blocks)
        orders = {"inode": self.inode_order()}
        if paths:
            orders["path"] = self.path_order()
        out: dict[str, Any] = {
            "models": {},
            "dynamic_layout_score": {},
            "dynamic_reads": {},
            "dynamic_layout_score_data_only": {},
        }
        objects = self.regular | self.dirs
        walks = {"inode": modeled_score(self.layout, s, np.flatnonzero(objects).astype(np.int64))}
        if paths:
            walks["path"] = self.path_score()
        for name, reads in walks.items():
            out["dynamic_layout_score"][name] = reads["score"]
            out["dynamic_reads"][name] = reads
        for name, order in orders.items():
            out["dynamic_layout_score_data_only"][name] = self.dynamic_score(order)
        buckets = sorted(set(k[orders["inode"]].tolist()))
        # every run of every file, grouped by bucket: only a disk model reads them
        split = {oname: self._bucket_runs(order, k) for oname, order in orders.items() if models}
        for mname in models:
            m = PRESETS[mname]
            per_order = {oname: self._bucket_ms(sp, m) for oname, sp in split.items()}
            rows = []
            for b in buckets:
                row: dict[str, Any] = bucket_fields(b, self.bs)
                for oname in orders:
                    files, nbytes, ms = per_order[oname].get(b, (0, 0, 0.0))
                    row[f"{oname}_files"] = files
                    row[f"{oname}_ms"] = ms
                    row[f"{oname}_mb_per_s"] = (nbytes / 1e6) / (ms / 1000.0) if ms > 0 else None
                rows.append(row)
            out["models"][mname] = {"description": m.description, "by_size": rows}
        return out

    def _bucket_runs(self, order: I64, k: I64) -> dict[str, Any]:
        """The runs of the files at ``order`` grouped by size bucket, each bucket's files in
        ``order``: what :meth:`read_time` reads for one bucket, for all buckets at once."""
        kb = k[order]
        by_bucket = order[np.argsort(kb.astype(np.int16), kind="stable")]  # a radix sort
        kbs = k[by_bucket]
        runs = self.scores.runs
        counts = runs.off[by_bucket + 1] - runs.off[by_bucket]
        idx = _csr_order(runs.off, by_bucket)
        run_bucket = np.repeat(kbs, counts)
        size = self.layout.files.size[by_bucket].astype(np.int64)
        nbytes = np.minimum(size, self.scores.blocks[by_bucket] * self.bs)
        return {
            "start": runs.start[idx] * self.bs,
            "length": runs.length[idx] * self.bs,
            "run_bucket": run_bucket,
            "file_bucket": kbs,
            "nbytes": nbytes,
        }

    @staticmethod
    def _bucket_ms(sp: dict[str, Any], m: DiskModel) -> dict[int, tuple[int, int, float]]:
        """Per bucket: files, bytes and modeled ms, each bucket read on its own (its first
        request pays an average access)."""
        ms = m.service_ms(sp["start"], sp["length"])
        rb = sp["run_bucket"]
        if rb.size:
            head = np.ones(rb.size, bool)
            head[1:] = rb[1:] != rb[:-1]
            ms[head] = m.average_access_ms + sp["length"][head] / m.bandwidth * 1000.0
        # files and runs come grouped by bucket (``_bucket_runs``): each bucket is a slice,
        # summed as the same values in the same order as a mask would give them
        fb = sp["file_bucket"]
        buckets = fb[np.flatnonzero(np.diff(fb, prepend=fb[:1] - 1))] if fb.size else fb
        f_lo, f_hi = np.searchsorted(fb, buckets), np.searchsorted(fb, buckets, side="right")
        r_lo, r_hi = np.searchsorted(rb, buckets), np.searchsorted(rb, buckets, side="right")
        nbytes = sp["nbytes"]
        out: dict[int, tuple[int, int, float]] = {}
        for k, b in enumerate(buckets.tolist()):
            out[int(b)] = (
                int(f_hi[k] - f_lo[k]),
                int(nbytes[f_lo[k] : f_hi[k]].sum()),
                float(ms[r_lo[k] : r_hi[k]].sum()),
            )
        return out

    def by_dir(self, depth: int = 2) -> list[dict[str, Any]]:
        """Aggregate score of every directory subtree down to ``depth`` below the root, with
        its locality: the modeled scan of the subtree (``grep -r``) and of the directory's own
        files, and the gaps between neighbouring files of the subtree's directories."""
        layout, s = self.layout, self.scores
        n = len(layout.files)
        parent = self.parent()
        dep = self._depths(parent)
        reg = self.regular
        contrib_c = np.where(reg, s.contiguous, 0).astype(np.int64)
        contrib_d = np.where(reg, s.denominator, 0).astype(np.int64)
        contrib_b = np.where(reg, s.blocks, 0).astype(np.int64)
        contrib_f = reg.astype(np.int64)
        gap, gap_dir = self.gaps()
        group_blocks = blocks_per_group(layout)
        gk = gap_buckets(gap, self.bs, group_blocks)
        pairs = [
            np.bincount(gap_dir[gk == k], minlength=n)[:n].astype(np.float64)
            for k in range(len(GAP_BUCKETS))
        ]
        acc = np.stack([contrib_f, contrib_b, contrib_c, contrib_d, *pairs]).astype(np.float64)
        # push every file's numbers up to its parent, deepest level first (files grouped by
        # depth once; each level one bincount per number)
        maxdep = int(dep.max()) if n else 0
        by_depth = np.argsort(dep, kind="stable")
        bounds = np.searchsorted(dep[by_depth], np.arange(maxdep + 2))
        for d in range(maxdep, 0, -1):
            at = by_depth[bounds[d] : bounds[d + 1]]
            at = at[parent[at] >= 0]
            if at.size == 0:
                continue
            up, where = np.unique(parent[at], return_inverse=True)
            for number in acc:
                number[up] += np.bincount(where, weights=number[at], minlength=up.size)
        names = self._dir_names(parent, dep, depth)
        listed = sorted(names.items(), key=lambda kv: kv[1])
        roots = np.array([i for i, _ in listed], np.int64)
        pos, size = self._preorder_sizes()
        walk = walk_order(layout, self.regular | self.dirs, pos)
        sub_disc, sub_blocks = subtree_scans(layout, s, roots, pos, size, walk)
        dirs, _, own_disc, own_blocks = self.directory_scans()
        at = np.searchsorted(dirs, roots)
        has_own = np.zeros(roots.size, bool)
        if dirs.size:
            has_own = (at < dirs.size) & (dirs[np.minimum(at, dirs.size - 1)] == roots)
        out = []
        for k, (i, path) in enumerate(listed):
            f, b, c, dd = (round(float(v)) for v in acc[:4, i])
            counts = [round(float(v)) for v in acc[4:, i]]
            npairs = sum(counts)
            own = None
            if has_own[k] and own_blocks[at[k]] > 0:
                own = 1.0 - int(own_disc[at[k]]) / int(own_blocks[at[k]])
            row: dict[str, Any] = {
                "path": path,
                "depth": int(dep[i]),
                "files": f,
                "blocks": b,
                "layout_score": _ratio(c, dd),
                "scan_score": (
                    1.0 - int(sub_disc[k]) / int(sub_blocks[k]) if sub_blocks[k] else None
                ),
                "own_scan_score": own,
                "pairs": npairs,
            }
            for name, cnt in zip(GAP_BUCKETS, counts, strict=True):
                known = name != "le_group" or group_blocks is not None
                row[f"{name}_share"] = cnt / npairs if npairs and known else None
            out.append(row)
        return out

    @staticmethod
    def _depths(parent: I64) -> I64:
        """Depth below the root (-1 for files not connected to a root)."""
        return depths_below(parent, np.flatnonzero(parent < 0))

    def _dir_names(self, parent: I64, dep: I64, depth: int) -> dict[int, str]:
        layout = self.layout
        ino = layout.files.ino.astype(np.int64)
        n = len(layout.files)
        root = root_index(layout)
        names: dict[int, str] = {}
        if root >= 0:
            names[root] = "/"
        want = set(np.flatnonzero(self.dirs & (dep >= 1) & (dep <= depth)).tolist())
        if not want:
            return names
        links = layout.links
        li = np.searchsorted(ino, links.ino.astype(np.int64))
        li = np.minimum(li, max(n - 1, 0))
        first: dict[int, str] = {}
        for j in np.flatnonzero(np.isin(li, list(want))).tolist():
            i = int(li[j])
            if i in first or ino[i] != int(links.ino[j]):
                continue
            first[i] = links.name(j).decode("utf-8", "surrogateescape")
        for i in sorted(want, key=lambda x: int(dep[x])):
            p = int(parent[i])
            base = names.get(p)
            if base is None or i not in first:
                continue
            names[i] = ("" if base == "/" else base) + "/" + first[i]
        return names

    def reference_time_ns(self) -> int:
        if self.taken_at is not None:
            return int(self.taken_at.timestamp()) * 10**9
        t = self.layout.facts.times
        for key in ("write", "wtime", "mount", "mtime"):
            if t.get(key):
                return int(t[key]) * 10**9
        m = self.layout.files.mtime
        return int(m.max()) if m.size else 0

    def by_age(self) -> list[dict[str, Any]]:
        s, reg = self.scores, self.regular
        age_days = (self.reference_time_ns() - self.layout.files.mtime.astype(np.int64)) / DAY_NS
        edges = np.array([b[0] for b in AGE_BUCKETS[1:]], np.float64)
        key = np.searchsorted(edges, np.maximum(age_days, 0), side="right").astype(np.int64)
        files, blocks, cont, den = _grouped_scores(key, s, reg, len(AGE_BUCKETS))
        return [
            {
                "label": label,
                "min_days": lo,
                "max_days": None if hi == float("inf") else hi,
                "files": int(files[i]),
                "blocks": int(blocks[i]),
                "layout_score": _ratio(int(cont[i]), int(den[i])),
            }
            for i, (lo, hi, label) in enumerate(AGE_BUCKETS)
            if files[i]
        ]

    def size_distribution(self) -> dict[str, Any]:
        sizes = self.layout.files.size[self.regular].astype(np.int64)
        fit = fit_sizes(sizes)
        pos = sizes[sizes > 0]
        k = np.floor(np.log2(pos)).astype(np.int64) if pos.size else np.zeros(0, np.int64)
        counts = np.bincount(k) if k.size else np.zeros(0, np.int64)
        return {
            "empty_files": int((sizes == 0).sum()),
            "histogram": [
                {"min_bytes": 1 << i, "max_bytes": (1 << (i + 1)) - 1, "files": int(c)}
                for i, c in enumerate(counts.tolist())
                if c
            ],
            "fit": fit.to_json() if fit else None,
        }

    def run(
        self,
        parts: Iterable[str] = PARTS,
        models: Sequence[str] = DEFAULT_MODELS,
        dir_depth: int = 2,
        path_order: bool = True,
    ) -> dict[str, Any]:
        want = set(parts)
        out = self.summary()
        if "size" in want:
            out["by_size"] = self.by_size()
            out["fragments_per_file"] = self.fragments_histogram()
        if "free" in want:
            fr = self.free()
            out["free_extents"] = fr.pop("free_extents")
            out["largest_free_extent"] = fr["largest_free_extent"]
            out["free_space"] = fr
        if "tools" in want:
            out["tools"] = self.tools()
        if "locality" in want:
            out["locality"] = self.locality()
        if "model" in want:
            out["disk_model"] = self.model(models, paths=path_order)
        if "dir" in want:
            out["by_dir"] = self.by_dir(dir_depth)
        if "age" in want:
            out["by_age"] = self.by_age()
        if "dist" in want:
            out["size_distribution"] = self.size_distribution()
        segments = segment_utilization(self.layout.facts.to_json())
        if segments is not None:
            out["segments"] = segments
        return out


def _subset(s: FileScores, sel: npt.NDArray[np.bool_]) -> FileScores:
    return FileScores(
        s.blocks[sel],
        s.contiguous[sel],
        s.extents[sel],
        s.fragments[sel],
        s.first_block[sel],
        s.runs,
    )


def analyze_layout(
    layout: Layout,
    *,
    snapshot_id: int | None = None,
    taken_at: dt.datetime | None = None,
    parts: Iterable[str] = PARTS,
    models: Sequence[str] = DEFAULT_MODELS,
    dir_depth: int = 2,
    path_order: bool = True,
) -> dict[str, Any]:
    """The JSON-ready analysis of one snapshot (see ``fsage analyze --format json``)."""
    return SnapshotAnalyzer(layout, snapshot_id=snapshot_id, taken_at=taken_at).run(
        parts, models, dir_depth, path_order
    )
