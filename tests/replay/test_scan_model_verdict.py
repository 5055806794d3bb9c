"""The scan criterion in the verdict, on layouts made by hand: 60 one-block files scattered (each
read a seek of its own) or laid end to end in name order (one seek for all), their modeled
times worked out from the disk model's definition (positioning + transfer)."""

from __future__ import annotations

import json

import pytest

from fsage.analyzer.diskmodel import get_model
from fsage.layout import Layout
from fsage.replay.fidelity import SCAN_JUDGED, NoiseFloor, fidelity
from fsage.replay.fidelity_scan import (
    COPY_FROM_FLOOR,
    JUDGED_MODEL,
    SCAN_BAND,
    ScanModel,
    contiguous_reads,
    scan_profile,
)

from .synth import BS, F, layout

N = 60


def _tree(place: list[int]) -> Layout:
    """``N`` one-block files f00..f59 in the root, file i at block ``place[i]``."""
    return layout(
        [
            F(100 + i, [(2, f"f{i:02d}".encode())], size=BS, ext=[(0, p, 1)])
            for i, p in enumerate(place)
        ]
    )


def _scattered(seed: int) -> Layout:
    # every file a seek away from the one before it, in other places for each seed
    return _tree([5000 + 97 * ((i * 7 + seed) % N) + seed for i in range(N)])


def _end_to_end() -> Layout:
    return _tree([20000 + i for i in range(N)])


def _transfer_ms(blocks: int) -> float:
    return blocks * BS / get_model(JUDGED_MODEL).bandwidth * 1000.0


def test_a_contiguous_read_pays_one_access_and_the_transfer() -> None:
    hdd = get_model(JUDGED_MODEL)
    copy = _end_to_end()
    prof = scan_profile(contiguous_reads(copy), BS)
    assert prof["seeks"] == 1 and prof["blocks"] == N
    assert prof["seconds"][JUDGED_MODEL] * 1000.0 == pytest.approx(
        hdd.average_access_ms + _transfer_ms(N)
    )
    # the scattered tree: every request seeks, so at least one minimal seek each
    scat = fidelity(_scattered(0), copy).scan
    assert scat is not None
    assert scat.original["seeks"] == N
    assert scat.original["seconds"][JUDGED_MODEL] * 1000.0 > N * hdd.half_rotation_ms
    # the contiguous bound of a tree is its files end to end, wherever they lie
    assert scat.contiguous == prof


def test_without_a_floor_s_plain_copy_the_criterion_is_unknown() -> None:
    fid = fidelity(_scattered(0), _end_to_end())
    v = fid.judge()
    assert fid.scan is not None and fid.scan.copy is None
    assert v.scan == "unknown"
    assert not any("scan" in r for r in v.reasons)
    assert "unknown (no plain copy" in fid.scan.line()


def test_a_recreation_that_scans_like_the_copy_misses_where_the_copy_is_outside_the_band() -> None:
    orig, copy = _scattered(0), _end_to_end()
    floor = NoiseFloor(runs=3)
    floor.add_copy(orig, copy)
    assert floor.copy_scan is not None and floor.copy_scan["seeks"] == 1
    # a recreation laid out like the copy
    like_copy = fidelity(orig, _tree([30000 + i for i in range(N)]))
    v = like_copy.judge(floor)
    assert like_copy.scan is not None
    assert like_copy.scan.copy_source == COPY_FROM_FLOOR
    assert like_copy.scan.applies() and like_copy.scan.status() == "MISSED"
    assert v.scan == "MISSED"
    missed = [r for r in v.reasons if r.startswith("modeled scan time")]
    assert bool(missed) == SCAN_JUDGED
    # a recreation scattered as the original is, elsewhere: within the band
    like_orig = fidelity(orig, _scattered(1))
    v2 = like_orig.judge(floor)
    assert like_orig.scan is not None
    r = like_orig.scan.ratio("recreated")
    assert r is not None and abs(r - 1) <= SCAN_BAND
    assert v2.scan == "met"
    assert not any(x.startswith("modeled scan time") for x in v2.reasons)
    # both in the JSON and the text
    out = like_copy.to_json()
    assert out["scan"]["status"] == "MISSED" and out["verdict"]["scan"] == "MISSED"
    assert json.loads(json.dumps(out, default=str))["scan"]["ratio_copy"] < 1 - SCAN_BAND
    assert any(line.startswith("modeled cold path-order scan") for line in like_copy.lines())


def test_the_criterion_does_not_apply_where_the_copy_scans_as_the_original_does() -> None:
    orig = _scattered(0)
    floor = NoiseFloor(runs=3)
    floor.add_copy(orig, _scattered(2))  # a "copy" as scattered as the original
    fid = fidelity(orig, _end_to_end())
    v = fid.judge(floor)
    assert fid.scan is not None and fid.scan.status() == "does not apply"
    assert v.scan == "does not apply"
    assert not any(r.startswith("modeled scan time") for r in v.reasons)


def test_a_floor_keeps_its_copy_s_scan_for_its_own_snapshot_only() -> None:
    floor = NoiseFloor(runs=3, original_snapshot=7, to_original=[{"dynamic": 0.0}])
    floor.add_copy(_scattered(0), _end_to_end())
    back = NoiseFloor.from_json(json.loads(json.dumps(floor.to_json())))
    assert back.copy_scan == floor.copy_scan
    assert back.for_snapshot(7).copy_scan == floor.copy_scan
    assert back.for_snapshot(8).copy_scan is None
    # a floor stored before the copy's scan was kept has none
    old = floor.to_json()
    del old["copy_scan"]
    assert NoiseFloor.from_json(old).copy_scan is None


def test_a_scan_model_reads_back_from_json() -> None:
    fid = fidelity(_scattered(0), _end_to_end())
    assert fid.scan is not None
    back = ScanModel.from_json(json.loads(json.dumps(fid.scan.to_json())))
    assert back is not None and back.to_json() == fid.scan.to_json()
    assert ScanModel.from_json(None) is None
