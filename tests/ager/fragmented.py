"""A fragmented ext4 made through the kernel's allocator: the layout target of the mounted
match tests."""

from __future__ import annotations

import os
import random
from pathlib import Path

from fsage.ager.match import LayoutTarget, target_from_layout


def fragment(root: Path, fill: float, seed: int) -> None:
    """A fragmenting workload: small files made four at a time with most of their blocks
    allocated in turn (fallocate, one block at a time), larger files written whole; then 30%
    of the larger files deleted."""
    rng = random.Random(seed)
    buf = b"z" * 4096
    n = 0
    big: list[Path] = []
    (root / "t").mkdir()
    while True:
        v = os.statvfs(root)
        if (v.f_blocks - v.f_bfree) / v.f_blocks >= fill:
            break
        d = root / "t" / f"{n // 200:04d}"
        d.mkdir(exist_ok=True)
        if rng.random() < 0.75:
            sizes = [rng.randint(2, 16) for _ in range(4)]
            fds = [os.open(d / f"s{n}_{j}", os.O_CREAT | os.O_WRONLY) for j in range(4)]
            for b in range(max(sizes)):
                for fd, sz in zip(fds, sizes, strict=True):
                    if b < sz and (b == 0 or rng.random() < 0.75):
                        os.posix_fallocate(fd, b * 4096, 4096)
            for fd, sz in zip(fds, sizes, strict=True):
                os.write(fd, buf * sz)
                os.close(fd)
        else:
            p = d / f"l{n}"
            p.write_bytes(buf * rng.randint(17, 256))
            big.append(p)
        n += 1
        if n % 200 == 0:
            os.sync()
    for p in big:
        if rng.random() < 0.3:
            p.unlink()
    os.sync()


def fragmented_target(image: Path, size: int, label: str) -> LayoutTarget:
    """Make an ext4 of ``size`` bytes at ``image``, fragment it to 70% full through a loop
    mount, and return its layout read offline (libext2fs) as a match target. Needs root and
    loop devices; the image stays for the caller to remove."""
    from fsage.ager.images import loop_mount, make_image
    from fsage.snapshotter.ext import read_ext_layout

    src = make_image(image, "ext4", size)
    with loop_mount(src) as mnt:
        fragment(mnt, 0.7, seed=3)
    return target_from_layout(read_ext_layout(src), label)
