"""The records behind the workload generator's model of the target: a file's size, birth and
buckets; the live files by birth op (a Fenwick tree, for age histograms); bags that pick a
random member deterministically; and the stream's running statistics."""

from __future__ import annotations

import bisect
import random
from dataclasses import dataclass, field


@dataclass
class _File:
    size: int
    born: int
    parent: str
    depth: int  # directories above the file (0: in the root), as Geriatrix counts depth
    bucket: int = -1  # size bucket in convergence mode
    dbucket: int = -1  # depth bucket in convergence mode
    slot: int = -1  # index in the age index
    grows: int = 0  # appends since it was empty (``ExtMeta``)
    holes: set[int] | None = None  # blocks punched out and not written since (``ExtMeta``)


class _AgeIndex:
    """Live files by birth op. Births are appended in creation order (so never decrease);
    a Fenwick tree over the slots counts the live ones, giving the number of live files born
    before any op and the k-th live file in birth order in O(log n)."""

    __slots__ = ("alive", "births", "cap", "paths", "tree")

    def __init__(self) -> None:
        self.births: list[int] = []
        self.paths: list[str] = []
        self.alive = bytearray()
        self.cap = 1024
        self.tree = [0] * (self.cap + 1)

    def _add(self, slot: int, delta: int) -> None:
        tree, cap = self.tree, self.cap
        i = slot + 1
        while i <= cap:
            tree[i] += delta
            i += i & -i

    def _grow(self) -> None:
        self.cap *= 2
        tree = [0] * (self.cap + 1)
        for i, a in enumerate(self.alive, 1):
            tree[i] += a
        for i in range(1, self.cap + 1):
            j = i + (i & -i)
            if j <= self.cap:
                tree[j] += tree[i]
        self.tree = tree

    def add(self, born: int, path: str) -> int:
        slot = len(self.births)
        if self.births and born < self.births[-1]:
            raise ValueError("births must not decrease")
        if slot >= self.cap:
            self._grow()
        self.births.append(born)
        self.paths.append(path)
        self.alive.append(1)
        self._add(slot, 1)
        return slot

    def revive(self, slot: int, path: str) -> None:
        self.paths[slot] = path
        if not self.alive[slot]:
            self.alive[slot] = 1
            self._add(slot, 1)

    def remove(self, slot: int) -> None:
        if self.alive[slot]:
            self.alive[slot] = 0
            self._add(slot, -1)

    def _prefix(self, n: int) -> int:
        """Live files among the first ``n`` slots."""
        tree = self.tree
        total = 0
        while n > 0:
            total += tree[n]
            n -= n & -n
        return total

    def born_before(self, op: float) -> int:
        """Live files born before ``op``."""
        return self._prefix(bisect.bisect_left(self.births, op))

    def sample(self, first: int, count: int, k: int, rng: random.Random) -> list[str]:
        """``k`` random live files (with repeats) among the ``count`` live ones after the
        first ``first`` in birth order: tries at random slots of their span, else an exact
        descent of the tree."""
        lo = self.slot_of(first)
        hi = self.slot_of(first + count - 1) + 1
        alive, paths = self.alive, self.paths
        out: list[str] = []
        for _ in range(k):
            for _ in range(4):
                s = rng.randrange(lo, hi)
                if alive[s]:
                    break
            else:
                s = self.slot_of(first + rng.randrange(count))
            out.append(paths[s])
        return out

    def slot_of(self, k: int) -> int:
        """The slot of the k-th (0-based) live file in birth order."""
        pos = 0
        step = self.cap
        tree = self.tree
        while step:
            nxt = pos + step
            if nxt <= self.cap and tree[nxt] <= k:
                pos = nxt
                k -= tree[nxt]
            step >>= 1
        return pos

    def kth(self, k: int) -> str:
        """The path of the k-th (0-based) live file in birth order."""
        return self.paths[self.slot_of(k)]


class _Bag:
    """A list with O(1) add, remove (swap with last) and deterministic random pick."""

    __slots__ = ("items", "pos")

    def __init__(self) -> None:
        self.items: list[str] = []
        self.pos: dict[str, int] = {}

    def add(self, key: str) -> None:
        if key not in self.pos:
            self.pos[key] = len(self.items)
            self.items.append(key)

    def remove(self, key: str) -> None:
        i = self.pos.pop(key, None)
        if i is None:
            return
        last = self.items.pop()
        if i < len(self.items):
            self.items[i] = last
            self.pos[last] = i

    def __len__(self) -> int:
        return len(self.items)

    def pick(self, rng: random.Random) -> str:
        return self.items[rng.randrange(len(self.items))]


@dataclass
class GenStats:
    ops: int = 0
    bytes_written: int = 0
    phase: str = "fill"
    fill_ops: int | None = None
    fill_bytes: int | None = None
    nospace: int = 0
    converged_at: int | None = None
    #: What ended the stream: "fill" (no churn asked), "churn" (the churn bytes were written),
    #: "ops-limit", "converged", "updates" (random-update),
    #: "prefragment"; empty while the stream runs.
    stopped_by: str = ""
    counts: dict[str, int] = field(default_factory=dict)


class ExtMeta:
    """The blocks an ext4 file system spends beyond file data and a directory's first block,
    as a function of the ops alone, for a generator that steers a mounted ext4 by its model
    (a kernel's own count varies from run to run). Two sources matter at a few percent full:

    - directories: an entry takes 8 bytes and its name rounded up to 4; a directory never
      shrinks, so its size is that of its peak; past one block it is an htree, an index block
      and leaves about 3/4 full after their splits;
    - extent blocks: a file written in one go gets few extents, each append after writeback
      may start another; past the 4 extents an inode holds, the tree takes a block per
      ``(bs - 12) // 12`` extents.

    Each method returns the change in blocks, which the generator adds to its used blocks.
    """

    __slots__ = ("bs", "live", "peak", "per")

    def __init__(self, bs: int) -> None:
        self.bs = bs
        self.per = (bs - 12) // 12
        self.live: dict[str, int] = {}
        self.peak: dict[str, int] = {}

    def _dir_blocks(self, size: int) -> int:
        """Blocks of a directory whose entries took ``size`` bytes, beyond the first."""
        if size <= self.bs - 24:  # the first block also holds "." and ".."
            return 0
        return 1 + -(-size // (self.bs * 3 // 4))

    def entry(self, parent: str, name: str, add: bool) -> int:
        rec = (8 + len(name.encode()) + 3) & ~3
        live = self.live.get(parent, 0) + (rec if add else -rec)
        self.live[parent] = live
        peak = self.peak.get(parent, 0)
        if live <= peak:
            return 0
        self.peak[parent] = live
        return self._dir_blocks(live) - self._dir_blocks(peak)

    def drop_dir(self, path: str) -> int:
        self.live.pop(path, None)
        return -self._dir_blocks(self.peak.pop(path, 0))

    def extents(self, grows: int) -> int:
        return 0 if grows < 4 else 1 + grows // self.per


def _blocks(size: int, bs: int) -> int:
    return (size + bs - 1) // bs
