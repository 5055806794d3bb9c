"""File-size distribution: a lognormal body with a Pareto tail (seed 004's model), fitted by
maximum likelihood with numpy alone.

* body: sizes in (0, threshold] — lognormal MLE, mu = mean(ln x), sigma = std(ln x)
  (the MLE uses the 1/n variance);
* tail: sizes above the threshold — Pareto with x_min = threshold, alpha by the Hill / MLE
  estimator alpha = k / Σ ln(x_i / x_min).

The threshold defaults to the 95th percentile of the non-empty sizes.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt


@dataclass
class SizeFit:
    files: int  # non-empty sizes fitted
    mu: float
    sigma: float
    threshold: float
    tail_fraction: float
    alpha: float | None  # None when the tail has fewer than two distinct sizes

    def to_json(self) -> dict[str, Any]:
        return {
            "files": self.files,
            "lognormal_mu": self.mu,
            "lognormal_sigma": self.sigma,
            "tail_threshold": self.threshold,
            "tail_fraction": self.tail_fraction,
            "pareto_alpha": self.alpha,
        }

    def density(self, x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """Mixture density in x (bytes): body weight (1 - tail) lognormal truncated at the
        threshold, tail weight Pareto above it."""
        x = np.asarray(x, np.float64)
        out = np.zeros_like(x)
        body = (x > 0) & (x <= self.threshold)
        if self.sigma > 0:
            z = (np.log(x[body]) - self.mu) / self.sigma
            pdf = np.exp(-0.5 * z * z) / (x[body] * self.sigma * np.sqrt(2 * np.pi))
            zt = (np.log(self.threshold) - self.mu) / (self.sigma * np.sqrt(2))
            cdf_t = 0.5 * (1 + _erf(zt))
            out[body] = (1 - self.tail_fraction) * pdf / max(cdf_t, 1e-12)
        if self.alpha is not None:
            tail = x > self.threshold
            a = self.alpha
            out[tail] = self.tail_fraction * a * self.threshold**a / x[tail] ** (a + 1)
        return out

    def cdf(self, x: float) -> float:
        """Fitted probability that a non-empty file is at most x bytes."""
        import math

        if x <= 0:
            return 0.0
        p = self.tail_fraction
        if x <= self.threshold or self.alpha is None:
            if self.sigma <= 0:
                body = 1.0 if x >= math.exp(self.mu) else 0.0
            else:
                zt = (math.log(self.threshold) - self.mu) / (self.sigma * math.sqrt(2))
                z = (math.log(min(x, self.threshold)) - self.mu) / (self.sigma * math.sqrt(2))
                body = (1 + math.erf(z)) / max(1 + math.erf(zt), 1e-300)
            return (1 - p) * body + (p if x > self.threshold else 0.0)
        return float((1 - p) + p * (1 - (self.threshold / x) ** self.alpha))

    def expected_counts(self, edges: list[float]) -> list[float]:
        """Expected number of files (of ``files``) between consecutive edges."""
        c = [self.cdf(e) for e in edges]
        return [self.files * (b - a) for a, b in itertools.pairwise(c)]


def _erf(x: float) -> float:
    import math

    return math.erf(x)


def fit_sizes(sizes: npt.NDArray[Any], threshold: float | None = None) -> SizeFit | None:
    x = np.asarray(sizes, np.float64)
    x = x[x > 0]
    if x.size < 2:
        return None
    if threshold is None:
        threshold = float(np.quantile(x, 0.95))
    body = x[x <= threshold]
    tail = x[x > threshold]
    if body.size == 0:
        return None
    logs = np.log(body)
    mu = float(logs.mean())
    sigma = float(logs.std())
    alpha: float | None = None
    if tail.size >= 2:
        s = float(np.log(tail / threshold).sum())
        if s > 0:
            alpha = tail.size / s
    return SizeFit(int(x.size), mu, sigma, float(threshold), tail.size / x.size, alpha)
