"""How reliable the verdict is: floors that record how many runs they rest on and how wide they
are, the rule that judges by the runs' distance to the original, verdicts that flip with the
floor, and an unaged copy of a small real history judged not faithful."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from fsage.cli import main
from fsage.db.store import Store
from fsage.errors import UsageError
from fsage.layout import FreeExtents, Layout
from fsage.replay.fidelity import NoiseFloor, fidelity, noise_between

from .synth import layout


def _free(runs: list[tuple[int, int]]) -> Layout:
    """A layout with no files and these free extents (start, length)."""
    lay = layout([])
    lay.free = FreeExtents(
        np.array([r[0] for r in runs], np.uint64), np.array([r[1] for r in runs], np.uint64)
    )
    return lay


# Free space in 8-block extents (original), in single blocks (runs of a biased op stream) and
# half of each (a run between them).
ORIGINAL = [(100 * i, 8) for i in range(8)]
SMALL = [(100 * i + 3 * j, 1) for i in range(8) for j in range(8)]
HALF = [(100 * i, 8) for i in range(4)] + [(1000 + 3 * j, 1) for j in range(32)]


def test_a_floor_records_its_pairs_and_each_runs_distance_to_the_original() -> None:
    orig = _free(ORIGINAL)
    runs = [_free(SMALL), _free(SMALL), _free(HALF)]
    floor = noise_between(runs, "three runs")
    assert floor.runs == 3 and len(floor.free_tv_pairs) == 3
    assert sorted(floor.free_tv_pairs) == pytest.approx([0.0, 0.5, 0.5])
    assert floor.free_tv == pytest.approx(0.5)
    # How much one run decides the floor: without the third, the two left agree (0).
    assert floor.free_tv_without_one() == pytest.approx((0.0, 0.5))
    assert noise_between(runs[:2]).free_tv_without_one() is None
    assert floor.original_snapshot is None
    floor.add_original(orig, runs, 7)
    assert floor.original_snapshot == 7
    assert floor.to_original_free_tv == pytest.approx([1.0, 1.0, 0.5])
    again = NoiseFloor.from_json(json.loads(json.dumps({"noise_floor": floor.to_json()})))
    assert again == floor
    # A floor saved before the runs were compared with the original still loads, and says
    # what is missing when asked to judge by the original.
    old = {k: v for k, v in floor.to_json().items() if k in ("by_bucket", "free_tv", "runs")}
    legacy = NoiseFloor.from_json(old)
    assert legacy.free_tv == floor.free_tv and legacy.original_snapshot is None
    with pytest.raises(UsageError, match="no distances to the original"):
        fidelity(orig, orig).judge(legacy, "original")
    # A floor that kept only each run's largest distance to the original (which the original
    # rule once took as tolerance) has no signed distances to judge a bias by either.
    kept = {
        **old,
        "original_snapshot": 7,
        "to_original_by_bucket": {},
        "to_original_free_tv": [1.0],
    }
    assert NoiseFloor.from_json(kept).original_snapshot is None
    assert NoiseFloor.from_json(kept).copy is None


def test_runs_that_agree_with_each_other_but_not_with_the_original_pass_nothing() -> None:
    # The op stream's runs land together (0 apart), all far from the original: a recreation
    # like them is as far from the original as they are, and no rule takes that bias as
    # tolerance.
    orig, rec = _free(ORIGINAL), _free(SMALL)
    runs = [_free(SMALL), _free(SMALL)]
    floor = noise_between(runs)
    floor.add_original(orig, runs, 1)
    fid = fidelity(orig, rec)
    assert fid.free_tv_distance == pytest.approx(1.0)
    for rule in ("spread", "original"):
        v = fid.judge(floor, rule)
        assert not v.faithful and v.free_tolerance == pytest.approx(0.1), rule
        assert "free space by blocks: distance 1.000, tolerance 0.100" in v.reasons
    by_original = fid.judge(floor, "original")
    assert (
        "the op stream's runs land off the original in free space by blocks: +1.000 to +1.000 "
        "(mean +1.000), tolerance 0.100" in by_original.reasons
    )
    assert "original of 2 runs" in by_original.line()
    assert "runs to snapshot 1 1.000-1.000" in by_original.line()
    assert by_original.to_json()["basis"] == by_original.basis()
    assert by_original.to_json()["rule"] == "original"


def test_the_verdict_flips_when_more_runs_widen_the_floor() -> None:
    # Two runs that happened to land together give a floor of 0; a third run shows the spread.
    orig, rec = _free(SMALL), _free(HALF)
    fid = fidelity(orig, rec)
    two = noise_between([_free(SMALL), _free(SMALL)])
    three = noise_between([_free(SMALL), _free(SMALL), _free(HALF)])
    assert fid.judge(two).reasons[0].endswith("tolerance 0.100")
    # The wider floor widens the tolerance, to twice the fixed bound at most: a distance of 0.5
    # is far however widely three runs spread.
    assert fid.judge(three).reasons[0] == "free space by blocks: distance 0.500, tolerance 0.200"
    # The verdict says how many runs its floor rests on and how wide their distances are.
    line = fid.judge(two).line()
    assert "2 runs (few" in line and "between runs 0.000-0.000" in line, line
    assert "3 runs (few" in fid.judge(three).line()
    assert "no measured noise floor" in fid.judge(None).line()


def test_fidelity_command_judges_by_the_original_only_against_that_snapshots_floor(
    tmp_path: Path,
) -> None:
    db = tmp_path / "f.db"
    orig, rec = _free(ORIGINAL), _free(SMALL)
    rec.facts.uuid = "00000000-0000-0000-0000-000000000002"
    with Store.open(db, create=True) as store:
        a = store.add_snapshot(orig, name="orig").snapshot_id
        b = store.add_snapshot(rec, name="rec").snapshot_id
    # Runs as close to each other as to the original's own free space (0 apart from it): the
    # recreation b is judged by them alike under both rules.
    runs = [_free(ORIGINAL), _free(ORIGINAL)]
    floor = noise_between(runs)
    floor.add_original(orig, runs, a)
    path = tmp_path / "floor.json"
    path.write_text(json.dumps({"noise_floor": floor.to_json()}))
    base = ["fidelity", str(a), str(b), "--db", str(db), "--noise-floor", str(path), "--check"]
    r = CliRunner().invoke(main, base)
    assert r.exit_code == 3, r.output
    r = CliRunner().invoke(main, [*base, "--tolerance-from", "original"])
    assert r.exit_code == 3, r.output
    assert "runs to snapshot" in r.output and "land off" not in r.output
    same = ["fidelity", str(a), str(a), "--db", str(db), "--noise-floor", str(path), "--check"]
    r = CliRunner().invoke(main, [*same, "--tolerance-from", "original"])
    assert r.exit_code == 0 and "verdict: FAITHFUL" in r.output, r.output
    # The floor's runs were compared with snapshot a: judging b as an original is refused.
    r = CliRunner().invoke(
        main,
        ["fidelity", str(b), str(a), "--db", str(db), "--noise-floor", str(path),
         "--tolerance-from", "original"],
    )  # fmt: skip
    assert r.exit_code != 0 and f"compared with snapshot {a}, not {b}" in r.output
    assert "Traceback" not in r.output


@pytest.mark.slow
@pytest.mark.needs_root
def test_an_unaged_copy_of_a_small_release_history_is_not_faithful(tmp_path: Path) -> None:
    from fsage.replay.noise import noise_floor
    from fsage.replay.unaged import fresh_copy
    from fsage.replay.unpack import history_size, unpack_history

    from .test_real_history import MIB, _releases

    tars = _releases(tmp_path, 6)
    batches = [[("proj", t)] for t in tars]
    need, _ = history_size(batches, 1024)
    size = int(need / 0.85) + 4096 * 256 + (2 << 20)
    hist = unpack_history(batches, tmp_path / "o.img", tmp_path / "h.db", "proj",
                          block_size=1024, size=size, inodes=4096)  # fmt: skip
    assert size > 3 * MIB
    db, last = tmp_path / "h.db", hist.snapshot_ids[-1]
    floor, runs = noise_floor(db, "proj", runs=3, workdir=tmp_path)
    with Store.open(db) as store:
        original = store.load_layout(last)
    floor.add_original(original, runs, last)
    fresh = fresh_copy(db, "proj", None, tmp_path)
    assert list(tmp_path.glob("fsage-fresh-*")) == []
    fid = fidelity(original, fresh)
    assert fid.files_matched == fid.files_original > 250
    # Written in one go, its free space is one piece or a few: far beyond any floor.
    assert fid.free_recreated["free_extent_count"] < fid.free_original["free_extent_count"]
    for rule in ("spread", "original"):
        v = fid.judge(floor, rule)
        assert not v.faithful, (rule, floor.to_json())
        assert any(r.startswith("free space by") for r in v.reasons), v.reasons
