"""A target that is full well before statvfs says (btrfs keeps room for its metadata that
statvfs counts as free): after the first op it refuses, the generator steers by the used
blocks it was refused at, so the run ends by its churn with a few refusals instead of
running into the full target again and again; and a run killed after it learned that, and
resumed (its probes replayed from the probe log), makes the same ops as the run that was not
stopped.

The target here is a model of such a file system: its used blocks are the generator's own
plus a start and a jitter of its own (what a kernel's count does), and it refuses any op that
takes it past 60% of its size.
"""

from __future__ import annotations

import random
from pathlib import Path

from fsage.ager.generator import Generator
from fsage.ager.profile import get_preset
from fsage.ager.resume import ProbeLog, replay
from fsage.workload import Op

MIB = 1 << 20
BS = 4096
SIZE = 256 * MIB
FULL_AT = SIZE // BS * 60 // 100


class _Target:
    def __init__(self) -> None:
        self.gen: Generator | None = None
        self.noise = random.Random(5)
        self.refused = 0

    def used(self) -> int:
        assert self.gen is not None
        return 700 + self.gen.used_blocks

    def probe(self) -> tuple[int, int, int]:
        return BS, SIZE // BS, self.used() + self.noise.randrange(40)

    def refuses(self) -> bool:
        full = self.used() > FULL_AT
        self.refused += full
        return full


def _gen(probe: ProbeLog) -> Generator:
    prof = get_preset("hfs-surge").with_overrides(fill=0.8, churn=1.0)
    return Generator(prof, 9, SIZE, probe=probe, block_size=BS, probe_every=None, meta="btrfs")


def _run(log: Path, stop: int | None) -> tuple[list[Op], list[Op], _Target, Generator]:
    """The ops that took effect up to op ``stop`` (all: None), those the generator made after
    it, the target and the generator."""
    tgt = _Target()
    plog = ProbeLog(log, tgt.probe, resume=False)
    gen = _gen(plog)
    tgt.gen = gen
    done: list[Op] = []
    after: list[Op] = []
    for op in gen.ops():
        assert gen.stats.ops < 200_000, f"no end: {tgt.refused} ops refused"
        if stop is not None and gen.stats.ops > stop:
            after.append(op)
            if len(after) >= 3000:
                break
            continue
        if tgt.refuses():
            gen.nospace(op)
        else:
            done.append(op)
    plog.close()
    return done, after, tgt, gen


def test_the_generator_learns_where_the_target_is_full(tmp_path: Path) -> None:
    _, _, tgt, gen = _run(tmp_path / "whole.probes", None)
    assert gen.stats.stopped_by == "churn"
    assert 1 <= tgt.refused <= 5, tgt.refused
    assert gen.full_at is not None and abs(gen.full_at - FULL_AT) <= 64, (gen.full_at, FULL_AT)
    # the fill asked for, of what the target holds
    total, used = gen.capacity_blocks()
    assert abs(used / total - 0.8) < 0.05, used / total


def test_a_resumed_run_learns_the_same(tmp_path: Path) -> None:
    whole, _, _, _ = _run(tmp_path / "whole.probes", None)
    # killed well after the first refusal: the resume must learn what the run had learned
    log = tmp_path / "stopped.probes"
    journal, after, stopped, run = _run(log, len(whole) * 3 // 4)
    assert stopped.refused >= 1 and run.full_at is not None and len(after) == 3000
    tgt = _Target()
    tgt.noise = random.Random(99)  # the kernel's count after the resume: not the run's
    plog = ProbeLog(log, tgt.probe, resume=True)
    gen = _gen(plog)
    tgt.gen = gen
    rest = replay(gen, journal)
    assert gen.full_at == run.full_at
    got = [op for _, op in zip(range(len(after)), rest, strict=False)]
    plog.close()
    assert got == after
