"""Validation against tools fsage did not write: e2freefrag and e2fsck on generated images."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from fsage.analyzer import analyze_layout, file_scores
from fsage.analyzer.locality import blocks_per_group
from fsage.layout import FileTable

from .images import make_image, need

snapshotter = pytest.importorskip("fsage.snapshotter")

CASES = [
    # seed, block size, MiB, files, max bytes  (different block sizes and fullness)
    (1, 1024, 16, 300, 40_000),
    (2, 4096, 64, 600, 120_000),
    (3, 2048, 24, 500, 60_000),
    (4, 4096, 48, 1500, 12_000),
]


@pytest.fixture(scope="module", params=CASES, ids=lambda c: f"bs{c[1]}-{c[2]}M")
def image(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    seed, bs, mb, n, mx = request.param
    return make_image(
        tmp_path_factory.mktemp("img"), seed=seed, block_size=bs, size_mb=mb, files=n, max_bytes=mx
    )


def parse_e2freefrag(text: str) -> dict[str, object]:
    out: dict[str, object] = {}
    out["free"] = int(re.search(r"Free blocks: (\d+)", text).group(1))  # type: ignore[union-attr]
    out["extents"] = int(re.search(r"Num\. free extent: (\d+)", text).group(1))  # type: ignore[union-attr]
    out["chunks_total"] = int(re.search(r"Total chunks: (\d+)", text).group(1))  # type: ignore[union-attr]
    out["chunks_free"] = int(re.search(r"Free chunks: (\d+)", text).group(1))  # type: ignore[union-attr]
    rows = re.findall(r"^\s*(\S+)\.\.\.\s*(\S+)\s*:\s+(\d+)\s+(\d+)\s+[\d.]+%$", text, re.M)
    # e2freefrag labels a bucket by its bounds ("4K...8K-"); fsage gives them in bytes
    out["hist"] = [(_e2freefrag_bytes(a), int(c), int(d)) for a, _, c, d in rows]
    return out


def _e2freefrag_bytes(bound: str) -> int:
    """A bucket bound as e2freefrag prints it ("4K", "512K", "1M") in bytes."""
    return int(bound[:-1]) << (10 * (" KMGTPE".index(bound[-1])))


def test_free_space_matches_e2freefrag(image: Path) -> None:
    need("e2freefrag")
    text = subprocess.run(
        ["e2freefrag", "-c", "1024", str(image)], check=True, capture_output=True, text=True
    ).stdout
    ref = parse_e2freefrag(text)
    layout = snapshotter.read_source(image)
    a = analyze_layout(layout, parts={"free"})
    ours = [(b["min_bytes"], b["count"], b["blocks"]) for b in a["free_extents"]]
    assert ours == ref["hist"]
    assert a["free_space"]["free_extent_count"] == ref["extents"]
    assert a["free_space"]["blocks_free"] == ref["free"]
    assert a["free_space"]["chunks_total"] == ref["chunks_total"]
    assert a["free_space"]["free_chunks"] == ref["chunks_free"]
    assert len(ref["hist"]) >= 3  # type: ignore[arg-type]


def _e2fsck_noncontiguous(image: Path) -> tuple[int, int]:
    p = subprocess.run(["e2fsck", "-fnv", str(image)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    files = int(re.search(r"(\d+) non-contiguous files?", p.stdout).group(1))  # type: ignore[union-attr]
    dirs = int(re.search(r"(\d+) non-contiguous director", p.stdout).group(1))  # type: ignore[union-attr]
    return files, dirs


def _fragmented(t: FileTable, bpg: int) -> np.ndarray:  # type: ignore[type-arg]
    s = file_scores(t)
    meta = (t.meta_off[1:] - t.meta_off[:-1]).astype(np.int64)
    # e2fsck: some extent does not start right after the previous one, and the inode holds
    # fewer than blocks_per_group blocks (data + extent-tree blocks)
    return (s.contiguous < s.denominator) & (s.blocks + meta < bpg)


def test_noncontiguous_count_matches_e2fsck(image: Path) -> None:
    need("e2fsck")
    ref_files, ref_dirs = _e2fsck_noncontiguous(image)
    assert ref_files > 0  # the churn must have fragmented something, or this proves little
    layout = snapshotter.read_source(image)
    bpg = blocks_per_group(layout)
    assert bpg
    frag = _fragmented(layout.files, bpg)
    is_dir = layout.files.is_dir()
    special = _fragmented(layout.special, bpg) if len(layout.special) else np.zeros(0, bool)
    assert int((frag & ~is_dir).sum()) + int(special.sum()) == ref_files
    assert int((frag & is_dir).sum()) == ref_dirs
    # and the regular files fsage scores below 1 are exactly those (no file reaches bpg here)
    a = analyze_layout(layout, parts=())
    assert a["fragmented_files"] == int((frag & layout.files.is_regular()).sum())
