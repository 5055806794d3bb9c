"""SIGTERM stops a mounted aging run as Ctrl-C does: between two ops, its journal consistent,
the image unmounted and its loop device detached, the mount point removed, exit status 143
with one line; ``--resume`` then finishes the run as the run that was never stopped."""

from __future__ import annotations

import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.ager.helpers import fsck_clean
from tests.ager.test_resume_same_run import _age, _finish, _image_targets, _ops, _stop_at

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
