"""Readers: turn a source (ext image or device, LFS image, mounted directory) into a Layout.

``read_source`` is imported on first use: ``fsage snapshot DIR`` starts its walk
(``fsage.snapshotter.livewalk``) before numpy, which the readers need, is imported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fsage.snapshotter.sources import read_source

__all__ = ["read_source"]


def __getattr__(name: str) -> Any:
    if name == "read_source":
        from fsage.snapshotter.sources import read_source

        return read_source
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
