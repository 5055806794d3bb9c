"""The study's scan-round rule: a single round never decides, the default runs until the
aged/clean ratio is decided (or its limits), and each verdict follows its interval."""

from __future__ import annotations

import random

from fsage.replay.bench.paired import median_interval, min_rounds
from fsage.study import rounds
from fsage.study.rounds import decide, stop_reason


def test_one_round_is_never_decided() -> None:
    assert decide([2.0], [1.0]).verdict == "inconclusive"
    assert stop_reason([2.0], [1.0], 0.0, repeat=1) is not None  # a fixed count stops there


def test_default_runs_until_an_interval_exists_then_stops_once_decided() -> None:
    need = min_rounds()
    aged, clean = [2.0] * (need - 1), [1.0] * (need - 1)
    assert stop_reason(aged, clean, 0.0, repeat=0) is None
    why = stop_reason([*aged, 2.0], [*clean, 1.0], 0.0, repeat=0)
    assert why is not None and why.startswith("decided (slower")


def _noisy(ratio: float, spread: float, n: int, seed: int) -> tuple[list[float], list[float]]:
    rng = random.Random(seed)
    clean = [1.0 + rng.random() for _ in range(n)]
    aged = [c * ratio * (1.0 + rng.uniform(-spread, spread)) for c in clean]
    return aged, clean


def test_verdicts_follow_the_sign_test_interval() -> None:
    for seed in range(30):
        for ratio, spread in ((1.0, 0.02), (1.0, 0.3), (1.5, 0.1), (0.7, 0.1)):
            aged, clean = _noisy(ratio, spread, 9, seed)
            d = decide(aged, clean)
            ci = median_interval([a / c for a, c in zip(aged, clean, strict=True)])
            assert ci is not None
            lo, hi = ci
            want = (
                "slower" if lo > 1 else "faster" if hi < 1
                else "same" if lo >= 1 - rounds.SAME_WITHIN and hi <= 1 + rounds.SAME_WITHIN
                else "inconclusive"
            )  # fmt: skip
            assert d.verdict == want, (seed, ratio, spread, lo, hi)


def test_undecided_rounds_stop_at_the_limit_or_the_budget() -> None:
    # ratios alternating 0.8 and 1.2: every interval includes 1 and is wider than "same"
    ratios = [0.8 if i % 2 else 1.2 for i in range(rounds.MAX_ROUNDS)]
    clean = [1.0] * rounds.MAX_ROUNDS
    assert decide(ratios, clean).verdict == "inconclusive"
    assert "round limit" in (stop_reason(ratios, clean, 0.0, repeat=0) or "")
    assert stop_reason(ratios[:6], clean[:6], 0.0, repeat=0) is None
    assert "budget" in (stop_reason(ratios[:6], clean[:6], rounds.BUDGET_S, repeat=0) or "")
