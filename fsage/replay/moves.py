"""The moves of a closed-loop replay's rounds, as ops on the recreation: rewrites of files (whole
under a temporary name and renamed over the old one, in alternating pieces, or mended at once),
free space shaped toward a snapshot's (files between free extents moved to join them, spacers
left as holes, a plug that holds the large free extents while files fill the small ones), and
the guard that keeps a full disk from cutting a file of the snapshot short. ``Mover`` holds the
state they share; ``fsage.replay.closedloop.Steerer`` decides, round by round, which to make."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable

from fsage.ager.match_target import FREE_TV, LayoutTarget, MeasuredState
from fsage.layout import Layout
from fsage.replay.changed import _File
from fsage.replay.freeshape import bucket_of_length, count_distance, join_windows, merge_windows
from fsage.replay.interval import IntervalChurn
from fsage.workload import NoSpaceError, Op, OpFailedError

#: Suffix of the temporary names inferred rewrites are written under.
TEMP_SUFFIX = ".fsage-inferred"
#: Files of fewer blocks ext4 packs in its per-CPU preallocation (mb_stream_req's default);
#: larger ones follow one another in the stream allocation.
STREAM_BLOCKS = 16
#: Rounds in a row without progress after which an interval's steering stops (a round's
#: Files may fill this share of a window whose small free extents are joined in a pressed
#: round (``merge_windows``): their new versions fill small free extents elsewhere.
MERGE_SHARE = 0.85
#: Spacers per round at most.
MAX_SPACERS = 64


class Mover:
    """The ops a round makes on the recreation (``run`` applies one and journals it), and what
    they are aimed by: the snapshot's free space and the recreation's last measurement."""

    def __init__(self, run: Callable[[Op], int]) -> None:
        self.run = run
        #: Nothing run since the last measurement, which unmounted and mounted the recreation.
        self.remounted = False
        #: The snapshot's free-space histogram (fractions of its free blocks) and the
        #: recreation's last measured state.
        self._want: dict[int, float] = {}
        self._target = LayoutTarget(0, 0, 0.0, {}, {})
        self._target_free: dict[int, int] = {}
        self._target_free_counts: dict[int, int] = {}
        self._state: MeasuredState | None = None
        #: Temporaries a full disk refused (deleted; never renamed over their file).
        self._lost: set[str] = set()
        self._path_cache: list[tuple[Layout, dict[int, list[str]]]] = []
        self._last: Layout | None = None
        #: Bytes the interval's spacers and their neighbours may still write (the steering
        #: sets it to its first round's step): they stand for temporaries and rewrites the
        #: interval hid, and a fresh file system's first interval, its free space one
        #: extent, asked for 21 MiB of them in one round where it hid 15 MiB in all.
        self.spacer_room = 1 << 62

    def _short(self, state: MeasuredState | None) -> dict[int, int]:
        """Free blocks the recreation lacks per free-extent bucket (log2 of the extent's
        length) against the snapshot, where the lack is worth a hole."""
        if state is None or not state.free_len.size:
            return {}
        have = state.target.free_fractions()
        total = int(state.free_len.sum())
        out = {}
        for k, w in self._want.items():
            lack = (w - have.get(k, 0.0)) * total
            if w - have.get(k, 0.0) > FREE_TV / 8 and lack >= 1 << k:
                out[k] = int(lack)
        if self._counts_off(state):
            # In pieces of other sizes than the snapshot's: the extents of the sizes it
            # lacks by count (as long as the snapshot's are).
            want_n = self._target_free_counts
            have_n = state.target.free_counts
            for k, n in want_n.items():
                lack_n = n - have_n.get(k, 0)
                if lack_n > 0:
                    mean = self._target_free.get(k, 0) / n
                    out[k] = max(out.get(k, 0), int(lack_n * mean))
        return out

    def _counts_off(self, state: MeasuredState) -> bool:
        """The recreation's free extents per bucket are farther from the snapshot's by count
        than the tolerance."""
        return count_distance(self._target, state.target) > FREE_TV

    def _excess(self, state: MeasuredState) -> dict[int, int]:
        """Free extents per bucket the recreation has more of than the snapshot, where its
        counts are off and it is in more pieces in all ({} where not, or the excess is a few
        extents): joining them would take a free space in fewer pieces farther."""
        want_n = self._target_free_counts
        have = sum(state.target.free_counts.values())
        if not self._counts_off(state) or have <= sum(want_n.values()):
            return {}
        out = {k: n - want_n.get(k, 0) for k, n in state.target.free_counts.items()
               if n > want_n.get(k, 0)}  # fmt: skip
        return out if sum(out.values()) >= max(sum(want_n.values()) // 50, 2) else {}

    def _paths(self, layout: Layout) -> dict[int, list[str]]:
        """``layout.paths()``, kept for the layouts in use (the snapshot, the one before, the
        last measurement): each is asked for several times an interval or round."""
        for lay, paths in self._path_cache:
            if lay is layout:
                return paths
        paths = layout.paths()
        self._path_cache = [*self._path_cache[-2:], (layout, paths)]
        return paths

    def _spans(self, state: MeasuredState, everyone: list[_File]) -> list[tuple[int, int, str]]:
        """(first block, end, path) of each file of ``everyone`` that is one extent on disk."""
        if self._last is None:
            return []
        ino_of: dict[str, int] = {}
        for ino, ps in self._paths(self._last).items():
            for p in ps:
                ino_of[p.lstrip("/")] = ino
        idx = {int(i): k for k, i in enumerate(state.ino.tolist())}
        spans = []
        for f in everyone:
            k_i = idx.get(ino_of.get(f.path, -1))
            if k_i is not None and int(state.frags[k_i]) == 1 and int(state.blocks[k_i]):
                a = int(state.first[k_i])
                spans.append((a, a + int(state.blocks[k_i]), f.path))
        return spans

    def _shape_free(
        self,
        state: MeasuredState,
        files: list[_File],
        everyone: list[_File],
        rng: random.Random,
        churn: IntervalChurn,
        allowed: int,
    ) -> None:
        """Free extents of the sizes the recreation lacks against the snapshot, as the
        original's unseen churn left them. First where a file's blocks lie between free
        extents whose union is of a size lacking: the file is rewritten elsewhere (put on disk
        before the old one goes), which joins them (a hole grows as files around it are
        renewed). Then, where the recreation has free extents larger than the snapshot's to
        spare, spacers: short-lived temporaries of the lacking sizes, each put on disk and
        followed by a rewritten file of the same allocation class (ext4 packs small files
        apart from large ones) so that each spacer lies between allocated blocks, and all
        deleted at the round's end, their blocks left as holes of their size. No more than
        the interval's ``allowed`` bytes are written, and the spacers with their neighbours no
        more than ``spacer_room`` over the interval."""
        short = self._short(state)
        excess = self._excess(state)
        if not (short or excess) or self._last is None:
            return
        bs = state.target.block_size
        by_path = {f.path: f for f in everyone}
        spans = self._spans(state, everyone)
        #: Rewrites written under their temporary name, renamed once all are on disk.
        pending: list[_File] = []
        spacers: list[str] = []
        if excess:
            # Too many free extents of some sizes: windows that join several of them, their
            # files moved while a plug holds the larger free extents (a pressed round).
            longest = (2 << max(self._target_free_counts, default=0)) - 1
            # The blocks of the small extents in excess: what the movers can fill, no more.
            fill = sum(n * state.target.free.get(k, 0) // max(state.target.free_counts[k], 1)
                       for k, n in excess.items())  # fmt: skip
            windows = merge_windows(state.free_start, state.free_len, spans, excess, longest,
                                    MERGE_SHARE)  # fmt: skip
            movers = []
            for f in (by_path[p] for w in windows for p in w):
                if fill <= 0:
                    break
                movers.append(f)
                fill -= -(-f.size // bs)
            plug = self._plug(state, movers, files or everyone, rng, churn)
            for f in movers:
                if churn.inferred_bytes >= allowed:
                    break
                pending.append(self._write_temp(f, churn, "merge"))
            if plug:
                # Nothing else this round: what it would write finds no room but the plug's.
                self._finish(pending, [plug], churn)
                return
            moved_now = {f.path for f in pending}
            spans = [t for t in spans if t[2] not in moved_now]
        for window in join_windows(state.free_start, state.free_len, spans, short):
            if churn.inferred_bytes >= allowed:
                break
            for path in window:
                pending.append(self._write_temp(by_path[path], churn, "join"))
        # Then single files beside a free extent, the interval's files first, for the sizes
        # still lacking (a small free space has few windows of little filling).
        moved = {f.path for f in pending}
        ends = {int(a + n): int(n) for a, n in zip(state.free_start, state.free_len, strict=True)}
        starts = {int(a): int(n) for a, n in zip(state.free_start, state.free_len, strict=True)}
        changed = {f.path for f in files}
        taken: set[int] = set()  # free extents (their start) joined this way
        for a, b, path in sorted(rng.sample(spans, len(spans)), key=lambda t: t[2] not in changed):
            if churn.inferred_bytes >= allowed:
                break
            if path in moved:
                continue
            left, right = ends.get(a, 0), starts.get(b, 0)
            if not (left or right) or (a - left) in taken or b in taken:
                continue
            k = bucket_of_length(left + b - a + right)
            if short.get(k, 0) <= 0:
                continue
            pending.append(self._write_temp(by_path[path], churn, "join"))
            short[k] -= left + b - a + right
            taken.update({a - left, b})
        have = state.target.free_fractions()
        spare = [k for k, v in have.items() if v > self._want.get(k, 0.0)]
        left = min(self.spacer_room, allowed - churn.inferred_bytes)
        small = [f for f in files if -(-f.size // bs) < STREAM_BLOCKS]
        large = [f for f in everyone if -(-f.size // bs) >= STREAM_BLOCKS]
        for k in sorted(short, reverse=True):
            if not any(j > k for j in spare):
                continue
            lo, hi = 1 << k, (1 << (k + 1)) - 1
            done = {f.path for f in pending}
            neighbours = [f for f in (small if hi < STREAM_BLOCKS else large)
                          if f.path not in done]  # fmt: skip
            rng.shuffle(neighbours)
            need = short[k]
            while (need >= lo and neighbours and len(spacers) < MAX_SPACERS
                   and left >= lo * bs + neighbours[-1].size):  # fmt: skip
                n = rng.randint(lo, max(lo, min(hi, need, (left - neighbours[-1].size) // bs)))
                left -= n * bs + neighbours[-1].size
                self.spacer_room -= n * bs + neighbours[-1].size
                host = rng.choice(files or neighbours)
                head = host.path.rpartition("/")[0]
                name = f".spc{rng.randrange(1 << 30):08x}{TEMP_SUFFIX}"
                path = f"{head}/{name}" if head else name
                self._op(Op("create", path, n * bs, inferred=True), churn)
                self._count(churn, "spacer")
                spacers.append(path)
                g = neighbours.pop()
                pending.append(self._write_temp(by_path.get(g.path, g), churn, "neighbour"))
                need -= n
        self._finish(pending, spacers, churn)

    def _finish(self, pending: list[_File], spacers: list[str], churn: IntervalChurn) -> None:
        if not pending and not spacers:
            return
        # One sync puts them all on disk, allocated in the order written (writeback takes
        # the inodes in the order they were dirtied): each spacer between the rewrites
        # around it, each new version before its old one is freed. One sync, not an fsync
        # each: a journal commit costs milliseconds.
        self._op(Op("sync", inferred=True), churn)
        for f in pending:
            self._replace(f, churn)
        for path in spacers:
            if path in self._lost:  # refused by a full disk: already gone
                self._lost.discard(path)
                continue
            self._op(Op("delete", path, inferred=True), churn)

    def _plug(
        self,
        state: MeasuredState,
        movers: list[_File],
        hosts: list[_File],
        rng: random.Random,
        churn: IntervalChurn,
    ) -> str | None:
        """A short-lived file that takes the free space but what ``movers`` need and what
        ext4 keeps back (2% of the blocks, 4096 at most), allocated before them: as the
        original's temporaries did while it was that full, it leaves the movers the small
        free extents (the allocator takes the largest first). Deleted at the round's end."""
        bs = state.target.block_size
        free = int(state.free_len.sum())
        keep = min(state.target.blocks_total // 50, 4096)
        need = sum(-(-f.size // bs) for f in movers)
        n = free - keep - need - max(free // 50, 64)
        if n <= 0 or not movers:
            return None
        head = rng.choice(hosts).path.rpartition("/")[0]
        name = f".plug{rng.randrange(1 << 30):08x}{TEMP_SUFFIX}"
        path = f"{head}/{name}" if head else name
        # Allocated, not written (fallocate takes its blocks at once, as writeback would):
        # space held for a moment is not churn, and megabytes a round cost time.
        if not self._op(Op("create", path, 0, inferred=True), churn):
            return None
        self._count(churn, "plug")
        if not self._op(Op("fallocate", path, n * bs, offset=0, inferred=True), churn):
            self._op(Op("delete", path, inferred=True), churn)
            return None
        return path

    def _mend(
        self, files: list[_File], state: MeasuredState, breaks: int, churn: IntervalChurn
    ) -> None:
        """Rewrite the most fragmented of ``files`` whole, put on disk at once (fsync) before
        it replaces the old version, until about ``breaks`` breaks are mended: a size bucket
        more fragmented than the snapshot's."""
        if self._last is None:
            return
        frags = dict(zip(state.ino.tolist(), state.frags.tolist(), strict=True))
        by_path = {p.lstrip("/"): frags.get(ino, 0) for ino, ps in self._paths(self._last).items()
                   for p in ps}  # fmt: skip
        worst = sorted(files, key=lambda f: -int(by_path.get(f.path, 0)))
        mended = 0
        for f in worst:
            if mended >= breaks or by_path.get(f.path, 0) <= 1:
                break
            tmp = _temp_name(f.path)
            if self._op(Op("create", tmp, f.size, inferred=True), churn):
                self._op(Op("fsync", tmp, inferred=True), churn)
            self._replace(f, churn)
            self._count(churn, "mend")
            mended += int(by_path[f.path]) - 1

    def _op(self, op: Op, churn: IntervalChurn) -> bool:
        """Run ``op``; False if it failed. An inferred file a full disk refused is deleted and
        remembered (``_lost``): its rename over the file it stands for is never run, so a
        short temporary never replaces a file of the snapshot."""
        self.remounted = False
        churn.inferred_ops += 1
        churn.inferred_bytes += op.size if op.op in ("create", "append") else 0
        # Journaled as run: a rerun meets the same failure.
        try:
            self.run(op)
        except NoSpaceError:
            if op.op in ("create", "append"):
                self._lost.add(op.path)
            if op.op == "append":
                # No part of an inferred file is left behind (the recreation would hold a
                # file the snapshot does not). A refused create left none: the executors
                # remove what it made, and deleting it again only failed (a notice of as
                # many failed ops as refused ones).
                with contextlib.suppress(NoSpaceError, OpFailedError):
                    self.run(Op("delete", op.path, inferred=True))
            return False
        except OpFailedError:
            return False
        return True

    def _replace(self, f: _File, churn: IntervalChurn) -> bool:
        """The temporary of ``f`` renamed over it and given its mode and time back, unless a
        full disk refused part of it (then it is gone already)."""
        tmp = _temp_name(f.path)
        if tmp in self._lost:
            self._lost.discard(tmp)
            return False
        if self._op(Op("rename", tmp, dest=f.path, inferred=True), churn):
            self._op(Op("setattr", f.path, mode=f.mode, mtime_ns=f.mtime_ns, inferred=True),
                     churn)  # fmt: skip
            return True
        return False

    def _count(self, churn: IntervalChurn, kind: str) -> None:
        churn.kinds[kind] = churn.kinds.get(kind, 0) + 1

    def _rewrite(self, f: _File, churn: IntervalChurn) -> None:
        """``f`` written whole under a temporary name and renamed over the old one."""
        self._op(Op("create", _temp_name(f.path), f.size, inferred=True), churn)
        self._replace(f, churn)
        self._count(churn, "rewrite")

    def _write_temp(self, f: _File, churn: IntervalChurn, kind: str) -> _File:
        """The new version of ``f`` written under its temporary name (the caller renames it)."""
        self._op(Op("create", _temp_name(f.path), f.size, inferred=True), churn)
        self._count(churn, kind)
        return f

    def _interleaved(
        self, pairs: list[list[_File]], bs: int, churn: IntervalChurn, room: int | None = None
    ) -> None:
        """Each pair's two files rewritten in alternating pieces, so that their blocks
        alternate as two writers' do. The pieces go to disk in layers: every file's first
        piece, in pair order, then one sync, then every file's second piece, and so on.
        Writeback allocates the files of a layer one after another in the order written, so
        each file's next piece finds the blocks after its last taken by its partner's; one
        sync per layer, not one fsync per piece (a journal commit each). Every temporary of a
        batch exists until the batch is renamed: batches hold at most ``room`` bytes (a
        nearly full disk refused the pieces of hundreds of pairs written at once)."""
        batch: list[list[_File]] = []
        held = 0
        for pair in pairs:
            size = sum(f.size for f in pair)
            if batch and room is not None and held + size > room:
                self._interleave_batch(batch, bs, churn)
                batch, held = [], 0
            batch.append(pair)
            held += size
        if batch:
            self._interleave_batch(batch, bs, churn)

    def _interleave_batch(self, pairs: list[list[_File]], bs: int, churn: IntervalChurn) -> None:
        files = [f for pair in pairs for f in pair]
        tmps = [_temp_name(f.path) for f in files]
        for t in tmps:
            self._op(Op("create", t, 0, inferred=True), churn)
        pieces = [max(-(-f.size // bs) // 2, 1) * bs for f in files]
        done = [0] * len(files)
        while any(d < f.size and t not in self._lost
                  for d, f, t in zip(done, files, tmps, strict=True)):  # fmt: skip
            for i, f in enumerate(files):
                if done[i] < f.size and tmps[i] not in self._lost:
                    n = min(pieces[i], f.size - done[i])
                    self._op(Op("append", tmps[i], n, inferred=True), churn)
                    done[i] += n
            self._op(Op("sync", inferred=True), churn)
        for f in files:
            if self._replace(f, churn):
                self._count(churn, "interleaved")


def _temp_name(path: str) -> str:
    head, _, name = path.rpartition("/")
    tmp = f".{name}{TEMP_SUFFIX}"
    return f"{head}/{tmp}" if head else tmp
