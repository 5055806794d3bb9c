"""`fsage workload generate` and `fsage age` end to end, including Ctrl-C and --resume."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from click.testing import CliRunner

from fsage.cli import main
from fsage.workload import read_workload
from tests.ager.helpers import record_written_since, wait_until

REPO = Path(__file__).resolve().parents[2]


def _tree(root: Path) -> dict[str, int]:
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for f in files:
            p = Path(dirpath) / f
            if not f.startswith(".fsage"):
                out[str(p.relative_to(root))] = p.stat().st_size
        for d in dirs:
            out[str((Path(dirpath) / d).relative_to(root)) + "/"] = -1
    return out


def test_generate_is_byte_identical(tmp_path: Path) -> None:
    r = CliRunner()
    args = ["workload", "generate", "--profile", "hfs-aging", "--seed", "4", "--capacity", "32M"]
    a = r.invoke(main, [*args, "-o", str(tmp_path / "a.jsonl.gz")])
    b = r.invoke(main, [*args, "-o", str(tmp_path / "b.jsonl.gz")])
    assert a.exit_code == 0 and b.exit_code == 0, a.output
    assert (tmp_path / "a.jsonl.gz").read_bytes() == (tmp_path / "b.jsonl.gz").read_bytes()
    assert "10000 ops" in a.output
    show = r.invoke(main, ["workload", "show", str(tmp_path / "a.jsonl.gz")])
    assert show.exit_code == 0 and "10000 ops" in show.output


def test_age_errors_are_one_line(tmp_path: Path) -> None:
    r = CliRunner()
    res = r.invoke(main, ["age", "/", "--profile", "hfs-surge"])
    assert res.exit_code != 0 and "fsage: error: refusing to age '/'" in res.output
    res = r.invoke(main, ["age", str(tmp_path)])
    assert res.exit_code == 2 and "exactly one of --profile or --ops" in res.output
    res = r.invoke(main, ["age", str(tmp_path), "--profile", "nope"])
    assert res.exit_code == 1 and "unknown profile 'nope'" in res.output
    assert "Traceback" not in res.output


def test_interrupt_and_resume_give_the_uninterrupted_tree(tmp_path: Path) -> None:
    ops = tmp_path / "ops.jsonl"
    r = CliRunner()
    gen = r.invoke(
        main,
        ["workload", "generate", "--profile", "hfs-surge", "--seed", "2", "--capacity", "48M",
         "--churn", "3", "-o", str(ops)],
    )  # fmt: skip
    assert gen.exit_code == 0, gen.output
    whole = tmp_path / "whole"
    whole.mkdir()
    assert r.invoke(main, ["age", str(whole), "--ops", str(ops)]).exit_code == 0

    part = tmp_path / "part"
    part.mkdir()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    cmd = [sys.executable, "-m", "fsage", "age", str(part), "--ops", str(ops), "--fsync"]
    since = time.time()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def running() -> bool:  # ops run (the journal beside the target), Ctrl-C is handled
        journals = list(tmp_path.glob("part.fsage-age.*.ops.jsonl"))
        return (
            bool(journals)
            and journals[0].read_bytes().count(b"\n") > 20
            and record_written_since(part, since)
        )

    wait_until(running, proc, "20 ops ran")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate()
    total = sum(1 for _ in read_workload(ops)[1])
    assert proc.returncode == 130, err
    assert b"interrupted" in out and b"ended by Ctrl-C" in out, out
    assert b"resume with --resume" in err
    assert not (part / ".fsage-age").exists()  # the record is kept outside the target
    again = r.invoke(main, ["age", str(part), "--ops", str(ops)])
    assert again.exit_code == 2 and "--resume" in again.output
    res = r.invoke(main, ["age", str(part), "--ops", str(ops), "--resume"])
    assert res.exit_code == 0, res.output
    assert f"{total} ops" in res.output
    assert _tree(part) == _tree(whole)


def test_age_with_profile_and_snapshots(tmp_path: Path) -> None:
    img = tmp_path / "e.img"
    with open(img, "wb") as fh:
        fh.truncate(48 << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-b", "4096", str(img)], check=True)
    db = tmp_path / "f.db"
    r = CliRunner()
    res = r.invoke(
        main,
        ["age", str(img), "--profile", "hfs-surge", "--fill", "0.5", "--churn", "0.5",
         "--db", str(db), "--snapshot-every", "500", "--format", "json"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    from fsage.db.store import Store

    with Store.open(db) as store:
        rows = store.snapshots()
    assert len(rows) >= 3
    assert rows[0].op_count == 0 and rows[0].bytes_written == 0
    assert [r.op_count for r in rows] == sorted(r.op_count for r in rows)
    assert rows[-1].bytes_written and rows[-1].bytes_written > (48 << 20) * 0.5
