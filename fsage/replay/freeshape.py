"""The free-space geometry the closed loop shapes: how far two free spaces are by the count of
their extents, and the windows of the disk (free extents and the files between them) whose
files, moved elsewhere, leave one free extent of a wanted size (``join_windows``) or one for
several small ones (``merge_windows``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from fsage.analyzer.freespace import MAX_BUCKET

if TYPE_CHECKING:
    from fsage.ager.match_target import LayoutTarget


def count_distance(want: LayoutTarget, have: LayoutTarget) -> float:
    """How far two free spaces are by the count of their free extents per bucket: the
    extents that would have to appear or go over all extents of both (Bray-Curtis, as
    ``fsage.replay.fidelity`` judges a recreation by extents)."""
    keys = set(want.free_counts) | set(have.free_counts)
    total = sum(want.free_counts.values()) + sum(have.free_counts.values())
    diff = sum(abs(want.free_counts.get(k, 0) - have.free_counts.get(k, 0)) for k in keys)
    return diff / total if total else 0.0


def join_windows(
    free_start: np.ndarray,
    free_len: np.ndarray,
    spans: list[tuple[int, int, str]],
    short: dict[int, int],
) -> list[list[str]]:
    """Windows of the disk that start and end with a free extent and hold between them only
    free extents and whole files of one extent each (``spans``: start, end, path), whose
    length falls in a free-extent bucket (log2 of blocks) that ``short`` lacks blocks of:
    the files of each, moved away, leave the window one free extent. Largest buckets first;
    windows do not overlap; at most a quarter of a window's blocks are files' (moving more
    costs more writes than the hole is worth). ``short`` is decreased by what they give."""
    chains = _chains(free_start, free_len, spans)
    out: list[list[str]] = []
    used: set[tuple[int, int]] = set()  # (chain, item) taken
    for k in sorted(short, reverse=True):
        lo, hi = 1 << k, (2 << k) - 1 if k < MAX_BUCKET else 1 << 62
        for c, chain in enumerate(chains):
            free = [i for i, it in enumerate(chain) if not it[2]]
            i = 0
            while i < len(free) and short.get(k, 0) > 0:
                got = None
                for j in range(i + 1, len(free)):
                    if (c, free[j]) in used:
                        break
                    length = chain[free[j]][1] - chain[free[i]][0]
                    if length > hi:
                        break
                    moved = sum(it[1] - it[0] for it in chain[free[i] : free[j]] if it[2])
                    if length >= lo and 4 * moved <= length:
                        got = j, length
                        break
                if got is None or (c, free[i]) in used:
                    i += 1
                    continue
                j, length = got
                out.append([it[2] for it in chain[free[i] : free[j]] if it[2]])
                used.update((c, m) for m in range(free[i], free[j] + 1))
                short[k] -= length
                i = j + 1
    return out


def _chains(
    free_start: np.ndarray, free_len: np.ndarray, spans: list[tuple[int, int, str]]
) -> list[list[tuple[int, int, str]]]:
    """Runs of the disk where free extents and ``spans`` (files: start, end, path; a free
    extent has no path) follow one another without a gap, in disk order."""
    items = sorted([(int(a), int(a + n), "") for a, n in zip(free_start, free_len, strict=True)]
                   + spans)  # fmt: skip
    chains: list[list[tuple[int, int, str]]] = []
    for it in items:
        if chains and chains[-1][-1][1] == it[0]:
            chains[-1].append(it)
        else:
            chains.append([it])
    return chains


def merge_windows(
    free_start: np.ndarray,
    free_len: np.ndarray,
    spans: list[tuple[int, int, str]],
    excess: dict[int, int],
    longest: int,
    share: float = 0.5,
) -> list[list[str]]:
    """Windows (as ``join_windows``'s) of at most ``longest`` blocks, files at most ``share``
    of each, that hold two or more free extents of the buckets ``excess`` counts too many
    of: the files moved away, each leaves one free extent for several. From each start in a
    run of the disk the window holding the most of them is taken; no more than ``excess``
    asks (decreased by what they take)."""
    out: list[list[str]] = []
    for chain in _chains(free_start, free_len, spans):
        free = [i for i, it in enumerate(chain) if not it[2]]
        i = 0
        while i < len(free) - 1 and sum(excess.values()) > 0:
            a = chain[free[i]][0]
            moved = 0
            best: tuple[int, list[int]] | None = None
            ks = [bucket_of_length(chain[free[i]][1] - a)]
            for j in range(i + 1, len(free)):
                length = chain[free[j]][1] - a
                if length > longest:
                    break
                moved += sum(it[1] - it[0] for it in chain[free[j - 1] + 1 : free[j]])
                ks.append(bucket_of_length(chain[free[j]][1] - chain[free[j]][0]))
                if moved > share * length:
                    continue
                many = [k for k in ks if excess.get(k, 0) > 0]
                if len(many) >= 2 and (best is None or len(many) > len(best[1])):
                    best = j, many
            if best is None:
                i += 1
                continue
            j, many = best
            out.append([it[2] for it in chain[free[i] : free[j]] if it[2]])
            for k in many[1:]:
                excess[k] -= 1
            i = j + 1
    return out


def bucket_of_length(n: int) -> int:
    """The free-extent bucket (log2 of its blocks, e2freefrag's) of an extent of ``n`` blocks."""
    return min(n.bit_length() - 1, MAX_BUCKET)


__all__ = ["bucket_of_length", "count_distance", "join_windows", "merge_windows"]
