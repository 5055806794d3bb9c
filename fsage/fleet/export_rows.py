"""The export's large tables, row by row: which file versions a snapshot adds or ends, and
their Arrow tables (file versions with their extents and first path, ends, free extents)."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from fsage.db import codec
from fsage.fleet.export_prefixes import Prefixes
from fsage.fleet.export_schema import ExportError
from fsage.layout import Layout, LinkTable

I64 = npt.NDArray[np.int64]


def new_rows_mask(new_rows: I64, n: int) -> npt.NDArray[np.bool_]:
    mask = np.zeros(n, bool)
    mask[new_rows] = True
    return mask


def diff_versions(prev: dict[str, I64], layout: Layout) -> tuple[I64, dict[str, I64], I64]:
    """New version rows of ``layout.files``, its keys (with the carried first snapshot),
    and the rows of ``prev`` that ended."""
    files = layout.files
    link_file = codec.link_files(files, layout.links)
    digest = codec.file_digests(files, layout.links, link_file).view(np.int64)
    del link_file
    ino = files.ino.astype(np.int64)
    # (Layout guarantees the order; compared pairwise: a stable argsort and its identity
    # would be two more arrays of every file)
    if ino.size > 1 and bool(np.any(ino[1:] < ino[:-1])):
        raise ExportError("file table not in inode order")
    return diff_keys(prev, ino, files.generation.astype(np.int64), digest)


def diff_keys(
    prev: dict[str, I64], ino: I64, gen: I64, digest: I64
) -> tuple[I64, dict[str, I64], I64]:
    """``diff_versions`` of files given by their keys (inode, generation, digest)."""
    n_prev = prev["ino"].size
    first = np.full(ino.size, -1, np.int64)
    if n_prev:
        pos = np.searchsorted(prev["ino"], ino)
        pos_c = np.minimum(pos, n_prev - 1)
        same = (
            (pos < n_prev)
            & (prev["ino"][pos_c] == ino)
            & (prev["generation"][pos_c] == gen)
            & (prev["digest"][pos_c] == digest)
        )
        first[same] = prev["first"][pos_c[same]]
        kept = np.zeros(n_prev, bool)
        kept[pos_c[same]] = True
        ended = np.flatnonzero(~kept)
    else:
        same = np.zeros(ino.size, bool)
        ended = np.zeros(0, np.int64)
    cur = {"ino": ino, "generation": gen, "digest": digest, "first": first}
    return np.flatnonzero(~same), cur, ended


def files_table(
    pa: Any,
    schema: Any,
    host: str,
    fs: str,
    snap_id: int,
    layout: Layout,
    rows: I64,
    digest: I64,
    paths: PathSource,
) -> Any:
    sub = layout.files.take(rows)
    n = len(sub)
    ino = sub.ino.astype(np.int64)
    path_col = paths.first(ino)
    extent_type = schema.field("extents").type
    meta_type = schema.field("meta_blocks").type
    extents = pa.ListArray.from_arrays(
        pa.array(sub.ext_off.astype(np.int32)),
        pa.StructArray.from_arrays(
            [
                pa.array(sub.ext_logical.astype(np.int64)),
                pa.array(sub.ext_physical.astype(np.int64)),
                pa.array(sub.ext_length.astype(np.int64)),
                pa.array(sub.ext_flags.astype(np.int32)),
            ],
            fields=list(extent_type.value_type),
        ),
        type=extent_type,
    )
    meta = pa.ListArray.from_arrays(
        pa.array(sub.meta_off.astype(np.int32)),
        pa.StructArray.from_arrays(
            [
                pa.array(sub.meta_physical.astype(np.int64)),
                pa.array(sub.meta_kind.astype(np.int32)),
            ],
            fields=list(meta_type.value_type),
        ),
        type=meta_type,
    )
    cols: dict[str, Any] = {
        "host": pa.array([host] * n, pa.string()),
        "fs": pa.array([fs] * n, pa.string()),
        "first_snapshot": np.full(n, snap_id, np.int64),
        "ino": ino,
        "generation": sub.generation.astype(np.int64),
        "digest": digest[rows],
    }
    for name in ("mode", "nlink", "uid", "gid", "size", "flags", "damaged"):
        cols[name] = getattr(sub, name).astype(np.int64)
    for name in ("atime", "mtime", "ctime", "crtime"):
        cols[f"{name}_ns"] = getattr(sub, name).astype(np.int64)
    cols["path"] = pa.array(path_col, pa.string())
    cols["extents"] = extents
    cols["meta_blocks"] = meta
    return pa.table(cols, schema=schema)


class PathSource(Protocol):
    def first(self, inos: I64) -> list[str | None]: ...


class FirstPaths:
    """The first (smallest) path of inodes, resolved a chunk at a time: the same as
    ``min(Layout.paths()[ino])`` without holding every file's path strings at once (at 700k
    files that dict is larger than the layout). Only the directories' prefixes are kept; a
    file's paths are its links' names under them."""

    def __init__(self, links: LinkTable, root_ino: int) -> None:
        self.links = links
        self.root_ino = root_ino
        # sorted as stored (no int64 copy of every link's inode beside the order), then
        # viewed as int64: inode numbers are below 2**63
        self.by_ino = np.argsort(links.ino, kind="stable")
        self.sorted_ino = links.ino[self.by_ino].astype(np.uint64, copy=False).view(np.int64)
        self.prefix = _directory_prefixes(links, root_ino)

    def first(self, inos: I64) -> list[str | None]:
        from fsage.analyzer.dynamic import ranges

        lo = np.searchsorted(self.sorted_ino, inos, side="left")
        hi = np.searchsorted(self.sorted_ino, inos, side="right")
        links = self.links
        rows = self.by_ino[ranges(lo.astype(np.int64), hi.astype(np.int64))]
        heads = self.prefix.heads(links.parent[rows].astype(np.int64))
        out: list[str | None] = []
        at = 0
        for ino, n in zip(inos.tolist(), (hi - lo).tolist(), strict=True):
            found: list[str] = ["/"] if ino == self.root_ino else []
            for r, head in zip(rows[at : at + n].tolist(), heads[at : at + n], strict=True):
                if head is not None:
                    found.append(f"{head}/{_name(links, r)}")
            at += n
            out.append(min(found) if found else None)
        return out


def _name(links: LinkTable, row: int) -> str:
    return links.name(row).decode("utf-8", "surrogateescape")


def _directory_prefixes(links: LinkTable, root_ino: int) -> Prefixes:
    """The path under which each reachable directory's entries are named (``""`` for the
    root), walked as ``derive_paths`` walks it: only entries that are themselves parents are
    visited, so a directory reached by two names takes the same one."""
    parents = np.unique(links.parent.astype(np.int64))
    rows = np.flatnonzero(np.isin(links.ino.astype(np.int64), parents))
    off = links.name_off.astype(np.int64)
    return Prefixes.walk(
        links.parent[rows].astype(np.int64), links.ino[rows].astype(np.int64),
        off[rows], off[rows + 1], links.names, root_ino,
    )  # fmt: skip
