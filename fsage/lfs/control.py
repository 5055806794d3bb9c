"""Requests to a running ``fsage lfs mount`` server from the program that started it.

A program that scans a mount many times (``fsage study``) needs every scan cold. Starting a
server per scan makes it so, at the price of the image's check and open each time; instead the
server listens on a Unix socket named by ``FSAGE_LFS_CONTROL`` (set in its environment) and
answers one-line requests, each with one line of JSON:

* ``drop-caches``: forget what the server holds of the image (cached inodes, decoded
  directories, cached segments), so the next reads fetch it from the image again. Refused
  while changes wait to reach the log (they live in those caches). It is meant for a mount no
  one is using (a read-only one between scans); the kernel's own caches are the caller's to
  drop (``drop_caches``).
* ``stop-trace``: close the ``--trace`` file, complete with the reads so far; no more are
  recorded.
* ``io``: the server's read counters (``/proc/self/io``), by which a caller checks that a
  scan after ``drop-caches`` read the image as a fresh server's would.

Every reply also carries the counters, ``"ok"`` and, when refused, ``"error"``.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

from fsage.errors import FsageError

ENV = "FSAGE_LFS_CONTROL"
#: Seconds a client waits for a reply.
TIMEOUT_S = 30.0


def io_counters() -> dict[str, int]:
    """This process's read counters: ``rchar`` (octets read by system calls, the page cache's
    included) and ``read_bytes`` (octets the block layer fetched for it)."""
    out: dict[str, int] = {}
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/io").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("rchar", "read_bytes"):
                out[key] = int(value)
    return out


class ControlServer:
    """Answers requests on ``path`` from a thread of its own, for ``fs`` (an open LFS) and
    its ``tracer`` (None: not traced)."""

    def __init__(self, path: Path, fs: Any, tracer: Any | None) -> None:
        self.path = path
        self.fs = fs
        self.tracer = tracer
        path.unlink(missing_ok=True)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(str(path))
        os.chmod(path, 0o600)
        self._sock.listen(4)
        threading.Thread(target=self._run, name="fsage-control", daemon=True).start()

    def _run(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed
            with conn, contextlib.suppress(OSError):
                line = conn.makefile("r").readline().strip()
                conn.sendall((json.dumps(self.answer(line)) + "\n").encode())

    def answer(self, request: str) -> dict[str, Any]:
        out: dict[str, Any] = {"ok": True}
        if request == "drop-caches":
            fs = self.fs
            if not fs.readonly and (fs._pending_since is not None or fs._dirty or fs._dirty_dirs):
                out = {"ok": False, "error": "changes not yet in the log (sync first)"}
            else:
                out["dropped"] = {
                    "inodes": len(fs._icache),
                    "dirs": len(fs._dirs),
                    "segments": len(fs._seg_cache),
                }
                # new containers, not cleared ones: a request still iterating the old sees
                # them whole
                fs._icache = {}
                fs._dirs = {}
                fs._seg_cache = OrderedDict()
        elif request == "stop-trace":
            if self.tracer is not None:
                self.fs.read_trace = None
                self.tracer.close()
                self.tracer = None
        elif request != "io":
            out = {"ok": False, "error": f"unknown request {request!r}"}
        out["io"] = io_counters()
        return out

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.close()
        self.path.unlink(missing_ok=True)


def from_env(fs: Any, tracer: Any | None) -> ControlServer | None:
    """The server's control socket when its environment names one."""
    path = os.environ.get(ENV)
    if not path:
        return None
    try:
        return ControlServer(Path(path), fs, tracer)
    except OSError as exc:
        raise FsageError(f"{ENV}={path}: cannot listen there ({exc.strerror})") from None


def request(path: Path, what: str) -> dict[str, Any]:
    """Send ``what`` to the server listening on ``path``; its reply (refusals raised)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(TIMEOUT_S)
            s.connect(str(path))
            s.sendall((what + "\n").encode())
            reply = s.makefile("r").readline()
    except OSError as exc:
        raise FsageError(f"LFS server at {path}: {what}: {exc.strerror or exc}") from None
    try:
        data = json.loads(reply)
    except ValueError:
        raise FsageError(f"LFS server at {path}: {what}: no reply") from None
    if not isinstance(data, dict) or not data.get("ok"):
        err = data.get("error") if isinstance(data, dict) else reply
        raise FsageError(f"LFS server at {path}: {what}: {err}")
    return data
