"""`fsage replay` (recreate a recorded file system as of a snapshot) and `fsage deltas` (the
operations between snapshots as a workload)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from fsage.cli.common import db_option, echo_json, echo_table, format_option, progress_enabled
from fsage.db.store import Store
from fsage.errors import FsageError, UsageError
from fsage.imagelock import image_lock
from fsage.replay.closedloop import Budget
from fsage.replay.deltas import IntraDay, history, snapshot_deltas
from fsage.replay.fidelity import (
    DEFAULT_RULE,
    DYNAMIC,
    FREE_BLOCKS,
    FREE_EXTENTS,
    FREE_TOLERANCE,
    MIN_TOLERANCE,
    RULES,
    SOUND_RUNS,
    Fidelity,
    NoiseFloor,
    fidelity,
)
from fsage.replay.recreate import (
    DEFAULT_INTERVAL_END,
    INTERVAL_ENDS,
    RecreateOptions,
    recreate,
)
from fsage.text import shown
from fsage.workload import write_workload

F = TypeVar("F", bound=Callable[..., Any])


def _delta_options(f: F) -> F:
    opts = [
        click.option("--fs", "fs_name", required=True, help="File system name in the database."),
        click.option(
            "--until",
            help="Snapshot id, or date (YYYY-MM-DD, the end of that day; or an ISO time, UTC "
            "unless it says otherwise): the last snapshot taken by then. Default: the latest.",
        ),
        click.option(
            "--deletes",
            type=click.Choice(["first", "parent"]),
            default="first",
            show_default=True,
            help="Where deletes (which have no recorded time) go in each interval: at its "
            "start, or at the parent directory's last change.",
        ),
        click.option(
            "--intra-files-per-day",
            type=float,
            default=0.0,
            help="Add short-lived files the snapshots cannot see: this many per day.",
        ),
        click.option(
            "--intra-lifetime",
            type=float,
            default=3600.0,
            show_default=True,
            help="Mean lifetime of a short-lived file, seconds.",
        ),
        click.option("--intra-seed", type=int, default=0, show_default=True, help="Its seed."),
        click.option(
            "--setattr/--no-setattr",
            "setattr",
            default=True,
            show_default=True,
            help="Replay attribute changes: a file's mode and a modification time set after "
            "its data (as tar sets the archive's), with setattr ops.",
        ),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def _intra(per_day: float, lifetime: float, seed: int) -> IntraDay | None:
    if not per_day:
        return None
    return IntraDay(files_per_day=per_day, lifetime_s=lifetime, seed=seed)


#: What each verdict rule proves, for the help of every command that judges.
RULES_HELP = (
    "Both rules take their tolerances from the runs' spread (their largest distance between "
    "each other), never from a bias the runs share. spread: the recreation is as close to the "
    "original as one rerun of its op stream is to another. original: that, and the op stream "
    "reproduces the original: its runs land, on average, within the same tolerances of the "
    "snapshot, so a stream whose every rerun is off in the same direction fails (needs a floor "
    "measured at that snapshot). The spread widens a tolerance (0.02 for a score, 0.1 for a "
    "free-space distance) to twice that at most, and never to half a plain copy's distance: "
    "however widely a few runs spread, a recreation the fixed bounds or the copy call far fails."
)


def _closed_loop_options(f: F) -> F:
    for opt in reversed([
        click.option(
            "--closed-loop",
            is_flag=True,
            help="After each interval's ops, add unseen rewrites of the files it changed (and "
            "short-lived temporaries that leave holes of the sizes the snapshot's free space "
            "has) until the recreation's layout by size, path-order locality and free space "
            "match that snapshot's, or the interval's budget is spent. Off by default: the "
            "added ops are "
            "assumptions no snapshot records, and they cost time; the open loop replays only "
            "what was seen, which is what the noise floor's runs rerun.",
        ),
        click.option(
            "--churn-budget",
            type=click.FloatRange(min=0.0),
            default=Budget.bytes_factor,
            show_default=True,
            help="With --closed-loop: inferred bytes per interval, at most this many times the "
            "bytes its visible ops wrote.",
        ),
        click.option("--churn-seed", type=int, default=0, show_default=True,
                     help="With --closed-loop: the seed choosing which files are rewritten."),
    ]):  # fmt: skip
        f = opt(f)
    return f


def _churn_budget(factor: float) -> Budget:
    return Budget(bytes_factor=factor)


def _echo_churn(closed: dict[str, Any] | None) -> None:
    if not closed:
        return
    click.echo("  unseen churn inferred per interval (closed loop):")
    echo_table(
        ["snapshot", "visible MiB", "inferred MiB", "ops", "rewrites", "interleaved",
         "joins", "spacers", "distance", "now", "stopped"],
        [
            [
                c["snapshot"],
                f"{c['visible_bytes'] / 2**20:.2f}",
                f"{c['inferred_bytes'] / 2**20:.2f}",
                c["inferred_ops"],
                # rewrites: for locality, beside a spacer, mending a fragment
                sum(c["kinds"].get(k, 0) for k in ("rewrite", "neighbour", "mend")),
                c["kinds"].get("interleaved", 0),
                c["kinds"].get("join", 0),
                c["kinds"].get("spacer", 0),
                f"{c['distance_before']:.3f}",
                f"{c['distance_after']:.3f}",
                c["stopped"],
            ]
            for c in closed["intervals"]
        ],
    )  # fmt: skip


def _judge_options(f: F) -> F:
    f = click.option(
        "--tolerance-from",
        "rule",
        type=click.Choice(RULES),
        default=DEFAULT_RULE,
        show_default=True,
        help="What the verdict proves. " + RULES_HELP,
    )(f)
    f = click.option(
        "--check",
        is_flag=True,
        help="Exit with status 3 when the recreation is outside tolerance.",
    )(f)
    return click.option(
        "--noise-floor",
        type=click.Path(dir_okay=False, exists=True, path_type=Path),
        help="The noise floor to judge against (JSON from `fsage noise-floor --format json`); "
        f"default: none measured, so tolerances of {MIN_TOLERANCE} per size bucket and for the "
        f"dynamic layout score, and {FREE_TOLERANCE} for free space. A floor measured at the "
        "judged snapshot also places the recreation between a rerun (0) and a plain copy (1).",
    )(f)


@click.command("replay")
@click.argument("target", type=click.Path(dir_okay=False, path_type=Path))
@db_option
@_delta_options
@click.option("--name", help="Name of the recreation in the database (default: FS-recreated-ID).")
@click.option("--mount", "mode", flag_value="mount", help="Replay through a loop mount (root).")
@click.option(
    "--offline", "mode", flag_value="offline", help="Replay through libext2fs, unmounted."
)
@click.option(
    "--interval-end",
    type=click.Choice(INTERVAL_ENDS),
    default=DEFAULT_INTERVAL_END,
    show_default=True,
    help="How each snapshot interval is put on disk before the next starts: unmount and "
    "mount again, syncfs and drop the kernel's caches, syncfs only, or nothing.",
)
@_judge_options
@_closed_loop_options
@click.option(
    "--journal",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write every op run (seen and, marked inferred, added) as a workload that "
    "`fsage age IMG --ops FILE` runs again.",
)
@click.option("--force", is_flag=True, help="Replace an existing TARGET image.")
@format_option("text", "json")
def replay_cmd(
    target: Path, db: Path, fs_name: str, until: str | None, deletes: str,
    intra_files_per_day: float, intra_lifetime: float, intra_seed: int, setattr: bool,
    name: str | None,
    mode: str | None, interval_end: str, noise_floor: Path | None, rule: str, check: bool,
    closed_loop: bool, churn_budget: float, churn_seed: int, journal: Path | None,
    force: bool, fmt: str,
) -> None:  # fmt: skip
    """Recreate file system FS as it was at a snapshot, on a new image TARGET.

    Makes a fresh file system with the recorded mkfs parameters, creates the first snapshot's
    files, replays the operations inferred between snapshots up to --until (through a loop
    mount when root, else offline through libext2fs), records the result in the database as a
    recreation of that snapshot, and prints the fidelity: files and bytes matched, layout
    scores original vs recreated (overall and by size), path-order dynamic layout score,
    free-space histogram distances (by blocks and by extents), and the verdict.

    The verdict: every file matched, every size bucket of 50 files or more, the dynamic layout
    score and both free-space distances within tolerance. --tolerance-from says what a pass
    proves: spread, that the recreation is as close to the original as two reruns of its op
    stream are to each other; original, that and that the reruns themselves land on the
    original (no shared bias). With a floor measured at this snapshot the verdict also says
    where the recreation lies between a rerun (0) and a plain copy of the tree (1), and fails
    whenever the tolerances would pass that copy.

    The scan: the modeled time of a cold path-order read of the whole tree (each directory and
    file's inode-table block, extent blocks and data, in walk order; a request that does not
    start where the previous one ended pays a seek and half a rotation) on a modern 7200 RPM
    HDD (8.5 ms seek, 180 MB/s) and on seed 000's DSP 3105, for the original, the recreation, a
    plain copy (from a noise floor measured at this snapshot) and the tree laid out contiguously
    (the bound no copy beats). Where the copy's HDD time is outside 10% of the original's, the
    recreation's must be within 10%, or the verdict fails; elsewhere the criterion does not
    apply, and without a floor's copy it is unknown.

    \b
    Examples:
      fsage replay --db fsage.db --fs home --until 2024-05-01 home-may.img
      fsage replay --fs home --until 42 --format json rec.img
      fsage replay --fs home --closed-loop --journal rec.jsonl rec.img
    """
    floor = _load_floor(noise_floor)
    if floor is not None:
        with Store.open(db) as store:
            floor = _floor_for(floor, history(store, fs_name, until)[0][-1].id, rule)
    opts = RecreateOptions(
        db=db, fs_name=fs_name, target=target, until=until, mode=mode or "auto", force=force,
        intra=_intra(intra_files_per_day, intra_lifetime, intra_seed), deletes=deletes,
        interval_end=interval_end, noise_floor=floor, name=name,
        progress=progress_enabled() and fmt == "text", setattr=setattr,
        closed_loop=closed_loop, budget=_churn_budget(churn_budget), seed=churn_seed,
        journal=journal,
    )  # fmt: skip
    with image_lock(target, exclusive=True):
        res = recreate(opts, echo=lambda s: click.echo(s, err=True))
    fid = res.fidelity
    assert fid is not None
    fid.judge(floor, rule)
    if fmt == "json":
        echo_json(res.to_json())
        _exit_on_check(fid, check)
        return
    click.echo(
        f"{target}: recreated {fs_name} as of snapshot {res.snapshot_id} "
        f"({res.snapshot_taken_at}) from {len(res.snapshots_replayed)} snapshots: {res.ops} ops, "
        f"{res.bytes_written / 2**20:,.1f} MiB written, {res.elapsed:.1f} s"
    )
    click.echo(f"  via {res.description}; each interval ends with: {res.interval_end}")
    inferred = ", ".join(f"{v} {k}" for k, v in res.deltas["inferred"].items() if v)
    click.echo(f"  inferred: {inferred or 'nothing'}")
    if res.deltas["skipped"]:
        skipped = ", ".join(f"{v} {k}" for k, v in res.deltas["skipped"].items())
        click.echo(f"  not replayable: {skipped}")
    if res.intra_day is not None:
        click.echo(f"  intra-day files added: {sum(res.intra_day['files_added'])}")
    for n in res.notices:
        if n != res.description:
            click.echo(f"  note: {shown(n)}")
    click.echo(f"  recorded as snapshot {res.recreation_snapshot_id} of {shown(res.recreation_fs)}")
    if res.journal:
        click.echo(f"  ops journaled to {res.journal}")
    _echo_churn(res.closed_loop)
    _echo_fidelity(fid)
    _exit_on_check(fid, check)


def _load_floor(path: Path | None) -> NoiseFloor | None:
    if path is None:
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read noise floor {path}: {exc}") from None
    return NoiseFloor.from_json(data)


def _floor_for(floor: NoiseFloor, snapshot_id: int, rule: str) -> NoiseFloor:
    """The floor as it judges ``snapshot_id``: judging by the original needs the runs'
    distances to that very snapshot; the plain copy is only a yardstick for its own snapshot."""
    floor.check_rule(rule)  # UsageError when the floor has no distances to a snapshot
    if rule == "original" and floor.original_snapshot != snapshot_id:
        raise UsageError(
            f"the noise floor's runs were compared with snapshot {floor.original_snapshot}, "
            f"not {snapshot_id}: measure it at that snapshot to judge by the original"
        )
    return floor.for_snapshot(snapshot_id)


class OutsideTolerance(FsageError):
    exit_code = 3


def _exit_on_check(fid: Fidelity, check: bool) -> None:
    if check and fid.verdict is not None and not fid.verdict.faithful:
        raise OutsideTolerance("recreation outside tolerance: " + "; ".join(fid.verdict.reasons))


def _echo_fidelity(fid: Fidelity) -> None:
    for line in fid.lines():
        click.echo(f"  {line}")
    if not fid.by_size:
        return
    click.echo("")
    echo_table(
        ["file size", "files orig", "files rec", "score orig", "score rec", "diff", "noise",
         "tolerance", "judged"],
        [
            [
                r["label"],
                r["files_original"],
                r["files_recreated"],
                r["layout_score_original"],
                r["layout_score_recreated"],
                r.get("difference"),
                r.get("noise_floor"),
                r.get("tolerance"),
                ("ok" if r.get("within") else "OUT") if r.get("judged") else "-",
            ]
            for r in fid.by_size
        ],
    )  # fmt: skip


@click.command("deltas")
@db_option
@_delta_options
@click.option(
    "--from",
    "since",
    help="Start at this snapshot (id or date); default: an empty file system, so the stream "
    "first creates the first snapshot's files.",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="Workload file to write (.gz: gzip; '-': standard output, the summary then goes to "
    "stderr).",
)
@_closed_loop_options
@click.option(
    "--image",
    type=click.Path(dir_okay=False, path_type=Path),
    help="With --closed-loop: the image the steered recreation is built on (needed: the "
    "inferred ops depend on where the file system put the seen ones); kept, not recorded.",
)
@click.option("--force", is_flag=True, help="With --image: replace an existing image.")
@format_option("text", "json")
def deltas_cmd(
    db: Path, fs_name: str, until: str | None, deletes: str, intra_files_per_day: float,
    intra_lifetime: float, intra_seed: int, setattr: bool, since: str | None, output: Path,
    closed_loop: bool, churn_budget: float, churn_seed: int, image: Path | None, force: bool,
    fmt: str,
) -> None:  # fmt: skip
    """Write the operations between snapshots of FS as a workload (JSON Lines).

    Creates, deletes, grows, shrinks, rewrites, renames and hard links are inferred from the
    snapshots and ordered by the recorded times; a snapshot marker closes each interval. Replay
    the stream with `fsage age TARGET --ops FILE`.

    \b
    Examples:
      fsage deltas --fs home -o home.jsonl.gz
      fsage deltas --fs home --from 3 --until 2024-05-01 -o may.jsonl
      fsage deltas --fs home --intra-files-per-day 500 --intra-seed 1 -o busy.jsonl
      fsage deltas --fs home --closed-loop --image steer.img -o steered.jsonl
    """
    intra = _intra(intra_files_per_day, intra_lifetime, intra_seed)
    if closed_loop:
        _closed_loop_deltas(db, fs_name, until, since, deletes, intra, setattr, output,
                            churn_budget, churn_seed, image, force, fmt)  # fmt: skip
        return
    if image is not None:
        raise UsageError("--image is for --closed-loop")
    with Store.open(db) as store:
        header, ops, stats = snapshot_deltas(
            store, fs_name, until=until, since=since, intra=intra, deletes=deletes,
            setattr=setattr,
        )  # fmt: skip
    count = write_workload(output, header, ops)
    err = str(output) == "-"  # the stream went to stdout: the summary goes to stderr
    if fmt == "json":
        click.echo(
            json.dumps(
                {"output": str(output), "header": header.params, **stats.to_json()},
                indent=2,
                default=str,
            ),
            err=err,
        )
        return
    p = header.params
    start = f"snapshot {p['from']}" if p["from"] is not None else "an empty file system"
    click.echo(
        f"{output}: {count} ops, {stats.bytes / 2**20:,.1f} MiB of data, from {start} to "
        f"snapshot {p['until']} ({len(p['snapshots'])} snapshots)",
        err=err,
    )
    inferred = ", ".join(f"{v} {k}" for k, v in stats.inferred.items() if v)
    click.echo(f"  inferred: {inferred or 'nothing'}", err=err)
    if p["skipped"]:
        click.echo(
            "  not replayable: " + ", ".join(f"{v} {k}" for k, v in p["skipped"].items()),
            err=err,
        )
    if intra is not None:
        added = sum(p["intra_day"]["files_added"])
        click.echo(
            f"  intra-day activity added: {added} short-lived files "
            f"({intra.files_per_day:g}/day, mean lifetime {intra.lifetime_s:g} s, "
            f"seed {intra.seed})",
            err=err,
        )


@click.command("noise-floor")
@db_option
@click.option("--fs", "fs_name", required=True, help="File system name in the database.")
@click.option("--until", help="Snapshot id or date to measure at (default: the latest).")
@click.option(
    "--runs",
    type=click.IntRange(min=2),
    default=SOUND_RUNS,
    show_default=True,
    help="Runs of the op stream; the floor is the largest distance between any two of them "
    "(and each run's distance to the snapshot is recorded too). Fewer runs give a narrower, "
    "noisier floor: on real histories a replay as close as a rerun passed a 3-run floor in "
    "63-93% of cases, a 5-run one in 77-100% (bench/verdict.py).",
)
@click.option(
    "--copy/--no-copy",
    default=True,
    show_default=True,
    help="Also write the snapshot's files in one go onto an empty file system of the same "
    "geometry and record that plain copy's distances to the snapshot: the yardstick a verdict "
    "places a recreation against (0 = as good as a rerun, 1 = no better than a copy), and "
    "its modeled cold path-order scan, which decides whether the scan criterion applies.",
)
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    help="Where the run images go (removed after); default: the temporary directory.",
)
@click.option(
    "--mount",
    "mode",
    flag_value="mount",
    help="Run through a loop mount (root; the default when possible).",
)
@click.option("--offline", "mode", flag_value="offline", help="Run through libext2fs.")
@format_option("text", "json")
def noise_floor_cmd(
    db: Path, fs_name: str, until: str | None, runs: int, copy: bool, workdir: Path | None,
    mode: str | None, fmt: str,
) -> None:  # fmt: skip
    """Measure how far two runs of FS's op stream land apart: the noise floor of a recreation.

    Infers the op stream up to --until (as `fsage deltas` does), runs it --runs times the
    way `fsage replay` does (unmounting at every snapshot) onto fresh file systems of the
    recorded geometry, and compares the runs: per size bucket the largest layout-score
    difference, the largest difference of path-order dynamic layout score, and the largest
    free-space distances (by blocks and by extents); then each run, and a plain copy, with the
    snapshot itself.

    `fsage replay --noise-floor FILE` and `fsage fidelity` judge against the floor. Both rules
    take the runs' spread as tolerance. --tolerance-from spread (default) proves the recreation
    is as close to the snapshot as one rerun is to another; --tolerance-from original proves
    that and that the runs themselves land on the snapshot on average (an op stream that
    reruns the same way but misses the snapshot fails). A floor whose tolerances would pass
    the plain copy judges nothing faithful.

    \b
    Examples:
      fsage noise-floor --fs home --until 2024-05-01 --format json > floor.json
      fsage replay --fs home --until 2024-05-01 --noise-floor floor.json --check rec.img
      fsage fidelity 31 40 --noise-floor floor.json --tolerance-from original
    """
    from fsage.replay.noise import noise_floor

    floor, layouts = noise_floor(
        db, fs_name, until, runs=runs, mode=mode or "auto", workdir=workdir,
        echo=(lambda s: click.echo(s, err=True)) if fmt == "text" else None, copy=copy,
    )  # fmt: skip
    if fmt == "json":
        echo_json({"noise_floor": floor.to_json()})
        return
    snap = floor.original_snapshot
    click.echo(f"noise floor of {fs_name}: {floor.note}")
    pairs = ", ".join(f"{x:.3f}" for x in sorted(floor.free_tv_pairs))
    click.echo(f"  free-space distance between runs: {floor.free_tv:.3f} (largest of {pairs})")
    click.echo(
        f"  by extents: {floor.free_extents:.3f}; path-order dynamic layout score: "
        f"{floor.dynamic:.3f}"
    )
    without = floor.free_tv_without_one()
    if without is not None:
        click.echo(
            f"  with any one run left out, the floor would be {without[0]:.3f}-{without[1]:.3f}"
        )
    to_orig = ", ".join(f"{x:.3f}" for x in sorted(floor.to_original_free_tv))
    click.echo(f"  free-space distance of each run to snapshot {snap}: {to_orig}")
    if floor.copy is not None:
        c = floor.copy
        click.echo(
            f"  a plain copy to snapshot {snap}: free space {c.get(FREE_BLOCKS, 0.0):.3f} by "
            f"blocks, {c.get(FREE_EXTENTS, 0.0):.3f} by extents; dynamic layout score "
            f"{c.get(DYNAMIC, 0.0):.3f}"
        )
    if floor.copy_scan is not None:
        secs = ", ".join(f"{m} {t:.2f} s" for m, t in floor.copy_scan["seconds"].items())
        click.echo(
            f"  the plain copy's modeled cold path-order scan: {secs} "
            f"({floor.copy_scan['seeks']:,} seeks)"
        )
    if runs < SOUND_RUNS:
        click.echo(
            f"  note: a floor of {runs} runs is itself noisy (bench/verdict.py); "
            f"{SOUND_RUNS} or more are steadier"
        )
    bias = {k: floor.bias(f"bucket:{k}") for k in floor.by_bucket}
    echo_table(
        ["file size", "layout score difference", "runs to snapshot (mean)"],
        [
            [label, diff, bias[k]]
            for (label, diff), k in zip(
                floor.labelled(layouts[0].facts.block_size), sorted(floor.by_bucket), strict=True
            )
        ],
    )


@click.command("fidelity")
@click.argument("original", type=int)
@click.argument("recreation", type=int)
@db_option
@_judge_options
@format_option("text", "json")
def fidelity_cmd(
    original: int,
    recreation: int,
    db: Path,
    noise_floor: Path | None,
    rule: str,
    check: bool,
    fmt: str,
) -> None:
    """Compare snapshot ORIGINAL with RECREATION (any two snapshots) and give the verdict.

    The verdict judges matched files, the layout score of every size bucket of 50 files or
    more, the path-order dynamic layout score, and the free space by blocks and by extents.
    With --noise-floor, --tolerance-from spread proves RECREATION is as close to ORIGINAL as
    one rerun of the op stream is to another; original proves that and that the reruns
    themselves land on ORIGINAL (no bias they share); a floor measured at ORIGINAL places
    RECREATION between a rerun (0) and a plain copy (1).

    \b
    Examples:
      fsage fidelity 31 40 --noise-floor floor.json --check
      fsage fidelity 31 40 --format json
    """
    floor = _load_floor(noise_floor)
    if floor is not None:
        floor = _floor_for(floor, original, rule)
    with Store.open(db) as store:
        a = store.load_layout(original)
        b = store.load_layout(recreation)
    fid = fidelity(a, b)
    fid.judge(floor, rule)
    if fmt == "json":
        echo_json(fid.to_json())
    else:
        click.echo(f"snapshot {original} vs snapshot {recreation}")
        _echo_fidelity(fid)
    _exit_on_check(fid, check)


COMMANDS = [replay_cmd, deltas_cmd, noise_floor_cmd, fidelity_cmd]


def _closed_loop_deltas(
    db: Path, fs_name: str, until: str | None, since: str | None, deletes: str,
    intra: IntraDay | None, setattr: bool, output: Path, factor: float, seed: int,
    image: Path | None, force: bool, fmt: str,
) -> None:  # fmt: skip
    """The seen ops and the churn inferred by steering a recreation built on ``image``."""
    if image is None:
        raise UsageError(
            "--closed-loop steers a recreation: give the image to build it on (--image)"
        )
    if since is not None:
        raise UsageError("--closed-loop starts from an empty file system: --from is not supported")
    if str(output) == "-":
        raise UsageError("--closed-loop writes its workload to a file, not standard output")
    opts = RecreateOptions(
        db=db, fs_name=fs_name, target=image, until=until, force=force, intra=intra,
        deletes=deletes, setattr=setattr, closed_loop=True, budget=_churn_budget(factor),
        seed=seed, journal=output, record=False,
    )  # fmt: skip
    with image_lock(image, exclusive=True):
        res = recreate(opts, echo=lambda s: click.echo(s, err=True))
    closed = res.closed_loop or {}
    if fmt == "json":
        echo_json({"output": str(output), "image": str(image), "ops": res.ops,
                   "bytes_written": res.bytes_written, "closed_loop": closed})  # fmt: skip
        return
    click.echo(
        f"{output}: {res.ops} ops, {res.bytes_written / 2**20:,.1f} MiB of data "
        f"({closed.get('inferred_bytes', 0) / 2**20:,.1f} MiB inferred), to snapshot "
        f"{res.snapshot_id} ({len(res.snapshots_replayed)} snapshots), steered on {image}"
    )
    _echo_churn(closed)
