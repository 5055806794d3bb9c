"""An LFS operation that fails leaves the file system exactly as it was; random op streams on
small images, run to exhaustion and beyond, keep fsck clean after every batch and after reopen
(issue 17 part 1)."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from fsage.ager.profile import get_preset
from fsage.ager.run import AgeOptions, age, aging_runs
from fsage.cli import main
from fsage.db.store import Store
from fsage.errors import FsageError, UsageError
from fsage.lfs import format as fmt
from fsage.lfs.executor import LfsExecutor
from fsage.lfs.format import LfsNoSpace
from fsage.lfs.fs import LFS, LfsOpError, mkfs
from fsage.lfs.fsck import fsck
from fsage.lfs.sim import random_update
from fsage.workload import NoSpaceError, Op, OpFailedError, WorkloadHeader, write_workload


def image(path: Path, segments: int = 24, bps: int = 32, policy: str = "greedy") -> Path:
    mkfs(path, segments=segments, blocks_per_segment=bps, block_size=4096, cleaning_policy=policy)
    return path


def state(fs: LFS) -> dict[str, Any]:
    """Everything a user can see: every path's stat (but atime) and content."""
    out: dict[str, Any] = {}
    todo = [""]
    while todo:
        d = todo.pop()
        for name, ino in sorted(fs.readdir(d)):
            p = f"{d}/{name}" if d else name
            st = fs.stat(p)
            key = (st.ino, st.mode, st.nlink, st.size, st.blocks, st.mtime_ms, st.ctime_ms)
            if fs.is_dir(ino):
                out[p] = key
                todo.append(p)
            else:
                out[p] = (key, fs.read(p) if st.mode & 0o170000 == 0o100000 else fs.readlink(p))
    root = fs.stat("")
    out[""] = (root.nlink, root.mtime_ms)
    return out


def assert_clean(img: Path) -> None:
    rep = fsck(img)
    assert rep.ok, rep.problems[:5]


def test_a_write_that_does_not_fit_changes_nothing(tmp_path: Path) -> None:
    img = image(tmp_path / "a.img")
    with LFS.open(img) as fs:
        fs.mkdir("d")
        fs.create("d/f")
        fs.write("d/f", 0, b"x" * 20000)
        fs.create("g")
        fs.sync()  # usage counts blocks in the log: what waits in memory is not there yet
        before = state(fs)
        usage = fs.usage()
        with pytest.raises(LfsNoSpace):
            fs.write("g", 0, bytes(range(256)) * 12288)  # 3 MiB on a 2.6 MiB log
        assert state(fs) == before
        assert fs.usage() == usage
        fs.sync()
        assert_clean(img)
    assert_clean(img)


def test_an_op_failing_part_way_is_undone_whole(tmp_path: Path) -> None:
    """Several calls in one ``atomic`` group; the last fails: all of them are undone,
    on disk too (fsck, and a reopen sees the state before)."""
    img = image(tmp_path / "a.img")
    with LFS.open(img) as fs:
        fs.create("keep")
        fs.write("keep", 0, b"k" * 9000)
        before = state(fs)
        with pytest.raises(LfsOpError), fs.atomic(40):
            fs.mkdir("new")
            fs.create("new/f")
            fs.write("new/f", 0, b"y" * 70000)
            fs.write("keep", 100, b"z" * 5000)
            fs.unlink("keep")
            fs.unlink("no-such-file")
        assert state(fs) == before
        fs.sync()
        assert_clean(img)
    with LFS.open(img) as fs:
        assert state(fs) == before


def _pending(fs: LFS) -> tuple[list[int], list[bytes], set[int], list[list[int]]]:
    """The changes waiting in memory for the next commit, and the system files' maps."""
    maps = [list(fs.inode(i).ptr) for i in fmt.SYSTEM_FILES]
    return list(fs._dirty), list(fs._dirch), set(fs._dirty_dirs), maps


@pytest.mark.parametrize("commit_inside", [False, True])
def test_an_undone_op_keeps_the_changes_waiting_before_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, commit_inside: bool
) -> None:
    """Savepoints keep only a count of the inodes and directory records waiting for a commit
    (or copy them when a commit comes inside the operation): an undone operation leaves
    exactly the changes made before it waiting, and they reach the log whole."""
    img = image(tmp_path / "a.img")
    with LFS.open(img) as fs:
        fs.mkdir("d")
        for i in range(5):
            fs.create(f"d/f{i}")
            fs.write(f"d/f{i}", 0, bytes([i]) * 3000)
        pending = _pending(fs)
        assert pending[0] and pending[1]  # buffered, not yet committed
        before = state(fs)
        clean = set(fs.clean)
        with pytest.raises(LfsOpError), fs.atomic(4):
            fs.create("d/new")
            fs.write("d/new", 0, b"n" * 9000)
            fs.unlink("d/f0")
            if commit_inside:
                fs._commit()
            fs.unlink("no-such-file")
        assert _pending(fs) == pending
        assert state(fs) == before
        assert clean - fs.clean <= {fs.next_seg}  # the undo may name the next segment
        fs.sync()
        assert_clean(img)
    with LFS.open(img) as fs:
        assert state(fs) == before


def test_attribute_changes_without_a_savepoint_still_reach_the_log(tmp_path: Path) -> None:
    """chmod/utimens and one-block writes with no commit due change memory only (no
    savepoint); they wait for the next commit like any buffered change."""
    img = image(tmp_path / "a.img")
    with LFS.open(img) as fs:
        ino = fs.create("f")
        taken = []
        real = fs._savepoint
        fs._savepoint = lambda: taken.append(1) or real()  # type: ignore[method-assign]
        fs.write_ino(ino, 10, b"abc")
        st = fs.setattr_ino(ino, mode=0o600, mtime_ms=12345)
        assert taken == []
        assert (st.mode & 0o7777, st.mtime_ms) == (0o600, 12345)
        assert fs.read_ino(ino) == bytes(10) + b"abc"
        assert ino in fs._dirty
        with pytest.raises(LfsOpError):
            fs.setattr_ino(999, mode=0o600)  # no such inode: refused before any change
    with LFS.open(img) as fs:
        st = fs.stat("f")
        assert (st.mode & 0o7777, st.mtime_ms, st.size) == (0o600, 12345, 13)
        assert fs.lookup(fmt.INO_ROOT, "f") == st
        assert fs.lookup(fmt.INO_ROOT, "g") is None
    assert_clean(img)


def test_creates_and_unlinks_without_indirect_blocks_take_no_savepoint(tmp_path: Path) -> None:
    """Creating a file with a plain name and unlinking one without indirect blocks change
    memory only; names a directory change record cannot hold, and files with indirect blocks,
    take the savepoint (and a name too long changes nothing)."""
    img = image(tmp_path / "a.img", segments=48)
    with LFS.open(img) as fs:
        taken: list[int] = []
        real = fs._savepoint
        fs._savepoint = lambda: taken.append(1) or real()  # type: ignore[method-assign]
        a = fs.create_at(fmt.INO_ROOT, "a")
        fs.write_ino(a, 0, b"small")
        b = fs.create_at(fmt.INO_ROOT, "b")
        fs.unlink_at(fmt.INO_ROOT, "a")
        assert taken == []
        before = state(fs)
        with pytest.raises(LfsOpError, match="name too long"):
            fs.create_at(fmt.INO_ROOT, "x" * 256)
        assert taken == [1] and state(fs) == before
        fs.write_ino(b, 0, os.urandom(14 * 4096))  # past the 12 direct blocks
        taken.clear()
        fs.unlink_at(fmt.INO_ROOT, "b")
        assert taken == [1]
        c = fs.create_at(fmt.INO_ROOT, "c")
        fs.write_ino(c, 0, b"kept")
    assert_clean(img)
    with LFS.open(img) as fs:
        assert sorted(n for n, _ in fs.readdir("")) == ["c"]
        assert fs.read("c") == b"kept"


def test_a_commit_due_is_made_before_an_in_memory_op_which_then_keeps_its_change(
    tmp_path: Path,
) -> None:
    """When a commit is due, an operation that may stay in memory commits what waits first
    (no savepoint); the commit may drop cached inodes and directories, and the operation's
    own change still lands."""
    img = image(tmp_path / "a.img", segments=48)
    with LFS.open(img) as fs:
        a = fs.create_at(fmt.INO_ROOT, "a")
        fs.create_at(fmt.INO_ROOT, "b")
        taken: list[int] = []
        real_sp, real_commit = fs._savepoint, fs._commit
        fs._savepoint = lambda: taken.append(1) or real_sp()  # type: ignore[method-assign]

        def commit_and_forget() -> None:
            real_commit()
            fs._icache.clear()  # as the cache trim after a commit may
            fs._dirs.clear()

        fs._commit = commit_and_forget  # type: ignore[method-assign]

        def due() -> None:
            assert fs._pending_since is not None
            fs._pending_since -= 3600  # older than commit_interval: a commit is due

        due()
        fs.write_ino(a, 0, b"x" * 5000)
        assert fs.read_ino(a) == b"x" * 5000
        due()
        fs.setattr_ino(a, mode=0o600)
        assert fs.stat_ino(a).mode & 0o7777 == 0o600
        due()
        c = fs.create_at(fmt.INO_ROOT, "c")
        assert fs.stat_ino(c).nlink == 1
        due()
        fs.unlink_at(fmt.INO_ROOT, "b")
        assert sorted(fs.directory(fmt.INO_ROOT)) == ["a", "c"]
        assert taken == []
    assert_clean(img)
    with LFS.open(img) as fs:
        assert fs.read("a") == b"x" * 5000 and fs.stat("a").mode & 0o7777 == 0o600
        assert sorted(fs.directory(fmt.INO_ROOT)) == ["a", "c"]


def test_a_commit_leaves_the_times_of_a_directory_that_shrank(tmp_path: Path) -> None:
    """The commit that writes a directory file shorter than before truncates it; the
    directory's times are those of the change, not of the commit (a cleaning pass commits
    inside an operation that then fails for want of space, which must change nothing)."""
    img = image(tmp_path / "a.img")
    with LFS.open(img) as fs:
        for i in range(40):
            fs.create(f"name-long-enough-to-fill-{i:03}")
        fs.sync()
        for i in range(40):
            fs.unlink(f"name-long-enough-to-fill-{i:03}")
        st = fs.stat("")
        time.sleep(0.01)
        fs.sync()
        assert (fs.stat("").mtime_ms, fs.stat("").ctime_ms) == (st.mtime_ms, st.ctime_ms)
    with LFS.open(img) as fs:
        assert (fs.stat("").mtime_ms, fs.stat("").ctime_ms) == (st.mtime_ms, st.ctime_ms)


def test_writes_of_a_few_blocks_stay_in_memory_and_match_a_model(tmp_path: Path) -> None:
    """Writes of several blocks that fit the segment buffer take no savepoint (as the
    kernel's writeback cache sends a small file's pages), past the direct blocks too; partly
    rewritten blocks, blocks still in the buffer and holes read back as a model says, before
    and after the commit and a reopen."""
    img = image(tmp_path / "a.img", segments=32, bps=32)
    rnd = random.Random(7)
    model: dict[str, bytearray] = {}
    with LFS.open(img) as fs:
        taken = []
        real = fs._savepoint
        fs._savepoint = lambda: taken.append(1) or real()  # type: ignore[method-assign]
        for step in range(300):
            name = f"f{rnd.randrange(6)}"
            if name not in model:
                fs.create(name)
                model[name] = bytearray()
            off = rnd.randrange(0, 20 * 4096)  # direct blocks and the first indirect ones
            data = os.urandom(rnd.randrange(1, 3 * 4096 + 100))
            fs.write(name, off, data)
            buf = model[name]
            if len(buf) < off + len(data):
                buf.extend(bytes(off + len(data) - len(buf)))
            buf[off : off + len(data)] = data
            if step % 50 == 49:
                fs.sync()
            assert fs.read(name) == bytes(buf)
        assert len(taken) < 300 // 4  # most writes took none (creates and big writes do)
    assert_clean(img)
    with LFS.open(img) as fs:
        for name, buf in model.items():
            assert fs.read(name) == bytes(buf)


def test_a_buffered_write_that_cannot_read_an_old_block_changes_nothing(
    tmp_path: Path,
) -> None:
    """The old content of a block a write changes in part is read before the first change: a
    bad block pointer fails the write with the file and the log as they were."""
    img = image(tmp_path / "a.img")
    with LFS.open(img) as fs:
        ino = fs.create("f")
        fs.write_ino(ino, 0, b"x" * 3 * 4096)
        fs.sync()
        inode = fs._iget(ino)
        inode.ptr[1] = (fs.geo.segments + 5) << 32  # beyond the disk
        before = (list(inode.ptr), inode.size, fs.cur_pos, fs.seq, dict(fs._dirty))
        with pytest.raises(fmt.LfsError):
            fs.write_ino(ino, 100, b"y" * 5000)  # all of block 0's tail, part of block 1
        assert (list(inode.ptr), inode.size, fs.cur_pos, fs.seq, dict(fs._dirty)) == before
        fs.closed = True  # the image was damaged in memory only: do not write it
    with LFS.open(img) as fs:  # the same with a bad pointer to an indirect block
        ino = fs.create("g")
        fs.write_ino(ino, 0, b"x" * 16 * 4096)
        fs.sync()
        fs._icache.clear()
        inode = fs._iget(ino)
        inode.ptr[fmt.N_DIRECT] = (fs.geo.segments + 5) << 32
        before = (list(inode.ptr), inode.size, fs.cur_pos, fs.seq, dict(fs._dirty))
        with pytest.raises(fmt.LfsError):
            fs.write_ino(ino, 11 * 4096 + 10, b"y" * 4096)  # blocks 11 and 12
        assert (list(inode.ptr), inode.size, fs.cur_pos, fs.seq, dict(fs._dirty)) == before
        fs.closed = True


def test_failed_cleaning_pass_and_crash_after_undo(tmp_path: Path) -> None:
    """After an undone op the image on disk rolls forward to the state before it, not into
    the undone op's blocks (the summary of the current segment is written again)."""
    img = image(tmp_path / "a.img")
    fs = LFS.open(img)
    fs.create("f")
    fs.write("f", 0, b"a" * 5000)
    fs.sync()
    before = state(fs)
    with pytest.raises(LfsNoSpace):
        fs.write("f", 0, b"b" * (3 << 20))
    # No close: as if the process died here.
    crashed = tmp_path / "crash.img"
    crashed.write_bytes(img.read_bytes())
    assert_clean(crashed)
    with LFS.open(crashed) as fs2:
        assert state(fs2) == before
    fs.close()


def test_checkpoint_next_seg_is_a_clean_segment_and_reused_times_reset(tmp_path: Path) -> None:
    img = image(tmp_path / "a.img")
    with LFS.open(img, commit_interval=0) as fs:  # a commit per op: segments that empty
        for i in range(30):
            fs.create(f"f{i}")
            fs.write(f"f{i}", 0, bytes([i]) * 30000)
        for i in range(0, 30, 2):
            fs.unlink(f"f{i}")
        fs.checkpoint()
        stale = {s: fs.mtime[s] for s in fs.clean}
        assert any(stale.values())  # segments that were written and emptied
    fd = os.open(img, os.O_RDONLY)
    try:
        geo = fmt.read_geometry(fd, img.stat().st_size, str(img))
        _, cp, _ = fmt.preferred_checkpoint(fd, geo, str(img))
    finally:
        os.close(fd)
    assert cp.segusage[cp.next_seg].nblks_live == 0
    with LFS.open(img) as fs:
        assert fs.cur_seg == cp.next_seg and fs.cur_pos == 0
        seg = fs._alloc_segment()
        assert fs.mtime[seg] == 0


_NAMES = [f"n{i}" for i in range(40)]


def _random_op(rng: random.Random, files: list[str], dirs: list[str]) -> Op:
    r = rng.random()
    d = rng.choice(dirs) if dirs and rng.random() < 0.6 else ""
    path = f"{d}/{rng.choice(_NAMES)}" if d else rng.choice(_NAMES)
    size = int(rng.paretovariate(1.2) * 20000)
    if r < 0.40 or not files:
        return Op("create", path, size=min(size, 1 << 20))
    if r < 0.50:
        return Op("append", rng.choice(files), size=min(size, 1 << 19))
    if r < 0.58:
        return Op(
            "overwrite", rng.choice(files), size=min(size, 1 << 19), offset=rng.randrange(50000)
        )
    if r < 0.63:
        return Op("truncate", rng.choice(files), size=rng.randrange(60000))
    if r < 0.78:
        return Op("delete", rng.choice(files))
    if r < 0.84:
        return Op("mkdir", f"d{rng.randrange(6)}")
    if r < 0.92:
        return Op("rename", rng.choice(files), dest=path)
    return Op("link", rng.choice(files), dest=path)


def _stream(
    img: Path, seed: int, batches: int, per_batch: int, reopen_every: int, crash_every: int = 0
) -> dict[str, int]:
    """Ops in batches; after a batch: ``sync`` and fsck, every ``reopen_every`` batches close
    and reopen, and every ``crash_every`` batches (instead) a crash: the process drops the
    image without a sync, and the next open must roll forward to the state after one of the
    ops since the last sync (what was not synced may be lost, but whole ops only)."""
    rng = random.Random(seed)
    ex = LfsExecutor(img)
    counts = {"ok": 0, "nospace": 0, "failed": 0, "crashes": 0, "lost": 0}
    since_sync: list[dict[str, Any]] = []
    try:
        for b in range(batches):
            for _ in range(per_batch):
                fs = ex.fs
                files: list[str] = []
                dirs: list[str] = []
                for p, ino in _walk(fs):
                    (dirs if fs.is_dir(ino) else files).append(p)
                op = _random_op(rng, files, dirs)
                before = state(fs)
                since_sync.append(before)
                try:
                    ex.apply(op)
                    counts["ok"] += 1
                except NoSpaceError:
                    counts["nospace"] += 1
                    assert state(ex.fs) == before, op
                except OpFailedError:
                    counts["failed"] += 1
                    assert state(ex.fs) == before, op
            if crash_every and (b + 1) % crash_every == 0:
                since_sync.append(state(ex.fs))
                os.close(ex.fs.fd)  # crash: no sync, no checkpoint
                ex.fs.closed = True
                assert_clean(img)
                ex = LfsExecutor(img)
                got = state(ex.fs)
                assert got in since_sync, f"batch {b}: not the state after any op since sync"
                counts["crashes"] += 1
                counts["lost"] += len(since_sync) - 1 - since_sync.index(got)
                since_sync = []
                assert_clean(img)
                continue
            ex.fs.sync()
            since_sync = []
            assert_clean(img)
            if (b + 1) % reopen_every == 0:
                ex.close()
                assert_clean(img)
                ex = LfsExecutor(img)
    finally:
        ex.close()
    assert_clean(img)
    return counts


def _walk(fs: LFS) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []
    todo = [""]
    while todo:
        d = todo.pop()
        for name, ino in fs.readdir(d):
            p = f"{d}/{name}" if d else name
            out.append((p, ino))
            if fs.is_dir(ino):
                todo.append(p)
    return out


def test_random_stream_to_exhaustion_and_beyond(tmp_path: Path) -> None:
    img = image(tmp_path / "a.img")
    counts = _stream(img, 1, batches=6, per_batch=25, reopen_every=2)
    assert counts["nospace"] > 10  # the stream ran the log full, again and again
    assert counts["ok"] > 60


def test_random_stream_with_crashes_rolls_forward(tmp_path: Path) -> None:
    img = image(tmp_path / "a.img", segments=40)
    counts = _stream(img, 4, batches=8, per_batch=25, reopen_every=3, crash_every=2)
    assert counts["crashes"] == 4 and counts["nospace"] > 5
    assert counts["lost"] > 0  # some ops were still buffered when the process died


@pytest.mark.slow
@pytest.mark.parametrize(
    "policy", ["greedy", "cost-benefit", "adaptive", "hole-plugging", "cost-age-cache"]
)
def test_random_streams_every_policy(tmp_path: Path, policy: str) -> None:
    seed = len(policy)
    img = image(tmp_path / "a.img", segments=20 + seed, bps=16 + seed % 3 * 8, policy=policy)
    counts = _stream(img, seed, batches=8, per_batch=40, reopen_every=3, crash_every=4)
    assert counts["nospace"] > 10


# ---------------------------------------------------------------- aging runs on an LFS


def _ops_file(path: Path, ops: list[Op]) -> Path:
    write_workload(path, WorkloadHeader(generator="test", params={}, seed=0), ops)
    return path


def test_unreachable_fill_is_refused_up_front(tmp_path: Path) -> None:
    img = image(tmp_path / "a.img", segments=48)
    with LFS.open(img) as fs:
        reach = fs.max_fullness()
    assert reach == pytest.approx((45 - 7) / 45)
    prof = get_preset("hfs-surge").with_overrides(fill=0.95)
    with pytest.raises(UsageError, match=f"at most {reach:.3f}"):
        age(img, AgeOptions(profile=prof))
    with LFS.open(img) as fs:
        assert fs.readdir("") == []


def test_failed_lfs_run_records_metrics_and_the_first_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    img = image(tmp_path / "a.img")
    wl = _ops_file(tmp_path / "w.jsonl", [Op("create", "f", size=50000), Op("delete", "missing")])
    db = tmp_path / "d.db"

    def full_close(self: LfsExecutor) -> None:  # closing after the error fails too
        written = self.fs.exists("f")
        LFS.close(self.fs)
        if written:
            raise LfsNoSpace("no clean segment left")

    monkeypatch.setattr(LfsExecutor, "close", full_close)
    with pytest.raises(FsageError, match="missing"):
        age(img, AgeOptions(ops_file=wl, db=db))
    with Store.open(db) as store:
        (r,) = aging_runs(store, kind="lfs")
    assert r.status == "failed" and "missing" in r.notes[0]
    assert r.metrics["write_cost"] >= 1.0 and r.metrics["counters"]["new_blocks"] > 12
    assert r.utilization["live_blocks"] > 12


def test_age_chooses_the_lfs_cleaning_policy(tmp_path: Path) -> None:
    img = image(tmp_path / "a.img", segments=48)
    wl = _ops_file(tmp_path / "w.jsonl", [Op("create", f"f{i}", size=30000) for i in range(5)])
    db = tmp_path / "d.db"
    res = CliRunner().invoke(
        main, ["age", str(img), "--ops", str(wl), "--db", str(db), "--policy", "cost-benefit"]
    )
    assert res.exit_code == 0, res.output
    with Store.open(db) as store:
        (r,) = aging_runs(store, kind="lfs")
    assert r.metrics["policy"] == "cost-benefit"
    bad = CliRunner().invoke(main, ["age", str(tmp_path), "--ops", str(wl), "--policy", "greedy"])
    assert bad.exit_code != 0 and "LFS image" in bad.output


def test_simulator_reclaims_segments_that_empty_on_their_own() -> None:
    """Seed 001 Figure 5-3's small segments: with one block per segment every overwritten
    segment empties by itself, so no cleaning is needed at all."""
    one = random_update(0.85, "clean", segments=512, segment_size=8192, updates_per_block=2)
    assert one.counters.cleaning_passes == 0 and one.metrics["write_cost"] == 1.0
    two = random_update(0.85, "clean", segments=256, segment_size=16384, updates_per_block=2)
    assert two.metrics["write_cost"] > 1.0
    assert two.metrics["overall_write_cost"] > one.metrics["overall_write_cost"]
