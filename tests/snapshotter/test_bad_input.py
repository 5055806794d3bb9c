"""`fsage snapshot` on bad input: one clear error line, exit 1 or 2, database untouched.

Each case runs the real command in a subprocess twice: against a database that already holds
a snapshot (its bytes must not change) and against a missing database (it must not appear).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from images import TreeSpec, build_tree, make_ext_image, run

pytestmark = pytest.mark.usefixtures("e2fsprogs")

SB = 1024  # byte offset of the primary superblock


def fsage(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fsage", *args], capture_output=True, text=True, env=env, timeout=120
    )


def db_state(db: Path) -> dict[str, bytes]:
    """The database and its WAL/shared-memory side files, byte for byte."""
    out = {}
    for suffix in ("", "-wal", "-shm", "-journal"):
        p = Path(f"{db}{suffix}")
        if p.exists():
            out[suffix] = p.read_bytes()
    return out


def assert_clean_failure(proc: subprocess.CompletedProcess[str]) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode in (1, 2), (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("fsage: error: "), proc.stderr
    assert proc.stdout == ""
    return lines[0]


def good_image(tmp_path: Path, size: str = "32M") -> Path:
    """An ext4 image with 1 KiB blocks: four groups, the root and files in group 0."""
    tree = build_tree(tmp_path / "tree", 21, TreeSpec(files=20, dirs=3))
    return make_ext_image(tmp_path, "ext4", block_size=1024, tree=tree, size=size)


def group0_inode_table(image: Path) -> tuple[int, int]:
    """(byte offset, byte length) of group 0's inode table, from dumpe2fs."""
    out = run(["dumpe2fs", image])
    line = next(x for x in out.splitlines() if x.strip().startswith("Inode table at "))
    first, last = line.split("at ", 1)[1].split()[0].split("-")
    return int(first) * 1024, (int(last) - int(first) + 1) * 1024


def patch(image: Path, offset: int, data: bytes) -> None:
    with open(image, "r+b") as fh:
        fh.seek(offset)
        fh.write(data)


# ---------------------------------------------------------------- the inputs


def empty(tmp: Path) -> Path:
    p = tmp / "empty.img"
    p.touch()
    return p


def random_bytes(tmp: Path) -> Path:
    p = tmp / "random.img"
    p.write_bytes(random.Random(1).randbytes(1 << 20))
    return p


def truncated_inside_inode_table(tmp: Path) -> Path:
    image = good_image(tmp)
    offset, _ = group0_inode_table(image)
    os.truncate(image, offset + 4096)
    return image


def truncated_after_metadata(tmp: Path) -> Path:
    # All metadata of group 0 and every file are still there; groups 1-3 are cut off.
    image = good_image(tmp)
    os.truncate(image, 8 * 1024 * 1024)
    return image


def superblock_magic(tmp: Path) -> Path:
    image = good_image(tmp)
    patch(image, SB, random.Random(2).randbytes(1024))
    return image


def superblock_block_size(tmp: Path) -> Path:
    image = good_image(tmp)
    patch(image, SB + 24, struct.pack("<I", 20))  # s_log_block_size: 1 GiB blocks
    return image


def superblock_blocks_count(tmp: Path) -> Path:
    image = good_image(tmp)
    patch(image, SB + 4, struct.pack("<I", 0xFFFFFFFF))  # s_blocks_count_lo
    return image


def inode_table_location(tmp: Path) -> Path:
    image = good_image(tmp)
    # bg_inode_table_lo of group 0's descriptor (block 2 with 1 KiB blocks), far out of range.
    patch(image, 2 * 1024 + 8, struct.pack("<I", 7_000_000))
    return image


def inode_table_zeroed(tmp: Path) -> Path:
    image = good_image(tmp)
    offset, length = group0_inode_table(image)
    patch(image, offset, bytes(length))
    return image


def inode_table_garbage(tmp: Path) -> Path:
    image = good_image(tmp)
    offset, length = group0_inode_table(image)
    patch(image, offset, random.Random(3).randbytes(length))
    return image


def missing(tmp: Path) -> Path:
    return tmp / "no-such-image"


def pseudo_directory(tmp: Path) -> Path:
    return Path("/proc")


def char_device(tmp: Path) -> Path:
    return Path("/dev/null")


CASES: dict[str, Callable[[Path], Path]] = {
    f.__name__: f
    for f in (
        empty,
        random_bytes,
        truncated_inside_inode_table,
        truncated_after_metadata,
        superblock_magic,
        superblock_block_size,
        superblock_blocks_count,
        inode_table_location,
        inode_table_zeroed,
        inode_table_garbage,
        missing,
        pseudo_directory,
        char_device,
    )
}


@pytest.fixture(scope="module")
def baseline_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A database holding one snapshot of a good image."""
    tmp = tmp_path_factory.mktemp("baseline")
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    env.pop("FSAGE_DB", None)
    db = tmp / "fsage.db"
    proc = fsage(["snapshot", str(good_image(tmp, "8M")), "--db", str(db), "--name", "base"], env)
    assert proc.returncode == 0, proc.stderr
    return db


def check_refused(
    source: Path, tmp_path: Path, baseline_db: Path, env: dict[str, str]
) -> list[str]:
    db = tmp_path / "db" / "fsage.db"
    db.parent.mkdir()
    shutil.copy(baseline_db, db)
    before = db_state(db)
    lines = [assert_clean_failure(fsage(["snapshot", str(source), "--db", str(db)], env))]
    assert db_state(db) == before
    fresh = tmp_path / "fresh" / "fsage.db"
    fresh.parent.mkdir()
    lines.append(assert_clean_failure(fsage(["snapshot", str(source), "--db", str(fresh)], env)))
    assert list(fresh.parent.iterdir()) == []
    return lines


@pytest.mark.parametrize(
    "case",
    list(CASES),
)
def test_bad_source_is_refused(
    case: str, tmp_path: Path, baseline_db: Path, fsage_env: dict[str, str]
) -> None:
    source = CASES[case](tmp_path)
    lines = check_refused(source, tmp_path, baseline_db, fsage_env)
    assert str(source) in lines[0]


def test_good_image_is_accepted(
    tmp_path: Path, baseline_db: Path, fsage_env: dict[str, str]
) -> None:
    # The control for the cases above: the same image, unharmed, is recorded.
    db = tmp_path / "fsage.db"
    shutil.copy(baseline_db, db)
    proc = fsage(["snapshot", str(good_image(tmp_path)), "--db", str(db)], fsage_env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    listing = fsage(["snapshots", "--db", str(db), "--format", "json"], fsage_env)
    assert len(json.loads(listing.stdout)) == 2


# ---------------------------------------------------------------- permissions


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory anyone can enter (pytest's own temporary tree is private to root)."""
    d = Path(tempfile.mkdtemp(prefix="fsage-perm-", dir="/tmp"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d)


def run_as_nobody(args: list[str]) -> tuple[int, str, str]:
    """Run the fsage CLI in a forked child with uid/gid 65534 (the interpreter lives in a
    directory nobody cannot enter, so the child reuses this one instead of exec'ing)."""
    from click.testing import CliRunner

    from fsage.cli import main

    # The child cannot import anything from the interpreter's directory: load what the error
    # path needs here, by taking it once.
    runner = CliRunner()
    runner.invoke(main, ["snapshot", "--help"])
    runner.invoke(main, ["snapshot", "/nonexistent/fsage-image", "--db", "/nonexistent/db"])
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(read_fd)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            result = runner.invoke(main, args)
            err = result.stderr
            if result.exception and not isinstance(result.exception, SystemExit):
                err += "Traceback: " + repr(result.exception)
            msg = json.dumps([result.exit_code, result.stdout, err]).encode()
            os.write(write_fd, msg)
        finally:
            os._exit(0)
    os.close(write_fd)
    chunks = []
    while chunk := os.read(read_fd, 65536):
        chunks.append(chunk)
    os.close(read_fd)
    os.waitpid(pid, 0)
    code, out, err = json.loads(b"".join(chunks))
    return int(code), str(out), str(err)


def test_unreadable_image_is_refused(
    open_dir: Path, baseline_db: Path, fsage_env: dict[str, str]
) -> None:
    image = good_image(open_dir, "8M")
    image.chmod(0)
    db = open_dir / "fsage.db"
    shutil.copy(baseline_db, db)
    db.chmod(0o666)  # fsage makes databases private; here the image is what cannot be read
    before = db_state(db)
    fresh = open_dir / "fresh.db"
    for target in (db, fresh):
        args = ["snapshot", str(image), "--db", str(target)]
        if os.geteuid() == 0:  # root reads anything: drop to nobody
            code, out, err = run_as_nobody(args)
            proc = subprocess.CompletedProcess(args, code, out, err)
        else:
            proc = fsage(args, fsage_env)
        line = assert_clean_failure(proc)
        assert str(image) in line
        assert "permission denied" in line.lower()
    assert db_state(db) == before
    assert not fresh.exists()
