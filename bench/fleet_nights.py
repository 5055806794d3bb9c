#!/usr/bin/env python3
"""Peak memory of a fleet's nightly `fsage export` and `fsage fleet compact`, through the
night the compaction rewrites its large tables whole.

A fleet of --fleet synthetic file systems (fsage.fleet.synth) of --files files each, in one
SQLite database; each night adds a snapshot of every file system, then, each as its own
process, `fsage export --db DB --host h DIR` (the new snapshot only, as cron runs it) and
`fsage fleet compact DIR`. A compaction appends a generation of files to each large table
(file versions, their ends, free extents) until it has ``MAX_LARGE_GENERATIONS``; the next
one rewrites the table: file systems of more than ``SORT_ROWS`` rows stream in order, the
others are sorted a group at a time, reading the compacted files that hold them. --nights
defaults to one past the generations, so that the last night is such a rewrite.

--baseline TREE also runs TREE's compaction (another checkout of fsage, its extension built)
on a copy of the rewrite night's dataset, right before this tree's, and --check requires the
same compacted tables.

Figures as bench/fleet_memory.py's: wall and CPU seconds, peak resident set (wait4) and the
largest anonymous resident set sampled, in MiB; the load average at each command's start.

Usage: python3 bench/fleet_nights.py [--fleet 100] [--files 2000] [--nights 9]
                                     [--baseline /path/to/other/fsage] [--check]
                                     [--keep DIR] [--json]
e.g. python3 bench/fleet_nights.py --fleet 400 --files 20000 --keep /tmp/nights
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.fleet_memory import MIB, TARGET_MB, du, measured, same_dataset
from fsage.fleet.compact import MAX_LARGE_GENERATIONS
from fsage.fleet.pieces import first_piece

REPO = Path(__file__).resolve().parents[1]

NIGHT = """
import sys
from fsage.db.store import Store
from fsage.fleet.synth import synthetic_history
db, night, files, fleet = sys.argv[1], *map(int, sys.argv[2:])
with Store.open(db, create=night == 1) as store:
    for i in range(fleet):
        synthetic_history(store, f"fs{i:04d}", files=files, snapshots=night, seed=300 + i,
                          skip=night - 1)
"""


def add_night(db: Path, night: int, files: int, fleet: int, env: dict[str, str]) -> None:
    """The fleet's snapshots of ``night`` (1: the first), in a process of its own: a child's
    peak resident set starts at its parent's size when it was forked."""
    argv = [sys.executable, "-c", NIGHT, str(db), str(night), str(files), str(fleet)]
    subprocess.run(argv, env=env, cwd=REPO, check=True)


def generations(out: Path) -> int:
    """The compacted generations of the file versions' table (a generation's pieces once)."""
    names = (out / "files" / "compacted").glob("c*.parquet")
    return len({first_piece(p.name) for p in names})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fleet", type=int, default=100, help="file systems (default 100)")
    ap.add_argument("--files", type=int, default=2000, help="files each (default 2000)")
    ap.add_argument("--nights", type=int, default=MAX_LARGE_GENERATIONS + 1,
                    help="nights (default: the last one rewrites the large tables)")  # fmt: skip
    ap.add_argument("--baseline", type=Path, help="another fsage tree whose rewrite to compare")
    ap.add_argument("--check", action="store_true",
                    help="with --baseline: require the same compacted tables")  # fmt: skip
    ap.add_argument("--keep", type=Path, help="work here and keep the data")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if min(args.fleet, args.files, args.nights) < 1:
        ap.error("--fleet, --files and --nights must be at least 1")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    fsage = [sys.executable, "-m", "fsage"]
    work = args.keep or Path(tempfile.mkdtemp(prefix="fsage-fleet-nights-"))
    work.mkdir(parents=True, exist_ok=True)
    db, out, other = work / "fleet.db", work / "dataset", work / "baseline"
    for stale in (db, out, other):  # every night from the first: a kept directory's too
        if stale.is_dir():
            shutil.rmtree(stale)
        else:
            stale.unlink(missing_ok=True)
    nights: list[dict[str, Any]] = []
    try:
        for night in range(1, args.nights + 1):
            add_night(db, night, args.files, args.fleet, env)
            row: dict[str, Any] = {"night": night}
            row["export"] = measured([*fsage, "export", "--db", str(db), "--host", "h",
                                      str(out)], env)  # fmt: skip
            before = generations(out)
            if args.baseline is not None and before >= MAX_LARGE_GENERATIONS:
                shutil.copytree(out, other)
                row["baseline_compact"] = measured(
                    [*fsage, "fleet", "compact", str(other)],
                    {**env, "PYTHONPATH": str(args.baseline)},
                    args.baseline,
                )
            row["compact"] = measured([*fsage, "fleet", "compact", str(out)], env)
            row["rewrite"] = before >= MAX_LARGE_GENERATIONS
            row["generations"] = generations(out)
            row["dataset_mib"] = du(out) / MIB
            if "baseline_compact" in row:
                if args.check:
                    row["same_as_baseline"] = same_dataset(out, other, env) or "yes"
                shutil.rmtree(other)
            nights.append(row)
            if not args.json:
                print(line(row), flush=True)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    result = summary(nights)
    if args.json:
        print(json.dumps({"fleet": args.fleet, "files": args.files, "nights": nights,
                          "summary": result}, indent=2))  # fmt: skip
        return
    for text in result["lines"]:
        print(text)


def line(row: dict[str, Any]) -> str:
    head = f"night {row['night']}{' (rewrite)' if row['rewrite'] else ''}:"
    head += f" {row['generations']} generation(s), dataset {row['dataset_mib']:.1f} MiB"
    if "same_as_baseline" in row:
        head += f"; same as the baseline's: {row['same_as_baseline']}"
    lines = [head]
    for key, name in (("export", "export"), ("baseline_compact", "baseline compact"),
                      ("compact", "compact")):  # fmt: skip
        if key in row:
            m = row[key]
            lines.append(f"  {name:<16} {m['wall_s']:7.1f} s / {m['cpu_s']:7.1f} s,"
                         f" peak {m['peak_mib']:4.0f} MiB (anon. {m['anon_mib']:4.0f},"
                         f" load {m['load']:.1f})")  # fmt: skip
    return "\n".join(lines)


def summary(nights: list[dict[str, Any]]) -> dict[str, Any]:
    """Each command's largest peak against the target, and the rewrite's against the other
    compactions'."""
    out: dict[str, Any] = {"lines": []}
    for key in ("export", "compact"):
        peak = max(r[key]["peak_mib"] for r in nights)
        out[key] = {"peak_mib": peak, "met": peak * MIB <= TARGET_MB * 1e6}
        out["lines"].append(f"  {key:<8} largest peak {peak:.0f} MiB"
                            f" ({peak * MIB / 1e6:.0f} MB): target {TARGET_MB} MB"
                            f" {'met' if out[key]['met'] else 'NOT met'}")  # fmt: skip
    rewrites = [r for r in nights if r["rewrite"]]
    appends = [r for r in nights if not r["rewrite"]]
    if rewrites and appends:
        rw = max(r["compact"]["peak_mib"] for r in rewrites)
        ap = max(r["compact"]["peak_mib"] for r in appends)
        out["rewrite_over_append_mib"] = rw - ap
        text = f"  rewrite  peak {rw:.0f} MiB against {ap:.0f} for the appending compactions"
        base = [r["baseline_compact"]["peak_mib"] for r in rewrites if "baseline_compact" in r]
        if base:
            out["baseline_rewrite_mib"] = max(base)
            text += f"; the baseline's rewrite {max(base):.0f}"
        out["lines"].append(text)
    return out


if __name__ == "__main__":
    main()
