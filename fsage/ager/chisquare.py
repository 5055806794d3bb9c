"""Goodness of fit of a histogram of counts to a target one: Pearson's chi-square test, with
the tail probability computed here (no SciPy). The convergence mode of the workload generator
stops when every target histogram passes it."""

from __future__ import annotations

import math
from typing import Any

#: Buckets are merged with their neighbours until each group expects at least this many files.
MIN_EXPECTED = 5.0


def chi_square_test(
    ideal: list[float], counts: list[int], confidence: float, tolerance: float = 1.0
) -> dict[str, Any]:
    """Pearson's chi-square goodness of fit of ``counts`` to the fractions ``ideal``.

    Expected counts are ``ideal[i] * n``. Adjacent buckets are merged, left to right, until
    each group expects at least ``MIN_EXPECTED`` files (a short last group joins the one
    before); a file in a bucket whose ideal fraction is 0 fails the test outright. ``passed``:
    the p-value is at least ``1 - confidence`` and no bucket's fraction is more than
    ``tolerance`` from its ideal; with fewer than two groups the test cannot be made and does
    not pass unless the ideal has a single non-empty bucket.
    """
    n = sum(counts)
    expected = [f * n for f in ideal]
    impossible = any(c > 0 and e <= 0 for c, e in zip(counts, expected, strict=True))
    groups: list[list[int]] = []
    cur: list[int] = []
    acc = 0.0
    for i, e in enumerate(expected):
        cur.append(i)
        acc += e
        if acc >= MIN_EXPECTED:
            groups.append(cur)
            cur, acc = [], 0.0
    if cur:
        if groups:
            groups[-1].extend(cur)
        else:
            groups.append(cur)
    chi2 = 0.0
    for g in groups:
        e = sum(expected[i] for i in g)
        o = sum(counts[i] for i in g)
        if e > 0:
            chi2 += (o - e) ** 2 / e
    dof = len(groups) - 1
    actual = [c / n if n else 0.0 for c in counts]
    max_diff = max(abs(a - b) for a, b in zip(ideal, actual, strict=True))
    if impossible:
        chi2, p_value = math.inf, 0.0
    else:
        p_value = chi2_sf(chi2, dof) if dof > 0 else 1.0
    single = sum(1 for f in ideal if f > 0) <= 1
    passed = (
        n > 0
        and not impossible
        and (dof > 0 or single)
        and p_value >= 1.0 - confidence
        and max_diff <= tolerance
    )
    return {
        "ideal": list(ideal),
        "actual": actual,
        "counts": list(counts),
        "expected": expected,
        "groups": [[g[0], g[-1]] for g in groups],
        "max_diff": max_diff,
        "chi2": None if impossible else chi2,
        "dof": dof,
        "p_value": p_value,
        "files": n,
        "passed": passed,
    }


def chi2_sf(x: float, dof: int) -> float:
    """P(X >= x) for a chi-square with ``dof`` degrees of freedom."""
    if x <= 0:
        return 1.0
    return _gammaincc(dof / 2.0, x / 2.0)


def _gammaincc(a: float, x: float) -> float:
    """Regularized upper incomplete gamma Q(a, x) (series or continued fraction)."""
    lg = math.lgamma(a)
    if x < a + 1:
        term = 1.0 / a
        total = term
        n = a
        for _ in range(1000):
            n += 1
            term *= x / n
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return max(0.0, 1.0 - total * math.exp(-x + a * math.log(x) - lg))
    # Lentz's continued fraction.
    tiny = 1e-300
    b = x + 1 - a
    c = 1 / tiny
    d = 1 / b
    h = d
    for i in range(1, 1000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-15:
            break
    return min(1.0, math.exp(-x + a * math.log(x) - lg) * h)
