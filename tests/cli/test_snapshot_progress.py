"""`fsage snapshot`: progress on a terminal (a pseudo-terminal here), silence otherwise, and
a start-up that imports only what the command needs."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from fsage import _ext2fs
from fsage.cli.common import CountProgress
from fsage.db.store import Store
from tests.conftest import require_tools, root_and_loop
from tests.images import dumpe2fs_header, make_ext_image
from tests.terminal import run_on_terminal

# Modules `fsage snapshot` has no use for: the report, fleet and LFS stacks, the listing, the
# analyzer, and numpy's masked arrays (which numpy 2's np.unique imports on first use).
HEAVY = (
    "plotly",
    "pandas",
    "pyarrow",
    "duckdb",
    "scipy",
    "pyspark",
    "google.protobuf",
    "numpy.ma",
    "fsage.lfs",
    "fsage.listing",
    "fsage.analyzer",
    "fsage.reports",
    "fsage.fleet",
    "fsage.ager",
    "fsage.replay",
)

PROGRESS_LINE = re.compile(r"reading inodes  ([\d,]+)/([\d,]+)  +(\d+)%  (ETA \S+|[\d.]+ s)")


def _tree(root: Path, n: int) -> Path:
    root.mkdir()
    for d in range(n // 100):
        sub = root / f"d{d}"
        sub.mkdir()
        for i in range(100):
            (sub / f"f{i}").write_bytes(b"x" * (i * 37 % 9000))
    return root


def _in_use(image: Path) -> int:
    head = dumpe2fs_header(image)
    return int(head["Inode count"]) - int(head["Free inodes"])


def _summary(out: str) -> dict[str, int]:
    doc: dict[str, int] = json.loads(out)
    return doc


@pytest.fixture(scope="module")
def ext_image() -> Iterator[Path]:
    require_tools("mke2fs", "dumpe2fs")
    with tempfile.TemporaryDirectory(prefix="fsage-progress-") as d:
        work = Path(d)
        yield make_ext_image(work, "ext4", tree=_tree(work / "tree", 1500), size="32M")


def test_ext_image_progress_on_a_terminal(
    ext_image: Path, tmp_path: Path, fsage_env: dict[str, str]
) -> None:
    argv = [sys.executable, "-m", "fsage", "snapshot", str(ext_image), "--format", "json"]
    status, out, term = run_on_terminal([*argv, "--db", str(tmp_path / "a.db")], fsage_env)
    assert status == 0, term
    lines = PROGRESS_LINE.findall(term)
    assert lines, f"no progress line on the terminal: {term!r}"
    in_use = _in_use(ext_image)  # dumpe2fs: inodes in use, reserved ones included
    # The first line counts against the inodes in use; the last one what was read, 100 %.
    assert int(lines[0][1].replace(",", "")) == in_use
    done, total, pct, tail = lines[-1]
    inodes = _summary(out)["inodes"]
    assert done == total and pct == "100" and tail.endswith(" s")
    read = int(done.replace(",", ""))
    # what was read: the user inodes of the summary plus the reserved inodes in use
    assert inodes < read <= in_use
    assert term.endswith("\r\n") or term.endswith("\n")


def test_quiet_when_stderr_is_not_a_terminal(
    ext_image: Path, tmp_path: Path, fsage_env: dict[str, str]
) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "fsage", "snapshot", str(ext_image), "--db", str(tmp_path / "b.db")],
        capture_output=True,
        text=True,
        env=fsage_env,
        check=True,
    )
    assert res.stderr == ""
    assert res.stdout.startswith("snapshot 1 of ")


def test_scan_reports_progress_and_passes_on_what_it_raises(ext_image: Path) -> None:
    in_use = _in_use(ext_image)
    calls: list[tuple[int, int]] = []
    scanner = _ext2fs.Scanner(str(ext_image))
    try:
        cols = scanner.scan(2, lambda done, total: calls.append((done, total)))
    finally:
        scanner.close()
    scanned = len(cols["ino"]) // 8
    assert calls and all(total == in_use for _, total in calls)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)
    assert all(0 <= d <= scanned for d, _ in calls)

    class Stop(Exception):
        pass

    def stop(done: int, total: int) -> None:
        raise Stop

    scanner = _ext2fs.Scanner(str(ext_image))
    try:
        with pytest.raises(Stop):
            scanner.scan(2, stop)
        # nothing half-done is left: the same scanner scans again, completely
        assert len(scanner.scan(1)["ino"]) // 8 == scanned
    finally:
        scanner.close()


def test_count_progress_line_has_total_and_eta(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    import fsage.cli.common as common

    clock = [100.0]
    monkeypatch.setattr(common.time, "monotonic", lambda: clock[0])
    out = io.StringIO()
    line = CountProgress("reading inodes", out)
    line(0, 1000)
    clock[0] += 2.0
    line(250, 1000)  # 2 s for a quarter: 6 s left
    clock[0] += 0.0625
    line(260, 1000)  # drawn at most every 0.1 s
    clock[0] += 0.9375
    line(1200, 1000)  # more than the estimate: the total grows with it
    line.finish()
    shown = out.getvalue().split("\r")[1:]
    assert shown[0].startswith("reading inodes  0/1,000    0%  ETA -:--")
    assert shown[1].startswith("reading inodes  250/1,000   25%  ETA 0:06")
    assert len(shown) == 3
    assert shown[2].endswith("\n")
    assert shown[2].rstrip() == "reading inodes  1,200/1,200  100%  3.0 s"


def _snapshot_modules(argv: list[str], env: dict[str, str]) -> set[str]:
    """The modules loaded by the whole `fsage snapshot` command, run as a process."""
    code = (
        "import sys\n"
        "from fsage.cli import main\n"
        f"sys.argv = ['fsage', *{argv!r}]\n"
        "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
        "print('MODULES', ' '.join(sorted(sys.modules)))\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert res.stdout.startswith("snapshot 1 of "), res.stdout
    line = next(x for x in res.stdout.splitlines() if x.startswith("MODULES "))
    return set(line.split()[1:])


def _heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))


def test_snapshot_of_an_image_imports_nothing_heavy(
    ext_image: Path, tmp_path: Path, fsage_env: dict[str, str]
) -> None:
    modules = _snapshot_modules(
        ["snapshot", str(ext_image), "--db", str(tmp_path / "c.db")], fsage_env
    )
    assert "fsage.snapshotter.ext" in modules  # the command ran what it should have
    assert _heavy(modules) == []


@contextlib.contextmanager
def _mounted_ext4(image: Path) -> Iterator[Path]:
    """A fresh 64 MiB ext4 on ``image``, loop-mounted beside it for the block."""
    if not root_and_loop():
        pytest.skip("needs root and loop devices")
    require_tools("mkfs.ext4")
    mnt = image.with_suffix(".mnt")
    with open(image, "wb") as f:
        f.truncate(64 << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
    mnt.mkdir()
    subprocess.run(["mount", "-o", "loop", str(image), str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


@pytest.mark.needs_root
def test_snapshot_of_a_mounted_tree_progress_and_imports(
    tmp_path: Path, fsage_env: dict[str, str]
) -> None:
    with _mounted_ext4(tmp_path / "live.img") as mnt:
        _tree(mnt / "t", 5000)  # more than the 4096 inodes the C walk reports after
        os.sync()
        vfs = os.statvfs(mnt)
        in_use = vfs.f_files - vfs.f_ffree
        status, out, term = run_on_terminal(
            [sys.executable, "-m", "fsage", "snapshot", str(mnt), "--format", "json",
             "--db", str(tmp_path / "d.db")],
            fsage_env,
        )  # fmt: skip
        assert status == 0, term
        lines = PROGRESS_LINE.findall(term)
        assert lines, f"no progress line on the terminal: {term!r}"
        done, total, pct, tail = lines[-1]
        # every inode of the tree was read: the files, their directories, the root, lost+found,
        # and (as root, the device readable) the reserved inodes of the inode table
        walked = 1 + sum(len(dirs) + len(files) for _, dirs, files in os.walk(mnt))
        assert _summary(out)["inodes"] == walked
        with Store.open(tmp_path / "d.db") as store:
            reserved = len(store.load_layout(store.snapshots()[-1].id).special)
        assert int(done.replace(",", "")) == walked + reserved
        assert done == total and pct == "100" and tail.endswith(" s")
        # while it read: 4,096 of statvfs's inodes in use (the reserved ones included)
        assert (lines[0][0], int(lines[0][1].replace(",", ""))) == ("4,096", in_use)
        modules = _snapshot_modules(
            ["snapshot", str(mnt), "--db", str(tmp_path / "e.db")], fsage_env
        )
        assert "fsage.snapshotter.live" in modules
        assert _heavy(modules) == []


def test_count_progress_claims_nothing_on_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    import fsage.cli.common as common

    buf = io.StringIO()
    monkeypatch.setattr(sys, "stderr", buf)
    monkeypatch.setattr(common, "progress_enabled", lambda: True)
    with pytest.raises(OSError), common.count_progress("reading inodes") as report:
        assert report is not None
        report(10, 1000)
        raise OSError("the source went away")
    assert buf.getvalue().startswith("\rreading inodes  10/1,000    1%")
    assert buf.getvalue().endswith("\n") and "100%" not in buf.getvalue()
    monkeypatch.setattr(common, "progress_enabled", lambda: False)
    with common.count_progress("reading inodes") as report:
        assert report is None


@pytest.mark.needs_root
def test_progress_of_a_subtree_counts_the_subtree(
    tmp_path: Path, fsage_env: dict[str, str]
) -> None:
    """Below a mount point the file system's inodes in use say nothing of the walk: the first
    snapshot shows the count alone, the next one the count its predecessor read."""
    with _mounted_ext4(tmp_path / "sub.img") as mnt:
        _tree(mnt / "other", 6000)  # outside the subtree: statvfs counts it, the walk must not
        sub = _tree(mnt / "sub", 5000)
        os.sync()
        # the subtree's inodes and the mount root the layout's paths start from
        walked = 2 + sum(len(dirs) + len(files) for _, dirs, files in os.walk(sub))
        argv = [sys.executable, "-m", "fsage", "snapshot", str(sub), "--format", "json",
                "--db", str(tmp_path / "s.db")]  # fmt: skip
        status, out, term = run_on_terminal(argv, fsage_env)
        assert status == 0, term
        assert _summary(out)["inodes"] == walked
        unknown = re.findall(r"reading inodes  ([\d,]+)  \(of a number not known ahead\)", term)
        assert unknown and all(0 < int(n.replace(",", "")) < walked for n in unknown)
        lines = PROGRESS_LINE.findall(term)
        assert [(d, t) for d, t, _p, _tail in lines] == [(f"{walked:,}", f"{walked:,}")]
        status, out, term = run_on_terminal(argv, fsage_env)
        assert status == 0, term
        lines = PROGRESS_LINE.findall(term)
        assert len(lines) >= 2 and {t for _d, t, _p, _tail in lines} == {f"{walked:,}"}
