"""The scan suite's clean copy where the mkfs parameters come from elsewhere than fsage's ext
reader: an xfs image (its geometry as xfs_info prints it), a directory mounted from a loop
device, and the refusals (btrfs, a directory on no loop device)."""

from __future__ import annotations

import random
import re
import subprocess
from pathlib import Path

import pytest

from fsage.replay.bench import BenchOptions
from fsage.replay.bench.cleancopy import loop_backing, make_xfs_like, parse_xfs_info
from fsage.replay.bench.scan import run_scan
from tests.conftest import require_tools


def _xfs_info(image: Path) -> str:
    """xfs_info's geometry without the name of the image (its first field)."""
    out = subprocess.run(["xfs_info", str(image)], capture_output=True, text=True, check=True)
    return re.sub(r"^meta-data=\S+", "meta-data=", out.stdout)


#: An xfs of nothing but non-default choices: 2 KiB blocks, 3 AGs, 1 KiB inodes, 8 KiB
#: directory blocks, a 70 MiB log, no reflink, rmapbt on, 1 KiB sectors.
ODD_XFS = [
    *("-b", "size=2048", "-d", "agcount=3,size=320m", "-i", "size=1024,maxpct=10"),
    *("-n", "size=8192", "-l", "size=70m", "-m", "reflink=0,rmapbt=1", "-s", "size=1024"),
]


def test_an_xfs_of_the_same_geometry(tmp_path: Path) -> None:
    require_tools("mkfs.xfs", "xfs_info")
    orig, copy = tmp_path / "orig.img", tmp_path / "copy.img"
    subprocess.run(["truncate", "-s", "330M", str(orig)], check=True)
    subprocess.run(["mkfs.xfs", "-q", "-f", *ODD_XFS, str(orig)], check=True)
    assert make_xfs_like(orig, copy) == []
    # the oracle: xfs_info of the two, line for line
    assert _xfs_info(copy) == _xfs_info(orig)
    geo = parse_xfs_info(_xfs_info(orig))
    assert geo["data"]["bsize"] == "2048" and geo["meta-data"]["agcount"] == "3"
    assert copy.stat().st_size == int(geo["data"]["blocks"]) * 2048


def test_xfs_info_text_with_stripes_parses() -> None:
    text = """meta-data=/dev/sdb1              isize=512    agcount=16, agsize=1638400 blks
         =                       sectsz=4096  attr=2, projid32bit=1
         =                       crc=1        finobt=1, sparse=1, rmapbt=0
         =                       reflink=1    bigtime=1 inobtcount=1 nrext64=0
data     =                       bsize=4096   blocks=26214400, imaxpct=25
         =                       sunit=64     swidth=256 blks
naming   =version 2              bsize=4096   ascii-ci=0, ftype=1
log      =internal log           bsize=4096   blocks=12800, version=2
         =                       sectsz=4096  sunit=64 blks, lazy-count=1
realtime =none                   extsz=4096   blocks=0, rtextents=0
"""
    from fsage.replay.bench.cleancopy import xfs_mkfs_argv

    geo = parse_xfs_info(text)
    assert geo["data"]["sunit"] == "64" and geo["log"]["sunit"] == "64"
    assert geo["log"]["kind"] == "internal log"
    argv = xfs_mkfs_argv(geo, Path("x.img"))
    assert "agcount=16,size=107374182400,su=262144,sw=4" in argv
    assert "size=52428800,sectsize=4096,sunit=512" in argv  # log sunit in 512-byte units


def test_a_directory_on_no_loop_device_says_why(tmp_path: Path) -> None:
    backing, why = loop_backing(tmp_path)
    assert backing is None
    assert "not a loop device" in why or "no block device" in why


def _fill(mnt: Path) -> tuple[int, int]:
    rng = random.Random(5)
    files = total = 0
    for d in range(4):
        (mnt / f"d{d}").mkdir()
        for f in range(25):
            n = rng.randint(1, 300_000)
            (mnt / f"d{d}" / f"f{f}").write_bytes(rng.randbytes(n))
            files, total = files + 1, total + n
    return files, total


@pytest.mark.needs_root
def test_scan_of_an_xfs_image_and_of_its_mount_against_a_clean_copy(tmp_path: Path) -> None:
    require_tools("mkfs.xfs", "xfs_info", "losetup")
    image, mnt = tmp_path / "aged.img", tmp_path / "mnt"
    subprocess.run(["truncate", "-s", "330M", str(image)], check=True)
    subprocess.run(["mkfs.xfs", "-q", "-f", *ODD_XFS, str(image)], check=True)
    mnt.mkdir()
    subprocess.run(["mount", "-o", "loop", str(image), str(mnt)], check=True)
    try:
        files, total = _fill(mnt)
    finally:
        subprocess.run(["umount", str(mnt)], check=True)
    opts = BenchOptions("scan", repeat=2, baseline=True)
    run = run_scan(image, opts)
    scan = run.params["scan"]
    for side in ("aged", "clean"):
        assert (scan[side]["files"], scan[side]["bytes"]) == (files, total)
    assert scan["aged_clean"]["rounds"] == 2
    assert any(n.startswith("clean copy: 100 files") for n in run.notes)
    assert not any("geometry differs" in n for n in run.notes)
    # the clean image is gone, the aged one untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["aged.img", "mnt"]
    # the same image mounted: the directory's clean copy has the image's parameters
    subprocess.run(["mount", "-o", "loop", str(image), str(mnt)], check=True)
    try:
        run = run_scan(mnt, opts)
    finally:
        subprocess.run(["umount", str(mnt)], check=True)
    scan = run.params["scan"]
    assert scan["clean"] is not None
    assert (scan["clean"]["files"], scan["clean"]["bytes"]) == (files, total)
    assert any(f"mkfs parameters of {image}" in n for n in run.notes)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["aged.img", "mnt"]


@pytest.mark.needs_root
def test_a_btrfs_image_has_no_clean_copy_and_says_why(tmp_path: Path) -> None:
    require_tools("mkfs.btrfs", "losetup")
    image = tmp_path / "b.img"
    subprocess.run(["truncate", "-s", "200M", str(image)], check=True)
    subprocess.run(["mkfs.btrfs", "-q", "-f", str(image)], check=True)
    run = run_scan(image, BenchOptions("scan", repeat=1, baseline=True))
    assert run.params["scan"]["clean"] is None
    assert any("no clean copy" in n and "btrfs" in n for n in run.notes)
