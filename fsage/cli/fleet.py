"""`fsage export` and `fsage fleet`: a database's history as Parquet, fleet questions over many."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from fsage.cli.common import (
    count_progress,
    db_option,
    echo_json,
    format_option,
    progress_enabled,
)
from fsage.errors import UsageError


@click.command()
@db_option
@click.option(
    "--format",
    "out_format",
    type=click.Choice(["parquet"]),
    default="parquet",
    show_default=True,
    help="Dataset format.",
)
@click.option("--host", help="Host name recorded in the dataset (default: this machine's).")
@click.option("--fs", "fs_names", multiple=True, help="Export only this file system (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
def export(
    db: Path,
    out_format: str,
    host: str | None,
    fs_names: tuple[str, ...],
    as_json: bool,
    directory: Path,
) -> None:
    """Export the database's history to DIRECTORY as a Parquet dataset, partitioned by host and
    file system: snapshots, file versions with their extents, free extents and the
    per-snapshot metrics of `fsage analyze`. Incremental: a second run adds only the snapshots
    taken since. Collect the directories of many hosts in one place (rsync, object storage)
    and ask `fsage fleet` about them.

    Scratch files (some 200 bytes a file of a snapshot, removed at the end) go to the
    system's temporary directory when it is on disk, else to /var/tmp: on a tmpfs they would
    be memory. FSAGE_SCRATCH names another directory.

    \b
    Examples:
      fsage export --db /var/lib/fsage/fsage.db --format parquet /srv/fleet
      FSAGE_SCRATCH=/srv/scratch fsage export --db big.db /srv/fleet
      rsync -a /srv/fleet/ central:/data/fleet/ && fsage fleet /data/fleet
    """
    from fsage import scratch
    from fsage.fleet.export import export_parquet

    # the directory is made by the export: its parent is on the same file system as it will be
    warning = scratch.in_memory(near=directory if directory.is_dir() else directory.parent)
    if warning:
        _warn(warning)
    # on a terminal: a line at once, then a snapshot in 100 units, moved by its parts
    with count_progress("exporting (100 a snapshot)") as progress:
        summary = export_parquet(
            db, directory, host=host, fs_names=list(fs_names) or None, progress=progress
        )
    if as_json:
        echo_json(summary.to_json())
    else:
        click.echo(summary.line())


# Where the help text holds `fsage analyze`'s rule for trends (fsage.analyzer.history), read
# only when help is shown: importing it loads the analyzer and numpy, which a fleet query does
# not need (17 MiB of its peak).
TREND_RULE = "\0TREND_RULE\0"


class _TrendRuleHelp:
    """Help text with ``TREND_RULE`` put in when it is read."""

    _help: str | None

    @property
    def help(self) -> str | None:
        if self._help is None or TREND_RULE not in self._help:
            return self._help
        from fsage.analyzer.history import TREND_RULE as rule

        return self._help.replace(TREND_RULE, rule)

    @help.setter
    def help(self, value: str | None) -> None:
        self._help = value


class _Command(_TrendRuleHelp, click.Command):
    pass


class _DefaultGroup(_TrendRuleHelp, click.Group):
    """A group whose first argument, when it is not a subcommand, goes to ``summary``."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("-h", "--help"):
            args = ["summary", *args]
        return super().parse_args(ctx, args)


@click.group(
    cls=_DefaultGroup,
    help="Fleet questions over exported datasets (DuckDB, in process): which file systems "
    "decline fastest, in which size classes, free-space fragmentation across hosts, outliers."
    "\n\n`fsage fleet DIR` is `fsage fleet summary DIR`.\n\n"
    + TREND_RULE
    + """

\b
Examples:
  fsage fleet /data/fleet
  fsage fleet /data/fleet --format csv > filesystems.csv
  fsage fleet report /data/fleet -o fleet.html
""",
)
def fleet() -> None:
    pass


def _warn(line: str) -> None:
    click.echo(f"fsage: warning: {line}", err=True)


damaged_option = click.option(
    "--damaged",
    "on_damage",
    type=click.Choice(["refuse", "skip"]),
    default="refuse",
    show_default=True,
    help="A file of the dataset that cannot be read (empty, truncated, not Parquet, a column "
    "missing or of another type): refuse the dataset, or leave that file's file system out "
    "with a warning naming the file.",
)

TABLE_CHOICES = ["filesystems", "size", "free", "outliers", "trend", "files_by_size"]


@fleet.command(
    cls=_Command,
    help="The fleet analysis of DIRECTORY (a dataset written by `fsage export`).\n\n"
    + TREND_RULE
    + """

\b
Examples:
  fsage fleet summary /data/fleet
  fsage fleet /data/fleet --table size --format json
  fsage fleet /data/fleet --damaged skip
""",
)
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--table",
    "tables",
    multiple=True,
    type=click.Choice(TABLE_CHOICES),
    help="Tables to print (default: filesystems, size, free, outliers; CSV: filesystems). "
    "files_by_size computes the layout score per size bucket from the exported extents.",
)
@click.option(
    "--threshold",
    default=2.0,
    show_default=True,
    help="Outliers: standard deviations from the fleet's mean.",
)
@damaged_option
@format_option("text", "json", "csv")
def summary(
    directory: Path, tables: tuple[str, ...], threshold: float, on_damage: str, fmt: str
) -> None:
    from fsage.fleet.output import write_tables
    from fsage.fleet.query import DEFAULT_TABLES

    if fmt == "csv" and len(tables) > 1:
        raise UsageError("--format csv prints one table: give one --table")
    want = tables or (("filesystems",) if fmt == "csv" else DEFAULT_TABLES)
    # streamed a chunk of rows at a time, printed once every query has succeeded
    write_tables(
        directory,
        tuple(want),
        fmt,
        sys.stdout,
        threshold,
        on_damage=on_damage,
        warn=_warn,
        advise=_warn,
    )


@fleet.command()
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--keep-sources",
    is_flag=True,
    help="Keep the merged per-partition files (readers skip them; rsync then copies only "
    "what is new).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def compact(directory: Path, keep_sources: bool, as_json: bool) -> None:
    """Merge the per-file-system files of DIRECTORY (collected exports) into a few large files
    per table, sorted by host, file system and time, so that fleet queries open a few files
    instead of one per file system. Atomic (interrupted, the dataset reads as before) and
    idempotent; later exports into DIRECTORY add files beside the compacted ones, and the next
    compaction merges them.

    \b
    Examples:
      rsync -a host1:/srv/fleet/ /data/fleet/ && fsage fleet compact /data/fleet
      fsage fleet compact --keep-sources /data/fleet --json
    """
    from fsage.fleet.compact import compact as run

    shown = [""]

    def progress(stage: str, line: str) -> None:
        # one line per stage (the check, each table, ...), redrawn in place
        if shown[0] and shown[0] != stage:
            click.echo(err=True)
        shown[0] = stage
        click.echo(f"\r{line}", err=True, nl=False)

    try:
        summary = run(
            directory, keep_sources=keep_sources, progress=progress if progress_enabled() else None
        )
    finally:
        if shown[0]:
            click.echo(err=True)
    if as_json:
        echo_json(summary.to_json())
    else:
        click.echo(summary.line())


@fleet.command()
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "-o",
    "--output",
    # a directory is refused by the report's own check, in fsage's words
    type=click.Path(path_type=Path),
    default=Path("fleet.html"),
    show_default=True,
    help="HTML file to write ('-': standard output).",
)
@damaged_option
def report(directory: Path, output: Path, on_damage: str) -> None:
    """Draw the fleet analysis of DIRECTORY as one self-contained HTML file (opens offline).

    \b
    Examples:
      fsage fleet report /data/fleet -o fleet.html
      fsage fleet report /data/fleet -o - | gzip > fleet.html.gz
    """
    from fsage.fleet.report import write_fleet_report
    from fsage.reports.html import check_output

    check_output(output)  # before the queries: a bad path is found at once
    figures = write_fleet_report(directory, output, on_damage=on_damage, warn=_warn, advise=_warn)
    if str(output) == "-":
        click.echo(f"fleet report: {figures} figures", err=True)  # standard output holds the page
    else:
        click.echo(f"wrote {output} ({figures} figures)")


COMMANDS = [export, fleet]
