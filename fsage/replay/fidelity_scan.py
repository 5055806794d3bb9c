"""The scan a layout stands for: the modeled time of a cold path-order read of the whole tree.

A cold recursive read (Conway's ``grep -r``: ``fsage.analyzer.dynamic.modeled_reads``, inodes,
metadata and data in path order) is fed through a disk model (``fsage.analyzer.diskmodel``):
each request that does not start where the previous one ended pays positioning, every block
pays transfer. On a disk where seeks cost (the ``hdd`` preset; seed 000's DSP 3105), the time
says how much the layout's scattering is felt; a VM's disk, where seeks are nearly free, says
little (a plain copy with several times fewer seeks scans as fast as an aged original).

The scan criterion compares three reads of the judged snapshot's tree: the original, the
recreation and a plain copy (the yardstick of ``fsage.replay.verdict``). It applies where the
copy's time is outside ``SCAN_BAND`` of the original's (else a copy would pass it, and it
cannot tell an aged layout from a fresh one): the recreation's time must then be within the
band. The copy's time comes from the noise floor's plain copy (``NoiseFloor.copy_scan``, the
snapshot's files written in one go onto an empty file system of the recorded geometry, as
``fsage noise-floor`` measures it); without one the criterion is unknown. The snapshot's files
laid out contiguously in path order (``contiguous_reads``) are shown beside it as the bound no
copy beats, not as a copy: on a git-checkout history of small files a real plain copy makes
3,202 seeks where the contiguous layout makes 24, and its time is 0.90 of the original's, not
0.02, because ext4 puts directories, inode tables and small files' data apart even on an empty
file system.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from fsage.analyzer.diskmodel import get_model
from fsage.analyzer.dynamic import INODE_READAHEAD_BLOCKS, Requests, request_score
from fsage.analyzer.locality import fact, inodes_per_group
from fsage.layout import Layout

I64 = npt.NDArray[np.int64]

#: The disks the scan is modeled on: a modern HDD (judged) and seed 000's DSP 3105 (shown).
SCAN_MODELS = ("hdd", "dsp3105")
#: The model the criterion is judged on.
JUDGED_MODEL = "hdd"
#: The criterion's band: a scan time within this share of the original's.
SCAN_BAND = 0.10
#: Where the copy's modeled time came from.
COPY_FROM_FLOOR = "the noise floor's plain copy"


def path_reads(layout: Layout) -> Requests:
    """The modeled requests of a cold path-order read of every directory and regular file."""
    from fsage.analyzer.analysis import SnapshotAnalyzer

    return SnapshotAnalyzer(layout).path_reads()


def contiguous_reads(layout: Layout) -> Requests:
    """The requests a cold path-order read of ``layout``'s tree would make had its files been
    written in that order onto an empty file system with no scatter: each directory's and
    file's data one run right after the previous one's, inodes numbered in the same order so
    that the inode table is read one readahead window (``INODE_READAHEAD_BLOCKS``) per
    window's worth of inodes, from the first group's table (where it is known) before the
    data."""
    from fsage.analyzer.dynamic import walk_order
    from fsage.analyzer.scores import file_scores

    files = layout.files
    scores = file_scores(files)
    walk = walk_order(layout, files.is_regular() | files.is_dir())
    blocks = scores.blocks[walk].astype(np.int64)
    n = walk.size
    ipg = inodes_per_group(layout)
    isize = fact(layout, "inode_size", "s_inode_size")
    groups = layout.facts.groups
    itab = groups[0].get("inode_table") if groups else None
    data_start = np.zeros(n, np.int64)
    if n:
        np.cumsum(blocks[:-1], out=data_start[1:])
    if not (ipg and isize and itab is not None):
        start, length = data_start, blocks
    else:
        per_window = max(layout.facts.block_size // int(isize), 1) * INODE_READAHEAD_BLOCKS
        table_blocks = -(-int(ipg) * int(isize) // layout.facts.block_size)
        flex = int(fact(layout, "groups_per_flex", "flex_bg_size") or 1)
        # data after the tables of the first flex group, where mke2fs puts them
        base = int(itab) + table_blocks * flex
        window = np.arange(n, dtype=np.int64) // per_window
        first = np.ones(n, bool)
        first[1:] = window[1:] != window[:-1]
        # per object: its inode window when it opens one, then its data
        per = first.astype(np.int64) + 1
        at = np.zeros(n + 1, np.int64)
        np.cumsum(per, out=at[1:])
        start = np.zeros(int(at[-1]), np.int64)
        length = np.zeros(int(at[-1]), np.int64)
        w = at[:-1][first]
        start[w] = int(itab) + window[first] * INODE_READAHEAD_BLOCKS
        length[w] = np.minimum(INODE_READAHEAD_BLOCKS, table_blocks * flex)
        start[at[1:] - 1] = base + data_start
        length[at[1:] - 1] = blocks
    keep = length > 0
    return Requests(start[keep], length[keep])


def model_seconds(reads: Requests, block_size: int, model: str) -> float:
    """Seconds the requests take on disk model ``model``, in order, the first paying an
    average access."""
    keep = reads.length > 0
    bs = int(block_size)
    ms = get_model(model).service_ms(reads.start[keep] * bs, reads.length[keep] * bs)
    return float(ms.sum()) / 1000.0


def scan_profile(reads: Requests, block_size: int) -> dict[str, Any]:
    """Seconds on each of ``SCAN_MODELS``, requests that seek and blocks read."""
    sc = request_score(reads.start, reads.length)
    return {
        "seconds": {m: model_seconds(reads, block_size, m) for m in SCAN_MODELS},
        "seeks": int(sc["discontiguous"]),
        "blocks": int(sc["blocks"]),
    }


@dataclass
class ScanModel:
    """Modeled cold path-order scans of the original, the recreation and a plain copy (each
    ``scan_profile``), and the criterion on ``JUDGED_MODEL``."""

    original: dict[str, Any]
    recreated: dict[str, Any]
    copy: dict[str, Any] | None = None
    copy_source: str | None = None
    #: The snapshot's files laid out contiguously in path order: the bound no copy beats.
    contiguous: dict[str, Any] | None = None

    def ratio(self, side: str, model: str = JUDGED_MODEL) -> float | None:
        """``side``'s modeled time over the original's (None: not known)."""
        got = getattr(self, side)
        base = self.original["seconds"].get(model)
        if got is None or not base or got["seconds"].get(model) is None:
            return None
        return float(got["seconds"][model]) / float(base)

    def applies(self) -> bool | None:
        """Whether the criterion applies: the copy's time outside the band (None: no copy)."""
        r = self.ratio("copy")
        return None if r is None else abs(r - 1.0) > SCAN_BAND

    def within(self) -> bool | None:
        """Whether the recreation's time is within the band of the original's."""
        r = self.ratio("recreated")
        return None if r is None else abs(r - 1.0) <= SCAN_BAND

    def status(self) -> str:
        """One of: met, MISSED, does not apply (the copy is within the band), unknown."""
        a = self.applies()
        if a is None:
            return "unknown"
        if not a:
            return "does not apply"
        return "met" if self.within() else "MISSED"

    def reason(self) -> str | None:
        """The verdict's reason when the criterion applies and is missed."""
        if self.status() != "MISSED":
            return None
        return (
            f"modeled scan time ({JUDGED_MODEL}): {self.ratio('recreated'):.3f} of the "
            f"original's, band {SCAN_BAND:.0%}, a plain copy {self.ratio('copy'):.3f}"
        )

    def line(self) -> str:
        def sec(side: dict[str, Any] | None, m: str) -> str:
            return "-" if side is None else f"{side['seconds'][m]:.2f} s"

        def rat(side: str, m: str) -> str:
            r = self.ratio(side, m)
            return "-" if r is None else f"{r:.3f}"

        parts = [
            f"{m} original {sec(self.original, m)}, recreated {sec(self.recreated, m)} "
            f"({rat('recreated', m)}), plain copy {sec(self.copy, m)} ({rat('copy', m)}), "
            f"contiguous {sec(self.contiguous, m)} ({rat('contiguous', m)})"
            for m in SCAN_MODELS
        ]
        seeks = f"seeks {self.original['seeks']:,} / {self.recreated['seeks']:,} / " + (
            "-" if self.copy is None else f"{self.copy['seeks']:,}"
        )
        crit = {
            "met": f"recreation within {SCAN_BAND:.0%} of the original: met",
            "MISSED": f"recreation outside {SCAN_BAND:.0%} of the original: MISSED",
            "does not apply": f"does not apply (the plain copy is within {SCAN_BAND:.0%})",
            "unknown": "unknown (no plain copy: a noise floor measured at this snapshot has one)",
        }[self.status()]
        copy = f"; copy: {self.copy_source}" if self.copy_source else ""
        return (
            f"modeled cold path-order scan: {'; '.join(parts)}; {seeks}; "
            f"criterion ({JUDGED_MODEL}): {crit}{copy}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "original": self.original,
            "recreated": self.recreated,
            "copy": self.copy,
            "copy_source": self.copy_source,
            "contiguous": self.contiguous,
            "ratio_contiguous": self.ratio("contiguous"),
            "judged_model": JUDGED_MODEL,
            "band": SCAN_BAND,
            "ratio_recreated": self.ratio("recreated"),
            "ratio_copy": self.ratio("copy"),
            "applies": self.applies(),
            "within": self.within(),
            "status": self.status(),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> ScanModel | None:
        if not data:
            return None
        return cls(
            data["original"],
            data["recreated"],
            data.get("copy"),
            data.get("copy_source"),
            data.get("contiguous"),
        )


def scan_model(
    original: Layout,
    recreated: Layout,
    reads: tuple[Requests, Requests] | None = None,
    copy: dict[str, Any] | None = None,
) -> ScanModel:
    """The modeled scans of ``original`` and ``recreated`` (``reads``: their path reads when
    already modeled), with a plain copy's (``copy``: its ``scan_profile``, None: unknown) and
    the contiguous bound of the original's tree."""
    ra, rb = reads or (path_reads(original), path_reads(recreated))
    bs = original.facts.block_size
    return ScanModel(
        scan_profile(ra, bs),
        scan_profile(rb, recreated.facts.block_size),
        copy,
        None if copy is None else COPY_FROM_FLOOR,
        scan_profile(contiguous_reads(original), bs),
    )


__all__ = [
    "COPY_FROM_FLOOR",
    "JUDGED_MODEL",
    "SCAN_BAND",
    "SCAN_MODELS",
    "ScanModel",
    "contiguous_reads",
    "model_seconds",
    "path_reads",
    "scan_model",
    "scan_profile",
]
