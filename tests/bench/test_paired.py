"""The statistics of paired rounds on given numbers: the sign-test interval of the median, the
verdict, and the stopping rule."""

from __future__ import annotations

import pytest

from fsage.replay.bench.paired import (
    StoppingRule,
    coverage,
    median_interval,
    min_rounds,
    paired_effect,
    paired_ratios,
    sign_test_k,
)


def test_sign_test_order_statistics_are_the_tabulated_ones() -> None:
    # the 95 % distribution-free interval of the median uses the k-th smallest and largest
    # values: k = 1 for 6-8 values, 2 for 9-11, 3 for 12-14, 4 for 15-16 (binomial tables)
    assert [sign_test_k(n) for n in range(1, 17)] == [0] * 5 + [1] * 3 + [2] * 3 + [3] * 3 + [4] * 2
    assert min_rounds() == 6
    assert min_rounds(0.90) == 5  # 1 - 2 / 32 = 0.9375
    assert coverage(6, 1) == pytest.approx(1 - 2 / 64)
    assert coverage(9, 2) == pytest.approx(1 - 2 * (1 + 9) / 512)


def test_median_interval_of_given_values() -> None:
    assert median_interval([5, 1, 4, 2, 3]) is None
    assert median_interval([6, 1, 5, 2, 4, 3]) == (1, 6)
    assert median_interval([9, 1, 8, 2, 7, 3, 6, 4, 5]) == (2, 8)


def test_pairing_is_by_round() -> None:
    assert paired_ratios([2.0, 9.0], [1.0, 3.0]) == [2.0, 3.0]
    with pytest.raises(ValueError):
        paired_ratios([1.0], [1.0, 2.0])


def test_the_verdict_follows_the_interval() -> None:
    lower = paired_effect([0.8, 0.9, 0.85, 0.7, 0.95, 0.88], [1.0] * 6)
    assert lower.verdict == "lower" and lower.conclusive
    assert (lower.low, lower.high) == (pytest.approx(0.7), pytest.approx(0.95))
    assert lower.ratio == pytest.approx((0.85 + 0.88) / 2)
    assert lower.width == pytest.approx(0.25 / lower.ratio)
    straddles = paired_effect([0.8, 1.1, 0.85, 0.7, 0.95, 0.88], [1.0] * 6)
    assert straddles.verdict == "inconclusive" and "includes 1" in straddles.reason
    assert straddles.higher_rounds == 1


def test_stopping_rule() -> None:
    rule = StoppingRule(min_rounds=3, width=0.10, budget=100.0, max_rounds=10)
    narrow = paired_effect([2.0, 2.02, 2.04, 1.98, 1.96, 2.0], [1.0] * 6)  # width 0.08/2
    wide = paired_effect([1.5, 2.0, 2.5, 2.0, 2.2, 1.8], [1.0] * 6)  # width 1.0/2
    few = paired_effect([2.0, 2.0], [1.0, 1.0])  # no interval yet
    assert narrow.width == pytest.approx(0.04)
    assert wide.width == pytest.approx(0.5)
    # not before the rounds asked for, however narrow
    assert rule.why_stop([narrow], 2, 1000.0) is None
    # narrow enough: stop; the widest result decides
    assert "within 10%" in (rule.why_stop([narrow], 6, 1.0) or "")
    assert rule.why_stop([narrow, wide], 6, 1.0) is None
    # no interval yet: go on, until the budget is spent
    assert rule.why_stop([few], 3, 1.0) is None
    assert "budget" in (rule.why_stop([few], 3, 100.0) or "")
    assert "budget" in (rule.why_stop([narrow, wide], 7, 150.0) or "")
    assert "round limit" in (rule.why_stop([wide], 10, 1.0) or "")
    # nothing to pair with: exactly the rounds asked for
    assert rule.why_stop([], 3, 0.0) is not None
    # a budget of 0: exactly the rounds asked for
    assert StoppingRule(min_rounds=4, budget=0.0).why_stop([wide], 4, 0.0) is not None
