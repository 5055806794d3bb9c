"""`fsage study`: age several file systems side by side; `fsage study report`: the results."""

from __future__ import annotations

from pathlib import Path

import click

from fsage.cli.common import db_option, echo_json, format_option
from fsage.errors import UsageError


def _say(line: str) -> None:
    click.echo(line, err=True)


@click.group(invoke_without_command=True)
@click.option(
    "--fs", "fs", help="File systems, comma-separated: ext4, ext3, ext2, xfs, btrfs, lfs."
)
@click.option(
    "--workload",
    help="preset:NAME, profile:DIR (a JSON profile or Geriatrix directory), ops:FILE, "
    "replay:DB:FS (a recorded history's deltas) or git:REPO.",
)
@click.option("--size", help="Size of every file system's image (e.g. 256M, 2G).")
@click.option("--steps", type=int, help="Steps the op stream is cut into (measured after each).")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    help="The study's directory: parameters, op stream, images.",
)
@db_option
@click.option(
    "--seed", type=int, default=0, show_default=True, help="Seed of a generated workload."
)
@click.option(
    "--trace",
    is_flag=True,
    help="Trace the block requests of each step's first aged scan (root; the LFS's from its"
    " server).",
)
@click.option(
    "--repeat",
    type=int,
    default=0,
    show_default=True,
    help="Scan rounds (aged tree and clean copy) per file system and step. 0: a sequential "
    "test, looking after every round from the 3rd at a t interval of the aged/clean ratio "
    "(each look at 1 - 0.05/8, so all looks together err at most 5 %), until the ratio is "
    "decided (slower, faster, or the same within 5 %): a clear effect stops at 3 rounds; "
    "an undecided step stops after at least 6 at 10 rounds or 20 s of scanning. A fixed N "
    "(at least 2 for an interval) runs N rounds, judged once at 95 %. E.g. --repeat 6.",
)
@click.option(
    "--skip-missing", is_flag=True, help="Go on without a file system this machine cannot make."
)
@click.option(
    "--git-every", type=int, default=1, show_default=True, help="git: commits pulled per step."
)
@click.option(
    "--git-trees", type=int, default=1, show_default=True, help="git: work trees pulled into."
)
@click.option("--resume", is_flag=True, help="Continue the study in --out where it stopped.")
@format_option("text", "json")
@click.pass_context
def study(
    ctx: click.Context, fs: str | None, workload: str | None, size: str | None,
    steps: int | None, out: Path | None, db: Path, seed: int, trace: bool, repeat: int,
    skip_missing: bool, git_every: int, git_trees: int, resume: bool, fmt: str,
) -> None:  # fmt: skip
    """Age several file systems with the same op stream, step by step, and after every step
    snapshot each one, scan it against a clean copy (the aged/clean ratio) and, with --trace,
    trace the scan. Each file system is an image of --size on its own loop device (lfs:
    fsage's LFS through FUSE). The results go to the database under a study id.

    \b
    Examples:
      fsage study --fs ext4,xfs,btrfs,lfs --workload preset:hfs-surge --size 1G --steps 20 \\
          --out /tmp/s1 --db study.db
      fsage study --fs ext4,lfs --workload git:~/src/repo --git-every 5 --size 2G \\
          --steps 30 --out /tmp/s2 --db study.db
      fsage study --out /tmp/s1 --db study.db --resume
      fsage study report 1 --db study.db -o study.html
      fsage report --study 1 --db study.db -o study.html
    """
    if ctx.invoked_subcommand is not None:
        return
    from fsage.ager import parse_bytes
    from fsage.study.run import run_study

    if out is None:
        raise UsageError("--out: the study's directory is needed")
    if resume:
        given = [n for n, v in (("--fs", fs), ("--workload", workload), ("--size", size),
                                ("--steps", steps)) if v is not None]  # fmt: skip
        if given:
            raise UsageError(f"--resume takes the study's own parameters: drop {', '.join(given)}")
        res = run_study(out, db, resume=True, say=_say)
    else:
        missing = [n for n, v in (("--fs", fs), ("--workload", workload), ("--size", size),
                                  ("--steps", steps)) if v is None]  # fmt: skip
        if missing:
            raise UsageError(f"give {', '.join(missing)} (or --resume)")
        assert fs is not None and workload is not None and size is not None and steps is not None
        if repeat < 0:
            raise UsageError("--repeat: 0 (until decided) or a number of rounds")
        new = {
            "fs": fs,
            "workload": workload,
            "size": parse_bytes(size),
            "steps": steps,
            "seed": seed,
            "trace": trace,
            "repeat": repeat,
            "skip_missing": skip_missing,
            "git_trees": git_trees,
            "git_every": git_every,
        }
        res = run_study(out, db, resume=False, say=_say, new=new)
    if fmt == "json":
        echo_json(res.to_json())
        return
    parts = ", ".join(f"{k} {v:.1f} s" for k, v in res.seconds_by_part.items())
    click.echo(
        f"study {res.study_id}: {res.steps} steps on {', '.join(res.filesystems)} in "
        f"{res.seconds:.1f} s ({parts}); peak memory {res.peak_rss_mib:.0f} MiB; "
        f"`fsage study report {res.study_id} --db {res.db}`"
    )


@study.command("report")
@click.argument("study_id", type=int)
@db_option
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the HTML report here (default: print the table).",
)
@format_option("text", "json", "csv")
def report_cmd(study_id: int, db: Path, output: Path | None, fmt: str) -> None:
    """The study's results: per file system and step, scan seconds per GiB, the aged/clean
    ratio, layout and dynamic layout scores, free space, modeled read times; the rank order
    fresh and aged. -o writes a self-contained HTML report with the figures.

    \b
    Examples:
      fsage study report 1 --db study.db
      fsage study report 1 --db study.db --format csv > study.csv
      fsage study report 1 --db study.db -o study.html
    """
    from fsage.db.store import Store
    from fsage.reports.study import study_csv, study_html, study_table, study_text
    from fsage.study.store import load_study

    with Store.open(db, readonly=True) as store:
        row = load_study(store, study_id)
    if output is not None:
        study_html(row, output)
        click.echo(f"{output}: study {study_id} report")
        return
    if fmt == "json":
        echo_json(study_table(row))
    elif fmt == "csv":
        click.echo(study_csv(row), nl=False)
    else:
        click.echo(study_text(row))


COMMANDS = [study]
