"""The order a mounted run writes back the files it dirtied (``PosixExecutor._track``): the
files dirtied since the last writeback, each at the place it was last written, carried along
by renames of files and of the directories above them."""

from __future__ import annotations

import os
import random
from pathlib import Path

from fsage.ager.posix import MARKER, PosixExecutor
from fsage.workload import Op


def _model_order(order: list[str], op: Op) -> list[str]:
    """The writeback order after ``op``, rebuilt whole from the one before (the plain rule:
    a write moves its file last, a delete drops it, a rename maps every path at or under its
    source to the destination, a path met twice keeping its first place)."""
    if op.op in ("create", "append", "overwrite"):
        return [p for p in order if p != op.path] + [op.path]
    if op.op == "delete":
        return [p for p in order if p != op.path]
    if op.op == "rename":
        head = op.path + "/"
        moved = [
            op.dest if p == op.path else op.dest + p[len(op.path) :] if p.startswith(head) else p
            for p in order
        ]
        return list(dict.fromkeys(moved))
    return order


def _files_on_disk(root: Path) -> set[str]:
    out = set()
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            rel = str((Path(dirpath) / f).relative_to(root))
            if rel != MARKER:
                out.add(rel)
    return out


def _random_ops(rng: random.Random, n: int) -> list[Op]:
    """Valid ops on an empty directory: files written, deleted and renamed (over others too),
    directories made and renamed with the files below them."""
    dirs = [""]
    files: set[str] = set()
    ops: list[Op] = []
    serial = 0

    def fresh(parent: str, stem: str) -> str:
        nonlocal serial
        serial += 1
        return f"{parent}/{stem}{serial}" if parent else f"{stem}{serial}"

    for _ in range(n):
        u = rng.random()
        if u < 0.1 or not files:
            d = fresh(rng.choice(dirs), "d")
            dirs.append(d)
            ops.append(Op("mkdir", d))
            f = fresh(d, "f")
            files.add(f)
            ops.append(Op("create", f, 1))
        elif u < 0.35:
            f = fresh(rng.choice(dirs), "f")
            files.add(f)
            ops.append(Op("create", f, 1))
        elif u < 0.5:
            ops.append(Op("append", rng.choice(sorted(files)), 1))
        elif u < 0.6:
            f = rng.choice(sorted(files))
            files.discard(f)
            ops.append(Op("delete", f))
        elif u < 0.8:
            src = rng.choice(sorted(files))
            others = sorted(files - {src})
            dest = (
                rng.choice(others)
                if others and rng.random() < 0.4
                else fresh(rng.choice(dirs), "r")
            )
            files.discard(src)
            files.add(dest)
            ops.append(Op("rename", src, dest=dest))
        else:
            src = rng.choice(dirs[1:] or [""])
            if not src:
                continue
            parents = [d for d in dirs if d != src and not d.startswith(src + "/")]
            dest = fresh(rng.choice(parents), "m")
            head = src + "/"
            dirs = [dest + d[len(src) :] if d == src or d.startswith(head) else d for d in dirs]
            files = {dest + f[len(src) :] if f.startswith(head) else f for f in files}
            ops.append(Op("rename", src, dest=dest))
    return ops


def test_writeback_order_follows_writes_deletes_and_renames(tmp_path: Path) -> None:
    for seed in range(3):
        root = tmp_path / f"r{seed}"
        root.mkdir()
        ex = PosixExecutor(root)
        try:
            ex._free = 1 << 62  # no writeback on the way: the order holds every op's effect
            order: list[str] = []
            for op in _random_ops(random.Random(seed), 400):
                ex.apply(op)
                order = _model_order(order, op)
                assert list(ex._order.values()) == order, (seed, op)
            # Every file the run wrote is to be written back, and no path that is gone.
            assert set(order) == _files_on_disk(root)
            assert sorted(ex._dirty, key=ex._dirty.__getitem__) == order
            ex._write_back()
            assert not ex._dirty and not ex._order
        finally:
            ex.close()
