"""The ``setattr`` op (permission bits and/or modification time, as tar sets them after a
file's data) in the workload format and on every executor: the kernel (lstat), e2fsprogs
(debugfs, e2fsck) and the LFS's own stat are the oracles."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

import pytest

from fsage.ager.images import make_image
from fsage.ager.posix import PosixExecutor
from fsage.errors import WorkloadError
from fsage.workload import Op, WorkloadHeader, read_workload, write_workload

from .helpers import debugfs, fsck_clean

MIB = 1 << 20
#: 2033-05-18 03:33:20.123456789 UTC: past 2^31 seconds, so the epoch bits are needed too.
LATE_NS = 2_000_000_000 * 10**9 + 123_456_789
EARLY_NS = -1_500_000_001  # before 1970, nanoseconds included


# ---------------------------------------------------------------------------- format


def test_setattr_round_trips_and_old_streams_still_parse(tmp_path: Path) -> None:
    ops = [
        Op("create", "f", size=10),
        Op("setattr", "f", mode=0o755, mtime_ns=LATE_NS),
        Op("setattr", "f", mode=0),
        Op("setattr", "f", mtime_ns=EARLY_NS),
    ]
    assert ops[1].to_json() == (
        '{"op":"setattr","path":"f","mode":493,"mtime_ns":2000000000123456789}'
    )
    wl = tmp_path / "w.jsonl"
    write_workload(wl, WorkloadHeader(generator="t"), ops)
    assert [json.loads(line) for line in wl.read_text().splitlines()[1:]][2] == {
        "op": "setattr", "path": "f", "mode": 0
    }  # fmt: skip
    _, got = read_workload(wl)
    assert list(got) == ops
    # A stream written before setattr existed: no mode or mtime_ns on any line.
    old = tmp_path / "old.jsonl"
    old.write_text(
        WorkloadHeader(generator="t").to_json() + '\n{"op":"create","path":"a","size":3}\n'
    )
    assert list(read_workload(old)[1]) == [Op("create", "a", size=3)]


@pytest.mark.parametrize(
    ("line", "msg"),
    [
        ('{"op":"setattr","path":"f"}', "sets neither mode nor mtime"),
        ('{"op":"setattr","path":"f","mode":4096}', "not permission bits"),
        ('{"op":"setattr","path":"f","mode":-1}', "not permission bits"),
        ('{"op":"setattr","path":"f","mode":"644"}', "bad op"),
        ('{"op":"setattr","path":"f","mtime_ns":1.5}', "bad op"),
        ('{"op":"setattr","path":"f","mtime_ns":true}', "bad op"),
        ('{"op":"setattr","path":"f","mtime_ns":9223372036854775808}', "out of range"),
        ('{"op":"setattr","path":"../f","mode":420}', "unsafe path"),
        ('{"op":"create","path":"f","mode":420}', "belong to setattr"),
    ],
)
def test_bad_setattr_lines_are_refused(tmp_path: Path, line: str, msg: str) -> None:
    wl = tmp_path / "w.jsonl"
    wl.write_text(WorkloadHeader(generator="t").to_json() + "\n" + line + "\n")
    with pytest.raises(WorkloadError, match=msg):
        list(read_workload(wl)[1])


# ---------------------------------------------------------------------------- posix


class _Journal:
    def __init__(self, path: Path) -> None:
        from fsage.ager.run import _op_line

        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self.line = _op_line

    def add(self, op: Op) -> None:
        os.write(self.fd, self.line(op))


_POSIX_OPS = [
    Op("mkdir", "d"),
    Op("create", "d/f", size=5000),
    Op("setattr", "d/f", mode=0o751, mtime_ns=LATE_NS),
    Op("create", "d/g", size=1),
    Op("setattr", "d/g", mtime_ns=EARLY_NS),
    Op("setattr", "d/g", mode=0o600),
    Op("symlink", "d/l", dest="f"),
    Op("setattr", "d/l", mode=0o600, mtime_ns=LATE_NS + 5),  # the link's own time, no mode
    Op("create", "d/\u00e9", size=2),
    Op("setattr", "d/\u00e9", mode=0o640),
    Op("setattr", "d", mode=0o700, mtime_ns=7),  # a directory too (after its last entry)
]


@pytest.mark.parametrize("ahead", [False, True])
def test_posix_setattr_sets_mode_and_mtime_never_through_a_symlink(
    tmp_path: Path, ahead: bool
) -> None:
    root = tmp_path / "t"
    root.mkdir()
    journal = _Journal(tmp_path / "j.jsonl")
    with PosixExecutor(root) as ex:
        ex.capacity_blocks()  # what queued ops may use
        step = ex.journaled(journal, ahead=ahead)
        assert [step(op) for op in _POSIX_OPS][2] == 0
        ex.drain()
        with pytest.raises(WorkloadError, match=r"^setattr 'd/nope': No such file"):
            ex.apply(Op("setattr", "d/nope", mode=0o644))
    os.close(journal.fd)
    f, g, d = os.stat(root / "d/f"), os.stat(root / "d/g"), os.stat(root / "d")
    assert (stat.S_IMODE(f.st_mode), f.st_mtime_ns, f.st_size) == (0o751, LATE_NS, 5000)
    assert (stat.S_IMODE(g.st_mode), g.st_mtime_ns) == (0o600, EARLY_NS)
    assert (stat.S_IMODE(d.st_mode), d.st_mtime_ns) == (0o700, 7)
    assert os.lstat(root / "d/l").st_mtime_ns == LATE_NS + 5
    assert stat.S_IMODE(os.stat(root / "d/\u00e9").st_mode) == 0o640
    # The journal lines are Op.to_json's, whether the C side wrote them or journal.add did.
    want = "".join(op.to_json() + "\n" for op in _POSIX_OPS).encode()
    assert (tmp_path / "j.jsonl").read_bytes() == want
    assert b"".join(journal.line(op) for op in _POSIX_OPS) == want


# ---------------------------------------------------------------------------- offline


def _debugfs_attrs(image: Path, path: str) -> tuple[int, str]:
    out = debugfs(image, f'stat "/{path}"')
    mode = re.search(r"Mode:\s+(\d+)", out)
    mtime = re.search(r"mtime: (0x[0-9a-f]+(?::[0-9a-f]+)?)", out)
    assert mode and mtime, out
    return int(mode.group(1), 8), mtime.group(1)


def test_offline_setattr_writes_the_inode_as_the_kernel_would(
    tmp_path: Path, e2fsprogs: None
) -> None:
    pytest.importorskip("fsage._ext2fs")
    from fsage.ager.offline import OfflineExtExecutor
    from fsage.snapshotter import read_source

    img = make_image(tmp_path / "o.img", "ext4", 16 * MIB)
    with OfflineExtExecutor(img) as ex:
        for op in _POSIX_OPS:
            if op.op != "symlink" and not (op.op == "setattr" and op.path == "d/l"):
                ex.apply(op)
        with pytest.raises(WorkloadError, match="setattr 'd/nope'"):
            ex.apply(Op("setattr", "d/nope", mode=0o644))
    fsck_clean(img)
    # debugfs: 32 bits of seconds, then epoch bits and nanoseconds << 2.
    assert _debugfs_attrs(img, "d/f") == (0o751, "0x77359400:1d6f3454")
    assert _debugfs_attrs(img, "d/g")[0] == 0o600
    layout = read_source(img)
    by_size = {int(s): r for r, s in enumerate(layout.files.size.tolist())}
    f, g = by_size[5000], by_size[1]
    assert int(layout.files.mtime[f]) == LATE_NS and int(layout.files.mtime[g]) == EARLY_NS
    assert stat.S_IMODE(int(layout.files.mode[f])) == 0o751


# ---------------------------------------------------------------------------- LFS


def test_lfs_setattr_keeps_milliseconds(tmp_path: Path) -> None:
    from fsage.lfs.executor import LfsExecutor
    from fsage.lfs.fs import mkfs

    img = tmp_path / "l.img"
    mkfs(img, segments=48, blocks_per_segment=32, block_size=4096)
    with LfsExecutor(img) as ex:
        ex.apply(Op("create", "f", size=5000))
        ex.apply(Op("setattr", "f", mode=0o751, mtime_ns=LATE_NS))
        ex.apply(Op("setattr", "f", mode=0o700))
        st = ex.fs.stat("f")
        assert (stat.S_IMODE(st.mode), st.mtime_ms, st.size) == (0o700, LATE_NS // 10**6, 5000)
        with pytest.raises(WorkloadError):
            ex.apply(Op("setattr", "nope", mode=0o644))


# ---------------------------------------------------------------------------- journal, resume


def _attrs_of(root: Path) -> dict[str, tuple[int, int, int]]:
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        if stat.S_ISREG(st.st_mode):
            out[str(p.relative_to(root))] = (stat.S_IMODE(st.st_mode), st.st_mtime_ns, st.st_size)
    return out


def test_a_stream_with_setattr_resumes_from_its_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fsage.ager.run import AgeOptions, age
    from fsage.workload import OpFailedError

    ops = [Op("mkdir", "d")]
    for i in range(60):
        name = f"d/f{i}" if i % 3 else f"d/\u00e9{i}"  # journaled by the C side and by Python
        ops += [Op("create", name, size=100 + i), Op("setattr", name, mode=0o600 + i % 8,
                                                     mtime_ns=EARLY_NS + i * 10**9)]  # fmt: skip
    stream = tmp_path / "ops.jsonl"
    write_workload(stream, WorkloadHeader(generator="t"), ops)
    whole, part = tmp_path / "whole", tmp_path / "part"
    whole.mkdir()
    part.mkdir()
    assert age(whole, AgeOptions(ops_file=stream)).finished
    real = PosixExecutor.apply
    calls = [0]

    def failing(self: PosixExecutor, op: Op) -> int:
        calls[0] += 1
        if calls[0] == 80:
            raise OpFailedError("setattr: injected")
        return real(self, op)

    with monkeypatch.context() as m:
        m.setattr(PosixExecutor, "apply", failing)
        with pytest.raises(OpFailedError):
            age(part, AgeOptions(ops_file=stream))
    res = age(part, AgeOptions(resume=True))
    assert res.finished and res.resumed_from == 79
    assert _attrs_of(part) == _attrs_of(whole)
    assert len(_attrs_of(whole)) == 60
    assert {m for m, _t, _s in _attrs_of(whole).values()} == set(range(0o600, 0o610))
