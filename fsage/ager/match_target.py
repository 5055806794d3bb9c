"""What ``fsage age --match`` aims at and how near a file system is to it.

A layout target is files and layout score per size bucket (seed 000 buckets of blocks), the
free-space histogram (free blocks per log2 extent length, e2freefrag's buckets) and the
fullness, taken from a stored snapshot or a JSON file. ``measure`` reads the same from a
``Layout``; ``compare`` judges one against the other.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fsage.analyzer.analysis import bucket_range, size_bucket
from fsage.analyzer.freespace import MAX_BUCKET, merge_runs
from fsage.analyzer.scores import file_scores
from fsage.errors import UsageError
from fsage.layout import Layout
from fsage.text import size_range

SCORE_TOL = 0.02
FREE_TV = 0.1
MIN_FILES = 50
#: How far the fullness left on disk may be from the target's.
FULLNESS_TOL = 0.01
#: How far the path-order dynamic layout score may be from the target's.
DYNAMIC_TOL = 0.02


@dataclass
class LayoutTarget:
    """What a layout is matched on (see the module doc)."""

    block_size: int
    blocks_total: int
    fullness: float
    #: size bucket k -> (files, layout score or None); k = 0: one-block files.
    buckets: dict[int, tuple[int, float | None]]
    #: log2 free-extent bucket -> free blocks.
    free: dict[int, int]
    source: str = ""
    #: The file-system family the target was read from ("ext", "xfs", "btrfs", "lfs"; "":
    #: not said, as in a hand-written JSON target).
    kind: str = ""
    #: Placement between files and the tree's shape (``locality_of``); {}: not known.
    locality: dict[str, Any] = field(default_factory=dict)
    #: size bucket k -> blocks its files hold; {}: not known (older JSON targets).
    bucket_blocks: dict[int, int] = field(default_factory=dict)
    #: log2 free-extent bucket -> free extents; {}: not known (older JSON targets).
    free_counts: dict[int, int] = field(default_factory=dict)

    def free_mean(self, k: int) -> float | None:
        """The mean length of the target's free extents of bucket ``k``, where known."""
        n = self.free_counts.get(k)
        return self.free.get(k, 0) / n if n else None

    def free_fractions(self) -> dict[int, float]:
        total = sum(self.free.values())
        return {k: v / total for k, v in self.free.items()} if total else {}

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "kind": self.kind,
            "locality": self.locality,
            "block_size": self.block_size,
            "blocks_total": self.blocks_total,
            "fullness": self.fullness,
            "size_buckets": [
                {
                    "min_blocks": bucket_range(k)[0],
                    "max_blocks": bucket_range(k)[1],
                    "files": n,
                    "layout_score": s,
                    **({"blocks": self.bucket_blocks[k]} if k in self.bucket_blocks else {}),
                }
                for k, (n, s) in sorted(self.buckets.items())
            ],
            "free_extents": [
                {
                    "min_blocks": 1 << k,
                    "blocks": b,
                    **({"extents": self.free_counts[k]} if k in self.free_counts else {}),
                }
                for k, b in sorted(self.free.items())
            ],
        }

    @classmethod
    def from_json(cls, data: Any, source: str = "JSON target") -> LayoutTarget:
        """The form ``to_json`` writes; ``fsage analyze --format json`` output also works
        (its ``by_size`` and ``free`` parts)."""
        try:
            rows = data.get("size_buckets", data.get("by_size"))
            free = data.get("free_extents")
            if free is None and isinstance(data.get("free"), dict):
                free = data["free"].get("free_extents")
            summary = data.get("summary", {})
            bs = int(data.get("block_size", summary.get("block_size", 4096)))
            total = int(data.get("blocks_total", summary.get("blocks_total", 0)))
            fullness = float(data.get("fullness", summary.get("fullness", 0.0)))
            buckets: dict[int, tuple[int, float | None]] = {}
            bucket_blocks: dict[int, int] = {}
            for r in rows or []:
                k = int(size_bucket(np.array([int(r["max_blocks"])]))[0])
                score = r.get("layout_score")
                buckets[k] = (int(r["files"]), None if score is None else float(score))
                if r.get("blocks") is not None:
                    bucket_blocks[k] = int(r["blocks"])
            free_h: dict[int, int] = {}
            free_n: dict[int, int] = {}
            for r in free or []:
                k = min(int(r["min_blocks"]).bit_length() - 1, MAX_BUCKET)
                free_h[k] = free_h.get(k, 0) + int(r["blocks"])
                if r.get("extents") is not None:
                    free_n[k] = free_n.get(k, 0) + int(r["extents"])
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise UsageError(f"{source}: not a layout target ({exc})") from None
        if not buckets or not 0.0 < fullness < 1.0:
            raise UsageError(
                f"{source}: a layout target needs size_buckets and a fullness in (0, 1)"
            )
        kind = fs_family(str(data.get("kind", summary.get("kind", ""))))
        loc = data.get("locality") or {}
        if not isinstance(loc, dict):
            raise TypeError("locality is not an object")
        return cls(
            bs, total, fullness, buckets, free_h, source, kind, dict(loc), bucket_blocks,
            free_n if set(free_n) == set(free_h) else {},
        )  # fmt: skip


@dataclass
class MeasuredState:
    """A measured layout, with per-file arrays for choosing what to rewrite."""

    target: LayoutTarget  # the measured layout in target form
    ino: np.ndarray
    blocks: np.ndarray
    cont: np.ndarray
    den: np.ndarray
    frags: np.ndarray
    first: np.ndarray
    bucket: np.ndarray
    free_start: np.ndarray
    free_len: np.ndarray
    cont_k: dict[int, int] = field(default_factory=dict)
    den_k: dict[int, int] = field(default_factory=dict)
    #: False where the reader cannot see free space (btrfs has no GETFSMAP).
    free_known: bool = True


def fs_family(kind: str) -> str:
    """ "ext" for ext2/3/4 (read offline or live), else the kind without its "live:" prefix."""
    k = kind.removeprefix("live:").lower()
    return "ext" if k.startswith("ext") else k


def check_target(target: LayoutTarget, where: str, kind: str, block_size: int, most: float) -> None:
    """Refuse, in one line, a target the file system at ``where`` (of ``kind``, with blocks of
    ``block_size`` bytes) cannot be aged to: one of
    another block size (layout scores and free extents count blocks, so they do not scale),
    an LFS layout for another file system or another's for LFS, without files, or fuller
    than ``most`` (what the matcher fills to at most)."""
    src = target.source or "the target"
    if target.block_size != block_size:
        raise UsageError(
            f"{src} has {target.block_size}-byte blocks, {where} {block_size}-byte ones: "
            "layout scores and free extents count blocks and are not scaled; make the file "
            f"system with the target's block size (mkfs -b {target.block_size})"
        )
    # ext4, xfs and btrfs targets are matched on one another (their layouts are blocks of
    # files and free extents alike); a log-structured layout (segments, a log written in
    # order) is not that of an update-in-place file system, nor the other way round.
    family = fs_family(kind)
    if target.kind and family and target.kind != family and "lfs" in (target.kind, family):
        raise UsageError(
            f"{src} is a layout of {target.kind}, {where} is {family}: a log-structured "
            "layout and an update-in-place one are not matched on each other"
        )
    if not any(n for n, _s in target.buckets.values()):
        raise UsageError(f"{src} holds no files: nothing to match")
    if target.fullness > most:
        raise UsageError(
            f"{src} is {target.fullness:.3f} full; the matcher fills {where} to at most "
            f"{most:.2f} (it needs room to rewrite files)"
        )


def check_room(target: LayoutTarget, where: str, fullness: float) -> None:
    """Refuse a target emptier than the file system at ``where`` already is (``fullness``):
    the matcher adds files of its own and deletes none of the others."""
    if fullness > target.fullness + FULLNESS_TOL:
        raise UsageError(
            f"{where} is already {fullness:.3f} full, the target {target.fullness:.3f}: "
            "the matcher only adds files of its own"
        )


def measure(layout: Layout, source: str = "") -> MeasuredState:
    files = layout.files
    reg = files.is_regular()
    sc = file_scores(files)
    blocks = sc.blocks[reg]
    cont = sc.contiguous[reg]
    den = sc.denominator[reg]
    k = size_bucket(blocks)
    buckets: dict[int, tuple[int, float | None]] = {}
    cont_k: dict[int, int] = {}
    den_k: dict[int, int] = {}
    held: dict[int, int] = {}
    for b in np.unique(k[k >= 0]).tolist():
        sel = k == b
        c, d = int(cont[sel].sum()), int(den[sel].sum())
        buckets[int(b)] = (int(sel.sum()), c / d if d else None)
        held[int(b)] = int(blocks[sel].sum())
        cont_k[int(b)], den_k[int(b)] = c, d
    fs, fl = merge_runs(layout.free)
    fk = np.minimum(np.frexp(fl.astype(np.float64))[1] - 1, MAX_BUCKET) if fl.size else fl
    free = {int(b): int(fl[fk == b].sum()) for b in np.unique(fk).tolist()}
    free_n = {int(b): int((fk == b).sum()) for b in np.unique(fk).tolist()}
    f = layout.facts
    # The free count the file system reports, as the fill's fullness reads it (statvfs on a
    # mount: ext4's reservations for open files count as free, as they are once it is
    # unmounted and read offline). Not on xfs: mounted read-write, it holds back a reserve
    # pool and per-group reservations (6-7% of a 512 MiB image) that statvfs counts as used
    # and that are free again once unmounted; its free-space map is what is left on disk.
    used = f.blocks_total - f.blocks_free
    if fs_family(f.kind) == "xfs" and f.free_space_known and fl.size:
        used = f.blocks_total - int(fl.sum())
    tgt = LayoutTarget(
        f.block_size, f.blocks_total, used / f.blocks_total if f.blocks_total else 0.0,
        buckets, free, source, fs_family(f.kind), locality_of(layout), held, free_n,
    )  # fmt: skip
    return MeasuredState(
        tgt, files.ino[reg].astype(np.int64), blocks, cont, den, sc.fragments[reg],
        sc.first_block[reg], k, fs, fl, cont_k, den_k, bool(f.free_space_known),
    )  # fmt: skip


def target_from_layout(layout: Layout, source: str) -> LayoutTarget:
    return measure(layout, source).target


def load_target(spec: str, db: Path | None) -> LayoutTarget:
    """A snapshot id (with ``db``) or a JSON target file."""
    if spec.isdigit():
        if db is None:
            raise UsageError("--match SNAPSHOT_ID needs --db")
        from fsage.db.store import Store

        with Store.open(db) as store:
            layout = store.load_layout(int(spec))
        return target_from_layout(layout, f"snapshot {spec} of {db}")
    path = Path(spec)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"{spec}: neither a snapshot id nor a JSON target file") from None
    except RecursionError:
        raise UsageError(f"{spec}: cannot read the JSON target (nested too deeply)") from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"{spec}: cannot read the JSON target ({exc})") from None
    return LayoutTarget.from_json(data, str(path))


# ---------------------------------------------------------------------------- comparing


def free_tv(a: dict[int, float], b: dict[int, float]) -> float:
    """Total-variation distance between two free-space histograms (fractions of blocks)."""
    keys = set(a) | set(b)
    return 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in keys)


def compare(target: LayoutTarget, now: LayoutTarget, free_known: bool = True) -> dict[str, Any]:
    """``now`` against ``target``; ``free_known`` False: the free space of ``now`` could
    not be read, so it is not judged and the state is never called matched."""
    rows = []
    for k, (n, s) in sorted(target.buckets.items()):
        if k == 0 or s is None:
            continue
        cn, cs = now.buckets.get(k, (0, None))
        judged = n >= MIN_FILES
        ok = cs is not None and abs(cs - s) <= SCORE_TOL
        rows.append(
            {
                "bucket": k,
                "min_blocks": bucket_range(k)[0],
                "max_blocks": bucket_range(k)[1],
                "label": size_range(*bucket_range(k), target.block_size),
                "target_files": n,
                "target_score": s,
                "files": cn,
                "score": cs,
                "judged": judged,
                "ok": ok or not judged,
            }
        )
    tv = free_tv(target.free_fractions(), now.free_fractions()) if free_known else None
    free_ok = tv is not None and tv <= FREE_TV
    fullness_ok = abs(now.fullness - target.fullness) <= FULLNESS_TOL
    want_dyn = target.locality.get("dynamic_score")
    have_dyn = now.locality.get("dynamic_score")
    # Judged where both reads were modeled alike: with the inode-table reads (an ext layout
    # read offline, or live with the image's geometry) or both without (xfs, btrfs).
    alike = target.locality.get("inode_reads") == now.locality.get("inode_reads")
    dynamic_ok = (
        want_dyn is None
        or not alike
        or (have_dyn is not None and abs(have_dyn - want_dyn) <= DYNAMIC_TOL)
    )
    return {
        "buckets": rows,
        "free_tv": tv,
        "free_ok": free_ok,
        "free_known": free_known,
        "buckets_ok": all(r["ok"] for r in rows),
        "fullness": now.fullness,
        "target_fullness": target.fullness,
        "fullness_ok": fullness_ok,
        "locality": now.locality,
        "target_locality": target.locality,
        "dynamic_ok": dynamic_ok,
        "matched": all(r["ok"] for r in rows) and free_ok and fullness_ok and dynamic_ok,
    }


def bucket_excess(rep: dict[str, Any]) -> float:
    """The worst judged size bucket's distance beyond its tolerance (0: all within)."""
    worst = 0.0
    for r in rep["buckets"]:
        if r["judged"]:
            d = 1.0 if r["score"] is None else abs(r["score"] - r["target_score"])
            worst = max(worst, d - SCORE_TOL)
    return worst


def distance(rep: dict[str, Any]) -> float:
    """How far a state is from the target: the largest of the worst judged bucket's excess
    over its tolerance, the free-space histogram's and the dynamic layout score's."""
    worst = bucket_excess(rep)
    free = 0.0 if rep["free_tv"] is None else rep["free_tv"] - FREE_TV
    want = rep.get("target_locality", {}).get("dynamic_score")
    have = rep.get("locality", {}).get("dynamic_score")
    judged = want is not None and have is not None and not rep.get("dynamic_ok", True)
    dyn = abs(have - want) - DYNAMIC_TOL if judged else 0.0
    return float(max(worst, free, dyn, 0.0))


# ---------------------------------------------------------------------------- locality


def locality_of(layout: Layout) -> dict[str, Any]:
    """Placement between files and the tree's shape: the modeled dynamic layout score of a
    path-order read of every directory and file (Conway's ``grep -r``), for consecutive files
    of one directory in path order the shares of the distances from one's last block to the
    next one's first (adjacent, within 1 MiB, within one group, farther), and the directory
    count, depth and files per directory."""
    from fsage.analyzer.dynamic import modeled_reads, walk_order
    from fsage.analyzer.locality import blocks_per_group, parent_index

    files = layout.files
    sc = file_scores(files)
    reg, dirs = files.is_regular(), files.is_dir()
    reads = modeled_reads(layout, sc, walk_order(layout, reg | dirs)).score()
    order = walk_order(layout, reg & (sc.blocks > 0))
    parent = parent_index(layout)
    runs = sc.runs
    last_run = runs.off[order + 1] - 1
    first = sc.first_block[order]
    last = runs.start[last_run] + runs.length[last_run] - 1
    same = parent[order[1:]] == parent[order[:-1]]
    dist = np.abs(first[1:] - last[:-1] - 1)[same]
    mib = max(1, (1 << 20) // layout.facts.block_size)
    group = blocks_per_group(layout) or 32768
    n = max(int(dist.size), 1)
    depth = _depths(parent, dirs)
    ndirs = int(dirs.sum())
    ipg = layout.facts.groups and all("inode_table" in g for g in layout.facts.groups)
    return {
        **inode_order(layout, walk_order(layout, reg | dirs), order, parent),
        "dynamic_score": reads["score"],
        "read_blocks": int(reads["blocks"]),
        "inode_reads": bool(ipg),
        "pairs": int(dist.size),
        "adjacent": float(np.count_nonzero(dist == 0) / n),
        "within_mib": float(np.count_nonzero((dist > 0) & (dist <= mib)) / n),
        "within_group": float(np.count_nonzero((dist > mib) & (dist <= group)) / n),
        "farther": float(np.count_nonzero(dist > group) / n),
        # How near the near ones are (median blocks): a 512 MiB git target's 43, its match's
        # 20, as the fill scatters them (a wider scattering window gave 39, but moved the
        # dynamic layout score of a 128 MiB target by 0.022).
        "near_gap": float(np.median(dist[(dist > 0) & (dist <= mib)]))
        if np.any((dist > 0) & (dist <= mib))
        else None,
        "directories": ndirs,
        "max_depth": int(depth.max()) if depth.size else 0,
        "files_per_directory": float(reg.sum() / max(ndirs, 1)),
    }


def inode_order(
    layout: Layout, objs: np.ndarray, files: np.ndarray, parent: np.ndarray
) -> dict[str, Any]:
    """Where a path-order read finds the inodes (``objs``: directories and files in path
    order; ``files``: the regular files in path order): ``inode_switches``, the share of
    objects whose inode lies in another inode-table readahead window than the previous
    one's (each a request, and a re-read once the window has left the cache); for
    consecutive files of one directory, ``inode_window``, the share in the same window; and
    ``in_directory_group``, the share of files whose inode is in their directory's group
    (ext). A tree written in path order (a checkout, an unpack) has its inodes side by
    side whatever its data's scatter; files made in another order have them apart, and
    read as many more inode-table requests as the dynamic layout score hides (the blocks
    they read raise it)."""
    from fsage.analyzer.dynamic import INODE_READAHEAD_BLOCKS
    from fsage.analyzer.locality import fact, inodes_per_group

    ino = layout.files.ino.astype(np.int64)
    isize = int(fact(layout, "inode_size", "s_inode_size") or 256)
    per_window = INODE_READAHEAD_BLOCKS * max(layout.facts.block_size // max(isize, 1), 1)
    ipg = inodes_per_group(layout) or 0
    # Windows do not cross a group's inode table (ext): a group's inodes are numbered apart.
    local = (ino - 1) % ipg if ipg else ino - 1
    window = ((ino - 1) // ipg if ipg else 0) * (1 << 32) + local // per_window
    w = window[objs]
    switches = float(np.count_nonzero(w[1:] != w[:-1]) / max(w.size - 1, 1))
    same = parent[files[1:]] == parent[files[:-1]]
    pair = (window[files[1:]] == window[files[:-1]])[same]
    out: dict[str, Any] = {
        "inode_switches": switches,
        "inode_window": float(pair.mean()) if pair.size else None,
    }
    if ipg:
        has = parent[files] >= 0
        grp = (ino - 1) // ipg
        mine = grp[files][has] == grp[parent[files][has]]
        out["in_directory_group"] = float(mine.mean()) if mine.size else None
    return out


def _depths(parent: np.ndarray, dirs: np.ndarray) -> np.ndarray:
    """Depth of every directory below the root (the root: 0), through ``parent``."""
    idx = np.flatnonzero(dirs)
    depth = np.zeros(idx.size, np.int64)
    cur = parent[idx]
    for _ in range(4096):
        live = cur >= 0
        if not live.any():
            break
        depth[live] += 1
        cur = np.where(live, parent[np.maximum(cur, 0)], -1)
    return depth
