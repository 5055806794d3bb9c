"""A pinned op stream: a small synthetic history whose three snapshots exercise every kind of
inferred op (creates with their attributes, hard links, a symlink, a FIFO, a sparse file, a
rewrite by a new inode, grow, shrink, in-place rewrite, overwrite, chmod, touch -d, a rename
swap through a temporary name, a directory rename, removed directories) gives exactly this
stream, with each delete placement, without setattr, and with seeded intra-day files.

The expected lines were produced by the inference before its CPU was cut; any change to what
is inferred or to its order shows here first.
"""

from __future__ import annotations

import gc
from typing import Any

import pytest

from fsage.layout import Layout
from fsage.replay.deltas import DeltaBuilder, IntraDay

from .synth import BS, F, S, layout

LF = F(11, [(2, b"lost+found")], kind="dir", gen=0)


def _history() -> list[Layout]:
    s1 = [
        LF,
        F(30, [(2, b"src")], kind="dir", crtime=2 * S),
        F(31, [(2, b"docs")], kind="dir", crtime=3 * S),
        F(32, [(2, b"old")], kind="dir", crtime=4 * S),
        F(33, [(32, b"x")], size=10, crtime=5 * S, ext=[(0, 990, 1)]),
        F(40, [(30, b"a.py")], size=5000, crtime=10 * S, mtime=5 * S, ext=[(0, 1000, 2)]),
        F(41, [(30, b"b.py")], size=100, crtime=11 * S, ext=[(0, 1010, 1)]),
        F(42, [(31, b"readme")], size=9000, crtime=12 * S, ext=[(0, 1020, 3)], perm=0o600),
        F(43, [(2, b"h1"), (2, b"h2")], size=77, crtime=13 * S, ext=[(0, 1030, 1)]),
        F(44, [(2, b"ln")], kind="symlink", size=70, crtime=14 * S),
        F(45, [(2, b"pipe")], kind="fifo", crtime=15 * S),
        F(46, [(2, b"sp")], size=10 * BS - 100, crtime=16 * S, ext=[(0, 1040, 2), (6, 1050, 1)]),
        F(47, [(2, b"p")], size=1, crtime=17 * S, ext=[(0, 1060, 1)]),
        F(48, [(2, b"q")], size=2, crtime=18 * S, ext=[(0, 1061, 1)]),
        F(49, [(2, b"c")], size=3, crtime=19 * S, mtime=19 * S, ext=[(0, 1062, 1)]),
    ]
    s2 = [
        LF,
        F(30, [(2, b"src")], kind="dir", crtime=2 * S),
        F(31, [(2, b"docs")], kind="dir", crtime=3 * S),
        F(50, [(30, b"a.py")], size=6000, crtime=150 * S, ext=[(0, 1100, 2)]),
        F(
            41,
            [(30, b"b.py")],
            size=5000,
            crtime=11 * S,
            mtime=160 * S,
            ext=[(0, 1010, 1), (1, 1110, 1)],
        ),
        F(
            42,
            [(31, b"readme")],
            size=4000,
            crtime=12 * S,
            mtime=170 * S,
            ext=[(0, 1020, 1)],
            perm=0o600,
        ),
        F(43, [(2, b"h1"), (2, b"h3")], size=77, crtime=13 * S, ctime=175 * S, ext=[(0, 1030, 1)]),
        F(44, [(2, b"ln")], kind="symlink", size=70, crtime=14 * S),
        F(45, [(2, b"pipe")], kind="fifo", crtime=15 * S),
        F(46, [(2, b"sp")], size=10 * BS - 100, crtime=16 * S, ext=[(0, 1040, 2), (6, 1050, 1)]),
        F(47, [(2, b"q")], size=1, crtime=17 * S, ctime=180 * S, ext=[(0, 1060, 1)]),
        F(48, [(2, b"p")], size=2, crtime=18 * S, ctime=180 * S, ext=[(0, 1061, 1)]),
        F(
            49,
            [(2, b"c")],
            size=3,
            crtime=19 * S,
            mtime=19 * S,
            ctime=190 * S,
            ext=[(0, 1062, 1)],
            perm=0o755,
        ),
        F(60, [(2, b"new")], kind="dir", crtime=120 * S),
        F(61, [(60, b"f")], size=1, crtime=130 * S, ext=[(0, 1120, 1)]),
        F(63, [(31, b"tmp")], size=1, crtime=130 * S, ext=[(0, 1125, 1)]),
    ]
    s3 = [
        LF,
        F(30, [(2, b"lib")], kind="dir", crtime=2 * S, ctime=270 * S),
        F(31, [(2, b"docs")], kind="dir", crtime=3 * S, mtime=265 * S),
        F(50, [(30, b"a.py")], size=6000, crtime=150 * S, ext=[(0, 1100, 2)]),
        F(41, [(30, b"b.py")], size=8000, crtime=11 * S, mtime=250 * S, ext=[(0, 2000, 2)]),
        F(
            42,
            [(31, b"readme")],
            size=4000,
            crtime=12 * S,
            mtime=260 * S,
            ext=[(0, 1020, 1)],
            perm=0o600,
        ),
        F(43, [(2, b"h1"), (2, b"h3")], size=77, crtime=13 * S, ctime=175 * S, ext=[(0, 1030, 1)]),
        F(44, [(2, b"ln")], kind="symlink", size=70, crtime=14 * S),
        F(46, [(2, b"sp")], size=10 * BS - 100, crtime=16 * S, ext=[(0, 1040, 2), (6, 1050, 1)]),
        F(47, [(2, b"q")], size=1, crtime=17 * S, ctime=180 * S, ext=[(0, 1060, 1)]),
        F(48, [(2, b"p")], size=2, crtime=18 * S, ctime=180 * S, ext=[(0, 1061, 1)]),
        F(
            49,
            [(2, b"c")],
            size=3,
            crtime=19 * S,
            mtime=1 * S,
            ctime=280 * S,
            ext=[(0, 1062, 1)],
            perm=0o755,
        ),
        F(62, [(31, b"notes")], size=1, crtime=270 * S, ext=[(0, 1130, 1)]),
    ]
    return [layout(s) for s in (s1, s2, s3)]


def _stream(**kw: Any) -> tuple[list[str], dict[str, int]]:
    builder = DeltaBuilder(**kw)
    ops = []
    prev: Layout | None = None
    for i, lay in enumerate(_history()):
        start = None if prev is None else i * 100 * S
        ops += builder.interval(prev, lay, start_ns=start, end_ns=(i + 1) * 100 * S,
                                label=f"s{i + 1}")  # fmt: skip
        prev = lay
    return [op.to_json() for op in ops], builder.stats.inferred


INTRA = IntraDay(files_per_day=86_400 * 0.03, lifetime_s=20.0, seed=5,
                 size={"mu": 8.0, "sigma": 0.5})  # fmt: skip
VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "parent_nosetattr": {"deletes": "parent", "setattr": False},
    "intra": {"intra": INTRA},
}

DEFAULT = [
    '{"op":"mkdir","path":"src"}',
    '{"op":"mkdir","path":"docs"}',
    '{"op":"mkdir","path":"old"}',
    '{"op":"create","path":"old/x","size":10}',
    '{"op":"create","path":"src/a.py","size":5000}',
    '{"op":"setattr","path":"src/a.py","mode":420,"mtime_ns":5000000000}',
    '{"op":"create","path":"src/b.py","size":100}',
    '{"op":"create","path":"docs/readme","size":9000}',
    '{"op":"setattr","path":"docs/readme","mode":384}',
    '{"op":"create","path":"h1","size":77}',
    '{"op":"link","path":"h1","dest":"h2"}',
    '{"op":"symlink","path":"ln","size":70}',
    '{"op":"mknod","path":"pipe","label":"fifo"}',
    '{"op":"create","path":"sp"}',
    '{"op":"overwrite","path":"sp","size":8192}',
    '{"op":"overwrite","path":"sp","size":4096,"offset":24576}',
    '{"op":"truncate","path":"sp","size":40860}',
    '{"op":"create","path":"p","size":1}',
    '{"op":"create","path":"q","size":2}',
    '{"op":"create","path":"c","size":3}',
    '{"op":"snapshot","label":"s1"}',
    '{"op":"delete","path":"old/x"}',
    '{"op":"mkdir","path":"new"}',
    '{"op":"create","path":"new/f","size":1}',
    '{"op":"create","path":"docs/tmp","size":1}',
    '{"op":"delete","path":"src/a.py"}',
    '{"op":"create","path":"src/a.py","size":6000}',
    '{"op":"append","path":"src/b.py","size":4900}',
    '{"op":"truncate","path":"docs/readme","size":4000}',
    '{"op":"rename","path":"h2","dest":"h3"}',
    '{"op":"setattr","path":"c","mode":493}',
    '{"op":"delete","path":"old"}',
    '{"op":"rename","path":"p","dest":".fsage-replay-tmp-2"}',
    '{"op":"rename","path":"q","dest":"p"}',
    '{"op":"rename","path":".fsage-replay-tmp-2","dest":"q"}',
    '{"op":"snapshot","label":"s2"}',
    '{"op":"delete","path":"pipe"}',
    '{"op":"delete","path":"new/f"}',
    '{"op":"delete","path":"docs/tmp"}',
    '{"op":"truncate","path":"src/b.py"}',
    '{"op":"append","path":"src/b.py","size":8000}',
    '{"op":"overwrite","path":"docs/readme","size":4000}',
    '{"op":"rename","path":"src","dest":"lib"}',
    '{"op":"create","path":"docs/notes","size":1}',
    '{"op":"setattr","path":"c","mtime_ns":1000000000}',
    '{"op":"delete","path":"new"}',
    '{"op":"snapshot","label":"s3"}',
]
DEFAULT_INFERRED = {
    "mkdir": 4,
    "create": 13,
    "grow": 1,
    "shrink": 1,
    "rewrite": 1,
    "overwrite": 1,
    "rename": 4,
    "link": 1,
    "delete": 5,
    "rmdir": 2,
    "symlink": 1,
    "special": 1,
    "setattr": 4,
}

PARENT_NOSETATTR = [
    '{"op":"mkdir","path":"src"}',
    '{"op":"mkdir","path":"docs"}',
    '{"op":"mkdir","path":"old"}',
    '{"op":"create","path":"old/x","size":10}',
    '{"op":"create","path":"src/a.py","size":5000}',
    '{"op":"create","path":"src/b.py","size":100}',
    '{"op":"create","path":"docs/readme","size":9000}',
    '{"op":"create","path":"h1","size":77}',
    '{"op":"link","path":"h1","dest":"h2"}',
    '{"op":"symlink","path":"ln","size":70}',
    '{"op":"mknod","path":"pipe","label":"fifo"}',
    '{"op":"create","path":"sp"}',
    '{"op":"overwrite","path":"sp","size":8192}',
    '{"op":"overwrite","path":"sp","size":4096,"offset":24576}',
    '{"op":"truncate","path":"sp","size":40860}',
    '{"op":"create","path":"p","size":1}',
    '{"op":"create","path":"q","size":2}',
    '{"op":"create","path":"c","size":3}',
    '{"op":"snapshot","label":"s1"}',
    '{"op":"delete","path":"old/x"}',
    '{"op":"mkdir","path":"new"}',
    '{"op":"create","path":"new/f","size":1}',
    '{"op":"create","path":"docs/tmp","size":1}',
    '{"op":"delete","path":"src/a.py"}',
    '{"op":"create","path":"src/a.py","size":6000}',
    '{"op":"append","path":"src/b.py","size":4900}',
    '{"op":"truncate","path":"docs/readme","size":4000}',
    '{"op":"rename","path":"h2","dest":"h3"}',
    '{"op":"delete","path":"old"}',
    '{"op":"rename","path":"p","dest":".fsage-replay-tmp-2"}',
    '{"op":"rename","path":"q","dest":"p"}',
    '{"op":"rename","path":".fsage-replay-tmp-2","dest":"q"}',
    '{"op":"snapshot","label":"s2"}',
    '{"op":"delete","path":"pipe"}',
    '{"op":"delete","path":"new/f"}',
    '{"op":"overwrite","path":"c","size":3}',
    '{"op":"truncate","path":"src/b.py"}',
    '{"op":"append","path":"src/b.py","size":8000}',
    '{"op":"overwrite","path":"docs/readme","size":4000}',
    '{"op":"delete","path":"docs/tmp"}',
    '{"op":"rename","path":"src","dest":"lib"}',
    '{"op":"create","path":"docs/notes","size":1}',
    '{"op":"delete","path":"new"}',
    '{"op":"snapshot","label":"s3"}',
]
PARENT_NOSETATTR_INFERRED = {
    "mkdir": 4,
    "create": 13,
    "grow": 1,
    "shrink": 1,
    "rewrite": 1,
    "overwrite": 2,
    "rename": 4,
    "link": 1,
    "delete": 5,
    "rmdir": 2,
    "symlink": 1,
    "special": 1,
}

INTRA = [
    '{"op":"mkdir","path":"src"}',
    '{"op":"mkdir","path":"docs"}',
    '{"op":"mkdir","path":"old"}',
    '{"op":"create","path":"old/x","size":10}',
    '{"op":"create","path":"src/a.py","size":5000}',
    '{"op":"setattr","path":"src/a.py","mode":420,"mtime_ns":5000000000}',
    '{"op":"create","path":"src/b.py","size":100}',
    '{"op":"create","path":"docs/readme","size":9000}',
    '{"op":"setattr","path":"docs/readme","mode":384}',
    '{"op":"create","path":"h1","size":77}',
    '{"op":"link","path":"h1","dest":"h2"}',
    '{"op":"symlink","path":"ln","size":70}',
    '{"op":"mknod","path":"pipe","label":"fifo"}',
    '{"op":"create","path":"sp"}',
    '{"op":"overwrite","path":"sp","size":8192}',
    '{"op":"overwrite","path":"sp","size":4096,"offset":24576}',
    '{"op":"truncate","path":"sp","size":40860}',
    '{"op":"create","path":"p","size":1}',
    '{"op":"create","path":"q","size":2}',
    '{"op":"create","path":"c","size":3}',
    '{"op":"snapshot","label":"s1"}',
    '{"op":"delete","path":"old/x"}',
    '{"op":"create","path":".fsage-intra-4","size":1590}',
    '{"op":"mkdir","path":"new"}',
    '{"op":"delete","path":".fsage-intra-4"}',
    '{"op":"create","path":"new/f","size":1}',
    '{"op":"create","path":"docs/tmp","size":1}',
    '{"op":"delete","path":"src/a.py"}',
    '{"op":"create","path":"src/a.py","size":6000}',
    '{"op":"append","path":"src/b.py","size":4900}',
    '{"op":"truncate","path":"docs/readme","size":4000}',
    '{"op":"rename","path":"h2","dest":"h3"}',
    '{"op":"create","path":"docs/.fsage-intra-3","size":2816}',
    '{"op":"create","path":"src/.fsage-intra-2","size":3318}',
    '{"op":"delete","path":"docs/.fsage-intra-3"}',
    '{"op":"setattr","path":"c","mode":493}',
    '{"op":"delete","path":"src/.fsage-intra-2"}',
    '{"op":"delete","path":"old"}',
    '{"op":"rename","path":"p","dest":".fsage-replay-tmp-5"}',
    '{"op":"rename","path":"q","dest":"p"}',
    '{"op":"rename","path":".fsage-replay-tmp-5","dest":"q"}',
    '{"op":"snapshot","label":"s2"}',
    '{"op":"delete","path":"pipe"}',
    '{"op":"delete","path":"new/f"}',
    '{"op":"delete","path":"docs/tmp"}',
    '{"op":"create","path":"docs/.fsage-intra-7","size":2459}',
    '{"op":"create","path":".fsage-intra-6","size":2497}',
    '{"op":"delete","path":".fsage-intra-6"}',
    '{"op":"delete","path":"docs/.fsage-intra-7"}',
    '{"op":"truncate","path":"src/b.py"}',
    '{"op":"append","path":"src/b.py","size":8000}',
    '{"op":"overwrite","path":"docs/readme","size":4000}',
    '{"op":"rename","path":"src","dest":"lib"}',
    '{"op":"create","path":"docs/notes","size":1}',
    '{"op":"setattr","path":"c","mtime_ns":1000000000}',
    '{"op":"create","path":"lost+found/.fsage-intra-8","size":2502}',
    '{"op":"delete","path":"lost+found/.fsage-intra-8"}',
    '{"op":"delete","path":"new"}',
    '{"op":"snapshot","label":"s3"}',
]
INTRA_INFERRED = {
    "mkdir": 4,
    "create": 13,
    "grow": 1,
    "shrink": 1,
    "rewrite": 1,
    "overwrite": 1,
    "rename": 4,
    "link": 1,
    "delete": 5,
    "rmdir": 2,
    "intra_create": 6,
    "intra_delete": 6,
    "symlink": 1,
    "special": 1,
    "setattr": 4,
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_inferred_stream_is_pinned(variant: str) -> None:
    ops, inferred = _stream(**VARIANTS[variant])
    assert ops == globals()[variant.upper()]
    assert {k: v for k, v in inferred.items() if v} == globals()[variant.upper() + "_INFERRED"]


def test_interval_leaves_the_garbage_collector_as_it_found_it() -> None:
    was = gc.isenabled()
    try:
        for enabled in (True, False):
            gc.enable() if enabled else gc.disable()
            DeltaBuilder().interval(None, _history()[0], start_ns=None, end_ns=100 * S)
            assert gc.isenabled() is enabled
        gc.enable()
        with pytest.raises(AttributeError):  # an interval that fails half-way
            DeltaBuilder().interval(None, None, start_ns=None, end_ns=1)  # type: ignore[arg-type]
        assert gc.isenabled()
    finally:
        gc.enable() if was else gc.disable()
