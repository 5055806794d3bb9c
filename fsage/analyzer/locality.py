"""Where things sit relative to each other: file vs. parent directory group, inode vs. first
data block, metadata blocks (extent-tree nodes, indirect blocks) vs. the data of their file.

Group geometry comes from the reader's facts: ``facts.groups`` rows (``start``, ``length`` and,
for ext, ``inode_table``) and ``inodes_per_group`` / ``inode_size`` looked up in
``facts.extra`` then ``facts.mkfs``. When a fact is missing the metric is reported as None.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from fsage.layout import Layout

I64 = npt.NDArray[np.int64]


def fact(layout: Layout, *names: str) -> Any:
    """First of ``names`` found in facts.extra, facts.mkfs (None if absent)."""
    for src in (layout.facts.extra, layout.facts.mkfs):
        for name in names:
            if name in src and src[name] is not None:
                return src[name]
    return None


def inodes_per_group(layout: Layout) -> int | None:
    v = fact(layout, "inodes_per_group", "s_inodes_per_group")
    if v:
        return int(v)
    groups = layout.facts.groups
    if groups and layout.facts.inodes_total:
        return layout.facts.inodes_total // len(groups)
    return None


def blocks_per_group(layout: Layout) -> int | None:
    v = fact(layout, "blocks_per_group", "s_blocks_per_group")
    if v:
        return int(v)
    groups = layout.facts.groups
    if groups:
        return int(groups[0].get("length", 0)) or None
    return None


def groups_per_flex(layout: Layout) -> int:
    if "flex_bg" not in layout.facts.features:
        return 1
    v = fact(layout, "groups_per_flex", "flex_bg_size")
    if v:
        return int(v)
    log = fact(layout, "log_groups_per_flex")
    if log is not None:
        return 1 << int(log)
    return 16


def group_of_block(layout: Layout, block: I64) -> I64 | None:
    groups = layout.facts.groups
    if groups:
        starts = np.array([int(g["start"]) for g in groups], np.int64)
        return (np.searchsorted(starts, block, side="right") - 1).astype(np.int64)
    bpg = blocks_per_group(layout)
    if not bpg:
        return None
    return ((block - layout.facts.first_data_block) // bpg).astype(np.int64)


def parent_index(layout: Layout) -> I64:
    """Index (into layout.files) of each file's parent directory via its first link; -1 for
    the root and for files without a link."""
    files, links = layout.files, layout.links
    n = len(files)
    out = np.full(n, -1, np.int64)
    if len(links) == 0 or n == 0:
        return out
    ino = files.ino.astype(np.int64)
    li = np.searchsorted(ino, links.ino.astype(np.int64))
    lp = np.searchsorted(ino, links.parent.astype(np.int64))
    li_ok = (li < n) & (ino[np.minimum(li, n - 1)] == links.ino.astype(np.int64))
    lp_ok = (lp < n) & (ino[np.minimum(lp, n - 1)] == links.parent.astype(np.int64))
    ok = li_ok & lp_ok & (links.ino != links.parent)
    li, lp = li[ok], lp[ok]
    # first link per file: reverse assignment keeps the earliest
    out[li[::-1]] = lp[::-1]
    return out


def _stats(d: npt.NDArray[Any]) -> dict[str, float | int] | None:
    if d.size == 0:
        return None
    return {
        "count": int(d.size),
        "mean": float(d.mean()),
        "median": float(np.median(d)),
        "p90": float(np.quantile(d, 0.9)),
    }


def locality(
    layout: Layout,
    first_block: I64,
    regular: npt.NDArray[np.bool_],
    parent: I64 | None = None,
    *,
    meta: bool = True,
) -> dict[str, Any]:
    """``parent``: :func:`parent_index` of the layout, when the caller has it already;
    ``meta``: False leaves ``meta_to_data_blocks`` None (it reads every extent)."""
    files = layout.files
    has = regular & (first_block >= 0)
    out: dict[str, Any] = {
        "same_group_share": None,
        "inode_to_data_blocks": None,
        "meta_to_data_blocks": None,
    }
    ipg = inodes_per_group(layout)
    if parent is None:
        parent = parent_index(layout)
    ino = files.ino.astype(np.int64)
    if ipg:
        sel = has & (parent >= 0)
        data_group = group_of_block(layout, first_block[sel])
        if data_group is not None and sel.any():
            dir_group = (ino[parent[sel]] - 1) // ipg
            out["same_group_share"] = float(np.mean(data_group == dir_group))
        tables = [g.get("inode_table") for g in layout.facts.groups]
        isize = fact(layout, "inode_size", "s_inode_size")
        if tables and all(t is not None for t in tables) and isize:
            itab = np.array(tables, np.int64)
            g = (ino[has] - 1) // ipg
            okg = g < itab.size
            idx = (ino[has] - 1) % ipg
            iblock = itab[np.minimum(g, itab.size - 1)] + idx * int(isize) // (
                layout.facts.block_size
            )
            d = np.abs(first_block[has] - iblock)[okg]
            out["inode_to_data_blocks"] = _stats(d)
    if meta:
        out["meta_to_data_blocks"] = _stats(meta_distances(layout))
    return out


def meta_distances(layout: Layout) -> I64:
    """For every metadata block, the distance (blocks) to the nearest data block of its file."""
    files = layout.files
    n = len(files)
    mo = files.meta_off.astype(np.int64)
    mcount = mo[1:] - mo[:-1]
    if n == 0 or mcount.sum() == 0:
        return np.zeros(0, np.int64)
    m_owner = np.repeat(np.arange(n, dtype=np.int64), mcount)
    m_phys = files.meta_physical.astype(np.int64)
    eo = files.ext_off.astype(np.int64)
    ecount = eo[1:] - eo[:-1]
    e_owner = np.repeat(np.arange(n, dtype=np.int64), ecount)
    e_start = files.ext_physical.astype(np.int64)
    e_len = files.ext_length.astype(np.int64)
    keep = e_len > 0
    e_owner, e_start, e_len = e_owner[keep], e_start[keep], e_len[keep]
    has_data = np.isin(m_owner, e_owner)
    m_owner, m_phys = m_owner[has_data], m_phys[has_data]
    if m_owner.size == 0:
        return np.zeros(0, np.int64)
    span = int(max(int(e_start.max() + e_len.max()), int(m_phys.max()))) + 1
    if (n + 1) * span >= 2**62:
        return np.zeros(0, np.int64)
    key = e_owner * span + e_start
    order = np.argsort(key, kind="stable")
    key, e_owner, e_start, e_len = key[order], e_owner[order], e_start[order], e_len[order]
    mkey = m_owner * span + m_phys
    pos = np.searchsorted(key, mkey, side="right")
    best = np.full(m_owner.size, np.iinfo(np.int64).max, np.int64)
    for cand in (pos - 1, pos):
        c = np.clip(cand, 0, key.size - 1)
        same = (cand >= 0) & (cand < key.size) & (e_owner[c] == m_owner)
        s, e = e_start[c], e_start[c] + e_len[c] - 1
        d = np.where(m_phys < s, s - m_phys, np.where(m_phys > e, m_phys - e, 0))
        best = np.where(same, np.minimum(best, d), best)
    return best


# -- between neighbouring files ------------------------------------------------------------

MIB = 1 << 20
GAP_BUCKETS = ("adjacent", "le_1mib", "le_group", "farther")
"""Buckets of the distance between neighbouring files, in bytes so that block sizes compare:
0 (the next file starts right after the previous one ends), up to 1 MiB, up to one block
group / allocation group, farther."""


def last_block(run_off: I64, run_start: I64, run_length: I64) -> I64:
    """Physical address of each file's logically last block (-1: no blocks), from the CSR runs
    of :class:`fsage.analyzer.scores.Runs` (ordered by file, then logical block)."""
    out = np.full(run_off.size - 1, -1, np.int64)
    has = run_off[1:] > run_off[:-1]
    li = run_off[1:][has] - 1
    out[has] = run_start[li] + run_length[li] - 1
    return out


def neighbour_gaps(
    first: I64, last: I64, pos: I64, parent: I64, sel: npt.NDArray[np.bool_]
) -> tuple[I64, I64]:
    """For consecutive files of one directory in path order (the selected files with blocks,
    by their walk position ``pos`` within each ``parent``): the gap in blocks from one file's
    last block to the next one's first, ``first[next] - last[prev] - 1`` (0: adjacent;
    negative: the next file lies before), and the directory of each pair."""
    idx = np.flatnonzero(sel & (pos >= 0) & (parent >= 0) & (first >= 0))
    if idx.size < 2:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    order = idx[np.lexsort((pos[idx], parent[idx]))]
    same = parent[order[1:]] == parent[order[:-1]]
    prev, nxt = order[:-1][same], order[1:][same]
    return first[nxt] - last[prev] - 1, parent[nxt]


def gap_buckets(gap: I64, block_size: int, group_blocks: int | None) -> I64:
    """Index into :data:`GAP_BUCKETS` of every gap (in blocks)."""
    d = np.abs(gap) * block_size
    group = group_blocks * block_size if group_blocks else None
    out = np.full(gap.size, 3, np.int64)
    if group is not None:
        out[d <= group] = 2
    out[d <= MIB] = 1
    out[gap == 0] = 0
    return out


def gap_distribution(gap: I64, block_size: int, group_blocks: int | None) -> dict[str, Any]:
    """Counts and shares of the gaps by :data:`GAP_BUCKETS`; ``le_group`` is None where the
    group size is unknown (its gaps count as farther)."""
    k = gap_buckets(gap, block_size, group_blocks)
    counts = np.bincount(k, minlength=len(GAP_BUCKETS))
    n = int(gap.size)
    out: dict[str, Any] = {
        "pairs": n,
        "group_bytes": group_blocks * block_size if group_blocks else None,
    }
    for i, name in enumerate(GAP_BUCKETS):
        known = name != "le_group" or group_blocks is not None
        out[name] = int(counts[i]) if known else None
        out[f"{name}_share"] = float(counts[i]) / n if n and known else None
    d = np.abs(gap) * block_size
    out["median_bytes"] = float(np.median(d)) if n else None
    out["forward_share"] = float(np.mean(gap >= 0)) if n else None
    return out
