"""Dynamic layout score (Conway et al., "File Systems Fated for Senescence? Nonsense, Says
Science!", FAST'17, section 3): how contiguous the block requests of a real read are.

    dynamic layout score = 1 - (requests not starting where the previous one ended)
                               / (blocks read)

A request that starts right after the previous one costs no seek; every other one does. The
score is 1 for a read that is one sequential stream and falls towards 0 as every block needs
its own seek. fsage computes it two ways:

* **modeled** (:func:`modeled_reads`): the requests a recursive read of the tree would make
  (Conway's ``grep -r``), in path order — depth first, entries by name — with a cold cache.
  For every directory and regular file: its inode's inode-table block (ext: with the kernel's
  inode-table readahead of ``INODE_READAHEAD_BLOCKS`` aligned blocks, each window read once),
  then its extent-tree / indirect blocks, then its data in logical order. A directory's
  blocks are read when the walk enters it, before its entries. Reads that fall on blocks
  already read (an inode-table window seen before) make no request.
* **traced** (:mod:`fsage.trace`): the block requests the kernel issued while a command ran,
  from blktrace / blkparse text.

A fresh file system whose files were written in the order of the walk scores near 1; aging
scatters files, their inodes and extent blocks, so the modeled score falls, as Conway's
measured one does (ext4: 0.92 to 0.85 over their git-pull aging).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from fsage import _kernels
from fsage.analyzer.locality import fact, inodes_per_group
from fsage.analyzer.scores import FileScores
from fsage.layout import META_XATTR, Layout

I64 = npt.NDArray[np.int64]

INODE_READAHEAD_BLOCKS = 32
"""ext4's default ``inode_readahead_blks``: inode-table blocks read around a missing inode."""


@dataclass
class Requests:
    """Block requests in issue order (file-system blocks); ``segment``: for reads modeled as
    several independent scans, the scan each request belongs to (ascending)."""

    start: I64
    length: I64
    segment: I64 | None = None

    def score(self) -> dict[str, Any]:
        return request_score(self.start, self.length)

    def segment_counts(self, nseg: int) -> tuple[I64, I64]:
        """Per segment: (requests that seek, blocks read). Every scan starts with a seek."""
        seg = self.segment if self.segment is not None else np.zeros(self.start.size, np.int64)
        keep = self.length > 0
        seg, start, length = seg[keep], self.start[keep], self.length[keep]
        seek = np.ones(seg.size, bool)
        seek[1:] = (start[1:] != start[:-1] + length[:-1]) | (seg[1:] != seg[:-1])
        disc = np.bincount(seg[seek], minlength=nseg).astype(np.int64)
        blocks = np.rint(np.bincount(seg, weights=length, minlength=nseg)).astype(np.int64)
        return disc, blocks


def request_score(start: I64, length: I64) -> dict[str, Any]:
    """Conway's score of requests in issue order, with its ingredients."""
    keep = length > 0
    start, length = start[keep], length[keep]
    blocks = int(length.sum())
    if blocks == 0:
        return {"score": None, "requests": 0, "discontiguous": 0, "blocks": 0}
    disc = 1 + int(np.count_nonzero(start[1:] != start[:-1] + length[:-1]))
    return {
        "score": 1.0 - disc / blocks,
        "requests": int(start.size),
        "discontiguous": disc,
        "blocks": blocks,
    }


def reads_text(reads: dict[str, dict[str, Any]]) -> str:
    """The dynamic layout score of each read (``request_score`` by order name) in one line,
    as ``analyze`` prints it and the report notes it."""
    return ", ".join(
        f"{order} order {'-' if r['score'] is None else format(r['score'], '.4f')} "
        f"({r['discontiguous']:,} of {r['requests']:,} requests seek, {r['blocks']:,} blocks)"
        for order, r in reads.items()
    )


def walk_order(layout: Layout, sel: npt.NDArray[np.bool_], pos: I64 | None = None) -> I64:
    """Indices of the selected files in the order of a recursive walk: depth first, each
    directory before its entries, entries by name (byte order). Files not reachable from the
    root are left out; a file with several names is read at its first link's place."""
    if pos is None:
        pos = preorder(layout)
    idx = np.flatnonzero(sel & (pos >= 0))
    if idx.size == 0:
        return idx.astype(np.int64)
    # positions are distinct: each file dropped into its slot, the slots read in order
    slot = np.full(int(pos[idx].max()) + 1, -1, np.int64)
    slot[pos[idx]] = idx
    return slot[slot >= 0]


def preorder(layout: Layout) -> I64:
    """Each file's position in a depth-first walk from the root (-1: not reachable)."""
    return preorder_sizes(layout)[0]


def preorder_sizes(layout: Layout) -> tuple[I64, I64]:
    """Each file's position in a depth-first walk from the root (-1: not reachable) and the
    number of files of its subtree (itself included; 0: not reachable), without building path
    strings: siblings are ranked by name, subtree sizes summed bottom-up, and positions handed
    down level by level. A subtree's files hold the positions ``pos .. pos + size - 1``."""
    files, links = layout.files, layout.links
    n = len(files)
    root = root_index(layout)
    if root < 0:
        return np.full(n, -1, np.int64), np.zeros(n, np.int64)
    ino = files.ino.astype(np.int64)
    parent = np.full(n, -1, np.int64)
    link_of = np.full(n, -1, np.int64)
    # (each intermediate dropped once used: at a million files every array is 8 MB)
    if len(links):
        key = links.ino.astype(np.int64)
        li_c = np.minimum(np.searchsorted(ino, key), n - 1)
        ok = ino[li_c] == key
        key = links.parent.astype(np.int64)
        lp_c = np.minimum(np.searchsorted(ino, key), n - 1)
        ok &= ino[lp_c] == key
        del key
        ok &= li_c != lp_c
        ok &= li_c != root
        rows = np.flatnonzero(ok)[::-1]  # reversed: the first link of a file wins
        del ok
        parent[li_c[rows]] = lp_c[rows]
        link_of[li_c[rows]] = rows
        del li_c, lp_c, rows
    del ino
    dep = depths_below(parent, np.array([root], np.int64))
    reach = np.flatnonzero(dep > 0)
    # every reachable file after its siblings of smaller names (bytes compared, in C)
    reach_link = link_of[reach]
    del link_of
    by_name = _kernels.argsort_names(
        parent[reach], links.names, links.name_off.astype(np.uint64, copy=False), reach_link
    )
    del reach_link
    order = reach[np.frombuffer(by_name, np.int64)]
    del reach, by_name
    size = np.where(dep >= 0, 1, 0).astype(np.int64)
    maxdep = int(dep.max())
    for d in range(maxdep, 0, -1):
        at = np.flatnonzero(dep == d)
        # added straight from bincount's float64 sums (exact below 2**53): no int64 copy
        np.add(
            size,
            np.bincount(parent[at], weights=size[at], minlength=n),
            out=size,
            casting="unsafe",
        )
    # offset of each child within its parent: sizes of the siblings before it
    op = parent[order]
    first = np.ones(order.size, bool)
    first[1:] = op[1:] != op[:-1]
    del op
    # in place where it can be: at a million files every temporary is another 8 MB
    group_start = np.arange(order.size, dtype=np.int64)
    group_start[~first] = 0
    np.maximum.accumulate(group_start, out=group_start)
    del first
    sizes = size[order]
    csum = np.cumsum(sizes)
    csum -= sizes
    del sizes
    csum -= csum[group_start]
    del group_start
    offset = np.empty(n, np.int64)
    offset[order] = csum
    del csum, order
    return preorder_positions(parent, dep, np.array([root], np.int64), offset, maxdep), size


def preorder_positions(
    parent: npt.NDArray[Any], dep: npt.NDArray[Any], roots: I64, offset: I64, maxdep: int
) -> I64:
    """Each file's place in a preorder walk from ``roots`` (-1: unreached): its parent's
    place, one, and ``offset`` (the sizes of the subtrees of its siblings before it), found
    level by level down to ``maxdep``."""
    pos = np.full(parent.size, -1, np.int64)
    pos[roots] = 0
    for d in range(1, maxdep + 1):
        at = np.flatnonzero(dep == d)
        pos[at] = pos[parent[at]] + 1 + offset[at]
    return pos


def root_index(layout: Layout) -> int:
    """Index of the root directory in layout.files (-1: none): ``layout.root_ino`` where it
    names a directory with entries, else the one directory with entries that no other
    directory names (a layout whose root inode number was not kept, such as xfs's 128 or
    btrfs's 256 read back as ext's 2)."""
    files, links = layout.files, layout.links
    n = len(files)
    if n == 0:
        return -1
    ino = files.ino.astype(np.int64)
    parents = np.unique(links.parent.astype(np.int64))
    at = int(np.searchsorted(ino, layout.root_ino))
    if at < n and ino[at] == layout.root_ino and (parents.size == 0 or layout.root_ino in parents):
        return at
    named = links.ino[links.ino != links.parent].astype(np.int64)
    tops = parents[~np.isin(parents, named)]
    if tops.size != 1:
        return -1
    at = int(np.searchsorted(ino, tops[0]))
    return at if at < n and ino[at] == tops[0] else -1


def depths_below(parent: npt.NDArray[Any], roots: I64) -> npt.NDArray[Any]:
    """Each file's depth below ``roots`` (0 for a root) through the ``parent`` array (-1:
    none), found level by level; -1 for files no root reaches (cut off, or in a loop). In
    ``parent``'s integer type, its temporaries too (the path walk's are 4 bytes a directory)."""
    dep = np.full(parent.size, -1, parent.dtype)
    dep[roots] = 0
    has = np.flatnonzero(parent >= 0).astype(parent.dtype, copy=False)
    by_parent = has[np.argsort(parent[has], kind="stable")]
    del has
    sorted_parent = parent[by_parent]
    frontier, level = roots, 0
    while frontier.size:
        lo = np.searchsorted(sorted_parent, frontier, side="left")
        hi = np.searchsorted(sorted_parent, frontier, side="right")
        kids = by_parent[ranges(lo, hi)]
        kids = kids[dep[kids] < 0]
        level += 1
        dep[kids] = level
        frontier = kids
    return dep


def ranges(lo: I64, hi: I64) -> I64:
    """The indices lo[0]..hi[0]-1, lo[1]..hi[1]-1, ... concatenated (a CSR gather), in one
    pass in C."""
    out = _kernels.ranges(np.ascontiguousarray(lo, np.int64), np.ascontiguousarray(hi, np.int64))
    return np.frombuffer(out, np.int64)


@dataclass
class _InodeTables:
    """Where each inode's inode-table block lies (ext geometry), and the end of each group's
    table blocks that hold inodes in use (the kernel skips the unused tail)."""

    ino: I64
    ipg: int
    per_block: int
    itab: I64
    used_end: I64


def _inode_tables(layout: Layout) -> _InodeTables | None:
    """The geometry ``_inode_requests`` needs; None where it is unknown (non-ext)."""
    ipg = inodes_per_group(layout)
    isize = fact(layout, "inode_size", "s_inode_size")
    tables = [g.get("inode_table") for g in layout.facts.groups]
    if not (ipg and isize and tables and all(t is not None for t in tables)):
        return None
    per_block = max(layout.facts.block_size // int(isize), 1)
    itab = np.array(tables, np.int64)
    ino = layout.files.ino.astype(np.int64)
    all_g = (ino - 1) // ipg
    valid = (all_g >= 0) & (all_g < itab.size)
    top = np.zeros(itab.size, np.int64)
    np.maximum.at(top, all_g[valid], (ino[valid] - 1) % ipg)
    return _InodeTables(ino, ipg, per_block, itab, itab + top // per_block + 1)


class _FirstWindows:
    """Which objects are the first read of their readahead window within their segment,
    over chunks of one read taken in order: the windows the previous chunks' last segment
    read are carried to the next chunk (segments ascend, so no earlier one continues)."""

    def __init__(self) -> None:
        self.segment = -1
        self.seen = np.zeros(0, np.int64)

    def first(self, key: I64, segment: I64 | None) -> npt.NDArray[np.bool_]:
        n = key.size
        seg = np.zeros(n, np.int64) if segment is None else segment
        # first object of each (segment, window): a stable sort by window keeps each
        # window's objects in segment order
        by = np.argsort(key, kind="stable")
        ks, ss = key[by], seg[by]
        head = np.ones(by.size, bool)
        head[1:] = (ks[1:] != ks[:-1]) | (ss[1:] != ss[:-1])
        first = np.zeros(n, bool)
        first[by[head]] = True
        carried = seg == self.segment
        first[carried & np.isin(key, self.seen)] = False
        if n:
            last = int(seg[-1])
            mine = key[seg == last]
            self.seen = np.union1d(self.seen, mine) if last == self.segment else np.unique(mine)
            self.segment = last
        return first


def _inode_requests(
    tabs: _InodeTables | None, objs: I64, windows: _FirstWindows, segment: I64 | None = None
) -> tuple[I64, I64, npt.NDArray[np.bool_]]:
    """Per object: the inode-table request (start, length) and whether it is the first read
    of its readahead window (within its ``segment``: each scan starts cold). Empty lengths
    where the geometry is unknown (non-ext)."""
    n = objs.size
    if tabs is None or n == 0:
        return np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, bool)
    ino, ipg, itab = tabs.ino[objs], tabs.ipg, tabs.itab
    g = (ino - 1) // ipg
    ok = (g >= 0) & (g < itab.size)
    g = np.clip(g, 0, itab.size - 1)
    block = itab[g] + ((ino - 1) % ipg) // tabs.per_block
    ra = INODE_READAHEAD_BLOCKS
    wstart = np.maximum(block & ~np.int64(ra - 1), itab[g])
    wend = np.minimum((block & ~np.int64(ra - 1)) + ra, tabs.used_end[g])
    wend = np.maximum(wend, block + 1)
    first = np.zeros(n, bool)
    if ok.any():
        first = windows.first(np.where(ok, wstart, -1), segment)
    first &= ok
    return wstart, wend - wstart, first


# Objects modeled at a time: a read's requests are those of its objects one after the other,
# and the per-object arrays of the model are then a chunk's, not the tree's.
READS_CHUNK = 1 << 16


def modeled_reads(
    layout: Layout, scores: FileScores, order: I64, segment: I64 | None = None
) -> Requests:
    """The requests of reading the files at ``order`` (directories included) one after the
    other, each with its inode block, metadata blocks and data. ``segment`` (ascending, one
    per entry of ``order``) cuts the read into independent cold scans: a file may appear in
    several, and an inode-table window read by one scan is read again by the next."""
    n = order.size
    if n == 0:
        empty = np.zeros(0, np.int64)
        return Requests(empty, empty, None if segment is None else empty)
    tabs = _inode_tables(layout)
    windows = _FirstWindows()
    parts = []
    for lo in range(0, n, READS_CHUNK):
        hi = min(lo + READS_CHUNK, n)
        seg = None if segment is None else segment[lo:hi]
        parts.append(_chunk_reads(layout, scores, order[lo:hi], seg, tabs, windows))
    if len(parts) == 1:
        return parts[0]
    return Requests(
        np.concatenate([r.start for r in parts]),
        np.concatenate([r.length for r in parts]),
        None if segment is None else np.concatenate([r.segment for r in parts]),
    )


def modeled_score(layout: Layout, scores: FileScores, order: I64) -> dict[str, Any]:
    """``modeled_reads(layout, scores, order).score()``, modeled a chunk of objects at a time
    without holding every request: a chunk's first request is judged against the previous
    chunk's last one."""
    tabs = _inode_tables(layout)
    windows = _FirstWindows()
    blocks = requests = disc = 0
    prev_end: int | None = None
    for lo in range(0, order.size, READS_CHUNK):
        req = _chunk_reads(layout, scores, order[lo : lo + READS_CHUNK], None, tabs, windows)
        keep = req.length > 0
        start, length = req.start[keep], req.length[keep]
        if start.size == 0:
            continue
        blocks += int(length.sum())
        requests += int(start.size)
        disc += int(np.count_nonzero(start[1:] != start[:-1] + length[:-1]))
        disc += int(prev_end is None or int(start[0]) != prev_end)
        prev_end = int(start[-1] + length[-1])
    return score_of_totals(disc, blocks, requests)


def score_of_totals(disc: int, blocks: int, requests: int) -> dict[str, Any]:
    """A dynamic layout score's answer from its totals: discontiguous requests, blocks read
    and requests (None for a read of nothing)."""
    if blocks == 0:
        return {"score": None, "requests": 0, "discontiguous": 0, "blocks": 0}
    return {
        "score": 1.0 - disc / blocks,
        "requests": requests,
        "discontiguous": disc,
        "blocks": blocks,
    }


def modeled_segment_counts(
    layout: Layout, scores: FileScores, order: I64, segment: I64, nseg: int
) -> tuple[I64, I64]:
    """``modeled_reads(layout, scores, order, segment).segment_counts(nseg)``, modeled a
    chunk of objects at a time without holding every request: the seek of a chunk's first
    request is judged against the previous chunk's last one."""
    disc = np.zeros(nseg, np.int64)
    blocks = np.zeros(nseg, np.int64)
    tabs = _inode_tables(layout)
    windows = _FirstWindows()
    prev: tuple[int, int] | None = None  # the last request's segment and end
    for lo in range(0, order.size, READS_CHUNK):
        hi = min(lo + READS_CHUNK, order.size)
        req = _chunk_reads(layout, scores, order[lo:hi], segment[lo:hi], tabs, windows)
        assert req.segment is not None
        keep = req.length > 0
        seg, start, length = req.segment[keep], req.start[keep], req.length[keep]
        if seg.size == 0:
            continue
        seek = np.ones(seg.size, bool)
        seek[1:] = (start[1:] != start[:-1] + length[:-1]) | (seg[1:] != seg[:-1])
        seek[0] = prev != (int(seg[0]), int(start[0]))
        disc += np.bincount(seg[seek], minlength=nseg).astype(np.int64)
        blocks += np.rint(np.bincount(seg, weights=length, minlength=nseg)).astype(np.int64)
        prev = (int(seg[-1]), int(start[-1] + length[-1]))
    return disc, blocks


def _chunk_reads(
    layout: Layout,
    scores: FileScores,
    order: I64,
    segment: I64 | None,
    tabs: _InodeTables | None,
    windows: _FirstWindows,
) -> Requests:
    files = layout.files
    n = order.size
    istart, ilen, ifirst = _inode_requests(tabs, order, windows, segment)
    # metadata blocks of each object (extent-tree nodes, indirect blocks; not xattr blocks)
    mo = files.meta_off.astype(np.int64)
    m_rows = np.repeat(np.arange(n), mo[order + 1] - mo[order])
    m_idx = ranges(mo[order], mo[order + 1])
    keep_m = files.meta_kind[m_idx] != META_XATTR
    m_rows, m_idx = m_rows[keep_m], m_idx[keep_m]
    m_count = np.bincount(m_rows, minlength=n).astype(np.int64)
    # data runs in logical order
    runs = scores.runs
    r_rows = np.repeat(np.arange(n), runs.off[order + 1] - runs.off[order])
    r_idx = ranges(runs.off[order], runs.off[order + 1])
    r_count = np.bincount(r_rows, minlength=n).astype(np.int64)
    per = ifirst.astype(np.int64) + m_count + r_count
    base = np.zeros(n + 1, np.int64)
    np.cumsum(per, out=base[1:])
    total = int(base[-1])
    start = np.zeros(total, np.int64)
    length = np.zeros(total, np.int64)
    at = base[:-1][ifirst]
    start[at], length[at] = istart[ifirst], ilen[ifirst]
    m_first = np.zeros(n + 1, np.int64)
    np.cumsum(m_count, out=m_first[1:])
    m_pos = base[m_rows] + ifirst[m_rows] + (np.arange(m_rows.size) - m_first[m_rows])
    start[m_pos] = files.meta_physical[m_idx].astype(np.int64)
    length[m_pos] = 1
    r_first = np.zeros(n + 1, np.int64)
    np.cumsum(r_count, out=r_first[1:])
    r_pos = (
        base[r_rows] + ifirst[r_rows] + m_count[r_rows] + (np.arange(r_rows.size) - r_first[r_rows])
    )
    start[r_pos] = runs.start[r_idx]
    length[r_pos] = runs.length[r_idx]
    req_segment = None if segment is None else np.repeat(segment, per)
    return Requests(start, length, req_segment)


def directory_scans(
    layout: Layout, scores: FileScores, pos: I64, parent: I64, regular: npt.NDArray[np.bool_]
) -> tuple[I64, I64, I64, I64]:
    """Each directory's own scan, modeled cold: the directory (inode, metadata, its blocks),
    then its regular files by name — what ``cat DIR/*`` reads; subdirectories are left to
    their own scans. Returns, for every directory holding a regular file: its index, its
    regular files, the requests that seek and the blocks read."""
    kids = np.flatnonzero(regular & (pos >= 0) & (parent >= 0))
    dirs = np.unique(parent[kids])
    if dirs.size == 0:
        empty = np.zeros(0, np.int64)
        return empty, empty, empty, empty
    objs = np.concatenate([dirs, kids])
    owner = np.concatenate([dirs, parent[kids]])
    # a directory's walk position comes before every one of its entries'
    by = np.lexsort((pos[objs], owner))
    objs, seg = objs[by], np.searchsorted(dirs, owner[by])
    disc, blocks = modeled_segment_counts(layout, scores, objs, seg, dirs.size)
    files = np.bincount(seg, minlength=dirs.size).astype(np.int64) - 1
    return dirs, files, disc, blocks


def subtree_scans(
    layout: Layout, scores: FileScores, roots: I64, pos: I64, size: I64, walk: I64
) -> tuple[I64, I64]:
    """Conway's ``grep -r DIR`` for each directory of ``roots``, each modeled cold: (requests
    that seek, blocks read). ``walk``: the objects a scan reads, in walk order;
    ``pos``/``size``: :func:`preorder_sizes`."""
    if roots.size == 0 or walk.size == 0:
        return np.zeros(roots.size, np.int64), np.zeros(roots.size, np.int64)
    wp = pos[walk]
    lo = np.searchsorted(wp, pos[roots])
    hi = np.searchsorted(wp, pos[roots] + size[roots])
    hi = np.where(pos[roots] >= 0, hi, lo)
    disc = np.zeros(roots.size, np.int64)
    blocks = np.zeros(roots.size, np.int64)
    # nested subtrees read the same files again: modeled a quarter of a walk at a time (a
    # larger subtree on its own), so that memory stays below that of one scan of the tree
    ends = np.cumsum(hi - lo)
    batch = max(walk.size // 4, 1)
    start = 0
    while start < roots.size:
        base = int(ends[start - 1]) if start else 0
        stop = max(int(np.searchsorted(ends, base + batch, side="right")), start + 1)
        part = slice(start, stop)
        idx = ranges(lo[part], hi[part])
        seg = np.repeat(np.arange(stop - start, dtype=np.int64), (hi - lo)[part])
        disc[part], blocks[part] = modeled_segment_counts(
            layout, scores, walk[idx], seg, stop - start
        )
        start = stop
    return disc, blocks


def score_distribution(disc: I64, blocks: I64) -> dict[str, Any]:
    """The scores ``1 - disc / blocks`` of several scans: their block-weighted aggregate,
    mean, quantiles and a histogram in tenths (the last bin holds 0.9 to 1)."""
    ok = blocks > 0
    sc = 1.0 - disc[ok] / blocks[ok]
    n = int(sc.size)
    if n == 0:
        return {
            "scans": 0,
            "aggregate": None,
            "mean": None,
            "p10": None,
            "median": None,
            "p90": None,
            "histogram": [0] * 10,
        }
    hist = np.bincount(np.minimum((sc * 10).astype(np.int64), 9), minlength=10)
    return {
        "scans": n,
        "aggregate": 1.0 - int(disc[ok].sum()) / int(blocks[ok].sum()),
        "mean": float(sc.mean()),
        "p10": float(np.quantile(sc, 0.1)),
        "median": float(np.median(sc)),
        "p90": float(np.quantile(sc, 0.9)),
        "histogram": [int(c) for c in hist],
    }
