"""The fidelity verdict: tolerances from a noise floor, judged buckets, counts of symlinks and
other inodes, and the exit status of --check."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from fsage.cli import main
from fsage.db.store import Store
from fsage.layout import FreeExtents, Layout
from fsage.replay.fidelity import NoiseFloor, fidelity, noise_between
from fsage.text import size_range

from .synth import F, layout


def _many(n: int, base: int, *, split: int, size_blocks: int = 4) -> list[F]:
    """``n`` files of ``size_blocks`` blocks under the root; the first ``split`` of them in two
    pieces (a seek inside), the rest contiguous."""
    out = []
    for i in range(n):
        phys = 1000 + 10 * i
        ext = (
            [(0, phys, 2), (2, phys + 5000, size_blocks - 2)]
            if i < split
            else [(0, phys, size_blocks)]
        )
        out.append(F(base + i, [(2, f"f{i:03d}".encode())], size=size_blocks * 4096, ext=ext))
    return out


def _free(lay: Layout, runs: list[tuple[int, int]]) -> Layout:
    lay.free = FreeExtents(
        np.array([r[0] for r in runs], np.uint64), np.array([r[1] for r in runs], np.uint64)
    )
    return lay


def test_verdict_uses_the_larger_of_floor_and_minimum() -> None:
    # 60 files of 4 blocks (bucket 3-4): 3 scored blocks each, 180 in all.
    orig = _free(layout(_many(60, 100, split=0)), [(0, 8)])
    # 6 files split once: 6 of 180 blocks not contiguous -> score 1 - 6/180 = 0.9667.
    rec = _free(layout(_many(60, 100, split=6)), [(0, 8)])
    fid = fidelity(orig, rec)
    v = fid.judge(None)
    row = fid.by_size[0]
    assert row["files_original"] == 60 and row["judged"]
    assert row["difference"] == pytest.approx(-6 / 180)
    assert row["tolerance"] == 0.02 and not row["within"]
    assert not v.faithful and f"files of {size_range(3, 4, orig.facts.block_size)}" in v.reasons[0]
    # A measured floor of 0.035 in that bucket makes the same distance acceptable.
    v = fid.judge(NoiseFloor(by_bucket={3: 0.035}, free_tv=0.0, runs=2, dynamic=0.035))
    assert v.faithful, v.reasons
    assert fid.by_size[0]["tolerance"] == 0.035
    # A wider floor widens it no further than twice the fixed bound.
    fid.judge(NoiseFloor(by_bucket={3: 0.05}, free_tv=0.0, runs=2))
    assert fid.by_size[0]["tolerance"] == 0.04 and fid.by_size[0]["noise_floor"] == 0.05


def test_small_buckets_are_shown_not_judged() -> None:
    orig = layout(_many(49, 100, split=0))
    rec = layout(_many(49, 100, split=49))  # every file worse, but only 49 files
    fid = fidelity(orig, rec)
    assert fid.judge().faithful
    assert fid.by_size[0]["judged"] is False and fid.by_size[0]["within"] is None


def test_free_space_tolerance_is_floor_plus_a_tenth() -> None:
    # 36 of 37 free blocks in 4-7 against 8 of 18; 9 of 10 free extents in 4-7 against 2 of 12.
    orig = _free(layout([]), [(10 * i, 4) for i in range(9)] + [(100, 1)])
    rec = _free(layout([]), [(10 * i, 1) for i in range(10)] + [(200, 4), (210, 4)])
    fid = fidelity(orig, rec)
    tv, count_tv = fid.free_tv_distance, fid.free_extents_distance
    assert tv == pytest.approx(0.5 * (abs(1 / 37 - 10 / 18) + abs(36 / 37 - 8 / 18)))
    # By extents: 9 extents of 1 block and 7 of 4 appear or go, of 22 in both.
    assert count_tv == pytest.approx(16 / 22)
    assert not fid.judge().faithful

    def floor(blocks: float, extents: float) -> NoiseFloor:
        return NoiseFloor(free_tv=blocks - 0.1, free_extents=extents - 0.1, runs=2)

    v = fid.judge(floor(0.15, 0.17))
    assert v.reasons == [
        f"free space by blocks: distance {tv:.3f}, tolerance 0.150",
        f"free space by extents: distance {count_tv:.3f}, tolerance 0.170",
    ]
    # Runs that spread as far as the distance do not make it pass: the spread widens a
    # tolerance to twice its fixed bound at most.
    v = fid.judge(floor(tv + 1e-9, count_tv + 1e-9))
    assert v.reasons == [
        f"free space by blocks: distance {tv:.3f}, tolerance 0.200",
        f"free space by extents: distance {count_tv:.3f}, tolerance 0.200",
    ]


def test_a_missing_symlink_or_fifo_is_not_matched() -> None:
    common = [F(10, [(2, b"a")], size=4096, ext=[(0, 50, 1)])]
    orig = layout([*common, F(11, [(2, b"ln")], size=7, kind="symlink"),
                   F(12, [(2, b"pipe")], kind="fifo")])  # fmt: skip
    rec = layout([*common, F(13, [(2, b"pipe")], kind="fifo")])
    fid = fidelity(orig, rec)
    assert (fid.symlinks_original, fid.symlinks_matched) == (1, 0)
    assert (fid.others_original, fid.others_matched) == (1, 1)
    assert (fid.files_original, fid.files_matched) == (1, 1)
    v = fid.judge()
    assert not v.faithful and v.reasons == ["symlinks matched 0 of 1"]
    # The same type is needed: a symlink where the original had a FIFO does not match.
    rec2 = layout([*common, F(11, [(2, b"ln")], size=7, kind="symlink"),
                   F(13, [(2, b"pipe")], size=7, kind="symlink")])  # fmt: skip
    fid2 = fidelity(orig, rec2)
    assert (fid2.others_matched, fid2.symlinks_matched, fid2.symlinks_recreated) == (0, 1, 2)
    assert not fid2.judge().faithful


def test_noise_between_takes_the_largest_pairwise_difference() -> None:
    a = _free(layout(_many(60, 100, split=0)), [(0, 8)])
    b = _free(layout(_many(60, 100, split=3)), [(0, 8)])
    c = _free(layout(_many(60, 100, split=9)), [(0, 4), (20, 4)])
    floor = noise_between([a, b, c])
    assert floor.runs == 3
    assert floor.by_bucket[3] == pytest.approx(9 / 180)
    assert floor.free_tv == pytest.approx(1.0)
    again = NoiseFloor.from_json(json.loads(json.dumps({"noise_floor": floor.to_json()})))
    assert again.by_bucket == floor.by_bucket and again.free_tv == floor.free_tv


def test_fidelity_command_check_exit_status(tmp_path: Path) -> None:
    db = tmp_path / "f.db"
    orig = layout(_many(60, 100, split=0))
    rec = layout(_many(60, 100, split=6))
    rec.facts.uuid = "00000000-0000-0000-0000-000000000002"
    with Store.open(db, create=True) as store:
        a = store.add_snapshot(orig, name="orig").snapshot_id
        b = store.add_snapshot(rec, name="rec").snapshot_id
    r = CliRunner().invoke(main, ["fidelity", str(a), str(b), "--db", str(db), "--check"])
    assert r.exit_code == 3, r.output
    label = size_range(3, 4, orig.facts.block_size)
    assert "outside tolerance" in r.output and f"files of {label}" in r.output
    floor = tmp_path / "floor.json"
    wide = NoiseFloor({3: 0.05}, 0.0, 2, dynamic=0.05)
    floor.write_text(json.dumps({"noise_floor": wide.to_json()}))
    r = CliRunner().invoke(
        main, ["fidelity", str(a), str(b), "--db", str(db), "--check", "--noise-floor", str(floor)]
    )
    assert r.exit_code == 0, r.output
    assert "FAITHFUL" in r.output
    r = CliRunner().invoke(main, ["fidelity", str(a), str(b), "--db", str(db), "--format", "json"])
    data = json.loads(r.output)
    assert data["verdict"]["faithful"] is False and data["symlinks_original"] == 0
    floor.write_text("{}")
    r = CliRunner().invoke(
        main, ["fidelity", str(a), str(b), "--db", str(db), "--noise-floor", str(floor)]
    )
    assert r.exit_code != 0 and "fsage: error: not a noise floor" in r.output


def test_noise_floor_buckets_are_labelled_in_bytes_like_analyze() -> None:
    floor = NoiseFloor(by_bucket={5: 0.01, 1: 0.0, 3: 0.02}, free_tv=0.1, runs=3)
    rows = floor.labelled(1024)
    # Smallest first; each label is the bucket's own (1 block; 3-4 blocks; 5-8 blocks).
    assert [d for _, d in rows] == [0.0, 0.02, 0.01]
    assert [label for label, _ in rows] == [
        size_range(1, 1, 1024),
        size_range(3, 4, 1024),
        size_range(5, 8, 1024),
    ]
    assert rows[1][0] != floor.labelled(4096)[1][0]
