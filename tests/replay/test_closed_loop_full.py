"""A closed-loop replay of a history that ends nearly full: the steering's rewrites in
alternating pieces find no room for some of their new versions, and every file of the
recreation must still have the size the snapshot records (os.stat on the mounted recreation):
a piece the disk refused never leaves a short new version renamed over its file."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

from fsage.ager.images import loop_mount, make_image
from fsage.db.store import Store
from fsage.replay.recreate import RecreateOptions, recreate
from fsage.snapshotter import read_source

MIB = 1 << 20
#: Files of one size, enough of them for their size bucket to be judged, rewritten two at a
#: time in alternating pieces between the snapshots.
MID = [f"mid/m{i:02d}" for i in range(52)]
MID_SIZE = 512 * 1024
#: Free at the last snapshot: less than two of them take, so a pair rewritten together fails.
LEAVE = 3 * MID_SIZE // 2


def _pieces(mnt: Path, paths: list[str], size: int, piece: int, seed: int) -> None:
    """``paths`` rewritten in place, two at a time, in alternating pieces with an fsync after
    each (as two writers do): their blocks interleave on disk."""
    for pair in (paths[i : i + 2] for i in range(0, len(paths), 2)):
        fds = [os.open(mnt / p, os.O_WRONLY | os.O_TRUNC) for p in pair]
        try:
            for off in range(0, size, piece):
                for fd in fds:
                    os.write(fd, bytes([seed & 0xFF]) * min(piece, size - off))
                    os.fsync(fd)
        finally:
            for fd in fds:
                os.close(fd)


def _fill(path: Path, leave: int) -> None:
    """``path`` written until the disk refuses more (root's reserve included), then cut by
    ``leave`` bytes: what is left free is ``leave`` and what ext4 holds back from everyone."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        chunk = b"f" * 65536
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, chunk)
        os.fsync(fd)
        os.ftruncate(fd, max(os.fstat(fd).st_size - leave, 0))
        os.fsync(fd)
    finally:
        os.close(fd)


def _history(tmp: Path) -> Path:
    """Snapshot 1: small files and 52 of 512 KiB on a 40 MiB ext4. Then the 512 KiB files are
    rewritten in place in alternating pieces (no snapshot sees it: the snapshot finds them in
    pieces) and the disk is filled until less is free than two of them take; snapshot 2. The
    recreation, its files in one piece each, is steered by rewriting them in pairs in
    alternating pieces, some of which the full disk refuses."""
    img = make_image(tmp / "o.img", "ext4", 40 * MIB, label="full")
    db = tmp / "h.db"
    with Store.open(db, create=True) as store:
        with loop_mount(img) as mnt:
            for d in ("mid", "small"):
                (mnt / d).mkdir()
            for i in range(200):
                (mnt / f"small/s{i:03d}").write_bytes(b"s" * (1 + i * 97 % 12) * 1024)
            for p in MID:
                (mnt / p).write_bytes(b"m" * MID_SIZE)
        store.add_snapshot(read_source(img), name="full")
        with loop_mount(img) as mnt:
            _pieces(mnt, MID, MID_SIZE, 32 * 1024, 1)
            _fill(mnt / "small/fill", LEAVE)
        store.add_snapshot(read_source(img), name="full")
    return db


@pytest.mark.slow
@pytest.mark.needs_root
def test_a_closed_loop_replay_near_full_leaves_every_file_its_snapshot_size(
    tmp_path: Path,
) -> None:
    db = _history(tmp_path)
    with Store.open(db) as store:
        last = store.load_layout(2)
    f = last.files
    reg = f.is_regular()
    sizes = dict(zip(f.ino[reg].tolist(), f.size[reg].tolist(), strict=True))
    want = {p.lstrip("/"): sizes[ino] for ino, ps in last.paths().items() if ino in sizes
            for p in ps}  # fmt: skip
    assert set(MID) <= set(want) and len(want) > 250
    rec = tmp_path / "r.img"
    res = recreate(RecreateOptions(db=db, fs_name="full", target=rec, mode="mount",
                                   closed_loop=True, record=False))  # fmt: skip
    # The steering met a full disk (else this test proves nothing).
    assert res.nospace > 0, res.closed_loop
    with loop_mount(rec, options="ro") as mnt:
        got = {str(p.relative_to(mnt)): os.stat(p).st_size for p in mnt.rglob("*")
               if p.is_file() and p.name != "lost+found"}  # fmt: skip
    assert got == want
