#!/usr/bin/env python3
"""Fleet analysis speed: Parquet export + DuckDB against the per-database loop, in one run.

A. A synthetic fleet with per-file data: FS file systems (one SQLite database each, as one
   host keeps) x SNAPSHOTS nightly snapshots x FILES files with churn (fsage.fleet.synth):
     export          `fsage export` of every database (one process per host, as the daemon
                     or cron runs it), total time, peak memory, dataset vs database size
     per-file set    layout score per size bucket of the latest snapshot of every file
                     system, from the exported extents in SQL (DuckDB), against the naive
                     loop: open each database, rebuild its latest snapshot, analyze it by size
                     (in one process), and `fsage analyze --db DB` run on each database as a
                     user would (target: DuckDB >= 10x faster); the answers are compared
     history set     the fleet summary (filesystems, size, free, outliers) from the exported
                     metrics, against the loop that analyzes every snapshot of every database
   Both on the dataset as exported and after `fsage fleet compact` (timed too).
B. Metrics only at the issue's scale: MFS file systems x MSNAPS nightly snapshots of metrics,
   size buckets and free-space buckets written in the export's layout and schema:
     `fsage fleet DIR --format json` as a whole command, as exported and after `fsage fleet
     compact` (target < 2 s), peak memory, sizes; the answers must be the same; and on the
     compacted dataset `--table trend` in each format and `fsage fleet report`.

Peak memory is each measured process's own maximum resident set (VmHWM), in MiB; times are wall
seconds and CPU seconds (user + system) of the measured processes, and the machine's load
average is printed beside them (on a loaded machine the CPU figures are the ones to compare:
wall seconds grow with the load).

Usage: python3 bench/fleet.py [--filesystems 20] [--snapshots 30] [--files 20000]
                              [--metrics-filesystems 1000] [--metrics-snapshots 365] [--json]
(the issue's example fleet: --filesystems 200 --snapshots 30 --files 50000)
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

MIB = 1 << 20


CPU: dict[str, float] = {}  # CPU seconds of the last timed_child call (user + system)


# Runs `python3 -m MODULE ARGS` or `python3 -c CODE ARGS` (argv[2:]) and writes the process's
# own peak resident set (VmHWM, KiB) to argv[1] as it exits. wait4's ru_maxrss is not that:
# the kernel starts it from the size of the process that forked the child (this bench, which
# holds the outputs it compares: 218 MiB reported for a 100 MiB command).
PEAK = """
import atexit, runpy, sys
out, how, what = sys.argv[1:4]
def peak():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            with open(out, "w") as fh:
                fh.write(line.split()[1])
atexit.register(peak)
sys.argv = [what if how == "-m" else "-c", *sys.argv[4:]]
if how == "-m":
    runpy.run_module(what, run_name="__main__", alter_sys=True)
else:
    exec(compile(what, "<string>", "exec"), {"__name__": "__main__"})
"""


def timed_child(argv: list[str], env: dict[str, str]) -> tuple[float, float, bytes]:
    """(seconds, peak RSS MiB, stdout) of one Python process (``python3 -m M ...`` or
    ``python3 -c CODE ...``), reaped with wait4 for its rusage; its CPU time (user + system)
    is left in CPU["last"]."""
    assert argv[0] == sys.executable and argv[1] in ("-m", "-c"), argv
    fd, peak_file = tempfile.mkstemp(prefix="fsage-bench-peak-")
    os.close(fd)
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-c", PEAK, peak_file, *argv[1:]], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    assert p.stdout is not None and p.stderr is not None
    out = p.stdout.read()
    err = p.stderr.read()
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - t0
    CPU["last"] = usage.ru_utime + usage.ru_stime
    peak_kib = Path(peak_file).read_text()
    os.unlink(peak_file)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {err.decode()[-2000:]}")
    return seconds, int(peak_kib) / 1024, out


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


NAIVE_LATEST = """
import json, sys, time
from fsage.db.store import Store
from fsage.analyzer.analysis import SnapshotAnalyzer
out = []
for db in sys.argv[1:]:
    with Store.open(db) as store:
        for fs in store.filesystems():
            snap = store.latest_snapshot(fs["name"])
            an = SnapshotAnalyzer(store.load_layout(snap.id))
            for r in an.by_size():
                out.append([fs["name"], snap.id, r["max_bytes"], r["files"], r["blocks"],
                            r["layout_score"]])
print(json.dumps(out))
"""

NAIVE_HISTORY = """
import json, sys
from fsage.db.store import Store
from fsage.analyzer.analysis import SnapshotAnalyzer
n = 0
for db in sys.argv[1:]:
    with Store.open(db) as store:
        for s in store.snapshots():
            an = SnapshotAnalyzer(store.load_layout(s.id), snapshot_id=s.id, taken_at=s.taken_at)
            an.summary(); an.by_size(); an.free()
            n += 1
print(n)
"""

DUCK_LATEST = """
import json, sys
from pathlib import Path
from fsage.fleet.query import connect, files_by_size
con = connect(Path(sys.argv[1]))
rows = files_by_size(con)
print(json.dumps([[r["fs"], r["snapshot_id"], r["max_bytes"], r["files"], r["blocks"],
                   r["layout_score"]] for r in rows]))
"""


def part_a(args: argparse.Namespace, work: Path, env: dict[str, str], fig: dict[str, Any]) -> None:
    from fsage.db.store import Store
    from fsage.fleet.synth import synthetic_history

    dbs = []
    t0 = time.perf_counter()
    for i in range(args.filesystems):
        db = work / f"host{i:04d}.db"
        if db.exists():  # --keep: the databases of an earlier run
            dbs.append(db)
            continue
        with Store.open(db, create=True) as store:
            synthetic_history(
                store, f"fs{i:04d}", files=args.files, snapshots=args.snapshots, seed=1000 + i,
                churn=args.churn,
            )  # fmt: skip
        dbs.append(db)
        print(f"  generated {i + 1}/{args.filesystems}", file=sys.stderr, end="\r")
    print(file=sys.stderr)
    fig["generate_s"] = time.perf_counter() - t0
    fig["sqlite_bytes"] = sum(du_file(db) for db in dbs)

    ds = work / "fleet"
    shutil.rmtree(ds, ignore_errors=True)
    fsage = [sys.executable, "-m", "fsage"]
    export_s, export_cpu, export_rss = 0.0, 0.0, 0.0
    for i, db in enumerate(dbs):
        s, rss, _ = timed_child([*fsage, "export", "--db", str(db), "--host", f"host{i:04d}",
                                 str(ds)], env)  # fmt: skip
        export_s += s
        export_cpu += CPU["last"]
        export_rss = max(export_rss, rss)
    fig["export_s"], fig["export_cpu_s"] = export_s, export_cpu
    fig["export_s_per_snapshot"] = export_s / (args.filesystems * args.snapshots)
    fig["export_peak_mib"] = export_rss
    fig["dataset_bytes"] = du(ds)
    # an incremental run with nothing new
    s, _, _ = timed_child([*fsage, "export", "--db", str(dbs[0]), "--host", "host0000",
                           str(ds)], env)  # fmt: skip
    fig["export_nothing_new_s"] = s
    compacted = work / "fleet-compacted"
    shutil.rmtree(compacted, ignore_errors=True)
    shutil.copytree(ds, compacted)
    s, rss, _ = timed_child([*fsage, "fleet", "compact", str(compacted)], env)
    fig["compact_s"], fig["compact_cpu_s"], fig["compact_peak_mib"] = s, CPU["last"], rss
    fig["compacted_bytes"] = du(compacted)

    py = sys.executable
    naive_s, naive_rss, naive_out = timed_child([py, "-c", NAIVE_LATEST, *map(str, dbs)], env)
    naive_cpu = CPU["last"]
    duck_s, duck_rss, duck_out = timed_child([py, "-c", DUCK_LATEST, str(ds)], env)
    duck_cpu = CPU["last"]
    duckc_s, duckc_rss, duckc_out = timed_child([py, "-c", DUCK_LATEST, str(compacted)], env)
    fig["per_file_duckdb_compacted_s"], fig["per_file_duckdb_compacted_peak_mib"] = (
        duckc_s,
        duckc_rss,
    )
    fig["per_file_duckdb_compacted_cpu_s"] = CPU["last"]
    naive_rows = sorted(map(tuple, json.loads(naive_out)))
    duck_rows = sorted(map(tuple, json.loads(duck_out)))
    if naive_rows != duck_rows or sorted(map(tuple, json.loads(duckc_out))) != duck_rows:
        raise SystemExit("the per-file query set differs from the per-database analysis")
    fig["per_file_naive_cpu_s"], fig["per_file_duckdb_cpu_s"] = naive_cpu, duck_cpu
    fig["per_file_rows_compared"] = len(duck_rows)
    fig["per_file_naive_s"], fig["per_file_naive_peak_mib"] = naive_s, naive_rss
    fig["per_file_duckdb_s"], fig["per_file_duckdb_peak_mib"] = duck_s, duck_rss
    fig["per_file_speedup"] = naive_s / duck_s
    # the naive alternative as a user runs it: `fsage analyze` on each database
    analyze_s, analyze_rss, analyze_cpu = 0.0, 0.0, 0.0
    for i, db in enumerate(dbs):
        s, rss, out = timed_child([*fsage, "analyze", "--db", str(db), "--format", "json"], env)
        analyze_s += s
        analyze_cpu += CPU["last"]
        analyze_rss = max(analyze_rss, rss)
        (a,) = json.loads(out)["snapshots"]
        name = f"fs{i:04d}"
        ours = [r for r in duck_rows if r[0] == name]
        theirs = [
            (name, a["id"], b["max_bytes"], b["files"], b["blocks"], b["layout_score"])
            for b in a["by_size"]
        ]
        if not theirs or sorted(theirs) != sorted(ours):
            raise SystemExit(f"fsage analyze --db {db} differs from the per-file query set")
    fig["per_file_analyze_cli_s"], fig["per_file_analyze_cli_peak_mib"] = analyze_s, analyze_rss
    fig["per_file_analyze_cli_cpu_s"] = analyze_cpu
    fig["per_file_speedup_vs_analyze_cli"] = analyze_s / duck_s
    fig["per_file_speedup_vs_analyze_cli_cpu"] = analyze_cpu / duck_cpu
    fig["per_file_compacted_speedup_vs_analyze_cli"] = analyze_s / duckc_s
    fig["per_file_compacted_speedup_vs_analyze_cli_cpu"] = (
        analyze_cpu / fig["per_file_duckdb_compacted_cpu_s"]
    )

    hist_s, hist_rss, _ = timed_child([py, "-c", NAIVE_HISTORY, *map(str, dbs)], env)
    hist_cpu = CPU["last"]
    fleet_s, fleet_rss, _ = timed_child([*fsage, "fleet", str(compacted), "--format", "json"], env)
    fig["history_naive_cpu_s"], fig["history_duckdb_cpu_s"] = hist_cpu, CPU["last"]
    fig["history_naive_s"], fig["history_naive_peak_mib"] = hist_s, hist_rss
    fig["history_duckdb_s"], fig["history_duckdb_peak_mib"] = fleet_s, fleet_rss
    fig["history_speedup"] = hist_s / fleet_s


def du_file(db: Path) -> int:
    return sum(p.stat().st_size for p in db.parent.glob(db.name + "*") if p.is_file())


def part_b(args: argparse.Namespace, work: Path, env: dict[str, str], fig: dict[str, Any]) -> None:
    """Metrics-only dataset at scale, written directly in the export's layout."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from fsage.fleet.export_schema import partition_dir, schemas, table_metadata

    sch = schemas()
    root = work / "metrics-fleet"
    rng = np.random.default_rng(7)
    nsnap = args.metrics_snapshots
    start = dt.datetime(2024, 1, 1, 2, 30, tzinfo=dt.UTC)
    taken = [start + dt.timedelta(days=d) for d in range(nsnap)]
    nb, nf = 16, 12
    t0 = time.perf_counter()
    for i in range(args.metrics_filesystems if not (root / "metrics").exists() else 0):
        host, fs = f"host{i // 2:04d}", f"fs{i % 2}"
        ids = np.arange(i * nsnap + 1, (i + 1) * nsnap + 1, dtype=np.int64)
        s0 = rng.uniform(0.93, 0.999)
        slope = rng.normal(-0.0002, 0.0002)
        score = np.clip(s0 + slope * np.arange(nsnap) + rng.normal(0, 0.001, nsnap), 0.5, 1.0)
        total = int(rng.integers(1 << 18, 1 << 24))
        free = (total * rng.uniform(0.1, 0.8, nsnap)).astype(np.int64)
        key = {"host": [host] * nsnap, "fs": [fs] * nsnap, "snapshot_id": ids}
        files = rng.integers(10_000, 500_000, nsnap)
        tables = {
            "snapshots": {**key, "taken_at": taken, "uuid": [f"u{i}"] * nsnap,
                          "kind": ["ext4"] * nsnap, "block_size": [4096] * nsnap,
                          "blocks_total": [total] * nsnap, "blocks_free": free,
                          "blocks_used": total - free, "files": files},
            "metrics": {**key, "taken_at": taken, "block_size": [4096] * nsnap,
                        "blocks_total": [total] * nsnap, "blocks_free": free, "files": files,
                        "layout_score": score, "dynamic_layout_score_inode": score - 0.02,
                        "free_extent_count": rng.integers(100, 100_000, nsnap),
                        "largest_free_extent": rng.integers(1000, 32768, nsnap),
                        "free_chunks": rng.integers(0, 1000, nsnap),
                        "chunk_bytes": [1 << 20] * nsnap},
        }  # fmt: skip
        rep = np.repeat(np.arange(nsnap), nb)
        k = np.tile(np.arange(1, nb + 1), nsnap)
        den = rng.integers(100, 100_000, nsnap * nb)
        bscore = np.clip(score[rep] + rng.normal(0, 0.01, rep.size), 0, 1)
        tables["size_buckets"] = {
            "host": [host] * rep.size, "fs": [fs] * rep.size, "snapshot_id": ids[rep],
            "bucket": k.astype(np.int32), "min_blocks": np.where(k == 1, 2, (1 << (k - 1)) + 1),
            "max_blocks": 1 << k, "files": den // 4, "blocks": den + den // 4,
            "contiguous": np.rint(bscore * den).astype(np.int64), "denominator": den,
            "layout_score": np.rint(bscore * den) / den,
        }  # fmt: skip
        rep = np.repeat(np.arange(nsnap), nf)
        k = np.tile(np.arange(nf), nsnap)
        cnt = rng.integers(1, 5000, rep.size)
        tables["free_buckets"] = {
            "host": [host] * rep.size, "fs": [fs] * rep.size, "snapshot_id": ids[rep],
            "min_blocks": 1 << k, "max_blocks": (1 << (k + 1)) - 1, "count": cnt,
            "blocks": cnt * (1 << k),
        }  # fmt: skip
        for name, cols in tables.items():
            t = pa.table(
                {f.name: cols.get(f.name, pa.nulls(len(cols["snapshot_id"]), f.type))
                 for f in sch[name]},
                schema=sch[name],
            ).replace_schema_metadata(table_metadata(name))  # fmt: skip
            part = partition_dir(root, name, host, fs)
            part.mkdir(parents=True, exist_ok=True)
            pq.write_table(t, part / "part.parquet", compression="zstd")
    for name in ("files", "file_ends", "free_extents"):  # per-file tables: empty
        part = partition_dir(root, name, "host0000", "fs0")
        part.mkdir(parents=True, exist_ok=True)
        t = pa.table({f.name: pa.array([], f.type) for f in sch[name]}, schema=sch[name])
        pq.write_table(t.replace_schema_metadata(table_metadata(name)), part / "s0-0.parquet")
    fig["metrics_generate_s"] = time.perf_counter() - t0
    fig["metrics_dataset_bytes"] = du(root)
    fsage = [sys.executable, "-m", "fsage"]
    s, rss, before = timed_child([*fsage, "fleet", str(root), "--format", "json"], env)
    fig["metrics_uncompacted_s"], fig["metrics_uncompacted_cpu_s"] = s, CPU["last"]
    fig["metrics_uncompacted_peak_mib"] = rss
    compacted = work / "metrics-fleet-compacted"
    shutil.rmtree(compacted, ignore_errors=True)
    shutil.copytree(root, compacted)
    s, rss, _ = timed_child([*fsage, "fleet", "compact", str(compacted)], env)
    fig["metrics_compact_s"], fig["metrics_compact_cpu_s"] = s, CPU["last"]
    fig["metrics_compact_peak_mib"] = rss
    fig["metrics_compacted_bytes"] = du(compacted)
    best, best_cpu, peak = float("inf"), float("inf"), 0.0
    for _ in range(3):
        s, rss, out = timed_child([*fsage, "fleet", str(compacted), "--format", "json"], env)
        best, best_cpu, peak = min(best, s), min(best_cpu, CPU["last"]), max(peak, rss)
    fig["metrics_fleet_summary_s"], fig["metrics_fleet_summary_cpu_s"] = best, best_cpu
    fig["metrics_fleet_summary_peak_mib"] = peak
    res = json.loads(out)
    if res != json.loads(before) and not _close(res, json.loads(before)):
        raise SystemExit("the fleet summary differs before and after the compaction")
    fig["metrics_filesystems_reported"] = len(res["filesystems"])
    code = (
        "import sys,time; from pathlib import Path; t0=time.perf_counter();"
        "from fsage.fleet.query import fleet_tables; t1=time.perf_counter();"
        "fleet_tables(Path(sys.argv[1])); t2=time.perf_counter();"
        "print(t1-t0, t2-t1)"
    )
    s, _, out = timed_child([sys.executable, "-c", code, str(compacted)], env)
    imp, query = map(float, out.split())
    fig["metrics_fleet_query_only_s"] = query
    fig["metrics_fleet_import_s"] = imp
    # every snapshot's row, printed or drawn: the queries whose peak the trend's sort set
    for fmt in ("text", "json", "csv"):
        argv = [*fsage, "fleet", str(compacted), "--table", "trend", "--format", fmt]
        s, rss, _ = timed_child(argv, env)
        fig[f"metrics_trend_{fmt}"] = {"s": s, "cpu_s": CPU["last"], "peak_mib": rss}
    html = work / "fleet-report.html"
    s, rss, _ = timed_child([*fsage, "fleet", "report", str(compacted), "-o", str(html)], env)
    fig["metrics_report"] = {"s": s, "cpu_s": CPU["last"], "peak_mib": rss}
    html.unlink(missing_ok=True)


def _close(a: Any, b: Any) -> bool:
    """Equal, floats to 1e-12 (sums over a different file layout may round differently)."""
    import math

    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-15)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _load(marks: list[float]) -> str:
    """The machine's load while a part ran: wall seconds stretch with it, CPU seconds do not."""
    return (f"load average {marks[0]:.1f} at the start, {marks[1]:.1f} at the end, "
            f"{os.cpu_count()} CPUs")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--filesystems", type=int, default=20)
    ap.add_argument("--snapshots", type=int, default=30)
    ap.add_argument("--files", type=int, default=20_000)
    ap.add_argument("--churn", type=float, default=0.02)
    ap.add_argument("--metrics-filesystems", type=int, default=1000)
    ap.add_argument("--metrics-snapshots", type=int, default=365)
    ap.add_argument("--skip-a", action="store_true", help="only the metrics-only part")
    ap.add_argument("--skip-b", action="store_true", help="only the per-file part")
    ap.add_argument("--keep", type=Path, help="work here and keep the data (B reuses it)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    work = args.keep or Path(tempfile.mkdtemp(prefix="fsage-fleet-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    fig: dict[str, Any] = {
        "filesystems": args.filesystems,
        "snapshots": args.snapshots,
        "files": args.files,
        "metrics_filesystems": args.metrics_filesystems,
        "metrics_snapshots": args.metrics_snapshots,
    }
    try:
        if not args.skip_a:
            fig["a_load"] = [os.getloadavg()[0]]
            part_a(args, work, env, fig)
            fig["a_load"].append(os.getloadavg()[0])
        if not args.skip_b:
            fig["b_load"] = [os.getloadavg()[0]]
            part_b(args, work, env, fig)
            fig["b_load"].append(os.getloadavg()[0])
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(fig, indent=2))
        return
    if not args.skip_a:
        print(f"A. {args.filesystems} file systems x {args.snapshots} snapshots x "
              f"{args.files} files (wall s / CPU s, user + system;"
              f" {_load(fig['a_load'])})")  # fmt: skip
        print(f"  SQLite databases {fig['sqlite_bytes'] / MIB:.1f} MiB; Parquet dataset "
              f"{fig['dataset_bytes'] / MIB:.1f} MiB, compacted "
              f"{fig['compacted_bytes'] / MIB:.1f} MiB")  # fmt: skip
        print(f"  export: {fig['export_s']:.1f} s / {fig['export_cpu_s']:.1f} s in all "
              f"({fig['export_s_per_snapshot']:.3f} s a snapshot), peak "
              f"{fig['export_peak_mib']:.0f} MiB; nothing new: "
              f"{fig['export_nothing_new_s']:.2f} s")  # fmt: skip
        print(f"  fsage fleet compact: {fig['compact_s']:.1f} s / {fig['compact_cpu_s']:.1f} s, "
              f"peak {fig['compact_peak_mib']:.0f} MiB")  # fmt: skip
        print(f"  per-file set (latest snapshots, {fig['per_file_rows_compared']} bucket rows, "
              f"equal): DuckDB {fig['per_file_duckdb_s']:.2f} s / "
              f"{fig['per_file_duckdb_cpu_s']:.2f} s ({fig['per_file_duckdb_peak_mib']:.0f} MiB),"
              f" compacted {fig['per_file_duckdb_compacted_s']:.2f} s / "
              f"{fig['per_file_duckdb_compacted_cpu_s']:.2f} s "
              f"({fig['per_file_duckdb_compacted_peak_mib']:.0f} MiB)")  # fmt: skip
        print(f"    vs per-database loop in one process {fig['per_file_naive_s']:.2f} s / "
              f"{fig['per_file_naive_cpu_s']:.2f} s ({fig['per_file_naive_peak_mib']:.0f} MiB): "
              f"{fig['per_file_speedup']:.1f}x wall")  # fmt: skip
        print(f"    vs `fsage analyze --db DB` on each database: "
              f"{fig['per_file_analyze_cli_s']:.2f} s / {fig['per_file_analyze_cli_cpu_s']:.2f} s"
              f" ({fig['per_file_analyze_cli_peak_mib']:.0f} MiB): exported "
              f"{fig['per_file_speedup_vs_analyze_cli']:.1f}x wall, "
              f"{fig['per_file_speedup_vs_analyze_cli_cpu']:.1f}x CPU; compacted "
              f"{fig['per_file_compacted_speedup_vs_analyze_cli']:.1f}x wall, "
              f"{fig['per_file_compacted_speedup_vs_analyze_cli_cpu']:.1f}x CPU "
              "(target >= 10x)")  # fmt: skip
        print(f"  history set: fsage fleet (compacted) {fig['history_duckdb_s']:.2f} s / "
              f"{fig['history_duckdb_cpu_s']:.2f} s ({fig['history_duckdb_peak_mib']:.0f} MiB) "
              f"vs analyzing every snapshot {fig['history_naive_s']:.1f} s / "
              f"{fig['history_naive_cpu_s']:.1f} s ({fig['history_naive_peak_mib']:.0f} MiB): "
              f"{fig['history_speedup']:.0f}x")  # fmt: skip
    if args.skip_b:
        return
    print(f"B. metrics only: {args.metrics_filesystems} file systems x "
          f"{args.metrics_snapshots} snapshots, dataset "
          f"{fig['metrics_dataset_bytes'] / MIB:.1f} MiB, compacted "
          f"{fig['metrics_compacted_bytes'] / MIB:.1f} MiB (wall s / CPU s; "
          f"{_load(fig['b_load'])})")  # fmt: skip
    print(f"  as exported: fsage fleet DIR --format json {fig['metrics_uncompacted_s']:.2f} s / "
          f"{fig['metrics_uncompacted_cpu_s']:.2f} s, peak "
          f"{fig['metrics_uncompacted_peak_mib']:.0f} MiB")  # fmt: skip
    print(
        f"  fsage fleet compact: {fig['metrics_compact_s']:.1f} s / "
        f"{fig['metrics_compact_cpu_s']:.1f} s, peak {fig['metrics_compact_peak_mib']:.0f} MiB"
    )
    print(f"  compacted: fsage fleet DIR --format json {fig['metrics_fleet_summary_s']:.2f} s / "
          f"{fig['metrics_fleet_summary_cpu_s']:.2f} s whole command, best of 3 (target < 2 s; "
          f"queries {fig['metrics_fleet_query_only_s']:.2f} s, imports "
          f"{fig['metrics_fleet_import_s']:.2f} s), peak "
          f"{fig['metrics_fleet_summary_peak_mib']:.0f} MiB; same answers as exported")  # fmt: skip
    runs = [fig[f"metrics_trend_{f}"] for f in ("text", "json", "csv")] + [fig["metrics_report"]]
    print("  compacted: --table trend text / json / csv; fsage fleet report: "
          + " / ".join(f"{r['s']:.2f} s / {r['cpu_s']:.2f} s" for r in runs[:3])
          + f"; {runs[3]['s']:.2f} s / {runs[3]['cpu_s']:.2f} s, peak "
          + " / ".join(f"{r['peak_mib']:.0f}" for r in runs[:3])
          + f"; {runs[3]['peak_mib']:.0f} MiB")  # fmt: skip


if __name__ == "__main__":
    main()
