"""Run a study: each step's ops on every file system in turn, then each one measured.

Steps interleave: step k runs on every file system before step k + 1 runs on any, and the
measurements of step k are taken one file system after the other, so drift in the machine's
load falls on all of them alike. What is done is known from two records, both written as the
work completes: the ager's record beside each image (a step's ops, journaled op by op) and the
study's rows in the database (a step measured). A study killed anywhere resumes at the task it
was in: a half-run step continues at its next op (``fsage age --resume``), a half-measured
step is measured again.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from fsage.errors import FsageError, UsageError
from fsage.study.members import age_record, member, release_images
from fsage.study.spec import (
    StudySpec,
    check_fits,
    check_size,
    default_ext_inodes,
    ext_inodes,
    load_record,
    make_workload,
    parse_filesystems,
    save_record,
    step_file,
    write_study_dir,
)

Say = Callable[[str], None]


@dataclass(frozen=True)
class Task:
    step: int  # 1-based
    fs: str
    what: str  # "age" or "measure"


def plan(steps: int, filesystems: list[str]) -> list[Task]:
    """Every task of a study, in the order it runs."""
    out: list[Task] = []
    for k in range(1, steps + 1):
        out += [Task(k, fs, "age") for fs in filesystems]
        out += [Task(k, fs, "measure") for fs in filesystems]
    return out


class Worker(Protocol):
    """What the runner drives (the real file systems, or a test's stand-in)."""

    def aged(self, step: int, fs: str) -> bool: ...
    def measured(self, step: int, fs: str) -> bool: ...
    def age(self, step: int, fs: str) -> None: ...
    def measure(self, step: int, fs: str) -> None: ...


def pending(tasks: Iterable[Task], w: Worker) -> Iterator[Task]:
    """The tasks not yet done. A step's ops once run on a file system are done for good; a
    measurement is done when stored. Asked lazily: a step counts as aged only once run."""
    for t in tasks:
        done = w.aged(t.step, t.fs) if t.what == "age" else w.measured(t.step, t.fs)
        if not done:
            yield t


def drive(tasks: list[Task], w: Worker, say: Say) -> int:
    """Run what is pending of ``tasks`` in order; returns the tasks run."""
    n = 0
    for t in pending(tasks, w):
        doing = "running the ops on" if t.what == "age" else "measuring"
        say(f"fsage: step {t.step}: {doing} {t.fs}")
        if t.what == "age":
            w.age(t.step, t.fs)
        else:
            w.measure(t.step, t.fs)
        n += 1
    return n


@dataclass
class StudyResult:
    study_id: int
    out: Path
    db: Path
    filesystems: list[str]
    skipped: list[str]
    steps: int
    tasks_run: int
    seconds: float
    seconds_by_part: dict[str, float] = field(default_factory=dict)
    peak_rss_mib: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in self.__dict__.items()}


class RealWorker:
    """The study's file systems: aged by the ager, measured by :mod:`.measure`."""

    def __init__(self, out: Path, spec: StudySpec, store: Any, study_id: int, say: Say) -> None:
        self.out = out
        self.spec = spec
        self.store = store
        self.study_id = study_id
        self.say = say
        self.members = {fs: member(out, fs, spec.size, spec.inodes) for fs in spec.filesystems}
        from fsage.study.store import failed, measured

        self._measured = measured(store, study_id)
        #: file systems given up on: a step failed there (stored, so a resumed study knows)
        self.failed = failed(store, study_id)
        self.times: dict[str, float] = {"age": 0.0, "snapshot": 0.0, "clean_copy": 0.0, "scan": 0.0}

    def fs_name(self, fs: str) -> str:
        return f"study{self.study_id}-{fs}"

    def aged(self, step: int, fs: str) -> bool:
        if fs in self.failed:
            return True
        rec = age_record(self.members[fs])
        if rec is None:
            return False
        ran = (rec.get("ident") or {}).get("ops_file")
        if ran is None:
            return False
        k = _step_of(Path(str(ran)))
        return k is not None and (k > step or (k == step and bool(rec.get("finished"))))

    def measured(self, step: int, fs: str) -> bool:
        return fs in self.failed or (step, fs) in self._measured

    def give_up(self, step: int, fs: str, what: str, exc: FsageError) -> None:
        """The study goes on without ``fs``: the error is stored as its step's result."""
        from fsage.study.store import save_result

        self.say(f"fsage: step {step}: {what} {fs} failed, the study goes on without it: {exc}")
        save_result(self.store, self.study_id, step, fs, {"error": f"{what}: {exc}"})
        self.failed.add(fs)

    def age(self, step: int, fs: str) -> None:
        try:
            self._age(step, fs)
        except FsageError as exc:
            self.give_up(step, fs, "running the ops on", exc)

    def _age(self, step: int, fs: str) -> None:
        from fsage.ager.run import AgeOptions, age

        m = self.members[fs]
        if not m.image.exists():
            m.make()
        rec = age_record(m)
        ran = (rec or {}).get("ident", {}).get("ops_file")
        resume = rec is not None and ran is not None and _step_of(Path(str(ran))) == step
        t = time.perf_counter()
        with m.aging() as target:
            opts = AgeOptions(
                ops_file=None if resume else step_file(self.out, step),
                resume=resume,
                mode="mount",
                force=True,
                name=self.fs_name(fs),
            )
            res = age(target, opts)
        self.times["age"] += time.perf_counter() - t
        # what the step did on this file system (ops that found it full are skipped there)
        done = {"ops": res.ops, "nospace": res.nospace, "bytes_written": res.bytes_written,
                "seconds": res.elapsed, "resumed_from": res.resumed_from}  # fmt: skip
        _age_result_path(self.out, step, fs).write_text(json.dumps(done) + "\n")
        if res.nospace:
            self.say(f"fsage: step {step}: {res.nospace} ops found {fs} full")

    def measure(self, step: int, fs: str) -> None:
        try:
            self._measure(step, fs)
        except FsageError as exc:
            self.give_up(step, fs, "measuring", exc)

    def _measure(self, step: int, fs: str) -> None:
        from fsage.study.measure import measure_step
        from fsage.study.store import save_result

        m = self.members[fs]
        got = measure_step(
            m,
            step,
            store=self.store,
            fs_name=self.fs_name(fs),
            trace=self.spec.trace,
            repeat=self.spec.repeat,
            say=self.say,
        )
        try:
            got["age"] = json.loads(_age_result_path(self.out, step, fs).read_text())
        except (OSError, ValueError):
            # killed between the step's last op and this file: the ager's record says it all
            # but the ops skipped as full
            rec = age_record(m) or {}
            got["age"] = {"ops": rec.get("ops_done"), "bytes_written": rec.get("bytes_written")}
        save_result(self.store, self.study_id, step, fs, got)
        self._measured.add((step, fs))
        for k in ("snapshot", "clean_copy", "scan"):
            self.times[k] += float(got["seconds"].get(k, 0.0))
        sc = got["scan"]
        self.say(
            f"fsage: step {step} {fs}: layout score {got['layout_score'] or 0:.3f}, scan "
            f"{sc['aged_seconds']:.2f} s aged / {sc['clean_seconds']:.2f} s clean "
            f"(ratio {sc['ratio']:.2f})"
        )

    def cleanup(self) -> None:
        for m in self.members.values():
            with contextlib.suppress(Exception):
                m.cleanup()


def _age_result_path(out: Path, step: int, fs: str) -> Path:
    return step_file(out, step).with_suffix(f".{fs}.json")


def _step_of(path: Path) -> int | None:
    stem = path.name.removesuffix(".jsonl")
    if not stem.startswith("step-"):
        return None
    try:
        return int(stem[5:])
    except ValueError:
        return None


def prepare(
    out: Path,
    *,
    fs: str,
    workload: str,
    size: int,
    steps: int,
    seed: int,
    trace: bool,
    repeat: int,
    skip_missing: bool,
    say: Say,
    git_trees: int = 1,
    git_every: int = 1,
) -> tuple[StudySpec, dict[str, Any]]:
    """Check the input, make the op stream and write the study's directory (nothing is
    written before every check passed)."""
    if out.exists() and any(out.iterdir()):
        raise UsageError(f"--out {out}: not empty (--resume continues the study there)")
    kinds, skipped = parse_filesystems(fs, skip_missing=skip_missing)
    for s in skipped:
        say(f"fsage: skipping {s}: this machine cannot make it")
    check_size(kinds, size)
    if trace and os.geteuid() != 0:
        raise UsageError("--trace needs root (block tracing)")
    header, per_step = make_workload(
        workload, size, steps, seed, git_trees=git_trees, git_every=git_every
    )
    peak = check_fits(per_step, size)
    inodes = ext_inodes(per_step, size) if any(k.startswith("ext") for k in kinds) else None
    if inodes is not None:
        say(
            f"fsage: the ext file systems get {inodes:,} inodes (mkfs -N; the default "
            f"{default_ext_inodes(size):,} cannot hold the workload's files)"
        )
    spec = StudySpec(
        kinds, workload, size, steps, seed, trace, repeat, git_trees, git_every, skipped, inodes
    )
    out.mkdir(parents=True, exist_ok=True)
    extra = {"ops_per_step": [len(s) for s in per_step], "peak_live_bytes": peak}
    write_study_dir(out, spec, header, per_step, extra)
    return spec, extra


def run_study(
    out: Path,
    db: Path,
    *,
    resume: bool,
    say: Say,
    new: dict[str, Any] | None = None,
) -> StudyResult:
    """A new study (``new``: the options of :func:`prepare`) or the one in ``out`` resumed."""
    from fsage.ager.images import can_loop_mount
    from fsage.db.store import Store
    from fsage.study.store import create_study, finish_study

    if not can_loop_mount():
        raise UsageError("a study needs root and loop devices")
    t0 = time.perf_counter()
    if resume:
        record = load_record(out)
        release_images(out, say)
        spec = StudySpec.from_json(record["spec"])
        if "db" in record and Path(record["db"]) != db.resolve():
            raise UsageError(
                f"{out}: the study is stored in {record['db']}; give --db {record['db']}"
            )
    else:
        assert new is not None
        spec, _ = prepare(out, say=say, **new)
        record = load_record(out)
    with Store.open(db, create=True) as store:
        if "study_id" not in record:
            record["study_id"] = create_study(store, out.resolve(), spec.to_json())
            record["db"] = str(db.resolve())
            save_record(out, record)
        study_id = int(record["study_id"])
        worker = RealWorker(out, spec, store, study_id, say)
        try:
            n = drive(plan(spec.steps, spec.filesystems), worker, say)
        finally:
            worker.cleanup()
        finish_study(store, study_id)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return StudyResult(
        study_id,
        out,
        db,
        spec.filesystems,
        spec.skipped,
        spec.steps,
        n,
        time.perf_counter() - t0,
        {k: round(v, 2) for k, v in worker.times.items()},
        round(max(peak, kids), 1),
    )
