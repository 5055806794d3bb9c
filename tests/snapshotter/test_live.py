"""The live reader against real mounted ext4, xfs and btrfs file systems, and against /usr.

Oracles: ``filefrag -v`` (extents and flags of every file), ``blkid`` (uuid, label),
``lsattr -v`` (ext4 generation), ``stat`` (metadata, birth times), ``dumpe2fs`` and
``xfs_info`` (block counts), ``find`` (the files of /usr), and the kernel's own refusal to let
the walk see inside other mounts. The free space and the sources refused are in
test_live_sources.py; the C walk on odd trees in test_live_cwalk.py.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from snapshotter.livefs import (
    MARKS,
    Mounted,
    by_path,
    file_extents,
    filefrag_extents,
    mount,
    run,
    same_layout,
    scratch_dir,
    umount,
)

from fsage.errors import SourceError
from fsage.layout import (
    EXTENT_DELALLOC,
    EXTENT_INLINE,
    EXTENT_SHARED,
    EXTENT_UNWRITTEN,
    Layout,
)
from fsage.snapshotter.live import c_walker_available, read_live_layout, scope_of

pytestmark = MARKS


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    with scratch_dir() as d:
        yield d


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
    run("fallocate", "--keep-size", "--offset", "0", "--length", str(1 << 20), str(root / "beyond"))
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
        run("cp", "--reflink=always", str(root / "docs/deep/er/leaf"), str(root / "reflinked"))
    # Not readable by others: the unprivileged run must skip these and say so.
    (root / "secret").mkdir(mode=0o700)
    (root / "secret/inside").write_bytes(b"s" * 3000)
    (root / "secret").chmod(0o700)
    (root / "private").write_bytes(b"p" * 3000)
    (root / "private").chmod(0o600)
    os.sync()


@pytest.fixture(scope="module", params=["ext4", "xfs", "btrfs"])
def fs(request: pytest.FixtureRequest, workdir: Path) -> Iterator[Mounted]:
    m = mount(workdir, request.param)
    try:
        _populate(m.mnt, m.fstype)
        yield m
    finally:
        umount(m)


@pytest.fixture(scope="module")
def layouts(fs: Mounted) -> dict[int, Layout]:
    """The layout read with the default buffer and with a 1- and 3-extent buffer."""
    return {b: read_live_layout(fs.mnt, fiemap_batch=b) for b in (256, 3, 1)}


def test_extents_match_filefrag_for_every_file(fs: Mounted, layouts: dict[int, Layout]) -> None:
    layout = layouts[256]
    bs = layout.facts.block_size
    paths = by_path(layout)
    checked = 0
    for rel, row in paths.items():
        if not stat.S_ISREG(int(layout.files.mode[row])):
            continue
        full = fs.mnt / rel.lstrip("/")
        assert file_extents(layout, row) == filefrag_extents(full, bs), rel
        checked += 1
    assert checked >= 50
    # The tree has what it was built to have.
    frag = file_extents(layout, paths["/frag1"])
    assert len(frag) > 1
    assert sum(e[2] for e in frag) == 48
    prealloc = file_extents(layout, paths["/prealloc"])
    assert any(e[3] & EXTENT_UNWRITTEN for e in prealloc)
    assert sum(e[2] for e in prealloc) == 256
    beyond = file_extents(layout, paths["/beyond"])
    assert sum(e[2] for e in beyond) == 256  # the extents past the end of the file are there
    assert any(e[3] & EXTENT_UNWRITTEN and e[0] >= 2 for e in beyond)
    sparse = file_extents(layout, paths["/sparse"])
    assert [(e[0], e[2]) for e in sparse] == [(0, 1), (2560, 1)]
    assert file_extents(layout, paths["/empty"]) == []
    if fs.fstype == "btrfs":
        assert file_extents(layout, paths["/tiny"])[0][3] & EXTENT_INLINE
    if fs.fstype in ("xfs", "btrfs"):
        assert all(e[3] & EXTENT_SHARED for e in file_extents(layout, paths["/reflinked"]))


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
    paths = by_path(layout)
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
    assert facts.uuid == run("blkid", "-p", "-s", "UUID", "-o", "value", fs.dev).strip()
    assert facts.label == f"fsage-{fs.fstype}"
    if fs.fstype == "ext4":
        layout = layouts[256]
        paths = by_path(layout)
        out = run("lsattr", "-v", str(fs.mnt / "docs/f05"))
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
        run("mount", "-t", "tmpfs", "-o", "size=1m", "fsage-test", str(inner))
        (inner / "hidden").write_bytes(b"x")
        run("mount", "--bind", str(fs.mnt / "links"), str(bind))  # same device
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
    run("btrfs", "subvolume", "create", str(sub))
    try:
        (sub / "in-subvol").write_bytes(b"q" * 5000)
        layout = read_live_layout(fs.mnt)
        got = {p for ps in layout.paths().values() for p in ps}
        assert not any(p.startswith("/subvol") for p in got)
        assert any("/subvol" in n for n in layout.notes)
    finally:
        run("btrfs", "subvolume", "delete", str(sub))


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
        head = run("dumpe2fs", "-h", fs.dev)
        assert total == int(re.search(r"Block count:\s+(\d+)", head).group(1))  # type: ignore[union-attr]
    elif fs.fstype == "xfs":
        info = run("xfs_info", str(fs.mnt))
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


def test_c_walk_gives_the_python_walks_layout(fs: Mounted) -> None:
    if not c_walker_available():
        pytest.skip("fsage._live is not built")
    for top in (fs.mnt, fs.mnt / "docs" / "deep"):
        read_live_layout(top, engine="python")  # directories' atime settles (relatime)
        py = read_live_layout(top, engine="python")
        c = read_live_layout(top, engine="c", workers=1)
        same_layout(py, c)
        assert len(c.files) >= 5
    # crtime: statx's birth time, as stat(1) prints it (whole seconds; 0 where there is none).
    c = read_live_layout(fs.mnt, engine="c", workers=1)
    paths = by_path(c)
    out = run("stat", "-c", "%i %W", *(str(fs.mnt / p.lstrip("/")) for p in sorted(paths)))
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
    listed = run("find", str(usr), "-xdev", "-type", "f", "-printf", r"%i %p\n")
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
        assert file_extents(layout, row) == filefrag_extents(path, bs), path
        checked += 1
    assert checked >= 250
