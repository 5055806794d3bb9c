"""The benchmark rounds' default stop: as soon as every paired verdict is decided."""

from __future__ import annotations

from click.testing import CliRunner

from fsage.replay.bench.paired import StoppingRule, paired_effect
from fsage.replay.bench.scan import stopping_rule
from fsage.replay.bench.suites import BenchOptions


def test_a_decided_verdict_stops_the_rounds_however_wide_its_interval() -> None:
    rule = StoppingRule(min_rounds=3, width=0.10, budget=100.0, max_rounds=30, decided=True)
    wide = paired_effect([1.5, 2.0, 2.5, 2.0, 2.2, 1.8], [1.0] * 6)  # 1.5-2.5: higher
    straddles = paired_effect([0.8, 1.1, 0.85, 0.7, 0.95, 0.88], [1.0] * 6)
    few = paired_effect([2.0] * 5, [1.0] * 5)  # no interval before 6 rounds
    assert wide.conclusive and not straddles.conclusive and not few.conclusive
    assert "decided" in (rule.why_stop([wide], 6, 1.0) or "")
    # one result undecided keeps the rounds going, and so does a missing interval
    assert rule.why_stop([wide, straddles], 6, 1.0) is None
    assert rule.why_stop([few], 5, 1.0) is None
    # the width rule alone goes on while the interval is wide
    assert StoppingRule(3, 0.10, 100.0, 30).why_stop([wide], 6, 1.0) is None


def test_bench_stops_at_the_decided_verdict_unless_asked_for_the_width() -> None:
    from fsage.cli import main

    assert stopping_rule(BenchOptions(suite="seq", until_decided=True)).decided
    assert not stopping_rule(BenchOptions(suite="seq")).decided
    out = " ".join(CliRunner().invoke(main, ["bench", "run", "--help"]).output.split())
    assert "--until-width" in out and "[default: 120.0;" in out
