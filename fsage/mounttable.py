"""Who holds a loop device or a mount: the kernel's loop devices and mount table, and which
fsage process (by the pid in its mount point's name) a mount point belongs to. Read by the
image lock (``fsage.imagelock``) and by the clearing of stale mounts (``fsage.ager.images``)."""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass
from pathlib import Path


def process_alive(pid: int) -> bool:
    """True while process ``pid`` runs (a killed child its parent has not reaped yet, a
    zombie, is dead: it holds no lock and no mount any more)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat_line.rsplit(")", 1)[-1].split()[0] != "Z"


#: fsage's own mount points: ``fsage-<use>-<pid>-<random>`` (older versions: no pid).
_OWN_MOUNT = re.compile(r"fsage-(?:age|replay|mnt|match|unpack|bench|scan)-(?:(\d+)-)?[^-/]+")


@dataclass(frozen=True)
class _Loop:
    dev: str  # /dev/loopN
    devno: str  # major:minor, as /proc/self/mountinfo names it
    backing: str  # the backing file's path; " (deleted)" once unlinked
    autoclear: bool  # detached by the kernel at its last unmount (mount -o loop)


def _loops() -> list[_Loop]:
    out = []
    for sysdir in Path("/sys/block").glob("loop*"):
        try:
            backing = (sysdir / "loop" / "backing_file").read_text().rstrip("\n")
            devno = (sysdir / "dev").read_text().strip()
            autoclear = (sysdir / "loop" / "autoclear").read_text().strip() == "1"
        except OSError:  # not attached
            continue
        out.append(_Loop(f"/dev/{sysdir.name}", devno, backing, autoclear))
    return out


def _mounts() -> dict[str, list[str]]:
    """{major:minor: mount points} of this mount namespace."""
    out: dict[str, list[str]] = {}
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as fh:
        for line in fh:
            f = line.split()
            mnt = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), f[4])
            out.setdefault(f[2], []).append(mnt)
            # btrfs shows an anonymous device (0:N): its loop device is the mount's source.
            src = f[f.index("-") + 2] if "-" in f else ""
            if f[2].startswith("0:") and src.startswith("/dev/loop"):
                with contextlib.suppress(OSError):
                    dev = Path("/sys/block", src[5:], "dev").read_text().strip()
                    out.setdefault(dev, []).append(mnt)
    return out


def _owner(mountpoint: str) -> int | bool:
    """Who made ``mountpoint``: the pid of a live fsage process, False for a stale mount of
    fsage's (its process is gone, or an older fsage that did not say), True for anything not
    fsage's own."""
    m = _OWN_MOUNT.fullmatch(os.path.basename(mountpoint))
    if m is None:
        return True
    if m[1] is None:
        return False
    pid = int(m[1])
    return pid if process_alive(pid) else False


def _pid_named(mountpoint: str) -> bool:
    m = _OWN_MOUNT.fullmatch(os.path.basename(mountpoint))
    return m is not None and m[1] is not None
