"""When the closed loop gives up on an interval: after rounds that do not reach a state nearer
than the nearest one so far, not after rounds that only fail to beat the round before (a loop
whose rounds each mend a little of what the one before lost drifts away for its whole budget).

The steering's measurements are scripted here: the rule is about the sequence of gaps only.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

import fsage.replay.closedloop as closedloop
from fsage.replay.closedloop import STALE_ROUNDS, Steerer
from fsage.replay.interval import Budget


def _steer(monkeypatch: pytest.MonkeyPatch, gaps: list[float], rounds: int = 40) -> Any:
    """Steer one interval whose measured gap is ``gaps[0]`` before the first round and
    ``gaps[k]`` after round ``k`` (the last repeated)."""
    seen = iter(gaps)
    last = [gaps[0]]

    def judge(_target: object, _state: object) -> dict[str, Any]:
        last[0] = next(seen, last[0])
        return {"gap": last[0], "buckets_ok": False, "free_ok": True, "dynamic_ok": True,
                "buckets": [], "free_tv": 0.0}  # fmt: skip

    target = SimpleNamespace(free_fractions=lambda: {}, free={}, free_counts={})
    monkeypatch.setattr(closedloop, "target_from_layout", lambda *_a: target)
    monkeypatch.setattr(closedloop, "judge", judge)
    monkeypatch.setattr(closedloop, "_gap", lambda rep: rep["gap"])
    monkeypatch.setattr(closedloop, "_distance", lambda rep: rep["gap"])
    monkeypatch.setattr(closedloop, "_point", lambda _c, rep, gap, *_a: {"gap": gap})
    monkeypatch.setattr(closedloop, "_off", lambda _rep: [])
    monkeypatch.setattr(closedloop, "evidence", lambda *_a: {})
    monkeypatch.setattr(closedloop, "changed_files", lambda *_a: ["a file"])
    monkeypatch.setattr(Steerer, "_measure", lambda self: SimpleNamespace(target=None))
    monkeypatch.setattr(Steerer, "_round", lambda self, *_a: None)
    monkeypatch.setattr(Steerer, "_steerable", lambda self, _rep: True)
    budget = Budget(rounds=rounds, last_factor=1, seconds=600.0)
    steerer = Steerer(lambda _op: 0, lambda: None, budget)  # type: ignore[arg-type,return-value]
    return steerer.steer(2, None, None, None, 1 << 20)  # type: ignore[arg-type]


def test_rounds_that_only_beat_the_round_before_are_no_progress(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # nearest after round 2; then each round loses some and the next wins a little of it back
    drift = [0.64, 0.32, 0.27, 0.33, 0.31, 0.32, 0.31, 0.34, 0.33, 0.38, 0.37, 0.42, 0.41]
    churn = _steer(monkeypatch, drift + [0.45, 0.44] * 10)
    assert churn.stopped == "no progress"
    assert churn.rounds == 2 + STALE_ROUNDS, [p["gap"] for p in churn.trace]


def test_a_new_nearest_state_keeps_the_interval_going(monkeypatch: pytest.MonkeyPatch) -> None:
    # two rounds lost, then one nearer than any before: the count starts again from there
    gaps = [0.64, 0.40, 0.45, 0.44, 0.30, 0.35, 0.33, 0.34]
    churn = _steer(monkeypatch, gaps)
    assert churn.stopped == "no progress"
    assert churn.rounds == 4 + STALE_ROUNDS
