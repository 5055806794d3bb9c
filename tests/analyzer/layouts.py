"""Build small Layouts by hand for analyzer tests."""

from __future__ import annotations

import stat
from collections.abc import Sequence

import numpy as np

from fsage.layout import FileTable, FreeExtents, FsFacts, Layout, LinkTable

Extent = tuple[int, int, int] | tuple[int, int, int, int]  # logical, physical, length[, flags]


def table(
    extents: Sequence[Sequence[Extent]],
    *,
    inos: Sequence[int] | None = None,
    modes: Sequence[int] | None = None,
    sizes: Sequence[int] | None = None,
    mtimes: Sequence[int] | None = None,
    meta: Sequence[Sequence[int]] | None = None,
    block_size: int = 4096,
) -> FileTable:
    n = len(extents)
    inos = list(inos) if inos is not None else list(range(12, 12 + n))
    modes = list(modes) if modes is not None else [stat.S_IFREG | 0o644] * n
    if sizes is None:
        sizes = [sum(e[2] for e in ex) * block_size for ex in extents]
    mtimes = list(mtimes) if mtimes is not None else [0] * n
    meta = list(meta) if meta is not None else [[] for _ in range(n)]
    flat = [e for ex in extents for e in ex]
    ext_off = np.zeros(n + 1, np.uint64)
    np.cumsum([len(ex) for ex in extents], out=ext_off[1:])
    meta_off = np.zeros(n + 1, np.uint64)
    np.cumsum([len(m) for m in meta], out=meta_off[1:])
    z32 = np.zeros(n, np.uint32)
    z64 = np.zeros(n, np.int64)
    return FileTable(
        ino=np.array(inos, np.uint64),
        generation=z32.copy(),
        mode=np.array(modes, np.uint32),
        nlink=np.ones(n, np.uint32),
        uid=z32.copy(),
        gid=z32.copy(),
        size=np.array(sizes, np.uint64),
        atime=z64.copy(),
        mtime=np.array(mtimes, np.int64),
        ctime=z64.copy(),
        crtime=z64.copy(),
        flags=z32.copy(),
        damaged=z32.copy(),
        ext_off=ext_off,
        ext_logical=np.array([e[0] for e in flat], np.uint64),
        ext_physical=np.array([e[1] for e in flat], np.uint64),
        ext_length=np.array([e[2] for e in flat], np.uint64),
        ext_flags=np.array([e[3] if len(e) > 3 else 0 for e in flat], np.uint32),  # type: ignore[misc]
        meta_off=meta_off,
        meta_physical=np.array([b for m in meta for b in m], np.uint64),
        meta_kind=np.ones(sum(len(m) for m in meta), np.uint8),
    )


def layout(
    files: FileTable,
    *,
    links: list[tuple[int, int, bytes]] | None = None,
    free: Sequence[tuple[int, int]] = (),
    block_size: int = 4096,
    blocks_total: int = 1 << 16,
    first_data_block: int = 0,
    groups: list[dict[str, int]] | None = None,
    extra: dict[str, object] | None = None,
) -> Layout:
    lk = LinkTable.from_lists(
        [p for p, _, _ in links or []],
        [i for _, i, _ in links or []],
        [n for _, _, n in links or []],
    )
    fr = FreeExtents(
        np.array([s for s, _ in free], np.uint64), np.array([n for _, n in free], np.uint64)
    )
    facts = FsFacts(
        kind="ext4",
        uuid="00000000-0000-0000-0000-000000000000",
        label="t",
        block_size=block_size,
        blocks_total=blocks_total,
        blocks_free=fr.blocks,
        first_data_block=first_data_block,
        groups=groups or [],
        extra=dict(extra or {}),
    )
    return Layout(facts=facts, files=files, links=lk, free=fr)
