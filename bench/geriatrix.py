"""Geriatrix's profiles for the benchmarks (its distribution files, as text)."""

from __future__ import annotations

from pathlib import Path

#: Geriatrix's "agrawal" profile: size, age and directory-depth distributions.
AGRAWAL = {
    "size_distribution.txt": "11\n8 1\n32 7\n128 16\n512 40\n2048 50\n8192 46\n32768 35\n"
    "131072 20\n524288 10\n2097152 4\n8388608 1\n",
    "age_distribution.txt": "10\n10.74 1\n31 2\n85.98 8\n240 20\n687.87 44\n1945.59 75\n"
    "5502.98 144\n15768 146\n44023.9 23\n122640 1\n",
    "dir_distribution.txt": "15\n1 1 1\n2 2 5\n3 14 13\n4 15 19\n5 23 30\n6 24 36\n7 42 32\n"
    "8 22 26\n9 15 22\n10 12 17\n11 7 8\n12 4 5\n13 3 2\n14 2 1\n15 1 1\n",
}


def write_agrawal(directory: Path) -> Path:
    """Write the agrawal profile's three files into ``directory``; returns it."""
    for name, text in AGRAWAL.items():
        (directory / name).write_text(text)
    return directory
