"""Fixtures for the daemon tests: small ext4 images, configurations, a daemon subprocess."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from images import TreeSpec, build_tree, make_ext_image

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def two_images(tmp_path: Path, e2fsprogs: None) -> tuple[Path, Path]:
    """Two small ext4 images (mke2fs -d from seeded trees): a.img and b.img."""
    a = build_tree(tmp_path / "tree-a", 1, TreeSpec(files=30, dirs=4))
    b = build_tree(tmp_path / "tree-b", 2, TreeSpec(files=20, dirs=3))
    return (
        make_ext_image(tmp_path, "ext4", tree=a, size="4M", name="a.img"),
        make_ext_image(tmp_path, "ext4", tree=b, size="4M", name="b.img"),
    )


def write_config(path: Path, body: str, targets: dict[str, Path]) -> Path:
    text = body.strip() + "\n"
    for name, source in targets.items():
        text += f'[[target]]\nname = "{name}"\nsource = "{source}"\n'
    path.write_text(text)
    return path


def query(db: Path, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    con = sqlite3.connect(db, timeout=30)
    try:
        return con.execute(sql, args).fetchall()
    finally:
        con.close()


def wait_for(what: str, check: Callable[[], bool], timeout: float = 120.0) -> None:
    # Generous: the daemon slows down a lot on a loaded machine, and waiting longer costs
    # nothing when it is done early.
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except sqlite3.OperationalError:
            pass  # the database or a table does not exist yet
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def env(tmp_path: Path, **extra: str) -> dict[str, str]:
    out = dict(os.environ)
    out["PYTHONPATH"] = str(REPO) + os.pathsep + out.get("PYTHONPATH", "")
    out.pop("FSAGE_DB", None)
    out.pop("JOURNAL_STREAM", None)
    out.pop("NOTIFY_SOCKET", None)
    out["HOME"] = str(tmp_path)
    out.update(extra)
    return out


def fsage(args: list[str], tmp_path: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fsage", *args],
        capture_output=True,
        text=True,
        env=env(tmp_path, **extra),
        timeout=120,
        cwd=tmp_path,
    )


class DaemonProcess:
    """`python3 -m fsage daemon --config ...` as a real subprocess, stderr to a file."""

    def __init__(self, config: Path, tmp_path: Path, db: Path, **extra: str) -> None:
        self.db = db
        self.log_path = tmp_path / f"daemon-{time.monotonic_ns()}.log"
        self._log = open(self.log_path, "w")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fsage", "daemon", "--config", str(config)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env(tmp_path, **extra),
            cwd=tmp_path,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text()

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Ready once it has written its plans (daemon_targets rows carrying its pid)."""

        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited early ({self.proc.returncode}):\n{self.log()}")
            return bool(query(self.db, "SELECT 1 FROM daemon_targets WHERE pid = ?", (self.pid,)))

        wait_for("the daemon to start", ready, timeout)

    def ok_runs(self, target: str) -> int:
        rows = query(
            self.db,
            "SELECT COUNT(*) FROM collection_runs WHERE target = ? AND status = 'ok'",
            (target,),
        )
        return int(rows[0][0])

    def send(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        finally:
            self._log.close()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(30)
        self._log.close()


@pytest.fixture
def daemons() -> Iterator[list[DaemonProcess]]:
    """Collects started daemons; any still running at the end is killed."""
    started: list[DaemonProcess] = []
    yield started
    for d in started:
        if d.proc.poll() is None:
            d.kill()


def integrity(db: Path) -> str:
    return str(query(db, "PRAGMA integrity_check")[0][0])


def orphan_versions(db: Path) -> int:
    """Version chunks of a snapshot that is not there: newer than the newest snapshot of their
    file system (retention may delete older snapshots whose versions stay valid later on)."""
    rows = query(
        db,
        "SELECT COUNT(*) FROM version_chunks v WHERE v.first_snap >"
        " (SELECT COALESCE(MAX(s.id), 0) FROM snapshots s WHERE s.fs_id = v.fs_id)",
    )
    return int(rows[0][0])
