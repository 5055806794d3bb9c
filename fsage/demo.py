"""`fsage demo`: the whole toolchain on a small embedded example, needing no root.

It makes an ext4 image from a seeded tree of lognormal/Pareto-sized files (seed 004's hFS
distribution), snapshots it, and prints the layout summary. Everything lives in one working
directory that the demo marks as its own, so a second run replaces only what the first made.
"""

from __future__ import annotations

import random
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fsage.ager.distributions import HFS_SURGE
from fsage.db.store import SnapshotSummary, Store
from fsage.errors import FsageError, UnsafeTargetError
from fsage.snapshotter import read_source

MARKER = ".fsage-demo"
FILES_PER_DIR = 64  # seed 004: a new directory with probability 1/64


@dataclass
class DemoResult:
    workdir: Path
    image: Path
    db: Path
    snapshots: list[SnapshotSummary]


def prepare_workdir(workdir: Path) -> None:
    """Create the demo directory, or reuse one an earlier demo made; refuse anything else."""
    if workdir.exists():
        if not workdir.is_dir():
            raise UnsafeTargetError(f"{workdir} exists and is not a directory")
        if any(workdir.iterdir()) and not (workdir / MARKER).exists():
            raise UnsafeTargetError(
                f"{workdir} is not empty and was not made by fsage demo; choose another --dir"
            )
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / MARKER).write_text("made by fsage demo\n")


def make_tree(root: Path, files: int, seed: int) -> int:
    """A seeded tree of ``files`` files with hFS sizes; returns the bytes written."""
    rng = random.Random(seed)
    total = 0
    dirs = [root]
    for i in range(files):
        if rng.random() < 1 / FILES_PER_DIR:
            parent = rng.choice(dirs)
            new = parent / f"d{len(dirs):04d}"
            new.mkdir()
            dirs.append(new)
        size = HFS_SURGE.sample(rng, cap=8 << 20)
        path = rng.choice(dirs) / f"f{i:05d}"
        with open(path, "wb") as fh:
            fh.write(rng.randbytes(min(size, 4096)) * (size // 4096 + 1) if size else b"")
            fh.truncate(size)
        total += size
    return total


def make_image(image: Path, tree: Path, data_bytes: int) -> None:
    size_mib = max(32, int(data_bytes * 1.6) // (1 << 20) + 16)
    argv = ["mke2fs", "-q", "-F", "-t", "ext4", "-L", "fsage-demo", "-d", str(tree),
            str(image), f"{size_mib}M"]  # fmt: skip
    try:
        subprocess.run(argv, check=True, capture_output=True, text=True)
    except FileNotFoundError:
        raise FsageError("mke2fs not found: install e2fsprogs") from None
    except subprocess.CalledProcessError as exc:
        raise FsageError(f"mke2fs failed: {exc.stderr.strip()}") from None


def run_demo(
    workdir: Path, files: int = 3000, seed: int = 42, echo: Callable[[str], None] = print
) -> DemoResult:
    prepare_workdir(workdir)
    image = workdir / "demo.img"
    db = workdir / "fsage.db"
    for old in (image, db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
        old.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(dir=workdir, prefix="tree-") as tmp:
        echo(f"making {files} files with hFS sizes (seed {seed})")
        data = make_tree(Path(tmp), files, seed)
        echo(f"making ext4 image {image} from {data / (1 << 20):.1f} MiB of files")
        make_image(image, Path(tmp), data)
    with Store.open(db, create=True) as store:
        summary = store.add_snapshot(read_source(image), name="demo", source=str(image))
    echo(summary.line())
    return DemoResult(workdir, image, db, [summary])


__all__ = ["DemoResult", "make_tree", "prepare_workdir", "run_demo"]
