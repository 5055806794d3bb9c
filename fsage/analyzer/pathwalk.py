"""The path-order figures of a snapshot fed a part at a time, in bounded memory: the dynamic
layout score of a depth-first walk by name, each directory's own scan, and the gaps between
consecutive files of a directory (``dynamic.preorder_sizes``, ``directory_scans``,
``locality.neighbour_gaps``).

Each named file's record goes to a bucket file by its parent's inode range; a bucket at a time,
records are put in (parent, name, inode) order (a directory's entries as the walk takes them)
and written out without their names. Directory scans and gaps read that order straight; the
walk positions follow from each directory's subtree size, found in a scratch file
(``walktree``), and the objects, bucketed again by position, are read back in walk order. A
bucket of many windows (one directory of that many entries) is sorted in runs on disk and
merged (``namesort``). Nothing is kept a directory in memory: the directories' inodes, own
requests, entry counts and scan scores are files read a window at a time in inode order,
which is the order the walk takes the parents in.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from fsage.analyzer import spill
from fsage.analyzer.dynamic import _InodeTables, ranges, score_of_totals
from fsage.analyzer.locality import GAP_BUCKETS, gap_buckets
from fsage.analyzer.namesort import sorted_windows
from fsage.analyzer.objects import OWN, Scan
from fsage.analyzer.spill import AscendingLookup, Buckets, Values
from fsage.analyzer.walktree import DirTree

I64 = npt.NDArray[np.int64]

REC = np.dtype(
    [("parent", "<i8"), ("ino", "<i8"), ("kind", "u1"), ("first", "<i8"), ("last", "<i8"), *OWN]
)
POS_REC = np.dtype([("pos", "<i8"), ("ino", "<i8"), ("kind", "u1"), *OWN])
OWN_REC = np.dtype(OWN)
COUNT = np.dtype([("idx", "<i8"), ("n", "<i8")])  # entries of a directory (by index)
REGULAR, DIRECTORY = 1, 2
# Windows (or buckets) of a step between two trims of the heap: a window's arrays, freed, left
# pieces between longer-lived ones that the next window's did not fit, and the walk's peak
# grew with the snapshot.
TRIM_WINDOWS = 8


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


def _sort_by_ino(path: Path) -> None:
    """The directories' records in inode order. The parts come in inode order, so they are
    (a window at a time checked); were they not, they are sorted in memory."""
    last = -1
    width = max(spill.WINDOW, 1)
    with open(path, "rb") as f:
        while (w := np.fromfile(f, REC, width)).size:
            ino = w["ino"]
            if int(ino[0]) <= last or (ino[1:] <= ino[:-1]).any():
                break
            last = int(ino[-1])
        else:
            return
    dirs = np.fromfile(path, REC)
    dirs.sort(order="ino")
    dirs.tofile(path)


def _fill(tree: DirTree, d_ino: Values, d_parent: Values, counts: Values) -> None:
    """The directories to ``tree`` a window at a time, with their entries (``counts``: by
    directory, ascending)."""
    pending = np.zeros(0, COUNT)
    pieces = counts.windows()
    width = max(spill.WINDOW, 1)
    for lo in range(0, d_ino.n, width):
        hi = min(lo + width, d_ino.n)
        cnt = np.zeros(hi - lo, np.int64)
        while True:
            below = int(np.searchsorted(pending["idx"], hi))
            np.add.at(cnt, pending["idx"][:below] - lo, pending["n"][:below])
            pending = pending[below:]
            if pending.size:
                break
            pending = next(pieces, np.zeros(0, COUNT))
            if pending.size == 0:
                break
        tree.add_dirs(d_ino.read(lo, hi), d_parent.read(lo, hi), cnt)
    tree.link_parents()


class _DirScans:
    """Each directory's own scan, from its objects' seeks and blocks fed in directory order
    (a directory's may run over windows): the scores go to disk for their median."""

    def __init__(self, path: Path) -> None:
        self.scores = Values(path, np.float64)
        self.open: tuple[int, int, int] | None = None  # a directory, its seeks and blocks
        self.disc = 0  # over directories with blocks
        self.blocks = 0

    def add(self, disc: I64, blocks: I64, seg: I64) -> None:
        if seg.size == 0:
            return
        heads = np.flatnonzero(np.diff(seg, prepend=seg[0] - 1))
        d = np.add.reduceat(disc, heads)
        b = np.add.reduceat(blocks, heads)
        u = seg[heads]
        if self.open is not None:
            if int(u[0]) == self.open[0]:
                d[0] += self.open[1]
                b[0] += self.open[2]
            else:
                self._close(np.array([self.open[1]]), np.array([self.open[2]]))
        self.open = (int(u[-1]), int(d[-1]), int(b[-1]))
        self._close(d[:-1], b[:-1])

    def _close(self, disc: I64, blocks: I64) -> None:
        ok = blocks > 0
        self.disc += int(disc[ok].sum())
        self.blocks += int(blocks[ok].sum())
        self.scores.add(1.0 - disc[ok] / blocks[ok])

    def flush(self) -> None:
        if self.open is not None:
            self._close(np.array([self.open[1]]), np.array([self.open[2]]))
            self.open = None

    def figures(self) -> dict[str, float | None]:
        n = self.scores.n
        out = {
            "aggregate": 1.0 - self.disc / self.blocks if n else None,
            "median": self.scores.median() if n else None,
        }
        self.scores.path.unlink()
        return out


def bucket_starts(entries: npt.NDArray[Any]) -> I64:
    """Where the walk's buckets start among the sorted inodes that name entries, given how
    many names each holds: about a window's entries a bucket (one directory's entries are
    sorted together, however many). Counted a window of directories at a time: the running
    totals of all would take eight bytes a directory."""
    window = max(spill.WINDOW, 1)
    out: list[I64] = []
    carry = 0
    for lo in range(0, entries.size, window):
        total = carry + np.cumsum(entries[lo : lo + window], dtype=np.int64)
        crossed = np.diff(total // window, prepend=carry // window)
        out.append(lo + np.flatnonzero(crossed))
        carry = int(total[-1])
    return np.concatenate(out) if out else np.zeros(0, np.int64)


class PathWalk:
    def __init__(self, tmp: Path, tabs: _InodeTables | None, root: int, bs: int,
                 group_blocks: int | None, cuts: I64) -> None:  # fmt: skip
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
        # buckets by ranges of parents (their order is the parents' order), from each of
        # ``cuts`` on (``bucket_starts``)
        self.cuts = cuts

    def add(self, rec: npt.NDArray[Any], name_row: I64, name_off: Any, names: bytes,
            holds: npt.NDArray[np.bool_]) -> None:  # fmt: skip
        """Records of a part's files (``parent`` -1: not named in the walk), with the row of
        each one's first name; ``holds``: which of them name entries."""
        ino = rec["ino"]
        if holds.any():
            with open(self.dirs, "ab") as f:
                rec[holds].tofile(f)
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

    def _in_walk_order(
        self, d_ino: Values, kinds: list[int], tree: DirTree, done: Callable[[int, int, int], None]
    ) -> tuple[Values, Values]:
        """Step 1: the entries, a bucket at a time, in walk order to ``walked``; the entries
        that may name a directory (of a kind the directories are) to ``tree``; how many
        entries each directory holds (``COUNT`` records by directory, a directory's entries
        in pieces where they run over windows)."""
        walked = Values(self.tmp / "walked", REC)  # type: ignore[arg-type]
        counts = Values(self.tmp / "dirs-count", COUNT)  # type: ignore[arg-type]
        find = AscendingLookup(d_ino)  # the walk takes the parents in inode order
        kids = sorted(self.kids.used)  # (``load`` takes each from ``used``)
        width = max(spill.WINDOW, 1)
        for i, k in enumerate(kids):
            done(0, i, len(kids))
            # one directory's entries may run over windows: its index among them carries
            carry = (-1, 0)  # the last window's last parent, and its entries so far
            for rec in sorted_windows(self.kids, k, width):
                seq = walked.n + np.arange(rec.size, dtype=np.int64)
                walked.add(rec)
                par = rec["parent"].astype(np.int64)
                p = find.find(par)
                grp_start = np.ones(par.size, bool)
                grp_start[1:] = par[1:] != par[:-1]
                heads = np.flatnonzero(grp_start)
                got = np.zeros(heads.size, COUNT)
                got["idx"], got["n"] = p[heads], np.diff(heads, append=par.size)
                counts.add(got)
                first_of = np.maximum.accumulate(np.where(grp_start, np.arange(par.size), 0))
                index = np.arange(par.size) - first_of
                if int(par[0]) == carry[0]:
                    index[first_of == 0] += carry[1]
                carry = (int(par[-1]), int(index[-1]) + 1)
                may = np.flatnonzero(np.isin(rec["kind"], kinds))
                tree.add_candidates(seq[may], rec["ino"][may].astype(np.int64), index[may])
        return walked, counts

    def _walk_windows(
        self,
        walked: Values,
        done: Callable[[int, int, int], None],
        d_ino: Values,
        own_dirs: Values,
        tree: DirTree,
        by_pos: Buckets,
        gaps: I64,
        scans: _DirScans,
        scan: Scan,
    ) -> None:
        """Step 3: the entries in walk order, a window at a time: their positions (to
        ``by_pos``), the gaps between neighbours, every directory's own scan (to ``scans``;
        its directory's own requests are rows of ``own_dirs``, read as the scans begin: the
        walk takes the parents in inode order)."""
        width = max(spill.WINDOW, 1)
        find = AscendingLookup(d_ino)
        carry = (-1, 0, 0)  # the last directory, its next entry index, the extra before it
        last_file: tuple[int, int] | None = None  # (directory, last block) of a regular file
        opened = -1  # the directory whose own scan has begun
        for i, rec in enumerate(walked.windows()):
            done(1, i * spill.WINDOW, walked.n)
            n = rec.size
            lo = i * spill.WINDOW
            par = rec["parent"]
            p = find.find(par.astype(np.int64))
            first_p = int(p[0])
            reached_at, pos_at = tree.placed(first_p, int(p[-1]))
            if reached_at.size == 0:  # no directory: nothing is reached
                reached_at, pos_at = np.zeros(1, bool), np.zeros(1, np.int64)
                p = np.full(n, first_p)
            reach = reached_at[p - first_p]
            extra = np.zeros(n, np.int64)
            e_seq, e_size = tree.edge_sizes(lo, lo + n)
            extra[e_seq - lo] = e_size - 1
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
                carry = (int(par[-1]), int(j[-1]) + 1, int(ex[-1] + extra[-1]))
            rpos = pos_at[p - first_p] + 1 + j + ex
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
                seq_ino[is_head] = _rows(d_ino, kp[heads])
                seq_seg[~is_head] = kp
                seq_seg[is_head] = kp[heads]
                head_own = _rows(own_dirs, kp[heads])
                for key, _ in OWN:
                    own[key][~is_head] = rec[key][kids]
                    own[key][is_head] = head_own[key]
                del head_own
                scans.add(*scan.add(seq_ino, own, seq_seg))

    def _directories(self) -> tuple[Values, Values, Values, list[int]]:
        """The directories by inode: their inodes, their parents' inodes and, on disk, their
        own requests (read back as step 3 needs them); the kinds they are of."""
        _sort_by_ino(self.dirs)
        d_ino = Values(self.tmp / "dirs-ino", np.int64)
        d_parent = Values(self.tmp / "dirs-parent", np.int64)
        own_dirs = Values(self.tmp / "dirs-own", OWN_REC)  # type: ignore[arg-type]
        kinds: set[int] = set()
        width = max(spill.WINDOW, 1)
        with open(self.dirs, "rb") as f:
            while (dirs := np.fromfile(f, REC, width)).size:
                d_ino.add(dirs["ino"])
                d_parent.add(dirs["parent"])
                kinds.update(np.unique(dirs["kind"]).tolist())
                part = np.empty(dirs.size, OWN_REC)
                for key, _ in OWN:
                    part[key] = dirs[key]
                own_dirs.add(part)
        self.dirs.unlink()
        return d_ino, d_parent, own_dirs, sorted(kinds)

    def finish(
        self,
        trim: Callable[[], None] | None = None,
        progress: Callable[[float], None] | None = None,
    ) -> dict[str, Any]:
        """``progress(share)``: called as the buckets are read (a third of it a step);
        ``trim``: gives freed memory back, between the steps and every ``TRIM_WINDOWS``
        windows or buckets of each."""
        windows = 0

        def done(step: int, at: int, of: int) -> None:
            nonlocal windows
            windows += 1
            if trim is not None and windows % TRIM_WINDOWS == 0:
                trim()
            if progress is not None:
                progress((step + at / max(of, 1)) / 3)

        tree = DirTree(self.tmp / "tree.db")
        try:
            d_ino, d_parent, own_dirs, kinds = self._directories()
            # 1. every directory's entries in walk order, without their names
            walked, counts = self._in_walk_order(d_ino, kinds, tree, done)
            if trim is not None:
                trim()
            # 2. subtree sizes bottom-up, positions top-down (in the tree's file)
            _fill(tree, d_ino, d_parent, counts)
            tree.place(self.root)
            # 3. entries in walk order: positions, gaps, every directory's own scan
            by_pos = Buckets(self.tmp, "pos", POS_REC)
            gaps = np.zeros(len(GAP_BUCKETS), np.int64)
            scans = _DirScans(self.tmp / "dir-scans")
            scan = Scan.new(self.tabs)
            self._walk_windows(walked, done, d_ino, own_dirs, tree, by_pos, gaps, scans, scan)
            scans.flush()
        finally:
            tree.close()
        for values in (d_ino, d_parent, counts, own_dirs, walked):
            values.path.unlink()
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
        npairs = int(gaps.sum())
        nd_out: dict[str, Any] = {"pairs": npairs}
        for i, name in enumerate(GAP_BUCKETS):
            known = name != "le_group" or self.group_blocks is not None
            nd_out[f"{name}_share"] = float(gaps[i]) / npairs if npairs and known else None
        return {
            "path": score_of_totals(p_disc, p_blocks, path.requests),
            "directory_scan": scans.figures(),
            "neighbour_distance": nd_out,
        }
