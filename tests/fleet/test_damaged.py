"""Damaged datasets: every command that reads one (fleet, fleet report, fleet compact, export)
says in one line which file it cannot read, or (fleet --damaged skip) leaves that file's file
system out with a warning naming the file; never a traceback, never a partial output. Leftovers
of killed writers are removed by the next run."""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pytest.importorskip("duckdb")

from fsage.db.store import Store  # noqa: E402
from fsage.fleet.dataset import partition_of  # noqa: E402
from fsage.fleet.export import ADDED_COLUMNS, export_parquet  # noqa: E402
from fsage.fleet.synth import synthetic_history  # noqa: E402

HOSTS = {"h1": ("a", "b"), "h2": ("c",)}
SNAPS = 3
KINDS = ("empty", "truncated", "garbage", "directory", "wrong type", "missing column", "extra")


def cli(*args: str | Path) -> Any:
    from click.testing import CliRunner

    from fsage.cli import main

    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A dataset of two hosts as exported, the same compacted, and for host h1 a database
    that holds one snapshot more per file system than the dataset (its export reads what is
    there)."""
    tmp = tmp_path_factory.mktemp("damaged")
    out = {"plain": tmp / "plain", "compacted": tmp / "compacted"}
    for host, names in HOSTS.items():
        db = tmp / f"{host}.db"
        with Store.open(db, create=True) as store:
            for i, name in enumerate(names):
                synthetic_history(store, name, files=120, snapshots=SNAPS, seed=10 * i + 1)
        export_parquet(db, out["plain"], host=host)
        if host == "h1":
            with Store.open(db) as store:
                for i, name in enumerate(names):
                    synthetic_history(store, name, files=120, snapshots=SNAPS + 1,
                                      seed=10 * i + 1, skip=SNAPS)  # fmt: skip
            out["db"] = db
    shutil.copytree(out["plain"], out["compacted"])
    assert cli("fleet", "compact", out["compacted"]).exit_code == 0
    return out


def damage(path: Path, kind: str, rnd: random.Random) -> Path:
    """Damage one file of the dataset; returns the path a command should name."""
    data = path.read_bytes()
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "truncated":
        path.write_bytes(data[: rnd.randrange(1, len(data))])
    elif kind == "garbage":
        path.write_bytes(rnd.randbytes(len(data)))
    elif kind == "directory":
        path.unlink()
        path.mkdir()
    elif kind in ("wrong type", "missing column"):
        t = pq.read_table(path)
        optional = set().union(*ADDED_COLUMNS.values())
        names = [n for n in t.column_names if n not in ("host", "fs")] or t.column_names
        if kind == "missing column":  # columns a later version added may be missing
            names = [n for n in names if n not in optional]
        col = rnd.choice(names)
        if kind == "missing column":
            t = t.drop_columns([col])
        else:
            i = t.column_names.index(col)
            t = t.set_column(i, col, pa.array([str(v) for v in t.column(col).to_pylist()]))
        pq.write_table(t, path)
    else:  # a directory named like a part of the table
        extra = path.with_name("x.parquet")
        extra.mkdir()
        return extra
    return path


def one_line(r: Any, named: Path) -> None:
    assert r.exit_code == 1, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("fsage: error: ") and str(named) in line, line


@pytest.mark.parametrize("seed", range(8))
def test_seeded_damage(made: dict[str, Path], tmp_path: Path, seed: int) -> None:
    rnd = random.Random(seed)
    layout = "compacted" if seed % 2 else "plain"
    ds = tmp_path / "ds"
    shutil.copytree(made[layout], ds)
    files = sorted(p for p in ds.rglob("*.parquet") if p.is_file())
    kind = KINDS[seed % len(KINDS)] if seed < len(KINDS) else rnd.choice(KINDS)
    victim = rnd.choice(files)
    named = damage(victim, kind, rnd)
    in_partition = "compacted" not in named.parts

    one_line(cli("fleet", ds), named)
    html = tmp_path / "fleet.html"
    one_line(cli("fleet", "report", ds, "-o", html), named)
    assert not html.exists()
    before = sorted(str(p.relative_to(ds)) for p in ds.rglob("*"))
    one_line(cli("fleet", "compact", ds), named)
    assert sorted(str(p.relative_to(ds)) for p in ds.rglob("*")) == before

    skipped = cli("fleet", ds, "--damaged", "skip", "--format", "json")
    if in_partition:
        assert skipped.exit_code == 0, skipped.output
        (warning,) = skipped.stderr.strip().splitlines()
        host, fs = partition_of(named)
        assert warning.startswith("fsage: warning: ") and str(named) in warning
        assert f"{host}/{fs} left out" in warning
        import json

        shown = {(r["host"], r["fs"]) for r in json.loads(skipped.stdout)["filesystems"]}
        every = {(h, f) for h, names in HOSTS.items() for f in names}
        assert shown == every - {(host, fs)}
    else:  # a compacted file holds every file system: refused whatever the option
        one_line(skipped, named)

    r = cli("export", "--db", made["db"], "--host", "h1", ds)
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    if r.exit_code:
        one_line(r, named)
    assert not [p for p in ds.rglob(".*.tmp")]


def test_leftovers_of_killed_writers_are_removed(made: dict[str, Path], tmp_path: Path) -> None:
    ds = tmp_path / "ds"
    shutil.copytree(made["compacted"], ds)
    mine = ds / "metrics" / "host=h1" / "fs=a" / ".part.parquet.4242.tmp"
    theirs = ds / "files" / "host=h2" / "fs=c" / ".s0000000001-0000000003.parquet.4243.tmp"
    spilled = ds / "files" / "compacted" / ".c000009.parquet.4244.tmp"
    manifest = ds / "._compacted.json.4245.tmp"
    for p in (mine, theirs, spilled, manifest):
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"half a file")
    (ds / ".compact-tmp-4246").mkdir()
    # an export of h1 removes what an export of h1 left, and nothing of another host's
    assert cli("export", "--db", made["db"], "--host", "h1", ds).exit_code == 0
    assert not mine.exists() and theirs.exists() and spilled.exists()
    # a compaction excludes every writer: it removes all of it
    r = cli("fleet", "compact", ds)
    assert r.exit_code == 0, r.output
    assert not [p for p in ds.rglob("*.tmp")] and not (ds / ".compact-tmp-4246").exists()


def test_files_from_before_added_columns_are_read(made: dict[str, Path], tmp_path: Path) -> None:
    """A metrics file written before the locality columns existed is not damaged: fleet reads
    it, with those columns null."""
    root = tmp_path / "old"
    shutil.copytree(made["plain"], root)
    metrics = sorted((root / "metrics").rglob("*.parquet"))
    assert metrics
    for p in metrics:
        t = pq.read_table(p)
        pq.write_table(t.drop_columns(sorted(ADDED_COLUMNS["metrics"] & set(t.column_names))), p)
    r = cli("fleet", root, "--format", "json")
    assert r.exit_code == 0, r.output
    r = cli("fleet", root, "--format", "json", "--damaged", "skip")
    assert r.exit_code == 0 and "damaged" not in r.stderr.lower(), r.stderr


def test_the_checked_column_types_are_those_the_export_writes(tmp_path: Path) -> None:
    """The types the check expects (fsage.fleet.damage.COLUMNS) are those DuckDB reads from a
    file written with the export's Arrow schema of each table."""
    import duckdb

    from fsage.fleet.damage import COLUMNS
    from fsage.fleet.export_schema import schemas

    con = duckdb.connect()
    for table, schema in schemas().items():
        p = tmp_path / f"{table}.parquet"
        pq.write_table(pa.table({f.name: pa.array([], f.type) for f in schema}, schema=schema), p)
        got = con.execute(f"DESCRIBE SELECT * FROM read_parquet('{p}')").fetchall()
        assert COLUMNS[table] == {r[0]: r[1] for r in got}, table
    assert set(COLUMNS) == set(schemas())


def test_a_damaged_footer_inside_sound_ends_is_one_line(
    made: dict[str, Path], tmp_path: Path
) -> None:
    """A file whose magic bytes and footer length are sound but whose footer is garbage (what
    a look at its ends cannot see) is named in one line, and --damaged skip leaves its file
    system out."""
    ds = tmp_path / "ds"
    shutil.copytree(made["plain"], ds)
    victim = ds / "size_buckets" / "host=h1" / "fs=b" / "part.parquet"
    data = bytearray(victim.read_bytes())
    footer = int.from_bytes(data[-8:-4], "little")
    data[-8 - footer : -8] = random.Random(5).randbytes(footer)
    victim.write_bytes(bytes(data))
    one_line(cli("fleet", ds), victim)
    one_line(cli("fleet", "compact", ds), victim)
    skipped = cli("fleet", ds, "--damaged", "skip", "--format", "json")
    assert skipped.exit_code == 0, skipped.output
    import json

    shown = {(r["host"], r["fs"]) for r in json.loads(skipped.stdout)["filesystems"]}
    assert shown == {("h1", "a"), ("h2", "c")}


def test_a_fleet_query_does_not_load_arrow(made: dict[str, Path], tmp_path: Path) -> None:
    """The damage check of `fsage fleet` and `fsage fleet report` reads the files with DuckDB:
    neither command imports pyarrow (nor numpy, for the tables), damaged file or not."""
    import subprocess
    import sys

    from tests.fleet.peaks import REPO, env

    probe = (
        "import sys\nfrom fsage.launch import run\n"
        "try:\n    run(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('pyarrow', 'numpy') if m in sys.modules), file=sys.stderr)"
    )
    ds = tmp_path / "ds"
    shutil.copytree(made["plain"], ds)
    runs = {
        "tables": ["fleet", str(ds), "--table", "trend", "--format", "csv"],
        "report": ["fleet", "report", str(ds), "-o", str(tmp_path / "r.html")],
    }
    for what, args in runs.items():
        done = subprocess.run([sys.executable, "-c", probe, *args], env=env(), cwd=REPO,
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert done.stdout if what == "tables" else (tmp_path / "r.html").exists()
        loaded = done.stderr.strip().splitlines()[-1]
        assert loaded == ("[]" if what == "tables" else "['numpy']"), (what, done.stderr)
    (ds / "metrics" / "host=h2" / "fs=c" / "part.parquet").write_bytes(b"PAR1 not parquet")
    done = subprocess.run([sys.executable, "-c", probe, *runs["tables"]], env=env(), cwd=REPO,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    first, loaded = done.stderr.strip().splitlines()
    assert first.startswith("fsage: error: ") and "not a readable Parquet file" in first
    assert loaded == "[]"
