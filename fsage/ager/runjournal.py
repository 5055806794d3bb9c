"""What ``fsage age`` keeps to resume a run: its record (a JSON file beside the target), its
journal (one line per op that took effect, written as it runs), the tree it started on, and how
a killed run's target is checked against the journal."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fsage.ager.ageresult import AgeResult
from fsage.ager.generator import DATA_OPS
from fsage.ager.posix import IGNORED_NAMES, InFlightError, PosixExecutor
from fsage.ager.reconcile import (
    Difference,
    Node,
    Tree,
    difference,
    disk_tree,
    durable_prefix,
    journal_tree,
    load_tree,
    save_tree,
    tree_change,
)
from fsage.ager.targets import AgeOptions, Target
from fsage.errors import FsageError, UnsafeTargetError, WorkloadError
from fsage.private import private_opener, write_private_text
from fsage.workload import Executor, Op, WorkloadHeader

# ---------------------------------------------------------------------------- record


def _read_record(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_record(path: Path, data: dict[str, Any]) -> None:
    if path.is_symlink():
        raise UnsafeTargetError(f"{path} is a symlink")
    tmp = path.with_name(path.name + ".part")
    try:
        write_private_text(tmp, json.dumps(data, sort_keys=True) + "\n")
        tmp.replace(path)
    except OSError as exc:
        raise FsageError(f"cannot write the run's record {path}: {exc.strerror}") from None


def _rng_state_to_json(state: Any) -> list[Any]:
    version, internal, gauss = state
    return [version, list(internal), gauss]


def _rng_state_from_json(data: list[Any]) -> Any:
    return (data[0], tuple(data[1]), data[2])


class _Journal:
    """The op stream actually run, one JSON line per op that took effect, written as it runs
    (one ``write`` per op, so a killed run leaves every completed op in it)."""

    def __init__(self, path: Path, header: WorkloadHeader | None, keep_bytes: int | None) -> None:
        self.path = path
        try:
            if header is not None:
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
                fd = private_opener(path, flags)
                os.write(fd, (header.to_json() + "\n").encode())
            else:
                fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError as exc:
            raise FsageError(f"cannot write the journal {path}: {exc.strerror}") from None
        self.fd = fd
        if keep_bytes is not None:
            os.ftruncate(fd, keep_bytes)
        self._end = os.lseek(fd, 0, os.SEEK_END)

    @property
    def bytes(self) -> int:
        """Where the journal ends: lines are appended at the descriptor's offset (by ``add``
        or by an executor's ``journaled`` apply)."""
        if self.fd >= 0:
            self._end = os.lseek(self.fd, 0, os.SEEK_CUR)
        return self._end

    @staticmethod
    def tail(path: Path, from_byte: int) -> tuple[list[Op], int]:
        """The complete op lines after ``from_byte`` (what ran after the record's last mark)
        and the byte offset where they end (a torn last line is dropped)."""
        with open(path, "rb") as fh:
            fh.seek(from_byte)
            data = fh.read()
        end = data.rfind(b"\n") + 1
        ops = [
            Op.from_json(json.loads(line), f"{path}: ")
            for line in data[:end].splitlines()
            if line.strip()
        ]
        return ops, from_byte + end

    def add(self, op: Op) -> None:
        line = _op_line(op)
        try:
            os.write(self.fd, line)
        except OSError as exc:
            raise FsageError(f"cannot write the journal {self.path}: {exc.strerror}") from None

    def close(self) -> None:
        if self.fd >= 0:
            self._end = os.lseek(self.fd, 0, os.SEEK_CUR)
            os.close(self.fd)
            self.fd = -1


def _stepper(ex: Executor, journal: _Journal, ahead: bool = False) -> Callable[[Op], int]:
    """Run an op on ``ex``, then journal it (only once it took effect): on a directory
    target both in one C call, and with ``ahead`` on a worker thread while the next op is
    generated (see ``PosixExecutor.journaled``)."""
    if isinstance(ex, PosixExecutor):
        return ex.journaled(journal, ahead=ahead)

    def step(op: Op) -> int:
        n = ex.apply(op)
        journal.add(op)
        return n

    return step


def _drain(ex: Executor) -> None:
    """Wait for the ops an executor runs ahead (raises InFlightError if one failed)."""
    if isinstance(ex, PosixExecutor):
        ex.drain()


def _lost_in_flight(ex: Executor) -> InFlightError | None:
    """After an error: wait for the ops run ahead; the failure among them, if any."""
    try:
        _drain(ex)
    except InFlightError as exc:
        return exc
    except Exception:  # the first error is the one shown
        return None
    return None


def _busy(ex: Executor) -> float | None:
    """Seconds the executor spent running ops, when it measures them itself."""
    return ex.busy_s if isinstance(ex, PosixExecutor) else None


def _op_line(op: Op) -> bytes:
    """A journal line: ``op.to_json()`` and a newline."""
    return (op.to_json() + "\n").encode()


def _start_tree_path(journal: Path) -> Path:
    """Where the tree a journal started on is kept (when it was not empty)."""
    return journal.with_name(journal.name.removesuffix(".ops.jsonl") + ".start.json")


def _start_tree(tgt: Target) -> tuple[Tree, dict[str, int]]:
    """The tree a new run starts on, with inode numbers where the target is a directory tree
    (elsewhere each path its own number: the reader's walk shows no hard links)."""
    root = tgt.tree_root()
    if root is not None:
        return disk_tree(root, skip=IGNORED_NAMES)
    entries = tgt.walk()
    tree: Tree = {p: Node("d") if is_dir else Node("f", size) for p, is_dir, size in entries}
    return tree, {p: i for i, p in enumerate(sorted(tree), 1)}


def _save_start_tree(journal: Path, tree: Tree, inodes: dict[str, int]) -> None:
    """Keep the tree a new journal starts on beside it, when not empty: a resume after a kill
    replays the journal, and the generator, from it."""
    if tree:
        save_tree(_start_tree_path(journal), tree, inodes)


def _compare_with_journal(
    tgt: Target,
    journal: Path,
    opts: AgeOptions,
    res: AgeResult,
    say: Callable[[str], None],
) -> tuple[Difference | None, Tree]:
    """How the tree on disk differs from the one the journal replays to, and that tree;
    (None, {}) when the target is not a directory tree."""
    root = tgt.tree_root()
    if root is None:
        return None, {}
    with open(journal, "rb") as fh:
        header_end = len(fh.readline())
    ops, _ = _Journal.tail(journal, header_end)  # every complete line: what took effect
    try:
        base = load_tree(_start_tree_path(journal))
        journaled = journal_tree(base, ops, allocate_only=opts.data == "fallocate")
    except WorkloadError as exc:
        res.notices.append(f"the journal could not be checked against the target: {exc}")
        say(f"fsage: {res.notices[-1]}")
        return None, {}
    disk, inodes = disk_tree(root, skip=IGNORED_NAMES)
    return difference(journaled, disk, inodes), journaled


def _lfs_durable(
    tgt: Target,
    journal: Path,
    ran_after: list[Op],
    keep: int | None,
    res: AgeResult,
    say: Callable[[str], None],
) -> tuple[list[Op], int | None, list[Op] | None]:
    """The journal cut back to the ops the LFS image holds: a killed LFS run loses the ops of
    its segment buffer, journaled but never written, and those run again. Returns the ops
    that ran after the record and the journal's length, or, when the image lost ops journaled
    before the record too, every op it holds, the length, and the ops lost before the record."""
    with open(journal, "rb") as fh:
        fh.readline()
        lines = fh.read().splitlines(keepends=True)
    header_end = journal.stat().st_size - sum(map(len, lines))
    every, _ = _Journal.tail(journal, header_end)
    mark = len(every) - len(ran_after)  # journaled before the record
    image: Tree = {p: Node("d") if is_dir else Node("f", size) for p, is_dir, size in tgt.walk()}
    k = durable_prefix(load_tree(_start_tree_path(journal)), every, image)
    if k is None:
        raise FsageError(
            f"{tgt.source}: the killed run's LFS image holds none of the states its journal "
            "passes through: it cannot be resumed"
        )
    if k == len(every):
        return ran_after, keep, None
    res.notices.append(
        f"{len(every) - k} ops journaled after the last segment the LFS image holds were lost "
        "with the kill: they run again"
    )
    say(f"fsage: {res.notices[-1]}")
    cut = header_end + sum(map(len, lines[:k]))
    if k >= mark:
        return ran_after[: k - mark], cut, None
    return every[:k], cut, every[k:mark]


def _journaled_ops(journal: Path, end: int) -> list[Op]:
    """The ops of ``journal`` up to byte ``end`` (where the resumed run goes on from)."""
    with open(journal, "rb") as fh:
        header_end = len(fh.readline())
    ops, stop = _Journal.tail(journal, header_end)
    if stop > end:  # cut back (an LFS image lost the ops after ``end``)
        with open(journal, "rb") as fh:
            fh.seek(header_end)
            kept = fh.read(end - header_end)
        ops = ops[: kept.count(b"\n")]
    return ops


def _changes(journal: Path, opts: AgeOptions) -> dict[str, int] | None:
    """What the run journaled in ``journal`` changed on disk, from the tree it started on."""
    try:
        base = load_tree(_start_tree_path(journal))
        with open(journal, "rb") as fh:
            header_end = len(fh.readline())
        ops, _ = _Journal.tail(journal, header_end)
        return tree_change(base, ops, allocate_only=opts.data == "fallocate").to_json()
    except (OSError, WorkloadError):  # a start not kept (a recorded stream on an image)
        return None


def _data_bytes(ops: list[Op]) -> int:
    """The bytes ``ops`` write (as ``bytes_written`` counts them)."""
    return sum(o.size for o in ops if o.op in DATA_OPS)


def _as_named_by(found: Difference, op: Op | None) -> Op | None:
    """``found.op`` under ``op``'s name of the file, when the file written has several (hard
    links: every name of it differs)."""
    if op is None or found.op is None or op.path not in found.paths or op.op == "create":
        return found.op
    return replace(found.op, path=op.path) if found.op.op in ("append", "truncate") else found.op


def _in_part(op: Op, effect: Op | None) -> bool:
    """True when ``effect`` (a change found on disk) is what ``op`` leaves when it stops
    part-way: a file created or appended to but not to its full length."""
    return (
        effect is not None
        and op.op in ("create", "append")
        and effect.path == op.path
        and effect.op in ("create", "append", "truncate")
    )


def _describe(op: Op) -> str:
    text = f"{op.op} {op.path!r}" + (f" to {op.dest!r}" if op.dest else "")
    if op.op in DATA_OPS or op.op == "truncate":
        text += f", {op.size:,} bytes"
    return text


def _journal_path(record_path: Path) -> Path:
    """A new run's journal: named by the time it starts, and never an earlier run's (two
    runs of one image started in the same second get ``STAMP.ops.jsonl`` and
    ``STAMP-2.ops.jsonl``; the journal is then created exclusively, so not even a race
    truncates one)."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    path = record_path.with_name(f"{record_path.name}.{stamp}.ops.jsonl")
    n = 1
    while os.path.lexists(path):
        n += 1
        path = record_path.with_name(f"{record_path.name}.{stamp}-{n}.ops.jsonl")
    return path
