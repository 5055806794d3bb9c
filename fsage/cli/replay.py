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
from fsage.replay.deltas import IntraDay, snapshot_deltas
from fsage.replay.recreate import RecreateOptions, recreate
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
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def _intra(per_day: float, lifetime: float, seed: int) -> IntraDay | None:
    if not per_day:
        return None
    return IntraDay(files_per_day=per_day, lifetime_s=lifetime, seed=seed)


@click.command("replay")
@click.argument("target", type=click.Path(dir_okay=False, path_type=Path))
@db_option
@_delta_options
@click.option("--name", help="Name of the recreation in the database (default: FS-recreated-ID).")
@click.option("--mount", "mode", flag_value="mount", help="Replay through a loop mount (root).")
@click.option(
    "--offline", "mode", flag_value="offline", help="Replay through libext2fs, unmounted."
)
@click.option("--force", is_flag=True, help="Replace an existing TARGET image.")
@format_option("text", "json")
def replay_cmd(
    target: Path, db: Path, fs_name: str, until: str | None, deletes: str,
    intra_files_per_day: float, intra_lifetime: float, intra_seed: int, name: str | None,
    mode: str | None, force: bool, fmt: str,
) -> None:  # fmt: skip
    """Recreate file system FS as it was at a snapshot, on a new image TARGET.

    Makes a fresh file system with the recorded mkfs parameters, creates the first snapshot's
    files, replays the operations inferred between snapshots up to --until (through a loop
    mount when root, else offline through libext2fs), records the result in the database as a
    recreation of that snapshot, and prints the fidelity: files and bytes matched, layout
    scores original vs recreated (overall and by size), free-space histogram distance.

    \b
    Examples:
      fsage replay --db fsage.db --fs home --until 2024-05-01 home-may.img
      fsage replay --fs home --until 42 --format json rec.img
    """
    opts = RecreateOptions(
        db=db, fs_name=fs_name, target=target, until=until, mode=mode or "auto", force=force,
        intra=_intra(intra_files_per_day, intra_lifetime, intra_seed), deletes=deletes,
        name=name, progress=progress_enabled() and fmt == "text",
    )  # fmt: skip
    res = recreate(opts, echo=lambda s: click.echo(s, err=True))
    if fmt == "json":
        echo_json(res.to_json())
        return
    click.echo(
        f"{target}: recreated {fs_name} as of snapshot {res.snapshot_id} "
        f"({res.snapshot_taken_at}) from {len(res.snapshots_replayed)} snapshots: {res.ops} ops, "
        f"{res.bytes_written / 2**20:,.1f} MiB written, {res.elapsed:.1f} s"
    )
    click.echo(f"  via {res.description}")
    inferred = ", ".join(f"{v} {k}" for k, v in res.deltas["inferred"].items() if v)
    click.echo(f"  inferred: {inferred or 'nothing'}")
    if res.deltas["skipped"]:
        skipped = ", ".join(f"{v} {k}" for k, v in res.deltas["skipped"].items())
        click.echo(f"  not replayable: {skipped}")
    if res.intra_day is not None:
        click.echo(f"  intra-day files added: {sum(res.intra_day['files_added'])}")
    for n in res.notices:
        if n != res.description:
            click.echo(f"  note: {n}")
    click.echo(f"  recorded as snapshot {res.recreation_snapshot_id} of {res.recreation_fs}")
    fid = res.fidelity
    assert fid is not None
    for line in fid.lines():
        click.echo(f"  {line}")
    if fid.by_size:
        click.echo("")
        echo_table(
            ["blocks", "files orig", "files rec", "score orig", "score rec"],
            [
                [
                    f"{r['min_blocks']}-{r['max_blocks']}",
                    r["files_original"],
                    r["files_recreated"],
                    r["layout_score_original"],
                    r["layout_score_recreated"],
                ]
                for r in fid.by_size
            ],
        )


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
@format_option("text", "json")
def deltas_cmd(
    db: Path, fs_name: str, until: str | None, deletes: str, intra_files_per_day: float,
    intra_lifetime: float, intra_seed: int, since: str | None, output: Path, fmt: str,
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
    """
    intra = _intra(intra_files_per_day, intra_lifetime, intra_seed)
    with Store.open(db) as store:
        header, ops, stats = snapshot_deltas(
            store, fs_name, until=until, since=since, intra=intra, deletes=deletes
        )
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


COMMANDS = [replay_cmd, deltas_cmd]
