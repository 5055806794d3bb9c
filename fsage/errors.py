"""The one exception family fsage raises for bad input or a failed operation.

The CLI turns any FsageError into one line on stderr and a non-zero exit; anything else is a bug.
"""


class FsageError(Exception):
    """Base class: a problem the user can act on (bad input, missing file, corrupt image)."""

    exit_code = 1


class UsageError(FsageError):
    """The arguments do not make sense together."""

    exit_code = 2


class SourceError(FsageError):
    """A snapshot source cannot be read: not a file system, truncated, unreadable."""


class StoreError(FsageError):
    """The database is missing, of an unknown version, or inconsistent with the request."""


class WorkloadError(FsageError):
    """A workload or profile is malformed, or an executor cannot run it."""


class UnsafeTargetError(FsageError):
    """A target that fsage refuses to write to (not empty, '/', outside the target...)."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the command is, so that what it set up is undone on the way out
    (an image unmounted and its loop device detached, a temporary mount point removed), as
    for Ctrl-C; the CLI exits with status 143. A command that stops cleanly between steps
    (``fsage age``) holds the signal itself."""
