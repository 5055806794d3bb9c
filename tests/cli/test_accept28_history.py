"""A history of several aging runs counts operations over the file system's life: the change per
1,000 operations and per GiB written are slopes over the runs' counts added up (each run counts
from 0), and `analyze --history` lists those counts, as the report's axis draws them. The
operations are counted from the runs' own journals."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import require_tools
from images import make_ext_image

from fsage.cli import main

RUNS = ((1, 900), (2, 600), (3, 900))  # (seed, ops)


def cli(*args: str | Path) -> Any:
    out = CliRunner().invoke(main, [str(a) for a in args])
    assert out.exit_code == 0, out.output
    return out


def journal_ops(path: Path) -> int:
    """Operations in a run's journal (JSON Lines, optionally gzip): the lines with an op."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as fh:
        return sum(1 for line in fh if line.strip() and "op" in json.loads(line))


def test_rates_per_operation_count_over_every_run(tmp_path: Path) -> None:
    require_tools("mke2fs")
    img = make_ext_image(tmp_path, "ext4", size="64M", extra=["-L", "hist"], name="h.img")
    db = tmp_path / "h.db"
    per_run = []
    for seed, ops in RUNS:
        out = cli("age", img, "--profile", "hfs-aging", "--offline", "--db", db, "--seed", seed,
                  "--ops-limit", ops, "--snapshot-every", 300).output  # fmt: skip
        # read now: a run started within the same second writes the same journal name
        journal = Path(re.search(r"ops run: (\S+)", out).group(1))  # type: ignore[union-attr]
        per_run.append(journal_ops(journal))
    assert per_run == [ops for _, ops in RUNS]

    out = json.loads(cli("analyze", "--db", db, "--history", "--format", "json").stdout)
    t = out["trends"]["hist"]
    snaps = t["snapshots"]
    # each run's snapshots: its start (0) and every 300 ops; the runs' totals come before it
    xs, offset, last = [], 0, None
    for s in snaps:
        if last is not None and s["op_count"] < last:
            offset += last
        last = s["op_count"]
        xs.append(offset + s["op_count"])
    assert xs[-1] == sum(per_run)
    pts = [(x, s["layout_score"]) for x, s in zip(xs, snaps, strict=True)
           if s["layout_score"] is not None]  # fmt: skip
    want = np.polyfit([p[0] for p in pts], [p[1] for p in pts], 1)[0] * 1000
    assert want != 0
    assert t["change_per_kop"] == pytest.approx(want, rel=1e-6)

    text = cli("analyze", "--db", db, "--history").stdout.splitlines()
    head = next(i for i, ln in enumerate(text) if ln.startswith("id "))
    rows = [ln.split() for ln in text[head + 2 : head + 2 + len(snaps)]]
    assert [int(r[2].replace(",", "")) for r in rows] == xs
