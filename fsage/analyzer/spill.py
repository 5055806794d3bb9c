"""Numbers of every file kept on disk, not in memory: bucket files of fixed-size records
(optionally with a name each), and the two statistics the figures take over every file, a
float mean summed as numpy sums it and an exact order statistic, read back a window at a time.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from fsage import scratch
from fsage.analyzer.dynamic import ranges
from fsage.errors import FsageError

#: Values read back at a time.
WINDOW = 1 << 16
# numpy's pairwise summation adds up to this many values in one unrolled loop
PAIRWISE_BLOCK = 128
#: The oldest SQLite the scratch tables' statements run on (``UPDATE ... FROM``: 3.33), with
#: its JSON functions (``json_each``), built in by default from 3.38 on.
SQLITE_MIN = (3, 33, 0)
# flips a negative float's magnitude bits, so that its bits as an integer sort as it does
_MAGNITUDE = np.int64(0x7FFF_FFFF_FFFF_FFFF)


def scratch_db(path: Path, cache_kib: int) -> sqlite3.Connection:
    """A SQLite file for scratch tables: no journal, no syncs, a page cache of ``cache_kib``
    (what the tables hold beyond it stays on disk, sorts and temporary tables too)."""
    have = sqlite3.sqlite_version_info
    if have < SQLITE_MIN:
        raise FsageError(
            f"the path walk and the export need SQLite {'.'.join(map(str, SQLITE_MIN))} or "
            f"newer; this Python's sqlite3 module has {sqlite3.sqlite_version}: use a Python "
            "built against a newer SQLite (Debian 12's is 3.40)"
        )
    path.unlink(missing_ok=True)
    con = sqlite3.connect(path)
    try:
        con.execute("SELECT count(*) FROM json_each('[1]')").fetchone()
    except sqlite3.OperationalError:
        con.close()
        raise FsageError(
            f"this Python's SQLite ({sqlite3.sqlite_version}) was built without its JSON "
            "functions, which the export needs: use a Python built against SQLite 3.38 or "
            "newer, or one with JSON1"
        ) from None
    con.executescript(
        f"""PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF;
        PRAGMA cache_size = -{cache_kib}; PRAGMA temp_store = FILE;"""
    )
    scratch.sqlite_temp_files(con)
    return con


class Buckets:
    """Records of ``dtype`` appended to numbered bucket files (each with its records' names
    when ``names``), read back one bucket at a time."""

    def __init__(
        self, directory: Path, tag: str, dtype: np.dtype[Any], names: bool = False
    ) -> None:
        self.dir = directory
        self.tag = tag
        self.dtype = dtype
        self.names = names
        self.used: set[int] = set()

    def _path(self, k: int, what: str) -> Path:
        return self.dir / f"{self.tag}-{k}.{what}"

    def add(
        self,
        bucket: npt.NDArray[np.int64],
        records: npt.NDArray[Any],
        name_off: npt.NDArray[np.uint64] | None = None,
        names: bytes = b"",
    ) -> None:
        """Append ``records`` (and the names ``names[name_off[i]:name_off[i+1]]``) to the
        bucket each names."""
        if records.size == 0:
            return
        order = np.argsort(bucket, kind="stable")
        b = bucket[order]
        cut = np.flatnonzero(np.diff(b)) + 1
        starts = np.concatenate([[0], cut])
        ends = np.concatenate([cut, [b.size]])
        raw = np.frombuffer(names, np.uint8) if self.names else None
        for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
            k = int(b[s])
            idx = order[s:e]
            self.used.add(k)
            with open(self._path(k, "rec"), "ab") as f:
                records[idx].tofile(f)
            if raw is not None and name_off is not None:
                lo = name_off[:-1][idx].astype(np.int64)
                hi = name_off[1:][idx].astype(np.int64)
                with open(self._path(k, "len"), "ab") as f:
                    (hi - lo).astype("<u4").tofile(f)
                with open(self._path(k, "nam"), "ab") as f:
                    raw[ranges(lo, hi)].tofile(f)

    def load(self, k: int) -> tuple[npt.NDArray[Any], npt.NDArray[np.uint64], bytes]:
        """Bucket ``k``'s records, and its names' offsets and bytes (removed once read)."""
        if k not in self.used:
            return np.zeros(0, self.dtype), np.zeros(1, np.uint64), b""
        rec = np.fromfile(self._path(k, "rec"), self.dtype)
        os.unlink(self._path(k, "rec"))
        off = np.zeros(rec.size + 1, np.uint64)
        names = b""
        if self.names:
            lens = np.fromfile(self._path(k, "len"), "<u4")
            np.cumsum(lens, out=off[1:])
            names = self._path(k, "nam").read_bytes()
            os.unlink(self._path(k, "len"))
            os.unlink(self._path(k, "nam"))
        self.used.discard(k)
        return rec, off, names

    def count(self, k: int) -> int:
        """Records in bucket ``k``."""
        if k not in self.used:
            return 0
        return self._path(k, "rec").stat().st_size // self.dtype.itemsize

    def windows(
        self, k: int, width: int
    ) -> Iterator[tuple[npt.NDArray[Any], npt.NDArray[np.uint64], bytes]]:
        """Bucket ``k`` as ``load`` gives it, ``width`` records at a time (removed once
        read)."""
        if k not in self.used:
            return
        paths = [self._path(k, what) for what in ("rec", "len", "nam")]
        with contextlib.ExitStack() as stack:
            fr = stack.enter_context(open(paths[0], "rb"))
            fl = stack.enter_context(open(paths[1], "rb")) if self.names else None
            fn = stack.enter_context(open(paths[2], "rb")) if self.names else None
            while True:
                rec = np.fromfile(fr, self.dtype, width)
                if rec.size == 0:
                    break
                off = np.zeros(rec.size + 1, np.uint64)
                names = b""
                if fl is not None and fn is not None:
                    np.cumsum(np.fromfile(fl, "<u4", rec.size), out=off[1:])
                    names = fn.read(int(off[-1]))
                yield rec, off, names
        for path in paths if self.names else paths[:1]:
            path.unlink()
        self.used.discard(k)


class Values:
    """Values of one dtype appended in order to one file."""

    def __init__(self, path: Path, dtype: type[np.generic]) -> None:
        self.path = path
        self.dtype = np.dtype(dtype)
        self.n = 0
        path.write_bytes(b"")

    def add(self, values: npt.NDArray[Any]) -> None:
        if values.size:
            with open(self.path, "ab") as f:
                np.ascontiguousarray(values, self.dtype).tofile(f)
            self.n += int(values.size)

    def read(self, lo: int, hi: int) -> npt.NDArray[Any]:
        size = self.dtype.itemsize
        with open(self.path, "rb") as f:
            f.seek(lo * size)
            return np.fromfile(f, self.dtype, hi - lo)

    def windows(self) -> Any:
        for lo in range(0, self.n, WINDOW):
            yield self.read(lo, min(lo + WINDOW, self.n))

    def pairwise_sum(self) -> np.float64:
        """``np.add.reduce`` of the values as one float64 array: numpy sums an array by
        halves (at a multiple of 8) down to blocks, so a window that is one of those halves
        sums as it would inside the whole. A block of up to ``PAIRWISE_BLOCK`` values is
        summed in one piece, as numpy does (and a smaller window would never halve)."""

        def total(lo: int, n: int) -> np.float64:
            if n <= max(WINDOW, PAIRWISE_BLOCK):
                return np.float64(np.add.reduce(self.read(lo, lo + n)))
            half = n // 2
            half -= half % 8
            return np.float64(total(lo, half) + total(lo + half, n - half))

        return total(0, self.n)

    def median(self) -> float:
        """``float(np.median(values))`` of integer or float values (not NaN), found a window
        at a time."""
        n = self.n
        ks = [n // 2] if n % 2 else [n // 2 - 1, n // 2]
        keys = np.array([self._kth(k) for k in ks], np.int64)
        if self.dtype.kind == "f":
            middle = _float_keys(keys).view(np.float64)
        else:
            middle = keys.astype(self.dtype)
        return float(np.median(middle))

    def _keys(self) -> Iterator[npt.NDArray[np.int64]]:
        """The values a window at a time as integers in the values' order."""
        for w in self.windows():
            yield _float_keys(w.astype(np.float64).view(np.int64)) if self.dtype.kind == "f" else w

    def _kth(self, k: int) -> int:
        """The k-th smallest key (0-based): a histogram of the keys narrows their range until
        the candidates fit in a window."""
        lo, hi = None, None
        for w in self._keys():
            if w.size:
                lo = int(w.min()) if lo is None else min(lo, int(w.min()))
                hi = int(w.max()) if hi is None else max(hi, int(w.max()))
        assert lo is not None and hi is not None
        below = 0  # values smaller than lo
        while True:
            inside: list[npt.NDArray[Any]] = []
            count = 0
            for w in self._keys():
                m = w[(w >= lo) & (w <= hi)]
                count += int(m.size)
                if count <= WINDOW:
                    inside.append(m)
            if count <= WINDOW or lo == hi:
                if lo == hi:
                    return lo
                vals = np.sort(np.concatenate(inside))
                return int(vals[k - below])
            bins = 4096
            width = max((hi - lo + 1 + bins - 1) // bins, 1)
            hist = np.zeros(bins + 1, np.int64)
            for w in self._keys():
                m = w[(w >= lo) & (w <= hi)]
                # in unsigned integers: a float's keys can span more than an int64 holds
                at = (m.astype(np.uint64) - np.uint64(lo % (1 << 64))) // np.uint64(width)
                hist += np.bincount(at.astype(np.int64), minlength=bins + 1)[: bins + 1]
            cum = np.cumsum(hist)
            b = int(np.searchsorted(cum, k - below, side="right"))
            below += int(cum[b - 1]) if b else 0
            lo, hi = lo + b * width, min(lo + (b + 1) * width - 1, hi)


def _float_keys(bits: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """A float64's bits (as int64) to an integer that sorts as the float does, and back."""
    return np.where(bits < 0, bits ^ _MAGNITUDE, bits)


class AscendingLookup:
    """``np.searchsorted(values, q)`` (clipped to the last index) in ascending ``values`` on
    disk, for queries that ascend from call to call: a few windows of them in memory."""

    def __init__(self, values: Values) -> None:
        self.values = values
        self.lo = 0  # the index of ``buf[0]``
        self.buf = np.zeros(0, values.dtype)

    def find(self, q: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        n = self.values.n
        if q.size == 0 or n == 0:
            return np.zeros(q.size, np.int64)
        first, last = int(q.min()), int(q.max())
        if self.buf.size and first <= int(self.buf[0]) and self.lo > 0:
            self.lo, self.buf = 0, np.zeros(0, self.values.dtype)  # a query went back
        # drop what lies below the queries, then read on until past them
        keep = max(int(np.searchsorted(self.buf, first, side="left")) - 1, 0)
        self.lo += keep
        self.buf = self.buf[keep:]
        while self.lo + self.buf.size < n and (not self.buf.size or int(self.buf[-1]) < last):
            end = self.lo + self.buf.size
            more = self.values.read(end, min(end + max(WINDOW, 1), n))
            self.buf = np.concatenate([self.buf, more])
        at = np.searchsorted(self.buf, q, side="left") + self.lo
        return np.minimum(at, n - 1).astype(np.int64)
