"""Aging profiles: what a generated workload looks like.

A profile names the file-size distribution, the namespace model (probability that a create
makes a directory, depth limit and weights), the phases (fill to a fullness target, then churn
in a configurable mix), and optionally target histograms of file size, age (in ops) and depth
for convergence mode.

``load_profile`` accepts a preset name (``PRESETS``), a JSON profile file, or a Geriatrix
profile (a directory holding ``size_distribution.txt``, ``age_distribution.txt`` and
``dir_distribution.txt``, or one of those files): each of those files is a count line, then
``<value> <weight> [...]`` lines. They are read as Geriatrix reads them:

- sizes: every file of bucket ``i`` is exactly ``value[i]`` bytes (not a range);
- ages: the bucket edges are relative — bucket ``i`` ends at ``value[i] / value[-1]`` of the
  run Geriatrix plans (see below): a file's age is ``(now - birth) / plan`` in ops, so the
  histogram is the target's at the plan's end;
- directories: ``<depth> <weight> <sub-directories>``; a file at depth ``d`` has ``d``
  directories above it (0: the root), and lives in one of ``sub-directories`` sibling
  directories ``d1/d2/.../d<d-1>/d<k>`` (0 sub-directories: the one directory ``.../d<d>``);
- the fill is creates only; churn is half creates, half deletes.

Geriatrix plans its run from the age histogram: bucket ``i`` must hold a share ``f_i`` of the
files, all born within its share ``w_i`` of the ops, and churn makes a file every other op, so
the age histogram is reachable only after about ``max(2 * f_i * files / w_i)`` ops (1.14M ops
for its agrawal profile on 2 GiB at 0.8 full, about 77 times the files);
``Generator.age_ops_needed`` gives that bound. The generator fixes it as its plan when the
fill ends (``Generator.age_plan``) and chooses deletions so that the ages match at the plan's
end; a run that stops short of it says so.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fsage.ager.distributions import HFS_SURGE, IMPRESSIONS, HybridSize
from fsage.ager.patterns import NEWS_SIZES, PATTERN_KINDS
from fsage.errors import WorkloadError

MODES = ("hybrid", "random-update", "prefragment", "convergence")

#: Churn mix of the default profiles: relative weights of each op kind after the fill.
DEFAULT_MIX: dict[str, float] = {
    "create": 0.35,
    "delete": 0.35,
    "append": 0.1,
    "overwrite": 0.1,
    "truncate": 0.05,
    "rename": 0.05,
}
#: Op kinds and the write patterns of ``fsage.ager.patterns`` (bursts of ops).
MIX_KINDS = tuple(DEFAULT_MIX) + PATTERN_KINDS


@dataclass(frozen=True)
class Histogram:
    """Target histogram: bucket ``i`` holds values in (edges[i-1], edges[i]] (the first from 0)."""

    edges: tuple[float, ...]
    weights: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.edges or len(self.edges) != len(self.weights):
            raise WorkloadError("histogram: edges and weights must be non-empty, equal length")
        if any(b <= a for a, b in zip(self.edges, self.edges[1:], strict=False)):
            raise WorkloadError("histogram: edges must increase")
        if any(w < 0 for w in self.weights) or sum(self.weights) <= 0:
            raise WorkloadError("histogram: weights must be non-negative with a positive sum")

    @property
    def fractions(self) -> list[float]:
        total = sum(self.weights)
        return [w / total for w in self.weights]

    def bucket(self, value: float) -> int:
        """Index of the bucket holding ``value``; values past the last edge go to the last."""
        return min(bisect.bisect_left(self.edges, value), len(self.edges) - 1)

    def to_json(self) -> dict[str, Any]:
        return {"edges": list(self.edges), "weights": list(self.weights)}

    @classmethod
    def from_json(cls, data: Any) -> Histogram:
        try:
            return cls(
                tuple(float(e) for e in data["edges"]), tuple(float(w) for w in data["weights"])
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise WorkloadError(f"bad histogram {data!r}: {exc}") from None


@dataclass(frozen=True)
class Profile:
    name: str
    sizes: HybridSize = HFS_SURGE
    mode: str = "hybrid"
    #: Fullness to fill to (blocks in use ÷ all blocks, as statvfs reports them).
    fill: float = 0.8
    #: Churn until this many times the capacity has been written after the fill (0: no churn).
    churn: float = 2.0
    #: Stop after this many ops in all (None: no limit).
    ops_limit: int | None = None
    #: Probability that a create makes a directory (seed 004: 1/N with N = 64 files per dir).
    dir_prob: float = 1.0 / 64
    max_depth: int = 16
    #: Relative weight of choosing a parent at depth 0, 1, ... (None: any directory alike).
    depth_weights: tuple[float, ...] | None = None
    mix: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_MIX))
    #: Emit an fsync after every Nth data-writing op, a sync after every Nth op (0: never).
    fsync_every: int = 0
    sync_every: int = 0
    #: random-update: updates per block initially written; block size of the model.
    update_factor: float = 10.0
    block_size: int = 4096
    #: Convergence mode: target histograms and when to stop.
    size_hist: Histogram | None = None
    age_hist: Histogram | None = None
    depth_hist: Histogram | None = None
    #: Age histogram edges are fractions of the ops so far (Geriatrix), not op counts.
    age_relative: bool = False
    #: Sibling directories per depth-histogram bucket (Geriatrix's third column).
    depth_dirs: tuple[int, ...] | None = None
    #: Converged when every target histogram passes a chi-square goodness-of-fit test at
    #: this confidence and no bucket's fraction is further than ``tolerance`` from its target.
    confidence: float = 0.95
    tolerance: float = 0.02
    check_every: int = 1000

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise WorkloadError(f"profile {self.name}: unknown mode {self.mode!r}")
        if not 0.0 < self.fill < 1.0:
            raise WorkloadError(f"profile {self.name}: fill must be in (0, 1), got {self.fill}")
        if self.churn < 0 or not 0.0 <= self.dir_prob < 1.0:
            raise WorkloadError(f"profile {self.name}: churn must be >= 0, dir_prob in [0, 1)")
        unknown = set(self.mix) - set(MIX_KINDS)
        if unknown or sum(self.mix.values()) <= 0 or any(v < 0 for v in self.mix.values()):
            raise WorkloadError(
                f"profile {self.name}: mix takes non-negative weights of {', '.join(MIX_KINDS)}"
            )
        if self.mode == "convergence" and self.size_hist is None:
            raise WorkloadError(f"profile {self.name}: convergence mode needs a size histogram")
        if not 0.0 < self.confidence < 1.0 or self.check_every < 1:
            raise WorkloadError(
                f"profile {self.name}: confidence must be in (0, 1), check_every >= 1"
            )
        if self.depth_dirs is not None and (
            self.depth_hist is None
            or len(self.depth_dirs) != len(self.depth_hist.edges)
            or any(n < 0 for n in self.depth_dirs)
        ):
            raise WorkloadError(
                f"profile {self.name}: depth_dirs needs one count >= 0 per depth_hist bucket"
            )

    def with_overrides(self, **kw: Any) -> Profile:
        return replace(self, **{k: v for k, v in kw.items() if v is not None})

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "sizes": self.sizes.to_json(),
            "mode": self.mode,
            "fill": self.fill,
            "churn": self.churn,
            "ops_limit": self.ops_limit,
            "dir_prob": self.dir_prob,
            "max_depth": self.max_depth,
            "depth_weights": None if self.depth_weights is None else list(self.depth_weights),
            "mix": dict(sorted(self.mix.items())),
            "fsync_every": self.fsync_every,
            "sync_every": self.sync_every,
            "update_factor": self.update_factor,
            "block_size": self.block_size,
            "tolerance": self.tolerance,
            "confidence": self.confidence,
            "check_every": self.check_every,
            "age_relative": self.age_relative,
            "depth_dirs": None if self.depth_dirs is None else list(self.depth_dirs),
        }
        for key in ("size_hist", "age_hist", "depth_hist"):
            h: Histogram | None = getattr(self, key)
            out[key] = None if h is None else h.to_json()
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any], name: str = "profile") -> Profile:
        if not isinstance(data, dict):
            raise WorkloadError(f"profile {name}: not a JSON object")
        known = {
            "name", "sizes", "mode", "fill", "churn", "ops_limit", "dir_prob", "max_depth",
            "depth_weights", "mix", "fsync_every", "sync_every", "update_factor",
            "block_size", "size_hist", "age_hist", "depth_hist", "tolerance", "check_every",
            "base", "confidence", "age_relative", "depth_dirs",
        }  # fmt: skip
        unknown = set(data) - known
        if unknown:
            raise WorkloadError(f"profile {name}: unknown keys {', '.join(sorted(unknown))}")
        base = get_preset(str(data["base"])) if "base" in data else Profile(name=name)
        kw: dict[str, Any] = {}
        try:
            for key in ("mode",):
                if key in data:
                    kw[key] = str(data[key])
            for key in ("fill", "churn", "dir_prob", "update_factor", "tolerance", "confidence"):
                if key in data:
                    kw[key] = float(data[key])
            for key in ("max_depth", "fsync_every", "sync_every", "block_size", "check_every"):
                if key in data:
                    kw[key] = int(data[key])
            if "ops_limit" in data:
                kw["ops_limit"] = None if data["ops_limit"] is None else int(data["ops_limit"])
            if "sizes" in data:
                sizes = data["sizes"]
                kw["sizes"] = (
                    get_preset(sizes).sizes
                    if isinstance(sizes, str)
                    else HybridSize.from_json(sizes)
                )
            if data.get("depth_weights") is not None:
                kw["depth_weights"] = tuple(float(w) for w in data["depth_weights"])
            if "age_relative" in data:
                kw["age_relative"] = bool(data["age_relative"])
            if data.get("depth_dirs") is not None:
                kw["depth_dirs"] = tuple(int(n) for n in data["depth_dirs"])
            if "mix" in data:
                kw["mix"] = {str(k): float(v) for k, v in data["mix"].items()}
            for key in ("size_hist", "age_hist", "depth_hist"):
                if data.get(key) is not None:
                    kw[key] = Histogram.from_json(data[key])
        except (TypeError, ValueError, AttributeError) as exc:
            raise WorkloadError(f"profile {name}: {exc}") from None
        return replace(base, name=str(data.get("name", name)), **kw)


_HFS_MIX = {"create": 0.5, "delete": 0.5}
#: The hFS aging benchmark stops on its op count, not on bytes written.
_HFS_CHURN = 1000.0

PRESETS: dict[str, Profile] = {
    "hfs-surge": Profile(name="hfs-surge", sizes=HFS_SURGE),
    "impressions": Profile(name="impressions", sizes=IMPRESSIONS),
    # seed 004 §6.4: creates and deletes only; the create probability falls as the fs fills.
    "hfs-aging": Profile(
        name="hfs-aging", sizes=HFS_SURGE, mix=_HFS_MIX, churn=_HFS_CHURN, ops_limit=10_000
    ),
    "hfs-aging-10k": Profile(
        name="hfs-aging-10k", sizes=HFS_SURGE, mix=_HFS_MIX, churn=_HFS_CHURN, ops_limit=10_000
    ),
    "hfs-aging-20k": Profile(
        name="hfs-aging-20k", sizes=HFS_SURGE, mix=_HFS_MIX, churn=_HFS_CHURN, ops_limit=20_000
    ),
    "hfs-aging-40k": Profile(
        name="hfs-aging-40k", sizes=HFS_SURGE, mix=_HFS_MIX, churn=_HFS_CHURN, ops_limit=40_000
    ),
    # seed 001 §5.2.1.1: fill sequentially to U, then 10x as many random block updates as
    # blocks written, a sync after every fourth write.
    "random-update": Profile(name="random-update", mode="random-update", sync_every=4),
    # seed 001 §6.3: 40% of the disk in never-referenced 8-block chunks spread evenly.
    "prefragment": Profile(name="prefragment", mode="prefragment", fill=0.4, churn=0.0),
}
# Presets of real use built from the write patterns of fsage.ager.patterns (PRESET_DOCS there
# says what each models).
PRESETS.update(
    {
        "desktop": Profile(
            name="desktop",
            sizes=HFS_SURGE,
            mix={
                "create": 0.2,
                "delete": 0.2,
                "append": 0.04,
                "overwrite": 0.04,
                "truncate": 0.02,
                "rename": 0.03,
                "replace": 0.15,
                "log": 0.1,
                "streams": 0.06,
                "prealloc": 0.04,
                "tree": 0.06,
                "rmtree": 0.06,
            },
        ),
        "news": Profile(
            name="news",
            sizes=NEWS_SIZES,
            dir_prob=1.0 / 256,
            mix={"spool": 0.85, "log": 0.1, "create": 0.025, "delete": 0.025},
        ),
        "vcs": Profile(
            name="vcs",
            sizes=HFS_SURGE,
            mix={
                "tree": 0.25,
                "replace": 0.4,
                "rmtree": 0.15,
                "log": 0.05,
                "create": 0.075,
                "delete": 0.075,
            },
        ),
        "database": Profile(
            name="database",
            sizes=HFS_SURGE,
            mix={"dbwrite": 0.6, "log": 0.25, "create": 0.075, "delete": 0.075},
        ),
        "mail": Profile(
            name="mail",
            sizes=HFS_SURGE,
            mix={"trickle": 0.5, "create": 0.05, "delete": 0.3, "replace": 0.1, "log": 0.05},
        ),
    }
)


def get_preset(name: str) -> Profile:
    try:
        return PRESETS[name]
    except KeyError:
        raise WorkloadError(
            f"unknown profile {name!r} (presets: {', '.join(sorted(PRESETS))}, "
            "or a JSON profile file, or a Geriatrix profile directory)"
        ) from None


GERIATRIX_FILES = {
    "size_distribution.txt": "size_hist",
    "age_distribution.txt": "age_hist",
    "dir_distribution.txt": "depth_hist",
}


def _geriatrix_rows(text: str, where: str, columns: int) -> list[list[float]]:
    """The ``count`` rows after a Geriatrix file's count line, ``columns`` numbers each."""
    lines = [ln.split() for ln in text.splitlines()]
    lines = [ln for ln in lines if ln]
    try:
        count = int(lines[0][0])
        rows = lines[1 : 1 + count]
        if len(rows) != count or any(len(r) < columns for r in rows):
            raise ValueError(f"{count} rows of {columns} numbers announced")
        return [[float(x) for x in r[:columns]] for r in rows]
    except (IndexError, ValueError) as exc:
        raise WorkloadError(f"{where}: not a Geriatrix distribution ({exc})") from None


def parse_geriatrix(text: str, where: str = "geriatrix profile") -> Histogram:
    """One Geriatrix distribution file: a count line, then ``<value> <weight> [...]`` lines."""
    rows = _geriatrix_rows(text, where, 2)
    return Histogram(tuple(r[0] for r in rows), tuple(r[1] for r in rows))


def parse_geriatrix_ages(text: str, where: str = "age_distribution.txt") -> Histogram:
    """Geriatrix age buckets as fractions of the run so far: edge ``i`` = value[i] / value[-1]."""
    h = parse_geriatrix(text, where)
    last = h.edges[-1]
    if h.edges[0] <= 0:
        raise WorkloadError(f"{where}: age bucket bounds must be positive")
    return Histogram(tuple(e / last for e in h.edges), h.weights)


def parse_geriatrix_dirs(
    text: str, where: str = "dir_distribution.txt"
) -> tuple[Histogram, tuple[int, ...]]:
    """Geriatrix's ``<depth> <weight> <sub-directories>`` rows: the depth histogram and the
    sibling directories per depth."""
    rows = _geriatrix_rows(text, where, 3)
    if any(r[0] < 0 or r[0] != int(r[0]) or r[2] < 0 for r in rows):
        raise WorkloadError(f"{where}: depths and sub-directory counts must be whole, >= 0")
    hist = Histogram(tuple(r[0] for r in rows), tuple(r[1] for r in rows))
    return hist, tuple(int(r[2]) for r in rows)


#: Geriatrix's churn: a create or a delete with equal odds.
GERIATRIX_MIX = {"create": 0.5, "delete": 0.5}


def load_geriatrix(path: Path) -> Profile:
    """A Geriatrix profile directory (see the module doc for how it is read)."""
    kw: dict[str, Any] = {}
    f = path / "size_distribution.txt"
    if not f.is_file():
        raise WorkloadError(f"{path}: no size_distribution.txt (Geriatrix profile)")
    kw["size_hist"] = parse_geriatrix(_read(f), str(f))
    f = path / "age_distribution.txt"
    if f.is_file():
        kw["age_hist"] = parse_geriatrix_ages(_read(f), str(f))
        kw["age_relative"] = True
    f = path / "dir_distribution.txt"
    if f.is_file():
        kw["depth_hist"], kw["depth_dirs"] = parse_geriatrix_dirs(_read(f), str(f))
    return Profile(name=path.name, mode="convergence", mix=dict(GERIATRIX_MIX), **kw)


def _read(f: Path) -> str:
    try:
        return f.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise WorkloadError(f"cannot read {f}: {exc}") from None


def load_profile(spec: str) -> Profile:
    """A preset name, a JSON profile file, or a Geriatrix profile directory or file."""
    if spec in PRESETS:
        return PRESETS[spec]
    path = Path(spec)
    if path.is_dir():
        return load_geriatrix(path)
    if not path.is_file():
        return get_preset(spec)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise WorkloadError(f"cannot read profile {path}: {exc}") from None
    if path.name in GERIATRIX_FILES:
        key = GERIATRIX_FILES[path.name]
        if key != "size_hist":
            raise WorkloadError(f"{path}: a Geriatrix profile needs size_distribution.txt")
        return load_geriatrix(path.parent)  # with its age and directory files, if present
    try:
        data = json.loads(text)
    except ValueError:
        try:
            hist = parse_geriatrix(text, str(path))
        except WorkloadError:
            raise WorkloadError(f"{path}: neither a JSON profile nor a Geriatrix file") from None
        return Profile(name=path.stem, mode="convergence", mix=dict(GERIATRIX_MIX), size_hist=hist)
    return Profile.from_json(data, name=path.stem)
