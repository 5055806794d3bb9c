"""A match is recorded like any aging run: stopped (killed, or Ctrl-C), ``fsage age IMG
--resume`` finishes it, the image passes e2fsck, and its journal (which holds every op that
took effect, the stopped part included) runs again with ``fsage age OTHER --ops``: offline
to the same blocks for every file (debugfs) and the same free space (e2freefrag); through
the kernel to the same tree (its allocator places blocks differently from run to run)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from fsage.ager.match import AREA, FREE_TV, target_from_layout
from fsage.cli import main
from fsage.snapshotter.ext import read_ext_layout
from tests.ager.fragmented import fragmented_target

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
    # Stopped in its fill's planned files, the fill went on from them: the files it had
    # written stay (the rounds after may move a few), not deleted to be written again.
    cleared = {o["path"] for o in ops[len(stopped) :] if o["op"] == "delete"}
    made = {o["path"] for o in stopped if o["op"] == "create" and int(str(o.get("size", 0))) > 0}
    assert made and len(made & cleared) <= len(made) // 4, (len(made), len(made & cleared))

    r = CliRunner().invoke(main, ["age", str(other), "--ops", str(journal), "--offline"])
    assert r.exit_code == 0, r.output
    matched, replayed = _files(img), _files(other)
    assert len(matched) > 300
    assert matched == replayed
    assert _free(img) == _free(other)


@pytest.mark.slow
@pytest.mark.needs_root
def test_a_killed_mounted_match_resumes(tmp_path: Path) -> None:
    from fsage.ager.images import clear_stale_mounts, make_image

    size = 512 * MIB
    spec = tmp_path / "t.json"
    spec.write_text(
        json.dumps(fragmented_target(tmp_path / "target.img", size, "fragmented").to_json())
    )
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
        # And the free space: the target's two large holes (half a group and nearly a whole
        # one) are spacers of the fill, allocated first, on the kernel path too.
        assert rep["free_tv"] is not None and rep["free_tv"] <= FREE_TV, res["stop"]
        assert res["matched"], res["reasons"]
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


@pytest.mark.slow
def test_a_match_stopped_in_its_rounds_resumes_from_its_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stopped once its fill is done, a match resumed keeps the files on disk and goes on
    with its rounds: no file of the fill is deleted and written again, and the journal of
    both parts still runs again to the same blocks."""
    from fsage.ager.match import Matcher

    spec = _holes_target(tmp_path)
    img, other = _ext4(tmp_path / "a.img", 64 * MIB), _ext4(tmp_path / "b.img", 64 * MIB)
    real_snapshot = Matcher.snapshot

    def snapshot(self: Matcher) -> object:
        raise KeyboardInterrupt  # the first round's read: the fill is done

    monkeypatch.setattr(Matcher, "snapshot", snapshot)
    r = CliRunner().invoke(main, ["age", str(img), "--match", str(spec), "--offline"])
    assert r.exit_code == 130, r.output
    monkeypatch.setattr(Matcher, "snapshot", real_snapshot)
    rec = _record(img)
    assert rec["finished"] is False and rec["phase"] == "rounds"
    journal = Path(str(rec["journal"]))
    stopped = _journal_ops(journal)
    filled = {str(o["path"]) for o in stopped if o["op"] == "create"}
    on_disk = _files(img)
    assert len(on_disk) > 300

    r = CliRunner().invoke(main, ["age", str(img), "--resume", "--format", "json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.output[r.output.index("{") :])
    assert res["resumed"] and res["matched"], res["stop"]
    assert any("resumed in its rounds" in n for n in res["notices"]), res["notices"]
    _fsck(img)
    ops = _journal_ops(journal)
    assert ops[: len(stopped)] == stopped
    later = ops[len(stopped) :]
    # The fill's files stay where they were (a fill drawn again would delete them all and
    # write them again at the same paths).
    assert not {str(o["path"]) for o in later if o["op"] == "create"} & filled
    deleted = {str(o["path"]) for o in later if o["op"] == "delete"}
    assert len(deleted) < len(filled) / 2
    after = _files(img)
    kept = [p for p in on_disk if p not in deleted]
    assert kept and all(after[p] == on_disk[p] for p in kept)

    r = CliRunner().invoke(main, ["age", str(other), "--ops", str(journal), "--offline"])
    assert r.exit_code == 0, r.output
    assert _files(other) == after
    assert _free(other) == _free(img)


@pytest.mark.slow
@pytest.mark.needs_root
def test_matched_mounted_but_not_unmounted_mounts_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kernel-path match that the state left on disk does not bear out (here: the first
    reading after unmount made to show one huge hole) mounts the image again and goes on
    with its rounds from its files; the record ends finished and the journal holds both."""
    import fsage.ager.match as m
    from fsage.ager.images import make_image

    spec = tmp_path / "t.json"
    spec.write_text(_holes_target(tmp_path).read_text())
    target = m.LayoutTarget.from_json(json.loads(spec.read_text()), "t")
    img = make_image(tmp_path / "a.img", "ext4", 64 * MIB)
    real = m.measure
    calls = [0]

    def measure(layout: object) -> object:
        st = real(layout)  # type: ignore[arg-type]
        calls[0] += 1
        if calls[0] == 1:
            st.target.free = {20: 1}
        return st

    monkeypatch.setattr(m, "measure", measure)
    said: list[str] = []
    copy = tmp_path / "ops.jsonl"
    res = m.match_layout(img, target, seed=1, mode="mount", say=said.append, journal=copy)
    assert calls[0] == 2
    assert any("mounted again" in s for s in said), said
    assert any("mounted again" in n for n in res.notices), res.notices
    assert res.matched and res.measured_by == "the offline reader after unmount", res.stop
    assert _record(img)["finished"] is True
    _fsck(img)
    assert copy.read_bytes() == Path(res.journal).read_bytes()
    # Its area was not cleared to be filled again (a clear deletes the area itself).
    assert not [o for o in _journal_ops(copy) if o["op"] == "delete" and o["path"] == AREA]
