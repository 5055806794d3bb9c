"""A match is recorded like any aging run: stopped (killed, or Ctrl-C), ``fsage age IMG
--resume`` finishes it, the image passes e2fsck, and its journal (which holds every op that
took effect, the stopped part included) runs again with ``fsage age OTHER --ops``: offline
to the same blocks for every file (debugfs) and the same free space (e2freefrag); through
the kernel to the same tree (its allocator places blocks differently from run to run)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from fsage.ager.match import target_from_layout
from fsage.cli import main
from fsage.snapshotter.ext import read_ext_layout

MIB = 1 << 20
_SEED = "0c1f9e1c-55b1-4f43-9a3e-5f0b8f6c2d11"


def _ext4(path: Path, size: int, tree: Path | None = None) -> Path:
    subprocess.run(["truncate", "-s", str(size), str(path)], check=True)
    argv = ["mke2fs", "-q", "-F", "-t", "ext4", "-b", "4096", "-U", "clear"]
    argv += ["-E", f"hash_seed={_SEED}"]
    if tree is not None:
        argv += ["-d", str(tree)]
    subprocess.run([*argv, str(path)], check=True)
    return path


def _files(image: Path) -> dict[str, tuple[int, str]]:
    """path -> (size, the blocks debugfs lists) of every regular file below /fsage-match."""
    out: dict[str, tuple[int, str]] = {}
    stack = ["/fsage-match"]
    while stack:
        d = stack.pop()
        ls = subprocess.run(
            ["debugfs", "-R", f"ls -p {d}", str(image)], capture_output=True, text=True, check=True
        ).stdout
        names: list[tuple[str, int]] = []
        for line in ls.splitlines():
            parts = line.strip().strip("/").split("/")
            if len(parts) < 5 or parts[4] in (".", ".."):
                continue
            path = f"{d}/{parts[4]}"
            if int(parts[1], 8) & 0o040000:
                stack.append(path)
            else:
                names.append((path, int(parts[5] or 0)))
        if not names:
            continue
        cmds = "".join(f"blocks {p}\n" for p, _ in names)
        got = subprocess.run(
            ["debugfs", "-f", "-", str(image)], input=cmds, capture_output=True, text=True
        ).stdout.split("debugfs: ")[1:]
        assert len(got) == len(names)
        for (p, size), chunk in zip(names, got, strict=True):
            out[p] = (size, chunk.partition("\n")[2].strip())
    return out


def _fsck(image: Path) -> None:
    r = subprocess.run(["e2fsck", "-fn", str(image)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def _free(image: Path) -> list[str]:
    out = subprocess.run(["e2freefrag", str(image)], capture_output=True, text=True, check=True)
    return [line for line in out.stdout.splitlines() if not line.startswith("Device")]


def _record(image: Path) -> dict[str, object]:
    data = json.loads(image.with_name(image.name + ".fsage-age").read_text())
    assert isinstance(data, dict)
    return data


def _journal_ops(journal: Path) -> list[dict[str, object]]:
    """The journal's complete op lines (a killed run may have left its last one torn)."""
    lines = journal.read_text().split("\n")[1:-1]
    return [json.loads(line) for line in lines if line.strip()]


def _holes_target(tmp_path: Path) -> Path:
    tree = tmp_path / "tree"
    for i in range(400):
        (tree / f"d{i % 7}").mkdir(parents=True, exist_ok=True)
        (tree / f"d{i % 7}" / f"f{i:03d}").write_bytes(b"t" * (4096 * (1 + (i * 37) % 60) + 5))
    timg = _ext4(tmp_path / "t.img", 64 * MIB, tree)
    rm = "".join(f"rm /d{i % 7}/f{i:03d}\n" for i in range(0, 400, 5))
    subprocess.run(["debugfs", "-w", "-f", "-", str(timg)], input=rm, text=True, check=True,
                   capture_output=True)  # fmt: skip
    spec = tmp_path / "t.json"
    spec.write_text(json.dumps(target_from_layout(read_ext_layout(timg), "t").to_json()))
    return spec


@pytest.mark.slow
def test_an_interrupted_offline_match_resumes_and_replays_to_the_same_blocks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fsage.ager.offline import OfflineExtExecutor

    spec = _holes_target(tmp_path)
    img, other = _ext4(tmp_path / "a.img", 64 * MIB), _ext4(tmp_path / "b.img", 64 * MIB)
    # Ctrl-C in the middle of the fill: the executor is stopped between two ops.
    real_apply = OfflineExtExecutor.apply
    calls = [0]

    def apply(self: OfflineExtExecutor, op: object) -> int:
        calls[0] += 1
        if calls[0] == 300:
            raise KeyboardInterrupt
        return real_apply(self, op)  # type: ignore[arg-type]

    monkeypatch.setattr(OfflineExtExecutor, "apply", apply)
    db = tmp_path / "runs.db"
    r = CliRunner().invoke(
        main, ["age", str(img), "--match", str(spec), "--offline", "--db", str(db)]
    )
    assert r.exit_code == 130, r.output
    monkeypatch.setattr(OfflineExtExecutor, "apply", real_apply)
    rec = _record(img)
    assert rec["finished"] is False and rec["clean"] is True
    journal = Path(str(rec["journal"]))
    stopped = _journal_ops(journal)
    assert 200 < len(stopped) < 300
    _fsck(img)  # stopped between two ops, closed: consistent
    # A new match on it is refused until the stopped one is resumed (or forced).
    r = CliRunner().invoke(main, ["age", str(img), "--match", str(spec), "--offline"])
    assert r.exit_code != 0 and "--resume" in r.output
    # Killed offline (the record not clean): refused in one line, libext2fs's state is lost.
    record_file = img.with_name(img.name + ".fsage-age")
    record_file.write_text(json.dumps({**rec, "clean": False}))
    r = CliRunner().invoke(main, ["age", str(img), "--resume"])
    assert r.exit_code != 0 and "cannot be resumed" in r.output
    assert len(r.output.strip().splitlines()) == 1, r.output
    record_file.write_text(json.dumps(rec))
    # It goes on as it began: another seed, or another way to reach the image, is refused.
    for extra, why in ((["--seed", "5"], "seed 0"), (["--mount"], "ran offline, not mount")):
        r = CliRunner().invoke(main, ["age", str(img), "--resume", *extra])
        assert r.exit_code != 0 and why in r.output, r.output

    r = CliRunner().invoke(main, ["age", str(img), "--resume", "--format", "json", "--db", str(db)])
    assert r.exit_code == 0, r.output
    res = json.loads(r.output[r.output.index("{") :])
    assert res["resumed"] and res["matched"], res["stop"]
    assert _record(img)["finished"] is True
    _fsck(img)
    # Both parts are aging runs of the database, as any `fsage age` run is.
    import sqlite3

    with sqlite3.connect(db) as con:
        rows = con.execute("SELECT kind, status FROM aging_runs ORDER BY id").fetchall()
    assert rows == [("match-offline-ext", "interrupted"), ("match-offline-ext", "finished")]
    ops = _journal_ops(journal)
    assert ops[: len(stopped)] == stopped  # the stopped part stays in the journal
    cleared = {o["path"] for o in ops[len(stopped) :] if o["op"] == "delete"}
    made = {o["path"] for o in stopped if o["op"] in ("create", "mkdir")}
    assert made <= cleared  # its files were deleted, journaled

    r = CliRunner().invoke(main, ["age", str(other), "--ops", str(journal), "--offline"])
    assert r.exit_code == 0, r.output
    matched, replayed = _files(img), _files(other)
    assert len(matched) > 300
    assert matched == replayed
    assert _free(img) == _free(other)


def _fragment(root: Path, fill: float, seed: int) -> None:
    """Small files made four at a time with their blocks allocated in turn, larger files
    written whole, then 30% of the larger ones deleted: a fragmented target."""
    rng = random.Random(seed)
    buf = b"z" * 4096
    n = 0
    big: list[Path] = []
    (root / "t").mkdir()
    while True:
        v = os.statvfs(root)
        if (v.f_blocks - v.f_bfree) / v.f_blocks >= fill:
            break
        d = root / "t" / f"{n // 200:04d}"
        d.mkdir(exist_ok=True)
        if rng.random() < 0.75:
            sizes = [rng.randint(2, 16) for _ in range(4)]
            fds = [os.open(d / f"s{n}_{j}", os.O_CREAT | os.O_WRONLY) for j in range(4)]
            for b in range(max(sizes)):
                for fd, sz in zip(fds, sizes, strict=True):
                    if b < sz and (b == 0 or rng.random() < 0.75):
                        os.posix_fallocate(fd, b * 4096, 4096)
            for fd, sz in zip(fds, sizes, strict=True):
                os.write(fd, buf * sz)
                os.close(fd)
        else:
            p = d / f"l{n}"
            p.write_bytes(buf * rng.randint(17, 256))
            big.append(p)
        n += 1
    for p in big:
        if rng.random() < 0.3:
            p.unlink()
    os.sync()


@pytest.mark.slow
@pytest.mark.needs_root
def test_a_killed_mounted_match_resumes(tmp_path: Path) -> None:
    from fsage.ager.images import clear_stale_mounts, loop_mount, make_image
    from fsage.snapshotter import read_source

    # 512 MiB: on smaller images of this target the kernel's allocator leaves the free
    # space unmatched in about half the runs, killed or not.
    size = 512 * MIB
    src = make_image(tmp_path / "target.img", "ext4", size)
    with loop_mount(src) as mnt:
        _fragment(mnt, 0.7, seed=3)
    spec = tmp_path / "t.json"
    spec.write_text(json.dumps(target_from_layout(read_source(src), "fragmented").to_json()))
    img = make_image(tmp_path / "a.img", "ext4", size)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    argv = [sys.executable, "-m", "fsage", "age", str(img), "--match", str(spec), "--mount"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        # Killed once its journal holds a few hundred ops: in the middle of the fill. No time
        # limit of its own (reading the target takes minutes on a loaded machine): the run
        # ending first ends the wait, pytest's timeout bounds it.
        journal: Path | None = None
        while proc.poll() is None:
            found = sorted(tmp_path.glob("a.img.fsage-age.*.ops.jsonl"))
            if found and found[0].read_bytes().count(b"\n") > 400:
                journal = found[0]
                break
            time.sleep(0.02)
        assert proc.poll() is None, "the match ended before it could be killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert journal is not None
        rec = _record(img)
        assert rec["finished"] is False and rec["clean"] is False
        # ext4's reserve, lifted on fsage's own mount, is a parameter of the journal.
        header = json.loads(journal.read_text().partition("\n")[0])["fsage_workload"]
        assert header["params"]["ext4_reserved_clusters"] == 0
        stopped = _journal_ops(journal)

        r = CliRunner().invoke(main, ["age", str(img), "--resume", "--format", "json"])
        assert r.exit_code == 0, r.output
        res = json.loads(r.output[r.output.index("{") :])
        assert res["resumed"] and Path(res["journal"]) == journal
        rep = res["report"]
        # Judged after unmount by the offline reader: every size bucket and the fullness.
        assert res["measured_by"].startswith("the offline reader")
        assert rep["buckets_ok"] and rep["fullness_ok"], res["stop"]
        # The free space within a loose bound: the kernel's allocator leaves some runs, killed
        # or not, just short of the 0.1 a match needs (test_match.py judges that part).
        assert rep["free_tv"] is not None and rep["free_tv"] <= 0.2, res["stop"]
        assert res["matched"] or res["reasons"]  # else it says which dimension failed
        assert _record(img)["finished"] is True
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        clear_stale_mounts(img)  # what the killed run left mounted, when the resume failed
    _fsck(img)
    ops = _journal_ops(journal)
    assert ops[: len(stopped) - 1] == stopped[:-1]

    other = make_image(tmp_path / "b.img", "ext4", size)
    r = CliRunner().invoke(main, ["age", str(other), "--ops", str(journal), "--mount"])
    assert r.exit_code == 0, r.output
    _fsck(other)
    matched, replayed = _files(img), _files(other)
    assert len(matched) > 300
    # The same files of the same sizes; where the kernel put their blocks may differ.
    assert {p: s for p, (s, _) in matched.items()} == {p: s for p, (s, _) in replayed.items()}
