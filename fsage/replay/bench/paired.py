"""Paired rounds: how a benchmark judges an effect on a loaded machine.

A round runs the measured side and its reference side (the empty-file-system baseline, or the
scan's clean copy) one after the other, alternating which goes first. Load that drifts between
rounds then falls on both sides of a round alike, and the effect is judged from each round's
ratio (measured / reference) rather than from the ranges of two independent series.

* The effect is the median of the paired ratios.
* Its interval is the sign-test (binomial order-statistic) confidence interval of that median:
  ``[r_(k), r_(n+1-k)]`` of the sorted ratios, with the largest ``k`` whose coverage
  ``1 - 2 P(Binomial(n, 1/2) <= k - 1)`` is at least the confidence asked. It assumes nothing
  about the shape of the ratios' distribution, only that rounds are independent. Below the
  rounds that can reach the confidence (6 for 95 %), there is no interval.
* The result is inconclusive when there is no interval or the interval includes 1 (no effect).
* Stopping rule: rounds go on until the interval's width, relative to the median, is at most
  the width asked, or the time budget is spent (no round starts after it), or the round limit.
  With ``decided``, they also stop as soon as every watched effect's interval excludes 1: the
  verdict (higher or lower) is then settled and further rounds only narrow the ratio.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import comb
from typing import Any

import numpy as np

CONFIDENCE = 0.95
#: Default relative width of the interval the rounds aim for (±5 % around the median).
CI_WIDTH = 0.10
#: Default seconds after which no further round is started.
BUDGET = 300.0
MAX_ROUNDS = 30


def sign_test_k(n: int, confidence: float = CONFIDENCE) -> int:
    """The largest ``k`` (1-based) whose order-statistic interval ``[x_(k), x_(n+1-k)]``
    covers the median with at least ``confidence``; 0 when even ``[min, max]`` does not."""
    best = 0
    cdf = 0.0  # P(B <= k - 1)
    for k in range(1, n // 2 + 1):
        cdf += comb(n, k - 1) / 2.0**n
        if 1.0 - 2.0 * cdf >= confidence - 1e-12:
            best = k
        else:
            break
    return best


def coverage(n: int, k: int) -> float:
    """Coverage of ``[x_(k), x_(n+1-k)]`` for the median of ``n`` independent values."""
    return 1.0 - 2.0 * sum(comb(n, i) for i in range(k)) / 2.0**n


def min_rounds(confidence: float = CONFIDENCE) -> int:
    """The fewest rounds that can give an interval at ``confidence``."""
    n = 1
    while sign_test_k(n, confidence) == 0:
        n += 1
    return n


def median_interval(
    values: Sequence[float], confidence: float = CONFIDENCE
) -> tuple[float, float] | None:
    """The sign-test interval of the median of ``values``; None with too few values."""
    n = len(values)
    k = sign_test_k(n, confidence)
    if k == 0:
        return None
    s = sorted(float(v) for v in values)
    return s[k - 1], s[n - k]


@dataclass
class PairedEffect:
    """The effect measured over paired rounds: median ratio, its interval and the verdict."""

    ratios: list[float]
    ratio: float  # median of the paired ratios
    low: float | None
    high: float | None
    confidence: float
    #: "higher" / "lower" (the measured side against its reference), or "inconclusive".
    verdict: str
    reason: str
    higher_rounds: int  # rounds whose ratio is above 1

    @property
    def rounds(self) -> int:
        return len(self.ratios)

    @property
    def width(self) -> float | None:
        """The interval's width relative to the median; None without an interval."""
        if self.low is None or self.high is None or self.ratio <= 0:
            return None
        return (self.high - self.low) / self.ratio

    @property
    def conclusive(self) -> bool:
        return self.verdict != "inconclusive"

    def interval_text(self) -> str:
        if self.low is None or self.high is None:
            return "no interval"
        return f"{self.confidence:.0%} interval {self.low:.3f}-{self.high:.3f}"

    def to_json(self) -> dict[str, Any]:
        return {
            "ratio": self.ratio,
            "ci_low": self.low,
            "ci_high": self.high,
            "confidence": self.confidence,
            "ci_width": self.width,
            "verdict": self.verdict,
            "reason": self.reason,
            "rounds": self.rounds,
            "higher_rounds": self.higher_rounds,
            "ratios": self.ratios,
        }


def paired_ratios(measured: Sequence[float], reference: Sequence[float]) -> list[float]:
    """Each round's measured / reference (rounds where the reference is 0 are left out)."""
    if len(measured) != len(reference):
        raise ValueError(f"{len(measured)} measured values for {len(reference)} references")
    return [float(m) / float(r) for m, r in zip(measured, reference, strict=True) if r]


def paired_effect(
    measured: Sequence[float], reference: Sequence[float], confidence: float = CONFIDENCE
) -> PairedEffect:
    """The effect of ``measured[i]`` against ``reference[i]`` (round ``i``) and its verdict."""
    ratios = paired_ratios(measured, reference)
    if not ratios:
        raise ValueError("no paired rounds to judge")
    med = float(np.median(ratios))
    higher = sum(1 for r in ratios if r > 1.0)
    ci = median_interval(ratios, confidence)
    if ci is None:
        need = min_rounds(confidence)
        return PairedEffect(ratios, med, None, None, confidence, "inconclusive",
                            f"too few rounds ({len(ratios)}) for a {confidence:.0%} "
                            f"interval (it needs {need})", higher)  # fmt: skip
    lo, hi = ci
    if lo <= 1.0 <= hi:
        verdict, reason = "inconclusive", f"the {confidence:.0%} interval includes 1 (no effect)"
    else:
        verdict = "higher" if lo > 1.0 else "lower"
        reason = f"the {confidence:.0%} interval excludes 1"
    return PairedEffect(ratios, med, lo, hi, confidence, verdict, reason, higher)


@dataclass
class StoppingRule:
    """When to stop adding rounds (see the module doc)."""

    min_rounds: int = 1
    width: float = CI_WIDTH
    budget: float = BUDGET  # seconds
    max_rounds: int = MAX_ROUNDS
    confidence: float = CONFIDENCE
    #: Stop once every effect is conclusive (its interval excludes 1), however wide.
    decided: bool = False

    def why_stop(self, effects: Sequence[PairedEffect], rounds: int, elapsed: float) -> str | None:
        """Why no further round should run after ``rounds`` rounds in ``elapsed`` seconds,
        judged on the widest of ``effects``; None to go on."""
        if rounds < self.min_rounds:
            return None
        if rounds >= self.max_rounds:
            return f"the round limit ({self.max_rounds}) is reached"
        if not effects:
            return "no reference to pair with: the rounds asked are run"
        widths = [e.width for e in effects]
        if effects and all(w is not None for w in widths):
            widest = max(float(w) for w in widths if w is not None)
            if widest <= self.width:
                return (
                    f"the {self.confidence:.0%} interval is within {self.width:.0%} of the "
                    f"median (widest {widest:.1%})"
                )
        if self.decided and all(e.conclusive for e in effects):
            return (
                f"the verdict is decided (every {self.confidence:.0%} interval excludes 1; "
                f"widest {max(float(w) for w in widths if w is not None):.1%} of the median)"
            )
        if elapsed >= self.budget:
            return f"the time budget ({self.budget:.0f} s) is spent"
        return None
