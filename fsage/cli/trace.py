"""`fsage trace`: the block requests of a real read and their dynamic layout score."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from fsage.cli.common import db_option, echo_json, echo_table, format_option
from fsage.db.store import Store
from fsage.errors import UsageError

CONWAY = "Conway et al., 'File Systems Fated for Senescence? Nonsense, Says Science!', FAST'17"


@click.group("trace")
def trace() -> None:
    """Block traces of real reads and their dynamic layout score.

    The dynamic layout score (Conway et al., FAST'17, section 3) of a read is
    1 - (requests not starting where the previous one ended) / (blocks read): 1 for one
    sequential stream. `fsage analyze` models it from a snapshot; a trace measures it.

    \b
    Examples:
      fsage trace run /mnt/home --fs home -- grep -r zzzz /mnt/home
      blkparse -i sda1 > read.txt; fsage trace import read.txt --fs home
      fsage trace list --format csv
    """


def _device(value: str | None) -> tuple[int, int] | None:
    if value is None:
        return None
    try:
        a, b = value.split(",")
        return int(a), int(b)
    except ValueError:
        raise UsageError(
            f"--device takes MAJOR,MINOR as blkparse prints it, not {value!r}"
        ) from None


def _snapshot_options(f: Any) -> Any:
    f = click.option(
        "--snapshot",
        "snapshot_id",
        type=int,
        help="Store the trace with this snapshot (its block size and modeled score are used).",
    )(f)
    f = click.option(
        "--fs", "fs_name", help="Store the trace with the latest snapshot of this file system."
    )(f)
    return click.option(
        "--block-size",
        type=int,
        help="File-system block size in bytes (default: the snapshot's).",
    )(f)


def _print(row: Any, fmt: str, tool: str) -> None:
    if fmt == "json":
        echo_json(row.to_json())
        return
    modeled = "" if row.modeled_score is None else f"; modeled {row.modeled_score:.4f}"
    where = "" if row.snapshot_id is None else f" with snapshot {row.snapshot_id}"
    click.echo(
        f"trace {row.id}{where} ({tool}): dynamic layout score "
        f"{'-' if row.score is None else f'{row.score:.4f}'}{modeled}; "
        f"{row.discontiguous} of {row.requests} read requests seek, {row.blocks} blocks of "
        f"{row.block_size} B read"
        + (
            f" ({row.reread_blocks} more read again, left out: the page cache dropped them "
            "while the command ran)"
            if row.reread_blocks
            else ""
        )
    )


@trace.command("run")
@db_option
@click.argument("target", type=click.Path(path_type=Path))
@click.argument("command", nargs=-1, required=True)
@_snapshot_options
@click.option(
    "--warm", is_flag=True, help="Keep the page cache (default: drop it first, a cold read)."
)
@format_option("text", "json")
def trace_run(
    db: Path,
    target: Path,
    command: tuple[str, ...],
    snapshot_id: int | None,
    fs_name: str | None,
    block_size: int | None,
    warm: bool,
    fmt: str,
) -> None:
    """Run COMMAND with the block requests on TARGET's device traced (root).

    TARGET is a block device or a mounted directory. blktrace (Debian package `blktrace`) is
    used with debugfs at /sys/kernel/debug (mounted when it is not); where the kernel refuses
    blktrace's relay files, its blk tracer through tracefs records the same events. The page
    cache is dropped first unless --warm. Read requests as issued to the driver count.

    \b
    Examples:
      fsage trace run /mnt/home --fs home -- grep -r zzzz /mnt/home
      fsage trace run /dev/loop3 --block-size 4096 -- sh -c 'tar cf - -C /mnt/t . | cat >/dev/null'

    GNU tar writing straight to /dev/null reads no file data, so its trace measures almost
    nothing: pipe it through cat as above. fsage warns when a trace read far fewer blocks
    than the files under TARGET hold.
    """
    from fsage.trace import (
        block_size_of,
        file_bytes_under,
        mountpoint_of,
        parse_blkparse,
        record,
        resolve_device,
        save_trace,
        short_read_warning,
        snapshot_for,
    )

    dev = resolve_device(target)
    with Store.open(db) as store:
        sid = snapshot_for(store, snapshot_id, fs_name)
        bs = block_size_of(store, sid, block_size)
    rec = record(dev, command, cold=not warm)
    tr = parse_blkparse(
        rec.text.splitlines(),
        device=(dev.major, dev.minor),
        source=f"the trace of {dev.name}",
        device_sectors=dev.size_sectors,
    )
    result = tr.score(bs, dev.start_sector)
    # what the files hold is walked after the trace, so that the walk warms no cache it reads
    where = target if target.is_dir() else mountpoint_of(dev)
    warning = None
    if where is not None:
        read = (int(result["blocks"]) + int(result["reread_blocks"])) * bs
        warning = short_read_warning(read, file_bytes_under(where), where)
    with Store.open(db, create=True) as store:
        row = save_trace(
            store,
            result,
            snapshot_id=sid,
            source=rec.tool,
            device=tr.device,
            command=" ".join(command),
            params={"cold": not warm, "seconds": rec.seconds, "exit_code": rec.exit_code},
        )
    _print(row, fmt, rec.tool)
    if warning is not None:
        click.echo(f"fsage: warning: {warning}", err=True)
    if rec.exit_code != 0:
        click.echo(f"fsage: note: the command exited with {rec.exit_code}", err=True)


@trace.command("import")
@db_option
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True, path_type=Path))
@_snapshot_options
@click.option("--device", help="Only this device's events, MAJOR,MINOR as blkparse prints it.")
@click.option(
    "--offset-sectors",
    type=int,
    default=0,
    show_default=True,
    help="Start of the partition in 512-byte sectors when the trace was of the whole disk.",
)
@click.option(
    "--action",
    type=click.Choice(["D", "Q", "C"]),
    help="Which events count: D issued to the driver (default), Q queued, C completed.",
)
@format_option("text", "json")
def trace_import(
    db: Path,
    file: Path,
    snapshot_id: int | None,
    fs_name: str | None,
    block_size: int | None,
    device: str | None,
    offset_sectors: int,
    action: str | None,
    fmt: str,
) -> None:
    """Import a blkparse text FILE ('-' for stdin) and store its dynamic layout score.

    \b
    Examples:
      blktrace -d /dev/sdb1 -o - | blkparse -i - > read.txt   # while the read runs
      fsage trace import read.txt --fs home
      fsage trace import read.txt --block-size 4096 --format json
    """
    from fsage.trace import block_size_of, parse_blkparse, save_trace, snapshot_for

    if str(file) == "-":
        lines = sys.stdin.read().splitlines()
    else:
        try:
            lines = file.read_text(errors="replace").splitlines()
        except OSError as exc:
            raise UsageError(f"{file}: {exc.strerror}") from None
    tr = parse_blkparse(lines, device=_device(device), action=action, source=str(file))
    with Store.open(db, create=True) as store:
        sid = snapshot_for(store, snapshot_id, fs_name)
        bs = block_size_of(store, sid, block_size)
        result = tr.score(bs, offset_sectors)
        row = save_trace(
            store,
            result,
            snapshot_id=sid,
            source=f"import:{file.name}",
            device=tr.device,
            command=f"import {file}",
            params={"action": tr.action, "offset_sectors": offset_sectors},
        )
    _print(row, fmt, f"imported, action {tr.action}")


@trace.command("list")
@db_option
@click.option("--fs", "fs_name", help="Only traces of this file system's snapshots.")
@format_option("text", "json", "csv")
def trace_list(db: Path, fs_name: str | None, fmt: str) -> None:
    """List the stored traces with their dynamic layout scores, traced and modeled.

    \b
    Examples:
      fsage trace list
      fsage trace list --fs home --format csv
    """
    from fsage.errors import StoreError
    from fsage.trace import traces

    with Store.open(db) as store:
        rows = traces(store, fs_name=fs_name)
    if not rows and fs_name is not None:
        raise StoreError(f"no traces of {fs_name!r} in {db}")
    cols = [
        "id",
        "snapshot_id",
        "fs",
        "taken_at",
        "source",
        "command",
        "block_size",
        "requests",
        "discontiguous",
        "blocks",
        "score",
        "modeled_score",
    ]
    if fmt == "json":
        echo_json([r.to_json() for r in rows])
    elif fmt == "csv":
        import csv

        w = csv.writer(sys.stdout)
        w.writerow(cols)
        for r in rows:
            w.writerow([getattr(r, c) for c in cols])
    else:
        echo_table(
            [
                "id",
                "snapshot",
                "fs",
                "taken at",
                "command",
                "requests",
                "seeks",
                "blocks",
                "traced score",
                "modeled score",
            ],
            [
                [
                    r.id,
                    r.snapshot_id,
                    r.fs,
                    r.taken_at[:19],
                    r.command[:40],
                    r.requests,
                    r.discontiguous,
                    r.blocks,
                    r.score,
                    r.modeled_score,
                ]
                for r in rows
            ],
        )
        click.echo(f"(dynamic layout score: {CONWAY}, section 3)")


COMMANDS = [trace]
