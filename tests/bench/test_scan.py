"""The scan suite: the aged/clean verdict on given numbers, path order and the copy on a plain
directory, the command's refusals, and (root) a scattered ext4 image scanned against its clean
copy, checked against the bytes written, filefrag, dumpe2fs and the database's own rows."""

from __future__ import annotations

import json
import os
import random
import re
import sqlite3
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

import fsage.replay.bench.scan as scan_mod
from fsage.replay.bench import BenchOptions
from fsage.replay.bench.scan import run_scan
from fsage.replay.bench.scantree import aged_clean_verdict, copy_tree, read_tree, walk_path_order
from tests.conftest import REPO, require_tools

# ---------------------------------------------------------------------------- the verdict


#: Seven rounds under drifting load: every round's aged scan slower than its clean one by
#: 8-15 %, while the load moves both from 9 to 30 s.
AGED7 = [10.0, 20.0, 15.0, 30.0, 12.0, 25.0, 18.0]
RATIOS7 = [1.10, 1.15, 1.08, 1.12, 1.09, 1.11, 1.14]
CLEAN7 = [a / r for a, r in zip(AGED7, RATIOS7, strict=True)]


def test_paired_rounds_see_an_effect_the_spread_of_the_sets_hides() -> None:
    v = aged_clean_verdict(AGED7, CLEAN7)
    # the two sets spread over 100 % (20 / 18): the ranges overlap entirely
    assert v.spread > 1.0
    assert v.verdict == "slower"
    assert (v.slower_rounds, v.rounds) == (7, 7)
    # the median of the paired ratios, with the sign-test interval [min, max] at 7 rounds
    assert v.ratio == pytest.approx(1.11)
    assert (v.ci_low, v.ci_high) == (pytest.approx(1.08), pytest.approx(1.15))
    assert v.to_json()["ratio"] == pytest.approx(1.11)
    assert "slower" in v.text() and "95% interval 1.080-1.150" in v.text()


def test_a_faster_aged_tree_is_said() -> None:
    v = aged_clean_verdict(CLEAN7, AGED7)
    assert v.verdict == "faster"
    assert v.ratio == pytest.approx(1 / 1.11)


def test_an_interval_that_includes_one_is_inconclusive() -> None:
    # six rounds, aged slower in four: the interval [min, max] = [0.95, 1.2] includes 1
    ratios = [1.2, 0.95, 1.1, 1.05, 0.98, 1.15]
    v = aged_clean_verdict([10.0 * r for r in ratios], [10.0] * 6)
    assert v.verdict == "inconclusive"
    assert v.ratio is None
    assert v.paired_ratio == pytest.approx((1.05 + 1.1) / 2)
    assert (v.ci_low, v.ci_high) == (pytest.approx(0.95), pytest.approx(1.2))
    assert v.to_json()["ratio"] is None
    assert v.to_json()["verdict"] == "inconclusive"
    assert v.text().startswith("inconclusive")
    assert (v.slower_rounds, v.rounds) == (4, 6)
    assert "aged slower in 4 of 6 rounds" in v.text()


def test_too_few_rounds_for_an_interval_are_inconclusive() -> None:
    # five rounds, all slower by 2x: [min, max] covers the median only 93.75 % of the time
    v = aged_clean_verdict([20.0] * 5, [10.0] * 5)
    assert v.verdict == "inconclusive"
    assert v.paired_ratio == 2.0
    assert v.ci_low is None and "it needs 6" in v.reason
    v = aged_clean_verdict([20.0], [10.0])
    assert v.ratio is None and "too few rounds (1)" in v.reason


# ---------------------------------------------------------------------------- the walk


def _tree(root: Path) -> dict[str, int]:
    """A small tree whose path order differs from a sort of the full paths ('a/...' comes
    before 'a-c' in a walk, after it in a sort: '-' < '/'); the sizes written."""
    sizes = {"a/b": 5000, "a/z/deep": 70000, "a-c": 1, "b": 0, "B": 123456, "c/d/e/f": 4096}
    for rel, size in sizes.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(os.urandom(size))
    (root / "link").symlink_to("a/b")
    (root / "emptydir").mkdir()
    return sizes


def test_path_order_is_a_walk_by_name(tmp_path: Path) -> None:
    _tree(tmp_path)
    got = [os.path.relpath(os.fsdecode(e.path), tmp_path) for e, _ in walk_path_order(tmp_path)]
    assert got == [
        "B", "a", "a/b", "a/z", "a/z/deep", "a-c", "b", "c", "c/d", "c/d/e", "c/d/e/f",
        "emptydir", "link",
    ]  # fmt: skip


def test_a_scan_reads_every_byte_the_files_hold(tmp_path: Path) -> None:
    sizes = _tree(tmp_path)
    r = read_tree(tmp_path)
    # independent: what find reports (symbolic links not followed)
    find = subprocess.run(
        ["find", str(tmp_path), "-type", "f", "-printf", "%s\n"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert r.bytes == sum(int(x) for x in find) == sum(sizes.values())
    assert r.files == len(find) == 6
    assert r.dirs == 6  # a, a/z, c, c/d, c/d/e, emptydir
    assert r.seconds > 0 and r.mb_per_s > 0


def test_the_copy_holds_the_same_tree(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    _tree(src)
    os.chmod(src / "a" / "b", 0o640)
    stats = copy_tree(src, dst)
    assert (stats.files, stats.symlinks, stats.dirs) == (6, 1, 6)
    # independent: diff compares contents and links without following them
    diff = subprocess.run(["diff", "-r", "--no-dereference", str(src), str(dst)], check=False)
    assert diff.returncode == 0
    assert os.stat(dst / "a" / "b").st_mode & 0o777 == 0o640
    assert os.readlink(dst / "link") == "a/b"


# ---------------------------------------------------------------------------- the command


def _fsage(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fsage", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        check=False,
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--suite", "seq", "--path", "x"], "--path and --trace belong to the scan suite"),
        (["--suite", "scan", "--size", "8M"], "takes no --size"),
        (["--suite", "scan", "--path", "../etc"], "without '..'"),
        (["--suite", "scan", "--path", "nowhere"], "no such directory"),
    ],
)
def test_bad_scan_options_give_one_line(
    tmp_path: Path, fsage_env: dict[str, str], args: list[str], message: str
) -> None:
    (tmp_path / "t").mkdir()
    db = tmp_path / "r.db"
    p = _fsage("bench", str(tmp_path / "t"), *args, "--db", str(db), env=fsage_env)
    assert p.returncode != 0
    assert message in p.stderr
    assert "Traceback" not in p.stderr
    assert p.stderr.strip().startswith("fsage: error:") or "Usage" in p.stderr
    assert not db.exists()  # nothing written


def test_scan_of_a_directory_says_it_has_no_clean_copy(
    tmp_path: Path, fsage_env: dict[str, str]
) -> None:
    tree = tmp_path / "t"
    tree.mkdir()
    sizes = _tree(tree)
    p = _fsage(
        "bench", str(tree), "--suite", "scan", "--repeat", "2", "--format", "json", env=fsage_env
    )
    assert p.returncode == 0, p.stderr
    run = json.loads(p.stdout)
    scan = run["params"]["scan"]
    assert scan["aged"]["bytes"] == sum(sizes.values())
    assert len(scan["aged"]["values"]) == 2
    assert scan["clean"] is None and "aged_clean" not in scan
    assert any("no clean copy" in n for n in run["notes"])


# ---------------------------------------------------------------------------- root: an image


def _scattered_image(path: Path, mnt: Path) -> dict[str, int]:
    """A 64 MiB ext4 of 4 KiB blocks whose files are scattered: files of four directories
    created in turn (each directory's files interleaved with the others'), and every third
    file of a spacer directory deleted between them. The sizes of the files left."""
    subprocess.run(
        ["mkfs.ext4", "-q", "-F", "-b", "4096", "-E", "lazy_itable_init=0", str(path), "64M"],
        check=True,
    )
    mnt.mkdir()
    subprocess.run(["mount", "-o", "loop", str(path), str(mnt)], check=True)
    rng = random.Random(7)
    sizes: dict[str, int] = {}
    try:
        dirs = ["mail", "src", "docs", "spool"]
        for d in [*dirs, "spacer"]:
            (mnt / d).mkdir()
        for k in range(60):
            for d in dirs:
                size = rng.randint(1, 24) * 4096 + rng.randint(0, 4095)
                (mnt / d / f"f{k:03d}").write_bytes(rng.randbytes(size))
                sizes[f"{d}/f{k:03d}"] = size
                with open(mnt / "spacer" / f"s{k:03d}{d}", "wb") as fh:
                    fh.write(b"s" * 9000)
                    os.fsync(fh.fileno())
        for i, f in enumerate(sorted((mnt / "spacer").iterdir())):
            if i % 3:
                f.unlink()
            else:
                sizes[f"spacer/{f.name}"] = 9000
    finally:
        subprocess.run(["umount", str(mnt)], check=True)
    return sizes


def _filefrag_blocks(mnt: Path) -> tuple[int, int]:
    """(data blocks of the regular files, blocks of the directories) by filefrag -v."""
    totals = []
    for kind in ("f", "d"):
        files = subprocess.run(
            ["find", str(mnt), "-xdev", "-type", kind], capture_output=True, text=True, check=True
        ).stdout.split()
        out = subprocess.run(
            ["filefrag", "-v", "-b4096", *files], capture_output=True, text=True, check=True
        ).stdout
        # rows: "   0:        0..       3:      34816..     34819:      4: ..."
        ext = re.findall(r"^\s*\d+:\s+\d+\.\.\s*\d+:\s+\d+\.\.\s*\d+:\s+(\d+):", out, re.M)
        totals.append(sum(int(x) for x in ext))
    return totals[0], totals[1]


def _inode_table_blocks(image: Path) -> int:
    out = subprocess.run(["dumpe2fs", "-h", str(image)], capture_output=True, text=True).stdout
    per_group = int(re.search(r"Inode blocks per group:\s+(\d+)", out).group(1))  # type: ignore[union-attr]
    count = int(re.search(r"Block count:\s+(\d+)", out).group(1))  # type: ignore[union-attr]
    per = int(re.search(r"Blocks per group:\s+(\d+)", out).group(1))  # type: ignore[union-attr]
    return per_group * -(-count // per)


@pytest.mark.needs_root
@pytest.mark.slow
def test_scan_of_a_scattered_image_against_its_clean_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_tools("mkfs.ext4", "filefrag", "dumpe2fs", "losetup", "blktrace", "blkparse")
    # The kernel's tracer is one per machine: while another trace (a second copy of the suite,
    # anyone's) holds it, the scan waits for it rather than running untraced after 3 tries.
    monkeypatch.setattr(scan_mod, "TRACE_ATTEMPTS", 25)  # waits of 1 s, 2 s, ...: 5 min
    image = tmp_path / "scan-aged.img"
    sizes = _scattered_image(image, tmp_path / "mnt")
    db = tmp_path / "scan.db"
    said: list[str] = []
    run = run_scan(
        image, BenchOptions("scan", repeat=2, trace=True, baseline=True), db, said.append
    )
    scan = run.params["scan"]
    aged, clean = scan["aged"], scan["clean"]

    # every byte of every file, on both sides (exact: the sizes written)
    assert aged["bytes"] == clean["bytes"] == sum(sizes.values())
    assert aged["files"] == clean["files"] == len(sizes)

    # the traced blocks hold the files' data blocks and no more than the metadata besides
    subprocess.run(["mount", "-o", "loop,ro", str(image), str(tmp_path / "mnt")], check=True)
    try:
        data, dir_blocks = _filefrag_blocks(tmp_path / "mnt")
    finally:
        subprocess.run(["umount", str(tmp_path / "mnt")], check=True)
    metadata = dir_blocks + _inode_table_blocks(image) + 64
    for side in (aged, clean):
        traced = side["trace"]
        assert traced["block_size"] == 4096
        assert data <= traced["blocks"] <= data + metadata, (traced, data, metadata)
    # the clean copy is read as fewer, longer runs than the scattered original
    assert clean["trace"]["score"] > aged["trace"]["score"]

    # alternating: aged, clean, then clean, aged
    # (a scan's time, not a trace that failed and was tried again)
    done = [m for m in said if re.match(r"fsage: scan \d+ of the \w+ tree: [\d.]+ s", m)]
    order = [m.split(" tree")[0].split()[-1] for m in done]
    assert order == ["aged", "clean", "clean", "aged"]
    a, c = aged["values"], clean["values"]
    assert len(a) == len(c) == 2
    verdict = scan["aged_clean"]
    # the median of the two rounds' paired ratios; two rounds give no 95% interval
    assert verdict["paired_ratio"] == pytest.approx(statistics.median([a[0] / c[0], a[1] / c[1]]))
    assert verdict["ratio"] is None and verdict["verdict"] == "inconclusive"
    assert "too few rounds (2)" in verdict["reason"]

    # stored as a bench run, as the database holds it
    con = sqlite3.connect(db)
    (suite, params) = con.execute("SELECT suite, params FROM bench_runs").fetchone()
    assert suite == "scan"
    assert json.loads(params)["scan"]["aged"]["values"] == a
    metrics = sorted(r[0] for r in con.execute("SELECT metric FROM bench_results"))
    want = ["scan", "scan", "scan_rate", "scan_rate"]
    if verdict["ratio"] is not None:
        want.insert(0, "aged_clean_ratio")
    assert metrics == want
    con.close()

    # nothing left: the clean image, its loop devices, the mounts
    assert not list(tmp_path.glob(".*fsage-scan-clean"))
    loops = subprocess.run(["losetup", "-j", str(image)], capture_output=True, text=True).stdout
    assert loops.strip() == ""
    assert str(tmp_path) not in Path("/proc/self/mounts").read_text()


@pytest.mark.needs_root
@pytest.mark.slow
def test_scan_of_a_path_reads_and_copies_only_that_tree(tmp_path: Path) -> None:
    require_tools("mkfs.ext4", "losetup")
    image = tmp_path / "scan-path.img"
    sizes = _scattered_image(image, tmp_path / "mnt")
    run = run_scan(image, BenchOptions("scan", repeat=1, baseline=True, path="/mail"))
    scan = run.params["scan"]
    mail = [s for name, s in sizes.items() if name.startswith("mail/")]
    assert scan["path"] == "mail"
    for side in ("aged", "clean"):
        assert scan[side]["bytes"] == sum(mail)
        assert scan[side]["files"] == len(mail) == 60
    # one round: no interval to judge a ratio by
    assert scan["aged_clean"]["ratio"] is None
    assert "too few rounds (1)" in scan["aged_clean"]["reason"]


@pytest.mark.needs_root
def test_an_image_whose_journal_needs_recovery_is_refused(
    tmp_path: Path, fsage_env: dict[str, str]
) -> None:
    require_tools("mkfs.ext4", "debugfs")
    image = tmp_path / "dirty.img"
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image), "32M"], check=True, capture_output=True)
    # the flag a crash leaves: read-only, the journal would not be replayed
    subprocess.run(
        ["debugfs", "-w", "-R", "feature needs_recovery", str(image)],
        check=True, capture_output=True,
    )  # fmt: skip
    p = _fsage("bench", str(image), "--suite", "scan", "--repeat", "1", env=fsage_env)
    assert p.returncode != 0
    assert p.stderr.strip().splitlines() == [
        f"fsage: error: {image}: its journal needs recovery (not unmounted cleanly); mount and "
        "unmount it once, or e2fsck -fy it, before scanning"
    ]
    loops = subprocess.run(["losetup", "-j", str(image)], capture_output=True, text=True).stdout
    assert loops.strip() == ""
