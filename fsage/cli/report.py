"""`fsage report`: one self-contained HTML report of the recorded snapshots."""

from __future__ import annotations

from pathlib import Path

import click

from fsage.cli.common import db_option, progress_bar
from fsage.db.store import Store
from fsage.reports import report_data_from_store, write_report
from fsage.reports.html import check_output


@click.command()
@db_option
@click.option("--fs", "fs_name", help="Only this file system (default: every file system).")
@click.option(
    "-o",
    "--output",
    # a directory is refused by the report's own check, in fsage's words
    type=click.Path(path_type=Path),
    default=Path("report.html"),
    show_default=True,
    help="HTML file to write ('-': standard output).",
)
@click.option(
    "--compare",
    nargs=2,
    type=int,
    metavar="A B",
    help="Also compare snapshots A and B: layout score by size class, free space by extent "
    "size, and how many files moved to other blocks.",
)
@click.option(
    "--study",
    "study_id",
    type=int,
    metavar="ID",
    help="Report the aging study ID instead (`fsage study`): per file system and step, scan "
    "s/GiB, aged/clean ratio, layout and dynamic layout scores, free space, modeled read times; "
    "rank order fresh vs aged; the paper table.",
)
def report(
    db: Path,
    fs_name: str | None,
    output: Path,
    compare: tuple[int, int] | None,
    study_id: int | None,
) -> None:
    """Write an HTML report (plotly.js inlined; opens offline) of the snapshots in the database.

    Layout score vs file size and over time, free-space histogram over time, fragments per
    file, modeled read throughput vs file size, file-size distribution with a fitted lognormal
    body and Pareto tail, and a summary table.

    \b
    Examples:
      fsage report -o report.html
      fsage report --fs home --db /var/lib/fsage/fsage.db -o home.html
      fsage report --compare 3 12 -o compare.html
      fsage report --study 1 --db study.db -o study.html
    """
    check_output(output)  # before the analysis: a bad path is found at once
    if study_id is not None:
        _study_report(db, study_id, output, fs_name, compare)
        return
    with Store.open(db, readonly=True) as store:
        total = len(store.snapshots(fs_name))
        with progress_bar(total, "analyzing snapshots") as step:
            data = report_data_from_store(store, fs_name, progress=step, compare=compare or None)
    figures = write_report(output, data)
    done = f"{len(data.analyses)} snapshot(s), {figures} figure(s)"
    if str(output) == "-":
        click.echo(f"report: {done}", err=True)  # standard output holds the page
    else:
        click.echo(f"wrote {output}: {done}")


def _study_report(
    db: Path, study_id: int, output: Path, fs_name: str | None, compare: tuple[int, int] | None
) -> None:
    from fsage.reports.study import study_html
    from fsage.study.store import load_study

    if fs_name is not None or compare is not None:
        raise click.UsageError("--study reports a whole study: drop --fs and --compare")
    with Store.open(db, readonly=True) as store:
        row = load_study(store, study_id)
    figures = study_html(row, output)
    done = f"study {study_id}, {len(row.results)} result(s), {figures} figure(s)"
    if str(output) == "-":
        click.echo(f"report: {done}", err=True)
    else:
        click.echo(f"wrote {output}: {done}")


COMMANDS = [report]
