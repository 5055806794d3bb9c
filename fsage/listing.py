"""A per-file view of a Layout: what `fsage show` prints.

The whole listing is built column by column: every path once from the directory table (each
directory's path once, then each name appended to its directory's), one sort of the paths, and
the text and CSV rows formatted with numpy string operations and written in large chunks. A
listing below a path resolves that path name by name from the root and derives only the paths
below it (:func:`subtree_paths`).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
from numpy.dtypes import StringDType

from fsage import _kernels
from fsage.errors import StoreError
from fsage.layout import FileTable, Layout, LinkTable, derive_paths
from fsage.text import shown

if TYPE_CHECKING:
    from fsage.db.store import Store

I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]
_STR = StringDType()
CHUNK_ROWS = 65_536  # rows formatted and written at a time
PATH_WIDTH_FLOOR = 40  # paths up to this long are always aligned (see path_width)

TEXT_HEADERS = ["path", "ino", "size", "blocks", "extents (logical:physical+length)"]
CSV_HEADERS = ["path", "ino", "mode", "size", "blocks", "extents"]


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


@dataclass
class ListedFiles:
    """The columns of files a listing shows (views of a FileTable's, or read on their own)."""

    ino: U64
    mode: npt.NDArray[np.uint32]
    size: U64
    damaged: npt.NDArray[np.uint32]
    ext_off: U64  # len n+1
    ext_logical: U64
    ext_physical: U64
    ext_length: U64

    @classmethod
    def of(cls, t: FileTable) -> ListedFiles:
        return cls(
            t.ino, t.mode, t.size, t.damaged, t.ext_off, t.ext_logical, t.ext_physical,
            t.ext_length,
        )  # fmt: skip

    def __len__(self) -> int:
        return int(self.ino.shape[0])


@dataclass
class Listing:
    """Files in listing order: ``rows`` index ``files``; ``path`` is each one's first path
    (None: no directory names it); ``paths_of()`` all of their paths, each list sorted."""

    files: ListedFiles
    rows: I64
    path: list[str | None]
    paths_of: Callable[[], list[list[str]]]
    unnamed: int = 0  # the last rows: files no directory names (path None)
    printable: bool = False  # every path known to be printable (shown() leaves it as it is)

    def __len__(self) -> int:
        return int(self.rows.size)

    def named(self) -> Listing:
        """The files a directory names (unnamed inodes come last)."""
        n = len(self.path) - self.unnamed
        paths_of = self.paths_of
        rows, path = self.rows[:n], self.path[:n]
        return Listing(self.files, rows, path, lambda: paths_of()[:n], 0, self.printable)

    def entries(self) -> list[FileEntry]:
        files, rows = self.files, self.rows
        blocks = _blocks(files, rows)
        off = files.ext_off.tolist()
        logical = files.ext_logical.tolist()
        physical = files.ext_physical.tolist()
        length = files.ext_length.tolist()
        out = []
        cols = zip(
            rows.tolist(),
            self.path,
            self.paths_of(),
            files.ino[rows].tolist(),
            files.mode[rows].tolist(),
            files.size[rows].tolist(),
            blocks.tolist(),
            files.damaged[rows].tolist(),
            strict=True,
        )
        for i, path, paths, ino, mode, size, nblocks, damaged in cols:
            a, b = off[i], off[i + 1]
            out.append(
                FileEntry(
                    path=path,
                    paths=paths,
                    ino=ino,
                    mode=mode,
                    size=size,
                    blocks=nblocks,
                    extents=list(zip(logical[a:b], physical[a:b], length[a:b], strict=True)),
                    damaged=damaged,
                )
            )
        return out


def link_paths(links: LinkTable, root_ino: int) -> tuple[I64, npt.NDArray[np.object_], bool] | None:
    """The directory entries reachable from the root, the path each gives its inode (as
    :func:`fsage.layout.derive_paths` finds them) and whether every name is printable; None
    when a directory with entries has more than one name (a damaged tree), where the walk's
    order decides and that function must."""
    n = len(links)
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, object), True
    parent = links.parent.astype(np.int64)
    ino = links.ino.astype(np.int64)
    holders = _distinct(parent)
    dir_rows = np.flatnonzero(np.isin(ino, holders) & (ino != root_ino))
    if _distinct(ino[dir_rows]).size != dir_rows.size:
        return None
    names = links.decoded()
    printable = "".join(names).isprintable()
    # each directory's path and a slash, from the root down (one name each: any order does)
    prefix: dict[int, str] = {root_ino: "/"}
    kids: dict[int, list[int]] = {}
    for r, p in zip(dir_rows.tolist(), parent[dir_rows].tolist(), strict=True):
        kids.setdefault(p, []).append(r)
    todo = [root_ino]
    while todo:
        d = todo.pop()
        base = prefix[d]
        for r in kids.get(d, ()):
            child = int(ino[r])
            prefix[child] = base + names[r] + "/"
            todo.append(child)
    dirs = np.fromiter(prefix, np.int64, len(prefix))
    order = np.argsort(dirs)
    dirs = dirs[order]
    at = np.minimum(np.searchsorted(dirs, parent), dirs.size - 1)
    rows = np.flatnonzero(dirs[at] == parent)
    bases = _objects(list(prefix.values()))[order[at[rows]]]
    return rows.astype(np.int64), np.add(bases, _objects(names)[rows]), printable


def _distinct(values: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """The distinct values, sorted: ``np.unique`` without its look at ``np.ma``, which costs
    `fsage show --path` the import of numpy.ma (15-30 ms)."""
    out = np.sort(values)
    return out[np.concatenate(([True], out[1:] != out[:-1]))] if out.size else out


def _objects(items: list[Any]) -> npt.NDArray[np.object_]:
    """A list as a 1-D array of objects (taken, indexed and added without Python loops)."""
    out = np.empty(len(items), object)
    out[:] = items
    return out


def _file_rows(files: ListedFiles | FileTable, ino: I64) -> I64:
    """The row of ``files`` holding each inode number (-1: none)."""
    n = len(files)
    if n == 0:
        return np.full(ino.size, -1, np.int64)
    pos = np.searchsorted(files.ino.astype(np.int64), ino)
    pos_c = np.minimum(pos, n - 1)
    return np.where(files.ino[pos_c].astype(np.int64) == ino, pos_c, -1).astype(np.int64)


def listing(layout: Layout) -> Listing:
    """Every file of the snapshot sorted by its first path (its smallest), then inode number;
    inodes no directory names last, by inode number."""
    return listing_of(ListedFiles.of(layout.files), layout.links, layout.root_ino)


def listing_of(files: ListedFiles, links: LinkTable, root_ino: int) -> Listing:
    """:func:`listing` of files (in ino order) and their directory table."""
    if len(files) and not bool(np.all(files.ino[1:] > files.ino[:-1])):
        raise ValueError("the files of a layout are sorted by inode number")
    found = link_paths(links, root_ino)
    if found is None:
        return _listing_from(files, derive_paths(links, root_ino))
    sel, paths, printable = found
    owners = links.ino.astype(np.int64)[sel]
    root_row = _file_rows(files, np.array([root_ino], np.int64))
    if root_row[0] >= 0:
        paths = np.append(paths, _objects(["/"]))
        owners = np.append(owners, root_ino)
    row = _file_rows(files, owners)
    named = np.flatnonzero(row >= 0)
    row, paths = row[named], paths[named]
    # by path, equal paths by inode number
    by_ino = np.argsort(row, kind="stable")
    order = by_ino[_argsort_text(paths[by_ino])]
    row_sorted, sorted_paths = row[order], paths[order]
    # where each file first comes (written back to front: the earliest place stays)
    first_at = np.empty(len(files), np.int64)
    first_at[row_sorted[::-1]] = np.arange(row_sorted.size - 1, -1, -1)
    is_first = np.zeros(row_sorted.size, bool)
    is_first[first_at[row_sorted]] = True
    first = np.flatnonzero(is_first)
    listed = row_sorted[first]
    unnamed = np.ones(len(files), bool)
    unnamed[listed] = False
    rest = np.flatnonzero(unnamed).astype(np.int64)
    path: list[str | None] = sorted_paths[first].tolist()
    path.extend([None] * rest.size)

    def paths_of() -> list[list[str]]:
        group = np.argsort(row_sorted, kind="stable")  # each file's paths, in path order
        bounds = np.searchsorted(row_sorted[group], listed)
        counts = np.bincount(row_sorted, minlength=len(files))[listed]
        grouped = sorted_paths[group].tolist()
        out = [grouped[b : b + c] for b, c in zip(bounds.tolist(), counts.tolist(), strict=True)]
        out.extend([] for _ in range(rest.size))
        return out

    rows = np.concatenate([listed, rest]).astype(np.int64)
    return Listing(files, rows, path, paths_of, int(rest.size), printable)


def _argsort_text(texts: npt.NDArray[np.object_]) -> I64:
    """Stable order of ``texts`` (code point order, as Python compares str). Python's sort:
    it takes the runs the texts already come in (files numbered in the order their directory
    was filled) where a sort of arrays starts from scratch."""
    keys = texts.tolist()
    return np.array(sorted(range(len(keys)), key=keys.__getitem__), np.int64)


def _listing_from(files: ListedFiles, paths: dict[int, list[str]]) -> Listing:
    """A listing from every inode's paths (derive_paths)."""
    inos = files.ino.tolist()
    keyed = sorted(range(len(inos)), key=lambda i: _key(paths.get(inos[i]), inos[i]))
    rows = np.array(keyed, np.int64)
    path: list[str | None] = [p[0] if (p := paths.get(inos[i])) else None for i in keyed]
    unnamed = sum(p is None for p in path)
    return Listing(files, rows, path, lambda: [paths.get(inos[i], []) for i in keyed], unnamed)


def _key(names: list[str] | None, ino: int) -> tuple[bool, str, int]:
    return (not names, names[0] if names else "", ino)


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
    return paths_below(layout.links, layout.root_ino, prefix)


def paths_below(links: LinkTable, root_ino: int, prefix: str) -> dict[int, list[str]]:
    """:func:`subtree_paths` of a directory table."""
    parts = [c for c in prefix.strip("/").split("/") if c]
    if not parts:
        return derive_paths(links, root_ino)
    parent = links.parent.astype(np.int64)
    # the entries grouped by directory, once: each level then costs its own entries only
    by_parent = np.argsort(parent, kind="stable")
    sorted_parent = parent[by_parent]

    def entries_of(dirs: I64) -> I64:
        lo = np.searchsorted(sorted_parent, dirs, side="left")
        hi = np.searchsorted(sorted_parent, dirs, side="right")
        n = hi - lo
        start = np.zeros(n.size + 1, np.int64)
        np.cumsum(n, out=start[1:])
        at = np.repeat(lo - start[:-1], n) + np.arange(int(start[-1]), dtype=np.int64)
        return np.sort(by_parent[at])  # in table order, as a scan of the table finds them

    cur = root_ino
    path = ""
    for comp in parts:
        want = comp.encode("utf-8", "surrogateescape")
        rows = entries_of(np.array([cur], np.int64))
        hit = next((int(r) for r in rows.tolist() if links.name(r) == want), None)
        if hit is None:
            return {}
        cur = int(links.ino[hit])
        path += "/" + comp
    out: dict[int, list[str]] = {cur: [path]}
    frontier = {cur: path}
    seen = {cur}
    while frontier:
        rows = entries_of(np.fromiter(frontier, np.int64, len(frontier)))
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


def subtree_listing(files: ListedFiles, paths: dict[int, list[str]]) -> Listing:
    """The files of ``paths`` (from :func:`subtree_paths`) that ``files`` holds, by first path
    then inode number."""
    inos = np.fromiter(paths, np.int64, len(paths))
    rows = _distinct(_file_rows(files, inos))
    rows = rows[rows >= 0]
    ino = files.ino[rows].tolist()
    order = sorted(range(rows.size), key=lambda k: (paths[ino[k]][0], ino[k]))
    rows = rows[np.array(order, np.int64)] if order else rows
    names = [paths[i] for i in files.ino[rows].tolist()]
    return Listing(files, rows.astype(np.int64), [p[0] for p in names], lambda: names)


def show_files(
    store: Store, snapshot_id: int, prefix: str | None, fmt: str, write: Callable[[str], object]
) -> None:
    """Write what ``fsage show`` prints: the files of a snapshot (or those at or below
    ``prefix``) in ``fmt`` (text, csv or json). Below a path, only the names and the shown
    columns of the files found there are read from the store."""
    if prefix is not None and prefix.strip("/"):
        found: dict[int, list[str]] = {}

        def resolve(links: LinkTable) -> U64:
            found.update(paths_below(links, Layout.root_ino, prefix))
            return np.fromiter(found, np.uint64, len(found))

        _, cols = store.listed_subtree(snapshot_id, resolve)
        lst = subtree_listing(ListedFiles(**cols), found)
    else:
        links, cols = store.listed_subtree(snapshot_id, lambda _: None)
        lst = listing_of(ListedFiles(**cols), links, Layout.root_ino)
        if prefix is not None:  # "/": every file a directory names
            lst = lst.named()
    if prefix is not None and not len(lst):
        raise StoreError(f"no file at or below {prefix} in snapshot {snapshot_id}")
    if fmt == "json":
        write_json_listing(lst, write)
    elif fmt == "csv":
        write_csv(lst, write)
    else:
        write_text(lst, write)


def file_listing(layout: Layout, prefix: str | None = None) -> list[FileEntry]:
    """Every file (or those at or below ``prefix``), sorted by path, unnamed inodes last."""
    if prefix is not None and prefix.strip("/"):
        paths = subtree_paths(layout, prefix)
        return subtree_listing(ListedFiles.of(layout.files), paths).entries()
    lst = listing(layout)
    return (lst if prefix is None else lst.named()).entries()


# ---------- output ----------


def _digits(v: U64) -> I64:
    """Decimal digits of each value."""
    powers = np.array([10**k for k in range(1, 20)], np.uint64)
    return (np.searchsorted(powers, v, side="right") + 1).astype(np.int64)


def _blocks(files: ListedFiles, rows: I64) -> U64:
    """Allocated data blocks of each row (the sum of its extent lengths)."""
    sums = np.zeros(len(files.ext_length) + 1, np.uint64)
    np.cumsum(files.ext_length, out=sums[1:])
    off = files.ext_off.astype(np.int64)
    return np.asarray(sums[off[rows + 1]] - sums[off[rows]], np.uint64)


def _extent_array(
    files: ListedFiles,
    rows: I64,
    empty: str,
    parts: tuple[str, str, str, str] = ("", ":", "+", ""),
    sep: str = " ",
) -> npt.NDArray[Any]:
    """Each file's extents as ``logical:physical+length`` separated by spaces (``empty`` for
    a file without extents); ``parts`` (before, between the numbers, after) and ``sep``
    make other notations (JSON's)."""
    off = files.ext_off.astype(np.int64)
    start, count = off[rows], off[rows + 1] - off[rows]
    out = np.full(rows.size, empty, dtype=_STR)
    if rows.size == 0 or not count.any():
        return out
    first = np.zeros(rows.size + 1, np.int64)
    np.cumsum(count, out=first[1:])
    # the extents of these rows, back to back, each as text
    idx = np.repeat(start - first[:-1], count) + np.arange(int(first[-1]), dtype=np.int64)
    ext = (
        parts[0]
        + files.ext_logical[idx].astype(_STR)
        + parts[1]
        + files.ext_physical[idx].astype(_STR)
        + parts[2]
        + files.ext_length[idx].astype(_STR)
        + parts[3]
    )
    has = np.flatnonzero(count > 0)
    out[has] = ext[first[has]]
    # a few extents: appended one column at a time; many: joined file by file
    few = np.flatnonzero((count > 1) & (count <= 32))
    k = 1
    while few.size:
        out[few] = out[few] + sep + ext[first[few] + k]
        k += 1
        few = few[count[few] > k]
    for i in np.flatnonzero(count > 32).tolist():
        out[i] = sep.join(ext[first[i] : first[i + 1]].tolist())
    return out


def _shown_paths(paths: list[str | None], unnamed: int, printable: bool) -> list[str]:
    """Each path as a table shows it (``shown``; "-" for none)."""
    if printable and unnamed == 0:
        return paths  # type: ignore[return-value]
    return ["-" if p is None else p if p.isprintable() else shown(p) for p in paths]


def path_width(lengths: I64) -> int:
    """The width of the path column: the longest path, but no wider than nine paths in ten
    (a few deep paths would pad every row; a longer one pushes the rest of its row over)."""
    if lengths.size == 0:
        return 0
    longest = int(lengths.max())
    k = -(-lengths.size * 9 // 10) - 1  # nine in ten are at most this long
    ninth = int(np.partition(lengths, k)[k])
    return min(longest, max(ninth, PATH_WIDTH_FLOOR))


def write_text(lst: Listing, write: Callable[[str], object]) -> None:
    """The listing as ``fsage show`` prints it: an aligned table (numbers right-aligned), its
    header as soon as the column widths are known, then the rows in large chunks, formatted
    in C (``fsage/_kernels.c``)."""
    files, rows = lst.files, lst.rows
    shown_path = _shown_paths(lst.path, lst.unnamed, lst.printable)
    blocks = _blocks(files, rows)
    numeric = [lst.unnamed == len(lst), True, True, True, not len(lst)]
    cols: list[U64] = [files.ino[rows], files.size[rows], blocks]
    widths = [len(h) for h in TEXT_HEADERS]
    if len(lst):
        widths[0] = max(widths[0], path_width(np.fromiter(map(len, shown_path), np.int64)))
        for k, col in enumerate(cols, start=1):
            widths[k] = max(widths[k], int(_digits(col).max()))
    head = [
        h.rjust(w) if num else h.ljust(w)
        for h, w, num in zip(TEXT_HEADERS, widths, numeric, strict=True)
    ]
    # The extents come last, unpadded: their rule is as long as their heading.
    write("  ".join(head).rstrip() + "\n" + "  ".join("-" * w for w in widths) + "\n")
    # the last column is not padded (the table's lines end without blanks)
    off = files.ext_off.astype(np.int64)
    logical, physical, length = (
        np.ascontiguousarray(c, np.uint64)
        for c in (files.ext_logical, files.ext_physical, files.ext_length)
    )
    ino, size, nblocks = (np.ascontiguousarray(c, np.uint64) for c in cols)
    for a in range(0, len(lst), CHUNK_ROWS):
        b = min(a + CHUNK_ROWS, len(lst))
        r = rows[a:b]
        write(
            _kernels.text_rows(
                shown_path[a:b],
                (widths[0], widths[1], widths[2], widths[3]),
                numeric[0],
                ino[a:b],
                size[a:b],
                nblocks[a:b],
                off[r],
                off[r + 1] - off[r],
                logical,
                physical,
                length,
            )
        )


class _Sink:
    """A file-like object over a write function (for csv.writer)."""

    def __init__(self, write: Callable[[str], object]) -> None:
        self.write = write


def write_csv(lst: Listing, write: Callable[[str], object]) -> None:
    """The listing as CSV rows (path, ino, mode in octal, size, blocks, extents)."""

    files, rows = lst.files, lst.rows
    w = csv.writer(_Sink(write), lineterminator="\n")
    w.writerow(CSV_HEADERS)
    blocks = _blocks(files, rows)
    for a in range(0, len(lst), CHUNK_ROWS):
        b = min(a + CHUNK_ROWS, len(lst))
        r = rows[a:b]
        modes = files.mode[r]
        kinds, back = np.unique(modes, return_inverse=True)
        lut = [f"{m:o}" for m in kinds.tolist()]
        octal = [lut[i] for i in back.tolist()]
        w.writerows(
            zip(
                ["" if p is None else p for p in lst.path[a:b]],
                files.ino[r].tolist(),
                octal,
                files.size[r].tolist(),
                blocks[a:b].tolist(),
                _extent_array(files, r, "").tolist(),
                strict=True,
            )
        )


_JSON_EXTENT = ("[\n        ", ",\n        ", ",\n        ", "\n      ]")
# One entry as json.dumps(..., indent=2) writes it inside the list.
_JSON_ITEM = (
    '  {\n    "path": %s,\n    "paths": %s,\n    "ino": %d,\n    "mode": "%o",\n'
    '    "size": %d,\n    "blocks": %d,\n    "extents": %s,\n    "damaged": %d\n  }'
)


def write_json_listing(lst: Listing, write: Callable[[str], object]) -> None:
    """What :func:`write_json` writes of ``lst.entries()``, byte for byte, from the columns a
    chunk of rows at a time, without an object per file."""
    if not len(lst):
        write("[]\n")
        return
    enc = json.encoder.encode_basestring_ascii
    files, rows = lst.files, lst.rows
    blocks = _blocks(files, rows)
    all_paths = lst.paths_of()
    write("[\n")
    for a in range(0, len(lst), CHUNK_ROWS):
        b = min(a + CHUNK_ROWS, len(lst))
        r = rows[a:b]
        path = ["null" if p is None else enc(p) for p in lst.path[a:b]]
        paths = [
            "[]"
            if not ps
            else f"[\n      {pj}\n    ]"
            if len(ps) == 1
            else "[\n      " + ",\n      ".join(map(enc, ps)) + "\n    ]"
            for pj, ps in zip(path, all_paths[a:b], strict=True)
        ]
        extents = [
            f"[\n      {e}\n    ]" if e else "[]"
            for e in _extent_array(files, r, "", _JSON_EXTENT, ",\n      ").tolist()
        ]
        columns = zip(
            path,
            paths,
            files.ino[r].tolist(),
            files.mode[r].tolist(),
            files.size[r].tolist(),
            blocks[a:b].tolist(),
            extents,
            files.damaged[r].tolist(),
            strict=True,
        )
        part = ",\n".join(map(_JSON_ITEM.__mod__, columns))
        write(part + (",\n" if b < len(lst) else "\n"))
    write("]\n")


def write_json(entries: list[FileEntry], write: Callable[[str], object]) -> None:
    """The entries as a JSON list (as ``json.dumps(..., indent=2)`` writes it), in chunks."""
    if not entries:
        write("[]\n")
        return
    enc = json.encoder.encode_basestring_ascii

    def item(e: FileEntry) -> str:
        path = "null" if e.path is None else enc(e.path)
        paths = "[\n      " + ",\n      ".join(map(enc, e.paths)) + "\n    ]" if e.paths else "[]"
        extents = (
            "[\n      "
            + ",\n      ".join(
                f"[\n        {lo},\n        {ph},\n        {n}\n      ]" for lo, ph, n in e.extents
            )
            + "\n    ]"
            if e.extents
            else "[]"
        )
        return (
            f'  {{\n    "path": {path},\n    "paths": {paths},\n    "ino": {e.ino},\n'
            f'    "mode": "{e.mode:o}",\n    "size": {e.size},\n    "blocks": {e.blocks},\n'
            f'    "extents": {extents},\n    "damaged": {e.damaged}\n  }}'
        )

    write("[\n")
    for a in range(0, len(entries), CHUNK_ROWS):
        part = ",\n".join(item(e) for e in entries[a : a + CHUNK_ROWS])
        write(part + (",\n" if a + CHUNK_ROWS < len(entries) else "\n"))
    write("]\n")


__all__ = [
    "FileEntry",
    "Listing",
    "file_listing",
    "link_paths",
    "listing",
    "listing_of",
    "paths_below",
    "show_files",
    "subtree_listing",
    "subtree_paths",
    "write_csv",
    "write_json",
    "write_json_listing",
    "write_text",
]
