"""How far the runs' spread may widen a tolerance: never past twice its fixed bound, never to
half a plain copy's distance, so a wide spread between a few runs cannot pass a recreation that
is far from the original."""

from __future__ import annotations

import pytest

from fsage.replay.verdict import (
    DYNAMIC,
    FREE_BLOCKS,
    FREE_EXTENTS,
    NoiseFloor,
    allowed_noise,
    judge_distances,
)

JUDGED = {
    "bucket:3": "files of 3-4 blocks",
    FREE_BLOCKS: "free space by blocks",
    FREE_EXTENTS: "free space by extents",
    DYNAMIC: "path-order dynamic layout score",
}


def _near(**over: float) -> dict[str, float]:
    """Distances within every fixed bound, but those given."""
    return {"bucket:3": 0.0, FREE_BLOCKS: 0.05, FREE_EXTENTS: 0.05, DYNAMIC: 0.0, **over}


def test_a_wide_three_run_floor_does_not_pass_a_stream_far_off_in_free_space() -> None:
    # Three runs of an open-loop stream, 0.18 apart in free space by blocks, all landing
    # 0.25-0.30 from the original; the replay judged lands 0.276 off, a plain copy 0.8. The
    # spread once made the tolerance 0.28 and passed it.
    floor = NoiseFloor(free_tv=0.18, free_extents=0.05, runs=3)
    floor.original_snapshot = 7
    floor.to_original = [_near(free_blocks=x) for x in (0.25, 0.27, 0.30)]
    floor.copy = {"bucket:3": 0.1, FREE_BLOCKS: 0.8, FREE_EXTENTS: 0.7, DYNAMIC: 0.1}
    for rule in ("spread", "original"):
        v = judge_distances(_near(free_blocks=0.276), JUDGED, floor, rule)
        assert not v.faithful, rule
        assert v.reasons[0] == "free space by blocks: distance 0.276, tolerance 0.200"
        assert v.free_tolerance == pytest.approx(0.2)
    # Without a copy to measure by, the same bound holds.
    floor.copy = None
    assert not judge_distances(_near(free_blocks=0.276), JUDGED, floor).faithful


def test_the_spread_widens_a_tolerance_up_to_the_bounds() -> None:
    floor = NoiseFloor(by_bucket={3: 0.03}, free_tv=0.04, free_extents=0.0, dynamic=0.03, runs=5)
    # Within the runs' spread, wider than the fixed bounds: passes.
    v = judge_distances(_near(**{"bucket:3": -0.028, "free_blocks": 0.13, "dynamic": 0.029}),
                        JUDGED, floor)  # fmt: skip
    assert v.faithful, v.reasons
    assert allowed_noise("bucket:3", 0.03) == pytest.approx(0.03)
    assert allowed_noise("bucket:3", 0.3) == pytest.approx(0.04)
    assert allowed_noise(FREE_BLOCKS, 0.3) == pytest.approx(0.1)
    assert allowed_noise(FREE_BLOCKS, 0.3, copy=0.3) == pytest.approx(0.05)
    # A copy closer than twice the fixed bound: the fixed bound stands, the spread adds nothing.
    assert allowed_noise("bucket:3", 0.03, copy=0.03) == pytest.approx(0.02)
    assert allowed_noise(FREE_BLOCKS, 0.5, copy=0.1) == pytest.approx(0.0)


def test_a_distance_half_a_copys_is_far_however_the_runs_spread() -> None:
    # Runs 0.035 apart in a bucket whose plain copy lands 0.05 off: the spread would take the
    # tolerance to 0.035, but a replay 0.03 off is more than half-way to the copy.
    floor = NoiseFloor(by_bucket={3: 0.035}, free_tv=0.08, runs=5)
    floor.copy = {"bucket:3": 0.05, FREE_BLOCKS: 0.3, FREE_EXTENTS: 0.3, DYNAMIC: 0.0}
    v = judge_distances(_near(**{"bucket:3": 0.03}), JUDGED, floor)
    assert v.reasons == ["files of 3-4 blocks: distance +0.030, tolerance 0.025"]
    # Free space: runs 0.08 apart would allow 0.18; half the copy's 0.3 is 0.15.
    v = judge_distances(_near(free_blocks=0.16), JUDGED, floor)
    assert v.reasons == ["free space by blocks: distance 0.160, tolerance 0.150"]
    assert judge_distances(_near(free_blocks=0.14), JUDGED, floor).faithful
    # The place between a rerun and the copy uses the same allowance: 0.16 lies
    # (0.16 - 0.05) / (0.3 - 0.05) of the way.
    assert v.copy_relative == pytest.approx(0.11 / 0.25)
