"""Age a mounted file system until its layout matches a target (``fsage age T --match``).

The target is a layout: files and layout score per size bucket (seed 000 buckets of blocks),
the free-space histogram (free blocks per log2 extent length, e2freefrag's buckets) and the
fullness — taken from a stored snapshot or a JSON file. The matcher

1. fills the target with files drawn from the target's size buckets (file counts scaled to
   the capacity) up to the target's fullness: a share of each bucket's files with their
   blocks interleaved, the rest whole; a bucket with too few files to be steered, every file
   in pieces of the length that gives its score;
2. then, in rounds, reads the mounted tree with fsage's live reader and steers:
   - a size bucket whose score is above the target's gets files rewritten as interleaved,
     fsync'ed appends of several files at once (their blocks alternate on disk);
   - a bucket below the target gets its most fragmented files rewritten whole;
   - free-extent sizes the target has more of get holes of those sizes: punched into the
     middle of large contiguous files (exact free extents; not on btrfs, which frees a
     punched range only with its whole extent), else contiguous files of that size that
     touch no free extent deleted; as many blocks are then allocated from the largest free
     extent when the target has less free space in extents of its size (the fill already
     leaves holes shaped like the target's free extents: it writes spacer files of those
     sizes, the large ones first, and deletes them once the rest is written);
   - where the live reader cannot see free space (btrfs: no GETFSMAP), free space is not
     judged, the run stops once the size buckets match, and it is never called matched.
3. It stops when every size bucket holding at least ``MIN_FILES`` files in the target is
   within ``SCORE_TOL`` of the target's score and the free-space histograms are within total
   variation ``FREE_TV``; or at the time limit, or when rounds stop making progress, and then
   reports the closest state reached (the size buckets first, then the distance) per bucket
   and why it could not get closer.

On xfs the largest free extents are the allocation groups' unwritten tails: the fill gives
each group its share of the files and leaves it the target's tail (``match_xfs``), and the
state left on disk is read on a read-only mount after unmount.

The fill and the matcher's files are in ``match_fill``, the steering in ``match_steer``, the
target and its comparison in ``match_target``, where the writes go in ``match_disk`` (every op
through the executors every aging uses), the run's record, journal and resume in
``match_record``.
"""

from __future__ import annotations

import contextlib
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fsage.ager.match_disk import AREA, Disk, OfflineDisk, open_disk, probe
from fsage.ager.match_fill import MAX_FULLNESS
from fsage.ager.match_record import (
    finish_run_row,
    interrupted_match,
    match_header,
    refuse_unfinished,
    resume_record,
    start_record,
    start_run_row,
)
from fsage.ager.match_steer import Steering
from fsage.ager.match_target import (
    FREE_TV,
    MIN_FILES,
    SCORE_TOL,
    LayoutTarget,
    MeasuredState,
    bucket_excess,
    check_room,
    check_target,
    compare,
    distance,
    free_tv,
    load_target,
    measure,
    target_from_layout,
)
from fsage.ager.offline import OFFLINE_NOTICE
from fsage.errors import UsageError, WorkloadError
from fsage.workload import NoSpaceError

__all__ = [
    "AREA",
    "FREE_TV",
    "MIN_FILES",
    "SCORE_TOL",
    "LayoutTarget",
    "MatchResult",
    "Matcher",
    "compare",
    "free_tv",
    "interrupted_match",
    "load_target",
    "match_layout",
    "resume_match",
    "target_from_layout",
]

STALL_ROUNDS = 6
#: Fills tried in all: a fill whose rounds stall is cleared and drawn again.
FILLS = 3


# ---------------------------------------------------------------------------- matching


@dataclass
class MatchResult:
    target: str
    source: str
    matched: bool = False
    elapsed: float = 0.0
    rounds: int = 0
    files_written: int = 0
    bytes_written: int = 0
    stop: str = ""
    report: dict[str, Any] = field(default_factory=dict)
    closest: dict[str, Any] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    #: Aged through the offline writer (libext2fs's allocator, not the kernel's).
    offline: bool = False
    #: What read the state ``report`` describes (the state left on disk).
    measured_by: str = ""
    #: The journal of every op that took effect (across resumes): ``fsage age OTHER --ops``
    #: runs it again; the record beside the target points to it for ``--resume``.
    journal: str = ""
    #: Continued a match that was stopped (``--resume``).
    resumed: bool = False
    notices: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


class Matcher(Steering):
    """Fill, then steer in rounds until matched or stalled."""

    #: Told "rounds" once a fill is done and "fill" when one is cleared (the record keeps it,
    #: so that ``--resume`` knows whether the files on disk are a whole fill).
    on_phase: Callable[[str], None] | None = None

    def _phase(self, phase: str) -> None:
        if self.on_phase is not None:
            self.on_phase(phase)

    def _settled_report(self) -> dict[str, Any]:
        """The state against the target once out of space: the fullness settled first (the
        file that did not fit is gone, fillers may be due)."""
        self.settle_fullness()
        st = self.snapshot()
        return compare(self.target, st.target, st.free_known)

    def run(self, adopted: bool = False) -> MatchResult:
        """``adopted``: the files on disk are a fill (``adopt``): the rounds go on from them."""
        t0 = time.perf_counter()
        res = MatchResult(target="", source=self.target.source)
        if adopted:
            self.say(f"fsage: the rounds go on from the {len(self.sizes):,} files on disk")
        else:
            self.say(f"fsage: filling to {self.target.fullness:.3f} with the target's file sizes")
        try:
            if not adopted:
                self.fill()
                self._phase("rounds")
        except NoSpaceError as exc:
            # The fill never plans past the target's fullness; a file system that still runs
            # out (its metadata grew more than counted) is said, and the rest left as it is.
            res.stop = f"the fill ran out of space ({exc})"
            res.report = res.closest = self._settled_report()
            res.reasons = _reasons(res.report, {}, self.locality_reason)
            res.elapsed = time.perf_counter() - t0
            res.files_written, res.bytes_written = self.files_written, self.bytes_written
            return res
        best: tuple[float, dict[str, Any]] | None = None
        # The closest state reported: the size buckets first (a state with them matched beats
        # one nearer in free space only), then the distance.
        closest: tuple[tuple[float, float], dict[str, Any]] | None = None
        stalled = 0
        fills = 1
        fill_best: dict[bool, float] = {}
        first_top_spacer = self.top_spacer
        last_actions: dict[str, str] = {}
        while True:
            st = self.snapshot()
            rep = compare(self.target, st.target, st.free_known)
            res.rounds += 1
            dist = distance(rep)
            tv = "unknown" if rep["free_tv"] is None else f"{rep['free_tv']:.3f}"
            self.say(
                f"fsage: round {res.rounds}: distance {dist:.3f}, free-space TV {tv}, "
                f"fullness {st.target.fullness:.3f}, path-order dynamic layout score "
                f"{st.target.locality.get('dynamic_score') or 0:.3f}, "
                f"{time.perf_counter() - t0:.0f} s"
            )
            rank = (bucket_excess(rep), dist)
            better = closest is None or rank[0] < closest[0][0] - 1e-4
            if closest is None or rank < closest[0]:
                closest = (rank, rep)
            if best is None or dist < best[0] - 1e-4:
                best = (dist, rep)
                better = True
            # Progress in the size buckets or in the distance as a whole keeps the rounds going.
            stalled = 0 if better else stalled + 1
            if rep["matched"]:
                res.matched, res.stop = True, "matched"
                break
            if rep["buckets_ok"] and rep["free_ok"] and rep["fullness_ok"]:
                # Only the path-order read is off, which the rounds do not steer (rewriting
                # files to move them undoes the free space): keep this state.
                res.stop = "all but the path-order dynamic layout score matched"
                break
            if not st.free_known and rep["buckets_ok"]:
                res.stop = "size buckets matched; free space unknown on this file system"
                break
            if time.perf_counter() - t0 > self.time_limit:
                res.stop = f"time limit ({self.time_limit:.0f} s)"
                break
            if stalled >= STALL_ROUNDS and fills < FILLS:
                # Holes punched cannot always be given back on the kernel's allocator (it
                # takes no hint where to put the filler), and the free extents a fill leaves
                # vary from run to run: a stalled fill is cleared and drawn again.
                # The fills take turns between the two ways of making the largest holes; the
                # last takes the way that came closer (it is the one left on disk).
                assert best is not None
                fill_best[self.top_spacer] = min(fill_best.get(self.top_spacer, 9.0), best[0])
                fills += 1
                self.top_spacer = (
                    (fills % 2 == 0) != first_top_spacer
                    if fills < FILLS
                    else fill_best.get(True, 9.0) < fill_best.get(False, 9.0)
                )
                self.say(f"fsage: no progress in {STALL_ROUNDS} rounds: fill {fills} of {FILLS}")
                self._phase("fill")
                self.clear()
                try:
                    self.fill()
                    self._phase("rounds")
                except NoSpaceError as exc:
                    res.stop = f"fill {fills} ran out of space ({exc})"
                    rep = self._settled_report()
                    break
                best, stalled = None, 0
                continue
            if stalled >= STALL_ROUNDS:
                res.stop = f"no progress in {STALL_ROUNDS} rounds of each of {FILLS} fills"
                break
            try:
                last_actions = self.steer_scores(st)
                # One of the two a round: holes punched into the files a bucket's rewrite was
                # aimed at add breaks the rewrite did not count (a bucket 0.024 above its
                # target came out 0.026 below, and the next round undid it).
                rewrote = any(k.startswith("bucket") for k in last_actions)
                free_action = self.steer_free(st) if st.free_known and not rewrote else ""
                if free_action:
                    last_actions["free space"] = free_action
                settled = self.settle_fullness()
                if settled:
                    last_actions["fullness"] = settled
            except NoSpaceError as exc:
                res.stop = f"round {res.rounds} ran out of space: {exc}"
                rep = self._settled_report()
                break
        assert best is not None and closest is not None
        res.report = rep
        res.closest = closest[1]
        self.last_actions = last_actions
        res.reasons = _reasons(rep, last_actions, self.locality_reason) if not res.matched else {}
        res.elapsed = time.perf_counter() - t0
        res.files_written = self.files_written
        res.bytes_written = self.bytes_written
        return res


def _reasons(
    rep: dict[str, Any],
    actions: dict[str, str],
    locality_why: Callable[[float, float], str] | None = None,
) -> dict[str, str]:
    """Why each dimension of ``rep`` is off: the last round's own word where it said one,
    else what is known of it (``locality_why``: the steering's reason for a dynamic score off
    that no round reached, as when the first round already had everything else)."""
    out: dict[str, str] = {}
    for r in rep["buckets"]:
        if r["ok"]:
            continue
        key = f"bucket {r['bucket']}"
        if r["score"] is None:
            out[key] = "no files of this size reached"
        else:
            way = "above" if r["score"] > r["target_score"] else "below"
            last = actions.get(key, "no rewrite possible")
            out[key] = f"still {way} target after the last round ({last})"
    if not rep.get("free_known", True):
        out["free space"] = (
            "not judged: the live reader cannot see this file system's free space (no GETFSMAP)"
        )
    elif not rep["free_ok"]:
        out["free space"] = actions.get(
            "free space", "no contiguous file of a needed hole size touches no free extent"
        )
    if not rep.get("dynamic_ok", True):
        have = rep["locality"].get("dynamic_score")
        want = rep["target_locality"]["dynamic_score"]
        if "locality" in actions:
            out["locality"] = actions["locality"]
        elif have is not None and locality_why is not None:
            out["locality"] = locality_why(float(have), float(want))
        else:
            out["locality"] = (
                f"path-order dynamic layout score {have if have is None else round(have, 3)}"
                f" against {want:.3f}"
            )
    if not rep.get("fullness_ok", True):
        out["fullness"] = actions.get(
            "fullness",
            f"{rep['fullness']:.3f} against {rep['target_fullness']:.3f}: not settled",
        )
    return out


def _write_journal(journal: Path, disk: Disk, target: LayoutTarget, seed: int) -> None:
    """The ops ``disk`` ran, as a Workload: what was done stays replayable even when the
    match failed half way."""
    from fsage.workload import write_workload

    try:
        write_workload(journal, match_header(disk, target, seed), disk.ops)
    except OSError as exc:
        raise WorkloadError(f"cannot write the journal {journal}: {exc.strerror}") from None


def match_layout(
    path: Path,
    target: LayoutTarget,
    *,
    seed: int = 0,
    time_limit: float = 600.0,
    mode: str = "auto",
    say: Callable[[str], None] | None = None,
    journal: Path | None = None,
    force: bool = False,
    db: Path | None = None,
) -> MatchResult:
    """Age the mounted directory or image ``path`` until its layout matches ``target``
    (``mode``: see ``open_disk``). The match is recorded like any aging run (a record beside
    the target, a journal of the ops that took effect: see ``match_record``); ``journal``:
    where to write a copy of those ops as well (``fsage age OTHER --ops JOURNAL`` runs them
    again). ``force``: start even where an earlier run stopped before its end. ``db``: the
    run is recorded in its ``aging_runs`` as well."""
    if not path.exists():
        raise UsageError(f"{path}: no such file or directory")
    if not math.isfinite(time_limit) or time_limit <= 0:
        raise UsageError("the time limit must be a positive number of seconds")
    refuse_unfinished(path, force)
    return _match(path, target, seed, time_limit, mode, say, journal, None, db)


def resume_match(
    path: Path,
    say: Callable[[str], None] | None = None,
    db: Path | None = None,
    mode: str | None = None,
    seed: int | None = None,
) -> MatchResult:
    """Continue the match that stopped on ``path`` (killed, interrupted or failed), with the
    target, seed, time limit and way of reaching it of its record; ``db``: as for
    ``match_layout``. A ``mode`` or ``seed`` given must be the record's."""
    if not path.exists():
        raise UsageError(f"{path}: no such file or directory")
    record = interrupted_match(path)
    if record is None:
        raise UsageError(f"{path}: no interrupted match to resume")
    ident = record["ident"]
    data = ident.get("target")
    source = data.get("source") if isinstance(data, dict) else None
    target = LayoutTarget.from_json(data, str(source or f"{path}: the record's target"))
    rec_seed = int(ident.get("seed", 0))
    if seed is not None and seed != rec_seed:
        raise UsageError(f"{path}: the interrupted match used seed {rec_seed}")
    rec_mode = str(record.get("mode", "auto"))
    if mode not in (None, "auto") and rec_mode not in ("auto", mode):
        raise UsageError(f"{path}: the interrupted match ran {rec_mode}, not {mode}")
    limit = float(ident.get("time_limit", 600.0))
    return _match(path, target, rec_seed, limit, rec_mode, say, None, record, db)


def _match(
    path: Path,
    target: LayoutTarget,
    seed: int,
    time_limit: float,
    mode: str,
    say: Callable[[str], None] | None,
    journal: Path | None,
    record: dict[str, Any] | None,
    db: Path | None = None,
    again: int = 2,
) -> MatchResult:
    """``again``: how many times a match matched while mounted and not once unmounted may
    mount the image again and go on with its rounds from the state left on disk."""
    from fsage.ager.images import image_kind

    # An ext image is judged by the offline reader once unmounted: the state left on disk,
    # not what the kernel showed while mounted (its reservations and unflushed metadata).
    offline_after = path.is_file() and image_kind(path) == "ext"
    # An xfs image: by the live reader on a read-only mount once unmounted (see match_xfs).
    xfs_after = path.is_file() and image_kind(path) == "xfs"
    live: MeasuredState | None = None
    kind, block_size = probe(path)
    if block_size:  # else open_disk says what the path is not
        check_target(target, str(path), kind, block_size, MAX_FULLNESS)
    with open_disk(path, mode, resume=record is not None) as disk:
        if record is None:
            check_room(target, str(path), disk.fullness())
            rec = start_record(path, disk, target, seed, time_limit)
        else:
            rec = resume_record(path, disk, record)
            for note in rec.notices:
                if say is not None:
                    say(f"fsage: {note}")
            if not (rec.kept and rec.phase == "fill"):  # a fill's spacers are in its room
                check_room(target, str(path), disk.fullness())
        run_id = start_run_row(db, path, disk, rec)
        try:
            if not rec.kept:  # else its area is there, with the files the rounds go on from
                disk.prepare()
            if isinstance(disk, OfflineDisk) and say is not None:
                say(f"fsage: {OFFLINE_NOTICE}")
            matcher = Matcher(disk, target, seed=seed, time_limit=time_limit, say=say)
            matcher.on_phase = rec.set_phase
            matcher.on_fill = rec.set_fill
            if rec.kept and rec.phase == "fill" and rec.fill is not None:
                matcher.resume_fill(rec.fill)
            elif rec.kept:
                matcher.adopt()
            try:
                res = matcher.run(adopted=rec.kept and rec.phase == "rounds")
                if not (offline_after or xfs_after):
                    live = matcher.snapshot()
            except OSError as exc:
                raise WorkloadError(f"matching {path}: {exc}") from None
            except WorkloadError as exc:
                raise WorkloadError(f"matching {path}: {exc}") from None
            finally:
                if journal is not None:
                    _write_journal(journal, disk, target, seed)
        except BaseException as exc:
            # Stopped by an error or Ctrl-C between two ops: the journal holds exactly what
            # ran, and --resume goes on from it.
            rec.ops = rec.base_ops + len(disk.ops)
            with contextlib.suppress(Exception):
                rec.save(finished=False, clean=True)
            rec.close()
            with contextlib.suppress(Exception):
                status = "failed" if isinstance(exc, Exception) else "interrupted"
                notes = [f"{type(exc).__name__}: {exc}"]
                finish_run_row(db, run_id, status, rec, {}, notes)
            raise
        rec.ops = rec.base_ops + len(disk.ops)
        # A kernel-path match of an image is finished once the state left on disk is judged
        # (see below); until then its record says where --resume would go on.
        kernel_image = (offline_after or xfs_after) and not isinstance(disk, OfflineDisk)
        rec.save(finished=not kernel_image, clean=True)
        rec.close()
    if xfs_after:
        from fsage.ager.match_xfs import read_after_unmount

        final = read_after_unmount(path)
        res.measured_by = "the live reader on a read-only mount after unmount"
    elif live is None:
        from fsage.snapshotter.ext import read_ext_layout

        final = measure(read_ext_layout(path))
        res.measured_by = "the offline reader after unmount"
    else:
        final = live
        res.measured_by = "the live reader" + (" before unmount" if path.is_file() else "")
    res.report = compare(target, final.target, final.free_known)
    was = res.matched
    res.matched = bool(res.report["matched"])
    if was and not res.matched:
        res.stop = f"matched while aging, not as measured by {res.measured_by}"
    elif res.matched and not was:
        res.stop = f"matched as measured by {res.measured_by}"
    if kernel_image and was and not res.matched and again > 0 and res.elapsed < time_limit:
        # The kernel's preallocations, freed at unmount, join holes the rounds had judged
        # (a mail target's free-space TV 0.093 while mounted, 0.144 unmounted): mounted
        # again, without them, the rounds go on from the files on disk.
        if say is not None:
            tv = res.report.get("free_tv")
            say(
                f"fsage: matched while mounted, not once unmounted (free-space TV "
                f"{'unknown' if tv is None else f'{tv:.3f}'}): mounted again, the rounds go on"
            )
        finish_run_row(db, run_id, "finished", rec, {"matched": False}, ["mounted again"])
        more = _match(
            path, target, seed, time_limit - res.elapsed, mode, say, None,
            interrupted_match(path), db, again - 1,
        )  # fmt: skip
        more.elapsed += res.elapsed
        more.rounds += res.rounds
        more.files_written += res.files_written
        more.bytes_written += res.bytes_written
        more.resumed = record is not None
        more.notices = [
            *rec.notices,
            "matched while mounted, not once unmounted: mounted again, the rounds went on "
            "from the files on disk",
        ]
        if journal is not None:
            shutil.copyfile(more.journal, journal)
        return more
    if kernel_image:
        rec.save(finished=True)
    res.reasons = (
        {} if res.matched else _reasons(res.report, matcher.last_actions, matcher.locality_reason)
    )
    plan = matcher.groups_plan
    if "free space" in res.reasons and plan is not None and plan.notes:
        res.reasons["free space"] += "; " + "; ".join(plan.notes)  # what xfs's groups cannot give
    res.target = str(path)
    res.offline = isinstance(disk, OfflineDisk)
    res.journal = str(rec.journal.path)
    res.resumed = record is not None
    res.notices = rec.notices
    metrics = {
        "elapsed_s": res.elapsed,
        "matched": res.matched,
        "rounds": res.rounds,
        "stopped_by": res.stop,
        "free_tv": res.report.get("free_tv"),
        "fullness": res.report.get("fullness"),
        "files_written": res.files_written,
    }
    notes = rec.notices + [f"{k}: {v}" for k, v in res.reasons.items()]
    finish_run_row(db, run_id, "finished", rec, metrics, notes, res.bytes_written)
    return res
