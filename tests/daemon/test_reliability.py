"""The daemon as a real subprocess on a seconds-level schedule: several snapshots of two
targets, kill -9 inside a snapshot, SIGTERM inside a snapshot, readers while it writes, a
second daemon, a full disk under the database, a target's image deleted mid-run."""

from __future__ import annotations

import errno
import os
import signal
import sqlite3
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from fsage.db.store import Store

from .conftest import (
    DaemonProcess,
    fsage,
    integrity,
    orphan_versions,
    query,
    wait_for,
    write_config,
)

EVERY = 'database = "fsage.db"\nevery = "0.5s"\n'


def start(
    tmp_path: Path, daemons: list[DaemonProcess], targets: dict[str, Path], **env: str
) -> DaemonProcess:
    cfg = write_config(tmp_path / "fsage.toml", EVERY, targets)
    d = DaemonProcess(cfg, tmp_path, tmp_path / "fsage.db", **env)
    daemons.append(d)
    d.wait_ready()
    return d


def snapshot_ids(db: Path) -> list[int]:
    return [r[0] for r in query(db, "SELECT id FROM snapshots ORDER BY id")]


def test_several_snapshots_of_two_targets_then_sigterm(
    tmp_path: Path, two_images: tuple[Path, Path], daemons: list[DaemonProcess]
) -> None:
    a, b = two_images
    d = start(tmp_path, daemons, {"a": a, "b": b})
    wait_for("3 snapshots of each", lambda: d.ok_runs("a") >= 3 and d.ok_runs("b") >= 3)
    # A second daemon on the same database refuses at once, naming the first.
    second = fsage(["daemon", "--config", str(tmp_path / "fsage.toml")], tmp_path)
    assert second.returncode == 1
    assert second.stderr == (
        f"fsage: error: another fsage daemon (pid {d.pid}) is using {tmp_path}/fsage.db"
        f" (lock {tmp_path}/fsage.db.lock is held)\n"
    )
    status = fsage(["status", "--db", "fsage.db", "--format", "json"], tmp_path)
    assert status.returncode == 0, status.stderr
    assert f'"daemon_pid": {d.pid}' in status.stdout
    assert d.stop() == 0
    db = tmp_path / "fsage.db"
    assert integrity(db) == "ok" and orphan_versions(db) == 0
    runs = query(db, "SELECT target, status, snapshot_id, error FROM collection_runs ORDER BY id")
    # Every run succeeded, but for one the SIGTERM may have caught inside its snapshot (on a
    # loaded machine a snapshot takes long enough): it is rolled back and recorded so.
    stopped = [r for r in runs if r[1] == "interrupted"]
    assert len(stopped) <= 1 and all(r[2:] == (None, "stopped by SIGTERM") for r in stopped), runs
    assert all(r[1] == "ok" for r in runs if r not in stopped), runs
    with Store.open(db) as store:
        snaps = store.snapshots()
        assert [s.id for s in snaps] == sorted(r[2] for r in runs if r[1] == "ok")
        for s in snaps:
            assert store.load_layout(s.id).files.ino.size > 0
    stamped = d.log().splitlines()
    # One event per line: an ISO 8601 time with its offset (stderr is a file here), the level.
    for line in stamped:
        stamp = datetime.fromisoformat(line.split(" ", 1)[0])
        assert stamp.utcoffset() is not None
        assert abs((datetime.now(UTC) - stamp).total_seconds()) < 600
    log = [line.split(" ", 1)[1] for line in stamped]
    assert log[0].startswith("info: daemon started: pid ")
    assert log[-1] == "info: daemon stopping on SIGTERM"
    assert all(line.split(": ", 1)[0] in {"info", "warning", "error"} for line in log)


def test_kill_9_inside_a_snapshot_leaves_nothing_and_the_next_run_succeeds(
    tmp_path: Path, two_images: tuple[Path, Path], daemons: list[DaemonProcess]
) -> None:
    a, _ = two_images
    db = tmp_path / "fsage.db"
    assert fsage(["snapshot", str(a), "--name", "a", "--db", str(db)], tmp_path).returncode == 0
    d = start(tmp_path, daemons, {"a": a}, FSAGE_DAEMON_TEST_HOLD="30")
    wait_for("the hold inside the transaction", lambda: "test hold" in d.log())
    # The snapshot row is written but not committed: a reader does not see it.
    assert snapshot_ids(db) == [1]
    d.kill()
    assert d.proc.returncode == -signal.SIGKILL
    assert integrity(db) == "ok"
    assert snapshot_ids(db) == [1]
    assert orphan_versions(db) == 0
    assert query(db, "SELECT COUNT(*) FROM collection_runs")[0][0] == 0
    # The lock died with the process; the next run takes a whole snapshot.
    again = fsage(["daemon", "--config", str(tmp_path / "fsage.toml"), "--once"], tmp_path)
    assert again.returncode == 0, again.stderr
    assert snapshot_ids(db) == [2] or snapshot_ids(db) == [1, 2]
    assert query(db, "SELECT status, snapshot_id FROM collection_runs") == [("ok", 2)]
    with Store.open(db) as store:
        assert store.snapshot(2).files == store.snapshot(1).files
    assert integrity(db) == "ok"


def test_sigterm_inside_a_snapshot_rolls_it_back_and_exits_0(
    tmp_path: Path, two_images: tuple[Path, Path], daemons: list[DaemonProcess]
) -> None:
    a, _ = two_images
    db = tmp_path / "fsage.db"
    d = start(tmp_path, daemons, {"a": a}, FSAGE_DAEMON_TEST_HOLD="30")
    wait_for("the hold inside the transaction", lambda: "test hold" in d.log())
    assert d.stop(signal.SIGTERM) == 0
    assert snapshot_ids(db) == []
    assert query(db, "SELECT target, status, error, snapshot_id FROM collection_runs") == [
        ("a", "interrupted", "stopped by SIGTERM", None)
    ]
    assert integrity(db) == "ok" and orphan_versions(db) == 0
    assert "warning: target a: interrupted (stopped by SIGTERM)" in d.log()


def test_readers_never_see_database_is_locked(
    tmp_path: Path, two_images: tuple[Path, Path], daemons: list[DaemonProcess]
) -> None:
    a, b = two_images
    db = tmp_path / "fsage.db"
    # Every snapshot holds its write transaction open for 1 s: the daemon is writing most of
    # the time the readers below run.
    d = start(tmp_path, daemons, {"a": a, "b": b}, FSAGE_DAEMON_TEST_HOLD="1")
    wait_for("a first snapshot", lambda: d.ok_runs("a") >= 1)
    first = len(snapshot_ids(db))
    holds = d.log().count("test hold")
    # Plain SQLite readers that wait at most 0.25 s for a lock, a quarter of the writer's
    # transaction: a reader blocked by the writer would fail here.
    reads = 0
    # Read until the daemon has written twice meanwhile (a loaded machine makes that longer,
    # not the test weaker); the deadline only stops a daemon that never writes.
    deadline = time.monotonic() + 120
    while reads <= 10 or d.log().count("test hold") < holds + 2:
        assert time.monotonic() < deadline, "the daemon did not write while the readers read"
        con = sqlite3.connect(db, timeout=0.25)
        try:
            con.execute("SELECT COUNT(*) FROM version_chunks").fetchone()
            con.execute("SELECT id, taken_at FROM snapshots ORDER BY id").fetchall()
        finally:
            con.close()
        with Store.open(db) as store:
            latest = store.snapshots()[-1]
            assert store.load_layout(latest.id).files.ino.size > 0
        reads += 1
    # And the CLI, as a report would read it.
    out = fsage(["snapshots", "--db", "fsage.db", "--format", "json"], tmp_path)
    assert out.returncode == 0 and "locked" not in out.stderr, out.stderr
    assert d.log().count("test hold") >= holds + 2, "the daemon must have written meanwhile"
    assert len(snapshot_ids(db)) >= first + 1
    assert reads > 10
    assert d.stop() == 0
    assert "error" not in d.log()
    assert integrity(db) == "ok" and orphan_versions(db) == 0


def test_an_image_deleted_mid_run_is_a_recorded_failure_the_other_target_goes_on(
    tmp_path: Path, two_images: tuple[Path, Path], daemons: list[DaemonProcess]
) -> None:
    a, b = two_images
    db = tmp_path / "fsage.db"
    d = start(tmp_path, daemons, {"a": a, "b": b})
    wait_for("2 snapshots of each", lambda: d.ok_runs("a") >= 2 and d.ok_runs("b") >= 2)
    a.unlink()

    def failed_a() -> bool:
        return bool(query(db, "SELECT 1 FROM collection_runs WHERE status = 'failed'"))

    wait_for("a recorded failure", failed_a)
    first_failure = query(db, "SELECT MIN(id) FROM collection_runs WHERE status = 'failed'")[0][0]

    def b_after() -> bool:
        rows = query(
            db,
            "SELECT COUNT(*) FROM collection_runs WHERE target = 'b' AND status = 'ok' AND id > ?",
            (first_failure,),
        )
        return int(rows[0][0]) >= 2

    wait_for("b going on", b_after)
    assert d.stop() == 0
    failures = query(db, "SELECT DISTINCT target, error FROM collection_runs WHERE status != 'ok'")
    assert failures == [("a", f"{a}: no such file or directory")]
    assert f"error: target a: failed: {a}: no such file or directory" in d.log()
    assert integrity(db) == "ok" and orphan_versions(db) == 0
    status = fsage(["status", "--config", "fsage.toml"], tmp_path)
    assert status.returncode == 0, status.stderr
    line_a = next(x for x in status.stdout.splitlines() if x.startswith("a "))
    assert f"{a}: no such file or directory" in line_a


@pytest.mark.needs_root
def test_full_disk_under_the_database(
    tmp_path: Path, two_images: tuple[Path, Path], daemons: list[DaemonProcess]
) -> None:
    a, b = two_images
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], check=True)
    try:
        db = mnt / "fsage.db"
        cfg = write_config(tmp_path / "fsage.toml", f'database = "{db}"', {"a": a, "b": b})
        once = ["daemon", "--config", str(cfg), "--once"]
        assert fsage([*once, "--target", "a"], tmp_path).returncode == 0
        before = snapshot_ids(db)
        # Fill what is left of the file system.
        filler = mnt / "filler"
        with open(filler, "wb") as fh:
            try:
                while True:
                    fh.write(b"\0" * 65536)
                    fh.flush()
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
        # With no room at all the database cannot even be opened (its -shm file needs space).
        full = fsage([*once, "--target", "b"], tmp_path)
        assert full.returncode == 1
        assert full.stderr.startswith(f"fsage: error: {db}: ")
        assert full.stderr.endswith(f"(the file system holding {db} is full: 0 KiB free)\n")
        # The database file itself, read without its -shm (no room for one):
        con = sqlite3.connect(f"file:{db}?immutable=1", uri=True)
        try:
            assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)
            assert [r[0] for r in con.execute("SELECT id FROM snapshots")] == before
        finally:
            con.close()
        # With a little room, the snapshot's own writes fail: the run fails, the database
        # stays intact. Some room later the snapshot fits.
        outcomes = []
        size = filler.stat().st_size
        for room in (36, 48, 64, 96, 160, 256, 512):
            os.truncate(filler, size - room * 1024)
            run = fsage([*once, "--target", "b"], tmp_path)
            assert "Traceback" not in run.stderr
            assert integrity(db) == "ok" and orphan_versions(db) == 0
            if run.returncode == 0:
                outcomes.append("ok")
                break
            assert run.returncode == 1
            assert "error: target b: failed: " in run.stderr
            assert f"(the file system holding {db} is full: " in run.stderr
            assert snapshot_ids(db) == before
            outcomes.append(run.stderr)
        assert any("database or disk is full" in o for o in outcomes), outcomes
        assert outcomes[-1] == "ok", outcomes
        assert len(snapshot_ids(db)) == len(before) + 1
        # Room again: the next run succeeds.
        filler.unlink()
        ok = fsage([*once, "--target", "b"], tmp_path)
        assert ok.returncode == 0, ok.stderr
        assert len(snapshot_ids(db)) == len(before) + 2
        assert integrity(db) == "ok"
    finally:
        subprocess.run(["umount", str(mnt)], check=False)
        os.sync()
