"""`fsage age` killed with SIGKILL at random points, then resumed: the journal must replay to
exactly the tree left on disk (names, types, sizes), however many times the run was killed and
whichever op was running at the kill."""

from __future__ import annotations

import os
import random
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fsage.ager.run import AgeOptions, age
from fsage.workload import Op, WorkloadHeader, read_workload, write_workload
from tests.ager.helpers import mounted_tmpfs, record_written_since

MIB = 1 << 20
CAPACITY = 128 * MIB
KILLS = 10
_KINDS = {stat.S_IFDIR: "d", stat.S_IFREG: "f", stat.S_IFLNK: "l"}


def tree_with_types(root: Path) -> dict[str, tuple[str, int]]:
    """{relative path: (type, size)} below ``root``: d(irectory), f(ile), l(ink), o(ther)."""
    out: dict[str, tuple[str, int]] = {}
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not (dirpath == str(root) and d == "lost+found")]
        for name in dirs + files:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            kind = _KINDS.get(stat.S_IFMT(st.st_mode), "o")
            out[os.path.relpath(p, root)] = (kind, 0 if kind == "d" else st.st_size)
    return out


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 128 MiB tmpfs mounted for the test: a bounded target that a generated run fills."""
    with mounted_tmpfs(tmp_path / "t", CAPACITY) as mnt:
        yield mnt


def replayed_tree(journal: Path) -> dict[str, tuple[str, int]]:
    """What replaying ``journal`` on an empty directory gives, as ``tree_with_types`` shows it
    (the ops the tests' streams use; hard links share one size)."""
    tree: dict[str, list[object]] = {}  # path -> [kind, size], shared by hard links
    for op in read_workload(journal)[1]:
        if op.op == "mkdir":
            tree[op.path] = ["d", 0]
        elif op.op == "create":
            if op.path in tree:
                tree[op.path][1] = op.size
            else:
                tree[op.path] = ["f", op.size]
        elif op.op == "append":
            tree[op.path][1] = int(str(tree[op.path][1])) + op.size
        elif op.op == "truncate":
            tree[op.path][1] = op.size
        elif op.op == "overwrite":
            tree[op.path][1] = max(int(str(tree[op.path][1])), op.offset + op.size)
        elif op.op == "delete":
            del tree[op.path]
        elif op.op == "link":
            tree[op.dest] = tree[op.path]
        elif op.op == "rename":
            for p in [p for p in tree if p == op.path or p.startswith(op.path + "/")]:
                tree[op.dest + p[len(op.path) :]] = tree.pop(p)
    return {p: (str(kind), int(str(size))) for p, (kind, size) in tree.items()}


def _differ(a: dict[str, tuple[str, int]], b: dict[str, tuple[str, int]]) -> list[Any]:
    paths = sorted(p for p in a.keys() | b.keys() if a.get(p) != b.get(p))
    return [(p, a.get(p), b.get(p)) for p in paths[:10]]


def _big_ops(rng: random.Random, count: int) -> Iterator[Op]:
    """A stream of every namespace and data op the ager runs, with writes of up to 4 MiB (so
    that a kill often lands inside one), keeping under 64 MiB live."""
    dirs = ["a"]
    files: dict[str, int] = {}  # path -> inode
    size: dict[int, int] = {}
    yield Op("mkdir", "a")
    for n in range(count):
        live = sum(size[i] for i in set(files.values()))
        kind = rng.choices(
            ["create", "append", "truncate", "delete", "rename", "link", "mkdir", "overwrite"],
            [20, 30, 5, 20 if live < 48 * MIB else 200, 8, 3, 3, 5],
        )[0]
        if kind == "mkdir" or not files:
            kind = "create" if files or kind != "mkdir" else "mkdir"
        if kind == "mkdir":
            d = f"{rng.choice(dirs)}/d{n}"
            dirs.append(d)
            yield Op("mkdir", d)
        elif kind in ("create", "link", "rename"):
            path = f"{rng.choice(dirs)}/f{n}"
            if kind == "create":
                files[path] = n
                size[n] = rng.randrange(1, 4 * MIB)
                yield Op("create", path, size=size[n])
            else:
                src = rng.choice(sorted(files))
                files[path] = files[src]
                if kind == "rename":
                    del files[src]
                yield Op(kind, src, dest=path)
        else:
            path = rng.choice(sorted(files))
            ino = files[path]
            if kind == "delete":
                del files[path]
                yield Op("delete", path)
            elif kind == "append":
                add = rng.randrange(1, 4 * MIB)
                size[ino] += add
                yield Op("append", path, size=add)
            elif kind == "truncate":
                size[ino] = rng.randrange(size[ino] + 1)
                yield Op("truncate", path, size=size[ino])
            else:
                yield Op("overwrite", path, offset=0, size=min(size[ino], MIB))


def _journal_size(target: Path) -> int:
    return sum(p.stat().st_size for p in target.parent.glob(target.name + ".fsage-age.*.ops.jsonl"))


def _run_and_stop(
    cmd: list[str],
    env: dict[str, str],
    target: Path,
    sig: int,
    wait: float,
    said: list[str],
    grow: int = 4096,
) -> bool:
    """Start ``cmd``; once it has journaled ``grow`` bytes more and ``wait`` seconds have
    passed, send it ``sig``. False when it finished first; what it said goes to ``said``."""
    before = _journal_size(target)
    since = time.time()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    # Conditions, not time: ops ran, and (for Ctrl-C) the run is in its op loop, where the
    # signal stops it between two ops. No time limit of its own: load only makes it longer.
    while proc.poll() is None and not (
        _journal_size(target) >= before + grow
        and (sig == signal.SIGKILL or record_written_since(target, since))
    ):
        time.sleep(0.005)
    time.sleep(wait)
    if proc.poll() is None:
        proc.send_signal(sig)
    _out, err = proc.communicate()
    said.extend(err.decode().splitlines())
    if proc.returncode == 0:
        return False
    assert proc.returncode == (-signal.SIGKILL if sig == signal.SIGKILL else 130), err.decode()
    return True


@pytest.mark.slow
@pytest.mark.needs_root
@pytest.mark.parametrize("workload", ["profile", "ops"])
def test_killed_runs_resume_to_a_tree_their_journal_replays_to(
    workload: str, small_fs: Path, tmp_path: Path, fsage_env: dict[str, str]
) -> None:
    """Each round: SIGKILL at a random moment, then a resume stopped with Ctrl-C once it ran
    on; the journal must then replay to the tree on disk (every round is checked: a later
    delete of the file would erase a difference)."""
    rng = random.Random(f"kill-{workload}")
    base = [sys.executable, "-m", "fsage", "age", str(small_fs)]
    if workload == "profile":
        first = [*base, "--profile", "hfs-surge", "--fill", "0.6", "--churn", "25", "--seed", "7"]
    else:  # a recorded stream on the same target: the op after the journaled ones is known
        ops = tmp_path / "ops.jsonl"
        write_workload(ops, WorkloadHeader("test"), _big_ops(random.Random(7), 4000))
        first = [*base, "--ops", str(ops)]
    resume = [*base, "--resume"]
    kills = 0
    said: list[str] = []
    cmd = first
    finished = False

    def hit() -> bool:  # a kill landed inside an op that had changed the tree
        return any("had taken effect" in line for line in said)

    # KILLS kills, and more (up to four times as many) until one lands inside an op: where a
    # kill lands is chance, and a loaded machine changes the odds
    while (kills < KILLS or (not hit() and kills < 4 * KILLS)) and not finished:
        pause = rng.uniform(0, 0.15)
        if not _run_and_stop(cmd, fsage_env, small_fs, signal.SIGKILL, pause, said):
            finished = True
            break
        kills += 1
        cmd = resume
        # stopped as soon as it ran on: before later ops delete what the kill left
        finished = not _run_and_stop(cmd, fsage_env, small_fs, signal.SIGINT, 0.0, said, 1)
        (journal,) = small_fs.parent.glob(small_fs.name + ".fsage-age.*.ops.jsonl")
        assert not _differ(tree_with_types(small_fs), replayed_tree(journal)), kills
    if not finished:
        done = subprocess.run(cmd, env=fsage_env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    assert kills >= KILLS // 2
    # some kills landed inside an op that had changed the tree (what the test is about), and
    # every difference was one op's
    assert hit(), said
    assert not any("differs from its journal" in line for line in said), said
    # The whole journal, replayed for real on another file system, gives the same tree.
    with mounted_tmpfs(tmp_path / "replayed", 2 * CAPACITY) as replayed:
        res = age(replayed, AgeOptions(ops_file=journal))
        assert res.finished and res.nospace == 0 and res.skipped == 0
        assert not _differ(tree_with_types(small_fs), tree_with_types(replayed))
