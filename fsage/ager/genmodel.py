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
    pinned: int = 0  # blocks held beyond its data by copy-on-write (``BtrfsMeta``)
    base: int = 0  # blocks of the extent its first write made (``BtrfsMeta``)


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
    The subclasses model xfs and btrfs through the same methods.
    """

    __slots__ = ("bs", "live", "peak", "per")

    #: Overwrites allocate new blocks and keep the old ones while any part of their extent
    #: is still referenced (btrfs).
    cow = False

    def __init__(self, bs: int) -> None:
        self.bs = bs
        self.per = (bs - 12) // 12
        self.live: dict[str, int] = {}
        self.peak: dict[str, int] = {}

    def _rec(self, name: str) -> int:
        """Bytes a directory entry of ``name`` takes."""
        return (8 + len(name.encode()) + 3) & ~3

    def _dir_blocks(self, size: int) -> int:
        """Blocks of a directory whose entries took ``size`` bytes, beyond the first."""
        if size <= self.bs - 24:  # the first block also holds "." and ".."
            return 0
        return 1 + -(-size // (self.bs * 3 // 4))

    def entry(self, parent: str, name: str, add: bool) -> int:
        rec = self._rec(name)
        live = self.live.get(parent, 0) + (rec if add else -rec)
        self.live[parent] = live
        peak = self.peak.get(parent, 0)
        if live <= peak:
            return 0
        self.peak[parent] = live
        return self._dir_blocks(live) - self._dir_blocks(peak)

    def new_dir(self) -> int:
        """An empty directory's blocks beyond the one the generator counts for it."""
        return self._dir_blocks(0)

    def drop_dir(self, path: str) -> int:
        self.live.pop(path, None)
        return -self._dir_blocks(self.peak.pop(path, 0))

    def extents(self, grows: int) -> int:
        return 0 if grows < 4 else 1 + grows // self.per

    def regrow(self, old: int, new: int) -> int:
        """A file's extent count went from ``old`` to ``new`` appends since it was empty."""
        return self.extents(new) - self.extents(old)

    def inode(self, add: bool) -> int:
        """An inode was made (``add``) or freed: ext4's inode tables are made by mkfs."""
        return 0


class XfsMeta(ExtMeta):
    """xfs (v5, 512-byte inodes, directory blocks of one fs block):

    - inodes are allocated in chunks of 64 as needed, ``bs // 512`` to a block, and a chunk
      is freed with its last inode: counted at their share of a block;
    - a directory lives in its inode while its entries fit (about 336 bytes of short-form
      entries, 3/4 of the 8-byte-aligned data entries counted here), then in one block with
      its hash leaf, then in data blocks and leaf blocks (a data block freed only when empty:
      the peak is counted, as for ext4);
    - a file's extents live in its inode up to 21, then in a btree of
      ``(bs - 72) // 16`` extents a block.
    """

    __slots__ = ("inodes",)

    def __init__(self, bs: int) -> None:
        super().__init__(bs)
        self.per = (bs - 72) // 16
        self.inodes = 0

    def _rec(self, name: str) -> int:
        # inode number, name length, name, file type, tag: 8-byte aligned
        return (12 + len(name.encode()) + 7) & ~7

    def _dir_blocks(self, size: int) -> int:
        if size <= 336 * 4 // 3:
            return -1  # short form: no block at all
        if size * 4 // 3 + 72 <= self.bs:  # one block: entries, their leaf, the tail
            return 0
        data = -(-size // (self.bs - 64))
        leaves = -(-size // 3 // (self.bs - 64))
        return data + leaves + (leaves > 1) - 1

    def extents(self, grows: int) -> int:
        return 0 if grows < 21 else 1 + grows // self.per

    def inode(self, add: bool) -> int:
        per = self.bs // 512
        before = -(-self.inodes // per)
        self.inodes += 1 if add else -1
        return -(-self.inodes // per) - before


class BtrfsMeta(ExtMeta):
    """btrfs (16 KiB tree nodes, metadata DUP on one device, as mkfs.btrfs makes it): no
    blocks belong to one file or directory; its inode, names and extents are items in shared
    tree leaves, written twice, so each is counted as the bytes it takes in the leaves (at
    the leaves' usual fill) and the used blocks follow their sum. A file's data of up to 2 KiB
    lives in its leaf too, about a block once written twice: counted as its data block.
    Writes are copy-on-write (``cow``): see ``Generator._holes``."""

    __slots__ = ("bytes",)

    cow = True
    #: Leaf bytes of one item and its header, twice (DUP), at 3/4 leaf fill: an inode (inode
    #: item, the extent of its data and that extent's back reference), a directory entry
    #: (dir item, dir index, inode ref) and one more extent of a file.
    INODE = 2 * (185 + 78 + 80) * 4 // 3
    ENTRY = 2 * 3 * 45 * 4 // 3
    EXTENT = 2 * (78 + 80) * 4 // 3

    def __init__(self, bs: int) -> None:
        super().__init__(bs)
        self.bytes = 0

    def _add(self, delta: int) -> int:
        before = -(-self.bytes // self.bs)
        self.bytes += delta
        return -(-self.bytes // self.bs) - before

    def entry(self, parent: str, name: str, add: bool) -> int:
        size = self.ENTRY + 2 * len(name.encode())
        return self._add(size if add else -size)

    def new_dir(self) -> int:
        return -1  # its entries are items in the tree: no block of its own

    def drop_dir(self, path: str) -> int:
        return 1

    def regrow(self, old: int, new: int) -> int:
        return self._add((new - old) * self.EXTENT)

    def inode(self, add: bool) -> int:
        return self._add(self.INODE if add else -self.INODE)


#: The file system kinds whose metadata a generator can model (``Generator(meta=...)``).
META_MODELS: dict[str, type[ExtMeta]] = {"ext": ExtMeta, "xfs": XfsMeta, "btrfs": BtrfsMeta}


def _blocks(size: int, bs: int) -> int:
    return (size + bs - 1) // bs
