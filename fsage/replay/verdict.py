"""The verdict on a recreation: tolerances from the noise floor of its op stream, what each
rule proves, and a plain copy as yardstick.

A recreation is judged on the distances ``fsage.replay.fidelity`` measures (``Fidelity
.distances``): every size bucket holding at least ``MIN_BUCKET_FILES`` files of the original
within its tolerance (the noise floor of that bucket, or ``MIN_TOLERANCE``, whichever is
larger), the path-order dynamic layout score likewise, and both free-space distances (by blocks
and by extents) within their noise floor + ``FREE_TOLERANCE``. The noise floor widens a
tolerance only so far (``allowed_noise``): to twice its fixed bound at most, and never to half
the distance of a plain copy, so a wide spread between a few runs cannot pass a recreation
that the fixed bounds or the copy say is far. The noise floor (``NoiseFloor``)
is how far two runs of the same op stream on the same kernel land from each other
(``fsage.replay.noise``): ext4's allocator is not deterministic, so no recreation can be asked
to come closer than that.

A floor measured at the judged snapshot also carries the yardstick of a plain copy (the
snapshot's files written in one go onto an empty file system, ``fsage.replay.unaged``): the
verdict says where the recreation lies between a rerun and a copy (``Verdict.copy_relative``),
and a floor whose tolerances would let the copy pass judges nothing faithful.

The scan criterion (``fsage.replay.fidelity_scan``): where a plain copy's modeled cold
path-order scan is outside ``SCAN_BAND`` of the original's, the recreation's must be within it.
``SCAN_JUDGED`` says whether a miss fails the verdict or is only reported.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from fsage.analyzer.analysis import bucket_range, size_bucket
from fsage.text import size_range

if TYPE_CHECKING:
    from fsage.layout import Layout

#: Size buckets with fewer files of the original than this are shown but not judged.
MIN_BUCKET_FILES = 50
#: The smallest tolerance of a bucket's layout score.
MIN_TOLERANCE = 0.02
#: Added to the free-space noise floor to get its tolerance.
FREE_TOLERANCE = 0.1
#: Runs of the op stream a floor should rest on (``fsage noise-floor``'s default); a verdict
#: against fewer says its floor is noisy. bench/verdict.py, at the last snapshots of four release
#: histories: floors of 3 runs resampled from 10 judged replays that land as close to the
#: original as reruns do faithful in 63-93% of cases, floors of 5 in 77-100%.
SOUND_RUNS = 5


def bucket_tolerance(noise: float) -> float:
    """A size bucket's layout-score tolerance given its noise."""
    return max(noise, MIN_TOLERANCE)


def free_tolerance(noise: float) -> float:
    """The free-space distance's tolerance given its noise."""
    return noise + FREE_TOLERANCE


#: Where a verdict's tolerances come from and what it then proves (``Fidelity.judge``). Both
#: rules take the tolerances from the runs' spread (their largest distance between each other):
#: a bias the runs share is never part of a tolerance. ``spread``: the recreation lies within the
#: runs' noise of the original (it is as close to the original as one rerun is to another).
#: ``original``: that, and the op stream itself reproduces the original: its runs land, on
#: average, within the same tolerances of it (needs a floor measured with the original, see
#: ``NoiseFloor.add_original``), so a stream whose every rerun is off in the same direction is
#: not passed even when one recreation happens to land close.
RULES = ("spread", "original")
DEFAULT_RULE = "spread"

#: Whether the scan criterion (``fsage.replay.fidelity_scan``) fails a verdict when it applies
#: and is missed.
SCAN_JUDGED = True

#: The distances a verdict judges, besides the size buckets ("bucket:MIN_BLOCKS").
FREE_BLOCKS = "free_blocks"
FREE_EXTENTS = "free_extents"
DYNAMIC = "dynamic"


def is_free(key: str) -> bool:
    return key in (FREE_BLOCKS, FREE_EXTENTS)


def tolerance(key: str, noise: float) -> float:
    """The tolerance of distance ``key`` given its noise."""
    return free_tolerance(noise) if is_free(key) else bucket_tolerance(noise)


#: The runs' spread widens a tolerance at most to this many times its fixed bound
#: (``MIN_TOLERANCE`` for scores, ``FREE_TOLERANCE`` for free space): a floor of three runs is
#: itself noisy, and one wide pair of runs would otherwise let a stream that is systematically
#: off pass (an open loop 0.276 from the original's free space passed a floor of 0.18).
SPREAD_CAP = 2.0
#: ... and never to this share of a plain copy's distance: a recreation half as far from the
#: original as a copy of the tree is far, however widely the runs spread.
COPY_SHARE = 0.5


def fixed_tolerance(key: str) -> float:
    """The tolerance of distance ``key`` without a noise floor."""
    return FREE_TOLERANCE if is_free(key) else MIN_TOLERANCE


def allowed_noise(key: str, noise: float, copy: float | None = None) -> float:
    """The part of the runs' spread ``noise`` that distance ``key``'s tolerance takes: the
    tolerance widens with the spread up to ``SPREAD_CAP`` times its fixed bound, and below
    half (``COPY_SHARE``) the plain copy's distance ``copy`` where that is wider than the
    fixed bound (a distance that far is far whatever the runs do)."""
    fixed = fixed_tolerance(key)
    cap = SPREAD_CAP * fixed
    if copy is not None:
        cap = min(cap, max(fixed, COPY_SHARE * abs(copy)))
    # free: tolerance = noise + FREE_TOLERANCE; scores: max(noise, MIN_TOLERANCE)
    return max(min(noise, cap - FREE_TOLERANCE if is_free(key) else cap), 0.0)


@dataclass
class NoiseFloor:
    """How far runs of one op stream land from each other: per size bucket (its smallest
    block count) the largest layout-score difference seen, the largest free-space distances
    (by blocks and by extents) and the largest difference of path-order
    dynamic layout scores; every pair's free-space distance (how wide the floor is); and, when
    measured at a snapshot, each run's distances to it and those of a plain copy."""

    by_bucket: dict[int, float] = field(default_factory=dict)
    free_tv: float = 0.0
    runs: int = 0
    note: str = ""
    free_tv_pairs: list[float] = field(default_factory=list)
    free_extents: float = 0.0
    free_extents_pairs: list[float] = field(default_factory=list)
    dynamic: float = 0.0
    #: The snapshot the runs were compared with (None: not compared).
    original_snapshot: int | None = None
    #: Each run's distances to the original (``Fidelity.distances``: signed score differences).
    to_original: list[dict[str, float]] = field(default_factory=list)
    #: A plain copy's distances to the original (None: not measured).
    copy: dict[str, float] | None = None
    #: That copy's modeled cold path-order scan (``fsage.replay.fidelity_scan.scan_profile``).
    copy_scan: dict[str, Any] | None = None

    def bucket(self, min_blocks: int) -> float:
        return self.by_bucket.get(int(min_blocks), 0.0)

    def noise(self, key: str) -> float:
        """The spread of distance ``key`` between runs (0 when not measured)."""
        if key == FREE_BLOCKS:
            return self.free_tv
        if key == FREE_EXTENTS:
            return self.free_extents
        if key == DYNAMIC:
            return self.dynamic
        return self.bucket(int(key.split(":")[1]))

    def add_original(self, original: Layout, runs: list[Layout], snapshot_id: int) -> None:
        """Measure each run's distances to ``original`` (for the ``original`` rule)."""
        from fsage.replay.fidelity import dynamic_score, fidelity

        self.original_snapshot = int(snapshot_id)
        dyn = dynamic_score(original)
        self.to_original = [
            fidelity(original, run, dynamic=(dyn, dynamic_score(run)), scan=False).distances()
            for run in runs
        ]

    def add_copy(self, original: Layout, copy: Layout) -> None:
        """Measure a plain copy's distances to ``original`` (the verdict's yardstick) and its
        modeled scan."""
        from fsage.replay.fidelity import fidelity

        fid = fidelity(original, copy)
        self.copy = {k: abs(v) for k, v in fid.distances().items()}
        self.copy_scan = fid.scan.recreated if fid.scan is not None else None

    def for_snapshot(self, snapshot_id: int) -> NoiseFloor:
        """This floor as it applies to judging ``snapshot_id``: what was measured against
        another snapshot (runs' distances, the copy) left out."""
        if self.original_snapshot == snapshot_id:
            return self
        return replace(self, original_snapshot=None, to_original=[], copy=None, copy_scan=None)

    def bias(self, key: str) -> float | None:
        """The runs' mean distance ``key`` to the original (signed for scores)."""
        xs = [d[key] for d in self.to_original if key in d]
        return sum(xs) / len(xs) if xs else None

    @property
    def to_original_free_tv(self) -> list[float]:
        return [d.get(FREE_BLOCKS, 0.0) for d in self.to_original]

    def check_rule(self, rule: str) -> None:
        if rule not in RULES:
            raise ValueError(f"unknown rule {rule!r}")
        if rule == "original" and self.original_snapshot is None:
            from fsage.errors import UsageError

            raise UsageError(
                "this noise floor has no distances to the original snapshot: measure it again "
                "with `fsage noise-floor` at that snapshot to judge by the original"
            )

    def free_tv_without_one(self) -> tuple[float, float] | None:
        """The free-space floor the runs would give with any one of them left out, smallest
        and largest: how much a single run decides the floor (None below 3 runs, or for a
        floor stored without its pairs). The pairs are in ``noise_between``'s order."""
        n = self.runs
        if n < 3 or len(self.free_tv_pairs) != n * (n - 1) // 2:
            return None
        pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
        floors = [
            max(d for (i, j), d in zip(pairs, self.free_tv_pairs, strict=True) if k not in (i, j))
            for k in range(n)
        ]
        return min(floors), max(floors)

    def describe(self, rule: str = DEFAULT_RULE) -> str:
        """How many runs the floor rests on and how wide their free-space distances spread."""
        xs = self.free_tv_pairs
        spread = f"{min(xs):.3f}-{max(xs):.3f}" if xs else f"{self.free_tv:.3f}"
        few = " (few: the floor is itself noisy)" if self.runs < SOUND_RUNS else ""
        out = f"{self.runs} runs{few}; free-space distance between runs {spread}"
        orig = self.to_original_free_tv
        if rule == "original" and orig:
            out += f", runs to snapshot {self.original_snapshot} {min(orig):.3f}-{max(orig):.3f}"
        return out

    def labelled(self, block_size: int) -> list[tuple[str, float]]:
        """(file-size label in bytes, layout-score difference) per bucket, smallest first."""
        out = []
        for lo, diff in sorted(self.by_bucket.items()):
            hi = bucket_range(int(size_bucket(np.array([lo]))[0]))[1]
            out.append((size_range(lo, hi, block_size), diff))
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "by_bucket": {str(k): v for k, v in sorted(self.by_bucket.items())},
            "free_tv": self.free_tv,
            "free_extents": self.free_extents,
            "dynamic": self.dynamic,
            "runs": self.runs,
            "note": self.note,
            "free_tv_pairs": self.free_tv_pairs,
            "free_extents_pairs": self.free_extents_pairs,
            "free_tv_without_one": self.free_tv_without_one(),
            "original_snapshot": self.original_snapshot,
            "to_original": self.to_original,
            "copy": self.copy,
            "copy_scan": self.copy_scan,
        }

    @classmethod
    def from_json(cls, data: Any) -> NoiseFloor:
        from fsage.errors import UsageError

        try:
            if "noise_floor" in data:
                data = data["noise_floor"]
            to_original = [
                {str(k): float(v) for k, v in d.items()} for d in data.get("to_original", [])
            ]
            orig = data.get("original_snapshot")
            copy = data.get("copy")
            return cls(
                by_bucket={int(k): float(v) for k, v in data["by_bucket"].items()},
                free_tv=float(data["free_tv"]),
                runs=int(data.get("runs", 0)),
                note=str(data.get("note", "")),
                free_tv_pairs=[float(x) for x in data.get("free_tv_pairs", [])],
                free_extents=float(data.get("free_extents", 0.0)),
                free_extents_pairs=[float(x) for x in data.get("free_extents_pairs", [])],
                dynamic=float(data.get("dynamic", 0.0)),
                # a floor stored before the runs' distances were kept whole has none to judge by
                original_snapshot=None if orig is None or not to_original else int(orig),
                to_original=to_original,
                copy=None if copy is None else {str(k): float(v) for k, v in copy.items()},
                copy_scan=_scan_profile(data.get("copy_scan")),
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            raise UsageError("not a noise floor (see fsage noise-floor)") from None


def _scan_profile(data: Any) -> dict[str, Any] | None:
    """A stored copy scan (``scan_profile``), checked; None where the floor has none."""
    if data is None:
        return None
    return {
        "seconds": {str(k): float(v) for k, v in data["seconds"].items()},
        "seeks": int(data["seeks"]),
        "blocks": int(data["blocks"]),
    }


@dataclass
class Verdict:
    faithful: bool
    reasons: list[str]
    free_tolerance: float
    noise_floor: NoiseFloor | None
    rule: str = DEFAULT_RULE
    #: Where the recreation lies between a rerun (0) and a plain copy (1), in its worst judged
    #: distance; None without a copy's distances.
    copy_relative: float | None = None
    #: The distance that decides ``copy_relative``.
    copy_worst: str | None = None
    #: Whether the plain copy itself is within the tolerances (then they judge nothing).
    copy_passes: bool | None = None
    #: The scan criterion's status (``ScanModel.status``; None: not modeled).
    scan: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "faithful": self.faithful,
            "reasons": self.reasons,
            "free_tolerance": self.free_tolerance,
            "rule": self.rule,
            "basis": self.basis(),
            "copy_relative": self.copy_relative,
            "copy_worst": self.copy_worst,
            "copy_passes": self.copy_passes,
            "scan": self.scan,
            "scan_judged": SCAN_JUDGED,
            "noise_floor": self.noise_floor.to_json() if self.noise_floor else None,
        }

    def basis(self) -> str:
        """What the tolerances rest on."""
        if self.noise_floor is None:
            return "no measured noise floor: fixed tolerances"
        return f"{self.rule} of {self.noise_floor.describe(self.rule)}"

    def yardstick(self) -> str:
        """Where the recreation lies between a rerun and a plain copy."""
        if self.copy_relative is None:
            return "no plain-copy yardstick (a noise floor measured at this snapshot has one)"
        return (
            f"{self.copy_relative:.2f} of the way from a rerun to a plain copy "
            f"(0 = as good as a rerun, 1 = no better than a copy; worst: {self.copy_worst})"
        )

    def line(self) -> str:
        if self.faithful:
            head = "verdict: FAITHFUL (within tolerance in every judged distance)"
        else:
            head = "verdict: NOT FAITHFUL: " + "; ".join(self.reasons)
        return f"{head}; {self.yardstick()} [{self.basis()}]"


def judge_distances(
    dist: dict[str, float],
    judged: dict[str, str],
    floor: NoiseFloor | None = None,
    rule: str = DEFAULT_RULE,
    copy: dict[str, float] | None = None,
) -> Verdict:
    """The verdict on distances alone (``Fidelity.distances``; ``judged``: the keys judged
    and their labels, ``Fidelity.judged``): each within its tolerance, under ``rule`` the runs'
    bias too, and the place between a rerun and ``copy`` (else the floor's copy)."""
    if floor is not None:
        floor.check_rule(rule)
    elif rule not in RULES:
        raise ValueError(f"unknown rule {rule!r}")
    copy = copy if copy is not None else (floor.copy if floor else None)

    def noise(key: str) -> float:
        return floor_allowance(floor, key, copy)

    reasons: list[str] = []
    for key, label in judged.items():
        tol, d = tolerance(key, noise(key)), dist.get(key)
        if d is None:
            reasons.append(f"{label}: none in the recreation, tolerance {tol:.3f}")
        elif abs(d) > tol:
            shown = f"{d:.3f}" if is_free(key) else f"{d:+.3f}"
            reasons.append(f"{label}: distance {shown}, tolerance {tol:.3f}")
    if rule == "original" and floor is not None:
        for key, label in judged.items():
            bias, tol = floor.bias(key), tolerance(key, noise(key))
            if bias is not None and abs(bias) > tol:
                runs = [d[key] for d in floor.to_original if key in d]
                reasons.append(
                    f"the op stream's runs land off the original in {label}: "
                    f"{min(runs):+.3f} to {max(runs):+.3f} (mean {bias:+.3f}), "
                    f"tolerance {tol:.3f}"
                )
    relative, worst, copy_passes = _against_copy(copy, dist, judged, noise)
    if copy_passes:
        reasons.append(
            "a plain copy is within these tolerances too: they cannot tell a recreation from a copy"
        )
    free_tol = free_tolerance(noise(FREE_BLOCKS))
    return Verdict(not reasons, reasons, free_tol, floor, rule, relative, worst, copy_passes)


def floor_allowance(floor: NoiseFloor | None, key: str, copy: dict[str, float] | None) -> float:
    """The runs' spread of distance ``key`` as its tolerance takes it (``allowed_noise``;
    0 without a floor), given the plain copy's distances ``copy``."""
    if floor is None:
        return 0.0
    return allowed_noise(key, floor.noise(key), None if copy is None else copy.get(key))


def _against_copy(
    copy: dict[str, float] | None,
    dist: dict[str, float],
    judged: dict[str, str],
    noise: Callable[[str], float],
) -> tuple[float | None, str | None, bool | None]:
    """(where the recreation lies between a rerun and the copy in its worst judged
    distance, that distance's label, whether the copy passes every judged tolerance).
    A distance counts where the copy lands outside its tolerance (elsewhere the verdict
    cannot tell a copy from a rerun): (recreation - noise) / (copy - noise), at least 0."""
    if copy is None:
        return None, None, None
    passes = all(abs(copy.get(k, 1.0)) <= tolerance(k, noise(k)) for k in judged)
    best: tuple[float, str] | None = None
    for key, label in judged.items():
        n, c = noise(key), abs(copy.get(key, 0.0))
        if c <= tolerance(key, n):
            continue
        d = dist.get(key)
        r = 1.0 if d is None else max(abs(d) - n, 0.0) / (c - n)
        if best is None or r > best[0]:
            best = (r, label)
    if best is None:
        return None, None, passes
    return best[0], best[1], passes


__all__ = [
    "COPY_SHARE",
    "DEFAULT_RULE",
    "DYNAMIC",
    "FREE_BLOCKS",
    "FREE_EXTENTS",
    "FREE_TOLERANCE",
    "MIN_BUCKET_FILES",
    "MIN_TOLERANCE",
    "RULES",
    "SCAN_JUDGED",
    "SOUND_RUNS",
    "SPREAD_CAP",
    "NoiseFloor",
    "Verdict",
    "allowed_noise",
    "bucket_tolerance",
    "fixed_tolerance",
    "floor_allowance",
    "free_tolerance",
    "is_free",
    "judge_distances",
    "tolerance",
]
