"""The report's locality section: where a directory's files sit relative to each other, and
what that does to a scan (modeled dynamic layout score, Conway et al., FAST'17)."""

from __future__ import annotations

from typing import Any

from fsage.analyzer.locality import GAP_BUCKETS
from fsage.reports.html import ReportData, Section, Table, register_section
from fsage.reports.sections import _fig, esc, largest_dirs
from fsage.text import human_bytes

GAP_LABELS = {
    "adjacent": "adjacent",
    "le_1mib": "<= 1 MiB",
    "le_group": "<= one group",
    "farther": "farther",
}
SCORE_BINS = [f"{i / 10:.1f}-{(i + 1) / 10:.1f}" for i in range(10)]


def _share(v: float | None) -> str:
    return "-" if v is None else f"{v:.1%}"


@register_section("locality", order=65)
def locality_section(data: ReportData) -> Section | None:
    latest = [a for a in data.latest() if a.get("locality")]
    if not latest:
        return None
    names = [esc(a.get("fs")) for a in latest]
    gaps = [a["locality"].get("neighbour_distance") or {} for a in latest]
    bars = [
        {
            "type": "bar",
            "name": esc(GAP_LABELS[k]),
            "x": names,
            "y": [g.get(f"{k}_share") for g in gaps],
            "hovertemplate": "%{x}: %{y:.1%}<extra>" + esc(GAP_LABELS[k]) + "</extra>",
        }
        for k in GAP_BUCKETS
    ]
    hist = []
    for a, name in zip(latest, names, strict=True):
        ds = a["locality"].get("directory_scan") or {}
        counts = ds.get("histogram") or []
        total = sum(counts)
        if total:
            # shares of the directories that have a scan (those holding a regular file), which
            # are often a few of the file system's directories: the name gives both counts
            scanned = _scanned(total, a.get("directories"))
            hist.append(
                {
                    "type": "bar",
                    "name": esc(f"{a.get('fs')} ({scanned} directories have a scan)"),
                    "x": SCORE_BINS,
                    "y": [c / total for c in counts],
                    "customdata": counts,
                    "hovertemplate": "%{x}: %{customdata:,} directories, %{y:.1%} of the "
                    + esc(f"{total:,} with a scan")
                    + "<extra>"
                    + name
                    + "</extra>",
                }
            )
    figures = [
        _fig(
            bars,
            "Distance from a file's last block to the next file of its directory",
            "file system (newest snapshot)",
            "share of neighbouring file pairs",
            barmode="stack",
            yaxis={"tickformat": ".0%", "range": [0, 1]},
        )
    ]
    if hist:
        figures.append(
            _fig(
                hist,
                "Modeled dynamic layout score of each directory's own scan",
                "score",
                "share of the directories with a scan",
                barmode="group",
                yaxis={"tickformat": ".0%"},
            )
        )
    rows = []
    for a in latest:
        loc = a["locality"]
        nd = loc.get("neighbour_distance") or {}
        ds = loc.get("directory_scan") or {}
        i2d = loc.get("inode_to_data_blocks")
        traced = _whole_tree_traces(a)
        rows.append(
            [
                str(a.get("fs")),
                loc.get("dynamic_layout_score_path"),
                traced[-1] if traced else None,
                _scanned(ds.get("scans"), a.get("directories")),
                ds.get("aggregate"),
                ds.get("median"),
                nd.get("pairs"),
                *(_share(nd.get(f"{k}_share")) for k in GAP_BUCKETS),
                human_bytes(nd.get("group_bytes")),
                _share(loc.get("same_group_share")),
                None if i2d is None else round(i2d["median"]),
            ]
        )
    tables = [
        Table(
            [
                *(
                    "file system",
                    "path-order scan (modeled)",
                    "traced read of the tree",
                    "directories with a scan",
                ),
                *("own scans: aggregate", "median", "file pairs"),
                *(GAP_LABELS[k] for k in GAP_BUCKETS),
                *("group size", "files in their directory's group", "inode to data (median)"),
            ],
            rows,
        )
    ]
    for a in latest:
        by_dir = a.get("by_dir") or []
        if by_dir and "scan_score" in by_dir[0]:
            tables.append(_by_dir_table(a, by_dir))
    return Section(
        "Locality between files",
        figures=figures,
        tables=tables,
        notes=[
            "Neighbours are consecutive regular files of one directory in path order (by name); "
            "their distance runs from the first file's last block to the next file's first, in "
            "bytes so that block sizes compare (adjacent: the next file starts right after). "
            "A directory's own scan reads the directory, then its files by name, cold: inode "
            "blocks, extent/indirect blocks, data; only a directory holding a regular file has "
            "one, and the histogram's shares are of those directories. Dynamic layout score "
            "= 1 - requests that seek / blocks read (Conway et al., FAST'17); the traced read "
            "is the newest `fsage trace run` stored with the snapshot that read as many blocks "
            "as the modeled scan (within 1 %): a read of the whole tree, in the order its "
            "command read it. Inode to data in blocks.",
        ],
    )


def _scanned(scans: int | None, directories: int | None) -> str | int | None:
    """How many directories have a scan, of how many the file system has."""
    if scans is None or not directories:
        return scans
    return f"{scans:,} of {directories:,}"


def _whole_tree_traces(a: dict[str, Any]) -> list[float]:
    """Scores of the traces that read what the modeled path-order scan reads (their blocks
    within 1 % of its): whole-tree reads, not a directory's or a trace cut short."""
    modeled = (a.get("disk_model") or {}).get("dynamic_reads", {}).get("path") or {}
    want = modeled.get("blocks") or 0
    return [
        t["score"]
        for t in a.get("traces") or []
        if t.get("score") is not None and want and abs(t["blocks"] - want) <= 0.01 * want
    ]


def _by_dir_table(a: dict[str, Any], by_dir: list[dict[str, Any]]) -> Table:
    by_dir, left_out = largest_dirs(by_dir)
    return Table(
        [
            *("directory", "files", "subtree scan", "own scan", "file pairs"),
            *(GAP_LABELS[k] for k in GAP_BUCKETS),
        ],
        [
            [
                r["path"],
                r["files"],
                r["scan_score"],
                r["own_scan_score"],
                r["pairs"],
                *(_share(r.get(f"{k}_share")) for k in GAP_BUCKETS),
            ]
            for r in by_dir
        ],
        caption=f"{a.get('fs')}: locality by directory{left_out}",
    )
