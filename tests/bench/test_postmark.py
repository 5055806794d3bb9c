"""The postmark report parser, on output captured from a real postmark run."""

from __future__ import annotations

import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

from fsage.replay.bench import BenchOptions, run_bench
from fsage.replay.bench.postmark import DEFAULT_VARIANT, VARIANTS, PostmarkConfig, parse_report
from tests.conftest import require_tools

FILES = 300


@pytest.fixture(scope="module")
def postmark_output(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Output of a real postmark run (more transactions whenever it dies of SIGFPE)."""
    require_tools("postmark")
    work = tmp_path_factory.mktemp("pm")
    tx = 20_000
    for _ in range(4):
        cfg = PostmarkConfig(files=FILES, transactions=tx, subdirectories=10)
        proc = subprocess.run(
            ["postmark"], input=cfg.script("."), capture_output=True, text=True, cwd=work
        )
        if proc.returncode == 0:
            return proc.stdout
        tx *= 4
    pytest.fail("postmark never ran long enough to report")


def test_parser_against_real_output(postmark_output: str) -> None:
    rep = parse_report(postmark_output)
    tx = int(re.search(r"Transactions: (\d+)", postmark_output)[1])  # type: ignore[index]
    # Every transaction creates or deletes a file (PostMark's definition); the read-or-append
    # half is skipped when the picked file is gone, so it counts at most one per transaction.
    assert 0.9 * tx < rep.read + rep.appended <= tx
    assert rep.created_alone == FILES
    assert rep.created == rep.deleted  # everything created is deleted at the end
    assert (rep.created - rep.created_alone) + (rep.deleted - rep.deleted_alone) == tx
    mixed = re.findall(r"Mixed with transactions: (\d+) files", postmark_output)
    assert [int(v) for v in mixed] == [
        rep.created - rep.created_alone,
        rep.deleted - rep.deleted_alone,
    ]
    assert rep.seconds_transactions >= 1 and rep.seconds_total >= rep.seconds_transactions
    assert rep.transactions_per_second == tx // rep.seconds_transactions
    # The data lines, independently: "<n> <unit> read (<rate> <unit> per second)".
    scale = {"bytes": 1 / 1024, "kilobytes": 1.0, "megabytes": 1024.0, "gigabytes": 1024.0**2}
    m = re.search(r"([\d.]+) (\w+) written \(([\d.]+) (\w+) per second\)", postmark_output)
    assert m is not None
    assert rep.write_kb == pytest.approx(float(m[1]) * scale[m[2]])
    assert rep.write_kb_per_second == pytest.approx(float(m[3]) * scale[m[4]])
    assert rep.read_kb > 0 and rep.write_kb > rep.read_kb  # creating files writes them


def test_parser_refuses_other_text() -> None:
    from fsage.errors import FsageError

    with pytest.raises(FsageError, match="postmark output: no 'seconds total' line"):
        parse_report("PostMark v1.51 : 8/14/01\npm>")


def test_variants_are_the_seeds_settings() -> None:
    s3 = VARIANTS["seed003"]
    assert (s3.files, s3.transactions, s3.size_low, s3.size_high, s3.subdirectories, s3.seed) == (
        500, 500, 500, 10_000, 100, 42,
    )  # fmt: skip
    assert [VARIANTS[k].files for k in ("50k", "100k", "150k")] == [50_000, 100_000, 150_000]
    assert {VARIANTS[k].transactions for k in ("50k", "100k", "150k")} == {500}
    script = s3.script(".").splitlines()
    assert script[:3] == ["set location .", "set number 500", "set transactions 500"]
    assert script[-2:] == ["run", "quit"]


def _fake_postmark(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, output: str) -> Path:
    """A stand-in postmark on PATH that keeps every configuration it is given (in
    ``configs/``) and dies of SIGFPE below 2000 transactions, as the real one does when its
    transactions finish within one second; the caches are never dropped."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (tmp_path / "configs").mkdir()
    (tmp_path / "out.txt").write_text(output)
    fake = bindir / "postmark"
    fake.write_text(
        "#!/bin/sh\n"
        f'cp "$1" {tmp_path}/configs/$(date +%s%N).cfg\n'
        "n=$(sed -n 's/^set transactions //p' \"$1\")\n"
        'if [ "$n" -lt 2000 ]; then kill -FPE $$; fi\n'
        f"cat {tmp_path}/out.txt\n"
    )
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    import fsage.replay.bench.target

    monkeypatch.setattr(fsage.replay.bench.target, "can_drop_caches", lambda: False)
    return tmp_path / "configs"


def test_sigfpe_is_one_clear_error_not_another_size(
    tmp_path: Path, postmark_output: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fsage.errors import FsageError

    configs = _fake_postmark(tmp_path, monkeypatch, postmark_output)
    target = tmp_path / "t"
    target.mkdir()
    with pytest.raises(FsageError, match=r"SIGFPE: its 500 transactions took under one second"):
        run_bench(target, BenchOptions("postmark", transactions=500))
    assert len(list(configs.iterdir())) == 1  # run once, never again with another size
    assert os.listdir(target) == []


def test_default_size_is_absolute_and_runs_for_seconds(
    tmp_path: Path, postmark_output: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default configuration is the same whatever the target (a small, nearly full one and
    a large empty one): 5,000 files of seed 003's sizes in 100 directories, 100,000
    transactions."""
    configs = _fake_postmark(tmp_path, monkeypatch, postmark_output)
    small, large = tmp_path / "small", tmp_path / "large"
    small.mkdir()
    large.mkdir()
    (small / "old").write_bytes(os.urandom(1 << 20))
    runs = [run_bench(t, BenchOptions("postmark")) for t in (small, large)]
    texts = [p.read_text() for p in sorted(configs.iterdir())]
    assert len(texts) == 2 and texts[0] == texts[1]
    assert "set number 5000\nset transactions 100000\n" in texts[0]
    assert "set subdirectories 100\n" in texts[0]
    for run in runs:
        assert run.params["variant"] == "standard"
        assert (run.params["files"], run.params["transactions"]) == (5_000, 100_000)
    assert VARIANTS[DEFAULT_VARIANT] == VARIANTS["standard"]


@pytest.mark.slow
def test_the_real_postmark_default_runs_for_seconds(tmp_path: Path) -> None:
    """Seed 003's 500 transactions took 0.06 s here; the default takes seconds (and does not
    run out of PostMark's file table)."""
    require_tools("postmark")
    import time

    t0 = time.perf_counter()
    proc = subprocess.run(
        ["postmark"],
        input=VARIANTS[DEFAULT_VARIANT].script("."),
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=True,
    )
    wall = time.perf_counter() - t0
    rep = parse_report(proc.stdout)
    assert rep.seconds_transactions >= 1 and wall >= 1.0
    assert os.listdir(tmp_path) == []
