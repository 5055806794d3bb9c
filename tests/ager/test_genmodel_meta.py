"""The generator's models of xfs and btrfs metadata (``fsage.ager.genmodel``): a stream steered
by one reads the target's used blocks once, so a kernel whose count drifts between runs cannot
change it; and the model's blocks come back to where they started when what the ops made is
deleted again (no block is counted twice or lost)."""

from __future__ import annotations

import itertools
import random

import pytest

from fsage.ager.generator import Generator, meta_kind
from fsage.ager.genmodel import BtrfsMeta, XfsMeta
from fsage.ager.profile import get_preset
from fsage.errors import WorkloadError
from fsage.workload import Op

MIB = 1 << 20
BS = 4096


def _stream(kind: str, noise_seed: int) -> tuple[list[Op], int]:
    """The first ops of a database-profile run (punches, overwrites, appends) whose probe is
    the model's used blocks off by up to 30 blocks, and how many probes it made."""
    prof = get_preset("database").with_overrides(fill=0.5, churn=2.0)
    noise = random.Random(noise_seed)
    calls = [0]
    gen: Generator

    def probe() -> tuple[int, int, int]:
        calls[0] += 1
        jitter = noise.randrange(31) if calls[0] > 1 else 0  # the start: a fresh image
        return BS, gen.total_blocks, 500 + gen.used_blocks + jitter

    gen = Generator(prof, 11, 256 * MIB, probe=probe, block_size=BS, probe_every=None, meta=kind)
    return list(itertools.islice(gen.ops(), 20_000)), calls[0]


@pytest.mark.parametrize("kind", ["xfs", "btrfs"])
def test_a_stream_steered_by_the_model_does_not_hear_the_kernels_noise(kind: str) -> None:
    first, probes = _stream(kind, 1)
    second, _ = _stream(kind, 2)
    assert probes == 1 and len(first) == 20_000
    assert {op.op for op in first} >= {"punch", "overwrite", "append", "delete"}
    assert first == second


@pytest.mark.parametrize("kind", ["ext", "xfs", "btrfs"])
def test_the_model_gives_back_what_deleted_files_and_directories_took(kind: str) -> None:
    prof = get_preset("hfs-surge").with_overrides(fill=0.5, churn=1.0)
    gen = Generator(prof, 3, 32 * MIB, block_size=BS, meta=kind)
    empty = gen.used_blocks
    ops = list(itertools.islice(gen.ops(), 3000))
    assert gen.stats.phase == "churn"
    assert {"mkdir", "create", "append", "truncate", "rename", "delete"} <= {o.op for o in ops}
    for path in sorted(gen.files):
        gen._drop_file(path)
    for path in sorted(gen.all_dirs[1:], key=lambda p: -p.count("/")):
        gen._drop_dir(path)
    # every file's data, pinned blocks, entries and inodes, every directory's own blocks
    # (ext4 and xfs count a directory's blocks at their peak, given back with it) but the
    # root's, which stays
    m = gen.meta
    assert m is not None
    root = m._dir_blocks(m.peak.get("", 0)) - m._dir_blocks(0) if not m.cow else 0
    assert gen.used_blocks == empty + root


def test_xfs_directories_live_in_their_inode_then_in_blocks() -> None:
    m = XfsMeta(BS)
    assert m.new_dir() == -1  # short form: the block the generator counts is not spent
    added = sum(m.entry("d", f"{i:010d}", True) for i in range(17))
    assert added == 0  # 17 names of 10 bytes fit in the inode
    grown = sum(m.entry("d", f"{i:010d}", True) for i in range(17, 1000))
    # 1,000 entries of 24 bytes: 6 data blocks of (4096 - 64) bytes and 2 leaf blocks, plus
    # the node block of a directory with more than one leaf (the generator counts one)
    assert 1 + m.new_dir() + grown == 9


def test_btrfs_counts_tree_items_twice_and_no_directory_blocks() -> None:
    m = BtrfsMeta(BS)
    taken = sum(m.inode(True) + m.entry("", f"{i:010d}", True) for i in range(1000))
    per_file = (m.INODE + m.ENTRY + 20) / BS
    assert taken == pytest.approx(1000 * per_file, abs=1)
    assert sum(m.inode(False) + m.entry("", f"{i:010d}", False) for i in range(1000)) == -taken


def test_only_mounted_image_kinds_are_modelled() -> None:
    assert [meta_kind(k) for k in ("mounted-ext", "mounted-xfs", "mounted-btrfs")] == [
        "ext",
        "xfs",
        "btrfs",
    ]
    assert (
        meta_kind("dir") is None and meta_kind("lfs") is None and meta_kind("mounted-image") is None
    )
    with pytest.raises(WorkloadError, match="no model of 'zfs'"):
        Generator(get_preset("hfs-surge"), 1, 256 * MIB, block_size=BS, meta="zfs")
