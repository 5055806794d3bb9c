"""The LFS rounds' cold check: a round is cold when its server asked as much of the image as a
fresh server did and storage (not the page cache) gave it what it asked."""

from __future__ import annotations

from fsage.study.measure import cold_check

MIB = 1 << 20


def test_cold_rounds_pass_and_warm_ones_are_named() -> None:
    cold = {"aged": [{"rchar": 74 * MIB, "read_bytes": 77 * MIB},
                     {"rchar": 74 * MIB, "read_bytes": 136 * MIB}]}  # fmt: skip
    assert cold_check(cold, from_device=True) == []
    server_warm = {"aged": [{"rchar": 74 * MIB, "read_bytes": 77 * MIB},
                            {"rchar": 10 * MIB, "read_bytes": 10 * MIB}]}  # fmt: skip
    (line,) = cold_check(server_warm, from_device=True)
    assert line.startswith("round 2 of the aged tree") and "not cold" in line
    page_cached = {"clean": [{"rchar": 74 * MIB, "read_bytes": 1 * MIB}]}
    assert len(cold_check(page_cached, from_device=True)) == 1
    assert cold_check(page_cached, from_device=False) == []  # not root: no drop, no claim
