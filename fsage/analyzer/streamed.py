"""The figures ``fsage export`` takes of a snapshot (``SnapshotAnalyzer``'s summary, sizes,
free space, dynamic scores and locality), computed from the snapshot a part at a time.

Per part (files of an inode range, ``fsage.db.parts``): the files are scored and their numbers
added to per-bucket totals; what needs every file in another order is written to disk: the
per-file numbers of a mean and a median (``spill.Values``), and one record per named file for
the path-order walk (``pathwalk``), which puts each directory's entries in name order a bucket
at a time. What stays in memory: per-bucket totals and a part (the caller tells which files
name entries: ``names_entries``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from fsage.analyzer import spill
from fsage.analyzer.analysis import bucket_fields, size_bucket
from fsage.analyzer.dynamic import score_of_totals
from fsage.analyzer.freespace import MAX_BUCKET, FreeSpace, _log2_floor, free_space
from fsage.analyzer.locality import (
    GAP_BUCKETS,
    blocks_per_group,
    fact,
    group_of_block,
    inodes_per_group,
    last_block,
)
from fsage.analyzer.objects import OWN, Scan, geometry, own_requests
from fsage.analyzer.pathwalk import REC, PathWalk
from fsage.analyzer.scores import file_scores
from fsage.analyzer.spill import Values
from fsage.layout import FreeExtents, Layout

I64 = npt.NDArray[np.int64]

MAX_BUCKETS = 65


Windows = Callable[[], Iterable[tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64]]]]


def free_figures(layout: Layout, windows: Windows | None = None) -> tuple[dict[str, Any], int]:
    """The free-space figures of ``SnapshotAnalyzer.free`` the export reads, and the free
    blocks of its summary: a window of extents at a time where they come sorted and apart
    (as readers give them, nothing to merge), else by ``free_space``. ``windows()``: the
    free map's (start, length) pairs a window at a time (default: ``layout.free``'s)."""
    f = layout.facts
    if windows is None:
        free = layout.free

        def whole() -> Iterable[tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64]]]:
            for lo in range(0, len(free.start), spill.WINDOW):
                yield free.start[lo : lo + spill.WINDOW], free.length[lo : lo + spill.WINDOW]

        windows = whole
    fs, blocks = _free_by_window(layout, windows)
    if fs is None:  # gathered whole to be merged
        got = list(windows())
        start = np.concatenate([w[0] for w in got]) if got else np.zeros(0, np.uint64)
        length = np.concatenate([w[1] for w in got]) if got else np.zeros(0, np.uint64)
        fs = free_space(FreeExtents(start, length), f.block_size, f.blocks_total,
                        f.first_data_block)  # fmt: skip
    return fs.to_json(), blocks if f.free_space_known else int(f.blocks_free)


def _free_by_window(layout: Layout, windows: Windows) -> tuple[FreeSpace | None, int]:
    """The figures (None: extents out of order or touching) and the free map's blocks."""
    f = layout.facts
    chunk_blocks = max((1 << 20) // f.block_size, 1)
    counts = np.zeros(MAX_BUCKET + 1, np.int64)
    blocks = np.zeros(MAX_BUCKET + 1, np.int64)
    total = extents = chunks = 0
    largest, smallest = 0, None
    prev_end = -1
    every = 0
    merged = False
    for w_start, w_length in windows():
        every += int(w_length.sum())
        if merged:
            continue
        start = w_start.astype(np.int64)
        length = w_length.astype(np.int64)
        keep = length > 0
        start, length = start[keep], length[keep]
        if start.size == 0:
            continue
        end = start + length
        if int(start[0]) <= prev_end or bool(np.any(start[1:] <= end[:-1])):
            merged = True  # out of order or touching: merged whole
            continue
        prev_end = int(end[-1])
        k = np.minimum(_log2_floor(length), MAX_BUCKET)
        counts += np.bincount(k, minlength=MAX_BUCKET + 1)
        blocks += np.bincount(k, weights=length, minlength=MAX_BUCKET + 1).astype(np.int64)
        first = -(-start // chunk_blocks)
        if f.first_data_block > 0:
            first = np.maximum(first, 1)
        chunks += int(np.maximum(end // chunk_blocks - first, 0).sum())
        total += int(length.sum())
        extents += int(length.size)
        largest = max(largest, int(length.max()))
        smallest = int(length.min()) if smallest is None else min(smallest, int(length.min()))
    if merged:
        return None, every
    return FreeSpace(
        block_size=f.block_size,
        blocks_total=f.blocks_total,
        blocks_free=total,
        extents=extents,
        largest=largest,
        smallest=smallest or 0,
        chunk_blocks=chunk_blocks,
        chunks_total=(f.blocks_total + chunk_blocks) // chunk_blocks,
        chunks_free=chunks,
        buckets=[(int(i), int(counts[i]), int(blocks[i])) for i in np.flatnonzero(counts)],
    ), every


class StreamedFigures:
    """Fed the parts of one snapshot in inode order (``add``), then ``finish``."""

    def __init__(self, head: Layout, all_ino: Iterable[npt.NDArray[np.uint64]], root: int,
                 cuts: I64, names_entries: Callable[[I64], npt.NDArray[np.bool_]],
                 tmp: Path, free: tuple[dict[str, Any], int] | None = None) -> None:  # fmt: skip
        """``cuts``: where the walk's buckets start among the inodes that name entries
        (``pathwalk.bucket_starts``); ``names_entries(ino)``: which of ``ino`` name entries,
        asked a part at a time; ``free``: ``free_figures(head)``, when the caller has let go
        of the free map."""
        self.head = head
        self.free = free if free is not None else free_figures(head)
        self.bs = head.facts.block_size
        self.tabs = geometry(head, all_ino)
        self.root = root  # the walk's root inode (-1: none)
        self.names_entries: Callable[[I64], npt.NDArray[np.bool_]] | None = names_entries
        n = MAX_BUCKETS
        self.by_size = np.zeros((4, n), np.int64)  # files, blocks, contiguous, denominator
        self.count = dict.fromkeys(
            ("inodes", "files", "dirs", "data_blocks", "reg_cont", "reg_den", "dir_cont",
             "dir_den", "scored", "fragmented", "frag_files", "fragments", "same_group",
             "group_files"), 0,
        )  # fmt: skip
        self.ratios = Values(tmp / "ratios", np.float64)
        self.i2d = Values(tmp / "i2d", np.int64)
        self.inode_scan = Scan.new(self.tabs)
        self.inode_disc = self.inode_blocks = 0
        group_blocks = blocks_per_group(head)
        self.walk = PathWalk(tmp, self.tabs, root, self.bs, group_blocks, cuts)
        self.ipg = inodes_per_group(head)
        tables = [g.get("inode_table") for g in head.facts.groups]
        isize = fact(head, "inode_size", "s_inode_size")
        self.itab = (
            np.array(tables, np.int64)
            if self.ipg and tables and all(t is not None for t in tables) and isize
            else None
        )
        self.isize = int(isize) if isize else 0

    def add(self, part: Layout, parent: I64, name_row: I64, name_off: Any, names: bytes) -> None:
        """One part: its files (``part.files``), each one's parent by its first name (-1:
        none; ``parent_index``) and that name (row ``name_row`` of ``name_off``/``names``)."""
        files = part.files
        c = self.count
        s = file_scores(files)
        reg, dirs = files.is_regular(), files.is_dir()
        c["inodes"] += len(files)
        c["files"] += int(reg.sum())
        c["dirs"] += int(dirs.sum())
        c["data_blocks"] += int(s.blocks[reg].sum())
        den = s.denominator
        c["reg_cont"] += int(s.contiguous[reg].sum())
        c["reg_den"] += int(den[reg].sum())
        c["dir_cont"] += int(s.contiguous[dirs].sum())
        c["dir_den"] += int(den[dirs].sum())
        multi = reg & (s.blocks >= 2)
        c["scored"] += int(multi.sum())
        c["fragmented"] += int((multi & (s.contiguous < den)).sum())
        self.ratios.add(s.contiguous[multi] / den[multi])
        withblk = reg & (s.blocks > 0)
        c["frag_files"] += int(withblk.sum())
        c["fragments"] += int(s.fragments[withblk].sum())
        k = size_bucket(s.blocks)
        sel = reg & (k >= 1)
        for row, values in enumerate((None, s.blocks, s.contiguous, den)):
            w = None if values is None else values[sel].astype(np.float64)
            self.by_size[row] += np.rint(
                np.bincount(k[sel], weights=w, minlength=MAX_BUCKETS)
            ).astype(np.int64)
        ino = files.ino.astype(np.int64)
        first = s.first_block
        has = reg & (first >= 0)
        if self.ipg:
            gsel = has & (parent >= 0)
            data_group = group_of_block(self.head, first[gsel])
            if data_group is not None:
                dir_group = (parent[gsel] - 1) // self.ipg
                c["same_group"] += int(np.count_nonzero(data_group == dir_group))
                c["group_files"] += int(gsel.sum())
            if self.itab is not None:
                g = (ino[has] - 1) // self.ipg
                okg = g < self.itab.size
                idx = (ino[has] - 1) % self.ipg
                iblock = self.itab[np.minimum(g, self.itab.size - 1)] + idx * self.isize // self.bs
                self.i2d.add(np.abs(first[has] - iblock)[okg])
        # every object's own requests: the inode-order read now, the path-order ones later
        own = own_requests(part, s, np.arange(len(files), dtype=np.int64))
        objs = np.flatnonzero(reg | dirs)
        disc, blocks, _ = self.inode_scan.add(ino[objs], {k: v[objs] for k, v in own.items()})
        self.inode_disc += int(disc.sum())
        self.inode_blocks += int(blocks.sum())
        runs = s.runs
        last = last_block(runs.off, runs.start, runs.length)
        rec = np.zeros(len(files), REC)
        rec["ino"] = ino
        rec["parent"] = np.where(ino == self.root, -1, parent)
        rec["kind"] = np.where(reg, 1, np.where(dirs, 2, 0))
        rec["first"] = first
        rec["last"] = last
        for key, _ in OWN:
            rec[key] = own[key]
        assert self.names_entries is not None, "a part after parts_done"
        self.walk.add(rec, name_row, name_off, names, self.names_entries(ino))

    def parts_done(self) -> None:
        """No more parts: what only they ask is let go before the walk."""
        self.names_entries = None

    def finish(
        self,
        trim: Callable[[], None] | None = None,
        progress: Callable[[float], None] | None = None,
    ) -> dict[str, Any]:
        """The figures (``trim``: gives freed memory back between the walk's steps;
        ``progress(share)``: how much of the walk is done)."""
        c = self.count
        head, bs = self.head, self.bs
        f = head.facts
        summ = {
            "block_size": bs,
            "blocks_total": f.blocks_total,
            "blocks_free": self.free[1],
            "files": c["files"],
            "directories": c["dirs"],
            "data_blocks": c["data_blocks"],
            "layout_score": c["reg_cont"] / c["reg_den"] if c["reg_den"] else None,
            "directories_layout_score": c["dir_cont"] / c["dir_den"] if c["dir_den"] else None,
            "scored_files": c["scored"],
            "fragmented_files": c["fragmented"],
            "mean_file_score": (
                float(self.ratios.pairwise_sum() / self.ratios.n) if self.ratios.n else None
            ),
            "fragments_per_file": (
                float(np.float64(c["fragments"]) / c["frag_files"]) if c["frag_files"] else None
            ),
        }
        files, blocks, cont, den = self.by_size
        by_size = []
        for i in range(1, MAX_BUCKETS):
            if files[i] == 0:
                continue
            by_size.append(
                {
                    **bucket_fields(i, bs),
                    "files": int(files[i]),
                    "blocks": int(blocks[i]),
                    "layout_score": int(cont[i]) / int(den[i]) if den[i] else None,
                }
            )
        free = self.free[0]
        walk = self.walk.finish(trim, progress)
        i2d = None
        if self.itab is not None and self.i2d.n:
            i2d = {"median": self.i2d.median()}
        locality = {
            "same_group_share": (
                float(np.float64(c["same_group"]) / c["group_files"]) if c["group_files"] else None
            ),
            "inode_to_data_blocks": i2d,
            "directory_scan": walk["directory_scan"],
            "neighbour_distance": walk["neighbour_distance"],
        }
        dyn = {
            "inode": score_of_totals(self.inode_disc, self.inode_blocks, self.inode_scan.requests)[
                "score"
            ],
            "path": walk["path"]["score"],
        }
        return {"summary": summ, "by_size": by_size, "free": free, "dynamic": dyn,
                "locality": locality}  # fmt: skip


__all__ = ["GAP_BUCKETS", "StreamedFigures"]
