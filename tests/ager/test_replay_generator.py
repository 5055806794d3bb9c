"""The generator run again through a journal (with the probes its run kept) is in the state of
the run at the journal's end: it goes on with the ops the run went on with, whatever the
profile (write patterns, Geriatrix convergence, random update) and wherever the run stopped,
ops that ran out of space included."""

from __future__ import annotations

from pathlib import Path

import pytest

from fsage.ager.generator import Generator
from fsage.ager.profile import PRESETS, Profile, load_profile
from fsage.ager.resume import ProbeLog, ReplayError, replay
from fsage.ager.run import shape_profile
from fsage.workload import Op
from tests.ager.test_convergence import AGRAWAL, _profile_dir

MIB = 1 << 20
CAPACITY = 64 * MIB


class _Target:
    """A stand-in for a target's statvfs: the generator's own count plus a drift, so that
    every probe returns something the model could not have predicted."""

    def __init__(self) -> None:
        self.gen: Generator | None = None
        self.calls = 0

    def probe(self) -> tuple[int, int, int]:
        assert self.gen is not None
        self.calls += 1
        return 4096, CAPACITY // 4096, self.gen.used_blocks + 7 * (self.calls % 13)


def _run(
    profile: Profile, log: Path, stop: int, nospace_every: int
) -> tuple[list[Op], list[Op], int]:
    """A run of ``profile`` whose probes go to ``log``, killed after op ``stop``: its journal
    up to there, the ops it would have made after, and the probes it had made (``log`` is left
    as the kill leaves it). Every ``nospace_every``-th create before the stop ran out of
    space."""
    tgt = _Target()
    plog = ProbeLog(log, tgt.probe, resume=False)
    gen = Generator(profile, 9, CAPACITY, probe=plog, block_size=4096)
    tgt.gen = gen
    journal: list[Op] = []
    after: list[Op] = []
    creates = 0
    kept = -1
    calls = 0
    for op in gen.ops():
        if gen.stats.ops > stop:
            if kept < 0:  # the kill
                kept, calls = log.stat().st_size, tgt.calls
            after.append(op)
            continue
        if op.op == "create":
            creates += 1
            if creates % nospace_every == 0:
                gen.nospace(op)
                continue
        journal.append(op)
    plog.close()
    with open(log, "r+b") as fh:
        fh.truncate(kept)
    return journal, after, calls


NAMES = ["hfs-surge", "desktop", "news", "mail", "random-update", "agrawal"]


def _profiles(tmp: Path) -> dict[str, Profile]:
    d = tmp / "agrawal"
    d.mkdir()
    geriatrix = load_profile(str(_profile_dir(d, AGRAWAL)))
    return {
        "hfs-surge": PRESETS["hfs-surge"],
        "desktop": PRESETS["desktop"],
        "news": PRESETS["news"],
        "mail": PRESETS["mail"],
        "random-update": PRESETS["random-update"],
        "agrawal": geriatrix,
    }


@pytest.mark.parametrize(
    "name", ["hfs-surge", "desktop", "news", "mail", "random-update", "agrawal"]
)
def test_a_replayed_generator_goes_on_as_the_run_did(name: str, tmp_path: Path) -> None:
    profile = shape_profile(_profiles(tmp_path)[name], fill=0.5, churn=3, ops_limit=2500)
    for stop in (211, 844, 1377):
        log = tmp_path / f"{name}-{stop}.probes"
        journal, after, calls = _run(profile, log, stop, nospace_every=37)
        assert len(after) > 100
        # the resume: the probes come from the log, then from the target
        tgt = _Target()
        tgt.calls = calls  # the target's drift goes on where the run's was
        plog = ProbeLog(log, tgt.probe, resume=True)
        gen = Generator(profile, 9, CAPACITY, probe=plog, block_size=4096)
        tgt.gen = gen
        rest = replay(gen, journal)
        assert gen.stats.ops == stop and tgt.calls == calls  # no probe of the target yet
        assert list(rest) == after, stop
        plog.close()


def test_a_journal_the_generator_does_not_make_is_refused(tmp_path: Path) -> None:
    profile = shape_profile(PRESETS["hfs-surge"], ops_limit=500)
    journal, _, _ = _run(profile, tmp_path / "p", 300, nospace_every=10**9)
    other = list(journal)
    other[100] = Op("create", "not/a/name/it/makes", size=1)
    plog = ProbeLog(tmp_path / "p", lambda: (4096, CAPACITY // 4096, 0), resume=True)
    longer = shape_profile(PRESETS["hfs-surge"], ops_limit=10**6)  # the same ops, and more
    gen = Generator(longer, 9, CAPACITY, probe=plog, block_size=4096)
    with pytest.raises(ReplayError, match="op 101"):
        replay(gen, other)
    plog.close()
