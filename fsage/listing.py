"""A per-file view of a Layout: what `fsage show` prints."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from fsage.layout import Layout


@dataclass(frozen=True)
class FileEntry:
    path: str | None  # first path from the root; None for an inode no directory names
    paths: list[str]
    ino: int
    mode: int
    size: int
    blocks: int  # allocated data blocks (holes excluded)
    extents: list[tuple[int, int, int]]  # (logical, physical, length), logical order
    damaged: int

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "paths": self.paths,
            "ino": self.ino,
            "mode": f"{self.mode:o}",
            "size": self.size,
            "blocks": self.blocks,
            "extents": [list(e) for e in self.extents],
            "damaged": self.damaged,
        }


def _matches(paths: list[str], prefix: str | None) -> bool:
    if prefix is None:
        return True
    prefix = "/" + prefix.strip("/") if prefix.strip("/") else "/"
    if prefix == "/":
        return True
    return any(p == prefix or p.startswith(prefix + "/") for p in paths)


def subtree_paths(layout: Layout, prefix: str) -> dict[int, list[str]]:
    """The paths at or below ``prefix`` (ino -> its paths there), found through the directory
    entries from the root down without deriving every path of the file system."""
    links = layout.links
    parts = [c for c in prefix.strip("/").split("/") if c]
    if not parts:
        return layout.paths()
    parent = links.parent.astype(np.int64)
    cur = layout.root_ino
    path = ""
    for comp in parts:
        want = comp.encode("utf-8", "surrogateescape")
        rows = np.flatnonzero(parent == cur)
        hit = next((int(r) for r in rows.tolist() if links.name(r) == want), None)
        if hit is None:
            return {}
        cur = int(links.ino[hit])
        path += "/" + comp
    out: dict[int, list[str]] = {cur: [path]}
    frontier = {cur: path}
    seen = {cur}
    while frontier:
        rows = np.flatnonzero(np.isin(parent, np.fromiter(frontier, np.int64, len(frontier))))
        nxt: dict[int, str] = {}
        for r in rows.tolist():
            ino = int(links.ino[r])
            if ino == int(parent[r]):
                continue
            p = frontier[int(parent[r])] + "/" + links.name(r).decode("utf-8", "surrogateescape")
            out.setdefault(ino, []).append(p)
            if ino not in seen:
                seen.add(ino)
                nxt[ino] = p
        frontier = nxt
    for v in out.values():
        v.sort()
    return out


def file_listing(layout: Layout, prefix: str | None = None) -> list[FileEntry]:
    """Every file (or those at or below ``prefix``), sorted by path, unnamed inodes last."""
    files = layout.files
    if prefix is not None and prefix.strip("/"):
        paths = subtree_paths(layout, prefix)
        idx = np.searchsorted(files.ino, np.fromiter(paths, np.uint64, len(paths)))
        return _entries(layout, paths, idx, prefix)
    paths = layout.paths()
    blocks = files.data_blocks
    off = files.ext_off.tolist()
    logical, physical, length = (
        files.ext_logical.tolist(),
        files.ext_physical.tolist(),
        files.ext_length.tolist(),
    )
    out = []
    for i, ino in enumerate(files.ino.tolist()):
        names = paths.get(ino, [])
        if not _matches(names, prefix) or (prefix is not None and not names):
            continue
        a, b = off[i], off[i + 1]
        shown = [p for p in names if _matches([p], prefix)] or names
        out.append(
            FileEntry(
                path=shown[0] if shown else None,
                paths=names,
                ino=ino,
                mode=int(files.mode[i]),
                size=int(files.size[i]),
                blocks=int(blocks[i]),
                extents=list(zip(logical[a:b], physical[a:b], length[a:b], strict=True)),
                damaged=int(files.damaged[i]),
            )
        )
    out.sort(key=lambda e: (e.path is None, e.path or "", e.ino))
    return out


def _entries(
    layout: Layout, paths: dict[int, list[str]], idx: npt.NDArray[np.int64], prefix: str
) -> list[FileEntry]:
    files = layout.files
    n = len(files)
    out = []
    for i in sorted(set(idx.tolist())):
        if i >= n or int(files.ino[i]) not in paths:
            continue
        names = paths[int(files.ino[i])]
        a, b = int(files.ext_off[i]), int(files.ext_off[i + 1])
        out.append(
            FileEntry(
                path=names[0],
                paths=names,
                ino=int(files.ino[i]),
                mode=int(files.mode[i]),
                size=int(files.size[i]),
                blocks=int(files.ext_length[a:b].sum()),
                extents=list(
                    zip(
                        files.ext_logical[a:b].tolist(),
                        files.ext_physical[a:b].tolist(),
                        files.ext_length[a:b].tolist(),
                        strict=True,
                    )
                ),
                damaged=int(files.damaged[i]),
            )
        )
    out.sort(key=lambda e: (e.path or "", e.ino))
    return out


__all__ = ["FileEntry", "file_listing", "subtree_paths"]
