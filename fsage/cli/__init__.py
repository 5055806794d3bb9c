"""The `fsage` command: one click group; every module in this package adds its commands.

Each component module defines ``COMMANDS`` (a list of click commands or groups) and names them
in ``COMMAND_MODULES`` below. A module is imported only when one of its commands runs (or
help lists them all), so `fsage snapshot` from cron does not pay for plotly or the LFS code;
tests/cli checks that the table and the modules agree.
"""

from __future__ import annotations

import importlib
import signal
import sqlite3
import sys
import threading
from collections.abc import Sequence
from typing import Any

import click

from fsage import __version__
from fsage.errors import FsageError, Terminated
from fsage.launch import SNAPSHOT_FLAG_OPTIONS as SNAPSHOT_FLAG_OPTIONS
from fsage.launch import SNAPSHOT_VALUE_OPTIONS as SNAPSHOT_VALUE_OPTIONS
from fsage.launch import snapshot_directory as snapshot_directory
from fsage.launch import start_snapshot_walk
from fsage.text import shown

# command name -> module of fsage.cli that defines it
COMMAND_MODULES = {
    "age": "age",
    "analyze": "analyze",
    "bench": "bench",
    "daemon": "daemon",
    "deltas": "replay",
    "demo": "demo",
    "export": "fleet",
    "fleet": "fleet",
    "fidelity": "replay",
    "lfs": "lfs",
    "noise-floor": "replay",
    "replay": "replay",
    "report": "report",
    "runs": "runs",
    "show": "snapshot",
    "snapshot": "snapshot",
    "snapshots": "snapshot",
    "status": "daemon",
    "study": "study",
    "trace": "trace",
    "workload": "workload",
}


def _terminated(signum: int, frame: object) -> None:
    raise Terminated


class FsageGroup(click.Group):
    """Loads commands on demand, and turns FsageError into one clear line on stderr and its
    exit code — never a traceback."""

    def main(self, args: Sequence[str] | None = None, *rest: Any, **kwargs: Any) -> Any:
        """Run the command; ``fsage snapshot DIR`` first starts its walk of DIR on threads of
        its own, so that the walk and the imports the command needs (numpy, the store: a
        tenth of a second or more of CPU) overlap. Not on a terminal, where the walk reports
        progress to the command."""
        args = sys.argv[1:] if args is None else list(args)
        from fsage.cli.common import progress_enabled

        # a no-op where `python3 -m fsage` (fsage.launch) has started it before click
        directory = start_snapshot_walk(args, progress_enabled())
        try:
            return super().main(args, *rest, **kwargs)
        finally:
            if directory is not None:  # a walk that the command did not take (it failed first)
                from fsage.snapshotter.livewalk import forget_background_walks

                forget_background_walks()

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMAND_MODULES)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module = COMMAND_MODULES.get(cmd_name)
        if module is None:
            return None
        commands = importlib.import_module(f"{__name__}.{module}").COMMANDS
        return next((c for c in commands if c.name == cmd_name), None)

    def invoke(self, ctx: click.Context) -> Any:
        # SIGTERM unwinds the command as Ctrl-C does, unless someone (a caller embedding the
        # CLI) already handles it; the handler goes again when the command returns.
        prev = None
        if (
            threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
        ):
            prev = signal.signal(signal.SIGTERM, _terminated)
        try:
            return self._invoke(ctx)
        finally:
            if prev is not None and signal.getsignal(signal.SIGTERM) is _terminated:
                signal.signal(signal.SIGTERM, prev)

    def _invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except Terminated:
            click.echo("fsage: terminated", err=True)
            sys.exit(143)
        except FsageError as exc:
            click.echo(f"fsage: error: {shown(str(exc))}", err=True)
            sys.exit(exc.exit_code)
        except sqlite3.Error as exc:  # raised past the store's own reporting: the same line
            from fsage.db.store import failure_of_latest

            click.echo(f"fsage: error: {shown(str(failure_of_latest(exc)))}", err=True)
            sys.exit(1)
        except KeyboardInterrupt:
            click.echo("fsage: interrupted", err=True)
            sys.exit(130)
        except BrokenPipeError:
            sys.exit(141)


@click.group(
    cls=FsageGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(__version__, prog_name="fsage")
@click.option(
    "--follow-umask",
    is_flag=True,
    envvar="FSAGE_FOLLOW_UMASK",
    help="Write databases, reports, exports, workloads and run records with the modes the "
    "umask gives, not 0600 (directories 0700): they name files. Also $FSAGE_FOLLOW_UMASK=1.",
)
def main(follow_umask: bool) -> None:
    """Measure how file systems lay files out on disk and how that layout decays with age.

    \b
    Examples:
      fsage demo                         # make, fill and snapshot a small ext4 image
      fsage snapshot /dev/sdb1 --name home
      fsage snapshots --format json
      fsage --follow-umask export --db fsage.db /srv/fleet   # a dataset others may read
    """
    from fsage.private import follow_umask as follow

    follow(follow_umask)  # set each time: one process may run several commands (tests)
