"""``fsage lfs mount --trace``: the blocks the server reads for file data, as a block trace.

Oracle: the image itself. Every request of the trace names sectors of the image; the blocks
there, read straight from the image file, must be exactly the blocks of the files read through
the mount (random content, so each block is told apart), and ``fsage trace import`` must
accept the trace and count as many blocks as the files hold.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fsage.lfs.blocktrace import runs, score_file
from fsage.lfs.fs import mkfs
from fsage.lfs.mount import fuse_available
from fsage.trace import parse_blkparse
from tests.lfs.test_mount import Mounted

BS = 4096


def test_runs_merge_contiguous_blocks_only() -> None:
    got = runs([0, BS, 2 * BS, 10 * BS, 9 * BS, 11 * BS], BS)
    assert got == [(0, 3 * BS), (10 * BS, BS), (9 * BS, BS), (11 * BS, BS)]


@pytest.mark.slow
@pytest.mark.skipif(fuse_available() is not None, reason=f"no FUSE here: {fuse_available()}")
def test_trace_names_the_image_blocks_the_files_hold(
    tmp_path: Path, fsage_env: dict[str, str]
) -> None:
    img, mp, trace = tmp_path / "t.img", tmp_path / "mnt", tmp_path / "read.trace"
    mkfs(img, size=32 << 20, blocks_per_segment=64)
    mp.mkdir()
    files = {f"d/f{i}": os.urandom(s) for i, s in enumerate((5000, 300_000, 70_000, 1_200_000))}
    m = Mounted(img, mp)
    try:
        (mp / "d").mkdir()
        for name, data in files.items():  # interleaved appends: the files' blocks mix
            (mp / name).write_bytes(data[:4096])
        for name, data in files.items():
            with open(mp / name, "ab") as f:
                f.write(data[4096:])
    finally:
        m.unmount()
    m = Mounted(img, mp, "--trace", str(trace))
    try:
        for name, data in files.items():
            assert (mp / name).read_bytes() == data
    finally:
        m.unmount()
    with open(trace) as f:
        tr = parse_blkparse(f)
    got: list[bytes] = []
    with open(img, "rb") as f:
        for sector, n in zip(tr.sector.tolist(), tr.sectors.tolist(), strict=True):
            f.seek(sector * 512)
            raw = f.read(n * 512)
            got += [raw[i : i + BS] for i in range(0, len(raw), BS)]
    want = [
        data[i : i + BS].ljust(BS, b"\0")
        for data in files.values()
        for i in range(0, len(data), BS)
    ]
    assert sorted(set(got)) == sorted(want)  # each file block read, no other block
    assert score_file(trace, img)["blocks"] == len(want)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "fsage",
            "trace",
            "import",
            str(trace),
            "--block-size",
            str(BS),
            "--db",
            str(tmp_path / "t.db"),
            "--format",
            "json",
        ],
        env=fsage_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["blocks"] == len(want)
