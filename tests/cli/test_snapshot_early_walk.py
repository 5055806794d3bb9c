"""`fsage snapshot DIR` starts its walk before it imports the rest of the command, and the
command takes that walk over (or drops it, when it fails first)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import click
import pytest

import fsage.snapshotter.livewalk as livewalk
from fsage.cli import (
    SNAPSHOT_FLAG_OPTIONS,
    SNAPSHOT_VALUE_OPTIONS,
    main,
    snapshot_directory,
)
from fsage.errors import SourceError


def test_snapshot_directory_reads_the_command_line(tmp_path: Path) -> None:
    d, f = str(tmp_path), str(tmp_path / "file")
    Path(f).write_bytes(b"x")
    assert snapshot_directory(["snapshot", d]) == d
    assert snapshot_directory(["snapshot", "--db", "x.db", d, "--freeze"]) == d
    assert snapshot_directory(["snapshot", "--format=json", "--label", "-x", d]) == d
    assert snapshot_directory(["snapshot", "--", d]) == d
    assert snapshot_directory(["snapshot", d, "--help"]) is None
    assert snapshot_directory(["snapshot", d, "--nope"]) is None
    assert snapshot_directory(["snapshot", d, d]) is None
    assert snapshot_directory(["snapshot", f]) is None  # an image: not the live reader
    assert snapshot_directory(["snapshot", str(tmp_path / "missing")]) is None
    assert snapshot_directory(["snapshot", d, "--db"]) is None
    assert snapshot_directory(["show", d]) is None
    assert snapshot_directory(["--version"]) is None
    assert snapshot_directory([]) is None


def test_the_options_it_knows_are_the_commands() -> None:
    from fsage.cli.snapshot import snapshot

    opts = [p for p in snapshot.params if isinstance(p, click.Option)]
    flags = {o for p in opts if p.is_flag for o in p.opts}
    values = {o for p in opts if not p.is_flag for o in p.opts}
    assert flags == SNAPSHOT_FLAG_OPTIONS
    assert values == SNAPSHOT_VALUE_OPTIONS


def _readable_tree(tmp_path: Path) -> Path:
    tree = tmp_path / "tree"
    for i in range(30):
        (tree / f"d{i % 3}").mkdir(parents=True, exist_ok=True)
        (tree / f"d{i % 3}" / f"f{i}").write_bytes(b"y" * (i * 700))
    os.sync()  # no delayed allocation left for writeback to settle between two reads
    try:
        livewalk.scope_of(tree, engine="c")
    except SourceError as exc:
        pytest.skip(f"the live reader cannot read {tmp_path}: {exc}")
    return tree


def _walks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the threads each C walk runs on, as they run."""
    threads: list[str] = []
    real = livewalk.run_c_walk

    def run(sc: livewalk.WalkScope) -> livewalk.CWalk:
        threads.append(threading.current_thread().name)
        return real(sc)

    import fsage.snapshotter.live as live

    monkeypatch.setattr(livewalk, "run_c_walk", run)
    monkeypatch.setattr(live, "run_c_walk", run)
    return threads


def test_the_command_takes_the_walk_started_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    tree = _readable_tree(tmp_path)
    threads = _walks(monkeypatch)
    db = tmp_path / "a.db"
    with pytest.raises(SystemExit) as exit_:
        main(["snapshot", str(tree), "--db", str(db), "--format", "json"])
    assert exit_.value.code == 0
    assert threads == ["fsage-walk"]  # one walk, the one started before the command ran
    assert '"files": 30' in capsys.readouterr().out
    # and the layout it stored is the one a walk of the library call finds
    from fsage.db.store import Store
    from fsage.snapshotter.live import read_live_layout

    with Store.open(db) as store:
        stored = store.load_layout(1)
    direct = read_live_layout(tree)
    assert threads == ["fsage-walk", "MainThread"]
    assert sorted(stored.files.ino.tolist()) == sorted(direct.files.ino.tolist())
    assert stored.files.ext_physical.tolist() == direct.files.ext_physical.tolist()


def test_a_walk_not_taken_is_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    tree = _readable_tree(tmp_path)
    threads = _walks(monkeypatch)
    with pytest.raises(SystemExit) as exit_:
        main(["snapshot", str(tree), "--db", str(tmp_path / "b.db"), "--taken-at", "nope"])
    assert exit_.value.code != 0
    assert "--taken-at" in capsys.readouterr().err
    assert not livewalk._started  # nothing left for a later command to take
    walking = [t for t in threading.enumerate() if t.name == "fsage-walk"]
    assert all(t.daemon for t in walking)  # the process does not wait for it
    for t in walking:
        t.join()
    assert threads == ["fsage-walk"]
    assert not (tmp_path / "b.db").exists()


def test_a_walk_is_started_once_per_directory(tmp_path: Path) -> None:
    tree = _readable_tree(tmp_path)
    try:
        livewalk.start_background_walk(str(tree))
        livewalk.start_background_walk(str(tree))  # as `python3 -m fsage`, then the group
        assert len(livewalk._started) == 1
    finally:
        for walk in livewalk._started:
            walk.result()
        livewalk.forget_background_walks()


def test_python_m_fsage_snapshot_stores_before_it_exits(
    tmp_path: Path, fsage_env: dict[str, str]
) -> None:
    """The process ends without the interpreter's teardown: the snapshot must be committed,
    and its line printed, by then; a failed command exits as usual."""
    import json
    import subprocess
    import sys

    from fsage.db.store import Store

    tree = _readable_tree(tmp_path)
    db = tmp_path / "m.db"
    argv = [sys.executable, "-m", "fsage", "snapshot", str(tree), "--db", str(db)]
    res = subprocess.run([*argv, "--format", "json"], capture_output=True, text=True, env=fsage_env)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["files"] == 30
    with Store.open(db) as store:
        assert int(store.load_layout(1).files.is_regular().sum()) == 30
    bad = subprocess.run(
        [*argv, "--taken-at", "nope"], capture_output=True, text=True, env=fsage_env
    )
    assert bad.returncode == 2 and "--taken-at" in bad.stderr


def test_a_failed_first_snapshot_leaves_no_database(tmp_path: Path) -> None:
    """The database is opened before the read (so that the schema of a new one is made while
    the walk runs): a read that fails removes a database it made, never one that was there."""
    bad = tmp_path / "not-a-file-system.img"
    bad.write_bytes(b"\x5a" * 65536)
    db = tmp_path / "new.db"
    with pytest.raises(SystemExit) as exit_:
        main(["snapshot", str(bad), "--db", str(db)])
    assert exit_.value.code != 0
    assert [p.name for p in tmp_path.iterdir()] == [bad.name]  # no db, -wal or -shm
    tree = _readable_tree(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main(["snapshot", str(tree), "--db", str(db)])
    assert exit_.value.code == 0
    before = db.read_bytes()
    with pytest.raises(SystemExit) as exit_:
        main(["snapshot", str(bad), "--db", str(db)])
    assert exit_.value.code != 0
    from fsage.db.store import Store

    assert db.exists() and len(db.read_bytes()) == len(before)
    with Store.open(db, readonly=True) as store:
        assert [s.id for s in store.snapshots(None)] == [1]


def test_the_seconds_reported_count_the_walk_started_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The summary's seconds run from the start of the walk begun before the command's
    imports, not from the command body (which would leave the read out)."""
    import json
    import time

    tree = _readable_tree(tmp_path)
    real = livewalk.run_c_walk

    def slow(sc: livewalk.WalkScope) -> livewalk.CWalk:
        time.sleep(0.4)  # a walk of a large tree, most of it before the command body runs
        return real(sc)

    monkeypatch.setattr(livewalk, "run_c_walk", slow)
    livewalk.start_background_walk(str(tree))
    time.sleep(0.3)  # the imports
    with pytest.raises(SystemExit) as exit_:
        main(["snapshot", str(tree), "--db", str(tmp_path / "s.db"), "--format", "json"])
    assert exit_.value.code == 0
    assert json.loads(capsys.readouterr().out)["seconds"] >= 0.4


def test_mounts_elsewhere_do_not_make_another_walk(tmp_path: Path) -> None:
    """A walk started early is still the command's when something else on the machine was
    mounted meanwhile; a mount below the tree makes it another walk."""
    tree = _readable_tree(tmp_path)
    first = livewalk.scope_of(tree, engine="c")
    later = livewalk.scope_of(tree, engine="c")
    assert first.same_walk(later)
    root = first.real if first.sub else b""  # submounts are named as the scope names sub
    elsewhere = (first.sub or root) + b"-not-below/m" if first.sub else None
    if elsewhere is not None:
        later.submounts = {*later.submounts, elsewhere}
        assert first.same_walk(later)
    below = (first.sub or b"") + b"/d0/m"
    later.submounts = {*later.submounts, below}
    assert not first.same_walk(later)
