"""`fsage age` of an image written by a library (LFS, offline ext) killed with SIGKILL, then
resumed: an LFS image holds its journal's ops up to its last written segment, and the ops
after it run again; an offline ext image holds neither, and is refused."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from fsage.ager.images import make_image
from fsage.ager.reconcile import Node, durable_prefix, journal_tree
from fsage.ager.run import _Journal, _layout_entries
from fsage.snapshotter import read_source
from fsage.workload import Op, WorkloadHeader, write_workload
from tests.ager.helpers import wait_until

MIB = 1 << 20


def _ops(path: Path, n: int) -> Path:
    rng = random.Random(1)
    ops = [Op("mkdir", "d")] + [
        Op("create", f"d/f{i}", size=rng.randrange(1, 60000)) for i in range(n)
    ]
    ops += [Op("delete", f"d/f{i}") for i in range(0, n, 3)]
    ops += [Op("append", f"d/f{i}", size=5000) for i in range(1, n, 3)]
    write_workload(path, WorkloadHeader("test"), iter(ops))
    return path


def _journal(image: Path) -> Path:
    (journal,) = image.parent.glob(image.name + ".fsage-age.*.ops.jsonl")
    return journal


def _kill_after(cmd: list[str], env: dict[str, str], image: Path, lines: int) -> str:
    """Start ``cmd`` and SIGKILL it once its journal has grown by ``lines`` ops; what it
    said."""

    def count() -> int:
        try:
            return _journal(image).read_bytes().count(b"\n")
        except ValueError:
            return 0

    before = count()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wait_until(lambda: count() >= before + lines, proc, f"{lines} more ops were journaled")
    proc.send_signal(signal.SIGKILL)
    _out, err = proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    return err.decode()


def _differs_from_journal(image: Path) -> list[str]:
    journal = _journal(image)
    with open(journal, "rb") as fh:
        header_end = len(fh.readline())
    ops, _ = _Journal.tail(journal, header_end)
    replayed = journal_tree({}, ops)
    found = {p: Node("d") if d else Node("f", s) for p, d, s in _layout_entries(read_source(image))}
    return sorted(p for p in replayed.keys() | found.keys() if replayed.get(p) != found.get(p))


@pytest.mark.slow
def test_a_killed_lfs_run_resumes_to_what_its_journal_replays_to(
    tmp_path: Path, fsage_env: dict[str, str]
) -> None:
    pytest.importorskip("fsage.lfs.executor")
    image = tmp_path / "l.img"
    fsage = [sys.executable, "-m", "fsage"]
    subprocess.run(
        [*fsage, "lfs", "mkfs", str(image), "--size", "512M"],
        env=fsage_env,
        check=True,
        capture_output=True,
    )
    ops = _ops(tmp_path / "ops.jsonl", 6000)
    said: list[str] = []
    cmd = [*fsage, "age", str(image), "--ops", str(ops)]
    for lines in (2500, 1500):  # across a record (every 1000 ops) and not
        said.append(_kill_after(cmd, fsage_env, image, lines))
        cmd = [*fsage, "age", str(image), "--resume"]
    done = subprocess.run(cmd, env=fsage_env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    said.append(done.stderr)
    # the kills lost what the segment buffer held (what the test is about)
    assert "lost with the kill: they run again" in "".join(said), said
    assert _differs_from_journal(image) == []
    fsck = subprocess.run(
        [*fsage, "lfs", "fsck", str(image)], env=fsage_env, capture_output=True, text=True
    )
    assert fsck.returncode == 0, fsck.stdout


def test_a_killed_offline_run_is_not_resumed(tmp_path: Path, fsage_env: dict[str, str]) -> None:
    image = make_image(tmp_path / "a.img", "ext4", 256 * MIB)
    ops = _ops(tmp_path / "ops.jsonl", 6000)
    base = [sys.executable, "-m", "fsage", "age", str(image)]
    _kill_after([*base, "--offline", "--ops", str(ops)], fsage_env, image, 1500)
    again = subprocess.run([*base, "--resume"], env=fsage_env, capture_output=True, text=True)
    assert again.returncode == 1
    assert "the offline run was killed" in again.stderr and "cannot be resumed" in again.stderr


def test_durable_prefix_finds_the_last_journal_state_an_image_holds() -> None:
    ops = [
        Op("mkdir", "a"),
        Op("create", "a/x", size=10),
        Op("link", "a/x", dest="a/y"),
        Op("append", "a/y", size=5),
        Op("rename", "a", dest="b"),
        Op("delete", "b/x"),
        Op("symlink", "b/s", dest="y"),
    ]
    for k in range(len(ops) + 1):
        state = journal_tree({}, ops[:k])
        image = {p: replace(n) for p, n in state.items() if n.kind in "df"}
        # the last state equal to it: a symlink is not seen in an image read back
        assert durable_prefix({}, ops, image) == (len(ops) if k == len(ops) - 1 else k)
    assert durable_prefix({}, ops, {"a": Node("d"), "a/x": Node("f", 11)}) is None
    assert durable_prefix({}, ops, {"a": Node("d")}, first=2) is None
