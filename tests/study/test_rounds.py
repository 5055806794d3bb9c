"""The study's scan-round rule: a single round never decides, the default is a sequential test
that stops at the first look that decides (sooner when the effect is clear), each verdict
follows its interval, and the looks together err no more often than the stated 5 %."""

from __future__ import annotations

import math
import random
import statistics

from fsage.study import rounds
from fsage.study.rounds import decide, final_decision, planned_looks, stop_reason, t_quantile


def test_one_round_is_never_decided() -> None:
    assert decide([2.0], [1.0]).verdict == "inconclusive"
    assert stop_reason([2.0], [1.0], 0.0, repeat=1) is not None  # a fixed count stops there


def test_t_quantiles_against_printed_tables() -> None:
    # two-sided 95 % and 99 % points of Student's t (any statistics table)
    for conf, df, want in ((0.95, 1, 12.706), (0.95, 2, 4.303), (0.95, 9, 2.262),
                           (0.99, 5, 4.032), (0.95, 30, 2.042), (0.99, 10, 3.169)):  # fmt: skip
        assert abs(t_quantile(conf, df) - want) < 1e-3, (conf, df)


def test_a_clear_effect_is_decided_at_the_first_look() -> None:
    rng = random.Random(1)
    clean = [1.0 + rng.uniform(-0.01, 0.01) for _ in range(rounds.FIRST_LOOK)]
    aged = [c * 1.6 * (1 + rng.uniform(-0.01, 0.01)) for c in clean]
    assert stop_reason(aged[:-1], clean[:-1], 0.0, repeat=0) is None
    why = stop_reason(aged, clean, 0.0, repeat=0)
    assert why is not None and why.startswith("decided (slower")


def _noisy(ratio: float, sd: float, n: int, rng: random.Random) -> tuple[list[float], list[float]]:
    clean = [1.0 + rng.random() for _ in range(n)]
    aged = [c * ratio * math.exp(rng.gauss(0.0, sd)) for c in clean]
    return aged, clean


def test_verdicts_follow_the_interval() -> None:
    rng = random.Random(7)
    for _ in range(30):
        for ratio, sd in ((1.0, 0.01), (1.0, 0.3), (1.5, 0.1), (0.7, 0.1)):
            aged, clean = _noisy(ratio, sd, 9, rng)
            d = decide(aged, clean, looks=3)
            # the interval recomputed independently: t on the logs at 1 - 0.05 / 3
            logs = [math.log(a / c) for a, c in zip(aged, clean, strict=True)]
            half = t_quantile(1 - 0.05 / 3, 8) * statistics.stdev(logs) / 3
            lo = math.exp(statistics.fmean(logs) - half)
            hi = math.exp(statistics.fmean(logs) + half)
            assert d.low is not None and d.high is not None
            assert abs(d.low - lo) < 1e-9 and abs(d.high - hi) < 1e-9
            want = (
                "slower" if lo > 1 else "faster" if hi < 1
                else "same" if lo >= 1 - rounds.SAME_WITHIN and hi <= 1 + rounds.SAME_WITHIN
                else "inconclusive"
            )  # fmt: skip
            assert d.verdict == want, (ratio, sd, lo, hi)


def _sequential(aged: list[float], clean: list[float]) -> str:
    for n in range(1, rounds.MAX_ROUNDS + 1):
        if stop_reason(aged[:n], clean[:n], 0.0, repeat=0) is not None:
            return final_decision(aged[:n], clean[:n], 0).verdict
    raise AssertionError("the rule never stopped")


def test_the_looks_together_keep_the_error_rate() -> None:
    # no aging effect, noise of 10 %: "slower" or "faster" is an error; with every look at
    # 95 % the repeated looks would err well above 5 % (counted below for contrast)
    rng = random.Random(3)
    trials, wrong, naive_wrong = 3000, 0, 0
    for _ in range(trials):
        aged, clean = _noisy(1.0, 0.1, rounds.MAX_ROUNDS, rng)
        wrong += _sequential(aged, clean) in ("slower", "faster")
        naive_wrong += any(
            decide(aged[:n], clean[:n]).verdict in ("slower", "faster")
            for n in range(rounds.FIRST_LOOK, rounds.MAX_ROUNDS + 1)
        )
    assert wrong / trials <= 0.05
    assert naive_wrong / trials > 0.08  # the test can tell a rule that does not correct


def test_the_sequential_rule_needs_fewer_rounds_on_a_clear_effect() -> None:
    rng = random.Random(5)
    used = []
    for _ in range(200):
        aged, clean = _noisy(1.5, 0.05, rounds.MAX_ROUNDS, rng)
        for n in range(1, rounds.MAX_ROUNDS + 1):
            if stop_reason(aged[:n], clean[:n], 0.0, repeat=0) is not None:
                used.append(n)
                assert final_decision(aged[:n], clean[:n], 0).verdict == "slower"
                break
    assert statistics.mean(used) < 6  # the sign test's fewest rounds


def test_undecided_rounds_stop_at_the_limit_or_the_budget() -> None:
    # ratios alternating 0.8 and 1.2: every interval includes 1 and is wider than "same"
    ratios = [0.8 if i % 2 else 1.2 for i in range(rounds.MAX_ROUNDS)]
    clean = [1.0] * rounds.MAX_ROUNDS
    assert final_decision(ratios, clean, 0).verdict == "inconclusive"
    assert "round limit" in (stop_reason(ratios, clean, 0.0, repeat=0) or "")
    assert stop_reason(ratios[:6], clean[:6], 0.0, repeat=0) is None
    assert "budget" in (stop_reason(ratios[:6], clean[:6], rounds.BUDGET_S, repeat=0) or "")
    # undecided, the budget stops no step before the rounds it always had
    k = rounds.MIN_UNDECIDED - 1
    assert stop_reason(ratios[:k], clean[:k], rounds.BUDGET_S, repeat=0) is None


def test_a_fixed_count_is_one_look_at_95() -> None:
    assert planned_looks(8) == 1
    assert final_decision([2.0, 2.1, 1.9], [1.0] * 3, 3).confidence == rounds.CONFIDENCE
    assert final_decision([2.0, 2.1, 1.9], [1.0] * 3, 0).confidence > rounds.CONFIDENCE
