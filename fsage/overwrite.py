"""What a command that makes a file system would destroy: say it and refuse, unless forced.

Like mke2fs, fsage does not make a file system over an existing non-empty file or over a
device that holds a recognisable file system unless told to (``--force``), and never over a
mounted one.
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

from fsage.errors import UnsafeTargetError
from fsage.text import from_disk, shown

_EXT_SB = 1024
_EXT_MAGIC = b"\x53\xef"


def _ext_description(head: bytes) -> str | None:
    sb = head[_EXT_SB : _EXT_SB + 1024]
    if len(sb) < 1024 or sb[56:58] != _EXT_MAGIC:
        return None
    compat, incompat = int.from_bytes(sb[92:96], "little"), int.from_bytes(sb[96:100], "little")
    kind = "ext4" if incompat & 0x2C0 else ("ext3" if compat & 0x4 else "ext2")
    label = from_disk(sb[120:136].split(b"\0", 1)[0])
    u = sb[104:120].hex()
    uuid = f"{u[:8]}-{u[8:12]}-{u[12:16]}-{u[16:20]}-{u[20:]}"
    named = f" labelled {shown(label)!r}" if label else ""
    return f"an {kind} file system{named} (uuid {uuid})"


def _blkid(path: Path) -> str | None:
    try:
        res = subprocess.run(
            ["blkid", "-p", "-c", "/dev/null", "-o", "export", str(path)],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    found = dict(line.split("=", 1) for line in res.stdout.splitlines() if "=" in line)
    kind = found.get("TYPE") or found.get("PTTYPE")
    if not kind:
        return None
    what = "partition table" if "PTTYPE" in found and "TYPE" not in found else "file system"
    return f"a {shown(kind)} {what}"


def existing_contents(path: Path) -> str | None:
    """What ``path`` holds that making a file system there would destroy (None: nothing)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UnsafeTargetError(f"{path}: {exc.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        raise UnsafeTargetError(f"{path} is a directory")
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISBLK(st.st_mode)):
        raise UnsafeTargetError(f"{path} is neither a regular file nor a block device")
    if stat.S_ISREG(st.st_mode) and st.st_size == 0:
        return None
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError as exc:
        raise UnsafeTargetError(f"{path}: {exc.strerror}") from None
    found = _ext_description(head)
    if found is None:
        from fsage.lfs.executor import is_lfs_image

        if is_lfs_image(path):
            found = "an fsage LFS file system"
    if found is None:
        found = _blkid(path)
    if found is None and stat.S_ISREG(st.st_mode):
        found = f"{st.st_size} bytes"
    return found


def _mounted(path: Path) -> bool:
    st = path.stat()
    if not stat.S_ISBLK(st.st_mode):
        return False
    dev = (os.major(st.st_rdev), os.minor(st.st_rdev))
    try:
        with open("/proc/self/mountinfo", "rb") as f:
            lines = f.read().splitlines()
    except OSError:
        return False
    for line in lines:
        parts = line.split(b" ")
        if len(parts) > 2 and parts[2] == f"{dev[0]}:{dev[1]}".encode():
            return True
    return False


def refuse_overwrite(path: Path, force: bool) -> None:
    """Raise UnsafeTargetError if making a file system on ``path`` would destroy something
    (unless ``force``) or if ``path`` is a mounted device (always)."""
    if path.exists() and _mounted(path):
        raise UnsafeTargetError(f"{path} is mounted; will not make a file system on it")
    if force:
        return
    found = existing_contents(path)
    if found is not None:
        raise UnsafeTargetError(
            f"{path} contains {found}; use --force to overwrite it (its contents are lost)"
        )
