"""The matcher's fill against a disk of its own: what it leaves behind when the disk runs out
of space part of the way (no spacer of its stays: they are the target's free space)."""

from __future__ import annotations

import errno

from fsage.ager.match_disk import Disk
from fsage.ager.match_fill import MatchWriter
from fsage.ager.match_target import LayoutTarget


class _Disk(Disk):
    """Files as block counts; interleaving fewer than four files runs out of space."""

    def __init__(self) -> None:
        self._start_journal()
        self.bs, self.total = 4096, 1 << 16
        self.files: dict[str, int] = {}
        self.next_ino = 12

    def _add(self, rel: str, size: int) -> int:
        self.files[rel] = -(-size // self.bs)
        self.next_ino += 1
        return self.next_ino

    def mkdir(self, rel: str) -> None:
        pass

    def create(self, rel: str, size: int, at_once: bool = False) -> int:
        return self._add(rel, size)

    def interleave(self, items: list[tuple[str, int]], chunk: int) -> list[int]:
        if len(items) < 4:
            self._add(items[0][0], items[0][1])  # half way through, as the kernel leaves it
            raise OSError(errno.ENOSPC, "No space left on device")
        return [self._add(rel, size) for rel, size in items]

    def unlink(self, rel: str) -> None:
        self.files.pop(rel, None)

    def punch(self, rel: str, offset: int, length: int) -> bool:
        self.files[rel] -= length // self.bs
        return True

    def allocate(self, rel: str, size: int, near: int | None = None) -> int | None:
        return self._add(rel, size)

    def fullness(self) -> float:
        return sum(self.files.values()) / self.total


def test_a_fill_that_runs_out_of_space_at_its_last_files_still_deletes_its_spacers() -> None:
    # 402 fragmented files of 2 blocks: written four at a time, the last two on their own.
    target = LayoutTarget(4096, 1 << 16, 0.3, {1: (402, 0.0)}, {3: 4000}, "t")
    disk = _Disk()
    writer = MatchWriter(disk, target, seed=1)
    writer.fill()
    assert not [rel for rel in disk.files if rel.startswith("s")]
    assert set(writer.sizes) == set(disk.files)  # the file cut short is gone too
    assert sum(1 for rel in disk.files if rel.startswith("d")) >= 400


def test_a_dynamic_score_no_round_reached_gets_the_steerings_reason() -> None:
    # When the first round already has everything but the path-order score, no round speaks
    # of locality: the reason must still say why (the steering's word), not only the numbers.
    from fsage.ager.match import _reasons

    rep = {
        "buckets": [],
        "free_ok": True,
        "dynamic_ok": False,
        "locality": {"dynamic_score": 0.888},
        "target_locality": {"dynamic_score": 0.839},
    }
    seen: list[tuple[float, float]] = []

    def why(have: float, want: float) -> str:
        seen.append((have, want))
        return "set by the fill's order only"

    assert _reasons(rep, {}, why) == {"locality": "set by the fill's order only"}
    assert seen == [(0.888, 0.839)]
    # A round's own word wins; without a steering, the numbers are said.
    assert _reasons(rep, {"locality": "moved"}, why)["locality"] == "moved"
    assert "0.888 against 0.839" in _reasons(rep, {})["locality"]
