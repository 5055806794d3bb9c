"""One benchmark run: snapshot the target, run the suite cold, snapshot again, score both sets of
files, clean up, and store the results (tables ``bench_runs`` and ``bench_results``)."""

from __future__ import annotations

import contextlib
import errno
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from fsage.errors import FsageError, UsageError
from fsage.layout import Layout
from fsage.replay.bench.layoutscore import (
    BenchLayout,
    SetScore,
    bench_files_score,
    old_files_score,
)
from fsage.replay.bench.suites import SUITES, BenchOptions, Result, SuiteOutput, check_variant
from fsage.replay.bench.target import BENCH_PREFIX, BenchTarget


@dataclass
class BenchRun:
    suite: str
    target: str
    via: str
    fs_name: str
    started_at: str
    seconds: float
    cold: bool
    params: dict[str, Any]
    results: list[Result]
    layout: BenchLayout | None
    notes: list[str] = field(default_factory=list)
    run_id: int | None = None
    fs_id: int | None = None
    snapshot_id: int | None = None

    @property
    def layout_score_bench_files(self) -> float | None:
        return None if self.layout is None or self.layout.bench is None else self.layout.bench.score

    @property
    def layout_score_old_files(self) -> float | None:
        return None if self.layout is None or self.layout.old is None else self.layout.old.score

    def result_scores(self, r: Result) -> tuple[float | None, float | None]:
        """Layout scores for one result: of the files it measured where they are a group of
        the run's files, else of the run's files."""
        if self.layout is not None and r.group:
            return self.layout.group_scores(r.group)
        return self.layout_score_bench_files, self.layout_score_old_files

    def results_json(self) -> list[dict[str, Any]]:
        out = []
        for r in self.results:
            bench, old = self.result_scores(r)
            out.append(
                {
                    "suite": self.suite,
                    "params": {**_public(self.params), **r.params},
                    "metric": r.metric,
                    "value": r.value,
                    "unit": r.unit,
                    "layout_score_bench_files": bench,
                    "layout_score_old_files": old,
                }
            )
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "suite": self.suite,
            "target": self.target,
            "via": self.via,
            "fs_name": self.fs_name,
            "fs_id": self.fs_id,
            "snapshot_id": self.snapshot_id,
            "started_at": self.started_at,
            "seconds": self.seconds,
            "cold": self.cold,
            "params": _public(self.params),
            "layout_score_bench_files": self.layout_score_bench_files,
            "layout_score_old_files": self.layout_score_old_files,
            "layout": None if self.layout is None else self.layout.to_json(),
            "notes": self.notes,
            "results": self.results_json(),
        }


def _public(params: dict[str, Any]) -> dict[str, Any]:
    """Params without the bulky raw texts (postmark's configuration and output)."""
    return {k: v for k, v in params.items() if k not in ("config", "output")}


def run_bench(
    target: Path,
    opts: BenchOptions,
    db: Path | None = None,
    echo: Callable[[str], None] | None = None,
) -> BenchRun:
    """Run suite ``opts.suite`` on ``target`` (an image or a mounted directory); store the run
    in ``db`` when given."""
    say = echo or (lambda s: None)
    if opts.suite == "scan":
        from fsage.replay.bench.scan import run_scan

        return run_scan(target, opts, db, say)
    fn = SUITES.get(opts.suite)
    if fn is None:
        raise UsageError(f"unknown suite {opts.suite!r} (one of {', '.join(SUITES)})")
    check_variant(opts)
    started = datetime.now(UTC)
    t0 = time.perf_counter()
    with BenchTarget(Path(target), opts.suite) as tgt:
        notes = list(tgt.notes)
        for n in notes:
            say(f"fsage: {n}")
        before: Layout | None = None
        try:
            before = tgt.layout()
        except FsageError as exc:
            notes.append(f"no layout scores: the target's layout cannot be read ({exc})")
            say(f"fsage: {notes[-1]}")
        out, after = _repeated(tgt, fn, opts, say, str(target), want_after=before is not None)
        notes += out.notes
        baseline: BaselineRun | None = None
        if opts.baseline and before is not None and tgt.image is not None:
            baseline = _baseline(tgt, before, fn, opts, say)
        elif opts.baseline:
            notes.append(
                "no empty-file-system baseline: the target is "
                + ("a directory (its mkfs parameters are not known)" if tgt.image is None
                   else "an image whose layout cannot be read")
            )  # fmt: skip
        if opts.keep:
            notes.append(f"benchmark files kept in {tgt.bench_name}")
        via = tgt.description
        cold = tgt.cold_possible
    layout = None
    if before is not None:
        old = old_files_score(before, BENCH_PREFIX)
        bench: SetScore | None = None
        groups: dict[str, SetScore] = {}
        if after is not None:
            bench, groups = bench_files_score(after, tgt.bench_name)
        layout = BenchLayout(before.facts.block_size, bench, old, groups)
    if baseline is not None:
        notes.append(f"empty-file-system baseline run in {baseline.seconds:.1f} s")
        notes += _relate(out.results, baseline)
    from fsage.db.store import default_fs_name

    run = BenchRun(
        suite=opts.suite,
        target=str(target),
        via=via,
        fs_name=opts.name or (default_fs_name(before.facts) if before else Path(target).name),
        started_at=started.isoformat(timespec="seconds"),
        seconds=time.perf_counter() - t0,
        cold=cold,
        params={
            **out.params,
            "size": opts.size,
            # The variant the suite ran (its default when none was asked for).
            "variant": out.params.get("variant", opts.variant),
            "repeat": max(opts.repeat, 1),
        },
        results=out.results,
        layout=layout,
        notes=notes,
    )
    if db is not None:
        from fsage.db.store import Store

        with Store.open(db, create=True) as store:
            uuid = None if before is None else before.facts.uuid
            store_run(store, run, uuid=uuid, named=opts.name is not None)
    return run


@dataclass
class BaselineRun:
    """The same suite, repeated as often, on an empty file system of the target's mkfs
    parameters and size, made for this invocation and removed after."""

    results: list[Result]
    seconds: float
    notes: list[str] = field(default_factory=list)


def _repeated(
    tgt: BenchTarget,
    fn: Callable[[BenchTarget, BenchOptions, Callable[[str], None]], SuiteOutput],
    opts: BenchOptions,
    say: Callable[[str], None],
    target: str,
    *,
    want_after: bool,
) -> tuple[SuiteOutput, Layout | None]:
    """Run the suite ``opts.repeat`` times (each starting cold, in a fresh directory), and
    the results as their medians; the layout after the last repeat when ``want_after``."""
    outs: list[SuiteOutput] = []
    after: Layout | None = None
    n = max(opts.repeat, 1)
    for i in range(n):
        last = i == n - 1
        if n > 1:
            say(f"fsage: repeat {i + 1}/{n}")
        tgt.make_bench_dir()
        exhausted: str | None = None
        try:
            try:
                out = fn(tgt, opts, say)
            except OSError as exc:
                if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                st = tgt.statvfs()
                what = "inodes" if st.f_files and st.f_favail == 0 else "space"
                exhausted = (
                    f"{target}: the {opts.suite} benchmark ran out of {what} "
                    f"({st.f_bavail * st.f_frsize / 2**20:.1f} MiB and {st.f_favail:,} inodes "
                    "left); its files were removed; use --size or --file-size"
                )
            if exhausted is None and last and want_after and out.keeps_files:
                after = tgt.layout()
        finally:
            if not (opts.keep and last) or exhausted is not None:
                tgt.remove_bench_dir()
        if exhausted is not None:
            raise FsageError(exhausted)
        outs.append(out)
    if n == 1:
        return outs[0], after
    return SuiteOutput(median_results([o.results for o in outs]), outs[-1].params,
                       outs[-1].notes, outs[-1].keeps_files), after  # fmt: skip


def _result_key(r: Result) -> str:
    p = {k: v for k, v in r.params.items() if k not in _PER_REPEAT}
    return json.dumps([r.metric, r.unit, r.group, p], sort_keys=True, default=str)


#: Result parameters that differ from one repeat to the next.
_PER_REPEAT = frozenset({"seconds", "values", "spread", "repeats", "median_seconds"})


def median_results(runs: list[list[Result]]) -> list[Result]:
    """One result per measurement: the median of its values over the repeats, with the values
    and their spread ((max - min) / median) in its params."""
    order: list[str] = []
    by: dict[str, list[Result]] = {}
    for results in runs:
        for r in results:
            k = _result_key(r)
            if k not in by:
                order.append(k)
            by.setdefault(k, []).append(r)
    out = []
    for k in order:
        rs = by[k]
        vals = [float(r.value) for r in rs]
        med = float(np.median(vals))
        spread = (max(vals) - min(vals)) / med if med else 0.0
        params = {**rs[0].params, "repeats": len(vals), "values": vals, "spread": spread}
        if "seconds" in params:
            params["seconds"] = float(np.median([float(r.params["seconds"]) for r in rs]))
        out.append(Result(rs[0].metric, med, rs[0].unit, params, rs[0].group))
    return out


def _baseline(
    tgt: BenchTarget,
    before: Layout,
    fn: Callable[[BenchTarget, BenchOptions, Callable[[str], None]], SuiteOutput],
    opts: BenchOptions,
    say: Callable[[str], None],
) -> BaselineRun | None:
    from fsage.replay.recreate import make_filesystem

    assert tgt.image is not None
    if not before.facts.kind.startswith("ext") or not before.facts.mkfs.get("blocks_count"):
        return None
    image = tgt.image.with_name(f".{tgt.image.name}.fsage-baseline")
    say("fsage: the same suite on an empty file system of the same mkfs parameters and size")
    t0 = time.perf_counter()
    try:
        make_filesystem(image, before)
        with BenchTarget(image, opts.suite) as btgt:
            out, _ = _repeated(btgt, fn, replace(opts, keep=False), say, str(image),
                               want_after=False)  # fmt: skip
    finally:
        with contextlib.suppress(OSError):
            image.unlink()
    return BaselineRun(out.results, time.perf_counter() - t0, out.notes)


def _relate(results: list[Result], base: BaselineRun) -> list[str]:
    """Each result's baseline value and relative performance (result / baseline) in its params;
    notes where the spread of the repeats is wider than the effect (|1 - relative|)."""
    bases = {_result_key(b): b for b in base.results}
    notes = []
    for r in results:
        b = bases.get(_result_key(r))
        if b is None or not b.value:
            continue
        rel = float(r.value) / float(b.value)
        r.params["baseline"] = float(b.value)
        r.params["relative"] = rel
        spread = max(float(r.params.get("spread", 0.0)), float(b.params.get("spread", 0.0)))
        r.params["baseline_spread"] = float(b.params.get("spread", 0.0))
        if spread > abs(1.0 - rel):
            what = f"{r.metric} of {r.group}" if r.group else r.metric
            notes.append(
                f"{what}: the repeats spread {spread:.1%}, wider than the effect they report "
                f"({rel:.3f} of the empty file system)"
            )
    return notes


def store_run(store: Any, run: BenchRun, uuid: str | None = None, named: bool = False) -> int:
    """Insert ``run`` and its results; link it to the file system of the same UUID (and that
    file system's newest snapshot) when the store knows one, and, unless ``named`` (--name
    given), record it under that file system's name."""
    con = store.con
    if uuid:
        row = con.execute(
            "SELECT id, name FROM filesystems WHERE uuid = ? ORDER BY id LIMIT 1", (uuid,)
        ).fetchone()
        if row is not None:
            run.fs_id = int(row[0])
            if not named:
                run.fs_name = str(row[1])
            snap = con.execute(
                "SELECT MAX(id) FROM snapshots WHERE fs_id = ?", (run.fs_id,)
            ).fetchone()
            run.snapshot_id = None if snap is None or snap[0] is None else int(snap[0])
    with store.transaction() as tx:
        cur = tx.execute(
            "INSERT INTO bench_runs (suite, target, fs_name, fs_id, snapshot_id, started_at, "
            "finished_at, seconds, params, cold, layout_score_bench_files, "
            "layout_score_old_files, layout, notes) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                run.suite,
                run.target,
                run.fs_name,
                run.fs_id,
                run.snapshot_id,
                run.started_at,
                datetime.now(UTC).isoformat(timespec="seconds"),
                run.seconds,
                json.dumps(run.params, default=str),
                int(run.cold),
                run.layout_score_bench_files,
                run.layout_score_old_files,
                json.dumps(None if run.layout is None else run.layout.to_json()),
                json.dumps(run.notes),
            ),
        )
        run_id = int(cur.lastrowid or 0)
        for r in run.results:
            bench, old = run.result_scores(r)
            tx.execute(
                "INSERT INTO bench_results (run_id, metric, value, unit, params, "
                "layout_score_bench_files, layout_score_old_files) VALUES (?,?,?,?,?,?,?)",
                (run_id, r.metric, float(r.value), r.unit, json.dumps(r.params), bench, old),
            )
    run.run_id = run_id
    return run_id


@dataclass
class StoredResult:
    run_id: int
    suite: str
    fs_name: str | None
    target: str
    started_at: str
    cold: bool
    run_params: dict[str, Any]
    layout: dict[str, Any] | None
    metric: str
    value: float
    unit: str
    params: dict[str, Any]
    layout_score_bench_files: float | None
    layout_score_old_files: float | None
    snapshot_id: int | None = None


def has_bench_tables(con: Any) -> bool:
    row = con.execute(
        "SELECT 1 FROM sqlite_master WHERE type='table' AND name='bench_results'"
    ).fetchone()
    return row is not None


def stored_results(store: Any, suite: str | None = None) -> list[StoredResult]:
    """Every stored result (with its run's facts), oldest run first."""
    con = store.con
    if not has_bench_tables(con):
        return []
    sql = (
        "SELECT r.id, r.suite, r.fs_name, r.target, r.started_at, r.cold, r.params, r.layout, "
        "x.metric, x.value, x.unit, x.params, x.layout_score_bench_files, "
        "x.layout_score_old_files, r.snapshot_id FROM bench_results x "
        "JOIN bench_runs r ON r.id = x.run_id"
    )
    args: tuple[Any, ...] = ()
    if suite is not None:
        sql += " WHERE r.suite = ?"
        args = (suite,)
    sql += " ORDER BY r.id, x.rowid"
    out = []
    for row in con.execute(sql, args):
        out.append(
            StoredResult(
                run_id=int(row[0]),
                suite=str(row[1]),
                fs_name=row[2],
                target=str(row[3]),
                started_at=str(row[4]),
                cold=bool(row[5]),
                run_params=json.loads(row[6] or "{}"),
                layout=json.loads(row[7]) if row[7] else None,
                metric=str(row[8]),
                value=float(row[9]),
                unit=str(row[10]),
                params=json.loads(row[11] or "{}"),
                layout_score_bench_files=row[12],
                layout_score_old_files=row[13],
                snapshot_id=None if row[14] is None else int(row[14]),
            )
        )
    return out
