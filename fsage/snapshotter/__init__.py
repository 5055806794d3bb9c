"""Readers: turn a source (ext image or device, LFS image, mounted directory) into a Layout.

``read_source`` is imported on first use: ``fsage snapshot DIR`` starts its walk
(``fsage.snapshotter.livewalk``) before numpy, which the readers need, is imported.
"""

from __future__ import annotations

# Not typing.TYPE_CHECKING: typing is not imported yet when `fsage snapshot DIR` starts its
# walk from here.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from fsage.snapshotter.sources import read_source

__all__ = ["read_source"]


def __getattr__(name: str) -> Any:
    if name == "read_source":
        from fsage.snapshotter.sources import read_source

        return read_source
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
