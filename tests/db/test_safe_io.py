"""Nothing written where it should not be, and nobody reads what they could not list.

- `fsage lfs mkfs` refuses an existing non-empty file or file system unless --force;
- someone else's SQLite database is refused untouched;
- the daemon on a full disk says so in one line;
- a database on read-only media is read by snapshots, show, analyze, report and status;
- libext2fs' own messages do not reach stderr;
- databases (with -wal and -shm), reports and exports are private whatever the umask.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO
from images import TreeSpec, build_tree, make_ext_image

from fsage.db.store import Store

pytestmark = pytest.mark.usefixtures("e2fsprogs")


def fsage(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = dict(os.environ, PYTHONPATH=str(REPO))
    full.pop("FSAGE_DB", None)
    full.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "fsage", *args],
        capture_output=True,
        text=True,
        env=full,
        timeout=300,
    )


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fsage: error: "), proc.stderr
    return lines[0]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("safe")
    tree = build_tree(tmp / "tree", 3, TreeSpec(files=30, dirs=4))
    return make_ext_image(tmp, "ext4", block_size=1024, tree=tree, size="16M")


# ---------------------------------------------------------------- lfs mkfs


def test_lfs_mkfs_refuses_an_ext4_image(tmp_path: Path) -> None:
    victim = make_ext_image(tmp_path, "ext4", size="1G", extra=["-L", "victim"], name="v.img")
    before = digest(victim)
    line = one_error_line(fsage("lfs", "mkfs", str(victim), "--size", "64M"))
    assert "ext4 file system labelled 'victim'" in line and "--force" in line
    assert digest(victim) == before and victim.stat().st_size == 1 << 30
    forced = fsage("lfs", "mkfs", str(victim), "--size", "64M", "--force")
    assert forced.returncode == 0, forced.stderr
    assert victim.stat().st_size == 64 << 20


def test_lfs_mkfs_refuses_non_empty_files_and_lfs_images(tmp_path: Path) -> None:
    data = tmp_path / "notes.txt"
    data.write_bytes(b"precious\n" * 100)
    line = one_error_line(fsage("lfs", "mkfs", str(data), "--size", "16M"))
    assert "900 bytes" in line
    assert data.read_bytes() == b"precious\n" * 100
    lfs = tmp_path / "l.img"
    assert fsage("lfs", "mkfs", str(lfs), "--size", "16M").returncode == 0  # a new file
    assert "LFS" in one_error_line(fsage("lfs", "mkfs", str(lfs), "--size", "16M"))
    empty = tmp_path / "empty.img"
    empty.touch()
    assert fsage("lfs", "mkfs", str(empty), "--size", "16M").returncode == 0


# ---------------------------------------------------------------- someone else's database


def test_foreign_sqlite_database_left_untouched(tmp_path: Path, image: Path) -> None:
    other = tmp_path / "app.db"
    con = sqlite3.connect(other)
    con.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    con.execute("INSERT INTO users(name) VALUES ('alice')")
    con.commit()
    con.close()
    before = digest(other)
    for args in (
        ["snapshot", str(image), "--db", str(other)],
        ["snapshots", "--db", str(other)],
        ["analyze", "--db", str(other)],
    ):
        line = one_error_line(fsage(*args))
        assert "not an fsage database" in line and "users" in line
    assert digest(other) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.db"]
    # A database that uses another tool's schema_migrations is not fsage's either.
    rails = tmp_path / "rails.db"
    con = sqlite3.connect(rails)
    con.execute("CREATE TABLE schema_migrations (version TEXT PRIMARY KEY)")
    con.commit()
    con.close()
    before = digest(rails)
    assert "not an fsage database" in one_error_line(
        fsage("snapshot", str(image), "--db", str(rails))
    )
    assert digest(rails) == before


def test_not_a_database_at_all(tmp_path: Path, image: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"SQLite format 3\0" + os.urandom(4000))
    before = digest(junk)
    assert "not an fsage database" in one_error_line(
        fsage("snapshot", str(image), "--db", str(junk))
    )
    assert digest(junk) == before


# ---------------------------------------------------------------- full disk, read-only media


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "fsage-test", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


@pytest.mark.needs_root
def test_daemon_on_a_full_disk_says_so_in_one_line(tmpfs: Path, image: Path) -> None:
    with contextlib.suppress(OSError), open(tmpfs / "fill", "wb") as f:
        f.write(b"\0" * (1 << 20))
    cfg = tmpfs.parent / "fsage.toml"
    cfg.write_text(f'database = "{tmpfs}/fsage.db"\n[[target]]\nname = "x"\nsource = "{image}"\n')
    line = one_error_line(fsage("daemon", "--config", str(cfg), "--once"))
    assert "No space left on device" in line or "full" in line
    assert not (tmpfs / "fsage.db").exists()


def test_store_on_a_full_disk_leaves_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "x.db"
    real = sqlite3.connect

    def full(*args: object, **kwargs: object) -> sqlite3.Connection:
        con = real(*args, **kwargs)  # type: ignore[arg-type]
        con.close()
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(sqlite3, "connect", full)
    from fsage.errors import StoreError

    with pytest.raises(StoreError, match="disk is full"):
        Store.open(db, create=True)
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def readonly_db(tmp_path: Path, image: Path) -> Iterator[Path]:
    """A database with two snapshots and a daemon record, then bind-mounted read-only."""
    src = tmp_path / "rw"
    src.mkdir()
    db = src / "fsage.db"
    assert fsage("snapshot", str(image), "--db", str(db), "--name", "img").returncode == 0
    assert fsage("snapshot", str(image), "--db", str(db), "--name", "img").returncode == 0
    ro = tmp_path / "ro"
    ro.mkdir()
    subprocess.run(["mount", "--bind", str(src), str(ro)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(ro)], check=True)
        yield ro / "fsage.db"
    finally:
        subprocess.run(["umount", str(ro)], check=False)


@pytest.mark.needs_root
def test_database_on_read_only_media_is_readable(readonly_db: Path, tmp_path: Path) -> None:
    db = str(readonly_db)
    for args in (
        ["snapshots", "--db", db],
        ["snapshots", "--db", db, "--format", "json"],
        ["show", "2", "--db", db],
        ["analyze", "--db", db],
        ["analyze", "--db", db, "--history"],
        ["report", "--db", db, "-o", str(tmp_path / "r.html")],
        ["status", "--db", db],
    ):
        proc = fsage(*args)
        assert proc.returncode == 0, (args, proc.stderr)
        assert "Traceback" not in proc.stderr
    assert "img" in fsage("snapshots", "--db", db).stdout
    # A writer is told, in one line.
    line = one_error_line(fsage("snapshot", "/dev/null", "--db", db))
    assert line
    assert sorted(p.name for p in readonly_db.parent.iterdir()) == ["fsage.db"]


@pytest.mark.needs_root
def test_immutable_database_is_readable(tmp_path: Path, image: Path) -> None:
    db = tmp_path / "fsage.db"
    assert fsage("snapshot", str(image), "--db", str(db)).returncode == 0
    if subprocess.run(["chattr", "+i", str(db)], capture_output=True).returncode != 0:
        pytest.skip("this file system has no immutable flag")
    try:
        proc = fsage("snapshots", "--db", str(db))
        assert proc.returncode == 0, proc.stderr
        assert fsage("show", "1", "--db", str(db)).returncode == 0
    finally:
        subprocess.run(["chattr", "-i", str(db)], check=True)


# ---------------------------------------------------------------- libext2fs on stderr


def test_libext2fs_messages_do_not_reach_stderr() -> None:
    """libext2fs prints some problems itself through com_err ("Illegal block number passed
    to ext2fs_mark_block_bitmap ..."); once fsage's extension is loaded they are dropped (the
    damage or error is fsage's to report). The control run shows the message does print."""
    call = (
        "import ctypes, ctypes.util\n"
        "lib = ctypes.CDLL(ctypes.util.find_library('com_err') or 'libcom_err.so.2')\n"
        "lib.com_err(b'ext2fs_mark_block_bitmap', ctypes.c_long(0),"
        " b'Illegal block number passed to %s', b'ext2fs_mark_block_bitmap')\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    for preload, shows in (("", True), ("import fsage._ext2fs\n", False)):
        proc = subprocess.run(
            [sys.executable, "-c", preload + call], capture_output=True, text=True, env=env
        )
        assert proc.returncode == 0, proc.stderr
        assert ("Illegal block number" in proc.stderr) == shows, proc.stderr


# ---------------------------------------------------------------- private files


def _nobody_can_read(path: Path) -> bool:
    res = subprocess.run(
        ["runuser", "-u", "nobody", "--", "head", "-c", "1", str(path)], capture_output=True
    )
    return res.returncode == 0


@pytest.mark.needs_root
def test_databases_reports_and_exports_are_private(image: Path) -> None:
    # pytest's own temporary directories are closed to other users: work in an open one
    work = Path(tempfile.mkdtemp(prefix="fsage-private-", dir="/tmp"))
    try:
        work.chmod(0o755)
        _check_private(work, image)
    finally:
        shutil.rmtree(work)


def _check_private(work: Path, image: Path) -> None:
    db = work / "fsage.db"
    shell = (
        f"umask 022; {sys.executable} -m fsage snapshot {image} --db {db} --name img"
        f" && {sys.executable} -m fsage report --db {db} -o {work}/r.html"
        f" && {sys.executable} -m fsage deltas --fs img --db {db} -o {work}/ops.jsonl"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    subprocess.run(["sh", "-c", shell], check=True, env=env, capture_output=True)
    old = os.umask(0o022)
    try:
        store = Store.open(db)  # holds -wal and -shm open while they are checked
        try:
            store.con.execute("SELECT COUNT(*) FROM snapshots").fetchone()
            files = [db, Path(f"{db}-wal"), Path(f"{db}-shm"), work / "r.html", work / "ops.jsonl"]
            for p in files:
                assert p.exists(), p
                assert stat.S_IMODE(p.stat().st_mode) & 0o077 == 0, (p, oct(p.stat().st_mode))
                assert not _nobody_can_read(p), p
            control = work / "control.txt"
            control.write_text("x")
            assert _nobody_can_read(control)  # the check itself can succeed
        finally:
            store.close()
    finally:
        os.umask(old)


def test_contrib_units_keep_the_state_private() -> None:
    from fsage.snapshotter.units import render_unit

    for unit in ("fsage.service", "fsage-daemon.service"):
        text = render_unit(unit, Path("/etc/fsage/fsage.toml"))
        assert "UMask=0077" in text and "StateDirectoryMode=0700" in text
