"""Installing the systemd units and the cron line that run the daemon, with the real paths.

The templates (``fsage/snapshotter/units/``) name the fsage executable ``@FSAGE@`` and the
configuration ``@CONFIG@``; :func:`install_units` writes them with the command that runs this
fsage (the console script beside the running interpreter, else ``python3 -m fsage``) and the
configuration's absolute path, so that ``systemd-analyze verify`` accepts them as written.
"""

from __future__ import annotations

import shlex
import shutil
import sys
from importlib import resources
from pathlib import Path

from fsage.errors import FsageError

UNITS = ("fsage.service", "fsage.timer", "fsage-daemon.service")
CRON = "fsage.cron"


def fsage_command() -> str:
    """The command line that runs this fsage, for ExecStart= and cron."""
    beside = Path(sys.executable).parent / "fsage"
    if beside.is_file():
        return shlex.quote(str(beside))
    found = shutil.which("fsage")
    if found and "shims" not in Path(found).parts:  # version-manager shims need a shell
        return shlex.quote(str(Path(found).resolve()))
    return f"{shlex.quote(sys.executable)} -m fsage"


def render_unit(name: str, config: Path, command: str | None = None) -> str:
    text = resources.files("fsage.snapshotter").joinpath("units", name).read_text("utf-8")
    return text.replace("@FSAGE@", command or fsage_command()).replace(
        "@CONFIG@", shlex.quote(str(config.resolve()))
    )


def install_cron(path: Path, config: Path, command: str | None = None) -> Path:
    """Write the cron line (for /etc/cron.d/) to ``path``."""
    try:
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(render_unit(CRON, config, command), encoding="utf-8")
        tmp.replace(path)
    except OSError as exc:
        raise FsageError(f"{path}: cannot write the cron file ({exc.strerror})") from None
    return path


def install_units(
    directory: Path, config: Path, command: str | None = None, names: tuple[str, ...] = UNITS
) -> list[Path]:
    """Write the units to ``directory`` (created); returns the files written."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        written = []
        for name in names:
            path = directory / name
            tmp = path.with_name(f".{name}.tmp")
            tmp.write_text(render_unit(name, config, command), encoding="utf-8")
            tmp.replace(path)
            written.append(path)
    except OSError as exc:
        raise FsageError(f"{directory}: cannot write the units ({exc.strerror})") from None
    return written
