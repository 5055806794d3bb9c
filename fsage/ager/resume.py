"""A resumed generated run is the same run: its generator is rebuilt, not approximated.

A generated stream depends on the profile, the seed, the tree the run started on and what the
generator's probes (statvfs of the target) returned. ``fsage age`` keeps the last two beside
the journal (``….start.json`` and ``….probes``, one line per probe). ``--resume`` makes a new
generator from the same start, feeds it the probes of the interrupted run in order, and runs it
through the journal without running anything: an op the journal holds took effect, one it does
not hold ran out of space (the generator hears so, as it did then). The generator is then in
the state it had after the last journaled op — random state, names, model of the tree, steering
histograms, the op bursts of write patterns — and goes on with the ops the uninterrupted run
would have made.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from fsage.ager.generator import Generator
from fsage.ager.reconcile import Tree
from fsage.errors import FsageError
from fsage.workload import Op

Probe = Callable[[], tuple[int, int, int]]

#: Ops the generator may make in a row that the journal does not hold (ops that ran out of
#: space) before the journal is taken not to follow from the generator.
MAX_MISSES = 4096


class ReplayError(FsageError):
    """The journal is not what this generator makes (another fsage, profile or start)."""


def probes_path(journal: Path) -> Path:
    """Where the probes of the run journaled in ``journal`` are kept."""
    return journal.with_name(journal.name.removesuffix(".ops.jsonl") + ".probes")


#: A probe's used blocks are rounded to this fraction of the file system (see ProbeLog).
QUANTUM_FRACTION = 1024


def quantized(value: tuple[int, int, int]) -> tuple[int, int, int]:
    """(block size, total, used) with used rounded to the nearest 1/QUANTUM_FRACTION of
    total: the figure the generator steers by, the same in two runs whose kernels disagree by
    a few blocks."""
    bs, total, used = value
    q = max(1, total // QUANTUM_FRACTION)
    return bs, total, min(total, (used + q // 2) // q * q)


class ProbeLog:
    """A generator's probe that keeps what each probe returned, one line per probe; a resumed
    run is first answered from the lines the interrupted run left, then by the target.

    The live figure is quantized (``quantized``): a mounted kernel file system's used-block
    count after the same ops is not the same from run to run. It depends on when the journal
    last committed (blocks freed by a delete count as used until then) and when writeback
    allocated the delayed blocks (and their extent blocks), so two runs of one seed, stopped
    or not, read counts a block or a few apart at a few percent of their probes (measured on
    96 MiB ext4 images: 14 of 26 pairs of runs, with or without a kill, had a probe differ, by
    1 to 30 blocks). A generator decision near its threshold then went the other way. The
    model carries the run between probes, so rounding to 0.1% of the file system costs the
    steering nothing that matters, and the same ops give the same probes but where a count lies
    at a rounding boundary (a probe then differed in 2 of 24 pairs). So a run on a mounted
    ext4, xfs or btrfs image probes only at its start and after ENOSPC, after a sync, and its
    generator models the rest (``Generator.capacity_blocks``, ``fsage.ager.genmodel``): the
    same seed then makes the same ops.
    """

    def __init__(self, path: Path, live: Probe, *, resume: bool) -> None:
        self.path = path
        self.live = live
        self.logged: list[tuple[int, int, int]] = []
        self.pos = 0
        flags = os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW
        try:
            if resume:
                with open(path, "rb") as fh:
                    data = fh.read()
                end = data.rfind(b"\n") + 1  # a torn last line was never used
                for line in data[:end].splitlines():
                    bs, total, used = (int(x) for x in line.split())
                    self.logged.append((bs, total, used))
                self.fd = os.open(path, flags)
                os.ftruncate(self.fd, end)
                os.lseek(self.fd, end, os.SEEK_SET)
            else:
                self.fd = os.open(path, flags | os.O_CREAT | os.O_TRUNC, 0o600)
        except (OSError, ValueError) as exc:
            raise FsageError(f"cannot use the probe log {path}: {exc}") from None

    @staticmethod
    def usable(path: Path) -> bool:
        """True when ``path`` is a probe log a resume can replay from."""
        return path.is_file() and not path.is_symlink()

    def __call__(self) -> tuple[int, int, int]:
        if self.pos < len(self.logged):
            self.pos += 1
            return self.logged[self.pos - 1]
        value = quantized(self.live())
        try:
            os.write(self.fd, f"{value[0]} {value[1]} {value[2]}\n".encode())
        except OSError as exc:
            raise FsageError(f"cannot write the probe log {self.path}: {exc.strerror}") from None
        return value

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def tree_entries(tree: Tree, *, regular_only: bool) -> list[tuple[str, bool, int]]:
    """(path, is_dir, size) of a tree's directories and files (``regular_only``: no symlinks
    or special files), as ``Generator.adopt`` and ``Generator.reserve`` take them."""
    return [
        (p, n.kind == "d", n.size)
        for p, n in sorted(tree.items())
        if n.kind in ("d", "f") or not regular_only
    ]


def replay(gen: Generator, journaled: Iterable[Op]) -> Iterator[Op]:
    """Run ``gen`` through the ops a journal holds (see the module doc); returns its stream,
    positioned after the last of them."""
    ops = gen.ops()
    for n, want in enumerate(journaled):
        misses = 0
        while True:
            op = next(ops, None)
            if op is None:
                raise ReplayError(
                    f"the journal holds more ops than the generator makes ({n:,} matched)"
                )
            if op == want:
                break
            misses += 1
            if misses > MAX_MISSES:
                raise ReplayError(
                    f"the journal's op {n + 1:,} ({want.op} {want.path!r}) is not one the "
                    "generator makes"
                )
            gen.nospace(op)
    return ops
