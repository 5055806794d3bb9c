"""SIGTERM stops a mounted aging run as Ctrl-C does: between two ops, its journal consistent,
the image unmounted and its loop device detached, the mount point removed, exit status 143
with one line; ``--resume`` then finishes the run as the run that was never stopped. Other
commands that hold an image mounted unwind on it as on Ctrl-C."""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from fsage.ager.images import make_image, umount
from fsage.ager.profile import get_preset
from fsage.ager.run import AgeOptions, age
from tests.ager.helpers import fsck_clean, wait_until
from tests.ager.test_resume_same_run import _age, _finish, _image_targets, _ops, _stop_at
from tests.ager.test_stale_mounts import loop_devices_of, mounts_of
from tests.replay.test_stale_mounts import replay_mounts

MIB = 1 << 20
pytestmark = [pytest.mark.needs_root, pytest.mark.slow]


def _loops_of(image: Path) -> str:
    """What ``losetup -j`` says is attached to ``image`` (nothing: empty)."""
    done = subprocess.run(["losetup", "-j", str(image)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _mounts_of(pid: int) -> list[str]:
    """The mounts of this system on a mount point fsage named for process ``pid``."""
    text = Path("/proc/self/mountinfo").read_text()
    return [line for line in text.splitlines() if f"/fsage-age-{pid}-" in line.split()[4]]


def test_sigterm_unmounts_a_mounted_run_which_then_resumes(
    tmp_path: Path, fsage_env: dict[str, str]
) -> None:
    args = ["--profile", "hfs-surge", "--seed", "7", "--fill", "0.5", "--churn", "5"]
    args += ["--ops-limit", "2500", "--mount"]
    images = _image_targets(tmp_path)
    whole = next(images)
    _finish(_age(whole, args), fsage_env)
    img = next(images)
    pid, said = _stop_at(_age(img, args), fsage_env, img, 900, signal.SIGTERM)
    assert said.strip().splitlines()[-1] == "fsage: terminated (resume with --resume)", said
    assert "Traceback" not in said, said
    assert _mounts_of(pid) == []
    assert _loops_of(img) == ""
    assert list(Path(tempfile.gettempdir()).glob(f"fsage-age-{pid}-*")) == []
    fsck_clean(img)
    stopped = len(_ops(img))
    assert 900 <= stopped < 2500, stopped
    _finish(_age(img, ["--resume"]), fsage_env)
    assert _ops(img) == _ops(whole)
    assert _loops_of(img) == ""
    fsck_clean(img)


@pytest.mark.parametrize("command", ["replay", "noise-floor"])
def test_sigterm_unmounts_a_replay(command: str, tmp_path: Path, fsage_env: dict[str, str]) -> None:
    """Commands that hold an image mounted for long (a replay, a noise floor) unwind on
    SIGTERM as on Ctrl-C: nothing of theirs stays mounted or attached."""
    img = make_image(tmp_path / "orig.img", "ext4", 64 * MIB)
    db = tmp_path / "fsage.db"
    prof = get_preset("hfs-surge").with_overrides(fill=0.5, churn=0.5)
    res = age(img, AgeOptions(profile=prof, seed=3, db=db, snapshot_every=400, name="orig"))
    assert res.finished and len(res.snapshots) >= 3
    cmd = [sys.executable, "-m", "fsage", command, "--db", str(db), "--fs", "orig"]
    cmd += ["--runs", "2"] if command == "noise-floor" else [str(tmp_path / "rec.img")]
    env = {**fsage_env, "TMPDIR": str(tmp_path)}  # the run's mount points
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_until(lambda: bool(replay_mounts(tmp_path)), proc, "it mounted an image")
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate()
        said = err.decode()
        assert proc.returncode == 143, said
        assert said.strip().splitlines()[-1].startswith("fsage: terminated"), said
        assert "Traceback" not in said, said
        assert replay_mounts(tmp_path) == []
        assert mounts_of(tmp_path, under=True) == []
        assert loop_devices_of(tmp_path, True) == {}
        assert list(tmp_path.glob("fsage-replay-*")) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        for mnt in replay_mounts(tmp_path):
            umount(Path(mnt))
            Path(mnt).rmdir()
        for dev in loop_devices_of(tmp_path, True).values():
            subprocess.run(["losetup", "-d", dev], check=False)
