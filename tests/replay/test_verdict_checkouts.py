"""The verdict on a history with known hidden churn: checkouts of generated commits into a
small loop-mounted ext4, a snapshot every few checkouts, so most rewrites happen between two
snapshots and no op stream inferred from them can see them. A plain copy of the last snapshot
is judged NOT FAITHFUL under both rules and sits at the far end of the yardstick; the free
extents the verdict counts are e2freefrag's."""

from __future__ import annotations

import json
import random
import re
import subprocess
from pathlib import Path

import pytest

from fsage.ager.images import loop_mount, make_image
from fsage.db.store import Store
from fsage.replay.fidelity import RULES, fidelity
from fsage.replay.fidelity_scan import COPY_FROM_FLOOR, SCAN_BAND
from fsage.replay.noise import noise_floor
from fsage.replay.recreate import RecreateOptions, recreate
from fsage.replay.unaged import fresh_copy
from fsage.snapshotter import read_source

MIB = 1 << 20
CHECKOUTS = 12
EVERY = 4  # checkouts between two snapshots


def _commits(rng: random.Random, count: int) -> list[dict[str, int]]:
    """``count`` trees (path -> size) of a generated project: each commit changes about a
    fifth of the files, adds a few and removes a few, as development does."""
    dirs = [f"src/m{i}" for i in range(8)] + ["docs", "tests"]
    tree = {
        f"{rng.choice(dirs)}/f{i:03d}.c": int(rng.lognormvariate(9.5, 1.0)) + 1 for i in range(220)
    }
    out, serial = [], 220
    for _ in range(count):
        tree = dict(tree)
        for p in rng.sample(sorted(tree), len(tree) // 5):
            tree[p] = max(1, int(tree[p] * rng.uniform(0.7, 1.5)))
        for p in rng.sample(sorted(tree), 6):
            del tree[p]
        for _ in range(8):
            tree[f"{rng.choice(dirs)}/f{serial:03d}.c"] = int(rng.lognormvariate(9.5, 1.0)) + 1
            serial += 1
        out.append(tree)
    return out


def _checkout(root: Path, old: dict[str, int], new: dict[str, int], seed: int) -> int:
    """Move the work tree from ``old`` to ``new`` as git does: removed files unlinked, changed
    and new ones written whole under a temporary name and renamed into place. Bytes written."""
    written = 0
    for p in sorted(set(old) - set(new)):
        (root / p).unlink()
    for p, size in sorted(new.items()):
        if old.get(p) == size:
            continue
        dest = root / p
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.lock")
        tmp.write_bytes(random.Random(f"{seed}:{p}").randbytes(size))
        tmp.rename(dest)
        written += size
    return written


def _e2freefrag(image: Path) -> tuple[int, list[tuple[int, int]]]:
    """e2freefrag's count of free extents and its histogram: (extents, blocks) per bucket."""
    out = subprocess.run(["e2freefrag", str(image)], capture_output=True, text=True, check=True)
    m = re.search(r"Num. free extent:\s*(\d+)", out.stdout)
    assert m, out.stdout
    rows = re.findall(r"^\s*\S+\.\.\.\s*\S+\s*:\s*(\d+)\s+(\d+)\s", out.stdout, re.M)
    return int(m.group(1)), [(int(c), int(b)) for c, b in rows]


@pytest.mark.slow
@pytest.mark.needs_root
def test_a_plain_copy_of_a_checkout_history_is_not_faithful(tmp_path: Path) -> None:
    img = make_image(tmp_path / "o.img", "ext4", 24 * MIB, label="co")
    db = tmp_path / "h.db"
    trees = _commits(random.Random(26), CHECKOUTS)
    written = 0
    with Store.open(db, create=True) as store:
        prev: dict[str, int] = {}
        for start in range(0, CHECKOUTS, EVERY):
            with loop_mount(img) as mnt:
                for k in range(start, start + EVERY):
                    written += _checkout(mnt, prev, trees[k], k)
                    prev = trees[k]
            store.add_snapshot(read_source(img), name="co")
    # The hidden churn is known: of what the checkouts wrote, the snapshots see much less.
    visible = sum(trees[EVERY - 1].values()) + sum(
        size
        for a, b in zip(trees[EVERY - 1 :: EVERY], trees[2 * EVERY - 1 :: EVERY], strict=False)
        for p, size in b.items()
        if a.get(p) != size
    )
    assert written > 1.3 * visible, (written, visible)

    floor, _ = noise_floor(db, "co", runs=3, workdir=tmp_path)
    assert floor.copy is not None and floor.original_snapshot is not None
    assert len(floor.to_original) == 3
    with Store.open(db) as store:
        original = store.load_layout(floor.original_snapshot)
    copy = fresh_copy(db, "co", None, tmp_path)
    fid = fidelity(original, copy)
    assert fid.files_matched == fid.files_original == len(trees[-1])
    # The free extents the verdict counts are e2freefrag's on the original image, bucket by
    # bucket.
    total, hist = _e2freefrag(img)
    assert fid.free_original["free_extent_count"] == total and len(hist) > 3
    assert [(b["count"], b["blocks"]) for b in fid.free_original["free_extents"]] == hist
    assert fid.free_recreated["free_extent_count"] < fid.free_original["free_extent_count"]
    for rule in RULES:
        v = fid.judge(floor, rule)
        assert not v.faithful, (rule, v.reasons)
        # As far from the original as the copy the floor measured (up to the allocator's
        # noise between two copies).
        assert v.copy_relative is not None and v.copy_relative > 0.8, v.line()
        # a copy misses the scan criterion wherever it applies (the floor's copy is the band's
        # yardstick, this copy another of the same tree)
        assert fid.scan is not None and fid.scan.copy == floor.copy_scan
        if fid.scan.applies() and abs((fid.scan.ratio("recreated") or 1) - 1) > 0.1:
            assert v.scan == "MISSED" and not v.faithful

    rec = recreate(RecreateOptions(db=db, fs_name="co", target=tmp_path / "r.img", mode="mount"))
    assert rec.fidelity is not None
    v = rec.fidelity.judge(floor)
    assert v.copy_relative is not None and v.copy_worst is not None
    assert f"{v.copy_relative:.2f} of the way from a rerun to a plain copy" in v.line()
    assert list(tmp_path.glob("fsage-*")) == []


@pytest.mark.slow
@pytest.mark.needs_root
def test_noise_floor_and_replay_commands_carry_the_yardstick(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from fsage.cli import main

    img = make_image(tmp_path / "o.img", "ext4", 24 * MIB, label="co")
    db = tmp_path / "h.db"
    trees = _commits(random.Random(7), 4)
    with Store.open(db, create=True) as store:
        prev: dict[str, int] = {}
        for k in (0, 2):
            with loop_mount(img) as mnt:
                for j in (k, k + 1):
                    _checkout(mnt, prev, trees[j], j)
                    prev = trees[j]
            store.add_snapshot(read_source(img), name="co")
    base = ["--db", str(db), "--fs", "co"]
    r = CliRunner().invoke(main, ["noise-floor", *base, "--runs", "2", "--workdir", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert "a plain copy to snapshot 2: free space" in r.output
    assert "the plain copy's modeled cold path-order scan: hdd" in r.output
    assert "free-space distance of each run to snapshot 2:" in r.output
    r = CliRunner().invoke(main, ["noise-floor", *base, "--runs", "2", "--no-copy",
                                  "--workdir", str(tmp_path), "--format", "json"])  # fmt: skip
    assert r.exit_code == 0, r.output
    floor = json.loads(r.stdout)["noise_floor"]
    assert floor["copy"] is None and len(floor["to_original"]) == 2
    r = CliRunner().invoke(main, ["noise-floor", *base, "--runs", "2",
                                  "--workdir", str(tmp_path), "--format", "json"])  # fmt: skip
    floor = json.loads(r.stdout)["noise_floor"]
    assert floor["copy"]["free_extents"] > 0 and floor["original_snapshot"] == 2
    # the copy's modeled scan reads every block of the tree's files and directories
    assert floor["copy_scan"]["seeks"] > 0 and floor["copy_scan"]["seconds"]["hdd"] > 0
    path = tmp_path / "floor.json"
    path.write_text(r.stdout)
    rec, judge = str(tmp_path / "r.img"), ["--noise-floor", str(path)]
    r = CliRunner().invoke(main, ["replay", *base, *judge, "--tolerance-from", "original",
                                  "--format", "json", rec])  # fmt: skip
    assert r.exit_code == 0, r.output
    v = json.loads(r.stdout)["fidelity"]["verdict"]
    assert v["rule"] == "original" and v["copy_relative"] is not None
    assert v["faithful"] == (not v["reasons"])
    # the scan criterion takes the floor's copy; the original's blocks are the copy's
    scan = json.loads(r.stdout)["fidelity"]["scan"]
    assert scan["copy"] == floor["copy_scan"] and scan["copy_source"] == COPY_FROM_FLOOR
    assert abs(scan["original"]["blocks"] - scan["copy"]["blocks"]) <= 0.05 * scan["copy"]["blocks"]
    ratio = scan["ratio_copy"]
    assert scan["applies"] == (abs(ratio - 1) > SCAN_BAND) and v["scan"] == scan["status"]
    assert (scan["status"] == "MISSED") == any(x.startswith("modeled scan") for x in v["reasons"])
    # Judged at the first snapshot, a floor measured at the last has no yardstick and no runs'
    # distances to it.
    r = CliRunner().invoke(main, ["replay", *base, "--until", "1", *judge, "--force", rec])
    assert r.exit_code == 0 and "no plain-copy yardstick" in r.output, r.output
    assert "criterion (hdd): unknown (no plain copy" in r.output
    r = CliRunner().invoke(main, ["replay", *base, "--until", "1", *judge, "--tolerance-from",
                                  "original", "--force", rec])  # fmt: skip
    assert r.exit_code != 0 and "compared with snapshot 2, not 1" in r.output
    assert "Traceback" not in r.output
