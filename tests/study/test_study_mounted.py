"""A real 3-step study of a generated git history on ext4 and xfs, killed once and resumed,
checked against what e2fsprogs, git and find say about the images it leaves."""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from fsage.ager.images import loop_mount
from tests.conftest import REPO, require_tools

pytestmark = [pytest.mark.needs_root, pytest.mark.slow]

SIZE = "320M"  # xfs's smallest
IDENT = ["-c", "user.name=t", "-c", "user.email=t@example.org"]


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *IDENT, *args], check=True, capture_output=True, text=True
    ).stdout


def _make_repo(repo: Path) -> list[str]:
    """Four commits of a tree that grows, shrinks and changes; returns them, oldest first."""
    rng = random.Random(5)
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    names = [f"d{i % 7}/f{i}" for i in range(120)]
    live: set[str] = set()
    for c in range(4):
        for n in rng.sample(names, 60):
            p = repo / n
            if n in live and rng.random() < 0.3:
                p.unlink()
                live.discard(n)
                continue
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(rng.randbytes(int(rng.lognormvariate(9, 1.5)) % (3 << 20) + 1))
            live.add(n)
        _git(repo, "add", "-A")
        _git(repo, "commit", "-qm", f"c{c}")
    return _git(repo, "rev-list", "--first-parent", "--reverse", "HEAD").split()


def _study(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "fsage", "study", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _free_the_tracer_left_by_a_kill(ours: Path) -> None:
    """A SIGKILL that lands inside a traced scan skips the study's cleanup: the kernel's blk
    tracer stays on, and fsage will not take it over (it cannot tell it from another trace).
    Free it as fsage says to, when what it traces is the killed study's loop devices only."""
    from fsage.trace import TRACEFS_DIRS

    t = next((d for d in TRACEFS_DIRS if (d / "current_tracer").exists()), None)
    if t is None or (t / "current_tracer").read_text().strip() != "blk":
        return
    for enable in Path("/sys/class/block").glob("*/trace/enable"):
        if enable.read_text().strip() != "1":
            continue
        backing = enable.parent.parent / "loop" / "backing_file"
        if not (backing.exists() and backing.read_text().startswith(str(ours))):
            return  # another trace runs on the machine: not ours to free
        enable.write_text("0\n")
    (t / "tracing_on").write_text("0\n")
    (t / "current_tracer").write_text("nop\n")


def _filefrag_score(root: Path) -> tuple[float, int]:
    """Aggregate layout score of the regular files under ``root`` by filefrag -v extents."""
    contiguous = pairs = 0
    files = 0
    for dirpath, _dirs, fnames in os.walk(root):
        for f in fnames:
            p = Path(dirpath) / f
            if p.is_symlink() or not p.is_file():
                continue
            files += 1
            out = subprocess.run(
                ["filefrag", "-v", "-b4096", str(p)], check=True, capture_output=True, text=True
            ).stdout
            runs: list[tuple[int, int, int]] = []
            for line in out.splitlines():
                parts = line.replace(":", " ").replace("..", " ").split()
                if len(parts) >= 6 and parts[0].isdigit():
                    runs.append((int(parts[1]), int(parts[3]), int(parts[5])))
            blocks = sum(n for _l, _p, n in runs)
            if blocks < 2:
                continue
            pairs += blocks - 1
            contiguous += sum(n - 1 for _l, _p, n in runs)
            contiguous += sum(1 for a, b in itertools.pairwise(runs) if b[1] == a[1] + a[2])
    return contiguous / pairs, files


def _e2freefrag_free(image: Path) -> int:
    out = subprocess.run(["e2freefrag", str(image)], check=True, capture_output=True, text=True)
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("Free blocks:"))
    return int(line.split()[2])


def test_a_killed_study_resumes_and_its_results_match_the_tools(
    tmp_path: Path, fsage_env: dict[str, str]
) -> None:
    require_tools("filefrag", "e2freefrag", "mkfs.xfs", "git", "blktrace")
    commits = _make_repo(tmp_path / "repo")
    out = tmp_path / "study"
    db = tmp_path / "s.db"
    args = ["--fs", "ext4,xfs", "--workload", f"git:{tmp_path / 'repo'}", "--size", SIZE,
            "--steps", "3", "--out", str(out), "--db", str(db), "--trace",
            "--repeat", "2"]  # fmt: skip
    # killed while step 2 runs: on its way to measuring it
    proc = _study(args, fsage_env)
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if "step 2: measuring ext4" in line:
            break
    else:
        proc.wait()
        pytest.fail("the study ended before step 2:\n" + "".join(seen))
    time.sleep(1.0)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    _free_the_tracer_left_by_a_kill(tmp_path)
    done = _study(["--out", str(out), "--db", str(db), "--resume", "--format", "json"], fsage_env)
    stdout, stderr = done.communicate(timeout=900)
    assert done.returncode == 0, stderr
    res = json.loads(stdout)
    assert res["filesystems"] == ["ext4", "xfs"]
    con = sqlite3.connect(db)
    rows = con.execute(
        "SELECT step, fs, layout_score, dynamic_score, aged_seconds, clean_seconds, "
        "aged_clean_ratio, blocks_free, metrics FROM study_results ORDER BY step, fs"
    ).fetchall()
    assert [(r[0], r[1]) for r in rows] == [
        (1, "ext4"), (1, "xfs"), (2, "ext4"), (2, "xfs"), (3, "ext4"), (3, "xfs")
    ]  # fmt: skip
    last: dict[str, dict[str, Any]] = {r[1]: json.loads(r[8]) for r in rows if r[0] == 3}
    for r in rows:
        assert r[4] > 0 and r[5] > 0
        scan = json.loads(r[8])["scan"]
        assert len(scan["aged_values"]) == len(scan["clean_values"]) == 2  # --repeat 2
        # the ratio is the geometric mean of the rounds' paired ratios
        ratios = [a / c for a, c in zip(scan["aged_values"], scan["clean_values"], strict=True)]
        assert r[6] == pytest.approx(statistics.geometric_mean(ratios))

    # the aged trees hold the third commit exactly: no op ran twice or was lost
    want = set(_git(tmp_path / "repo", "ls-tree", "-r", "--name-only", commits[2]).split())
    sizes = {
        n: int(_git(tmp_path / "repo", "cat-file", "-s", f"{commits[2]}:{n}").strip()) for n in want
    }
    for fs in ("ext4", "xfs"):
        with loop_mount(out / "images" / f"{fs}.img", options="ro") as mnt:
            got = {
                str(p.relative_to(mnt / "tree0")): p.stat().st_size
                for p in (mnt / "tree0").rglob("*")
                if p.is_file()
            }
            assert got == sizes, fs
            if fs == "ext4":
                score, files = _filefrag_score(mnt)
        m = last[fs]
        scan = m["scan"]
        total = sum(sizes.values())
        # the scan read every file whole, on the aged tree and on its clean copy
        assert scan["files"] == len(sizes) and scan["bytes"] == total
        assert scan["clean_bytes"] == total
        assert m["clean_copy"]["files"] == len(sizes)
        # the trace read at least the files' blocks, and not much more (metadata)
        tr = scan["trace"]
        data_blocks = sum(-(-s // 4096) for s in sizes.values())
        assert data_blocks <= tr["blocks"] <= data_blocks * 1.1 + 2000
        assert 0.0 < tr["score"] <= 1.0
        if fs == "ext4":
            assert m["files"] == files
            assert m["layout_score"] == pytest.approx(score, abs=1e-9)
            assert m["blocks_free"] == _e2freefrag_free(out / "images" / "ext4.img")
    # a stored snapshot per step and file system
    snaps = con.execute("SELECT COUNT(*) FROM snapshots").fetchone()[0]
    assert snaps >= 6
    rep = subprocess.run(
        [
            sys.executable,
            "-m",
            "fsage",
            "study",
            "report",
            str(res["study_id"]),
            "--db",
            str(db),
            "--format",
            "json",
        ],
        cwd=REPO,
        env=fsage_env,
        capture_output=True,
        text=True,
        check=True,
    )
    table = json.loads(rep.stdout)
    assert len(table["rows"]) == 6
    assert sorted(table["rank_order"]["scan_aged_s_per_gib"]["aged"]) == ["ext4", "xfs"]


def test_a_fragmenting_preset_study_scores_as_filefrag_does(
    tmp_path: Path, fsage_env: dict[str, str]
) -> None:
    require_tools("filefrag", "e2freefrag")
    out = tmp_path / "study"
    db = tmp_path / "s.db"
    proc = _study(
        [
            "--fs",
            "ext4",
            "--workload",
            "preset:hfs-surge",
            "--size",
            "64M",
            "--steps",
            "2",
            "--out",
            str(out),
            "--db",
            str(db),
            "--seed",
            "3",
        ],
        fsage_env,
    )
    _stdout, stderr = proc.communicate(timeout=900)
    assert proc.returncode == 0, stderr
    con = sqlite3.connect(db)
    (metrics,) = con.execute("SELECT metrics FROM study_results WHERE step = 2").fetchone()
    m = json.loads(metrics)
    with loop_mount(out / "images" / "ext4.img", options="ro") as mnt:
        score, files = _filefrag_score(mnt)
        total = sum(p.stat().st_size for p in mnt.rglob("*") if p.is_file() and not p.is_symlink())
    assert score < 0.99  # the oracle sees fragmentation: the comparison means something
    assert m["layout_score"] == pytest.approx(score, abs=1e-9)
    assert m["files"] == files
    assert m["scan"]["bytes"] == total
    assert m["blocks_free"] == _e2freefrag_free(out / "images" / "ext4.img")
    _report_matches_the_tools(out, db, m, score, files, total, fsage_env)
    # the study's op stream is recorded whole, with a marker after each step
    steps = json.loads((out / "study.json").read_text())["ops_per_step"]
    import gzip

    with gzip.open(out / "ops.jsonl.gz", "rt") as fh:
        lines = [json.loads(x) for x in fh]
    assert sum(1 for x in lines if x.get("op") == "snapshot") == 2
    assert len(lines) == 1 + sum(steps) + 2


def _e2freefrag(image: Path) -> dict[str, int]:
    """e2freefrag's block size, total and free blocks, and largest free extent in KiB."""
    out = subprocess.run(["e2freefrag", str(image)], check=True, capture_output=True, text=True)
    got: dict[str, int] = {}
    for line in out.stdout.splitlines():
        key, _, rest = line.partition(":")
        words = rest.split()
        if key in ("Blocksize", "Total blocks", "Free blocks", "Max. free extent") and words:
            got[key] = int(words[0].removesuffix("KB"))
    return got


def _report_matches_the_tools(
    out: Path, db: Path, m: dict[str, Any], score: float, files: int, total: int,
    env: dict[str, str],
) -> None:  # fmt: skip
    """The report's row of the last step (`fsage study report --format json`, whose table
    `fsage report --study` draws) against filefrag, e2freefrag, stat and the scan's rounds."""
    rep = subprocess.run(
        [sys.executable, "-m", "fsage", "study", "report", "1", "--db", str(db),
         "--format", "json"],
        cwd=REPO, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    row = json.loads(rep.stdout)["rows"][-1]
    ff = _e2freefrag(out / "images" / "ext4.img")
    assert row["layout_score"] == pytest.approx(score, abs=1e-9)
    assert row["files"] == files and row["gib"] == pytest.approx(total / 2**30)
    assert row["free_share"] == pytest.approx(ff["Free blocks"] / ff["Total blocks"])
    assert row["largest_free_mib"] == pytest.approx(ff["Max. free extent"] / 1024, abs=1 / 1024)
    aged, clean = m["scan"]["aged_values"], m["scan"]["clean_values"]
    # the seconds are the upper median of the rounds
    assert row["aged_s_per_gib"] == pytest.approx(sorted(aged)[len(aged) // 2] / (total / 2**30))
    ratios = [a / c for a, c in zip(aged, clean, strict=True)]
    assert row["ratio"] == pytest.approx(statistics.geometric_mean(ratios))
    # the default rounds: at least 3 (the first look), fewer than 6 only when decided, at
    # most 10
    assert 3 <= row["rounds"] == len(aged) <= 10
    assert row["rounds"] >= 6 or row["verdict"] != "inconclusive"
    assert row["ratio_low"] <= row["ratio"] <= row["ratio_high"]
    page = out / "report.html"
    subprocess.run(
        [sys.executable, "-m", "fsage", "report", "--study", "1", "--db", str(db), "-o",
         str(page)],
        cwd=REPO, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    text = page.read_text()
    assert "Rank order, fastest first" in text and "Measured on this machine" in text


def _expected_tree(steps: list[Path]) -> dict[str, int]:
    """Regular files and sizes the op streams leave, by their ops alone."""
    files: dict[str, int] = {}
    for f in steps:
        for line in f.read_text().splitlines()[1:]:
            op = json.loads(line)
            kind, path = op["op"], op.get("path", "")
            size, off = op.get("size", 0), op.get("offset", 0)
            if kind == "create":
                files[path] = size
            elif kind == "append":
                files[path] += size
            elif kind in ("overwrite", "fallocate"):
                files[path] = max(files[path], off + size)
            elif kind == "truncate":
                files[path] = size
            elif kind == "delete":
                files.pop(path, None)
            elif kind == "rename":
                dest = op["dest"]
                moved = {p: s for p, s in files.items() if p == path or p.startswith(path + "/")}
                for p, s in moved.items():
                    del files[p]
                    files[dest + p[len(path) :]] = s
    return files


def test_a_study_killed_while_a_step_runs_resumes_at_its_next_op(
    tmp_path: Path, fsage_env: dict[str, str]
) -> None:
    out = tmp_path / "study"
    db = tmp_path / "s.db"
    # 256 MiB: step 2's ops take seconds, and the kill comes one second into them
    args = ["--fs", "ext4", "--workload", "preset:hfs-surge", "--size", "256M", "--steps", "2",
            "--out", str(out), "--db", str(db)]  # fmt: skip
    proc = _study(args, fsage_env)
    assert proc.stderr is not None
    for line in proc.stderr:
        if "step 2: running the ops on ext4" in line:
            break
    time.sleep(1.0)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    record = json.loads((out / "images" / "ext4.img.fsage-age").read_text())
    assert record["ident"]["ops_file"].endswith("step-0002.jsonl")
    assert record["finished"] is False  # killed inside the step, as meant
    done = _study(["--out", str(out), "--db", str(db), "--resume"], fsage_env)
    _stdout, stderr = done.communicate(timeout=900)
    assert done.returncode == 0, stderr
    want = _expected_tree(sorted((out / "steps").glob("step-*.jsonl")))
    with loop_mount(out / "images" / "ext4.img", options="ro") as mnt:
        got = {
            str(p.relative_to(mnt)): p.stat().st_size
            for p in mnt.rglob("*")
            if p.is_file() and not p.is_symlink() and p.parent.name != "lost+found"
        }
    assert got == want
    rows = sqlite3.connect(db).execute("SELECT step FROM study_results ORDER BY step").fetchall()
    assert rows == [(1,), (2,)]
