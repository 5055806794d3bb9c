"""An image attached to a loop device and mounted, for the tests that read a mounted source."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def mounted_loop(image: Path, mnt: Path) -> Iterator[str]:
    """Attach ``image`` to a free loop device, mount it on ``mnt`` (made here) and yield the
    device; unmount and detach afterwards, whatever happened."""
    dev = subprocess.run(
        ["losetup", "-f", "--show", str(image)], check=True, capture_output=True, text=True
    ).stdout.strip()
    mnt.mkdir()
    try:
        subprocess.run(["mount", dev, str(mnt)], check=True)
        try:
            yield dev
        finally:
            umount_patiently(mnt)
    finally:
        subprocess.run(["losetup", "-d", dev], check=False)


def umount_patiently(mnt: Path) -> None:
    """Unmount, waiting out a process that still has the mount open (a watchdog exiting)."""
    for _ in range(50):
        if subprocess.run(["umount", str(mnt)], check=False).returncode == 0:
            return
        time.sleep(0.1)
    subprocess.run(["umount", "-l", str(mnt)], check=False)
