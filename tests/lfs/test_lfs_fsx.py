"""An fsx-style exerciser: one long random sequence of file operations run on the mounted LFS
and on a loop-mounted ext4 side by side, every read compared with an in-memory shadow copy
of the file (fsx's method), first with room, then with both file systems filled near full.

Operations: pwrite at a random offset (the file grows through holes), ftruncate up and down,
pread and mmap reads of random ranges, fsync, close and reopen, and remount (fsync, close,
unmount, mount, the whole file compared). A write or truncate refused with ENOSPC must leave
the file as it was. An fsync or a close refused with ENOSPC (a write-back refused) leaves
the writes since the last good fsync stored or not, page by page: every byte must then be
the old or the new one, and what is stored becomes the shadow. On a mismatch the test fails
with the seed and the last operations, so ``FSAGE_FSX_SEED=N pytest ...`` replays it;
``FSAGE_FSX_OPS`` sets the length of each half.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import random
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fsage.ager.images import mount as loop_mount_at
from fsage.ager.images import umount
from fsage.lfs.fs import mkfs
from fsage.lfs.mount import fuse_available
from tests.conftest import require_tools
from tests.lfs.test_mount import Mounted

pytestmark = [
    pytest.mark.slow,
    pytest.mark.needs_root,
    pytest.mark.skipif(fuse_available() is not None, reason=f"no FUSE here: {fuse_available()}"),
]

MAXLEN = 192 << 10  # the file's largest size
MAXOP = 24 << 10  # the largest write or read
PAGE = 4096


class Target:
    """One file system under test: its mount, the file's descriptor, and the shadow."""

    def __init__(self, name: str, mp: Path, mount: object, unmount: object) -> None:
        self.name, self.mp = name, mp
        self._mount, self._unmount = mount, unmount
        self.shadow = bytearray()  # what the file must hold
        self.synced = bytearray()  # what it held at the last good fsync
        self.lo = self.hi = 0  # the smallest and largest size since then
        self.fd = -1
        self.enospc = 0

    @property
    def path(self) -> Path:
        return self.mp / "fsx.dat"

    def open(self) -> None:
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)

    def close(self) -> bool:
        """Close; whether a write-back was refused (ENOSPC) at close."""
        if self.fd < 0:
            return False
        fd, self.fd = self.fd, -1
        try:
            os.close(fd)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            self.enospc += 1
            return True
        return False

    def changed(self) -> None:
        self.lo = min(self.lo, len(self.shadow))
        self.hi = max(self.hi, len(self.shadow))

    def remount(self) -> bool:
        """Close, unmount, mount, open; whether a write-back was refused at the close."""
        refused = self.close()
        self._unmount()  # type: ignore[operator]
        self._mount()  # type: ignore[operator]
        self.open()
        return refused


class Mismatch(AssertionError):
    pass


def _check(t: Target, off: int, n: int, got: bytes, how: str) -> None:
    want = bytes(t.shadow[off : off + n])
    if got != want:
        bad = next((i for i in range(min(len(got), len(want))) if got[i] != want[i]), None)
        raise Mismatch(
            f"{t.name}: {how} at {off}: {len(got)} octets read, shadow has "
            f"{len(t.shadow)} octets; first difference at {None if bad is None else off + bad}"
        )


def _whole(t: Target, how: str) -> None:
    size = os.fstat(t.fd).st_size
    if size != len(t.shadow):
        raise Mismatch(f"{t.name}: {how}: size {size}, shadow {len(t.shadow)}")
    _check(t, 0, size + 1, os.pread(t.fd, size + 1, 0), how)


def _adopt(t: Target, how: str) -> None:
    """After a refused write-back (fsync or close): the writes since the last good fsync are
    stored or not, page by page (truncates reach the file at once). Every octet must be the
    synced one, the new one or a hole's zero, the size one the file had meanwhile; what is
    stored becomes the shadow."""
    # The LFS mount sets the kernel's size of the open file to the stored one by a truncate
    # of its own that lands just after the refusal returns (``fsage.lfs.kcache.SizeFixer``):
    # give it a moment to (a size that does not change costs the whole moment).
    first, end = os.fstat(t.fd).st_size, time.monotonic() + 0.5
    while os.fstat(t.fd).st_size == first and time.monotonic() < end:
        time.sleep(0.01)
    size = os.fstat(t.fd).st_size
    got = os.pread(t.fd, size + 1, 0)
    if not t.lo <= size <= t.hi:
        raise Mismatch(f"{t.name}: {how}: size {size} not in {t.lo}..{t.hi}")
    old, new = t.synced, t.shadow
    for i, b in enumerate(got):
        if b and b != (old[i] if i < len(old) else 0) and b != (new[i] if i < len(new) else 0):
            raise Mismatch(f"{t.name}: {how}: octet {i} is neither old nor new")
    t.shadow = bytearray(got)
    _synced(t)


def _synced(t: Target) -> None:
    t.synced = bytearray(t.shadow)
    t.lo = t.hi = len(t.shadow)


def _fsync(t: Target) -> str:
    try:
        os.fsync(t.fd)
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
        t.enospc += 1
        _adopt(t, "refused fsync")
        return "ENOSPC"
    _synced(t)
    return "ok"


def _apply(t: Target, op: tuple[str, int, int, bytes]) -> str:
    kind, off, n, data = op
    if kind == "write":
        try:
            done = os.pwrite(t.fd, data, off)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            t.enospc += 1
            return "ENOSPC"
        if len(t.shadow) < off:
            t.shadow.extend(bytes(off - len(t.shadow)))
        t.shadow[off : off + done] = data[:done]
        t.changed()
        return f"{done}"
    if kind == "truncate":
        try:
            os.ftruncate(t.fd, off)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            t.enospc += 1
            return "ENOSPC"
        if off < len(t.shadow):
            del t.shadow[off:]
        else:
            t.shadow.extend(bytes(off - len(t.shadow)))
        t.changed()
        return "ok"
    if kind == "read":
        _check(t, off, n, os.pread(t.fd, n, off), "pread")
        return "ok"
    if kind == "mapread":
        size = os.fstat(t.fd).st_size
        if size != len(t.shadow):
            raise Mismatch(f"{t.name}: mapread: size {size}, shadow {len(t.shadow)}")
        if size == 0 or off >= size:
            return "empty"
        # private: the LFS opens files without the page cache near full, and FUSE maps
        # those only privately
        with mmap.mmap(t.fd, size, mmap.MAP_PRIVATE, mmap.PROT_READ) as mm:
            got = mm[off : min(size, off + n)]
        _check(t, off, n, got, "mmap read")
        return "ok"
    if kind == "fsync":
        return _fsync(t)
    if kind == "closeopen":
        refused = t.close()
        t.open()
        if refused:
            _adopt(t, "refused close")
            return "ENOSPC"
        _whole(t, "after close and open")
        _synced(t)  # written back at close
        return "ok"
    if kind == "remount":
        _fsync(t)
        if t.remount():
            _adopt(t, "refused close before the unmount")
            return "ENOSPC"
        _whole(t, "after remount")
        return "ok"
    raise AssertionError(kind)


def _ops(rng: random.Random, count: int) -> Iterator[tuple[str, int, int, bytes]]:
    kinds = ["write"] * 8 + ["read"] * 4 + ["mapread"] * 3 + ["truncate"] * 2
    kinds += ["fsync"] * 2 + ["closeopen"]
    for i in range(count):
        kind = "remount" if i % 97 == 96 else rng.choice(kinds)
        off = rng.randrange(MAXLEN)
        n = rng.randrange(1, MAXOP)
        if kind == "write":
            n = min(n, MAXLEN - off)
            yield kind, off, n, rng.randbytes(n)
        elif kind == "truncate":
            yield kind, rng.randrange(MAXLEN), 0, b""
        else:
            yield kind, off, n, b""


def _fill(t: Target, rng: random.Random) -> int:
    """Fill the file system to ENOSPC with other files, fsync'd, of 64 KiB then of 4 KiB:
    the file then grows only into what its own truncates free (and on the LFS, what
    cleaning makes of the blocks its overwrites leave dead)."""
    made = 0
    for size in (64 << 10, 4 << 10):
        for _ in range(10_000):
            p = t.mp / f"filler{made:05d}"
            try:
                fd = os.open(p, os.O_WRONLY | os.O_CREAT, 0o644)
            except OSError as exc:
                if exc.errno == errno.ENOSPC:
                    break
                raise
            made += 1
            try:
                os.write(fd, rng.randbytes(size))
                os.fsync(fd)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                break
            finally:
                with contextlib.suppress(OSError):
                    os.close(fd)
    return made


def _run(targets: list[Target], seed: int, count: int, log: list[str]) -> None:
    rng = random.Random(seed)
    for i, op in enumerate(_ops(rng, count)):
        results = [_apply(t, op) for t in targets]
        log.append(f"#{i} {op[0]} off={op[1]} n={op[2] or len(op[3])}: {' / '.join(results)}")


@contextlib.contextmanager
def _targets(tmp: Path) -> Iterator[list[Target]]:
    lfs_img, ext_img = tmp / "fsx-lfs.img", tmp / "fsx-ext4.img"
    mkfs(lfs_img, size=8 << 20, blocks_per_segment=32, block_size=1024)
    with open(ext_img, "wb") as f:
        f.truncate(8 << 20)
    subprocess.run(
        ["mke2fs", "-q", "-F", "-t", "ext4", "-b", "1024", str(ext_img)],
        check=True,
        capture_output=True,
    )
    lmp, emp = tmp / "lfs", tmp / "ext4"
    lmp.mkdir()
    emp.mkdir()
    state: dict[str, Mounted | None] = {"lfs": None}
    ext_mounted = [False]
    busy = [0]

    def lfs_mount() -> None:
        state["lfs"] = Mounted(lfs_img, lmp)

    def lfs_unmount() -> None:
        m, state["lfs"] = state["lfs"], None
        if m is None:
            return
        for _ in range(20):  # busy a moment while the mount's own truncate is in flight
            done = subprocess.run(["fusermount3", "-u", str(lmp)], capture_output=True)
            if done.returncode == 0 or not os.path.ismount(lmp):
                break
            busy[0] += 1
            time.sleep(0.1)
        m.wait_gone()

    def ext_mount() -> None:
        loop_mount_at(ext_img, emp)
        ext_mounted[0] = True

    def ext_unmount() -> None:
        if ext_mounted[0]:
            umount(emp)
            ext_mounted[0] = False

    targets = [
        Target("lfs", lmp, lfs_mount, lfs_unmount),
        Target("ext4", emp, ext_mount, ext_unmount),
    ]
    try:
        lfs_mount()
        ext_mount()
        for t in targets:
            t.open()
        yield targets
        print(f"fsx: the LFS mount was busy at {busy[0]} unmount attempts")
    finally:
        for t in targets:
            with contextlib.suppress(OSError):
                t.close()
        try:
            lfs_unmount()
        finally:
            ext_unmount()
            lfs_img.unlink(missing_ok=True)
            ext_img.unlink(missing_ok=True)


def test_fsx_lfs_and_ext4_agree_with_the_shadow_with_room_and_near_full(tmp_path: Path) -> None:
    require_tools("mke2fs", "mount", "umount")
    seed = int(os.environ.get("FSAGE_FSX_SEED", "27"))
    count = int(os.environ.get("FSAGE_FSX_OPS", "400"))
    log: list[str] = []
    with _targets(tmp_path) as targets:
        try:
            _run(targets, seed, count, log)
            # with room no op fails: both files must be the same
            assert targets[0].shadow == targets[1].shadow
            filled = [_fill(t, random.Random(seed)) for t in targets]
            log.append(f"filled with {filled} files")
            _run(targets, seed + 1, count, log)
        except Mismatch as exc:
            tail = "\n".join(log[-25:])
            raise AssertionError(f"fsx seed {seed}: {exc}\nlast operations:\n{tail}") from None
        for t in targets:
            _fsync(t)
            assert not t.remount()
            _whole(t, "final remount")
        enospc = {t.name: t.enospc for t in targets}
    print(f"fsx seed {seed}: {2 * count} ops on each; refused with ENOSPC: {enospc}")
    assert enospc["lfs"] > 0, "the LFS was never near full enough to refuse an op"
