"""``fsage age --match`` refuses, in one line and before writing anything, a target the file
system cannot be aged to; and a target it accepts never runs the disk out of space: the
fullness left on disk ends within 0.01 of the target's, as e2freefrag counts it."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from fsage.ager.match import LayoutTarget, target_from_layout
from fsage.cli import main as cli
from fsage.snapshotter.ext import read_ext_layout
from tests.ager.helpers import fsck_clean

MIB = 1 << 20


def _ext4(path: Path, size: int, block: int = 4096, tree: Path | None = None) -> Path:
    subprocess.run(["truncate", "-s", str(size), str(path)], check=True)
    argv = ["mke2fs", "-q", "-F", "-t", "ext4", "-b", str(block)]
    if tree is not None:
        argv += ["-d", str(tree)]
    subprocess.run([*argv, str(path)], check=True)
    return path


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _target_json(tmp: Path, target: LayoutTarget, **change: object) -> Path:
    data = target.to_json()
    data.update(change)
    out = tmp / "target.json"
    out.write_text(json.dumps(data))
    return out


def _fullness(image: Path) -> float:
    """Used blocks of all blocks, as e2freefrag counts them from the block bitmaps."""
    out = subprocess.run(["e2freefrag", str(image)], capture_output=True, text=True, check=True)
    total = int(re.search(r"Total blocks:\s*(\d+)", out.stdout).group(1))  # type: ignore[union-attr]
    free = int(re.search(r"Free blocks:\s*(\d+)", out.stdout).group(1))  # type: ignore[union-attr]
    return 1 - free / total


def _refused(image: Path, spec: Path, *extra: str) -> str:
    """Run the match; assert it failed with one line on stderr and left ``image`` as it was."""
    before = _digest(image)
    res = CliRunner().invoke(cli, ["age", str(image), "--match", str(spec), *extra])
    assert res.exit_code != 0 and isinstance(res.exception, SystemExit), res.output
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in res.output, res.output
    assert _digest(image) == before  # nothing written, not even the matcher's directory
    return lines[0]


@pytest.fixture
def small_target(tmp_path: Path) -> LayoutTarget:
    """A 64 MiB 4 KiB ext4 about half full of files of a few sizes, read offline."""
    tree = tmp_path / "tree"
    tree.mkdir()
    for i in range(300):
        (tree / f"f{i:03d}").write_bytes(b"t" * (4096 * (1 + i % 40) + 7))
    image = _ext4(tmp_path / "target.img", 64 * MIB, tree=tree)
    return target_from_layout(read_ext_layout(image), "small target")


def test_a_target_of_another_block_size_is_refused(
    tmp_path: Path, small_target: LayoutTarget
) -> None:
    image = _ext4(tmp_path / "fresh.img", 64 * MIB, block=1024)
    line = _refused(image, _target_json(tmp_path, small_target), "--offline")
    assert "4096-byte blocks" in line and "1024-byte" in line and "mkfs -b 4096" in line


def test_an_lfs_target_is_refused_for_an_ext_image(tmp_path: Path) -> None:
    lfs = tmp_path / "lfs.img"
    res = CliRunner().invoke(cli, ["lfs", "mkfs", str(lfs), "--size", "16M"])
    assert res.exit_code == 0, res.output
    db = tmp_path / "lfs.db"
    res = CliRunner().invoke(cli, ["snapshot", str(lfs), "--db", str(db)])
    assert res.exit_code == 0, res.output
    image = _ext4(tmp_path / "fresh.img", 64 * MIB)
    before = _digest(image)
    res = CliRunner().invoke(cli, ["age", str(image), "--match", "1", "--db", str(db)])
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.exit_code != 0 and len(lines) == 1, res.output
    assert "lfs" in lines[0] and "ext" in lines[0]
    assert _digest(image) == before


def test_an_empty_target_is_refused(tmp_path: Path) -> None:
    empty = _ext4(tmp_path / "empty.img", 64 * MIB)
    target = target_from_layout(read_ext_layout(empty), "empty ext4")
    image = _ext4(tmp_path / "fresh.img", 64 * MIB)
    line = _refused(image, _target_json(tmp_path, target, size_buckets=[]), "--offline")
    assert "layout target" in line  # a JSON target without size buckets
    db = tmp_path / "e.db"
    assert CliRunner().invoke(cli, ["snapshot", str(empty), "--db", str(db)]).exit_code == 0
    before = _digest(image)
    res = CliRunner().invoke(cli, ["age", str(image), "--match", "1", "--db", str(db), "--offline"])
    assert res.exit_code != 0 and "holds no files" in res.stderr, res.output
    assert _digest(image) == before


def test_a_target_fuller_than_the_image_can_hold_is_refused(
    tmp_path: Path, small_target: LayoutTarget
) -> None:
    image = _ext4(tmp_path / "fresh.img", 64 * MIB)
    line = _refused(image, _target_json(tmp_path, small_target, fullness=0.99), "--offline")
    assert "0.990 full" in line and "at most 0.97" in line


def test_a_target_emptier_than_the_image_already_is_refused(
    tmp_path: Path, small_target: LayoutTarget
) -> None:
    tree = tmp_path / "full"
    tree.mkdir()
    (tree / "big").write_bytes(b"b" * (48 * MIB))
    image = _ext4(tmp_path / "used.img", 64 * MIB, tree=tree)
    line = _refused(image, _target_json(tmp_path, small_target, fullness=0.3), "--offline")
    assert "already" in line and "0.300" in line


def _bucket_floor_target(tmp_path: Path) -> tuple[Path, float]:
    """A 128 MiB ext4 0.84 full of files one byte past a power of two blocks (the bottom of
    their size bucket: files drawn anywhere in the bucket hold half as many blocks again)."""
    tree = tmp_path / "floor"
    tree.mkdir()
    total, i = 0, 0
    while total < 82 * MIB:
        k = 2 + (i * 7919) % 7
        size = (1 << k) * 4096 + 1
        (tree / f"f{i:04d}").write_bytes(b"x" * size)
        total, i = total + size, i + 1
    image = _ext4(tmp_path / "floor.img", 128 * MIB, tree=tree)
    target = target_from_layout(read_ext_layout(image), "bucket floors")
    return _target_json(tmp_path, target), _fullness(image)


@pytest.mark.parametrize(
    "mode", ["--offline", pytest.param("--mount", marks=pytest.mark.needs_root)]
)
def test_a_fill_of_files_larger_than_the_targets_never_runs_out_of_space(
    tmp_path: Path, mode: str
) -> None:
    spec, want = _bucket_floor_target(tmp_path)
    assert 0.8 < want < 0.9
    image = _ext4(tmp_path / "fresh.img", 128 * MIB)
    res = CliRunner().invoke(
        cli, ["age", str(image), "--match", str(spec), mode, "--format", "json"]
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["measured_by"] == "the offline reader after unmount"
    got = _fullness(image)
    assert abs(got - want) <= 0.01, (got, want)
    assert abs(out["report"]["fullness"] - got) < 0.002  # what it says is what is on disk
    fsck_clean(image)
