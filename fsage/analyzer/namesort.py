"""A bucket of named records (``spill.Buckets``) in (parent, name) order, a window at a time,
as ``_kernels.argsort_names`` orders them (ties in the order the records were added).

A bucket of up to two windows is sorted in memory. A larger one (a directory of that many
entries: a mail spool, a cache) is sorted a window at a time into runs on disk, and the runs
merged: memory holds a window and a few keys a run, not the directory, whose sort in memory
costs some 130 bytes an entry (a million entries would be 130 MB).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from fsage import _kernels
from fsage.analyzer.dynamic import ranges
from fsage.analyzer.spill import Buckets

# Keys read ahead from each run while merging (at least): Python tuples, ~150 bytes each.
RUN_KEYS = 256


def sorted_windows(kids: Buckets, k: int, width: int) -> Iterator[npt.NDArray[Any]]:
    """Bucket ``k``'s records (without names) in (parent, name) order, ``width`` at a time;
    the bucket's files are removed."""
    n = kids.count(k)
    if n <= 2 * width:
        rec, off, names = kids.load(k)
        by = _order(rec, off, names)
        del off, names
        for lo in range(0, n, width):
            yield rec[by[lo : lo + width]]
        return
    runs = _runs(kids, k, width)
    try:
        yield from _merged(runs, kids.dtype, width)
    finally:
        for run in runs:
            for what in ("rec", "len", "nam"):
                Path(f"{run}.{what}").unlink(missing_ok=True)


def _order(rec: npt.NDArray[Any], off: Any, names: bytes) -> npt.NDArray[np.int64]:
    par = rec["parent"].astype(np.int64)
    n = par.size
    return np.frombuffer(
        _kernels.argsort_names(par, names, off, np.arange(n, dtype=np.int64)), np.int64
    )


def _runs(kids: Buckets, k: int, width: int) -> list[str]:
    """The bucket a window at a time, each sorted and written (records, name lengths and
    names) to a run of its own; the runs' path stems, in the bucket's order."""
    runs = []
    for i, (rec, off, names) in enumerate(kids.windows(k, width)):
        by = _order(rec, off, names)
        stem = f"{kids.dir / kids.tag}-{k}-run{i}"
        rec[by].tofile(f"{stem}.rec")
        lo = off[:-1][by].astype(np.int64)
        hi = off[1:][by].astype(np.int64)
        (hi - lo).astype("<u4").tofile(f"{stem}.len")
        np.frombuffer(names, np.uint8)[ranges(lo, hi)].tofile(f"{stem}.nam")
        runs.append(stem)
    return runs


def _keys(stem: str, r: int, dtype: np.dtype[Any], step: int) -> Iterator[tuple[int, bytes, int]]:
    """(parent, name, run) of a run's records in order, ``step`` read at a time."""
    with (
        open(f"{stem}.rec", "rb") as fr,
        open(f"{stem}.len", "rb") as fl,
        open(f"{stem}.nam", "rb") as fn,
    ):
        while True:
            rec = np.fromfile(fr, dtype, step)
            if rec.size == 0:
                return
            lens = np.fromfile(fl, "<u4", rec.size).astype(np.int64)
            raw = fn.read(int(lens.sum()))
            at = 0
            for parent, ln in zip(rec["parent"].tolist(), lens.tolist(), strict=True):
                yield parent, raw[at : at + ln], r
                at += ln


def _merged(runs: list[str], dtype: np.dtype[Any], width: int) -> Iterator[npt.NDArray[Any]]:
    """The runs merged, ``width`` records at a time: the merge gives each record's run, and a
    run's records come in its order, so an output window takes the next few of each."""
    step = max(RUN_KEYS, width // max(len(runs), 1))
    merge = heapq.merge(*(_keys(stem, r, dtype, step) for r, stem in enumerate(runs)))
    files = [open(f"{stem}.rec", "rb") for stem in runs]  # noqa: SIM115 (closed below)
    try:
        while True:
            which = np.fromiter((key[2] for key in itertools.islice(merge, width)), np.int64)
            if which.size == 0:
                return
            # the window's places by run (stably: each run's in order), filled run by run
            at = np.argsort(which, kind="stable")
            counts = np.bincount(which, minlength=len(runs)).tolist()
            out = np.empty(which.size, dtype)
            out[at] = np.concatenate(
                [np.fromfile(files[r], dtype, c) for r, c in enumerate(counts) if c]
            )
            yield out
    finally:
        for f in files:
            f.close()
