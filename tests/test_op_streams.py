"""Malformed op streams: one line naming the file and the line, a non-zero exit, nothing
written to the target."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from fsage.cli import main
from fsage.workload import Op, WorkloadHeader, write_workload

HEADER = WorkloadHeader(generator="test", seed=1).to_json()


def _stream(tmp: Path, name: str, *lines: bytes) -> Path:
    path = tmp / name
    path.write_bytes(HEADER.encode() + b"\n" + b"".join(line + b"\n" for line in lines))
    return path


def _fails(args: list[str], code: int = 1) -> str:
    result = CliRunner().invoke(main, args)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code == code, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


OK_OP = b'{"op":"mkdir","path":"a"}'


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b'{"op":"mkdir","path":"a\xff"}', "3: not UTF-8 text (byte 0xff at column 24)"),
        (b"[" * 100_000 + b"]" * 100_000, "3: JSON nested too deeply"),
        (b'{"op":"create","path":"x","size":"10"}', '3: bad op: size "10" is not an integer'),
        (b'{"op":"create","path":"x","size":1.5}', "3: bad op: size 1.5 is not an integer"),
        (b'{"op":"create","path":"x","size":true}', "3: bad op: size true is not an integer"),
        (b'{"op":"create","path":"x","size":-1}', "3: bad op: size -1 is out of range"),
        (b'{"op":"overwrite","path":"x","offset":1e3}', "3: bad op: offset 1000.0 is not an"),
        (b'{"op":"create","path":7}', "3: bad op: path 7 is not a string"),
        (b'{"path":"x"}', "3: bad op: no 'op'"),
        (b'{"op":"mkdir","path":"a"', "3: not JSON"),
    ],
)
def test_a_bad_line_is_named(tmp_path: Path, line: bytes, message: str) -> None:
    path = _stream(tmp_path, "ops.jsonl", OK_OP, line)
    for args in (["workload", "show", str(path)], ["age", str(tmp_path / "t"), "--ops", str(path)]):
        (tmp_path / "t").mkdir(exist_ok=True)
        assert _fails(args).startswith(f"fsage: error: {path}:{message}")


def test_a_file_that_is_not_a_workload(tmp_path: Path) -> None:
    elf = tmp_path / "prog"  # an executable's first bytes, before its first newline
    elf.write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(128, 256)) + b"\n")
    assert _fails(["workload", "show", str(elf)]) == (
        f"fsage: error: {elf}: not an fsage workload (not text)"
    )
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert _fails(["workload", "show", str(empty)]) == (
        f"fsage: error: {empty}: not an fsage workload (empty)"
    )


def test_a_truncated_gzip_stream(tmp_path: Path) -> None:
    whole = tmp_path / "ops.jsonl.gz"
    ops = [Op("create", f"f{i}", size=i) for i in range(1, 3000)]
    write_workload(whole, WorkloadHeader(generator="test"), ops)
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    line = _fails(["workload", "show", str(cut)])
    assert line.startswith(f"fsage: error: {cut}:") and line.endswith(
        ": the gzip stream is cut short"
    )


def test_a_create_larger_than_the_target_writes_nothing(tmp_path: Path) -> None:
    target = tmp_path / "t"
    target.mkdir()
    path = _stream(
        tmp_path, "big.jsonl", OK_OP, json.dumps({"op": "create", "path": "big",
                                                 "size": 10**18}).encode()
    )  # fmt: skip
    line = _fails(["age", str(target), "--ops", str(path)])
    assert line.startswith(f"fsage: error: {path}:3: create of {10**18} bytes is more than")
    assert not (target / "big").exists()


def test_match_with_deeply_nested_json(tmp_path: Path) -> None:
    spec = tmp_path / "target.json"
    spec.write_text("[" * 100_000 + "]" * 100_000)
    (tmp_path / "t").mkdir()
    line = _fails(["age", str(tmp_path / "t"), "--match", str(spec)], code=2)
    assert line == f"fsage: error: {spec}: cannot read the JSON target (nested too deeply)"


@pytest.mark.parametrize("name", ["ops.jsonl", "ops.jsonl.gz"])
def test_an_op_stream_goes_through_a_symlink_and_into_a_device(tmp_path: Path, name: str) -> None:
    """A symlink stays a link and its file gets the stream; a device node is written into,
    not replaced by a regular file (as root, `-o /dev/null` would otherwise take the device)."""
    import os
    import stat

    from fsage.workload import read_workload

    ops = [Op("mkdir", "d"), Op("create", "d/f", size=10)]
    real = tmp_path / "real" / name
    real.parent.mkdir()
    link = tmp_path / name
    link.symlink_to(Path("real") / name)
    assert write_workload(link, WorkloadHeader(generator="test"), ops) == 2
    assert link.is_symlink() and [o.op for o in read_workload(real)[1]] == ["mkdir", "create"]
    assert sorted(p.name for p in real.parent.iterdir()) == [name]
    if os.geteuid() != 0:
        return
    null = tmp_path / "null"
    os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    assert write_workload(null, WorkloadHeader(generator="test"), ops) == 2
    assert stat.S_ISCHR(null.lstat().st_mode) and null.lstat().st_rdev == os.makedev(1, 3)
