"""`fsage demo`: the toolchain end to end on a small embedded example."""

from __future__ import annotations

from pathlib import Path

import click

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
@click.option("--files", type=click.IntRange(10, 200_000), default=3000, show_default=True)
@click.option("--seed", type=int, default=42, show_default=True)
def demo(workdir: Path, files: int, seed: int) -> None:
    """Make a small ext4 image of hFS-sized files, snapshot it and summarise its layout.

    Needs no root and no network. The database is left in DIR/fsage.db for further commands.

    \b
    Examples:
      fsage demo
      fsage demo --dir /tmp/demo --files 10000 --seed 7
    """
    run_demo(workdir, files=files, seed=seed, echo=click.echo)


COMMANDS = [demo]
