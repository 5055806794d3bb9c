"""Where a run of ``fsage age`` starts: the profile as the options shape it, the options an
interrupted run's record gives ``--resume`` (workload, seed, mode, data, name, database,
snapshot cadence, fsync, cleaning policy), the tree a new generator starts on, and the ops of a
recorded stream that ran before the stop."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from fsage.ager.generator import Generator
from fsage.ager.profile import Profile
from fsage.ager.reconcile import Tree
from fsage.ager.resume import tree_entries
from fsage.ager.targets import AgeOptions
from fsage.errors import UsageError, WorkloadError
from fsage.workload import Op


def shape_profile(
    profile: Profile,
    *,
    fill: float | None = None,
    churn: float | None = None,
    ops_limit: int | None = None,
) -> Profile:
    """``profile`` with the options a user gave explicitly. A --fill or --churn given without
    --ops-limit lifts the profile's own op limit (hfs-aging's 10,000 ops), so the run stops on
    what was asked, not on a limit the user did not choose."""
    shaped = profile.with_overrides(fill=fill, churn=churn, ops_limit=ops_limit)
    if ops_limit is None and (fill is not None or churn is not None):
        shaped = replace(shaped, ops_limit=None)
    return shaped


def _workload_from_record(path: Path, opts: AgeOptions, record: dict[str, Any]) -> AgeOptions:
    """The options of the interrupted run in ``record``; refuse anything given that differs."""
    ident = record.get("ident") or {}
    if ident.get("kind") == "ops":
        rec_ops = Path(str(ident.get("ops_file")))
        if opts.shape:
            given = ", ".join(f"--{k.replace('_', '-')}" for k in sorted(opts.shape))
            raise UsageError(
                f"{path}: {given} shape a generated workload; the interrupted run ran the op "
                f"stream {rec_ops}"
            )
        if opts.profile is not None:
            raise UsageError(
                f"{path}: the interrupted run ran the op stream {rec_ops}, not a profile"
            )
        if opts.ops_file is not None and Path(os.path.realpath(opts.ops_file)) != Path(
            os.path.realpath(rec_ops)
        ):
            raise UsageError(f"{path}: the interrupted run ran the op stream {rec_ops}")
        return replace(opts, ops_file=rec_ops, mode=_record_mode(path, opts, record))
    if ident.get("kind") == "match":
        raise UsageError(f"{path}: the interrupted run is a match: resume it with --resume alone")
    if ident.get("kind") != "profile" or "profile" not in ident:
        raise UsageError(f"{path}: the record of the interrupted run is unreadable")
    rec_profile = Profile.from_json(ident["profile"], name=str(ident["profile"].get("name", "")))
    if opts.ops_file is not None:
        raise UsageError(f"{path}: the interrupted run generated profile {rec_profile.name}")
    if opts.profile is not None:
        given = json.loads(json.dumps(opts.profile.to_json()))
        if given != ident["profile"]:
            diff = sorted(
                k
                for k in set(given) | set(ident["profile"])
                if given.get(k) != ident["profile"].get(k)
            )
            raise UsageError(
                f"{path}: the interrupted run used profile {rec_profile.name} with other "
                f"settings ({', '.join(diff)}); resume without --profile and its options"
            )
    _check_shape(path, opts.shape, rec_profile)
    rec_seed = int(ident.get("seed", 0))
    if opts.seed is not None and opts.seed != rec_seed:
        raise UsageError(f"{path}: the interrupted run used seed {rec_seed}")
    return replace(opts, profile=rec_profile, seed=rec_seed, mode=_record_mode(path, opts, record))


def _check_shape(path: Path, given: dict[str, Any], profile: Profile) -> None:
    """--fill, --churn or --ops-limit given again without --profile: each must be what the
    interrupted run's profile had (the generator's state follows from them)."""
    for key, value in sorted(given.items()):
        had = getattr(profile, key)
        if value != had:
            said = "no op limit" if had is None else f"{key.replace('_', ' ')} {_num(had)}"
            raise UsageError(
                f"{path}: --{key.replace('_', '-')} {_num(value)} contradicts the interrupted "
                f"run's {said}; resume without it"
            )


def _num(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def recorded_options(opts: AgeOptions, run_id: int | None) -> dict[str, Any]:
    """What a run's record keeps of its options beside its workload, seed, mode, data and
    name, so that --resume goes on recording as the run was asked to (``run_id``: its row in
    the database's ``aging_runs``, which a resume continues)."""
    return {
        "db": None if opts.db is None else os.path.abspath(opts.db),
        "snapshot_every": opts.snapshot_every or 0,
        "fsync": bool(opts.fsync),
        "policy": opts.policy,
        "run_id": run_id,
    }


def resume_options(
    path: Path, opts: AgeOptions, record: dict[str, Any]
) -> tuple[AgeOptions, list[str]]:
    """The options of the interrupted run in ``record`` with what was given again: an option
    not given is the record's, one that contradicts it is refused, naming it (a database, and
    with it a snapshot cadence, given to a run that kept none wins, said so in the notes
    returned). A record of an older fsage keeps no database, cadence, fsync or policy: those
    are then taken as given, with a note."""
    opts = _workload_from_record(path, opts, record)
    rec_data = str(record.get("data", "write"))
    if opts.data is not None and opts.data != rec_data:
        raise UsageError(f"{path}: the interrupted run ran with --data {rec_data}")
    rec_name = record.get("name")
    if opts.name is not None and rec_name is not None and opts.name != rec_name:
        raise UsageError(
            f"{path}: --name {opts.name} contradicts the interrupted run's file system "
            f"{rec_name}; resume without --name"
        )
    opts = replace(opts, data=rec_data, name=opts.name or rec_name)
    kept = record.get("options")
    if not isinstance(kept, dict):
        note = (
            "the record of the interrupted run (an older fsage's) does not keep its database, "
            "snapshot cadence, --fsync or cleaning policy: this run takes them as given now"
        )
        return replace(opts, snapshot_every=opts.snapshot_every or 0, fsync=bool(opts.fsync)), [
            note
        ]
    notes: list[str] = []
    rec_db = kept.get("db")
    rec_every = int(kept.get("snapshot_every") or 0)
    if rec_db is None:
        if opts.db is not None:
            notes.append(
                f"the interrupted run recorded in no database: {opts.db} records the run "
                "from where it stopped"
            )
        db, every = opts.db, opts.snapshot_every or 0
    else:
        if opts.db is not None and os.path.realpath(opts.db) != os.path.realpath(rec_db):
            raise UsageError(
                f"{path}: --db {opts.db} contradicts the interrupted run's database {rec_db}; "
                "resume without --db"
            )
        if opts.snapshot_every is not None and opts.snapshot_every != rec_every:
            had = f"every {rec_every:,} ops" if rec_every else "only at its start and end"
            raise UsageError(
                f"{path}: --snapshot-every {opts.snapshot_every} contradicts the interrupted "
                f"run's snapshots {had}; resume without --snapshot-every"
            )
        db, every = Path(rec_db), rec_every
    rec_fsync = bool(kept.get("fsync"))
    if opts.fsync is not None and opts.fsync != rec_fsync:
        raise UsageError(f"{path}: --fsync contradicts the interrupted run, which ran without it")
    rec_policy = kept.get("policy")
    if opts.policy is not None and opts.policy != rec_policy:
        had = "the image's own" if rec_policy is None else str(rec_policy)
        raise UsageError(
            f"{path}: --policy {opts.policy} contradicts the interrupted run's cleaning "
            f"policy ({had}); resume without --policy"
        )
    opts = replace(opts, db=db, snapshot_every=every, fsync=rec_fsync, policy=rec_policy)
    return opts, notes


def _record_mode(path: Path, opts: AgeOptions, record: dict[str, Any]) -> str:
    """The interrupted run's --mount/--offline choice (an image aged offline is not resumed
    through the kernel's allocator, nor the other way round)."""
    rec_mode = str(record.get("mode", opts.mode))
    if opts.mode != "auto" and rec_mode not in ("auto", opts.mode):
        raise UsageError(f"{path}: the interrupted run ran {rec_mode}, not {opts.mode}")
    return rec_mode if opts.mode == "auto" else opts.mode


def _setup(gen: Generator, tree: Tree, adopt: bool) -> None:
    """Give a new generator the tree its run starts on: to age with its own files
    (``adopt``), or to keep clear of."""
    if adopt:
        gen.adopt(tree_entries(tree, regular_only=True))
    else:
        gen.reserve(tree_entries(tree, regular_only=False))


def _skip_ran(ops: Iterator[Op], ran: list[Op]) -> int:
    """Consume the stream's ops up to the last of ``ran`` (the ops the journal shows ran after
    the record's mark, in order; ops between them that are not in the journal ran out of space
    or were skipped then); returns how many were consumed."""
    n = 0
    i = 0
    while i < len(ran):
        op = next(ops, None)
        if op is None:
            raise WorkloadError("the journal holds ops that are not in the op stream")
        n += 1
        if op == ran[i]:
            i += 1
    return n
