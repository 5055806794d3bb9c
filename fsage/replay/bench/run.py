"""One benchmark run: snapshot the target, run the suite cold, snapshot again, score both sets of
files, clean up, and store the results (tables ``bench_runs`` and ``bench_results``, kept by
:mod:`.record`). The scan suite runs in :mod:`.scan`."""

from __future__ import annotations

import contextlib
import errno
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from fsage.errors import FsageError, UsageError
from fsage.layout import Layout
from fsage.replay.bench.layoutscore import (
    BenchLayout,
    SetScore,
    bench_files_score,
    old_files_score,
)
from fsage.replay.bench.paired import PairedEffect, paired_effect
from fsage.replay.bench.record import BenchRun as BenchRun  # re-exported, as are the next
from fsage.replay.bench.record import StoredResult as StoredResult
from fsage.replay.bench.record import store_run as store_run
from fsage.replay.bench.record import stored_results as stored_results
from fsage.replay.bench.scan import run_scan
from fsage.replay.bench.suites import (
    SUITES,
    BenchOptions,
    Result,
    SuiteOutput,
    check_variant,
    stopping_rule,
)
from fsage.replay.bench.target import BENCH_PREFIX, BenchTarget


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
