"""The synthetic streams of seed 001's cleaning experiments, as workload generator modes:
``random-update`` (fill to ``profile.fill``, then random one-block overwrites) and
``prefragment`` (8-block keepers left evenly spread by deleting the spacers between them)."""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Callable, Iterator

from fsage.ager.genmodel import GenStats, _blocks, _File
from fsage.ager.profile import Profile
from fsage.errors import WorkloadError
from fsage.workload import Op


class SyntheticStreams:
    """The ``random-update`` and ``prefragment`` modes of ``Generator``, which holds the
    state declared here."""

    profile: Profile
    stats: GenStats
    rng: random.Random
    bs: int
    files: dict[str, _File]
    dir_names: dict[str, set[str]]
    _force_deletes: int
    _undo: Callable[[], None] | None
    # Generator's capacity and namespace model.
    capacity_blocks: Callable[[], tuple[int, int]]
    fullness: Callable[[], float]
    _free_bytes: Callable[[], int]
    _add_dir: Callable[[str, str, str], None]
    _add_file: Callable[[str, str, int], str]
    _drop_file: Callable[[str], _File]
    _dropper: Callable[[str], Callable[[], None]]

    def _free_root_name(self, base: str, prefix: bool = False) -> str:
        """``base``, or ``base.2``, ``base.3``, ... : the first not in use at the root (as a
        name, or with ``prefix`` as the start of one), for profiles with fixed names."""
        taken = self.dir_names[""]
        for n in range(1, 1 << 30):
            cand = base if n == 1 else f"{base}.{n}"
            if prefix and not any(t.startswith(cand) for t in taken):
                return cand
            if not prefix and cand not in taken:
                return cand
        raise WorkloadError(f"no free name for {base!r}")  # pragma: no cover

    # ---- random update (seed 001 §5.2.1.1)

    def _random_update(self) -> Iterator[Op]:
        p = self.profile
        st = self.stats
        chunk = 16 * 1024 * 1024
        top = self._free_root_name("ru")
        self._mkdir_fixed(top)
        yield Op("mkdir", top)
        paths: list[str] = []
        while self.fullness() < p.fill:
            total, used = self.capacity_blocks()
            want = (math.ceil(p.fill * total) - used) * self.bs
            size = max(self.bs, min(chunk, want, self._free_bytes()))
            if self._force_deletes or size <= 0:
                break
            path = self._add_file(top, f"f{len(paths):06d}", size)
            paths.append(path)
            self._undo = self._dropper(path)
            yield Op("create", path, size=size)
        st.phase = "churn"
        st.fill_ops, st.fill_bytes = st.ops, st.bytes_written
        blocks = [_blocks(self.files[q].size, self.bs) for q in paths if q in self.files]
        live = [q for q in paths if q in self.files]
        if not live:
            return
        cum: list[int] = []
        acc = 0
        for b in blocks:
            acc += b
            cum.append(acc)
        updates = int(p.update_factor * acc)
        for _ in range(updates):
            g = self.rng.randrange(acc)
            i = bisect.bisect_right(cum, g)
            first = cum[i - 1] if i else 0
            self._undo = None
            yield Op("overwrite", live[i], size=self.bs, offset=(g - first) * self.bs)

    def _mkdir_fixed(self, path: str) -> None:
        self._add_dir("", path, path)

    # ---- pre-fragmentation (seed 001 §6.3)

    def _prefragment(self) -> Iterator[Op]:
        """Keep ``fill`` of the disk in 8-block chunks spread evenly: write 8-block keepers
        alternating with spacers over the whole disk, then delete the spacers."""
        p = self.profile
        st = self.stats
        keep = 8 * self.bs
        spacer = max(self.bs, round(8 * (1 - p.fill) / p.fill) * self.bs)
        per_dir = 1024
        spacers: list[str] = []
        kept_blocks = 0
        i = 0
        d = ""
        base = self._free_root_name("pf", prefix=True)
        while True:
            total, _ = self.capacity_blocks()
            if kept_blocks >= p.fill * total or self.fullness() >= 0.97:
                break
            if self._force_deletes:
                break
            if i % per_dir == 0:
                d = f"{base}{i // per_dir:05d}"
                self._mkdir_fixed(d)
                self._undo = None
                yield Op("mkdir", d)
            path = self._add_file(d, f"k{i:07d}", keep)
            self._undo = self._dropper(path)
            yield Op("create", path, size=keep)
            if path not in self.files:
                break
            kept_blocks += 8
            sp = self._add_file(d, f"s{i:07d}", spacer)
            self._undo = self._dropper(sp)
            yield Op("create", sp, size=spacer)
            if sp not in self.files:
                break
            spacers.append(sp)
            i += 1
        st.phase = "churn"
        st.fill_ops, st.fill_bytes = st.ops, st.bytes_written
        for sp in spacers:
            self._drop_file(sp)
            self._undo = None
            yield Op("delete", sp)
