"""`fsage age`: age a mounted directory or an image with a generated or recorded workload."""

from __future__ import annotations

from pathlib import Path

import click

from fsage.ager.profile import load_profile
from fsage.ager.run import AgeOptions, age
from fsage.cli.common import echo_json, format_option, progress_enabled
from fsage.errors import UsageError
from fsage.lfs.cleaner import POLICIES


@click.command("age")
@click.argument("target", type=click.Path(path_type=Path))
@click.option(
    "--profile",
    "profile_spec",
    help="Preset (hfs-surge, impressions, hfs-aging, random-update, prefragment...), "
    "a JSON profile file, or a Geriatrix profile directory.",
)
@click.option(
    "--ops",
    "ops_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Run this recorded op stream instead of generating one.",
)
@click.option("--fill", type=float, help="Fullness to fill to, 0-1 (profile default 0.8).")
@click.option(
    "--churn",
    type=float,
    help="After the fill, churn until this many times the capacity is written.",
)
@click.option("--ops-limit", type=int, help="Stop after this many ops.")
@click.option("--seed", type=int, default=0, show_default=True, help="Random seed.")
@click.option(
    "--db",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Record snapshots while aging in this database.",
)
@click.option("--snapshot-every", type=int, default=0, help="Snapshot every N ops (with --db).")
@click.option("--name", help="File-system name for the snapshots (default: target's name).")
@click.option("--mount", "mode", flag_value="mount", help="Loop-mount an image (root).")
@click.option(
    "--offline",
    "mode",
    flag_value="offline",
    help="Write an ext image through libext2fs, without mounting.",
)
@click.option("--fsync", is_flag=True, help="fsync after every op (mounted targets).")
@click.option(
    "--force",
    is_flag=True,
    help="Age a non-empty directory fsage did not create, or start over after an interrupted run.",
)
@click.option("--resume", is_flag=True, help="Continue an interrupted run from its record.")
@click.option(
    "--policy",
    type=click.Choice(POLICIES),
    help="Cleaning policy of an LFS image (default: the one chosen at mkfs).",
)
@format_option("text", "json")
def age_cmd(
    target: Path, profile_spec: str | None, ops_file: Path | None, fill: float | None,
    churn: float | None, ops_limit: int | None, seed: int, db: Path | None,
    snapshot_every: int, name: str | None, mode: str | None, fsync: bool, force: bool,
    resume: bool, policy: str | None, fmt: str,
) -> None:  # fmt: skip
    """Age TARGET (a mounted directory or an image file) with a workload.

    With --profile, ops are generated as they run and the fill target is steered by the real
    fullness (statvfs). An ext image is loop-mounted and aged through the kernel when fsage
    runs as root with loop devices, otherwise offline through libext2fs (whose allocator is not
    the kernel's). Ctrl-C stops between two ops; --resume continues.

    \b
    Examples:
      fsage age /mnt/test --profile hfs-surge --fill 0.8 --churn 2
      fsage age ext4.img --profile hfs-aging --db fsage.db --snapshot-every 2000
      fsage age ext4.img --ops ops.jsonl.gz --offline
      fsage age lfs.img --profile random-update --fill 0.8 --policy cost-benefit
    """
    if (profile_spec is None) == (ops_file is None):
        raise UsageError("give exactly one of --profile or --ops")
    if snapshot_every and db is None:
        raise UsageError("--snapshot-every needs --db")
    profile = None
    if profile_spec is not None:
        profile = load_profile(profile_spec).with_overrides(
            fill=fill, churn=churn, ops_limit=ops_limit
        )
    elif fill is not None or churn is not None or ops_limit is not None:
        raise UsageError("--fill, --churn and --ops-limit shape a generated workload (--profile)")
    opts = AgeOptions(
        profile=profile, ops_file=ops_file, seed=seed, mode=mode or "auto", force=force,
        resume=resume, fsync=fsync, db=db, snapshot_every=snapshot_every, name=name,
        progress=progress_enabled() and fmt == "text", policy=policy,
    )  # fmt: skip
    res = age(target, opts, echo=lambda s: click.echo(s, err=True))
    if fmt == "json":
        echo_json(res.to_json())
        return
    rate = (res.ops - res.resumed_from) / res.elapsed if res.elapsed else 0.0
    state = "interrupted (resume with --resume)" if res.interrupted else "done"
    click.echo(
        f"{target}: {state}: {res.ops} ops, {res.bytes_written / 2**20:,.1f} MiB written, "
        f"fullness {res.fullness:.3f}, {rate:,.0f} ops/s"
        + (f", {res.nospace} out of space" if res.nospace else "")
        + (f", {res.skipped} skipped" if res.skipped else "")
        + (f", {len(res.snapshots)} snapshots" if res.snapshots else "")
    )
    click.echo(f"  via {res.description}")
    if res.convergence:
        for key, h in res.convergence.items():
            click.echo(
                f"  {key}: max bucket difference {h['max_diff']:.3f}, chi-square {h['chi2']:.1f} "
                f"({h['dof']} dof, p={h['p_value']:.3g})"
            )


COMMANDS = [age_cmd]
