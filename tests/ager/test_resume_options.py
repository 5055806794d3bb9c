"""`fsage age --resume` continues the run as it was asked for: its database, snapshot cadence,
name and the other options come from the record when not given again, one given again that
contradicts the record is refused by name, snapshots fall at the op counts of a run never
stopped, and the database's row of the run is continued, not left interrupted beside a new
one; a record of an older fsage still resumes, with a note."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from fsage.ager.images import make_image
from fsage.ager.run import AgingRun, aging_runs
from fsage.cli import main
from fsage.db.store import Store
from fsage.workload import Op, OpFailedError

MIB = 1 << 20
RUN = ["--offline", "--profile", "hfs-surge", "--fill", "0.5", "--churn", "2", "--seed", "4"]
EVERY = 250


@pytest.fixture
def offline_cls() -> type:
    pytest.importorskip("fsage._ext2fs")
    from fsage.ager.offline import OfflineExtExecutor

    return OfflineExtExecutor


def _stop_at_op(monkeypatch: pytest.MonkeyPatch, cls: type, n: int, how: str) -> None:
    """Stop the run at its ``n``-th op (1-based, counted in this process): ``sigint`` sends
    the process a real SIGINT while the op runs (the run stops after it, as on Ctrl-C),
    ``fail`` makes the op fail."""
    real = cls.apply
    calls = [0]

    def apply(self: object, op: Op) -> int:
        calls[0] += 1
        if calls[0] == n:
            if how == "fail":
                raise OpFailedError(f"create {op.path!r}: Input/output error")
            os.kill(os.getpid(), signal.SIGINT)
        return real(self, op)  # type: ignore[no-any-return]

    monkeypatch.setattr(cls, "apply", apply)


def _age(*args: str) -> Result:
    return CliRunner().invoke(main, ["age", *args])


def _runs(db: Path) -> list[AgingRun]:
    with Store.open(db) as store:
        return aging_runs(store)


def _snapshot_ops(db: Path) -> list[int | None]:
    with Store.open(db) as store:
        return [s.op_count for s in store.snapshots()]


def _interrupted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cls: type, name: str, *extra: str
) -> Path:
    """An image whose run (RUN and ``extra``) was stopped by SIGINT at op 700."""
    img = make_image(tmp_path / name, "ext4", 32 * MIB)
    with monkeypatch.context() as m:
        _stop_at_op(m, cls, 700, "sigint")
        res = _age(str(img), *RUN, *extra)
    assert res.exit_code == 130, res.output
    record = json.loads(img.with_name(img.name + ".fsage-age").read_text())
    assert record["ops_done"] == 700 and not record["finished"]
    return img


def test_a_resumed_run_keeps_its_database_cadence_and_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, offline_cls: type
) -> None:
    """Stopped by SIGINT, resumed without --db and failing again, resumed once more: the
    snapshots and the row are those of the run never stopped."""
    whole_db = tmp_path / "whole.db"
    whole = make_image(tmp_path / "whole.img", "ext4", 32 * MIB)
    done = _age(str(whole), *RUN, "--db", str(whole_db), "--snapshot-every", str(EVERY))
    assert done.exit_code == 0, done.output
    (uninterrupted,) = _runs(whole_db)
    want = _snapshot_ops(whole_db)
    assert want[:3] == [0, EVERY, 2 * EVERY] and len(want) > 6

    db = tmp_path / "d.db"
    snap = ["--db", str(db), "--snapshot-every", str(EVERY), "--name", "demo"]
    img = _interrupted(tmp_path, monkeypatch, offline_cls, "e.img", *snap)
    with monkeypatch.context() as m:  # the resumed run fails at op 700 + 800
        _stop_at_op(m, offline_cls, 801, "fail")
        failed = _age(str(img), "--resume")
    assert failed.exit_code == 1 and "Input/output error" in failed.output, failed.output
    record = json.loads(img.with_name(img.name + ".fsage-age").read_text())
    assert record["ops_done"] == 1500 and record["name"] == "demo"
    assert record["options"]["db"] == str(db) and record["options"]["snapshot_every"] == EVERY
    (run,) = _runs(db)
    assert (run.status, run.ops, run.params["resumed_at"]) == ("failed", 1500, [700])

    ok = _age(str(img), "--resume", "--format", "json")
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout)["resumed_from"] == 1500
    assert _snapshot_ops(db) == want
    (run,) = _runs(db)
    assert (run.status, run.fs, run.ops) == ("finished", "demo", uninterrupted.ops)
    assert run.bytes_written == uninterrupted.bytes_written
    assert run.params["resumed_at"] == [700, 1500] and run.params["resumed_from"] == 0
    assert (run.first_snap, run.last_snap) == (1, len(want))
    assert "resumed at op 700" in run.notes and "resumed at op 1,500" in run.notes
    table = CliRunner().invoke(main, ["runs", "--db", str(db)])
    assert table.exit_code == 0 and "finished, resumed 2 times" in table.output, table.output


def test_options_given_again_must_be_the_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, offline_cls: type
) -> None:
    db = tmp_path / "d.db"
    snap = ["--db", str(db), "--snapshot-every", str(EVERY), "--name", "demo"]
    img = _interrupted(tmp_path, monkeypatch, offline_cls, "e.img", *snap)
    refused = {
        "--db": ["--db", str(tmp_path / "other.db")],
        "--snapshot-every": ["--snapshot-every", "100"],
        "--name": ["--name", "other"],
        "--fill": ["--fill", "0.6"],
        "--ops-limit": ["--ops-limit", "5000"],
        "--fsync": ["--fsync"],
        "seed 4": ["--seed", "5"],
        "--data": ["--data", "fallocate"],
    }
    for said, args in refused.items():
        bad = _age(str(img), "--resume", *args)
        assert bad.exit_code == 2 and said in bad.output, (args, bad.output)
    # Given again as the run had them, they are accepted.
    ok = _age(str(img), "--resume", *snap[:4], "--name", "demo", "--fill", "0.5", "--seed", "4")
    assert ok.exit_code == 0, ok.output
    (run,) = _runs(db)
    assert run.status == "finished" and run.params["resumed_at"] == [700]
    assert _snapshot_ops(db)[-1] == run.ops


def test_a_database_given_to_a_run_that_kept_none_records_from_the_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, offline_cls: type
) -> None:
    img = _interrupted(tmp_path, monkeypatch, offline_cls, "e.img")
    db = tmp_path / "late.db"
    ok = _age(str(img), "--resume", "--db", str(db), "--snapshot-every", str(EVERY))
    assert ok.exit_code == 0, ok.output
    assert "recorded in no database" in ok.output
    (run,) = _runs(db)
    ops = _snapshot_ops(db)
    assert ops[0] == 750 and all(n % EVERY == 0 for n in ops[:-1]) and ops[-1] == 700 + run.ops


def test_a_record_of_an_older_fsage_resumes_as_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, offline_cls: type
) -> None:
    """A record without the options (as fsage wrote them before it kept them) resumes with
    the options given now, and says so; its row, found by the journal, is continued."""
    db = tmp_path / "d.db"
    img = _interrupted(tmp_path, monkeypatch, offline_cls, "e.img", "--db", str(db))
    rec_path = img.with_name(img.name + ".fsage-age")
    record = json.loads(rec_path.read_text())
    del record["options"]
    rec_path.write_text(json.dumps(record))
    without = _age(str(img), "--resume", "--snapshot-every", str(EVERY))
    assert without.exit_code == 2 and "--snapshot-every needs --db" in without.output
    ok = _age(str(img), "--resume", "--db", str(db), "--snapshot-every", str(EVERY))
    assert ok.exit_code == 0, ok.output
    assert "an older fsage" in ok.output
    (run,) = _runs(db)
    assert run.status == "finished" and run.params["resumed_at"] == [700]
    assert _snapshot_ops(db)[:3] == [0, 750, 1000]


@pytest.mark.needs_root
@pytest.mark.slow
def test_a_mounted_run_stopped_by_ctrl_c_resumes_with_its_options(
    tmp_path: Path, fsage_env: dict[str, str]
) -> None:
    """The report: a loop-mounted run with a database and a snapshot cadence, stopped by
    SIGINT and resumed with --resume alone, is one run with every snapshot asked for."""
    from tests.ager.test_resume_same_run import _age as age_cmd
    from tests.ager.test_resume_same_run import _finish, _stop_at

    img = tmp_path / "r.img"
    make_image(img, "ext4", 64 * MIB)
    db = tmp_path / "r.db"
    args = ["--profile", "hfs-aging", "--ops-limit", "3000", "--mount", "--db", str(db)]
    args += ["--name", "demo", "--snapshot-every", str(EVERY)]
    _stop_at(age_cmd(img, args), fsage_env, img, 1100, signal.SIGINT)
    _finish(age_cmd(img, ["--resume"]), fsage_env)
    (run,) = _runs(db)
    assert (run.status, run.fs, run.ops) == ("finished", "demo", 3000)
    assert _snapshot_ops(db) == list(range(0, 3001, EVERY))
    assert len(run.params["resumed_at"]) == 1 and run.params["resumed_at"][0] >= 1100


def test_a_resumed_lfs_run_counts_its_write_cost_over_the_whole_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cleaner's counters of the part before the stop are carried into the resumed part:
    the row's write cost is the whole run's, as for a run never stopped (the log differs a
    little after a reopen, so the counters agree closely, not exactly)."""
    from fsage.ager.profile import get_preset
    from fsage.ager.run import AgeOptions, age
    from fsage.lfs.executor import LfsExecutor
    from fsage.lfs.fs import mkfs

    prof = get_preset("random-update").with_overrides(fill=0.6, update_factor=3.0)
    runs = []
    for name, stop in (("whole", 0), ("part", 2500)):
        img = tmp_path / f"{name}.img"
        mkfs(img, segments=48, blocks_per_segment=32, block_size=4096, cleaning_policy="greedy")
        db = tmp_path / f"{name}.db"
        opts = AgeOptions(profile=prof, db=db, snapshot_every=1000, seed=2)
        if stop:
            with monkeypatch.context() as m:
                _stop_at_op(m, LfsExecutor, stop, "sigint")
                assert age(img, opts).interrupted
            opts = AgeOptions(resume=True)
        assert age(img, opts).finished
        (run,) = _runs(db)
        runs.append(run)
    whole, resumed = runs
    assert resumed.params["resumed_at"] == [2500] and resumed.ops == whole.ops
    new_blocks = [r.metrics["counters"]["new_blocks"] for r in runs]
    assert abs(new_blocks[1] - new_blocks[0]) <= 0.02 * new_blocks[0], new_blocks
    assert abs(resumed.metrics["write_cost"] - whole.metrics["write_cost"]) <= 0.05


def test_a_run_stopped_between_an_op_and_its_snapshot_takes_it_on_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, offline_cls: type
) -> None:
    """The op on the cadence ran and was journaled, then the run died taking its snapshot:
    the resumed run takes that snapshot first, so the snapshots are a run never stopped's."""
    whole_db = tmp_path / "whole.db"
    whole = make_image(tmp_path / "whole.img", "ext4", 32 * MIB)
    assert (
        _age(str(whole), *RUN, "--db", str(whole_db), "--snapshot-every", str(EVERY)).exit_code == 0
    )
    want = _snapshot_ops(whole_db)

    db = tmp_path / "d.db"
    img = make_image(tmp_path / "k.img", "ext4", 32 * MIB)
    real = Store.add_snapshot

    def dies_at(self: Store, *args: object, **kw: object) -> object:
        if kw.get("op_count") == 3 * EVERY:
            raise OSError(5, "Input/output error")
        return real(self, *args, **kw)  # type: ignore[arg-type]

    with monkeypatch.context() as m:
        m.setattr(Store, "add_snapshot", dies_at)
        died = _age(str(img), *RUN, "--db", str(db), "--snapshot-every", str(EVERY))
    assert died.exit_code != 0, died.output
    record = json.loads(img.with_name(img.name + ".fsage-age").read_text())
    assert record["ops_done"] == 3 * EVERY
    assert _snapshot_ops(db) == want[:3]  # 0, 250, 500: not 750
    ok = _age(str(img), "--resume")
    assert ok.exit_code == 0, ok.output
    assert _snapshot_ops(db) == want
    # the summary's ops are the whole run's; its snapshots, this part's, say so
    taken = len(want) - 3
    assert f", {taken} snapshots since op {3 * EVERY:,}" in ok.output, ok.output


def test_resuming_a_finished_run_says_so_before_any_option(
    tmp_path: Path, offline_cls: type
) -> None:
    """Not "--snapshot-every needs --db" for a run that had its database: there is nothing
    to resume, and that is said first, whatever the options."""
    img = make_image(tmp_path / "f.img", "ext4", 32 * MIB)
    done = _age(str(img), *RUN, "--ops-limit", "300", "--db", str(tmp_path / "f.db"))
    assert done.exit_code == 0, done.output
    for extra in ([], ["--snapshot-every", "500"], ["--name", "other"]):
        r = _age(str(img), "--resume", *extra)
        assert r.exit_code == 2, r.output
        assert "no interrupted run to resume (its last run finished)" in r.output, r.output
    never = make_image(tmp_path / "n.img", "ext4", 32 * MIB)
    r = _age(str(never), "--resume", "--snapshot-every", "500")
    assert r.exit_code == 2 and "no interrupted run to resume" in r.output, r.output
    assert "needs --db" not in r.output
