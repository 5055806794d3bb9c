"""The postmark report parser, on output captured from a real postmark run."""

from __future__ import annotations

import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

from fsage.replay.bench import BenchOptions, run_bench
from fsage.replay.bench.postmark import VARIANTS, PostmarkConfig, parse_report
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


def test_sigfpe_is_retried_with_more_transactions(
    tmp_path: Path, postmark_output: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stand-in postmark that dies of SIGFPE below 2000 transactions, like the real one does
    when its transactions finish within one second."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (tmp_path / "out.txt").write_text(postmark_output)
    fake = bindir / "postmark"
    fake.write_text(
        "#!/bin/sh\n"
        "n=$(sed -n 's/^set transactions //p' \"$1\")\n"
        f'echo "$n" >> {tmp_path}/calls\n'
        'if [ "$n" -lt 2000 ]; then kill -FPE $$; fi\n'
        f"cat {tmp_path}/out.txt\n"
    )
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    import fsage.replay.bench.target

    monkeypatch.setattr(fsage.replay.bench.target, "can_drop_caches", lambda: False)
    target = tmp_path / "t"
    target.mkdir()
    run = run_bench(target, BenchOptions("postmark", transactions=500))
    assert (tmp_path / "calls").read_text().split() == ["500", "2000"]
    assert any(
        n.startswith("postmark died of SIGFPE with 500 transactions") and n.endswith("2000")
        for n in run.notes
    )
    assert run.params["transactions"] == 2000
    values = {r.metric: r.value for r in run.results}
    assert values["transactions"] == parse_report(postmark_output).transactions_per_second
    assert os.listdir(target) == []
