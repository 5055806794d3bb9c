"""`fsage age`: age a mounted directory or an image with a generated or recorded workload."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from fsage.ager.profile import load_profile
from fsage.ager.run import AgeOptions, AgeResult, age, shape_profile
from fsage.cli.common import echo_json, format_option, progress_enabled
from fsage.errors import Terminated, UsageError
from fsage.imagelock import image_lock
from fsage.lfs.cleaner import POLICIES
from fsage.text import counted


@click.command("age")
@click.argument("target", type=click.Path(path_type=Path))
@click.option(
    "--profile",
    "profile_spec",
    help="Preset (hfs-surge, impressions, hfs-aging, random-update, prefragment; write "
    "patterns of real use: desktop, news, vcs, database, mail), a JSON profile file, or a "
    "Geriatrix profile directory.",
)
@click.option(
    "--ops",
    "ops_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Run this recorded op stream (JSON Lines, optionally gzip; '-': standard input) "
    "instead of generating one.",
)
@click.option("--fill", type=float, help="Fullness to fill to, 0-1 (profile default 0.8).")
@click.option(
    "--churn",
    type=float,
    help="After the fill, churn until this many times the capacity is written.",
)
@click.option(
    "--ops-limit",
    type=int,
    help="Stop after exactly this many ops (--fill or --churn without it lifts a profile's own "
    "op limit, such as hfs-aging's 10,000).",
)
@click.option("--seed", type=int, help="Random seed (default 0; with --resume, the run's).")
@click.option(
    "--db",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Record snapshots while aging in this database (with --resume, the run's).",
)
@click.option(
    "--snapshot-every",
    type=int,
    default=None,
    help="Snapshot every N ops (with --db), counted from the run's first op, across --resume.",
)
@click.option(
    "--name",
    help="File-system name for the snapshots (default: as for fsage snapshot, the name it"
    " already has in the database, else its label, else fs-<uuid>; kept by --resume).",
)
@click.option("--mount", "mode", flag_value="mount", help="Loop-mount an image (root).")
@click.option(
    "--offline",
    "mode",
    flag_value="offline",
    help="Write an ext image through libext2fs, without mounting.",
)
@click.option(
    "--fsync",
    is_flag=True,
    default=None,
    help="fsync after every op (mounted targets; with --resume, as the run did).",
)
@click.option(
    "--data",
    type=click.Choice(["write", "fallocate"]),
    help="write (default): real data; fallocate: allocate the blocks only, as Geriatrix does (ext "
    "images and mounted targets).",
)
@click.option(
    "--force",
    is_flag=True,
    help="Age a non-empty directory fsage did not create, or start over after an interrupted run.",
)
@click.option(
    "--adopt",
    is_flag=True,
    help="With --profile: take the files already on the target into the run, so that its churn "
    "deletes and rewrites them too (otherwise it ages the files it makes).",
)
@click.option(
    "--resume",
    is_flag=True,
    help="Continue an interrupted run from its record and journal: the same ops as a run "
    "never stopped, recorded as the run was asked to. The profile or op stream, --fill, "
    "--churn, --ops-limit, --seed, --mount/--offline, --data, --fsync, --policy, --name, --db "
    "and --snapshot-every are the run's: not given again, the record's; given again, they "
    "must be the same (an error names the one that is not), except that --db (and its "
    "--snapshot-every) given to a run that recorded in no database records it from the stop "
    "on. Snapshots keep the run's cadence and the database's row of the run goes on (fsage "
    "runs: one run, resumed at op N). --adopt is refused; --force and --format change "
    "nothing in the run. The record of an older fsage keeps no --db, --snapshot-every, "
    "--fsync or --policy: those are then taken as given, with a note. A stopped --match "
    "keeps its journal, deletes its files (journaled) and matches again with the record's "
    "target and seed.",
)
@click.option(
    "--match",
    "match_spec",
    help="Age until the layout matches this target: a snapshot id (with --db) or a JSON "
    "target (layout score per size bucket, free-space histogram, fullness). An ext image is "
    "matched offline (libext2fs) without root or with --offline.",
)
@click.option(
    "--match-ops",
    "match_ops",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="With --match: write the ops the matcher ran here (JSON Lines; .gz: gzip), a "
    "stream that --ops runs again on another file system.",
)
@click.option(
    "--time-limit",
    type=float,
    default=600.0,
    show_default=True,
    help="With --match: give up after this many seconds and report the closest state.",
)
@click.option(
    "--policy",
    type=click.Choice(POLICIES),
    help="Cleaning policy of an LFS image (default: the one chosen at mkfs).",
)
@format_option("text", "json")
def age_cmd(
    target: Path, profile_spec: str | None, ops_file: Path | None, fill: float | None,
    churn: float | None, ops_limit: int | None, seed: int | None, db: Path | None,
    snapshot_every: int | None, name: str | None, mode: str | None, fsync: bool | None,
    data: str | None,
    force: bool, adopt: bool, resume: bool, match_spec: str | None, match_ops: Path | None,
    time_limit: float, policy: str | None, fmt: str,
) -> None:  # fmt: skip
    """Age TARGET (a mounted directory or an image file) with a workload.

    With --profile, ops are generated as they run and the fill target is steered by the real
    fullness (statvfs; on a loop-mounted ext4, xfs or btrfs image, read at the start and after
    ENOSPC and carried by the generator's model of data and metadata blocks, so that a seed
    makes the same ops every time). An ext image is loop-mounted and aged through the kernel
    when fsage runs as root with loop devices, otherwise offline through libext2fs (whose
    allocator is not the kernel's). The run ends on the fill and churn asked for (or
    --ops-limit) and says which ended it. Ctrl-C stops between two ops (exit status 130;
    SIGTERM too, exit status 143); --resume continues from the record kept beside the target
    (TARGET.fsage-age) with the workload, seed and options recorded there (database,
    snapshot cadence and the rest: see --resume), and makes the ops and snapshots a run never
    stopped makes. Every op that ran is written to a journal beside
    the target, which --ops replays exactly. A run on a target that holds files already keeps
    clear of their names, and says at its end what it changed on disk.

    \b
    Examples:
      fsage age /mnt/test --profile hfs-surge --fill 0.8 --churn 2
      fsage age ext4.img --profile hfs-aging --db fsage.db --snapshot-every 2000
      fsage age ext4.img --ops ops.jsonl.gz --offline
      fsage age ext4.img --resume
      fsage age /mnt/test --match 12 --db fsage.db
      fsage age ext4.img --match target.json --offline --match-ops m.jsonl.gz
      fsage age lfs.img --profile random-update --fill 0.8 --policy cost-benefit
    """
    if match_spec is not None:
        if profile_spec is not None or ops_file is not None or resume:
            raise UsageError("--match takes no --profile, --ops or --resume")
        _match(
            target, match_spec, db, 0 if seed is None else seed, time_limit, mode, fmt,
            match_ops, force,
        )  # fmt: skip
        return
    if match_ops is not None:
        raise UsageError("--match-ops goes with --match")
    if resume and profile_spec is None and ops_file is None:
        from fsage.ager.match import interrupted_match

        if interrupted_match(target) is not None:
            _resume_match(target, fmt, db, mode, seed)
            return
    if (profile_spec is not None and ops_file is not None) or (
        not resume and profile_spec is None and ops_file is None
    ):
        raise UsageError("give exactly one of --profile or --ops")
    if ops_file is not None and str(ops_file) == "-" and resume:
        raise UsageError("--resume needs the op stream in a file, not standard input")
    if adopt and resume:
        raise UsageError("--resume goes on as the run began, with or without --adopt")
    profile = None
    shape = {
        k: v
        for k, v in (("fill", fill), ("churn", churn), ("ops_limit", ops_limit))
        if v is not None
    }
    if profile_spec is not None:
        profile = shape_profile(
            load_profile(profile_spec), fill=fill, churn=churn, ops_limit=ops_limit
        )
        shape = {}  # in the profile, which a resume compares whole
    elif adopt:
        raise UsageError("--adopt takes a target's files into a generated workload (--profile)")
    elif shape and not resume:
        raise UsageError("--fill, --churn and --ops-limit shape a generated workload (--profile)")
    opts = AgeOptions(
        profile=profile, ops_file=ops_file, seed=seed, mode=mode or "auto", force=force,
        resume=resume, fsync=fsync, data=data, db=db, snapshot_every=snapshot_every, name=name,
        progress=progress_enabled() and fmt == "text", policy=policy, adopt=adopt, shape=shape,
    )  # fmt: skip
    with image_lock(target, exclusive=True):
        res = age(target, opts, echo=lambda s: click.echo(s, err=True))
    if fmt == "json":
        echo_json(res.to_json())
    else:
        _print_result(target, res)
    if res.interrupted:
        term = res.signal == signal.SIGTERM
        said = "terminated" if term else "interrupted"
        click.echo(f"fsage: {said} (resume with --resume)", err=True)
        raise SystemExit(143 if term else 130)


_STOPPED = {
    "fill": "the fill target",
    "churn": "the churn asked for",
    "ops-limit": "the op limit",
    "converged": "convergence",
    "updates": "the random updates asked for",
    "prefragment": "the prefragmentation's end",
    "end-of-stream": "the end of the op stream",
    "interrupted": "Ctrl-C",
}


def _print_result(target: Path, res: AgeResult) -> None:
    rate = (res.ops - res.resumed_from) / res.elapsed if res.elapsed else 0.0
    state = "interrupted" if res.interrupted else "done"
    click.echo(
        f"{target}: {state}: {res.ops} ops, {res.bytes_written / 2**20:,.1f} MiB written, "
        f"fullness {res.fullness:.3f}, {rate:,.0f} ops/s"
        + (f", {res.nospace} out of space" if res.nospace else "")
        + (f", {res.skipped} skipped" if res.skipped else "")
        + (f", {len(res.snapshots)} snapshots" if res.snapshots else "")
        # ops and bytes count the whole run; its snapshots before the stop are not this part's
        + (f" since op {res.resumed_from:,}" if res.snapshots and res.resumed_from else "")
    )
    click.echo(f"  via {res.description}")
    if res.stopped_by:
        ended = _STOPPED.get(res.stopped_by, res.stopped_by)
        if res.interrupted and res.signal == signal.SIGTERM:
            ended = "SIGTERM"
        click.echo(f"  ended by {ended}")
    if res.journal:
        click.echo(f"  ops run: {res.journal}")
    if res.changes is not None:
        for line in change_lines(res.changes):
            click.echo(f"  {line}")
    if res.convergence:
        for line in convergence_lines(res.convergence):
            click.echo(f"  {line}")


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def change_lines(ch: dict[str, int]) -> list[str]:
    """What a run changed on disk, and why a run of many ops can change little."""
    net = ch["net_bytes"]
    out = [
        f"changed on disk: {counted(ch['files_created'], 'file')} created"
        f" ({_mib(ch['bytes_created'])}),"
        f" {ch['files_deleted']:,} deleted ({_mib(ch['bytes_deleted'])}),"
        f" {ch['files_grown']:,} grown (+{_mib(ch['bytes_grown'])}),"
        f" {ch['files_shrunk']:,} shrunk (-{_mib(ch['bytes_shrunk'])}); directories"
        f" {ch['dirs_created']:,} created, {ch['dirs_deleted']:,} deleted; net"
        f" {ch['net_files']:+,} files, {'+' if net >= 0 else '-'}{_mib(abs(net))}"
    ]
    own, rewrites = ch["deletes_of_own"], ch["rewrites"]
    if ch["deletes"]:
        out.append(
            f"  {own:,} of its {ch['deletes']:,} deletes removed what the run had made itself"
            + (" (there neither before nor after it)" if own else "")
            + (
                "; --adopt ages the files that were there too"
                if own == ch["deletes"] and ch["files_before"]
                else ""
            )
        )
    if rewrites:
        out.append(f"  {rewrites:,} creates rewrote a file of the same name already there")
    return out


def _match(
    target: Path, spec: str, db: Path | None, seed: int, time_limit: float, mode: str | None,
    fmt: str, journal: Path | None, force: bool,
) -> None:  # fmt: skip
    from fsage.ager.match import load_target, match_layout

    goal = load_target(spec, db)
    quiet = not progress_enabled() or fmt != "text"
    with image_lock(target, exclusive=True), _match_interrupt():
        res = match_layout(
            target, goal, seed=seed, time_limit=time_limit, mode=mode or "auto",
            say=None if quiet else (lambda s: click.echo(s, err=True)), journal=journal,
            force=force, db=db,
        )  # fmt: skip
    _show_match(res, fmt)


@contextlib.contextmanager
def _match_interrupt() -> Iterator[None]:
    """Ctrl-C stops a match between two ops, its record and journal kept: said in one line
    (exit status 130), as for any aging run."""
    try:
        yield
    except KeyboardInterrupt as exc:
        term = isinstance(exc, Terminated)
        said = "terminated" if term else "interrupted"
        click.echo(f"fsage: {said} (resume with --resume)", err=True)
        raise SystemExit(143 if term else 130) from None


def _resume_match(
    target: Path, fmt: str, db: Path | None, mode: str | None, seed: int | None
) -> None:
    """``fsage age TARGET --resume`` where the run that stopped was a match."""
    from fsage.ager.match import resume_match

    quiet = not progress_enabled() or fmt != "text"
    with image_lock(target, exclusive=True), _match_interrupt():
        say = None if quiet else (lambda s: click.echo(s, err=True))
        res = resume_match(target, say=say, db=db, mode=mode, seed=seed)
    _show_match(res, fmt)


def _show_match(res: Any, fmt: str) -> None:
    if fmt == "json":
        echo_json(res.to_json())
        return
    for line in match_lines(res.to_json()):
        click.echo(line)


def match_lines(res: dict[str, Any]) -> list[str]:
    """The per-bucket table, target vs the state left on disk; the closest state seen while
    aging on a line of its own."""
    rep = res["report"]
    state = "matched" if res["matched"] else f"NOT matched ({res['stop']})"
    by = f"; measured by {res['measured_by']}" if res.get("measured_by") else ""
    out = [
        f"{res['target']}: {state} after {res['elapsed']:.0f} s, {res['rounds']} rounds, "
        f"{res['bytes_written'] / 2**20:,.0f} MiB written; target {res['source']}{by}",
        *(
            ["  via the offline writer (libext2fs's allocator, not the kernel's)"]
            if res.get("offline")
            else []
        ),
        *([f"  {n}" for n in res.get("notices", [])] if res.get("resumed") else []),
        f"  {'file size':>19} {'target files':>12} {'score':>6} {'files':>7} {'reached':>7}",
    ]
    for r in rep["buckets"]:
        got = "-" if r["score"] is None else f"{r['score']:.3f}"
        mark = "" if r["ok"] else "  <- off" if r["judged"] else ""
        out.append(
            f"  {r['label']:>19} {r['target_files']:>12,}"
            f" {r['target_score']:>6.3f} {r['files']:>7,} {got:>7}{mark}"
        )
    tv = "unknown" if rep["free_tv"] is None else f"{rep['free_tv']:.3f}"
    out.append(
        f"  free-space histogram: total variation {tv} (<= 0.1 to match);"
        f" fullness {rep['fullness']:.3f} (target {rep['target_fullness']:.3f})"
    )
    out += locality_lines(rep.get("locality") or {}, rep.get("target_locality") or {})
    close = res.get("closest")
    if close and not res["matched"] and close is not rep:
        off = sum(1 for r in close["buckets"] if r["judged"] and not r["ok"])
        ctv = "unknown" if close["free_tv"] is None else f"{close['free_tv']:.3f}"
        out.append(
            f"  closest state seen while aging: {off} size bucket(s) off, free-space TV {ctv},"
            f" fullness {close['fullness']:.3f}"
        )
    for key, why in res["reasons"].items():
        out.append(f"  {key}: {why}")
    if res.get("journal"):
        out.append(f"  journal: {res['journal']} (fsage age OTHER --ops JOURNAL runs it again)")
    return out


def locality_lines(have: dict[str, Any], want: dict[str, Any]) -> list[str]:
    """Placement between files and the tree's shape, reached against the target's."""
    if not want:
        return []

    def num(d: dict[str, Any], key: str, fmt: str) -> str:
        v = d.get(key)
        return "-" if v is None else format(v, fmt)

    shares = " / ".join(
        f"{num(have, k, '.2f')} ({num(want, k, '.2f')})"
        for k in ("adjacent", "within_mib", "within_group", "farther")
    )
    return [
        f"  path-order dynamic layout score {num(have, 'dynamic_score', '.3f')}"
        f" (target {num(want, 'dynamic_score', '.3f')}, within 0.02 to match)",
        f"  consecutive files of a directory adjacent / within 1 MiB / within a group /"
        f" farther: {shares}",
        f"  inode order: objects in another inode-table window than the previous"
        f" {num(have, 'inode_switches', '.3f')} ({num(want, 'inode_switches', '.3f')}),"
        f" consecutive files in one {num(have, 'inode_window', '.2f')}"
        f" ({num(want, 'inode_window', '.2f')}), files in their directory's group"
        f" {num(have, 'in_directory_group', '.2f')} ({num(want, 'in_directory_group', '.2f')})",
        f"  directories {num(have, 'directories', ',')} ({num(want, 'directories', ',')}),"
        f" files per directory {num(have, 'files_per_directory', '.1f')}"
        f" ({num(want, 'files_per_directory', '.1f')}), depth {num(have, 'max_depth', 'd')}"
        f" ({num(want, 'max_depth', 'd')})",
    ]


def convergence_lines(rep: dict[str, Any]) -> list[str]:
    """Per target histogram: ideal vs actual per bucket and the chi-square verdict."""
    out = [
        ("converged" if rep["converged"] else "NOT converged")
        + f" at op {rep['ops']:,} (chi-square at confidence {rep['confidence']:g},"
        f" every bucket within {rep['tolerance']:g})"
    ]
    reach = rep.get("age_reachable_at")
    if reach is not None and not rep["converged"] and rep["ops"] < reach:
        out.append(
            f"the age histogram needs about {reach:,} ops (Geriatrix's plan for "
            f"{rep['histograms']['age']['files']:,} files: its young buckets must hold more "
            f"files than one create every other op makes in their share of the ops); "
            f"age further (--churn, --ops-limit)"
        )
    for key, h in rep["histograms"].items():
        chi2 = "inf" if h["chi2"] is None else f"{h['chi2']:.1f}"
        out.append(
            f"{key}: {'pass' if h['passed'] else 'FAIL'}, chi-square {chi2} ({h['dof']} dof,"
            f" p={h['p_value']:.3g}), max bucket difference {h['max_diff']:.3f},"
            f" {h['files']:,} files"
        )
        unit = ""
        if key == "age" and rep.get("age_relative"):
            plan = rep.get("age_planned_end")
            unit = (
                f" (fraction of the planned {plan:,} ops)" if plan else " (fraction of ops so far)"
            )
        out.append(f"  {'bucket <=':>14} {'ideal':>7} {'actual':>7} {'files':>8}{unit}")
        for e, i, a, c in zip(h["edges"], h["ideal"], h["actual"], h["counts"], strict=True):
            out.append(f"  {e:>14.6g} {i:>7.4f} {a:>7.4f} {c:>8,}")
    return out


COMMANDS = [age_cmd]
