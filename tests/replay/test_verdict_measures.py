"""What the verdict judges beyond the size buckets, each checked against values worked out by
hand from the definitions: free space by extent counts as well as by blocks, the path-order
dynamic layout score, a shared bias of the runs under ``--tolerance-from original``, and the
plain copy as yardstick."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from fsage.cli import main
from fsage.db.store import Store
from fsage.layout import FreeExtents, Layout
from fsage.replay.fidelity import NoiseFloor, fidelity

from .synth import F, layout

BIG = 16384  # blocks: one 64 MiB free extent (4 KiB blocks)


def _free(lay: Layout, runs: list[tuple[int, int]]) -> Layout:
    lay.free = FreeExtents(
        np.array([r[0] for r in runs], np.uint64), np.array([r[1] for r in runs], np.uint64)
    )
    return lay


def _small_and_big(small: int) -> list[tuple[int, int]]:
    """``small`` free extents of 4 blocks and one of ``BIG`` blocks."""
    return [(10 * i, 4) for i in range(small)] + [(100_000, BIG)]


def test_free_space_is_judged_by_extent_counts_when_one_extent_holds_the_blocks() -> None:
    # The original: 128 small free extents beside one large one; the recreation: 5 beside the
    # same large one. By blocks the large extent decides (97% and 99.9% of the free blocks);
    # by extents 123 of the 135 extents of both would have to appear or go.
    orig = _free(layout([]), _small_and_big(128))
    rec = _free(layout([]), _small_and_big(5))
    fid = fidelity(orig, rec)
    small_o, small_r = 512 / (512 + BIG), 20 / (20 + BIG)
    assert fid.free_tv_distance == pytest.approx(small_o - small_r)
    assert fid.free_tv_distance < 0.1
    assert fid.free_extents_distance == pytest.approx(123 / 135)
    v = fid.judge()
    assert not v.faithful
    assert v.reasons == [f"free space by extents: distance {123 / 135:.3f}, tolerance 0.100"]
    # The same number of small extents in other places passes both.
    # Spread alike over the buckets but half as many (a distance between the distributions
    # would call them the same): 64 small extents beside a large one half as large.
    orig2 = _free(layout([]), [(10 * i, 4) for i in range(128)] + [(100_000, 32_000)])
    half = _free(layout([]), [(10 * i, 4) for i in range(64)] + [(100_000, 16_400)])
    fewer = fidelity(orig2, half)
    assert fewer.free_tv_distance == pytest.approx(512 / 32_512 - 256 / 16_656)
    assert fewer.free_extents_distance == pytest.approx(64 / 194)
    assert not fewer.judge().faithful
    moved = _free(layout([]), [(20 * i + 3, 4) for i in range(128)] + [(200_000, BIG)])
    assert fidelity(orig, moved).judge().faithful


def test_a_plain_copys_few_free_extents_never_pass_even_a_wide_block_floor() -> None:
    orig = _free(layout([]), _small_and_big(128))
    copy = _free(layout([]), [(0, 3), (50, BIG), (200_000, 200)])  # 3 free extents
    fid = fidelity(orig, copy)
    # A floor as wide by blocks as the copy's distance still leaves the extents judged.
    v = fid.judge(NoiseFloor(free_tv=fid.free_tv_distance, runs=5))
    assert not v.faithful
    assert [r.split(":")[0] for r in v.reasons] == ["free space by extents"]


def _row(n: int, order: list[int], base: int = 1000) -> list[F]:
    """``n`` contiguous files of 4 blocks in one directory, named f000...; file ``order[k]``
    placed ``k``-th on disk, back to back."""
    place = {i: base + 4 * k for k, i in enumerate(order)}
    return [
        F(100 + i, [(2, f"f{i:03d}".encode())], size=4 * 4096, ext=[(0, place[i], 4)])
        for i in range(n)
    ]


def test_locality_alone_changes_the_verdict() -> None:
    # Every file contiguous in both, so every size bucket scores 1.0 in both and the free
    # space is the same; only the order of the files on disk differs. Read in path order the
    # original is one stream of 240 blocks (1 request that does not follow another); the
    # reversed copy makes every one of the 60 files a jump.
    n = 60
    orig = _free(layout(_row(n, list(range(n)))), [(0, 8)])
    rec = _free(layout(_row(n, list(reversed(range(n))))), [(0, 8)])
    fid = fidelity(orig, rec)
    assert [r["layout_score_recreated"] for r in fid.by_size] == [1.0]
    assert fid.dynamic_score_original == pytest.approx(1 - 1 / 240)
    assert fid.dynamic_score_recreated == pytest.approx(1 - 60 / 240)
    v = fid.judge()
    assert v.reasons == [
        f"path-order dynamic layout score: distance {-59 / 240:+.3f}, tolerance 0.020"
    ]
    # A floor whose runs differed a little in locality widens the tolerance; one whose runs
    # differed as much does not let it pass (twice the fixed bound at most).
    v = fid.judge(NoiseFloor(runs=5, dynamic=0.03))
    assert v.reasons[0].endswith("tolerance 0.030")
    v = fid.judge(NoiseFloor(runs=5, dynamic=59 / 240 + 1e-9))
    assert v.reasons == [
        f"path-order dynamic layout score: distance {-59 / 240:+.3f}, tolerance 0.040"
    ]
    # Below MIN_BUCKET_FILES files the dynamic score is shown, not judged.
    few = fidelity(layout(_row(40, list(range(40)))), layout(_row(40, list(range(40))[::-1])))
    assert few.judge().faithful


def _scored(split: int, n: int = 60) -> Layout:
    """``n`` files of 4 blocks, the first ``split`` of them in two pieces: layout score
    1 - split/180 (3 scored blocks a file)."""
    files = []
    for i in range(n):
        phys = 1000 + 10 * i
        ext = [(0, phys, 2), (2, phys + 5000, 2)] if i < split else [(0, phys, 4)]
        files.append(F(100 + i, [(2, f"f{i:03d}".encode())], size=4 * 4096, ext=ext))
    return _free(layout(files), [(0, 8)])


def _floor(orig: Layout, runs: list[Layout]) -> NoiseFloor:
    from fsage.replay.fidelity import noise_between

    floor = noise_between(runs)
    floor.add_original(orig, runs, 1)
    return floor


def test_a_systematically_biased_stream_is_not_passed() -> None:
    orig = _scored(9)  # 0.950
    # The stream's reruns land 1/180 apart from each other and 8-9/180 above the original.
    biased = _floor(orig, [_scored(0), _scored(1)])
    assert biased.by_bucket[3] == pytest.approx(1 / 180)
    assert biased.bias("bucket:3") == pytest.approx(8.5 / 180)
    like_runs = fidelity(orig, _scored(0))
    for rule in ("spread", "original"):
        v = like_runs.judge(biased, rule)
        assert not v.faithful, rule
        assert any(r.startswith(f"files of {like_runs.by_size[0]['label']}") for r in v.reasons)
    # A recreation that happens to land on the original: as close as a rerun (spread), but
    # its stream does not reproduce the original (original).
    lucky = fidelity(orig, _scored(9))
    assert lucky.judge(biased, "spread").faithful
    v = lucky.judge(biased, "original")
    assert not v.faithful
    label = lucky.by_size[0]["label"]
    assert (
        f"the op stream's runs land off the original in files of {label}: +0.044 to +0.050 "
        f"(mean +0.047), tolerance 0.020" in v.reasons
    )
    # Runs on both sides of the original: both rules pass a recreation among them.
    fair = _floor(orig, [_scored(7), _scored(11)])
    assert fair.bias("bucket:3") == pytest.approx(0.0)
    among = fidelity(orig, _scored(8))
    assert among.judge(fair, "spread").faithful
    assert among.judge(fair, "original").faithful


def test_the_verdict_places_a_recreation_between_a_rerun_and_a_plain_copy() -> None:
    orig = _scored(0)
    # Runs 3/180 apart; a copy 30/180 off; a recreation 12/180 off: (12-3)/(30-3) = 1/3.
    floor = NoiseFloor(by_bucket={3: 3 / 180}, runs=5, dynamic=1.0, free_extents=1.0)
    floor.copy = {"bucket:3": 30 / 180, "free_blocks": 0.0, "free_extents": 0.0}
    v = fidelity(orig, _scored(12)).judge(floor)
    assert not v.faithful
    label = fidelity(orig, orig).by_size[0]["label"]
    assert v.copy_relative == pytest.approx(1 / 3) and v.copy_worst == f"files of {label}"
    assert v.copy_passes is False
    assert "0.33 of the way from a rerun to a plain copy (0 = as good as a rerun, 1 = no " in (
        v.line()
    )
    # Within the runs' noise: 0; as far as the copy: 1; farther: more than 1.
    assert fidelity(orig, _scored(2)).judge(floor).copy_relative == 0.0
    assert fidelity(orig, _scored(30)).judge(floor).copy_relative == pytest.approx(1.0)
    assert fidelity(orig, _scored(48)).judge(floor).copy_relative == pytest.approx(45 / 27)
    # A distance where the copy is within tolerance cannot place anything (a rerun may differ
    # as much), even when it lies beyond the runs' noise.
    near = NoiseFloor(by_bucket={3: 0.0}, runs=5, dynamic=1.0, free_extents=1.0)
    near.copy = {"bucket:3": 3 / 180, "free_blocks": 0.0, "free_extents": 0.0, "dynamic": 0.0}
    v = fidelity(orig, _scored(2)).judge(near)
    assert v.copy_relative is None and v.copy_passes
    # Tolerances wide enough to pass the copy judge nothing faithful: only a copy within the
    # fixed bounds can pass (the runs' spread never widens a tolerance to half the copy's
    # distance).
    close = NoiseFloor(by_bucket={3: 0.0}, runs=5, free_tv=0.0, free_extents=0.0)
    close.copy = {"bucket:3": 0.01, "free_blocks": 0.05, "free_extents": 0.05, "dynamic": 0.0}
    v = fidelity(orig, orig).judge(close)
    assert not v.faithful and v.copy_passes
    assert v.reasons == [
        "a plain copy is within these tolerances too: they cannot tell a recreation from a copy"
    ]
    wide = NoiseFloor(by_bucket={3: 0.2}, runs=5, dynamic=1.0)
    wide.copy = floor.copy
    v = fidelity(orig, orig).judge(wide)
    assert v.faithful and v.copy_passes is False


def test_fidelity_command_shows_the_yardstick_only_for_the_floors_snapshot(
    tmp_path: Path,
) -> None:
    db = tmp_path / "f.db"
    orig, rec = _scored(0), _scored(12)
    rec.facts.uuid = "00000000-0000-0000-0000-000000000002"
    with Store.open(db, create=True) as store:
        a = store.add_snapshot(orig, name="orig").snapshot_id
        b = store.add_snapshot(rec, name="rec").snapshot_id
    floor = NoiseFloor(by_bucket={3: 3 / 180}, runs=5, dynamic=1.0, free_extents=1.0)
    floor.original_snapshot = a
    floor.to_original = [{"bucket:3": 0.0}]
    floor.copy = {"bucket:3": 30 / 180}
    path = tmp_path / "floor.json"
    path.write_text(json.dumps({"noise_floor": floor.to_json()}))
    r = CliRunner().invoke(
        main, ["fidelity", str(a), str(b), "--db", str(db), "--noise-floor", str(path),
               "--format", "json"],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    v = json.loads(r.output)["verdict"]
    assert v["faithful"] is False and v["copy_relative"] == pytest.approx(1 / 3)
    # Judging another snapshot, the copy measured at a is no yardstick.
    r = CliRunner().invoke(
        main, ["fidelity", str(b), str(a), "--db", str(db), "--noise-floor", str(path)]
    )
    assert r.exit_code == 0, r.output
    assert "no plain-copy yardstick" in r.output
