"""Damaged databases: every read command gives the right answer or one line and a non-zero
exit, never a traceback and never a different answer; nothing is written into one.

A small real database (two snapshots of one ext4 image and one of another, made with mke2fs
-d from a seeded tree) is damaged in seeded ways (zeroed pages, random bytes in chunk blobs
and in any page, truncation), and each command's output on the damaged copy is compared with
its output on the intact one.
"""

from __future__ import annotations

import hashlib
import itertools
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
    _records(tmp, db)
    return db


def _records(tmp: Path, db: Path) -> None:
    """A row or more in each table of records (migration 11), each made by its own writer:
    an aging run, a daemon's run and plan, a bench run and its results, a trace, a study."""
    from fsage.db.store import Store
    from fsage.replay.bench.run import BenchRun, store_run
    from fsage.replay.bench.suites import Result
    from fsage.study.store import create_study, save_result

    def run(*args: str) -> None:
        result = CliRunner().invoke(main, list(args))
        assert result.exit_code == 0, f"{args}: {result.output}{result.exception!r}"

    run("workload", "generate", "--profile", "hfs-surge", "--capacity", "4M", "--ops-limit",
        "20", "-o", str(tmp / "gen.jsonl"))  # fmt: skip
    (tmp / "aged").mkdir()
    run("age", str(tmp / "aged"), "--ops", str(tmp / "gen.jsonl"), "--db", str(db))
    config = tmp / "fsage.toml"
    config.write_text(
        f'database = "{db}"\n[[target]]\nname = "two"\nsource = "{tmp / "fs2.img"}"\n'
    )
    run("daemon", "--config", str(config), "--once")
    (tmp / "read.txt").write_text(
        "8,0 1 1 0.0 1 D R 2048 + 8 [cat]\n8,0 1 2 0.1 1 D R 96 + 16 [cat]\n"
    )
    run("trace", "import", str(tmp / "read.txt"), "--db", str(db), "--snapshot", "2")
    with Store.open(db) as store:
        # a bench run as the bench stores it (running one takes tens of seconds under load)
        results = [Result("read", 123.5, "MB/s", {"file_size": 65536}), Result("write", 7.25, "s")]
        store_run(store, BenchRun("seq", str(tmp), "directory", "one", "2026-01-02T03:04:05+00:00",
                                  1.5, True, {"size": 4096}, results, None, ["warm"]))  # fmt: skip
        study = create_study(store, tmp / "study", {"fs": ["ext4"], "steps": 1, "seed": 3})
        for step in (0, 1):
            save_result(store, study, step, "ext4", {
                "snapshot_id": 1 + step, "layout_score": 0.9 - step / 10, "blocks_free": 1000,
                "scan": {"aged_seconds": 1.5, "clean_seconds": 1.25, "ratio": 1.2},
            })  # fmt: skip


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
        "runs": ["runs", *d, "--format", "json"],
        "bench": ["bench", "results", *d, "--format", "json"],
        "traces": ["trace", "list", *d, "--format", "json"],
        "study": ["study", "report", "1", *d, "--format", "json"],
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


def _texts(row: tuple[object, ...]) -> list[bytes]:
    """The text values of a row and each two side by side (a record stores them so), as
    bytes, longest first."""
    texts = [v.encode() for v in row if isinstance(v, str)]
    texts += [a.encode() + b.encode() for a, b in itertools.pairwise(row)
              if isinstance(a, str) and isinstance(b, str)]  # fmt: skip
    return sorted(texts, key=len, reverse=True)


def _record_spans(db: Path) -> dict[str, list[tuple[int, int]]]:
    """{table: where the text values of its rows lie in the file}, for each table of records
    (migration 11); values of 8 bytes or more, found once."""
    from fsage.db.rowcheck import TABLES

    con = sqlite3.connect(db)
    raw = db.read_bytes()
    out: dict[str, list[tuple[int, int]]] = {}
    for t in TABLES:
        for row in con.execute(f"SELECT {', '.join(t.columns)} FROM {t.table}"):
            for data in _texts(row):
                if len(data) >= 8 and raw.count(data) == 1:
                    at = raw.find(data)
                    out.setdefault(t.table, []).append((at, min(len(data), PAGE - at % PAGE)))
    con.close()
    return out


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
    for table, table_spans in sorted(_record_spans(db).items()):
        for _ in range(2):
            start, length = rng.choice(table_spans)
            at = start + rng.randrange(length)
            data = rng.randbytes(rng.randint(1, 4))
            out.append((f"{len(data)} random bytes at {at} (a row of {table})", scribble(at, data)))
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
    assert len(_record_spans(intact)) == 8  # every table of records is damaged too
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
        f"{len(cases)} damaged databases, {refused} of {len(cases) * len(expected)} read runs"
        " refused;"
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
        if args[0] == "show" and result.exit_code == 0:
            # show reads a chunk a column at a time: a flip in a column it does not read
            # leaves its answer whole, and it must then be the intact database's answer
            same = CliRunner().invoke(main, [*args, "--db", str(intact)])
            assert same.exit_code == 0 and result.stdout == same.stdout
            continue
        assert result.exit_code == 1 and result.stdout == ""
        # show checks the columns it reads, analyze the whole chunk
        assert result.stderr.startswith(
            f"fsage: error: {db}: snapshot 3 cannot be read: the file versions recorded by"
            " snapshot 2 are damaged ("
        ), result.stderr
        assert result.stderr.endswith(" match its checksum)\n" if args[0] == "show" else
                                      " match their checksum)\n"), result.stderr  # fmt: skip
        assert len(result.stderr.splitlines()) == 1


def test_a_readers_fault_in_a_sound_database_is_not_called_damage(
    intact: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader that fails on rows whose checksums match (here made to) is one line that
    says so and asks for a report: told "damaged", a user could throw the database away."""
    from fsage.db import versions

    db = tmp_path / "x.db"
    shutil.copy(intact, db)

    def failing(*args: object, **kwargs: object) -> None:
        raise TypeError("a reader's fault")

    monkeypatch.setattr(versions, "valid_versions", failing)
    result = CliRunner().invoke(main, ["analyze", "--snapshot", "3", "--db", str(db)])
    assert result.exit_code == 1 and result.stdout == ""
    assert len(result.stderr.splitlines()) == 1, result.stderr
    start = f"fsage: error: {db}: snapshot 3 cannot be read: it matches its checksums"
    assert result.stderr.startswith(f"{start} but does not decode (TypeError("), result.stderr
    assert "a fault in fsage (please report it)" in result.stderr
    assert "is damaged" not in result.stderr


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


@pytest.mark.parametrize(
    ("table", "command", "named"),
    [
        ("aging_runs", ["runs"], "aging run 1"),
        ("collection_runs", ["status"], "collection run 1"),
        ("daemon_targets", ["status"], "the daemon's plan for target two"),
        ("bench_runs", ["bench", "results"], "bench run 1"),
        ("bench_results", ["bench", "results"], "a result of bench run 1 (read)"),
        ("traces", ["trace", "list"], "trace 1"),
        ("studies", ["study", "report", "1"], "study 1"),
        ("study_results", ["study", "report", "1"], "the result of study 1, step 0, ext4"),
    ],
)
def test_a_damaged_record_row_is_named(
    intact: Path, tmp_path: Path, table: str, command: list[str], named: str
) -> None:
    """One bit flipped in a text value of a row (an ASCII letter for another: SQLite's own
    checks cannot tell) makes the command that reads it fail in one line naming the row."""
    from fsage.db.rowcheck import TABLES

    t = next(t for t in TABLES if t.table == table)
    con = sqlite3.connect(intact)
    row = con.execute(f"SELECT {', '.join(t.columns)} FROM {table} ORDER BY rowid").fetchone()
    con.close()
    raw = bytearray(intact.read_bytes())
    text = next(x for x in _texts(row) if raw.count(x) == 1)  # the longest the file holds once
    at = raw.find(text) + len(text) // 2
    raw[at] ^= 0x01
    db = tmp_path / "x.db"
    db.write_bytes(raw)
    assert _quick_check(db) == "ok"
    result = CliRunner().invoke(main, [*command, "--db", str(db)])
    assert result.exit_code == 1, result.output
    assert result.stderr == f"fsage: error: {db}: {named} is damaged (its row does not match" \
        " its checksum)\n"  # fmt: skip
