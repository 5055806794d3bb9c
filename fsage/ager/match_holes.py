"""The order of the matcher's fill around its spacers (``fsage age T --match``): spacer files
are written where the target has holes and deleted once their neighbours are placed, so no
spacer may follow another of its allocation class (they would leave one hole of both sizes);
wall files of the class make up for too few whole files to follow.

``match_fill`` draws the plan and writes it.
"""

from __future__ import annotations

import random

from fsage.ager.match_disk import Disk

#: ext4's kernel allocator serves files of at most this many blocks from per-CPU group
#: preallocations (its ``mb_stream_req``), larger ones where the large files go.
SMALL = 16

#: A planned write of the fill: (kind, size bucket or spacer blocks, blocks).
Item = tuple[str, int, int]


class SpacerOrder:
    """The fill's order of spacers, walls and files (a part of ``MatchWriter``)."""

    disk: Disk
    rng: random.Random

    def _small_class(self, blocks: int) -> bool:
        """Whether ext4's kernel allocator puts a file of ``blocks`` blocks with the other
        small files (per-CPU group preallocations, files of at most ``SMALL`` blocks) rather
        than where the large files go; elsewhere all files are one class."""
        return self.disk.kind == "ext4" and not self.disk.can_place and blocks <= SMALL

    def _walls_needed(self, items: list[Item]) -> list[Item]:
        """One-block wall files so that every spacer of a class can follow a whole file of
        its class (see ``_walled``). Among the large files (``wall+``) a wall is written one
        block past the small files' limit and all but its first block punched before
        writeback: the allocator places it among the large files, and it holds one block (a
        wall of the large files' size would take the blocks of files the fill then leaves
        out, a path-order read of fewer files than the target's)."""
        out: list[Item] = []
        for small in (True, False):
            cls = [it for it in items if self._item_small(it) == small]
            spacers = sum(1 for it in cls if it[0].startswith("spacer"))
            hosts = sum(1 for it in cls if it[0] == "whole")
            wall = "wall" if small or not self._small_class(1) else "wall+"
            out += [(wall, 0, 1)] * max(spacers - hosts, 0)
        return out

    def _item_small(self, it: Item) -> bool:
        return it[0] not in ("spacer+", "wall+") and self._small_class(it[2])

    def _trim(self, head: list[Item], rest: list[Item], room: float) -> list[Item]:
        """``rest`` without files drawn at random until its files, the walls it needs and
        ``head``'s files fit in ``room`` blocks."""
        rest = list(rest)

        def over() -> float:
            files = sum(b for kind, _v, b in head + rest if kind != "spacer")
            return files + sum(b for _k, _v, b in self._walls_needed(rest)) - room

        excess = over()
        while excess > 0:
            idx = [i for i, it in enumerate(rest) if it[0] != "spacer"]
            if not idx:
                break
            self.rng.shuffle(idx)
            drop: set[int] = set()
            for i in idx:
                if excess <= 0:
                    break
                drop.add(i)
                excess -= rest[i][2]
            rest = [it for i, it in enumerate(rest) if i not in drop]
            excess = over()
        return rest

    def _spacers_among_large(self, items: list[Item]) -> list[Item]:
        """Where small spacers outnumber the small files and the large files outnumber the
        large spacers (a mail target's holes of a few blocks among mails of a few dozen),
        small spacers are made large (``spacer+``: written one block past the small files'
        limit and the rest punched before writeback, so that the allocator places their
        blocks among the large files), to follow large files instead of walls."""
        small_sp = [i for i, it in enumerate(items) if it[0] == "spacer" and self._item_small(it)]
        small_hosts = sum(1 for it in items if it[0] == "whole" and self._item_small(it))
        large_sp = sum(1 for it in items if it[0] == "spacer" and not self._item_small(it))
        large_hosts = sum(1 for it in items if it[0] == "whole" and not self._item_small(it))
        n = min(len(small_sp) - small_hosts, large_hosts - large_sp)
        if n <= 0:
            return items
        out = list(items)
        for i in self.rng.sample(small_sp, n):
            out[i] = ("spacer+", out[i][1], out[i][2])
        return out

    def _walled(self, items: list[Item]) -> list[Item]:
        """``items`` in an order where no spacer follows another spacer of its class: the
        allocator puts a class's files side by side in the order written (on ext4, small
        files in per-CPU preallocations, large ones where the large files go), so two
        spacers in a row would leave one hole of both sizes once deleted. Each spacer comes
        after a whole file of its class (interleaved files are placed when written, not at
        writeback, and so bound nothing); where there are fewer whole files than spacers,
        wall files of the class make up the difference (they stay, small, as files of the
        matcher's). The classes' orders are then merged at random."""
        items = self._spacers_among_large(items)
        walls = self._walls_needed(items)
        seqs: list[list[Item]] = []
        for small in (True, False):
            cls = [it for it in items + walls if self._item_small(it) == small]
            sp = [it for it in cls if it[0].startswith("spacer")]
            others = [it for it in cls if not it[0].startswith("spacer")]
            self.rng.shuffle(others)
            hosts = [i for i, it in enumerate(others) if it[0] in ("whole", "wall", "wall+")]
            after = set(self.rng.sample(hosts, min(len(sp), len(hosts))))
            left = iter(sp)
            seq: list[Item] = []
            for i, it in enumerate(others):
                seq.append(it)
                if i in after:
                    seq.append(next(left))
            seq += list(left)  # none: the walls made up the difference
            seqs.append(seq)
        out: list[Item] = []
        a, b = seqs
        ia = ib = 0
        while ia < len(a) or ib < len(b):
            left_a, left_b = len(a) - ia, len(b) - ib
            if left_b == 0 or (left_a and self.rng.random() * (left_a + left_b) < left_a):
                out.append(a[ia])
                ia += 1
            else:
                out.append(b[ib])
                ib += 1
        return out
