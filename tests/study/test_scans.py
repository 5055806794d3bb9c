"""A study step's scans: each image's loop device is attached once for all rounds, yet every
scan is a cold read of the whole tree (the kernel's own counters of the loop device show it
read at least the tree's bytes each time), sides alternate, only the aged tree's first scan is
traced, and nothing stays attached."""

from __future__ import annotations

import random
import subprocess
from pathlib import Path
from typing import Any

import pytest

from fsage.ager.images import loop_mount
from fsage.study.members import Member
from tests.conftest import require_tools

pytestmark = [pytest.mark.needs_root, pytest.mark.slow]


def fill_tree(root: Path, seed: int, per_dir: int = 12, largest: int = 400_000) -> int:
    """A small tree; its bytes, summed from what was written."""
    rng = random.Random(seed)
    total = 0
    for d in ("a", "b/c"):
        (root / d).mkdir(parents=True)
        for i in range(per_dir):
            data = rng.randbytes(rng.randrange(1, largest))
            (root / d / f"f{i:02d}").write_bytes(data)
            total += len(data)
    return total


def _read_sectors(dev: Path) -> int:
    # /sys/block/<dev>/stat: the third field is sectors read (Documentation/block/stat.rst)
    return int((Path("/sys/block") / dev.name / "stat").read_text().split()[2])


def _attached(image: Path) -> str:
    return subprocess.run(
        ["losetup", "-j", str(image)], capture_output=True, text=True, check=False
    ).stdout.strip()


@pytest.mark.parametrize("trace", [False, True])
def test_a_step_s_scans_reuse_each_loop_device_and_read_cold_every_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, trace: bool
) -> None:
    require_tools("mkfs.ext4", "losetup")
    from fsage.replay.bench import scan as scan_mod
    from fsage.study import measure

    m = Member(tmp_path, "ext4", 64 << 20)
    m.make()
    m.make(m.clean_image)
    sizes = []
    for image in (m.image, m.clean_image):
        with loop_mount(image) as mnt:
            sizes.append(fill_tree(mnt, seed=1))
    assert sizes[0] == sizes[1]
    seen: list[dict[str, Any]] = []
    real = scan_mod.scan_tree

    def counted(tree: Any, **kw: Any) -> Any:
        before = _read_sectors(tree.device)
        r = real(tree, **kw)
        read = _read_sectors(tree.device) - before
        seen.append({"side": tree.name, "dev": tree.device, "read": read, "traced": kw["trace"]})
        return r

    monkeypatch.setattr(scan_mod, "scan_tree", counted)
    out = measure._scans(m, trace=trace, repeat=3, say=lambda s: None)

    assert [s["side"] for s in seen] == ["aged", "clean", "clean", "aged", "aged", "clean"]
    for side in ("aged", "clean"):
        assert len({s["dev"] for s in seen if s["side"] == side}) == 1
    assert seen[0]["dev"] != seen[1]["dev"]
    for s in seen:  # cold: every byte of the tree came from the device, each round
        assert s["read"] * 512 >= sizes[0], s
    assert out["bytes"] == out["clean_bytes"] == sizes[0]
    assert out["files"] == 24 and out["rounds"] == 3
    assert len(out["aged_values"]) == len(out["clean_values"]) == 3
    assert _attached(m.image) == "" and _attached(m.clean_image) == ""
    # traced: the aged tree's first scan only, and its requests cover the tree's blocks
    assert [s["traced"] for s in seen] == [trace] + [False] * 5
    if trace and out["trace"] is not None:
        assert out["trace"]["blocks"] * out["trace"]["block_size"] >= sizes[0]
    elif not trace:
        assert out["trace"] is None
