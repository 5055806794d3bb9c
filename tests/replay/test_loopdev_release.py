"""A recreation's image is opened offline only once no file system holds it: a lazy unmount
(what an unmount busy for too long falls back to) leaves the file system alive while a file
on it is open, and libext2fs then finds a journal that needs recovery."""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

import pytest

from fsage.errors import FsageError
from fsage.replay.loopdev import LoopDevice

pytestmark = pytest.mark.needs_root


def test_offline_waits_for_a_lazily_unmounted_file_system(tmp_path: Path) -> None:
    img = tmp_path / "r.img"
    with open(img, "wb") as fh:
        fh.truncate(16 << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(img)], check=True)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    loop = LoopDevice(img)
    try:
        loop.mount(mnt)
        held = os.open(mnt / "open-file", os.O_CREAT | os.O_WRONLY, 0o644)
        try:
            loop.umount(mnt)  # busy: retried, then detached lazily
            assert not os.path.ismount(mnt)
            # the file system lives on while the file is open: not released
            with pytest.raises(FsageError, match="still in use"):
                loop.wait_released(seconds=0.5)
            threading.Timer(0.5, os.close, (held,)).start()
            held = -1
            loop.wait_released(seconds=10)  # released once the last file closes
        finally:
            if held >= 0:
                os.close(held)
        # and libext2fs finds it clean (e2fsck -n exits 0 on a clean file system)
        assert subprocess.run(["e2fsck", "-fn", str(img)], capture_output=True).returncode == 0
    finally:
        loop.detach()
