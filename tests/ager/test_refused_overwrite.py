"""An overwrite inside a file refused for lack of space leaves the file as it was.

On a small, near-full, loop-mounted ext4 and btrfs (and a tmpfs) a file holds data and then a
hole; an overwrite of the whole range first replaces the data (in place on ext4 and tmpfs,
copy-on-write on btrfs) and then needs new blocks for the hole, which the full file system
refuses; another file (of an unaligned size) is overwritten from inside to past its end. The
executor must report each op refused (NoSpaceError), write no journal line for it, and leave
the file's bytes (sha256 read back through the mount), size and holes (SEEK_DATA/SEEK_HOLE) as
they were before.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from fsage.ager.images import loop_mount, make_image
from fsage.ager.posix import PosixExecutor
from fsage.workload import NoSpaceError, Op
from tests.ager.test_executors import _ListJournal
from tests.conftest import require_tools

pytestmark = [pytest.mark.needs_root, pytest.mark.slow]

MIB = 1 << 20


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _data_ranges(path: Path) -> list[tuple[int, int]]:
    """The file's data ranges as SEEK_DATA/SEEK_HOLE give them (the kernel's own answer)."""
    out: list[tuple[int, int]] = []
    fd = os.open(path, os.O_RDONLY)
    try:
        size, pos = os.fstat(fd).st_size, 0
        while pos < size:
            try:
                start = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError as exc:
                if exc.errno == errno.ENXIO:
                    break
                raise
            pos = os.lseek(fd, start, os.SEEK_HOLE)
            out.append((start, pos))
    finally:
        os.close(fd)
    return out


@contextlib.contextmanager
def _mounted(kind: str, tmp_path: Path) -> Iterator[Path]:
    if kind == "tmpfs":
        mnt = Path(tempfile.mkdtemp(prefix="fsage-tmpfs-"))
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mnt)], check=True)
        try:
            yield mnt
        finally:
            subprocess.run(["umount", str(mnt)], check=True)
            mnt.rmdir()
        return
    require_tools(f"mkfs.{kind}")
    image = make_image(tmp_path / f"{kind}.img", kind, (128 if kind == "btrfs" else 16) * MIB)
    try:
        with loop_mount(image) as mnt:
            yield mnt
    finally:
        image.unlink()


def _fill(root: Path) -> list[Path]:
    """Files of 1 MiB (then smaller) until the file system refuses more; synced."""
    made: list[Path] = []
    size = MIB
    chunk = os.urandom(MIB)
    while size >= 4096:
        p = root / f"fill{len(made):04d}"
        try:
            with open(p, "wb") as f:
                f.write(chunk[:size])
                f.flush()
                os.fsync(f.fileno())
            made.append(p)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            p.unlink(missing_ok=True)
            size //= 2
    os.sync()
    return made


@pytest.mark.parametrize("kind", ["ext4", "btrfs", "tmpfs"])
def test_a_refused_overwrite_leaves_the_file_as_it_was(tmp_path: Path, kind: str) -> None:
    with _mounted(kind, tmp_path) as mnt:
        root = mnt / "t"
        root.mkdir()
        target = root / "x"
        with open(target, "wb") as f:  # 2 MiB of data, then a hole to 40 MiB
            f.write(os.urandom(2 * MIB))
            f.truncate(40 * MIB)
            os.fsync(f.fileno())
        grown = root / "y"  # data only, an unaligned end: overwritten past it
        grown.write_bytes(os.urandom(2 * MIB + 1234))
        fill = _fill(root)
        for p in fill[:2]:  # a little room: part of the overwrite is written before the refusal
            p.unlink()
        os.sync()
        before = (_sha(target), target.stat().st_size, _data_ranges(target))
        journal = _ListJournal(tmp_path / "j.jsonl")
        refused = 0
        try:
            with PosixExecutor(root) as ex:
                step = ex.journaled(journal)
                for offset in (0, MIB + 4096 * 3 + 100, 3 * MIB + 100):  # aligned, not, in a hole
                    with pytest.raises(NoSpaceError):
                        step(Op("overwrite", "x", size=36 * MIB, offset=offset))
                    refused += 1
                    after = (_sha(target), target.stat().st_size, _data_ranges(target))
                    assert after[:2] == before[:2], (
                        f"{kind}: the refused overwrite at {offset} changed x"
                    )
                    if kind != "btrfs":  # btrfs may store the restored range as new extents
                        assert after[2] == before[2], f"{kind}: holes of x changed"
                y_before = (_sha(grown), grown.stat().st_size)
                with pytest.raises(NoSpaceError):
                    step(Op("overwrite", "y", size=36 * MIB, offset=4096))
                refused += 1
                assert (_sha(grown), grown.stat().st_size) == y_before, f"{kind}: y changed"
                step(Op("overwrite", "x", size=4096, offset=8192))  # room for this one
        finally:
            os.close(journal.fd)
        assert refused == 4
        assert [(op.op, op.offset) for op in journal.added] == []
        lines = (tmp_path / "j.jsonl").read_text().splitlines()
        assert len(lines) == 1 and '"offset":8192' in lines[0].replace(" ", ""), lines
