"""Run a command with its stderr on a pseudo-terminal, as a user at a terminal sees it: the
progress lines fsage shows only there."""

from __future__ import annotations

import os
import pty
import select
import subprocess
from pathlib import Path


def run_on_terminal(
    argv: list[str], env: dict[str, str] | None = None, cwd: Path | None = None, quiet: int = 60
) -> tuple[int, str, str]:
    """(exit status, stdout, what the terminal got). The terminal is read while the command
    runs (a full terminal buffer would stop it); AssertionError after ``quiet`` seconds
    without output."""
    primary, secondary = pty.openpty()
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=secondary, env=env, cwd=cwd
    )
    os.close(secondary)
    got = bytearray()
    try:
        while True:
            ready, _, _ = select.select([primary], [], [], quiet)
            if not ready:
                proc.kill()
                raise AssertionError(f"no output on the terminal for {quiet} s")
            try:
                chunk = os.read(primary, 65536)
            except OSError:  # EIO: every writer has closed the terminal
                break
            if not chunk:
                break
            got += chunk
    finally:
        os.close(primary)
    out = proc.stdout.read().decode() if proc.stdout else ""
    return proc.wait(), out, got.decode()
