"""`fsage runs`: the aging runs recorded in a database, with their LFS write-cost metrics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from fsage.ager.run import AgingRun, aging_runs
from fsage.cli.common import db_option, echo_csv, echo_json, echo_table, format_option
from fsage.db.store import Store
from fsage.errors import StoreError


def _row(r: AgingRun) -> list[Any]:
    m, u = r.metrics, r.utilization
    util = u.get("fraction", u.get("fullness"))
    snaps = "-" if r.first_snap is None else f"{r.first_snap}-{r.last_snap}"
    return [
        r.id,
        r.fs or "-",
        r.kind,
        r.status,
        r.started_at.replace("+00:00", "Z"),
        r.ops,
        round(r.bytes_written / 2**20, 1),
        snaps,
        None if util is None else round(float(util), 3),
        _cpu(m),
        None if m.get("own_share") is None else f"{float(m['own_share']):.0%}",
        m.get("policy", "-"),
        m.get("write_cost"),
        m.get("cleaner_overhead"),
        m.get("transfer_inefficiency"),
        m.get("overall_write_cost"),
        (m.get("after_fill") or {}).get("overall_write_cost"),
        ";".join(str(n) for n in _resumed_at(r)),
    ]


def _resumed_at(r: AgingRun) -> list[int]:
    """The ops a run was resumed at (``fsage age --resume`` continues the run's row)."""
    at = r.params.get("resumed_at")
    return [int(n) for n in at] if isinstance(at, list) else []


def _text_row(r: AgingRun) -> list[Any]:
    """A row of the table: its status says where a resumed run was resumed."""
    row = _row(r)[:-1]
    at = _resumed_at(r)
    if len(at) == 1:
        row[3] = f"{r.status}, resumed at {at[0]:,}"
    elif at:
        row[3] = f"{r.status}, resumed {len(at)} times"
    return row


def _cpu(m: dict[str, Any]) -> str | None:
    if m.get("cpu_user_s") is None:
        return None
    return f"{float(m['cpu_user_s']):.1f}+{float(m.get('cpu_system_s', 0.0)):.1f}"


RUN_COLUMNS = [
    "id",
    "fs",
    "kind",
    "status",
    "started_at",
    "ops",
    "mib_written",
    "snapshots",
    "utilization",
    "cpu_user_plus_system_s",
    "own_share",
    "policy",
    "write_cost",
    "cleaner_overhead",
    "transfer_inefficiency",
    "overall_write_cost",
    "overall_write_cost_after_fill",
    "resumed_at",
]


@click.command("runs")
@db_option
@click.option("--fs", "fs_name", help="Only runs on this file system (its database name).")
@click.option("--kind", help="Only runs on this target kind: dir, mounted-ext, offline-ext, lfs.")
@format_option("text", "json", "csv")
def runs_cmd(db: Path, fs_name: str | None, kind: str | None, fmt: str) -> None:
    """List the aging runs recorded by `fsage age ... --db`, oldest first.

    Every run records its target, kind, status, ops and bytes written and the snapshots it
    took, the process's CPU time (user+system seconds) and fsage's own share of the run's
    wall time ("own": time outside the executor's ops, snapshots left out). Runs on LFS images
    also record seed 001's write-cost metrics (EQ 1-6: write cost,
    cleaner overhead, transfer inefficiency, overall write cost under a 15 ms / 5 MB/s disk)
    over the whole run and over the ops after the workload's fill phase ("after fill", what
    seed 001 Figure 5-4 counts), the cleaner's counters and the segment utilization
    histogram (in --format json). The text table shows utilization as the LFS's live
    fraction, or the target's fullness. A run continued by `fsage age --resume` is one row:
    its ops, bytes, snapshots and times are the whole run's, and its status says where it
    was resumed (resumed_at: the ops, in --format csv and json's params).

    \b
    Examples:
      fsage lfs mkfs lfs.img --size 64M
      fsage age lfs.img --profile hfs-aging --db fsage.db
      fsage runs --db fsage.db
      fsage runs --db fsage.db --kind lfs --format json
    """
    with Store.open(db) as store:
        runs = aging_runs(store, fs_name, kind)
    if not runs and (fs_name is not None or kind is not None):
        what = " and ".join(
            x for x in (fs_name and f"fs {fs_name!r}", kind and f"kind {kind!r}") if x
        )
        raise StoreError(f"no aging runs with {what} in {db}")
    if fmt == "csv":
        echo_csv(RUN_COLUMNS, [_row(r) for r in runs])
        return
    if fmt == "json":
        echo_json([r.to_json() for r in runs])
        return
    if not runs:
        click.echo("no aging runs recorded")
        return
    echo_table(
        [
            "id",
            "fs",
            "kind",
            "status",
            "started",
            "ops",
            "MiB written",
            "snapshots",
            "util",
            "cpu s",
            "own",
            "policy",
            "write cost",
            "overhead",
            "TI",
            "overall",
            "after fill",
        ],
        [_text_row(r) for r in runs],
    )


COMMANDS = [runs_cmd]
