"""What an export directory already holds for a host's file system (its newest exported
snapshot, the file versions still open), and new files written under temporary names."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np
import numpy.typing as npt

from fsage.fleet.dataset import file_damage, load_manifest, run_range
from fsage.fleet.export_schema import ExportError, partition_dir
from fsage.private import private_file, private_mkdir, private_opener

I64 = npt.NDArray[np.int64]


def read_table(pq: Any, path: Path, table: str, **kw: Any) -> Any:
    """One file of the dataset, read; a damaged one is one line naming it."""
    import pyarrow as pa

    why = file_damage(path, table)
    if why is None:
        try:
            return pq.read_table(path, **kw)
        except (pa.ArrowException, OSError, ValueError) as exc:
            why = f"cannot be read ({str(exc).splitlines()[0] if str(exc) else exc!r})"
    raise ExportError(
        f"{path}: {why} (move it away and export again: the next run rewrites what it held)"
    )


@contextmanager
def export_lock(root: Path, host: str) -> Iterator[None]:
    lock = root / f".export-{quote(host, safe='')}.lock"
    with open(lock, "a", opener=private_opener) as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ExportError(f"another export of host {host} into {root} is running") from None
        yield


class PendingFiles:
    """Collects files under temporary names; ``commit`` renames them into place."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.pending: list[tuple[Path, Path]] = []

    def path(self, final: Path) -> Path:
        private_mkdir(final.parent, parents=True, exist_ok=True)
        tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
        self.pending.append((tmp, final))
        return private_file(tmp)

    def commit(self) -> None:
        # The snapshots table marks what is exported: it goes last.
        order = sorted(self.pending, key=lambda p: p[1].parts[-4] == "snapshots")
        for tmp, final in order:
            tmp.replace(final)
        self.pending.clear()

    def abort(self) -> None:
        for tmp, _ in self.pending:
            tmp.unlink(missing_ok=True)
        self.pending.clear()


def exported_upto(pq: Any, out: Path, host: str, fs: str) -> tuple[int | None, str | None]:
    """Newest exported snapshot id of a file system and its UUID (None, None if none), in the
    compacted files (their watermark) or its own partition."""
    covered = load_manifest(out).covered.get((host, fs))
    done, uuid = covered if covered else (None, None)
    part = partition_dir(out, "snapshots", host, fs) / "part.parquet"
    if not part.exists():
        return done, uuid
    t = read_table(pq, part, "snapshots", columns=["snapshot_id", "uuid"])
    if t.num_rows == 0:
        return done, uuid
    ids = t.column("snapshot_id").to_numpy()
    last = int(np.argmax(ids))
    if done is not None and done >= int(ids[last]):
        return done, uuid
    return int(ids[last]), str(t.column("uuid")[last].as_py())


def _partition_rows(pq: Any, out: Path, table: str, host: str, fs: str, columns: list[str]) -> Any:
    """The rows of one file system in a large table: its part of the compacted files and its
    export runs newer than their watermark (None if there are none)."""
    import pyarrow as pa

    manifest = load_manifest(out)
    mark = manifest.watermark(host, fs)
    tables = []
    if mark is not None:
        for rel in manifest.tables.get(table, []):
            tables.append(
                read_table(
                    pq,
                    out / table / rel,
                    table,
                    columns=columns,
                    filters=[("host", "=", host), ("fs", "=", fs)],
                )
            )
    pdir = partition_dir(out, table, host, fs)
    for p in sorted(pdir.glob("s*.parquet")) if pdir.exists() else []:
        rng = run_range(p)
        if mark is not None and rng is not None and rng[1] <= mark:
            continue
        tables.append(read_table(pq, p, table, columns=columns))
    return pa.concat_tables(tables) if tables else None


def open_versions(pq: Any, out: Path, host: str, fs: str) -> dict[str, I64]:
    """Keys of the versions valid in the newest exported snapshot, in ino order."""
    empty = np.zeros(0, np.int64)
    cols = ["ino", "generation", "digest", "first_snapshot"]
    t = _partition_rows(pq, out, "files", host, fs, cols)
    if t is None or t.num_rows == 0:
        return {"ino": empty, "generation": empty, "digest": empty, "first": empty}
    ino = t.column("ino").to_numpy().astype(np.int64)
    first = t.column("first_snapshot").to_numpy().astype(np.int64)
    alive = np.ones(ino.size, bool)
    e = _partition_rows(pq, out, "file_ends", host, fs, ["ino", "first_snapshot"])
    if e is not None and e.num_rows:
        ended = set(
            zip(
                e.column("ino").to_numpy().tolist(),
                e.column("first_snapshot").to_numpy().tolist(),
                strict=True,
            )
        )
        alive = np.fromiter(
            ((i, f) not in ended for i, f in zip(ino.tolist(), first.tolist(), strict=True)),
            bool,
            ino.size,
        )
    idx = np.flatnonzero(alive)
    order = idx[np.argsort(ino[idx], kind="stable")]
    return {
        "ino": ino[order],
        "generation": t.column("generation").to_numpy().astype(np.int64)[order],
        "digest": t.column("digest").to_numpy().astype(np.int64)[order],
        "first": first[order],
    }


def last_valid(prev_id: int, snap_id: int, out: Path, host: str, fs: str, pq: Any) -> int:
    """The exported snapshot before ``snap_id`` (in this run or an earlier one)."""
    if prev_id >= 0:
        return prev_id
    done, _ = exported_upto(pq, out, host, fs)
    return done if done is not None else snap_id - 1
