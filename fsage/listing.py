"""A per-file view of a Layout: what `fsage show` prints."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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


def file_listing(layout: Layout, prefix: str | None = None) -> list[FileEntry]:
    """Every file (or those at or below ``prefix``), sorted by path, unnamed inodes last."""
    files = layout.files
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


__all__ = ["FileEntry", "file_listing"]
