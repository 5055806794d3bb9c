"""Layout scores of a benchmark's own files and of the files that were already there (seed 002).

The *benchmark files* are the regular files below the run's own directory in the snapshot taken
after the benchmark; the *old files* are the regular files of the snapshot taken before it. Both
scores are block-weighted aggregates (Σ contiguous / Σ (blocks − 1), DESIGN.md). Benchmark files
are also grouped by the first directory below the run's directory (``seq-64K``...: one group per
file size), and each group is compared with the old files of the same size bucket, as seed 002
compares the benchmark's 64 KB files with the 64 KB files already on the file system.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from fsage.analyzer.scores import aggregate_score, file_scores
from fsage.layout import Layout

I64 = npt.NDArray[np.int64]


def size_bucket(blocks: int) -> int:
    """Seed 000 Figure 5's buckets by blocks: 2 → 1, 3-4 → 2, 5-8 → 3, ... (0 below 2 blocks)."""
    return (blocks - 1).bit_length() if blocks >= 2 else 0


def bucket_label(bucket: int) -> str:
    if bucket <= 1:
        return "2"
    return f"{(1 << (bucket - 1)) + 1}-{1 << bucket}"


@dataclass
class SetScore:
    files: int = 0
    blocks: int = 0
    score: float | None = None
    by_bucket: dict[int, tuple[int, int, float | None]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "files": self.files,
            "blocks": self.blocks,
            "score": self.score,
            "by_bucket": {
                bucket_label(b): {"files": f, "blocks": n, "score": s}
                for b, (f, n, s) in sorted(self.by_bucket.items())
            },
        }


def _score_set(contig: I64, den: I64, blocks: I64) -> SetScore:
    out = SetScore(files=int(blocks.size), blocks=int(blocks.sum()))
    out.score = aggregate_score(contig, den)
    buckets = np.array([size_bucket(int(b)) for b in blocks], dtype=np.int64)
    for b in np.unique(buckets):
        if b == 0:
            continue
        m = buckets == b
        out.by_bucket[int(b)] = (
            int(m.sum()),
            int(blocks[m].sum()),
            aggregate_score(contig[m], den[m]),
        )
    return out


@dataclass
class BenchLayout:
    """What seed 002's table needs from the two snapshots."""

    block_size: int
    bench: SetScore | None
    old: SetScore | None
    groups: dict[str, SetScore] = field(default_factory=dict)

    def group_scores(self, group: str) -> tuple[float | None, float | None]:
        """(benchmark files of ``group``, old files of the group's size bucket)."""
        g = self.groups.get(group)
        if g is None:
            return None, None
        old_score = None
        if self.old is not None and g.by_bucket:
            main = max(g.by_bucket.items(), key=lambda kv: kv[1][1])[0]
            hit = self.old.by_bucket.get(main)
            old_score = hit[2] if hit else None
        return g.score, old_score

    def to_json(self) -> dict[str, Any]:
        return {
            "block_size": self.block_size,
            "bench": None if self.bench is None else self.bench.to_json(),
            "old": None if self.old is None else self.old.to_json(),
            "groups": {k: v.to_json() for k, v in sorted(self.groups.items())},
        }


def _regular(layout: Layout) -> tuple[npt.NDArray[np.bool_], I64, I64, I64]:
    sc = file_scores(layout.files)
    return layout.files.is_regular(), sc.contiguous, sc.denominator, sc.blocks


def old_files_score(before: Layout, exclude_prefix: str) -> SetScore:
    """All regular files of ``before`` except those below a directory named ``exclude_prefix*``
    (an earlier benchmark run kept with --keep is not an old file of the file system)."""
    reg, contig, den, blocks = _regular(before)
    keep = reg.copy()
    paths = before.paths()
    for i in np.flatnonzero(reg):
        for p in paths.get(int(before.files.ino[i]), []):
            if any(part.startswith(exclude_prefix) for part in p.split("/")):
                keep[i] = False
                break
    return _score_set(contig[keep], den[keep], blocks[keep])


def bench_files_score(after: Layout, bench_name: str) -> tuple[SetScore, dict[str, SetScore]]:
    """The regular files below the directory ``bench_name`` in ``after``, overall and grouped
    by the first directory below it."""
    reg, contig, den, blocks = _regular(after)
    paths = after.paths()
    idx: list[int] = []
    group_of: list[str] = []
    for i in np.flatnonzero(reg):
        for p in paths.get(int(after.files.ino[i]), []):
            parts = p.split("/")
            if bench_name in parts:
                k = parts.index(bench_name)
                idx.append(int(i))
                group_of.append(parts[k + 1] if k + 2 < len(parts) else "")
                break
    sel = np.array(idx, dtype=np.int64)
    overall = _score_set(contig[sel], den[sel], blocks[sel])
    groups: dict[str, SetScore] = {}
    garr = np.array(group_of, dtype=object)
    for g in sorted(set(group_of)):
        if not g:
            continue
        m = sel[garr == g]
        groups[g] = _score_set(contig[m], den[m], blocks[m])
    return overall, groups
