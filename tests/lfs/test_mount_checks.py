"""`fsage lfs mount` against what the kernel and POSIX expect of it: a damaged image refused
(or mounted read-only with --force), names longer than statfs's namemax, an open unlinked
file's link count, and statfs's available blocks when writes are refused."""

from __future__ import annotations

import errno
import hashlib
import os
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from fsage.lfs import format as fmt
from fsage.lfs.fs import LFS, mkfs
from fsage.lfs.mount import fuse_available
from tests.lfs.test_mount import REPO, Mounted

pytestmark = pytest.mark.skipif(
    fuse_available() is not None, reason=f"no FUSE here: {fuse_available()}"
)


def _mount(image: Path, mp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-m", "fsage", "lfs", "mount", str(image), str(mp), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _wait_gone(pid: int) -> None:
    end = time.monotonic() + 60
    while time.monotonic() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise AssertionError(f"mount process {pid} did not exit")


def _digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _with_files(image: Path) -> int:
    """An image with two files; returns a segment the log wrote."""
    mkfs(image, size=8 << 20, blocks_per_segment=32)
    with LFS.open(image) as fs:
        for name in ("a", "b"):
            fs.create(name)
            fs.write(name, 0, name.encode() * 5000)
        return next(s for s in range(fs.geo.first_log_segment, fs.geo.segments) if fs.live[s])


def _zero_next(image: Path, seg: int) -> None:
    """Write 0 (a system segment) as the next segment of ``seg``'s summary, its checksum
    made right again: the state a writer that got the pointer wrong would leave."""
    with open(image, "r+b") as f:
        geo = fmt.read_geometry(f.fileno(), os.fstat(f.fileno()).st_size, str(image))
        off = geo.seg_offset(seg) + geo.data_blocks_per_segment * geo.block_size
        raw = bytearray(os.pread(f.fileno(), geo.summary_blocks * geo.block_size, off))
        meta = 24 * geo.blocks_per_segment
        raw[meta : meta + 4] = bytes(4)
        raw[meta + 8 : meta + 12] = bytes(4)
        raw[meta + 8 : meta + 12] = zlib.crc32(raw).to_bytes(4, "big")
        os.pwrite(f.fileno(), raw, off)


def test_a_damaged_image_is_refused_or_mounted_read_only(tmp_path: Path) -> None:
    image = tmp_path / "d.img"
    _zero_next(image, _with_files(image))
    before = _digest(image)
    mp = tmp_path / "mnt"
    mp.mkdir()
    out = _mount(image, mp)
    assert out.returncode != 0 and not os.path.ismount(mp)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "damaged" in lines[0] and "segment 0" in lines[0], out.stderr
    out = _mount(image, mp, "--force")
    assert out.returncode == 0, out.stderr
    pid = int(out.stdout.rsplit("pid ", 1)[1].split(")")[0])
    try:
        assert "read-only" in out.stderr and "segment 0" in out.stderr
        assert (mp / "a").read_bytes() == b"a" * 5000
        with pytest.raises(OSError) as exc:
            (mp / "c").write_bytes(b"c")
        assert exc.value.errno == errno.EROFS
        assert os.statvfs(mp).f_flag & os.ST_RDONLY
    finally:
        subprocess.run(["fusermount3", "-u", str(mp)], check=True, timeout=30)
    _wait_gone(pid)
    assert _digest(image) == before  # a read-only mount writes nothing


def test_fsck_flags_what_the_format_forbids(tmp_path: Path) -> None:
    from fsage.lfs.fsck import fsck

    image = tmp_path / "n.img"
    seg = _with_files(image)
    assert fsck(image).ok
    _zero_next(image, seg)
    probs = fsck(image).problems
    assert any(f"segment {seg}: summary names segment 0" in p for p in probs), probs
    image2 = tmp_path / "m.img"
    seg = _with_files(image2)
    with LFS.open(image2) as fs:
        fs.mtime[seg] += 3600_000  # an hour newer than any block it holds
        fs.checkpoint()
    probs = fsck(image2).problems
    assert any(f"segment {seg}: usage table time" in p for p in probs), probs


@pytest.fixture
def mounted(tmp_path: Path) -> Iterator[Mounted]:
    image = tmp_path / "lfs.img"
    mkfs(image, size=6 << 20, blocks_per_segment=32)
    mp = tmp_path / "mnt"
    mp.mkdir()
    m = Mounted(image, mp)
    yield m
    if m.alive() or os.path.ismount(mp):
        m.unmount()


def test_a_name_of_256_octets_is_too_long(mounted: Mounted) -> None:
    mp = mounted.mp
    assert os.statvfs(mp).f_namemax == 255
    (mp / ("n" * 255)).write_bytes(b"x")
    assert (mp / ("n" * 255)).read_bytes() == b"x"
    for call in (
        lambda p: os.stat(p),
        lambda p: os.open(p, os.O_CREAT | os.O_WRONLY, 0o644),
        lambda p: os.mkdir(p),
        lambda p: os.unlink(p),
        lambda p: os.symlink("x", p),
        lambda p: os.rename(mp / ("n" * 255), p),
    ):
        with pytest.raises(OSError) as exc:
            call(mp / ("n" * 256))
        assert exc.value.errno == errno.ENAMETOOLONG


def test_an_open_unlinked_file_has_no_links(mounted: Mounted) -> None:
    p = mounted.mp / "f"
    p.write_bytes(b"data")
    fd = os.open(p, os.O_RDWR)
    try:
        assert os.fstat(fd).st_nlink == 1
        os.unlink(p)
        assert os.fstat(fd).st_nlink == 0
        assert os.pread(fd, 4, 0) == b"data"
    finally:
        os.close(fd)


def test_statfs_available_blocks_are_what_can_be_written(mounted: Mounted) -> None:
    """One-block files until one is refused: statfs said so beforehand and afterwards, within
    a segment (32 blocks), while the dead blocks still count as free."""
    mp = mounted.mp
    i = 0
    while True:
        vfs = os.statvfs(mp)
        try:
            fd = os.open(mp / f"f{i}", os.O_CREAT | os.O_WRONLY, 0o644)
            try:
                os.write(fd, b"x" * vfs.f_frsize)
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
            break
        i += 1
        if i % 50 == 0:  # dead blocks (free, not available) of the files removed
            os.unlink(mp / f"f{i - 50}")
    assert i > 100
    after = os.statvfs(mp)
    assert vfs.f_bavail <= 32 and after.f_bavail <= 32
    assert after.f_bfree > after.f_bavail + 64


def test_a_mount_sets_a_usage_time_newer_than_the_blocks(tmp_path: Path) -> None:
    from fsage.lfs.fsck import fsck

    image = tmp_path / "t.img"
    seg = _with_files(image)
    with LFS.open(image) as fs:
        fs.mtime[seg] += 3600_000
        fs.checkpoint()
    assert fsck(image).only_times
    mp = tmp_path / "mnt"
    mp.mkdir()
    out = _mount(image, mp)
    assert out.returncode == 0, out.stderr
    pid = int(out.stdout.rsplit("pid ", 1)[1].split(")")[0])
    try:
        assert "usage-table time of 1 segments" in out.stderr
        assert (mp / "b").read_bytes() == b"b" * 5000
    finally:
        subprocess.run(["fusermount3", "-u", str(mp)], check=True, timeout=30)
    _wait_gone(pid)
    rep = fsck(image)
    assert rep.ok, rep.problems
