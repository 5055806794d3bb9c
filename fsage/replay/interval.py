"""One interval of a closed-loop replay: what its steering may spend (``Budget``), the churn it
inferred with its per-round trace (``IntervalChurn``), and the comparison each round is judged
by (the matcher's, with the free space by extent counts as well as by blocks)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fsage.ager.match_target import (
    DYNAMIC_TOL,
    FREE_TV,
    SCORE_TOL,
    LayoutTarget,
    compare,
    distance,
)
from fsage.replay.freeshape import count_distance


@dataclass
class Budget:
    """What one interval's steering may spend: inferred bytes up to ``bytes_factor`` times the
    bytes its visible ops wrote (at least ``min_bytes``), ``ops`` ops, ``seconds`` of wall
    time and ``rounds`` measurements; the last interval (the snapshot a recreation is judged
    at) ``rounds`` times ``last_factor`` of them, and as many more rounds without progress
    before it gives up, every other interval ``rounds`` over that factor (a round costs a
    remount and an offline read: the time goes where the verdict is taken)."""

    bytes_factor: float = 3.0
    min_bytes: int = 1 << 20
    ops: int = 50_000
    seconds: float = 120.0
    rounds: int = 10
    last_factor: int = 2

    def rounds_for(self, last: bool) -> int:
        f = max(self.last_factor, 1)
        return self.rounds * f if last else max(self.rounds // f, 1)

    def bytes_for(self, visible: int) -> int:
        return max(int(self.bytes_factor * visible), self.min_bytes)

    def to_json(self) -> dict[str, Any]:
        return {
            "bytes_factor": self.bytes_factor,
            "min_bytes": self.min_bytes,
            "ops": self.ops,
            "seconds": self.seconds,
            "rounds": self.rounds,
            "last_factor": self.last_factor,
        }


@dataclass
class IntervalChurn:
    """The unseen churn inferred for one snapshot interval."""

    snapshot: int
    visible_bytes: int
    inferred_bytes: int = 0
    inferred_ops: int = 0
    #: rewrite (by rename, whole), interleaved (rewrites in alternating pieces), mend (a
    #: fragmented file rewritten at once), join (moved to join free extents), spacer and
    #: neighbour (a short-lived file and the rewrite placed after it).
    kinds: dict[str, int] = field(default_factory=dict)
    rounds: int = 0
    #: The matcher's distance (worst excess over tolerance) before and after steering.
    distance_before: float = 0.0
    distance_after: float = 0.0
    matched: bool = False
    stopped: str = ""
    seconds: float = 0.0
    evidence: dict[str, int] = field(default_factory=dict)
    #: What is still off after steering (bucket labels, "free space", "locality").
    off: list[str] = field(default_factory=list)
    #: Each measurement (before the first round, then after each): inferred bytes so far,
    #: the free-space distance by blocks and by counts, the summed excess over the
    #: tolerances and, after a round, the moves it made by kind (``moves``).
    trace: list[dict[str, Any]] = field(default_factory=list)
    #: Free space shaped offline (``fsage.replay.offshape``) in rounds after a mounted round
    #: that did not bring it nearer: files put (plugs), how many took the free extent they
    #: were put at (landed), rounds ({} where none ran).
    offline: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def judge(target: LayoutTarget, now: LayoutTarget) -> dict[str, Any]:
    """The matcher's comparison (``compare``), with the free space judged by the count of
    free extents per bucket as well as by blocks (``free_count``): the blocks' histogram
    is decided by the few largest extents, and a recreation in twice the pieces passed it."""
    rep = compare(target, now)
    rep["free_count"] = count_distance(target, now)
    rep["free_ok"] = bool(rep["free_ok"] and rep["free_count"] <= FREE_TV)
    rep["matched"] = bool(rep["matched"] and rep["free_ok"])
    return rep


def _free_excess(rep: dict[str, Any]) -> float:
    """The free space's distance beyond its tolerance: the worse of by blocks and by counts."""
    tv = rep["free_tv"]
    if tv is None:
        return 0.0
    return float(max(0.0, tv - FREE_TV, rep.get("free_count", 0.0) - FREE_TV))


def _distance(rep: dict[str, Any]) -> float:
    """The matcher's distance, the free space's by counts included."""
    return float(max(distance(rep), _free_excess(rep)))


def _gap(rep: dict[str, Any]) -> float:
    """Every dimension's excess over its tolerance, summed: progress in one bucket counts
    even while another decides the matcher's distance."""
    gap = 0.0
    for r in rep["buckets"]:
        if r["judged"]:
            d = 1.0 if r["score"] is None else abs(r["score"] - r["target_score"])
            gap += max(0.0, d - SCORE_TOL)
    gap += _free_excess(rep)
    want = rep["target_locality"].get("dynamic_score")
    have = rep["locality"].get("dynamic_score")
    if want is not None and have is not None and not rep["dynamic_ok"]:
        gap += max(0.0, abs(have - want) - DYNAMIC_TOL)
    return gap


def _point(
    churn: IntervalChurn, rep: dict[str, Any], gap: float, before: dict[str, int] | None = None
) -> dict[str, Any]:
    """One trace point; ``before``: the interval's moves by kind before the round measured."""
    tv = rep["free_tv"]
    out: dict[str, Any] = {"bytes": churn.inferred_bytes,
                           "free_tv": -1.0 if tv is None else round(tv, 4),
                           "free_count": round(rep.get("free_count", 0.0), 4),
                           "gap": round(gap, 4)}  # fmt: skip
    if before is not None:
        out["moves"] = {k: n - before.get(k, 0) for k, n in churn.kinds.items()
                        if n != before.get(k, 0)}  # fmt: skip
    return out


def _off(rep: dict[str, Any]) -> list[str]:
    out = [r["label"] for r in rep["buckets"] if not r["ok"]]
    if not rep["free_ok"]:
        out.append("free space")
    if not rep["dynamic_ok"]:
        out.append("locality")
    return out
