"""What a study is: its file systems, its workload cut into steps, and its record in DIR.

The op stream is made once, before any file system is touched, and written to the study's
directory (``ops.jsonl.gz``, a ``snapshot`` marker between steps, and one file per step that
the ager runs), so every file system gets the same ops and a study can be rerun from its
directory alone.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fsage.errors import FsageError, UsageError
from fsage.workload import Op, WorkloadHeader, read_workload, write_workload

#: File systems a study knows: fsage's LFS (through FUSE) and kernel ones made by mkfs.
KERNEL_KINDS = ("ext4", "ext3", "ext2", "xfs", "btrfs")
#: Kernel file systems known by name that a study cannot run yet (the scan suite reads only
#: the kinds above through loop devices): refused, after saying what this machine lacks.
NAMED_KINDS = ("f2fs", "nilfs2", "jfs", "reiserfs")
KNOWN_KINDS = (*KERNEL_KINDS, "lfs", *NAMED_KINDS)
WORKLOAD_KINDS = ("preset", "profile", "ops", "replay", "git")
#: Share of an image's bytes a workload's live data may reach: the rest is the file
#: system's own (journal, inode tables, log segments kept clean for the cleaner).
FIT_SHARE = 0.9
#: Share of an image's bytes a generated workload is made for.
GENERATED_SHARE = 0.75
RECORD = "study.json"
OPS_FILE = "ops.jsonl.gz"
STEPS_DIR = "steps"


class MissingFilesystem(FsageError):
    """A known file system this machine cannot make or mount (no kernel support, no mkfs)."""


@dataclass
class StudySpec:
    """The parameters that decide a study's results (recorded in ``DIR/study.json``)."""

    filesystems: list[str]
    workload: str
    size: int
    steps: int
    seed: int = 0
    trace: bool = False
    repeat: int = 0  # scan rounds per step; 0: until decided (fsage.study.rounds)
    git_trees: int = 1
    git_every: int = 1
    skipped: list[str] = field(default_factory=list)  # asked for, missing, skipped
    #: inodes of the ext file systems (mkfs -N), sized for the workload; None: mkfs's default
    inodes: int | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StudySpec:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


def _kernel_has(kind: str) -> bool:
    def listed() -> bool:
        try:
            text = Path("/proc/filesystems").read_text()
        except OSError:
            return False
        return any(line.split()[-1] == kind for line in text.splitlines() if line.split())

    if listed():
        return True
    # not loaded yet: the module may be there
    if shutil.which("modprobe") and os.geteuid() == 0:
        subprocess.run(["modprobe", "-q", kind], capture_output=True, check=False)
    return listed()


def why_missing(kind: str) -> str | None:
    """Why this machine cannot run a study on ``kind`` (None: it can)."""
    if kind == "lfs":
        from fsage.lfs.mount import fuse_available

        return fuse_available()
    if shutil.which(f"mkfs.{kind}") is None:
        return f"mkfs.{kind} is not installed"
    if not _kernel_has(kind):
        return f"the kernel has no {kind} (not in /proc/filesystems, no module)"
    return None


def parse_filesystems(text: str, *, skip_missing: bool) -> tuple[list[str], list[str]]:
    """``ext4,xfs,lfs`` -> (the ones to study, the missing ones skipped); bad names refused."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise UsageError("--fs: give at least one file system (e.g. ext4,xfs,btrfs,lfs)")
    for n in names:
        if n not in KNOWN_KINDS:
            raise UsageError(f"--fs: unknown file system {n!r} (known: {', '.join(KNOWN_KINDS)})")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise UsageError(f"--fs: {', '.join(dup)} given twice")
    keep: list[str] = []
    skipped: list[str] = []
    for n in names:
        why = why_missing(n)
        if why is None and n in NAMED_KINDS:
            raise UsageError(f"--fs {n}: studies cannot scan {n} images yet")
        if why is None:
            keep.append(n)
        elif skip_missing:
            skipped.append(n)
        else:
            raise MissingFilesystem(f"--fs {n}: {why} (--skip-missing studies the others)")
    if not keep:
        raise MissingFilesystem(f"--fs: none of {', '.join(names)} can be made on this machine")
    return keep, skipped


def check_size(filesystems: Iterable[str], size: int) -> None:
    from fsage.ager.images import MIN_SIZE

    for n in filesystems:
        low = MIN_SIZE.get(n, 16 << 20)
        if size < low:
            raise UsageError(f"--size: {n} needs an image of at least {low >> 20} MiB")


# ---------------------------------------------------------------------------- workloads


def _split_spec(spec: str) -> tuple[str, str]:
    kind, sep, rest = spec.partition(":")
    if not sep or kind not in WORKLOAD_KINDS or not rest:
        raise UsageError(
            f"--workload {spec!r}: one of preset:NAME, profile:DIR, ops:FILE, replay:DB:FS, "
            "git:REPO"
        )
    return kind, rest


def check_git_repo(path: Path) -> None:
    """Refuse a path that is not a git repository, in one line."""
    if not path.is_dir():
        raise UsageError(f"--workload git:{path}: no such directory")
    proc = subprocess.run(
        ["git", "-C", str(path), "rev-parse", "--git-dir"],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise UsageError(f"--workload git:{path}: not a git repository")


def make_workload(
    spec: str, size: int, steps: int, seed: int, *, git_trees: int = 1, git_every: int = 1
) -> tuple[WorkloadHeader, list[list[Op]]]:
    """The study's op stream, cut into ``steps`` steps (a git history: one pull of
    ``git_every`` commits into ``git_trees`` work trees per step)."""
    kind, rest = _split_spec(spec)
    if kind == "git":
        repo = Path(rest)
        check_git_repo(repo)
        from fsage.ager.githistory import git_workload

        try:
            header, per_step = git_workload(repo, trees=git_trees, every=git_every, steps=steps)
        except FsageError as exc:
            raise UsageError(f"--workload git:{repo}: {exc}") from None
        out = [list(s) for s in per_step]
        if len(out) < steps:
            raise UsageError(
                f"--workload git:{repo}: the history gives {len(out)} steps of {git_every} "
                f"commit(s), not {steps}"
            )
        return header, out[:steps]
    if kind in ("preset", "profile"):
        from fsage.ager.generator import Generator
        from fsage.ager.profile import PRESETS, load_profile

        if kind == "preset" and rest not in PRESETS:
            raise UsageError(
                f"--workload preset:{rest}: no such preset (known: {', '.join(sorted(PRESETS))})"
            )
        if kind == "profile" and not Path(rest).exists():
            raise UsageError(f"--workload profile:{rest}: no such file or directory")
        # The generator fills its model of the capacity: made for what every file system
        # can hold (btrfs's metadata takes a fifth of a small image), so that no op finds
        # one of them full and the streams stay the same on all.
        gen = Generator(load_profile(rest), seed, int(size * GENERATED_SHARE))
        header = gen.header()
        ops = list(gen.ops())
    elif kind == "ops":
        if not Path(rest).is_file():
            raise UsageError(f"--workload ops:{rest}: no such file")
        header, it = read_workload(Path(rest))
        ops = list(it)
    else:
        db, sep, fs_name = rest.rpartition(":")
        if not sep or not db or not fs_name:
            raise UsageError(f"--workload replay:{rest}: give replay:DB:FS")
        if not Path(db).is_file():
            raise UsageError(f"--workload replay:{rest}: no database {db}")
        from fsage.db.store import Store
        from fsage.replay.deltas import snapshot_deltas

        with Store.open(Path(db), readonly=True) as store:
            header, ops, _stats = snapshot_deltas(store, fs_name)
    ops = [op for op in ops if op.op != "snapshot"]  # the study puts its own between steps
    return header, split_steps(ops, steps)


def _data_bytes(op: Op) -> int:
    return op.size if op.op in ("create", "append", "overwrite", "fallocate") else 0


def split_steps(ops: list[Op], steps: int) -> list[list[Op]]:
    """Cut ``ops`` into ``steps`` runs of about equal data written, in order."""
    if steps < 1:
        raise UsageError("--steps: at least 1")
    if not ops:
        raise UsageError("the workload has no ops")
    total = sum(_data_bytes(op) for op in ops)
    out: list[list[Op]] = [[] for _ in range(steps)]
    done = 0
    for i, op in enumerate(ops):
        if total > 0:
            k = min(steps - 1, done * steps // total)
        else:
            k = min(steps - 1, i * steps // len(ops))
        out[k].append(op)
        done += _data_bytes(op)
    return out


def peak_live_bytes(steps: list[list[Op]]) -> int:
    """The most bytes the stream's files hold at once (file sizes, not blocks)."""
    sizes: dict[str, int] = {}
    live = peak = 0
    for step in steps:
        for op in step:
            old = sizes.get(op.path, 0)
            if op.op == "create":
                new = op.size
            elif op.op == "append":
                new = old + op.size
            elif op.op in ("overwrite", "fallocate"):
                new = max(old, op.offset + op.size)
            elif op.op == "truncate":
                new = op.size
            elif op.op == "delete":
                live -= sizes.pop(op.path, 0)
                continue
            elif op.op == "rename":
                moved = sizes.pop(op.path, None)
                if moved is not None:
                    live -= sizes.pop(op.dest, 0)
                    sizes[op.dest] = moved
                continue
            else:
                continue
            sizes[op.path] = new
            live += new - old
            peak = max(peak, live)
    return peak


def peak_live_inodes(steps: list[list[Op]]) -> int:
    """The most files, directories, symlinks and special files the stream holds at once."""
    live: set[str] = set()
    links: set[str] = set()  # second names of a file: no inode of their own
    peak = 0
    for step in steps:
        for op in step:
            if op.op in ("create", "mkdir", "symlink", "mknod"):
                live.add(op.path)
            elif op.op == "link" and op.dest:
                links.add(op.dest)
            elif op.op == "delete":
                if op.path in links:
                    links.discard(op.path)
                else:
                    live.discard(op.path)
            elif op.op == "rename" and op.dest and op.path in live:
                live.discard(op.path)
                live.add(op.dest)
            peak = max(peak, len(live))
    return peak


#: Headroom over the stream's peak inode count (the ager's own files, lost+found, a margin).
INODE_HEADROOM = 1.25


def default_ext_inodes(size: int) -> int:
    """mke2fs's inode count for an image of ``size`` (mke2fs.conf: one inode per 4 KiB below
    512 MiB, the "small" type, else per 16 KiB)."""
    return size // (4096 if size < 512 << 20 else 16384)


def ext_inodes(steps: list[list[Op]], size: int) -> int | None:
    """The inode count an ext file system needs for the stream (mkfs -N), or None where
    mke2fs's default holds it: a workload of small files (a news spool) would otherwise find
    the inode table full long before the blocks run out."""
    need = int(peak_live_inodes(steps) * INODE_HEADROOM) + 64
    return need if need > default_ext_inodes(size) else None


def check_fits(steps: list[list[Op]], size: int) -> int:
    peak = peak_live_bytes(steps)
    if peak > FIT_SHARE * size:
        raise UsageError(
            f"the workload holds up to {peak / 2**20:,.1f} MiB of files at once: it cannot fit "
            f"{size / 2**20:,.0f} MiB images (give a larger --size)"
        )
    return peak


# ---------------------------------------------------------------------------- the record


def step_file(out: Path, step: int) -> Path:
    return out / STEPS_DIR / f"step-{step:04d}.jsonl"


def write_study_dir(
    out: Path, spec: StudySpec, header: WorkloadHeader, steps: list[list[Op]], extra: dict[str, Any]
) -> None:
    """The op stream (whole and per step) and the parameters, each written whole."""
    (out / STEPS_DIR).mkdir(parents=True, exist_ok=True)

    def marked() -> Iterable[Op]:
        for i, ops in enumerate(steps):
            yield from ops
            yield Op("snapshot", label=f"study step {i + 1}")

    write_workload(out / OPS_FILE, header, marked())
    for i, ops in enumerate(steps):
        write_workload(step_file(out, i + 1), header, ops)
    save_record(
        out, {"spec": spec.to_json(), "workload_header": json.loads(header.to_json()), **extra}
    )


def save_record(out: Path, data: dict[str, Any]) -> None:
    tmp = out / (RECORD + ".part")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    tmp.replace(out / RECORD)


def load_record(out: Path) -> dict[str, Any]:
    path = out / RECORD
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"{out}: no study here (no {RECORD}) to resume") from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: unreadable ({exc})") from None
    if not isinstance(data, dict) or "spec" not in data:
        raise UsageError(f"{path}: not a study record")
    return data
