"""A study step's LFS scans: one server per side for all rounds, yet every round reads the
whole tree from the image (the kernel's count of the octets the server read from storage, in
/proc/PID/io, is at least the bytes written into the tree, in every round); the server drops
its caches only when no change waits for the log; the aged side's first round is traced."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fsage.errors import FsageError
from fsage.study.members import LfsMember
from tests.study.test_scans import fill_tree

pytestmark = [pytest.mark.needs_root, pytest.mark.slow]


@pytest.fixture
def lfs_pair(tmp_path: Path) -> tuple[LfsMember, int]:
    from fsage.lfs.mount import fuse_available
    from fsage.replay.bench.target import can_drop_caches

    if fuse_available() is not None or not can_drop_caches():
        pytest.skip("needs FUSE and root (drop_caches)")
    m = LfsMember(tmp_path, "lfs", 64 << 20)
    m.make()
    m.make(m.clean_image)
    sizes = []
    for image in (m.image, m.clean_image):
        with m.mounted(image, readonly=False) as mnt:
            sizes.append(fill_tree(mnt, seed=2, per_dir=10, largest=300_000))
    assert sizes[0] == sizes[1]
    return m, sizes[0]


@pytest.mark.parametrize("trace", [False, True])
def test_lfs_rounds_share_a_server_per_side_and_read_cold(
    lfs_pair: tuple[LfsMember, int], monkeypatch: pytest.MonkeyPatch, trace: bool
) -> None:
    from fsage.study import measure

    m, size = lfs_pair
    starts: list[Path] = []
    real = LfsMember.mounted

    def counted(self: LfsMember, image: Path | None = None, **kw: Any) -> Any:
        starts.append(image or self.image)
        return real(self, image, **kw)

    monkeypatch.setattr(LfsMember, "mounted", counted)
    out = measure._scans(m, trace=trace, repeat=3, say=lambda s: None)

    assert sorted(starts) == sorted([m.image, m.clean_image])  # one server per side
    assert out["rounds"] == 3 and out["bytes"] == out["clean_bytes"] == size
    for side in ("aged", "clean"):
        rounds = out["image_reads"][side]
        assert len(rounds) == 3
        for r in rounds:  # the server read the whole tree from storage, every round
            assert r["read_bytes"] >= size, (side, rounds)
    assert not [n for n in out["notes"] if "not cold" in n]
    if trace:
        assert out["trace"] is not None
        assert out["trace"]["blocks"] * out["trace"]["block_size"] >= size
    else:
        assert out["trace"] is None
    assert not list(m.image.parent.glob("*.trace"))


def test_an_lfs_server_with_changes_pending_refuses_to_drop_its_caches(
    lfs_pair: tuple[LfsMember, int], tmp_path: Path
) -> None:
    from fsage.lfs import control

    m, _ = lfs_pair
    sock = tmp_path / "ctl"
    with m.mounted(m.image, readonly=False, env={control.ENV: str(sock)}) as mnt:
        assert control.request(sock, "io")["io"]["rchar"] >= 0
        (mnt / "new").mkdir()  # in the server's memory until its next commit (5 s)
        with pytest.raises(FsageError, match="not yet in the log"):
            control.request(sock, "drop-caches")
        with pytest.raises(FsageError, match="unknown request"):
            control.request(sock, "nonsense")
    assert not sock.exists()
