"""`fsage age` stops cleanly, resumes from wherever it stopped, honours explicit options and
keeps the op stream it ran (issue: the README example finishes)."""

from __future__ import annotations

import itertools
import json
import os
import shutil
from datetime import datetime, tzinfo
from pathlib import Path

import pytest
from click.testing import CliRunner

from fsage.ager.generator import Generator
from fsage.ager.images import make_image
from fsage.ager.posix import PosixExecutor
from fsage.ager.profile import get_preset
from fsage.ager.run import AgeOptions, _layout_entries, age, aging_runs, shape_profile
from fsage.cli import main
from fsage.db.store import Store
from fsage.errors import UsageError
from fsage.snapshotter import read_source
from fsage.workload import Op, OpFailedError, read_workload, write_workload

from .helpers import tree_of

MIB = 1 << 20


@pytest.fixture
def stream(tmp_path: Path) -> Path:
    prof = get_preset("hfs-surge").with_overrides(fill=0.6, churn=2.0)
    gen = Generator(prof, 3, 48 * MIB)  # 4,430 ops
    path = tmp_path / "ops.jsonl"
    write_workload(path, gen.header(), gen.ops())
    return path


def _fail_at(monkeypatch: pytest.MonkeyPatch, cls: type, n: int, exc: BaseException) -> None:
    """Make the ``n``-th op (0-based) of ``cls`` raise ``exc`` before running."""
    real = cls.apply
    calls = [0]

    def apply(self: object, op: Op) -> int:
        calls[0] += 1
        if calls[0] == n + 1:
            raise exc
        return real(self, op)  # type: ignore[no-any-return]

    monkeypatch.setattr(cls, "apply", apply)


def test_crash_then_resume_gives_the_whole_tree(
    tmp_path: Path, stream: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole = tmp_path / "whole"
    whole.mkdir()
    assert age(whole, AgeOptions(ops_file=stream)).finished
    part = tmp_path / "part"
    part.mkdir()
    with monkeypatch.context() as m:
        _fail_at(m, PosixExecutor, 1234, OpFailedError("rename 'x': Bad file descriptor"))
        with pytest.raises(OpFailedError):
            age(part, AgeOptions(ops_file=stream))
    record = json.loads((tmp_path / "part.fsage-age").read_text())
    assert record["ops_done"] == 1234 and record["clean"] and not record["finished"]
    res = age(part, AgeOptions(resume=True))  # the op stream comes from the record
    assert res.finished and res.resumed_from == 1234
    assert tree_of(part) == tree_of(whole)
    assert ".fsage-age" not in os.listdir(part)


def test_resume_after_a_kill_between_records(tmp_path: Path, stream: Path) -> None:
    """A run killed after op 1,700 left its record at op 1,000: the journal shows which ops
    ran since, and those are not run again (an append run twice would change the tree)."""
    total = sum(1 for _ in read_workload(stream)[1])
    whole = tmp_path / "whole"
    whole.mkdir()
    assert age(whole, AgeOptions(ops_file=stream)).finished
    part = tmp_path / "part"
    part.mkdir()
    _h, ops = read_workload(stream)
    first = [op for _i, op in zip(range(1701), ops, strict=False)]
    cut = tmp_path / "cut.jsonl"
    write_workload(cut, read_workload(stream)[0], first)
    age(part, AgeOptions(ops_file=cut))
    rec_path = tmp_path / "part.fsage-age"
    record = json.loads(rec_path.read_text())
    journal = Path(record["journal"])
    lines = journal.read_bytes().splitlines(keepends=True)
    assert len(lines) == 1 + 1701  # header + every op that ran
    # The state a kill leaves: the record of op 1,000, a journal holding ops past it with a
    # torn last line, and (below) the next op already run but not journaled.
    mark = sum(len(x) for x in lines[: 1 + 1000])
    journal.write_bytes(b"".join(lines[:-1]) + lines[-1][:7])
    _h, ops = read_workload(stream)
    nxt = [op for _i, op in zip(range(1701), ops, strict=False)][-1]
    assert nxt == first[-1]
    record.update(
        ident={**record["ident"], "ops_file": str(stream), "header": record["ident"]["header"]},
        ops_done=1000,
        journal_bytes=mark,
        finished=False,
        clean=False,
    )
    rec_path.write_text(json.dumps(record))
    res = age(part, AgeOptions(ops_file=stream, resume=True))
    assert res.finished and res.ops == total
    # ops 1000..1699 came from the journal, op 1700 (its line torn) was found on disk
    assert res.resumed_from == 1701
    assert any("had taken effect without its journal line" in n for n in res.notices)
    assert tree_of(part) == tree_of(whole)
    # The journal now holds every op exactly once and replays to the same tree.
    assert sum(1 for _ in read_workload(journal)[1]) == total
    again = tmp_path / "again"
    again.mkdir()
    assert age(again, AgeOptions(ops_file=journal)).finished
    assert tree_of(again) == tree_of(whole)


def test_resume_takes_the_record_and_refuses_a_mismatch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("fsage._ext2fs")
    from fsage.ager.offline import OfflineExtExecutor

    img = make_image(tmp_path / "e.img", "ext4", 32 * MIB)
    r = CliRunner()
    args = ["age", str(img), "--offline", "--profile", "hfs-surge", "--fill", "0.5"]
    with monkeypatch.context() as m:
        _fail_at(m, OfflineExtExecutor, 700, KeyboardInterrupt())
        res = r.invoke(main, [*args, "--churn", "0.5", "--seed", "4"])
    assert res.exit_code == 130, res.output
    record = json.loads((tmp_path / "e.img.fsage-age").read_text())
    assert record["ops_done"] == 700 and record["ident"]["seed"] == 4
    bad = r.invoke(main, ["age", str(img), "--resume", "--profile", "hfs-surge"])
    assert bad.exit_code == 2 and "churn" in bad.output and "fill" in bad.output, bad.output
    bad = r.invoke(main, ["age", str(img), "--resume", "--seed", "5"])
    assert bad.exit_code == 2 and "seed 4" in bad.output, bad.output
    bad = r.invoke(main, ["age", str(img), "--resume", "--ops", str(tmp_path / "x.jsonl")])
    assert bad.exit_code == 2 and "generated profile hfs-surge" in bad.output, bad.output
    ok = r.invoke(main, ["age", str(img), "--resume", "--format", "json"])
    assert ok.exit_code == 0, ok.output
    out = json.loads(ok.stdout)
    assert out["resumed_from"] == 700 and out["stopped_by"] == "churn"
    assert abs(out["fullness"] - 0.5) <= 0.01
    # The journal of the whole run (both parts) replays to the same tree on a fresh image.
    fresh = make_image(tmp_path / "f.img", "ext4", 32 * MIB)
    replay = age(fresh, AgeOptions(ops_file=Path(out["journal"]), mode="offline"))
    assert replay.finished and replay.nospace == 0
    aged = sorted(_layout_entries(read_source(img)))
    assert aged and aged == sorted(_layout_entries(read_source(fresh)))


def test_explicit_options_are_honoured() -> None:
    hfs = get_preset("hfs-aging")
    assert hfs.ops_limit == 10_000
    assert shape_profile(hfs).ops_limit == 10_000
    assert shape_profile(hfs, fill=0.8, churn=2).ops_limit is None
    assert shape_profile(hfs, fill=0.8, ops_limit=500).ops_limit == 500
    # The op limit is exact even when an fsync follows the op that reaches it.
    prof = get_preset("hfs-surge").with_overrides(ops_limit=1001, fsync_every=1)
    gen = Generator(prof, 1, 64 * MIB)
    ops = list(gen.ops())
    assert len(ops) == 1001 and gen.stats.stopped_by == "ops-limit"
    assert ops[-1].op != "fsync" or ops[-2].op in ("create", "append", "overwrite", "truncate")
    # A run resumed with its op count restored stops at the same limit: none more at it, one
    # more one op short of it.
    for done, more in ((1001, 0), (1000, 1)):
        again = Generator(prof, 1, 64 * MIB)
        again.stats.ops = done
        assert len(list(again.ops())) == more and again.stats.stopped_by == "ops-limit"
    # A churned run ends on its fill target, not wherever the churn drifted to.
    for name in ("impressions", "hfs-surge"):
        gen = Generator(get_preset(name).with_overrides(fill=0.7, churn=1.0), 2, 256 * MIB)
        for _ in gen.ops():
            pass
        assert gen.stats.stopped_by == "churn"
        assert abs(gen.fullness() - 0.7) <= 0.006, name


def test_run_records_cpu_and_own_share(tmp_path: Path, stream: Path) -> None:
    target = tmp_path / "t"
    target.mkdir()
    db = tmp_path / "d.db"
    res = age(target, AgeOptions(ops_file=stream, db=db))
    with Store.open(db) as store:
        (run,) = aging_runs(store)
    m = run.metrics
    # The kernel's CPU time of a process is exact in total, but split into user and system
    # by where its clock ticks fell: under load a short run (3/4 in the kernel) may show no
    # user time at all (a CI run beside two busy loops did).
    assert m["cpu_user_s"] >= 0 and m["cpu_system_s"] >= 0
    assert m["cpu_user_s"] + m["cpu_system_s"] > 0
    assert 0.0 < m["own_share"] < 1.0 and m["executor_s"] < m["elapsed_s"]
    assert m["stopped_by"] == "end-of-stream" and run.params["journal"] == res.journal
    out = CliRunner().invoke(main, ["runs", "--db", str(db)])
    assert out.exit_code == 0 and "cpu" in out.output, out.output


def test_usage_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no interrupted run"):
        age(tmp_path, AgeOptions(resume=True))
    with pytest.raises(UsageError, match="exactly one"):
        age(tmp_path, AgeOptions())


def test_journal_lines_are_the_ops_json() -> None:
    from fsage.ager.run import _op_line

    ops = [
        Op("create", "a/b", size=5),
        Op("rename", "x y/\u00e9", dest="q"),
        Op("overwrite", "f", size=4096, offset=8192),
        Op("snapshot", label="mid"),
        Op("sync"),
        Op("link", 'a"b', dest="c\\d"),
        Op("create", "tab\there"),
        Op("punch", "p", size=7),
        Op("setattr", "s", mode=0o600, mtime_ns=-5),
        Op("create", "bad-\udcff-name\u2603\U0001f600", label="x\x00"),
    ]
    for op in ops:
        # The definition: json.dumps of the non-default fields, in field order.
        fields = {k: v for k, v in vars(op).items() if v not in ("", 0, None) or k == "op"}
        assert _op_line(op) == (json.dumps(fields, separators=(",", ":")) + "\n").encode()
        assert Op.from_json(json.loads(_op_line(op))) == op


def test_op_is_a_frozen_dataclass_whatever_its_init() -> None:
    """Op's own __init__ (one dict assignment, for speed) takes every field, with the defaults
    the fields declare, and the instances behave as the frozen dataclass's would."""
    import dataclasses
    import inspect
    import pickle

    params = inspect.signature(Op).parameters
    fields = dataclasses.fields(Op)
    assert list(params) == [f.name for f in fields]
    assert [p.default for p in params.values()][1:] == [f.default for f in fields][1:]
    op = Op("setattr", "a/b", mode=0o640, mtime_ns=7)
    assert vars(op) == {f.name: getattr(op, f.name) for f in fields}
    assert op == Op("setattr", "a/b", 0, 0, "", "", 0o640, 7) and hash(op) == hash(Op(**vars(op)))
    assert op != Op("setattr", "a/b", mode=0o640)
    assert pickle.loads(pickle.dumps(op)) == op and dataclasses.replace(op, size=1).size == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        op.size = 3  # type: ignore[misc]
    assert repr(Op("sync")) == (
        "Op(op='sync', path='', size=0, offset=0, dest='', label='', mode=None, mtime_ns=None,"
        " inferred=False)"
    )


def test_two_runs_started_in_one_second_keep_their_own_journals(
    tmp_path: Path, stream: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Journals are named by the second a run starts: a second run of the same target in that
    second must not truncate the first one's (its record still points at it)."""
    import fsage.ager.runjournal as runjournal

    class Frozen(datetime):
        @classmethod
        def now(cls, tz: tzinfo | None = None) -> Frozen:
            return cls(2026, 11, 28, 12, 0, 0, tzinfo=tz)

    monkeypatch.setattr(runjournal, "datetime", Frozen)
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    for path, n in ((first, 300), (second, 120)):
        header, ops = read_workload(stream)
        write_workload(path, header, list(itertools.islice(ops, n)))
    target = tmp_path / "t"
    target.mkdir()
    rec_path = tmp_path / "t.fsage-age"
    journals = []
    for stream_file, n in ((first, 300), (second, 120)):
        age(target, AgeOptions(ops_file=stream_file, force=True))
        journals.append((Path(json.loads(rec_path.read_text())["journal"]), n))
        shutil.rmtree(target)
        target.mkdir()
    assert journals[0][0] != journals[1][0]
    for journal, n in journals:  # header + every op the run made, each run's own
        assert len(journal.read_bytes().splitlines()) == 1 + n, journal
