"""The live reader against real mounted ext4, xfs and btrfs file systems.

Oracles: ``filefrag -v`` (extents and flags of every file), ``blkid`` (uuid, label),
``lsattr -v`` (ext4 generation), ``e2freefrag`` (ext4 free space), and the kernel's own
refusal to let the walk see inside other mounts.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fsage.errors import SourceError
from fsage.layout import (
    EXTENT_DELALLOC,
    EXTENT_ENCODED,
    EXTENT_INLINE,
    EXTENT_SHARED,
    EXTENT_UNWRITTEN,
    Layout,
)
from fsage.snapshotter.live import (
    c_walker_available,
    merge_extents,
    read_live_layout,
    read_mountinfo,
    scope_of,
)

MKFS = {
    "ext4": (["mkfs.ext4", "-q", "-F", "-b", "4096", "-L", "fsage-ext4"], 64),
    "xfs": (["mkfs.xfs", "-q", "-f", "-L", "fsage-xfs"], 320),
    "btrfs": (["mkfs.btrfs", "-q", "-f", "-L", "fsage-btrfs"], 160),
}


def _can_mount() -> bool:
    return os.geteuid() == 0 and os.path.exists("/dev/loop-control")


needs_root = pytest.mark.needs_root
pytestmark = [
    pytest.mark.skipif(not _can_mount(), reason="needs root and loop devices"),
    needs_root,
]


def _run(*cmd: str) -> str:
    res = subprocess.run(cmd, check=True, capture_output=True)
    return res.stdout.decode("utf-8", "surrogateescape")


@dataclass
class Mounted:
    fstype: str
    image: Path
    mnt: Path
    dev: str


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    # World-traversable (0755) so that the unprivileged test can walk it too.
    d = Path(tempfile.mkdtemp(prefix="fsage-live-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _mount(workdir: Path, fstype: str, name: str = "") -> Mounted:
    if shutil.which(MKFS[fstype][0][0]) is None:
        pytest.skip(f"{MKFS[fstype][0][0]} not installed")
    cmd, mib = MKFS[fstype]
    image = workdir / f"{fstype}{name}.img"
    with open(image, "wb") as f:
        f.truncate(mib << 20)
    _run(*cmd, str(image))
    mnt = workdir / f"mnt-{fstype}{name}"
    mnt.mkdir()
    mnt.chmod(0o755)
    try:
        _run("mount", "-o", "loop", str(image), str(mnt))
    except subprocess.CalledProcessError as e:
        pytest.skip(f"cannot mount {fstype}: {e.stderr.strip()}")
    mnt.chmod(0o755)
    dev = _run("findmnt", "-n", "-o", "SOURCE", str(mnt)).strip()
    return Mounted(fstype, image, mnt, dev)


def _umount(m: Mounted) -> None:
    # A walk of / by another process can hold the mount for a moment: retry, and detach it
    # lazily as a last resort rather than leave it mounted over a deleted image.
    for attempt in range(6):
        if subprocess.run(["umount", "-R", str(m.mnt)], capture_output=True).returncode == 0:
            return
        time.sleep(0.2 * (attempt + 1))
    subprocess.run(["umount", "-R", "-l", str(m.mnt)], check=False, capture_output=True)


def _populate(root: Path, fstype: str) -> None:
    """A small tree with every case the reader must handle (seeded, so runs repeat)."""
    rnd = random.Random(7)
    (root / "docs").mkdir()
    (root / "docs/deep/er").mkdir(parents=True)
    for i in range(40):
        size = int(rnd.lognormvariate(8.5, 1.6))
        (root / "docs" / f"f{i:02d}").write_bytes(rnd.randbytes(size))
    (root / "docs/deep/er/leaf").write_bytes(b"z" * 70000)
    (root / "empty").write_bytes(b"")
    (root / "tiny").write_bytes(b"hi\n")  # inline on btrfs
    # Two files written in interleaved, synced pieces: fragmented on every fs.
    with open(root / "frag1", "wb") as a, open(root / "frag2", "wb") as b:
        for _ in range(24):
            for f in (a, b):
                f.write(rnd.randbytes(8192))
                f.flush()
                os.fsync(f.fileno())
    # Preallocated (unwritten) space and a sparse file.
    with open(root / "prealloc", "wb") as f:
        os.posix_fallocate(f.fileno(), 0, 1 << 20)
        f.write(b"x" * 5000)
    with open(root / "sparse", "wb") as f:
        f.write(b"a" * 4096)
        f.seek(10 << 20)
        f.write(b"b" * 4096)
    # Space allocated past the end of the file (fallocate --keep-size).
    (root / "beyond").write_bytes(b"y" * 5000)
    _run(
        "fallocate", "--keep-size", "--offset", "0", "--length", str(1 << 20), str(root / "beyond")
    )
    # Hard links: three names of one inode, in two directories.
    (root / "links").mkdir()
    (root / "links/h1").write_bytes(b"h" * 9000)
    os.link(root / "links/h1", root / "links/h2")
    os.link(root / "links/h1", root / "docs/h3")
    os.chown(root / "docs/f01", 1234, 5678)  # owner and group apart, so columns cannot swap
    os.symlink("docs/f00", root / "sym")
    os.mkfifo(root / "fifo")
    (root / b"we\xffird\nname".decode("utf-8", "surrogateescape")).write_bytes(b"w" * 5000)
    if fstype in ("xfs", "btrfs"):
        _run("cp", "--reflink=always", str(root / "docs/deep/er/leaf"), str(root / "reflinked"))
    # Not readable by others: the unprivileged run must skip these and say so.
    (root / "secret").mkdir(mode=0o700)
    (root / "secret/inside").write_bytes(b"s" * 3000)
    (root / "secret").chmod(0o700)
    (root / "private").write_bytes(b"p" * 3000)
    (root / "private").chmod(0o600)
    os.sync()


@pytest.fixture(scope="module", params=["ext4", "xfs", "btrfs"])
def fs(request: pytest.FixtureRequest, workdir: Path) -> Iterator[Mounted]:
    m = _mount(workdir, request.param)
    try:
        _populate(m.mnt, m.fstype)
        yield m
    finally:
        _umount(m)


@pytest.fixture(scope="module")
def layouts(fs: Mounted) -> dict[int, Layout]:
    """The layout read with the default buffer and with a 1- and 3-extent buffer."""
    return {b: read_live_layout(fs.mnt, fiemap_batch=b) for b in (256, 3, 1)}


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
    out = _run("filefrag", "-v", str(path))
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


def _by_path(layout: Layout) -> dict[str, int]:
    """path -> row index in layout.files."""
    rows = {int(ino): i for i, ino in enumerate(layout.files.ino.tolist())}
    out = {}
    for ino, paths in layout.paths().items():
        for p in paths:
            out[p] = rows[ino]
    return out


def _extents(layout: Layout, row: int) -> list[tuple[int, int, int, int]]:
    return [tuple(int(v) for v in r) for r in layout.files.extents_of(row)]  # type: ignore[misc]


# --- tests ------------------------------------------------------------------------------------


def test_extents_match_filefrag_for_every_file(fs: Mounted, layouts: dict[int, Layout]) -> None:
    layout = layouts[256]
    bs = layout.facts.block_size
    paths = _by_path(layout)
    checked = 0
    for rel, row in paths.items():
        if not stat.S_ISREG(int(layout.files.mode[row])):
            continue
        full = fs.mnt / rel.lstrip("/")
        assert _extents(layout, row) == filefrag_extents(full, bs), rel
        checked += 1
    assert checked >= 50
    # The tree has what it was built to have.
    frag = _extents(layout, paths["/frag1"])
    assert len(frag) > 1
    assert sum(e[2] for e in frag) == 48
    prealloc = _extents(layout, paths["/prealloc"])
    assert any(e[3] & EXTENT_UNWRITTEN for e in prealloc)
    assert sum(e[2] for e in prealloc) == 256
    beyond = _extents(layout, paths["/beyond"])
    assert sum(e[2] for e in beyond) == 256  # the extents past the end of the file are there
    assert any(e[3] & EXTENT_UNWRITTEN and e[0] >= 2 for e in beyond)
    sparse = _extents(layout, paths["/sparse"])
    assert [(e[0], e[2]) for e in sparse] == [(0, 1), (2560, 1)]
    assert _extents(layout, paths["/empty"]) == []
    if fs.fstype == "btrfs":
        assert _extents(layout, paths["/tiny"])[0][3] & EXTENT_INLINE
    if fs.fstype in ("xfs", "btrfs"):
        assert all(e[3] & EXTENT_SHARED for e in _extents(layout, paths["/reflinked"]))


def test_small_fiemap_buffer_reads_the_same(layouts: dict[int, Layout]) -> None:
    ref = layouts[256].files
    for batch in (3, 1):
        got = layouts[batch].files
        for col in ("ino", "ext_off", "ext_logical", "ext_physical", "ext_length", "ext_flags"):
            assert np.array_equal(getattr(got, col), getattr(ref, col)), (batch, col)


@pytest.mark.parametrize("engine", ["c", "python"])
def test_parallel_walk_reads_the_same(fs: Mounted, layouts: dict[int, Layout], engine: str) -> None:
    ref = layouts[256]
    got = read_live_layout(fs.mnt, workers=2, engine=engine)
    for col in ("ino", "mode", "nlink", "size", "mtime", "generation", "ext_off", "ext_physical"):
        assert np.array_equal(getattr(got.files, col), getattr(ref.files, col)), col
    assert got.paths() == ref.paths()
    assert len(got.links) == len(ref.links)
    assert got.free.blocks == ref.free.blocks


def test_metadata_and_names(fs: Mounted, layouts: dict[int, Layout]) -> None:
    layout = layouts[256]
    files = layout.files
    assert np.all(np.diff(files.ino.astype(np.int64)) > 0)  # sorted, each inode once
    paths = _by_path(layout)
    expected = set()
    for dirpath, dirnames, filenames in os.walk(os.fsencode(fs.mnt)):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            expected.add(os.fsdecode(full[len(os.fsencode(fs.mnt)) :]))
    assert set(paths) == expected | {"/"}
    for rel in ("/docs/f03", "/sym", "/fifo", "/docs", "/we\udcffird\nname"):
        st = os.lstat(os.fsencode(fs.mnt) + os.fsencode(rel))
        row = paths[rel]
        assert int(files.ino[row]) == st.st_ino
        assert int(files.mode[row]) == st.st_mode
        assert int(files.size[row]) == st.st_size
        assert int(files.nlink[row]) == st.st_nlink
        assert int(files.mtime[row]) == st.st_mtime_ns
        assert int(files.ctime[row]) == st.st_ctime_ns
    assert layout.root_ino == os.stat(fs.mnt).st_ino
    assert layout.facts.kind == f"live:{fs.fstype}"
    assert layout.facts.extra["subtree"] == "/"
    vfs = os.statvfs(fs.mnt)
    assert layout.facts.block_size == vfs.f_frsize
    assert layout.facts.inodes_total == vfs.f_files


def test_hard_links_counted_once_with_all_names(layouts: dict[int, Layout]) -> None:
    layout = layouts[256]
    paths = layout.paths()
    ino = next(i for i, p in paths.items() if "/links/h1" in p)
    assert paths[ino] == ["/docs/h3", "/links/h1", "/links/h2"]
    assert int(np.count_nonzero(layout.files.ino == ino)) == 1
    assert int(np.count_nonzero(layout.links.ino == ino)) == 3


def test_uuid_label_and_generation(fs: Mounted, layouts: dict[int, Layout]) -> None:
    facts = layouts[256].facts
    assert facts.uuid == _run("blkid", "-p", "-s", "UUID", "-o", "value", fs.dev).strip()
    assert facts.label == f"fsage-{fs.fstype}"
    if fs.fstype == "ext4":
        layout = layouts[256]
        paths = _by_path(layout)
        out = _run("lsattr", "-v", str(fs.mnt / "docs/f05"))
        assert int(layout.files.generation[paths["/docs/f05"]]) == int(out.split()[0])


def test_subdirectory_paths_start_at_mount_root(fs: Mounted) -> None:
    layout = read_live_layout(fs.mnt / "docs" / "deep")
    got = {p for ps in layout.paths().values() for p in ps}
    assert got == {"/", "/docs", "/docs/deep", "/docs/deep/er", "/docs/deep/er/leaf"}
    assert layout.facts.extra["subtree"] == "/docs/deep"
    assert layout.root_ino == os.stat(fs.mnt).st_ino


def test_mount_points_are_not_crossed(fs: Mounted, workdir: Path) -> None:
    inner = fs.mnt / "docs" / "inner"
    bind = fs.mnt / "bindpt"
    inner.mkdir()
    bind.mkdir()
    try:
        _run("mount", "-t", "tmpfs", "-o", "size=1m", "fsage-test", str(inner))
        (inner / "hidden").write_bytes(b"x")
        _run("mount", "--bind", str(fs.mnt / "links"), str(bind))  # same device
        layout = read_live_layout(fs.mnt)
        got = {p for ps in layout.paths().values() for p in ps}
        assert not any(p.startswith(("/docs/inner", "/bindpt")) for p in got)
        assert "/links/h2" in got
        note = next(n for n in layout.notes if n.startswith("did not cross 2"))
        assert "/docs/inner" in note and "/bindpt" in note
    finally:
        subprocess.run(["umount", str(inner)], check=False)
        subprocess.run(["umount", str(bind)], check=False)
        inner.rmdir()
        bind.rmdir()


def test_btrfs_subvolume_not_crossed(fs: Mounted) -> None:
    if fs.fstype != "btrfs":
        pytest.skip("btrfs only")
    sub = fs.mnt / "subvol"
    _run("btrfs", "subvolume", "create", str(sub))
    try:
        (sub / "in-subvol").write_bytes(b"q" * 5000)
        layout = read_live_layout(fs.mnt)
        got = {p for ps in layout.paths().values() for p in ps}
        assert not any(p.startswith("/subvol") for p in got)
        assert any("/subvol" in n for n in layout.notes)
    finally:
        _run("btrfs", "subvolume", "delete", str(sub))


@pytest.mark.parametrize("engine", ["c", "python"])
def test_unprivileged_run_skips_what_it_cannot_read(fs: Mounted, engine: str) -> None:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: drop to nobody, read, report as JSON
        try:
            os.close(r)
            os.setgroups([])
            os.setresgid(65534, 65534, 65534)
            os.setresuid(65534, 65534, 65534)
            layout = read_live_layout(fs.mnt, engine=engine)
            doc = {
                "paths": sorted(p for ps in layout.paths().values() for p in ps),
                "notes": layout.notes,
                "skipped": layout.facts.extra["skipped"],
                "free_known": layout.facts.free_space_known,
            }
            os.write(w, json.dumps(doc).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    doc = json.loads(data)
    # What "others" may not read: the two made so, and ext4's lost+found (mode 0700).
    unreadable = ["/private", "/secret"] + (["/lost+found"] if fs.fstype == "ext4" else [])
    for p in unreadable:
        assert p not in doc["paths"]
    assert "/secret/inside" not in doc["paths"]
    assert "/docs/f00" in doc["paths"] and "/links/h2" in doc["paths"]
    assert doc["skipped"] == len(unreadable)
    (note,) = [n for n in doc["notes"] if n.startswith("skipped")]
    head, listed = note.split(": ", 1)
    assert head == f"skipped {len(unreadable)} paths (permission denied)"
    assert sorted(listed.split(", ")) == sorted(unreadable)
    # GETFSMAP answers unprivileged callers on ext4 and (on recent kernels) xfs.
    assert doc["free_known"] == (fs.fstype != "btrfs")


def test_block_count_is_the_devices(fs: Mounted, layouts: dict[int, Layout]) -> None:
    """The block count is the file system's own, metadata included, as its tools give it
    (dumpe2fs's block count, xfs_info's data blocks, its internal log among them); btrfs
    answers no GETFSMAP and keeps statvfs's."""
    total = layouts[256].facts.blocks_total
    if fs.fstype == "ext4":
        head = _run("dumpe2fs", "-h", fs.dev)
        assert total == int(re.search(r"Block count:\s+(\d+)", head).group(1))  # type: ignore[union-attr]
    elif fs.fstype == "xfs":
        info = _run("xfs_info", str(fs.mnt))
        data = re.search(r"^data\s+=.*?blocks=(\d+)", info, re.M)
        assert data is not None and total == int(data.group(1))
        assert total > os.statvfs(fs.mnt).f_blocks  # statvfs leaves the log out
    else:
        assert total == os.statvfs(fs.mnt).f_blocks


def test_free_space_per_fs(fs: Mounted, layouts: dict[int, Layout]) -> None:
    layout = layouts[256]
    if fs.fstype == "btrfs":
        assert not layout.facts.free_space_known
        assert len(layout.free) == 0
        assert any(n.startswith("free space unknown") for n in layout.notes)
    else:
        assert layout.facts.free_space_known
        # Free extents never overlap a file's extents.
        used = np.zeros(int(layout.facts.blocks_total) * 2, bool)
        f = layout.files
        real = (f.ext_flags & (EXTENT_DELALLOC | EXTENT_INLINE)) == 0
        for p, n in zip(f.ext_physical[real].tolist(), f.ext_length[real].tolist(), strict=True):
            used[p : p + n] = True
        for s, n in zip(layout.free.start.tolist(), layout.free.length.tolist(), strict=True):
            assert not used[s : s + n].any()


def _e2freefrag(dev: str) -> tuple[int, int, int, dict[int, int]]:
    """Total blocks, free blocks, free extents and {bucket lower bound in bytes: extents}
    from e2freefrag."""
    out = _run("e2freefrag", dev)
    total = int(re.search(r"Total blocks: (\d+)", out).group(1))  # type: ignore[union-attr]
    free_blocks = int(re.search(r"Free blocks: (\d+)", out).group(1))  # type: ignore[union-attr]
    extents = int(re.search(r"Num. free extent: (\d+)", out).group(1))  # type: ignore[union-attr]
    unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    hist = {}
    for m in re.finditer(r"^\s*(\d+)([KMGT])\.\.\.\s*\S+\s*:\s*(\d+)\s+(\d+)", out, re.M):
        hist[int(m.group(1)) * unit[m.group(2)]] = int(m.group(3))
    return total, free_blocks, extents, hist


def test_ext4_free_space_matches_e2freefrag(workdir: Path) -> None:
    m = _mount(workdir, "ext4", "-free")
    try:
        rnd = random.Random(11)
        names = []
        for i in range(300):
            p = m.mnt / f"f{i}"
            p.write_bytes(b"d" * (4096 * rnd.randint(1, 40)))
            names.append(p)
        os.sync()
        for p in rnd.sample(names, 150):  # holes of many sizes in the free space
            p.unlink()
        os.sync()
        layout = read_live_layout(m.mnt)
        statvfs_blocks = os.statvfs(m.mnt).f_blocks
        os.sync()
        total, free_blocks, extents, hist = _e2freefrag(m.dev)
    finally:
        _umount(m)
    bs = layout.facts.block_size
    assert layout.facts.free_space_known
    # The block count is the device's, metadata included (statvfs leaves that out), so that
    # fullness means the same in a live snapshot as in an offline one.
    assert layout.facts.blocks_total == total > statvfs_blocks
    assert layout.free.blocks == free_blocks
    assert len(layout.free) == extents
    got: dict[int, int] = {}
    for n in layout.free.length.tolist():
        low = bs << (int(n).bit_length() - 1)
        got[low] = got.get(low, 0) + 1
    assert got == hist
    assert len(hist) >= 3


def test_pseudo_file_systems_refused(workdir: Path) -> None:
    for p in ("/proc", "/sys", "/dev"):
        if os.path.isdir(p):
            with pytest.raises(SourceError, match="no block layout"):
                read_live_layout(Path(p))
    t = workdir / "tmpfs"
    t.mkdir()
    try:
        _run("mount", "-t", "tmpfs", "-o", "size=1m", "fsage-test", str(t))
        with pytest.raises(SourceError, match=r"is on a tmpfs file system"):
            read_live_layout(t)
    finally:
        subprocess.run(["umount", str(t)], check=False)


def test_not_a_directory_refused(workdir: Path) -> None:
    with pytest.raises(SourceError, match="not a directory"):
        read_live_layout(Path("/etc/hostname"))
    with pytest.raises(SourceError, match="No such file"):
        read_live_layout(workdir / "missing")


def test_mountinfo_unescapes_names() -> None:
    line = b"36 25 8:1 / /mnt/a\\040b rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
    (m,) = read_mountinfo(line)
    assert m.mount_point == b"/mnt/a b"
    assert (m.fstype, m.source, m.major, m.minor) == ("ext4", "/dev/sda1", 8, 1)


def test_merge_extents_rules() -> None:
    from fsage.snapshotter.live import FIEMAP_EXTENT_DTYPE

    raw = np.zeros(5, FIEMAP_EXTENT_DTYPE)
    # file 0: two contiguous (merge), then a gap; file 1: contiguous with file 0's end (no merge)
    rows = [
        (0, 40960, 4096, 0),
        (4096, 45056, 8192, 0x1000),  # MERGED flag is ignored when comparing
        (20480, 90000 * 4096, 4096, 0x801),  # unwritten, last
        (0, 90001 * 4096, 4096, 0),
        (4096, 90002 * 4096, 100, 0x301),  # inline, not aligned
    ]
    for i, (r_lo, r_po, r_ln, r_fl) in enumerate(rows):
        raw[i]["logical"], raw[i]["physical"] = r_lo, r_po
        raw[i]["length"], raw[i]["flags"] = r_ln, r_fl
    off, lo, po, ln, fl = merge_extents(raw, np.array([3, 2]), 4096)
    assert off.tolist() == [0, 2, 4]
    assert lo.tolist() == [0, 5, 0, 1]
    assert po.tolist() == [10, 90000, 90001, 90002]
    assert ln.tolist() == [3, 1, 1, 1]
    assert fl.tolist() == [0, EXTENT_UNWRITTEN, 0, EXTENT_INLINE]


# --- the C walk (fsage._live) against the Python walk and against odd trees --------------------


def _same_layout(py: Layout, c: Layout) -> None:
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


def test_c_walk_gives_the_python_walks_layout(fs: Mounted) -> None:
    if not c_walker_available():
        pytest.skip("fsage._live is not built")
    for top in (fs.mnt, fs.mnt / "docs" / "deep"):
        read_live_layout(top, engine="python")  # directories' atime settles (relatime)
        py = read_live_layout(top, engine="python")
        c = read_live_layout(top, engine="c", workers=1)
        _same_layout(py, c)
        assert len(c.files) >= 5
    # crtime: statx's birth time, as stat(1) prints it (whole seconds; 0 where there is none).
    c = read_live_layout(fs.mnt, engine="c", workers=1)
    paths = _by_path(c)
    out = _run("stat", "-c", "%i %W", *(str(fs.mnt / p.lstrip("/")) for p in sorted(paths)))
    births = {int(i): int(w) for i, w in (line.split() for line in out.splitlines())}
    got = {int(i): int(t) // 10**9 for i, t in zip(c.files.ino, c.files.crtime, strict=True)}
    assert got == {i: max(w, 0) for i, w in births.items()}
    assert any(w > 0 for w in births.values())


def test_each_directory_is_read_in_inode_order(fs: Mounted) -> None:
    """Both walks take a directory's entries by inode number, not in the order the directory
    lists them (ext4: by name hash), so the inodes are read as they lie."""
    engines = ["python", "c"] if c_walker_available() else ["python"]
    for engine in engines:
        layout = read_live_layout(fs.mnt, engine=engine, workers=1)
        files, links = layout.files, layout.links
        regular = set(files.ino[files.is_regular()].tolist())  # a directory's name is
        by_dir: dict[int, list[int]] = {}  # recorded when the directory itself is read
        for parent, ino in zip(links.parent.tolist(), links.ino.tolist(), strict=True):
            if ino in regular:
                by_dir.setdefault(parent, []).append(ino)
        assert any(len(inos) > 3 for inos in by_dir.values())
        for inos in by_dir.values():
            assert inos == sorted(inos), engine


def _scratch(workdir: Path, name: str) -> Mounted:
    if not c_walker_available():
        pytest.skip("fsage._live is not built")
    return _mount(workdir, "ext4", name)


def test_c_walk_deep_tree_beyond_path_max(workdir: Path) -> None:
    """A chain of directories whose path is longer than PATH_MAX: the C walk opens it piece by
    piece; the Python walk (paths) cannot and says so."""
    m = _scratch(workdir, "-deep")
    try:
        comp = "d" * 200
        depth = 30  # 30 * 201 bytes > 4096
        fd = os.open(m.mnt, os.O_RDONLY | os.O_DIRECTORY)
        for _ in range(depth):
            os.mkdir(comp, dir_fd=fd)
            nfd = os.open(comp, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nfd
        leaf = os.open("leaf", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(leaf, b"L" * 20000)
        os.fsync(leaf)
        leaf_ino = os.fstat(leaf).st_ino
        os.close(leaf)
        os.close(fd)
        c = read_live_layout(m.mnt, engine="c", workers=1)
        py = read_live_layout(m.mnt, engine="python")
    finally:
        _umount(m)
    want = "/" + "/".join([comp] * depth) + "/leaf"
    assert c.paths()[leaf_ino] == [want]
    row = int(np.flatnonzero(c.files.ino == leaf_ino)[0])
    ext = _extents(c, row)
    assert sum(e[2] for e in ext) == 5 and ext[0][0] == 0
    assert not c.facts.extra["skipped"]
    assert leaf_ino not in py.paths()
    assert any("File name too long" in n for n in py.notes)


def test_c_walk_huge_directory_and_hard_links(workdir: Path) -> None:
    """One directory needing several getdents64 calls; hard links across directories."""
    m = _scratch(workdir, "-huge")
    try:
        big = m.mnt / "big"
        big.mkdir()
        names = [f"entry-with-a-longish-name-{i:06d}" for i in range(9000)]
        for n in names:
            (big / n).touch()
        (m.mnt / "h").mkdir()
        (m.mnt / "h/a").write_bytes(b"a" * 10000)
        for i in range(3):
            os.link(m.mnt / "h/a", big / f"link{i}")
        os.sync()
        read_live_layout(m.mnt, engine="python")
        py = read_live_layout(m.mnt, engine="python")
        c = read_live_layout(m.mnt, engine="c", workers=1)
        c2 = read_live_layout(m.mnt, engine="c", workers=2)
        ino = os.stat(m.mnt / "h/a").st_ino
        # A progress callback that raises ends the walk with its exception, with one worker
        # thread or several.
        for workers in (1, 2):
            seen: list[int] = []

            def progress(n: int, seen: list[int] = seen) -> None:
                seen.append(n)
                raise KeyError("enough")

            with pytest.raises(KeyError, match="enough"):
                read_live_layout(m.mnt, engine="c", workers=workers, progress=progress)
            assert len(seen) == 1
            assert seen[0] == 4096 if workers == 1 else 4096 <= seen[0] < 9000
    finally:
        _umount(m)
    _same_layout(py, c)
    got = {p for ps in c.paths().values() for p in ps}
    assert {f"/big/{n}" for n in names} <= got
    assert c.paths()[ino] == ["/big/link0", "/big/link1", "/big/link2", "/h/a"]
    assert int(np.count_nonzero(c.files.ino == ino)) == 1
    assert int(np.count_nonzero(c.links.ino == ino)) == 4
    assert len(c.files) == 9000 + 4 + (1 if "/lost+found" in got else 0)  # h/a, /, big, h
    assert c2.paths() == c.paths()
    assert np.array_equal(c2.files.ino, c.files.ino)
    assert np.array_equal(c2.files.ext_physical, c.files.ext_physical)


def test_c_walk_files_vanishing_mid_walk(workdir: Path) -> None:
    """Files deleted after their directory was listed are skipped and noted, not fatal."""
    m = _scratch(workdir, "-vanish")
    try:
        v = m.mnt / "v"
        v.mkdir()
        total = 6000
        for i in range(total):
            (v / f"f{i}").touch()
        os.sync()
        deleted: list[int] = []

        def progress(n: int) -> None:  # the C walk calls this after 4096 records
            if not deleted:
                for p in v.iterdir():
                    p.unlink()
                deleted.append(n)

        layout = read_live_layout(m.mnt, engine="c", workers=1, progress=progress)
    finally:
        _umount(m)
    assert deleted == [4096]
    in_v = [p for ps in layout.paths().values() for p in ps if p.startswith("/v/")]
    vanished = layout.facts.extra["skipped"]
    assert vanished > 0
    assert len(in_v) + vanished == total
    (note,) = [n for n in layout.notes if n.startswith("skipped")]
    assert note.startswith(f"skipped {vanished} paths (vanished or changed during the walk): /v/f")


def test_c_walk_rejects_bad_tasks() -> None:
    if not c_walker_available():
        pytest.skip("fsage._live is not built")
    from fsage import _live

    kw: dict[str, Any] = dict(
        mode=_live.MODE_WALK,
        dev=0,
        submounts=[],
        sync=False,
        batch=8,
        dir_fiemap=True,
        getversion=True,
        block_size=4096,
    )
    with pytest.raises(ValueError, match="start with '/'"):
        _live.walk(b"/", [(b"etc", None)], **kw)
    with pytest.raises(ValueError, match="bad mode or batch"):
        _live.walk(b"/", [(b"", None)], **{**kw, "batch": 0})
    with pytest.raises(FileNotFoundError):
        _live.walk(b"/nonexistent-fsage-dir", [(b"", None)], **kw)
    for threads in (0, _live.MAX_THREADS + 1):
        with pytest.raises(ValueError, match="threads must be between"):
            _live.walk(b"/", [(b"", None)], **{**kw, "threads": threads})
    with pytest.raises(TypeError, match="block_size"):
        _live.walk(b"/", [(b"", None)], **{**kw, "block_size": 0})


def test_c_walk_extent_flags_are_fsages() -> None:
    """The C walk converts FIEMAP flags to fsage's own; its constants must be layout.py's."""
    if not c_walker_available():
        pytest.skip("fsage._live is not built")
    from fsage import _live

    assert (
        _live.EXTENT_UNWRITTEN,
        _live.EXTENT_DELALLOC,
        _live.EXTENT_INLINE,
        _live.EXTENT_SHARED,
        _live.EXTENT_ENCODED,
    ) == (EXTENT_UNWRITTEN, EXTENT_DELALLOC, EXTENT_INLINE, EXTENT_SHARED, EXTENT_ENCODED)


def test_c_walk_threads_share_a_wide_tree(workdir: Path) -> None:
    """Many directories read by several threads at once, with hard links whose names lie in
    directories different threads read: each inode is recorded once, with every name, and the
    layout is the one a single thread reads."""
    m = _scratch(workdir, "-wide")
    try:
        rnd = random.Random(3)
        for d in range(60):
            sub = m.mnt / f"d{d:02d}" / f"e{d % 7}"
            sub.mkdir(parents=True)
            for f in range(30):
                (sub / f"f{f}").write_bytes(rnd.randbytes(rnd.randrange(1, 40000)))
        shared = m.mnt / "d00/e0/f0"
        for d in range(1, 60, 3):
            os.link(shared, m.mnt / f"d{d:02d}/e{d % 7}/link")
        os.sync()
        read_live_layout(m.mnt, engine="python")  # directories' atime settles (relatime)
        py = read_live_layout(m.mnt, engine="python")
        one = read_live_layout(m.mnt, engine="c", workers=1)
        many = [read_live_layout(m.mnt, engine="c", workers=w) for w in (2, 3, 8)]
        ino = os.stat(shared).st_ino
    finally:
        _umount(m)
    _same_layout(py, one)

    def link_set(layout: Layout) -> set[tuple[int, int, bytes]]:
        t = layout.links
        return {
            (int(t.parent[i]), int(t.ino[i]), t.names[int(t.name_off[i]) : int(t.name_off[i + 1])])
            for i in range(len(t))
        }

    for got in many:
        for col in dataclasses.fields(one.files):
            name = col.name
            assert np.array_equal(getattr(got.files, name), getattr(one.files, name)), name
        assert link_set(got) == link_set(one)
        assert len(got.links) == len(one.links)
        assert int(np.count_nonzero(got.files.ino == ino)) == 1
        assert len(got.paths()[ino]) == 1 + len(range(1, 60, 3))
    assert len(one.files) >= 60 * 30


def test_c_walk_under_a_low_descriptor_limit(workdir: Path) -> None:
    """Files are closed in runs; with few descriptors allowed the run is closed early instead
    of files being skipped."""
    m = _scratch(workdir, "-nofile")
    try:
        d = m.mnt / "many"
        d.mkdir()
        for i in range(300):
            (d / f"f{i}").write_bytes(b"x" * 100)
        os.sync()
        code = (
            "import resource, sys\n"
            "from pathlib import Path\n"
            "from fsage.snapshotter.live import read_live_layout\n"
            "resource.setrlimit(resource.RLIMIT_NOFILE, (40, 40))\n"
            "layout = read_live_layout(Path(sys.argv[1]), engine='c', workers=2)\n"
            "print(len(layout.files), layout.facts.extra['skipped'])\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", code, str(m.mnt)], check=True, capture_output=True, text=True
        ).stdout.split()
    finally:
        _umount(m)
    assert int(out[1]) == 0
    assert int(out[0]) >= 302  # the files, "/" and "/many"


@pytest.mark.slow
def test_the_machines_own_usr_matches_find_and_filefrag() -> None:
    """A tree nobody here wrote: /usr as installed. Its regular files are those find lists
    (one record per inode), and a sample of them have filefrag's extents and stat's sizes."""
    usr = Path("/usr")
    try:
        scope_of(usr)
    except SourceError as exc:
        pytest.skip(f"the live reader cannot read /usr here: {exc}")
    if shutil.which("filefrag") is None:
        pytest.skip("filefrag is not installed")
    listed = _run("find", str(usr), "-xdev", "-type", "f", "-printf", r"%i %p\n")
    by_ino: dict[int, str] = {}
    for line in listed.splitlines():
        ino, _, path = line.partition(" ")
        by_ino.setdefault(int(ino), path)
    layout = read_live_layout(usr)
    files = layout.files
    regular = files.is_regular()
    assert len(by_ino) > 1000
    assert set(files.ino[regular].tolist()) == set(by_ino)
    rows = {int(ino): i for i, ino in enumerate(files.ino.tolist())}
    bs = layout.facts.block_size
    rng = random.Random(16)
    checked = 0
    for ino in rng.sample(sorted(by_ino), 300):
        path = Path(by_ino[ino])
        row = rows[ino]
        st = os.lstat(path)
        if st.st_ctime_ns != int(files.ctime[row]):
            continue  # changed since the read (a package being installed)
        assert int(files.size[row]) == st.st_size, path
        assert _extents(layout, row) == filefrag_extents(path, bs), path
        checked += 1
    assert checked >= 250
