"""The tree walks of the ``scan`` suite: read every file of a tree in path order, push a tree's
files out of the page cache, copy a tree in path order with one writer, and judge an aged/clean
pair of timings.

Path order is the order of a recursive walk, as grep -r, tar or a backup reads a tree: depth
first, each directory before its entries, entries by name (byte order), symbolic links not
followed, other file systems not entered. It is the order :func:`fsage.analyzer.dynamic.walk_order`
models.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fsage.replay.bench.paired import CONFIDENCE, paired_effect

READ_CHUNK = 1 << 20
MB = 1_000_000


@dataclass
class ScanRead:
    """One cold read of a tree."""

    seconds: float
    bytes: int = 0
    files: int = 0
    dirs: int = 0
    #: The traced requests' dynamic layout score and counts (see fsage.trace), when traced.
    trace: dict[str, Any] | None = None

    @property
    def mb_per_s(self) -> float:
        return self.bytes / MB / self.seconds if self.seconds > 0 else 0.0


def _entries(path: bytes) -> list[os.DirEntry[bytes]]:
    with os.scandir(path) as it:
        return sorted(it, key=lambda e: e.name)


def walk_path_order(root: Path) -> Iterator[tuple[os.DirEntry[bytes], os.stat_result]]:
    """Every entry below ``root`` in path order (see the module doc), with its lstat."""
    top = os.lstat(root).st_dev
    stack = [iter(_entries(os.fsencode(root)))]
    while stack:
        e = next(stack[-1], None)
        if e is None:
            stack.pop()
            continue
        st = e.stat(follow_symlinks=False)
        if st.st_dev != top:
            continue
        yield e, st
        if stat.S_ISDIR(st.st_mode):
            stack.append(iter(_entries(e.path)))


def read_tree(root: Path) -> ScanRead:
    """Read every regular file below ``root`` whole, in path order; the time it took (the walk
    included: reading directories and inodes is part of a scan)."""
    buf = bytearray(READ_CHUNK)
    view = memoryview(buf)
    out = ScanRead(0.0)
    t0 = time.perf_counter()
    for e, st in walk_path_order(root):
        if stat.S_ISDIR(st.st_mode):
            out.dirs += 1
        elif stat.S_ISREG(st.st_mode):
            out.files += 1
            with open(e.path, "rb", buffering=0) as fh:
                while n := fh.readinto(view):
                    out.bytes += n
    out.seconds = time.perf_counter() - t0
    return out


def evict_tree(root: Path) -> int:
    """posix_fadvise(DONTNEED) every regular file below ``root``: their pages leave the page
    cache where nothing holds them (what an unprivileged user can do to read cold); the
    number of files advised."""
    n = 0
    for e, st in walk_path_order(root):
        if stat.S_ISREG(st.st_mode):
            with contextlib.suppress(OSError):
                fd = os.open(e.path, os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    n += 1
                finally:
                    os.close(fd)
    return n


@dataclass
class CopyStats:
    files: int = 0
    dirs: int = 0
    symlinks: int = 0
    bytes: int = 0
    #: Entries a copy cannot hold as they are: devices, sockets, FIFOs (left out), extra hard
    #: links (copied as files of their own).
    skipped: int = 0
    hard_links: int = 0
    notes: list[str] = field(default_factory=list)


def copy_tree(src: Path, dst: Path) -> CopyStats:
    """Copy the tree ``src`` into the existing directory ``dst`` in path order with one
    writer: each directory made before its entries, each file written whole, front to back,
    before the next is created. Modes are kept; symbolic links are copied as links."""
    out = CopyStats()
    buf = bytearray(READ_CHUNK)
    view = memoryview(buf)
    src_b, dst_b = os.fsencode(src), os.fsencode(dst)
    seen: set[int] = set()
    for e, st in walk_path_order(src):
        rel = os.path.relpath(e.path, src_b)
        to = os.path.join(dst_b, rel)
        mode = stat.S_IMODE(st.st_mode)
        if stat.S_ISDIR(st.st_mode):
            # mkfs made some (lost+found): kept, with the source's mode
            if not os.path.isdir(to):
                os.mkdir(to, 0o700)
            os.chmod(to, mode)
            out.dirs += 1
        elif stat.S_ISLNK(st.st_mode):
            os.symlink(os.readlink(e.path), to)
            out.symlinks += 1
        elif stat.S_ISREG(st.st_mode):
            if st.st_nlink > 1:
                if st.st_ino in seen:
                    out.hard_links += 1
                seen.add(st.st_ino)
            with open(e.path, "rb", buffering=0) as fin:
                fd = os.open(to, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                try:
                    while n := fin.readinto(view):
                        _write_all(fd, view[:n])
                        out.bytes += n
                finally:
                    os.close(fd)
            os.chmod(to, mode)
            out.files += 1
        else:
            out.skipped += 1
    if out.skipped:
        out.notes.append(f"{out.skipped} special files (devices, FIFOs, sockets) not copied")
    if out.hard_links:
        out.notes.append(f"{out.hard_links} extra hard links copied as files of their own")
    return out


def _write_all(fd: int, buf: memoryview) -> None:
    while buf:
        n = os.write(fd, buf)
        buf = buf[n:]


# ---------------------------------------------------------------------------- the verdict


def relative_spread(values: Sequence[float]) -> float:
    """(max - min) / median of the repeats, as every bench result reports it."""
    med = float(np.median(values))
    return (max(values) - min(values)) / med if med else 0.0


@dataclass
class AgedCleanVerdict:
    """The aged/clean ratio of paired scan times (one scan of each tree per round), or why it
    cannot be told (see :mod:`.paired`)."""

    aged_median: float
    clean_median: float
    spread: float  # the wider relative spread of the two series (shown, not judged by)
    difference: float  # |paired ratio - 1|
    #: "slower" or "faster" (the aged tree against its clean copy), or "inconclusive".
    verdict: str
    reason: str
    #: Rounds in which the aged tree read slower.
    slower_rounds: int = 0
    rounds: int = 0
    #: The median of the rounds' aged/clean ratios, and its interval (None: too few rounds).
    paired_ratio: float = 0.0
    ci_low: float | None = None
    ci_high: float | None = None
    confidence: float = CONFIDENCE

    @property
    def ratio(self) -> float | None:
        """The ratio where it is conclusive; None where its interval includes 1."""
        if self.verdict == "inconclusive":
            return None
        return self.paired_ratio

    def interval_text(self) -> str:
        if self.ci_low is None or self.ci_high is None:
            return "no interval"
        return f"{self.confidence:.0%} interval {self.ci_low:.3f}-{self.ci_high:.3f}"

    def text(self) -> str:
        rounds = f"; aged slower in {self.slower_rounds} of {self.rounds} rounds"
        if self.ratio is None:
            return (
                f"inconclusive (paired ratio {self.paired_ratio:.3f}, {self.interval_text()}: "
                f"{self.reason}{rounds})"
            )
        return (
            f"{self.ratio:.3f} (the aged tree reads {self.difference:.1%} {self.verdict} than its "
            f"clean copy; {self.interval_text()}{rounds})"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "ratio": self.ratio,
            "paired_ratio": self.paired_ratio,
            "ci_low": self.ci_low,
            "ci_high": self.ci_high,
            "confidence": self.confidence,
            "verdict": self.verdict,
            "reason": self.reason,
            "aged_median_seconds": self.aged_median,
            "clean_median_seconds": self.clean_median,
            "spread": self.spread,
            "difference": self.difference,
            "aged_slower_rounds": self.slower_rounds,
            "rounds": self.rounds,
        }


def aged_clean_verdict(
    aged: Sequence[float], clean: Sequence[float], confidence: float = CONFIDENCE
) -> AgedCleanVerdict:
    """Conway's aged/clean ratio judged from paired rounds: ``aged[i]`` and ``clean[i]`` are
    the scans of round ``i``; the ratio is the median of the rounds' aged/clean ratios, called
    inconclusive where its sign-test interval includes 1 or there are too few rounds for one."""
    if not aged or not clean:
        raise ValueError("no scan times to compare")
    rounds = min(len(aged), len(clean))
    eff = paired_effect(aged[:rounds], clean[:rounds], confidence)
    word = {"higher": "slower", "lower": "faster"}.get(eff.verdict, "inconclusive")
    return AgedCleanVerdict(
        aged_median=float(np.median(aged)),
        clean_median=float(np.median(clean)),
        spread=max(relative_spread(aged), relative_spread(clean)),
        difference=abs(eff.ratio - 1.0),
        verdict=word,
        reason=eff.reason,
        slower_rounds=eff.higher_rounds,
        rounds=rounds,
        paired_ratio=eff.ratio,
        ci_low=eff.low,
        ci_high=eff.high,
        confidence=confidence,
    )
