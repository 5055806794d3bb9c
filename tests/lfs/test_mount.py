"""`fsage lfs mount`: real images mounted through the kernel's FUSE, checked against a tmpfs
twin, fsck, a remount and the kernel's own view (statfs, stat)."""

from __future__ import annotations

import errno
import hashlib
import os
import random
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fsage.lfs.fs import LFS, mkfs
from fsage.lfs.fsck import fsck
from fsage.lfs.mount import _options, fuse_available

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    fuse_available() is not None, reason=f"no FUSE here: {fuse_available()}"
)


class Mounted:
    """An image mounted by ``fsage lfs mount`` (daemon mode) in a subprocess."""

    def __init__(self, image: Path, mp: Path, *args: str) -> None:
        self.image, self.mp = image, mp
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        out = subprocess.run(
            [sys.executable, "-m", "fsage", "lfs", "mount", str(image), str(mp), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        m = re.search(r"\(pid (\d+)\)", out.stdout)
        assert m, out.stdout
        self.pid = int(m.group(1))
        assert os.path.ismount(mp)

    def alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        try:  # a zombie has exited
            with open(f"/proc/{self.pid}/stat") as f:
                return f.read().split(") ", 1)[1][0] != "Z"
        except OSError:
            return False

    def wait_gone(self, timeout: float = 30.0) -> None:
        end = time.monotonic() + timeout
        while self.alive():
            assert time.monotonic() < end, "the mount process did not exit"
            time.sleep(0.05)

    def unmount(self) -> None:
        # Another process walking the tree (a du, an indexer) holds the mount for a moment:
        # busy is retried for a while, anything else fails at once.
        end = time.monotonic() + 15
        while os.path.ismount(self.mp):
            out = subprocess.run(
                ["fusermount3", "-u", str(self.mp)], capture_output=True, text=True, timeout=30
            )
            if out.returncode == 0:
                break
            if "busy" not in out.stderr or time.monotonic() > end:
                raise AssertionError(f"fusermount3 -u {self.mp}: {out.stderr.strip()}")
            time.sleep(0.2)
        self.wait_gone()

    def kill9(self) -> None:
        os.kill(self.pid, 9)
        self.wait_gone()
        # A killed server shows as a zombie before the kernel has torn its connection down.
        end = time.monotonic() + 30
        while time.monotonic() < end:
            try:
                os.stat(self.mp)
            except OSError:
                break
            time.sleep(0.05)
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        try:
            out = subprocess.run(
                [sys.executable, "-m", "fsage", "lfs", "mount", str(self.image), str(self.mp)],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert out.returncode == 2 and "fusermount3 -u" in out.stderr, out.stderr
        finally:  # the dead mount is detached whatever happens
            subprocess.run(["fusermount3", "-u", str(self.mp)], check=True, timeout=30)


@pytest.fixture
def image(tmp_path: Path) -> Path:
    img = tmp_path / "lfs.img"
    mkfs(img, size=64 << 20, blocks_per_segment=128)
    return img


@pytest.fixture
def mounted(tmp_path: Path, image: Path) -> Iterator[Mounted]:
    mp = tmp_path / "mnt"
    mp.mkdir()
    m = Mounted(image, mp)
    try:
        yield m
    finally:
        if m.alive() or os.path.ismount(mp):
            try:
                m.unmount()
            except Exception:
                subprocess.run(["fusermount3", "-uz", str(mp)], check=False)
                raise


@pytest.fixture
def twin() -> Iterator[Path]:
    """A directory on tmpfs (/dev/shm) that runs the same workload."""
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm (tmpfs)")
    d = Path(tempfile.mkdtemp(prefix="fsage-twin-", dir="/dev/shm"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)
        for left in d.parent.glob(f"{d.name}.fsage-age*"):  # `fsage age`'s state, beside it
            left.unlink()


# ---------------------------------------------------------------------------- the workload


def _outcome(fn: Callable[[], Any]) -> Any:
    try:
        return ("ok", fn())
    except OSError as exc:
        return ("err", errno.errorcode.get(exc.errno or 0, exc.errno))


_OPS = [
    "create",
    "create",
    "write",
    "write",
    "append",
    "truncate",
    "unlink",
    "mkdir",
    "rmdir",
    "rename",
    "rename",
    "symlink",
    "link",
    "chmod",
    "chown",
    "utime",
    "read",
    "readlink",
    "hold",
    "release",
]


def _step(
    rng: random.Random, op: str, a: Path, b: Path, d: Path, held: list[tuple[int, str]]
) -> Any:
    """One POSIX call of the workload."""
    size = rng.choice([0, 1, 100, 4095, 4096, 4097, 9000, 70000])
    data = rng.randbytes(size)
    off = rng.choice([0, 1, 4096, 5000, 130000])
    if op in ("create", "write", "append"):
        flags = {"create": os.O_CREAT | os.O_TRUNC, "write": 0, "append": os.O_APPEND}[op]
        fd = os.open(a, os.O_WRONLY | flags, 0o640)
        try:
            return os.pwrite(fd, data, off) if op == "write" else os.write(fd, data)
        finally:
            os.close(fd)
    if op == "hold":
        held.append((os.open(a, os.O_RDWR), a.name))
        return 0
    if op == "release":
        if not held:
            return b""
        fd, _ = held.pop(rng.randrange(len(held)))
        try:
            return hashlib.sha1(os.pread(fd, 1 << 20, 0)).digest()
        finally:
            os.close(fd)
    if op == "truncate":
        return os.truncate(a, rng.choice([0, 10, 4096, 6000, 200000]))
    if op == "unlink":
        return os.unlink(a)
    if op == "mkdir":
        return os.mkdir(d, 0o750)
    if op == "rmdir":
        return os.rmdir(d)
    if op == "rename":
        return os.rename(a, rng.choice([b, d]))
    if op == "symlink":  # targets stay inside the tree (relative, or dangling)
        return os.symlink(rng.choice(["f1", "d0/f2", "nowhere", "d0/f1" * 40]), a)
    if op == "link":
        return os.link(a, b)
    if op == "chmod":
        return os.chmod(a, rng.choice([0o600, 0o644, 0o4755, 0o1777]))
    if op == "chown":
        return os.chown(a, 1234, 4321)
    if op == "utime":
        return os.utime(a, ns=(rng.randrange(1 << 40) * 1_000_000,) * 2)
    if op == "read":
        return hashlib.sha1(a.read_bytes()).digest()
    assert op == "readlink"
    return os.readlink(a)


def _workload(root: Path, seed: int, n: int) -> list[Any]:
    """A seeded stream of POSIX calls below ``root``; returns each call's outcome."""
    rng = random.Random(seed)
    names = [f"f{i}" for i in range(12)] + [f"d{i}/f{j}" for i in range(3) for j in range(4)]
    dirs = ["d0", "d1", "d2", "d0/e", "d1/e"]
    out: list[Any] = []
    held: list[tuple[int, str]] = []
    for _ in range(n):
        op = rng.choice(_OPS)
        a, b = root / rng.choice(names), root / rng.choice(names)
        d = root / rng.choice(dirs)
        res = _outcome(lambda: _step(rng, op, a, b, d, held))  # noqa: B023 (called at once)
        out.append((op, a.relative_to(root), res))
    while held:
        os.close(held.pop()[0])
    return out


def _tree(root: Path) -> dict[str, Any]:
    """Everything POSIX shows of a tree, comparable across file systems."""
    out: dict[str, Any] = {}
    inodes: dict[int, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames + filenames):
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            st = os.lstat(p)
            rec: dict[str, Any] = {
                "type": stat.S_IFMT(st.st_mode),
                "perm": stat.S_IMODE(st.st_mode),
                "uid": st.st_uid,
                "gid": st.st_gid,
            }
            if stat.S_ISREG(st.st_mode):
                rec["size"] = st.st_size
                rec["sha1"] = hashlib.sha1(p.read_bytes()).hexdigest()
                rec["nlink"] = st.st_nlink
                rec["mtime_ms"] = st.st_mtime_ns // 1_000_000
                rec["same_as"] = inodes.setdefault(st.st_ino, rel)
            elif stat.S_ISLNK(st.st_mode):
                rec["target"] = os.readlink(p)
            else:
                rec["entries"] = sorted(os.listdir(p))
                rec["nlink"] = st.st_nlink
            out[rel] = rec
    return out


def _strip_times(tree: dict[str, Any]) -> dict[str, Any]:
    return {k: {f: v for f, v in r.items() if f != "mtime_ms"} for k, r in tree.items()}


# ---------------------------------------------------------------------------- tests


@pytest.mark.slow
def test_posix_workload_matches_tmpfs_twin(mounted: Mounted, twin: Path) -> None:
    mp = mounted.mp
    for root in (mp, twin):
        for d in ("d0", "d1", "d2"):
            (root / d).mkdir()
    got = _workload(mp, seed=7, n=700)
    want = _workload(twin, seed=7, n=700)
    assert got == want
    assert sum(1 for _, _, (k, _) in got if k == "ok") > 250  # the workload did things
    tree_twin = _tree(twin)
    # Explicit utimes agree to the millisecond; times the file systems set themselves differ
    # by when each ran, so only the set (non-time) attributes are compared for those.
    assert _strip_times(_tree(mp)) == _strip_times(tree_twin)
    os.utime(mp / "d0", ns=(1_500_000_000_123_000_000,) * 2)
    assert os.stat(mp / "d0").st_mtime_ns == 1_500_000_000_123_000_000
    before = _tree(mp)
    mounted.unmount()
    rep = fsck(mounted.image)
    assert rep.ok, rep.problems
    again = Mounted(mounted.image, mp)
    try:
        after = _tree(mp)
        assert _strip_times(after) == _strip_times(before)
        # The kernel's writeback cache keeps the mtime of a written file itself; the LFS stores
        # the time the data reached it, up to the write-back's delay later.
        for k, rec in before.items():
            if "mtime_ms" in rec:
                assert 0 <= after[k]["mtime_ms"] - rec["mtime_ms"] < 2000, k
        assert os.stat(mp / "d0").st_mtime_ns == 1_500_000_000_123_000_000
    finally:
        again.unmount()


def test_file_ops_and_attributes(mounted: Mounted) -> None:
    mp = mounted.mp
    (mp / "a").write_bytes(b"hello")
    os.mkdir(mp / "dir", 0o700)
    os.symlink("a", mp / "s")
    os.link(mp / "a", mp / "dir" / "h")
    assert (mp / "s").read_bytes() == b"hello"
    assert os.stat(mp / "a").st_nlink == 2
    assert stat.S_IMODE(os.stat(mp / "dir").st_mode) == 0o700
    os.chmod(mp / "a", 0o604)
    os.utime(mp / "a", ns=(1_000_000_000_000_000_000, 1_200_000_000_456_000_000))
    st = os.stat(mp / "dir" / "h")
    assert stat.S_IMODE(st.st_mode) == 0o604
    assert st.st_mtime_ns == 1_200_000_000_456_000_000
    if os.geteuid() == 0:
        os.chown(mp / "a", 501, 20)
        assert (os.stat(mp / "a").st_uid, os.stat(mp / "a").st_gid) == (501, 20)
    with open(mp / "a", "r+b") as f:
        f.truncate(2)
        f.seek(10000)
        f.write(b"tail")
        f.flush()
        os.fsync(f.fileno())
    assert (mp / "a").read_bytes() == b"he" + bytes(9998) + b"tail"
    os.rename(mp / "dir", mp / "moved")
    assert (mp / "moved" / "h").read_bytes().endswith(b"tail")
    with pytest.raises(OSError) as ei:
        os.rmdir(mp / "moved")
    assert ei.value.errno == errno.ENOTEMPTY
    with pytest.raises(FileExistsError):
        os.mkdir(mp / "moved")
    # An open file that is unlinked keeps its data until closed, then goes.
    fd = os.open(mp / "moved" / "h", os.O_RDWR)
    os.unlink(mp / "moved" / "h")
    os.unlink(mp / "a")
    assert os.pread(fd, 2, 0) == b"he"
    os.close(fd)
    assert os.listdir(mp / "moved") == []
    os.rmdir(mp / "moved")
    assert sorted(os.listdir(mp)) == ["s"]
    # statfs: the LFS's own block counts.
    vfs = os.statvfs(mp)
    assert vfs.f_frsize == 4096
    mounted.unmount()
    with LFS.open(mounted.image, readonly=True) as fs:
        total, live = fs.usage()
        assert fs.rolled_forward == 0  # the unmount checkpointed
        assert [n for n, _ in fs.readdir("")] == ["s"]
    assert vfs.f_blocks == total
    assert total - vfs.f_bfree >= live  # blocks of the removed files were still live then
    assert rep_ok(mounted.image)


def rep_ok(image: Path) -> bool:
    rep = fsck(image)
    assert rep.ok, rep.problems
    return True


@pytest.mark.slow
def test_kill9_loses_nothing_fsynced(tmp_path: Path, mounted: Mounted) -> None:
    mp = mounted.mp
    data = random.Random(3).randbytes(300_000)
    with open(mp / "kept", "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.mkdir(mp / "dir")
    fd = os.open(mp / "dir", os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(fd)
    os.close(fd)
    # Not fsynced: buffered in the mount process, and may be lost (whole), never half.
    loose = random.Random(4).randbytes(50_000)
    (mp / "loose").write_bytes(loose)
    with open(mp / "kept", "r+b") as f:
        f.write(b"Z" * 10)
    mounted.kill9()
    with LFS.open(mounted.image, readonly=True) as fs:
        assert fs.rolled_forward > 0  # no checkpoint since: what is there came by roll-forward
    assert rep_ok(mounted.image)
    again = Mounted(mounted.image, mp)
    try:
        kept = (mp / "kept").read_bytes()
        assert kept in (data, b"Z" * 10 + data[10:])
        assert (mp / "dir").is_dir()
        if (mp / "loose").exists():
            assert (mp / "loose").read_bytes() in (b"", loose)
    finally:
        again.unmount()
    assert rep_ok(mounted.image)


@pytest.mark.slow
def test_snapshot_of_the_mount_reads_the_image(
    tmp_path: Path, mounted: Mounted, fsage_env: dict[str, str]
) -> None:
    mp = mounted.mp
    for i in range(20):
        (mp / f"f{i}").write_bytes(bytes([i]) * (i * 5000))
    db = tmp_path / "s.db"
    out = subprocess.run(
        [sys.executable, "-m", "fsage", "snapshot", str(mp), "--db", str(db)],
        env=fsage_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    from fsage.errors import SourceError
    from fsage.snapshotter.live import read_live_layout
    from fsage.snapshotter.sources import read_source

    with pytest.raises(SourceError, match="no FIEMAP"):
        read_live_layout(mp)

    layout = read_source(mp)
    assert layout.facts.kind == "lfs"
    assert any("mounted through FUSE" in n for n in layout.notes)
    sizes = sorted(int(s) for s in layout.files.size if s)
    assert sizes[-19:] == [i * 5000 for i in range(1, 20)]


@pytest.mark.slow
def test_foreground_mount_checkpoints_on_sigterm(tmp_path: Path, image: Path) -> None:
    mp = tmp_path / "fg"
    mp.mkdir()
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.Popen(
        [sys.executable, "-m", "fsage", "lfs", "mount", str(image), str(mp), "--foreground"],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert "mounted on" in proc.stdout.readline()
        (mp / "f").write_bytes(b"x" * 10000)  # not fsync'ed: the unmount writes it
        proc.send_signal(15)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        # A server that died leaves a mount os.path.ismount cannot stat: look in the table.
        if str(mp) in Path("/proc/mounts").read_text():
            subprocess.run(["fusermount3", "-uz", str(mp)], check=False)
    assert not os.path.ismount(mp)
    with LFS.open(image, readonly=True) as fs:
        assert fs.rolled_forward == 0
        assert fs.read("f") == b"x" * 10000
    assert rep_ok(image)


@pytest.mark.slow
def test_age_through_the_mount_matches_tmpfs(
    tmp_path: Path, mounted: Mounted, twin: Path, fsage_env: dict[str, str]
) -> None:
    ops = tmp_path / "ops.jsonl"

    def fsage(*args: str) -> None:
        out = subprocess.run(
            [sys.executable, "-m", "fsage", *args],
            env=fsage_env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 0, out.stderr

    fsage(
        "workload",
        "generate",
        "--profile",
        "hfs-surge",
        "--seed",
        "5",
        "--capacity",
        "24M",
        "--fill",
        "0.5",
        "-o",
        str(ops),
    )
    first = tmp_path / "first.jsonl"  # the header and the first 600 ops
    first.write_text("".join(ops.read_text().splitlines(keepends=True)[:601]))
    for target in (mounted.mp, twin):
        fsage("age", str(target), "--ops", str(first), "--force")
    skip = {".fsage-age"}
    got = {k: v for k, v in _strip_times(_tree(mounted.mp)).items() if k not in skip}
    want = {k: v for k, v in _strip_times(_tree(twin)).items() if k not in skip}
    assert len(want) > 50
    assert got == want
    mounted.unmount()
    assert rep_ok(mounted.image)


def test_permissions_are_checked_by_the_kernel_only_when_others_are_let_in() -> None:
    """Without allow_other only the mounting user (who can write the image anyway) reaches
    the files: no default_permissions, which costs a request per directory change."""
    img = Path("/x/lfs.img")
    assert "default_permissions" not in _options(img, ()).split(",")
    opts = _options(img, ("allow_other",)).split(",")
    assert "default_permissions" in opts and "allow_other" in opts
    assert _options(img, ("allow_other", "default_permissions")).count("default_permissions") == 1
