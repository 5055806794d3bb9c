"""The matcher's rounds of steering (``fsage age T --match``): files rewritten toward each
size bucket's layout score, holes made and filled toward the target's free-space histogram,
the fullness brought back to the target's.
"""

from __future__ import annotations

import math

import numpy as np

from fsage.ager.match_fill import MatchWriter
from fsage.ager.match_target import (
    DYNAMIC_TOL,
    FREE_TV,
    FULLNESS_TOL,
    MIN_FILES,
    SCORE_TOL,
    MeasuredState,
    free_tv,
)
from fsage.analyzer.freespace import MAX_BUCKET


class Steering(MatchWriter):
    """Steps of a round, each from the state a round began with."""

    def steer_scores(self, st: MeasuredState) -> dict[str, str]:
        actions: dict[str, str] = {}
        by_bucket = st.bucket
        for k, (n, s) in self.target.buckets.items():
            if k == 0 or s is None or n < MIN_FILES:
                continue
            cs = st.target.buckets.get(k, (0, None))[1]
            if cs is None or abs(cs - s) <= SCORE_TOL * 0.75:
                # Within the tolerance, with a margin: left alone. A rewrite frees its files'
                # blocks and takes others, which moves the free space (a mail target's
                # 1-block holes grew by a third when six buckets within 0.02 were nudged
                # toward their targets' scores to bring a seventh in).
                continue
            den = st.den_k.get(k, 0)
            idx = np.flatnonzero(by_bucket == k)
            idx = np.array([i for i in idx.tolist() if int(st.ino[i]) in self.paths], np.int64)
            if idx.size == 0:
                actions[f"bucket {k}"] = "no files of fsage's in this bucket to rewrite"
                continue
            if cs > s:
                need = (cs - s) * den
                order_list = idx[st.cont[idx] > 0].tolist()
                self.rng.shuffle(order_list)
                chunk = 1
                victims: list[tuple[str, int]] = []
                done = 0.0
                for i in order_list:
                    if done >= 0.8 * need:
                        break
                    rel = self.delete(int(st.ino[i]))
                    if rel is None:
                        continue
                    b = int(st.blocks[i])
                    victims.append((rel, b * self.bs))
                    done += max(0.0, float(st.cont[i]) - (b - math.ceil(b / chunk)))
                # Freed blocks are reused only once the deletes are committed: commit them so
                # that the rewritten files take the holes the old ones leave.
                self.disk.commit()
                self.disk.precreate(sorted(rel for rel, _ in victims))  # their inodes back
                for g in range(0, len(victims), 4):
                    self.write_interleaved(victims[g : g + 4], chunk)
                actions[f"bucket {k}"] = f"fragmented by interleaving ({done:.0f} of {need:.0f})"
            else:
                need = (s - cs) * den
                gap = st.den[idx] - st.cont[idx]
                order = idx[np.argsort(-gap, kind="stable")]
                done = 0.0
                redo: list[tuple[str, int]] = []
                for i in order.tolist():
                    if done >= 0.8 * need or st.den[i] == st.cont[i]:
                        break
                    rel = self.delete(int(st.ino[i]))
                    if rel is None:
                        continue
                    redo.append((rel, int(st.blocks[i]) * self.bs))
                    done += float(st.den[i] - st.cont[i])
                self.disk.commit()
                self.disk.precreate(sorted(rel for rel, _ in redo))  # their inodes back
                for rel, size in redo:
                    self.write_whole(rel, size)
                actions[f"bucket {k}"] = (
                    f"rewrote fragmented files whole ({done:.0f} of {need:.0f})"
                )
        want = self.target.locality.get("dynamic_score")
        have = st.target.locality.get("dynamic_score")
        if want is not None and have is not None and abs(have - want) > DYNAMIC_TOL:
            actions["locality"] = self.locality_reason(float(have), float(want))
        return actions

    def locality_reason(self, have: float, want: float) -> str:
        """Why the path-order dynamic layout score is off: the rounds do not steer it
        (moving files to change it undoes the free space), and where below, what the fill's
        wall files cost it."""
        why = (
            f"path-order dynamic layout score {have:.3f} against {want:.3f}: set by the fill's"
            " order only, not steered by the rounds (moving files undoes the free space)"
        )
        if have < want and self.walls:
            why += (
                f"; the target has more small holes than files to bound them: the fill's"
                f" {self.walls:,} wall files between them add a jump each to the read"
            )
        return why

    def steer_free(self, st: MeasuredState) -> str:
        """Shape the free space toward the target's histogram. For each extent-size bucket
        short of free blocks, holes of that size: punched into the middle of contiguous
        files of the matcher's (a hole inside one extent is a free extent of exactly its
        length; a big file takes a few), else whole contiguous files of that size that touch
        no free extent deleted. As many blocks as the holes freed are then allocated
        (fallocate) as filler files, which take them from the large free extents the target
        has too much of, so the fullness stays where the fill put it."""
        want = self.target.free_fractions()
        have = st.target.free_fractions()
        tv = free_tv(want, have)
        if tv <= FREE_TV * 0.6:
            return ""
        free_total = int(st.free_len.sum())
        ends = set((st.free_start + st.free_len).tolist())
        starts = set(st.free_start.tolist())
        short = sorted(k for k in want if want[k] > have.get(k, 0.0))
        ours = np.array([int(i) in self.paths for i in st.ino.tolist()], bool)
        solo = (st.frags == 1) & ours
        used = np.zeros(st.ino.size, bool)  # files punched or deleted this round
        punched = deleted = made = 0
        missed: list[str] = []  # hole sizes short that no file of the matcher's could give
        for k in short:
            need = (want[k] - have.get(k, 0.0)) * free_total
            lo, hi = 1 << k, (1 << (k + 1)) - 1
            got = 0
            if self.disk.can_punch:
                # The largest contiguous files first: a hole costs a file one break in its
                # layout, which a file of many blocks hardly notices (one hole per 100 blocks
                # at most).
                idx = np.flatnonzero(solo & ~used & (st.blocks >= lo + 2))
                idx = idx[np.argsort(-st.blocks[idx], kind="stable")]
                for i in idx.tolist():
                    if got >= 0.9 * need or not self.disk.can_punch:
                        break
                    got += self._punch_holes(st, i, lo, hi, need - got)
                    used[i] = True
            if got < 0.9 * need:
                idx = np.flatnonzero(solo & ~used & (st.blocks >= lo) & (st.blocks <= hi))
                idx = idx[self.rng.sample(range(idx.size), idx.size)] if idx.size else idx
                for i in idx.tolist():
                    if got >= 0.9 * need:
                        break
                    a, b = int(st.first[i]), int(st.first[i] + st.blocks[i])
                    if a in ends or b in starts:
                        continue  # would join a free extent, not make a hole
                    if self.delete(int(st.ino[i])) is None:
                        continue
                    used[i] = True
                    got += int(st.blocks[i])
                    deleted += int(st.blocks[i])
                    ends.add(b)
                    starts.add(a)
            top_free = int(st.free_len.max()) if st.free_len.size else 0
            if got < 0.9 * need and 4 <= k <= 9 and top_free >= 8 << k:
                # No file of the matcher's can give a hole of 16-1023 blocks (a git-like
                # target has few large files): allocate one two blocks larger than the hole
                # from the large free extents (eight times the hole at least) and punch the
                # hole into it at once, which moves that many free blocks from the extent
                # it came from into a hole of this size for two blocks of fullness.
                m = self._carve_holes(lo, hi, need * 0.9 - got)
                made += m
                got += m
            punched += got
            if got == 0:
                missed.append(f"{lo}-{hi}")
        punched -= deleted + made
        self.disk.commit()
        # Give back as many blocks from the largest free extent (and those still short of the
        # target's fullness) when the target has too much free space in extents of its size,
        # never so many that what is left of it drops below its bucket, or below the target's
        # largest bucket when the target has none as large.
        filled = 0
        cut = ""
        if st.free_len.size:
            i = int(np.argmax(st.free_len))
            top = int(st.free_len[i])
            kt = min(top.bit_length() - 1, MAX_BUCKET)
            excess = (have.get(kt, 0.0) - want.get(kt, 0.0)) * free_total
            wanted = [k for k, f in want.items() if f > 0]
            floor = min(kt, max(wanted)) if wanted else kt
            room = top - (1 << floor) - 1
            lacking = int((self.target.fullness - st.target.fullness) * self.total)
            give = punched + deleted + max(lacking, 0)
            if kt > floor and self.disk.can_place and top > 2 << floor:
                # The target has no free extent this large: cut it in two with the filler
                # placed in its middle, both halves as large as the target's largest.
                n = max(1, min(give, top - (2 << floor)))
                filled = self._fill_large(n, int(st.free_start[i]) + (top - n) // 2)
                cut = f" (in its middle: cut in two, the target has no free extent of {top})"
            else:
                filled = self._fill_large(
                    max(min(give, int(excess), room), 0), int(st.free_start[i])
                )
            if self.disk.can_place or self.disk.groups:
                filled += self._shrink_extents(st, want, have, give - filled, free_total)
            if self.disk.kept_empty is not None and give > filled:
                # The largest free extent is the group kept empty, which the target wants as
                # large: the blocks punched go back where the allocator puts a new file (its
                # directory's group, never the one kept empty).
                filled += self._fill_large(give - filled, None)
        why = (
            f"; no contiguous file of the matcher's can give holes of {', '.join(missed)} blocks"
            if missed
            else ""
        )
        return (
            f"{punched} blocks punched, {deleted} deleted and {made} carved from new files "
            "as holes of the sizes short, "
            f"{filled} blocks of the largest free extent filled{cut}{why}"
        )

    def _punch_holes(self, st: MeasuredState, i: int, lo: int, hi: int, need: float) -> int:
        """Punch holes of ``lo``-``hi`` blocks into file ``i`` (one extent), each bounded by
        the file's own blocks, at most one per 100 blocks; returns the blocks freed."""
        rel = self.paths.get(int(st.ino[i]))
        if rel is None:
            return 0
        n = int(st.blocks[i])
        holes = max(1, min(n // 100, n // (lo + 2)))
        got = 0
        # Holes at evenly spaced places, each at least one block from the next.
        span = n // holes
        for h in range(holes):
            if got >= need:
                break
            room = span - 2
            if room < lo:
                break
            length = self.rng.randint(lo, min(hi, room))
            off = h * span + 1 + self.rng.randint(0, room - length)
            if not self.disk.punch(rel, off * self.bs, length * self.bs):
                break
            got += length
        return got

    def _carve_holes(self, lo: int, hi: int, need: float) -> int:
        """Holes of ``lo``-``hi`` blocks, as many as make ``need`` blocks (eight at most), each
        punched into a file allocated two blocks larger; returns the blocks of the holes."""
        got = 0
        for _ in range(8):
            if got >= need or not (self.disk.can_punch and self.disk.can_fallocate):
                break
            length = self.rng.randint(lo, max(lo, min(hi, int(need - got))))
            rel = self._new_path()
            with self._undone_if_no_space([rel]):
                ino = self.disk.allocate(rel, (length + 2) * self.bs, None)
            if ino is None:
                break
            self.paths[ino] = rel
            self.sizes[rel] = (length + 2) * self.bs
            self.files_written += 1
            self.disk.commit()
            if not self.disk.punch(rel, self.bs, length * self.bs):
                break
            self.sizes[rel] = 2 * self.bs  # what it holds once punched
            got += length
        self.disk.commit()
        return got

    def _shrink_extents(
        self,
        st: MeasuredState,
        want: dict[int, float],
        have: dict[int, float],
        spare: int,
        free_total: int,
    ) -> int:
        """Where the filler can be placed (offline: at a block; xfs: in an allocation group),
        drop the next largest free extents of a size the target has too much of into the
        size below, which it has too little of, by filling their ends: as many as ``spare``
        blocks (and half a percent of fullness more) pay for. Returns the blocks allocated."""
        have = dict(have)
        spare += int(0.005 * self.total)
        done = 0
        for j in np.argsort(-st.free_len, kind="stable")[1:9].tolist():
            e = int(st.free_len[j])
            k = min(e.bit_length() - 1, MAX_BUCKET)
            if k == 0 or have.get(k, 0.0) - want.get(k, 0.0) <= 0.01:
                continue
            if want.get(k - 1, 0.0) <= have.get(k - 1, 0.0):
                continue
            need = e - ((1 << k) - 1)  # what is left falls in bucket k - 1
            if need > spare:
                continue
            got = self._fill_large(need, int(st.free_start[j]))
            spare -= got
            done += got
            have[k] = have.get(k, 0.0) - e / free_total
            have[k - 1] = have.get(k - 1, 0.0) + (e - got) / free_total
        return done

    def _fill_large(self, blocks: int, start: int | None) -> int:
        """Allocate ``blocks`` blocks as filler files of at most 64 MiB (fallocate: the
        kernel's allocator serves a large request from the large free extents; the offline
        one is told to start at ``start``, the largest free extent); returns the blocks
        allocated."""
        done = 0
        step = (64 << 20) // self.bs
        while done < blocks and self.disk.can_fallocate:
            n = min(step, blocks - done)
            rel = self._new_path()
            with self._undone_if_no_space([rel]):
                ino = self.disk.allocate(rel, n * self.bs, None if start is None else start + done)
            if ino is None:
                break
            self.paths[ino] = rel
            self.sizes[rel] = n * self.bs
            self.fillers.append(rel)
            self.files_written += 1
            done += n
        self.disk.commit()
        return done

    def settle_fullness(self) -> str:
        """Bring the fullness within half of ``FULLNESS_TOL`` of the target's: fillers (then
        the largest files of the matcher's) deleted when above, a filler allocated when below
        (both from and to the large free extents, which changes the free-space histogram
        least). Returns what was done, "" if nothing."""
        self.disk.commit()
        goal, now = self.target.fullness, self.fullness()
        slack = FULLNESS_TOL / 2
        if abs(now - goal) <= slack:
            return ""
        if now < goal:
            got = self._fill_large(int((goal - now) * self.total), None)
            return f"{got} blocks allocated to reach the target's fullness"
        over = int((now - goal) * self.total)
        rels = [r for r in dict.fromkeys(reversed(self.fillers)) if r in self.sizes]
        rest = sorted(set(self.sizes) - set(rels), key=lambda r: -self.sizes[r])
        freed = 0
        for rel in rels + rest:
            if freed >= over:
                break
            freed += -(-self.sizes.pop(rel) // self.bs)
            self.disk.unlink(rel)
        self.paths = {ino: rel for ino, rel in self.paths.items() if rel in self.sizes}
        self.disk.commit()
        return f"{freed} blocks of the matcher's deleted to come down to the target's fullness"

    # -- the loop
