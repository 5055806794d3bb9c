"""`--resume` after a kill that left the running op's effect, whole or in part, on the target
without its journal line: the journal, the record and the disk agree again (no root needed:
the kill's state is made by hand on a plain directory)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from fsage.ager.posix import PosixExecutor
from fsage.ager.profile import get_preset
from fsage.ager.reconcile import difference, disk_tree, journal_tree
from fsage.ager.run import AgeOptions, age, shape_profile
from fsage.workload import Op, WorkloadHeader, read_workload, write_workload

from .test_resume_kill import tree_with_types

HEADER = WorkloadHeader("test")
STREAM = [
    Op("mkdir", "a"),
    Op("create", "a/x", size=300_000),
    Op("create", "a/y", size=5_000),
    Op("append", "a/x", size=200_000),
    Op("rename", "a/y", dest="z"),
    Op("link", "a/x", dest="w"),
    Op("append", "w", size=70_000),  # through the other name of a/x
    Op("mkdir", "b"),
    Op("rename", "a", dest="b/a"),  # a directory, with what it holds
    Op("truncate", "b/a/x", size=100),
    Op("delete", "z"),
    Op("overwrite", "w", size=50, offset=10),
    Op("create", "c", size=8_000),
]


def _partly(op: Op) -> Op | None:
    """What ``op`` leaves when killed part-way (only writes stop part-way)."""
    if op.op == "create":
        return replace(op, size=op.size // 3)
    if op.op == "append":
        return replace(op, size=op.size // 3)
    return None


def _killed_at(tmp_path: Path, k: int, effect: Op | None) -> tuple[Path, Path]:
    """A directory whose run of STREAM was killed while op ``k`` ran: ops before it journaled,
    ``effect`` (what op ``k`` had done) on disk only; the record is the one of op 0."""
    stream = tmp_path / "ops.jsonl"
    write_workload(stream, HEADER, STREAM)
    cut = tmp_path / "cut.jsonl"
    write_workload(cut, HEADER, STREAM[:k])
    part = tmp_path / "part"
    part.mkdir()
    first = age(part, AgeOptions(ops_file=cut))
    assert first.finished and first.journal is not None
    if effect is not None:
        ex = PosixExecutor(part)
        ex.apply(effect)
        ex.close()
    rec_path = tmp_path / "part.fsage-age"
    record = json.loads(rec_path.read_text())
    journal = Path(first.journal)
    header_len = len(journal.read_bytes().splitlines(keepends=True)[0])
    record.update(
        ident={**record["ident"], "ops_file": str(stream)},
        ops_done=0,
        journal_bytes=header_len,
        finished=False,
        clean=False,
    )
    rec_path.write_text(json.dumps(record))
    return part, journal


@pytest.fixture
def whole(tmp_path: Path) -> dict[str, tuple[str, int]]:
    stream = tmp_path / "whole.jsonl"
    write_workload(stream, HEADER, STREAM)
    target = tmp_path / "whole"
    target.mkdir()
    assert age(target, AgeOptions(ops_file=stream)).finished
    return tree_with_types(target)


CASES = [
    (k, how)
    for k in range(len(STREAM))
    for how in ("whole", "in part", "not at all")
    if how != "in part" or _partly(STREAM[k]) is not None
]


@pytest.mark.parametrize(("k", "how"), CASES)
def test_resume_after_the_running_op_took_effect_unjournaled(
    tmp_path: Path, whole: dict[str, tuple[str, int]], k: int, how: str
) -> None:
    op = STREAM[k]
    effect = {"whole": op, "in part": _partly(op), "not at all": None}[how]
    part, journal = _killed_at(tmp_path, k, effect)
    said: list[str] = []
    res = age(part, AgeOptions(resume=True), echo=said.append)
    assert res.finished and res.ops == len(STREAM)
    assert tree_with_types(part) == whole  # the op ran once, whole
    ops = list(read_workload(journal)[1])
    assert ops == STREAM  # journaled once, in its place
    changes_tree = op.op != "overwrite"
    if how == "whole" and changes_tree:
        assert res.resumed_from == k + 1
        assert any("had taken effect without its journal line" in s for s in said), said
    elif how == "in part":
        assert res.resumed_from == k
        assert any("had taken effect in part: it runs again" in s for s in said), said
    else:
        assert not any("taken effect" in s for s in said), said
    again = tmp_path / "again"
    again.mkdir()
    assert age(again, AgeOptions(ops_file=journal)).finished
    assert tree_with_types(again) == whole


def test_a_generated_run_journals_the_op_that_ran_unjournaled(tmp_path: Path) -> None:
    """The generator, run again through the journal, names the op that was running: what
    it left is journaled as that op, which does not run again."""
    prof = shape_profile(get_preset("hfs-surge"), ops_limit=400)
    target = tmp_path / "t"
    target.mkdir()
    first = age(target, AgeOptions(profile=prof, seed=3))
    assert first.finished and first.journal is not None
    journal = Path(first.journal)
    lines = journal.read_bytes().splitlines(keepends=True)
    last = Op.from_json(json.loads(lines[-1]))
    assert last.op in ("create", "append", "delete", "rename", "truncate", "mkdir"), last
    # the kill: the last op ran, its line did not reach the journal; the record is older
    journal.write_bytes(b"".join(lines[:-1]))
    rec_path = tmp_path / "t.fsage-age"
    record = json.loads(rec_path.read_text())
    record.update(finished=False, clean=False, ops_done=399 - 50)
    record["journal_bytes"] = len(b"".join(lines[: 1 + 349]))
    record["ident"]["profile"]["ops_limit"] = 500  # and it goes on after the kill
    rec_path.write_text(json.dumps(record))
    said: list[str] = []
    res = age(target, AgeOptions(resume=True), echo=said.append)
    assert any(last.path in s and "without its journal line" in s for s in said), said
    assert res.resumed_from == 400 and res.ops == 500 and res.finished
    assert list(read_workload(journal)[1])[399] == last
    again = tmp_path / "again"
    again.mkdir()
    assert age(again, AgeOptions(ops_file=journal)).finished
    assert tree_with_types(again) == tree_with_types(target)


def test_a_difference_no_single_op_leaves_is_reported_and_left(tmp_path: Path) -> None:
    part, _journal = _killed_at(tmp_path, 3, None)
    (part / "a" / "x").unlink()  # two changes: more than the running op can have made
    (part / "stray").write_bytes(b"1")
    said: list[str] = []
    with pytest.raises(Exception, match="append"):
        age(part, AgeOptions(resume=True), echo=said.append)
    assert any("differs from its journal by more than" in s and "2 paths" in s for s in said)


def test_difference_names_the_op(tmp_path: Path) -> None:
    """Whatever one op did to a tree, ``difference`` names that op (from names, types, sizes
    and inode numbers)."""
    base = [Op("mkdir", "d"), Op("create", "d/f", size=10), Op("create", "g", size=3)]
    for i, op in enumerate(
        [
            Op("create", "d/h", size=7),
            Op("append", "g", size=5),
            Op("truncate", "d/f", size=4),
            Op("delete", "g"),
            Op("mkdir", "e"),
            Op("rename", "g", dest="d/g2"),
            Op("rename", "d", dest="e2"),
            Op("rename", "g", dest="d/f"),  # onto an existing file
            Op("link", "g", dest="d/l"),
            Op("symlink", "s", size=3, dest="d/f"),
            Op("mknod", "n", label="fifo"),
        ]
    ):
        root = tmp_path / f"r{i}"
        root.mkdir()
        ex = PosixExecutor(root)
        for b in base:
            ex.apply(b)
        journaled = journal_tree({}, base)
        ex.apply(op)
        ex.close()
        disk, inodes = disk_tree(root)
        assert difference(journaled, disk, inodes).op == op
        assert difference(journal_tree(journaled, [op]), disk, inodes).paths == []
    # two changes are not one op's
    disk, inodes = disk_tree(root)
    journaled = journal_tree({}, [*base, Op("create", "x", size=1), Op("delete", "g")])
    found = difference(journaled, disk, inodes)
    assert found.op is None and len(found.paths) == 3
