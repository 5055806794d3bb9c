"""Where `-o` points at something other than a regular file, the report goes into it as a
shell's `>` would, and nothing is replaced: a symlink stays a link (its file is written), a
device node stays a device (run as root, `-o /dev/null` must not leave a regular file where
the device was); a standard output that fails is one error line, not a traceback."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from fsage.cli import main
from fsage.db.store import Store
from fsage.fleet.synth import synthetic_history

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("targets") / "h.db"
    with Store.open(path, create=True) as store:
        synthetic_history(store, "fs", files=100, snapshots=2, seed=3)
    return path


def report(db: Path, out: Path | str) -> tuple[int, str]:
    r = CliRunner().invoke(main, ["report", "--db", str(db), "-o", str(out)])
    return r.exit_code, r.output


def test_a_symlink_stays_a_link_and_its_file_gets_the_page(db: Path, tmp_path: Path) -> None:
    (tmp_path / "keep").mkdir()
    real = tmp_path / "keep" / "real.html"
    real.write_text("old")
    link = tmp_path / "link.html"
    link.symlink_to(Path("keep") / "real.html")
    code, out = report(db, link)
    assert code == 0, out
    assert link.is_symlink() and os.readlink(link) == str(Path("keep") / "real.html")
    assert real.read_text().startswith("<!DOCTYPE html>")
    assert sorted(p.name for p in (tmp_path / "keep").iterdir()) == ["real.html"]


@pytest.mark.skipif(os.geteuid() != 0, reason="making a device node needs root")
def test_a_device_node_stays_a_device(db: Path, tmp_path: Path) -> None:
    null = tmp_path / "null"
    os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    code, out = report(db, null)
    assert code == 0, out
    assert stat.S_ISCHR(null.lstat().st_mode) and null.lstat().st_rdev == os.makedev(1, 3)
    assert [p.name for p in tmp_path.iterdir()] == ["null"]  # no temporary file left


@pytest.mark.skipif(os.geteuid() != 0, reason="making a device node needs root")
def test_a_full_output_is_one_error_line(db: Path, tmp_path: Path) -> None:
    full = tmp_path / "full"  # a device of its own: a failing run must not touch /dev/full
    os.mknod(full, 0o666 | stat.S_IFCHR, os.makedev(1, 7))
    code, out = report(db, full)
    assert (
        code == 1 and out.strip() == f"fsage: error: cannot write {full}: No space left on device"
    )
    assert stat.S_ISCHR(full.lstat().st_mode) and full.lstat().st_rdev == os.makedev(1, 7)
    with open(full, "w") as stdout:
        p = subprocess.run(
            [sys.executable, "-m", "fsage", "report", "--db", str(db), "-o", "-"],
            stdout=stdout, stderr=subprocess.PIPE, text=True, cwd=REPO, check=False,
        )  # fmt: skip
    assert p.returncode == 1, p.stderr
    assert p.stderr.strip().splitlines() == [
        "fsage: error: cannot write to standard output: No space left on device"
    ]
