"""`fsage fleet`'s tables as text, JSON or CSV in memory bounded by a chunk of rows.

Each table streams from DuckDB (``fsage.fleet.query.table_rows``) into a temporary file of the
connection's private spill directory; only once every query has succeeded is the file copied to
standard output, so a failure prints one error line and no partial table. The text table's
column widths need every row before the first is printed: its formatted cells go to a second
temporary file on the first pass, and are read back a chunk at a time. The bytes are those of
``json.dumps(tables, indent=2)``, ``csv.DictWriter`` and ``fsage.cli.common.echo_table``.
"""

from __future__ import annotations

import csv
import pickle
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from json.encoder import encode_basestring_ascii
from pathlib import Path
from typing import IO, Any

from fsage.fleet.query import CHUNK, ONE_SCORED, SHORT_SPAN, opened, table_rows
from fsage.text import shown, table_cell

# Changes of layout score read with two significant digits, as in analyze and the reports: a
# loss of 0.0003 a month must not print as -0.000.
CHANGES = frozenset({"total_change", "change_per_month", "mean_change_per_month"})
OUTLIER_FIGURES = frozenset({"value", "fleet_mean"})

# The text tables: a title and the columns shown, per table.
TEXT_COLUMNS = {
    "filesystems": (
        "file systems, fastest decline first",
        ["host", "fs", "snapshots", "span_days", "layout_score", "total_change",
         "change_per_month", "free_fraction", "free_extent_count"],
    ),
    "size": (
        "layout score by file size, latest snapshots",
        ["label", "filesystems", "files", "layout_score", "worst_layout_score",
         "mean_change_per_month"],
    ),
    "free": (
        "free space across the fleet by free-extent size, latest snapshot of each device",
        ["label", "filesystems", "free_extents", "free_bytes", "share_of_free_space"],
    ),
    "outliers": ("outliers", ["host", "fs", "metric", "value", "fleet_mean", "z", "direction"]),
    "trend": ("layout score over time", ["host", "fs", "snapshot_id", "taken_at",
                                          "layout_score", "free_fraction"]),
    "files_by_size": (
        "layout score by size bucket from the exported extents",
        ["host", "fs", "snapshot_id", "bucket", "label", "files", "bytes", "layout_score"],
    ),
}  # fmt: skip
#: What a '-' in change_per_month (and total_change) means, by the row's ``no_rate_reason``.
NO_RATE_NOTES = {  # in the table's order: short histories, then single snapshots
    SHORT_SPAN: f"{SHORT_SPAN} (total_change given)",
    ONE_SCORED: f"{ONE_SCORED} (no change to measure: total_change '-' too)",
}


def write_tables(
    root: Path,
    tables: tuple[str, ...],
    fmt: str,
    out: IO[str],
    threshold: float = 2.0,
    *,
    on_damage: str = "refuse",
    warn: Callable[[str], None] | None = None,
    advise: Callable[[str], None] | None = None,
) -> None:
    """Write the fleet tables of ``root`` to ``out`` as ``fmt`` ('text', 'json', 'csv': the
    first table only)."""
    with opened(root, on_damage, warn, advise=advise) as con:
        spill = Path(con.execute("SELECT current_setting('temp_directory')").fetchone()[0])
        with tempfile.TemporaryFile("w+", dir=spill, encoding="utf-8", newline="") as buf:
            streams = {t: table_rows(con, t, threshold) for t in tables}
            if fmt == "json":
                _json(streams, buf)
            elif fmt == "csv":
                _csv(streams[tables[0]], buf)
            else:
                _text(streams, buf, spill)
            buf.seek(0)
            shutil.copyfileobj(buf, out)
    out.flush()


def _scalar(v: Any) -> str:
    """One value as ``json.dumps`` writes it (``default=str`` for other types)."""
    if v is None:
        return "null"
    if v is True:
        return "true"
    if v is False:
        return "false"
    if isinstance(v, float):
        if v != v:
            return "NaN"
        if v in (float("inf"), float("-inf")):
            return "Infinity" if v > 0 else "-Infinity"
        return float.__repr__(v)
    if isinstance(v, int):
        return int.__repr__(v)
    return encode_basestring_ascii(v if isinstance(v, str) else str(v))


def _json(streams: dict[str, Iterator[dict[str, Any]]], buf: IO[str]) -> None:
    """``json.dumps(tables, indent=2, default=str)`` and a newline, a row at a time (the rows
    are flat: their values are numbers, strings and nulls)."""
    if not streams:
        buf.write("{}\n")
        return
    buf.write("{")
    for i, (name, rows) in enumerate(streams.items()):
        buf.write(("," if i else "") + "\n  " + encode_basestring_ascii(name) + ": [")
        n = 0
        keys: dict[str, str] = {}  # a key as written, once per table
        for row in rows:
            fields = []
            for k, v in row.items():
                if k not in keys:
                    keys[k] = "\n      " + encode_basestring_ascii(k) + ": "
                fields.append(keys[k] + _scalar(v))
            body = ",".join(fields)
            buf.write(("," if n else "") + ("\n    {" + body + "\n    }" if fields else "\n    {}"))
            n += 1
        buf.write("\n  ]" if n else "]")
    buf.write("\n}\n")


def _csv(rows: Iterable[dict[str, Any]], buf: IO[str]) -> None:
    w: csv.DictWriter[str] | None = None
    for row in rows:
        if w is None:
            w = csv.DictWriter(buf, fieldnames=list(row), lineterminator="\n")
            w.writeheader()
        w.writerow(row)


def _line(cells: list[str], widths: list[int], numeric: list[bool]) -> str:
    """One row of a text table: numbers right-aligned, text left-aligned."""
    parts = zip(cells, widths, numeric, strict=True)
    return "  ".join(c.rjust(w) if num else c.ljust(w) for c, w, num in parts).rstrip() + "\n"


def _text(streams: dict[str, Iterator[dict[str, Any]]], buf: IO[str], spill: Path) -> None:
    # here, not at the top: fsage.analyzer loads numpy, which the JSON and CSV do not need
    from fsage.analyzer.history import change_text

    no_rate: dict[str, int] = {}
    for i, (name, rows) in enumerate(streams.items()):
        title, cols = TEXT_COLUMNS[name]
        if i:
            buf.write("\n")
        buf.write(f"{title}:\n")
        widths = [len(c) for c in cols]
        numeric = [True] * len(cols)
        n = 0
        with tempfile.TemporaryFile(dir=spill) as cells:
            chunk: list[list[str]] = []
            for row in rows:
                vals = [row[c] for c in cols]
                # an outlier's value is a change where its metric is one
                changes = CHANGES | (
                    OUTLIER_FIGURES if row.get("metric") in CHANGES else frozenset()
                )
                text = [
                    change_text(v) if c in changes and isinstance(v, float) else table_cell(v)
                    for c, v in zip(cols, vals, strict=True)
                ]
                for j, (v, cell) in enumerate(zip(vals, text, strict=True)):
                    widths[j] = max(widths[j], len(cell))
                    if numeric[j] and not (isinstance(v, int | float) or v is None):
                        numeric[j] = False
                if name == "filesystems" and row["no_rate_reason"]:
                    no_rate[row["no_rate_reason"]] = no_rate.get(row["no_rate_reason"], 0) + 1
                chunk.append(text)
                n += 1
                if len(chunk) == CHUNK:
                    pickle.dump(chunk, cells)
                    chunk = []
            if chunk:
                pickle.dump(chunk, cells)
            if not n:
                buf.write("  (none)\n")
                continue
            buf.write(_line([shown(c) for c in cols], widths, numeric))
            buf.write("  ".join("-" * w for w in widths) + "\n")
            cells.seek(0)
            for _ in range(0, n, CHUNK):
                for text in pickle.load(cells):
                    buf.write(_line(text, widths, numeric))
    for reason in [r for r in NO_RATE_NOTES if r in no_rate]:
        count = no_rate[reason]
        many = "file system" if count == 1 else "file systems"
        buf.write(f"change_per_month '-' for {count} {many}: {NO_RATE_NOTES[reason]}\n")
