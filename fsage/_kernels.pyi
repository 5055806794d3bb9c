"""Typed stub of the loops numpy has no single call for, in C (fsage/_kernels.c)."""

from typing import Any

def text_rows(
    paths: list[str],
    widths: tuple[int, int, int, int],
    path_right: bool,
    ino: Any,
    size: Any,
    blocks: Any,
    ext_start: Any,
    ext_count: Any,
    logical: Any,
    physical: Any,
    length: Any,
    /,
) -> str: ...
def argsort_names(group: Any, names: bytes, name_off: Any, which: Any, /) -> bytes: ...
def ranges(lo: Any, hi: Any, /) -> bytearray: ...
