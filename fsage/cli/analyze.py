"""`fsage analyze`: layout scores, free-space fragmentation and modeled read time of snapshots."""

from __future__ import annotations

import csv
import sys
from pathlib import Path
from typing import Any

import click

from fsage.analyzer.diskmodel import PRESETS
from fsage.analyzer.dynamic import reads_text
from fsage.analyzer.history import (
    SEED000_TREND,
    TREND_RULE,
    analyze_many,
    select_snapshots,
    trend_line,
    trends,
)
from fsage.analyzer.locality import GAP_BUCKETS
from fsage.cli.common import db_option, echo_json, echo_table, format_option, progress_bar
from fsage.db.store import Store
from fsage.errors import UsageError
from fsage.heap import keep_freed_memory
from fsage.text import human_bytes, shown

BY_PARTS = {"size": "size", "dir": "dir", "age": "age"}


@click.command()
@db_option
@click.option("--fs", "fs_name", help="File system name (default: every file system).")
@click.option("--snapshot", "snapshot_id", type=int, help="Analyze this snapshot id.")
@click.option(
    "--by",
    type=click.Choice(["size", "dir", "age"]),
    default="size",
    show_default=True,
    help="Break the layout score down by file size (Seltzer et al., USENIX 1995, Figure 5: "
    "powers of two of the blocks of data, labelled in bytes, '8 KiB-16 KiB' being over 8 KiB "
    "and up to 16 KiB), directory subtree or file age (mtime).",
)
@click.option(
    "--history",
    is_flag=True,
    help="Every snapshot of the file system(s): one line each (date, operations done, layout "
    "score, free space) and the trends. Operations done and GiB written (ops_done, "
    "gib_written in JSON and CSV) count over the file system's life, every aging run or "
    "replay in turn; op_count and bytes_written are the snapshot's own run's counts, each run "
    "counting from 0. " + TREND_RULE,
)
@click.option(
    "--full",
    is_flag=True,
    help="With --history: the full analysis of every snapshot as well as the table.",
)
@click.option(
    "--model",
    "models",
    multiple=True,
    type=click.Choice(sorted(PRESETS)),
    help="Disk model preset(s) for modeled read time (default: dsp3105, hdd, ssd).",
)
@click.option("--depth", default=2, show_default=True, help="Directory depth for --by dir.")
@format_option("text", "json", "csv")
def analyze(
    db: Path,
    fs_name: str | None,
    snapshot_id: int | None,
    by: str,
    history: bool,
    full: bool,
    models: tuple[str, ...],
    depth: int,
    fmt: str,
) -> None:
    """Analyze the layout of recorded snapshots (the latest of each file system by default).

    Prints the aggregate layout score (block-weighted, as Seltzer et al., "File System Logging
    versus Clustering: A Performance Comparison", USENIX 1995, section 4.1 define it: the share
    of a file's blocks, after its first, that follow the previous block on disk), its breakdown
    (file sizes in bytes of data: "8 KiB-16 KiB" is over 8 KiB and up to 16 KiB), the
    free-space histogram in e2freefrag's buckets ("4 KiB-<8 KiB": at least 4 KiB, under 8), the
    numbers filefrag, e4defrag -c and xfs_db frag would
    give, locality, and the modeled time to read each size class in inode and path order.

    Locality between files: for consecutive files of one directory in path order, the
    distance from one file's last block to the next one's first (adjacent, up to 1 MiB, up to
    one block group / AG, farther; bytes, so that block sizes compare), and the modeled
    dynamic layout score (Conway et al., FAST'17) of each directory's own scan (the directory,
    then its files by name, cold) beside that of the whole path-order scan. With --by dir,
    each subtree's scan score, its own files' and its shares of neighbour distances.

    \b
    Examples:
      fsage analyze
      fsage analyze --fs home --by dir --depth 1
      fsage analyze --fs home --by dir --format csv
      fsage analyze --snapshot 12 --format json
      fsage analyze --fs home --history --format csv
    """
    if depth < 0:
        raise UsageError("--depth must be 0 or more")
    keep_freed_memory()  # whole-snapshot arrays come and go: no page faults for each anew
    models = models or ("dsp3105", "hdd", "ssd")
    if full and not history:
        raise UsageError("--full goes with --history")
    parts = {"size", "free", "tools", "locality", "model", "age"}
    if history and not full and fmt != "json":
        parts = {"size", "free"}
    if by == "dir":
        parts.add("dir")
    with Store.open(db, readonly=True) as store:
        rows = select_snapshots(store, fs_name, snapshot_id, history)
        with progress_bar(len(rows), "analyzing snapshots") as step:
            results = analyze_many(
                store, rows, parts, models, depth, path_order=True, progress=step
            )
    tr = trends(results) if history else None
    if fmt == "json":
        echo_json({"snapshots": results, "trends": tr})
    elif fmt == "csv":
        if tr is not None and not full:
            _csv_history(tr)
        else:
            _csv(results, by)
    else:
        if tr is None or full:
            for a in results:
                _text(a, by)
        if tr is not None:
            _text_trends(tr)


def _score(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


# The columns of a directory's row after its path, in the text table and the CSV alike.
_DIR_FIELDS = ("files", "blocks", "layout_score", "scan_score", "own_scan_score", "pairs")


def _by_rows(a: dict[str, Any], by: str) -> tuple[list[str], list[list[Any]]]:
    if by == "size":
        return (
            ["file size", "files", "data blocks", "layout score"],
            [
                [
                    r["label"],
                    r["files"],
                    r["blocks"],
                    r["layout_score"],
                ]
                for r in a["by_size"]
            ],
        )
    if by == "dir":
        return (
            [
                *("directory", "files", "data blocks", "layout score", "scan score"),
                *("own scan score", "file pairs", "adjacent", "<= 1 MiB", "<= group", "farther"),
            ],
            [
                [
                    _printable(r["path"]),
                    *(r[k] for k in _DIR_FIELDS),
                    *(_share(r[f"{k}_share"]) for k in GAP_BUCKETS),
                ]
                for r in a["by_dir"]
            ],
        )
    return (
        ["age (mtime)", "files", "data blocks", "layout score"],
        [[r["label"], r["files"], r["blocks"], r["layout_score"]] for r in a["by_age"]],
    )


_printable = shown  # terminal-safe: undecodable bytes and control characters escaped


def _text(a: dict[str, Any], by: str) -> None:
    click.echo(
        f"snapshot {a['id']} of {_printable(str(a['fs']))} ({a['kind']}, "
        f"{a['block_size']} B blocks) taken {a['taken_at']}"
    )
    click.echo(
        f"  layout score {_score(a['layout_score'])} over {a['scored_files']} multi-block files "
        f"({a['fragmented_files']} fragmented); directories {_score(a['directories_layout_score'])}"
    )
    click.echo("")
    headers, rows = _by_rows(a, by)
    echo_table(headers, rows)
    fs = a["free_space"]
    click.echo("")
    click.echo(
        f"free space: {fs['blocks_free']} blocks in {fs['free_extent_count']} extents, largest "
        f"{fs['largest_free_extent']} blocks; {fs['free_chunks']}/{fs['chunks_total']} free "
        f"{fs['chunk_bytes'] // 1024} KiB chunks"
    )
    echo_table(
        ["extent size", "free extents", "free blocks"],
        [[r["label"], r["count"], r["blocks"]] for r in a["free_extents"]],
    )
    seg = a.get("segments")
    if seg:
        click.echo("")
        click.echo(
            f"LFS segments: {len(seg['live'])} of {seg['capacity']} blocks, "
            f"{seg['fraction']:.1%} live"
        )
        echo_table(
            ["utilization", "segments"],
            [[f"{h['low']:.0%}-{h['high']:.0%}", h["segments"]] for h in seg["histogram"]],
        )
    t = a["tools"]
    e4 = "-" if t["e4defrag_score"] is None else f"{t['e4defrag_score']:.2f}"
    click.echo("")
    click.echo(
        f"filefrag: {t['filefrag_extents_total']} extents; e4defrag -c: "
        f"{t['e4defrag_extents_now']}/{t['e4defrag_extents_best']} extents, score "
        f"{e4}; xfs_db frag: "
        f"factor {t['xfs_frag_factor']:.2f}%"
    )
    loc = a["locality"]
    share = loc["same_group_share"]
    i2d = loc["inode_to_data_blocks"]
    m2d = loc["meta_to_data_blocks"]
    click.echo(
        "locality: "
        + (f"{share:.1%} of files in their directory's group" if share is not None else "-")
        + (f"; inode->data median {i2d['median']:.0f} blocks" if i2d else "")
        + (f"; metadata->data median {m2d['median']:.0f} blocks" if m2d else "")
    )
    for line in locality_lines(loc):
        click.echo("  " + line)
    dm = a["disk_model"]
    click.echo(
        "dynamic layout score (Conway et al., FAST'17; modeled cold read of every directory and "
        "file: inode, extent/indirect blocks, data): " + reads_text(dm["dynamic_reads"])
    )
    for tr in a.get("traces") or []:
        click.echo(
            f"traced dynamic layout score {_score(tr['score'])} (trace {tr['id']}: "
            f"{tr['discontiguous']} of {tr['requests']} requests seek, {tr['blocks']} blocks; "
            f"{_printable(tr['command'])})"
        )
    for name, m in dm["models"].items():
        click.echo("")
        click.echo(f"modeled read, {name} ({m['description']}):")
        echo_table(
            ["file size", "files", "inode order MB/s", "path order MB/s"],
            [
                [
                    r["label"],
                    r["inode_files"],
                    r["inode_mb_per_s"],
                    r.get("path_mb_per_s"),
                ]
                for r in m["by_size"]
            ],
        )
    click.echo("")


def _share(v: float | None) -> str:
    return "-" if v is None else f"{v:.1%}"


def locality_lines(loc: dict[str, Any]) -> list[str]:
    """Between files: the gaps of neighbouring files and the directories' own scans."""
    out = []
    nd = loc.get("neighbour_distance")
    if nd and nd["pairs"]:
        group = (
            f"<= one group ({human_bytes(nd['group_bytes'])})"
            if nd["group_bytes"]
            else "<= one group (size unknown)"
        )
        out.append(
            f"next file of the directory (path order, {nd['pairs']} pairs): "
            f"{_share(nd['adjacent_share'])} adjacent, {_share(nd['le_1mib_share'])} <= 1 MiB, "
            f"{_share(nd['le_group_share'])} {group}, {_share(nd['farther_share'])} farther"
        )
    ds = loc.get("directory_scan")
    if ds and ds["scans"]:
        out.append(
            f"directories' own scans (modeled dynamic layout score, {ds['scans']} directories): "
            f"aggregate {_score(ds['aggregate'])}, p10 {_score(ds['p10'])}, median "
            f"{_score(ds['median'])}, p90 {_score(ds['p90'])}"
        )
    return out


def _ops(v: int | None) -> str:
    return "-" if v is None else f"{v:,}"


def _text_trends(tr: dict[str, dict[str, Any]]) -> None:
    for fs, t in tr.items():
        click.echo(f"history of {_printable(fs)}: {trend_line(t)}")
        click.echo(f"  ({SEED000_TREND})")
        echo_table(
            [
                "id",
                "taken at (UTC)",
                "ops done",
                "GiB written",
                "files",
                "layout score",
                "free blocks",
                "free extents",
                "largest free extent (blocks)",
            ],
            [
                [
                    s["id"],
                    str(s["taken_at"])[:19],
                    s["ops_done"],
                    None if s["gib_written"] is None else round(s["gib_written"], 3),
                    s["files"],
                    s["layout_score"],
                    s["blocks_free"],
                    sum(b["count"] for b in s["free_extents"] or []),
                    s["largest_free_extent"],
                ]
                for s in t["snapshots"]
            ],
        )
        rec = t.get("recreations") or []
        if rec:
            click.echo("recreations (fsage replay) beside the snapshot they recreate:")
            echo_table(
                ["id", "recreates", "original score", "recreated score", "ops replayed"],
                [
                    [
                        r["id"],
                        r["recreation_of"],
                        r["original_layout_score"],
                        r["layout_score"],
                        _ops(r["op_count"]),
                    ]
                    for r in rec
                ],
            )
        click.echo("")


def _csv_history(tr: dict[str, dict[str, Any]]) -> None:
    w = csv.writer(sys.stdout)
    w.writerow(
        [
            "id",
            "fs",
            "taken_at",
            "ops_done",
            "gib_written",
            "op_count",
            "bytes_written",
            "files",
            "layout_score",
            "blocks_free",
            "free_extents",
            "largest_free_extent",
            "recreation_of",
        ]
    )
    for fs, t in tr.items():
        for s in t["snapshots"]:
            w.writerow(
                [
                    s["id"],
                    fs,
                    s["taken_at"],
                    s["ops_done"],
                    s["gib_written"],
                    s["op_count"],
                    s["bytes_written"],
                    s["files"],
                    s["layout_score"],
                    s["blocks_free"],
                    sum(b["count"] for b in s["free_extents"] or []),
                    s["largest_free_extent"],
                    None,
                ]
            )
        for r in t.get("recreations") or []:
            w.writerow(
                [
                    r["id"],
                    r["fs"],
                    r["taken_at"],
                    None,  # a recreation is its replay's: it has no life of aging runs
                    None,
                    r["op_count"],
                    r["bytes_written"],
                    r["files"],
                    r["layout_score"],
                    r["blocks_free"],
                    None,
                    None,
                    r["recreation_of"],
                ]
            )


def _csv(results: list[dict[str, Any]], by: str) -> None:
    w = csv.writer(sys.stdout)
    if by == "size":
        w.writerow(
            [
                *("id", "fs", "min_blocks", "max_blocks", "files", "blocks", "layout_score"),
                *("min_bytes", "max_bytes", "label"),  # added last: earlier columns stay put
            ]
        )
        for a in results:
            for r in a["by_size"]:
                w.writerow(
                    [
                        a["id"],
                        a["fs"],
                        r["min_blocks"],
                        r["max_blocks"],
                        r["files"],
                        r["blocks"],
                        r["layout_score"],
                        r["min_bytes"],
                        r["max_bytes"],
                        r["label"],
                    ]
                )
    elif by == "dir":
        w.writerow(
            [
                *("id", "fs", "path", "depth", *_DIR_FIELDS),
                *(f"{k}_share" for k in GAP_BUCKETS),
            ]
        )
        for a in results:
            for r in a["by_dir"]:
                w.writerow(
                    [
                        *(a["id"], a["fs"], r["path"], r["depth"]),
                        *(r[k] for k in _DIR_FIELDS),
                        *(r[f"{k}_share"] for k in GAP_BUCKETS),
                    ]
                )
    else:
        w.writerow(["id", "fs", "age", "min_days", "max_days", "files", "blocks", "layout_score"])
        for a in results:
            for r in a["by_age"]:
                w.writerow(
                    [
                        a["id"],
                        a["fs"],
                        r["label"],
                        r["min_days"],
                        r["max_days"],
                        r["files"],
                        r["blocks"],
                        r["layout_score"],
                    ]
                )


COMMANDS = [analyze]
