"""The first schema's per-row file versions, read only to convert them into version chunks
(migration 5). Each ``file_versions`` row held one version: its inode fields
(``codec.INODE_DTYPE``), extents as u64 (logical, physical, length, flags) rows, metadata blocks
as u64 (physical, kind) rows, the u64 parent of each name and the names, each ended by a NUL.
"""

from __future__ import annotations

import sqlite3

import numpy as np
import numpy.typing as npt

from fsage.db import codec, versions
from fsage.layout import FileTable, LinkTable

_EXTENT = np.dtype([("l", "<u8"), ("p", "<u8"), ("n", "<u8"), ("f", "<u8")])
_META = np.dtype([("p", "<u8"), ("k", "<u8")])


def _offsets(blobs: list[bytes], itemsize: int) -> npt.NDArray[np.uint64]:
    counts = np.fromiter((len(b) // itemsize for b in blobs), np.uint64, len(blobs))
    off = np.zeros(len(blobs) + 1, np.uint64)
    np.cumsum(counts, out=off[1:])
    return off


def convert_file_versions(con: sqlite3.Connection) -> None:
    """Turn every (fs, first snapshot) group of ``file_versions`` rows into one version chunk,
    and each (chunk, last snapshot) group into one ``version_ends`` row."""
    groups = con.execute(
        "SELECT DISTINCT fs_id, first_snap FROM file_versions ORDER BY fs_id, first_snap"
    ).fetchall()
    for fs_id, first_snap in groups:
        rows = con.execute(
            "SELECT ino, digest, inode, extents, meta, link_parents, link_names,"
            " last_snap FROM file_versions WHERE fs_id = ? AND first_snap = ? ORDER BY ino",
            (fs_id, first_snap),
        ).fetchall()
        ino, digest, inode, ext, meta, parents, names, last = map(list, zip(*rows, strict=True))
        inodes = np.frombuffer(b"".join(inode), codec.INODE_DTYPE)
        extents = np.frombuffer(b"".join(ext), _EXTENT)
        metas = np.frombuffer(b"".join(meta), _META)
        files = FileTable(
            ino=np.asarray(ino, np.int64).astype(np.uint64),
            **{
                c: inodes[c].astype(np.dtype(inodes.dtype[c]).newbyteorder("="))
                for c in codec.INODE_FIELDS
            },
            ext_off=_offsets(ext, _EXTENT.itemsize),
            ext_logical=extents["l"].astype(np.uint64),
            ext_physical=extents["p"].astype(np.uint64),
            ext_length=extents["n"].astype(np.uint64),
            ext_flags=extents["f"].astype(np.uint32),
            meta_off=_offsets(meta, _META.itemsize),
            meta_physical=metas["p"].astype(np.uint64),
            meta_kind=metas["k"].astype(np.uint8),
        )
        link_off = _offsets(parents, 8)
        split = [n for blob in names for n in blob.split(b"\0")[:-1]]
        links = LinkTable.from_lists(
            np.frombuffer(b"".join(parents), "<u8").tolist(),
            np.repeat(files.ino, np.diff(link_off).astype(np.int64)).tolist(),
            split,
        )
        blobs = codec.pack_chunk(
            files,
            inodes["special"].astype(bool),
            np.asarray(digest, np.int64),
            links,
            np.repeat(np.arange(len(files), dtype=np.int64), np.diff(link_off).astype(np.int64)),
        )
        chunk_id = versions.write_chunk(con, fs_id, first_snap, blobs)
        # Ends in order of their last snapshot, so a chunk whose versions all ended gets the
        # latest of them as its dead_after.
        by_last: dict[int, list[int]] = {}
        for k, s in enumerate(last):
            if s is not None:
                by_last.setdefault(int(s), []).append(k)
        for s in sorted(by_last):
            ks = np.asarray(by_last[s], np.int64)
            versions.end_versions(con, fs_id, s, np.full(len(ks), chunk_id, np.int64), ks)
