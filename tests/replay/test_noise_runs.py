"""The runs a noise floor is measured from: the op stream run the way a replay runs it (one
loop device, remounted with the system calls at every snapshot marker but the last), with no
mount(8), and nothing left behind."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

import fsage.ager.images as images
from fsage.ager.images import loop_mount, make_image
from fsage.replay import loopdev
from fsage.replay.recreate import run_op_stream
from fsage.workload import Op

MIB = 1 << 20

OPS = [
    Op("mkdir", "d"),
    Op("create", "d/a", size=3 * MIB),
    Op("create", "d/b", size=5000),
    Op("snapshot", label="1"),
    Op("delete", "d/a"),
    Op("create", "d/c", size=2 * MIB),
    Op("snapshot", label="2"),
    Op("append", "d/b", size=100),
    Op("create", "d/huge", size=64 * MIB),  # does not fit: skipped, not fatal
    Op("snapshot", label="3"),
]


@pytest.mark.needs_root
def test_a_run_remounts_one_loop_device_between_intervals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    real_mount, real_umount = loopdev.LoopDevice.mount, loopdev.LoopDevice.umount

    def mount(self: Any, mnt: Path) -> None:
        calls.append(f"mount {self.dev}")
        real_mount(self, mnt)

    def umount(self: Any, mnt: Path) -> None:
        calls.append(f"umount {self.dev}")
        real_umount(self, mnt)

    def no_tool(*_a: Any, **_k: Any) -> None:
        raise AssertionError("mount(8) or umount(8) was run")

    monkeypatch.setattr(loopdev.LoopDevice, "mount", mount)
    monkeypatch.setattr(loopdev.LoopDevice, "umount", umount)
    monkeypatch.setattr(images, "mount", no_tool)
    monkeypatch.setattr(images, "umount", no_tool)
    image = make_image(tmp_path / "run.img", "ext4", 32 * MIB)
    counts = run_op_stream(image, OPS, mode="mount")
    assert counts.ops == len(OPS) - 3 and counts.nospace == 1 and counts.failed == 0
    assert counts.bytes_written == 3 * MIB + 5000 + 2 * MIB + 100
    # The first mount, a remount after markers 1 and 2 (not after the last), the final unmount.
    devs = {c.split()[1] for c in calls}
    assert len(devs) == 1
    assert [c.split()[0] for c in calls] == [
        "mount",
        "umount",
        "mount",
        "umount",
        "mount",
        "umount",
    ]
    monkeypatch.undo()
    with loop_mount(image) as mnt:
        assert sorted(os.listdir(mnt / "d")) == ["b", "c"]
        assert os.path.getsize(mnt / "d/b") == 5100
    with open("/proc/self/mountinfo") as fh:
        assert str(tmp_path) not in fh.read()
