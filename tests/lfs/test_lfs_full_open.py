"""Open files of a mounted LFS grown until the LFS refuses them: fstat and reads made the
instant the refusal returns (no wait) show what is stored.

Fifty files are opened while the LFS has room (so through the page cache), the LFS is then
filled, and each file in turn is grown by pwrite + fsync until one of the two is refused
with ENOSPC (a little room is made before each file, so that some of its writes succeed
first). Straight after the refusal the still open file is fstat'ed and read. The oracle is
a remount (a fresh kernel cache): each file must there have the size and bytes seen at the
refusal and when read after close; ``fsage lfs fsck`` must be clean.
"""

from __future__ import annotations

import errno
import os
import random
from pathlib import Path

import pytest

from fsage.lfs.fs import mkfs
from fsage.lfs.mount import fuse_available
from tests.lfs.test_lfs_full_cache import _stored, _view, _write
from tests.lfs.test_mount import Mounted

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(fuse_available() is not None, reason=f"no FUSE here: {fuse_available()}"),
]

FILES = 50


def _grow_until_refused(fd: int, rng: random.Random) -> tuple[str, int, int, bytes] | None:
    """pwrite + fsync at the end of ``fd`` until one is refused: (the step refused, the size
    written up to, fstat's size and the bytes read at once after the refusal)."""
    end = os.fstat(fd).st_size
    for _ in range(64):
        data = rng.randbytes(rng.randrange(24 << 10, 64 << 10))
        step = "write"
        try:
            n = os.pwrite(fd, data, end)
            end += n
            step = "fsync"
            os.fsync(fd)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            size = os.fstat(fd).st_size  # at once: no sleep, no other request first
            return step, end, size, os.pread(fd, end + 4096, 0)
    return None


def test_open_files_show_the_stored_size_at_once_after_a_refusal(tmp_path: Path) -> None:
    image = tmp_path / "open.img"
    mkfs(image, size=8 << 20, blocks_per_segment=32, block_size=512)
    mp = tmp_path / "mnt"
    mp.mkdir()
    rng = random.Random("open-files-refused")
    seen: dict[str, tuple[str, int, int, bytes]] = {}
    m = Mounted(image, mp)
    try:
        fds = {}
        try:
            for i in range(FILES):
                name = f"o{i:02d}"
                fds[name] = os.open(mp / name, os.O_RDWR | os.O_CREAT, 0o644)
                os.pwrite(fds[name], rng.randbytes(1000), 0)
                os.fsync(fds[name])
            fillers = []
            for i in range(1000):  # the rest filled to ENOSPC
                step = _write(mp / f"f{i:04d}", 0, rng.randbytes(128 << 10), True, True)
                if step == "open":
                    break
                if step is None:
                    fillers.append(f"f{i:04d}")
                else:
                    os.unlink(mp / f"f{i:04d}")  # what a refused create left
                    break
            for name, fd in fds.items():
                if fillers:  # room for a few of this file's writes before the refusal
                    os.unlink(mp / fillers.pop())
                got = _grow_until_refused(fd, rng)
                assert got is not None, f"{name}: no write or fsync was refused"
                seen[name] = got
        finally:
            for fd in fds.values():
                os.close(fd)
        shown = _view(mp)
    finally:
        m.unmount()
    stored = _stored(image, mp, shown)
    steps = sorted({s for s, *_ in seen.values()})
    wrong = [
        f"{n} (refused at {step}, written to {end}): fstat {size}, read {len(read)} octets; "
        f"stored {stored[n][0]}"
        for n, (step, end, size, read) in sorted(seen.items())
        if (size, read) != stored[n]
    ]
    print(f"{len(seen)} refusals (at {', '.join(steps)}); {len(wrong)} showed another size")
    assert not wrong, f"{len(wrong)} of {len(seen)} files: {wrong[:3]}"
