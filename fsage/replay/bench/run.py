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

from fsage.db import rowcheck
from fsage.errors import FsageError, UsageError
from fsage.layout import Layout
from fsage.replay.bench.layoutscore import (
    BenchLayout,
    SetScore,
    bench_files_score,
    old_files_score,
)
from fsage.replay.bench.paired import PairedEffect, paired_effect
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
    with BenchTarget(Path(target), opts.suite) as tgt, contextlib.ExitStack() as stack:
        notes = list(tgt.notes)
        for n in notes:
            say(f"fsage: {n}")
        before: Layout | None = None
        try:
            before = tgt.layout()
        except FsageError as exc:
            notes.append(f"no layout scores: the target's layout cannot be read ({exc})")
            say(f"fsage: {notes[-1]}")
        btgt: BenchTarget | None = None
        if opts.baseline:
            btgt, why = _baseline_target(tgt, before, opts, say, stack)
            if why:
                notes.append(f"no empty-file-system baseline: {why}")
            elif btgt is not None and btgt.image is not None:
                from fsage.ager.images import image_kind

                if (kind := image_kind(btgt.image)) in ("xfs", "btrfs"):
                    notes.append(
                        f"the empty {kind} baseline was made by mkfs.{kind} with its defaults "
                        "at the image's size (the image's own parameters are not recovered)"
                    )
        try:
            rounds = _rounds(tgt, btgt, fn, opts, say, str(target))
        except BaseException:
            tgt.remove_bench_dir()  # a failed round leaves nothing behind, kept or not
            raise
        after: Layout | None = None
        try:
            if before is not None and rounds.outs[-1].keeps_files:
                after = tgt.layout()
        finally:
            if not opts.keep:
                tgt.remove_bench_dir()
        out = rounds.measured()
        notes += out.notes
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
    baseline = rounds.baseline()
    if baseline is not None:
        notes.append(
            f"empty-file-system baseline run in {baseline.seconds:.1f} s, interleaved with the "
            f"measured runs ({rounds.count} rounds: {rounds.why})"
        )
        notes += relate(out.results, baseline.results, rounds.paired_values())
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
            "repeat": rounds.count,
            "ci_width": opts.ci_width,
            "budget": opts.budget,
            "until_decided": opts.until_decided,
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


Suite = Callable[[BenchTarget, BenchOptions, Callable[[str], None]], SuiteOutput]


def _baseline_target(
    tgt: BenchTarget,
    before: Layout | None,
    opts: BenchOptions,
    say: Callable[[str], None],
    stack: contextlib.ExitStack,
) -> tuple[BenchTarget | None, str | None]:
    """An empty file system of the target's mkfs parameters and size, made for this
    invocation and removed after; or why there is none."""
    from fsage.replay.recreate import make_filesystem

    if tgt.image is None:
        return None, "the target is a directory (its mkfs parameters are not known)"
    from fsage.ager.images import image_kind

    image = tgt.image.with_name(f".{tgt.image.name}.fsage-baseline")
    kind = image_kind(tgt.image)
    if kind in ("xfs", "btrfs"):
        # their mkfs parameters are not recovered: mkfs's defaults at the image's size
        from fsage.ager.images import make_image

        stack.callback(lambda: image.unlink(missing_ok=True))
        say(
            f"fsage: an empty {kind} file system of the same size (mkfs.{kind}'s defaults), "
            "run in turn"
        )
        make_image(image, kind, tgt.image.stat().st_size)
        return stack.enter_context(BenchTarget(image, opts.suite)), None
    if before is None:
        return None, "the target is an image whose layout cannot be read"
    kind = before.facts.kind
    if not kind.startswith("ext") or not before.facts.mkfs.get("blocks_count"):
        return None, f"the mkfs parameters of a {kind} image are not recovered"
    stack.callback(lambda: image.unlink(missing_ok=True))
    say("fsage: an empty file system of the same mkfs parameters and size, run in turn")
    make_filesystem(image, before)
    return stack.enter_context(BenchTarget(image, opts.suite)), None


@dataclass
class Rounds:
    """What the rounds measured: per round, the measured side's output and the baseline's."""

    outs: list[SuiteOutput] = field(default_factory=list)
    base_outs: list[SuiteOutput] = field(default_factory=list)
    base_seconds: float = 0.0
    why: str = ""

    @property
    def count(self) -> int:
        return len(self.outs)

    def measured(self) -> SuiteOutput:
        return _medians(self.outs)

    def baseline(self) -> BaselineRun | None:
        if not self.base_outs:
            return None
        return BaselineRun(_medians(self.base_outs).results, self.base_seconds)

    def paired_values(self) -> dict[str, tuple[list[float], list[float]]]:
        """Per result (its key), the measured and the baseline value of every round."""
        out: dict[str, tuple[list[float], list[float]]] = {}
        for m, b in zip(self.outs, self.base_outs, strict=False):
            bases = {_result_key(r): float(r.value) for r in b.results}
            for r in m.results:
                k = _result_key(r)
                if k in bases:
                    pair = out.setdefault(k, ([], []))
                    pair[0].append(float(r.value))
                    pair[1].append(bases[k])
        return out

    def effects(self) -> list[PairedEffect]:
        """The paired effects the stopping rule watches: the main rates (read, write, ...)."""
        return [
            paired_effect(m, b)
            for k, (m, b) in self.paired_values().items()
            if json.loads(k)[0] in JUDGED_METRICS and all(b)
        ]


#: The results whose paired interval decides when the rounds may stop.
JUDGED_METRICS = frozenset({"read", "write", "creates", "transactions", "tps", "ops_per_second"})


def _medians(outs: list[SuiteOutput]) -> SuiteOutput:
    if len(outs) == 1:
        return outs[0]
    last = outs[-1]
    notes = list(dict.fromkeys(n for o in outs for n in o.notes))
    return SuiteOutput(median_results([o.results for o in outs]), last.params, notes,
                       last.keeps_files)  # fmt: skip


def _rounds(
    tgt: BenchTarget,
    btgt: BenchTarget | None,
    fn: Suite,
    opts: BenchOptions,
    say: Callable[[str], None],
    target: str,
) -> Rounds:
    """Rounds of the suite on the target and, interleaved, on the baseline (the target first
    in odd rounds, the baseline first in even ones, so that drifting load falls on both),
    until the stopping rule ends them. The target's files of the last round are left in
    place (the caller reads their layout and removes them)."""
    from fsage.replay.bench.scan import stopping_rule

    rule = stopping_rule(opts)
    got = Rounds()
    t0 = time.perf_counter()
    while True:
        i = got.count
        say(f"fsage: round {i + 1}")
        sides: list[BenchTarget] = [tgt] if btgt is None else [tgt, btgt]
        for side in sides if i % 2 == 0 else sides[::-1]:
            if side is tgt:
                tgt.remove_bench_dir()  # the previous round's files
                got.outs.append(_one_run(tgt, fn, opts, say, target))
                scaled = got.outs[-1].params.get("data_size")
                if opts.size is None and scaled is not None:
                    # the data set the target's free space allowed, on both sides and in
                    # every round: an empty file system would otherwise run a larger one
                    opts = replace(opts, size=int(scaled))
            else:
                tb = time.perf_counter()
                say("fsage: on the empty file system:")
                got.base_outs.append(_one_run(side, fn, opts, say, str(side.path)))
                side.remove_bench_dir()
                got.base_seconds += time.perf_counter() - tb
        why = rule.why_stop(got.effects(), got.count, time.perf_counter() - t0)
        if why is not None:
            got.why = why
            return got


def _one_run(
    tgt: BenchTarget, fn: Suite, opts: BenchOptions, say: Callable[[str], None], target: str
) -> SuiteOutput:
    """One run of the suite, cold, in a fresh directory (left in place)."""
    tgt.make_bench_dir()
    try:
        return fn(tgt, opts, say)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        st = tgt.statvfs()
        what = "inodes" if st.f_files and st.f_favail == 0 else "space"
        tgt.remove_bench_dir()
        raise FsageError(
            f"{target}: the {opts.suite} benchmark ran out of {what} "
            f"({st.f_bavail * st.f_frsize / 2**20:.1f} MiB and {st.f_favail:,} inodes "
            "left); its files were removed; use --size or --file-size"
        ) from None


def _result_key(r: Result) -> str:
    p = {k: v for k, v in r.params.items() if k not in _PER_REPEAT}
    return json.dumps([r.metric, r.unit, r.group, p], sort_keys=True, default=str)


#: Result parameters that differ from one repeat to the next.
_PER_REPEAT = frozenset(
    {"seconds", "values", "spread", "repeats", "median_seconds", "baseline_values"}
)


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


def relate(
    results: list[Result],
    baseline: list[Result],
    paired: dict[str, tuple[list[float], list[float]]] | None = None,
) -> list[str]:
    """Each result's baseline value and relative performance in its params: the median of the
    rounds' paired ratios (result / baseline of the same round) with its interval and verdict
    where the rounds are paired, else the ratio of the medians; notes on the inconclusive
    main results."""
    bases = {_result_key(b): b for b in baseline}
    notes = []
    for r in results:
        k = _result_key(r)
        b = bases.get(k)
        if b is None or not b.value:
            continue
        r.params["baseline"] = float(b.value)
        r.params["baseline_spread"] = float(b.params.get("spread", 0.0))
        pair = (paired or {}).get(k)
        if pair is None or not all(pair[1]):
            r.params["relative"] = float(r.value) / float(b.value)
            continue
        eff = paired_effect(*pair)
        r.params["baseline_values"] = pair[1]
        r.params["relative"] = eff.ratio
        r.params["relative_ci"] = [eff.low, eff.high]
        r.params["verdict"] = eff.verdict
        if r.metric in JUDGED_METRICS and not eff.conclusive:
            what = f"{r.metric} of {r.group}" if r.group else r.metric
            notes.append(
                f"{what}: inconclusive, {eff.ratio:.3f} of the empty file system "
                f"({eff.interval_text()}: {eff.reason})"
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
    rowcheck.verify_all(con, ("bench_runs", "bench_results"))
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
