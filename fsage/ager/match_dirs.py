"""The shape of the matcher's tree (``fsage age T --match``): how many files go to a
directory of files, and how many directories of directories stand above them.

A path-order read (``grep -r``, tar, a backup) jumps to each directory holding files and back
to its first file, while a directory read right after its parent is most often next to it
(a checkout makes them one after the other), and a file after its neighbour as often as the
target's pairs of consecutive files are adjacent. So the directories of files are made as
many as give the target's jumps, and the rest of the target's directories are their parents:
a Django checkout has 1.5 files per directory but 2.6 per directory of files as its read
counts them; matched with the first, its path-order read scored 0.135 lower.
"""

from __future__ import annotations

from fractions import Fraction

from fsage.ager.match_target import LayoutTarget


def _fraction(x: float) -> Fraction:
    return Fraction(round(x * 64), 64)


def tree_shape(
    target: LayoutTarget,
    levels: int,
    per_dir: int,
    nest: int,
    other: float = 0.0,
    places: int = 0,
) -> tuple[Fraction, Fraction]:
    """(files per directory of files, directories per parent directory) for a tree of
    ``levels`` levels of parents above the directories of files (none: one level of
    directories). ``per_dir``: the most files to a directory is four times it; ``nest``:
    the parents' fan-out where the target does not say (an older target, without its
    pairs), parents counted in its files per directory. ``other``: jumps the fill's read
    will have that are not the tree's (its wall files); ``places``: the files the fill
    places in its tree, where more than the target's (its walls)."""
    loc = target.locality
    fpd = float(loc.get("files_per_directory") or per_dir)
    top = per_dir * 4.0
    # One level (xfs, whose directories are placed one by one; a shallow target), or a
    # target that does not say: whole numbers of files of at least 4, parents counted.
    counted = fpd * (1 + 1 / (nest - 1)) if levels else fpd
    whole = Fraction(max(4, min(per_dir * 4, round(counted))))
    if not levels:
        return whole, Fraction(nest)
    files = sum(n for n, _s in target.buckets.values())
    pairs, dirs = int(loc.get("pairs") or 0), int(loc.get("directories") or 0)
    score, blocks = loc.get("dynamic_score"), float(loc.get("read_blocks") or 0)
    holding = files - pairs  # at most one directory per file not paired with the one before
    if not (pairs and holding > 0 and dirs > holding and score is not None and blocks):
        return whole, Fraction(nest)
    # Jumps inside files (fragmented buckets) are not the tree's.
    inside = sum(
        (1.0 - (sc if sc is not None else 1.0)) * max(target.bucket_blocks.get(k, 0) - n, 0)
        for k, (n, sc) in target.buckets.items()
    )
    jumps = (1.0 - float(score)) * blocks - inside - other
    apart = 1.0 - float(loc.get("adjacent", 1.0))
    # jumps = 2 * leaves + (files - leaves) * apart
    leaves = (jumps - files * apart) / (2.0 - apart)
    leaves = min(max(leaves, holding / 2), holding)
    # About leaves / (nest - 1) parents, all levels counted, for the rest of the directories.
    rest = (dirs - leaves) / leaves
    fan = min(max(1 + 1 / rest, 1.25), 64.0)
    placed = max(places, files)
    return _fraction(min(max(placed / leaves, 1.0), top)), _fraction(fan)
