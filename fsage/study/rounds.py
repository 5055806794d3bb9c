"""How many scan rounds a study's step takes, and what they decide.

A round scans the aged tree and its clean copy (alternating which goes first). The aged/clean
effect is judged by the sign-test interval of the paired ratios' median
(:mod:`fsage.replay.bench.paired`), which needs at least 6 rounds at 95 %: a single round can
never decide. With ``repeat`` 0 (the default) rounds go on until the step is decided or its
time budget is spent:

* ``slower`` / ``faster``: the interval lies above / below 1 (the aged tree reads slower or
  faster than its copy);
* ``same``: the interval includes 1 but lies within ``1 ± SAME_WITHIN`` (no aging effect larger
  than that: an equivalence decision, not a lack of one);
* ``inconclusive``: neither, when the round limit or the budget stops the rounds first.

A fixed ``repeat`` runs exactly that many rounds and is judged by the same rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fsage.replay.bench.paired import CONFIDENCE, min_rounds, paired_effect

#: Relative distance from 1 within which an interval that includes 1 decides "same".
SAME_WITHIN = 0.05
#: Seconds of scanning per file system and step after which no round starts (auto rounds).
BUDGET_S = 20.0
#: Most rounds per file system and step (auto rounds).
MAX_ROUNDS = 10


@dataclass(frozen=True)
class Decision:
    verdict: str  # "slower", "faster", "same" or "inconclusive"
    ratio: float  # median of the paired aged/clean ratios
    low: float | None
    high: float | None
    rounds: int
    reason: str


def decide(aged: Sequence[float], clean: Sequence[float]) -> Decision:
    """The aged/clean verdict of paired rounds ``aged[i]``, ``clean[i]``."""
    n = min(len(aged), len(clean))
    eff = paired_effect(aged[:n], clean[:n], CONFIDENCE)
    if eff.low is None or eff.high is None:
        return Decision("inconclusive", eff.ratio, None, None, n, eff.reason)
    if eff.low > 1.0:
        verdict = "slower"
    elif eff.high < 1.0:
        verdict = "faster"
    elif eff.low >= 1.0 - SAME_WITHIN and eff.high <= 1.0 + SAME_WITHIN:
        verdict = "same"
    else:
        verdict = "inconclusive"
    text = f"{eff.confidence:.0%} interval {eff.low:.3f}-{eff.high:.3f}"
    return Decision(verdict, eff.ratio, eff.low, eff.high, n, text)


def stop_reason(
    aged: Sequence[float], clean: Sequence[float], elapsed: float, repeat: int
) -> str | None:
    """Why no further round runs after the rounds so far (None: run another).

    ``repeat`` > 0 runs exactly that many; 0 runs at least the rounds an interval needs, then
    stops once decided, at :data:`MAX_ROUNDS`, or once :data:`BUDGET_S` seconds are spent."""
    n = min(len(aged), len(clean))
    if repeat > 0:
        return f"{repeat} round(s) asked" if n >= repeat else None
    if n < min_rounds(CONFIDENCE):
        return None
    d = decide(aged, clean)
    if d.verdict != "inconclusive":
        return f"decided ({d.verdict}: {d.reason})"
    if n >= MAX_ROUNDS:
        return f"the round limit ({MAX_ROUNDS}) is reached"
    if elapsed >= BUDGET_S:
        return f"the scan budget ({BUDGET_S:.0f} s) is spent"
    return None
