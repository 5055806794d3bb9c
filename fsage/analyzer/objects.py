"""The modeled reads of ``fsage.analyzer.dynamic`` from a few numbers per object, so that
objects can be scored in any order without their extents at hand.

An object (a directory or file) read cold makes its inode-table request when its readahead
window is new to the scan, then its own requests: metadata blocks, then data runs
(``dynamic._chunk_reads``). Its own requests are summed up once (how many, where the first
starts and the last ends, the seeks between them, blocks); the seeks of a read are then those
inside objects plus those between one object's last request and the next one's first.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from fsage.analyzer.dynamic import (
    _chunk_reads,
    _FirstWindows,
    _inode_tables,
    _InodeTables,
    ranges,
)
from fsage.analyzer.scores import FileScores
from fsage.layout import FileTable, Layout

I64 = npt.NDArray[np.int64]

#: One object's own requests, summed (``own_requests``).
OWN = [("nown", "<i8"), ("head", "<i8"), ("tail", "<i8"), ("disc", "<i8"), ("blocks", "<i8")]


def own_requests(layout: Layout, scores: FileScores, objs: I64) -> dict[str, I64]:
    """Per object of ``objs``: its own requests (no inode block), summed."""
    n = objs.size
    req = _chunk_reads(layout, scores, objs, None, None, _FirstWindows())
    files = layout.files
    mo = files.meta_off.astype(np.int64)
    m_idx_count = np.zeros(n, np.int64)
    if files.meta_kind.size:
        from fsage.layout import META_XATTR

        m_rows = np.repeat(np.arange(n), mo[objs + 1] - mo[objs])
        keep = files.meta_kind[ranges(mo[objs], mo[objs + 1])] != META_XATTR
        m_idx_count = np.bincount(m_rows[keep], minlength=n).astype(np.int64)
    runs = scores.runs
    per = m_idx_count + (runs.off[objs + 1] - runs.off[objs])
    base = np.zeros(n + 1, np.int64)
    np.cumsum(per, out=base[1:])
    has = per > 0
    head = np.zeros(n, np.int64)
    tail = np.zeros(n, np.int64)
    head[has] = req.start[base[:-1][has]]
    last = base[1:][has] - 1
    tail[has] = req.start[last] + req.length[last]
    owner = np.repeat(np.arange(n, dtype=np.int64), per)
    seek = np.zeros(req.start.size, bool)
    if req.start.size > 1:
        seek[1:] = (req.start[1:] != req.start[:-1] + req.length[:-1]) & (owner[1:] == owner[:-1])
    disc = np.bincount(owner[seek], minlength=n).astype(np.int64)
    blocks = np.rint(np.bincount(owner, weights=req.length, minlength=n)).astype(np.int64)
    return {"nown": per, "head": head, "tail": tail, "disc": disc, "blocks": blocks}


def geometry(layout: Layout, all_ino: Iterable[npt.NDArray[np.uint64]]) -> _InodeTables | None:
    """The inode-table geometry of ``dynamic._inode_tables`` for a snapshot whose files'
    inodes come in pieces (``all_ino``): the used end of each group's table from every one."""
    probe = Layout(
        facts=layout.facts, files=FileTable.empty(), links=layout.links, free=layout.free
    )
    tabs = _inode_tables(probe)
    if tabs is None:
        return None
    top = np.zeros(tabs.itab.size, np.int64)
    for ino_u in all_ino:
        ino = ino_u.astype(np.int64)
        g = (ino - 1) // tabs.ipg
        valid = (g >= 0) & (g < tabs.itab.size)
        np.maximum.at(top, g[valid], (ino[valid] - 1) % tabs.ipg)
    tabs.used_end = tabs.itab + top // tabs.per_block + 1
    return tabs


def windows_of(tabs: _InodeTables | None, ino: I64) -> tuple[I64, I64, npt.NDArray[np.bool_]]:
    """Each inode's readahead window (start, length) and whether the geometry places it
    (``dynamic._inode_requests``)."""
    n = ino.size
    if tabs is None or n == 0:
        return np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, bool)
    ipg, itab = tabs.ipg, tabs.itab
    g = (ino - 1) // ipg
    ok = (g >= 0) & (g < itab.size)
    g = np.clip(g, 0, itab.size - 1)
    block = itab[g] + ((ino - 1) % ipg) // tabs.per_block
    ra = 32
    wstart = np.maximum(block & ~np.int64(ra - 1), itab[g])
    wend = np.minimum((block & ~np.int64(ra - 1)) + ra, tabs.used_end[g])
    wend = np.maximum(wend, block + 1)
    return wstart, wend - wstart, ok


@dataclass
class Scan:
    """Seeks and blocks of objects read one after another (``segment``: each a cold scan of
    its own, ascending), fed a batch at a time in read order."""

    tabs: _InodeTables | None
    windows: _FirstWindows
    prev: tuple[int, int] | None = None  # the last request's segment and end
    requests: int = 0

    @classmethod
    def new(cls, tabs: _InodeTables | None) -> Scan:
        return cls(tabs, _FirstWindows())

    def add(
        self, ino: I64, own: dict[str, Any], segment: I64 | None = None
    ) -> tuple[I64, I64, I64]:
        """Per object: seeks, blocks, and its segment (0 without segments)."""
        n = ino.size
        seg = np.zeros(n, np.int64) if segment is None else segment
        wstart, wlen, ok = windows_of(self.tabs, ino)
        first = np.zeros(n, bool)
        if self.tabs is not None and ok.any():
            first = self.windows.first(np.where(ok, wstart, -1), segment)
        first &= ok
        nown = own["nown"]
        has_own = nown > 0
        wend = wstart + wlen
        start = np.where(first, wstart, own["head"])
        end = np.where(has_own, own["tail"], wend)
        disc = own["disc"] + (first & has_own & (own["head"] != wend))
        blocks = own["blocks"] + np.where(first, wlen, 0)
        self.requests += int(nown.sum() + first.sum())
        idx = np.flatnonzero(first | has_own)
        if idx.size:
            s, e, sg = start[idx], end[idx], seg[idx]
            seek = np.ones(idx.size, bool)
            seek[1:] = (s[1:] != e[:-1]) | (sg[1:] != sg[:-1])
            seek[0] = self.prev != (int(sg[0]), int(s[0]))
            disc[idx] += seek
            self.prev = (int(sg[-1]), int(e[-1]))
        return disc, blocks, seg
