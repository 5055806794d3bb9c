"""The `fsage` command: one click group; every module in this package adds its commands.

Each component module defines ``COMMANDS`` (a list of click commands or groups) and names them
in ``COMMAND_MODULES`` below. A module is imported only when one of its commands runs (or
help lists them all), so `fsage snapshot` from cron does not pay for plotly or the LFS code;
tests/cli checks that the table and the modules agree.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any

import click

from fsage import __version__
from fsage.errors import FsageError
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
    "trace": "trace",
    "workload": "workload",
}


# `fsage snapshot`'s options, those that take a value and the flags (tests/cli holds them to
# the command's): enough to see, before the command is even imported, which directory it reads.
SNAPSHOT_VALUE_OPTIONS = frozenset({"--db", "--name", "--label", "--taken-at", "--format"})
SNAPSHOT_FLAG_OPTIONS = frozenset({"--freeze"})


def snapshot_directory(args: Sequence[str]) -> str | None:
    """The directory that ``fsage ARGS`` will snapshot, if ARGS are ``snapshot DIR [options]``
    with options the command knows; None otherwise (the command then says what is wrong)."""
    if not args or args[0] != "snapshot":
        return None
    positional: list[str] = []
    rest = iter(args[1:])
    for arg in rest:
        if arg == "--":
            positional.extend(rest)
            break
        if arg.split("=", 1)[0] in SNAPSHOT_VALUE_OPTIONS:
            if "=" not in arg and next(rest, None) is None:
                return None
        elif arg.startswith("-") and arg not in SNAPSHOT_FLAG_OPTIONS:
            return None  # --help, or an option that does not exist
        elif arg not in SNAPSHOT_FLAG_OPTIONS:
            positional.append(arg)
    if len(positional) != 1 or not os.path.isdir(positional[0]):
        return None
    return positional[0]


class FsageGroup(click.Group):
    """Loads commands on demand, and turns FsageError into one clear line on stderr and its
    exit code — never a traceback."""

    def main(self, args: Sequence[str] | None = None, *rest: Any, **kwargs: Any) -> Any:
        """Run the command; ``fsage snapshot DIR`` first starts its walk of DIR on threads of
        its own, so that the walk and the imports the command needs (numpy, the store: a
        tenth of a second or more of CPU) overlap. Not on a terminal, where the walk reports
        progress to the command."""
        args = sys.argv[1:] if args is None else list(args)
        directory = snapshot_directory(args)
        if directory is not None:
            from fsage.cli.common import progress_enabled

            if not progress_enabled():
                from fsage.snapshotter.livewalk import start_background_walk

                start_background_walk(directory)
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
        try:
            return super().invoke(ctx)
        except FsageError as exc:
            click.echo(f"fsage: error: {shown(str(exc))}", err=True)
            sys.exit(exc.exit_code)
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
def main() -> None:
    """Measure how file systems lay files out on disk and how that layout decays with age.

    \b
    Examples:
      fsage demo                         # make, fill and snapshot a small ext4 image
      fsage snapshot /dev/sdb1 --name home
      fsage snapshots --format json
    """
