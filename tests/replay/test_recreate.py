"""Recreation from snapshots: geometry (dumpe2fs as the oracle), a kernel-aged history replayed
onto a real loop-mounted ext4 (the kernel's own tree and e2fsck as oracles), the offline
variant, bad input and cleanup after a failure."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from fsage.ager.images import loop_mount, make_image
from fsage.ager.profile import get_preset
from fsage.ager.run import AgeOptions, age
from fsage.cli import main
from fsage.db.store import Store
from fsage.replay import deltas as deltas_mod
from fsage.replay import recreate as recreate_mod
from fsage.replay.recreate import RecreateOptions, make_filesystem, recreate
from fsage.snapshotter import read_source

MIB = 1 << 20
GEOMETRY_FIELDS = (
    "Block count",
    "Inode count",
    "Reserved block count",
    "Block size",
    "Group descriptor size",
    "Reserved GDT blocks",
    "Blocks per group",
    "Inodes per group",
    "Inode blocks per group",
    "Flex block group size",
    "Inode size",
    "Filesystem features",
    "Filesystem volume name",
    "Directory Hash Seed",
    "Default directory hash",
    "Journal size",
    "Total journal blocks",
    "Total journal size",
)


def _dumpe2fs(image: Path) -> dict[str, str]:
    out = subprocess.run(
        ["dumpe2fs", "-h", str(image)], capture_output=True, text=True, check=True
    ).stdout
    fields = {}
    for line in out.splitlines():
        m = re.match(r"^([^:]+):\s*(.*)$", line)
        if m:
            fields[m.group(1).strip()] = m.group(2).strip()
    return fields


def _fsck_clean(image: Path) -> None:
    proc = subprocess.run(["e2fsck", "-fn", str(image)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _tree(root: Path) -> dict[str, int]:
    """path -> size (-1 for directories) as the kernel shows the mounted tree."""
    out: dict[str, int] = {}
    for dirpath, dirs, files in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        if rel == ".":
            dirs[:] = [d for d in dirs if d != "lost+found"]
        for d in dirs:
            out[os.path.normpath(os.path.join(rel, d))] = -1
        for f in files:
            p = os.path.join(dirpath, f)
            out[os.path.normpath(os.path.join(rel, f))] = os.lstat(p).st_size
    return out


@pytest.mark.parametrize(
    "mkfs_args",
    [
        ["-t", "ext4", "-b", "1024"],
        ["-t", "ext4", "-b", "2048", "-I", "512", "-G", "4", "-N", "3000", "-g", "4096",
         "-J", "size=2", "-m", "2", "-L", "odd-geometry"],
        ["-t", "ext3", "-b", "4096", "-L", "old"],
        ["-t", "ext2", "-b", "1024", "-O", "^resize_inode", "-m", "0"],
        ["-t", "ext4", "-O", "bigalloc", "-C", "16384", "-b", "4096"],
    ],
)  # fmt: skip
def test_recorded_geometry_is_made_again(tmp_path: Path, mkfs_args: list[str]) -> None:
    orig = tmp_path / "orig.img"
    with open(orig, "wb") as fh:
        fh.truncate(48 * MIB)
    subprocess.run(["mke2fs", "-F", "-q", *mkfs_args, str(orig)], check=True, capture_output=True)
    rec = tmp_path / "rec.img"
    notes = make_filesystem(rec, read_source(orig))
    assert notes == []
    a, b = _dumpe2fs(orig), _dumpe2fs(rec)
    for key in GEOMETRY_FIELDS:
        assert a.get(key) == b.get(key), key
    assert a["Filesystem UUID"] != b["Filesystem UUID"]
    _fsck_clean(rec)


# ---------------------------------------------------------------------------- histories


def _aged_history(tmp_path: Path, mode: str, size: int = 96 * MIB) -> tuple[Path, Path, int]:
    """An image aged with snapshots into a database: (image, db, last snapshot id)."""
    img = make_image(tmp_path / "orig.img", "ext4", size)
    db = tmp_path / "fsage.db"
    prof = get_preset("hfs-surge").with_overrides(fill=0.6, churn=0.6)
    res = age(
        img,
        AgeOptions(profile=prof, seed=11, mode=mode, db=db, snapshot_every=500, name="orig"),
    )
    assert res.finished and len(res.snapshots) >= 3
    return img, db, res.snapshots[-1]


@pytest.mark.needs_root
def test_replay_of_a_kernel_aged_history_on_loop_mounted_ext4(tmp_path: Path) -> None:
    img, db, last = _aged_history(tmp_path, "mount")
    target = tmp_path / "rec.img"
    runner = CliRunner()
    out = runner.invoke(
        main,
        ["replay", "--db", str(db), "--fs", "orig", "--until", str(last), "--format", "json",
         str(target)],
    )  # fmt: skip
    assert out.exit_code == 0, out.output
    import json

    data: dict[str, Any] = json.loads(out.stdout)
    fid = data["fidelity"]
    assert data["mode"] == "mount"
    assert data["snapshot_id"] == last and len(data["snapshots_replayed"]) >= 3
    assert fid["files_matched"] == fid["files_original"] == fid["files_recreated"] > 100
    assert fid["bytes_matched"] == fid["bytes_original"] == fid["bytes_recreated"]
    assert fid["dirs_matched"] == fid["dirs_original"] == fid["dirs_recreated"]
    assert abs(fid["layout_score_recreated"] - fid["layout_score_original"]) <= 0.05
    assert fid["geometry_matches"]
    assert data["nospace"] == 0 and data["failed"] == 0

    # Oracles: e2fsck, dumpe2fs, and the two trees as the kernel shows them.
    _fsck_clean(target)
    a, b = _dumpe2fs(img), _dumpe2fs(target)
    for key in GEOMETRY_FIELDS:
        assert a.get(key) == b.get(key), key
    with loop_mount(img) as m1:
        t1 = _tree(m1)
    with loop_mount(target) as m2:
        t2 = _tree(m2)
    assert t1 == t2
    assert not list(tmp_path.glob(".*fsage-part"))

    # Recorded as a recreation, under its own name, in time order after the original.
    with Store.open(db) as store:
        row = store.snapshot(data["recreation_snapshot_id"])
        assert row.recreation_of == last
        assert row.fs_name == f"orig-recreated-{last}" == data["recreation_fs"]
        assert row.uuid != store.snapshot(last).uuid
        assert row.files == store.snapshot(last).files


@pytest.mark.needs_root
def test_replay_to_an_earlier_snapshot_by_date(tmp_path: Path) -> None:
    _img, db, _last = _aged_history(tmp_path, "mount", size=64 * MIB)
    with Store.open(db) as store:
        rows = store.snapshots("orig")
    second = rows[1]
    when = second.taken_at.isoformat()
    res = recreate(RecreateOptions(db=db, fs_name="orig", target=tmp_path / "r.img", until=when))
    assert res.snapshot_id == second.id
    assert res.snapshots_replayed == [rows[0].id, second.id]
    fid = res.fidelity
    assert fid is not None
    # The store counts every user inode (directories too: root and lost+found among them).
    assert fid.files_matched == fid.files_original == second.files - second.dirs
    assert fid.dirs_matched == fid.dirs_original == second.dirs - 2


def test_offline_replay_matches_files_and_bytes(tmp_path: Path) -> None:
    pytest.importorskip("fsage._ext2fs")
    img, db, last = _aged_history(tmp_path, "offline", size=64 * MIB)
    target = tmp_path / "rec.img"
    msgs: list[str] = []
    res = recreate(
        RecreateOptions(db=db, fs_name="orig", target=target, mode="offline"), echo=msgs.append
    )
    assert res.mode == "offline"
    assert any("libext2fs" in m for m in msgs)
    fid = res.fidelity
    assert fid is not None
    assert fid.files_matched == fid.files_original == fid.files_recreated > 50
    assert fid.bytes_matched == fid.bytes_original == fid.bytes_recreated
    assert fid.geometry_matches
    _fsck_clean(target)
    # Oracle independent of fsage's reader: debugfs lists the same names in the root.
    ls = subprocess.run(
        ["debugfs", "-R", "ls -p /", str(target)], capture_output=True, text=True, check=True
    ).stdout
    ls0 = subprocess.run(
        ["debugfs", "-R", "ls -p /", str(img)], capture_output=True, text=True, check=True
    ).stdout

    def names(text: str) -> dict[str, str]:
        out = {}
        for line in text.splitlines():
            parts = line.strip().strip("/").split("/")
            # Inode 0: an unused entry (what an unlink leaves at the start of a block).
            if len(parts) >= 6 and parts[4] not in (".", "..") and parts[0] != "0":
                out[parts[4]] = parts[5]  # name -> size
        return out

    assert names(ls) == names(ls0)
    assert res.recreation_snapshot_id > last


def _loops_over(directory: Path) -> list[str]:
    """Loop devices whose backing file lies in ``directory``, after up to 5 s for one being
    detached to go (a device udev still has open is detached at its last close)."""
    import time

    for _ in range(50):
        out = subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout
        left = [line for line in out.splitlines() if str(directory) in line]
        if not left:
            break
        time.sleep(0.1)
    return left


@pytest.mark.needs_root
@pytest.mark.parametrize("end", ["remount", "sync"])
def test_interval_ends_leave_no_mount_or_loop_device(tmp_path: Path, end: str) -> None:
    """Remounts go through one loop device set up for the replay; the recreation is whole and
    clean, and neither the mount nor the device outlives the replay."""
    _img, db, _last = _aged_history(tmp_path, "mount", size=64 * MIB)
    target = tmp_path / "r.img"
    res = recreate(RecreateOptions(db=db, fs_name="orig", target=target, interval_end=end))
    assert res.interval_end == end and len(res.snapshots_replayed) >= 3
    fid = res.fidelity
    assert fid is not None
    assert fid.files_matched == fid.files_original == fid.files_recreated > 50
    assert fid.bytes_matched == fid.bytes_original
    assert {"deltas", "waiting_for_deltas", "ops", "interval_ends"} <= set(res.timings)
    assert _loops_over(tmp_path) == []
    with open("/proc/self/mountinfo") as fh:
        assert str(tmp_path) not in fh.read()
    _fsck_clean(target)


@pytest.mark.needs_root
def test_the_next_interval_is_inferred_while_this_one_ends_never_while_ops_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inferring on another thread while ops run made every op wait for the interpreter lock;
    the inference overlaps only the interval ends."""
    _img, db, _last = _aged_history(tmp_path, "mount", size=64 * MIB)
    inferring: list[tuple[float, float]] = []
    op_times: list[float] = []
    real_interval, real_apply = deltas_mod.DeltaBuilder.interval, recreate_mod._apply

    def interval(self: Any, *a: Any, **kw: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return real_interval(self, *a, **kw)
        finally:
            inferring.append((t0, time.perf_counter()))

    def apply(*a: Any) -> None:
        op_times.append(time.perf_counter())
        real_apply(*a)

    monkeypatch.setattr(deltas_mod.DeltaBuilder, "interval", interval)
    monkeypatch.setattr(recreate_mod, "_apply", apply)
    res = recreate(RecreateOptions(db=db, fs_name="orig", target=tmp_path / "r.img"))
    assert len(inferring) == len(res.snapshots_replayed) >= 3 and len(op_times) == res.ops
    assert not [t for t in op_times for lo, hi in inferring if lo < t < hi]
    assert res.fidelity is not None and res.fidelity.files_matched == res.fidelity.files_original


# ---------------------------------------------------------------------------- bad input


@pytest.fixture
def two_fs_db(tmp_path: Path) -> tuple[Path, int, int]:
    """A database with file systems 'one' (two snapshots) and 'two' (one); no root needed."""
    db = tmp_path / "fsage.db"
    a = make_image(tmp_path / "a.img", "ext4", 16 * MIB)
    b = make_image(tmp_path / "b.img", "ext4", 16 * MIB)
    with Store.open(db, create=True) as store:
        s1 = store.add_snapshot(read_source(a), name="one").snapshot_id
        store.add_snapshot(read_source(a), name="one")
        s3 = store.add_snapshot(read_source(b), name="two").snapshot_id
    return db, s1, s3


def _run(args: list[str]) -> Any:
    return CliRunner().invoke(main, args)


def test_bad_input_gives_one_clear_error(tmp_path: Path, two_fs_db: tuple[Path, int, int]) -> None:
    db, _s1, s3 = two_fs_db
    target = str(tmp_path / "t.img")
    cases = [
        (["--fs", "nope"], "no file system named 'nope'"),
        (["--fs", "one", "--until", str(s3)], f"snapshot {s3} belongs to file system 'two'"),
        (["--fs", "one", "--until", "1999-12-31"], "before the first snapshot of 'one'"),
        (["--fs", "one", "--until", "999"], "no snapshot 999"),
        (["--fs", "one", "--until", "soon"], "neither a snapshot id nor a date"),
    ]
    for extra, msg in cases:
        res = _run(["replay", "--db", str(db), *extra, target])
        assert res.exit_code != 0
        assert msg in res.output, res.output
        assert "Traceback" not in res.output
        assert not Path(target).exists()
        res = _run(["deltas", "--db", str(db), *extra, "-o", str(tmp_path / "o.jsonl")])
        assert res.exit_code != 0 and msg in res.output
    res = _run(["replay", "--db", str(tmp_path / "missing.db"), "--fs", "one", target])
    assert res.exit_code != 0 and "no database" in res.output
    with Store.open(db) as store:
        assert len(store.snapshots()) == 3


def test_existing_target_is_refused_without_force(
    tmp_path: Path, two_fs_db: tuple[Path, int, int]
) -> None:
    db, _s1, _s3 = two_fs_db
    target = tmp_path / "t.img"
    target.write_bytes(b"precious")
    res = _run(["replay", "--db", str(db), "--fs", "one", str(target)])
    assert res.exit_code == 2
    assert "exists; use --force" in res.output
    assert target.read_bytes() == b"precious"
    res = _run(["replay", "--db", str(db), "--fs", "one", str(tmp_path)])
    assert res.exit_code == 2 and "is a directory" in res.output


def test_failure_leaves_nothing_behind(
    tmp_path: Path, two_fs_db: tuple[Path, int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    db, _s1, _s3 = two_fs_db
    target = tmp_path / "t.img"
    target.write_bytes(b"precious")

    def boom(*args: object, **kw: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(deltas_mod.DeltaBuilder, "interval", boom)
    # The replay's mount point goes under tmp_path: replays running beside this test (other
    # tests, benchmarks) mount theirs under the temporary directory at any moment.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with pytest.raises(KeyboardInterrupt):
        recreate(RecreateOptions(db=db, fs_name="one", target=target, force=True))
    assert target.read_bytes() == b"precious"
    left = sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("fsage.db"))
    assert left == ["a.img", "b.img", "t.img"]
    with open("/proc/self/mountinfo") as fh:
        assert str(tmp_path) not in fh.read()
    assert _loops_over(tmp_path) == []
    with Store.open(db) as store:
        assert [f["name"] for f in store.filesystems()] == ["one", "two"]


def test_deltas_cli_writes_a_workload_the_ager_reads(
    tmp_path: Path, two_fs_db: tuple[Path, int, int]
) -> None:
    db, s1, _s3 = two_fs_db
    out = tmp_path / "ops.jsonl.gz"
    res = _run(["deltas", "--db", str(db), "--fs", "one", "-o", str(out),
                "--intra-files-per-day", "5", "--intra-seed", "3"])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "intra-day activity added" in res.output
    from fsage.workload import read_workload

    header, ops = read_workload(out)
    assert header.generator == "fsage replay deltas"
    assert header.params["snapshots"] == [s1, s1 + 1]
    assert header.params["intra_day"]["files_per_day"] == 5.0
    assert header.seed == 3
    body = list(ops)
    # Two empty file systems: only the snapshot markers.
    assert [o.op for o in body] == ["snapshot", "snapshot"]


def test_offline_replay_makes_symlinks_and_special_files(tmp_path: Path, e2fsprogs: None) -> None:
    """An original made by debugfs (symlinks fast and slow, a FIFO, a device node, a file),
    replayed through libext2fs without a mount: debugfs finds the same inodes of the same
    types in the recreation, and e2fsck finds it clean."""
    pytest.importorskip("fsage._ext2fs")
    img = tmp_path / "o.img"
    with open(img, "wb") as fh:
        fh.truncate(16 * MIB)
    subprocess.run(["mke2fs", "-F", "-q", "-t", "ext4", str(img)], check=True, capture_output=True)
    data = tmp_path / "data"
    data.write_bytes(b"d" * 20000)
    cmds = "\n".join([
        "mkdir d", f"write {data} d/file", "symlink d/short file", "symlink long " + "t" * 200,
        "mknod fifo p", "cd d", "mknod tty c 4 1",  # (debugfs puts a "d/tty" in the root)
    ])  # fmt: skip
    subprocess.run(["debugfs", "-w", "-f", "-", str(img)], input=cmds, text=True, check=True,
                   capture_output=True)  # fmt: skip
    db = tmp_path / "s.db"
    with Store.open(db, create=True) as store:
        store.add_snapshot(read_source(img), name="s")
    target = tmp_path / "r.img"
    res = recreate(RecreateOptions(db=db, fs_name="s", target=target, mode="offline"))
    assert res.failed == 0, res.failed_examples
    fid = res.fidelity
    assert fid is not None
    assert fid.symlinks_matched == fid.symlinks_original == 2
    assert fid.others_matched == fid.others_original == 2
    assert fid.files_matched == 1
    _fsck_clean(target)

    def kind(image: Path, path: str) -> tuple[str, str]:
        out = subprocess.run(["debugfs", "-R", f"stat {path}", str(image)], capture_output=True,
                             text=True, check=True).stdout  # fmt: skip
        t = re.search(r"Type: (\w+)", out)
        size = re.search(r"Size: (\d+)", out)
        assert t and size, out
        return t.group(1), size.group(1)

    for path in ("/d/short", "/long", "/fifo", "/d/tty", "/d/file"):
        assert kind(target, path) == kind(img, path), path


def test_a_name_taken_by_a_concurrent_replay_is_chosen_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two replays into one database: the name the first chose at its start is taken by the
    other before it stores its recreation; it stores under the next free name, not an error
    after the whole replay (which removed its recreated image)."""
    pytest.importorskip("fsage._ext2fs")
    import sqlite3

    from fsage.replay import recreate as recreate_mod

    _img, db, last = _aged_history(tmp_path, "offline", size=64 * MIB)
    real_free_name = recreate_mod._free_name

    def free_name_then_taken(store: Any, base: str) -> str:
        name = real_free_name(store, base)
        if name == base:  # the first choice: another replay stores under it meanwhile
            con = sqlite3.connect(db)
            with con:
                con.execute(
                    "INSERT INTO filesystems (name, uuid, kind, created_at) VALUES (?, ?, ?, ?)",
                    (name, "another-replay", "ext4", "2026-01-01T00:00:00+00:00"),
                )
            con.close()
        return name

    monkeypatch.setattr(recreate_mod, "_free_name", free_name_then_taken)
    target = tmp_path / "rec.img"
    res = recreate(RecreateOptions(db=db, fs_name="orig", target=target, mode="offline"))
    assert res.recreation_fs == f"orig-recreated-{last}-2"
    assert target.exists()
