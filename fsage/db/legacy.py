"""Earlier stores' file versions, read only to convert them.

Schema 1 kept one ``file_versions`` row per version: its inode fields (``INODE_DTYPE``), extents
as u64 (logical, physical, length, flags) rows, metadata blocks as u64 (physical, kind) rows, the
u64 parent of each name and the names, each ended by a NUL. Migration 5 turned them into
version chunks with one fixed-width blob per column in ``version_chunks`` (``V5_BLOBS``);
migration 6 moved the blobs to ``chunk_blobs`` in the narrowed format of ``codec``.
"""

from __future__ import annotations

import sqlite3

import numpy as np
import numpy.typing as npt

from fsage.db import codec, versions
from fsage.layout import FILE_COLUMNS, FileTable, LinkTable

_EXTENT = np.dtype([("l", "<u8"), ("p", "<u8"), ("n", "<u8"), ("f", "<u8")])
_META = np.dtype([("p", "<u8"), ("k", "<u8")])
# A version's inode fields in schemas 1 and 5, and whether it is a reserved (special) inode.
INODE_DTYPE = np.dtype(
    [(c, np.dtype(FILE_COLUMNS[c]).newbyteorder("<")) for c in codec.INODE_FIELDS]
    + [("special", "<u4")]
)
# Schema 5's chunk blobs, each a fixed-width column (or a record of columns).
_V5_KEY = np.dtype([("ino", "<u8"), ("generation", "<u4"), ("digest", "<i8")])
_V5_EXTENT = np.dtype([("l", "<u8"), ("p", "<u8"), ("n", "<u8"), ("f", "<u4")])
_V5_META = np.dtype([("p", "<u8"), ("k", "u1")])
V5_BLOBS = (
    "keys", "inodes", "ext_counts", "extents", "meta_counts", "meta", "link_rows",
    "link_parents", "name_lens", "names",
)  # fmt: skip


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
        inodes = np.frombuffer(b"".join(inode), INODE_DTYPE)
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
        arrays = codec.chunk_arrays(
            files,
            inodes["special"].astype(bool),
            np.asarray(digest, np.int64),
            links,
            np.repeat(np.arange(len(files), dtype=np.int64), np.diff(link_off).astype(np.int64)),
        )
        blobs = _v5_blobs(arrays)
        cur = con.execute(
            f"INSERT INTO version_chunks(fs_id, first_snap, n, live, {', '.join(V5_BLOBS)})"
            f" VALUES (?, ?, ?, ?, {', '.join('?' * len(V5_BLOBS))})",
            (fs_id, first_snap, len(files), len(files), *(blobs[b] for b in V5_BLOBS)),
        )
        assert cur.lastrowid is not None
        chunk_id = cur.lastrowid
        # Ends in order of their last snapshot, so a chunk whose versions all ended gets the
        # latest of them as its dead_after.
        by_last: dict[int, list[int]] = {}
        for k, s in enumerate(last):
            if s is not None:
                by_last.setdefault(int(s), []).append(k)
        for s in sorted(by_last):
            ks = np.asarray(by_last[s], np.int64)
            versions.end_versions(
                con, fs_id, s, np.full(len(ks), chunk_id, np.int64), ks, checksum=False
            )


def _v5_blobs(a: codec.Arrays) -> dict[str, bytes]:
    keys = np.empty(len(a["ino"]), _V5_KEY)
    for c in _V5_KEY.names or ():
        keys[c] = a[c]
    inodes = np.empty(len(a["ino"]), INODE_DTYPE)
    for c in INODE_DTYPE.names or ():
        inodes[c] = a[c]
    ext = np.empty(len(a["ext_logical"]), _V5_EXTENT)
    ext["l"], ext["p"], ext["n"], ext["f"] = (
        a["ext_logical"], a["ext_physical"], a["ext_length"], a["ext_flags"],
    )  # fmt: skip
    meta = np.empty(len(a["meta_physical"]), _V5_META)
    meta["p"], meta["k"] = a["meta_physical"], a["meta_kind"]
    return {
        "keys": keys.tobytes(),
        "inodes": inodes.tobytes(),
        "ext_counts": a["ext_counts"].astype("<u4").tobytes(),
        "extents": ext.tobytes(),
        "meta_counts": a["meta_counts"].astype("<u4").tobytes(),
        "meta": meta.tobytes(),
        "link_rows": a["link_rows"].astype("<u4").tobytes(),
        "link_parents": a["link_parents"].astype("<u8").tobytes(),
        "name_lens": a["name_lens"].astype("<u2").tobytes(),
        "names": a["names"].tobytes(),
    }


def _v5_arrays(blobs: dict[str, bytes]) -> codec.Arrays:
    keys = np.frombuffer(blobs["keys"], _V5_KEY)
    inodes = np.frombuffer(blobs["inodes"], INODE_DTYPE)
    ext = np.frombuffer(blobs["extents"], _V5_EXTENT)
    meta = np.frombuffer(blobs["meta"], _V5_META)
    arrays: codec.Arrays = {c: keys[c] for c in _V5_KEY.names or ()}
    arrays.update({c: inodes[c] for c in INODE_DTYPE.names or () if c != "generation"})
    arrays.update(
        ext_counts=np.frombuffer(blobs["ext_counts"], "<u4"),
        ext_logical=ext["l"],
        ext_physical=ext["p"],
        ext_length=ext["n"],
        ext_flags=ext["f"],
        meta_counts=np.frombuffer(blobs["meta_counts"], "<u4"),
        meta_physical=meta["p"],
        meta_kind=meta["k"],
        link_rows=np.frombuffer(blobs["link_rows"], "<u4"),
        link_parents=np.frombuffer(blobs["link_parents"], "<u8"),
        name_lens=np.frombuffer(blobs["name_lens"], "<u2"),
        names=np.frombuffer(blobs["names"], np.uint8),
    )
    return arrays


def convert_v5_chunks(con: sqlite3.Connection) -> None:
    """Re-encode every schema-5 chunk into ``chunk_blobs`` and drop the old blob columns."""
    ids = [r[0] for r in con.execute("SELECT id FROM version_chunks ORDER BY id")]
    for chunk_id in ids:  # one at a time: a chunk can be large
        row = con.execute(
            f"SELECT {', '.join(V5_BLOBS)} FROM version_chunks WHERE id = ?", (chunk_id,)
        ).fetchone()
        blobs = codec.pack_arrays(_v5_arrays(dict(zip(V5_BLOBS, row, strict=True))))
        con.execute(
            "INSERT INTO chunk_blobs(chunk_id, keys, body) VALUES (?, ?, ?)",
            (chunk_id, blobs["keys"], blobs["body"]),
        )
    # Emptied first, so that each DROP COLUMN below rewrites a table of small rows.
    empty = ", ".join(f"{b} = x''" for b in V5_BLOBS)
    con.execute(f"UPDATE version_chunks SET {empty}")
    for blob in V5_BLOBS:
        con.execute(f"ALTER TABLE version_chunks DROP COLUMN {blob}")
