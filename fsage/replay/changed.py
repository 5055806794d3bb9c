"""What a snapshot says its interval wrote: the files it changed (the closed loop's candidates
for unseen rewrites) and the evidence of rewrites no snapshot saw."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fsage.layout import Layout

#: A layout's paths by inode (``Layout.paths``, or a cache of it: deriving them costs a tenth
#: of a second on a tree of 8,000 names).
PathsOf = Callable[[Layout], dict[int, list[str]]]


def _paths(layout: Layout) -> dict[int, list[str]]:
    return layout.paths()


def evidence(
    prev: Layout | None, now: Layout, prev_ns: int | None, paths: PathsOf | None = None
) -> dict[str, int]:
    """What in snapshot ``now`` says files were rewritten since ``prev``: paths that hold a new
    inode with the old size and modification time, and files modified after ``prev``."""
    f = now.files
    reg = f.is_regular()
    out = {"files": int(reg.sum()), "modified_since": 0, "renewed_unchanged": 0, "new_inodes": 0}
    if prev is None or prev_ns is None:
        out["modified_since"] = out["new_inodes"] = out["files"]
        return out
    out["modified_since"] = int(np.count_nonzero(reg & (f.mtime > prev_ns)))
    old: dict[str, tuple[int, int, int]] = {}
    pf = prev.files
    pidx = {int(i): k for k, i in enumerate(pf.ino.tolist())}
    paths_of = paths or _paths
    preg = pf.is_regular()
    for ino, paths_ in paths_of(prev).items():
        k = pidx.get(ino)
        if k is not None and preg[k]:
            for p in paths_:
                old[p] = (ino, int(pf.size[k]), int(pf.mtime[k]))
    nidx = {int(i): k for k, i in enumerate(f.ino.tolist())}
    for ino, paths_ in paths_of(now).items():
        k = nidx.get(ino)
        if k is None or not reg[k]:
            continue
        for p in paths_:
            was = old.get(p)
            if was is None:
                continue
            if was[0] != ino:
                out["new_inodes"] += 1
                if was[1] == int(f.size[k]) and was[2] == int(f.mtime[k]):
                    out["renewed_unchanged"] += 1
    return out


@dataclass
class _File:
    path: str
    size: int
    mode: int
    mtime_ns: int


def changed_files(
    prev: Layout | None, now: Layout, prev_ns: int | None, paths: PathsOf | None = None
) -> list[_File]:
    """Regular files of one link in ``now`` that the interval wrote: a new inode (or
    generation), or a modification time after ``prev``."""
    f = now.files
    seen: set[tuple[int, int]] = set()
    if prev is not None:
        seen = set(zip(prev.files.ino.tolist(), prev.files.generation.tolist(), strict=True))
    names_of = (paths or _paths)(now)
    out = []
    reg = f.is_regular()
    for k, (ino, gen) in enumerate(zip(f.ino.tolist(), f.generation.tolist(), strict=True)):
        if not reg[k] or int(f.nlink[k]) != 1 or not int(f.size[k]):
            continue
        new = (ino, gen) not in seen or prev_ns is None or int(f.mtime[k]) > prev_ns
        names = names_of.get(ino)
        if new and names and len(names) == 1:
            out.append(
                _File(names[0].lstrip("/"), int(f.size[k]), int(f.mode[k]) & 0o7777,
                      int(f.mtime[k]))
            )  # fmt: skip
    return out


__all__ = ["changed_files", "evidence"]
