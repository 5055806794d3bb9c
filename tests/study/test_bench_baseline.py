"""An xfs or btrfs image gets its empty-file-system baseline too (postmark's and the other
suites'): an empty file system of the same kind and size, made and removed in the run."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from fsage.ager.images import loop_mount
from fsage.replay.bench import BenchOptions, run_bench
from tests.conftest import require_tools

MIB = 1 << 20


def _blkid_type(image: Path) -> str:
    return subprocess.run(
        ["blkid", "-p", "-o", "value", "-s", "TYPE", str(image)],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()


@pytest.mark.needs_root
@pytest.mark.slow
@pytest.mark.parametrize("kind, size", [("xfs", 320 * MIB), ("btrfs", 256 * MIB)])
def test_an_xfs_or_btrfs_image_gets_an_empty_baseline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, size: int
) -> None:
    require_tools(f"mkfs.{kind}", "blkid", "losetup")
    img = tmp_path / f"{kind}.img"
    with open(img, "wb") as fh:
        fh.truncate(size)
    subprocess.run([f"mkfs.{kind}", "-f", "-q", str(img)], check=True, capture_output=True)
    with loop_mount(img) as mnt:
        for i in range(20):  # old files: the target is not empty
            (mnt / f"old{i}").write_bytes(b"o" * (i * 5000))
    from fsage.ager import images

    seen: list[dict[str, Any]] = []
    real = images.make_image

    def made(path: Path, k: str, sz: int, **kw: Any) -> Path:
        out = real(path, k, sz, **kw)
        # checked by blkid and the image's own size, not by fsage
        seen.append({"path": path, "type": _blkid_type(path), "size": path.stat().st_size})
        with loop_mount(path) as mnt:
            seen[-1]["entries"] = sorted(p.name for p in mnt.iterdir())
        return out

    monkeypatch.setattr(images, "make_image", made)
    run = run_bench(
        img,
        BenchOptions("seq", size=256 * 1024, file_sizes=[65536], repeat=2, baseline=True),
    )
    assert len(seen) == 1
    assert seen[0]["type"] == kind and seen[0]["size"] == size and seen[0]["entries"] == []
    assert not seen[0]["path"].exists()  # removed after the run
    assert any(f"empty {kind} baseline" in n for n in run.notes), run.notes
    assert not any("no empty-file-system baseline" in n for n in run.notes)
    assert all(r.params.get("baseline") for r in run.results)
