"""How reliable is the fidelity verdict? Spread of the op stream's own runs against replays.

At each point (a recorded history and one of its snapshots) the op stream up to the snapshot
is run ``--runs`` times (as ``fsage noise-floor`` runs it), ``fsage replay`` recreates the
snapshot ``--replays`` times, and two recreations that are clearly not aged are made: the
snapshot's files created fresh, in one go, on an empty file system of the same geometry
(``fresh``, the plain copy the verdict's yardstick rests on), and a replay whose intervals end
with nothing (``--interval-end none``: delayed allocation lays out only the survivors). Printed
per point:

* the distances the verdict judges (free space by blocks and by extents per bucket, the
  path-order dynamic layout score, the largest layout-score difference over the judged size
  buckets) run vs run, run vs original, replay vs original, and of the unaged recreations;
* how often each replay is judged faithful against floors of 3 and of 5 runs resampled from
  the runs (every subset), under both rules of ``fsage.replay.fidelity`` (``spread``: within
  the runs' spread; ``original``: that, and the runs' mean distance to the original within it
  too), what fails them, and where they lie between a rerun (0) and the plain copy (1);
* whether the unaged recreations are judged NOT faithful under each rule.

Needs root and loop devices. The history directories hold ``h.db`` (``bench/
replay_histories.py`` makes them); the database is copied to ``--work`` first (runs and
replays are recorded in the copy):

    python3 bench/verdict.py --hist /dev/shm/hist --work /dev/shm/h15verdict \\
        --point sqla-4k:last --point sqla-1k:last --runs 8 --replays 8 [--json raw.json]

``--from-json raw.json`` prints the tables again from saved distances without running.
"""

from __future__ import annotations

import argparse
import itertools
import json
import resource
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fsage.ager.images import can_loop_mount
from fsage.db.store import Store
from fsage.layout import Layout
from fsage.replay.fidelity import (
    DYNAMIC,
    FREE_BLOCKS,
    FREE_EXTENTS,
    RULES,
    NoiseFloor,
    fidelity,
    floor_from_distances,
    judge_distances,
)
from fsage.replay.noise import noise_floor
from fsage.replay.recreate import RecreateOptions, recreate
from fsage.replay.unaged import fresh_copy


def _cpu() -> float:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def distance(a: Layout, b: Layout) -> dict[str, float]:
    """The distances a verdict judges (``Fidelity.distances``), a as original, and the free
    extents of both."""
    f = fidelity(a, b)
    return {
        **f.distances(),
        "extents_original": f.free_original["free_extent_count"],
        "extents": f.free_recreated["free_extent_count"],
    }


def replay_layout(db: Path, fs: str, sid: int, work: Path, interval_end: str) -> Layout:
    target = work / "rec.img"
    res = recreate(
        RecreateOptions(
            db=db, fs_name=fs, target=target, until=str(sid), force=True, interval_end=interval_end
        )
    )
    target.unlink(missing_ok=True)
    with Store.open(db) as store:
        return store.load_layout(res.recreation_snapshot_id)


def measure(hist: Path, work: Path, point: str, runs: int, replays: int) -> dict[str, Any]:
    name, which = point.split(":")
    src = hist / name
    ids = json.loads((src / "history.json").read_text())["snapshot_ids"]
    sid = {"last": ids[-1], "middle": ids[len(ids) // 2 - 1]}.get(which) or int(which)
    wd = work / name
    wd.mkdir(parents=True, exist_ok=True)
    db = wd / "h.db"
    if not db.exists():
        shutil.copy(src / "h.db", db)
    with Store.open(db) as store:
        original = store.load_layout(sid)
    judged = fidelity(original, original).judged()
    t0, c0 = time.perf_counter(), _cpu()
    _, run_layouts = noise_floor(db, name, str(sid), runs=runs, workdir=wd, copy=False)
    t_runs, c_runs = time.perf_counter() - t0, _cpu() - c0
    rep_layouts = [replay_layout(db, name, sid, wd, "remount") for _ in range(replays)]
    t_rep = time.perf_counter() - t0 - t_runs
    unaged = {
        "fresh": fresh_copy(db, name, str(sid), wd),
        "interval-end none": replay_layout(db, name, sid, wd, "none"),
    }
    n = len(run_layouts)
    return {
        "point": point,
        "snapshot": sid,
        "judged": judged,
        "free_extents_original": distance(original, original)["extents_original"],
        "run_run": {
            f"{i},{j}": distance(run_layouts[i], run_layouts[j])
            for i, j in itertools.combinations(range(n), 2)
        },
        "run_orig": [distance(original, r) for r in run_layouts],
        "replay_orig": [distance(original, r) for r in rep_layouts],
        "unaged_orig": {k: distance(original, v) for k, v in unaged.items()},
        "seconds": {"runs_wall": t_runs, "runs_cpu": c_runs, "replays_wall": t_rep},
    }


# ------------------------------------------------------------------------------- analysis


def _bucket_max(d: dict[str, float], judged: dict[str, str]) -> float:
    return max((abs(d.get(k, 0.0)) for k in judged if k.startswith("bucket:")), default=0.0)


def _spread(xs: list[float]) -> str:
    if not xs:
        return "-"
    return f"{min(xs):.3f} / {statistics.median(xs):.3f} / {max(xs):.3f}"


def _floor(raw: dict[str, Any], subset: tuple[int, ...]) -> NoiseFloor:
    """The floor the runs of ``subset`` give (as ``noise_between`` and ``add_original`` make
    it), with the plain copy as yardstick."""
    pairs = [raw["run_run"][f"{i},{j}"] for i, j in itertools.combinations(subset, 2)]
    floor = floor_from_distances(
        NoiseFloor(runs=len(subset), original_snapshot=int(raw["snapshot"])), pairs
    )
    floor.to_original = [raw["run_orig"][i] for i in subset]
    fresh = raw["unaged_orig"]["fresh"]
    floor.copy = {k: abs(v) for k, v in fresh.items() if not k.startswith("extents")}
    return floor


def _why(reasons: list[str]) -> set[str]:
    """What failed a verdict, in short."""
    out = set()
    for r in reasons:
        if r.startswith("the op stream's runs"):
            out.add("bias")
        elif r.startswith("free space by blocks"):
            out.add("free/blocks")
        elif r.startswith("free space by extents"):
            out.add("free/extents")
        elif r.startswith("path-order dynamic"):
            out.add("dynamic")
        elif r.startswith("files of"):
            out.add("bucket")
        elif r.startswith("a plain copy"):
            out.add("copy passes")
    return out


WHY = ("free/blocks", "free/extents", "bucket", "dynamic", "bias")


def analyse(raw: dict[str, Any]) -> list[str]:
    if "judged" not in raw:
        sys.exit("saved distances from an older bench/verdict.py: measure them again")
    judged: dict[str, str] = raw["judged"]
    n = len(raw["run_orig"])
    out = [
        f"== {raw['point']} (snapshot {raw['snapshot']}; {raw['free_extents_original']} free "
        f"extents in the original; {n} runs, {len(raw['replay_orig'])} replays; judged: "
        f"{len(judged)} distances; the runs took {raw['seconds']['runs_cpu']:.0f} s CPU, "
        f"{raw['seconds']['runs_wall']:.0f} s wall)",
        f"  {'distances (min / median / max)':34} {'free TV blocks':>22} {'free extents dist':>22} "
        f"{'dynamic score':>22} {'worst judged bucket':>22} {'free extents':>13}",
    ]
    groups = {
        "run vs run": list(raw["run_run"].values()),
        "run vs original": raw["run_orig"],
        "replay vs original": raw["replay_orig"],
        **{f"unaged ({k}) vs original": [v] for k, v in raw["unaged_orig"].items()},
    }
    for label, ds in groups.items():
        out.append(
            f"  {label:34} {_spread([d[FREE_BLOCKS] for d in ds]):>22} "
            f"{_spread([d[FREE_EXTENTS] for d in ds]):>22} "
            f"{_spread([abs(d.get(DYNAMIC, 0.0)) for d in ds]):>22} "
            f"{_spread([_bucket_max(d, judged) for d in ds]):>22} "
            f"{_spread([float(d['extents']) for d in ds]):>13}"
        )
    out.append(
        f"  {'floor of k runs':22} {'rule':9} {'replays faithful':>16} "
        + " ".join(f"{w:>12}" for w in WHY)
        + f" {'vs copy (med)':>14}   unaged judged faithful"
    )
    for k in sorted({k for k in (3, 5, n) if k <= n}):
        subsets = list(itertools.combinations(range(n), k))
        floors = [_floor(raw, s) for s in subsets]
        for rule in RULES:
            verdicts = [
                judge_distances(d, judged, fl, rule) for fl in floors for d in raw["replay_orig"]
            ]
            why = [_why(v.reasons) for v in verdicts]
            rel = [v.copy_relative for v in verdicts if v.copy_relative is not None]
            unaged = {
                label: sum(judge_distances(d, judged, fl, rule).faithful for fl in floors)
                / len(floors)
                for label, d in raw["unaged_orig"].items()
            }
            out.append(
                f"  {k:2} runs ({len(subsets):3} subsets)  {rule:9} "
                f"{sum(v.faithful for v in verdicts) / len(verdicts):>16.0%} "
                + " ".join(f"{sum(w in x for x in why) / len(why):>12.0%}" for w in WHY)
                + f" {statistics.median(rel) if rel else float('nan'):>14.2f}   "
                + ", ".join(f"{lab} {v:.0%}" for lab, v in unaged.items())
            )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hist", type=Path, default=Path("/dev/shm/hist"))
    ap.add_argument("--work", type=Path, default=Path("/dev/shm/h15verdict"))
    ap.add_argument("--point", action="append", default=[], help="NAME:last|middle|ID")
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--replays", type=int, default=8)
    ap.add_argument("--json", type=Path, help="save the distances here (appended per point)")
    ap.add_argument("--from-json", type=Path, help="print the tables from saved distances")
    a = ap.parse_args()
    if a.from_json:
        for raw in json.loads(a.from_json.read_text()):
            print("\n".join(analyse(raw)))
        return
    if not can_loop_mount():
        sys.exit("needs root and loop devices")
    saved: list[dict[str, Any]] = []
    for p in a.point:
        raw = measure(a.hist, a.work, p, a.runs, a.replays)
        saved.append(raw)
        if a.json:
            a.json.write_text(json.dumps(saved, indent=1))
        print("\n".join(analyse(raw)), flush=True)


if __name__ == "__main__":
    main()
