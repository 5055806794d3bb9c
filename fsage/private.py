"""Files fsage writes that name what it has seen are readable by their owner only.

The daemon runs as root and records every path name of the file systems it reads, names in
directories other users cannot list among them. Databases (``fsage.db.store``), reports and
exports (workloads inferred from snapshots) are therefore written with mode 0600, whatever
the umask. A database keeps the mode it has once made, so a group can be given read access to
it (``chgrp``/``chmod g+r``); a report or export is written anew, private, each time.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

PRIVATE_MODE = 0o600

__all__ = ["PRIVATE_MODE", "private_opener", "write_private_text"]


def private_opener(path: str | os.PathLike[str], flags: int) -> int:
    """An ``opener`` for open(): a file it creates is private whatever the umask (a regular
    file it truncates is made private too; a device or pipe is left alone)."""
    fd = os.open(path, flags | os.O_CLOEXEC, PRIVATE_MODE)
    try:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_mode & 0o077:
            os.fchmod(fd, stat.S_IMODE(st.st_mode) & 0o700)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_private_text(path: Path, text: str) -> None:
    """Write ``text`` as UTF-8 to a private file (see :func:`private_opener`)."""
    with open(path, "w", encoding="utf-8", opener=private_opener) as f:
        f.write(text)
