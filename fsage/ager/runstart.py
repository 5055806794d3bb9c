"""Where a run of ``fsage age`` starts: the profile as the options shape it, the workload,
seed and mode an interrupted run's record gives ``--resume``, the tree a new generator starts
on, and the ops of a recorded stream that ran before the stop."""

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
    rec_seed = int(ident.get("seed", 0))
    if opts.seed is not None and opts.seed != rec_seed:
        raise UsageError(f"{path}: the interrupted run used seed {rec_seed}")
    return replace(opts, profile=rec_profile, seed=rec_seed, mode=_record_mode(path, opts, record))


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
