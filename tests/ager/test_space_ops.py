"""punch and fallocate ops, and --data fallocate, in every executor (kernel and libext2fs as
oracles: st_blocks, debugfs, e2fsck)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from fsage.ager.images import make_image
from fsage.ager.posix import PosixExecutor
from fsage.errors import UsageError, WorkloadError
from fsage.workload import Op

MIB = 1 << 20


def _stat(path: Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_size, st.st_blocks * 512


def test_posix_punch_and_fallocate(tmp_path: Path) -> None:
    with PosixExecutor(tmp_path) as ex:
        ex.apply(Op("create", "f", size=256 * 1024))
        assert _stat(tmp_path / "f") == (256 * 1024, 256 * 1024)
        ex.apply(Op("punch", "f", offset=64 * 1024, size=128 * 1024))
        assert _stat(tmp_path / "f") == (256 * 1024, 128 * 1024)  # size kept, blocks freed
        data = (tmp_path / "f").read_bytes()
        assert data[64 * 1024 : 192 * 1024] == bytes(128 * 1024) and data[:10] != bytes(10)
        ex.apply(Op("create", "g", size=0))
        ex.apply(Op("fallocate", "g", offset=0, size=1 * MIB))
        assert _stat(tmp_path / "g") == (MIB, MIB)
        assert (tmp_path / "g").read_bytes() == bytes(MIB)


def test_posix_data_fallocate_mode(tmp_path: Path) -> None:
    with PosixExecutor(tmp_path, data="fallocate") as ex:
        assert ex.apply(Op("create", "f", size=300 * 1024)) == 300 * 1024
        ex.apply(Op("append", "f", size=100 * 1024))
        ex.apply(Op("overwrite", "f", offset=4096, size=8192))
        assert "fallocate" in ex.description
    assert _stat(tmp_path / "f") == (400 * 1024, 400 * 1024)
    assert (tmp_path / "f").read_bytes() == bytes(400 * 1024)  # allocated, never written
    with pytest.raises(WorkloadError, match="data mode"):
        PosixExecutor(tmp_path, data="zeros")


def _debugfs_stat(image: Path, path: str) -> tuple[int, int]:
    out = subprocess.run(
        ["debugfs", "-R", f"stat /{path}", str(image)], capture_output=True, text=True, check=True
    ).stdout
    size = int(re.search(r"Size: (\d+)", out).group(1))  # type: ignore[union-attr]
    blocks = int(re.search(r"Blockcount: (\d+)", out).group(1))  # type: ignore[union-attr]
    return size, blocks * 512


@pytest.mark.parametrize("data", ["write", "fallocate"])
def test_offline_punch_fallocate_and_data_mode(tmp_path: Path, data: str) -> None:
    pytest.importorskip("fsage._ext2fs")
    from fsage.ager.offline import OfflineExtExecutor

    img = make_image(tmp_path / "e.img", "ext4", 64 * MIB)
    ex = OfflineExtExecutor(img, data=data)
    ex.apply(Op("create", "f", size=256 * 1024))
    ex.apply(Op("append", "f", size=64 * 1024))
    ex.apply(Op("punch", "f", offset=64 * 1024 + 100, size=128 * 1024))
    ex.apply(Op("create", "g", size=0))
    ex.apply(Op("fallocate", "g", offset=0, size=MIB + 1))
    ex.close()
    fsck = subprocess.run(["e2fsck", "-fn", str(img)], capture_output=True, text=True)
    assert fsck.returncode == 0, fsck.stdout
    # The punch frees the whole blocks inside the range: 31 of them (the first is partial).
    assert _debugfs_stat(img, "f") == (320 * 1024, 320 * 1024 - 31 * 4096)
    assert _debugfs_stat(img, "g") == (MIB + 1, MIB + 4096)


def test_lfs_refuses_punch_and_fallocate(tmp_path: Path) -> None:
    from fsage.ager.run import AgeOptions, age
    from fsage.lfs.executor import LfsExecutor
    from fsage.lfs.fs import mkfs

    img = tmp_path / "l.img"
    mkfs(img, size=16 * MIB)
    ex = LfsExecutor(img)
    ex.apply(Op("create", "f", size=8192))
    for kind in ("punch", "fallocate"):
        with pytest.raises(WorkloadError, match=f"op '{kind}' is not supported on an LFS"):
            ex.apply(Op(kind, "f", offset=0, size=4096))
    ex.close()
    from fsage.ager.profile import get_preset

    with pytest.raises(UsageError, match="LFS image is aged with --data write"):
        age(img, AgeOptions(profile=get_preset("hfs-surge"), data="fallocate"))


@pytest.mark.needs_root
def test_age_mounted_ext4_with_data_fallocate(tmp_path: Path) -> None:
    from fsage.ager.images import loop_mount
    from fsage.ager.profile import get_preset
    from fsage.ager.run import AgeOptions, age

    img = make_image(tmp_path / "e.img", "ext4", 96 * MIB)
    prof = get_preset("hfs-surge").with_overrides(fill=0.5, churn=0.0)
    res = age(img, AgeOptions(profile=prof, seed=2, mode="mount", data="fallocate"))
    assert res.finished and abs(res.fullness - 0.5) <= 0.02
    with loop_mount(img) as mnt:
        big = max((p for p in mnt.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
        out = subprocess.run(["filefrag", "-v", str(big)], capture_output=True, text=True).stdout
        # The kernel's own view: the blocks are allocated (unwritten), never written.
        assert "unwritten" in out, out
        assert big.read_bytes() == bytes(big.stat().st_size)
