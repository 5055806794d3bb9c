"""`fsage demo`: the toolchain end to end on a small embedded example."""

from __future__ import annotations

from pathlib import Path

import click

from fsage.cli.analyze import analyze
from fsage.cli.common import progress_enabled
from fsage.demo import run_demo


@click.command()
@click.option(
    "--dir",
    "workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("fsage-demo"),
    show_default=True,
    help="Working directory (made by the demo; an earlier demo's is reused).",
)
@click.option(
    "--files",
    type=click.IntRange(10, 200_000),
    default=3000,
    show_default=True,
    help="Files in the seeded starting tree (regular files).",
)
@click.option(
    "--seed", type=int, default=42, show_default=True, help="Random seed of the tree and aging."
)
@click.option(
    "--churn",
    type=click.FloatRange(0, 20),
    default=0.5,
    show_default=True,
    help="After filling to 80%, age until this many times the capacity is written (the mail "
    "preset: 0.5 takes the demo's image from layout score 1.000 to about 0.90).",
)
@click.pass_context
def demo(ctx: click.Context, workdir: Path, files: int, seed: int, churn: float) -> None:
    """Make a small ext4 image of hFS-sized files, age it, summarise its layout, write a report.

    The aging is the mail preset (files arriving side by side by small pieces, the seeded
    files deleted and replaced too). Snapshots are taken before and while aging (through the
    kernel when run as root with loop devices, else offline through libext2fs). Needs no
    network. The database and report are left in DIR/fsage.db and DIR/report.html for further
    commands.

    \b
    Examples:
      fsage demo
      fsage demo --dir /tmp/demo --files 10000 --seed 7
    """
    result = run_demo(
        workdir, files=files, seed=seed, churn=churn, echo=click.echo, progress=progress_enabled()
    )
    click.echo("")
    ctx.invoke(analyze, db=result.db, fs_name="demo")


COMMANDS = [demo]
