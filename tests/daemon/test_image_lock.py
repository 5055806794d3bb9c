"""The daemon's snapshots of an image take its shared lock, as `fsage snapshot IMG` does: an
image another fsage command holds for writing is refused in one line (and tried again at the
next run), never read half-written; while the daemon reads, no writer gets in."""

from __future__ import annotations

import io
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import fsage.snapshotter
from fsage.db.store import Store
from fsage.layout import Layout
from fsage.snapshotter.daemon import Daemon, Log, load_config

from .conftest import REPO, env, integrity, query, write_config

_HOLD = """
import sys
from fsage.imagelock import acquire, ImageBusyError
try:
    acquire(sys.argv[1], exclusive=sys.argv[2] == "write")
except ImageBusyError as exc:
    print("refused:", exc, flush=True)
    sys.exit(0)
print("held", flush=True)
sys.stdin.read()
"""


def _holder(image: Path, tmp_path: Path, mode: str) -> subprocess.Popen[str]:
    """Another process that takes ``image``'s lock and keeps it until its stdin closes."""
    return subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(image), mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env(tmp_path),
        cwd=REPO,
    )


@pytest.fixture
def writer(tmp_path: Path, two_images: tuple[Path, Path]) -> Iterator[subprocess.Popen[str]]:
    proc = _holder(two_images[0], tmp_path, "write")
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        yield proc
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(timeout=60)


def test_an_image_held_for_writing_is_refused_then_snapshotted_once_free(
    tmp_path: Path, two_images: tuple[Path, Path], writer: subprocess.Popen[str]
) -> None:
    a, b = two_images
    cfg = write_config(tmp_path / "fsage.toml", 'database = "fsage.db"', {"a": a, "b": b})
    out = io.StringIO()
    daemon = Daemon(load_config(cfg), log=Log(out, style="plain"))
    assert daemon.run_once() == 1
    db = tmp_path / "fsage.db"
    rows = query(db, "SELECT target, status, error, snapshot_id FROM collection_runs ORDER BY id")
    assert [r[:2] for r in rows] == [("a", "failed"), ("b", "ok")]
    error = rows[0][2]
    assert f"pid {writer.pid}" in error and "being written" in error, error
    assert "tried again at the next run" in error and "\n" not in error
    failed = [line for line in out.getvalue().splitlines() if "target a" in line]
    assert len(failed) == 1 and f"pid {writer.pid}" in failed[0], out.getvalue()
    assert query(db, "SELECT f.name FROM snapshots s JOIN filesystems f ON f.id = s.fs_id") == [
        ("b",)
    ]
    assert integrity(db) == "ok"
    assert writer.stdin is not None
    writer.stdin.close()  # the writer is done: the next run reads the image
    writer.wait(timeout=60)
    assert daemon.run_once(["a"]) == 0
    with Store.open(db) as store:
        assert sorted(s.fs_name for s in store.snapshots()) == ["a", "b"]


def test_no_writer_gets_the_image_while_the_daemon_reads_it(
    tmp_path: Path, two_images: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, _ = two_images
    cfg = write_config(tmp_path / "fsage.toml", 'database = "fsage.db"', {"a": a})
    seen: list[str] = []
    real = fsage.snapshotter.read_source

    def reading(source: Path, *args: object, **kwargs: object) -> Layout:
        other = _holder(a, tmp_path, "write")  # a writer that starts during the read
        out, _ = other.communicate("", timeout=60)
        seen.append(out.strip())
        return real(source)

    monkeypatch.setattr(fsage.snapshotter, "read_source", reading)
    assert Daemon(load_config(cfg), log=Log(io.StringIO(), style="plain")).run_once() == 0
    assert len(seen) == 1 and seen[0].startswith("refused:") and "being read" in seen[0], seen
