"""Scratch goes to a disk, not to a tmpfs: an export's scratch files and paged arrays are some
200 bytes a file, page cache on a disk but memory on a tmpfs (an export of 2.8M files put
560 MiB there, and a 200 MiB memory cgroup killed it). What a killed run left is removed by
the next one."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from fsage import paged, scratch
from fsage.cli import main
from fsage.db.store import Store
from fsage.fleet import synth
from fsage.fleet.export import export_parquet


def _memory_per_findmnt(path: Path) -> bool:
    out = subprocess.run(
        ["findmnt", "-n", "-o", "FSTYPE", "--target", str(path)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return out.stdout.split()[-1] in ("tmpfs", "ramfs")  # the topmost of stacked mounts


def _shm() -> Path:
    """A tmpfs directory to stand for a system temporary directory kept in memory."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or scratch.memory_fs(shm) is None or not os.access(shm, os.W_OK):
        pytest.skip("needs /dev/shm on a tmpfs")
    return shm


def test_memory_fs_agrees_with_the_mount_table(tmp_path: Path) -> None:
    if shutil.which("findmnt") is None:
        pytest.skip("needs findmnt")
    paths = [
        Path(p) for p in ("/", "/dev/shm", "/proc", "/sys", "/run", "/var/tmp") if Path(p).exists()
    ]
    paths.append(tmp_path)
    seen = {p: scratch.memory_fs(p) is not None for p in paths}
    assert seen == {p: _memory_per_findmnt(p) for p in paths}
    if Path("/dev/shm").is_dir() and _memory_per_findmnt(Path("/dev/shm")):
        assert scratch.memory_fs(Path("/dev/shm")) == "tmpfs"


def test_scratch_leaves_a_temporary_directory_kept_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shm = _shm()
    disk = tmp_path / "var-tmp"
    disk.mkdir()
    near = tmp_path / "out"
    near.mkdir()
    monkeypatch.delenv(scratch.ENV, raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(shm))
    monkeypatch.setattr(scratch, "VAR_TMP", disk)
    assert scratch.base(near) == disk
    assert scratch.in_memory(near) is None
    monkeypatch.setattr(scratch, "VAR_TMP", shm)  # /var/tmp in memory as well
    assert scratch.base(near) == near
    assert scratch.base() == shm  # nothing on disk: the system's, and a warning says so
    warning = scratch.in_memory()
    assert warning is not None and "tmpfs" in warning and scratch.ENV in warning
    monkeypatch.setenv(scratch.ENV, str(shm))  # what the user names wins, unwarned
    assert scratch.base(near) == shm and scratch.in_memory(near) is None
    monkeypatch.setattr(tempfile, "tempdir", str(disk))
    monkeypatch.delenv(scratch.ENV)
    assert scratch.base(near) == disk  # a temporary directory on disk is used as it is


def test_a_paged_array_is_mapped_from_the_disk_s_scratch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shm = _shm()
    monkeypatch.delenv(scratch.ENV, raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(shm))
    monkeypatch.setattr(scratch, "VAR_TMP", tmp_path)
    bits = paged.zeros(paged.PAGED_BYTES * 4)
    assert paged.is_paged(bits)
    at = bits.ctypes.data
    files = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        span, rest = line.split(None, 1)
        lo, hi = (int(x, 16) for x in span.split("-"))
        if lo <= at < hi:
            files.append(rest.split(None, 4)[-1])
    assert len(files) == 1 and files[0].startswith(f"{tmp_path}/"), files


def test_the_export_warns_when_its_scratch_is_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shm = _shm()
    db = tmp_path / "h.db"
    with Store.open(db, create=True) as store:
        synth.synthetic_history(store, "a", files=200, snapshots=1, seed=1)
    monkeypatch.delenv(scratch.ENV, raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(shm))
    monkeypatch.setattr(scratch, "VAR_TMP", shm)
    out = shm / f"fsage-test-out-{os.getpid()}"  # the output on a tmpfs too: nowhere on disk
    try:
        res = CliRunner().invoke(main, ["export", "--db", str(db), "--host", "h", str(out)])
        assert res.exit_code == 0, res.output
        assert "warning: scratch space" in res.stderr and scratch.ENV in res.stderr
    finally:
        shutil.rmtree(out, ignore_errors=True)
    monkeypatch.setattr(scratch, "VAR_TMP", tmp_path)  # /var/tmp on disk: no warning
    res = CliRunner().invoke(main, ["export", "--db", str(db), "--host", "h", str(tmp_path / "o")])
    assert res.exit_code == 0 and "warning" not in res.stderr, res.output


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_a_sweep_removes_only_what_gone_processes_of_its_use_left(tmp_path: Path) -> None:
    dead = _dead_pid()
    names = {
        f"fsage-export-{dead}-abc": True,
        f"fsage-export-{os.getpid()}-abc": False,  # a live run's
        f"fsage-fleet-{dead}-abc": False,  # another use's
        f"fsage-age-{dead}-abc": False,  # a mount point (fsage.ager.images sweeps those)
        "fsage-export-notapid-abc": False,
    }
    for name in names:
        (tmp_path / name).mkdir()
        (tmp_path / name / "keys-1").write_bytes(b"x" * 100)
    (tmp_path / f"fsage-export-{dead}-file").write_text("a file, not a directory")
    removed = scratch.sweep(tmp_path, "export")
    assert removed == [tmp_path / n for n, gone in names.items() if gone]
    for name, gone in names.items():
        assert (tmp_path / name).exists() != gone
    assert (tmp_path / f"fsage-export-{dead}-file").exists()


@pytest.mark.needs_root
def test_an_export_with_a_small_tmpfs_as_its_temporary_directory_writes_to_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 1 MiB tmpfs as $TMPDIR: an export of 30,000 files needs several MiB of scratch, which
    a tmpfs would have held in memory (and here cannot hold at all)."""
    db = tmp_path / "h.db"
    with Store.open(db, create=True) as store:
        synth.synthetic_history(store, "a", files=30000, snapshots=2, seed=3)
    export_parquet(db, tmp_path / "plain", host="h")
    mem, disk = tmp_path / "mem", tmp_path / "disk"
    mem.mkdir()
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mem)], check=True)
    try:
        monkeypatch.delenv(scratch.ENV, raising=False)
        monkeypatch.setattr(tempfile, "tempdir", str(mem))
        monkeypatch.setattr(scratch, "VAR_TMP", disk)
        export_parquet(db, tmp_path / "out", host="h")
        assert list(mem.iterdir()) == [] and list(disk.iterdir()) == []  # all cleaned up
    finally:
        # lazily: a failed export may still map a scratch file there
        subprocess.run(["umount", "-l", str(mem)], check=True)
    plain, out = tmp_path / "plain", tmp_path / "out"
    files = sorted(p.relative_to(plain) for p in plain.rglob("*.parquet"))
    assert files and files == sorted(p.relative_to(out) for p in out.rglob("*.parquet"))
    for f in files:
        assert pq.read_table(plain / f).equals(pq.read_table(out / f)), f


def test_an_export_killed_leaves_scratch_the_next_one_removes(
    tmp_path: Path, fsage_env: dict[str, str]
) -> None:
    db = tmp_path / "h.db"
    with Store.open(db, create=True) as store:
        synth.synthetic_history(store, "a", files=200_000, snapshots=1, seed=2)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**fsage_env, "TMPDIR": str(tmp)}
    env.pop(scratch.ENV, None)
    argv = [sys.executable, "-m", "fsage", "export", "--db", str(db), "--host", "h"]
    proc = subprocess.Popen([*argv, str(tmp_path / "out")], env=env, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    left: list[Path] = []
    while not left and time.monotonic() < deadline and proc.poll() is None:
        left = [p for p in tmp.glob(f"fsage-export-{proc.pid}-*") if any(p.iterdir())]
        time.sleep(0.05)
    assert left, "the export made no scratch directory under $TMPDIR"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert all(p.exists() for p in left)  # SIGKILL: nothing could clean up
    done = subprocess.run([*argv, str(tmp_path / "out")], env=env, capture_output=True)
    assert done.returncode == 0, done.stderr
    assert list(tmp.iterdir()) == []


@pytest.mark.needs_root
def test_sqlite_s_sorts_leave_a_tmpfs_tmpdir_for_the_disk(
    tmp_path: Path, fsage_env: dict[str, str]
) -> None:
    """SQLite writes the sorts of a scratch table past its cache to ``$TMPDIR``: with a 1 MiB
    tmpfs there, a sort of 20 MB fails ("database or disk is full") unless they go to disk."""
    mem = tmp_path / "mem"
    mem.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mem)], check=True)
    script = f"""
import sys
from pathlib import Path
from fsage import scratch
from fsage.analyzer.spill import scratch_db
scratch.VAR_TMP = Path({str(tmp_path)!r})
con = scratch_db(Path({str(tmp_path / "s.db")!r}), 256)
con.execute("CREATE TABLE t(a, b)")
rows = ((i * 7919 % 1000003, "x" * 60) for i in range(300000))
con.executemany("INSERT INTO t VALUES (?, ?)", rows)
print(sum(1 for _ in con.execute("SELECT a, b FROM t ORDER BY b, a")))
"""
    try:
        env = {**fsage_env, "TMPDIR": str(mem)}
        env.pop(scratch.ENV, None)
        env.pop("SQLITE_TMPDIR", None)
        done = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True
        )
    finally:
        # lazily: a failed export may still map a scratch file there
        subprocess.run(["umount", "-l", str(mem)], check=True)
    assert done.returncode == 0 and done.stdout.split() == ["300000"], done.stderr


def test_a_scratch_directory_named_that_cannot_be_used_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "h.db"
    with Store.open(db, create=True) as store:
        synth.synthetic_history(store, "a", files=100, snapshots=1, seed=1)
    monkeypatch.setenv(scratch.ENV, str(tmp_path / "missing"))
    res = CliRunner().invoke(main, ["export", "--db", str(db), str(tmp_path / "out")])
    assert res.exit_code == 2, res.output
    assert f"{scratch.ENV}={tmp_path / 'missing'}: not a directory" in res.stderr
    assert res.exception is None or isinstance(res.exception, SystemExit)
    assert not (tmp_path / "out").exists()
    monkeypatch.setenv(scratch.ENV, str(tmp_path))  # a directory: used as it is
    res = CliRunner().invoke(main, ["export", "--db", str(db), str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("fsage-")] == []


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.mark.needs_root
def test_a_full_scratch_disk_says_so_and_leaves_the_dataset_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    small, large = tmp_path / "small.db", tmp_path / "large.db"
    with Store.open(small, create=True) as store:
        synth.synthetic_history(store, "small", files=300, snapshots=2, seed=1)
    with Store.open(large, create=True) as store:
        synth.synthetic_history(store, "large", files=30000, snapshots=2, seed=2)
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["export", "--db", str(small), "--host", "h", str(out)])
    assert res.exit_code == 0, res.output
    before = _tree(out)
    mem = tmp_path / "mem"
    mem.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mem)], check=True)
    try:
        monkeypatch.setenv(scratch.ENV, str(mem))  # named, so used though it is a tmpfs
        res = CliRunner().invoke(main, ["export", "--db", str(large), "--host", "h", str(out)])
        left = list(mem.iterdir())
    finally:
        # lazily: a failed export may still map a scratch file there
        subprocess.run(["umount", "-l", str(mem)], check=True)
    assert res.exit_code == 1, res.output
    message = res.stderr
    # numpy's short write says "N requested and M written", without an errno
    assert any(w in message for w in ("No space left", "is full", "requested and")), message
    assert f"scratch in {mem}: " in message and "of 1 MiB free" in message, message
    assert scratch.ENV in message.splitlines()[-1]
    assert left == []  # its scratch directory removed on the way out
    assert _tree(out) == before  # nothing of the failed export left in the dataset


def test_sqlite_s_full_disk_is_the_export_s_line_its_other_errors_are_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scratch database whose disk fills is the export's one line with the room left; any
    other SQLite error (a damaged store) goes on to the store's reporting, which names the
    database."""
    import sqlite3

    from fsage.fleet import export as export_module
    from fsage.fleet.export_schema import ExportError

    db = tmp_path / "h.db"
    with Store.open(db, create=True) as store:
        synth.synthetic_history(store, "a", files=100, snapshots=1, seed=1)
    raised: list[BaseException] = []

    def failing(*args: object) -> None:
        raise raised[-1]

    monkeypatch.setattr(export_module, "_export_locked", failing)
    full = sqlite3.OperationalError("database or disk is full")
    full.sqlite_errorcode = sqlite3.SQLITE_FULL
    raised.append(full)
    with pytest.raises(ExportError, match=r"is full \(the dataset in .* MiB free; scratch in "):
        export_parquet(db, tmp_path / "out", host="h")
    other = sqlite3.OperationalError("malformed JSON")
    other.sqlite_errorcode = sqlite3.SQLITE_ERROR
    raised.append(other)
    with pytest.raises(Exception, match="malformed JSON") as caught:
        export_parquet(db, tmp_path / "out", host="h")
    assert not isinstance(caught.value, ExportError)
    assert str(db) in str(caught.value)  # the store's reporting names the database
