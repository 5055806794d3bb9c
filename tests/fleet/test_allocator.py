"""The compaction's buffers are mapped on their own (``map_large_buffers``): after a larger
buffer is freed, glibc would serve the next ones from its heap, where what is freed between
longer-lived pieces stays with the process."""

from __future__ import annotations

import ctypes
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = """
import ctypes, sys
from fsage.fleet.allocator import map_large_buffers

class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
if sys.argv[1] == "mapped":
    assert map_large_buffers()
libc.free(libc.malloc(8 << 20))  # glibc's threshold rises to the freed buffer's size
before = libc.mallinfo2().hblks
buf = libc.malloc(512 << 10)
print(libc.mallinfo2().hblks - before)
libc.free(buf)
"""


def _glibc() -> bool:
    try:
        ctypes.CDLL(None).mallinfo2  # noqa: B018
    except (OSError, AttributeError):
        return False
    return True


@pytest.mark.skipif(not _glibc(), reason="glibc's allocator (mallinfo2) only")
def test_a_buffer_after_a_larger_one_freed_is_mapped_on_its_own() -> None:
    repo = str(Path(__file__).resolve().parents[2])

    def mapped_buffers(mode: str) -> int:
        out = subprocess.run(
            [sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True,
            cwd=repo,
        )  # fmt: skip
        return int(out.stdout.strip())

    assert mapped_buffers("default") == 0  # from the heap, as the compaction's were
    assert mapped_buffers("mapped") == 1
