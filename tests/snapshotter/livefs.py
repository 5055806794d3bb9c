"""Mounting scratch file systems and reading oracles for the live reader's tests
(test_live.py, test_live_sources.py, test_live_cwalk.py)."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from fsage.layout import (
    EXTENT_DELALLOC,
    EXTENT_ENCODED,
    EXTENT_INLINE,
    EXTENT_SHARED,
    EXTENT_UNWRITTEN,
    Layout,
)

MKFS = {
    "ext4": (["mkfs.ext4", "-q", "-F", "-b", "4096", "-L", "fsage-ext4"], 64),
    "xfs": (["mkfs.xfs", "-q", "-f", "-L", "fsage-xfs"], 320),
    "btrfs": (["mkfs.btrfs", "-q", "-f", "-L", "fsage-btrfs"], 160),
}


def can_mount() -> bool:
    return os.geteuid() == 0 and os.path.exists("/dev/loop-control")


# The pytestmark of each live test module: their tests mount scratch file systems (root).
MARKS = [
    pytest.mark.skipif(not can_mount(), reason="needs root and loop devices"),
    pytest.mark.needs_root,
]


def run(*cmd: str) -> str:
    res = subprocess.run(cmd, check=True, capture_output=True)
    return res.stdout.decode("utf-8", "surrogateescape")


@dataclass
class Mounted:
    fstype: str
    image: Path
    mnt: Path
    dev: str


@contextmanager
def scratch_dir() -> Iterator[Path]:
    # World-traversable (0755) so that the unprivileged test can walk it too.
    d = Path(tempfile.mkdtemp(prefix="fsage-live-"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def mount(workdir: Path, fstype: str, name: str = "") -> Mounted:
    if shutil.which(MKFS[fstype][0][0]) is None:
        pytest.skip(f"{MKFS[fstype][0][0]} not installed")
    cmd, mib = MKFS[fstype]
    image = workdir / f"{fstype}{name}.img"
    with open(image, "wb") as f:
        f.truncate(mib << 20)
    run(*cmd, str(image))
    mnt = workdir / f"mnt-{fstype}{name}"
    mnt.mkdir()
    mnt.chmod(0o755)
    try:
        run("mount", "-o", "loop", str(image), str(mnt))
    except subprocess.CalledProcessError as e:
        pytest.skip(f"cannot mount {fstype}: {e.stderr.strip()}")
    mnt.chmod(0o755)
    dev = run("findmnt", "-n", "-o", "SOURCE", str(mnt)).strip()
    return Mounted(fstype, image, mnt, dev)


def umount(m: Mounted) -> None:
    # A walk of / by another process can hold the mount for a moment: retry, and detach it
    # lazily as a last resort rather than leave it mounted over a deleted image.
    for attempt in range(6):
        if subprocess.run(["umount", "-R", str(m.mnt)], capture_output=True).returncode == 0:
            return
        time.sleep(0.2 * (attempt + 1))
    subprocess.run(["umount", "-R", "-l", str(m.mnt)], check=False, capture_output=True)


# --- filefrag as the oracle -------------------------------------------------------------------

_EXT_LINE = re.compile(
    r"^\s*\d+:\s+(\d+)\.\.\s*(\d+):\s+(\d+)\.\.\s*(\d+):\s+(\d+):\s+(?:\d+:)?\s*(\S*)\s*$"
)
_FLAG_MAP = {
    "unwritten": EXTENT_UNWRITTEN,
    "delalloc": EXTENT_DELALLOC,
    "inline": EXTENT_INLINE,
    "data_tail": EXTENT_INLINE,
    "tail": EXTENT_INLINE,
    "shared": EXTENT_SHARED,
    "encoded": EXTENT_ENCODED,
    "encrypted": EXTENT_ENCODED,
}
_IGNORED = {"last", "eof", "merged", ""}


def filefrag_extents(path: Path, bs: int) -> list[tuple[int, int, int, int]]:
    """Extents as filefrag -v prints them, merged the way fsage documents, in blocks."""
    out = run("filefrag", "-v", str(path))
    raw: list[tuple[int, int, int, frozenset[str]]] = []  # bytes
    for line in out.splitlines():
        m = _EXT_LINE.match(line)
        if not m:
            continue
        lo, _lo_end, po, _po_end, ln = (int(x) for x in m.groups()[:5])
        flags = frozenset(m.group(6).split(",")) - _IGNORED
        unit = 1 if "not_aligned" in flags else bs  # filefrag prints bytes for those
        raw.append((lo * unit, po * unit, ln * unit, flags))
    merged: list[tuple[int, int, int, frozenset[str]]] = []
    for lo, po, ln, fl in raw:
        if merged:
            plo, ppo, pln, pfl = merged[-1]
            if (
                pfl == fl
                and plo + pln == lo
                and ppo + pln == po
                and not fl & {"not_aligned", "unknown_loc"}
            ):
                merged[-1] = (plo, ppo, pln + ln, pfl)
                continue
        merged.append((lo, po, ln, fl))
    result = []
    for lo, po, ln, fl in merged:
        f = 0
        for name in fl:
            f |= _FLAG_MAP.get(name, 0)
        first, last = lo // bs, (lo + ln + bs - 1) // bs
        result.append((first, po // bs, last - first, f))
    return result


def by_path(layout: Layout) -> dict[str, int]:
    """path -> row index in layout.files."""
    rows = {int(ino): i for i, ino in enumerate(layout.files.ino.tolist())}
    out = {}
    for ino, paths in layout.paths().items():
        for p in paths:
            out[p] = rows[ino]
    return out


def file_extents(layout: Layout, row: int) -> list[tuple[int, int, int, int]]:
    return [tuple(int(v) for v in r) for r in layout.files.extents_of(row)]  # type: ignore[misc]


def same_layout(py: Layout, c: Layout) -> None:
    """Everything equal but crtime (the Python walk has none on 3.11) and extra["walk"]."""
    for f in dataclasses.fields(py.files):
        if f.name == "crtime":
            continue
        assert np.array_equal(getattr(py.files, f.name), getattr(c.files, f.name)), f.name
    for col in ("parent", "ino", "name_off"):
        assert np.array_equal(getattr(py.links, col), getattr(c.links, col)), col
    assert py.links.names == c.links.names
    assert np.array_equal(py.free.start, c.free.start)
    assert np.array_equal(py.free.length, c.free.length)
    assert py.root_ino == c.root_ino
    assert py.notes == c.notes
    pf, cf = py.facts.to_json(), c.facts.to_json()
    assert (pf["extra"].pop("walk"), cf["extra"].pop("walk")) == ("python", "c")
    assert pf == cf
