"""The path-order figures of a snapshot fed a part at a time, in bounded memory: the dynamic
layout score of a depth-first walk by name, each directory's own scan, and the gaps between
consecutive files of a directory (``dynamic.preorder_sizes``, ``directory_scans``,
``locality.neighbour_gaps``).

Each named file's record goes to a bucket file by its parent's inode range; a bucket at a time,
records are put in (parent, name, inode) order (a directory's entries as the walk takes them)
and written out without their names. Directory scans and gaps read that order straight; the
walk positions follow from each directory's subtree size (a few numbers per directory in
memory, 4-byte indices where they fit; the directories' own requests stay on disk), and the
objects, bucketed again by position, are read back in walk order. A bucket of many windows
(one directory of that many entries) is sorted in runs on disk and merged (``namesort``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from fsage.analyzer import spill
from fsage.analyzer.dynamic import (
    _InodeTables,
    depths_below,
    preorder_positions,
    ranges,
    score_of_totals,
)
from fsage.analyzer.locality import GAP_BUCKETS, gap_buckets
from fsage.analyzer.namesort import sorted_windows
from fsage.analyzer.objects import OWN, Scan
from fsage.analyzer.spill import Buckets, Values

I64 = npt.NDArray[np.int64]

REC = np.dtype(
    [("parent", "<i8"), ("ino", "<i8"), ("kind", "u1"), ("first", "<i8"), ("last", "<i8"), *OWN]
)
POS_REC = np.dtype([("pos", "<i8"), ("ino", "<i8"), ("kind", "u1"), *OWN])
OWN_REC = np.dtype(OWN)
REGULAR, DIRECTORY = 1, 2


def _narrow(n: int) -> np.dtype[Any]:
    """The integer type of indices and counts below ``n``: 4 bytes a directory, not 8."""
    return np.dtype(np.int32) if n < 2**31 else np.dtype(np.int64)


def _rows(own: Values, at: I64) -> npt.NDArray[Any]:
    """Rows ``at`` (ascending) of ``own``, read a window at a time from where they lie."""
    out = np.empty(at.size, own.dtype)
    i = 0
    while i < at.size:
        lo = int(at[i])
        hi = min(lo + max(spill.WINDOW, 1), own.n)
        j = int(np.searchsorted(at, hi, side="left"))
        out[i:j] = own.read(lo, hi)[at[i:j] - lo]
        i = j
    return out


def _own(rec: npt.NDArray[Any]) -> dict[str, I64]:
    return {k: rec[k].astype(np.int64) for k, _ in OWN}


class PathWalk:
    def __init__(self, tmp: Path, tabs: _InodeTables | None, root: int, bs: int,
                 group_blocks: int | None, parents: I64, entries: I64) -> None:  # fmt: skip
        self.tmp = tmp
        self.tabs = tabs
        self.root = root
        self.bs = bs
        self.group_blocks = group_blocks
        self.kids = Buckets(tmp, "kids", REC, names=True)
        # the records of files that name entries, on disk until the walk: kept as many small
        # arrays they would pin the heap pages between a part's freed ones
        self.dirs = tmp / "dirs.rec"
        self.dirs.write_bytes(b"")
        self.root_rec: npt.NDArray[Any] | None = None
        # buckets by ranges of parents (their order is the parents' order) of about a
        # window's entries each (``entries``: the names each of ``parents`` holds); one
        # directory's entries are sorted together, however many
        total = np.cumsum(entries)
        cut = np.flatnonzero(np.diff(total // max(spill.WINDOW, 1), prepend=0))
        self.cuts = parents[cut]
        # names in the walk: they bound every count and index of step 1 and 2
        self.names = int(total[-1]) if total.size else 0

    def add(self, rec: npt.NDArray[Any], name_row: I64, name_off: Any, names: bytes,
            parents: I64) -> None:  # fmt: skip
        """Records of a part's files (``parent`` -1: not named in the walk), with the row of
        each one's first name; ``parents``: the sorted inodes that name entries."""
        ino = rec["ino"]
        if parents.size:
            at = np.minimum(np.searchsorted(parents, ino), parents.size - 1)
            with open(self.dirs, "ab") as f:
                rec[parents[at] == ino].tofile(f)
        if self.root >= 0:
            r = rec[ino == self.root]
            if r.size:
                self.root_rec = r.copy()
        named = np.flatnonzero(rec["parent"] >= 0)
        if named.size == 0:
            return
        bucket = np.searchsorted(self.cuts, rec["parent"][named], side="right")
        sub_off = np.zeros(named.size + 1, np.uint64)
        lens = (name_off[1:] - name_off[:-1])[name_row[named]]
        np.cumsum(lens, out=sub_off[1:])
        raw = np.frombuffer(names, np.uint8)
        sub = raw[ranges(name_off[:-1][name_row[named]].astype(np.int64),
                         name_off[1:][name_row[named]].astype(np.int64))]  # fmt: skip
        self.kids.add(bucket, rec[named], sub_off, sub.tobytes())

    # The two passes over every entry are methods of their own: the arrays of their last
    # window go when they return, before the next step allocates its own.

    def _in_walk_order(
        self, d_ino: I64, done: Callable[[int, int, int], None]
    ) -> tuple[Values, npt.NDArray[Any], list[tuple[npt.NDArray[Any], npt.NDArray[Any]]]]:
        """Step 1: the entries, a bucket at a time, in walk order to ``walked``; how many
        entries each directory holds; (directory, index among its entries) of each, in walk
        order (so by parent, then index)."""
        nd = d_ino.size
        t = _narrow(max(nd, self.names))
        walked = Values(self.tmp / "walked", REC)  # type: ignore[arg-type]
        count = np.zeros(nd, t)
        edges: list[tuple[npt.NDArray[Any], npt.NDArray[Any]]] = []
        kids = sorted(self.kids.used)  # (``load`` takes each from ``used``)
        width = max(spill.WINDOW, 1)
        for i, k in enumerate(kids):
            done(0, i, len(kids))
            # one directory's entries may run over windows: its index among them carries
            carry = (-1, 0)  # the last window's last parent, and its entries so far
            for rec in sorted_windows(self.kids, k, width):
                walked.add(rec)
                par = rec["parent"].astype(np.int64)
                ino = rec["ino"].astype(np.int64)
                del rec
                p = np.minimum(np.searchsorted(d_ino, par), max(nd - 1, 0))
                np.add.at(count, p, 1)
                del p
                q = np.minimum(np.searchsorted(d_ino, ino), max(nd - 1, 0))
                is_dir = np.flatnonzero(d_ino[q] == ino) if nd else np.zeros(0, np.int64)
                del ino
                grp_start = np.ones(par.size, bool)
                grp_start[1:] = par[1:] != par[:-1]
                first_of = np.maximum.accumulate(np.where(grp_start, np.arange(par.size), 0))
                index = np.arange(par.size) - first_of
                if int(par[0]) == carry[0]:
                    index[first_of == 0] += carry[1]
                last = int(par[-1])
                carry = (last, int(index[-1]) + 1)
                edges.append((q[is_dir].astype(t), index[is_dir].astype(t)))
        return walked, count, edges

    def _walk_windows(
        self,
        walked: Values,
        done: Callable[[int, int, int], None],
        d_ino: I64,
        own_dirs: Values,
        placed: tuple[npt.NDArray[np.bool_], I64, I64],
        by_pos: Buckets,
        gaps: I64,
        segs: tuple[I64, I64, npt.NDArray[np.bool_]],
        scan: Scan,
    ) -> None:
        """Step 3: the entries in walk order, a window at a time: their positions (to
        ``by_pos``), the gaps between neighbours, every directory's own scan (``segs``; its
        directory's own requests are rows of ``own_dirs``, read as the scans begin: the walk
        takes the parents in inode order)."""
        nd = d_ino.size
        reached, size, pos = placed
        seg_disc, seg_blocks, has_seg = segs
        width = max(spill.WINDOW, 1)
        carry = (-1, 0, 0)  # the last directory, its next entry index, the extra before it
        last_file: tuple[int, int] | None = None  # (directory, last block) of a regular file
        opened = -1  # the directory whose own scan has begun
        for i, rec in enumerate(walked.windows()):
            done(1, i * spill.WINDOW, walked.n)
            n = rec.size
            par = rec["parent"]
            p = np.minimum(np.searchsorted(d_ino, par), max(nd - 1, 0))
            reach = reached[p] if nd else np.zeros(n, bool)
            q = np.minimum(np.searchsorted(d_ino, rec["ino"]), max(nd - 1, 0))
            is_dir = (d_ino[q] == rec["ino"]) if nd else np.zeros(n, bool)
            extra = np.where(is_dir, size[q] - 1, 0)
            gs = np.ones(n, bool)
            gs[1:] = par[1:] != par[:-1]
            cont = par[0] == carry[0] if n else False
            start = np.maximum.accumulate(np.where(gs, np.arange(n), 0))
            j = np.arange(n) - start
            csum = np.cumsum(extra) - extra
            ex = csum - csum[start]
            if cont:
                head = start == 0
                j[head] += carry[1]
                ex[head] += carry[2]
            if n:
                last_grp = start == start[-1]
                carry = (int(par[-1]), int(j[-1]) + 1, int(ex[-1] + extra[-1]))
                del last_grp
            rpos = pos[p] + 1 + j + ex
            objs = np.flatnonzero(reach & ((rec["kind"] == REGULAR) | (rec["kind"] == DIRECTORY)))
            out = np.zeros(objs.size, POS_REC)
            out["pos"] = rpos[objs]
            out["ino"] = rec["ino"][objs]
            out["kind"] = rec["kind"][objs]
            for key, _ in OWN:
                out[key] = rec[key][objs]
            by_pos.add(out["pos"] // width, out)
            # gaps between consecutive regular files of a directory that have blocks
            g = np.flatnonzero(reach & (rec["kind"] == REGULAR) & (rec["first"] >= 0))
            if g.size:
                gp, gf, gl = par[g], rec["first"][g], rec["last"][g]
                same = gp[1:] == gp[:-1]
                gap = gf[1:][same] - gl[:-1][same] - 1
                if last_file is not None and last_file[0] == int(gp[0]):
                    gap = np.concatenate([[int(gf[0]) - last_file[1] - 1], gap])
                last_file = (int(gp[-1]), int(gl[-1]))
                gaps += np.bincount(
                    gap_buckets(gap.astype(np.int64), self.bs, self.group_blocks),
                    minlength=len(GAP_BUCKETS),
                )
            # each directory's own scan: the directory, then its regular files in order
            kids = np.flatnonzero(reach & (rec["kind"] == REGULAR))
            if kids.size:
                kp = p[kids]
                new = np.ones(kids.size, bool)
                new[1:] = kp[1:] != kp[:-1]
                new[0] = int(kp[0]) != opened
                heads = np.flatnonzero(new)
                opened = int(kp[-1])
                n_obj = kids.size + heads.size
                is_head = np.zeros(n_obj, bool)
                is_head[heads + np.arange(heads.size)] = True
                seq_ino = np.zeros(n_obj, np.int64)
                seq_seg = np.zeros(n_obj, np.int64)
                own = {key: np.zeros(n_obj, np.int64) for key, _ in OWN}
                seq_ino[~is_head] = rec["ino"][kids]
                seq_ino[is_head] = d_ino[kp[heads]]
                seq_seg[~is_head] = kp
                seq_seg[is_head] = kp[heads]
                head_own = _rows(own_dirs, kp[heads])
                for key, _ in OWN:
                    own[key][~is_head] = rec[key][kids]
                    own[key][is_head] = head_own[key]
                del head_own
                disc, blocks, seg = scan.add(seq_ino, own, seq_seg)
                np.add.at(seg_disc, seg, disc)
                np.add.at(seg_blocks, seg, blocks)
                has_seg[kp] = True

    def _placed(
        self,
        dpar: npt.NDArray[Any],
        roots: I64,
        count: npt.NDArray[Any],
        edges: list[tuple[npt.NDArray[Any], npt.NDArray[Any]]],
    ) -> tuple[npt.NDArray[np.bool_], I64, I64]:
        """Step 2: whether the walk reaches each directory, its subtree size (bottom-up) and
        walk position (top-down), one number each per directory; the rest goes when it
        returns (``edges`` is emptied as its pieces are joined)."""
        nd = dpar.size
        dep = depths_below(dpar, roots) if nd else np.zeros(0, dpar.dtype)
        size = np.where(dep >= 0, 1 + count, 0).astype(np.int64)
        e_q = np.concatenate([e[0] for e in edges]) if edges else np.zeros(0, dpar.dtype)
        e_j = np.concatenate([e[1] for e in edges]) if edges else np.zeros(0, dpar.dtype)
        edges.clear()
        maxdep = int(dep.max()) if nd and (dep >= 0).any() else 0
        for d in range(maxdep, 0, -1):
            at = e_q[dep[e_q] == d]
            np.add.at(size, dpar[at], size[at] - 1)
        offset = np.zeros(nd, np.int64)
        if e_q.size:
            grp = dpar[e_q]
            # step 1 gives the edges by parent, then index: sorting them again is the identity
            # (lexsort is stable), and its index arrays would cost 8 bytes an edge each
            step = grp[1:].astype(np.int64) - grp[:-1]
            if not ((step > 0) | ((step == 0) & (e_j[1:] >= e_j[:-1]))).all():
                by = np.lexsort((e_j, grp))
                e_q, e_j, grp = e_q[by], e_j[by], grp[by]
                del by
            del step
            csum = size[e_q] - 1
            csum -= np.cumsum(csum)  # minus the exclusive sum (sign flipped below)
            np.negative(csum, out=csum)
            starts = np.flatnonzero(np.diff(grp, prepend=grp[0] - 1))
            del grp
            csum -= np.repeat(csum[starts], np.diff(starts, append=e_q.size))
            csum += e_j
            offset[e_q] = csum
            del csum, starts
        pos = preorder_positions(dpar, dep, roots, offset, maxdep)
        return dep >= 0, size, pos

    def _directories(self) -> tuple[I64, npt.NDArray[Any], Values]:
        """The directories by inode: their inodes, each one's parent (its index, -1: none)
        and, on disk, their own requests (read back as step 3 needs them)."""
        dirs = np.fromfile(self.dirs, REC)
        self.dirs.unlink()
        # in place (a directory's record is written once, so no two share an inode and the
        # order is the stable one): a sorted copy would hold the records twice
        dirs.sort(order="ino")
        nd = dirs.size
        d_ino = dirs["ino"].copy()
        dpar = np.full(nd, -1, _narrow(nd))
        if nd:
            parent = dirs["parent"]
            at = np.minimum(np.searchsorted(d_ino, parent), nd - 1)
            ok = (parent >= 0) & (d_ino[at] == parent)
            dpar[ok] = at[ok]
            del at, ok, parent
        own_dirs = Values(self.tmp / "dirs-own", OWN_REC)  # type: ignore[arg-type]
        width = max(spill.WINDOW, 1)
        for lo in range(0, nd, width):
            part = np.empty(min(width, nd - lo), OWN_REC)
            for key, _ in OWN:
                part[key] = dirs[key][lo : lo + width]
            own_dirs.add(part)
        return d_ino, dpar, own_dirs

    def finish(
        self,
        trim: Callable[[], None] | None = None,
        progress: Callable[[float], None] | None = None,
    ) -> dict[str, Any]:
        """``progress(share)``: called as the buckets are read (a third of it a step)."""

        def done(step: int, at: int, of: int) -> None:
            if progress is not None:
                progress((step + at / max(of, 1)) / 3)

        d_ino, dpar, own_dirs = self._directories()
        nd = d_ino.size
        roots = np.flatnonzero(d_ino == self.root)
        if trim is not None:
            trim()  # the directories' whole records, read and sorted: step 1 holds a bucket
        # 1. every directory's entries in walk order, without their names
        walked, count, edges = self._in_walk_order(d_ino, done)
        if trim is not None:
            trim()
        # 2. subtree sizes bottom-up, positions top-down (one number per directory)
        placed = self._placed(dpar, roots, count, edges)
        del count, edges, dpar
        if trim is not None:
            trim()  # step 2's arrays: step 3 keeps three of them
        # 3. entries in walk order: positions, gaps, every directory's own scan
        by_pos = Buckets(self.tmp, "pos", POS_REC)
        gaps = np.zeros(len(GAP_BUCKETS), np.int64)
        seg_disc = np.zeros(nd, np.int64)
        seg_blocks = np.zeros(nd, np.int64)
        has_seg = np.zeros(nd, bool)
        scan = Scan.new(self.tabs)
        self._walk_windows(walked, done, d_ino, own_dirs, placed, by_pos, gaps,
                           (seg_disc, seg_blocks, has_seg), scan)  # fmt: skip
        del placed, d_ino
        own_dirs.path.unlink()
        if trim is not None:
            trim()
        # 4. the objects in walk order, the root first
        path = Scan.new(self.tabs)
        p_disc = p_blocks = 0
        root_rec = self.root_rec
        if root_rec is not None and int(root_rec["kind"][0]) in (REGULAR, DIRECTORY):
            disc, blocks, _ = path.add(root_rec["ino"].astype(np.int64), _own(root_rec))
            p_disc += int(disc.sum())
            p_blocks += int(blocks.sum())
        used = sorted(by_pos.used)  # (``load`` takes each from ``used``)
        for i, k in enumerate(used):
            done(2, i, len(used))
            rec, _, _ = by_pos.load(k)
            rec = rec[np.argsort(rec["pos"], kind="stable")]
            disc, blocks, _ = path.add(rec["ino"].astype(np.int64), _own(rec))
            p_disc += int(disc.sum())
            p_blocks += int(blocks.sum())
        ok = has_seg & (seg_blocks > 0)
        sc = 1.0 - seg_disc[ok] / seg_blocks[ok]
        npairs = int(gaps.sum())
        nd_out: dict[str, Any] = {"pairs": npairs}
        for i, name in enumerate(GAP_BUCKETS):
            known = name != "le_group" or self.group_blocks is not None
            nd_out[f"{name}_share"] = float(gaps[i]) / npairs if npairs and known else None
        return {
            "path": score_of_totals(p_disc, p_blocks, path.requests),
            "directory_scan": {
                "aggregate": (
                    1.0 - int(seg_disc[ok].sum()) / int(seg_blocks[ok].sum()) if sc.size else None
                ),
                "median": float(np.median(sc)) if sc.size else None,
            },
            "neighbour_distance": nd_out,
        }
