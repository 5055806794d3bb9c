"""How reliable is the fidelity verdict? Spread of the op stream's own runs against replays.

At each point (a recorded history and one of its snapshots) the op stream up to the snapshot
is run ``--runs`` times with ``fsage age --ops`` (as ``fsage noise-floor`` runs it), ``fsage
replay`` recreates the snapshot ``--replays`` times, and two recreations that are clearly not
aged are made: the last snapshot's files created fresh, in one go, on an empty file system of
the same geometry (``fresh``), and a replay whose intervals end with nothing
(``--interval-end none``: delayed allocation lays out only the survivors). Printed per point:

* the distances (free-space total variation and earth mover's distance; the largest layout-
  score difference over the judged size buckets) run vs run, run vs original, replay vs
  original, and of the unaged recreations to the original;
* how often each replay is judged faithful against floors of 3 and of 5 runs resampled from
  the runs (every subset), under the pairwise rule (the issue's: within the runs' largest
  distance between each other, + 0.1 for free space) and the reference rule (within the
  largest distance of the runs to the original, + the same margins);
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
from fsage.replay.fidelity import MIN_BUCKET_FILES, bucket_tolerance, fidelity, free_tolerance
from fsage.replay.noise import noise_floor
from fsage.replay.recreate import RecreateOptions, recreate
from fsage.replay.unaged import fresh_copy


def _cpu() -> float:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def distance(a: Layout, b: Layout) -> dict[str, Any]:
    """Free-space distances and layout-score differences per size bucket (a as original)."""
    f = fidelity(a, b)
    buckets = {}
    for r in f.by_size:
        so, sr = r["layout_score_original"], r["layout_score_recreated"]
        if so is not None and sr is not None:
            buckets[str(r["min_blocks"])] = abs(sr - so)
    return {
        "tv": f.free_tv_distance,
        "emd": f.free_emd_buckets,
        "buckets": buckets,
        "extents": [f.free_original["free_extent_count"], f.free_recreated["free_extent_count"]],
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
    judged = [
        str(r["min_blocks"])
        for r in fidelity(original, original).by_size
        if r["files_original"] >= MIN_BUCKET_FILES
    ]
    t0, c0 = time.perf_counter(), _cpu()
    _, run_layouts = noise_floor(db, name, str(sid), runs=runs, workdir=wd)
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
        "judged_buckets": judged,
        "free_extents_original": fidelity(original, original).free_original["free_extent_count"],
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


def _bucket_max(d: dict[str, Any], judged: list[str]) -> float:
    return max((d["buckets"].get(k, 0.0) for k in judged), default=0.0)


def _spread(xs: list[float]) -> str:
    if not xs:
        return "-"
    return f"{min(xs):.3f} / {statistics.median(xs):.3f} / {max(xs):.3f}"


def _misses(
    d: dict[str, Any], judged: list[str], free: float, by_bucket: dict[str, float]
) -> tuple[bool, bool]:
    """(outside the free-space tolerance, outside some judged bucket's tolerance)."""
    buckets = any(
        d["buckets"].get(k, 1.0) > bucket_tolerance(by_bucket.get(k, 0.0)) for k in judged
    )
    return d["tv"] > free_tolerance(free), buckets


def _faithful(
    d: dict[str, Any], judged: list[str], free: float, by_bucket: dict[str, float]
) -> bool:
    return not any(_misses(d, judged, free, by_bucket))


def _floor_spread(raw: dict[str, Any], subset: tuple[int, ...]) -> tuple[float, dict[str, float]]:
    free, buckets = 0.0, {}  # type: ignore[var-annotated]
    for i, j in itertools.combinations(subset, 2):
        d = raw["run_run"][f"{i},{j}"]
        free = max(free, d["tv"])
        for k, v in d["buckets"].items():
            buckets[k] = max(buckets.get(k, 0.0), v)
    return free, buckets


def _floor_original(raw: dict[str, Any], subset: tuple[int, ...]) -> tuple[float, dict[str, float]]:
    free, buckets = 0.0, {}  # type: ignore[var-annotated]
    for i in subset:
        d = raw["run_orig"][i]
        free = max(free, d["tv"])
        for k, v in d["buckets"].items():
            buckets[k] = max(buckets.get(k, 0.0), v)
    return free, buckets


#: The verdict's rules (fsage.replay.fidelity.RULES): the runs' spread between each other, and
#: the runs' distance to the original.
RULES = {"spread": _floor_spread, "original": _floor_original}


def analyse(raw: dict[str, Any]) -> list[str]:
    judged = raw["judged_buckets"]
    n = len(raw["run_orig"])
    out = [
        f"== {raw['point']} (snapshot {raw['snapshot']}; {raw['free_extents_original']} free "
        f"extents in the original; {n} runs, {len(raw['replay_orig'])} replays; judged buckets "
        f"{len(judged)}; the runs took {raw['seconds']['runs_cpu']:.0f} s CPU, "
        f"{raw['seconds']['runs_wall']:.0f} s wall)",
        f"  {'distances (min / median / max)':34} {'free TV':>22} {'free EMD':>22} "
        f"{'worst judged bucket':>22}",
    ]
    groups = {
        "run vs run": list(raw["run_run"].values()),
        "run vs original": raw["run_orig"],
        "replay vs original": raw["replay_orig"],
    }
    for label, ds in groups.items():
        out.append(
            f"  {label:34} {_spread([d['tv'] for d in ds]):>22} "
            f"{_spread([d['emd'] for d in ds]):>22} "
            f"{_spread([_bucket_max(d, judged) for d in ds]):>22}"
        )
    for label, d in raw["unaged_orig"].items():
        out.append(
            f"  {'unaged (' + label + ') vs original':34} {d['tv']:>22.3f} {d['emd']:>22.3f} "
            f"{_bucket_max(d, judged):>22.3f}"
        )
    out.append(
        f"  {'floor of k runs':22} {'rule':10} {'free floor min/med/max':>24} "
        f"{'replays faithful':>17} {'out: free':>9} {'bucket':>9}   unaged judged faithful"
    )
    for k in sorted({k for k in (3, 5, n) if k <= n}):
        subsets = list(itertools.combinations(range(n), k))
        for rule, make in RULES.items():
            floors = [make(raw, s) for s in subsets]
            misses = [_misses(d, judged, fr, bb) for fr, bb in floors for d in raw["replay_orig"]]
            ok = [not any(m) for m in misses]
            by_free = sum(m[0] for m in misses) / len(misses)
            by_bucket = sum(m[1] for m in misses) / len(misses)
            unaged = {
                label: sum(_faithful(d, judged, fr, bb) for fr, bb in floors) / len(floors)
                for label, d in raw["unaged_orig"].items()
            }
            out.append(
                f"  {k:2} runs ({len(subsets):3} subsets)   {rule:10} "
                f"{_spread([f for f, _ in floors]):>24} {sum(ok) / len(ok):>16.0%} "
                f"{by_free:>9.0%} {by_bucket:>9.0%}   "
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
