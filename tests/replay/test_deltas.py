"""Snapshot deltas on synthetic Layouts: each op kind, renames, ordering, untrusted names.

The oracle for whole streams is a tiny file-system model (``Model``) written here: it applies
ops with POSIX rules (a parent must exist, a name must be free, a removed directory must be
empty) and must end holding exactly the later snapshot's files.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fsage.errors import UsageError
from fsage.replay.deltas import DeltaBuilder, IntraDay, parse_when
from fsage.workload import Op, WorkloadHeader, check_relpath, read_workload, write_workload

from .synth import BS, LF, F, Model, S, layout
from .synth import body as _body
from .synth import two_intervals as _two


def test_population_in_creation_order_dirs_first() -> None:
    ents = [
        F(20, [(2, b"late")], size=10, crtime=50 * S, mtime=50 * S),
        F(21, [(22, b"inner")], size=7000, crtime=5 * S, mtime=60 * S),
        F(22, [(2, b"d")], kind="dir", crtime=30 * S),
        F(23, [(2, b"early")], size=1, crtime=1 * S),
    ]
    first, _, bld = _two(ents, ents)
    # inner was created (crtime 5) before its directory's recorded crtime (30): it waits.
    assert _body(first) == [
        '{"op":"create","path":"early","size":1}',
        '{"op":"mkdir","path":"d"}',
        '{"op":"create","path":"d/inner","size":7000}',
        '{"op":"create","path":"late","size":10}',
    ]
    assert first[-1] == Op("snapshot", label="s1")
    assert bld.stats.inferred["create"] == 3 and bld.stats.inferred["mkdir"] == 1


def test_unchanged_snapshot_gives_no_ops() -> None:
    ents = [F(20, [(2, b"a")], size=9000, mtime=5 * S, ext=[(0, 500, 3)])]
    _, second, _ = _two(ents, ents)
    assert second == [Op("snapshot", label="s2")]


@pytest.mark.parametrize(
    ("before", "after", "expect", "kind"),
    [
        # grow: old blocks stay, two more
        (
            F(20, [(2, b"f")], size=2 * BS, mtime=1, ext=[(0, 100, 2)]),
            F(20, [(2, b"f")], size=4 * BS + 5, mtime=150 * S, ext=[(0, 100, 2), (2, 300, 3)]),
            ['{"op":"append","path":"f","size":8197}'],
            "grow",
        ),
        # shrink: truncated, the blocks it kept did not move
        (
            F(20, [(2, b"f")], size=4 * BS, mtime=1, ext=[(0, 100, 4)]),
            F(20, [(2, b"f")], size=BS + 1, mtime=150 * S, ext=[(0, 100, 2)]),
            ['{"op":"truncate","path":"f","size":4097}'],
            "shrink",
        ),
        # rewrite: same size, blocks moved
        (
            F(20, [(2, b"f")], size=3 * BS, mtime=1, ext=[(0, 100, 3)]),
            F(20, [(2, b"f")], size=3 * BS, mtime=150 * S, ext=[(0, 700, 3)]),
            ['{"op":"truncate","path":"f"}', '{"op":"append","path":"f","size":12288}'],
            "rewrite",
        ),
        # rewrite even when the modification time did not change (extents are the evidence);
        # the time, from before the interval, is put back after the data
        (
            F(20, [(2, b"f")], size=2 * BS, mtime=7, ext=[(0, 100, 2)]),
            F(20, [(2, b"f")], size=2 * BS, mtime=7, ext=[(0, 100, 1), (1, 900, 1)]),
            [
                '{"op":"truncate","path":"f"}',
                '{"op":"append","path":"f","size":8192}',
                '{"op":"setattr","path":"f","mtime_ns":7}',
            ],
            "rewrite",
        ),
        # rewrite and grow: the first block moved, so the whole file is written anew
        (
            F(20, [(2, b"f")], size=2 * BS, mtime=1, ext=[(0, 100, 2)]),
            F(20, [(2, b"f")], size=3 * BS, mtime=150 * S, ext=[(0, 400, 3)]),
            ['{"op":"truncate","path":"f"}', '{"op":"append","path":"f","size":12288}'],
            "rewrite",
        ),
        # overwrite in place: same size, same blocks, newer mtime
        (
            F(20, [(2, b"f")], size=2 * BS, mtime=1, ext=[(0, 100, 2)]),
            F(20, [(2, b"f")], size=2 * BS, mtime=150 * S, ext=[(0, 100, 2)]),
            ['{"op":"overwrite","path":"f","size":8192}'],
            "overwrite",
        ),
        # extents split but blocks unchanged (same mapping): nothing happened
        (
            F(20, [(2, b"f")], size=4 * BS, mtime=1, ext=[(0, 100, 4)]),
            F(20, [(2, b"f")], size=4 * BS, mtime=1, ext=[(0, 100, 2), (2, 102, 2)]),
            [],
            "",
        ),
    ],
)
def test_each_content_change(before: F, after: F, expect: list[str], kind: str) -> None:
    _, second, bld = _two([before], [after])
    assert _body(second) == expect
    if kind:
        assert bld.stats.inferred[kind] == 1
        others = {
            k: v for k, v in bld.stats.inferred.items() if k not in (kind, "create", "setattr")
        }
        assert set(others.values()) == {0}


def test_create_delete_and_rename_by_inode_and_generation() -> None:
    a = [
        F(20, [(2, b"old")], size=100, ctime=1),
        F(21, [(2, b"gone")], size=5, ctime=1),
        F(22, [(2, b"reused")], size=7, gen=1, ctime=1),
    ]
    b = [
        F(20, [(2, b"new-name")], size=100, ctime=120 * S),
        F(22, [(2, b"reused")], size=9, gen=2, crtime=130 * S),  # same ino, new generation
        F(23, [(2, b"fresh")], size=4096, crtime=110 * S),
    ]
    _, second, bld = _two(a, b)
    # The name a new inode took is freed just before the new file comes (at 130 s).
    assert _body(second) == [
        '{"op":"delete","path":"gone"}',
        '{"op":"create","path":"fresh","size":4096}',
        '{"op":"rename","path":"old","dest":"new-name"}',
        '{"op":"delete","path":"reused"}',
        '{"op":"create","path":"reused","size":9}',
    ]
    assert bld.stats.inferred["rename"] == 1
    assert bld.stats.inferred["delete"] == 2


def test_ordering_follows_recorded_times_and_clamps() -> None:
    a = [F(20, [(2, b"x")], size=BS, mtime=1, ext=[(0, 100, 1)])]
    b = [
        F(20, [(2, b"x")], size=2 * BS, mtime=180 * S, ext=[(0, 100, 2)]),
        F(30, [(2, b"c")], size=1, crtime=170 * S),
        F(31, [(2, b"b")], size=1, crtime=140 * S),
        F(32, [(2, b"a")], size=1, crtime=5 * S),  # before the interval (restored times)
        F(33, [(2, b"z")], size=1, crtime=999 * S),  # after it (clock skew)
    ]
    _, second, _ = _two(a, b)
    assert [(o.op, o.path) for o in second[:-1]] == [
        ("create", "a"),
        ("create", "b"),
        ("create", "c"),
        ("append", "x"),
        ("create", "z"),
    ]


def test_directories_made_moved_and_removed() -> None:
    a = [
        F(40, [(2, b"d")], kind="dir", crtime=1),
        F(41, [(40, b"f")], size=3, crtime=2),
        F(42, [(2, b"rm")], kind="dir", crtime=3),
        F(43, [(42, b"sub")], kind="dir", crtime=4),
        F(44, [(43, b"g")], size=1, crtime=5),
        F(45, [(42, b"keep")], size=2, crtime=6),
    ]
    b = [
        F(40, [(2, b"e")], kind="dir", crtime=1, ctime=150 * S),
        F(41, [(40, b"f")], size=3, crtime=2),
        F(45, [(46, b"keep")], size=2, crtime=6, ctime=160 * S),
        F(46, [(2, b"new")], kind="dir", crtime=120 * S),
    ]
    first, second, bld = _two(a, b)
    assert _body(second) == [
        '{"op":"delete","path":"rm/sub/g"}',
        '{"op":"mkdir","path":"new"}',
        '{"op":"rename","path":"d","dest":"e"}',
        '{"op":"rename","path":"rm/keep","dest":"new/keep"}',
        '{"op":"delete","path":"rm/sub"}',
        '{"op":"delete","path":"rm"}',
    ]
    assert bld.stats.inferred["rmdir"] == 2
    model = Model().run(first + second)
    assert model.t == {"lost+found": None, "e": None, "e/f": 3, "new": None, "new/keep": 2}


def test_rename_swap_goes_through_a_temporary_name() -> None:
    a = [F(20, [(2, b"a")], size=1, ctime=1), F(21, [(2, b"b")], size=2, ctime=1)]
    b = [F(20, [(2, b"b")], size=1, ctime=150 * S), F(21, [(2, b"a")], size=2, ctime=150 * S)]
    first, second, _ = _two(a, b)
    renames = [o for o in second if o.op == "rename"]
    assert len(renames) == 3
    assert renames[0].dest.startswith(".fsage-replay-tmp-")
    model = Model().run(first + second)
    assert model.t == {"lost+found": None, "a": 2, "b": 1}


def test_replace_by_rename_over_an_existing_name() -> None:
    # Editor-style save: new inode renamed over the old name; the old inode is gone.
    a = [F(20, [(2, b"doc")], size=10, ctime=1)]
    b = [F(21, [(2, b"doc")], size=12, crtime=150 * S)]
    first, second, _ = _two(a, b)
    assert _body(second) == [
        '{"op":"delete","path":"doc"}',
        '{"op":"create","path":"doc","size":12}',
    ]
    assert Model().run(first + second).t == {"lost+found": None, "doc": 12}


def test_deletes_at_parent_change() -> None:
    a = [
        F(40, [(2, b"d")], kind="dir", crtime=1),
        F(41, [(40, b"old")], size=3, crtime=2),
    ]
    b = [
        F(40, [(2, b"d")], kind="dir", crtime=1, mtime=170 * S),
        F(42, [(2, b"new")], size=3, crtime=130 * S),
    ]
    _, first_policy, _ = _two(a, b)
    _, parent_policy, _ = _two(a, b, deletes="parent")
    assert [o.path for o in first_policy[:-1]] == ["d/old", "new"]
    assert [o.path for o in parent_policy[:-1]] == ["new", "d/old"]
    with pytest.raises(UsageError):
        DeltaBuilder(deletes="never")


@pytest.mark.parametrize(
    "bad", [b"..", b".", b"", b"a/b", b"nul\0byte", b"x" * 256, b"../../etc/passwd"]
)
def test_untrusted_names_are_skipped_and_counted(bad: bytes) -> None:
    ents = [
        F(20, [(2, bad)], kind="dir", crtime=1),
        F(21, [(20, b"inside")], size=5, crtime=2),
        F(22, [(2, b"ok")], size=6, crtime=3),
    ]
    first, _, bld = _two(ents, ents)
    assert _body(first) == ['{"op":"create","path":"ok","size":6}']
    assert bld.stats.skipped_counts() == {"unsafe_name": 1}
    for op in first[:-1]:
        check_relpath(op.path)


def test_symlinks_special_files_made_and_hard_links_linked() -> None:
    ents = [
        F(20, [(2, b"ln")], kind="symlink", size=70, crtime=3),
        F(21, [(2, b"pipe")], kind="fifo", crtime=2),
        F(22, [(2, b"h1"), (2, b"h2"), (2, b"h3")], size=77, crtime=1),
    ]
    first, second, bld = _two(ents, ents)
    assert _body(first) == [
        '{"op":"create","path":"h1","size":77}',
        '{"op":"link","path":"h1","dest":"h2"}',
        '{"op":"link","path":"h1","dest":"h3"}',
        '{"op":"mknod","path":"pipe","label":"fifo"}',
        '{"op":"symlink","path":"ln","size":70}',
    ]
    assert _body(second) == []
    assert bld.stats.skipped_counts() == {}
    assert bld.stats.inferred["symlink"] == 1 and bld.stats.inferred["special"] == 1


def test_sparse_file_is_made_with_its_holes() -> None:
    # 10 blocks long, data in blocks 0-1 and 6; recorded on a file system with extents.
    ents = [F(20, [(2, b"sp")], size=10 * BS - 100, crtime=1, ext=[(0, 500, 2), (6, 900, 1)])]
    lay = layout(ents)
    lay.facts.mkfs = {"features": ["extent", "sparse_super"]}
    ops = DeltaBuilder().interval(None, lay, start_ns=None, end_ns=10 * S)
    assert _body(ops) == [
        '{"op":"create","path":"sp"}',
        f'{{"op":"overwrite","path":"sp","size":{2 * BS}}}',
        f'{{"op":"overwrite","path":"sp","size":{BS},"offset":{6 * BS}}}',
        f'{{"op":"truncate","path":"sp","size":{10 * BS - 100}}}',
    ]


def test_hard_link_losing_its_first_name_loses_that_name_only() -> None:
    # More cases, with an inode-aware model, in test_hard_links.py.
    a = [F(22, [(2, b"h1"), (2, b"h2")], size=7, crtime=1)]
    b = [F(22, [(2, b"h2")], size=7, crtime=1, ctime=150 * S)]
    _, second, bld = _two(a, b)
    assert _body(second) == ['{"op":"delete","path":"h1"}']
    assert bld.stats.inferred["unlink"] == 1 and bld.stats.inferred["delete"] == 0


def test_non_utf8_name_survives_the_workload_file(tmp_path: Path) -> None:
    raw = b"caf\xe9-\xff"
    ents = [F(20, [(2, raw)], size=3, crtime=1)]
    first, _, _ = _two(ents, ents)
    path = tmp_path / "ops.jsonl"
    write_workload(path, WorkloadHeader("test"), first)
    _, ops = read_workload(path)
    back = list(ops)
    assert os.fsencode(back[0].path) == raw


def test_stream_rebuilds_every_snapshot_in_a_model() -> None:
    s1 = [
        F(40, [(2, b"d")], kind="dir", crtime=1),
        F(41, [(40, b"a")], size=BS, crtime=2, mtime=2, ext=[(0, 10, 1)]),
        F(42, [(2, b"b")], size=3 * BS, crtime=3, mtime=3, ext=[(0, 20, 3)]),
    ]
    s2 = [
        F(40, [(2, b"d")], kind="dir", crtime=1),
        F(41, [(40, b"a2")], size=2 * BS, crtime=2, mtime=150 * S, ctime=160 * S,
          ext=[(0, 10, 2)]),
        F(43, [(40, b"c")], size=1, crtime=140 * S),
    ]  # fmt: skip
    s3 = [
        F(44, [(2, b"d")], size=9, crtime=250 * S),
        F(41, [(2, b"a2")], size=BS, crtime=2, mtime=240 * S, ctime=240 * S, ext=[(0, 10, 1)]),
    ]
    bld = DeltaBuilder()
    l1, l2, l3 = layout([LF, *s1]), layout([LF, *s2]), layout([LF, *s3])
    model = Model()
    model.run(bld.interval(None, l1, start_ns=None, end_ns=100 * S))
    assert model.t == {"lost+found": None, "d": None, "d/a": BS, "b": 3 * BS}
    model.run(bld.interval(l1, l2, start_ns=100 * S, end_ns=200 * S))
    assert model.t == {"lost+found": None, "d": None, "d/a2": 2 * BS, "d/c": 1}
    model.run(bld.interval(l2, l3, start_ns=200 * S, end_ns=300 * S))
    assert model.t == {"lost+found": None, "d": 9, "a2": BS}


def test_start_from_a_snapshot_emits_only_the_changes() -> None:
    s1 = [F(20, [(2, b"a")], size=5, crtime=1)]
    s2 = [F(20, [(2, b"a")], size=5, crtime=1), F(21, [(2, b"b")], size=6, crtime=150 * S)]
    bld = DeltaBuilder()
    l1, l2 = layout([LF, *s1]), layout([LF, *s2])
    bld.start_from(l1)
    ops = bld.interval(l1, l2, start_ns=100 * S, end_ns=200 * S)
    assert _body(ops) == ['{"op":"create","path":"b","size":6}']


def test_intra_day_files_are_seeded_pairs() -> None:
    ents = [F(40, [(2, b"d")], kind="dir", crtime=1), F(41, [(2, b"f")], size=5000, crtime=1)]
    intra = IntraDay(files_per_day=86_400 * 10, lifetime_s=5.0, seed=7,
                     size={"mu": 8.0, "sigma": 0.5})  # fmt: skip
    runs = []
    for _ in range(2):
        first, second, bld = _two(ents, ents, intra=intra)
        runs.append(second)
        creates = [o for o in second if o.op == "create"]
        deletes = [o for o in second if o.op == "delete"]
        # 100 s at 10 files per second.
        assert len(creates) == len(deletes) == 1000
        assert {o.path for o in creates} == {o.path for o in deletes}
        assert all(o.path.rpartition("/")[2].startswith(".fsage-intra-") for o in creates)
        assert bld.stats.inferred["intra_create"] == 1000
        assert bld.stats.intervals[1]["intra_day_files"] == 1000
        Model().run(first + second)
    assert runs[0] == runs[1]
    # A different seed gives a different stream.
    _, other, _ = _two(ents, ents, intra=IntraDay(864_000, 5.0, seed=8, size=intra.size))
    assert other != runs[0]
    # No intra-day activity while populating (no interval start).
    assert [o.op for o in first] == ["mkdir", "create", "snapshot"]


def test_parse_when() -> None:
    assert parse_when("12") == 12
    d = parse_when("2024-05-01")
    assert not isinstance(d, int)
    assert d.isoformat() == "2024-05-01T23:59:59.999999+00:00"
    t = parse_when("2024-05-01T10:00+02:00")
    assert not isinstance(t, int)
    assert t.isoformat() == "2024-05-01T10:00:00+02:00"
    with pytest.raises(UsageError):
        parse_when("last tuesday")


def test_inode_reused_for_a_directory_is_delete_then_mkdir() -> None:
    a = [F(20, [(2, b"f")], size=5, crtime=7, ctime=1)]
    b = [F(20, [(2, b"d")], kind="dir", crtime=7), F(21, [(20, b"in")], size=1, crtime=8)]
    first, second, _bld = _two(a, b)
    assert _body(second) == [
        '{"op":"delete","path":"f"}',
        '{"op":"mkdir","path":"d"}',
        '{"op":"create","path":"d/in","size":1}',
    ]
    assert Model().run(first + second).t == {"lost+found": None, "d": None, "d/in": 1}


def test_without_generation_a_moved_and_rewritten_inode_is_a_new_file() -> None:
    # No generation and no creation time (libext2fs-written images): inode 20 under a new
    # name with its blocks elsewhere is taken for a reused inode, not a rename.
    a = [F(20, [(2, b"a")], size=BS, gen=0, mtime=1, ext=[(0, 100, 1)])]
    b = [F(20, [(2, b"b")], size=BS, gen=0, mtime=150 * S, ext=[(0, 500, 1)])]
    _, second, _ = _two(a, b)
    assert _body(second) == ['{"op":"delete","path":"a"}', '{"op":"create","path":"b","size":4096}']
    # The same with a generation is a rename plus a rewrite.
    a[0].gen = b[0].gen = 5
    _, second, _bld = _two(a, b)
    assert _body(second) == [
        '{"op":"rename","path":"a","dest":"b"}',
        '{"op":"truncate","path":"b"}',
        '{"op":"append","path":"b","size":4096}',
    ]
