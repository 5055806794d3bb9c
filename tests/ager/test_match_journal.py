"""A match is an op stream like any other aging: ``--match-ops`` writes the ops that took
effect, and ``fsage age OTHER --ops`` runs them again. Offline (libext2fs places blocks the
same way every time) the replay gives the same layout: every file's blocks as debugfs lists
them and the free space as e2freefrag counts it."""

from __future__ import annotations

import gzip
import json
import subprocess
from pathlib import Path

from click.testing import CliRunner

from fsage.ager.match import target_from_layout
from fsage.cli import main
from fsage.snapshotter.ext import read_ext_layout
from fsage.workload import Op, WorkloadError

MIB = 1 << 20
_MKFS = ["mke2fs", "-q", "-F", "-t", "ext4", "-b", "4096", "-U", "clear", "-E", "hash_seed="]


def _ext4(path: Path, tree: Path | None = None) -> Path:
    subprocess.run(["truncate", "-s", str(64 * MIB), str(path)], check=True)
    seed = "0c1f9e1c-55b1-4f43-9a3e-5f0b8f6c2d11"
    argv = [*_MKFS[:-1], _MKFS[-1] + seed]
    if tree is not None:
        argv += ["-d", str(tree)]
    subprocess.run([*argv, str(path)], check=True)
    return path


def _blocks(image: Path, paths: list[str]) -> list[str]:
    cmds = "".join(f"blocks /{p}\n" for p in paths)
    out = subprocess.run(
        ["debugfs", "-f", "-", str(image)], input=cmds, capture_output=True, text=True, check=True
    ).stdout
    return out.splitlines()


def _free(image: Path) -> list[str]:
    out = subprocess.run(["e2freefrag", str(image)], capture_output=True, text=True, check=True)
    return [line for line in out.stdout.splitlines() if not line.startswith("Device")]


def test_an_offline_match_replays_to_the_same_layout(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    for i in range(400):
        (tree / f"d{i % 7}").mkdir(exist_ok=True)
        (tree / f"d{i % 7}" / f"f{i:03d}").write_bytes(b"t" * (4096 * (1 + (i * 37) % 60) + 5))
    timg = _ext4(tmp_path / "t.img", tree)
    # Every fifth file deleted: holes between the others, which the fill makes with spacers.
    rm = "".join(f"rm /d{i % 7}/f{i:03d}\n" for i in range(0, 400, 5))
    subprocess.run(["debugfs", "-w", "-f", "-", str(timg)], input=rm, text=True, check=True,
                   capture_output=True)  # fmt: skip
    target = target_from_layout(read_ext_layout(timg), "t")
    spec = tmp_path / "t.json"
    spec.write_text(json.dumps(target.to_json()))
    matched, replayed = _ext4(tmp_path / "a.img"), _ext4(tmp_path / "b.img")
    ops = tmp_path / "match.jsonl.gz"
    r = CliRunner().invoke(
        main, ["age", str(matched), "--match", str(spec), "--offline", "--match-ops", str(ops)]
    )
    assert r.exit_code == 0, r.output
    with gzip.open(ops, "rt") as fh:
        header = json.loads(fh.readline())["fsage_workload"]
        stream = [Op.from_json(json.loads(line)) for line in fh]
    assert header["generator"] == "fsage age --match" and header["params"]["offline"]
    kinds = {op.op for op in stream}
    assert {"mkdir", "create", "delete", "sync"} <= kinds
    r = CliRunner().invoke(main, ["age", str(replayed), "--ops", str(ops), "--offline"])
    assert r.exit_code == 0, r.output
    live: dict[str, bool] = {}
    for op in stream:
        if op.op == "create":
            live[op.path] = True
        elif op.op == "delete":
            live.pop(op.path, None)
    assert len(live) > 300
    assert _blocks(matched, sorted(live)) == _blocks(replayed, sorted(live))
    assert _free(matched) == _free(replayed)


def test_allocate_near_needs_a_block_number() -> None:
    import pytest

    Op("allocate-near", "f", 4096, 0, label="123").check()
    with pytest.raises(WorkloadError, match="block number"):
        Op("allocate-near", "f", 4096, 0, label="x").check()
