"""Which files of a dataset directory hold which rows: the per-partition files `fsage export`
writes and the compacted files `fsage fleet compact` merges them into.

After a compaction, ``DIR/_compacted.json`` (the manifest) names the compacted files of every
table (``DIR/<table>/compacted/c<generation>.parquet``, then ``c<generation>_<k>.parquet`` where
a compaction's rows of a table fill more than one file) and, per file system, the newest
snapshot they cover (its watermark). The rows of a file system up to its watermark are read from
the compacted files only; its per-partition files add what is newer:

* small tables (one ``part.parquet`` per partition): the rows with ``snapshot_id`` above the
  watermark (a ``part.parquet`` collected again, for instance by rsync, still holds older rows);
  a ``part.parquet`` the compaction absorbed, of the same size, modification time and inode,
  is not opened at all;
* large tables (``s<first>-<last>.parquet`` per export run, and ``s<first>-<last>_<k>.parquet``
  after it where a run's rows fill more than one file): the files whose ``last`` is above the
  watermark (a compaction absorbs whole runs only).

Compacted files not named in the manifest (left by an interrupted compaction) are never read.
Without a manifest every per-partition file is read, as `fsage export` wrote it.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from fsage.errors import FsageError
from fsage.fleet import LARGE_TABLES, SCHEMA_VERSION, TABLES
from fsage.fleet.pieces import piece_name
from fsage.private import private_opener

MANIFEST = "_compacted.json"
SUMMARY_TABLE = "size_summary"  # derived by the compaction (fsage.fleet.query.SIZE_SUMMARY)
COMPACTED = "compacted"
_RUN = re.compile(r"^s(\d+)-(\d+)(?:_\d+)?\.parquet$")


@dataclass
class Manifest:
    """The committed state of the compacted files (an empty one when never compacted)."""

    generation: int = 0
    tables: dict[str, list[str]] = field(default_factory=dict)
    # (host, fs) -> (watermark snapshot id, UUID of the file system)
    covered: dict[tuple[str, str], tuple[int, str | None]] = field(default_factory=dict)
    # relative path of an absorbed part.parquet -> [size, mtime in whole seconds, inode]
    absorbed: dict[str, list[int]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "generation": self.generation,
            "tables": self.tables,
            "covered": [
                {"host": h, "fs": f, "last_snapshot": w, "uuid": u}
                for (h, f), (w, u) in sorted(self.covered.items())
            ],
            "absorbed": dict(sorted(self.absorbed.items())),
        }

    def watermark(self, host: str, fs: str) -> int | None:
        got = self.covered.get((host, fs))
        return got[0] if got else None


class ManifestError(FsageError):
    """The manifest is unreadable or of a newer schema."""


def load_manifest(root: Path) -> Manifest:
    path = root / MANIFEST
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return Manifest()
    except (OSError, ValueError) as exc:
        raise ManifestError(f"{path}: unreadable compaction manifest ({exc})") from None
    try:
        version = int(raw["schema_version"])
        if version > SCHEMA_VERSION:
            raise ManifestError(
                f"{path}: export schema version {version}, this fsage reads up to "
                f"{SCHEMA_VERSION} (upgrade fsage)"
            )
        return Manifest(
            generation=int(raw["generation"]),
            tables={str(k): [str(p) for p in v] for k, v in raw["tables"].items()},
            covered={
                (str(c["host"]), str(c["fs"])): (int(c["last_snapshot"]), c.get("uuid"))
                for c in raw["covered"]
            },
            absorbed={str(k): [int(x) for x in v] for k, v in raw["absorbed"].items()},
        )
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, ManifestError):
            raise
        raise ManifestError(f"{path}: malformed compaction manifest ({exc!r})") from None


def save_manifest(root: Path, manifest: Manifest) -> None:
    """Atomically (write, fsync, rename, fsync the directory)."""
    path = root / MANIFEST
    tmp = root / f".{MANIFEST}.{os.getpid()}.tmp"
    with open(tmp, "w", opener=private_opener) as fh:
        json.dump(manifest.to_json(), fh, indent=1)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(root)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def partition_of(path: Path) -> tuple[str, str]:
    """(host, fs) of a per-partition file ``<table>/host=H/fs=F/<name>``."""
    return unquote(path.parent.parent.name[5:]), unquote(path.parent.name[3:])


def run_file(first: int, last: int, k: int = 0) -> str:
    """The name of the ``k``-th file of the export run of snapshots ``first``..``last`` of a
    large table (``fsage.fleet.pieces``)."""
    return piece_name(f"s{first:010d}-{last:010d}.parquet", k)


def run_range(path: Path) -> tuple[int, int] | None:
    """(first, last) snapshot of a large table's export run file, None for another name."""
    m = _RUN.match(path.name)
    return (int(m.group(1)), int(m.group(2))) if m else None


def stamp(path: Path) -> list[int]:
    """What tells an absorbed ``part.parquet`` from a later one written at its path: size and
    mtime in whole seconds (what any copy keeps) are not enough, since an export that writes
    the same number of rows within the same second gives both again; the inode is new for
    every file written there while the absorbed one exists (an export replaces by rename,
    rsync too)."""
    st = path.stat()
    return [st.st_size, st.st_mtime_ns // 1_000_000_000, st.st_ino]


@dataclass
class TableFiles:
    """The files to read for one table, and whether ``fresh`` rows need the watermark filter
    (small tables with a manifest: rows at or below their file system's watermark are
    already in ``compacted``)."""

    compacted: list[Path]
    fresh: list[Path]
    filter_fresh: bool

    @property
    def all(self) -> list[Path]:
        return self.compacted + self.fresh


def partition_files(root: Path, table: str) -> list[Path]:
    return sorted((root / table).glob("host=*/fs=*/*.parquet"))


def table_files(root: Path, table: str, manifest: Manifest) -> TableFiles:
    compacted = [root / table / rel for rel in manifest.tables.get(table, [])]
    fresh: list[Path] = []
    for p in partition_files(root, table):
        if not manifest.covered:
            fresh.append(p)
            continue
        mark = manifest.watermark(*partition_of(p))
        if table in LARGE_TABLES:
            rng = run_range(p)
            if mark is not None and rng is not None and rng[1] <= mark:
                continue  # the whole run is compacted
        else:
            rel = str(p.relative_to(root))
            if mark is not None and manifest.absorbed.get(rel) == stamp(p):
                continue  # absorbed as it is
        fresh.append(p)
    filter_fresh = bool(manifest.covered) and table not in LARGE_TABLES
    return TableFiles(compacted, fresh, filter_fresh and bool(fresh))


def dataset_files(root: Path, manifest: Manifest | None = None) -> dict[str, TableFiles]:
    manifest = manifest if manifest is not None else load_manifest(root)
    return {t: table_files(root, t, manifest) for t in TABLES}


def cover_table(con: Any, name: str, cover: dict[tuple[str, str], tuple[int, str | None]]) -> None:
    """A temporary DuckDB table ``name`` (host, fs, mark): the watermarks, in one statement."""
    keys = sorted(cover)
    con.execute(
        f"CREATE TEMP TABLE {name} AS SELECT unnest(?::VARCHAR[]) AS host,"
        " unnest(?::VARCHAR[]) AS fs, unnest(?::BIGINT[]) AS mark",
        [[k[0] for k in keys], [k[1] for k in keys], [cover[k][0] for k in keys]],
    )


class DamagedFileError(FsageError):
    """A file of the dataset is not the Parquet file its place says it is."""


def not_a_file(path: Path) -> str | None:
    """Why ``path`` cannot hold a part of the dataset before its bytes are read: a directory,
    unreadable, not a regular file, or empty (None: it may)."""
    if path.is_dir():
        return "a directory, not a Parquet file"
    try:
        size = path.stat().st_size
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if not path.is_file():
        return "not a regular file"
    if size == 0:
        return "an empty file"
    return None


def file_damage(path: Path, table: str) -> str | None:
    """Why the file at ``path`` cannot be read as a part of ``table`` (None: it can): not a
    regular file, empty, not Parquet (truncated, garbage), or a column missing or of another
    type than `fsage export` writes. Reads the footer only; extra columns are allowed, and so
    are missing ones that later versions added (``ADDED_COLUMNS``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    why = not_a_file(path)
    if why is not None:
        return why
    try:
        got = pq.read_schema(path)
    except (pa.ArrowException, OSError, ValueError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return f"not a readable Parquet file ({first})"
    from fsage.fleet.export import ADDED_COLUMNS, schemas

    want = schemas().get(table)
    added = ADDED_COLUMNS.get(table, frozenset())
    for f in want or []:
        i = got.get_field_index(f.name)
        if i < 0:
            if f.name in added:
                continue
            return f"has no column {f.name!r}"
        if got.field(i).type != f.type:
            return f"column {f.name!r} is {got.field(i).type}, not {f.type}"
    return None


def drop_partitions(files: dict[str, TableFiles], parts: set[tuple[str, str]]) -> None:
    """Leave the per-partition files of these (host, fs) out of every table."""
    for tf in files.values():
        tf.fresh = [p for p in tf.fresh if partition_of(p) not in parts]
        if not tf.fresh:
            tf.filter_fresh = False


def remove_stale_temporaries(dirs: list[Path]) -> int:
    """Remove the hidden ``.NAME.PID.tmp`` files an interrupted writer left in ``dirs`` (the
    caller holds the lock that excludes every writer of them). The number removed."""
    removed = 0
    for d in dirs:
        try:
            names = list(d.iterdir())
        except OSError:
            continue
        for p in names:
            if p.name.startswith(".") and p.name.endswith(".tmp") and p.is_file():
                p.unlink(missing_ok=True)
                removed += 1
    return removed
