"""LFS fixes: system inodes and the unlinked directory are special in the Layout, a full log
raises NoSpaceError (undoing the op) so the ager steps around it, and images carry a UUID."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from fsage.ager.profile import get_preset
from fsage.ager.run import AgeOptions, age
from fsage.cli import main
from fsage.db.store import Store
from fsage.errors import WorkloadError
from fsage.lfs import format as fmt
from fsage.lfs.executor import LfsExecutor
from fsage.lfs.fs import LFS, mkfs
from fsage.lfs.fsck import fsck
from fsage.lfs.reader import read_lfs_layout
from fsage.workload import NoSpaceError, Op, OpFailedError


def small(path: Path, **kw: object) -> Path:
    args: dict[str, object] = {"segments": 48, "blocks_per_segment": 32, "block_size": 4096}
    args.update(kw)
    mkfs(path, **args)  # type: ignore[arg-type]
    return path


def test_system_inodes_and_unlinked_dir_are_special(tmp_path: Path) -> None:
    img = small(tmp_path / "s.img")
    with LFS.open(img) as fs:
        fs.mkdir("d")
        for i in range(5):
            fs.create(f"d/f{i}")
            fs.write(f"d/f{i}", 0, b"z" * 9000 * (i + 1))
        user = {fs.stat(p).ino for p in ("", "d", *(f"d/f{i}" for i in range(5)))}
    lay = read_lfs_layout(img)
    assert set(lay.files.ino.tolist()) == user
    assert set(lay.special.ino.tolist()) == {16, 17, 18, 20}
    rep = fsck(img)
    assert rep.ok
    # fsck counts the unlinked directory among directories; the Layout's user files do not.
    assert len(lay.files) == rep.files + rep.directories - 1 == 7
    # The system files' blocks are recorded: every block the reader counted is either a user
    # file's or a special inode's.
    with LFS.open(img, readonly=True) as fs:
        sys_blocks = sum(sum(1 for _ in fs.file_blocks(i)) for i in fmt.SYSTEM_FILES)
        unl_blocks = sum(1 for _ in fs.file_blocks(fmt.INO_UNLINKED))
    sp = lay.special
    got = int(sp.ext_length.sum()) + len(sp.meta_physical)
    assert got == sys_blocks + unl_blocks
    assert lay.facts.extra["used_blocks"] == sum(g["live_blocks"] for g in lay.facts.groups)
    # The store and the analyzer count only user files.
    db = tmp_path / "s.db"
    with Store.open(db, create=True) as store:
        store.add_snapshot(lay, name="s")
        row = store.snapshots()[0]
        assert (row.files, row.dirs) == (7, 2)
        back = store.load_layout(row.id)
    assert set(back.special.ino.tolist()) == {16, 17, 18, 20}
    r = CliRunner().invoke(main, ["analyze", "--db", str(db), "--format", "json"])
    assert r.exit_code == 0, r.output
    assert '"files": 5' in r.output or '"files": 7' in r.output


def test_full_log_raises_nospace_and_undoes_the_op(tmp_path: Path) -> None:
    img = small(tmp_path / "f.img", segments=16, blocks_per_segment=16)
    ex = LfsExecutor(img)
    made = 0
    with pytest.raises(NoSpaceError) as err:
        for i in range(1000):
            before = ex.capacity_blocks()[2]
            ex.apply(Op("create", f"dir{i % 3}/f{i}", size=20_000))
            made = i + 1
    assert "no space left" in str(err.value)
    # The failed create left nothing behind: no file, no directory it made, no live blocks.
    fs = ex.fs
    assert not fs.exists(f"dir{made % 3}/f{made}")
    assert ex.capacity_blocks()[2] <= before
    # An append that does not fit is cut back to the old size.
    with pytest.raises(NoSpaceError):
        ex.apply(Op("append", "dir0/f0", size=1 << 20))
    assert fs.stat("dir0/f0").size == 20_000
    # Deleting makes room again.
    for i in range(0, made, 2):
        ex.apply(Op("delete", f"dir{i % 3}/f{i}"))
    ex.apply(Op("create", "again", size=20_000))
    ex.close()
    rep = fsck(img)
    assert rep.ok, rep.problems
    with LFS.open(img, readonly=True) as fs2:
        assert fs2.stat("again").size == 20_000
        assert fs2.read("dir1/f1", 0, 10) == bytes(range(10))


def test_age_fill_steps_around_a_full_lfs(tmp_path: Path) -> None:
    img = small(tmp_path / "a.img", segments=24)
    prof = get_preset("hfs-surge").with_overrides(
        fill=0.66, churn=0.3, ops_limit=400
    )  # the most it can reach
    res = age(img, AgeOptions(profile=prof, seed=3))
    assert res.finished and res.nospace > 0
    assert fsck(img).ok


def test_images_have_distinct_uuids(tmp_path: Path) -> None:
    a = small(tmp_path / "a.img")
    b = small(tmp_path / "b.img")
    la, lb = read_lfs_layout(a), read_lfs_layout(b)
    assert la.facts.uuid and lb.facts.uuid and la.facts.uuid != lb.facts.uuid
    # The UUID is the superblock's field 102.
    import uuid

    assert str(uuid.UUID(la.facts.uuid)) == la.facts.uuid
    db = tmp_path / "u.db"
    r = CliRunner()
    for img in (a, b):
        out = r.invoke(main, ["snapshot", str(img), "--db", str(db)])
        assert out.exit_code == 0, out.output
    out = r.invoke(main, ["snapshots", "--db", str(db), "--format", "json"])
    rows = json.loads(out.output)
    assert len({row["fs"] for row in rows}) == 2


def test_link_ops_give_one_file_two_names_and_unknown_ops_fail(tmp_path: Path) -> None:
    img = small(tmp_path / "l.img")
    ex = LfsExecutor(img)
    try:
        ex.apply(Op("create", "a/f", size=10000))
        ex.apply(Op("link", "a/f", dest="b/g"))  # the destination's directory is made
        with pytest.raises(OpFailedError, match="exists"):
            ex.apply(Op("link", "a/f", dest="b/g"))
        with pytest.raises(OpFailedError, match="directories"):
            ex.apply(Op("link", "a", dest="c"))
        with pytest.raises(WorkloadError, match="not supported"):
            ex.apply(Op("bogus", "a/f"))
        first, second = ex.fs.stat("a/f"), ex.fs.stat("b/g")
        assert first.ino == second.ino and first.nlink == second.nlink == 2
        ex.apply(Op("delete", "a/f"))
        assert ex.fs.stat("b/g").nlink == 1 and ex.fs.stat("b/g").size == 10000
    finally:
        ex.close()
    assert fsck(img).ok


def test_analyze_shows_segment_utilization(tmp_path: Path) -> None:
    img = small(tmp_path / "l.img")
    ex = LfsExecutor(img)
    try:
        for i in range(30):
            ex.apply(Op("create", f"d/f{i}", size=20000 + 1000 * i))
        for i in range(0, 30, 3):
            ex.apply(Op("delete", f"d/f{i}"))
        ex.apply(Op("sync"))
    finally:
        ex.close()
    db = tmp_path / "db.sqlite"
    runner = CliRunner()
    assert runner.invoke(main, ["snapshot", str(img), "--db", str(db)]).exit_code == 0
    out = runner.invoke(main, ["analyze", "--db", str(db), "--format", "json"])
    assert out.exit_code == 0, out.output
    seg = json.loads(out.output)["snapshots"][0]["segments"]
    fs = LFS.open(img, readonly=True)
    try:
        _total, live = fs.usage()
        capacity = fs.geo.data_blocks_per_segment
    finally:
        fs.close()
    assert seg["capacity"] == capacity
    assert sum(seg["live"]) == live  # the usage table agrees with the live LFS's own count
    assert sum(h["segments"] for h in seg["histogram"]) == len(seg["live"])
    text = runner.invoke(main, ["analyze", "--db", str(db)])
    assert "LFS segments:" in text.output
