"""``setattr`` ops in snapshot deltas: a modification time from before the file's data was
written (tar sets the archive's), and mode changes, are replayed right after the data."""

from __future__ import annotations

from .synth import BS, F, Model, S
from .synth import body as _body
from .synth import two_intervals as _two


def test_a_file_whose_mtime_predates_its_creation_gets_it_set_after_its_data() -> None:
    # Unpacked in the second interval (created at 150 s) with the archive's time (20 s) and
    # mode; a file written in place keeps its own time and no setattr follows it.
    unpacked = F(20, [(2, b"tarred")], size=5000, crtime=150 * S, mtime=20 * S, perm=0o755)
    written = F(21, [(2, b"written")], size=10, crtime=160 * S, mtime=161 * S)
    same_second = F(22, [(2, b"same")], size=10, crtime=170 * S, mtime=170 * S)
    _, second, bld = _two([], [unpacked, written, same_second])
    assert _body(second) == [
        '{"op":"create","path":"tarred","size":5000}',
        '{"op":"setattr","path":"tarred","mode":493,"mtime_ns":20000000000}',
        '{"op":"create","path":"written","size":10}',
        '{"op":"create","path":"same","size":10}',
    ]
    assert bld.stats.inferred["setattr"] == 1


def test_without_crtime_the_previous_snapshot_time_decides() -> None:
    # No creation time recorded (crtime 0): an mtime before the interval's start was set.
    old_time = F(20, [(2, b"a")], size=10, mtime=50 * S)
    in_interval = F(21, [(2, b"b")], size=10, mtime=150 * S)
    _, second, _ = _two([], [old_time, in_interval])
    assert _body(second) == [
        '{"op":"create","path":"a","size":10}',
        '{"op":"setattr","path":"a","mode":420,"mtime_ns":50000000000}',
        '{"op":"create","path":"b","size":10}',
    ]


def test_setattr_follows_a_sparse_file_and_precedes_its_other_names() -> None:
    sparse = F(20, [(2, b"s"), (2, b"t")], size=10 * BS, crtime=150 * S, mtime=9 * S,
               ext=[(0, 300, 1)])  # fmt: skip
    _, second, _ = _two([], [sparse])
    assert _body(second) == [
        '{"op":"create","path":"s"}',
        '{"op":"overwrite","path":"s","size":4096}',
        '{"op":"truncate","path":"s","size":40960}',
        '{"op":"setattr","path":"s","mode":420,"mtime_ns":9000000000}',
        '{"op":"link","path":"s","dest":"t"}',
    ]


def test_a_mode_other_than_a_creates_is_set_alone() -> None:
    exe = F(20, [(2, b"run")], size=10, crtime=150 * S, mtime=151 * S, perm=0o700)
    _, second, _ = _two([], [exe])
    assert _body(second) == [
        '{"op":"create","path":"run","size":10}',
        '{"op":"setattr","path":"run","mode":448}',
    ]


def test_chmod_of_an_unchanged_file_is_a_setattr_at_its_change_time() -> None:
    before = F(20, [(2, b"f")], size=BS, crtime=5 * S, mtime=5 * S, ext=[(0, 100, 1)])
    after = F(20, [(2, b"f")], size=BS, crtime=5 * S, mtime=5 * S, ctime=130 * S,
              ext=[(0, 100, 1)], perm=0o600)  # fmt: skip
    grown = F(21, [(2, b"g")], size=BS, crtime=5 * S, mtime=5 * S, ext=[(0, 200, 1)])
    grown2 = F(21, [(2, b"g")], size=2 * BS, crtime=5 * S, mtime=140 * S,
               ext=[(0, 200, 2)])  # fmt: skip
    _, second, bld = _two([before, grown], [after, grown2])
    assert _body(second) == [
        '{"op":"setattr","path":"f","mode":384}',
        '{"op":"append","path":"g","size":4096}',
    ]
    assert bld.stats.inferred["setattr"] == 1 and bld.stats.inferred["overwrite"] == 0


def test_a_rewrite_given_an_old_time_is_followed_by_setattr() -> None:
    # tar --overwrite: the same inode rewritten (blocks moved), the archive's time put back.
    before = F(20, [(2, b"f")], size=2 * BS, crtime=5 * S, mtime=5 * S, ext=[(0, 100, 2)])
    after = F(20, [(2, b"f")], size=3 * BS, crtime=5 * S, mtime=60 * S, ctime=150 * S,
              ext=[(0, 400, 3)], perm=0o444)  # fmt: skip
    _, second, _ = _two([before], [after])
    assert _body(second) == [
        '{"op":"truncate","path":"f"}',
        '{"op":"append","path":"f","size":12288}',
        '{"op":"setattr","path":"f","mode":292,"mtime_ns":60000000000}',
    ]


def test_a_time_set_back_without_new_data_is_not_an_overwrite() -> None:
    # touch -d: same blocks, same size, an older modification time.
    before = F(20, [(2, b"f")], size=BS, crtime=5 * S, mtime=90 * S, ext=[(0, 100, 1)])
    after = F(20, [(2, b"f")], size=BS, crtime=5 * S, mtime=40 * S, ctime=150 * S,
              ext=[(0, 100, 1)])  # fmt: skip
    _, second, bld = _two([before], [after])
    assert _body(second) == ['{"op":"setattr","path":"f","mtime_ns":40000000000}']
    assert bld.stats.inferred["overwrite"] == 0
    # Switched off, the same change is the overwrite it was inferred as before.
    _, second, bld = _two([before], [after], setattr=False)
    assert _body(second) == ['{"op":"overwrite","path":"f","size":4096}']


def test_no_setattr_when_switched_off_and_streams_stay_replayable() -> None:
    a = [
        F(20, [(2, b"d")], kind="dir", crtime=1 * S),
        F(21, [(20, b"x")], size=3 * BS, crtime=2 * S, mtime=1, ext=[(0, 10, 3)], perm=0o664),
        F(22, [(2, b"y")], size=BS, crtime=3 * S, mtime=3 * S, ext=[(0, 20, 1)]),
    ]
    b = [
        F(20, [(2, b"d")], kind="dir", crtime=1 * S),
        # x replaced by a new inode (tar), y chmodded and renamed
        F(23, [(20, b"x")], size=BS, crtime=150 * S, mtime=2, ext=[(0, 50, 1)], perm=0o664),
        F(
            22,
            [(20, b"z")],
            size=BS,
            crtime=3 * S,
            mtime=3 * S,
            ctime=160 * S,
            perm=0o640,
            ext=[(0, 20, 1)],
        ),
    ]
    first, second, bld = _two(a, b)
    assert [op.to_json() for op in second if op.op in ("setattr", "rename")] == [
        '{"op":"setattr","path":"d/x","mode":436,"mtime_ns":2}',
        '{"op":"rename","path":"y","dest":"d/z"}',
        '{"op":"setattr","path":"d/z","mode":416}',
    ]
    assert [op.op for op in first].count("setattr") == 1
    # Each setattr names a file the stream has made by then (the model checks every op).
    model = Model().run(first + second)
    assert model.t == {"lost+found": None, "d": None, "d/x": BS, "d/z": BS}
    first, second, bld = _two(a, b, setattr=False)
    assert "setattr" not in [op.op for op in first + second]
    assert bld.stats.inferred["setattr"] == 0
