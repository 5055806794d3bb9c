"""The study's order of work, its resumption, its op stream cut into steps, and bad input."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from fsage.cli import main
from fsage.errors import UsageError
from fsage.study.run import Task, drive, plan
from fsage.study.spec import (
    check_fits,
    make_workload,
    parse_filesystems,
    peak_live_bytes,
    split_steps,
)
from fsage.workload import Op, WorkloadHeader, write_workload


class Killed(Exception):
    pass


class FakeWorker:
    """Keeps what was done, as the real records do; dies at a chosen task."""

    def __init__(self, die_at: Task | None = None) -> None:
        self.done: set[Task] = set()
        self.log: list[Task] = []
        self.die_at = die_at

    def _run(self, t: Task) -> None:
        if t == self.die_at:
            self.die_at = None
            raise Killed
        self.log.append(t)
        self.done.add(t)

    def aged(self, step: int, fs: str) -> bool:
        return Task(step, fs, "age") in self.done

    def measured(self, step: int, fs: str) -> bool:
        return Task(step, fs, "measure") in self.done

    def age(self, step: int, fs: str) -> None:
        self._run(Task(step, fs, "age"))

    def measure(self, step: int, fs: str) -> None:
        self._run(Task(step, fs, "measure"))


def test_steps_interleave_across_file_systems() -> None:
    got = [(t.step, t.fs, t.what) for t in plan(2, ["ext4", "xfs", "lfs"])]
    assert got == [
        (1, "ext4", "age"), (1, "xfs", "age"), (1, "lfs", "age"),
        (1, "ext4", "measure"), (1, "xfs", "measure"), (1, "lfs", "measure"),
        (2, "ext4", "age"), (2, "xfs", "age"), (2, "lfs", "age"),
        (2, "ext4", "measure"), (2, "xfs", "measure"), (2, "lfs", "measure"),
    ]  # fmt: skip


@pytest.mark.parametrize("kill", range(12))
def test_a_killed_study_resumes_at_the_task_it_was_in(kill: int) -> None:
    tasks = plan(2, ["ext4", "xfs", "lfs"])
    w = FakeWorker(die_at=tasks[kill])
    with pytest.raises(Killed):
        drive(tasks, w, lambda s: None)
    assert w.log == tasks[:kill]
    n = drive(tasks, w, lambda s: None)
    assert n == len(tasks) - kill
    assert w.log == tasks  # each task once, in order
    assert drive(tasks, w, lambda s: None) == 0


def _ops(sizes: list[int]) -> list[Op]:
    return [Op("create", f"f{i}", size=s) for i, s in enumerate(sizes)]


def test_steps_cut_the_stream_by_data_written_in_order() -> None:
    ops = _ops([100] * 10)
    steps = split_steps(ops, 4)
    assert [op for s in steps for op in s] == ops
    assert [len(s) for s in steps] == [3, 2, 3, 2]
    assert split_steps(ops, 1) == [ops]


def test_steps_of_a_stream_without_data_cut_by_count() -> None:
    ops = [Op("mkdir", f"d{i}") for i in range(6)]
    assert [len(s) for s in split_steps(ops, 3)] == [2, 2, 2]


def test_peak_live_bytes_follows_deletes_renames_truncates() -> None:
    steps = [
        [Op("create", "a", size=100), Op("create", "b", size=50), Op("append", "a", size=10)],
        [Op("delete", "b"), Op("rename", "a", dest="c"), Op("truncate", "c", size=20)],
        [Op("create", "d", size=200), Op("overwrite", "d", offset=150, size=100)],
    ]
    # 160 after step 1; then 110 -> 20; then 20 + 200, grown to 250: 270
    assert peak_live_bytes(steps) == 270
    with pytest.raises(UsageError, match="cannot fit"):
        check_fits(steps, 280)
    assert check_fits(steps, 1000) == 270


def test_unknown_file_system_is_refused() -> None:
    with pytest.raises(UsageError, match="unknown file system 'zfsx'"):
        parse_filesystems("ext4,zfsx", skip_missing=True)
    with pytest.raises(UsageError, match="twice"):
        parse_filesystems("ext4,ext4", skip_missing=False)


def test_bad_workloads_are_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="one of preset:NAME"):
        make_workload("nonsense", 1 << 30, 3, 0)
    with pytest.raises(UsageError, match="no such preset"):
        make_workload("preset:nope", 1 << 30, 3, 0)
    (tmp_path / "plain").mkdir()
    with pytest.raises(UsageError, match="not a git repository"):
        make_workload(f"git:{tmp_path / 'plain'}", 1 << 30, 3, 0)
    with pytest.raises(UsageError, match="no such directory"):
        make_workload(f"git:{tmp_path / 'absent'}", 1 << 30, 3, 0)
    with pytest.raises(UsageError, match="no such file"):
        make_workload(f"ops:{tmp_path / 'absent.jsonl'}", 1 << 30, 3, 0)


def test_a_generated_workload_is_the_same_for_the_same_seed() -> None:
    a = make_workload("preset:hfs-surge", 64 << 20, 3, 7)[1]
    b = make_workload("preset:hfs-surge", 64 << 20, 3, 7)[1]
    c = make_workload("preset:hfs-surge", 64 << 20, 3, 8)[1]
    assert len(a) == 3 and all(a)
    assert a == b
    assert a != c


def _cli(args: list[str]) -> tuple[int, str]:
    r = CliRunner().invoke(main, args)
    return r.exit_code, r.output


def test_cli_bad_input_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "s"
    ops = tmp_path / "big.jsonl"
    write_workload(ops, WorkloadHeader("test"), _ops([300 << 20]))
    repo = tmp_path / "notgit"
    repo.mkdir()
    cases = [
        (["--fs", "ext4,zfsx", "--workload", "preset:mail"], "unknown file system 'zfsx'"),
        (["--fs", "ext4", "--workload", f"ops:{ops}"], "cannot fit"),
        (["--fs", "ext4", "--workload", f"git:{repo}"], "not a git repository"),
        (["--fs", "ext4", "--workload", "preset:nope"], "no such preset"),
    ]
    for args, msg in cases:
        code, text = _cli(
            [
                "study",
                *args,
                "--size",
                "256M",
                "--steps",
                "3",
                "--out",
                str(out),
                "--db",
                str(tmp_path / "s.db"),
            ]
        )
        lines = [ln for ln in text.splitlines() if ln.strip()]
        assert code != 0, text
        assert len(lines) == 1 and msg in lines[0], text
        assert "Traceback" not in text
        assert not out.exists() or not any(out.iterdir())


def test_cli_resume_of_nothing_and_missing_options(tmp_path: Path) -> None:
    code, text = _cli(["study", "--out", str(tmp_path / "none"), "--resume",
                       "--db", str(tmp_path / "s.db")])  # fmt: skip
    assert code != 0 and "no study here" in text
    code, text = _cli(["study", "--out", str(tmp_path / "x"), "--fs", "ext4"])
    assert code != 0 and "give --workload, --size, --steps" in text


def test_a_git_history_too_short_for_the_steps_is_refused(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    (repo / "a").write_text("a\n")
    ident = ["-c", "user.name=t", "-c", "user.email=t@example.org"]
    subprocess.run(["git", "-C", str(repo), "add", "a"], check=True)
    subprocess.run(["git", "-C", str(repo), *ident, "commit", "-qm", "one"], check=True)
    with pytest.raises(UsageError, match=r"git:.*(not 3|commit)"):
        make_workload(f"git:{repo}", 1 << 30, 3, 0)
    _header, steps = make_workload(f"git:{repo}", 1 << 30, 1, 0)
    assert [op.path for op in steps[0] if op.op == "create"] == ["tree0/a"]


def test_a_file_system_the_machine_lacks_is_named_or_skipped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from fsage.study import spec

    lacking = {"xfs": "the kernel has no xfs (not in /proc/filesystems, no module)"}
    monkeypatch.setattr(spec, "why_missing", lambda kind: lacking.get(kind))
    with pytest.raises(spec.MissingFilesystem, match="--fs xfs: the kernel has no xfs"):
        parse_filesystems("ext4,xfs", skip_missing=False)
    assert parse_filesystems("ext4,xfs", skip_missing=True) == (["ext4"], ["xfs"])
    with pytest.raises(spec.MissingFilesystem, match="none of xfs"):
        parse_filesystems("xfs", skip_missing=True)


def test_cli_names_a_missing_file_system_and_goes_on_only_when_asked(tmp_path: Path) -> None:
    from fsage.study.spec import why_missing

    if why_missing("f2fs") is None:
        pytest.skip("this machine has f2fs")
    code, text = _cli(["study", "--fs", "ext4,f2fs", "--workload", "preset:nope", "--size",
                       "256M", "--steps", "2", "--out", str(tmp_path / "s")])  # fmt: skip
    assert code != 0
    assert text.strip().count("\n") == 0 and "--fs f2fs:" in text and "--skip-missing" in text
    args = ["study", "--fs", "ext4,f2fs", "--workload", "preset:nope", "--size", "256M",
            "--steps", "2", "--out", str(tmp_path / "s")]  # fmt: skip
    code, text = _cli([*args, "--skip-missing"])
    # past the file systems: the next check (the workload) is the one that stops it
    assert code != 0 and "skipping f2fs" in text and "no such preset" in text
