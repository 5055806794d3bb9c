"""The ager: size distributions, profiles, the workload generator, and executors that run a
workload on a mounted directory, an ext image offline, or (via fsage.lfs) an LFS image."""

from __future__ import annotations

import re

from fsage.errors import UsageError

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_bytes(text: str) -> int:
    """'1048576', '64M', '2GiB', '512k' -> bytes."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgtKMGT]?)(?:i?[bB])?\s*", text)
    if not m:
        raise UsageError(f"not a size in bytes: {text!r} (e.g. 1073741824, 512M, 2G)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])
