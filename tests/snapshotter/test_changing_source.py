"""A source that changes while it is read is never recorded.

An image is truncated (or overwritten) from another thread at several points of the read,
from its first stat to just before the layout is handed back; every try must end in a
SourceError that says why, and `fsage snapshot` must leave the database as it was.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO
from images import TreeSpec, build_tree, make_ext_image

import fsage.snapshotter.ext as ext_mod
import fsage.snapshotter.sources as sources_mod
from fsage.errors import SourceError
from fsage.snapshotter import read_source

pytestmark = pytest.mark.usefixtures("e2fsprogs")


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("changing")
    tree = build_tree(tmp / "tree", 5, TreeSpec(files=300, dirs=10, max_file_size=8192))
    return make_ext_image(tmp, "ext4", block_size=1024, tree=tree, size="32M")


@pytest.fixture(scope="module")
def big_image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Big enough that a read takes a while (about 0.1 s on one thread, warm)."""
    tmp = tmp_path_factory.mktemp("changing-big")
    tree = build_tree(tmp / "tree", 5, TreeSpec(files=12000, dirs=120, max_file_size=4096))
    return make_ext_image(tmp, "ext4", block_size=1024, tree=tree, size="128M")


def _copy(image: Path, dest: Path) -> Path:
    subprocess.run(["cp", "--sparse=always", str(image), str(dest)], check=True)
    return dest


def _truncate(path: Path) -> None:
    os.truncate(path, os.path.getsize(path) // 3)


def _overwrite(path: Path) -> None:
    with open(path, "r+b") as f:  # same size, other bytes: a rewrite in place
        f.seek(os.path.getsize(path) // 2)
        f.write(b"\xa5" * 65536)


def _read_while(path: Path, delay: float, change: Callable[[Path], None]) -> tuple[str, bool]:
    """Read ``path`` while another thread changes it after ``delay`` seconds: the error (""
    if the read succeeded) and whether the whole change came after the reader's first look
    at the source and before the read returned (on a loaded machine the thread can run
    before the reader has begun: a change the reader never saw the source without)."""
    changed: list[tuple[float, float]] = []
    looked: list[float] = []
    real_unchanged = sources_mod._unchanged

    def unchanged(*args: Any) -> Any:
        looked.append(time.monotonic())  # the source's stat was taken just before
        return real_unchanged(*args)

    def later() -> None:
        time.sleep(delay)
        t0 = time.monotonic()
        change(path)
        changed.append((t0, time.monotonic()))

    sources_mod._unchanged = unchanged  # type: ignore[assignment]
    t = threading.Thread(target=later)
    try:
        t.start()
        error = ""
        try:
            read_source(path)
        except SourceError as exc:
            error = str(exc)
        returned = time.monotonic()
        t.join()
    finally:
        sources_mod._unchanged = real_unchanged  # type: ignore[assignment]
    start, end = changed[0]
    return error, bool(looked) and looked[0] < start and end < returned


@pytest.mark.slow
@pytest.mark.parametrize("change", [_truncate, _overwrite])
def test_changed_during_the_read_from_another_thread(
    big_image: Path, tmp_path: Path, change: Callable[[Path], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FSAGE_SCAN_THREADS", "1")  # a longer read: more points inside it
    took = []
    for _ in range(2):
        t0 = time.monotonic()
        read_source(big_image)
        took.append(time.monotonic() - t0)
    during = 0
    for k, frac in enumerate((0.05, 0.2, 0.4, 0.6, 0.8, 0.95)):
        copy = _copy(big_image, tmp_path / f"try{k}.img")
        error, before_return = _read_while(copy, min(took) * frac, change)
        if before_return:
            during += 1
            assert error, f"a change at {frac:.0%} of the read was not noticed"
        copy.unlink()
    if during == 0:  # timing only: the deterministic test below covers every stage
        pytest.skip("no change point fell inside the read on this machine")


@pytest.mark.parametrize("stage", ["scan", "links", "free_extents"])
@pytest.mark.parametrize("change", [_truncate, _overwrite])
def test_changed_at_each_stage_of_the_read(
    image: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    stage: str,
    change: Callable[[Path], None],
) -> None:
    """Deterministic points: the change lands just after each pass of the scanner."""
    copy = _copy(image, tmp_path / "x.img")
    real = ext_mod._ext2fs.Scanner

    class Changing:
        def __init__(self, path: str) -> None:
            self._s = real(path)

        def __getattr__(self, name: str) -> object:
            attr = getattr(self._s, name)
            if name != stage:
                return attr

            def call(*args: object) -> object:
                out = attr(*args)
                change(copy)
                return out

            return call

    monkeypatch.setattr(ext_mod._ext2fs, "Scanner", Changing)
    with pytest.raises(SourceError, match="changed while it was read"):
        read_source(copy)


def test_cli_records_nothing(image: Path, tmp_path: Path) -> None:
    """A snapshot command whose source is cut short under it: one error line, no database."""
    copy = _copy(image, tmp_path / "y.img")
    db = tmp_path / "a.db"
    env = dict(os.environ, PYTHONPATH=str(REPO), FSAGE_SCAN_THREADS="1")
    code = (
        "import os, sys\n"
        "import fsage.snapshotter.ext as e\n"
        "real = e._batch_to_tables\n"
        "source = sys.argv[1]\n"
        "def cut(batch):\n"
        "    os.truncate(source, 4096)\n"
        "    return real(batch)\n"
        "e._batch_to_tables = cut\n"
        "sys.argv = ['fsage', 'snapshot', sys.argv[1], '--db', sys.argv[2]]\n"
        "from fsage.cli import main\n"
        "main()\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(copy), str(db)], capture_output=True, text=True, env=env
    )
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith("fsage: error: ") and proc.stderr.count("\n") == 1
    assert "changed while it was read" in proc.stderr
    assert not db.exists()
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_failed_reads_are_counted_and_refused(
    image: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reads the source refuses (here: past the end of a file cut short after the open) are
    counted by the scanner, and read_ext_layout refuses the result even where the stat check
    of read_source is not there (a block device's size and times do not change)."""
    copy = _copy(image, tmp_path / "z.img")
    scanner = ext_mod._ext2fs.Scanner(str(copy))
    try:
        assert scanner.io_errors() == 0
        os.truncate(copy, 64 * 1024)
        with contextlib.suppress(ext_mod._ext2fs.Ext2fsError):
            scanner.scan(1)
        assert scanner.io_errors() > 0
    finally:
        scanner.close()

    copy = _copy(image, tmp_path / "w.img")
    real = ext_mod._ext2fs.Scanner

    class CutAfterOpen:
        def __init__(self, path: str) -> None:
            self._s = real(path)
            os.truncate(copy, 64 * 1024)

        def __getattr__(self, name: str) -> object:
            return getattr(self._s, name)

    monkeypatch.setattr(ext_mod._ext2fs, "Scanner", CutAfterOpen)
    monkeypatch.setattr(ext_mod, "_check_size", lambda path, expected: None)
    with pytest.raises(SourceError, match=r"read\(s\) of the source failed|scanning inodes"):
        ext_mod.read_ext_layout(copy)
