"""A kernel-path match killed (SIGKILL) in the middle of its fill goes on with that fill on
``fsage age IMG --resume``: the files it had written stay where they are (the same inode and
modification time, as ``os.stat`` sees them on a read-only mount before and after), rather
than being deleted and written again, and the match ends as one never stopped would."""

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

from fsage.ager.match import AREA, Matcher
from fsage.cli import main
from tests.ager.fragmented import fragmented_target
from tests.ager.helpers import fsck_clean

MIB = 1 << 20


def _stats(area: Path, root: Path) -> dict[str, tuple[int, int]]:
    """path -> (inode, mtime in ns) of the matcher's files holding data under ``area``
    (paths relative to ``root``), spacers left out."""
    out: dict[str, tuple[int, int]] = {}
    for d, _dirs, names in os.walk(area):
        for n in names:
            st = os.lstat(os.path.join(d, n))
            if st.st_size and not n.startswith("s"):
                out[os.path.relpath(os.path.join(d, n), root)] = (st.st_ino, st.st_mtime_ns)
    return out


def _written(image: Path) -> dict[str, tuple[int, int]]:
    """``_stats`` of the matcher's area on a read-only mount of ``image``."""
    from fsage.ager.images import loop_mount

    with loop_mount(image, options="ro") as mnt:
        return _stats(mnt / AREA, mnt)


@pytest.mark.slow
@pytest.mark.needs_root
def test_a_match_killed_in_its_fill_goes_on_with_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fsage.ager.images import clear_stale_mounts, make_image

    size = 512 * MIB
    spec = tmp_path / "t.json"
    spec.write_text(
        json.dumps(fragmented_target(tmp_path / "target.img", size, "fragmented").to_json())
    )
    img = make_image(tmp_path / "a.img", "ext4", size)
    record = img.with_name(img.name + ".fsage-age")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    argv = [sys.executable, "-m", "fsage", "age", str(img), "--match", str(spec), "--mount"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        # Killed once the record says the fill is writing its planned files and the journal
        # holds a few hundred writes of them (after the files made ahead, empty).
        while proc.poll() is None:
            found = sorted(tmp_path.glob("a.img.fsage-age.*.ops.jsonl"))
            if found and found[0].read_bytes().count(b'{"op":"append"') > 300 and record.exists():
                with open(record) as fh:
                    fill = json.load(fh).get("fill") or {}
                if fill.get("step") == "files":
                    break
            time.sleep(0.02)
        assert proc.poll() is None, "the match ended before it could be killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        clear_stale_mounts(img)
    rec = json.loads(record.read_text())
    assert rec["phase"] == "fill" and rec["fill"]["step"] == "files", rec
    before = _written(img)
    assert len(before) > 100

    # What the resumed fill left when it ended, read through the match's own mount: the
    # rounds after it may draw a second fill (a stalled first one is cleared, as in a match
    # never stopped), so the files are judged where the resumed fill hands over.
    at_fill_end: dict[str, tuple[int, int]] = {}
    fills: list[int] = []
    phase = Matcher._phase

    def watch(self: Matcher, name: str) -> None:
        if name == "rounds" and not fills:
            area = getattr(self.disk, "area", None)
            assert area is not None, "the resumed match is not on a mounted disk"
            at_fill_end.update(_stats(Path(area), Path(area).parent))
        if name == "rounds":
            fills.append(self.fills)
        phase(self, name)

    monkeypatch.setattr(Matcher, "_phase", watch)
    r = CliRunner().invoke(main, ["age", str(img), "--resume", "--format", "json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.output[r.output.index("{") :])
    assert res["resumed"]
    assert any("resumed in its fill" in n for n in res["notices"]), res["notices"]
    rep = res["report"]
    assert res["measured_by"].startswith("the offline reader")
    assert rep["buckets_ok"] and rep["fullness_ok"], res["stop"]
    fsck_clean(img)
    # Every file written whole before the kill is there as it was when the fill ends (a file
    # cut short by the kill is written again: at most the few being written then).
    assert fills, "the resumed fill never handed over to the rounds"
    same = sum(1 for p, st in before.items() if at_fill_end.get(p) == st)
    assert same >= len(before) - 8, (same, len(before))
    if fills == [1]:
        # No second fill: the rounds move a few of them at most.
        after = _written(img)
        same = sum(1 for p, st in before.items() if after.get(p) == st)
        assert same >= 0.75 * len(before), (same, len(before))
