"""A match run through the kernel (the image loop-mounted) replays block for block: ``fsage age
IMG --match SPEC --match-ops J`` and then ``fsage age OTHER --ops J`` on a fresh image of the
same mkfs parameters give every file the same blocks as debugfs lists them and the same free
space as e2freefrag counts it. The mounted executor runs on one CPU and writes back what it
dirtied from its own thread, so ext4's per-CPU preallocations and delayed allocation do not
depend on where and when the kernel's threads ran."""

from __future__ import annotations

import gzip
import json
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from fsage.cli import main
from fsage.workload import Op

MIB = 1 << 20
SIZE = 128 * MIB
#: A fixed hash seed: Orlov spreads top-level directories by a hash of their name with it.
_MKFS = ["mke2fs", "-q", "-F", "-t", "ext4", "-b", "4096", "-U", "clear"]
_SEED = "hash_seed=5d0e3c1a-2b7f-4e19-8c44-0a9b1f6e7d23"


def _ext4(path: Path) -> Path:
    subprocess.run(["truncate", "-s", str(SIZE), str(path)], check=True)
    subprocess.run([*_MKFS, "-E", _SEED, str(path)], check=True)
    return path


def _live_files(journal: Path) -> list[str]:
    live: dict[str, None] = {}
    with gzip.open(journal, "rt") as fh:
        header = json.loads(fh.readline())["fsage_workload"]
        assert header["generator"] == "fsage age --match" and not header["params"]["offline"]
        for line in fh:
            op = Op.from_json(json.loads(line))
            if op.op == "create":
                live[op.path] = None
            elif op.op == "delete":
                live.pop(op.path, None)
            elif op.op == "rename" and op.path in live:
                live.pop(op.path)
                live[op.dest] = None
    return sorted(live)


def _blocks(image: Path, paths: list[str]) -> list[str]:
    cmds = "".join(f"blocks /{p}\n" for p in paths)
    out = subprocess.run(
        ["debugfs", "-f", "-", str(image)], input=cmds, capture_output=True, text=True, check=True
    ).stdout
    # One answer per file after each prompt; an empty answer would hide a missing file.
    answers = out.split("debugfs:")[1:]
    assert len(answers) == len(paths) and all(a.split()[2:] for a in answers), out[-500:]
    return answers


def _free(image: Path) -> list[str]:
    out = subprocess.run(["e2freefrag", str(image)], capture_output=True, text=True, check=True)
    return [line for line in out.stdout.splitlines() if not line.startswith("Device")]


@pytest.mark.slow
@pytest.mark.needs_root
def test_a_kernel_match_replays_block_for_block(tmp_path: Path) -> None:
    from tests.ager.fragmented import fragmented_target

    target = fragmented_target(tmp_path / "target.img", SIZE, "fragmented")
    (tmp_path / "target.img").unlink()
    spec = tmp_path / "t.json"
    spec.write_text(json.dumps(target.to_json()))
    matched, replayed = _ext4(tmp_path / "a.img"), _ext4(tmp_path / "b.img")
    ops = tmp_path / "match.jsonl.gz"
    r = CliRunner().invoke(
        main, ["age", str(matched), "--match", str(spec), "--match-ops", str(ops), "--mount"]
    )
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["age", str(replayed), "--ops", str(ops), "--mount"])
    assert r.exit_code == 0, r.output
    paths = _live_files(ops)
    assert len(paths) > 500
    want, got = _blocks(matched, paths), _blocks(replayed, paths)
    differ = [p for p, a, b in zip(paths, want, got, strict=True) if a != b]
    assert not differ, f"{len(differ)} of {len(paths)} files on other blocks, first {differ[:3]}"
    assert _free(matched) == _free(replayed)
