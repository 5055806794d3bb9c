"""The database schema as recorded, numbered migrations.

A database records every migration it has applied in ``schema_migrations``; opening it applies
the ones it lacks, in order, each in its own transaction. Never edit a released migration:
add a new one.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from datetime import UTC, datetime

from fsage.db import rowcheck
from fsage.errors import StoreError


def _version_chunks(con: sqlite3.Connection) -> None:
    from fsage.db.legacy import convert_file_versions  # only this migration needs it

    convert_file_versions(con)
    con.execute("DROP TABLE file_versions")


def _chunk_blobs(con: sqlite3.Connection) -> None:
    from fsage.db.legacy import convert_v5_chunks

    convert_v5_chunks(con)


# (version, name, SQL, then an optional Python step in the same transaction)
MIGRATIONS: list[tuple[int, str, str, Callable[[sqlite3.Connection], None] | None]] = [
    (
        1,
        "file systems, snapshots and file versions",
        """
        CREATE TABLE filesystems (
            id INTEGER PRIMARY KEY,
            name TEXT NOT NULL UNIQUE,
            uuid TEXT NOT NULL,
            kind TEXT NOT NULL,
            created_at TEXT NOT NULL
        );
        CREATE INDEX filesystems_uuid ON filesystems(uuid);

        CREATE TABLE snapshots (
            id INTEGER PRIMARY KEY,
            fs_id INTEGER NOT NULL REFERENCES filesystems(id),
            taken_at TEXT NOT NULL,          -- ISO 8601, UTC
            source TEXT NOT NULL,
            kind TEXT NOT NULL,
            facts TEXT NOT NULL,             -- FsFacts as JSON
            files INTEGER NOT NULL,
            dirs INTEGER NOT NULL,
            extents INTEGER NOT NULL,
            blocks_used INTEGER NOT NULL,
            blocks_free INTEGER NOT NULL,
            free_extents INTEGER NOT NULL,
            damaged INTEGER NOT NULL,
            new_files INTEGER NOT NULL,
            changed_files INTEGER NOT NULL,
            deleted_files INTEGER NOT NULL,
            seconds REAL NOT NULL,
            free_map BLOB NOT NULL,          -- zlib of u64 (start, length) pairs
            notes TEXT NOT NULL DEFAULT '[]',
            op_count INTEGER,                -- ops applied when taken while aging
            bytes_written INTEGER,
            label TEXT,
            recreation_of INTEGER REFERENCES snapshots(id)
        );
        CREATE INDEX snapshots_fs ON snapshots(fs_id, id);

        -- One row per version of a file; valid from first_snap to last_snap inclusive
        -- (NULL: still valid in the newest snapshot of its file system).
        CREATE TABLE file_versions (
            id INTEGER PRIMARY KEY,
            fs_id INTEGER NOT NULL REFERENCES filesystems(id),
            ino INTEGER NOT NULL,
            first_snap INTEGER NOT NULL,
            last_snap INTEGER,
            digest INTEGER NOT NULL,
            generation INTEGER NOT NULL,
            inode BLOB NOT NULL,        -- fsage.db.legacy.INODE_DTYPE: the inode's fields
            extents BLOB NOT NULL,      -- u64 (logical, physical, length, flags) rows
            meta BLOB NOT NULL,         -- u64 (physical, kind) rows
            link_parents BLOB NOT NULL, -- u64 directory inode of each name
            link_names BLOB NOT NULL    -- the names, each followed by a NUL
        );
        CREATE INDEX file_versions_live ON file_versions(fs_id, last_snap);
        """,
        None,
    ),
    (
        2,
        "aging runs with their LFS cleaning metrics",
        """
        -- One row per `fsage age` run recorded in a database, written when the run starts
        -- (status 'running') and completed when it ends ('finished', 'interrupted' by Ctrl-C,
        -- or 'failed' with the error in notes). kind: 'dir', 'mounted-<fs>', 'offline-ext' or
        -- 'lfs'. params: JSON (workload identity, seed, mode, resumed_from...). ops and
        -- bytes_written count this run's ops (a resumed run starts at params.resumed_from).
        -- metrics: JSON (for LFS: write cost, cleaner overhead, transfer inefficiency,
        -- overall write cost, the cleaner's counters, the disk model and the policy);
        -- utilization: JSON (fullness; for LFS live/data blocks and the histogram of segment
        -- utilization at the end of the run).
        CREATE TABLE aging_runs (
            id INTEGER PRIMARY KEY,
            fs_id INTEGER REFERENCES filesystems(id),
            target TEXT NOT NULL,
            kind TEXT NOT NULL,
            started_at TEXT NOT NULL,
            finished_at TEXT,
            status TEXT NOT NULL DEFAULT 'running'
                CHECK (status IN ('running', 'finished', 'interrupted', 'failed')),
            params TEXT NOT NULL DEFAULT '{}',
            ops INTEGER NOT NULL DEFAULT 0,
            bytes_written INTEGER NOT NULL DEFAULT 0,
            first_snap INTEGER REFERENCES snapshots(id),
            last_snap INTEGER REFERENCES snapshots(id),
            metrics TEXT NOT NULL DEFAULT '{}',
            utilization TEXT NOT NULL DEFAULT '{}',
            notes TEXT NOT NULL DEFAULT '[]'
        );
        CREATE INDEX aging_runs_fs ON aging_runs(fs_id, id);
        """,
        None,
    ),
    (
        3,
        "collection runs of the snapshot daemon",
        """
        -- One row per attempt to snapshot a daemon target, successful or not. snapshot_id is
        -- the snapshot the run recorded (NULL once retention deleted it; the run stays on
        -- record). pruned: JSON list of the snapshot ids retention deleted after this run.
        -- trigger: 'schedule' (the long-running daemon) or 'once' (fsage daemon --once).
        CREATE TABLE collection_runs (
            id INTEGER PRIMARY KEY,
            target TEXT NOT NULL,
            source TEXT NOT NULL,
            started_at TEXT NOT NULL,        -- ISO 8601, UTC
            finished_at TEXT NOT NULL,
            status TEXT NOT NULL CHECK (status IN ('ok', 'failed', 'interrupted')),
            error TEXT,
            snapshot_id INTEGER REFERENCES snapshots(id),
            seconds REAL NOT NULL,
            pruned TEXT NOT NULL DEFAULT '[]',
            trigger TEXT NOT NULL DEFAULT 'schedule',
            pid INTEGER
        );
        CREATE INDEX collection_runs_target ON collection_runs(target, id);

        -- What the daemon plans for each target: written at start and after every run, read by
        -- `fsage status --db` (the next run time without the configuration file).
        CREATE TABLE daemon_targets (
            target TEXT PRIMARY KEY,
            source TEXT NOT NULL,
            schedule TEXT NOT NULL,
            next_run TEXT,                   -- ISO 8601, UTC; NULL after a --once run
            updated_at TEXT NOT NULL,
            pid INTEGER
        );
        """,
        None,
    ),
    (
        4,
        "benchmark runs and their results",
        """
        -- One row per `fsage bench` run; layout scores of the benchmark's own files and of the
        -- files already on the target (seed 002's table). params: JSON of the suite's settings;
        -- layout: JSON detail (files, blocks and scores of both sets, by size bucket); notes:
        -- JSON list of what the run could not do (warm cache without root...).
        CREATE TABLE bench_runs (
            id INTEGER PRIMARY KEY,
            suite TEXT NOT NULL,
            target TEXT NOT NULL,
            fs_name TEXT,
            fs_id INTEGER REFERENCES filesystems(id),
            snapshot_id INTEGER REFERENCES snapshots(id),
            started_at TEXT NOT NULL,
            finished_at TEXT,
            seconds REAL,
            params TEXT NOT NULL DEFAULT '{}',
            cold INTEGER NOT NULL,
            layout_score_bench_files REAL,
            layout_score_old_files REAL,
            layout TEXT NOT NULL DEFAULT '{}',
            notes TEXT NOT NULL DEFAULT '[]'
        );
        CREATE INDEX bench_runs_suite ON bench_runs(suite, id);
        -- One row per measured value; params: what this value is of (file size, phase...);
        -- the layout scores of the files this value measured, where they are a subset.
        CREATE TABLE bench_results (
            run_id INTEGER NOT NULL REFERENCES bench_runs(id),
            metric TEXT NOT NULL,
            value REAL NOT NULL,
            unit TEXT NOT NULL,
            params TEXT NOT NULL DEFAULT '{}',
            layout_score_bench_files REAL,
            layout_score_old_files REAL
        );
        CREATE INDEX bench_results_run ON bench_results(run_id);
        """,
        None,
    ),
    (
        5,
        "file versions stored in column chunks",
        """
        -- The versions one snapshot recorded, column by column (fsage.db.legacy.V5_BLOBS);
        -- replaces file_versions' one row per version. See fsage.db.versions.
        CREATE TABLE version_chunks (
            id INTEGER PRIMARY KEY,
            fs_id INTEGER NOT NULL REFERENCES filesystems(id),
            first_snap INTEGER NOT NULL,    -- the snapshot that recorded them
            n INTEGER NOT NULL,             -- versions in the chunk
            live INTEGER NOT NULL,          -- of which not ended yet
            dead_after INTEGER,             -- once live = 0: the last snapshot seeing any
            keys BLOB NOT NULL,
            inodes BLOB NOT NULL,
            ext_counts BLOB NOT NULL,
            extents BLOB NOT NULL,
            meta_counts BLOB NOT NULL,
            meta BLOB NOT NULL,
            link_rows BLOB NOT NULL,
            link_parents BLOB NOT NULL,
            name_lens BLOB NOT NULL,
            names BLOB NOT NULL
        );
        CREATE INDEX version_chunks_fs ON version_chunks(fs_id, first_snap);

        -- Versions (u32 rows of a chunk) last valid in snapshot last_snap.
        CREATE TABLE version_ends (
            chunk_id INTEGER NOT NULL REFERENCES version_chunks(id),
            fs_id INTEGER NOT NULL REFERENCES filesystems(id),
            last_snap INTEGER NOT NULL,
            rows BLOB NOT NULL
        );
        CREATE INDEX version_ends_chunk ON version_ends(chunk_id);
        CREATE INDEX version_ends_fs ON version_ends(fs_id, last_snap);

        -- Small counters: 'last_snapshot_id' keeps ids from being reused after deletions.
        CREATE TABLE store_meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
        INSERT INTO store_meta(key, value) SELECT 'last_snapshot_id', COALESCE(MAX(id), 0)
            FROM snapshots;
        """,
        _version_chunks,
    ),
    (
        6,
        "version chunk blobs narrowed and kept apart from the chunk counters",
        """
        -- The versions of a chunk, column by column, each column narrowed to the bytes its
        -- values need (fsage.db.codec). Apart from version_chunks, whose counters change as
        -- versions end: SQLite rewrites a whole row to change one field of it.
        CREATE TABLE chunk_blobs (
            chunk_id INTEGER PRIMARY KEY REFERENCES version_chunks(id),
            keys BLOB NOT NULL,             -- codec.KEY_COLUMNS
            body BLOB NOT NULL              -- codec.BODY_COLUMNS
        );
        """,
        _chunk_blobs,
    ),
    (
        7,
        "block traces and their dynamic layout score",
        """
        -- A trace of the block requests a command made (blktrace / blkparse), with Conway et
        -- al.'s dynamic layout score of it and the modeled score of its snapshot beside it.
        CREATE TABLE traces (
            id INTEGER PRIMARY KEY,
            snapshot_id INTEGER REFERENCES snapshots(id),
            taken_at TEXT NOT NULL,          -- ISO 8601, UTC
            source TEXT NOT NULL,            -- blktrace, blk tracer, or the imported file
            device TEXT,                     -- major,minor
            command TEXT NOT NULL,
            block_size INTEGER NOT NULL,
            requests INTEGER NOT NULL,
            discontiguous INTEGER NOT NULL,
            blocks INTEGER NOT NULL,
            score REAL,
            modeled_score REAL,
            params TEXT NOT NULL DEFAULT '{}'
        );
        CREATE INDEX traces_snapshot ON traces(snapshot_id);
        """,
        None,
    ),
    (
        8,
        "regular files per snapshot",
        """
        -- "files" are regular files everywhere in fsage's output; snapshots.files counts every
        -- user inode. NULL for snapshots recorded before this migration.
        ALTER TABLE snapshots ADD COLUMN regular_files INTEGER;
        """,
        None,
    ),
    (
        9,
        "checksums of chunk blobs, ended versions and snapshot rows",
        """
        -- CRC-32 of what fsage stores, verified on read (fsage.db.checksum): SQLite checks its
        -- pages' structure, not the bytes of the values in them. NULL in rows written before
        -- this migration, which are read unchecked.
        ALTER TABLE chunk_blobs ADD COLUMN keys_crc INTEGER;
        ALTER TABLE chunk_blobs ADD COLUMN body_crc INTEGER;
        -- u32 CRC-32 of each column of body: a listing that reads a few columns checks those
        ALTER TABLE chunk_blobs ADD COLUMN body_column_crcs BLOB;
        ALTER TABLE version_ends ADD COLUMN rows_crc INTEGER;
        -- crc: the row's values and its file system's (checksum.SNAPSHOT_COLUMNS, FS_COLUMNS);
        -- free_crc: its free map.
        ALTER TABLE snapshots ADD COLUMN crc INTEGER;
        ALTER TABLE snapshots ADD COLUMN free_crc INTEGER;
        """,
        None,
    ),
    (
        10,
        "aging studies",
        """
        -- fsage study: one row per study, one per (study, step, file system) measured.
        CREATE TABLE studies (
            id INTEGER PRIMARY KEY,
            created_at TEXT NOT NULL,        -- ISO 8601, UTC
            out_dir TEXT NOT NULL,
            params TEXT NOT NULL,            -- JSON: file systems, workload, size, steps, seed
            finished_at TEXT
        );
        CREATE TABLE study_results (
            id INTEGER PRIMARY KEY,
            study_id INTEGER NOT NULL REFERENCES studies(id),
            step INTEGER NOT NULL,
            fs TEXT NOT NULL,
            snapshot_id INTEGER REFERENCES snapshots(id),
            layout_score REAL,
            dynamic_score REAL,              -- of the aged scan's block trace
            aged_seconds REAL,
            clean_seconds REAL,
            aged_clean_ratio REAL,
            blocks_free INTEGER,
            metrics TEXT NOT NULL,           -- JSON: everything measured in the step
            UNIQUE (study_id, step, fs)
        );
        """,
        None,
    ),
    (
        11,
        "checksums of the rows of runs, plans, bench results, traces and studies",
        # A crc column per table and the triggers that keep it (fsage.db.rowcheck).
        rowcheck.migration_sql(),
        rowcheck.seal_existing,
    ),
]


LATEST_VERSION = MIGRATIONS[-1][0]


def current_version(con: sqlite3.Connection) -> int:
    exists = con.execute(
        "SELECT 1 FROM sqlite_master WHERE type='table' AND name='schema_migrations'"
    ).fetchone()
    if not exists:
        return 0
    row = con.execute("SELECT MAX(version) FROM schema_migrations").fetchone()
    return int(row[0] or 0)


def migrate(con: sqlite3.Connection) -> list[int]:
    """Apply the migrations this database lacks; returns the versions applied."""
    applied: list[int] = []
    while (have := current_version(con)) < LATEST_VERSION:
        con.execute("BEGIN IMMEDIATE")
        try:
            # Read again under the write lock: another process may have just migrated (two
            # commands that found no database and made it at once).
            have = current_version(con)
            pending = [m for m in MIGRATIONS if m[0] > have]
            # A new database takes them all in one transaction (there is nothing to convert,
            # and one commit is cheaper than one per migration); an existing one, each in its
            # own.
            batch = pending if have == 0 else pending[:1]
            con.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations ("
                "version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)"
            )
            for version, name, sql, step in batch:
                for statement in _statements(sql):
                    con.execute(statement)
                if step is not None:
                    step(con)
                con.execute(
                    "INSERT INTO schema_migrations(version, name, applied_at) VALUES (?, ?, ?)",
                    (version, name, datetime.now(UTC).isoformat(timespec="seconds")),
                )
        except BaseException:
            con.execute("ROLLBACK")
            raise
        con.execute("COMMIT")
        applied.extend(m[0] for m in batch)
    if have > LATEST_VERSION:
        raise StoreError(
            f"database schema version {have} is newer than this fsage knows ({LATEST_VERSION});"
            " upgrade fsage"
        )
    return applied


def _statements(sql: str) -> list[str]:
    """Split a migration into statements (executescript would commit on its own)."""
    out = []
    buf = ""
    for line in sql.splitlines(keepends=True):
        buf += line
        if sqlite3.complete_statement(buf):
            if buf.strip():
                out.append(buf.strip())
            buf = ""
    if buf.strip():
        out.append(buf.strip())
    return out
