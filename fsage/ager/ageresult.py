"""What ``fsage age`` reports of a run: ``AgeResult``, and the notice of a limit that ended a
generated run before the fill and churn asked for."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fsage.ager.generator import Generator
from fsage.ager.targets import Target


@dataclass
class AgeResult:
    target: str
    description: str
    ops: int = 0
    bytes_written: int = 0
    skipped: int = 0
    nospace: int = 0
    fullness: float = 0.0
    elapsed: float = 0.0
    interrupted: bool = False
    signal: int = 0  # what interrupted it: SIGINT (Ctrl-C) or SIGTERM
    resumed_from: int = 0
    finished: bool = False
    phase: str = ""
    #: What ended the run: fill, churn, ops-limit, converged, written, updates, prefragment
    #: (generated workloads), end-of-stream (--ops), interrupted.
    stopped_by: str = ""
    #: The op stream actually run (JSON Lines with a header): ``fsage age X --ops`` replays it.
    journal: str | None = None
    #: Process CPU time during the run, and the share of the run's wall time (snapshots left
    #: out) spent outside the executor's ops: generating, dispatching, keeping the record.
    cpu_user_s: float = 0.0
    cpu_system_s: float = 0.0
    own_share: float = 0.0
    snapshots: list[int] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    convergence: dict[str, Any] | None = None
    run_id: int | None = None  # the aging_runs row, when run with a database
    #: What the run (all of it, across resumes) changed on disk: ``TreeChange.to_json``;
    #: None when the tree it started on is not known.
    changes: dict[str, int] | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _limit_notice(res: AgeResult, gen: Generator, tgt: Target) -> bool:
    """Say when a limit other than the fill and churn asked for ended the run."""
    p = gen.profile
    if res.stopped_by == "ops-limit":
        full = tgt.executor.fullness()
        res.notices.append(
            f"stopped by the op limit of {p.ops_limit:,} ops"
            + (
                f" before the fill target {p.fill:.2f} was reached (fullness {full:.3f})"
                if gen.stats.phase == "fill"
                else ""
            )
            + "; give --ops-limit, or --fill/--churn without it, to age further"
        )
        return True
    return False
