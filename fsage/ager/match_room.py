"""Where the matcher's fill can make the target's largest holes (``fsage age T --match``):
an allocation group kept empty, or spacers as large as the allocator keeps whole.

A part of ``match_fill.MatchWriter``.
"""

from __future__ import annotations

from fsage.ager.match_disk import Disk
from fsage.ager.match_target import LayoutTarget, measure


class SpacerRoom:
    """The fill's room for its largest holes (a part of ``MatchWriter``)."""

    disk: Disk
    target: LayoutTarget
    bs: int
    total: int
    _largest: int | None

    def _keep_a_group_empty(self) -> None:
        """Where free extents are bounded by regions (xfs allocation groups) and files are
        spread over all of them, each region keeps a share of the free space: a target whose
        largest free extents are larger than that share is reached only by keeping one region
        free of new files (the last: the first holds the log)."""
        d = self.disk
        want = self.target.free_fractions()
        if not d.groups or d.groups < 2 or not want:
            return
        free_after = (1.0 - self.target.fullness) * self.total
        top = max(want)
        if not (
            want[top] * free_after >= 1 << top > free_after / d.groups
            and 1 << top <= d.group_blocks
        ):
            return
        d.keep_group_empty(d.groups - 1)

    def _spacer_limit(self) -> int:
        """The largest spacer (in blocks) the allocator keeps whole: written, a quarter of an
        ext block group (8 x block size blocks; writeback splits more); allocated at once
        (fallocate, on the kernel), half a group."""
        if self.disk.can_fallocate and not self.disk.can_place:
            return 4 * self.bs
        return 2 * self.bs

    def _top_as_spacer(self, k: int, blocks: float) -> bool:
        """Whether the holes of the largest bucket ``k`` (``blocks`` in all) can be spacers:
        where the allocator keeps a spacer of the bucket's largest size whole, or, allocated
        at once (the large spacers first) on an empty disk of a few block groups, one of the
        largest the plan draws (at most ``blocks``) fits in a group less a sixteenth (a
        1 KiB-block target's one hole of 5,000 blocks, a 4 KiB one's of 30,600: the unwritten
        rest of the disk is split among the groups the files go to, and no file of the
        matcher's is large enough to punch such a hole into)."""
        if 2 << k <= self._spacer_limit():
            return True
        largest = min((2 << k) - 1, round(blocks))
        group = 8 * self.bs
        if not (self.disk.can_fallocate and self.disk.can_punch and not self.disk.can_place):
            return False
        if self.total >= 3 * group:
            # Or larger than a group, where the empty disk has a free extent across groups
            # that holds it (a git-aged 1 GiB target's files in its first five groups, the
            # next two one hole of 65,407 blocks: the files went to every group): fallocated
            # first, the allocator gives it nearly whole (63,488 blocks, the rest nearby).
            return largest <= group - group // 16 or group < largest <= self._largest_free()
        # A disk of one or two groups (a 256 MiB ext4: its inode tables fill the start of the
        # first, its journal the start of the second): a hole of more than half a group is
        # left by the files going around it. The spacer is allocated first, whole, where the
        # empty disk has a free extent that holds it and its wall block with room to spare.
        return largest + 1 <= self._largest_free() - group // 16

    def _largest_free(self) -> int:
        """The disk's largest free extent when the fill began, in blocks."""
        if self._largest is None:
            free_len = measure(self.disk.layout()).free_len
            self._largest = int(free_len.max()) if len(free_len) else 0
        return self._largest
