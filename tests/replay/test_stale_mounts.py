"""`fsage replay` and `fsage noise-floor` killed with SIGKILL leave their mount and loop device
behind; the next replay must clear both (a replay to the same target: its mount of the part
image; any run: the mounts of fsage processes that are gone)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fsage.ager.images import make_image, umount
from fsage.ager.profile import get_preset
from fsage.ager.run import AgeOptions, age
from tests.ager.test_stale_mounts import (
    in_namespace,
    kill_when_mounted,
    loop_devices_of,
    loops_of,
    mounts_of,
    private_mounts,
)

MIB = 1 << 20


def replay_mounts(tmp: Path, ns: int | None = None) -> list[str]:
    """The fsage-replay mount points below ``tmp`` (the runs' TMPDIR), in the mount namespace
    of process ``ns`` (else this process's)."""
    out = []
    for line in Path(f"/proc/{ns or 'self'}/mountinfo").read_text().splitlines():
        mnt = line.split()[4]
        if mnt.startswith(f"{tmp}/fsage-replay-"):
            out.append(mnt)
    return out


@pytest.mark.needs_root
@pytest.mark.slow
def test_a_killed_replay_and_noise_floor_leave_nothing_mounted_after_the_next_replay(
    tmp_path: Path, fsage_env: dict[str, str]
) -> None:
    img = make_image(tmp_path / "orig.img", "ext4", 64 * MIB)
    db = tmp_path / "fsage.db"
    prof = get_preset("hfs-surge").with_overrides(fill=0.5, churn=0.5)
    res = age(img, AgeOptions(profile=prof, seed=3, db=db, snapshot_every=400, name="orig"))
    assert res.finished and len(res.snapshots) >= 3
    fsage = [sys.executable, "-m", "fsage"]
    target = tmp_path / "rec.img"
    part = tmp_path / ".rec.img.fsage-part"
    replay = [*fsage, "replay", "--db", str(db), "--fs", "orig", str(target)]
    noise = [*fsage, "noise-floor", "--db", str(db), "--fs", "orig", "--runs", "2"]
    env = {**fsage_env, "TMPDIR": str(tmp_path)}  # the runs' mount points
    try:
        # Other fsage runs on the machine clear the mounts of dead fsage processes they see:
        # the runs here live in a mount namespace of the test's own.
        with private_mounts() as ns:
            # each killed run leaves its mount; the next run of either kind clears it
            left_noise = kill_when_mounted(noise, env, tmp_path, "fsage-replay-", True, 0, ns=ns)
            assert replay_mounts(tmp_path, ns) == [left_noise]
            left = kill_when_mounted(replay, env, part, "fsage-replay-", pause=0, ns=ns)
            assert replay_mounts(tmp_path, ns) == [left]
            done = subprocess.run(in_namespace(ns, replay), env=env, capture_output=True, text=True)
            assert done.returncode == 0, done.stderr
            assert "left behind by an fsage run that was killed" in done.stderr, done.stderr
            assert mounts_of(part, ns=ns) == [] and loops_of(part) == []
            assert replay_mounts(tmp_path, ns) == []
            assert mounts_of(tmp_path, under=True, ns=ns) == []
            assert not os.path.exists(left) and not os.path.exists(left_noise)
        fsck = subprocess.run(["e2fsck", "-fn", str(target)], capture_output=True, text=True)
        assert fsck.returncode == 0, fsck.stdout
    finally:
        for mnt in replay_mounts(tmp_path):
            umount(Path(mnt))
            Path(mnt).rmdir()
        for dev in loop_devices_of(tmp_path, True).values():
            subprocess.run(["losetup", "-d", dev], check=False)
