"""What ``--tolerance-from`` proves, on a history with known hidden churn (checkouts of generated
commits into a loop-mounted ext4, a snapshot every 4). Judged against itself, the snapshot is
as close to the original as reruns are to each other (``spread`` passes it); ``original`` also
asks that the op stream's reruns land on the snapshot, and fails it when they all land off in
the same direction (offline through libext2fs, every rerun lands in one place far from what the
kernel made), naming that shared bias. The runs' distances are measured here from e2freefrag on
the original image and the runs' own free extents, not taken from fsage's fidelity."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from fsage.cli import main
from fsage.db.store import Store
from fsage.layout import Layout
from fsage.replay.fidelity import fidelity
from fsage.replay.noise import noise_floor

from .test_closed_loop import _history


def _e2freefrag_hist(image: Path, block_size: int) -> dict[int, int]:
    """Free blocks per log2 bucket of extent length (in blocks), from e2freefrag's histogram."""
    out = subprocess.run(["e2freefrag", str(image)], capture_output=True, text=True, check=True)
    unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    hist: dict[int, int] = {}
    for lo, u, blocks in re.findall(
        r"^\s*(\d+)([KMG])\.\.\.\s*\S+\s*:\s*\d+\s+(\d+)\s", out.stdout, re.M
    ):
        hist[int(int(lo) * unit[u] // block_size).bit_length() - 1] = int(blocks)
    assert hist, out.stdout
    return hist


def _layout_hist(lay: Layout) -> dict[int, int]:
    lengths = np.asarray(lay.free.length, dtype=np.int64)
    hist: dict[int, int] = {}
    for n in lengths[lengths > 0]:
        k = int(n).bit_length() - 1
        hist[k] = hist.get(k, 0) + int(n)
    return hist


def _tv(a: dict[int, int], b: dict[int, int]) -> float:
    sa, sb = sum(a.values()), sum(b.values())
    return 0.5 * sum(abs(a.get(k, 0) / sa - b.get(k, 0) / sb) for k in set(a) | set(b))


def _judge_self(db: Path, tmp_path: Path, mode: str) -> tuple[float, float, Any, Any, Any]:
    """A floor of three runs of the op stream (``mode``); the runs' mean free-space distance
    to the snapshot and the free tolerance, by e2freefrag and the runs' own free extents; the
    floor and the snapshot judged against itself under each rule."""
    floor, runs = noise_floor(db, "co", runs=3, workdir=tmp_path, mode=mode)
    last = floor.original_snapshot
    assert last is not None
    with Store.open(db) as store:
        original = store.load_layout(last)
    want = _e2freefrag_hist(tmp_path / "o.img", original.facts.block_size)
    # The original's free space as fsage read it is e2freefrag's.
    assert _layout_hist(original) == want
    to_orig = [_tv(want, _layout_hist(run)) for run in runs]
    print(f"{mode}: runs to the original (e2freefrag) {to_orig}")
    same = fidelity(original, original)
    by_spread, by_original = same.judge(floor, "spread"), same.judge(floor, "original")
    # Distance 0: as close to the original as any rerun is to another, whatever the runs do.
    assert by_spread.faithful, by_spread.line()
    return sum(to_orig) / len(to_orig), by_spread.free_tolerance, floor, by_spread, by_original


def _bias_reason(verdict: Any) -> str | None:
    return next((r for r in verdict.reasons if "runs land off the original in free space by "
                 "blocks" in r), None)  # fmt: skip


@pytest.mark.slow
@pytest.mark.needs_root
def test_a_stream_whose_reruns_all_miss_the_free_space_passes_spread_not_original(
    tmp_path: Path,
) -> None:
    db, hidden = _history(tmp_path, 24, 4, 14)
    assert sum(hidden) > 0
    # Offline, every rerun lands in the same place, far from what the kernel made of the
    # history: no spread between the runs, a large shared bias. Judging by the runs' distance
    # to the original would pass anything; ``original`` fails the snapshot itself.
    bias, tol, floor, _, by_original = _judge_self(db, tmp_path, "offline")
    assert bias > tol + 0.05, (bias, tol)
    assert not by_original.faithful, by_original.line()
    reason = _bias_reason(by_original)
    assert reason is not None, by_original.reasons
    m = re.search(r"\(mean \+?(-?[\d.]+)\)", reason)
    assert m and float(m.group(1)) == pytest.approx(bias, abs=0.01), (reason, bias)

    # The same through the command, with the floor as JSON: the rule is what flips the verdict.
    last = str(floor.original_snapshot)
    path = tmp_path / "floor.json"
    path.write_text(json.dumps({"noise_floor": floor.to_json()}))
    base = ["fidelity", last, last, "--db", str(db), "--noise-floor", str(path), "--check"]
    r = CliRunner().invoke(main, [*base, "--tolerance-from", "spread"])
    assert r.exit_code == 0 and "verdict: FAITHFUL" in r.output, r.output
    r = CliRunner().invoke(main, [*base, "--tolerance-from", "original"])
    assert r.exit_code == 3 and "runs land off the original in free space by blocks" in r.output
    assert "Traceback" not in r.output

    # Through the kernel the runs spread (the allocator varies with the machine's load), and
    # the verdict follows their mean distance to the original as e2freefrag measures it.
    bias, tol, _, _, by_original = _judge_self(db, tmp_path, "mount")
    if abs(bias - tol) > 0.01:
        assert (_bias_reason(by_original) is not None) == (bias > tol), (bias, tol)
