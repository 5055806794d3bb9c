"""The path-order figures of a snapshot fed a part at a time, in bounded memory: the dynamic
layout score of a depth-first walk by name, each directory's own scan, and the gaps between
consecutive files of a directory (``dynamic.preorder_sizes``, ``directory_scans``,
``locality.neighbour_gaps``).

Each named file's record goes to a bucket file by its parent's inode range; a bucket at a time,
records are put in (parent, name, inode) order (a directory's entries as the walk takes them)
and written out without their names. Directory scans and gaps read that order straight; the
walk positions follow from each directory's subtree size (one record per directory in
memory), and the objects, bucketed again by position, are read back in walk order.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from fsage import _kernels
from fsage.analyzer import spill
from fsage.analyzer.dynamic import _InodeTables, depths_below, score_of_totals
from fsage.analyzer.locality import GAP_BUCKETS, gap_buckets
from fsage.analyzer.objects import OWN, Scan
from fsage.analyzer.spill import Buckets, Values

I64 = npt.NDArray[np.int64]

REC = np.dtype(
    [("parent", "<i8"), ("ino", "<i8"), ("kind", "u1"), ("first", "<i8"), ("last", "<i8"), *OWN]
)
POS_REC = np.dtype([("pos", "<i8"), ("ino", "<i8"), ("kind", "u1"), *OWN])
REGULAR, DIRECTORY = 1, 2


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
        from fsage.analyzer.dynamic import ranges

        raw = np.frombuffer(names, np.uint8)
        sub = raw[ranges(name_off[:-1][name_row[named]].astype(np.int64),
                         name_off[1:][name_row[named]].astype(np.int64))]  # fmt: skip
        self.kids.add(bucket, rec[named], sub_off, sub.tobytes())

    # The two passes over every entry are methods of their own: the arrays of their last
    # window go when they return, before the next step allocates its own.

    def _in_walk_order(
        self, d_ino: I64, done: Callable[[int, int, int], None]
    ) -> tuple[Values, I64, list[tuple[I64, I64]]]:
        """Step 1: the entries, a bucket at a time, in walk order to ``walked``; how many
        entries each directory holds; (directory, index among its entries) of each."""
        nd = d_ino.size
        walked = Values(self.tmp / "walked", REC)  # type: ignore[arg-type]
        count = np.zeros(nd, np.int64)
        edges: list[tuple[I64, I64]] = []  # (directory, index among its entries) of each
        kids = sorted(self.kids.used)  # (``load`` takes each from ``used``)
        for i, k in enumerate(kids):
            done(0, i, len(kids))
            rec, off, names = self.kids.load(k)
            by = np.frombuffer(
                _kernels.argsort_names(
                    rec["parent"].astype(np.int64), names, off, np.arange(rec.size, dtype=np.int64)
                ),
                np.int64,
            )
            rec = rec[by]
            del names, off
            p = np.searchsorted(d_ino, rec["parent"])
            p = np.minimum(p, max(nd - 1, 0))
            grp_start = np.ones(rec.size, bool)
            grp_start[1:] = rec["parent"][1:] != rec["parent"][:-1]
            first_of = np.maximum.accumulate(np.where(grp_start, np.arange(rec.size), 0))
            j = np.arange(rec.size) - first_of
            np.add.at(count, p, 1)
            q = np.minimum(np.searchsorted(d_ino, rec["ino"]), max(nd - 1, 0))
            is_dir = (d_ino[q] == rec["ino"]) if nd else np.zeros(rec.size, bool)
            edges.append((q[is_dir], j[is_dir]))
            walked.add(rec)
        return walked, count, edges

    def _walk_windows(
        self,
        walked: Values,
        done: Callable[[int, int, int], None],
        dirs: npt.NDArray[Any],
        placed: tuple[I64, I64, I64],
        by_pos: Buckets,
        gaps: I64,
        segs: tuple[I64, I64, npt.NDArray[np.bool_]],
        scan: Scan,
    ) -> None:
        """Step 3: the entries in walk order, a window at a time: their positions (to
        ``by_pos``), the gaps between neighbours, every directory's own scan (``segs``)."""
        d_ino, nd = dirs["ino"], dirs.size
        dep, size, pos = placed
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
            reach = dep[p] >= 0 if nd else np.zeros(n, bool)
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
                for key, _ in OWN:
                    own[key][~is_head] = rec[key][kids]
                    own[key][is_head] = dirs[key][kp[heads]]
                disc, blocks, seg = scan.add(seq_ino, own, seq_seg)
                np.add.at(seg_disc, seg, disc)
                np.add.at(seg_blocks, seg, blocks)
                has_seg[kp] = True

    def _placed(
        self, dirs: npt.NDArray[Any], count: I64, edges: list[tuple[I64, I64]]
    ) -> tuple[I64, I64, I64]:
        """Step 2: each directory's depth, subtree size (bottom-up) and walk position
        (top-down), one number each per directory; the rest goes when it returns."""
        nd = dirs.size
        d_ino = dirs["ino"]
        dpar = np.full(nd, -1, np.int64)
        if nd:
            at = np.minimum(np.searchsorted(d_ino, dirs["parent"]), nd - 1)
            ok = (dirs["parent"] >= 0) & (d_ino[at] == dirs["parent"])
            dpar[ok] = at[ok]
        roots = np.flatnonzero(d_ino == self.root)
        dep = depths_below(dpar, roots) if nd else np.zeros(0, np.int64)
        size = np.where(dep >= 0, 1 + count, 0).astype(np.int64)
        e_q = np.concatenate([e[0] for e in edges]) if edges else np.zeros(0, np.int64)
        e_j = np.concatenate([e[1] for e in edges]) if edges else np.zeros(0, np.int64)
        maxdep = int(dep.max()) if nd and (dep >= 0).any() else 0
        for d in range(maxdep, 0, -1):
            at = e_q[dep[e_q] == d]
            np.add.at(size, dpar[at], size[at] - 1)
        offset = np.zeros(nd, np.int64)
        if e_q.size:
            by = np.lexsort((e_j, dpar[e_q]))
            q, jj = e_q[by], e_j[by]
            extra = size[q] - 1
            grp = dpar[q]
            csum = np.cumsum(extra) - extra
            gs = np.ones(q.size, bool)
            gs[1:] = grp[1:] != grp[:-1]
            base = np.maximum.accumulate(np.where(gs, np.arange(q.size), 0))
            offset[q] = jj + csum - csum[base]
        pos = np.full(nd, -1, np.int64)
        pos[roots] = 0
        for d in range(1, maxdep + 1):
            at = np.flatnonzero(dep == d)
            pos[at] = pos[dpar[at]] + 1 + offset[at]
        return dep, size, pos

    def finish(
        self,
        trim: Callable[[], None] | None = None,
        progress: Callable[[float], None] | None = None,
    ) -> dict[str, Any]:
        """``progress(share)``: called as the buckets are read (a third of it a step)."""

        def done(step: int, at: int, of: int) -> None:
            if progress is not None:
                progress((step + at / max(of, 1)) / 3)

        dirs = np.fromfile(self.dirs, REC)
        self.dirs.unlink()
        # in place (a directory's record is written once, so no two share an inode and the
        # order is the stable one): a sorted copy would hold the records twice
        dirs.sort(order="ino")
        nd = dirs.size
        d_ino = dirs["ino"]
        # 1. every directory's entries in walk order, without their names
        walked, count, edges = self._in_walk_order(d_ino, done)
        if trim is not None:
            trim()
        # 2. subtree sizes bottom-up, positions top-down (one number per directory)
        dep, size, pos = self._placed(dirs, count, edges)
        del count, edges
        if trim is not None:
            trim()  # step 2's arrays: step 3 keeps three of them
        # 3. entries in walk order: positions, gaps, every directory's own scan
        by_pos = Buckets(self.tmp, "pos", POS_REC)
        gaps = np.zeros(len(GAP_BUCKETS), np.int64)
        seg_disc = np.zeros(nd, np.int64)
        seg_blocks = np.zeros(nd, np.int64)
        has_seg = np.zeros(nd, bool)
        scan = Scan.new(self.tabs)
        self._walk_windows(walked, done, dirs, (dep, size, pos), by_pos, gaps,
                           (seg_disc, seg_blocks, has_seg), scan)  # fmt: skip
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
