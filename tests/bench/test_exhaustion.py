"""Benchmarks on a small or inode-poor file system: the default seq set is scaled down with a
notice; running out of inodes or space mid-suite is one line and leaves the target clean."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from fsage.ager.images import loop_mount
from fsage.cli import main
from fsage.replay.bench import BenchOptions, run_bench

MIB = 1 << 20


def _ext4(path: Path, size: int, *extra: str) -> Path:
    with open(path, "wb") as fh:
        fh.truncate(size)
    subprocess.run(["mkfs.ext4", "-F", "-q", *extra, str(path)], check=True, capture_output=True)
    return path


@pytest.mark.needs_root
def test_default_seq_set_is_scaled_to_fit(tmp_path: Path) -> None:
    img = _ext4(tmp_path / "small.img", 64 * MIB)
    run = run_bench(img, BenchOptions("seq", file_sizes=[256 * 1024, 1 << 20]))
    scaled = [n for n in run.notes if "scaled down" in n]
    assert scaled and "32M to 16M" in scaled[0], run.notes
    assert run.params["data_size"] == 16 * MIB
    assert {r.params["files"] for r in run.results} == {64, 16}


@pytest.mark.needs_root
def test_running_out_of_inodes_is_one_line_and_a_clean_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 256 inodes: the 4K files of a 2 MiB set (512 of them) cannot all be made. Given --size,
    # the set is not scaled; the check before the run refuses it in one line.
    img = _ext4(tmp_path / "few.img", 64 * MIB, "-N", "256")
    with loop_mount(img) as mnt:
        free_inodes = os.statvfs(mnt).f_favail
    assert free_inodes < 512
    argv = ["bench", str(img), "--suite", "seq", "--size", "2M", "--file-size", "4K"]

    def one_error_line() -> str:
        r = CliRunner().invoke(main, argv)
        assert r.exit_code != 0 and "Traceback" not in r.output
        lines = [ln for ln in r.output.splitlines() if ln.startswith("fsage: error:")]
        assert len(lines) == 1, r.output
        return lines[0]

    assert "inodes but" in one_error_line()
    # Without that check the kernel runs out of inodes mid-suite: one line too, and the
    # benchmark's files are gone.
    from fsage.replay.bench import suites

    monkeypatch.setattr(suites, "_set_inodes", lambda *a: 0)
    line = one_error_line()
    assert "ran out of inodes" in line and "files were removed" in line
    with loop_mount(img) as mnt:
        assert sorted(os.listdir(mnt)) == ["lost+found"]
        assert os.statvfs(mnt).f_favail == free_inodes


@pytest.mark.needs_root
def test_repeats_and_empty_fs_baseline_in_one_invocation(tmp_path: Path) -> None:
    img = _ext4(tmp_path / "aged.img", 64 * MIB)
    with loop_mount(img) as mnt:
        for i in range(40):  # some old files, so the target is not empty
            (mnt / f"old{i}").write_bytes(b"o" * (i * 3000))
    said: list[str] = []
    run = run_bench(
        img,
        BenchOptions("seq", size=256 * 1024, file_sizes=[16384, 65536], repeat=3, baseline=True),
        echo=said.append,
    )
    assert run.params["repeat"] == 3
    assert len(run.results) == 4  # read and write for two sizes: medians, not 12 rows
    for r in run.results:
        vals = r.params["values"]
        assert r.params["repeats"] == 3 and len(vals) == 3
        assert r.value == sorted(vals)[1]
        assert r.params["spread"] == pytest.approx((max(vals) - min(vals)) / r.value)
        assert r.params["baseline"] > 0
        bases = r.params["baseline_values"]
        assert len(bases) == 3 and r.params["baseline"] == sorted(bases)[1]
        # relative: the median of the rounds' paired ratios, not the ratio of the medians
        ratios = sorted(v / b for v, b in zip(vals, bases, strict=True))
        assert r.params["relative"] == pytest.approx(ratios[1])
        # 3 rounds give no 95% interval (6 do): inconclusive, and said for each result
        assert r.params["relative_ci"] == [None, None]
        assert r.params["verdict"] == "inconclusive"
        assert any(n.startswith(f"{r.metric} of {r.group}: inconclusive") for n in run.notes)
    assert any("empty-file-system baseline run" in n and "3 rounds" in n for n in run.notes)
    # interleaved: the target first in rounds 1 and 3, the empty file system first in round 2
    marks = [s for s in said if s.startswith("fsage: round") or "empty file system:" in s]
    assert marks == [
        "fsage: round 1", "fsage: on the empty file system:",
        "fsage: round 2", "fsage: on the empty file system:",
        "fsage: round 3", "fsage: on the empty file system:",
    ]  # fmt: skip
    r2 = said.index("fsage: round 2")
    assert said[r2 + 1] == "fsage: on the empty file system:"
    r3 = said.index("fsage: round 3")
    assert said[r3 + 1] != "fsage: on the empty file system:"
    # The baseline image is gone and the target holds only its old files.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["aged.img"]
    with loop_mount(img) as mnt:
        assert len(os.listdir(mnt)) == 41


@pytest.mark.needs_root
def test_the_baseline_runs_the_data_set_the_target_was_scaled_to(tmp_path: Path) -> None:
    # a target with 20 MiB free: the default 32 MiB data set is scaled down on it; the empty
    # file system beside it has room for more, yet must run the same set, or nothing pairs
    img = _ext4(tmp_path / "full.img", 64 * MIB)
    with loop_mount(img) as mnt:
        (mnt / "old").write_bytes(b"o" * (40 * MIB))
    run = run_bench(img, BenchOptions("seq", file_sizes=[65536], repeat=2, baseline=True))
    assert any("data set scaled down from 32M" in n for n in run.notes)
    assert {r.metric for r in run.results} == {"read", "write"}
    for r in run.results:
        assert r.params["files"] * 65536 == run.params["data_size"] < 20 * MIB
        assert len(r.params["baseline_values"]) == 2  # paired in both rounds
        assert r.params["relative"] > 0
