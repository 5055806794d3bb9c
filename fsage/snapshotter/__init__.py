"""Readers: turn a source (ext image or device, LFS image, mounted tree) into a Layout."""

from fsage.snapshotter.sources import read_source

__all__ = ["read_source"]
