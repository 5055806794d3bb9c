"""How many scan rounds a study's step takes, and what they decide.

A round scans the aged tree and its clean copy (alternating which goes first). The aged/clean
effect is the geometric mean of the paired ratios, with a Student t interval on their logarithms
(scan times are positive and their noise multiplicative: a load spike lengthens a scan by a
share, not by seconds).

With ``repeat`` 0 (the default) the rounds are a sequential test: the interval is looked at
after every round from the :data:`FIRST_LOOK`-th to the :data:`MAX_ROUNDS`-th, and the rounds
stop at the first look that decides. Looking again and again at a 95 % interval would decide
wrongly more often than 5 % of the time (each look is a new chance to err), so every look is
made at the confidence ``1 - 0.05 / looks`` (Bonferroni over the planned looks): the chance that
any look's interval misses the true ratio stays at most 5 % whenever the rounds stop. The price
is a wider interval per look: an effect of more than 7.3 standard deviations of the rounds'
log-ratios is decided after 3 rounds (3.4 after 4, 1.8 after 6, 1.1 after 10), where a single
95 % look at 10 rounds decides 0.72 (see :func:`half_width`): at the round limit the interval
is 1.57 times as wide. Verdicts:

* ``slower`` / ``faster``: the interval lies above / below 1 (the aged tree reads slower or
  faster than its copy);
* ``same``: the interval includes 1 but lies within ``1 ± SAME_WITHIN`` (no aging effect larger
  than that: an equivalence decision, not a lack of one);
* ``inconclusive``: neither, when the round limit or the budget stops the rounds first.

A fixed ``repeat`` runs exactly that many rounds and is judged once, at 95 %.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

#: Confidence of the whole decision (over all its looks).
CONFIDENCE = 0.95
#: Relative distance from 1 within which an interval that includes 1 decides "same".
SAME_WITHIN = 0.05
#: Seconds of scanning per file system and step after which no round starts (auto rounds).
BUDGET_S = 20.0
#: Most rounds per file system and step (auto rounds).
MAX_ROUNDS = 10
#: The first round the sequential rule looks at (two rounds give an interval of one degree of
#: freedom, too wide at a Bonferroni level to ever decide).
FIRST_LOOK = 3
#: Rounds run at least before the round limit or the budget may stop undecided rounds: only a
#: decision ends them sooner (fewer rounds would widen the interval of every undecided step).
MIN_UNDECIDED = 6


def planned_looks(repeat: int) -> int:
    """How many times the interval may be looked at: once for a fixed count of rounds."""
    return 1 if repeat > 0 else MAX_ROUNDS - FIRST_LOOK + 1


def t_cdf_two_sided(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with ``df`` degrees of freedom (the closed form for an
    integer ``df``: Abramowitz and Stegun 26.7.3 and 26.7.4)."""
    if t <= 0:
        return 0.0
    theta = math.atan(t / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    if df % 2 == 1:
        s, term = 0.0, 1.0
        if df > 1:
            s = term
            for k in range(1, (df - 3) // 2 + 1):
                term *= c2 * (2 * k) / (2 * k + 1)
                s += term
        return (2 / math.pi) * (theta + math.sin(theta) * math.cos(theta) * s)
    s, term = 1.0, 1.0
    for k in range(1, (df - 2) // 2 + 1):
        term *= c2 * (2 * k - 1) / (2 * k)
        s += term
    return math.sin(theta) * s


@functools.lru_cache(maxsize=256)
def t_quantile(confidence: float, df: int) -> float:
    """The ``t`` with P(|T| <= t) = ``confidence`` (two-sided), by bisection."""
    lo, hi = 0.0, 1.0
    while t_cdf_two_sided(hi, df) < confidence:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if t_cdf_two_sided(mid, df) < confidence:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * hi:
            break
    return (lo + hi) / 2


def half_width(n: int, looks: int) -> float:
    """The interval's half-width on the log scale after ``n`` rounds, in standard deviations
    of the log-ratios: the smallest effect a look at ``n`` can decide (what the looks cost)."""
    return t_quantile(1 - (1 - CONFIDENCE) / looks, n - 1) / math.sqrt(n)


@dataclass(frozen=True)
class Decision:
    verdict: str  # "slower", "faster", "same" or "inconclusive"
    ratio: float  # geometric mean of the paired aged/clean ratios
    low: float | None
    high: float | None
    rounds: int
    reason: str
    confidence: float = CONFIDENCE  # of this look's interval


def decide(aged: Sequence[float], clean: Sequence[float], *, looks: int = 1) -> Decision:
    """The aged/clean verdict of paired rounds ``aged[i]``, ``clean[i]``, judged by one of
    ``looks`` looks (its interval at ``1 - 0.05 / looks``)."""
    n = min(len(aged), len(clean))
    pairs = [(a, c) for a, c in zip(aged[:n], clean[:n], strict=True) if a > 0 and c > 0]
    logs = [math.log(a / c) for a, c in pairs]
    conf = 1 - (1 - CONFIDENCE) / max(1, looks)
    if not logs:
        return Decision("inconclusive", math.nan, None, None, n, "no timed rounds", conf)
    mean = sum(logs) / len(logs)
    ratio = math.exp(mean)
    if len(logs) < 2:
        return Decision("inconclusive", ratio, None, None, n, "one round gives no interval", conf)
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (len(logs) - 1))
    half = t_quantile(conf, len(logs) - 1) * sd / math.sqrt(len(logs))
    low, high = math.exp(mean - half), math.exp(mean + half)
    if low > 1.0:
        verdict = "slower"
    elif high < 1.0:
        verdict = "faster"
    elif low >= 1.0 - SAME_WITHIN and high <= 1.0 + SAME_WITHIN:
        verdict = "same"
    else:
        verdict = "inconclusive"
    text = f"{conf:.2%} interval {low:.3f}-{high:.3f}"
    return Decision(verdict, ratio, low, high, n, text, conf)


def final_decision(aged: Sequence[float], clean: Sequence[float], repeat: int) -> Decision:
    """The verdict of a step's rounds, at the level their rule looked at them."""
    return decide(aged, clean, looks=planned_looks(repeat))


def stop_reason(
    aged: Sequence[float], clean: Sequence[float], elapsed: float, repeat: int
) -> str | None:
    """Why no further round runs after the rounds so far (None: run another).

    ``repeat`` > 0 runs exactly that many; 0 runs at least :data:`FIRST_LOOK` rounds, then
    stops once a look decides, or after at least :data:`MIN_UNDECIDED` rounds at
    :data:`MAX_ROUNDS` or once :data:`BUDGET_S` seconds are spent."""
    n = min(len(aged), len(clean))
    if repeat > 0:
        return f"{repeat} round(s) asked" if n >= repeat else None
    if n < FIRST_LOOK:
        return None
    d = final_decision(aged, clean, repeat)
    if d.verdict != "inconclusive":
        return f"decided ({d.verdict}: {d.reason})"
    if n < MIN_UNDECIDED:
        return None
    if n >= MAX_ROUNDS:
        return f"the round limit ({MAX_ROUNDS}) is reached"
    if elapsed >= BUDGET_S:
        return f"the scan budget ({BUDGET_S:.0f} s) is spent"
    return None


def mean_interval(
    values: Sequence[float], confidence: float = CONFIDENCE
) -> tuple[float | None, float | None]:
    """The Student t interval of the geometric mean of positive ``values`` (repeated scan
    times of one tree), or (None, None) with fewer than two."""
    logs = [math.log(v) for v in values if v > 0]
    if len(logs) < 2:
        return None, None
    mean = sum(logs) / len(logs)
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (len(logs) - 1))
    half = t_quantile(confidence, len(logs) - 1) * sd / math.sqrt(len(logs))
    return math.exp(mean - half), math.exp(mean + half)
