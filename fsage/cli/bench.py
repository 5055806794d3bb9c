"""`fsage bench`: run the seed benchmarks on an image or a mounted directory; `fsage bench predict`:
seed 002's predicted vs actual table; `fsage bench results`: the stored results."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from fsage.cli.common import db_option, echo_csv, echo_json, echo_table, format_option
from fsage.errors import StoreError, UsageError
from fsage.imagelock import image_lock

F = TypeVar("F", bound=Callable[..., Any])


class BenchGroup(click.Group):
    """``fsage bench TARGET ...`` runs a suite (the ``run`` subcommand) unless the first word
    names a subcommand (``predict``, ``results``)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("-h", "--help"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


@click.group("bench", cls=BenchGroup)
def bench_group() -> None:
    """Run a benchmark suite on TARGET and store it with layout scores (seed 000, 002, 004).

    The scan suite asks whether a file system is aged: a cold read of its tree against a clean
    copy made in the same run (Conway et al., FAST'17).

    `fsage bench TARGET --suite NAME` is short for `fsage bench run TARGET --suite NAME`.

    \b
    Examples:
      fsage bench ext4.img --suite seq --db fsage.db
      fsage bench /mnt/test --suite postmark --variant 50k --format json
      fsage bench aged.img --suite scan --trace --db fsage.db
      fsage bench predict --db fsage.db --suite create-read
    """


def _sizes(values: tuple[str, ...]) -> list[int] | None:
    from fsage.replay.bench import parse_size

    return [parse_size(v) for v in values] or None


def _defaulted(
    name: str, kind: click.ParamType[Any], default: float, help: str
) -> Callable[[F], F]:
    """A numeric option whose default is shown."""
    return click.option(name, type=kind, default=default, show_default=True, help=help)


def rounds_options(f: F) -> F:
    """How many rounds a suite runs: --repeat, --ci-width, --budget, --until-width and
    --max-repeat, the stopping rule that ``BenchOptions`` takes."""
    for deco in reversed(
        [
            _defaulted(
                "--repeat",
                click.IntRange(min=1),
                3,
                "Rounds at least; the results are their medians, with the spread. With a "
                "baseline (or scan's clean copy) rounds go on until every verdict is decided "
                "(or, --until-width, until --ci-width), or --budget.",
            ),
            _defaulted(
                "--ci-width",
                click.FloatRange(min=0.0, min_open=True),
                0.10,
                "Stop once the 95% interval of the median paired ratio (each round's result "
                "over the baseline's, or aged over clean) is this wide relative to the median "
                "(0.10: about +-5%); 6 rounds at least give such an interval.",
            ),
            _defaulted(
                "--budget",
                click.FloatRange(min=0.0),
                120.0,
                "Seconds of rounds after which no further round starts, the interval reached "
                "or not (0: exactly --repeat rounds).",
            ),
            click.option(
                "--until-width",
                is_flag=True,
                help="Go on until the interval is within --ci-width (or --budget) even once "
                "the verdict is decided; by default rounds stop as soon as every main "
                "result's 95% interval excludes 1 (6 rounds at least).",
            ),
            _defaulted("--max-repeat", click.IntRange(min=1), 30, "Rounds at most."),
        ]
    ):
        f = deco(f)
    return f


@bench_group.command("run")
@click.argument("target", type=click.Path(path_type=Path))
@click.option(
    "--suite",
    required=True,
    type=click.Choice(["seq", "seq-fsync", "create-read", "postmark", "tpcb", "hfs-aging", "scan"]),
    help="Benchmark suite (scan: a cold read of the tree in path order, against a clean copy).",
)
@click.option(
    "--db",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Store the run and its results in this database.",
)
@click.option(
    "--size",
    help="Scale: data set per file size (seq, create-read; default 32M), account file (tpcb), "
    "number of files (postmark), number of ops (hfs-aging).",
)
@click.option(
    "--variant",
    help="postmark: standard (default: 5,000 files, 100,000 transactions), seed003, 50k, "
    "100k, 150k; hfs-aging: 10k (default), 20k, 40k.",
)
@click.option("--transactions", type=int, help="Transactions (postmark, tpcb).")
@click.option(
    "--file-size",
    "file_sizes",
    multiple=True,
    help="Only these file sizes (seq, seq-fsync, create-read; default 1K..4M). Repeatable.",
)
@click.option("--seed", type=int, default=42, show_default=True, help="Random seed.")
@click.option(
    "--name",
    help="File-system name recorded with the run (default: the name the database has for it, "
    "else its label, else fs-<first 8 digits of its UUID>, as fsage snapshot names it).",
)
@click.option("--keep", is_flag=True, help="Keep the benchmark's files afterwards.")
@rounds_options
@click.option(
    "--baseline/--no-baseline",
    default=True,
    show_default=True,
    help="Also run the suite (as often) on an empty file system of the image's mkfs "
    "parameters and size, made and removed in this invocation; results are also given "
    "relative to it. scan: the clean copy of the tree the aged/clean ratio needs.",
)
@click.option(
    "--path",
    "scan_path",
    help="scan: read only this directory of the file system (default: all of it).",
)
@click.option(
    "--trace",
    is_flag=True,
    help="scan: trace each scan's block requests (root) and keep their dynamic layout score.",
)
@format_option("text", "json")
def run_cmd(
    target: Path,
    suite: str,
    db: Path | None,
    size: str | None,
    variant: str | None,
    transactions: int | None,
    file_sizes: tuple[str, ...],
    seed: int,
    name: str | None,
    keep: bool,
    repeat: int,
    ci_width: float,
    budget: float,
    until_width: bool,
    max_repeat: int,
    baseline: bool,
    scan_path: str | None,
    trace: bool,
    fmt: str,
) -> None:
    """Run SUITE on TARGET (an image, loop-mounted when root, or a mounted directory).

    Each phase starts cold: as root, fsage syncs, drops the page cache and remounts an image it
    mounted; without root it says the run is warm. The benchmark works in a directory of its
    own on the target and removes it afterwards unless --keep. Layout scores of the
    benchmark's files and of the files already there are read from snapshots before and after.
    On an image the suite also runs on an empty file system of the same mkfs parameters and
    size, made for the run and removed after: in rounds, one run on each, alternating which
    goes first, so that load that drifts falls on both. Each result's relative performance is
    the median of the rounds' paired ratios (result / baseline of the same round) with its
    95% sign-test interval, "inconclusive" where the interval includes 1 or there are fewer
    than 6 rounds. Rounds go on past --repeat until the verdict of every main result (read,
    write, ...) is decided (its interval excludes 1: about 6 rounds where the effect is
    clear), or with --until-width until its interval is within --ci-width of its median; or
    --budget seconds are spent (120 by default, so an undecided run ends in minutes), or
    --max-repeat. The baseline is stored with the run: predict and the report use it.

    The scan suite reads every file of the tree (or --path) in path order, cold: an image on a
    read-only loop device with direct I/O, remounted and with caches dropped before every
    scan; a mounted directory with each file advised out of the page cache. On an ext or xfs
    image (or a directory mounted from one through a loop device) it also copies the tree
    onto a fresh file system of the same mkfs parameters (xfs: the geometry xfs_info prints;
    btrfs has none) and scans the two in rounds, alternately: the aged/clean ratio is the
    median of the rounds' paired ratios with its 95% interval, "inconclusive" where the
    interval includes 1 (the same stopping rule).

    \b
    Examples:
      fsage bench ext4.img --suite seq --size 8M --db fsage.db
      fsage bench /mnt/test --suite tpcb --transactions 20000
      fsage bench ext4.img --suite hfs-aging --variant 20k --format json
      fsage bench aged.img --suite scan --repeat 5 --trace --db fsage.db
      fsage bench aged.img --suite seq --ci-width 0.05 --until-width --budget 900
      fsage bench aged.img --suite scan --path home/alice --format json
    """
    from fsage.replay.bench import BenchOptions, parse_size, run_bench

    if suite != "scan" and (scan_path is not None or trace):
        raise UsageError("--path and --trace belong to the scan suite")
    if suite == "scan" and (size or variant or transactions or file_sizes or keep):
        raise UsageError(
            "the scan suite reads the tree there is: it takes no --size, --variant, "
            "--transactions, --file-size or --keep"
        )

    opts = BenchOptions(
        suite=suite,
        size=_parse_scale(suite, size, parse_size),
        variant=variant,
        transactions=transactions,
        file_sizes=_sizes(file_sizes),
        seed=seed,
        keep=keep,
        name=name,
        repeat=repeat,
        ci_width=ci_width,
        budget=budget,
        until_decided=not until_width,
        max_repeat=max_repeat,
        baseline=baseline,
        path=scan_path,
        trace=trace,
    )
    with image_lock(target, exclusive=True):
        run = run_bench(target, opts, db=db, echo=lambda s: click.echo(s, err=True))
    if fmt == "json":
        echo_json(run.to_json())
        return
    if suite == "scan":
        _print_scan(run)
        return
    click.echo(f"{suite} on {run.via}: {run.seconds:.1f} s" + ("" if run.cold else " (warm)"))
    for n in run.notes:
        click.echo(f"  note: {n}")
    rows = []
    for r, j in zip(run.results, run.results_json(), strict=True):
        what = ", ".join(f"{k}={v}" for k, v in r.params.items() if k in ("file_size", "variant"))
        rows.append(
            [
                r.metric,
                what,
                r.value,
                r.params.get("spread"),
                r.unit,
                r.params.get("baseline"),
                r.params.get("relative"),
                _interval(r.params.get("relative_ci")),
                r.params.get("verdict"),
                j["layout_score_bench_files"],
                j["layout_score_old_files"],
            ]
        )
    echo_table(
        ["metric", "of", "median", "spread", "unit", "empty fs", "relative", "95% interval",
         "verdict", "bench layout", "old layout"],
        rows,
    )  # fmt: skip
    if run.run_id is not None:
        click.echo(f"stored as bench run {run.run_id}")


def _print_scan(run: Any) -> None:
    scan = run.params["scan"]
    click.echo(
        f"scan of {scan['path']} on {run.via}: {run.seconds:.1f} s"
        + ("" if run.cold else " (warm)")
    )
    for n in run.notes:
        click.echo(f"  note: {n}")
    rows = []
    for name in ("aged", "clean"):
        side = scan.get(name)
        if not side:
            continue
        tr = side.get("trace") or {}
        rows.append(
            [
                name,
                side["files"],
                side["bytes"] / 2**20,
                side["seconds"],
                side["spread"],
                side["mb_per_s"],
                tr.get("score"),
                tr.get("modeled_score"),
                tr.get("requests"),
                tr.get("blocks"),
            ]
        )
    headers = ["tree", "files", "MiB", "median s", "spread", "MB/s", "traced score",
               "modeled score", "requests", "blocks"]  # fmt: skip
    if not run.params.get("trace"):
        headers, rows = headers[:6], [r[:6] for r in rows]
    echo_table(headers, rows)
    verdict = scan.get("aged_clean")
    if verdict is not None:
        ratio = verdict["ratio"]
        paired = verdict.get("paired_ratio")
        click.echo(
            "aged/clean: "
            + ("inconclusive" if ratio is None else f"{ratio:.3f}")
            + ("" if ratio is not None or paired is None else f" (paired ratio {paired:.3f})")
            + f", 95% interval {_interval([verdict.get('ci_low'), verdict.get('ci_high')])}"
            f" ({verdict['reason']}; medians {verdict['aged_median_seconds']:.3f} s and "
            f"{verdict['clean_median_seconds']:.3f} s; aged slower in "
            f"{verdict['aged_slower_rounds']} of {verdict['rounds']} rounds)"
        )
    if run.run_id is not None:
        click.echo(f"stored as bench run {run.run_id}")


def _interval(ci: Any) -> str | None:
    """A paired interval as text: "-" where the rounds give none, None where not paired."""
    if ci is None:
        return None
    lo, hi = ci
    return "-" if lo is None or hi is None else f"{lo:.3f}-{hi:.3f}"


def _parse_scale(suite: str, size: str | None, parse_size: Any) -> int | None:
    if size is None:
        return None
    if suite in ("postmark", "hfs-aging"):
        try:
            n = int(size.replace("_", "").lower().removesuffix("k")) * (
                1000 if size.lower().endswith("k") else 1
            )
        except ValueError:
            raise UsageError(
                f"--size for {suite} is a count (e.g. 5000 or 50k): {size!r}"
            ) from None
        if n <= 0:
            raise UsageError(f"--size must be positive: {size!r}")
        return n
    return int(parse_size(size))


def _of(params: dict[str, Any]) -> str:
    """What a result measured: its file size, variant or (scan) tree."""
    return str(params.get("file_size") or params.get("variant") or params.get("tree") or "")


def _open_store(db: Path) -> Any:
    from fsage.db.store import Store

    if not db.exists():
        raise StoreError(f"{db}: no such database")
    return Store.open(db)


@bench_group.command("predict")
@db_option
@click.option("--suite", help="Suite whose runs to fit (default: the one with most runs).")
@click.option(
    "--file-size",
    default="64K",
    show_default=True,
    help="Results for files of this size (seq, create-read); seed 002 uses 64 KB files.",
)
@click.option("--fs", "fs_name", help="Only runs recorded under this file-system name.")
@format_option("text", "json")
def predict_cmd(db: Path, suite: str | None, file_size: str, fs_name: str | None, fmt: str) -> None:
    """Seed 002's table: bench and old layout scores, predicted vs actual relative performance.

    Relative performance is a result over a baseline: its run's own where it
    had one (the empty file system `fsage bench` ran in turn with it: the median of the rounds'
    paired ratios, as bench printed it, marked "(inconclusive)" where its interval includes
    1); else the best separate run on an empty file system, or, with none, the best run (the
    output says so). Predicted performance comes from a linear fit of relative performance
    against layout score over the stored runs, evaluated at the old files' layout score.

    \b
    Examples:
      fsage bench predict --db fsage.db
      fsage bench predict --db fsage.db --suite create-read --file-size 64K --format json
    """
    from fsage.replay.bench import parse_size
    from fsage.replay.bench.predict import Prediction, predict

    with _open_store(db) as store:
        pred = predict(store, suite, parse_size(file_size), fs_name)
    if fmt == "json":
        echo_json(pred.to_json())
        return
    what = f" ({pred.file_size}-byte files)" if pred.file_size else ""
    click.echo(f"suite {pred.suite}{what}: {len(pred.rows)} runs")
    for name, fit in (("read", pred.read_fit), ("write", pred.write_fit)):
        if fit is not None:
            click.echo(
                f"  {name}: relative = {fit.intercept:.3f} + {fit.slope:.3f} x layout score "
                f"(r = {fit.r:.2f}, {fit.points} runs, layout scores {fit.x_min:.3f}-"
                f"{fit.x_max:.3f})"
            )
    for n in pred.notes:
        click.echo(f"  note: {n}")
    if pred.rows:
        echo_table(list(Prediction.HEADERS), pred.table_rows())


@bench_group.command("results")
@db_option
@click.option("--suite", help="Only this suite.")
@format_option("text", "json", "csv")
def results_cmd(db: Path, suite: str | None, fmt: str) -> None:
    """The stored benchmark results, one line per value.

    relative: the result over its run's own empty-file-system baseline (the median of the
    rounds' paired ratios), as bench printed it; verdict: inconclusive where its 95% interval
    includes 1.

    \b
    Examples:
      fsage bench results --db fsage.db --suite seq
    """
    from fsage.replay.bench import stored_results

    with _open_store(db) as store:
        res = stored_results(store, suite)
    if not res and suite is not None:
        raise UsageError(f"no stored results of suite {suite!r} in {db}")
    if fmt == "csv":
        echo_csv(
            ["run_id", "suite", "fs", "started_at", "cold", "metric", "of", "value", "unit",
             "relative", "verdict", "layout_score_bench_files", "layout_score_old_files"],
            [
                [r.run_id, r.suite, r.fs_name, r.started_at, r.cold, r.metric,
                 _of(r.params), r.value, r.unit, r.params.get("relative"),
                 r.params.get("verdict"), r.layout_score_bench_files, r.layout_score_old_files]
                for r in res
            ],
        )  # fmt: skip
        return
    if fmt == "json":
        echo_json(
            [
                {
                    "run_id": r.run_id,
                    "suite": r.suite,
                    "fs": r.fs_name,
                    "started_at": r.started_at,
                    "cold": r.cold,
                    "params": {**r.run_params, **r.params},
                    "metric": r.metric,
                    "value": r.value,
                    "unit": r.unit,
                    "layout_score_bench_files": r.layout_score_bench_files,
                    "layout_score_old_files": r.layout_score_old_files,
                }
                for r in res
            ]
        )
        return
    echo_table(
        [
            "run",
            "suite",
            "fs",
            "date",
            "metric",
            "of",
            "value",
            "unit",
            "relative",
            "verdict",
            "bench",
            "old",
        ],
        [
            [
                r.run_id,
                r.suite,
                r.fs_name,
                r.started_at[:10],
                r.metric,
                _of(r.params),
                r.value,
                r.unit,
                r.params.get("relative"),
                r.params.get("verdict"),
                r.layout_score_bench_files,
                r.layout_score_old_files,
            ]
            for r in res
        ],
    )


COMMANDS = [bench_group]
