"""The LFS near full, through the mount: each cleaning policy filled to ENOSPC and back.

Random fsync'd creates, overwrites, truncates and unlinks (seeded) run through ``fsage lfs
mount`` on a small image of 32-block segments until writes are refused, then a share of the
files is deleted and the mix goes on. The oracles are the test's own record of what was
written and the kernel's answers:

* an operation that fails (ENOSPC at the write, the truncate or the fsync) leaves the file as
  it was before it, as the mount shows it;
* an unlink never fails;
* after every unmount ``fsage lfs fsck`` is clean and the image holds every fsync'd byte (read
  with the library, not through the mount).
"""

from __future__ import annotations

import errno
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from fsage.lfs.cleaner import POLICIES
from fsage.lfs.fs import LFS, mkfs
from fsage.lfs.mount import fuse_available
from tests.lfs.test_mount import REPO, Mounted

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(fuse_available() is not None, reason=f"no FUSE here: {fuse_available()}"),
]


class Run:
    """One mount of the image and the files the test knows it holds."""

    def __init__(self, mp: Path, model: dict[str, bytes], rng: random.Random) -> None:
        self.mp, self.model, self.rng = mp, model, rng
        self.refused: dict[str, int] = {}
        self.problems: list[str] = []

    def _shown(self, name: str) -> bytes:
        return (self.mp / name).read_bytes()

    def _refused(self, op: str, name: str, before: bytes | None, exc: OSError) -> None:
        if exc.errno != errno.ENOSPC:
            raise exc
        self.refused[op] = self.refused.get(op, 0) + 1
        now = self._shown(name) if (self.mp / name).exists() else None
        if now != before:
            self.problems.append(
                f"{op} of {name} failed with ENOSPC but changed it: "
                f"{None if before is None else len(before)} -> {None if now is None else len(now)}"
            )

    def write(self, name: str, off: int, data: bytes) -> bool:
        """pwrite + fsync; the record changes only if both succeed, by what pwrite wrote."""
        before = self.model.get(name)
        try:
            fd = os.open(self.mp / name, os.O_WRONLY | os.O_CREAT, 0o644)
        except OSError as exc:
            self._refused("create", name, before, exc)
            return False
        step = "write"
        try:
            # Short near full: a write starting inside a page not in the page cache reaches
            # the LFS as that page's part, then the rest, and the rest may be refused.
            n = os.pwrite(fd, data, off)
            if n < len(data):
                self.refused["short write"] = self.refused.get("short write", 0) + 1
                data = data[:n]
            step = "fsync after write"
            os.fsync(fd)
        except OSError as exc:
            os.close(fd)
            if before is None:  # the name itself was made: a refusal undoes only the data
                before = b""
                self.model[name] = b""
            self._refused(step, name, before, exc)
            return False
        os.close(fd)
        old = before or b""
        self.model[name] = old[:off] + bytes(max(0, off - len(old))) + data + old[off + len(data) :]
        return True

    def truncate(self, name: str, size: int) -> None:
        before = self.model[name]
        step = "truncate"
        try:
            fd = os.open(self.mp / name, os.O_WRONLY)
            try:
                os.ftruncate(fd, size)
                step = "fsync after truncate"
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            self._refused(step, name, before, exc)
            return
        self.model[name] = before[:size] + bytes(max(0, size - len(before)))

    def unlink(self, name: str) -> None:
        try:
            os.unlink(self.mp / name)
        except OSError as exc:
            self.problems.append(f"unlink {name}: {exc.strerror}")
            return
        del self.model[name]

    def fill(self, first: int) -> int:
        """New files until five in a row are refused; returns the next file number."""
        streak = 0
        while streak < 5 and not self.problems:
            name = f"f{first:05d}"
            first += 1
            data = self.rng.randbytes(self.rng.randint(1, 40) * 1024)
            streak = 0 if self.write(name, 0, data) else streak + 1
        return first

    def mix(self, ops: int) -> None:
        for _ in range(ops):
            if self.problems or not self.model:
                return
            name = self.rng.choice(sorted(self.model))
            r = self.rng.random()
            if r < 0.55:
                size = len(self.model[name])
                data = self.rng.randbytes(self.rng.randint(1, 40) * 1024)
                self.write(name, self.rng.randint(0, size), data)
            elif r < 0.8:
                self.truncate(name, self.rng.randint(0, len(self.model[name]) + 20000))
            else:
                self.unlink(name)


def _fsck(image: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-m", "fsage", "lfs", "fsck", str(image)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _stored(image: Path) -> dict[str, bytes]:
    fs = LFS.open(image, readonly=True)
    try:
        return {name: fs.read(name) for name, _ in fs.readdir("")}
    finally:
        fs.close()


@pytest.mark.parametrize("policy", POLICIES)
def test_each_policy_to_enospc_and_back_through_the_mount(tmp_path: Path, policy: str) -> None:
    image = tmp_path / "full.img"
    mkfs(image, size=6 << 20, blocks_per_segment=32, cleaning_policy=policy)
    mp = tmp_path / "mnt"
    mp.mkdir()
    rng = random.Random(f"full-{policy}")
    model: dict[str, bytes] = {}
    next_file = 0
    refused: dict[str, int] = {}
    for cycle in range(2):
        m = Mounted(image, mp)
        run = Run(mp, model, rng)
        try:
            next_file = run.fill(next_file)
            for name in rng.sample(sorted(model), len(model) * 15 // 100):
                run.unlink(name)
            run.mix(150)
            next_file = run.fill(next_file)
            run.mix(100)
        finally:
            m.unmount()
        for k, v in run.refused.items():
            refused[k] = refused.get(k, 0) + v
        assert not run.problems, f"cycle {cycle}: {run.problems[:5]}"
        out = _fsck(image)
        assert out.returncode == 0, f"cycle {cycle}: {out.stdout}{out.stderr}"
        stored = _stored(image)
        lost = sorted(n for n in set(stored) | set(model) if stored.get(n) != model.get(n))
        assert not lost, (
            f"cycle {cycle}: {len(lost)} files differ from what was fsync'd: {lost[:5]}"
        )
    assert sum(refused.values()) > 0  # it did reach ENOSPC
    # and everything can still be deleted
    m = Mounted(image, mp)
    run = Run(mp, model, rng)
    try:
        for name in sorted(model):
            run.unlink(name)
    finally:
        m.unmount()
    assert not run.problems, run.problems[:5]
    assert _stored(image) == {}
