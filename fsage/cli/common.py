"""Options and output helpers shared by the CLI modules."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click

from fsage.launch import progress_enabled as progress_enabled
from fsage.text import shown, table_cell

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
    text = [[table_cell(v) for v in row] for row in rows]
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


class CountProgress:
    """One line on stderr, redrawn in place: ``label  done/total  pct  ETA m:ss``, for work
    that reports absolute counts and learns its total only once it starts (an estimate: the
    line never shows more than 100 %, and says how many there were when it ends)."""

    REDRAW = 0.1  # seconds between redraws

    def __init__(self, label: str, file: Any = None) -> None:
        self.label = label
        self.file = file if file is not None else sys.stderr
        self.started = time.monotonic()
        self.drawn = 0.0
        self.done = 0
        self.total = 0
        self.width = 0

    def __call__(self, done: int, total: int) -> None:
        """``total`` 0: not known (the count alone is shown, without a share or an ETA)."""
        self.done, self.total = done, (max(total, done) if total > 0 else 0)
        now = time.monotonic()
        if self.drawn == 0.0 or (now - self.drawn >= self.REDRAW and done < total):
            self.drawn = now
            self._draw(self._eta(now))

    def _eta(self, now: float) -> str:
        elapsed = now - self.started
        if self.done <= 0 or elapsed < 0.2:
            return "ETA -:--"
        left = int(elapsed * (self.total - self.done) / self.done + 0.5)
        return f"ETA {left // 60}:{left % 60:02d}"

    def _draw(self, tail: str) -> None:
        if self.total:
            pct = 100 * self.done // self.total
            line = f"{self.label}  {self.done:,}/{self.total:,}  {pct:3d}%  {tail}"
        else:
            line = f"{self.label}  {self.done:,}  (of a number not known ahead)"
        pad = " " * max(0, self.width - len(line))
        self.width = len(line)
        self.file.write(f"\r{line}{pad}")
        self.file.flush()

    def abandon(self) -> None:
        """The work failed: end the line where it stood, so that the error starts its own."""
        if self.drawn:
            self.file.write("\n")
            self.file.flush()

    def finish(self) -> None:
        """The last line: what was counted, and how long it took."""
        if self.done == 0:
            return  # nothing was counted: no line
        self.total = self.done
        self._draw(f"{time.monotonic() - self.started:.1f} s")
        self.file.write("\n")
        self.file.flush()


@contextlib.contextmanager
def count_progress(label: str) -> Iterator[Callable[[int, int], None] | None]:
    """``report(done, total)`` drawing a :class:`CountProgress` line when stderr is a terminal;
    None otherwise, so that cron and pipes stay quiet."""
    if not progress_enabled():
        yield None
        return
    line = CountProgress(label)
    try:
        yield line
    except BaseException:
        line.abandon()
        raise
    line.finish()
