"""The system-call floor of a replay (bench/syscall_floor.py and .c): the op stream's encoding,
and the C program run on a loop-mounted ext4 (the kernel's tree as the oracle)."""

from __future__ import annotations

import os
import stat
import struct
import sys
from pathlib import Path
from typing import Any

import pytest

from fsage.ager.images import loop_mount, make_image
from fsage.workload import Op

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from syscall_floor import FLOOR_KINDS, encode, syscall_floor

MIB = 1 << 20


def _decode(raw: bytes) -> tuple[list[tuple[int, str]], int, list[dict[str, Any]]]:
    pos = 0

    def i32() -> int:
        nonlocal pos
        (v,) = struct.unpack_from("<i", raw, pos)
        pos += 4
        return int(v)

    def text() -> str:
        nonlocal pos
        n = i32()
        assert raw[pos + n] == 0
        s = raw[pos : pos + n].decode()
        pos += n + 1
        return s

    table = [(i32(), text()) for _ in range(i32())]
    marks = i32()
    recs = []
    while pos < len(raw):
        kind, d, d2, special, size, offset = struct.unpack_from("<iiiiqq", raw, pos)
        pos += 32
        name, name2, sym = text(), text(), text()
        inval = [i32() for _ in range(i32())]
        recs.append(dict(kind=FLOOR_KINDS[kind], d=d, d2=d2, special=special, size=size,
                         offset=offset, name=name, name2=name2, text=sym, inval=inval))  # fmt: skip
    return table, marks, recs


OPS = [
    Op("mkdir", "a"),
    Op("mkdir", "a/b"),
    Op("create", "a/b/f", size=3 * MIB + 5),
    Op("create", "top", size=100),
    Op("snapshot", label="one"),
    Op("rename", "a", dest="c"),
    Op("create", "c/b/g", size=4096),
    Op("append", "c/b/g", size=10),
    Op("link", "c/b/g", dest="hard"),
    Op("symlink", "c/s", size=40),
    Op("mknod", "c/fifo", label="fifo"),
    Op("truncate", "top", size=7),
    Op("setattr", "top", mode=0o600, mtime_ns=-1_500_000_000),
    Op("setattr", "c/s", mtime_ns=86_400 * 10**9),
    Op("delete", "c/b/f"),
    Op("snapshot", label="two"),
    Op("mkdir", "d"),
    Op("create", "d/x"),
    Op("delete", "d/x"),
    Op("delete", "d"),
    Op("snapshot", label="three"),
]


def test_encoding_names_each_directory_once_and_what_a_rename_makes_stale() -> None:
    table, marks, recs = _decode(encode(OPS))
    assert marks == 3 and len(recs) == len(OPS)
    paths = {}
    for i, (parent, name) in enumerate(table):
        paths[i] = name if parent < 0 else f"{paths[parent]}/{name}"
    assert sorted(paths.values()) == ["a", "a/b", "c", "c/b", "d"]
    ids = {p: i for i, p in paths.items()}
    create = recs[2]
    assert (create["kind"], create["d"], create["name"], create["size"]) == (
        "create", ids["a/b"], "f", 3 * MIB + 5,
    )  # fmt: skip
    rename = recs[5]
    assert (rename["d"], rename["name"], rename["d2"], rename["name2"]) == (-1, "a", -1, "c")
    assert sorted(rename["inval"]) == sorted([ids["a"], ids["a/b"]])
    assert len(recs[9]["text"]) == 40 and recs[10]["special"] == 0  # fifo
    assert recs[19]["inval"] == [ids["d"]] and recs[18]["inval"] == recs[14]["inval"] == []
    chmod_and_time, time_only = recs[12], recs[13]
    assert (chmod_and_time["special"], chmod_and_time["size"], chmod_and_time["offset"]) == (
        3, 0o600, -1_500_000_000,
    )  # fmt: skip
    assert (time_only["special"], time_only["offset"]) == (2, 86_400 * 10**9)


@pytest.mark.needs_root
@pytest.mark.parametrize("end", ["remount", "sync"])
def test_the_floor_program_makes_what_the_ops_say(tmp_path: Path, end: str) -> None:
    like = make_image(tmp_path / "like.img", "ext4", 32 * MIB)
    res = syscall_floor(OPS, like, end, tmp_path, keep_image=True)
    assert res["ops"] == len(OPS) and res["failed"] == 0
    assert res["bytes_written"] == 3 * MIB + 5 + 100 + 4096 + 10
    assert res["seconds"] > 0 and res["cpu_seconds"] > 0
    with loop_mount(tmp_path / "floor.img") as mnt:
        assert os.path.getsize(mnt / "c/b/g") == 4106
        assert os.stat(mnt / "hard").st_nlink == 2
        top = os.stat(mnt / "top")
        assert (top.st_size, stat.S_IMODE(top.st_mode), top.st_mtime_ns) == (
            7, 0o600, -1_500_000_000,
        )  # fmt: skip
        assert os.lstat(mnt / "c/s").st_mtime_ns == 86_400 * 10**9
        assert len(os.readlink(mnt / "c/s")) == 40
        assert stat.S_ISFIFO(os.lstat(mnt / "c/fifo").st_mode)
        assert not (mnt / "a").exists() and not (mnt / "d").exists()
        assert not (mnt / "c/b/f").exists()
    with open("/proc/self/mountinfo") as fh:
        assert str(tmp_path) not in fh.read()
