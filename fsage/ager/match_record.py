"""A match recorded like any aging run: the record beside the target (``TARGET.fsage-age``, which
``--resume`` reads) and the journal of the ops that took effect, written as they run.

A killed match is resumed from its record: the ops its journal holds stay (they ran). Stopped
in its rounds (the record's ``phase``: its fill was done), the files its journal leaves in
place are the image's, and the match goes on with its rounds from them (``adopt``): its files,
their sizes and its next paths are what is on disk. Stopped in the planned files of its first
fill, the record holds what the plan was drawn from (the fullness it began at, the disk's
largest free extent, the way of the largest holes): the plan is drawn again from the same seed
and the fill goes on, the files written whole kept (``resume_fill``). Stopped later in a fill
(its top-up, its spacers' deletion, a fill drawn again after a stall), or where the image does
not hold what the journal says, the matcher's files are deleted (journaled, so the journal
still replays to the image) and the match runs again from its fill with the same target and
seed; clearing is one of the matcher's own moves (a stalled fill is cleared the same way), so
the image ends as a match never stopped would leave it, only later."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fsage.ager.match_disk import AREA, Disk, OfflineDisk
from fsage.ager.match_target import LayoutTarget
from fsage.ager.posix import record_path_for
from fsage.ager.runjournal import _Journal, _journal_path, _read_record, _write_record
from fsage.ager.targets import RESERVE_PARAM
from fsage.errors import FsageError, UsageError
from fsage.workload import Op, OpFailedError, WorkloadHeader

#: The ``generator`` of a match's journal header.
GENERATOR = "fsage age --match"
#: Seconds between two writes of the record while matching (it is also written at the end).
SAVE_EVERY = 1.0


def match_header(disk: Disk, target: LayoutTarget, seed: int) -> WorkloadHeader:
    """The header of a match's op stream: what it matched, and the parameters a replay needs
    that are no op (ext4's reserve on fsage's own mount)."""
    params: dict[str, Any] = {
        "target": target.source,
        "offline": isinstance(disk, OfflineDisk),
    }
    if disk.reserve is not None:
        params[RESERVE_PARAM] = disk.reserve
    return WorkloadHeader(GENERATOR, params, seed)


def interrupted_match(path: Path) -> dict[str, Any] | None:
    """The record of the match that stopped on ``path`` before its end, if that is what
    ``--resume`` would continue."""
    record = _read_record(record_path_for(Path(os.path.realpath(path))))
    if record.get("finished") is False and (record.get("ident") or {}).get("kind") == "match":
        return record
    return None


@dataclass
class MatchRecord:
    """The record and journal of one match (see the module doc)."""

    record_path: Path
    journal: _Journal
    ident: dict[str, Any]
    mode: str
    #: Ops in the journal (across resumes), and those of it before this run.
    ops: int = 0
    base_ops: int = 0
    notices: list[str] = field(default_factory=list)
    #: "fill" until a fill is done, then "rounds" (until a stalled fill is cleared).
    phase: str = "fill"
    #: Resumed in its rounds or its fill: the files the stopped match left are kept (see
    #: ``adopt`` and ``resume_fill``).
    kept: bool = False
    #: What the fill's plan was drawn from, and how far it went (``MatchWriter.on_fill``).
    fill: dict[str, Any] | None = None
    _saved: float = 0.0

    def save(self, finished: bool = False, clean: bool = False, force: bool = True) -> None:
        now = time.monotonic()
        if not force and now - self._saved < SAVE_EVERY:
            return
        self._saved = now
        _write_record(
            self.record_path,
            {
                "ident": self.ident,
                "ops_done": self.ops,
                "bytes_written": 0,
                "finished": finished,
                "clean": clean or finished,
                "mode": self.mode,
                "data": "write",
                "journal": str(self.journal.path),
                "journal_bytes": self.journal.bytes,
                "phase": self.phase,
                "fill": self.fill,
                "updated": time.time(),
            },
        )

    def set_phase(self, phase: str) -> None:
        self.phase = phase
        self.save()

    def set_fill(self, info: dict[str, Any]) -> None:
        self.fill = dict(info) if info.get("step") == "files" else {**(self.fill or {}), **info}
        self.save()

    def close(self) -> None:
        self.journal.close()


def _mode_of(path: Path, disk: Disk) -> str:
    """How the target was reached, as the record keeps it (a resume reaches it the same way)."""
    if isinstance(disk, OfflineDisk):
        return "offline"
    return "mount" if path.is_file() else "auto"


def refuse_unfinished(path: Path, force: bool) -> None:
    """A new match on a target whose last run (a match or any aging) stopped before its end
    is refused unless ``force``, as ``fsage age`` refuses one."""
    record = _read_record(record_path_for(Path(os.path.realpath(path))))
    if record.get("finished") is False and not force:
        raise UsageError(
            f"{path}: an earlier run stopped at op {record.get('ops_done')}; "
            "use --resume to continue it or --force to start another"
        )


def start_record(
    path: Path, disk: Disk, target: LayoutTarget, seed: int, time_limit: float
) -> MatchRecord:
    """A new match's record and journal; every op ``disk`` runs from now on is journaled."""
    record_path = record_path_for(Path(os.path.realpath(path)))
    header = match_header(disk, target, seed)
    journal = _Journal(_journal_path(record_path), header, None)
    ident = {
        "kind": "match",
        "target": target.to_json(),
        "seed": seed,
        "time_limit": time_limit,
        "header": header.to_json(),
    }
    rec = MatchRecord(record_path, journal, ident, _mode_of(path, disk))
    disk.attach(journal, lambda: _count_and_save(rec, disk))
    rec.save()
    return rec


def _count_and_save(rec: MatchRecord, disk: Disk) -> None:
    rec.ops = rec.base_ops + len(disk.ops)
    rec.save(force=False)


def resume_record(path: Path, disk: Disk, record: dict[str, Any]) -> MatchRecord:
    """Go on with the killed match of ``record`` on ``disk``: its journal is kept (a torn
    last line dropped), and the files its matcher left are deleted, journaled."""
    record_path = record_path_for(Path(os.path.realpath(path)))
    old = Path(str(record.get("journal", "")))
    if not old.is_file():
        raise FsageError(f"{path}: the journal of the interrupted match ({old}) is gone")
    if isinstance(disk, OfflineDisk) and not record.get("clean", False):
        raise FsageError(
            f"{path}: the offline match was killed: libext2fs keeps the image's bitmaps, group "
            "descriptors and inodes in memory until it closes, so the image holds neither its "
            "journal's ops nor those of its record (check it with e2fsck -fn); it cannot be "
            "resumed: match a fresh image"
        )
    with open(old, "rb") as fh:
        header_end = len(fh.readline())
    ran, end = _Journal.tail(old, header_end)
    journal = _Journal(old, None, end)
    rec = MatchRecord(record_path, journal, dict(record["ident"]), _mode_of(path, disk))
    rec.base_ops = rec.ops = len(ran)
    live = _live_paths(ran)
    for p in live:
        disk.knows(p)
    disk.attach(journal, lambda: _count_and_save(rec, disk))
    tree = disk.area_tree()
    in_area = {p for p in live if p == AREA or p.startswith(AREA + "/")}
    if record.get("phase") == "rounds" and {p for p, _d in tree} == in_area:
        # Stopped in its rounds, the image holding exactly what the journal left: the rounds
        # go on from it.
        rec.kept, rec.phase = True, "rounds"
        files = sum(1 for _p, d in tree if not d)
        rec.notices.append(
            f"resumed in its rounds: the {files:,} files the interrupted match left are kept "
            "and the rounds go on from them"
        )
    elif _fill_goes_on(record, {p for p, _d in tree}, in_area):
        # Stopped in the planned files of its first fill, the image holding what the journal
        # left (and what the op running then made): the fill is drawn again from the same
        # seed and goes on, the files written whole kept.
        unjournaled = _drop_unjournaled(disk, tree, live)
        rec.kept, rec.phase, rec.fill = True, "fill", dict(record["fill"])
        files = sum(1 for p, d in tree if not d and p in live)
        rec.notices.append(
            f"resumed in its fill: the {files:,} files the interrupted match left are kept and "
            "the fill goes on from them"
        )
        if unjournaled:
            rec.notices.append(
                f"{unjournaled} path(s) made by the op running when the match was killed had "
                "no journal line: deleted without one"
            )
    else:
        rec.notices += _clear(disk, live)
    rec.save()
    return rec


def _fill_goes_on(record: dict[str, Any], on_disk: set[str], in_area: set[str]) -> bool:
    """Whether a match stopped in its fill goes on with it: in its first fill's planned
    files (``MatchWriter.resume_fill`` draws the same plan again), every path the journal
    leaves on disk."""
    fill = record.get("fill")
    return (
        record.get("phase") == "fill"
        and isinstance(fill, dict)
        and fill.get("step") == "files"
        and bool(fill.get("first"))
        and in_area <= on_disk
    )


def _drop_unjournaled(disk: Disk, tree: list[tuple[str, bool]], live: set[str]) -> int:
    """Delete, without a journal line, what the op running when the match was killed
    made (the journal never made it); how many paths."""
    gone = 0
    for p, _is_dir in sorted(tree, key=lambda e: (-e[0].count("/"), e[1], e[0])):
        if p in live:
            continue
        try:
            disk.x.apply(Op("delete", p))
        except OpFailedError:
            continue
        gone += 1
    disk.commit()
    return gone


def _live_paths(ops: list[Op]) -> set[str]:
    """The paths the journal's ops leave in place."""
    live: set[str] = set()
    for op in ops:
        if op.op == "delete":
            live.discard(op.path)
        elif op.op in ("create", "mkdir"):
            live.add(op.path)
        elif op.op == "rename":
            live = {
                op.dest + p[len(op.path) :] if p == op.path or p.startswith(op.path + "/") else p
                for p in live
            }
    return live


def _clear(disk: Disk, live: set[str]) -> list[str]:
    """Delete what the killed matcher left in its area, deepest first. A path the journal
    does not hold was made by the op running when the match was killed, which took effect
    without its journal line: deleted without one (the journal never made it)."""
    tree = disk.area_tree()
    tree.sort(key=lambda e: (-e[0].count("/"), e[1], e[0]))
    unjournaled = 0
    for p, _is_dir in tree:
        op = Op("delete", p)
        if p in live:
            disk._run(op)
        else:
            try:
                disk.x.apply(op)
            except OpFailedError:
                continue
            unjournaled += 1
    disk.commit()
    notes = [
        f"resumed: the {len(tree):,} files and directories the interrupted match left were "
        "deleted (journaled) and the match runs again from its fill"
    ]
    if unjournaled:
        notes.append(
            f"{unjournaled} path(s) made by the op running when the match was killed had no "
            "journal line: deleted without one"
        )
    missing = sorted(p for p in live if p == AREA or p.startswith(AREA + "/"))
    on_disk = {p for p, _ in tree}
    lost = [p for p in missing if p not in on_disk]
    if lost:
        notes.append(
            f"{len(lost)} path(s) the journal holds were not on disk (e.g. {lost[0]!r}): the "
            "journal will not replay to this image exactly"
        )
    return notes


def run_kind(path: Path, disk: Disk) -> str:
    """The ``aging_runs`` kind of a match: ``match-`` and how the target is reached."""
    if isinstance(disk, OfflineDisk):
        return "match-offline-ext"
    if path.is_file():
        return f"match-mounted-{disk.kind or 'image'}"
    return "match-dir"


def start_run_row(db: Path | None, path: Path, disk: Disk, rec: MatchRecord) -> int | None:
    """The match's row in ``aging_runs`` when run with a database, as ``fsage age`` keeps one
    for every run (``fsage runs`` lists it)."""
    if db is None:
        return None
    from fsage.ager.agingruns import _start_aging_run
    from fsage.db.store import Store

    params = {
        "workload": {k: v for k, v in rec.ident.items() if k != "target"},
        "target_source": rec.ident.get("target", {}).get("source"),
        "mode": rec.mode,
        "resumed_from": rec.base_ops,
        "journal": str(rec.journal.path),
    }
    with Store.open(db, create=True) as store:
        return _start_aging_run(store, run_kind(path, disk), path, params)


def finish_run_row(
    db: Path | None,
    run_id: int | None,
    status: str,
    rec: MatchRecord,
    metrics: dict[str, Any],
    notes: list[str],
    bytes_written: int = 0,
) -> None:
    if db is None or run_id is None:
        return
    from fsage.ager.agingruns import _finish_aging_run
    from fsage.db.store import Store

    with Store.open(db, create=True) as store:
        _finish_aging_run(
            store,
            run_id,
            name=None,
            status=status,
            ops=rec.ops - rec.base_ops,
            bytes_written=bytes_written,
            snapshots=[],
            metrics=metrics,
            notes=notes,
        )
