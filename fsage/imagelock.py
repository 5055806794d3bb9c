"""One image, one writer: the lock every fsage command takes on the image it opens.

A command that changes an image (``fsage lfs mount``, ``lfs mkfs``, ``age``, ``replay``,
``bench``) holds an exclusive lock on it for as long as it works on it; one that only reads it
(``lfs fsck``, ``lfs info``, ``snapshot``) holds a shared one. A second command that wants what
the first holds is refused at once, in one line naming the holder.

* The lock is ``flock`` on the image itself (a regular file or a block device), taken through
  a descriptor of its own that is not inherited across exec. The kernel drops it when the
  holder's last descriptor closes, so a killed holder releases it: nothing stale remains.
* Who holds it is written beside it, in a record per holder in a private runtime directory
  (``/run/fsage/locks`` for root, else under the temporary directory), named by the image's
  device and inode: its pid and command line. A record whose process is gone is ignored and
  removed. Without a record the holder is found in ``/proc/locks``.
* Locks are per process and reentrant: a command that opens its image again (the ager reading
  the layout of the LFS it writes) holds it once more, not against itself.
* An image mounted by something other than an fsage command (``mount -o loop``, another
  system's mount of the device) is refused to a writer too: the lock cannot speak for the
  kernel's file system.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from fsage.errors import FsageError
from fsage.mounttable import _loops, _mounts, _owner
from fsage.mounttable import process_alive as process_alive  # re-exported


class ImageBusyError(FsageError):
    """The image is held by another command (or mounted by something that is not fsage)."""


@dataclass
class _Held:
    fd: int
    image: Path
    exclusive: bool
    count: int
    record: Path | None


_KEY = tuple[int, int]
_held: dict[_KEY, _Held] = {}
_mutex = threading.Lock()
# udev and blkid take short shared locks on block devices: retry a little before refusing.
_RETRY_S = 0.3


def _lock_dir() -> Path:
    base = Path("/run/fsage/locks") if os.geteuid() == 0 else None
    if base is None or not base.parent.parent.is_dir():
        base = Path(tempfile.gettempdir()) / f"fsage-locks-{os.geteuid()}"
    return base


def _command() -> str:
    argv = list(sys.argv)
    if argv and (argv[0].endswith("fsage/__main__.py") or os.path.basename(argv[0]) == "fsage"):
        argv[0] = "fsage"
    return " ".join(argv)


def _record_name(key: _KEY, pid: int) -> str:
    return f"{key[0]}-{key[1]}-{pid}.json"


def _sweep(d: Path) -> None:
    """Remove the records of processes that are gone (killed, or ended without releasing)."""
    try:
        names = os.listdir(d)
    except OSError:
        return
    for name in names:
        pid = name.rsplit("-", 1)[-1].removesuffix(".json").removesuffix(".tmp")
        if pid.isdigit() and not process_alive(int(pid)):
            with contextlib.suppress(OSError):
                (d / name).unlink()


def _write_record(key: _KEY, image: Path, exclusive: bool) -> Path | None:
    """Say who holds ``key`` (best effort: a lock without a record still holds)."""
    d = _lock_dir()
    try:
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        _sweep(d)
        path = d / _record_name(key, os.getpid())
        tmp = path.with_suffix(".tmp")
        body = {
            "pid": os.getpid(),
            "command": _command(),
            "mode": "write" if exclusive else "read",
            "image": str(image),
        }
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, json.dumps(body).encode())
        finally:
            os.close(fd)
        os.replace(tmp, path)
        return path
    except OSError:
        return None


def _records(key: _KEY) -> list[dict[str, object]]:
    """The live holders' records of ``key``; records of dead processes are removed."""
    out = []
    prefix = f"{key[0]}-{key[1]}-"
    try:
        names = os.listdir(_lock_dir())
    except OSError:
        return []
    for name in names:
        if not (name.startswith(prefix) and name.endswith(".json")):
            continue
        pid_text = name[len(prefix) : -len(".json")]
        if not pid_text.isdigit() or int(pid_text) == os.getpid():
            continue
        path = _lock_dir() / name
        if not process_alive(int(pid_text)):
            with contextlib.suppress(OSError):
                path.unlink()
            continue
        try:
            rec = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def _proc_locks_pids(key: _KEY) -> list[int]:
    """Pids that /proc/locks names as holding a flock on ``key``."""
    want = f"{os.major(key[0]):02x}:{os.minor(key[0]):02x}:{key[1]}"
    pids = []
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as fh:
            for line in fh:
                f = line.split()
                if len(f) > 5 and f[1] == "FLOCK" and f[5] == want and f[4].isdigit():
                    pids.append(int(f[4]))
    except OSError:
        pass
    return [p for p in pids if p != os.getpid() and process_alive(p)]


def _cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    parts = [os.fsdecode(p) for p in raw.split(b"\0") if p]
    if len(parts) > 2 and parts[1:3] == ["-m", "fsage"]:
        parts = ["fsage", *parts[3:]]
    return " ".join(parts) or "?"


def holders(path: Path) -> list[tuple[int, str, str]]:
    """(pid, command, "write" or "read") of the other processes holding ``path``'s lock."""
    st = os.stat(path)
    key = (st.st_dev, st.st_ino)
    out = [
        (int(str(r.get("pid"))), str(r.get("command", "?")), str(r.get("mode", "?")))
        for r in _records(key)
        if str(r.get("pid", "")).isdigit()
    ]
    if not out:
        out = [(p, _cmdline(p), "?") for p in _proc_locks_pids(key)]
    return out


def _busy_message(image: Path, key: _KEY, want_exclusive: bool) -> str:
    try:
        found = holders(image)
    except OSError:
        found = []
    if found:
        pid, cmd, mode = next((h for h in found if h[2] == "write"), found[0])
        held = {"write": "being written", "read": "being read"}.get(mode, "in use")
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        who = f"pid {pid}, {cmd!r}"
    else:
        held, more, who = "in use", "", "another process"
    doing = "write" if want_exclusive else "read"
    return f"{image} is {held} by {who}{more}; cannot {doing} it until that ends"


def _foreign_mounts(image: Path, st: os.stat_result) -> list[str]:
    """Mount points of ``image`` that no live fsage command is answerable for."""
    if stat.S_ISBLK(st.st_mode):
        devno = f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
        return _mounts().get(devno, [])
    real = os.path.realpath(image)
    mounts = _mounts()
    out = []
    for loop in _loops():
        if loop.backing != real:
            continue
        for mp in mounts.get(loop.devno, []):
            who = _owner(mp)
            if who is True or (who is not False and who != os.getpid()):
                out.append(f"{mp} ({loop.dev})")
    return out


def acquire(path: str | os.PathLike[str], *, exclusive: bool) -> _KEY:
    """Take ``path``'s lock (exclusive for a writer); raise ImageBusyError if another process
    holds what conflicts. Returns the key to give back to ``release``."""
    image = Path(path)
    try:
        fd = os.open(image, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise FsageError(f"{image}: {exc.strerror}") from None
    st = os.fstat(fd)
    key = (st.st_dev, st.st_ino)
    with _mutex:
        held = _held.get(key)
        if held is not None:
            os.close(fd)
            if exclusive and not held.exclusive:
                _flock(held.fd, image, key, True)
                held.exclusive = True
            held.count += 1
            return key
        try:
            if exclusive:
                mounted = _foreign_mounts(image, st)
                if mounted:
                    raise ImageBusyError(
                        f"{image} is mounted on {', '.join(mounted)}; unmount it first"
                    )
            _flock(fd, image, key, exclusive)
        except BaseException:
            os.close(fd)
            raise
        _held[key] = _Held(fd, image, exclusive, 1, _write_record(key, image, exclusive))
    return key


def _flock(fd: int, image: Path, key: _KEY, exclusive: bool) -> None:
    op = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB
    deadline = time.monotonic() + _RETRY_S
    while True:
        try:
            fcntl.flock(fd, op)
            return
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise FsageError(f"{image}: cannot lock it: {exc.strerror}") from None
        if time.monotonic() >= deadline:
            raise ImageBusyError(_busy_message(image, key, exclusive))
        time.sleep(0.05)


def release(key: _KEY) -> None:
    with _mutex:
        held = _held.get(key)
        if held is None:
            return
        held.count -= 1
        if held.count > 0:
            return
        del _held[key]
        if held.record is not None:
            with contextlib.suppress(OSError):
                held.record.unlink()
        os.close(held.fd)


def after_fork() -> None:
    """In a forked child that carries on the parent's work (a mount's server): the records
    name this process, the parent's are gone."""
    with _mutex:
        for key, held in _held.items():
            old = held.record
            held.record = _write_record(key, held.image, held.exclusive)
            if old is not None and old != held.record:
                with contextlib.suppress(OSError):
                    old.unlink()


@contextlib.contextmanager
def image_lock(path: str | os.PathLike[str], *, exclusive: bool) -> Iterator[None]:
    """Hold ``path``'s lock for the ``with`` block. A directory (a mounted tree) or a path
    that does not exist yet is not an image: nothing is locked."""
    p = Path(path)
    try:
        st = p.stat()
    except OSError:
        yield
        return
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISBLK(st.st_mode)):
        yield
        return
    key = acquire(p, exclusive=exclusive)
    try:
        yield
    finally:
        release(key)
