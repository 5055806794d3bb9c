"""``fsage age``: pick the executor for a target, run a generated or recorded op stream on it,
take snapshots along the way, and keep a resumable record.

Targets:
- a directory (typically a mounted file system): POSIX calls;
- an ext image: loop-mounted and aged through the kernel when fsage runs as root with loop
  devices (the realistic allocator), else offline through libext2fs (with a notice);
- an LFS image: ``fsage.lfs.executor.LfsExecutor``, when that module exists.

The record (a JSON file: ``.fsage-age`` inside a directory target, ``<image>.fsage-age`` beside an
image) holds the op index reached and, for generated workloads, the generator's state; Ctrl-C
stops between two ops, so the target is consistent and the record exact, and ``--resume``
continues from it. After a kill, ``--resume`` takes what ran since the record from the journal
and checks a directory target's tree against the journal's (``fsage.ager.reconcile``), for the
op that was running may have taken effect without its journal line.

The targets and the options that choose them are in ``fsage.ager.targets``, the record and the
journal in ``fsage.ager.runjournal``, the ``aging_runs`` table in ``fsage.ager.agingruns``, what
a run starts from (a resume's workload, the shaped profile) in ``fsage.ager.runstart``, the
result in ``fsage.ager.ageresult`` and the stop on a signal in ``fsage.ager.interrupt``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from fsage.ager.ageresult import AgeResult, _limit_notice
from fsage.ager.agingruns import (
    AgingRun,
    _finish_aging_run,
    _merged_metrics,
    _missed_snapshot,
    _reopen_aging_run,
    _resumable_run,
    _start_aging_run,
    aging_runs,
)
from fsage.ager.generator import PROBE_EVERY, Generator, Probe, meta_kind
from fsage.ager.interrupt import _Interrupt
from fsage.ager.posix import InFlightError, record_path_for
from fsage.ager.reconcile import Difference, Tree, load_tree
from fsage.ager.resume import ProbeLog, ReplayError, probes_path, replay
from fsage.ager.runjournal import (
    _as_named_by,
    _busy,
    _changes,
    _compare_with_journal,
    _data_bytes,
    _describe,
    _drain,
    _in_part,
    _Journal,
    _journal_path,
    _journaled_ops,
    _lfs_durable,
    _lost_in_flight,
    _read_record,
    _rng_state_from_json,
    _rng_state_to_json,
    _save_start_tree,
    _start_tree,
    _start_tree_path,
    _stepper,
    _write_record,
)
from fsage.ager.runjournal import _op_line as _op_line  # re-exported: tests build journal lines
from fsage.ager.runstart import (
    _setup,
    _skip_ran,
    recorded_options,
    resume_options,
    shape_profile,
)
from fsage.ager.targets import RESERVE_PARAM, AgeOptions, Target, open_target
from fsage.ager.targets import _layout_entries as _layout_entries  # re-exported
from fsage.errors import FsageError, UsageError, WorkloadError
from fsage.workload import NoSpaceError, Op, OpFailedError, WorkloadHeader, read_workload

RECORD_EVERY = 1000


def age(
    target_path: Path, opts: AgeOptions, echo: Callable[[str], None] | None = None
) -> AgeResult:
    """Age ``target_path`` with a generated (``opts.profile``) or recorded (``opts.ops_file``)
    workload; see the module doc. With ``opts.resume`` the workload comes from the record, and
    a profile, op stream or seed given as well must be the record's."""
    if not opts.resume and (opts.profile is None) == (opts.ops_file is None):
        raise UsageError("give exactly one of a profile or an op stream")
    if opts.profile is not None and opts.ops_file is not None:
        raise UsageError("give exactly one of a profile or an op stream")
    say = echo or (lambda s: None)
    resume_notes: list[str] = []
    if opts.resume:
        # The run goes on as it was asked for: the options not given again are the record's
        # (kept beside the image as named, or beside the file a symlink names).
        near = [record_path_for(Path(os.path.realpath(target_path))), record_path_for(target_path)]
        record = next((r for r in map(_read_record, near) if r), {})
        if record.get("finished") is not False:  # said first: not a complaint about options
            said = " (its last run finished)" if record else ""
            raise UsageError(f"{target_path}: no interrupted run to resume{said}")
        opts, resume_notes = resume_options(Path(target_path), opts, record)
    opts = replace(
        opts,
        data=opts.data or "write",
        fsync=bool(opts.fsync),
        snapshot_every=opts.snapshot_every or 0,
    )
    if opts.snapshot_every and opts.db is None:
        raise UsageError("--snapshot-every needs --db")
    with _Interrupt() as intr:
        tgt = open_target(Path(target_path), opts)
        try:
            res = _run(tgt, Path(target_path), opts, say, intr, resume_notes)
        except BaseException:
            # The first error is the one shown: closing after it may fail too (a full log).
            with contextlib.suppress(Exception):
                tgt.close()
            raise
        tgt.close()
    return res


def _run(
    tgt: Target,
    path: Path,
    opts: AgeOptions,
    say: Callable[[str], None],
    intr: _Interrupt,
    resume_notes: list[str],
) -> AgeResult:
    res = AgeResult(target=str(path), description=tgt.executor.description)
    res.notices.extend(tgt.notices)
    res.notices.extend(resume_notes)
    for n in res.notices:
        say(f"fsage: {n}")
    record = _read_record(tgt.record_path)
    unfinished = bool(record) and record.get("finished") is False
    if opts.resume and not unfinished:
        raise UsageError(f"{path}: no interrupted run to resume")
    if unfinished and not opts.resume and not opts.force:
        raise UsageError(
            f"{path}: an earlier run stopped at op {record.get('ops_done')}; "
            "use --resume to continue it or --force to start another"
        )
    if not opts.resume:
        record = {}
    seed = opts.seed or 0

    gen: Generator | None = None
    ident: dict[str, Any]
    ops: Iterator[Op]
    header: WorkloadHeader
    start = int(record.get("ops_done", 0)) if opts.resume else 0
    bytes_written = int(record.get("bytes_written", 0)) if opts.resume else 0
    # After a run killed between two records, the journal holds the ops that ran after the
    # last one: they are not run again.
    ran_after: list[Op] = []
    journal_keep: int | None = None
    old_journal = Path(record["journal"]) if opts.resume and record.get("journal") else None
    if old_journal is not None and old_journal.is_file():
        ran_after, journal_keep = _Journal.tail(old_journal, int(record.get("journal_bytes", 0)))
    elif old_journal is not None:
        old_journal = None
    # A run killed while an op ran may have left that op's effect, whole or in part, without
    # its journal line: the tree on disk is checked against the one the journal replays to.
    unclean = opts.resume and not record.get("clean", False)
    if unclean and old_journal is not None and tgt.kind == "offline-ext":
        raise FsageError(
            f"{path}: the offline run was killed: libext2fs keeps the image's bitmaps, group "
            "descriptors and inodes in memory until it closes, so the image holds neither its "
            "journal's ops nor those of its record (check it with e2fsck -fn); it cannot be "
            "resumed: age a fresh image"
        )
    if unclean and old_journal is not None and tgt.kind == "lfs":
        ran_after, journal_keep, back = _lfs_durable(
            tgt, old_journal, ran_after, journal_keep, res, say
        )
        if back is not None:  # the image lost ops journaled before the record too
            if opts.ops_file is not None:  # the stream is skipped from its start
                start, bytes_written = 0, 0
            else:  # the generator goes on from the tree on disk
                start -= len(back)
                bytes_written -= _data_bytes(back)
                ran_after = []
    bytes_written += _data_bytes(ran_after)
    found: Difference | None = None
    journaled: Tree = {}
    if unclean and old_journal is not None:
        found, journaled = _compare_with_journal(tgt, old_journal, opts, res, say)
    # A new run's journal, and the tree it starts on (a generated run keeps clear of it).
    new_journal = _journal_path(tgt.record_path)
    start_tree: Tree = {}
    start_inodes: dict[str, int] = {}
    if old_journal is None and (opts.ops_file is None or tgt.tree_root() is not None):
        start_tree, start_inodes = _start_tree(tgt)
    plog: ProbeLog | None = None
    #: The stream goes on as it would have without the stop (a recorded stream, or a
    #: generator replayed through the journal).
    exact_resume = False
    repair: Op | None = None  # the op that took effect unjournaled: journaled, not run again
    undo: Op | None = None  # what takes back the part of an op that took effect in part
    rerun: Op | None = None  # the next op, which took effect in part: it runs again
    if opts.ops_file is not None:
        bs, total, _ = tgt.executor.capacity_blocks()
        header, ops = read_workload(opts.ops_file, capacity=bs * total)
        # A parameter the stream ran with that is no op: ext4's reserve on fsage's mount.
        reserve = header.params.get(RESERVE_PARAM)
        if isinstance(reserve, int) and not isinstance(reserve, bool):
            note = tgt.set_reserve(reserve)
            if note:
                res.notices.append(note)
                say(f"fsage: {note}")
        ident = {"kind": "ops", "ops_file": str(opts.ops_file), "header": header.to_json()}
        if opts.resume and record.get("ident", {}).get("header") != ident["header"]:
            raise UsageError(f"{path}: the op stream {opts.ops_file} changed since the run stopped")
        ops = itertools.islice(ops, start, None)
        start += _skip_ran(ops, ran_after)
        exact_resume = True
    else:
        assert opts.profile is not None
        profile = opts.profile
        bs, total, _ = tgt.executor.capacity_blocks()

        def probe() -> tuple[int, int, int]:
            if anchored:  # an anchor counts what writeback and commits have yet to settle
                tgt.executor.apply(Op("sync"))
            return tgt.executor.capacity_blocks()

        reach = tgt.max_fill()
        if reach is not None and profile.fill > reach:
            raise UsageError(
                f"{path}: fill {profile.fill:g} cannot be reached: the clean segments the log "
                f"keeps back leave at most {reach:.3f} (use --fill {reach - 0.005:.2f} or less)"
            )
        journal_file = old_journal if old_journal is not None else new_journal
        plog_path = probes_path(journal_file)
        ident = {"kind": "profile", "profile": profile.to_json(), "seed": seed}
        adopt = bool(record.get("ident", {}).get("adopt")) if opts.resume else opts.adopt
        if adopt:
            ident["adopt"] = True
        # A kernel's used-block count after the same ops differs from run to run by a few
        # blocks (journal commits, writeback): steered by it, two runs of one seed, or a run
        # and its resume, would part where a decision lies near its threshold. There the probe
        # only anchors the generator's model (at the start and after ENOSPC, both kept in the
        # probe log), and the model carries the run.
        anchored = meta_kind(tgt.kind)
        probe_every = None if anchored else PROBE_EVERY
        exact = not opts.resume or (old_journal is not None and ProbeLog.usable(plog_path))

        def new_generator(prober: Probe | None) -> Generator:
            return Generator(
                profile,
                seed,
                total * bs,
                probe=prober,
                block_size=bs,
                probe_every=probe_every,
                meta=anchored,
            )

        if exact:
            plog = ProbeLog(plog_path, probe, resume=opts.resume)
            gen = new_generator(plog)
            if opts.resume:
                assert old_journal is not None and journal_keep is not None
                _setup(gen, load_tree(_start_tree_path(old_journal)), adopt)
                try:
                    ops = replay(gen, _journaled_ops(old_journal, journal_keep))
                except ReplayError as exc:
                    plog.close()
                    plog = None
                    res.notices.append(
                        f"the run cannot go on as it would have without the stop ({exc}): its "
                        "generator goes on from the tree on disk"
                    )
                    say(f"fsage: {res.notices[-1]}")
                    exact = False
                else:
                    start = gen.stats.ops
                    exact_resume = True
            else:
                _setup(gen, start_tree, adopt)
                ops = gen.ops()
        if not exact:
            # No probes kept (a run an older fsage began), or a journal the generator does not
            # make: it takes the tree on disk and the random state of the last record.
            gen = new_generator(probe)
            gen.adopt(tgt.walk())
            st = record.get("gen", {})
            start += len(ran_after)
            if found is not None and found.op is not None:
                repair = found.op  # the generator takes the tree on disk as it is
                start += 1
                bytes_written += _data_bytes([repair])
            gen.stats.ops = start
            gen.stats.bytes_written = bytes_written
            gen.stats.phase = st.get("phase", "fill")
            gen.stats.fill_ops = st.get("fill_ops")
            gen.stats.fill_bytes = st.get("fill_bytes")
            gen.rng.setstate(_rng_state_from_json(st["rng"]))
            ops = gen.ops()
        assert gen is not None
        header = gen.header()
    if exact_resume and found is not None and found.op is not None:
        # The stream says which op was running: the difference is that op, whole or in
        # part (then it runs again, after what it appended is cut off).
        nxt = next(ops, None)
        effect = _as_named_by(found, nxt)
        if nxt is not None and nxt == effect:
            repair = nxt
            start += 1
            bytes_written += _data_bytes([nxt])
        elif nxt is not None and _in_part(nxt, effect):
            rerun = nxt
            if nxt.op == "append":
                undo = Op("truncate", nxt.path, size=journaled[nxt.path].size)
        if nxt is not None and repair is None:
            ops = itertools.chain([nxt], ops)
    res.resumed_from = start
    # A run killed between an op and its journal line, on a target whose tree could not be
    # checked against the journal: that op may have taken effect; a namespace op that then
    # fails as already done is counted as done.
    settled = found is not None and (not found.paths or repair is not None or rerun is not None)
    in_flight = unclean and not settled
    kill_notice = ""
    if found is not None and found.paths and not settled:
        kill_notice = (
            f"the target differs from its journal by more than the op running when the run "
            f"was killed can have done ({len(found.paths)} paths, e.g. {found.paths[0]!r}): "
            "the journal will not replay to it exactly"
        )
    elif repair is not None:
        kill_notice = (
            f"the op running when the run was killed ({_describe(repair)}) had taken effect "
            "without its journal line: journaled now, not run again"
        )
    elif rerun is not None:
        kill_notice = (
            f"the op running when the run was killed ({_describe(rerun)}) had taken effect "
            "in part: it runs again" + (" on the file's length before it" if undo else "")
        )
    if opts.resume:
        say(f"fsage: resuming at op {start}")
        if gen is not None and exact_resume:
            res.notices.append(
                f"the generator ran again through the journal (op {res.resumed_from:,}): the "
                "run goes on with the ops it would have made without the stop"
            )
            say(f"fsage: {res.notices[-1]}")
        if ran_after:
            res.notices.append(
                f"the run had stopped without a clean record: {len(ran_after)} ops it ran "
                "after its last record were taken from its journal"
            )
            say(f"fsage: {res.notices[-1]}")
        if kill_notice:
            res.notices.append(kill_notice)
            say(f"fsage: {kill_notice}")

    if old_journal is not None:
        journal = _Journal(old_journal, None, journal_keep)
        if undo is not None:
            tgt.executor.apply(undo)
        if repair is not None:
            journal.add(repair)
    else:
        jheader = WorkloadHeader(
            generator="fsage.age/journal",
            params={"workload": ident, "target": str(path), "source_header": header.to_json()},
            seed=seed if gen is not None else header.seed,
        )
        journal = _Journal(new_journal, jheader, None)
        _save_start_tree(journal.path, start_tree, start_inodes)
    res.journal = str(journal.path)

    store_cm: Any = contextlib.nullcontext(None)
    if opts.db is not None:
        from fsage.db.store import Store

        store_cm = Store.open(opts.db, create=True)
    # The store's rule names the file system (its label, else its uuid, or the name it was
    # recorded under), as `fsage snapshot` does; --name, also from the resumed run's record.
    name: str | None = opts.name or record.get("name")
    start_bytes = bytes_written
    params: dict[str, Any] = {
        "workload": ident,
        "mode": opts.mode,
        "snapshot_every": opts.snapshot_every,
        "name": name,
        "resumed_from": start,
        "start_bytes": bytes_written,
        "fsync": opts.fsync,
        "policy": opts.policy,
        "data": opts.data,
        "description": tgt.executor.description,
        "journal": str(journal.path),
    }

    done = start
    # The aging_runs row: the interrupted run's, continued, where the database holds it.
    kept = record.get("options") if opts.resume else None
    kept_run = kept.get("run_id") if isinstance(kept, dict) else None
    run_id: int | None = None
    # How the target was reached (recorded so --resume reaches it the same way).
    tgt_mode = "offline" if tgt.kind == "offline-ext" else "auto"
    if tgt.kind.startswith("mounted"):
        tgt_mode = "mount"

    def save(finished: bool, clean: bool = False) -> None:
        _drain(tgt.executor)  # every op counted has run, and is in the journal
        data: dict[str, Any] = {
            "ident": ident,
            "ops_done": done,
            "bytes_written": bytes_written,
            "finished": finished,
            "clean": clean or finished,
            "mode": tgt_mode,
            "data": opts.data,
            "journal": str(journal.path),
            "journal_bytes": journal.bytes,
            "updated": time.time(),
            "options": recorded_options(opts, run_id),
        }
        if name is not None:
            data["name"] = name
        if gen is not None:
            data["gen"] = {
                "phase": gen.stats.phase,
                "fill_ops": gen.stats.fill_ops,
                "fill_bytes": gen.stats.fill_bytes,
                "rng": _rng_state_to_json(gen.rng.getstate()),
            }
        _write_record(tgt.record_path, data)

    t0 = time.perf_counter()
    cpu0 = os.times()
    apply_s = 0.0
    snap_s = 0.0
    last_draw = t0
    progress = opts.progress
    # A generated workload's ops run ahead on a directory target's worker thread (never the
    # first op after an unclean stop, which may have run already: it runs here).
    ahead = gen is not None
    step = _stepper(tgt.executor, journal, ahead and not in_flight)
    busy_before = 0.0  # by executors replaced at snapshots
    last_snap = [-1]
    clock = time.perf_counter
    with store_cm as store:

        def snapshot(label: str) -> None:
            nonlocal step, snap_s, busy_before, name
            if store is None:
                return
            ts = clock()
            _drain(tgt.executor)
            old, busy = tgt.executor, _busy(tgt.executor)
            layout = tgt.layout()
            if tgt.executor is not old:  # reopened: its count starts again
                busy_before += busy or 0.0
            step = _stepper(tgt.executor, journal, ahead)
            summ = store.add_snapshot(
                layout, name=name, op_count=done, bytes_written=bytes_written, label=label
            )
            res.snapshots.append(int(summ.snapshot_id))
            name = summ.fs_name
            last_snap[0] = done
            snap_s += clock() - ts

        def timing() -> dict[str, Any]:
            wall = clock() - t0
            cpu1 = os.times()
            res.cpu_user_s = cpu1.user - cpu0.user
            res.cpu_system_s = cpu1.system - cpu0.system
            work = wall - snap_s
            # The executor's time: its own count of the time ops ran where it keeps one (ops
            # run ahead overlap generating: the time in its calls would not show them), else
            # the time in its calls.
            busy = _busy(tgt.executor)
            executor_s = apply_s if busy is None else busy_before + busy
            res.own_share = (work - executor_s) / work if work > 0 else 0.0
            return {
                "elapsed_s": wall,
                "snapshot_s": snap_s,
                "executor_s": executor_s,
                "cpu_user_s": res.cpu_user_s,
                "cpu_system_s": res.cpu_system_s,
                "own_share": res.own_share,
            }

        fill_mark: tuple[int, Any] | None = None  # (op index, counters) when the fill ended
        earlier: AgingRun | None = None  # the row as the interrupted part left it
        if store is not None and opts.resume:
            earlier = _resumable_run(store, kept_run, journal.path, tgt.kind)
            if earlier is None and kept_run is not None:
                res.notices.append(
                    f"the interrupted run's row {kept_run} is not in {opts.db} (or is of "
                    "another target): the run from here is recorded in a row of its own"
                )
                say(f"fsage: {res.notices[-1]}")
        if store is not None and earlier is not None:
            _reopen_aging_run(store, earlier, start)
            run_id = earlier.id
            fill_mark = tgt.carry_counters(earlier.metrics)
        elif store is not None:
            run_id = _start_aging_run(store, tgt.kind, path, params)
        res.run_id = run_id
        # Written once the row is known, so that a stop from here on resumes into it.
        save(False)

        def finish(status: str, part: dict[str, Any], utilization: Any, notes: list[str]) -> None:
            """The row's end: the whole run's where it continues the interrupted part."""
            assert store is not None and run_id is not None
            snaps, first_op, first_bytes = res.snapshots, start, start_bytes
            if earlier is not None:
                snaps = [s for s in (earlier.first_snap, earlier.last_snap) if s is not None]
                snaps += res.snapshots
                first_op = int(earlier.params.get("resumed_from", 0))
                # A row of an older fsage keeps no start_bytes: its part's bytes are its own.
                first_bytes = int(
                    earlier.params.get("start_bytes", start_bytes - earlier.bytes_written)
                )
                part = _merged_metrics(earlier.metrics, part)
                notes = [*earlier.notes, f"resumed at op {start:,}", *notes]
            _finish_aging_run(
                store,
                run_id,
                name=name,
                status=status,
                ops=done - first_op,
                bytes_written=bytes_written - first_bytes,
                snapshots=snaps,
                metrics=part,
                utilization=utilization,
                notes=notes,
            )

        try:
            if store is not None and start == 0 and (earlier is None or earlier.first_snap is None):
                snapshot("start")
            elif store is not None and _missed_snapshot(store, earlier, start, opts.snapshot_every):
                # killed after the op that was to be snapshotted, before its snapshot: take it
                # now, at the op count a run never stopped takes it at
                snapshot(f"op {start}")
            # A signal while the run was set up: it stops before its first op.
            for op in iter(()) if intr.hit else ops:
                if fill_mark is None and gen is not None and gen.stats.phase != "fill":
                    fill_mark = (done, tgt.counters_mark())
                ta = clock()
                try:
                    bytes_written += step(op)
                except NoSpaceError:
                    res.nospace += 1
                    if gen is not None:
                        gen.nospace(op)
                    else:
                        res.skipped += 1
                except OpFailedError:
                    if in_flight and op.op in ("mkdir", "delete", "rename", "link"):
                        res.notices.append(f"{op.op} {op.path!r} had already run before the stop")
                        say(f"fsage: {res.notices[-1]}")
                        journal.add(op)
                    elif gen is not None or not res.nospace:
                        raise
                    else:
                        res.skipped += 1  # a recorded stream after a skipped op: keep going
                apply_s += clock() - ta
                if in_flight:
                    in_flight = False
                    step = _stepper(tgt.executor, journal, ahead)
                done += 1
                if op.op == "snapshot" or (opts.snapshot_every and done % opts.snapshot_every == 0):
                    snapshot(op.label or f"op {done}")
                if done % RECORD_EVERY == 0:
                    save(False)
                if progress and done & 63 == 0:
                    now = clock()
                    if now - last_draw > 0.5:
                        last_draw = now
                        rate = (done - start) / (now - t0)
                        full = tgt.executor.fullness()
                        sys.stderr.write(
                            f"\r  {done} ops  {rate:,.0f} ops/s  fullness {full:.3f}  "
                            f"{bytes_written / 2**20:,.0f} MiB written "
                        )
                        sys.stderr.flush()
                if intr.hit:
                    break
            res.interrupted = intr.hit
            res.signal = intr.signum
            res.finished = not intr.hit
            res.ops = done
            res.bytes_written = bytes_written
            if res.interrupted:
                res.stopped_by = "interrupted"
            elif gen is not None:
                res.stopped_by = gen.stats.stopped_by
            else:
                res.stopped_by = "end-of-stream"
            if hasattr(tgt.executor, "sync"):
                tgt.executor.sync()
            save(res.finished, clean=True)
            if store is not None and not res.interrupted and last_snap[0] != done:
                snapshot("end")
        except BaseException as exc:
            # The record says exactly where the run stopped: the op that failed (or was
            # interrupted) did not take effect, and --resume runs it again. Ops run ahead
            # that failed or were queued after a failure did not run either.
            lost = exc if isinstance(exc, InFlightError) else _lost_in_flight(tgt.executor)
            if lost is not None:
                done -= lost.lost_ops
                bytes_written -= lost.lost_bytes
            with contextlib.suppress(Exception):
                save(False, clean=True)
            journal.close()
            if plog is not None:
                plog.close()
            if store is not None and run_id is not None:
                status = "failed" if isinstance(exc, Exception) else "interrupted"
                fail_metrics: dict[str, Any] | None = None
                fail_util: dict[str, Any] | None = None
                with contextlib.suppress(Exception):  # what the run did up to the error
                    fail_metrics, fail_util = tgt.run_metrics(fill_mark)
                    fail_metrics = {
                        "elapsed_s": time.perf_counter() - t0,
                        "nospace": res.nospace,
                        "skipped": res.skipped,
                        **fail_metrics,
                    }
                with contextlib.suppress(Exception):
                    finish(
                        status,
                        {**timing(), **(fail_metrics or {})},
                        fail_util,
                        [f"{type(exc).__name__}: {exc}"],
                    )
            raise
        journal.close()
        if plog is not None:
            plog.close()
        res.changes = _changes(journal.path, opts)
        times = timing()
        if gen is not None and _limit_notice(res, gen, tgt):
            say(f"fsage: {res.notices[-1]}")
        if store is not None and run_id is not None:
            metrics, utilization = tgt.run_metrics(fill_mark)
            metrics = {
                **times,
                "nospace": res.nospace,
                "skipped": res.skipped,
                "stopped_by": res.stopped_by,
                **metrics,
            }
            finish(
                "interrupted" if res.interrupted else "finished", metrics, utilization, res.notices
            )
    if progress:
        sys.stderr.write("\n")
    res.elapsed = time.perf_counter() - t0
    res.fullness = tgt.executor.fullness()
    if gen is not None:
        res.phase = gen.stats.phase
        if gen.profile.mode == "convergence":
            res.convergence = gen.convergence_report()
    return res


__all__ = [
    "AgeOptions",
    "AgeResult",
    "AgingRun",
    "FsageError",
    "WorkloadError",
    "age",
    "aging_runs",
    "open_target",
    "shape_profile",
]
