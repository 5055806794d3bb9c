"""The store: incremental snapshots rebuild exactly, one transaction each, migrations."""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
import zlib
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest

from fsage.db import codec, legacy
from fsage.db.schema import LATEST_VERSION, MIGRATIONS
from fsage.db.store import Store
from fsage.db.versions import stored_versions
from fsage.errors import StoreError
from fsage.layout import FILE_COLUMNS, FileTable, Layout, LinkTable
from fsage.snapshotter import read_source

REPO = Path(__file__).resolve().parents[2]


def make_tree(root: Path, files: int, seed: int, sizes: tuple[int, ...]) -> list[str]:
    rng = random.Random(seed)
    names = []
    for i in range(files):
        sub = root / f"d{i % 7}"
        sub.mkdir(exist_ok=True)
        name = f"d{i % 7}/f{i:05d}"
        (root / name).write_bytes(rng.randbytes(rng.choice(sizes)))
        names.append(name)
    return names


def make_image(
    tmp: Path,
    files: int = 400,
    seed: int = 1,
    sizes: tuple[int, ...] = (100, 3000, 9000, 40000),
    size: str = "32M",
) -> tuple[Path, list[str]]:
    tree = tmp / "tree"
    tree.mkdir()
    names = make_tree(tree, files, seed, sizes)
    image = tmp / "fs.img"
    subprocess.run(
        ["mke2fs", "-q", "-F", "-t", "ext4", "-b", "1024", "-N", str(files + 1000), "-d",
         str(tree), str(image), size],
        check=True,
    )  # fmt: skip
    return image, names


def debugfs_write(image: Path, commands: list[str]) -> None:
    script = image.with_suffix(".cmds")
    script.write_text("\n".join(commands) + "\n")
    subprocess.run(["debugfs", "-w", "-f", str(script), str(image)], check=True,
                   capture_output=True)  # fmt: skip


def assert_tables_equal(a: FileTable, b: FileTable, skip: tuple[str, ...] = ()) -> None:
    for f in fields(FileTable):
        if f.name in skip:
            continue
        np.testing.assert_array_equal(getattr(a, f.name), getattr(b, f.name), err_msg=f.name)


def assert_layouts_equal(a: Layout, b: Layout, skip: tuple[str, ...] = ()) -> None:
    assert a.facts == b.facts
    assert_tables_equal(a.files, b.files, skip)
    assert_tables_equal(a.special, b.special, skip)
    np.testing.assert_array_equal(a.free.start, b.free.start)
    np.testing.assert_array_equal(a.free.length, b.free.length)
    assert a.paths() == b.paths()


def test_full_snapshot_rebuilds_exactly(tmp_path: Path) -> None:
    image, _ = make_image(tmp_path)
    layout = read_source(image)
    with Store.open(tmp_path / "db.sqlite", create=True) as store:
        summary = store.add_snapshot(layout, name="t")
        assert summary.files == len(layout.files)
        assert summary.new_files == len(layout.files)
        rebuilt = store.load_layout(summary.snapshot_id)
    assert_layouts_equal(layout, rebuilt)
    assert len(rebuilt.special) > 0  # the journal and resize inodes were kept apart


def test_incremental_snapshot_stores_only_changes(tmp_path: Path) -> None:
    image, names = make_image(tmp_path, files=600)
    db = tmp_path / "db.sqlite"
    first = read_source(image)
    with Store.open(db, create=True) as store:
        s1 = store.add_snapshot(first, name="t")
    rows_before = _rows(db, "file_versions")

    # Change about 1% of the files: add 3, then delete 3 (in that order, so that the new
    # files do not reuse the deleted inode numbers: debugfs gives every inode generation 0).
    extra = tmp_path / "extra.bin"
    extra.write_bytes(os.urandom(20000))
    debugfs_write(
        image,
        [f"write {extra} /d0/new{i}" for i in range(3)] + [f"rm /{n}" for n in names[10:13]],
    )
    second = read_source(image)
    with Store.open(db, create=True) as store:
        s2 = store.add_snapshot(second, name="t")
        assert (s2.new_files, s2.deleted_files) == (3, 3)
        # The directories that gained or lost entries changed too; nothing else did.
        assert s2.changed_files <= 3
        added = _rows(db, "file_versions") - rows_before
        assert added == s2.new_files + s2.changed_files
        assert added < 0.02 * rows_before
        assert_layouts_equal(first, store.load_layout(s1.snapshot_id))
        assert_layouts_equal(second, store.load_layout(s2.snapshot_id))
        # Taking the same state again stores nothing.
        s3 = store.add_snapshot(read_source(image), name="t")
        assert (s3.new_files, s3.changed_files, s3.deleted_files) == (0, 0, 0)
        assert _rows(db, "file_versions") == rows_before + added


def test_rename_is_a_change_of_one_file(tmp_path: Path) -> None:
    image, names = make_image(tmp_path, files=50)
    with Store.open(tmp_path / "db.sqlite", create=True) as store:
        store.add_snapshot(read_source(image), name="t")
        debugfs_write(image, [f"ln /{names[0]} /d1/renamed", f"unlink /{names[0]}"])
        after = read_source(image)
        s2 = store.add_snapshot(after, name="t")
        assert s2.new_files == 0 and s2.deleted_files == 0
        # Only the file's names changed: debugfs leaves the directories' times and blocks alone.
        assert s2.changed_files == 1
        rebuilt = store.load_layout(s2.snapshot_id)
    ino = next(i for i, p in rebuilt.paths().items() if "/d1/renamed" in p)
    assert rebuilt.paths()[ino] == ["/d1/renamed"]


def test_atime_alone_is_not_a_change(tmp_path: Path) -> None:
    image, _ = make_image(tmp_path, files=20)
    layout = read_source(image)
    with Store.open(tmp_path / "db.sqlite", create=True) as store:
        store.add_snapshot(layout, name="t")
        layout.files.atime += 10**9
        s2 = store.add_snapshot(layout, name="t")
        assert s2.changed_files == 0
        layout.files.mtime[3] += 1
        s3 = store.add_snapshot(layout, name="t")
        assert s3.changed_files == 1


def test_name_belongs_to_one_uuid(tmp_path: Path) -> None:
    image, _ = make_image(tmp_path, files=5)
    layout = read_source(image)
    with Store.open(tmp_path / "db.sqlite", create=True) as store:
        store.add_snapshot(layout, name="home")
        layout.facts.uuid = "00000000-0000-0000-0000-000000000001"
        with pytest.raises(StoreError, match="belongs to UUID"):
            store.add_snapshot(layout, name="home")
        # Without a name, a known UUID keeps its name; a new one gets label or uuid prefix.
        assert store.add_snapshot(layout).fs_name == "fs-00000000"
        assert [r.fs_name for r in store.snapshots()] == ["home", "fs-00000000"]


def test_failed_snapshot_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    image, _ = make_image(tmp_path, files=30)
    layout = read_source(image)
    db = tmp_path / "db.sqlite"
    with Store.open(db, create=True) as store:
        store.add_snapshot(layout, name="t")
    before = (_rows(db, "snapshots"), _rows(db, "file_versions"), _rows(db, "filesystems"))
    layout.files.mtime[:] += 1  # everything changed: a large write

    def fail(*args: object) -> None:
        raise RuntimeError("disk on fire")

    # Fails after the snapshot row and the superseded versions were written.
    monkeypatch.setattr("fsage.db.codec.pack_chunk", fail)
    with Store.open(db) as store, pytest.raises(RuntimeError, match="disk on fire"):
        store.add_snapshot(layout, name="t")
    assert (_rows(db, "snapshots"), _rows(db, "file_versions"), _rows(db, "filesystems")) == before


def test_kill_during_snapshot_leaves_database_as_it_was(tmp_path: Path) -> None:
    image, _ = make_image(tmp_path, files=30000, sizes=(10, 100), size="64M")
    db = tmp_path / "db.sqlite"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "fsage", "snapshot", str(image), "--db", str(db), "--name", "t"]
    t0 = time.monotonic()
    subprocess.run(cmd, check=True, env=env, capture_output=True)
    duration = time.monotonic() - t0
    good = _rows(db, "snapshots"), _rows(db, "file_versions")
    rng = random.Random(3)
    killed_inside = 0
    for _ in range(6):
        # Force a full rewrite each time so that the transaction is long enough to interrupt:
        # with no snapshot left, the next one stores every file.
        with Store.open(db) as store:
            store.delete_snapshots([r.id for r in store.snapshots()])
            good = 0, 0
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        # Most of a run after start-up is the write transaction: kill somewhere in it.
        time.sleep(rng.uniform(0.5, 0.95) * duration)
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait()
        with sqlite3.connect(db) as con:
            assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
            snaps = con.execute("SELECT COUNT(*) FROM snapshots").fetchone()[0]
            if proc.returncode == -signal.SIGKILL:
                # Killed inside the transaction, or after its commit: never anything between.
                assert snaps in (good[0], good[0] + 1)
                killed_inside += snaps == good[0]
            good = snaps, stored_versions(con)
        # Whatever is there rebuilds to the image's current state.
        with Store.open(db) as store:
            snaps_left = store.snapshots("t")
            if snaps_left:
                rebuilt = store.load_layout(snaps_left[-1].id)
                assert len(rebuilt.files) == len(read_source(image).files)
            else:  # killed: not a single version of the half-written snapshot is left
                assert good == (0, 0)
    assert killed_inside > 0, "no run was interrupted; the test did not exercise a kill"


def _journal_mode(db: Path) -> str:
    with sqlite3.connect(db) as con:
        return str(con.execute("PRAGMA journal_mode").fetchone()[0])


def test_a_new_database_takes_wal_after_its_first_snapshot(tmp_path: Path) -> None:
    image, _ = make_image(tmp_path, files=50)
    db = tmp_path / "db.sqlite"
    store = Store.open(db, create=True)
    try:
        # The first snapshot's pages are written once, through a rollback journal...
        assert store.con.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
        store.add_snapshot(read_source(image), name="t")
        # ... and from then on readers never wait for the writer.
        assert store.con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        with Store.open(db, readonly=True) as reader:
            store.con.execute("BEGIN IMMEDIATE")
            store.con.execute("UPDATE snapshots SET label = 'being written'")
            assert [r.label for r in reader.snapshots()] == [None]  # read during the write
            store.con.execute("ROLLBACK")
    finally:
        store.close()
    assert not Path(f"{db}-journal").exists()
    assert _journal_mode(db) == "wal"
    with Store.open(db) as again:
        assert again.con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


KILL_IN_FIRST_WRITE = """
import os, signal, sys
from fsage.db import versions
from fsage.db.store import Store
from fsage.snapshotter import read_source
write_chunk = versions.write_chunk
def write_then_die(*args, **kwargs):
    write_chunk(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGKILL)  # inside the transaction, its pages written
versions.write_chunk = write_then_die
Store.open(sys.argv[2], create=True).add_snapshot(read_source(sys.argv[1]), name="t")
"""


def test_a_first_snapshot_killed_in_its_write_leaves_a_database_that_opens(
    tmp_path: Path,
) -> None:
    image, _ = make_image(tmp_path, files=2000, sizes=(10, 100, 5000))
    db = tmp_path / "db.sqlite"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-c", KILL_IN_FIRST_WRITE, str(image), str(db)], env=env, check=False
    )
    assert proc.returncode == -signal.SIGKILL
    assert Path(f"{db}-journal").exists()  # a hot journal: the write was under way
    with Store.open(db) as store:  # rolled back to the empty schema, and in WAL mode
        assert store.snapshots() == []
        assert store.con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert store.con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        summary = store.add_snapshot(read_source(image), name="t")
        assert summary.new_files == summary.files > 2000
    assert not Path(f"{db}-journal").exists()


def test_snapshots_of_four_file_systems_into_one_new_database_at_once(tmp_path: Path) -> None:
    images = []
    for k in range(4):
        (tmp_path / f"t{k}").mkdir()
        images.append(make_image(tmp_path / f"t{k}", files=300, seed=k)[0])
    db = tmp_path / "db.sqlite"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    commands = [
        [sys.executable, "-m", "fsage", "snapshot", str(image), "--db", str(db)] for image in images
    ]
    procs = [
        subprocess.Popen(c, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for c in commands
    ]
    outcomes = [(*p.communicate(), p.returncode) for p in procs]
    # One of them made the database; the others found it being made (its schema, or its first
    # snapshot, under way) and went on, each taking its turn to write.
    assert [code for _, _, code in outcomes] == [0, 0, 0, 0], outcomes
    with Store.open(db) as store:
        assert len(store.snapshots()) == 4
        assert len(store.filesystems()) == 4
        assert store.con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert _journal_mode(db) == "wal"
    assert not Path(f"{db}-journal").exists()


def test_migrations_are_recorded_and_newer_schema_refused(tmp_path: Path) -> None:
    db = tmp_path / "db.sqlite"
    with Store.open(db, create=True) as store:
        versions = [r[0] for r in store.con.execute("SELECT version FROM schema_migrations")]
        assert versions == [m[0] for m in MIGRATIONS]
    with sqlite3.connect(db) as con:
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"  # taken at close
        con.execute(
            "INSERT INTO schema_migrations VALUES (?, 'from the future', '2099-01-01')",
            (LATEST_VERSION + 1,),
        )
    with pytest.raises(StoreError, match="newer than this fsage"):
        Store.open(db)


def test_missing_and_foreign_databases_are_refused(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no database"):
        Store.open(tmp_path / "nope.db")
    assert not (tmp_path / "nope.db").exists()
    junk = tmp_path / "junk.db"
    junk.write_bytes(os.urandom(4096))
    with pytest.raises(StoreError, match="not an fsage database"):
        Store.open(junk)


def test_unknown_snapshot_and_fs(tmp_path: Path) -> None:
    with Store.open(tmp_path / "db.sqlite", create=True) as store:
        with pytest.raises(StoreError, match="no snapshot 7"):
            store.load_layout(7)
        with pytest.raises(StoreError, match="no file system named"):
            store.snapshots("home")


def _rows(db: Path, table: str) -> int:
    with sqlite3.connect(db) as con:
        if table == "file_versions":
            return stored_versions(con)
        return int(con.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])


def test_every_file_column_is_stored() -> None:
    # Guards the codec against a new Layout column that the store would silently drop.
    names = [name for name, _, _ in codec.KEY_COLUMNS + codec.BODY_COLUMNS]
    assert set(FILE_COLUMNS) <= set(names)
    assert len(names) == len(set(names))


@pytest.mark.parametrize(
    ("values", "delta", "width"),
    [
        (np.zeros(0, np.uint64), False, 0),
        (np.full(5, 7, np.uint32), False, 0),  # a constant column costs its header only
        (np.array([1, 3, 4, 10, 2, 11, 12], np.uint64), True, 1),  # a step back is fine
        (np.array([10**6, 10**6 + 300], np.uint64), False, 2),
        (np.array([-(2**63), 2**63 - 1], np.int64), False, 8),
        (np.array([2**64 - 1, 0, 2**63], np.uint64), True, 8),
        (np.array([-5, 3, -1], np.int16), True, 1),
        (np.array([True, False, True]), False, 1),
        (np.frombuffer(b"names\xff\x00", np.uint8), False, 1),
    ],
)
def test_narrowed_columns_round_trip(values: np.ndarray, delta: bool, width: int) -> None:
    from fsage import _ext2fs

    blob = _ext2fs.pack_columns([(values, delta)])
    assert len(blob) == 26 + width * len(values)
    (back,) = _ext2fs.unpack_columns(blob, [values.dtype.itemsize])
    np.testing.assert_array_equal(np.frombuffer(back, values.dtype), values)


def test_many_large_columns_round_trip() -> None:
    """Enough values that two threads share the columns (each column's last store spills into
    the next column's header, which is written after both threads are done)."""
    from fsage import _ext2fs

    rng = np.random.default_rng(11)
    n = 70_000
    cols: list[tuple[np.ndarray, bool]] = [
        (np.cumsum(rng.integers(0, 3, n)).astype(np.uint64), True),
        (rng.integers(-(2**40), 2**40, n), False),
        (rng.integers(0, 7, n).astype(np.uint8), False),
        (np.full(n, 5, np.uint32), False),  # width 0
        (rng.integers(0, 2**16, 3).astype(np.uint16), False),  # short between long ones
        (rng.integers(0, 2**63, n, dtype=np.uint64), True),
        (rng.integers(-(2**31), 2**31, n).astype(np.int32), True),
    ]
    blob = _ext2fs.pack_columns(cols)
    back = _ext2fs.unpack_columns(blob, [c.dtype.itemsize for c, _ in cols])
    for (values, _), got in zip(cols, back, strict=True):
        np.testing.assert_array_equal(np.frombuffer(got, values.dtype), values)
    # Each column on its own packs to the same bytes as its part of the whole.
    assert b"".join(_ext2fs.pack_columns([c]) for c in cols) == blob


def test_corrupt_column_blobs_are_refused() -> None:
    from fsage import _ext2fs

    blob = _ext2fs.pack_columns([(np.arange(100, dtype=np.uint64) * 1000, False)])
    for bad in (blob[:-1], blob + b"x", blob[:20]):
        with pytest.raises(ValueError, match="corrupt"):
            _ext2fs.unpack_columns(bad, [8])
    with pytest.raises(TypeError, match="unsupported"):
        _ext2fs.pack_columns([(np.zeros(3, np.float64), False)])


def test_schema_5_databases_are_converted(tmp_path: Path) -> None:
    """A database written by fsage at store schema 5 (tests/db/data/make_store_v5.py) reads
    back exactly what that fsage printed for it, after the conversion on opening."""
    import gzip
    import shutil

    data = Path(__file__).parent / "data"
    db = tmp_path / "v5.db"
    shutil.copyfile(data / "store_v5.db", db)
    with gzip.open(data / "store_v5.json.gz", "rt") as fh:
        expected = json.load(fh)
    from click.testing import CliRunner

    from fsage.cli import main

    def cli(*args: str) -> object:
        result = CliRunner().invoke(main, [*args, "--db", str(db), "--format", "json"])
        assert result.exit_code == 0, result.output
        return json.loads(result.output)

    listed = cli("snapshots")
    assert isinstance(listed, list)
    # regular files were not counted before schema 7: unknown, not guessed
    assert [row.pop("regular_files") for row in listed] == [None] * len(listed)
    assert listed == expected["snapshots"]
    for snap, listing in expected["show"].items():
        assert cli("show", snap) == listing
    with Store.open(db) as store:
        for snap, columns in expected["layouts"].items():
            layout = store.load_layout(int(snap))
            for key, want in columns.items():
                part, _, name = key.partition(".")
                if part in ("files", "special"):
                    got = getattr(getattr(layout, part), name).tolist()
                elif key == "links.names":
                    got = [n.decode("utf-8", "surrogateescape") for n in layout.links.iter_names()]
                elif part == "links":
                    got = getattr(layout.links, name).tolist()
                else:
                    got = [layout.free.start.tolist(), layout.free.length.tolist()]
                assert got == want, (snap, key)
        columns = {r[1] for r in store.con.execute("PRAGMA table_info(version_chunks)")}
        assert columns == {"id", "fs_id", "first_snap", "n", "live", "dead_after"}
        # It goes on incrementally from the converted state: nothing changed since snapshot 4.
        again = store.add_snapshot(store.load_layout(4), name="old")
        assert (again.new_files, again.changed_files, again.deleted_files) == (0, 0, 0)
        assert again.snapshot_id == 5
    assert sqlite3.connect(db).execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_deleted_snapshots_leave_the_others_exact(tmp_path: Path) -> None:
    image, names = make_image(tmp_path, files=120)
    db = tmp_path / "db.sqlite"
    extra = tmp_path / "extra.bin"
    extra.write_bytes(os.urandom(5000))
    states = [read_source(image)]
    debugfs_write(image, [f"write {extra} /d1/a{i}" for i in range(4)] + [f"rm /{names[3]}"])
    states.append(read_source(image))
    debugfs_write(image, [f"rm /d1/a{i}" for i in range(2)] + [f"rm /{names[5]}"])
    states.append(read_source(image))
    with Store.open(db, create=True) as store:
        ids = [store.add_snapshot(s, name="t").snapshot_id for s in states]
        # The middle one: the versions only it could see go, the others stay exact.
        assert store.delete_snapshots([ids[1]]) == 1
        assert [r.id for r in store.snapshots("t")] == [ids[0], ids[2]]
        assert_layouts_equal(states[0], store.load_layout(ids[0]))
        assert_layouts_equal(states[2], store.load_layout(ids[2]))
        # The newest: the state before it becomes current again, and a new snapshot compares
        # against that.
        store.delete_snapshots([ids[2]])
        assert_layouts_equal(states[0], store.load_layout(ids[0]))
        again = store.add_snapshot(states[2], name="t")
        assert (again.new_files, again.deleted_files) == (2, 2)
        assert_layouts_equal(states[2], store.load_layout(again.snapshot_id))
        assert_layouts_equal(states[0], store.load_layout(ids[0]))
        with pytest.raises(StoreError, match="no snapshot"):
            store.delete_snapshots([again.snapshot_id + 1])
    assert sqlite3.connect(db).execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def _write_v1_snapshot(
    con: sqlite3.Connection, layout: Layout, snap_id: int, prev: dict[int, int]
) -> dict[int, int]:
    """Record a snapshot the way the first schema did (one file_versions row per version);
    ``prev`` maps ino -> digest of the current versions. Returns the new map."""
    from fsage.db.diff import all_files

    files, special = all_files(layout)
    order, link_off = codec.link_order(files, layout.links)
    digests = codec.file_digests_numpy(files, layout.links, order, link_off).view(np.int64)
    free = np.stack([layout.free.start, layout.free.length], 1).astype("<u8").tobytes()
    con.execute(
        "INSERT INTO snapshots(id, fs_id, taken_at, source, kind, facts, files, dirs, extents,"
        " blocks_used, blocks_free, free_extents, damaged, new_files, changed_files,"
        " deleted_files, seconds, free_map) VALUES (?, 1, ?, '', ?, ?, 0,0,0,0,0,0,0,0,0,0,0, ?)",
        (snap_id, f"2026-01-0{snap_id}T00:00:00+00:00", layout.facts.kind,
         json.dumps(layout.facts.to_json()),
         zlib.compress(free)),
    )  # fmt: skip
    now = {int(i): int(d) for i, d in zip(files.ino, digests, strict=True)}
    for ino, digest in prev.items():
        if now.get(ino) != digest:
            con.execute(
                "UPDATE file_versions SET last_snap = ? WHERE ino = ? AND last_snap IS NULL",
                (snap_id - 1, ino),
            )
    for k in range(len(files)):
        ino = int(files.ino[k])
        if prev.get(ino) == now[ino]:
            continue
        inode = np.zeros(1, legacy.INODE_DTYPE)
        for c in codec.INODE_FIELDS:
            inode[c] = getattr(files, c)[k]
        inode["special"] = special[k]
        a, b = int(files.ext_off[k]), int(files.ext_off[k + 1])
        ext = np.stack([files.ext_logical[a:b], files.ext_physical[a:b], files.ext_length[a:b],
                        files.ext_flags[a:b].astype(np.uint64)], 1).astype("<u8")  # fmt: skip
        a, b = int(files.meta_off[k]), int(files.meta_off[k + 1])
        meta = np.stack([files.meta_physical[a:b], files.meta_kind[a:b].astype(np.uint64)], 1)
        mine = order[int(link_off[k]) : int(link_off[k + 1])]
        con.execute(
            "INSERT INTO file_versions(fs_id, ino, first_snap, digest, generation, inode,"
            " extents, meta, link_parents, link_names) VALUES (1, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (ino, snap_id, now[ino], int(files.generation[k]), inode.tobytes(), ext.tobytes(),
             meta.astype("<u8").tobytes(), layout.links.parent[mine].astype("<u8").tobytes(),
             b"".join(layout.links.name(int(j)) + b"\0" for j in mine)),
        )  # fmt: skip
    return now


def test_first_schema_databases_are_converted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    image, names = make_image(tmp_path, files=80)
    first = read_source(image)
    debugfs_write(image, [f"rm /{names[0]}", f"ln /{names[1]} /d2/again"])
    second = read_source(image)
    db = tmp_path / "old.db"
    from fsage.db import schema

    monkeypatch.setattr(schema, "MIGRATIONS", schema.MIGRATIONS[:4])
    monkeypatch.setattr(schema, "LATEST_VERSION", 4)
    with Store.open(db, create=True) as store:
        store.con.execute(
            "INSERT INTO filesystems VALUES (1, 'old', ?, 'ext4', '2026-01-01')",
            (first.facts.uuid,),
        )
        prev = _write_v1_snapshot(store.con, first, 1, {})
        _write_v1_snapshot(store.con, second, 2, prev)
    monkeypatch.undo()
    with Store.open(db) as store:
        assert_layouts_equal(first, store.load_layout(1))
        assert_layouts_equal(second, store.load_layout(2))
        tables = {r[0] for r in store.con.execute("SELECT name FROM sqlite_master")}
        assert "file_versions" not in tables
        # A new snapshot continues incrementally from the converted ones, with a fresh id.
        third = store.add_snapshot(second, name="old")
        assert (third.snapshot_id, third.new_files, third.changed_files) == (3, 0, 0)


def test_c_digests_agree_with_their_numpy_definition(tmp_path: Path) -> None:
    from fsage.db.diff import all_files

    image, _ = make_image(tmp_path, files=300)
    layout = read_source(image)
    files, _special = all_files(layout)
    order, link_off = codec.link_order(files, layout.links)
    link_file = codec.link_files(files, layout.links)
    c = codec.file_digests(files, layout.links, link_file)
    np.testing.assert_array_equal(c, codec.file_digests_numpy(files, layout.links, order, link_off))
    assert len(np.unique(c)) == len(files)
    # A link to an inode that is not listed is ignored by both.
    links = layout.links
    stray = type(links).from_lists([2], [999_999], [b"stray"])
    both = type(links)(
        parent=np.concatenate([links.parent, stray.parent]),
        ino=np.concatenate([links.ino, stray.ino]),
        name_off=np.concatenate([links.name_off, links.name_off[-1] + stray.name_off[1:]]),
        names=links.names + stray.names,
    )
    np.testing.assert_array_equal(c, codec.file_digests(files, both, codec.link_files(files, both)))


def test_an_unusable_database_is_not_called_foreign(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "db.sqlite"
    with Store.open(db, create=True):
        pass

    def io_error(*args: object, **kwargs: object) -> None:
        raise sqlite3.OperationalError("disk I/O error")  # what a full disk gives on open

    monkeypatch.setattr(sqlite3, "connect", io_error)
    with pytest.raises(StoreError, match=r"cannot use the database \(disk I/O error\)"):
        Store.open(db)


@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.uint32, np.int64, np.uint64])
def test_every_width_and_length_round_trips(dtype: type[np.generic]) -> None:
    """Short and long columns of every width, so that both the 8-byte loads and the last
    values (fewer than 8 bytes from the blob's end) are read."""
    from fsage import _ext2fs

    rng = np.random.default_rng(3)
    info = np.iinfo(dtype)  # type: ignore[type-var]
    for n in (1, 2, 7, 9, 100):
        for bits in (1, 8, 13, 24, 40, 63):
            hi = min(int(info.max), int(info.min) + (1 << bits))
            values = rng.integers(int(info.min), hi, n, endpoint=True, dtype=dtype)
            for delta in (False, True):
                blob = _ext2fs.pack_columns([(values, delta), (values[:1], False)])
                back = _ext2fs.unpack_columns(blob, [values.dtype.itemsize] * 2)
                np.testing.assert_array_equal(np.frombuffer(back[0], dtype), values)
                np.testing.assert_array_equal(np.frombuffer(back[1], dtype), values[:1])


@pytest.mark.parametrize("spread", [1, 1000])  # dense inode numbers (a table), sparse (a search)
def test_link_files_finds_each_links_inode(spread: int) -> None:
    rng = np.random.default_rng(spread)
    ino = rng.choice(np.arange(1, 7_000, dtype=np.uint64), 5_000, replace=False) * np.uint64(spread)
    empty = FileTable.empty()
    files = FileTable(
        **{
            name: np.zeros(len(ino), getattr(empty, name).dtype)
            for name in FILE_COLUMNS
            if name != "ino"
        },
        ino=ino,
        ext_off=np.zeros(len(ino) + 1, np.uint64),
        ext_logical=empty.ext_logical,
        ext_physical=empty.ext_physical,
        ext_length=empty.ext_length,
        ext_flags=empty.ext_flags,
        meta_off=np.zeros(len(ino) + 1, np.uint64),
        meta_physical=empty.meta_physical,
        meta_kind=empty.meta_kind,
    )
    # every file named, some twice, and names of inodes no file has (free, or past the end)
    missing = np.array([0, int(ino.max()) + 1, 2**63, 2**64 - 1], np.uint64)
    named = np.concatenate([ino, ino[:100], missing])
    rng.shuffle(named)
    links = LinkTable(
        np.zeros(len(named), np.uint64), named, np.zeros(len(named) + 1, np.uint64), b""
    )
    rows = codec.link_files(files, links)
    want = {int(i): r for r, i in enumerate(ino.tolist())}
    assert rows.tolist() == [want.get(int(i), -1) for i in named.tolist()]


def test_c_digests_of_many_files_agree_with_their_numpy_definition() -> None:
    """Past 65536 files the C digest sums the names on a second thread, and it reads the
    4-byte columns without their widened copies: still the numpy definition, bit for bit."""
    rng = np.random.default_rng(16)
    n = 70_000
    ext_counts = rng.integers(0, 4, n)
    ext_off = np.zeros(n + 1, np.uint64)
    np.cumsum(ext_counts, out=ext_off[1:])
    m = int(ext_off[-1])
    cols = {
        c: rng.integers(0, 2**63, n, dtype=np.uint64).astype(t) for c, t in FILE_COLUMNS.items()
    }
    cols["ino"] = np.arange(11, 11 + n, dtype=np.uint64)
    files = FileTable(
        **cols,
        ext_off=ext_off,
        ext_logical=rng.integers(0, 2**40, m, dtype=np.uint64),
        ext_physical=rng.integers(0, 2**40, m, dtype=np.uint64),
        ext_length=rng.integers(1, 2**20, m, dtype=np.uint64),
        ext_flags=rng.integers(0, 2**32, m, dtype=np.uint64).astype(np.uint32),
        meta_off=np.zeros(n + 1, np.uint64),
        meta_physical=np.zeros(0, np.uint64),
        meta_kind=np.zeros(0, np.uint8),
    )
    owners = rng.permutation(np.concatenate([cols["ino"], cols["ino"][:5000]]))  # hard links
    links = LinkTable.from_lists(
        rng.integers(2, 10, len(owners)).tolist(),
        owners.tolist(),
        [f"f{i}".encode() for i in range(len(owners))],
    )
    order, link_off = codec.link_order(files, links)
    c = codec.file_digests(files, links, codec.link_files(files, links))
    np.testing.assert_array_equal(c, codec.file_digests_numpy(files, links, order, link_off))
