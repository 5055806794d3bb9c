"""The `fsage` command: one click group; every module in this package adds its commands.

Each component module defines ``COMMANDS`` (a list of click commands or groups). Modules are
found by name, so adding a component never edits a shared registration list.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from typing import Any

import click

from fsage import __version__
from fsage.errors import FsageError


class FsageGroup(click.Group):
    """Turns FsageError into one clear line on stderr and its exit code — never a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except FsageError as exc:
            click.echo(f"fsage: error: {exc}", err=True)
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


def _register() -> None:
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_") or info.name == "common":
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        for command in getattr(module, "COMMANDS", []):
            main.add_command(command)


_register()
