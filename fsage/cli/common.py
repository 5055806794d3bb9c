"""Options and output helpers shared by the CLI modules."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click

from fsage.text import shown

F = TypeVar("F", bound=Callable[..., Any])


def default_db() -> Path:
    return Path(os.environ.get("FSAGE_DB", "fsage.db"))


def db_option(f: F) -> F:
    return click.option(
        "--db",
        type=click.Path(dir_okay=False, path_type=Path),
        default=default_db,
        show_default="./fsage.db or $FSAGE_DB",
        help="SQLite database of snapshots.",
    )(f)


def format_option(*choices: str) -> Callable[[F], F]:
    def deco(f: F) -> F:
        return click.option(
            "--format",
            "fmt",
            type=click.Choice(list(choices)),
            default=choices[0],
            show_default=True,
            help="Output format.",
        )(f)

    return deco


def echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False, default=str))


def echo_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """A plain aligned table; numbers right-aligned, text left-aligned."""
    text = [[_cell(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in text:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    numeric = [
        all(isinstance(row[i], int | float) or row[i] is None for row in rows)
        for i in range(len(headers))
    ]

    def fmt(cells: Sequence[str]) -> str:
        cols = zip(cells, widths, numeric, strict=True)
        return "  ".join(c.rjust(w) if num else c.ljust(w) for c, w, num in cols).rstrip()

    click.echo(fmt([shown(h) for h in headers]))
    click.echo("  ".join("-" * w for w in widths))
    for row in text:
        click.echo(fmt(row))


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}"
    return shown(str(v))  # a name with a newline must not forge a row


def progress_enabled() -> bool:
    """Progress bars only on a terminal, so cron stays quiet."""
    return sys.stderr.isatty()


def echo_csv(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Rows as CSV on stdout (empty cells for missing values; numbers unrounded)."""
    import csv

    w = csv.writer(sys.stdout, lineterminator="\n")
    w.writerow(headers)
    for row in rows:
        w.writerow(["" if v is None else v for v in row])


@contextlib.contextmanager
def progress_bar(total: int, label: str) -> Iterator[Callable[[int], None] | None]:
    """A progress bar with the total and an ETA on stderr when it is a terminal (and the
    work has more than one step); None otherwise, so cron stays quiet."""
    if not progress_enabled() or total <= 1:
        yield None
        return
    with click.progressbar(
        length=total, label=label, file=sys.stderr, show_eta=True, show_pos=True
    ) as bar:
        yield bar.update
