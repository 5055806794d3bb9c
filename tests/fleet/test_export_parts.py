"""The export reads a snapshot a part at a time: the parts hold what the snapshot rebuilt whole
holds and what debugfs reads from the image; the dataset is the one the whole-snapshot path
writes, table for table; and the export's memory stays below a fraction of one snapshot."""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fsage.analyzer import spill
from fsage.db import parts
from fsage.db.store import Store
from fsage.fleet import export_stream
from fsage.fleet.export import export_parquet
from fsage.layout import FileTable
from tests.fleet.test_chunked import _debugfs_extents, extents_of
from tests.fleet.test_chunked import history as history  # the fixture, shared

REPO = Path(__file__).resolve().parents[2]


def _read_whole(real_parts: Any) -> Any:
    """``Store.snapshot_parts`` as for chunks older than per-column checksums: no parts, so
    that the export reads each snapshot whole."""

    @contextlib.contextmanager
    def whole(
        self: Store, snapshot_id: int, rows: int | None = None, done: Any = None
    ) -> Iterator[object]:
        with real_parts(self, snapshot_id, rows, done) as (held, _):
            yield held, None

    return whole


def _tables(out: Path) -> dict[str, object]:
    import pyarrow.parquet as pq

    return {str(p.relative_to(out)): pq.read_table(p) for p in sorted(out.rglob("*.parquet"))}


def test_parts_hold_the_snapshot_and_what_debugfs_reads(history: tuple[Path, Path]) -> None:
    img, db = history
    with Store.open(db) as store:
        for row in store.snapshots("real"):
            whole = store.load_layout(row.id)
            with store.snapshot_parts(row.id, rows=37) as (_held, sp):
                assert sp is not None
                got = [p for _, p in sp.parts()]
                names = list(sp.names())
                free = list(sp.free_windows())
            assert len(got) > 3  # parts of 37 files of a chunk: many of them
            files = FileTable.concat([p.files for p in got])
            for f in FileTable.__dataclass_fields__:
                assert np.array_equal(getattr(files, f), getattr(whole.files, f)), f
            assert np.array_equal(np.concatenate([w[0] for w in free]), whole.free.start)
            assert np.array_equal(np.concatenate([w[1] for w in free]), whole.free.length)
            assert np.array_equal(np.concatenate([n.parent for n in names]), whole.links.parent)
            assert b"".join(n.names for n in names) == whole.links.names
    reg = np.flatnonzero(files.is_regular() & (np.diff(files.ext_off.astype(np.int64)) > 0))
    sample = sorted(random.Random(3).sample(reg.tolist(), 30))
    want = _debugfs_extents(img, [int(files.ino[i]) for i in sample])
    for i in sample:
        assert extents_of(files, i) == want[int(files.ino[i])], int(files.ino[i])


def test_a_part_is_bounded_over_many_chunks_and_fragmented_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A history of 20 nights (a chunk each, its files spread over every inode range, older
    versions gone between them; files more fragmented every night): every part of the last
    snapshot reads at most about ``PART_ROWS`` rows and ``PART_EXTENTS`` extents over all
    chunks (bounds taken from each chunk alone gave parts of several chunks' rows), and the
    parts together are the snapshot read whole."""
    from fsage.fleet import synth

    db = tmp_path / "long.db"
    with Store.open(db, create=True) as store:
        ids = synth.synthetic_history(store, "long", files=3000, snapshots=20, seed=9,
                                      churn=0.05)  # fmt: skip
    monkeypatch.setattr(parts, "PART_ROWS", 64)
    monkeypatch.setattr(parts, "PART_EXTENTS", 160)
    with Store.open(db) as store:
        whole = store.load_layout(ids[-1])
        with store.snapshot_parts(ids[-1], rows=64) as (_held, sp):
            assert sp is not None and len(sp.chunks) > 10
            got = [p.files for _, p in sp.parts()]
    files = FileTable.concat(got)
    for f in FileTable.__dataclass_fields__:
        assert np.array_equal(getattr(files, f), getattr(whole.files, f)), f
    for part in got:
        per_file = np.diff(part.ext_off.astype(np.int64))
        assert len(part) <= parts.SLACK * 64 + 1
        assert per_file.sum() <= parts.SLACK * 160 + per_file.max(), (len(part), per_file.sum())


def test_a_part_reads_only_the_chunks_that_hold_its_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first snapshot stored in many chunks, each a range of inode numbers: cutting it into
    parts and reading them decodes each chunk's inodes about once a part that holds its files
    (a part asked every chunk, each answer a window of its inodes decoded: parts times
    chunks), and the parts are the snapshot read whole."""
    from fsage.db import versions
    from fsage.fleet import synth

    monkeypatch.setattr(versions, "CHUNK_MAX_ROWS", 500)
    db = tmp_path / "wide.db"
    with Store.open(db, create=True) as store:
        (snap,) = synth.synthetic_history(store, "wide", files=20000, snapshots=1, seed=4)
    reads = 0
    real_values = parts._Column.values

    def counted(self: Any, lo: int, hi: int) -> Any:
        nonlocal reads
        reads += 1
        return real_values(self, lo, hi)

    monkeypatch.setattr(parts._Column, "values", counted)
    with Store.open(db) as store:
        whole = store.load_layout(snap)
        with store.snapshot_parts(snap, rows=100) as (_held, sp):
            assert sp is not None
            chunks = len(sp.chunks)
            made = reads  # the chunks' bits and the parts' bounds
            got = [p.files for _, p in sp.parts()]
    assert chunks >= 40 and len(got) >= 150
    files = FileTable.concat(got)
    for f in FileTable.__dataclass_fields__:
        assert np.array_equal(getattr(files, f), getattr(whole.files, f)), f
    # every chunk's columns once to make its bits, then each bound and each part: a chunk
    # read for the ones that hold its files, and once more where it stops
    assert made <= 4 * chunks + 2 * len(sp.bounds) + 2 * chunks, (made, chunks, len(got))
    assert reads - made <= 2 * len(got) + 2 * chunks, (reads - made, chunks, len(got))


def test_a_large_chunk_s_bits_are_paged_a_small_one_s_held(tmp_path: Path) -> None:
    """A chunk keeps a bit a row while a snapshot is read: summed over the chunks that grows
    with the database, so a chunk of 600k rows (75 KiB of bits) keeps them in a scratch
    file's pages, which the export's trims drop from memory; a small chunk's stay in the
    heap (a mapping costs a file and its page faults)."""
    from fsage import paged
    from fsage.db import versions
    from fsage.fleet import synth

    db = tmp_path / "big.db"
    with Store.open(db, create=True) as store:
        (big,) = synth.synthetic_history(store, "big", files=600_000, snapshots=1, seed=5)
        (small,) = synth.synthetic_history(store, "small", files=2000, snapshots=1, seed=6)
    with Store.open(db) as store:
        for snap, want in ((big, True), (small, False)):
            with store.snapshot_parts(snap) as (_held, sp):
                assert sp is not None and len(sp.chunks) == 1
                (chunk,) = sp.chunks
                assert chunk.n >= 2000 and (chunk.n >= 600_000) == want
                assert paged.is_paged(chunk.user.bits) == want, (chunk.n, want)
    assert (versions.CHUNK_MAX_ROWS + 7) // 8 >= paged.PAGED_BYTES  # the largest chunk's too


def test_export_by_parts_is_the_whole_snapshot_export(
    history: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("pyarrow")
    _, db = history
    real_parts = Store.snapshot_parts
    monkeypatch.setattr(Store, "snapshot_parts", _read_whole(real_parts))
    export_parquet(db, tmp_path / "whole", host="h")
    monkeypatch.setattr(Store, "snapshot_parts", real_parts)
    # parts, names and windows of a few dozen: every carried state crosses many boundaries
    monkeypatch.setattr(parts, "PART_ROWS", 23)
    monkeypatch.setattr(parts, "NAME_ROWS", 17)
    monkeypatch.setattr(spill, "WINDOW", 31)
    calls = []
    real_export = export_stream.export_snapshot

    def counted(*a: object, **k: object) -> object:
        calls.append(1)
        return real_export(*a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr("fsage.fleet.export.export_snapshot", counted)
    export_parquet(db, tmp_path / "parts", host="h")
    assert len(calls) == 2  # both snapshots went a part at a time
    a, b = _tables(tmp_path / "whole"), _tables(tmp_path / "parts")
    assert a.keys() == b.keys() and len(a) == 7
    for name, table in a.items():
        assert table.equals(b[name]), name  # type: ignore[attr-defined]
    metrics = a[next(k for k in a if k.startswith("metrics/"))].to_pylist()  # type: ignore[attr-defined]
    # the figures are there to compare: the walk, the directories' scans, the gaps
    assert all(m["dynamic_layout_score_path"] is not None for m in metrics)
    assert all(m["dir_scan_score_median"] is not None for m in metrics)
    assert all(m["neighbour_pairs"] > 0 for m in metrics)
    assert all(m["inode_to_data_median_blocks"] is not None for m in metrics)


@pytest.mark.parametrize("fanout", [0, 3, 1])
def test_a_flat_tree_walked_from_disk_is_the_whole_snapshot_export(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fanout: int
) -> None:
    """Hundreds of directories, every one under the root (``fanout`` 0), nested some six
    levels deep (3) or in one chain 400 deep (1): with windows of 16 the root's walk bucket
    is sorted in runs on disk and merged, and the directories' depths, sizes and positions
    are found in the tree's scratch file; the figures are those of the snapshot read whole
    (the walk in memory)."""
    pytest.importorskip("pyarrow")
    from fsage.analyzer import namesort
    from fsage.fleet import synth

    db = tmp_path / "flat.db"
    monkeypatch.setattr(synth, "PER_DIR", 4)
    monkeypatch.setattr(synth, "FANOUT", fanout)
    with Store.open(db, create=True) as store:
        synth.synthetic_history(store, "flat", files=1600, snapshots=2, seed=5)
    real_parts = Store.snapshot_parts
    monkeypatch.setattr(Store, "snapshot_parts", _read_whole(real_parts))
    export_parquet(db, tmp_path / "whole", host="h")
    monkeypatch.setattr(Store, "snapshot_parts", real_parts)
    monkeypatch.setattr(parts, "PART_ROWS", 97)
    monkeypatch.setattr(spill, "WINDOW", 16)
    merged = []
    real_merged = namesort._merged

    def counted(*a: Any) -> Iterator[Any]:
        merged.append(1)
        return real_merged(*a)

    monkeypatch.setattr(namesort, "_merged", counted)
    export_parquet(db, tmp_path / "parts", host="h")
    assert merged or fanout  # the root's bucket was sorted in runs on disk
    a, b = _tables(tmp_path / "whole"), _tables(tmp_path / "parts")
    assert a.keys() == b.keys()
    for name, table in a.items():
        assert table.equals(b[name]), name  # type: ignore[attr-defined]
    metrics = a[next(k for k in a if k.startswith("metrics/"))].to_pylist()  # type: ignore[attr-defined]
    assert all(m["dynamic_layout_score_path"] is not None for m in metrics)
    assert all(m["dir_scan_score_median"] is not None for m in metrics)


def test_spilled_mean_and_median_are_numpy_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(spill, "WINDOW", 1000)
    rng = np.random.default_rng(5)
    for n in (1, 2, 999, 1000, 1001, 54321):
        x = rng.random(n) * rng.random(n)
        v = spill.Values(tmp_path / f"f{n}", np.float64)
        for lo in range(0, n, 777):
            v.add(x[lo : lo + 777])
        assert v.pairwise_sum() / n == np.mean(x)
        d = rng.integers(0, 1 << 40, n) // rng.integers(1, 1 << 20, n)
        w = spill.Values(tmp_path / f"d{n}", np.int64)
        w.add(d)
        assert w.median() == float(np.median(d))


def test_a_spilled_median_of_floats_is_numpy_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Floats of both signs, zeros, ties and magnitudes far apart (their keys span more than
    an int64), narrowed window by window as the integers are."""
    monkeypatch.setattr(spill, "WINDOW", 64)
    rng = np.random.default_rng(9)
    for n in (1, 2, 3, 64, 65, 2000, 2001):
        x = rng.standard_normal(n) * 10.0 ** rng.integers(-300, 300, n)
        x[rng.random(n) < 0.2] = 0.5  # a tie across windows
        x[rng.random(n) < 0.05] = -1e308
        v = spill.Values(tmp_path / f"x{n}", np.float64)
        for lo in range(0, n, 50):
            v.add(x[lo : lo + 50])
        assert v.median() == float(np.median(x)), n
        y = 1.0 - rng.integers(0, 9, n) / rng.integers(1, 9, n)  # directory scores
        w = spill.Values(tmp_path / f"y{n}", np.float64)
        w.add(y)
        assert w.median() == float(np.median(y)), n


def test_an_ascending_lookup_is_searchsorted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(spill, "WINDOW", 7)
    rng = np.random.default_rng(4)
    keys = np.unique(rng.integers(0, 5000, 300))
    values = spill.Values(tmp_path / "keys", np.int64)
    values.add(keys)
    find = spill.AscendingLookup(values)
    q = np.sort(np.concatenate([keys[::3], rng.integers(-10, 5100, 400)]))
    for piece in np.array_split(q, 37):  # queries that ascend from call to call
        want = np.minimum(np.searchsorted(keys, piece), keys.size - 1)
        assert find.find(piece).tolist() == want.tolist()
    back = np.array([keys[5], keys[6]])  # a query that goes back reads from the start
    assert find.find(back).tolist() == [5, 6]
    assert len(find.buf) < keys.size  # the windows behind the queries were let go


def test_the_inodes_that_name_entries_are_every_piece_s_made_unique(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Marked a bit each among the user files' inode numbers, gathered outside them (below,
    above, reserved): the sorted unique parents of every piece, whatever the window; the set
    the parts ask holds those and no other inode."""

    class Pieces:
        def __init__(self, base: int, n: int, pieces: list[np.ndarray]) -> None:
            self.span, self.pieces = (base, n), pieces

        def inode_bits(self) -> parts._Bits:
            base, n = self.span
            return parts._Bits(np.zeros((n + 7) >> 3, np.uint8), n, base)

        def parents(self) -> Iterator[np.ndarray]:
            yield from self.pieces

    monkeypatch.setattr(spill, "WINDOW", 3)
    rng = np.random.default_rng(8)
    for base, n in ((0, 0), (8, 1), (16, 100), (1024, 5000)):
        pieces = [rng.integers(0, base + n + 60, rng.integers(0, 40)).astype(np.uint64)
                  for _ in range(23)]  # fmt: skip
        pieces.append(np.zeros(0, np.uint64))
        holds, any_name = export_stream._parents(Pieces(base, n, pieces))  # type: ignore[arg-type]
        want = np.unique(np.concatenate(pieces).astype(np.int64))
        got = holds.select(np.arange(holds.size, dtype=np.int64))
        assert got.tolist() == want.tolist() and any_name == (want.size > 0)
        asked = np.arange(-3, base + n + 70, dtype=np.int64)
        assert holds(asked).tolist() == np.isin(asked, want).tolist()
    holds, any_name = export_stream._parents(Pieces(8, 8, []))  # type: ignore[arg-type]
    assert holds.size == 0 and not any_name
    assert not holds(np.arange(0, 40, dtype=np.int64)).any()


LOOP_SECONDS = 60


def test_a_walk_whose_root_lies_in_a_loop_ends(tmp_path: Path) -> None:
    """The root's own record names a parent below it: the walk follows each directory's one
    parent from the root, so the root's is cut (its queries would loop for ever), and the
    figures are those of the same tree with no parent for the root."""
    import faulthandler

    from fsage.analyzer.pathwalk import REC, PathWalk, bucket_starts

    def walked(root_parent: int, tmp: Path) -> dict[str, Any]:
        rec = np.zeros(4, REC)
        rec["ino"] = [100, 200, 300, 301]
        rec["parent"] = [root_parent, 100, 200, 200]
        rec["kind"] = [2, 2, 1, 1]
        rec["first"] = [-1, -1, 5000, 5010]
        rec["last"] = [-1, -1, 5003, 5011]
        rec["nown"], rec["blocks"] = [0, 0, 1, 1], [0, 0, 4, 2]
        rec["head"], rec["tail"] = [0, 0, 5000, 5010], [0, 0, 5004, 5012]
        parents = np.array([100, 200], np.int64)
        tmp.mkdir()
        walk = PathWalk(tmp, None, 100, 4096, None, parents[bucket_starts(np.array([1, 3]))])
        walk.add(rec, np.arange(4), np.arange(5, dtype=np.uint64), b"abcd",
                 np.isin(rec["ino"], parents))  # fmt: skip
        return walk.finish()

    # a query that loops holds the interpreter in SQLite: no signal handler runs, so the
    # whole run is ended with the stacks printed, not left to fill the disk
    faulthandler.dump_traceback_later(LOOP_SECONDS, exit=True)
    try:
        looped = walked(200, tmp_path / "loop")
    finally:
        faulthandler.cancel_dump_traceback_later()
    tree = walked(-1, tmp_path / "tree")
    assert looped == tree and tree["path"]["blocks"] == 6


def test_the_walk_gives_freed_memory_back_within_its_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A walk of many windows trims the heap every ``TRIM_WINDOWS`` of them, in each step,
    not only between steps (the pieces its windows left between longer-lived arrays made its
    peak grow with the snapshot), and its figures are those of a walk not trimmed."""
    from fsage.analyzer import pathwalk
    from fsage.analyzer.pathwalk import REC, PathWalk, bucket_starts

    monkeypatch.setattr(spill, "WINDOW", 4)
    monkeypatch.setattr(pathwalk, "TRIM_WINDOWS", 2)
    n = 60
    rec = np.zeros(n + 1, REC)
    rec["ino"] = np.arange(100, 101 + n)
    rec["parent"] = [-1] + [100] * n
    rec["kind"] = [2] + [1] * n
    first = 5000 + 7 * np.arange(n)
    rec["first"][1:], rec["last"][1:] = first, first + 2
    rec["nown"][1:], rec["blocks"][1:] = 1, 3
    rec["head"][1:], rec["tail"][1:] = first, first + 3
    names = b"".join(b"f%03d" % i for i in range(n + 1))
    off = np.arange(0, 4 * (n + 2), 4, dtype=np.uint64)

    def walked(tmp: Path, trim: Any) -> dict[str, Any]:
        tmp.mkdir()
        walk = PathWalk(tmp, None, 100, 4096, None,
                        np.array([100], np.int64)[bucket_starts(np.array([n]))])  # fmt: skip
        walk.add(rec, np.arange(n + 1), off, names, rec["ino"] == 100)
        return walk.finish(trim)

    trims: list[int] = []
    assert walked(tmp_path / "trimmed", lambda: trims.append(1)) == walked(tmp_path / "not", None)
    # 15 windows in step 1 and 3 each (60 entries, 4 a window), buckets in step 4: a trim
    # every 2 of them, and 2 between the steps
    assert len(trims) >= 2 + 15, len(trims)


@pytest.mark.parametrize("width", [1, 3, 50])
def test_a_large_bucket_sorted_in_runs_is_the_kernel_s_order(tmp_path: Path, width: int) -> None:
    """A bucket of many windows, merged from sorted runs: the order ``argsort_names`` gives
    the whole bucket, ties (one name twice in a directory) in the order they were added,
    names that are not UTF-8 or empty too."""
    from fsage import _kernels
    from fsage.analyzer import namesort
    from fsage.analyzer.pathwalk import REC

    rng = random.Random(width)
    n = 400
    rec = np.zeros(n, REC)
    rec["parent"] = [rng.choice([7, 9, 2**40]) for _ in range(n)]
    rec["ino"] = np.arange(n)
    raw = [rng.choice([b"", b"a", b"ab", b"\xff", b"b\x00", b"z" * rng.randrange(1, 4)])
           for _ in range(n)]  # fmt: skip
    off = np.cumsum([0, *map(len, raw)]).astype(np.uint64)
    names = b"".join(raw)
    kids = spill.Buckets(tmp_path, "kids", REC, names=True)
    for lo in range(0, n, 37):  # added in pieces, as the parts come
        hi = min(lo + 37, n)
        piece = names[int(off[lo]) : int(off[hi])]
        kids.add(np.zeros(hi - lo, np.int64), rec[lo:hi], off[lo : hi + 1] - off[lo], piece)
    want = np.frombuffer(
        _kernels.argsort_names(rec["parent"].astype(np.int64), names, off,
                               np.arange(n, dtype=np.int64)), np.int64,
    )  # fmt: skip
    got = np.concatenate(list(namesort.sorted_windows(kids, 0, width)))
    assert got["ino"].tolist() == rec["ino"][want].tolist()
    assert sorted(os.listdir(tmp_path)) == []  # runs and the bucket removed


@pytest.mark.parametrize("window", [4, 9, 15, 100, 129])
def test_a_spilled_sum_in_small_windows_is_numpy_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, window: int
) -> None:
    # windows under 16 once halved to nothing and recursed without end
    monkeypatch.setattr(spill, "WINDOW", window)
    rng = np.random.default_rng(window)
    for n in (1, 7, 8, 15, 16, 17, 127, 128, 129, 300, 5000):
        x = rng.random(n) * 1e6 / rng.random(n)
        v = spill.Values(tmp_path / f"w{window}-{n}", np.float64)
        for lo in range(0, n, 3):
            v.add(x[lo : lo + 3])
        assert v.pairwise_sum() == np.add.reduce(x)


PROBE = """
import json, sys, tracemalloc
from pathlib import Path
from fsage.db.store import Store
from fsage.fleet.export import export_parquet
from fsage.fleet.synth import synthetic_history
import fsage.db.parts, fsage.analyzer.spill, fsage.fleet.export
import pyarrow.parquet, fsage.fleet.compact  # imported before the count starts
db, out, files = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
with Store.open(db, create=True) as store:
    synthetic_history(store, "big", files=files, snapshots=2, seed=3)
fsage.db.parts.PART_ROWS = fsage.db.parts.NAME_ROWS = fsage.analyzer.spill.WINDOW = 4096
fsage.fleet.export.FILES_CHUNK = 4096  # row groups too: their rows are held until written
# the windows a chunk's columns and the free map are read in, as small: a window still
# growing with the files at 160k would pass for what the export holds per file
fsage.db.parts.MARK_ROWS = 4096
fsage.db.parts.CRC_PIECE = 1 << 15
tracemalloc.start()
with Store.open(db) as store:
    base = tracemalloc.get_traced_memory()[0]
    layout = store.load_layout(store.snapshots("big")[-1].id)
    snapshot = tracemalloc.get_traced_memory()[0] - base
    free = layout.free.start.nbytes + layout.free.length.nbytes
    del layout
base = tracemalloc.get_traced_memory()[0]
tracemalloc.reset_peak()
export_parquet(db, out, host="h")
peak = tracemalloc.get_traced_memory()[1] - base
print(json.dumps({"snapshot": snapshot, "free": free, "files": files, "peak": peak}))
"""


def _probe(tmp_path: Path, files: int) -> dict[str, int]:
    """The export's traced peak over a synthetic history of ``files`` files, in a fresh
    process (nothing another test or size allocated counts)."""
    argv = [sys.executable, "-c", PROBE, str(tmp_path / f"m{files}.db"),
            str(tmp_path / f"out{files}"), str(files)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=True, timeout=300)
    got: dict[str, int] = json.loads(done.stdout.splitlines()[-1])
    return got


@pytest.mark.slow
def test_export_holds_a_part_not_a_snapshot(tmp_path: Path) -> None:
    """Every allocation numpy and Python make is traced (deterministic, unlike the resident
    set on a shared machine). With parts, windows and row groups of 4096 files, what the
    export holds for the whole snapshot is a few bytes a file and per-directory state: its
    peak stays below a third of one loaded snapshot of 160k files, and grows by less than an
    eighth of what a loaded snapshot grows by from 40k to 160k files (holding every file's
    inode and row, and the free map whole, as the export once did, grows by a quarter)."""
    pytest.importorskip("pyarrow")
    small, big = _probe(tmp_path, 40_000), _probe(tmp_path, 160_000)
    assert big["snapshot"] > 16 << 20  # a snapshot of 160k files: the measure means something
    assert big["free"] > 4 * small["free"] // 2  # the free map grows with the files too
    assert big["peak"] < big["snapshot"] / 3, big
    grown = big["peak"] - small["peak"]
    assert grown < (big["snapshot"] - small["snapshot"]) / 8, (small, big)


def test_held_rows_wait_on_disk_and_make_the_same_row_groups(tmp_path: Path) -> None:
    """Tables of a few rows held over many parts (``hold``, ``settle`` between parts) make the
    Parquet file that writing each at once makes: the same rows in the same row groups, as
    pyarrow reads them back; between parts no held row is in memory, only on disk."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rng = np.random.default_rng(11)
    schema = pa.schema([("ino", pa.int64()), ("path", pa.string())])
    tables = []
    for _ in range(40):
        n = int(rng.integers(0, 900))
        ino = rng.integers(0, 1 << 40, n)
        tables.append(pa.table({"ino": ino, "path": [f"/d/{i:x}" for i in ino]}, schema=schema))
    files = {}
    for how in ("write", "hold"):
        path = tmp_path / f"{how}.parquet"
        rg = export_stream.RowGroups(pa, lambda k, p=path: pq.ParquetWriter(p, schema), size=4096)
        for k, t in enumerate(tables):
            if how == "write":
                rg.write_table(t)
                continue
            rg.hold(t)
            rg.settle(tmp_path / "waiting")
            assert rg.pending == []  # what waits for a row group is on disk
            assert (tmp_path / "waiting").exists() == (rg.rows > 0), k
        rg.close()
        files[how] = pq.ParquetFile(path)
    md = [f.metadata for f in files.values()]
    groups = [[m.row_group(i).num_rows for i in range(m.num_row_groups)] for m in md]
    assert groups[0] == groups[1]
    assert len(groups[0]) > 4 and set(groups[0][:-1]) == {4096}
    expect = pa.concat_tables(tables)
    for f in files.values():
        assert f.read().equals(expect)
    assert not (tmp_path / "waiting").exists()


def test_inode_bits_count_from_the_lowest_inode_set() -> None:
    """A chunk's bit per inode starts at its lowest user file: the bits answer as a set of the
    inodes would (below the first, between, past the last), and hold about the range, not
    every inode number from 0."""
    rng = np.random.default_rng(5)
    inos = np.unique(rng.integers(5_000_000, 5_100_000, 20_000)).astype(np.int64)
    bits = parts._Bits.ones(0)
    for lo in range(0, inos.size, 3000):  # a window at a time, as a chunk is read
        bits.add(inos[lo : lo + 3000])
    probe = np.concatenate([inos, rng.integers(0, 5_200_000, 50_000), [-1, 0, 4_999_999]])
    assert bits.at(probe.astype(np.int64)).tolist() == np.isin(probe, inos).tolist()
    assert bits.bits.nbytes < 2 * (100_000 // 8)


def test_one_inode_bitmap_holds_every_chunks_files() -> None:
    """A snapshot's chunks' inode bits merged into one: it answers as the set of all their
    inodes does, and holds the span of the inodes once, not once per chunk."""
    rng = np.random.default_rng(11)
    first = np.arange(1000, 400_000, dtype=np.int64)  # the first chunk: most inodes
    sets = [first] + [np.unique(rng.integers(1000, 420_000, 3000)) for _ in range(5)]
    chunks = []
    for inos in sets:
        bits = parts._Bits.ones(0)
        bits.add(inos.astype(np.int64))
        chunks.append(bits)
    union = parts._Bits.union(chunks)
    every = np.unique(np.concatenate(sets))
    probe = np.concatenate([every, rng.integers(0, 500_000, 50_000), [-1, 0, 999, 420_000]])
    assert union.at(probe.astype(np.int64)).tolist() == np.isin(probe, every).tolist()
    assert union.bits.nbytes < 2 * (420_000 // 8)
    assert parts._Bits.union([parts._Bits.ones(0)]).at(np.array([0, 5])).tolist() == [0, 0]


def test_an_export_with_its_bits_paged_is_the_export_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every bit array and per-directory count of the export in a scratch file's pages, its
    pages dropped at each trim (``paged.PAGED_BYTES`` 1): the same tables as with all of them
    in memory."""
    pytest.importorskip("pyarrow")
    from fsage import paged
    from fsage.fleet import synth

    db = tmp_path / "paged.db"
    monkeypatch.setattr(synth, "PER_DIR", 6)
    monkeypatch.setattr(synth, "FANOUT", 3)
    with Store.open(db, create=True) as store:
        synth.synthetic_history(store, "p", files=2400, snapshots=3, seed=11, churn=0.05)
    monkeypatch.setattr(parts, "PART_ROWS", 97)
    monkeypatch.setattr(export_stream, "TRIM_PARTS", 2)
    monkeypatch.setattr(paged, "PAGED_BYTES", 1 << 40)
    export_parquet(db, tmp_path / "memory", host="h")
    monkeypatch.setattr(paged, "PAGED_BYTES", 1)
    released: list[int] = []
    real_release = paged.release
    monkeypatch.setattr(paged, "release", lambda *a: released.append(real_release(*a)) or 0)
    export_parquet(db, tmp_path / "paged", host="h")
    assert max(released) >= 4  # the snapshot's bits, the parents' bits and counts, ...
    a, b = _tables(tmp_path / "memory"), _tables(tmp_path / "paged")
    assert a.keys() == b.keys()
    for name, table in a.items():
        assert table.equals(b[name]), name  # type: ignore[attr-defined]
