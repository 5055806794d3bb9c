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


def test_free_space_is_in_bytes_across_block_sizes(tmp_path: Path) -> None:
    """The summary's and the comparison's free space and largest free extent are bytes, not
    blocks of 1 KiB beside blocks of 4 KiB."""
    from fsage.reports import report_data_from_store
    from fsage.reports.sections import summary
    from fsage.reports.sections_compare import compare
    from fsage.text import human_bytes

    path = tmp_path / "two.db"
    with Store.open(path, create=True) as store:
        synthetic_history(store, "k1", files=200, snapshots=1, seed=5, block_size=1024)
        synthetic_history(store, "k4", files=200, snapshots=1, seed=6)
        data = report_data_from_store(store)
        ids = [s.id for s in store.snapshots()]
        pair = report_data_from_store(store, compare=(ids[0], ids[-1]))
    (table,) = summary(data).tables
    free, largest = table.headers.index("free space"), table.headers.index("largest free extent")
    by_fs = {a["fs"]: a for a in data.latest()}
    assert {a["block_size"] for a in by_fs.values()} == {1024, 4096}
    for row in table.rows:
        a = by_fs[row[0]]
        assert row[free] == human_bytes(a["free_space"]["blocks_free"] * a["block_size"])
        assert row[largest] == human_bytes(a["largest_free_extent"] * a["block_size"])
    sec = compare(pair)
    assert sec is not None
    rows = {r[0]: r[1:] for r in sec.tables[0].rows}
    a, b = pair.extra["compare"]["a"], pair.extra["compare"]["b"]
    assert rows["largest free extent"] == [
        human_bytes(x["largest_free_extent"] * x["block_size"]) for x in (a, b)
    ]
