"""Hard links in snapshot deltas and recreation.

Synthetic Layouts check the exact ``link``/``delete``/``rename`` ops; a small inode-aware model
(``Model``, written here: POSIX rules for names, inodes kept while they have a name) must end
holding exactly each snapshot's names, grouped by file. End to end, an image with hard links
made by mke2fs -d and edited with debugfs is replayed offline (and through a loop mount when
root); debugfs, e2fsck and the kernel are the oracles for the names and link counts.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from fsage.ager.images import loop_mount
from fsage.db.store import Store
from fsage.layout import Layout
from fsage.replay.deltas import DeltaBuilder
from fsage.replay.recreate import RecreateOptions, recreate
from fsage.snapshotter import read_source
from fsage.workload import Op

from .synth import BS, F, Model, S, layout

LF = F(11, [(2, b"lost+found")], kind="dir", gen=0)
MIB = 1 << 20


def expected_view(entries: list[F]) -> set[tuple[tuple[str, ...], int | None]]:
    """What a snapshot of ``entries`` holds, in ``Model.view`` form."""
    by_ino = {f.ino: f for f in entries}
    out = set()
    for f in entries:
        names = []
        for parent, name in f.links:
            parts = [name.decode()]
            while parent != 2:
                p = by_ino[parent]
                parts.append(p.links[0][1].decode())
                parent = p.links[0][0]
            names.append("/".join(reversed(parts)))
        out.add((tuple(sorted(names)), None if f.kind == "dir" else f.size))
    return out


def _chain(*snaps: list[F]) -> tuple[list[list[Op]], DeltaBuilder]:
    bld = DeltaBuilder()
    outs: list[list[Op]] = []
    prev: Layout | None = None
    for i, ents in enumerate(snaps):
        lay = layout([LF, *ents])
        outs.append(
            bld.interval(
                prev,
                lay,
                start_ns=None if prev is None else i * 100 * S,
                end_ns=(i + 1) * 100 * S,
                label=f"s{i + 1}",
            )
        )
        prev = lay
    # The model replays the whole stream and matches every snapshot on the way.
    model = Model()
    for ops, ents in zip(outs, snaps, strict=True):
        model.run(ops)
        assert model.view() == expected_view(ents)
    return outs, bld


def _body(ops: list[Op]) -> list[str]:
    return [op.to_json() for op in ops if op.op != "snapshot"]


def test_a_hard_linked_file_is_created_then_given_its_other_names() -> None:
    d = F(30, [(2, b"d")], kind="dir", crtime=1 * S)
    f = F(31, [(2, b"h1"), (30, b"h2"), (2, b"h3")], size=77, crtime=2 * S)
    g = F(32, [(2, b"plain")], size=5, crtime=3 * S)
    (first,), bld = _chain([d, f, g])
    assert _body(first) == [
        '{"op":"mkdir","path":"d"}',
        '{"op":"create","path":"d/h2","size":77}',
        '{"op":"link","path":"d/h2","dest":"h1"}',
        '{"op":"link","path":"d/h2","dest":"h3"}',
        '{"op":"create","path":"plain","size":5}',
    ]
    assert bld.stats.inferred["link"] == 2 and bld.stats.inferred["create"] == 2
    assert bld.stats.skipped_counts() == {}


def test_a_link_waits_for_its_directory() -> None:
    # The file (crtime 2) is older than the directory holding its second name (crtime 9).
    f = F(31, [(2, b"a"), (30, b"b")], size=7, crtime=2 * S)
    d = F(30, [(2, b"zdir")], kind="dir", crtime=9 * S)
    (first,), _ = _chain([f, d])
    assert _body(first) == [
        '{"op":"create","path":"a","size":7}',
        '{"op":"mkdir","path":"zdir"}',
        '{"op":"link","path":"a","dest":"zdir/b"}',
    ]


def test_names_added_removed_and_renamed_between_snapshots() -> None:
    s1 = [F(20, [(2, b"h1")], size=9, crtime=1)]
    s2 = [F(20, [(2, b"h1"), (2, b"h2")], size=9, crtime=1, ctime=150 * S)]
    s3 = [F(20, [(2, b"h1"), (2, b"h3")], size=9, crtime=1, ctime=250 * S)]
    s4 = [F(20, [(2, b"h1")], size=9, crtime=1, ctime=350 * S)]
    (_, two, three, four), bld = _chain(s1, s2, s3, s4)
    assert _body(two) == ['{"op":"link","path":"h1","dest":"h2"}']
    assert _body(three) == ['{"op":"rename","path":"h2","dest":"h3"}']
    assert _body(four) == ['{"op":"delete","path":"h3"}']
    counts = {k: v for k, v in bld.stats.inferred.items() if v}
    assert counts == {"create": 1, "link": 1, "rename": 1, "unlink": 1}


def test_losing_the_first_name_keeps_the_file_under_its_others() -> None:
    s1 = [F(22, [(2, b"h1"), (2, b"h2"), (2, b"h3")], size=7, crtime=1)]
    s2 = [F(22, [(2, b"h2"), (2, b"h3")], size=7, crtime=1, ctime=150 * S)]
    # Later changes to the file go through a name it keeps (h3, not h2 which goes too).
    s3 = [
        F(22, [(2, b"h3")], size=7 + BS, crtime=1, ctime=260 * S, mtime=250 * S,
          ext=[(0, 100, 2)]),
    ]  # fmt: skip
    (first, two, three), bld = _chain(s1, s2, s3)
    assert _body(first)[1:] == [
        '{"op":"link","path":"h1","dest":"h2"}',
        '{"op":"link","path":"h1","dest":"h3"}',
    ]
    assert _body(two) == ['{"op":"delete","path":"h1"}']
    assert _body(three) == [
        f'{{"op":"append","path":"h3","size":{BS}}}',
        '{"op":"delete","path":"h2"}',
    ]
    assert bld.stats.inferred["unlink"] == 2 and bld.stats.inferred["delete"] == 0


def test_a_file_goes_when_all_its_names_go() -> None:
    s1 = [F(22, [(2, b"a"), (2, b"b"), (2, b"c")], size=7, crtime=1)]
    (_, two), bld = _chain(s1, [])
    assert _body(two) == [
        '{"op":"delete","path":"b"}',
        '{"op":"delete","path":"c"}',
        '{"op":"delete","path":"a"}',
    ]
    assert bld.stats.inferred["delete"] == 1 and bld.stats.inferred["unlink"] == 2


def test_all_names_renamed_at_once_are_renames() -> None:
    s1 = [F(22, [(2, b"a"), (2, b"b")], size=7, crtime=1)]
    s2 = [F(22, [(2, b"x"), (2, b"y")], size=7, crtime=1, ctime=150 * S)]
    (_, two), _ = _chain(s1, s2)
    assert _body(two) == [
        '{"op":"rename","path":"a","dest":"x"}',
        '{"op":"rename","path":"b","dest":"y"}',
    ]


def test_a_freed_name_is_taken_by_a_new_file_after_the_unlink() -> None:
    # The new file's recorded creation (120 s) is before the old name's removal (ctime 150 s).
    s1 = [F(22, [(2, b"a"), (2, b"b")], size=7, crtime=1)]
    s2 = [
        F(22, [(2, b"a")], size=7, crtime=1, ctime=150 * S),
        F(23, [(2, b"b")], size=3, crtime=120 * S),
    ]
    (_, two), _ = _chain(s1, s2)
    assert _body(two) == [
        '{"op":"delete","path":"b"}',
        '{"op":"create","path":"b","size":3}',
    ]


def test_names_swapped_between_two_files() -> None:
    s1 = [
        F(22, [(2, b"a"), (2, b"b")], size=7, crtime=1),
        F(23, [(2, b"c")], size=3, crtime=2),
    ]
    s2 = [
        F(22, [(2, b"a"), (2, b"c")], size=7, crtime=1, ctime=150 * S),
        F(23, [(2, b"b")], size=3, crtime=2, ctime=150 * S),
    ]
    (_, two), _ = _chain(s1, s2)  # the model checks the outcome
    assert sum(op.op == "rename" for op in two) == 3  # one goes through a temporary name


def test_a_name_in_a_removed_directory_goes_before_the_directory() -> None:
    s1 = [
        F(30, [(2, b"d")], kind="dir", crtime=1),
        F(31, [(2, b"a"), (30, b"b")], size=7, crtime=2),
    ]
    s2 = [F(31, [(2, b"a")], size=7, crtime=2, ctime=150 * S)]
    (_, two), _ = _chain(s1, s2)
    assert _body(two) == ['{"op":"delete","path":"d/b"}', '{"op":"delete","path":"d"}']


def test_an_inode_reused_without_generation_drops_every_old_name() -> None:
    # No generation or creation time recorded (libext2fs-written images): a new name and
    # moved blocks mean a new file in the old inode; all the old file's names go.
    s1 = [F(22, [(2, b"a"), (2, b"b")], size=BS, gen=0, ext=[(0, 10, 1)])]
    s2 = [F(22, [(2, b"z")], size=2 * BS, gen=0, mtime=150 * S, ext=[(0, 50, 2)])]
    (_, two), bld = _chain(s1, s2)
    assert _body(two) == [
        '{"op":"delete","path":"b"}',
        '{"op":"delete","path":"a"}',
        f'{{"op":"create","path":"z","size":{2 * BS}}}',
    ]
    assert bld.stats.inferred["unlink"] == 1 and bld.stats.inferred["delete"] == 1


def test_start_from_a_snapshot_with_hard_links() -> None:
    s1 = [F(22, [(2, b"a"), (2, b"b")], size=7, crtime=1)]
    s2 = [F(22, [(2, b"b")], size=7, crtime=1, ctime=150 * S)]
    bld = DeltaBuilder()
    la, lb = layout([LF, *s1]), layout([LF, *s2])
    bld.start_from(la)
    ops = bld.interval(la, lb, start_ns=100 * S, end_ns=200 * S)
    assert _body(ops) == ['{"op":"delete","path":"a"}']


# ---------------------------------------------------------------------------- end to end


def _need_writer() -> None:
    pytest.importorskip("fsage._ext2fs")
    from fsage import _ext2fs  # type: ignore[attr-defined,unused-ignore]

    if not hasattr(_ext2fs, "writer_link"):
        pytest.skip("fsage._ext2fs built without writer_link")


def _debugfs(image: Path, *cmds: str, write: bool = False) -> str:
    """Run debugfs commands on ``image`` (one with -R, several from a script with -f)."""
    argv = ["debugfs", *(["-w"] if write else [])]
    if len(cmds) == 1:
        argv += ["-R", cmds[0]]
    else:
        script = image.with_suffix(".debugfs")
        script.write_text("\n".join(cmds) + "\n", encoding="utf-8")
        argv += ["-f", str(script)]
    return subprocess.run([*argv, str(image)], capture_output=True, text=True, check=True).stdout


def _fsck_clean(image: Path) -> None:
    proc = subprocess.run(["e2fsck", "-fn", str(image)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _names_by_inode(image: Path, paths: list[str]) -> set[tuple[tuple[str, ...], int, int]]:
    """(names, link count, size) of each inode behind ``paths``, from debugfs."""
    by_ino: dict[int, list[str]] = {}
    info: dict[int, tuple[int, int]] = {}
    for p in paths:
        out = _debugfs(image, f'stat "/{p}"')
        ino = int(re.search(r"Inode: (\d+)", out).group(1))  # type: ignore[union-attr]
        links = int(re.search(r"Links: (\d+)", out).group(1))  # type: ignore[union-attr]
        size = int(re.search(r"Size: (\d+)", out).group(1))  # type: ignore[union-attr]
        by_ino.setdefault(ino, []).append(p)
        info[ino] = (links, size)
    return {(tuple(sorted(v)), *info[k]) for k, v in by_ino.items()}


FINAL_PATHS = ["a", "c", "e", "d/a2", "d/a3", "d/b2"]
FINAL_VIEW = {(("a", "d/a2", "d/a3", "d/b2"), 4, 10_000), (("c",), 1, 5000), (("e",), 1, 300)}


def _history(tmp_path: Path) -> tuple[Path, Path]:
    """An image with hard links (mke2fs -d keeps them) snapshotted, edited with debugfs (a
    name added, one removed, one moved), snapshotted again: (image, database)."""
    tree = tmp_path / "tree"
    (tree / "d").mkdir(parents=True)
    (tree / "a").write_bytes(b"x" * 10_000)
    os.link(tree / "a", tree / "b")
    os.link(tree / "a", tree / "d" / "a2")
    (tree / "c").write_bytes(b"y" * 5000)
    os.link(tree / "c", tree / "d" / "c2")
    (tree / "e").write_bytes(b"z" * 300)
    img = tmp_path / "orig.img"
    with open(img, "wb") as fh:
        fh.truncate(16 * MIB)
    subprocess.run(
        ["mke2fs", "-F", "-q", "-t", "ext4", "-d", str(tree), str(img)],
        check=True, capture_output=True,
    )  # fmt: skip
    _fsck_clean(img)
    assert _names_by_inode(img, ["a", "b", "d/a2"]) == {(("a", "b", "d/a2"), 3, 10_000)}
    db = tmp_path / "fsage.db"
    with Store.open(db, create=True) as store:
        store.add_snapshot(read_source(img), name="orig")
    _debugfs(
        img,
        "ln /a /d/a3",
        "ln /a /d/b2",
        "unlink /b",
        "sif /a links_count 4",
        "unlink /d/c2",
        "sif /c links_count 1",
        write=True,
    )
    _fsck_clean(img)
    assert _names_by_inode(img, FINAL_PATHS) == FINAL_VIEW
    with Store.open(db) as store:
        store.add_snapshot(read_source(img), name="orig")
    return img, db


def test_offline_replay_recreates_every_name(tmp_path: Path) -> None:
    _need_writer()
    _img, db = _history(tmp_path)
    target = tmp_path / "rec.img"
    res = recreate(RecreateOptions(db=db, fs_name="orig", target=target, mode="offline"))
    assert res.failed == 0 and res.nospace == 0, res.failed_examples
    inferred = {k: v for k, v in res.deltas["inferred"].items() if v}
    # Populate: a (+ b, d/a2), c (+ d/c2), e; then b -> d/a3, + d/b2, - d/c2.
    assert inferred == {"mkdir": 1, "create": 3, "link": 4, "rename": 1, "unlink": 1}
    assert res.deltas["skipped"] == {}
    fid = res.fidelity
    assert fid is not None
    assert fid.files_original == fid.files_recreated == fid.files_matched == 6
    assert fid.bytes_matched == fid.bytes_original == 4 * 10_000 + 5000 + 300
    assert fid.missing == [] and fid.extra == []
    _fsck_clean(target)
    assert _names_by_inode(target, FINAL_PATHS) == FINAL_VIEW
    listing = _debugfs(target, "ls -p /d")
    assert sorted(
        line.strip("/").split("/")[4] for line in listing.splitlines() if line.strip()
    ) == [".", "..", "a2", "a3", "b2"]


@pytest.mark.needs_root
def test_loop_mounted_replay_recreates_every_name(tmp_path: Path, needs_root: None) -> None:
    if shutil.which("mount") is None:
        pytest.skip("needs mount")
    _img, db = _history(tmp_path)
    target = tmp_path / "rec.img"
    res = recreate(RecreateOptions(db=db, fs_name="orig", target=target, mode="mount"))
    assert res.mode == "mount" and res.failed == 0
    _fsck_clean(target)
    with loop_mount(target) as m:
        st = {p: os.lstat(m / p) for p in FINAL_PATHS}
        assert len({st[p].st_ino for p in ("a", "d/a2", "d/a3", "d/b2")}) == 1
        assert st["a"].st_nlink == 4 and st["a"].st_size == 10_000
        assert st["c"].st_nlink == 1 and st["e"].st_nlink == 1
        assert not (m / "b").exists() and not (m / "d" / "c2").exists()
