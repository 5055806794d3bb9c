"""File-size distributions: a lognormal body with a Pareto tail.

A ``HybridSize`` draws a size from a lognormal (``mu``, ``sigma`` of the natural log of bytes)
with probability ``weight``, otherwise from a Pareto with scale ``xm`` bytes and shape
``alpha``. Presets come from the seed papers (hFS's aging benchmark, Impressions). ``fit_sizes``
fits one to a recorded file system's sizes, so a test file system can be aged to look like a
production one.

Sampling uses ``random.Random``, whose stream Python keeps stable, so the same seed gives the
same sizes on every platform and numpy version.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from fsage.errors import WorkloadError

if TYPE_CHECKING:
    from fsage.layout import Layout

KIB = 1024
MIB = 1024 * 1024


@dataclass(frozen=True)
class HybridSize:
    """Lognormal body (weight ``weight``) + Pareto tail (``1 - weight``); sizes in bytes."""

    mu: float
    sigma: float
    weight: float = 1.0
    xm: float = 1.0
    alpha: float = 1.0
    #: Sizes are clipped to this many bytes (None: no cap); the caller can pass a tighter one.
    cap: int | None = None
    #: Probability of an empty file, drawn before the body/tail choice.
    zero: float = 0.0

    def __post_init__(self) -> None:
        if not (0.0 <= self.weight <= 1.0) or not (0.0 <= self.zero < 1.0):
            raise WorkloadError("size distribution: weight and zero must be in [0, 1]")
        if self.sigma <= 0 or self.xm <= 0 or self.alpha <= 0:
            raise WorkloadError("size distribution: sigma, xm and alpha must be positive")

    def sample_float(self, rng: random.Random) -> float:
        """One uncapped size as a real number (the zero-size draw included)."""
        if self.zero and rng.random() < self.zero:
            return 0.0
        if rng.random() < self.weight:
            return math.exp(rng.gauss(self.mu, self.sigma))
        # Inverse CDF of the Pareto: xm * U^(-1/alpha), U in (0, 1].
        return float(self.xm * (1.0 - rng.random()) ** (-1.0 / self.alpha))

    def sample(self, rng: random.Random, cap: int | None = None) -> int:
        """One size in whole bytes, clipped to ``cap`` (and to the distribution's own cap)."""
        x = self.sample_float(rng)
        limit = self.cap
        if cap is not None:
            limit = cap if limit is None else min(limit, cap)
        if limit is not None and x > limit:
            return max(0, int(limit))
        return round(x)

    def cdf(self, x: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """The uncapped CDF at sizes ``x`` (bytes)."""
        xs = np.asarray(x, dtype=np.float64)
        out = np.zeros_like(xs)
        pos = xs > 0
        logx = np.log(xs[pos])
        z = (logx - self.mu) / (self.sigma * math.sqrt(2.0))
        body = 0.5 * (1.0 + _erf(z))
        tail = np.where(xs[pos] >= self.xm, 1.0 - (self.xm / xs[pos]) ** self.alpha, 0.0)
        out[pos] = self.weight * body + (1.0 - self.weight) * tail
        return np.where(xs < 0, 0.0, self.zero + (1.0 - self.zero) * out)

    def mean(self) -> float:
        """Mean size in bytes (inf for a Pareto tail with alpha <= 1 and no cap)."""
        body = math.exp(self.mu + self.sigma**2 / 2)
        tail = math.inf if self.alpha <= 1 else self.alpha * self.xm / (self.alpha - 1)
        if self.weight == 1.0:
            tail = 0.0
        return (1 - self.zero) * (self.weight * body + (1 - self.weight) * tail)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HybridSize:
        try:
            return cls(
                mu=float(data["mu"]),
                sigma=float(data["sigma"]),
                weight=float(data.get("weight", 1.0)),
                xm=float(data.get("xm", 1.0)),
                alpha=float(data.get("alpha", 1.0)),
                cap=None if data.get("cap") is None else int(data["cap"]),
                zero=float(data.get("zero", 0.0)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise WorkloadError(f"bad size distribution {data!r}: {exc}") from None


def _erf(z: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    return np.asarray(np.vectorize(math.erf, otypes=[np.float64])(z), dtype=np.float64)


#: seed 004 §6.4 (hFS aging benchmark): 93% lognormal(9.357, 1.318), 7% Pareto(133 KiB, 1.1).
HFS_SURGE = HybridSize(mu=9.357, sigma=1.318, weight=0.93, xm=133 * KIB, alpha=1.1)
#: Impressions (Agrawal et al.): lognormal(9.48, 2.46) weight 0.99994, Pareto(512 MiB, 0.91).
IMPRESSIONS = HybridSize(mu=9.48, sigma=2.46, weight=0.99994, xm=512 * MIB, alpha=0.91)

SIZE_PRESETS: dict[str, HybridSize] = {"hfs-surge": HFS_SURGE, "impressions": IMPRESSIONS}


def ks_statistic(sample: npt.ArrayLike, dist: HybridSize) -> float:
    """Kolmogorov–Smirnov distance between an empirical sample and ``dist``'s CDF."""
    xs = np.sort(np.asarray(sample, dtype=np.float64))
    n = xs.shape[0]
    if n == 0:
        return 0.0
    f = dist.cdf(xs)
    hi = np.arange(1, n + 1) / n - f
    lo = f - np.arange(0, n) / n
    return float(max(hi.max(), lo.max()))


def ks_critical(n: int, alpha: float = 0.05) -> float:
    """Asymptotic critical value of the one-sample KS statistic."""
    c = math.sqrt(-0.5 * math.log(alpha / 2))
    return c / math.sqrt(n)


def fit_sizes(source: Layout | Sequence[int] | npt.ArrayLike) -> HybridSize:
    """Fit a lognormal body + Pareto tail to file sizes (a Layout's regular files, or sizes).

    Empty files become the ``zero`` weight. The tail share is chosen from a small grid by
    the smallest KS distance; the tail's scale is the matching quantile and its shape the Hill
    estimate above it; the body is the lognormal maximum-likelihood fit below it.
    """
    from fsage.layout import Layout

    if isinstance(source, Layout):
        sizes = source.files.size[source.files.is_regular()].astype(np.float64)
    else:
        sizes = np.asarray(source, dtype=np.float64).ravel()
    if sizes.size == 0:
        raise WorkloadError("cannot fit a size distribution: no files")
    zero = float(np.count_nonzero(sizes <= 0)) / sizes.size
    pos = np.sort(sizes[sizes > 0])
    if pos.size < 2:
        raise WorkloadError("cannot fit a size distribution: fewer than two non-empty files")
    best: HybridSize | None = None
    best_d = math.inf
    for tail in (0.0, 0.01, 0.02, 0.03, 0.05, 0.07, 0.1, 0.15, 0.2):
        k = round(pos.size * (1 - tail))
        if tail and (k < 2 or pos.size - k < 5):
            continue
        body = pos[:k] if tail else pos
        logs = np.log(body)
        sigma = float(logs.std()) or 1e-3
        if tail:
            xm = float(pos[k])
            above = pos[k:]
            s = float(np.log(above / xm).sum())
            alpha = (above.size / s) if s > 0 else 10.0
        else:
            xm, alpha = 1.0, 1.0
        cand = HybridSize(mu=float(logs.mean()), sigma=sigma, weight=1.0 - tail, xm=xm, alpha=alpha)
        d = ks_statistic(pos, cand)
        if d < best_d:
            best, best_d = cand, d
    assert best is not None
    return HybridSize(
        mu=best.mu,
        sigma=best.sigma,
        weight=best.weight,
        xm=best.xm,
        alpha=best.alpha,
        cap=int(pos[-1]),
        zero=zero,
    )
