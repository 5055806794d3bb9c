"""Deleting is always possible: the clean segments writes leave alone cover the worst delete.

A full log refuses writes but must take deletes, since deletes are how it stops being full. A
delete writes metadata (the parent directory, rewritten from the removed entry on; the inode
table, vector and map), so the log keeps clean segments for it: as many as the largest
directory's delete needs (``fsage.lfs.common.reserve_segments``). The tests fill each cleaning
policy to ENOSPC beside a directory far larger than a segment, then delete everything:

* in the library, every delete's log blocks are counted (the cleaner's apart) and must stay
  within ``delete_blocks`` for the largest directory: the bound holds, not just the outcome;
* through the mount, many small and large files, truncated to 0 or unlinked, then rmdir:
  every call succeeds, and ``fsage lfs fsck`` is clean after unmount.

With a fixed two-segment reserve most deletes in the large directory failed for want of a
clean segment.
"""

from __future__ import annotations

import errno
import os
import random
from pathlib import Path

import pytest

from fsage.lfs.cleaner import POLICIES
from fsage.lfs.common import LfsOpError, delete_blocks
from fsage.lfs.format import BlockRec, LfsError
from fsage.lfs.fs import LFS, mkfs
from fsage.lfs.fsck import fsck
from fsage.lfs.mount import fuse_available
from tests.lfs.test_lfs_full import _fsck
from tests.lfs.test_mount import Mounted

SIZES = (100, 3000, 40_000, 250_000)  # in the inode, direct, single and double indirect
ENTRIES = 600  # a directory of ~24 blocks of 512 octets: more than a segment of 16


def _image(path: Path, policy: str) -> None:
    mkfs(path, size=3 << 20, blocks_per_segment=16, block_size=512, cleaning_policy=policy)


def _fill(fs: LFS, rng: random.Random) -> int:
    """Small and large files until five in a row are refused (only small ones after the first
    refusal, so that the log ends up full); returns the files made."""
    n = streak = made = 0
    sizes = SIZES
    while streak < 5:
        name = f"data/f{n:05d}"
        n += 1
        try:
            fs.create(name)
            fs.write(name, 0, rng.randbytes(rng.choice(sizes)))
            fs.sync()
            streak, made = 0, made + 1
        except LfsError:
            streak, sizes = streak + 1, SIZES[:2]
            if fs.exists(name):
                fs.unlink(name)  # what was made of it goes: deletes always can
    return made


@pytest.mark.slow
@pytest.mark.parametrize("policy", POLICIES)
def test_every_delete_fits_the_reserve_at_enospc(tmp_path: Path, policy: str) -> None:
    img = tmp_path / "full.img"
    _image(img, policy)
    rng = random.Random(policy)
    with LFS.open(img) as fs:
        fs.mkdir("big")
        for i in range(ENTRIES):
            fs.create(f"big/entry{i:06d}")
        fs.mkdir("data")
        assert _fill(fs, rng) > 10
        assert fs.writable_blocks() * fs.bs < 2 * SIZES[1]  # it is full
        big_blocks = -(-fs.stat("big").size // fs.bs)
        bound = delete_blocks(big_blocks + 1, fs.P)
        put, clean_now = fs._put, fs.clean_now
        written, cleaning = [0], [False]

        def counting_put(data: bytes | bytearray | memoryview, rec: BlockRec) -> int:
            # a cleaning pass (with the commit inside it) is undone unless it frees at least
            # the clean segments it takes: not the delete's
            if not cleaning[0]:
                written[0] += 1
            return put(data, rec)

        def marked_clean_now(want: int | None = None) -> int:
            cleaning[0] = True
            try:
                return clean_now(want)
            finally:
                cleaning[0] = False

        fs._put = counting_put  # type: ignore[method-assign]
        fs.clean_now = marked_clean_now  # type: ignore[method-assign]
        worst, failed = 0, []
        victims = [f"big/{n}" for n, _ in fs.readdir("big")]  # first entries first: worst
        victims += [f"data/{n}" for n, _ in fs.readdir("data")]
        for k, path in enumerate(victims):
            written[0] = 0
            try:
                if k % 3 == 0 and path.startswith("data/"):
                    fs.truncate(path, 0)
                    fs.sync()
                    worst = max(worst, written[0])
                    written[0] = 0
                fs.unlink(path)
                fs.sync()  # each delete committed on its own: its blocks are all counted
            except (LfsError, LfsOpError) as exc:
                failed.append(f"{path}: {exc}")
            worst = max(worst, written[0])
        for d in ("big", "data"):
            written[0] = 0
            try:
                fs.rmdir(d)
                fs.sync()
            except (LfsError, LfsOpError) as exc:
                failed.append(f"rmdir {d}: {exc}")
            worst = max(worst, written[0])
    assert not failed, f"{len(failed)} deletes failed: {failed[:3]}"
    assert worst <= bound, f"a delete wrote {worst} blocks, more than the bound {bound}"
    rep = fsck(img)
    assert not rep.problems, rep.problems[:5]
    with LFS.open(img, readonly=True) as fs:
        assert fs.readdir("") == []


@pytest.mark.slow
@pytest.mark.skipif(fuse_available() is not None, reason=f"no FUSE here: {fuse_available()}")
@pytest.mark.parametrize("policy", POLICIES)
def test_fill_to_enospc_then_delete_everything_through_the_mount(
    tmp_path: Path, policy: str
) -> None:
    img, mp = tmp_path / "full.img", tmp_path / "mnt"
    _image(img, policy)
    mp.mkdir()
    rng = random.Random(f"mount-{policy}")
    m = Mounted(img, mp)
    problems: list[str] = []
    try:
        (mp / "big").mkdir()
        for i in range(ENTRIES):
            (mp / "big" / f"entry{i:06d}").touch()
        (mp / "data").mkdir()
        n = streak = 0
        sizes = SIZES
        while streak < 5:
            path = mp / "data" / f"f{n:05d}"
            n += 1
            try:
                with open(path, "wb") as f:
                    f.write(rng.randbytes(rng.choice(sizes)))
                    f.flush()
                    os.fsync(f.fileno())
                streak = 0
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
                streak, sizes = streak + 1, SIZES[:2]
                path.unlink(missing_ok=True)
        assert n > 15
        st = os.statvfs(mp)
        assert st.f_bavail * st.f_frsize < 2 * SIZES[1]  # statfs says it is full
        names = sorted(os.listdir(mp / "big"))
        for name in names:
            try:
                os.unlink(mp / "big" / name)
            except OSError as exc:
                problems.append(f"unlink big/{name}: {exc.strerror}")
        for k, name in enumerate(sorted(os.listdir(mp / "data"))):
            try:
                if k % 3 == 0:
                    os.truncate(mp / "data" / name, 0)
                os.unlink(mp / "data" / name)
            except OSError as exc:
                problems.append(f"delete data/{name}: {exc.strerror}")
        for d in ("big", "data"):
            try:
                os.rmdir(mp / d)
            except OSError as exc:
                problems.append(f"rmdir {d}: {exc.strerror}")
    finally:
        m.unmount()
    assert not problems, f"{len(problems)} deletes failed: {problems[:3]}"
    out = _fsck(img)
    assert out.returncode == 0, out.stdout + out.stderr
    with LFS.open(img, readonly=True) as fs:
        assert fs.readdir("") == []
