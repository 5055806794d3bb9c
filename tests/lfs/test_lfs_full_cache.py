"""The LFS near full with the kernel's writeback cache on (``--writeback``): what the mount
shows is what is stored.

With the writeback cache, write(2) only fills the kernel's page cache and grows the size it
keeps; the LFS sees the data when it is written back (at close, at fsync), and may refuse it
then with ENOSPC. The oracle is a remount: after every file's size and bytes are read through
the mount that saw the failures, the image is unmounted and mounted again (a fresh kernel
cache), and each file must show the same size and bytes; ``fsage lfs fsck`` must be clean.
"""

from __future__ import annotations

import errno
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fsage.lfs.fs import mkfs
from fsage.lfs.mount import fuse_available
from fsage.workload import Op, WorkloadHeader, write_workload
from tests.lfs.test_lfs_full import _fsck
from tests.lfs.test_mount import REPO, Mounted

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(fuse_available() is not None, reason=f"no FUSE here: {fuse_available()}"),
]


def _view(mp: Path) -> dict[str, tuple[int, bytes]]:
    """Every regular file under ``mp``: (size from stat, bytes read)."""
    out: dict[str, tuple[int, bytes]] = {}
    for dirpath, _dirs, files in os.walk(mp):
        for f in files:
            p = Path(dirpath) / f
            out[str(p.relative_to(mp))] = (p.stat().st_size, p.read_bytes())
    return out


def _differ(a: dict[str, tuple[int, bytes]], b: dict[str, tuple[int, bytes]]) -> list[str]:
    return sorted(
        f"{n}: {a[n][0] if n in a else None} -> {b[n][0] if n in b else None} octets"
        for n in set(a) | set(b)
        if a.get(n) != b.get(n)
    )


def _stored(
    image: Path, mp: Path, shown: dict[str, tuple[int, bytes]]
) -> dict[str, tuple[int, bytes]]:
    """Unmount, mount again (a fresh kernel cache) and read every file: each must show the
    size and bytes ``shown`` through the mount that saw the failures; fsck must be clean."""
    m = Mounted(image, mp)
    try:
        stored = _view(mp)
    finally:
        m.unmount()
    diff = _differ(shown, stored)
    assert not diff, f"{len(diff)} files differ from what a remount shows: {diff[:5]}"
    out = _fsck(image)
    assert out.returncode == 0, out.stdout + out.stderr
    return stored


def _write(path: Path, off: int, data: bytes, create: bool, sync: bool) -> str | None:
    """Write (then fsync if ``sync``) and close; the step that failed with ENOSPC, if one
    did."""
    try:
        fd = os.open(path, os.O_WRONLY | (os.O_CREAT | os.O_EXCL if create else 0), 0o644)
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
        return "open"
    step = "write"
    try:
        os.pwrite(fd, data, off)
        step = "fsync"
        if sync:
            os.fsync(fd)
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
        os.close(fd)
        return step
    try:
        os.close(fd)
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
        return "close"
    return None


def test_failed_writeback_leaves_the_mount_showing_what_is_stored(tmp_path: Path) -> None:
    image = tmp_path / "wb.img"
    mkfs(image, size=8 << 20, blocks_per_segment=32, block_size=512)
    mp = tmp_path / "mnt"
    mp.mkdir()
    rng = random.Random("writeback-full")
    failed: dict[str, int] = {}
    m = Mounted(image, mp, "--writeback")
    try:
        names: list[str] = []
        misses = 0
        for i in range(400):
            if names and i % 3 == 2:  # overwrite (and grow) a file made before
                name, create = rng.choice(names), False
                off = rng.randrange(0, 64 << 10)
            else:
                name, create, off = f"f{i:04d}", True, 0
            data = rng.randbytes(rng.randrange(32 << 10, 512 << 10))
            step = _write(mp / name, off, data, create, sync=i % 4 == 3)
            if create and step != "open":
                names.append(name)
            if step is not None:
                failed[step] = failed.get(step, 0) + 1
                misses += 1
                if misses >= 12:
                    break
        shown = _view(mp)
    finally:
        m.unmount()
    assert failed.get("close", 0) > 0, f"no write was refused at close: {failed}"
    assert failed.get("fsync", 0) > 0, f"no fsync was refused: {failed}"
    _stored(image, mp, shown)


def _expected_from_journal(path: Path) -> dict[str, int]:
    """File sizes the ops the ager journals as done leave (renames move whole subtrees)."""
    files: dict[str, int] = {}
    with path.open() as f:
        next(f)  # the header
        for line in f:
            op = json.loads(line)
            kind, p, size = op["op"], op["path"], op.get("size", 0)
            if kind == "create" or kind == "truncate":
                files[p] = size
            elif kind == "delete":
                files.pop(p, None)
            elif kind == "append":
                files[p] += size
            elif kind == "overwrite":
                files[p] = max(files[p], op.get("offset", 0) + size)
            elif kind == "rename":
                dest = op["dest"]
                for q in [q for q in files if q == p or q.startswith(p + "/")]:
                    files[dest + q[len(p) :]] = files.pop(q)
    return files


def _age_to_enospc(tmp_path: Path, image: Path, ops: Path) -> tuple[dict[str, int], dict[str, int]]:
    """Run an op stream through a mount of `image` until it meets ENOSPC; the sizes stored
    (read after unmount, the mount's view checked against them) and the sizes the ops the
    ager reports done leave."""
    mp = tmp_path / "mnt"
    mp.mkdir()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    m = Mounted(image, mp, "--writeback")
    try:
        out = subprocess.run(
            [sys.executable, "-m", "fsage", "age", str(mp), "--ops", str(ops)],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert out.returncode == 0, out.stderr
        assert "out of space" in out.stdout + out.stderr  # it did reach ENOSPC
        shown = _view(mp)
    finally:
        m.unmount()
    stored = _stored(image, mp, shown)
    journal = _expected_from_journal(next(tmp_path.glob("mnt.fsage-age.*.ops.jsonl")))
    return {n: size for n, (size, _) in stored.items()}, journal


def test_ager_near_full_leaves_no_file_of_a_failed_create(tmp_path: Path) -> None:
    """``fsage age`` through the mount to ENOSPC: creates refused at close leave no file; the
    mount then shows what a remount shows and fsck is clean."""
    image = tmp_path / "age.img"
    mkfs(image, size=8 << 20, blocks_per_segment=32, block_size=512)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    ops = tmp_path / "ops.jsonl"
    gen = [sys.executable, "-m", "fsage", "workload", "generate", "--profile", "hfs-surge"]
    gen += ["--capacity", "8M", "--fill", "0.9", "--block-size", "512", "--seed", "3"]
    subprocess.run([*gen, "-o", str(ops)], env=env, check=True, capture_output=True, timeout=120)
    sizes, journal = _age_to_enospc(tmp_path, image, ops)
    wrong = sorted(n for n in set(sizes) | set(journal) if sizes.get(n) != journal.get(n))
    assert not wrong, (
        f"{len(wrong)} files differ from what the ops the ager reports done leave: "
        f"{[(n, journal.get(n), sizes.get(n)) for n in wrong[:5]]}"
    )


def test_an_open_file_shows_the_stored_size_after_a_refused_fsync(tmp_path: Path) -> None:
    """A file opened while there was room (so through the page cache), grown near full until
    fsync is refused: fstat and reads of the still open file show the stored size and bytes,
    those a remount shows, not the size the kernel grew it to."""
    image = tmp_path / "fs.img"
    mkfs(image, size=8 << 20, blocks_per_segment=32, block_size=512)
    mp = tmp_path / "mnt"
    mp.mkdir()
    rng = random.Random("open-fstat")
    m = Mounted(image, mp, "--writeback")
    try:
        fd = os.open(mp / "x", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.pwrite(fd, b"a" * 1000, 0)
            os.fsync(fd)
            for i in range(1000):  # the rest filled to ENOSPC, a little room made again
                if _write(mp / f"f{i:04d}", 0, rng.randbytes(256 << 10), True, True):
                    break
            for name in sorted(p.name for p in mp.iterdir() if p.name != "x")[-3:]:
                os.unlink(mp / name)
            grown, refused = 1000, False
            for _ in range(200):
                data = rng.randbytes(64 << 10)
                os.pwrite(fd, data, grown)
                grown += len(data)
                try:
                    os.fsync(fd)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC
                    refused = True
                    break
            assert refused, "no fsync was refused"
            first = os.fstat(fd).st_size
            # The mount's fixing truncate waits for the inode lock the fsync held, so it lands
            # just after the fsync returns: a stat at once may come before it.
            t0 = time.monotonic()
            while os.fstat(fd).st_size >= grown and time.monotonic() < t0 + 10:
                time.sleep(0.01)
            late = time.monotonic() - t0
            size = os.fstat(fd).st_size
            read = os.pread(fd, grown + 4096, 0)
        finally:
            os.close(fd)
        shown = _view(mp)
    finally:
        m.unmount()
    stored = _stored(image, mp, shown)
    print(f"grown to {grown}; fstat at once {first}, {size} after {late:.3f} s")
    assert size == stored["x"][0] < grown, (size, stored["x"][0], grown)
    assert read == stored["x"][1]


def test_ager_appends_and_overwrites_refused_near_full_leave_the_old_size(tmp_path: Path) -> None:
    """Appends and overwrites past the end run by ``fsage age`` through the mount until the
    LFS refuses them (in write(2), at fsync or only at close, when the writeback cache
    writes them back): each refused one leaves the file its old size, so after a remount
    every file is as large as the ops the ager journals as done leave it."""
    image = tmp_path / "grow.img"
    mkfs(image, size=8 << 20, blocks_per_segment=32, block_size=512)
    rng = random.Random("grow-near-full")
    ops = [Op("create", f"g{i:02d}", size=16 << 10) for i in range(24)]
    sizes = {op.path: op.size for op in ops}
    for _ in range(160):
        name = rng.choice(sorted(sizes))
        n = rng.randrange(64 << 10, 1 << 20)  # larger than one write-back request
        if rng.random() < 0.6:
            ops.append(Op("append", name, size=n))
        else:  # past the end: the file grows
            ops.append(Op("overwrite", name, size=n, offset=rng.randrange(sizes[name] + 1)))
    stream = tmp_path / "grow.jsonl"
    write_workload(stream, WorkloadHeader("test"), ops)
    got, journal = _age_to_enospc(tmp_path, image, stream)
    assert set(journal) == set(got)
    wrong = sorted(n for n in journal if got[n] != journal[n])
    assert not wrong, (
        f"{len(wrong)} files differ from what the ops the ager reports done leave: "
        f"{[(n, journal[n], got[n]) for n in wrong[:5]]}"
    )
