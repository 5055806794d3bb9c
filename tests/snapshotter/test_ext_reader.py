"""The ext2/3/4 reader against e2fsprogs: every file's blocks, names, free space and facts.

Images are generated with mke2fs -d from seeded trees (tests/images.py); the oracle is what
debugfs, dumpe2fs and e2freefrag print about the same image.
"""

from __future__ import annotations

import json
import os
import random
import stat
import subprocess
import sys
from dataclasses import fields, replace
from pathlib import Path

import numpy as np
import pytest
from images import (
    KIB,
    MIB,
    InodeStat,
    TreeSpec,
    build_tree,
    debugfs,
    dumpe2fs_header,
    e2freefrag,
    free_extents_dumpe2fs,
    freefrag_histogram,
    inode_offset,
    make_ext_image,
    merge_runs,
    ncheck,
    patch,
    run,
    stat_inodes,
    used_inodes,
    write_sparse,
)

from fsage.layout import (
    DAMAGE_EXTENT_TREE,
    DAMAGE_INODE_CHECKSUM,
    EXTENT_UNWRITTEN,
    META_DIND,
    META_EXTENT_NODE,
    META_IND,
    META_TIND,
    META_XATTR,
    FileTable,
    Layout,
)
from fsage.snapshotter.ext import read_ext_layout

pytestmark = pytest.mark.usefixtures("e2fsprogs")

EXT4_INLINE_DATA_FL = 0x10000000
META_LABELS = {"IND": META_IND, "DIND": META_DIND, "TIND": META_TIND}
TYPE_NAMES = {
    stat.S_IFREG: "regular",
    stat.S_IFDIR: "directory",
    stat.S_IFLNK: "symlink",
    stat.S_IFIFO: "FIFO",
}


# ---------------------------------------------------------------- the cross-check


def meta_of(table: FileTable, i: int) -> list[tuple[int, int]]:
    a, b = int(table.meta_off[i]), int(table.meta_off[i + 1])
    return sorted(
        zip(table.meta_kind[a:b].tolist(), table.meta_physical[a:b].tolist(), strict=True)
    )


def extents_of(table: FileTable, i: int) -> list[tuple[int, int, int, bool]]:
    return [
        (lo, ph, n, bool(fl & EXTENT_UNWRITTEN)) for lo, ph, n, fl in table.extents_of(i).tolist()
    ]


def expected_meta(st: InodeStat) -> list[tuple[int, int]]:
    out = [
        (META_EXTENT_NODE if label.startswith("ETB") else META_LABELS[label], block)
        for label, block in st.meta
    ]
    if st.file_acl:
        out.append((META_XATTR, st.file_acl))
    return sorted(out)


def check_file(table: FileTable, i: int, st: InodeStat) -> None:
    ino = int(table.ino[i])
    mode = int(table.mode[i])
    assert TYPE_NAMES.get(stat.S_IFMT(mode), "?") == st.kind, ino
    assert mode & 0o7777 == st.mode, ino
    assert int(table.size[i]) == st.size, ino
    assert int(table.nlink[i]) == st.links, ino
    assert int(table.generation[i]) == st.generation, ino
    assert int(table.damaged[i]) == 0, ino
    assert extents_of(table, i) == merge_runs(st.extents), ino
    assert meta_of(table, i) == expected_meta(st), ino
    if st.inline_size is not None:
        assert int(table.flags[i]) & EXT4_INLINE_DATA_FL, ino


def check_image(image: Path, layout: Layout, *, names: bool = True) -> dict[int, InodeStat]:
    """Assert that ``layout`` says what e2fsprogs says of ``image``; return debugfs's stats."""
    head = dumpe2fs_header(image)
    facts = layout.facts
    block_size = int(head["Block size"])
    assert facts.block_size == block_size
    assert facts.blocks_total == int(head["Block count"])
    assert facts.blocks_free == int(head["Free blocks"])
    assert facts.inodes_total == int(head["Inode count"])
    assert facts.inodes_free == int(head["Free inodes"])
    assert facts.uuid == head["Filesystem UUID"]
    assert facts.label == (
        "" if head["Filesystem volume name"] == "<none>" else head["Filesystem volume name"]
    )
    assert sorted(facts.features) == sorted(head["Filesystem features"].split())
    assert facts.first_data_block == int(head["First block"])
    assert facts.extra["inodes_per_group"] == int(head["Inodes per group"])
    assert facts.mkfs["flex_bg_size"] == (
        int(head["Flex block group size"]) if "Flex block group size" in head else None
    )
    first_ino = int(head["First inode"])
    n_groups = -(-(facts.blocks_total - facts.first_data_block) // int(head["Blocks per group"]))
    assert len(facts.groups) == n_groups

    # Which inodes: every in-use inode from s_first_ino on, and the root, are user files;
    # reserved inodes in use (resize 7, journal 8) are recorded apart.
    used = used_inodes(image)
    user = sorted(i for i in used if i >= first_ino or i == 2)
    files, special = layout.files, layout.special
    assert files.ino.tolist() == user
    assert set(special.ino.tolist()) <= {i for i in used if i < first_ino and i != 2}
    expect_special = set()
    if "resize_inode" in facts.features:
        expect_special.add(7)
    if "has_journal" in facts.features:
        expect_special.add(int(head["Journal inode"]))
    assert expect_special <= set(special.ino.tolist())

    stats = stat_inodes(image, user + special.ino.tolist())
    for table in (files, special):
        for i in range(len(table)):
            check_file(table, i, stats[int(table.ino[i])])

    if names:
        check_names(image, layout, [i for i in user if i != 2])

    # Free space: exact extents from the group bitmaps, totals and histogram from e2freefrag.
    cluster = int(head.get("Cluster size", block_size)) // block_size
    free = list(zip(layout.free.start.tolist(), layout.free.length.tolist(), strict=True))
    assert free == free_extents_dumpe2fs(image, cluster)
    ff = e2freefrag(image)
    assert ff.total_blocks == facts.blocks_total
    assert ff.free_blocks == layout.free.blocks
    if cluster == 1:  # e2freefrag miscounts its histogram with bigalloc
        assert ff.free_extents == len(layout.free)
        assert freefrag_histogram(layout.free.length.tolist()) == ff.histogram
    return stats


def check_names(image: Path, layout: Layout, inos: list[int]) -> None:
    """Every name of every inode (hard links included), as debugfs ncheck finds them."""
    expected = ncheck(image, inos)
    paths = layout.paths()
    assert paths.pop(2) == ["/"]
    assert paths == expected
    assert len(layout.links) == sum(len(v) for v in expected.values())


def read(image: Path) -> Layout:
    return read_ext_layout(image)


# ---------------------------------------------------------------- the images


# A sparse file with a few data chunks separated by holes (each chunk one extent).
def holey(block: int, chunks: int, chunk_blocks: int = 1) -> tuple[int, list[tuple[int, int]]]:
    step = 2 * chunk_blocks * block
    return chunks * step, [(k * step, chunk_blocks * block) for k in range(chunks)]


BASE = TreeSpec(files=40, dirs=6)

CASES: dict[str, tuple[str, int, list[str], list[str], str, TreeSpec]] = {
    # Block maps with 1 KiB blocks: a 300 KiB file needs a double indirect block; one byte at
    # 70 MiB needs a triple indirect block (block 71680 > 12 + 256 + 65536).
    "ext2-1k": (
        "ext2",
        1024,
        [],
        [],
        "32M",
        replace(BASE, big={"dind": 300 * KIB}, sparse={"tind": (70 * MIB + 1, [(70 * MIB, 1)])}),
    ),
    "ext2-4k": ("ext2", 4096, [], ["-g", "2048"], "32M", replace(BASE, big={"dind": 4200 * KIB})),
    "ext3-1k": (
        "ext3",
        1024,
        [],
        [],
        "32M",
        replace(BASE, big={"dind": 300 * KIB}, sparse={"holes": holey(1024, 30, 3)}),
    ),
    "ext3-4k": ("ext3", 4096, [], ["-g", "2048"], "32M", BASE),
    "ext4-1k-flex": (
        "ext4",
        1024,
        [],
        [],
        "32M",
        # 6 extents: a tree of depth 1; 400 extents: depth 2 (84 per 1 KiB leaf, 4 in the inode).
        replace(BASE, sparse={"holes6": holey(1024, 6, 2), "holes400": holey(1024, 400)}),
    ),
    "ext4-4k-flex": (
        "ext4",
        4096,
        [],
        ["-g", "2048", "-G", "4"],
        "32M",
        replace(BASE, sparse={"holes6": holey(4096, 6, 3)}),
    ),
    "ext4-1k-noflex": (
        "ext4",
        1024,
        ["^flex_bg"],
        [],
        "32M",
        replace(BASE, sparse={"holes6": holey(1024, 6)}),
    ),
    "ext4-4k-noflex": ("ext4", 4096, ["^flex_bg"], ["-g", "2048"], "32M", BASE),
    "ext4-bigalloc": (
        "ext4",
        4096,
        ["bigalloc"],
        ["-C", "16384"],
        "64M",
        replace(BASE, sparse={"holes6": holey(4096, 6, 5)}),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_generated_image_matches_e2fsprogs(tmp_path: Path, case: str) -> None:
    fstype, block, features, extra, size, spec = CASES[case]
    tree = build_tree(tmp_path / "tree", seed=sum(map(ord, case)), spec=spec)
    image = make_ext_image(
        tmp_path, fstype, block_size=block, features=features, extra=extra, tree=tree, size=size
    )
    layout = read(image)
    assert layout.facts.kind == fstype
    assert layout.damaged_files == 0
    stats = check_image(image, layout)
    # The cases reach what they were made for.
    labels = {label for st in stats.values() for label, _ in st.meta}
    if "dind" in spec.big:
        assert "DIND" in labels
    if "tind" in spec.sparse:
        assert "TIND" in labels
    if "holes6" in spec.sparse:
        assert any(lab.startswith("ETB") for lab in labels)
    if "holes400" in spec.sparse:
        assert "ETB1" in labels
    if len(layout.facts.groups) > 1 and "flex_bg" not in layout.facts.features:
        # Without flex_bg every group keeps its bitmaps and inode table inside itself.
        for g in layout.facts.groups:
            assert g["start"] <= g["inode_table"] < g["start"] + g["length"]


def test_sparse_file_holes_are_gaps_in_logical_order(tmp_path: Path) -> None:
    chunks = [(0, 3 * KIB), (10 * KIB, KIB), (100 * KIB, 5 * KIB), (1000 * KIB, KIB)]
    spec = TreeSpec(files=0, dirs=0, hard_links=0, symlinks=0, empty_files=0)
    spec.sparse = {"sparse": (2 * MIB, chunks)}
    tree = build_tree(tmp_path / "tree", 7, spec)
    image = make_ext_image(tmp_path, "ext4", block_size=1024, tree=tree, size="8M")
    layout = read(image)
    check_image(image, layout)
    i = int(np.flatnonzero(layout.files.size == 2 * MIB)[0])
    ext = layout.files.extents_of(i)
    logical = ext[:, 0].tolist()
    assert logical == sorted(logical)
    # Data exactly where it was written, holes everywhere else (1 KiB blocks).
    blocks = [(lo, n) for lo, _, n, _ in ext.tolist()]
    covered: list[int] = []
    for lo, n in blocks:
        covered.extend(range(lo, lo + n))
    assert covered == [0, 1, 2, 10, *range(100, 105), 1000]
    assert int(layout.files.data_blocks[i]) == 10


def _inline_image(tmp_path: Path) -> Path:
    tree = tmp_path / "tree"
    tree.mkdir()
    for k, n in enumerate([1, 10, 40, 59]):
        (tree / f"tiny{k}").write_bytes(b"x" * n)
    (tree / "tinydir").mkdir()
    (tree / "tinydir" / "a").write_bytes(b"a")
    (tree / "big").write_bytes(bytes(range(256)) * 64)
    return make_ext_image(
        tmp_path, "ext4", block_size=4096, features=["inline_data"], tree=tree, size="16M"
    )


def test_inline_data_has_no_blocks(tmp_path: Path) -> None:
    image = _inline_image(tmp_path)
    layout = read(image)
    stats = check_image(image, layout, names=False)
    inline = {ino for ino, st in stats.items() if st.inline_size is not None}
    expected = ncheck(image, layout.files.ino.tolist())
    inline_paths = {p for ino in inline for p in expected.get(ino, [])}
    assert {"/tiny0", "/tiny1", "/tiny2", "/tiny3", "/tinydir", "/tinydir/a"} == inline_paths
    for i in range(len(layout.files)):
        if int(layout.files.ino[i]) in inline:
            assert int(layout.files.extent_counts[i]) == 0
            assert int(layout.files.flags[i]) & EXT4_INLINE_DATA_FL


def test_inline_directory_names(tmp_path: Path) -> None:
    image = _inline_image(tmp_path)
    layout = read(image)
    check_names(image, layout, [i for i in layout.files.ino.tolist() if i != 2])


def _fragmented_file(tmp_path: Path, kind: str, n: int) -> tuple[Layout, dict[int, InodeStat], int]:
    """Fill a 4 MiB ``kind`` (1 KiB blocks) with ``n`` 1-block files, free every other one, then
    write a file larger than the free space left: it can only go into the 1-block gaps, so it
    has many extents. Returns the layout read (checked against debugfs), debugfs's view of
    every file, and the big file's inode."""
    tree = tmp_path / "tree"
    tree.mkdir()
    for k in range(n):
        (tree / f"s{k:04d}").write_bytes(bytes([k % 251 + 1]) * 1000)
    image = make_ext_image(tmp_path, kind, block_size=1024, tree=tree, size="4M")
    free = int(dumpe2fs_header(image)["Free blocks"])
    src = tmp_path / "payload"
    # More than the free space left, less than that plus the freed gaps.
    src.write_bytes(bytes([7]) * ((free + 100) * 1024))
    debugfs(image, [f"rm /s{k:04d}" for k in range(0, n, 2)], write=True)
    debugfs(image, [f"write {src} frag"], write=True)
    layout = read(image)
    stats = check_image(image, layout)
    return layout, stats, next(i for i, st in stats.items() if st.size == src.stat().st_size)


def test_fragmented_file_with_extent_index_blocks(tmp_path: Path) -> None:
    # Many extents: an extent tree with index blocks.
    layout, stats, ino = _fragmented_file(tmp_path, "ext4", 600)
    assert any(label.startswith("ETB") for label, _ in stats[ino].meta)
    i = int(np.flatnonzero(layout.files.ino == ino)[0])
    assert int(layout.files.extent_counts[i]) > 4


def test_block_mapped_fragmented_file(tmp_path: Path) -> None:
    _, stats, ino = _fragmented_file(tmp_path, "ext3", 400)
    assert {"IND", "DIND"} <= {label for label, _ in stats[ino].meta}


def test_unwritten_extents(tmp_path: Path) -> None:
    tree = build_tree(tmp_path / "tree", 3, TreeSpec(files=5, dirs=1))
    image = make_ext_image(tmp_path, "ext4", block_size=4096, tree=tree, size="16M")
    debugfs(image, ["write /dev/null prealloc", "fallocate /prealloc 0 39"], write=True)
    layout = read(image)
    stats = check_image(image, layout)
    ino = next(i for i, st in stats.items() if st.extents and st.extents[0][3])
    i = int(np.flatnonzero(layout.files.ino == ino)[0])
    ext = layout.files.extents_of(i)
    assert int(ext[:, 2].sum()) == 40
    assert np.all(ext[:, 3] & EXTENT_UNWRITTEN)


def test_hard_links_all_names(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "a" / "b").mkdir(parents=True)
    (tree / "orig").write_bytes(b"y" * 5000)
    for p in ["a/l1", "a/b/l2", "l3", "a/b/l4"]:
        (tree / p).hardlink_to(tree / "orig")
    image = make_ext_image(tmp_path, "ext4", block_size=1024, tree=tree, size="8M")
    layout = read(image)
    check_image(image, layout)
    i = int(np.flatnonzero(layout.files.nlink == 5)[0])
    ino = int(layout.files.ino[i])
    assert layout.paths()[ino] == ["/a/b/l2", "/a/b/l4", "/a/l1", "/l3", "/orig"]
    assert int(np.count_nonzero(layout.links.ino == ino)) == 5


def test_special_inodes_recorded_apart(tmp_path: Path) -> None:
    tree = build_tree(tmp_path / "tree", 11, TreeSpec(files=10, dirs=2))
    image = make_ext_image(tmp_path, "ext3", block_size=1024, tree=tree, size="32M")
    layout = read(image)
    stats = check_image(image, layout)
    specials = layout.special.ino.tolist()
    assert 7 in specials and 8 in specials
    assert not {7, 8} & set(layout.files.ino.tolist())
    # The journal's blocks are the journal inode's: 1 KiB blocks, size from dumpe2fs.
    head = dumpe2fs_header(image)
    j = specials.index(8)
    assert int(layout.special.data_blocks[j]) == int(head["Total journal blocks"])
    assert int(layout.special.size[j]) == stats[8].size
    # The resize inode holds a double indirect block over the reserved GDT blocks.
    r = specials.index(7)
    kinds = [k for k, _ in meta_of(layout.special, r)]
    assert kinds.count(META_DIND) == 1
    assert kinds.count(META_IND) >= int(head["Reserved GDT blocks"])
    # User files and used blocks do not include them.
    user_blocks = int(layout.files.data_blocks.sum())
    assert user_blocks < layout.facts.blocks_total - layout.free.blocks - int(
        head["Total journal blocks"]
    )


# ---------------------------------------------------------------- damage


def _damage_image(tmp_path: Path, features: list[str]) -> tuple[Path, dict[str, int]]:
    tree = build_tree(tmp_path / "tree", 5, TreeSpec(files=12, dirs=2, hard_links=0))
    image = make_ext_image(
        tmp_path, "ext4", block_size=1024, features=features, tree=tree, size="8M"
    )
    inos = {p: i for i, ps in read(image).paths().items() for p in ps}
    return image, inos


def test_broken_extent_header_is_flagged_and_scan_goes_on(tmp_path: Path) -> None:
    image, inos = _damage_image(tmp_path, ["^metadata_csum"])
    before = read(image)
    victim = next(i for p, i in sorted(inos.items()) if p.endswith(".dat"))
    # i_block starts at byte 40 of the inode; its first two bytes are the extent magic 0xf30a.
    patch(image, inode_offset(image, victim) + 40, b"\x00\x00")
    after = read(image)
    assert after.files.ino.tolist() == before.files.ino.tolist()
    damaged = after.files.ino[after.files.damaged != 0].tolist()
    assert damaged == [victim]
    i = int(np.flatnonzero(after.files.ino == victim)[0])
    assert int(after.files.damaged[i]) & DAMAGE_EXTENT_TREE
    assert after.damaged_files == 1
    # Every other file reads as before.
    for j in range(len(after.files)):
        if j != i:
            assert extents_of(after.files, j) == extents_of(before.files, j)


def test_broken_extent_leaf_block_is_flagged(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    size, chunks = holey(1024, 8)

    write_sparse(tree / "holes", size, chunks, random.Random(1))
    (tree / "other").write_bytes(b"z" * 3000)
    image = make_ext_image(
        tmp_path, "ext4", block_size=1024, features=["^metadata_csum"], tree=tree, size="8M"
    )
    before = read(image)
    ino = next(i for i, ps in before.paths().items() if ps == ["/holes"])
    leaf = next(b for label, b in stat_inodes(image, [ino])[ino].meta if label == "ETB0")
    patch(image, leaf * 1024, b"\xff" * 12)  # header of the leaf block
    after = read(image)
    assert after.files.ino.tolist() == before.files.ino.tolist()
    assert after.files.ino[after.files.damaged != 0].tolist() == [ino]
    i = int(np.flatnonzero(after.files.ino == ino)[0])
    assert int(after.files.damaged[i]) & DAMAGE_EXTENT_TREE


def test_inode_checksum_error_is_flagged(tmp_path: Path) -> None:
    image, inos = _damage_image(tmp_path, ["metadata_csum"])
    before = read(image)
    victim = next(i for p, i in sorted(inos.items()) if p.endswith(".dat"))
    # Change i_mtime (byte 16): the inode stays sane but its checksum no longer matches.
    off = inode_offset(image, victim) + 16
    with open(image, "rb") as fh:
        fh.seek(off)
        old = fh.read(1)
    patch(image, off, bytes([old[0] ^ 0x55]))
    after = read(image)
    assert after.files.ino.tolist() == before.files.ino.tolist()
    assert after.files.ino[after.files.damaged != 0].tolist() == [victim]
    i = int(np.flatnonzero(after.files.ino == victim)[0])
    assert int(after.files.damaged[i]) & DAMAGE_INODE_CHECKSUM
    assert after.damaged_files == 1
    # The damaged file's extents are still read.
    assert extents_of(after.files, i) == extents_of(before.files, i)


@pytest.mark.parametrize(
    ("inode_size", "features"),
    [(128, []), (256, []), (1024, []), (256, ["metadata_csum_seed"])],
)
def test_inode_checksums_are_verified_as_e2fsck_does(
    tmp_path: Path, inode_size: int, features: list[str]
) -> None:
    """The scan verifies inode checksums itself (in-use inodes only): a clean image, which
    e2fsck passes, has no damaged inode whatever its inode size or checksum seed, and one bit
    flipped in one inode flags that inode alone."""
    tree = build_tree(tmp_path / "tree", 7, TreeSpec(files=40, dirs=3, hard_links=2))
    image = make_ext_image(
        tmp_path, "ext4", block_size=1024, tree=tree, size="8M",
        features=["metadata_csum", *features], extra=["-I", str(inode_size)],
    )  # fmt: skip
    assert subprocess.run(["e2fsck", "-fn", str(image)], capture_output=True).returncode == 0
    clean = read(image)
    assert clean.damaged_files == 0
    victim = int(clean.files.ino[-1])
    off = inode_offset(image, victim) + 20  # i_ctime
    with open(image, "rb") as fh:
        fh.seek(off)
        old = fh.read(1)
    patch(image, off, bytes([old[0] ^ 0x01]))
    after = read(image)
    assert after.files.ino[after.files.damaged != 0].tolist() == [victim]
    assert int(after.files.damaged[-1]) & DAMAGE_INODE_CHECKSUM


def test_scan_split_over_threads_reads_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The inode scan and the directory pass split over threads (each with its own handle)
    give exactly what one thread gives, on an image of many groups."""
    tree = build_tree(tmp_path / "tree", 11, TreeSpec(files=300, dirs=12, hard_links=5))
    image = make_ext_image(tmp_path, "ext4", block_size=1024, tree=tree, size="24M",
                           extra=["-N", "2048", "-g", "1024"])  # fmt: skip
    seen = []
    for threads in ("1", "2", "3", "8"):
        monkeypatch.setenv("FSAGE_SCAN_THREADS", threads)
        seen.append(read(image))
    first = seen[0]
    assert len(first.facts.groups) >= 8
    for other in seen[1:]:
        for part in ("files", "special"):
            for f in fields(FileTable):
                np.testing.assert_array_equal(
                    getattr(getattr(first, part), f.name), getattr(getattr(other, part), f.name)
                )
        np.testing.assert_array_equal(first.links.parent, other.links.parent)
        np.testing.assert_array_equal(first.links.ino, other.links.ino)
        assert first.links.names == other.links.names
        assert first.paths() == other.paths()


def _groups_image(tmp_path: Path, features: list[str]) -> tuple[Path, Layout, int]:
    """An image whose user inodes span several groups (16 inodes per group); returns the
    image, its layout before damage, and the number of inodes per group."""
    tree = build_tree(tmp_path / "tree", 9, TreeSpec(files=30, dirs=4, hard_links=0))
    image = make_ext_image(
        tmp_path,
        "ext4",
        block_size=1024,
        features=features,
        extra=["-N", "64"],
        tree=tree,
        size="32M",
    )
    layout = read(image)
    ipg = int(dumpe2fs_header(image)["Inodes per group"])
    assert ipg == 16
    assert int(layout.files.ino.max()) > 3 * ipg  # files reach group 3
    return image, layout, ipg


def _inode_table(image: Path, group: int) -> tuple[int, int]:
    head = dumpe2fs_header(image)
    block = int(head["Block size"])
    table = read(image).facts.groups[group]["inode_table"]
    return table * block, int(head["Inode blocks per group"]) * block


def _group_damage(before: Layout, after: Layout, group: int, ipg: int) -> tuple[set[int], set[int]]:
    """(in-use inodes of ``group``, inodes flagged damaged) after damaging that group."""
    in_group = {i for i in before.files.ino.tolist() if (i - 1) // ipg == group}
    damaged = set(after.files.ino[after.files.damaged != 0].tolist())
    return in_group, damaged


def _others_intact(before: Layout, after: Layout, group: int, ipg: int) -> None:
    assert after.files.ino.tolist() == before.files.ino.tolist()
    for j in range(len(after.files)):
        if (int(after.files.ino[j]) - 1) // ipg != group:
            assert int(after.files.damaged[j]) == 0
            assert extents_of(after.files, j) == extents_of(before.files, j)
            assert int(after.files.mode[j]) == int(before.files.mode[j])


def test_garbage_inode_table_of_one_group_scan_goes_on(tmp_path: Path) -> None:
    image, before, ipg = _groups_image(tmp_path, ["^metadata_csum"])
    offset, length = _inode_table(image, 2)
    patch(image, offset, random.Random(4).randbytes(length))
    after = read(image)
    _others_intact(before, after, 2, ipg)
    in_group, damaged = _group_damage(before, after, 2, ipg)
    assert damaged <= in_group
    assert damaged  # random block numbers fall outside a 32 MiB fs
    assert after.damaged_files == len(damaged)


def test_garbage_inode_table_every_inode_flagged_with_metadata_csum(tmp_path: Path) -> None:
    image, before, ipg = _groups_image(tmp_path, ["metadata_csum"])
    offset, length = _inode_table(image, 2)
    patch(image, offset, random.Random(4).randbytes(length))
    after = read(image)
    _others_intact(before, after, 2, ipg)
    in_group, damaged = _group_damage(before, after, 2, ipg)
    assert damaged == in_group


def test_zeroed_inode_table_of_one_group_is_flagged(tmp_path: Path) -> None:
    image, before, ipg = _groups_image(tmp_path, ["^metadata_csum"])
    offset, length = _inode_table(image, 3)
    patch(image, offset, bytes(length))
    after = read(image)
    _others_intact(before, after, 3, ipg)
    in_group, damaged = _group_damage(before, after, 3, ipg)
    assert damaged == in_group


def test_fragmented_free_space_histogram(tmp_path: Path) -> None:
    # 1-block files freed in runs of 1, 2, 3, 5, 8, 13, 21, 34 leave free extents in many
    # log2 buckets; the histogram must match e2freefrag's bucket for bucket.
    tree = tmp_path / "tree"
    tree.mkdir()
    n = 900
    for k in range(n):
        (tree / f"s{k:04d}").write_bytes(bytes([k % 251 + 1]) * 1000)
    image = make_ext_image(
        tmp_path, "ext2", block_size=1024, tree=tree, size="2M", extra=["-N", "1024"]
    )
    doomed: list[int] = []
    k = 0
    for run_len in [1, 2, 3, 5, 8, 13, 21, 34] * 3:
        doomed.extend(range(k, min(k + run_len, n)))
        k += run_len + 1
    debugfs(image, [f"rm /s{d:04d}" for d in doomed], write=True)
    layout = read(image)
    check_image(image, layout)
    buckets = freefrag_histogram(layout.free.length.tolist())
    assert len(buckets) >= 5


def test_cross_check_catches_a_wrong_block(tmp_path: Path) -> None:
    # The oracle comparison itself must be able to fail: one block off is caught.
    tree = build_tree(tmp_path / "tree", 13, TreeSpec(files=8, dirs=1))
    image = make_ext_image(tmp_path, "ext4", block_size=1024, tree=tree, size="8M")
    layout = read(image)
    check_image(image, layout)
    layout.files.ext_physical[0] += 1
    with pytest.raises(AssertionError):
        check_image(image, layout)
    layout = read(image)
    layout.free.length[-1] -= 1
    with pytest.raises(AssertionError):
        check_image(image, layout)


def test_show_json_matches_debugfs(tmp_path: Path, fsage_env: dict[str, str]) -> None:
    spec = replace(BASE, files=15, sparse={"holes6": holey(1024, 6, 2)})
    tree = build_tree(tmp_path / "tree", 17, spec)
    image = make_ext_image(tmp_path, "ext3", block_size=1024, tree=tree, size="8M")
    db = tmp_path / "fsage.db"

    def cli(*args: str) -> str:
        proc = subprocess.run(
            [sys.executable, "-m", "fsage", *args, "--db", str(db)],
            capture_output=True,
            text=True,
            env=fsage_env,
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    cli("snapshot", str(image), "--name", "t")
    snap_id = json.loads(cli("snapshots", "--format", "json"))[0]["id"]
    entries = json.loads(cli("show", str(snap_id), "--format", "json"))
    by_ino = {e["ino"]: e for e in entries}
    used = sorted(i for i in used_inodes(image) if i >= 11 or i == 2)
    assert sorted(by_ino) == used
    stats = stat_inodes(image, used)
    names = ncheck(image, [i for i in used if i != 2])
    for ino in used:
        e, st = by_ino[ino], stats[ino]
        runs = [(lo, ph, n, False) for lo, ph, n, _ in st.extents]
        assert [tuple(x) for x in e["extents"]] == [r[:3] for r in merge_runs(runs)], ino
        assert e["size"] == st.size
        assert e["blocks"] == sum(r[2] for r in st.extents)
        assert e["path"] == ("/" if ino == 2 else names[ino][0])


@pytest.mark.needs_root
def test_block_device_reads_like_its_image(tmp_path: Path) -> None:
    tree = build_tree(tmp_path / "tree", 19, TreeSpec(files=10, dirs=2))
    image = make_ext_image(tmp_path, "ext4", block_size=4096, tree=tree, size="16M")
    dev = run(["losetup", "--find", "--show", "--read-only", image]).strip()
    try:
        from_dev = read_ext_layout(Path(dev))
    finally:
        run(["losetup", "-d", dev])
    from_image = read(image)
    check_image(image, from_dev)
    assert from_dev.files.ino.tolist() == from_image.files.ino.tolist()
    assert from_dev.files.ext_physical.tolist() == from_image.files.ext_physical.tolist()
    assert from_dev.free.start.tolist() == from_image.free.start.tolist()
    assert os.stat(dev).st_rdev != 0
