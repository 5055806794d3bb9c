"""What the ``fsage`` process does before click, numpy and the commands are imported.

``fsage snapshot DIR`` starts its walk of DIR here, on threads of its own, so that the walk
runs while the interpreter imports click, the command, numpy and the store (a tenth of a
second of CPU or more); the command then takes the walk over (``fsage.snapshotter.livewalk``).
This module imports only the standard library, as does the part of the live reader it starts.

``python3 -m fsage`` and the ``fsage`` console script run :func:`run`: the walk starts before
click is imported, malloc is told to reuse the memory the walk frees for the store's arrays,
and a successful ``fsage snapshot`` ends the process as soon as its output is flushed, without
the interpreter's teardown (freeing every module and array one by one: about 0.02 s of CPU
after the work is done). Callers of ``fsage.cli.main`` (tests, an ``fsage`` script installed
before the console script pointed here) start the walk after click is imported and exit as
usual.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

# `fsage snapshot`'s options, those that take a value and the flags (tests/cli holds them to
# the command's): enough to see, before the command is even imported, which directory it reads.
SNAPSHOT_VALUE_OPTIONS = frozenset({"--db", "--name", "--label", "--taken-at", "--format"})
SNAPSHOT_FLAG_OPTIONS = frozenset({"--freeze"})


def progress_enabled() -> bool:
    """Progress bars only on a terminal, so cron stays quiet."""
    return sys.stderr.isatty()


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


def start_snapshot_walk(args: Sequence[str], progress: bool) -> str | None:
    """If ``fsage ARGS`` snapshots a directory, start its walk (once, whoever asks again) and
    return the directory. Not with ``progress``: a walk that reports progress runs in the
    command, which shows it."""
    directory = snapshot_directory(args)
    if directory is not None and not progress:
        from fsage.snapshotter.livewalk import start_background_walk

        start_background_walk(directory)
    return directory


def _exit_now(code: int) -> None:
    """End the process with ``code`` once stdout and stderr are flushed, skipping the
    interpreter's teardown."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        code = code or 141  # as the command does when a reader went away
    except (OSError, ValueError):
        pass
    try:  # noqa: SIM105 (contextlib is not imported on this path)
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    os._exit(code)


def keep_freed_memory() -> None:
    """A snapshot allocates its large buffers one after the other (the walk's, on threads of
    its own, then the store's): reusing the freed ones spares a page fault for every 4 KiB of
    the next (about 4000 at 100k files)."""
    from fsage.heap import keep_freed_memory as keep

    keep(one_arena=True)


def run(args: Sequence[str]) -> None:
    """``python3 -m fsage ARGS``."""
    args = list(args)
    if args[:1] == ["snapshot"]:
        keep_freed_memory()
    start_snapshot_walk(args, progress_enabled())
    from fsage.cli import main

    try:
        main(args)
    except SystemExit as exc:
        if args[:1] == ["snapshot"] and exc.code in (0, None):
            _exit_now(0)  # the snapshot is committed and its line printed
        raise


def main() -> None:
    """The ``fsage`` console script."""
    run(sys.argv[1:])
