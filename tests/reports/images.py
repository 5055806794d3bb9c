"""Generated ext4 images for validation against e2fsprogs (mke2fs -d, then debugfs churn)."""

from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path

import pytest


def need(*tools: str) -> None:
    for t in tools:
        if shutil.which(t) is None:
            pytest.skip(f"{t} not installed")


def make_image(
    workdir: Path,
    *,
    seed: int,
    block_size: int,
    size_mb: int,
    files: int,
    max_bytes: int,
    churn: bool = True,
    extra_args: tuple[str, ...] = (),
) -> Path:
    """A seeded tree copied in by mke2fs -d; then every third file deleted and new files
    written with debugfs, which allocates into the holes and fragments them."""
    need("mke2fs", "debugfs")
    rnd = random.Random(seed)
    src = workdir / f"src{seed}"
    for i in range(files):
        d = src / f"d{i % 7}" / f"e{i % 3}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i}").write_bytes(rnd.randbytes(rnd.randint(0, max_bytes)))
    img = workdir / f"img{seed}"
    subprocess.run(
        [
            "mke2fs",
            "-q",
            "-F",
            "-t",
            "ext4",
            "-b",
            str(block_size),
            *extra_args,
            "-d",
            str(src),
            str(img),
            f"{size_mb}M",
        ],
        check=True,
        capture_output=True,
    )
    if churn:
        cmds = [f"rm /d{i % 7}/e{i % 3}/f{i}" for i in range(0, files, 3)]
        blob = workdir / f"blob{seed}"
        for j in range(files // 15):
            blob.write_bytes(rnd.randbytes(rnd.randint(1, max_bytes * 3)))
            part = workdir / f"blob{seed}_{j}"
            shutil.copyfile(blob, part)
            cmds.append(f"write {part} /d{j % 7}/new{j}")
        script = workdir / f"cmds{seed}"
        script.write_text("\n".join(cmds) + "\n")
        subprocess.run(
            ["debugfs", "-w", "-f", str(script), str(img)], check=True, capture_output=True
        )
    return img
