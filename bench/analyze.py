#!/usr/bin/env python3
"""Analysis and report speed, measured against the snapshot that produced the data.

1. One FILES-file ext4 snapshot (image shared with bench/snapshot.py under
   bench/.cache/ext4-FILES-SEED.img, built the same way when missing):
     fsage analyze time / fsage snapshot time          (target <= 2)
2. A HISTORY-snapshot history of a HISTORY_FILES-file image, each snapshot taken after a small
   offline change (debugfs deletes and writes ~0.5% of files):
     fsage report time                                  (target < 60 s)
   and, for scale, e2freefrag on the same image.

Usage: python3 bench/analyze.py [--files 500000] [--history 30] [--history-files 100000]
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / "bench" / ".cache"


def _snapshot_bench() -> object:
    spec = importlib.util.spec_from_file_location("bench_snapshot", REPO / "bench" / "snapshot.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def timed(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    p = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {p.stderr.decode()[-2000:]}")
    return time.perf_counter() - t0


def _some_file(db: Path, env: dict[str, str]) -> str:
    """The path of one regular file of snapshot 1 (from a CSV listing of one directory)."""
    out = subprocess.run(
        [sys.executable, "-m", "fsage", "show", "1", "--db", str(db), "--format", "csv"],
        env=env, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    for row in list(csv.reader(io.StringIO(out)))[1:]:
        path, _ino, mode = row[:3]
        if mode.startswith("100"):
            return path
    raise SystemExit("no regular file in the snapshot")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", type=int, default=500_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--history", type=int, default=30)
    ap.add_argument("--history-files", type=int, default=100_000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    sb = _snapshot_bench()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    fsage = [sys.executable, "-m", "fsage"]
    figures: dict[str, float | int] = {}
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        work = Path(tmp)
        # -- 1: one big snapshot ------------------------------------------------------------
        image = sb.build_image(args.files, args.seed)  # type: ignore[attr-defined]
        subprocess.run(["cat", str(image)], stdout=subprocess.DEVNULL, check=True)
        db = work / "one.db"
        t_snap = timed([*fsage, "snapshot", str(image), "--db", str(db)], env)
        t_an = timed([*fsage, "analyze", "--db", str(db), "--format", "json"], env)
        t_an_dir = timed([*fsage, "analyze", "--db", str(db), "--by", "dir"], env)
        t_show = timed([*fsage, "show", "1", "--db", str(db)], env)
        one = _some_file(db, env)
        t_show_path = timed([*fsage, "show", "1", "--db", str(db), "--path", one], env)
        t_ff = timed(["e2freefrag", str(image)], env)
        figures.update(
            files=args.files,
            snapshot_s=t_snap,
            analyze_s=t_an,
            analyze_by_dir_s=t_an_dir,
            show_s=t_show,
            show_path_s=t_show_path,
            analyze_over_snapshot=t_an / t_snap,
            e2freefrag_s=t_ff,
        )
        # -- 2: a history -------------------------------------------------------------------
        base = sb.build_image(args.history_files, args.seed)  # type: ignore[attr-defined]
        himg = work / "hist.img"
        shutil.copyfile(base, himg)
        hdb = work / "hist.db"
        t0 = time.perf_counter()
        for i in range(args.history):
            if i:
                sb.change_one_percent(himg, args.history_files, args.seed + i, work)  # type: ignore[attr-defined]
            subprocess.run([*fsage, "snapshot", str(himg), "--db", str(hdb), "--name", "h"],
                           env=env, check=True, stdout=subprocess.DEVNULL)  # fmt: skip
        figures["history_build_s"] = time.perf_counter() - t0
        out = work / "report.html"
        figures["history_snapshots"] = args.history
        figures["history_files"] = args.history_files
        figures["report_s"] = timed([*fsage, "report", "--db", str(hdb), "-o", str(out)], env)
        figures["report_bytes"] = out.stat().st_size

    if args.json:
        print(json.dumps(figures, indent=2))
        return
    print(f"snapshot of {args.files} files:         {figures['snapshot_s']:8.2f} s")
    print(f"fsage analyze (json, all parts):     {figures['analyze_s']:8.2f} s")
    print(f"fsage analyze --by dir:              {figures['analyze_by_dir_s']:8.2f} s"
          "   (target <= 3 s at 710k files)")  # fmt: skip
    print(f"fsage show (every file):             {figures['show_s']:8.2f} s"
          "   (target <= 3 s at 710k files)")  # fmt: skip
    print(f"fsage show --path FILE:              {figures['show_path_s']:8.2f} s"
          "   (target <= 0.3 s at 710k files)")  # fmt: skip
    print(f"analyze / snapshot:                  {figures['analyze_over_snapshot']:8.2f}"
          "   (target <= 2)")  # fmt: skip
    print(f"e2freefrag (reference):              {figures['e2freefrag_s']:8.2f} s")
    print(
        f"report over {args.history} snapshots of {args.history_files} files: "
        f"{figures['report_s']:8.2f} s   (target < 60 s), {figures['report_bytes']} bytes"
    )


if __name__ == "__main__":
    main()
