"""Files fsage writes that name what it has seen are readable by their owner only.

The daemon runs as root and records every path name of the file systems it reads, names in
directories other users cannot list among them. Everything fsage writes that names files —
databases (``fsage.db.store``), reports, exports (Parquet datasets, their manifest, workloads
inferred from snapshots), the ager's run record and journal, the demo's directory and image,
the scan suite's clean copy of a tree — is therefore made with mode
0600, and the directories it makes for them 0700, whatever the umask. A directory that
already exists keeps its mode, and so does a database once made, so that a group can be given
access to them (``chgrp``/``chmod g+rX``); a report or export file written anew is private
each time.

``fsage --follow-umask`` (or ``FSAGE_FOLLOW_UMASK=1``) asks for the modes the umask gives
instead (0644/0755 under umask 022), for outputs meant to be shared.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

PRIVATE_MODE = 0o600
PRIVATE_DIR_MODE = 0o700

__all__ = [
    "PRIVATE_DIR_MODE",
    "PRIVATE_MODE",
    "dir_mode",
    "file_mode",
    "follow_umask",
    "private_file",
    "private_mkdir",
    "private_opener",
    "write_private_text",
]

_follow_umask = False


def follow_umask(on: bool = True) -> None:
    """Make files and directories with the modes the umask gives (``--follow-umask``)."""
    global _follow_umask
    _follow_umask = on


def file_mode() -> int:
    """The mode a new file is made with (the umask applies on top)."""
    return 0o666 if _follow_umask else PRIVATE_MODE


def dir_mode() -> int:
    """The mode a new directory is made with (the umask applies on top)."""
    return 0o777 if _follow_umask else PRIVATE_DIR_MODE


def private_opener(path: str | os.PathLike[str], flags: int) -> int:
    """An ``opener`` for open(): a file it creates is private whatever the umask (a regular
    file it truncates is made private too; a device or pipe is left alone)."""
    fd = os.open(path, flags | os.O_CLOEXEC, file_mode())
    if _follow_umask:
        return fd
    try:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_mode & 0o077:
            os.fchmod(fd, stat.S_IMODE(st.st_mode) & 0o700)
    except BaseException:
        os.close(fd)
        raise
    return fd


def private_file(path: Path) -> Path:
    """Make ``path`` an empty private file (or make the one there private), for a writer that
    opens it by name and keeps its mode (pyarrow's); returns ``path``."""
    os.close(private_opener(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW))
    return path


def private_mkdir(path: Path, parents: bool = False, exist_ok: bool = False) -> None:
    """``path.mkdir(parents, exist_ok)``, every directory it makes private (0700) whatever the
    umask; directories already there keep their modes."""
    if parents and not path.parent.exists() and path.parent != path:
        private_mkdir(path.parent, parents=True, exist_ok=True)
    try:
        os.mkdir(path, dir_mode())
    except FileExistsError:
        if not exist_ok or not path.is_dir():
            raise
        return
    if not _follow_umask:
        os.chmod(path, PRIVATE_DIR_MODE)  # the umask may have taken more away: exactly 0700


def write_private_text(path: Path, text: str) -> None:
    """Write ``text`` as UTF-8 to a private file (see :func:`private_opener`)."""
    with open(path, "w", encoding="utf-8", opener=private_opener) as f:
        f.write(text)


def output_target(path: Path) -> tuple[Path, bool]:
    """Where a file written whole to ``path`` (a temporary file beside it, renamed over it)
    goes, and whether it must be written into instead: a symlink's target is written (the
    link stays a link), a device or FIFO written into, as a shell's ``>`` would (renamed
    over, ``-o /dev/null`` run as root would leave a regular file where the device was)."""
    real = Path(os.path.realpath(path))
    return real, real.exists() and not real.is_file()
