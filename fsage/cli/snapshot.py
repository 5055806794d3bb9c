"""`fsage snapshot`, `fsage snapshots`, `fsage show`: record layouts and look at them."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import click

from fsage.cli.common import (
    count_progress,
    db_option,
    echo_csv,
    echo_json,
    echo_table,
    format_option,
)
from fsage.db.store import Store, parse_taken_at
from fsage.errors import StoreError
from fsage.snapshotter.livewalk import background_walk_started


@click.command()
@click.argument("source", type=click.Path(path_type=Path, readable=False))
@db_option
@click.option(
    "--name",
    help="Name of the file system in the database (default: the name it already has there,"
    " else its label, else fs-<uuid>; fsage age names it the same way). A directory below"
    " a mount point is a history of its own, by default named after the file system and its"
    " path: home:/alice/src.",
)
@click.option("--label", help="A note stored with this snapshot.")
@click.option(
    "--freeze",
    is_flag=True,
    help="An ext source mounted read-write: freeze it (FIFREEZE) for an offline read instead"
    " of reading it through its mount point; writers wait until it is thawed.",
)
@click.option(
    "--taken-at",
    help="When the layout was taken (ISO 8601; naive means UTC), for histories collected "
    "elsewhere or backfilled; default: now. Snapshots of a file system go in time order.",
)
@format_option("text", "json")
def snapshot(
    source: Path,
    db: Path,
    name: str | None,
    label: str | None,
    freeze: bool,
    taken_at: str | None,
    fmt: str,
) -> None:
    """Record the layout of SOURCE (an ext2/3/4 image or device, an LFS image) in the database.

    Only files whose layout or metadata changed since the previous snapshot are stored again.
    Prints one summary line; on a terminal, stderr shows the inodes read so far, of those in
    use (for a directory below a mount point, of those its last snapshot read, if any), and an
    ETA while it reads. An ext source mounted read-write is read through its mount
    point (a line on stderr says so) and recorded as the device.

    SOURCE may also be a directory of a mounted file system, read through the mount (FIEMAP).
    The mount point of an ext file system whose device this process can read is recorded as
    the device is (what only the inode table holds comes from there), under the same name.
    A directory below the mount point is recorded as a file system of its own, with the same
    default name each time: the file system's name in the database (else its label, else
    fs-<uuid>), a colon and the directory's path from the file system's root
    (home:/alice/src below), unless --name says otherwise.

    \b
    Examples:
      fsage snapshot /dev/sdb1 --name home
      fsage snapshot /home                       # /dev/sdb1 mounted on /home: "home"
      fsage snapshot /home/alice/src             # "home:/alice/src", night after night
      fsage snapshot disk.img --db /var/lib/fsage/fsage.db
      fsage snapshot /dev/sdb1 --freeze
      fsage snapshot v1.img --name src --taken-at 2024-03-01T02:30:00Z
    """
    from fsage.imagelock import image_lock
    from fsage.snapshotter import read_source  # not on `fsage show`'s path

    when = parse_taken_at(taken_at) if taken_at else None
    # The read began with the walk `fsage snapshot DIR` started before this command was
    # imported, if it did: the seconds reported count it.
    started = background_walk_started(source) or time.monotonic()
    # The database is opened first, so that making a new one's schema overlaps the walk that
    # `fsage snapshot DIR` has already started; a database that cannot be used is reported
    # after the read, whose errors come first.
    store: Store | StoreError
    try:
        store = Store.open(db, create=True)
    except StoreError as exc:
        store = exc
    try:
        with count_progress("reading inodes") as progress:
            with image_lock(source, exclusive=False):
                layout = read_source(
                    source,
                    freeze=freeze,
                    notice=lambda line: click.echo(f"fsage: {line}", err=True),
                    progress=progress,
                    expected=_last_count(store, source) if progress is not None else None,
                )
            if progress is not None:  # the count it ended on
                read = len(layout.files) + len(layout.special)
                progress(read, read)
        if isinstance(store, StoreError):
            raise store
        summary = store.add_snapshot(
            layout, name=name, source=str(source), label=label, started=started, taken_at=when
        )
    except BaseException:
        if isinstance(store, Store):
            store.abandon()
        raise
    try:
        from fsage.db.readers import reader_notice  # after the counts, where they mislead

        notice = reader_notice(store, summary.snapshot_id, layout)
    except StoreError:  # the snapshot is recorded; an earlier one that cannot be read
        notice = None
    finally:
        store.close()
    if fmt == "json":
        echo_json(summary.to_json())
    else:
        click.echo(summary.line())
    if notice:
        click.echo(f"fsage: {notice}", err=True)


def _last_count(store: Store | StoreError, source: Path) -> int | None:
    """The inodes the last snapshot of the directory ``source`` read: the progress line's
    total for a directory below a mount point, of which statvfs knows nothing."""
    if isinstance(store, StoreError) or not source.is_dir():
        return None
    real = os.path.realpath(source)
    for snap in reversed(store.snapshots()):
        if snap.source == str(source) or os.path.realpath(snap.source) == real:
            return snap.files
    return None


@click.command()
@db_option
@click.option("--fs", "fs_name", help="Only snapshots of this file system.")
@format_option("text", "json", "csv")
def snapshots(db: Path, fs_name: str | None, fmt: str) -> None:
    """List the snapshots in the database.

    \b
    Examples:
      fsage snapshots
      fsage snapshots --fs home --format json
    """
    with Store.open(db, readonly=True) as store:
        rows = store.snapshots(fs_name)
    if fmt == "json":
        echo_json([r.to_json() for r in rows])
        return
    headers = [
        "id",
        "fs",
        "taken at (UTC)",
        "kind",
        "files",
        "inodes",
        "block size (B)",
        "used blocks",
        "free blocks",
        "new",
        "changed",
        "deleted",
    ]
    table = [
        [
            r.id,
            r.fs_name,
            r.taken_at.strftime("%Y-%m-%d %H:%M:%S"),
            r.kind,
            r.regular_files,
            r.files,
            r.block_size,
            r.blocks_used,
            r.blocks_free,
            r.new_files,
            r.changed_files,
            r.deleted_files,
        ]
        for r in rows
    ]
    if fmt == "csv":
        echo_csv([h.split(" (")[0].replace(" ", "_") for h in headers], table)
        return
    echo_table(headers, table)
    click.echo("(files: regular files; inodes: every user inode, directories included)")


@click.command()
@click.argument("snapshot_id", type=int)
@db_option
@click.option("--path", "prefix", help="Only this file, or the files below this directory.")
@format_option("text", "json", "csv")
def show(snapshot_id: int, db: Path, prefix: str | None, fmt: str) -> None:
    """Show the files of a snapshot with their extents (in file-system blocks).

    \b
    Examples:
      fsage show 3
      fsage show 3 --path /home/alice --format json
    """
    from fsage.listing import show_files  # not on `fsage snapshot`'s path

    with Store.open(db, readonly=True) as store:
        show_files(store, snapshot_id, prefix, fmt, sys.stdout.write)


COMMANDS = [snapshot, snapshots, show]
