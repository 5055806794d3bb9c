"""Executors: POSIX on a temporary directory, offline libext2fs on a generated ext4 image."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from fsage.ager.generator import Generator
from fsage.ager.images import make_image
from fsage.ager.posix import MARKER, PosixExecutor, check_target_dir, record_path_for
from fsage.ager.profile import get_preset
from fsage.errors import UnsafeTargetError
from fsage.workload import NoSpaceError, Op, OpFailedError

MIB = 1 << 20


def _tree(root: Path) -> dict[str, int]:
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            p = Path(dirpath) / f
            rel = str(p.relative_to(root))
            if rel != MARKER:
                out[rel] = p.stat().st_size
    return out


def test_posix_ops_write_real_data(tmp_path: Path) -> None:
    ex = PosixExecutor(tmp_path)
    assert ex.apply(Op("mkdir", "d")) == 0
    assert ex.apply(Op("create", "d/f", size=3 * MIB + 5)) == 3 * MIB + 5
    assert ex.apply(Op("append", "d/f", size=10)) == 10
    assert ex.apply(Op("overwrite", "d/f", size=100, offset=7)) == 100
    ex.apply(Op("create", "g", size=0))
    ex.apply(Op("rename", "g", dest="d/h"))
    ex.apply(Op("truncate", "d/f", size=4096))
    ex.apply(Op("fsync", "d/f"))
    ex.apply(Op("sync"))
    assert _tree(tmp_path) == {"d/f": 4096, "d/h": 0}
    data = (tmp_path / "d/f").read_bytes()
    assert data.count(0) < 64  # real data, not zeros or holes
    assert os.stat(tmp_path / "d/f").st_blocks * 512 >= 4096
    ex.apply(Op("delete", "d/f"))
    ex.apply(Op("delete", "d/h"))
    ex.apply(Op("delete", "d"))
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(OpFailedError):
        ex.apply(Op("append", "missing", size=1))
    ex.close()


def test_posix_never_follows_symlink_out(tmp_path: Path) -> None:
    target = tmp_path / "t"
    outside = tmp_path / "outside"
    target.mkdir()
    outside.mkdir()
    (target / "link").symlink_to(outside)
    (target / "flink").symlink_to(outside / "victim")
    (outside / "victim").write_bytes(b"keep")
    ex = PosixExecutor(target)
    with pytest.raises(UnsafeTargetError):
        ex.apply(Op("create", "link/x", size=10))
    with pytest.raises(OpFailedError):
        ex.apply(Op("create", "flink", size=10))
    with pytest.raises(OpFailedError):
        ex.apply(Op("overwrite", "flink", size=2))
    ex.close()
    assert list(outside.iterdir()) == [outside / "victim"]
    assert (outside / "victim").read_bytes() == b"keep"


def test_target_checks(tmp_path: Path) -> None:
    with pytest.raises(UnsafeTargetError, match="'/'"):
        check_target_dir(Path("/"))
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "data").write_text("x")
    with pytest.raises(UnsafeTargetError, match="not empty"):
        check_target_dir(busy)
    check_target_dir(busy, force=True)
    assert not (busy / MARKER).exists()  # nothing is written into the target
    record = record_path_for(busy)
    assert record == tmp_path / "busy.fsage-age"
    record.write_text("{}\n")
    check_target_dir(busy, record=record)  # an fsage working directory: no --force needed
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "lost+found").mkdir()
    check_target_dir(empty)


def _offline() -> type:
    pytest.importorskip("fsage._ext2fs")
    from fsage import _ext2fs  # type: ignore[attr-defined,unused-ignore]

    if not hasattr(_ext2fs, "writer_open"):
        pytest.skip("fsage._ext2fs built without the offline writer")
    from fsage.ager.offline import OfflineExtExecutor

    return OfflineExtExecutor


def _debugfs(image: Path, cmd: str) -> str:
    return subprocess.run(
        ["debugfs", "-R", cmd, str(image)], capture_output=True, text=True, check=True
    ).stdout


def test_offline_runs_stream_and_fsck_is_clean(tmp_path: Path) -> None:
    Offline = _offline()
    img = make_image(tmp_path / "e.img", "ext4", 64 * MIB)
    ex = Offline(img)
    bs, total, used = ex.capacity_blocks()
    assert bs == 4096 and 0 < used < 100
    prof = get_preset("hfs-surge").with_overrides(fill=0.6, churn=0.5)
    gen = Generator(prof, 21, total * bs, probe=ex.capacity_blocks, block_size=bs)
    for op in gen.ops():
        try:
            ex.apply(op)
        except NoSpaceError:
            gen.nospace(op)
    ex.apply(Op("mkdir", "x"))
    ex.apply(Op("create", "x/a", size=5000))
    ex.apply(Op("rename", "x/a", dest="b"))
    ex.apply(Op("mkdir", "y"))
    ex.apply(Op("rename", "y", dest="x/y"))
    ex.close()
    fsck = subprocess.run(["e2fsck", "-fn", str(img)], capture_output=True, text=True)
    assert fsck.returncode == 0, fsck.stdout
    # Sizes of a sample of the model's files, checked with debugfs.
    sample = sorted(gen.files)[:: max(1, len(gen.files) // 20)]
    for path in sample:
        out = _debugfs(img, f'stat "/{path}"')
        assert f"Size: {gen.files[path].size}\n" in out.replace("\t", "\n"), path
    assert "Size: 5000" in _debugfs(img, "stat /b")
    assert ".." in _debugfs(img, "ls /x/y")
    assert "(2)" not in _debugfs(img, "ls /x/y").split("..")[0][-10:]


def test_offline_fill_reaches_target(tmp_path: Path) -> None:
    from fsage.ager.run import AgeOptions, age

    _offline()
    img = make_image(tmp_path / "e.img", "ext4", 96 * MIB)
    prof = get_preset("hfs-surge").with_overrides(fill=0.8, churn=0.0)
    res = age(img, AgeOptions(profile=prof, seed=3, mode="offline"))
    assert res.finished and res.phase == "churn"
    assert abs(res.fullness - 0.8) <= 0.02
    # Oracle: dumpe2fs's free block count gives the same used blocks as the executor.
    out = subprocess.run(["dumpe2fs", "-h", str(img)], capture_output=True, text=True).stdout
    free = int(out.split("Free blocks:")[1].split()[0])
    count = int(out.split("Block count:")[1].split()[0])
    Offline = _offline()
    ex = Offline(img)
    _, total, used = ex.capacity_blocks()
    ex.close()
    assert count - free - used == count - total  # the same overhead both ways
    assert (img.with_name("e.img.fsage-age")).exists()


def test_offline_refuses_non_ext(tmp_path: Path) -> None:
    from fsage.ager.run import AgeOptions, age
    from fsage.errors import UsageError

    junk = tmp_path / "junk.img"
    junk.write_bytes(b"\0" * 8192)
    with pytest.raises(UsageError, match="not a directory or a recognised image"):
        age(junk, AgeOptions(profile=get_preset("hfs-surge"), mode="offline"))


def test_posix_renamed_directory_drops_cached_descriptors_below_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A renamed directory's cached descriptors (its own and those below it, even when its
    own was evicted first) are dropped: old paths fail, new paths reach the right place."""
    import fsage.ager.posix as posix

    monkeypatch.setattr(posix, "_MAX_DIR_FDS", 3)
    with PosixExecutor(tmp_path) as ex:
        for d in ("a", "a/b", "a/b/c", "z", "z/y"):
            ex.apply(Op("mkdir", d))
        ex.apply(Op("create", "a/b/c/f", size=10))
        ex.apply(Op("create", "z/y/g", size=10))  # evicts "a" and "a/b", keeps "a/b/c"
        assert "a/b/c" in ex._dir_fds and "a" not in ex._dir_fds
        ex.apply(Op("rename", "a", dest="x"))
        assert not any(k == "a" or k.startswith("a/") for k in ex._dir_fds)
        ex.apply(Op("create", "x/b/c/h", size=5))
        with pytest.raises(OpFailedError):
            ex.apply(Op("create", "a/b/c/h", size=5))
        ex.apply(Op("rename", "z/y/g", dest="z/g2"))  # a file: nothing cached below it
        assert "z/y" in ex._dir_fds
    assert (tmp_path / "x/b/c/h").stat().st_size == 5
    assert (tmp_path / "x/b/c/f").stat().st_size == 10
    assert (tmp_path / "z/g2").is_file() and not (tmp_path / "a").exists()


def test_posix_create_over_an_existing_name_truncates_and_refuses_non_files(
    tmp_path: Path,
) -> None:
    with PosixExecutor(tmp_path, data="fallocate") as ex:
        ex.apply(Op("create", "f", size=20000))
        ex.apply(Op("create", "f", size=4096))
        ex.apply(Op("mknod", "p", label="fifo"))
        with pytest.raises(OpFailedError):
            ex.apply(Op("create", "p", size=10))
    assert (tmp_path / "f").stat().st_size == 4096


class _ListJournal:
    """A journal on a file: what ``PosixExecutor.journaled`` writes to."""

    def __init__(self, path: Path) -> None:
        from fsage.ager.run import _op_line

        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self.line = _op_line
        self.added: list[Op] = []

    def add(self, op: Op) -> None:
        self.added.append(op)
        os.write(self.fd, self.line(op))


def test_posix_journaled_ops_write_the_ops_json_once_they_took_effect(tmp_path: Path) -> None:
    """The C apply's journal lines are Op.to_json's bytes; an op that fails leaves none; ops
    with non-plain paths or a label go through ``journal.add``."""
    root = tmp_path / "t"
    root.mkdir()
    journal = _ListJournal(tmp_path / "j.jsonl")
    ops = [
        Op("mkdir", "d"),
        Op("create", "d/f", size=5000),
        Op("append", "d/f", size=100),
        Op("overwrite", "d/f", size=10, offset=7),
        Op("truncate", "d/f", size=4096),
        Op("punch", "d/f", size=4096),
        Op("fallocate", "d/f", size=8192, offset=4096),
        Op("create", "d/x y\u00e9", size=3),
        Op("create", 'd/q"b', size=0),
        Op("link", "d/f", dest="d/g"),
        Op("rename", "d/g", dest="h"),
        Op("symlink", "s", dest="d/f"),
        Op("mknod", "p", label="fifo"),
        Op("snapshot", label="mid"),
        Op("delete", "h"),
    ]
    with PosixExecutor(root) as ex:
        step = ex.journaled(journal)
        written = [step(op) for op in ops]
        with pytest.raises(OpFailedError, match=r"^delete 'nope': No such file or directory$"):
            step(Op("delete", "nope"))
        with pytest.raises(OpFailedError, match=r"^create 'p': No such device or address$"):
            step(Op("create", "p", size=1))
    os.close(journal.fd)
    assert written[1:4] == [5000, 100, 10] and sum(written[4:]) == 3
    want = b"".join(journal.line(op) for op in ops)
    assert (tmp_path / "j.jsonl").read_bytes() == want
    assert journal.added == [ops[7], ops[8], ops[11], ops[12], ops[13]]
    assert _tree(root) == {"d/f": 12288, "d/x y\u00e9": 3, 'd/q"b': 0, "s": 12288, "p": 0}
    assert (root / "s").is_symlink() and not (root / "h").exists()


def test_posix_descriptor_cache_keeps_what_an_op_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With room for one descriptor, a rename between two deep directories still works (both
    stay pinned for the op), and a removed directory's descriptor is closed."""
    import fsage.ager.posix as posix

    monkeypatch.setattr(posix, "_MAX_DIR_FDS", 1)
    with PosixExecutor(tmp_path) as ex:
        for d in ("a", "a/b", "a/b/c", "x", "x/y"):
            ex.apply(Op("mkdir", d))
        ex.apply(Op("create", "a/b/c/f", size=1))
        ex.apply(Op("rename", "a/b/c/f", dest="x/y/g"))
        ex.apply(Op("link", "x/y/g", dest="a/b/c/h"))
        assert ex._dir_fds[-1] == "a/b/c"  # the most recently used
        ex.apply(Op("delete", "a/b/c/h"))
        ex.apply(Op("delete", "a/b/c"))
        assert "a/b/c" not in ex._dir_fds and len(ex._dir_fds) <= 3
        before = len(os.listdir("/proc/self/fd"))
        for i in range(50):
            ex.apply(Op("mkdir", f"x/y/d{i}"))
            ex.apply(Op("create", f"x/y/d{i}/f", size=1))
        assert len(os.listdir("/proc/self/fd")) <= before + 1
    assert (tmp_path / "x/y/g").stat().st_size == 1


def _mixed_ops() -> list[Op]:
    ops = [Op("mkdir", "d"), Op("mkdir", "d/e")]
    for i in range(150):
        ops.append(Op("create", f"d/e/f{i}", size=100 + i))
        if i % 7 == 3:
            ops.append(Op("delete", f"d/e/f{i - 2}"))
        if i % 25 == 0:  # ops that never run ahead, between ones that do
            ops.append(Op("symlink", f"d/s{i}", dest="../x/f0"))
            ops.append(Op("create", f"d/\u00e9{i}", size=3))
    ops += [Op("rename", "d/e", dest="x"), Op("append", "x/f149", size=10)]
    return ops


def test_posix_ops_run_ahead_as_they_run_here(tmp_path: Path) -> None:
    """Queued to the worker thread, the same ops make the same tree and the same journal
    (lines in op order, those of ops run here included) as run one by one."""
    out: dict[str, tuple[dict[str, int], bytes]] = {}
    for ahead in (False, True):
        root = tmp_path / f"t{ahead}"
        root.mkdir()
        journal = _ListJournal(tmp_path / f"j{ahead}.jsonl")
        with PosixExecutor(root) as ex:
            ex.capacity_blocks()  # sets what queued ops may use
            step = ex.journaled(journal, ahead=ahead)
            written = sum(step(op) for op in _mixed_ops())
            ex.drain()
        os.close(journal.fd)
        assert written == sum(100 + i for i in range(150)) + 6 * 3 + 10
        out[str(ahead)] = (_tree(root), journal.path.read_bytes())
    assert out["True"] == out["False"]
    assert out["True"][1].count(b"\n") == len(_mixed_ops())


def test_posix_op_failing_ahead_stops_the_queue(tmp_path: Path) -> None:
    """A queued op that fails: neither it nor the ops queued after it run or reach the
    journal; the next drain raises it as InFlightError with what they had been counted for."""
    from fsage.ager.posix import InFlightError

    journal = _ListJournal(tmp_path / "j.jsonl")
    root = tmp_path / "t"
    root.mkdir()
    with PosixExecutor(root) as ex:
        ex.capacity_blocks()
        step = ex.journaled(journal, ahead=True)
        step(Op("create", "a", size=10))
        step(Op("delete", "nope"))
        step(Op("create", "b", size=20))
        step(Op("create", "c", size=30))
        with pytest.raises(InFlightError, match=r"^delete 'nope': No such file or directory$") as e:
            ex.drain()
        assert (e.value.lost_ops, e.value.lost_bytes) == (3, 50)
        step(Op("create", "d", size=1))  # the queue runs again
        ex.drain()
    os.close(journal.fd)
    assert _tree(root) == {"a": 10, "d": 1}
    assert journal.path.read_bytes() == journal.line(Op("create", "a", size=10)) + journal.line(
        Op("create", "d", size=1)
    )


def test_posix_ops_that_could_run_out_of_space_run_here(tmp_path: Path) -> None:
    """An op whose data does not fit in what the last statvfs left (less the margin) is not
    queued: it runs at once, so its ENOSPC reaches the caller on that op."""
    root = tmp_path / "t"
    root.mkdir()
    journal = _ListJournal(tmp_path / "j.jsonl")
    with PosixExecutor(root, data="fallocate") as ex:
        bs, total, used = ex.capacity_blocks()
        step = ex.journaled(journal, ahead=True)
        step(Op("create", "small", size=4096))
        free = (total - used) * bs
        with pytest.raises(NoSpaceError):
            step(Op("create", "huge", size=free + (1 << 30)))
        ex.drain()
    os.close(journal.fd)
    assert set(_tree(root)) == {"small"}
