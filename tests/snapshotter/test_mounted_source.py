"""An ext device or image that is mounted read-write, snapshotted by its device or image path.

The reproduction of the README's `fsage snapshot /dev/sdb1`: 1,500 files synced, 1,500 more
only in the page cache. Every file's size and extents must equal what `filefrag -e` reports on
the mount, by default (read through the mount point) and with --freeze (offline read of the
frozen file system), and both must be recorded as the same file system.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import REPO, require_tools
from snapshotter.loops import mounted_loop

from fsage.db.store import Store
from fsage.layout import Layout
from fsage.snapshotter.mounted import FIFREEZE, FITHAW, find_mounted, frozen

pytestmark = pytest.mark.needs_root


@dataclass
class Loop:
    image: Path
    device: str
    mnt: Path


@pytest.fixture
def mounted(tmp_path: Path) -> Iterator[Loop]:
    require_tools("mke2fs", "losetup", "mount", "filefrag")
    image = tmp_path / "fs.img"
    subprocess.run(["truncate", "-s", "256M", str(image)], check=True)
    subprocess.run(["mke2fs", "-q", "-F", "-t", "ext4", str(image)], check=True)
    mnt = tmp_path / "mnt"
    with mounted_loop(image, mnt) as dev:
        yield Loop(image, dev, mnt)


def _write(root: Path, prefix: str, n: int, seed: int) -> None:
    for i in range(n):
        size = (i * seed) % 30000 + 1
        (root / f"{prefix}{i}").write_bytes(os.urandom(size))


def fsage(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-m", "fsage", *args], capture_output=True, text=True, env=env, timeout=300
    )


_EXT = re.compile(r"^\s*\d+:\s+(\d+)\.\.\s*\d+:\s+(\d+)\.\.\s*\d+:\s+(\d+):", re.M)


def filefrag(files: list[Path]) -> dict[str, tuple[int, list[tuple[int, int, int]]]]:
    """name -> (size, merged extents (logical, physical, length)) as `filefrag -e` sees them."""
    out: dict[str, tuple[int, list[tuple[int, int, int]]]] = {}
    for k in range(0, len(files), 500):
        text = subprocess.run(
            ["filefrag", "-e", *map(str, files[k : k + 500])],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        parts = re.split(r"^File size of (.+) is (\d+) ", text, flags=re.M)
        for name, size, body in zip(parts[1::3], parts[2::3], parts[3::3], strict=True):
            ext: list[tuple[int, int, int]] = []
            for lo, ph, n in ((int(a), int(b), int(c)) for a, b, c in _EXT.findall(body)):
                if ext and ext[-1][0] + ext[-1][2] == lo and ext[-1][1] + ext[-1][2] == ph:
                    ext[-1] = (ext[-1][0], ext[-1][1], ext[-1][2] + n)
                else:
                    ext.append((lo, ph, n))
            out[Path(name).name] = (int(size), ext)
    return out


def recorded(layout: Layout) -> dict[str, tuple[int, list[tuple[int, int, int]]]]:
    paths = layout.paths()
    f = layout.files
    out = {}
    for i, ino in enumerate(f.ino.tolist()):
        a, b = int(f.ext_off[i]), int(f.ext_off[i + 1])
        ext = list(
            zip(
                f.ext_logical[a:b].tolist(),
                f.ext_physical[a:b].tolist(),
                f.ext_length[a:b].tolist(),
                strict=True,
            )
        )
        for p in paths.get(ino, []):
            out[p.rsplit("/", 1)[-1]] = (int(f.size[i]), ext)
    return out


def _check_against_filefrag(m: Loop, layout: Layout) -> None:
    files = sorted(p for p in m.mnt.iterdir() if p.is_file())
    assert len(files) == 3000
    want = filefrag(files)
    got = recorded(layout)
    wrong = [n for n in want if got.get(n) != want[n]]
    assert not wrong, [(n, got.get(n), want[n]) for n in wrong[:5]]
    assert all(size > 0 and ext for size, ext in want.values())


def test_mounted_device_read_live_and_frozen_match_filefrag(mounted: Loop, tmp_path: Path) -> None:
    m = mounted
    _write(m.mnt, "a", 1500, 37)
    os.sync()
    _write(m.mnt, "b", 1500, 41)  # in the page cache only: not on disk yet
    db = tmp_path / "a.db"

    live = fsage("snapshot", m.device, "--db", str(db))
    assert live.returncode == 0, live.stderr
    assert "mounted read-write" in live.stderr and "through the mount point" in live.stderr
    assert len(live.stderr.strip().splitlines()) == 1
    with Store.open(db) as store:
        snap = store.snapshots()[-1]
        layout = store.load_layout(snap.id)
    assert snap.kind == "ext4" and snap.source == m.device
    _check_against_filefrag(m, layout)

    # The same file system, read through the image file and then frozen: one history.
    by_image = fsage("snapshot", str(m.image), "--db", str(db))
    assert by_image.returncode == 0, by_image.stderr
    _write(m.mnt, "c", 3, 7)
    for p in m.mnt.glob("c*"):
        p.unlink()
    frozen_run = fsage("snapshot", m.device, "--db", str(db), "--freeze")
    assert frozen_run.returncode == 0, frozen_run.stderr
    assert re.search(r"writers were held for \d+\.\d\d s", frozen_run.stderr)
    with Store.open(db) as store:
        snaps = store.snapshots()
        frozen_layout = store.load_layout(snaps[-1].id)
    assert len({s.fs_name for s in snaps}) == 1 and len({s.uuid for s in snaps}) == 1
    assert {s.kind for s in snaps} == {"ext4"}
    assert snaps[-1].new_files == snaps[-1].deleted_files == 0
    _check_against_filefrag(m, frozen_layout)
    # Thawed: a write goes through at once.
    (m.mnt / "after").write_bytes(b"x")
    os.sync()


def test_read_only_mount_is_read_offline(mounted: Loop) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(mounted.mnt)], check=True)
    where = find_mounted(Path(mounted.device), os.stat(mounted.device))
    assert where is not None and not where.read_write
    where = find_mounted(mounted.image, os.stat(mounted.image))
    assert where is not None and not where.read_write
    subprocess.run(["mount", "-o", "remount,rw", str(mounted.mnt)], check=True)
    where = find_mounted(mounted.image, os.stat(mounted.image))
    assert where is not None and where.read_write and where.mount_point == bytes(mounted.mnt)


def _is_frozen(mnt: Path) -> bool:
    """True if the file system is frozen (a freeze of our own fails with EBUSY)."""
    fd = os.open(mnt, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            fcntl.ioctl(fd, FIFREEZE, 0)
        except OSError as exc:
            assert exc.errno == errno.EBUSY
            return True
        fcntl.ioctl(fd, FITHAW, 0)
        return False
    finally:
        os.close(fd)


def test_freeze_thaws_on_error_and_after_a_signal(mounted: Loop) -> None:
    mnt = bytes(mounted.mnt)
    with pytest.raises(RuntimeError), frozen(mnt):
        assert _is_frozen(mounted.mnt)
        raise RuntimeError("the read failed")
    assert not _is_frozen(mounted.mnt)

    got: list[int] = []
    old = signal.signal(signal.SIGTERM, lambda s, f: got.append(s))
    # Another thread that does not block the signal (a mask covers only its own thread).
    done = threading.Event()
    other = threading.Thread(target=done.wait, daemon=True)
    other.start()
    try:
        with frozen(mnt):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
            assert got == []  # held back while frozen
            assert _is_frozen(mounted.mnt)
        assert got == [signal.SIGTERM]
    finally:
        done.set()
        other.join()
        signal.signal(signal.SIGTERM, old)
    assert not _is_frozen(mounted.mnt)


def test_killed_while_frozen_the_watchdog_thaws(mounted: Loop) -> None:
    code = (
        "import sys, time\n"
        "from fsage.snapshotter.mounted import frozen\n"
        "with frozen(sys.argv[1].encode()):\n"
        "    print('frozen', flush=True)\n"
        "    time.sleep(60)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(mounted.mnt)], stdout=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "frozen"
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 10
    while _is_frozen(mounted.mnt) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _is_frozen(mounted.mnt)


def test_daemon_reads_a_mounted_target_the_same_way(mounted: Loop, tmp_path: Path) -> None:
    import io

    from fsage.snapshotter.daemon import Daemon, Log, load_config

    m = mounted
    _write(m.mnt, "a", 1500, 37)
    os.sync()
    _write(m.mnt, "b", 1500, 41)
    cfg = tmp_path / "fsage.toml"
    cfg.write_text(
        f'database = "{tmp_path / "d.db"}"\n[[target]]\nname = "loop"\nsource = "{m.device}"\n'
    )
    daemon = Daemon(load_config(cfg), log=Log(io.StringIO(), style="plain"), use_jitter=False)
    assert daemon.run_once() == 0
    with Store.open(tmp_path / "d.db") as store:
        snap = store.snapshots()[-1]
        layout = store.load_layout(snap.id)
    assert snap.fs_name == "loop" and snap.kind == "ext4"
    assert any("through the mount point" in n for n in layout.notes)
    _check_against_filefrag(m, layout)
