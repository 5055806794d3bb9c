"""The daemon library in-process: configuration errors, lock, log lines, runs, retention,
SIGTERM inside the work, status."""

from __future__ import annotations

import io
import json
import os
import signal
from datetime import UTC, datetime
from pathlib import Path

import pytest

from fsage.db.store import Store
from fsage.errors import FsageError
from fsage.layout import Layout
from fsage.snapshotter import read_source
from fsage.snapshotter.daemon import (
    ConfigError,
    Daemon,
    DaemonLockedError,
    DatabaseLock,
    Log,
    daemon_status,
    load_config,
    lock_holder,
)
from fsage.snapshotter.retention import Retention

from .conftest import integrity, orphan_versions, query, write_config


def quiet() -> Log:
    return Log(io.StringIO(), style="plain")


def test_every_problem_of_a_config_gets_one_line(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text(
        'databse = "x.db"\n'
        'schedule = "30 25 * * *"\n'
        "jitter = -3\n"
        "[retention]\n"
        "daily = 14\n"
        "fortnightly = 2\n"
        "[[target]]\n"
        'name = "home"\n'
        "[[target]]\n"
        'name = "scratch"\n'
        'source = "/srv"\n'
        'sorce = "/x"\n'
        'schedule = "* * * * mon-sun-x"\n'
        "[[target]]\n"
        'name = "home"\n'
        'source = "/dev/sdb1"\n'
        'every = "2s"\n'
        'schedule = "@daily"\n'
    )
    with pytest.raises(ConfigError) as err:
        load_config(cfg)
    assert err.value.problems == [
        f"{cfg}: unknown key 'databse' (known: database, every, export_dir, export_host, jitter,"
        " retention, schedule, target, timezone)",
        f"{cfg}: missing key 'database' (the SQLite file, e.g. database = \"fsage.db\")",
        f"{cfg}: schedule '30 25 * * *': field 2 (hour) '25': 25 is out of range 0-23",
        f"{cfg}: jitter: -3 is not a duration of zero or more seconds",
        f"{cfg}: retention: unknown key 'fortnightly' (known: last, hourly, daily, weekly,"
        " monthly, yearly)",
        f"{cfg}: target 1 ('home'): missing key 'source' (an image, device or mounted path)",
        f"{cfg}: target 2 ('scratch'): unknown key 'sorce' (known: every, jitter, name,"
        " retention, schedule, source)",
        f"{cfg}: target 2 ('scratch'): schedule '* * * * mon-sun-x': field 5 (day of week)"
        " 'mon-sun-x': 'sun-x' is not a number 0-7 or a name (sun, mon, tue...)",
        f"{cfg}: target 3 ('home'): a target named 'home' is already defined",
        f"{cfg}: target 3 ('home'): give either 'schedule' or 'every', not both",
    ]


def test_config_defaults_and_relative_paths(tmp_path: Path) -> None:
    cfg = write_config(
        tmp_path / "fsage.toml",
        'database = "db/fsage.db"\n[retention]\ndaily = 14\nmonthly = 12',
        {"home": Path("/dev/sdb1"), "img": Path("images/a.img")},
    )
    config = load_config(cfg)
    assert config.database == tmp_path / "db" / "fsage.db"
    assert [t.source for t in config.targets] == [Path("/dev/sdb1"), tmp_path / "images/a.img"]
    home = config.targets[0]
    assert home.schedule.text == "30 2 * * *"  # nightly by default
    assert home.retention == Retention(daily=14, monthly=12)
    assert home.jitter == 0.0


def test_bad_toml_and_missing_file(tmp_path: Path) -> None:
    cfg = tmp_path / "x.toml"
    cfg.write_text("database = \n")
    with pytest.raises(ConfigError, match=r"not valid TOML: .*line 1"):
        load_config(cfg)
    with pytest.raises(FsageError, match="no such configuration file"):
        load_config(tmp_path / "missing.toml")


def test_one_lock_per_database(tmp_path: Path) -> None:
    db = tmp_path / "fsage.db"
    assert lock_holder(db) is None
    with DatabaseLock(db):
        assert lock_holder(db) == os.getpid()
        with pytest.raises(DaemonLockedError) as err:
            DatabaseLock(db).acquire(wait=0.1)
        assert str(err.value) == (
            f"another fsage daemon (pid {os.getpid()}) is using {db} (lock {db}.lock is held)"
        )
    assert lock_holder(db) is None
    with DatabaseLock(db):  # free again
        pass


def test_log_line_styles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    Log(out, style="journal").error("target a: failed: x\ny")
    Log(out, style="plain").info("daemon started")
    journal, plain = out.getvalue().splitlines()
    assert journal == "<3>target a: failed: x y"  # the journal stamps lines itself
    stamp, rest = plain.split(" ", 1)
    assert rest == "info: daemon started"
    when = datetime.fromisoformat(stamp)  # local time with its UTC offset
    assert when.utcoffset() is not None and abs((datetime.now(UTC) - when).total_seconds()) < 60
    # Auto-detection: JOURNAL_STREAM naming this very file means journald.
    path = tmp_path / "stream"
    with open(path, "w") as fh:
        st = os.fstat(fh.fileno())
        monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino}")
        Log(fh).warning("w")
        monkeypatch.setenv("JOURNAL_STREAM", "1:2")
        Log(fh).warning("w")
    first, second = path.read_text().splitlines()
    assert first == "<4>w" and second.endswith(" warning: w")
    datetime.fromisoformat(second.split(" ", 1)[0])


def test_once_records_every_attempt_and_a_failure_does_not_stop_the_others(
    tmp_path: Path, two_images: tuple[Path, Path]
) -> None:
    a, b = two_images
    cfg = write_config(
        tmp_path / "fsage.toml",
        'database = "fsage.db"',
        {"a": a, "gone": tmp_path / "missing.img", "b": b},
    )
    daemon = Daemon(load_config(cfg), log=quiet())
    assert daemon.run_once() == 1
    db = tmp_path / "fsage.db"
    rows = query(
        db, "SELECT target, status, error, snapshot_id, trigger FROM collection_runs ORDER BY id"
    )
    assert rows == [
        ("a", "ok", None, 1, "once"),
        ("gone", "failed", f"{tmp_path}/missing.img: no such file or directory", None, "once"),
        ("b", "ok", None, 2, "once"),
    ]
    with Store.open(db) as store:
        assert [(s.id, s.fs_name) for s in store.snapshots()] == [(1, "a"), (2, "b")]
        assert store.snapshot(1).files == tree_inodes(tmp_path / "tree-a")
        assert store.snapshot(2).files == tree_inodes(tmp_path / "tree-b")
    assert daemon.run_once(["a", "b"]) == 0
    with pytest.raises(FsageError, match="no target named 'c'"):
        daemon.run_once(["c"])


def tree_inodes(tree: Path) -> int:
    """Inodes mke2fs -d copied from ``tree`` (the root included), plus lost+found."""
    inodes = {tree.lstat().st_ino}
    for dirpath, dirnames, filenames in os.walk(tree):
        for name in dirnames + filenames:
            inodes.add((Path(dirpath) / name).lstat().st_ino)
    return len(inodes) + 1


def test_retention_after_each_success(tmp_path: Path, two_images: tuple[Path, Path]) -> None:
    a, _ = two_images
    cfg = write_config(
        tmp_path / "fsage.toml", 'database = "fsage.db"\n[retention]\nlast = 2', {"a": a}
    )
    daemon = Daemon(load_config(cfg), log=quiet())
    for _ in range(4):
        assert daemon.run_once() == 0
    db = tmp_path / "fsage.db"
    assert query(db, "SELECT id FROM snapshots ORDER BY id") == [(3,), (4,)]
    assert query(db, "SELECT snapshot_id, pruned FROM collection_runs ORDER BY id") == [
        (None, "[]"),
        (None, "[]"),
        (3, "[1]"),
        (4, "[2]"),
    ]
    # What is left still rebuilds exactly.
    with Store.open(db) as store:
        layout = store.load_layout(4)
    assert list(layout.files.ino) == list(read_source(a).files.ino)
    assert integrity(db) == "ok" and orphan_versions(db) == 0


def test_sigterm_inside_the_work_rolls_the_snapshot_back(
    tmp_path: Path, two_images: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = two_images
    cfg = write_config(tmp_path / "fsage.toml", 'database = "fsage.db"', {"a": a, "b": b})
    daemon = Daemon(load_config(cfg), log=quiet())
    assert daemon.run_once(["a"]) == 0

    import fsage.snapshotter as snapshotter

    real = snapshotter.read_source
    added: list[int] = []

    def reader_then_signal(path: Path) -> Layout:
        layout = real(path)
        os.kill(os.getpid(), signal.SIGTERM)  # arrives in the middle of the work
        added.append(1)
        return layout

    monkeypatch.setattr(snapshotter, "read_source", reader_then_signal)
    assert daemon.run_once() == 0  # stopped: exit 0, b never started
    assert added == [], "the signal must interrupt the work where it lands"
    db = tmp_path / "fsage.db"
    rows = query(db, "SELECT target, status, error, snapshot_id FROM collection_runs ORDER BY id")
    assert rows == [("a", "ok", None, 1), ("a", "interrupted", "stopped by SIGTERM", None)]
    assert query(db, "SELECT id FROM snapshots") == [(1,)]
    assert integrity(db) == "ok" and orphan_versions(db) == 0
    # The handlers are gone again: a later SIGTERM would not be swallowed by the daemon.
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_status_per_target(tmp_path: Path, two_images: tuple[Path, Path]) -> None:
    a, _ = two_images
    cfg = write_config(
        tmp_path / "fsage.toml",
        'database = "fsage.db"\ntimezone = "UTC"\nschedule = "0 3 * * *"',
        {"a": a, "gone": tmp_path / "nope.img"},
    )
    config = load_config(cfg)
    Daemon(config, log=quiet()).run_once()
    now = datetime(2024, 5, 1, 12, 0, tzinfo=UTC).timestamp()
    status = daemon_status(config.database, config, now=now)
    assert status.daemon_pid is None
    by_name = {t.target: t for t in status.targets}
    assert by_name["a"].last_success_snapshot == 1
    assert by_name["a"].last_failure_at is None
    assert by_name["a"].next_run == datetime(2024, 5, 2, 3, 0, tzinfo=UTC)
    assert by_name["gone"].last_success_at is None
    assert by_name["gone"].last_failure_error == f"{tmp_path}/nope.img: no such file or directory"
    assert (by_name["gone"].runs, by_name["gone"].failures) == (1, 1)
    # From the database alone: the same runs, no next run (no daemon planned one).
    alone = daemon_status(config.database)
    assert [(t.target, t.last_success_snapshot, t.next_run) for t in alone.targets] == [
        ("a", 1, None),
        ("gone", None, None),
    ]
    assert json.loads(json.dumps(alone.to_json()))["daemon_running"] is False


def test_status_as_csv(tmp_path: Path, two_images: tuple[Path, Path]) -> None:
    """One row per target, the columns of JSON's targets, against the runs table."""
    import csv

    from click.testing import CliRunner

    from fsage.cli import main

    a, b = two_images
    cfg = write_config(
        tmp_path / "fsage.toml",
        'database = "fsage.db"\ntimezone = "UTC"\nschedule = "0 3 * * *"',
        {"a": a, "b": b, "gone": tmp_path / "nope.img"},
    )
    config = load_config(cfg)
    Daemon(config, log=quiet()).run_once()
    Daemon(config, log=quiet()).run_once(["b"])
    res = CliRunner().invoke(main, ["status", "--config", str(cfg), "--format", "csv"])
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader(io.StringIO(res.output)))
    db = config.database
    last_ok = dict(
        query(db, "SELECT target, max(snapshot_id) FROM collection_runs WHERE status = 'ok'"
                  " GROUP BY target")
    )  # fmt: skip
    runs = dict(query(db, "SELECT target, count(*) FROM collection_runs GROUP BY target"))
    assert [r["target"] for r in rows] == ["a", "b", "gone"]
    for r in rows:
        assert r["last_success_snapshot"] == str(last_ok.get(r["target"], ""))
        assert r["runs"] == str(runs[r["target"]])
        assert datetime.fromisoformat(r["next_run"]).hour == 3
    assert (rows[1]["runs"], rows[2]["failures"]) == ("2", "1")
    assert rows[2]["last_failure_error"] == f"{tmp_path}/nope.img: no such file or directory"
    assert rows[0]["last_failure_at"] == "" and rows[2]["last_success_at"] == ""
    assert list(rows[0]) == list(daemon_status(db, config).targets[0].to_json())
