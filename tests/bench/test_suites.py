"""Every benchmark suite at a small size: on a loop-mounted ext4 image (root), and on a plain
directory as an unprivileged user (the run says it is warm). Layout scores are checked against
``filefrag -v`` on the files the benchmark kept."""

from __future__ import annotations

import itertools
import json
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from fsage.ager.images import loop_mount, make_image
from fsage.errors import UsageError
from fsage.replay.bench import BenchOptions, run_bench
from tests.conftest import REPO, require_tools

MIB = 1 << 20

# Small settings: each suite runs in about a second (plus cache drops).
SMALL: dict[str, list[str]] = {
    "seq": ["--size", "256K", "--file-size", "4K", "--file-size", "64K"],
    "seq-fsync": ["--size", "128K", "--file-size", "64K"],
    "create-read": ["--size", "256K", "--file-size", "16K", "--file-size", "64K"],
    "postmark": ["--size", "200", "--transactions", "20000"],
    "tpcb": ["--size", "512K", "--transactions", "1000"],
    "hfs-aging": ["--size", "200"],
}
SMALL_OPTS = {
    "seq": {"size": 256 * 1024, "file_sizes": [4096, 65536]},
    "seq-fsync": {"size": 128 * 1024, "file_sizes": [65536]},
    "create-read": {"size": 256 * 1024, "file_sizes": [16384, 65536]},
    "postmark": {"size": 200, "transactions": 20_000},
    "tpcb": {"size": 512 * 1024, "transactions": 1000},
    "hfs-aging": {"size": 200},
}


def _old_files(root: Path) -> None:
    """A few files already on the file system, two of them written interleaved."""
    (root / "old").mkdir()
    a = os.open(root / "old" / "a", os.O_WRONLY | os.O_CREAT, 0o644)
    b = os.open(root / "old" / "b", os.O_WRONLY | os.O_CREAT, 0o644)
    chunk = os.urandom(8192)
    for _ in range(16):
        os.write(a, chunk)
        os.fsync(a)
        os.write(b, chunk)
        os.fsync(b)
    os.close(a)
    os.close(b)
    for i in range(5):
        (root / "old" / f"c{i}").write_bytes(os.urandom(65536))


@pytest.fixture
def image(tmp_path: Path) -> Path:
    img = make_image(tmp_path / "bench.img", "ext4", 64 * MIB)
    with loop_mount(img) as mnt:
        _old_files(mnt)
    return img


def _rows(db: Path) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
    con = sqlite3.connect(db)
    try:
        runs = con.execute(
            "SELECT id, suite, cold, layout_score_bench_files, layout_score_old_files FROM "
            "bench_runs"
        ).fetchall()
        res = con.execute(
            "SELECT run_id, metric, value, unit, layout_score_bench_files, "
            "layout_score_old_files FROM bench_results"
        ).fetchall()
    finally:
        con.close()
    return runs, res


@pytest.mark.needs_root
@pytest.mark.parametrize("suite", list(SMALL))
def test_suite_on_loop_mounted_ext4(image: Path, tmp_path: Path, suite: str) -> None:
    if suite == "postmark":
        require_tools("postmark")
    db = tmp_path / "b.db"
    run = run_bench(image, BenchOptions(suite, **SMALL_OPTS[suite]), db=db)  # type: ignore[arg-type]
    assert run.cold is True
    assert not any("warm" in n for n in run.notes)
    runs, res = _rows(db)
    assert [(r[0], r[1], r[2]) for r in runs] == [(run.run_id, suite, 1)]
    assert len(res) == len(run.results) > 0
    # The old files are there (two interleaved 128 KB files, five 64 KB files).
    old = runs[0][4]
    assert isinstance(old, float) and 0.0 <= old <= 1.0
    bench = runs[0][3]
    if suite == "postmark":
        assert bench is None  # postmark deletes its own files
        assert any("postmark deletes its files" in n for n in run.notes)
    else:
        assert isinstance(bench, float) and 0.0 <= bench <= 1.0
    for r in res:
        for score in r[4:]:
            assert score is None or 0.0 <= float(score) <= 1.0  # type: ignore[arg-type]
    js = run.results_json()
    for j in js:
        assert {"suite", "params", "metric", "value", "unit"} <= set(j)
        assert "layout_score_bench_files" in j and "layout_score_old_files" in j
    # The benchmark cleaned up after itself.
    with loop_mount(image) as mnt:
        assert sorted(os.listdir(mnt)) == ["lost+found", "old"]


def _filefrag_extents(path: Path) -> list[tuple[int, int, int]]:
    out = subprocess.run(
        ["filefrag", "-v", str(path)], capture_output=True, text=True, check=True
    ).stdout
    ext = []
    for m in re.finditer(r"^\s*\d+:\s+(\d+)\.\.\s*(\d+):\s+(\d+)\.\.\s*(\d+):\s+(\d+):", out, re.M):
        ext.append((int(m[1]), int(m[3]), int(m[5])))
    return sorted(ext)


def _filefrag_score(files: list[Path]) -> float:
    """Σ contiguous / Σ (blocks - 1) from filefrag's extents (DESIGN.md definitions)."""
    contig = den = 0
    for f in files:
        ext = _filefrag_extents(f)
        blocks = sum(e[2] for e in ext)
        if blocks < 2:
            continue
        den += blocks - 1
        contig += sum(e[2] - 1 for e in ext)
        contig += sum(1 for p, q in itertools.pairwise(ext) if q[1] == p[1] + p[2])
    return contig / den


@pytest.mark.needs_root
def test_layout_scores_match_filefrag(image: Path, tmp_path: Path) -> None:
    require_tools("filefrag")
    opts = BenchOptions("create-read", size=512 * 1024, file_sizes=[16384, 65536], keep=True)
    run = run_bench(image, opts, db=tmp_path / "b.db")
    assert run.layout is not None and run.layout.bench is not None
    with loop_mount(image) as mnt:
        kept = [p for p in mnt.iterdir() if p.name.startswith("fsage-bench-create-read-")]
        assert len(kept) == 1
        bench_files = sorted(p for p in kept[0].rglob("*") if p.is_file())
        old_files = sorted(p for p in (mnt / "old").iterdir())
        assert run.layout.bench.files == len(bench_files) == 32 + 8
        assert run.layout.bench.score == pytest.approx(_filefrag_score(bench_files), abs=1e-12)
        assert run.layout_score_old_files == pytest.approx(_filefrag_score(old_files), abs=1e-12)
        g64 = sorted(p for p in kept[0].glob("create-read-64K/*/*"))
        assert len(g64) == 8
        assert run.layout.groups["create-read-64K"].score == pytest.approx(
            _filefrag_score(g64), abs=1e-12
        )
        # Results of the 64 KB files carry the 64 KB group's score and the old 64 KB files'.
        old64 = [mnt / "old" / f"c{i}" for i in range(5)]
        r64 = [j for j in run.results_json() if j["params"].get("file_size") == 65536]
        assert {j["metric"] for j in r64} == {"read", "write", "creates"}
        for j in r64:
            assert j["layout_score_bench_files"] == pytest.approx(_filefrag_score(g64))
            assert j["layout_score_old_files"] == pytest.approx(_filefrag_score(old64))


@pytest.mark.needs_root
def test_cli_json_on_image(image: Path, tmp_path: Path, fsage_env: dict[str, str]) -> None:
    db = tmp_path / "b.db"
    proc = subprocess.run(
        [sys.executable, "-m", "fsage", "bench", str(image), "--suite", "tpcb", *SMALL["tpcb"],
         "--db", str(db), "--format", "json"],
        capture_output=True, text=True, env=fsage_env, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["cold"] is True and data["suite"] == "tpcb"
    assert data["params"]["accounts"] == 512 * 1024 // 4096 * 40
    assert data["params"]["balance_check"] == "ok"
    metrics = {r["metric"]: r for r in data["results"]}
    assert metrics["tps"]["unit"] == "transactions/s" and metrics["tps"]["value"] > 0
    assert metrics["tps"]["params"]["transactions"] == 1000
    # The account file: 128 blocks of 4 KB, the history 1000 x 50 bytes, 11,000 bytes of
    # teller and branch records.
    assert data["layout"]["bench"]["files"] == 3
    assert data["layout"]["bench"]["blocks"] == 128 + 13 + 3


# ---------------------------------------------------------------------- without root
# Root's Python environment lives under /root (mode 0700 here), so an unprivileged subprocess
# cannot import fsage's dependencies; these tests take root's powers away from fsage instead.


@pytest.fixture
def no_root(monkeypatch: pytest.MonkeyPatch) -> None:
    import fsage.ager.images
    import fsage.replay.bench.target

    monkeypatch.setattr(fsage.replay.bench.target, "can_drop_caches", lambda: False)
    monkeypatch.setattr(fsage.ager.images, "can_loop_mount", lambda: False)


@pytest.mark.parametrize("suite", list(SMALL))
def test_without_root_each_suite_says_it_runs_warm(
    tmp_path: Path, suite: str, no_root: None
) -> None:
    if suite == "postmark":
        require_tools("postmark")
    target = tmp_path / "t"
    target.mkdir()
    (target / "old").write_bytes(os.urandom(40000))
    said: list[str] = []
    db = tmp_path / "b.db"
    run = run_bench(target, BenchOptions(suite, **SMALL_OPTS[suite]), db=db, echo=said.append)  # type: ignore[arg-type]
    warm = (
        "not root: the page cache cannot be dropped and the file system cannot be remounted, "
        "so this run is warm (reads may come from memory, not the disk)"
    )
    assert said[0] == f"fsage: {warm}"
    assert run.notes[0] == warm
    assert run.cold is False
    assert sorted(os.listdir(target)) == ["old"]
    # The live reader still scores the old file (10 blocks of 4 KB on the test machine's fs).
    assert run.layout_score_old_files is not None
    assert 0.0 <= run.layout_score_old_files <= 1.0
    con = sqlite3.connect(db)
    try:
        (cold, notes) = con.execute("SELECT cold, notes FROM bench_runs").fetchone()
    finally:
        con.close()
    assert cold == 0 and json.loads(notes)[0] == warm


def test_without_root_an_image_cannot_be_benchmarked(tmp_path: Path, no_root: None) -> None:
    require_tools("mkfs.ext4")
    img = make_image(tmp_path / "x.img", "ext4", 8 * MIB)
    from click.testing import CliRunner

    from fsage.cli import main

    res = CliRunner().invoke(main, ["bench", str(img), "--suite", "seq"])
    assert res.exit_code == 2
    assert res.output.strip().splitlines() == [
        f"fsage: error: {img}: cannot run the seq suite on this image (loop-mounting needs root "
        "and /dev/loop-control); give a mounted directory instead"
    ]


def test_unknown_suite_and_bad_size(tmp_path: Path, fsage_env: dict[str, str]) -> None:
    base = [sys.executable, "-m", "fsage", "bench", str(tmp_path)]
    proc = subprocess.run(
        [*base, "--suite", "seq", "--size", "lots"], capture_output=True, text=True,
        env=fsage_env, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip() == "fsage: error: not a size: 'lots' (e.g. 4096, 64K, 32M)"
    assert "Traceback" not in proc.stderr
    assert REPO.exists()


@pytest.mark.parametrize(
    ("suite", "listed"),
    [("postmark", "standard, seed003"), ("hfs-aging", "10k, 20k, 40k")],
)
def test_unknown_variant_is_refused_before_the_target_is_touched(
    tmp_path: Path, suite: str, listed: str
) -> None:
    target = tmp_path / "t"
    target.mkdir()
    opts = BenchOptions(suite=suite, variant="nope", repeat=3)
    said: list[str] = []
    with pytest.raises(UsageError, match=f"unknown {suite} variant 'nope' \\({listed}"):
        run_bench(target, opts, echo=said.append)
    assert said == []  # refused before any layout read or run began
    assert list(target.iterdir()) == []
