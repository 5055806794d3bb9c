"""The probes a generated run steers by are rounded to 1/1024 of the file system: two kernels
that disagree by a few blocks after the same ops give the run the same figures."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path

from fsage.ager.resume import ProbeLog

TOTAL = 102_400  # blocks: a quantum of 100


def _probe(values: Iterator[int]) -> tuple[int, int, int]:
    return 1024, TOTAL, next(values)


def test_probes_a_few_blocks_apart_read_the_same(tmp_path: Path) -> None:
    seen: list[tuple[int, int, int]] = []
    for n, live in enumerate(([5_020, 40_310, 99_990], [5_023, 40_306, 99_999])):
        values = iter(live)
        plog = ProbeLog(tmp_path / f"p{n}", functools.partial(_probe, values), resume=False)
        seen.append(tuple(plog()[2] for _ in live))  # type: ignore[arg-type]
        plog.close()
    assert seen[0] == seen[1] == (5_000, 40_300, 100_000)
    # what a resumed run reads back is what the run read, as the generator saw it
    assert (tmp_path / "p0").read_text().split("\n")[:3] == [
        "1024 102400 5000",
        "1024 102400 40300",
        "1024 102400 100000",
    ]
    again = ProbeLog(tmp_path / "p0", lambda: (1024, TOTAL, 77_777), resume=True)
    assert [again()[2] for _ in range(4)] == [5_000, 40_300, 100_000, 77_800]
    again.close()
