"""Layout analysis: layout scores, free-space fragmentation, locality, disk model, trends.

Everything here works on ``fsage.layout.Layout`` arrays (numpy, no per-block Python loop) and
on the snapshots of a store; nothing here reads images.
"""

from fsage.analyzer.analysis import SnapshotAnalyzer, analyze_layout, bucket_range, size_bucket
from fsage.analyzer.diskmodel import PRESETS, DiskModel, get_model
from fsage.analyzer.fit import SizeFit, fit_sizes
from fsage.analyzer.freespace import FreeSpace, free_space, merge_runs
from fsage.analyzer.scores import (
    FileScores,
    aggregate_score,
    e4defrag_score,
    file_scores,
    filefrag_extents,
    xfs_frag_counts,
)

__all__ = [
    "PRESETS",
    "DiskModel",
    "FileScores",
    "FreeSpace",
    "SizeFit",
    "SnapshotAnalyzer",
    "aggregate_score",
    "analyze_layout",
    "bucket_range",
    "e4defrag_score",
    "file_scores",
    "filefrag_extents",
    "fit_sizes",
    "free_space",
    "get_model",
    "merge_runs",
    "size_bucket",
    "xfs_frag_counts",
]
