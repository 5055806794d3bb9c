"""Damaged databases: every read command gives the right answer or one line and a non-zero
exit, never a traceback and never a different answer; nothing is written into one.

A small real database (two snapshots of one ext4 image and one of another, made with mke2fs
-d from a seeded tree) is damaged in seeded ways (zeroed pages, random bytes in chunk blobs
and in any page, truncation), and each command's output on the damaged copy is compared with
its output on the intact one.
"""

from __future__ import annotations

import hashlib
import random
import shutil
import sqlite3
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from fsage.cli import main

PAGE = 16384


def _tree(root: Path, seed: int, files: int) -> None:
    rng = random.Random(seed)
    for i in range(files):
        sub = root / f"d{i % 5}"
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"f{i:04d}").write_bytes(rng.randbytes(rng.choice((500, 3000, 20000))))


@pytest.fixture(scope="module")
def intact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("mke2fs") is None:
        pytest.skip("needs mke2fs")
    tmp = tmp_path_factory.mktemp("damaged")
    db = tmp / "intact.db"
    uuid = "8c1e4b52-5a0e-4c5e-9a4e-3f1f6c2d7a10"
    # snapshots 1 and 2 of two images of "one", 3 of the second again (it stores nothing:
    # rebuilding it reads what 2 stored), 4 of another file system
    other = "0f6f1d2e-9b7a-4d3c-8e5f-6a7b8c9d0e1f"
    for n, files, fs_uuid in ((0, 120, uuid), (1, 140, uuid), (1, 140, uuid), (2, 60, other)):
        image = tmp / f"fs{n}.img"
        if not image.exists():
            _tree(tmp / f"tree{n}", 1, files)
            subprocess.run(
                ["mke2fs", "-q", "-F", "-t", "ext4", "-b", "1024", "-U", fs_uuid, "-d",
                 str(tmp / f"tree{n}"), str(image), "8M"],
                check=True,
            )  # fmt: skip
        result = CliRunner().invoke(main, ["snapshot", str(image), "--db", str(db), "--name",
                                           "one" if fs_uuid == uuid else "two"])  # fmt: skip
        assert result.exit_code == 0, result.output
    return db


def _commands(db: Path, out: Path) -> dict[str, list[str]]:
    d = ["--db", str(db)]
    return {
        "snapshots": ["snapshots", *d, "--format", "json"],
        "show": ["show", "3", *d],
        "analyze": ["analyze", "--snapshot", "3", *d, "--format", "json"],
        "history": ["analyze", "--fs", "one", "--history", *d, "--format", "csv"],
        "report": ["report", *d, "-o", str(out / "report.html")],
        "export": ["export", *d, str(out / "export")],
        "deltas": ["deltas", "--fs", "one", *d, "-o", str(out / "ops.jsonl")],
        "status": ["status", *d, "--format", "json"],
    }


def _answer(args: list[str], out: Path) -> tuple[int, str, str, str]:
    """(exit code, stdout, stderr, digest of the files written); a traceback fails the test."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir()
    result = CliRunner().invoke(main, args)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"{args[0]}: traceback") from result.exception
    digest = hashlib.sha256()
    for f in sorted(out.rglob("*")):
        if f.is_file() and not f.name.startswith("."):
            digest.update(str(f.relative_to(out)).encode() + f.read_bytes())
    stdout = result.stdout
    if args[0] == "export":  # its one line ends with the time it took
        stdout = stdout.split(" in ")[0]
    return result.exit_code, stdout, result.stderr, digest.hexdigest()


def _quick_check(db: Path) -> str:
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            return str(con.execute("PRAGMA quick_check").fetchone()[0])
        finally:
            con.close()
    except sqlite3.DatabaseError as exc:
        return str(exc)


def _blob_spans(db: Path) -> list[tuple[int, int]]:
    """Where the chunk blobs' first bytes lie in the file (a blob's start is unique enough)."""
    con = sqlite3.connect(db)
    blobs = [b for row in con.execute("SELECT keys, body FROM chunk_blobs") for b in row]
    con.close()
    raw = db.read_bytes()
    spans = []
    for blob in blobs:
        at = raw.find(blob[:48])
        if at >= 0:
            spans.append((at, min(len(blob), PAGE - at % PAGE)))
    return spans


def _damages(db: Path, seed: int) -> list[tuple[str, Callable[[bytearray], bytearray]]]:
    rng = random.Random(seed)
    pages = db.stat().st_size // PAGE
    spans = _blob_spans(db)
    assert spans, "no chunk blob found in the file"
    out: list[tuple[str, Callable[[bytearray], bytearray]]] = []

    def zero_page(p: int) -> Callable[[bytearray], bytearray]:
        def f(b: bytearray) -> bytearray:
            b[p * PAGE : (p + 1) * PAGE] = bytes(PAGE)
            return b

        return f

    def scribble(at: int, data: bytes) -> Callable[[bytearray], bytearray]:
        def f(b: bytearray) -> bytearray:
            b[at : at + len(data)] = data
            return b

        return f

    def truncate(size: int) -> Callable[[bytearray], bytearray]:
        return lambda b: b[:size]

    for p in range(1, pages):
        out.append((f"page {p} zeroed", zero_page(p)))
    for _ in range(12):
        start, length = rng.choice(spans)
        at = start + rng.randrange(length)
        data = rng.randbytes(rng.randint(1, 8))
        out.append((f"{len(data)} random bytes at {at} (a chunk blob)", scribble(at, data)))
    for _ in range(16):
        at = rng.randrange(100, pages * PAGE)
        data = rng.randbytes(rng.randint(1, 16))
        out.append((f"{len(data)} random bytes at {at}", scribble(at, data)))
    for size in sorted({rng.randrange(1, pages) * PAGE for _ in range(3)} | {PAGE * 2 + 100}):
        out.append((f"truncated to {size} bytes", truncate(size)))
    return out


@pytest.mark.slow
def test_damaged_databases_answer_right_or_fail_in_one_line(intact: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    expected = {name: _answer(args, out) for name, args in _commands(intact, out).items()}
    for name, (code, _, err, _) in expected.items():
        assert code == 0, f"{name} on the intact database: {err}"
    damaged = tmp_path / "damaged.db"
    refused = written_into = 0
    cases = _damages(intact, seed=27)
    for what, damage in cases:
        damaged.write_bytes(damage(bytearray(intact.read_bytes())))
        for name, args in _commands(damaged, out).items():
            code, stdout, stderr, files = _answer(args, out)
            if code == 0:
                want = _commands(intact, out)[name]
                assert len(want) == len(args)
                _, exp_out, _, exp_files = expected[name]
                exp_out = exp_out.replace(str(intact), str(damaged))
                assert (stdout, files) == (exp_out, exp_files), f"{what}: {name} answered wrong"
            else:
                refused += 1
                left = [
                    str(f.relative_to(out))
                    for f in out.rglob("*")
                    if f.is_file() and not f.name.endswith(".lock")
                ]
                assert left == [], f"{what}: {name} failed and left {left}"
                lines = stderr.strip().splitlines()
                assert len(lines) == 1, f"{what}: {name}: {stderr}"
                assert lines[0].startswith("fsage: error: "), f"{what}: {name}: {stderr}"
                assert str(damaged) in lines[0], f"{what}: {name}: {stderr}"
        # a database that fails SQLite's quick check is never written into
        before = damaged.read_bytes()
        if _quick_check(damaged) != "ok":
            result = CliRunner().invoke(
                main, ["snapshot", str(intact.parent / "fs2.img"), "--db", str(damaged)]
            )
            assert result.exit_code == 1, f"{what}: snapshot: {result.output}"
            assert len(result.stderr.splitlines()) == 1, f"{what}: snapshot: {result.stderr}"
            assert damaged.read_bytes() == before, f"{what}: snapshot wrote into it"
            written_into += 1
    print(
        f"{len(cases)} damaged databases, {refused} of {len(cases) * 8} read runs refused;"
        f" {written_into} failing quick_check refused a snapshot"
    )
    assert refused > len(cases) and written_into > 5  # the damage was seen, not only survived


def test_a_damaged_chunk_names_its_snapshot(intact: Path, tmp_path: Path) -> None:
    db = tmp_path / "x.db"
    shutil.copy(intact, db)
    con = sqlite3.connect(db)
    (chunk_id, body) = con.execute(
        "SELECT b.chunk_id, b.body FROM chunk_blobs b JOIN version_chunks c"
        " ON c.id = b.chunk_id WHERE c.first_snap = 2"
    ).fetchone()
    flipped = bytearray(body)
    flipped[len(body) // 2] ^= 0x40  # one bit: SQLite cannot tell
    con.execute("UPDATE chunk_blobs SET body = ? WHERE chunk_id = ?", (bytes(flipped), chunk_id))
    con.commit()
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    con.close()
    for args in (["show", "3"], ["analyze", "--snapshot", "3"]):
        result = CliRunner().invoke(main, [*args, "--db", str(db)])
        assert result.exit_code == 1 and result.stdout == ""
        # show checks the columns it reads, analyze the whole chunk
        assert result.stderr.startswith(
            f"fsage: error: {db}: snapshot 3 cannot be read: the file versions recorded by"
            " snapshot 2 are damaged ("
        ), result.stderr
        assert result.stderr.endswith(" match its checksum)\n" if args[0] == "show" else
                                      " match their checksum)\n"), result.stderr  # fmt: skip
        assert len(result.stderr.splitlines()) == 1


def test_nothing_is_written_into_a_database_that_fails_its_quick_check(
    intact: Path, tmp_path: Path
) -> None:
    db = tmp_path / "x.db"
    raw = bytearray(intact.read_bytes())
    con = sqlite3.connect(intact)
    # the root page of the snapshots table's index: structure that quick_check reads
    (root,) = con.execute(
        "SELECT rootpage FROM sqlite_master WHERE name = 'snapshots_fs'"
    ).fetchone()
    con.close()
    raw[(root - 1) * PAGE : root * PAGE] = bytes(PAGE)
    db.write_bytes(raw)
    check = sqlite3.connect(db)
    assert check.execute("PRAGMA quick_check").fetchone()[0] != "ok"
    check.close()
    before = db.read_bytes()
    image = intact.parent / "fs0.img"
    result = CliRunner().invoke(main, ["snapshot", str(image), "--db", str(db)])
    assert result.exit_code == 1
    assert result.stderr.startswith(f"fsage: error: {db}: the database is damaged")
    assert len(result.stderr.splitlines()) == 1
    assert db.read_bytes() == before


def test_checksums_come_with_migration_9(intact: Path, tmp_path: Path) -> None:
    """Rows written before migration 9 have none (and still read: see
    test_store.test_schema_5_databases_are_converted); every row written since has all."""
    from fsage.db.store import Store

    old = tmp_path / "v5.db"
    shutil.copyfile(Path(__file__).parent / "data" / "store_v5.db", old)
    with Store.open(old) as store:
        applied = store.con.execute("SELECT version FROM schema_migrations").fetchall()
        assert (9,) in applied  # and every later one
        assert store.con.execute(
            "SELECT COUNT(*), COUNT(keys_crc), COUNT(body_crc) FROM chunk_blobs"
        ).fetchone()[1:] == (0, 0)
        assert store.con.execute("SELECT COUNT(crc) FROM snapshots").fetchone() == (0,)
    con = sqlite3.connect(intact)
    try:
        for table, columns in (
            ("chunk_blobs", ("keys_crc", "body_crc", "body_column_crcs")),
            ("version_ends", ("rows_crc",)),
            ("snapshots", ("crc", "free_crc")),
        ):
            for column in columns:
                total, checked = con.execute(
                    f"SELECT COUNT(*), COUNT({column}) FROM {table}"
                ).fetchone()
                assert total > 0 and checked == total, (table, column)
    finally:
        con.close()


def test_a_damaged_database_is_not_migrated(tmp_path: Path) -> None:
    """A migration writes: an older database that fails the quick check is left as it is."""
    from fsage.db.store import Store
    from fsage.errors import StoreError

    db = tmp_path / "v5.db"
    shutil.copyfile(Path(__file__).parent / "data" / "store_v5.db", db)
    con = sqlite3.connect(db)
    page_size = con.execute("PRAGMA page_size").fetchone()[0]
    (root,) = con.execute(
        "SELECT rootpage FROM sqlite_master WHERE name = 'version_chunks_fs'"
    ).fetchone()
    con.close()
    raw = bytearray(db.read_bytes())
    raw[(root - 1) * page_size : root * page_size] = bytes(page_size)
    db.write_bytes(raw)
    assert _quick_check(db) != "ok"
    with pytest.raises(StoreError, match=r"the database is damaged .* nothing was written"):
        Store.open(db, readonly=True)
    assert db.read_bytes() == raw
