"""One image, one writer: the lock of fsage.imagelock, held by real processes.

The oracles are the kernel's (a holder's pid, a killed process's locks dropped) and the image's
bytes, compared before and after a refused command."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fsage import imagelock
from fsage.imagelock import ImageBusyError

REPO = Path(__file__).resolve().parents[1]

_HOLDER = """
import sys, time
from fsage import imagelock
imagelock.acquire(sys.argv[1], exclusive=sys.argv[2] == "write")
print("held", flush=True)
time.sleep(120)
"""


class Holder:
    """Another process holding an image's lock until it is killed."""

    def __init__(self, image: Path, mode: str) -> None:
        env = dict(os.environ, PYTHONPATH=str(REPO))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _HOLDER, str(image), mode],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == "held"

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)


@pytest.fixture
def image(tmp_path: Path) -> Path:
    img = tmp_path / "x.img"
    img.write_bytes(b"\1" * 8192)
    return img


@pytest.fixture
def holders() -> Iterator[list[Holder]]:
    made: list[Holder] = []
    yield made
    for h in made:
        if h.proc.poll() is None:
            h.kill()


def test_a_writer_is_refused_naming_the_holder(image: Path, holders: list[Holder]) -> None:
    h = Holder(image, "write")
    holders.append(h)
    for exclusive in (True, False):
        with pytest.raises(ImageBusyError) as exc:
            imagelock.acquire(image, exclusive=exclusive)
        msg = str(exc.value)
        assert "\n" not in msg
        assert f"pid {h.proc.pid}" in msg
        assert "being written" in msg


def test_readers_share_and_keep_a_writer_out(image: Path, holders: list[Holder]) -> None:
    holders.append(Holder(image, "read"))
    key = imagelock.acquire(image, exclusive=False)  # a second reader
    imagelock.release(key)
    with pytest.raises(ImageBusyError, match="being read"):
        imagelock.acquire(image, exclusive=True)


def test_a_killed_holder_releases_the_image(image: Path, holders: list[Holder]) -> None:
    h = Holder(image, "write")
    holders.append(h)
    with pytest.raises(ImageBusyError):
        imagelock.acquire(image, exclusive=True)
    h.kill()
    key = imagelock.acquire(image, exclusive=True)
    imagelock.release(key)


def test_the_lock_is_reentrant_in_one_process(image: Path, holders: list[Holder]) -> None:
    a = imagelock.acquire(image, exclusive=False)
    b = imagelock.acquire(image, exclusive=True)  # upgraded: no one else holds it
    assert a == b
    imagelock.release(b)
    # still held once: another process cannot read it
    out = subprocess.run(
        [sys.executable, "-c", _HOLDER, str(image), "read"],
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0 and "ImageBusyError" in out.stderr
    imagelock.release(a)
    holders.append(Holder(image, "read"))  # and now it can


# ---------------------------------------------------------------------------- commands


def _fsage(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-m", "fsage", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _one_line_naming(out: subprocess.CompletedProcess[str], pid: int) -> None:
    assert out.returncode != 0, out.stdout
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert f"pid {pid}" in lines[0] and "lfs mount" in lines[0], lines[0]


def test_commands_are_refused_while_an_lfs_image_is_mounted(tmp_path: Path) -> None:
    from fsage.lfs.mount import fuse_available

    if fuse_available() is not None:
        pytest.skip(f"no FUSE here: {fuse_available()}")
    img = tmp_path / "d.img"
    m1, m2 = tmp_path / "m1", tmp_path / "m2"
    m1.mkdir()
    m2.mkdir()
    assert _fsage("lfs", "mkfs", str(img), "--size", "32M", cwd=tmp_path).returncode == 0
    out = _fsage("lfs", "mount", str(img), str(m1), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    pid = int(out.stdout.rsplit("pid ", 1)[1].split(")")[0])
    try:
        (m1 / "a").write_bytes(b"a" * 10000)
        with open(m1 / "a", "rb+") as f:
            os.fsync(f.fileno())
        before = _digest(img)
        for args in (
            ("lfs", "mount", str(img), str(m2)),
            ("age", str(img), "--profile", "hfs-surge", "--ops-limit", "50", "--fill", "0.5"),
            ("lfs", "mkfs", str(img), "--size", "32M", "--force"),
            ("lfs", "fsck", str(img)),
            ("snapshot", str(img), "--db", str(tmp_path / "s.db")),
        ):
            _one_line_naming(_fsage(*args, cwd=tmp_path), pid)
        assert not os.path.ismount(m2)
        assert _digest(img) == before  # nothing of the refused commands reached it
        assert not (tmp_path / "s.db").exists() or _fsage(
            "snapshots", "--db", str(tmp_path / "s.db"), "--format", "json", cwd=tmp_path
        ).stdout.strip() in ("[]", "")
    finally:
        subprocess.run(["fusermount3", "-u", str(m1)], check=False, timeout=30)
        end = time.monotonic() + 30
        while time.monotonic() < end:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
    # the server is gone: its lock with it, and the file it wrote is there
    out = _fsage("lfs", "fsck", str(img), cwd=tmp_path)
    assert out.returncode == 0 and ": 1 files," in out.stdout, out.stdout + out.stderr


@pytest.mark.needs_root
def test_a_writer_is_refused_an_ext_image_mounted_by_someone_else(tmp_path: Path) -> None:
    img = tmp_path / "e.img"
    with open(img, "wb") as f:
        f.truncate(16 << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(img)], check=True)
    mp = tmp_path / "mnt"
    mp.mkdir()
    subprocess.run(["mount", "-o", "loop", str(img), str(mp)], check=True)
    try:
        for args in (
            ("age", str(img), "--profile", "hfs-surge", "--ops-limit", "20", "--offline"),
            ("lfs", "mkfs", str(img), "--size", "16M", "--force"),
            ("bench", str(img), "--suite", "seq", "--size", "1M"),
        ):
            out = _fsage(*args, cwd=tmp_path)
            assert out.returncode != 0
            lines = out.stderr.strip().splitlines()
            assert len(lines) == 1 and f"mounted on {mp}" in lines[0], out.stderr
    finally:
        subprocess.run(["umount", str(mp)], check=True)
    out = subprocess.run(["e2fsck", "-fn", str(img)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout
