"""How the daemon speaks to its supervisor: log lines (journald priorities or time stamps),
systemd readiness notes, and SIGTERM/SIGINT turned into a stop that rolls back the work.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from types import FrameType
from typing import Any, TextIO

_PRIORITY = {"error": 3, "warning": 4, "info": 6, "debug": 7}


def _journal_stream(stream: TextIO) -> bool:
    value = os.environ.get("JOURNAL_STREAM")
    if not value:
        return False
    try:
        dev, ino = (int(x) for x in value.split(":"))
        st = os.fstat(stream.fileno())
    except (ValueError, OSError):
        return True  # set but unreadable: still under systemd
    return (st.st_dev, st.st_ino) == (dev, ino)


class Log:
    """One line per event: ``<6>text`` under journald; elsewhere a time stamp then
    ``info: text`` (local time on a terminal, ISO 8601 with the UTC offset otherwise)."""

    def __init__(self, stream: TextIO | None = None, style: str | None = None) -> None:
        self.stream = stream or sys.stderr
        if style is None:
            if _journal_stream(self.stream):
                style = "journal"
            elif self.stream.isatty():
                style = "tty"
            else:
                style = "plain"
        self.style = style

    def emit(self, level: str, text: str) -> None:
        text = " ".join(text.split("\n"))
        if self.style == "journal":
            line = f"<{_PRIORITY[level]}>{text}"
        elif self.style == "tty":
            line = f"{datetime.now().strftime('%Y-%m-%d %H:%M:%S')} {level}: {text}"
        else:  # cron mail, log files: the time with its offset
            line = f"{datetime.now().astimezone().isoformat(timespec='seconds')} {level}: {text}"
        try:
            self.stream.write(line + "\n")
            self.stream.flush()
        except (OSError, ValueError):
            pass  # a closed stderr must not stop the daemon

    def info(self, text: str) -> None:
        self.emit("info", text)

    def warning(self, text: str) -> None:
        self.emit("warning", text)

    def error(self, text: str) -> None:
        self.emit("error", text)


def sd_notify(message: str) -> None:
    """Tell systemd (Type=notify) about the daemon's state; nothing outside systemd."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.sendto(message.encode(), address)
    except OSError:
        pass


# ---------------------------------------------------------------- signals


class DaemonStop(BaseException):
    """Raised by the SIGTERM/SIGINT handler inside interruptible work (a BaseException, so
    ``except Exception`` in the work does not swallow it and the store's transaction rolls
    back)."""


class Stopper:
    """Turns SIGTERM/SIGINT into a stop request; raises DaemonStop while armed."""

    def __init__(self) -> None:
        self.requested: str | None = None
        self._armed = False
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        first = self.requested is None
        self.requested = signal.Signals(signum).name
        if self._armed and first:
            self._armed = False
            raise DaemonStop(self.requested)

    @contextlib.contextmanager
    def armed(self) -> Iterator[None]:
        """Within this block a stop request raises DaemonStop at once."""
        if self.requested:
            raise DaemonStop(self.requested)
        self._armed = True
        try:
            yield
        finally:
            self._armed = False

    def sleep(self, seconds: float) -> bool:
        """Sleep; False if a stop was requested before or during the sleep."""
        try:
            with self.armed():
                if seconds > 0:
                    time.sleep(seconds)
        except DaemonStop:
            return False
        return True
