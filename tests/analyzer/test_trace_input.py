"""Trace input fsage must refuse in one line (sectors past any device, requests no block
layer issues), the warning for a traced command that read little of the files, and the
example `trace run --help` gives."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fsage.trace import (
    MAX_REQUEST_SECTORS,
    TraceError,
    file_bytes_under,
    parse_blkparse,
    short_read_warning,
)
from tests.conftest import REPO

GOOD = "8,0 1 1 0.0 1 D R 100 + 8 [x]\n"


def _import(tmp_path: Path, text: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    f = tmp_path / "read.txt"
    f.write_text(text)
    return subprocess.run(
        [sys.executable, "-m", "fsage", "trace", "import", str(f), "--block-size", "4096",
         "--db", str(tmp_path / "t.db")],
        capture_output=True, text=True, cwd=REPO, env=env, check=False,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("line", "says"),
    [
        # a sector past 2^64: Python's int would overflow numpy's int64
        ("8,0 1 1 0.0 1 D R 99999999999999999999999 + 8 [x]", "lies beyond any device"),
        # a request of 46 PiB: numpy would try to allocate its blocks
        ("8,0 1 1 0.0 1 D R 100 + 99999999999999 [x]", "longer than any block layer issues"),
    ],
)
def test_impossible_requests_are_refused_naming_the_line(
    tmp_path: Path, fsage_env: dict[str, str], line: str, says: str
) -> None:
    p = _import(tmp_path, GOOD + GOOD + line + "\n", fsage_env)
    assert p.returncode != 0
    err = p.stderr.strip().splitlines()
    assert len(err) == 1, p.stderr
    assert "line 3" in err[0] and says in err[0]
    assert "Traceback" not in p.stderr
    assert not (tmp_path / "t.db").exists()


def test_requests_are_checked_against_a_known_device() -> None:
    ok = parse_blkparse([GOOD], device_sectors=108)
    assert ok.sector.tolist() == [100]
    with pytest.raises(TraceError, match=r"line 1: sector 100 \+ 8 lies beyond the device's 107"):
        parse_blkparse([GOOD], device_sectors=107, source="x")
    longest = f"8,0 1 1 0.0 1 D R 0 + {MAX_REQUEST_SECTORS} [x]"
    assert parse_blkparse([longest]).sectors.tolist() == [MAX_REQUEST_SECTORS]


def test_a_short_read_is_warned_of(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a").write_bytes(b"x" * 100_000)
    (tmp_path / "b").write_bytes(b"y" * 5000)
    (tmp_path / "l").symlink_to("b")
    # independent: find's count of 512-byte blocks allocated
    du = subprocess.run(
        ["find", str(tmp_path), "-type", "f", "-printf", "%b\n"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    held = file_bytes_under(tmp_path)
    assert held == 512 * sum(int(x) for x in du)
    assert short_read_warning(held, held, tmp_path) is None
    assert short_read_warning(held // 2 + 1, held, tmp_path) is None
    warning = short_read_warning(held // 10, held, tmp_path)
    assert warning is not None and "cat >/dev/null" in warning
    assert short_read_warning(0, 0, tmp_path) is None


def test_the_run_example_reads_file_data(fsage_env: dict[str, str]) -> None:
    p = subprocess.run(
        [sys.executable, "-m", "fsage", "trace", "run", "--help"],
        capture_output=True, text=True, cwd=REPO, env=fsage_env, check=True,
    )  # fmt: skip
    assert "cat >/dev/null" in p.stdout
    assert "tar cf /dev/null" not in p.stdout


@pytest.mark.needs_root
def test_a_tar_to_dev_null_is_warned_of_and_a_piped_one_is_not(
    tmp_path: Path, fsage_env: dict[str, str]
) -> None:
    from tests.analyzer.test_trace import _traceable, run_traced

    if not _traceable():
        pytest.skip("neither blktrace nor the kernel's blk tracer")
    img, mnt, db = tmp_path / "fs.img", tmp_path / "mnt", tmp_path / "t.db"
    subprocess.run(
        ["mke2fs", "-q", "-F", "-t", "ext4", "-b", "4096", str(img), "32M"],
        check=True, capture_output=True,
    )  # fmt: skip
    mnt.mkdir()
    subprocess.run(
        [sys.executable, "-m", "fsage", "snapshot", str(img), "--db", str(db)],
        check=True, capture_output=True, cwd=REPO, env=fsage_env,
    )  # fmt: skip
    subprocess.run(["mount", "-o", "loop", str(img), str(mnt)], check=True, capture_output=True)
    try:
        for i in range(20):
            (mnt / f"f{i}").write_bytes(os.urandom(200_000))
        outs = {}
        for name, cmd in (
            ("dev-null", ["tar", "cf", "/dev/null", "-C", str(mnt), "."]),
            ("piped", ["sh", "-c", f"tar cf - -C {mnt} . | cat >/dev/null"]),
        ):
            p = run_traced(
                [sys.executable, "-m", "fsage", "trace", "run", str(mnt), "--block-size",
                 "4096", "--db", str(db), "--", *cmd],
                cwd=REPO, env=fsage_env,
            )  # fmt: skip
            assert p.returncode == 0, p.stderr
            outs[name] = p.stderr
    finally:
        subprocess.run(["umount", str(mnt)], check=True, capture_output=True)
    assert "warning: the command read" in outs["dev-null"]
    assert "warning" not in outs["piped"]
