#!/usr/bin/env python3
"""Peak memory of `fsage export` and `fsage fleet compact` as the database grows.

For each size in --files: one synthetic file system (fsage.fleet.synth) of that many files x
--snapshots nightly snapshots in one SQLite database, then, each as its own process:
  export    `fsage export --db DB DIR` (every snapshot at once, as a first export runs)
  compact   `fsage fleet compact DIR` of that export
and a fleet of many small partitions (--fleet file systems of --fleet-files files x
--snapshots snapshots, one export), compacted: DuckDB reading many small files at once.
--baseline TREE also runs TREE's `fsage export` (another checkout of fsage, its extension
built) on the same databases in the same run, right before this tree's, for a comparison on
one machine at one load.

Peak memory is each process's maximum resident set (wait4), in MiB, and beside it the largest
anonymous part of it sampled (``RssAnon``: the heap's; the rest is mapped files' pages, the
libraries' and the export's paged arrays', which the kernel can drop); times are wall and CPU
seconds (user + system). The load average is printed beside each row: on a loaded machine
wall seconds stretch, peaks do not. Last, each command's largest peak against the target
(``TARGET_MB``, 200 MB) and how much its peak grew from the smallest size to the largest.

--per-dir sets how many files a directory of the built file systems holds (a database of its
own): the export keeps per-directory state, so its peak grows with directories, not files.
--fanout nests those directories (paths as long as a real tree's; default: all under the root).

--limit-mb N runs each command once more in a memory cgroup of N MiB (root; cgroup v2 or v1's
memory controller) and prints whether it completed and in what time: the memory a command
needs, where the peak resident set also counts file pages the kernel could take back. A
cgroup is charged the anonymous memory and the file pages its processes bring in; the
libraries' pages, already cached, are not.

--heaptrack runs the export once more under heaptrack (Debian's `heaptrack` package), which
records every allocation of the C heap (numpy's arrays, SQLite's caches, Arrow's buffers,
Python's objects) and prints its peak: the memory the command holds at once, without what the
kernel counts beside it (freed pieces of the heap not yet given back, mapped files' pages).
A peak that stays the same from the smallest size to the largest is a bound by a chunk, not by
the database; the resident peak's growth is then the heap's fragments, not data held. Not the
compaction: DuckDB allocates through its own allocator (jemalloc), which heaptrack does not see.

--tmpdir DIR sets the commands' TMPDIR: a tmpfs there stands for a machine whose /tmp is one
(Fedora, Arch, Debian 13), whose pages are memory a cgroup is charged and cannot take back;
the export's scratch should go to disk instead (fsage.scratch), and with --limit-mb complete.

Usage: python3 bench/fleet_memory.py [--files 100000,350000,700000,1400000] [--snapshots 3]
                                     [--fleet 100] [--fleet-files 2000] [--json]
                                     [--baseline /path/to/other/fsage] [--repeat 3] [--check]
                                     [--per-dir 20] [--fanout 8] [--no-compact]
                                     [--limit-mb 100] [--tmpdir /mnt/tmpfs] [--heaptrack]
e.g. python3 bench/fleet_memory.py --files 1400000,5600000 --fleet 0 --no-compact
         --baseline /path/to/main --repeat 3 --check --keep /tmp/fleet-memory
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

MIB = 1 << 20
SAMPLE_S = 0.02  # how often a command's anonymous memory is read
TARGET_MB = 200  # peak resident set of export and compact, whatever the database's size
PER_DIR = 1000  # files per directory of the synthetic file systems (fsage.fleet.synth's)


def _anonymous_peak(pid: int, stop: threading.Event, out: list[float]) -> None:
    """The largest anonymous resident set (``RssAnon``, MiB) seen every ``SAMPLE_S`` seconds
    in ``/proc/PID/status``; the rest of the peak is mapped files' pages (libraries, the
    export's paged arrays), which the kernel can take back."""
    status = Path(f"/proc/{pid}/status")
    while not stop.wait(SAMPLE_S):
        try:
            text = status.read_text()
        except OSError:
            return
        for line in text.splitlines():
            if line.startswith("RssAnon:"):
                out[0] = max(out[0], int(line.split()[1]) / 1024)


@contextlib.contextmanager
def memory_cgroup(limit_mib: int) -> Iterator[Path]:
    """A memory cgroup of ``limit_mib`` MiB without swap (v2 where its memory controller is
    enabled, else v1's), removed afterwards: yields the file a process joins it through."""
    v2 = Path("/sys/fs/cgroup")
    enabled = v2 / "cgroup.controllers"
    if enabled.exists() and "memory" in enabled.read_text().split():
        group, limits = v2 / f"fsage-bench-{os.getpid()}", {"memory.max": limit_mib * MIB,
                                                             "memory.swap.max": 0}  # fmt: skip
    else:
        group = Path("/sys/fs/cgroup/memory") / f"fsage-bench-{os.getpid()}"
        # memory and swap together (the second only where swap is accounted), in this order
        limits = {"memory.limit_in_bytes": limit_mib * MIB,
                  "memory.memsw.limit_in_bytes": limit_mib * MIB}  # fmt: skip
    try:
        group.mkdir()
    except OSError as exc:
        raise SystemExit(f"--limit-mb: cannot make a memory cgroup ({exc}); run as root") from None
    try:
        for name, value in limits.items():
            if (group / name).exists():
                (group / name).write_text(str(value))
        yield group / "cgroup.procs"
    finally:
        for _ in range(50):  # its last process may still be leaving
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def measured(
    argv: list[str], env: dict[str, str], tree: Path = REPO, limit_mib: int | None = None
) -> dict[str, float]:
    """Wall seconds, CPU seconds and peak RSS (MiB) of one process, its sampled peak of
    anonymous memory, the load at its start. ``limit_mib``: run in a memory cgroup of that
    size, and say whether it completed (``completed``: 1 or 0) instead of failing."""
    if not limit_mib:
        return _measured(argv, env, tree, None)
    with memory_cgroup(limit_mib) as procs:
        return _measured(argv, env, tree, procs)


def _measured(
    argv: list[str], env: dict[str, str], tree: Path, procs: Path | None
) -> dict[str, float]:
    join_cgroup = None
    if procs is not None:
        cgroup_procs = procs

        def join_cgroup() -> None:  # in the child, before it runs the command
            cgroup_procs.write_text(str(os.getpid()))

    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    # run from the tree measured: ``python -m`` looks in the working directory first
    p = subprocess.Popen(argv, env=env, cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         preexec_fn=join_cgroup)  # fmt: skip
    assert p.stderr is not None
    anon = [0.0]
    stop = threading.Event()
    sampler = threading.Thread(target=_anonymous_peak, args=(p.pid, stop, anon), daemon=True)
    sampler.start()
    err = p.stderr.read()
    stop.set()  # before the wait: /proc/PID goes (or is a zombie's) once it is reaped
    sampler.join()
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    code = os.waitstatus_to_exitcode(status)
    # in a cgroup, the OOM killer's SIGKILL is a result; any other failure is not
    if code != 0 and (procs is None or code != -9):
        raise SystemExit(f"{' '.join(argv)} failed: {err.decode()[-2000:]}")
    out = {
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "peak_mib": usage.ru_maxrss / 1024,
        "anon_mib": anon[0],
        "load": load,
    }
    if procs is not None:
        out["completed"] = float(code == 0)  # else killed by the cgroup's OOM killer
    return out


def heap_peak(argv: list[str], env: dict[str, str], out: Path) -> dict[str, float]:
    """The peak of the C heap's live allocations (MiB) of one run of ``argv`` under heaptrack
    (its record written beside ``out``, removed after), and the run's wall seconds."""
    # heaptrack's script splits its output path at spaces
    record = out.parent / (out.name.replace(" ", "-") + ".heaptrack")
    t0 = time.perf_counter()
    subprocess.run(["heaptrack", "-o", str(record), *argv], env=env, cwd=REPO, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    wall = time.perf_counter() - t0
    written = sorted(out.parent.glob(f"{record.name}*"))
    if not written:
        raise SystemExit(f"heaptrack wrote no record for {' '.join(argv)}")
    try:
        text = subprocess.run(
            ["heaptrack_print", "-f", str(written[0]), "-p", "0", "-a", "0", "-T", "0", "-l", "0"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
    finally:
        for f in written:
            f.unlink()
    return {"heap_peak_mib": _heaptrack_bytes(text, "peak heap memory consumption") / MIB,
            "wall_s": wall}  # fmt: skip


def _heaptrack_bytes(text: str, label: str) -> float:
    """A figure of heaptrack_print's summary in bytes: it writes them with decimal prefixes
    (53.38M is 53,380,000 bytes; its massif output gives the same peak in bytes)."""
    for line in text.splitlines():
        if line.startswith(label + ":"):
            figure = line.split(":", 1)[1].strip()
            scale = {"K": 1e3, "M": 1e6, "G": 1e9}.get(figure[-1:], 1.0)
            return float(figure.rstrip("BKMG")) * scale
    raise SystemExit(f"heaptrack_print gave no {label!r}")


BUILD = """
import sys
from fsage.db.store import Store
from fsage.fleet import synth
from fsage.fleet.synth import synthetic_history
db, files, snapshots, per_dir, fanout, *names = sys.argv[1:]
synth.PER_DIR = int(per_dir)
synth.FANOUT = int(fanout)
with Store.open(db, create=True) as store:
    for i, name in enumerate(names):
        synthetic_history(store, name, files=int(files), snapshots=int(snapshots), seed=100 + i)
"""


def build(
    db: Path, names: list[str], files: int, snapshots: int, env: dict[str, str],
    per_dir: int = PER_DIR, fanout: int = 0,
) -> None:  # fmt: skip
    """In a process of its own: a child's peak resident set starts at its parent's size when
    it was forked, so this process stays small (no numpy, no database built in it).
    ``per_dir``: files a directory of the synthetic file system holds; ``fanout``: the
    subdirectories one holds (0: all under the root)."""
    argv = [sys.executable, "-c", BUILD, str(db), str(files), str(snapshots), str(per_dir),
            str(fanout), *names]  # fmt: skip
    subprocess.run(argv, env=env, cwd=REPO, check=True)


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def median_run(runs: list[dict[str, float]]) -> dict[str, float]:
    """Runs of one command: the median of each figure (the load: the first run's)."""
    keys = ("wall_s", "cpu_s", "peak_mib", "anon_mib")
    out = {k: float(statistics.median(r[k] for r in runs)) for k in keys}
    out["load"] = runs[0]["load"]
    if len(runs) > 1:
        out["peaks_mib"] = [r["peak_mib"] for r in runs]  # type: ignore[assignment]
    return out


SAME = """
import sys
from pathlib import Path
import pyarrow.parquet as pq
a, b = Path(sys.argv[1]), Path(sys.argv[2])
def groups(root):
    # each directory's row groups in file order: a run's rows may lie in more files on one
    # side (a run is cut into files of FILE_GROUPS row groups) and still be the same rows
    out = {}
    for p in sorted(root.rglob("*.parquet")):
        f = pq.ParquetFile(p)
        md = f.metadata
        out.setdefault(p.parent.relative_to(root), []).extend(
            (f, i, md.row_group(i).num_rows) for i in range(md.num_row_groups))
    return out
ga, gb = groups(a), groups(b)
if ga.keys() != gb.keys():
    sys.exit(f"different directories: {sorted(set(ga) ^ set(gb))[:3]}")
for rel in sorted(ga):
    na, nb = [g[2] for g in ga[rel]], [g[2] for g in gb[rel]]
    if na != nb:
        sys.exit(f"{rel}: row groups {na[:5]} against {nb[:5]}")
    for k, ((fa, i, _), (fb, j, _)) in enumerate(zip(ga[rel], gb[rel])):  # a group at a time
        if not fa.read_row_group(i).equals(fb.read_row_group(j)):
            sys.exit(f"{rel}: row group {k} differs")
"""


def same_dataset(a: Path, b: Path, env: dict[str, str]) -> str | None:
    """None when the two exports hold the same rows in the same row groups in every
    directory (however a run's rows are cut into files), else the first difference. In a
    child: a process forked later starts its peak resident set at this one's size, so this
    one reads no table itself."""
    argv = [sys.executable, "-c", SAME, str(a), str(b)]
    done = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True)
    return None if done.returncode == 0 else (done.stderr.strip().splitlines() or ["?"])[-1]


def measure(
    label: str, db: Path, work: Path, env: dict[str, str], fsage: list[str],
    baseline: Path | None = None, compact: bool = True, repeat: int = 1, check: bool = False,
    limit_mib: int | None = None, heaptrack: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """Export ``db`` (``repeat`` times, alternating with the baseline tree's when given:
    the median of each figure), then compact the export once; with ``limit_mib``, each once
    more in a memory cgroup of that size (the compaction if the export completed); with
    ``heaptrack``, the export once more under heaptrack, for its heap's peak."""
    out = work / f"{label}-export"
    other = work / f"{label}-baseline"
    row: dict[str, Any] = {"case": label, "database_mib": db.stat().st_size / MIB}
    argv = [*fsage, "export", "--db", str(db), "--host", "h"]
    mine, theirs = [], []
    for _ in range(repeat):
        if baseline is not None:
            shutil.rmtree(other, ignore_errors=True)
            theirs.append(measured([*argv, str(other)], {**env, "PYTHONPATH": str(baseline)},
                                   baseline))  # fmt: skip
        shutil.rmtree(out, ignore_errors=True)
        mine.append(measured([*argv, str(out)], env))
    if theirs:
        row["baseline_export"] = median_run(theirs)
        if check:
            row["same_as_baseline"] = same_dataset(out, other, env) or "yes"
    shutil.rmtree(other, ignore_errors=True)
    row["export"] = median_run(mine)
    row["dataset_files"] = sum(1 for _ in out.rglob("*.parquet"))
    row["dataset_mib"] = du(out) / MIB
    limited = work / f"{label}-limited"
    if limit_mib:
        shutil.rmtree(limited, ignore_errors=True)
        row["export"]["limited"] = measured([*argv, str(limited)], env, limit_mib=limit_mib)
    if heaptrack:
        traced = work / f"{label}-heaptrack"
        shutil.rmtree(traced, ignore_errors=True)
        row["export"]["heaptrack"] = heap_peak([*argv, str(traced)], env, traced)
        shutil.rmtree(traced, ignore_errors=True)
    if compact:
        row["compact"] = measured([*fsage, "fleet", "compact", str(out)], env)
        if limit_mib and row["export"]["limited"]["completed"]:
            compact_argv = [*fsage, "fleet", "compact", str(limited)]
            row["compact"]["limited"] = measured(compact_argv, env, limit_mib=limit_mib)
    shutil.rmtree(limited, ignore_errors=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", default="100000,350000,700000", help="comma-separated file counts")
    ap.add_argument("--snapshots", type=int, default=3)
    ap.add_argument("--fleet", type=int, default=100, help="file systems of the small fleet")
    ap.add_argument("--fleet-files", type=int, default=2000)
    ap.add_argument("--keep", type=Path, help="work here and keep the data")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--baseline", type=Path, help="another fsage tree whose export to compare")
    ap.add_argument("--per-dir", type=int, default=PER_DIR,
                    help=f"files per directory of the file systems built (default {PER_DIR};"
                         " a real tree has one directory per 10-30 files)")  # fmt: skip
    ap.add_argument("--fanout", type=int, default=0,
                    help="subdirectories a directory holds (default 0: every directory under"
                         " the root; 8 gives paths as deep as a real tree's)")  # fmt: skip
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="exports of each database (alternating with --baseline's): medians",
    )
    ap.add_argument(
        "--no-compact", dest="compact", action="store_false", help="measure the exports only"
    )
    ap.add_argument(
        "--limit-mb", type=int, help="also run each command in a memory cgroup of so many MiB"
    )
    ap.add_argument("--tmpdir", type=Path, help="the commands' TMPDIR (a tmpfs, say)")
    ap.add_argument("--heaptrack", action="store_true",
                    help="the export once more under heaptrack: its C heap's peak")  # fmt: skip
    ap.add_argument(
        "--check",
        action="store_true",
        help="with --baseline: require the same Parquet tables and row groups",
    )
    args = ap.parse_args()
    if args.heaptrack and shutil.which("heaptrack") is None:
        raise SystemExit("--heaptrack: heaptrack is not installed (apt-get install heaptrack)")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if args.tmpdir:
        env["TMPDIR"] = str(args.tmpdir)
    fsage = [sys.executable, "-m", "fsage"]
    work = args.keep or Path(tempfile.mkdtemp(prefix="fsage-fleet-memory-"))
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    try:
        for n in (int(x) for x in args.files.split(",") if x):
            suffix = "" if args.per_dir == PER_DIR else f"-d{args.per_dir}"
            suffix += f"-t{args.fanout}" if args.fanout else ""
            db = work / f"f{n}{suffix}.db"
            if not db.exists():
                build(db, [f"fs{n}"], n, args.snapshots, env, args.per_dir, args.fanout)
            rows.append(measure(f"{n} files", db, work, env, fsage, args.baseline,
                                args.compact, args.repeat, args.check,
                                args.limit_mb, args.heaptrack))  # fmt: skip
            shutil.rmtree(work / f"{n} files-export", ignore_errors=True)
        if args.fleet:
            db = work / "fleet.db"
            if not db.exists():
                names = [f"fs{i:04d}" for i in range(args.fleet)]
                build(db, names, args.fleet_files, args.snapshots, env)
            label = f"{args.fleet} fs x {args.fleet_files} files"
            rows.append(measure(label, db, work, env, fsage, compact=args.compact,
                                heaptrack=args.heaptrack))  # fmt: skip
            # a kept directory's next run exports every snapshot again, as a first export does
            shutil.rmtree(work / f"{label}-export", ignore_errors=True)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    verdicts = verdict(rows)
    if args.json:
        print(json.dumps({"snapshots": args.snapshots, "rows": rows, "target": verdicts}, indent=2))
        return
    print(f"{args.snapshots} snapshots each, {args.per_dir} files a directory; wall s / CPU s"
          f" (user + system), peak RSS (median of {args.repeat} run(s));"
          f" load average at each command's start, {os.cpu_count()} CPUs")  # fmt: skip
    if args.tmpdir:
        from fsage.scratch import memory_fs

        kind = memory_fs(args.tmpdir)
        print(f"  TMPDIR {args.tmpdir}: " + (f"a {kind}" if kind else "on disk"))
    for r in rows:
        print(f"  {r['case']:>26}: database {r['database_mib']:7.1f} MiB,"
              f" dataset {r['dataset_mib']:6.1f} MiB in {r['dataset_files']} files")  # fmt: skip
        runs = [("export", r["export"])]
        if "compact" in r:
            runs.append(("fleet compact", r["compact"]))
        if "baseline_export" in r:
            runs.insert(0, ("baseline exp.", r["baseline_export"]))
        for name, m in runs:
            peaks = m.get("peaks_mib")
            print(f"  {'':>26}  {name:<13} {m['wall_s']:6.1f} s / {m['cpu_s']:6.1f} s,"
                  f" peak {m['peak_mib']:6.0f} MiB, anon. {m['anon_mib']:4.0f}"
                  f" (load {m['load']:.1f})"
                  + (f" runs {' '.join(f'{p:.0f}' for p in peaks)}" if peaks else ""))  # fmt: skip
            if "heaptrack" in m:
                print(f"  {'':>26}  {'':<13} heap peak {m['heaptrack']['heap_peak_mib']:6.1f} MiB"
                      f" (heaptrack, {m['heaptrack']['wall_s']:.0f} s)")  # fmt: skip
            if "limited" in m:
                lim = m["limited"]
                done = "completed" if lim["completed"] else "KILLED (out of memory)"
                print(f"  {'':>26}  {'':<13} in {args.limit_mb} MiB: {done} after"
                      f" {lim['wall_s']:.1f} s / {lim['cpu_s']:.1f} s"
                      f" (load {lim['load']:.1f})")  # fmt: skip
        if "baseline_export" in r:
            b = r["baseline_export"]
            print(f"  {'':>26}  export CPU {r['export']['cpu_s'] / b['cpu_s'] - 1:+.1%} and peak"
                  f" {r['export']['peak_mib'] - b['peak_mib']:+.1f} MiB against the baseline"
                  + (f"; same dataset: {r['same_as_baseline']}"
                     if "same_as_baseline" in r else ""))  # fmt: skip
    for v in verdicts:
        print(f"  {v['command']:<13} largest peak {v['peak_mib']:.0f} MiB"
              f" ({v['peak_mib'] * MIB / 1e6:.0f} MB): target {TARGET_MB} MB"
              f" {'met' if v['met'] else 'NOT met'};"
              f" {v['growth_mib']:+.0f} MiB (anon. {v['anon_growth_mib']:+.0f})"
              f" from {v['smallest']} to {v['largest']}"
              + (f"; in {args.limit_mb} MiB: {v['limited']}"
                 if "limited" in v else "")
              + (f"; heap peak {v['heap_growth_mib']:+.1f} MiB (largest {v['heap_peak_mib']:.1f})"
                 if "heap_growth_mib" in v else ""))  # fmt: skip


def verdict(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per command: its largest peak against the target, and its growth with the size of
    the file system (the single-file-system rows, smallest to largest)."""
    single = sorted(
        (r for r in rows if r["case"].endswith(" files") and " x " not in r["case"]),
        key=lambda r: int(r["case"].split()[0]),
    )
    out = []
    commands = [("export", "export"), ("compact", "fleet compact")]
    if single and all("baseline_export" in r for r in single):  # the same sizes, the other tree
        commands.insert(0, ("baseline_export", "baseline exp."))
    for key, name in commands:
        if not any(key in r for r in rows):
            continue
        peak = max(r[key]["peak_mib"] for r in rows if key in r)
        out.append(
            {
                "command": name,
                "peak_mib": peak,
                "met": peak * MIB <= TARGET_MB * 1e6,
                "smallest": single[0]["case"] if single else None,
                "largest": single[-1]["case"] if single else None,
                "growth_mib": _growth(single, key, "peak_mib"),
                "anon_growth_mib": _growth(single, key, "anon_mib"),
            }
        )
        traced = [r for r in single if key in r and "heaptrack" in r[key]]
        if traced:
            heaps = [r[key]["heaptrack"]["heap_peak_mib"] for r in traced]
            out[-1]["heap_peak_mib"] = max(heaps)
            out[-1]["heap_growth_mib"] = heaps[-1] - heaps[0]
        limited = [r[key]["limited"] for r in rows if key in r and "limited" in r[key]]
        if limited:
            done = sum(int(m["completed"]) for m in limited)
            out[-1]["limited"] = f"{done} of {len(limited)} completed"
    return out


def _growth(single: list[dict[str, Any]], key: str, figure: str) -> float:
    if not single or key not in single[0]:
        return 0.0
    return float(single[-1][key][figure] - single[0][key][figure])


if __name__ == "__main__":
    main()
