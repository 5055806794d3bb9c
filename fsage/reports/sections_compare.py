"""The report's comparison of two chosen snapshots (`fsage report --compare A B`): layout score
by file size, free space by extent size, and how many files moved."""

from __future__ import annotations

from typing import Any

from fsage.reports.html import ReportData, Section, Table, register_section
from fsage.reports.sections import (
    _fig,
    _ref_line,
    esc,
    every_size_class,
    free_bucket_label,
    free_share_bars,
    score_axis,
)
from fsage.text import human_bytes, size_range

#: One colour per snapshot compared; its share of the free extents is drawn hatched.
SIDE_COLOURS = ("#1f77b4", "#ff7f0e")


def _label(x: dict[str, Any]) -> str:
    return esc(f"{x['fs']} #{x['id']} ({str(x['taken_at'])[:10]})")


def _block_size(side: dict[str, Any]) -> int:
    return int(side.get("block_size") or 4096)


def _score_traces(a: dict[str, Any], b: dict[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """One line per snapshot over every size class from the smallest to the largest either
    holds, in size order (a class one snapshot lacks would otherwise be appended at the end
    of the category axis), broken where a snapshot has no files of a class."""
    sides = [(s, every_size_class(s.get("by_size") or [], _block_size(s))) for s in (a, b)]
    # classes are powers of two of bytes: the same class has the same label at any block size
    by_bytes: dict[int, str] = {}
    for side, rows in sides:
        for r in rows:
            by_bytes[r["max_blocks"] * _block_size(side)] = size_range(
                r["min_blocks"], r["max_blocks"], _block_size(side)
            )
    if not by_bytes:
        return [], []
    top = [1 << e for e in range(min(by_bytes).bit_length() - 1, max(by_bytes).bit_length())]
    labels = [by_bytes.get(n) or size_range(n // 2 + 1, n, 1) for n in top]
    traces = []
    for side, rows in sides:
        bs = _block_size(side)
        at = {r["max_blocks"] * bs: r for r in rows}
        traces.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "name": _label(side),
                "x": labels,
                "y": [at[n]["layout_score"] if n in at else None for n in top],
                "connectgaps": False,
                "customdata": [at[n]["files"] if n in at else 0 for n in top],
                "hovertemplate": "files of %{x}: layout score %{y:.4f}, %{customdata:,} "
                "files<extra>" + _label(side) + "</extra>",
            }
        )
    return traces, labels


def _free_traces(a: dict[str, Any], b: dict[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """Per snapshot, its shares of the free space and of the free extents in each free-extent
    bucket, as the one-snapshot free-space figure draws them: one large extent often holds
    nearly all the space, and its bar alone would leave the small buckets unseen. Every bucket
    from the smallest to the largest either snapshot holds is on the axis, empty ones too."""
    held = {
        r["min_blocks"] * _block_size(side)
        for side in (a, b)
        for r in side.get("free_extents") or []
    }
    if not held:
        return [], []
    buckets = [1 << e for e in range(min(held).bit_length() - 1, max(held).bit_length())]
    labels = [free_bucket_label(n, _block_size(a)) for n in buckets]
    traces = []
    for side, colour in zip((a, b), SIDE_COLOURS, strict=True):
        bs = _block_size(side)
        rows = {r["min_blocks"] * bs: r for r in side.get("free_extents") or []}
        traces += free_share_bars(rows, buckets, labels, bs, _label(side), colour)
    return traces, labels


@register_section("compare", order=15)
def compare(data: ReportData) -> Section | None:
    cmp = data.extra.get("compare")
    if not cmp:
        return None
    a, b = cmp["a"], cmp["b"]
    score_traces, size_labels = _score_traces(a, b)
    free_traces, free_labels = _free_traces(a, b)
    values = [y for t in score_traces for y in t["y"]]
    f = cmp["files"]
    table = Table(
        ["", _label(a), _label(b)],
        [
            ["files", a["files"], b["files"]],
            ["layout score", a["layout_score"], b["layout_score"]],
            [
                "free space",
                human_bytes(a["blocks_free"] * (a["block_size"] or 0)),
                human_bytes(b["blocks_free"] * (b["block_size"] or 0)),
            ],
            [
                "largest free extent",
                human_bytes((a["largest_free_extent"] or 0) * (a["block_size"] or 0)),
                human_bytes((b["largest_free_extent"] or 0) * (b["block_size"] or 0)),
            ],
        ],
        "The two snapshots compared.",
    )
    moved = Table(
        ["files in both", "moved to other blocks", "blocks of moved files", "unchanged",
         f"only in #{a['id']}", f"only in #{b['id']}"],
        [[f["in_both"], f["moved"], f["moved_blocks"], f["unchanged"], f["only_in_a"],
          f["only_in_b"]]],
        "Regular files with the same inode and generation in both snapshots; moved: their "
        "extents differ.",
    )  # fmt: skip
    figures = []
    if score_traces:
        figures.append(
            _fig(
                score_traces,
                "Layout score by file size",
                "file size (largest in the size class)",
                "layout score",
                xaxis={"type": "category", "categoryorder": "array", "categoryarray": size_labels},
                yaxis=score_axis(values, perfect_line=True),
                shapes=[_ref_line(1.0)],
            )
        )
    if free_traces:
        figures.append(
            _fig(
                free_traces,
                "Free space by extent size",
                "free extent size (e2freefrag's buckets)",
                "share",
                xaxis={
                    "type": "category",
                    "tickangle": -30,
                    "categoryorder": "array",
                    "categoryarray": free_labels,
                },
                yaxis={"tickformat": ".0%", "rangemode": "tozero"},
                barmode="group",
                legend={"y": -0.45},
            )
        )
    return Section(
        f"Snapshot #{a['id']} compared with #{b['id']}",
        figures=figures,
        tables=[table, moved],
        notes=[
            "Layout score by file size: a size class a snapshot has no files of breaks its "
            "line; the dotted line is a perfect layout (1.0). Free space: each snapshot's share "
            "of its free space (solid) and of its free extents (hatched) in each of "
            "e2freefrag's buckets, every bucket from the smallest to the largest either "
            "snapshot holds, empty ones too: one large extent often holds nearly all the "
            "space, and the share of the extents shows the small buckets beside it."
        ],
    )
