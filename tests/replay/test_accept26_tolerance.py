"""What ``--tolerance-from`` proves, on a history with known hidden churn (checkouts of generated
commits, a snapshot every 4): the open loop's reruns all land off the snapshot's free space in
the same direction, since none of them can see the rewrites between snapshots. Judged against
itself, the snapshot is as close to the original as reruns are to each other (``spread``
passes it), but the op stream does not reproduce it (``original`` fails it, naming the runs'
shared bias). The runs' distances are measured here from e2freefrag on the original image and
the runs' own free extents, not taken from fsage's fidelity."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

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


@pytest.mark.slow
@pytest.mark.needs_root
def test_a_stream_whose_reruns_all_miss_the_free_space_passes_spread_not_original(
    tmp_path: Path,
) -> None:
    db, hidden = _history(tmp_path, 24, 4, 14)
    assert sum(hidden) > 0
    floor, runs = noise_floor(db, "co", runs=3, workdir=tmp_path)
    last = floor.original_snapshot
    assert last is not None
    with Store.open(db) as store:
        original = store.load_layout(last)
    bs = original.facts.block_size
    want = _e2freefrag_hist(tmp_path / "o.img", bs)
    # The original's free space as fsage read it is e2freefrag's.
    assert _layout_hist(original) == want
    to_orig = [_tv(want, _layout_hist(run)) for run in runs]
    bias = sum(to_orig) / len(to_orig)
    print(f"runs to the original (e2freefrag): {to_orig}")
    same = fidelity(original, original)
    by_spread = same.judge(floor, "spread")
    assert by_spread.faithful, by_spread.line()
    by_original = same.judge(floor, "original")
    tol = by_spread.free_tolerance
    # The hidden rewrites leave the snapshot's free space more broken up than any rerun of the
    # visible ops does, run after run.
    assert min(to_orig) > 0.05 and bias > tol, (to_orig, tol)
    assert not by_original.faithful, by_original.line()
    shared = [r for r in by_original.reasons if "free space by blocks" in r]
    assert shared and shared[0].startswith("the op stream's runs land off the original"), shared
    m = re.search(r"\(mean \+?(-?[\d.]+)\)", shared[0])
    assert m and float(m.group(1)) == pytest.approx(bias, abs=0.01), (shared[0], to_orig)

    # The same through the command, with the floor as JSON: the rule is what flips the verdict.
    path = tmp_path / "floor.json"
    path.write_text(json.dumps({"noise_floor": floor.to_json()}))
    base = ["fidelity", str(last), str(last), "--db", str(db), "--noise-floor", str(path),
            "--check"]  # fmt: skip
    r = CliRunner().invoke(main, [*base, "--tolerance-from", "spread"])
    assert r.exit_code == 0 and "verdict: FAITHFUL" in r.output, r.output
    r = CliRunner().invoke(main, [*base, "--tolerance-from", "original"])
    assert r.exit_code == 3 and "runs land off the original in free space by blocks" in r.output
    assert "Traceback" not in r.output
