"""Every command is documented: --help works and shows at least one example."""

from __future__ import annotations

import importlib
import pkgutil

import click
import pytest
from click.testing import CliRunner

import fsage.cli
from fsage.cli import COMMAND_MODULES, main


def _commands(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = []
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        assert cmd is not None, f"fsage {' '.join((*prefix, name))} does not load"
        out.append((*prefix, name))
        if isinstance(cmd, click.Group):
            out.extend(_commands(cmd, (*prefix, name)))
    return out


ALL = _commands(main)


def test_the_core_commands_exist() -> None:
    names = {c[0] for c in ALL}
    assert {"snapshot", "snapshots", "show", "demo"} <= names


@pytest.mark.parametrize("path", ALL, ids=lambda p: " ".join(p))
def test_help_has_an_example(path: tuple[str, ...]) -> None:
    result = CliRunner().invoke(main, [*path, "--help"])
    assert result.exit_code == 0, result.output
    assert "Example" in result.output, f"fsage {' '.join(path)} --help shows no example"
    assert "fsage " in result.output.split("Example", 1)[1]


def test_unknown_command_fails_cleanly() -> None:
    result = CliRunner().invoke(main, ["no-such-command"])
    assert result.exit_code == 2
    assert "Traceback" not in result.output


def test_every_module_command_is_in_the_table() -> None:
    """COMMAND_MODULES names exactly the commands the modules define, each where it lives."""
    found = {}
    for info in pkgutil.iter_modules(fsage.cli.__path__):
        module = importlib.import_module(f"fsage.cli.{info.name}")
        for command in getattr(module, "COMMANDS", []):
            found[command.name] = info.name
    assert found == COMMAND_MODULES
