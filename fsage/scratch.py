"""Where large scratch files go: a directory on disk, not in memory.

An export of a large history writes gigabytes of scratch (some 200 bytes a file of the
first snapshot: keys, names, buckets) and maps its paged arrays (``fsage.paged``) from
scratch files. On a disk those are the page cache's, which the kernel reclaims; on a tmpfs
(``/tmp`` is one on Fedora, Arch and Debian 13) they are memory that cannot be reclaimed
without swap, so the run's memory would grow with the file system after all (560 MiB of
tmpfs for 2.8M files). So the system's temporary directory is used only when it is on
disk; else ``/var/tmp`` (on disk by the FHS), else the directory the caller names (the
export's output). ``FSAGE_SCRATCH`` overrides all of them.

A scratch directory's name carries its process's id, so a run killed before its clean-up
(the OOM killer's SIGKILL, say) leaves nothing for long: the next run's ``directory``
removes those of processes that are gone.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from fsage.errors import UsageError
from fsage.mounttable import process_alive

if TYPE_CHECKING:
    import sqlite3

ENV = "FSAGE_SCRATCH"
VAR_TMP = Path("/var/tmp")
# statfs(2)'s f_type of the file systems that keep their files in memory
MEMORY_FS = {0x01021994: "tmpfs", 0x858458F6: "ramfs"}
_OWN = re.compile(r"fsage-(?P<use>[a-z]+)-(?P<pid>[0-9]+)-[A-Za-z0-9_]+")


def memory_fs(path: Path) -> str | None:
    """The name of the in-memory file system ``path`` lies on (``tmpfs``, ``ramfs``), or
    None when it is on anything else or cannot be told."""
    statfs = _statfs()
    if statfs is None:
        return None
    buf = ctypes.create_string_buffer(256)  # struct statfs is 120 bytes on 64-bit Linux
    if statfs(os.fsencode(path), buf) != 0:
        return None
    return MEMORY_FS.get(ctypes.c_ulong.from_buffer(buf).value)  # f_type comes first


@functools.cache
def _statfs() -> Callable[[bytes, ctypes.Array[ctypes.c_char]], int] | None:
    try:
        call = ctypes.CDLL(None).statfs
    except (OSError, AttributeError):
        return None
    call.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    call.restype = ctypes.c_int
    result: Callable[[bytes, ctypes.Array[ctypes.c_char]], int] = call
    return result


def base(near: Path | None = None) -> Path:
    """The directory scratch goes in: ``$FSAGE_SCRATCH``; else the first of the system's
    temporary directory, ``/var/tmp`` and ``near`` that is a writable directory on disk;
    else the system's temporary directory (all in memory, then: ``in_memory`` says so).
    ``UsageError`` when ``$FSAGE_SCRATCH`` is no writable directory."""
    chosen = os.environ.get(ENV)
    if chosen:
        if not _usable(Path(chosen)):
            raise UsageError(f"{ENV}={chosen}: not a directory this user can write in")
        return Path(chosen)
    system = Path(tempfile.gettempdir())
    for cand in (system, VAR_TMP, near):
        if cand is not None and _usable(cand) and memory_fs(cand) is None:
            return cand
    return system


def sqlite_temp_files(con: sqlite3.Connection) -> None:
    """Keep SQLite's temporary files (sorts, temporary tables, VACUUM's copy) on disk: it puts
    them in ``$SQLITE_TMPDIR``, ``$TMPDIR`` or ``/var/tmp``, and a tmpfs there would hold them
    in memory (the export's sorts: 22 MiB at 11.2M files). SQLite has one such setting for the
    whole process, changed only when its own choice is in memory and then only once a place
    (changing it while another thread runs SQLite is not safe)."""
    global _sqlite_dir
    own = next((Path(d) for d in _sqlite_choices() if d and _usable(Path(d))), None)
    if own is None or memory_fs(own) is None:
        return
    where = base()
    if where == _sqlite_dir or memory_fs(where) is not None:
        return
    quoted = str(where).replace("'", "''")
    con.execute(f"PRAGMA temp_store_directory = '{quoted}'")  # ignored where compiled out
    _sqlite_dir = where


_sqlite_dir: Path | None = None


def _sqlite_choices() -> list[str | None]:
    """Where SQLite's Unix layer looks for a temporary directory, in its order."""
    env = os.environ
    return [env.get("SQLITE_TMPDIR"), env.get("TMPDIR"), "/var/tmp", "/usr/tmp", "/tmp"]


def _usable(path: Path) -> bool:
    return path.is_dir() and os.access(path, os.W_OK | os.X_OK)


def in_memory(near: Path | None = None) -> str | None:
    """A warning when the scratch directory holds its files in memory, else None (also when
    ``$FSAGE_SCRATCH`` chose it: the user's call)."""
    where = base(near)  # refused first if $FSAGE_SCRATCH is unusable
    kind = memory_fs(where)
    if kind is None or os.environ.get(ENV):
        return None
    return (
        f"scratch space {where} is a {kind}: the export's scratch files will take memory "
        f"as the file system grows; set {ENV} to a directory on disk"
    )


def make(use: str, near: Path | None = None) -> Path:
    """A new private (0700) scratch directory for ``use`` (``export``, ``fleet``) under
    ``base(near)``, for the caller to remove; those of ``use`` that processes now gone left
    there are removed first."""
    where = base(near)
    sweep(where, use)
    return Path(tempfile.mkdtemp(prefix=f"fsage-{use}-{os.getpid()}-", dir=where))


@contextlib.contextmanager
def directory(use: str, near: Path | None = None) -> Iterator[Path]:
    """``make(use, near)``, removed on the way out."""
    path = make(use, near)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def sweep(where: Path, use: str) -> list[Path]:
    """Remove the scratch directories of ``use`` under ``where`` whose process is gone and
    that this user owns; returns those removed."""
    removed: list[Path] = []
    try:
        entries = list(os.scandir(where))
    except OSError:
        return removed
    uid = os.geteuid()
    for entry in entries:
        m = _OWN.fullmatch(entry.name)
        if m is None or m["use"] != use or process_alive(int(m["pid"])):
            continue
        with contextlib.suppress(OSError):
            if entry.is_dir(follow_symlinks=False) and entry.stat().st_uid == uid:
                shutil.rmtree(entry.path)
                removed.append(Path(entry.path))
    return removed
