"""Arrays in a scratch file's pages: zeros, writable, the same values after their pages are
dropped from the resident set, ordinary memory when small or when the scratch file system
has no room."""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest

from fsage import paged


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_a_large_array_is_paged_and_keeps_its_values_when_released() -> None:
    a = paged.zeros(16 << 20, np.uint32)  # 64 MiB
    assert paged.is_paged(a) and paged.is_paged(a.view(">u8")[5:])
    assert a.flags.writeable and not a.any()
    a[:] = np.arange(a.size, dtype=np.uint32)
    held = _rss_mib()
    assert paged.release() >= 1
    dropped = held - _rss_mib()
    assert dropped > 48, dropped  # its pages left the resident set
    assert int(a[123_456]) == 123_456 and int(a[-1]) == a.size - 1  # and came back as written
    assert np.array_equal(a[::4096], np.arange(0, a.size, 4096, dtype=np.uint32))


def test_one_array_released_leaves_the_others_resident() -> None:
    a = paged.full(8 << 20, 7, np.uint32)  # 32 MiB each
    b = paged.full(8 << 20, 9, np.uint32)
    held = _rss_mib()
    assert paged.release(a, np.zeros(3)) == 1  # an ordinary array is left as it is
    dropped = held - _rss_mib()
    assert 24 < dropped < 40, dropped  # a's pages, not b's
    assert int(a[-1]) == 7 and int(b[-1]) == 9


def test_a_small_array_is_ordinary_memory() -> None:
    a = paged.zeros(1000, np.uint64)
    assert not paged.is_paged(a) and a.dtype == np.uint64 and a.size == 1000
    assert not paged.is_paged(np.zeros(paged.PAGED_BYTES))


def test_full_fills_a_paged_array() -> None:
    a = paged.full(paged.PAGED_BYTES + 3, 0xFF)
    assert paged.is_paged(a) and a.size == paged.PAGED_BYTES + 3 and bool(np.all(a == 0xFF))


def test_no_room_for_the_scratch_file_gives_ordinary_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A page of a sparse file that finds its file system full kills the process when it is
    touched (SIGBUS): the file's blocks are reserved first, and without them the array is
    made in memory."""

    def full_fs(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", full_fs)
    a = paged.zeros(4 << 20, np.uint8)
    assert not paged.is_paged(a) and a.size == 4 << 20 and not a.any()
