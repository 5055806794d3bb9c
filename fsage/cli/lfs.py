"""`fsage lfs`: make, check and describe log-structured file system images (seed 003)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from fsage.cli.common import echo_json, echo_table, format_option
from fsage.errors import UsageError
from fsage.lfs.cleaner import POLICIES
from fsage.lfs.fs import mkfs
from fsage.lfs.fsck import fsck
from fsage.lfs.info import lfs_info
from fsage.overwrite import refuse_overwrite
from fsage.text import shown


def _size(text: str) -> int:
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    t = text.strip().lower().rstrip("b").rstrip("i")
    try:
        if t and t[-1] in units:
            return int(float(t[:-1]) * units[t[-1]])
        return int(t)
    except ValueError:
        raise UsageError(f"bad size {text!r} (e.g. 64M, 1G, 1048576)") from None


@click.group("lfs")
def lfs_group() -> None:
    """Log-structured file system images in the on-disk format of seed 003.

    \b
    Examples:
      fsage lfs mkfs lfs.img --size 256M
      fsage lfs fsck lfs.img
      fsage lfs info lfs.img --format json
      fsage lfs mount lfs.img /mnt/lfs
    """


@lfs_group.command("mkfs")
@click.argument("image", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--size", help="Image size (e.g. 64M, 1G); segments = size / segment size.")
@click.option("--segments", type=int, help="Segment count (instead of --size).")
@click.option(
    "--blocks-per-segment",
    type=int,
    default=256,
    show_default=True,
    help="Blocks in a segment (the unit the log writes and the cleaner frees).",
)
@click.option("--block-size", type=int, default=4096, show_default=True, help="Bytes per block.")
@click.option(
    "--sector-size",
    type=int,
    default=512,
    show_default=True,
    help="Bytes per sector of the device the image stands for.",
)
@click.option(
    "--policy",
    type=click.Choice(POLICIES),
    default="greedy",
    show_default=True,
    help="Cleaning policy (open can override it).",
)
@click.option(
    "--checkpoint-interval",
    type=int,
    default=8,
    show_default=True,
    help="Write a checkpoint after this many segments.",
)
@click.option("--force", is_flag=True, help="Overwrite an existing non-empty file or file system.")
def mkfs_cmd(
    image: Path,
    size: str | None,
    segments: int | None,
    blocks_per_segment: int,
    block_size: int,
    sector_size: int,
    policy: str,
    checkpoint_interval: int,
    force: bool,
) -> None:
    """Make an empty LFS image. An existing non-empty file or a device holding a file system
    is overwritten only with --force (a mounted device never).

    \b
    Examples:
      fsage lfs mkfs lfs.img --size 256M
      fsage lfs mkfs small.img --segments 64 --blocks-per-segment 32 --block-size 8192
      fsage lfs mkfs old.img --size 64M --force
    """
    if (size is None) == (segments is None):
        raise UsageError("give exactly one of --size and --segments")
    refuse_overwrite(image, force)
    geo = mkfs(
        image,
        segments=segments,
        size=_size(size) if size else None,
        blocks_per_segment=blocks_per_segment,
        block_size=block_size,
        sector_size=sector_size,
        cleaning_policy=policy,
        checkpoint_interval=checkpoint_interval,
    )
    click.echo(
        f"{image}: {geo.segments} segments of {geo.blocks_per_segment} x "
        f"{geo.block_size}-octet blocks, log from segment {geo.first_log_segment}, "
        f"policy {geo.cleaning_policy}"
    )


@lfs_group.command("fsck")
@click.argument("image", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@format_option("text", "json")
def fsck_cmd(image: Path, fmt: str) -> None:
    """Check an LFS image; name each problem; exit 1 if there are any.

    \b
    Examples:
      fsage lfs fsck lfs.img
      fsage lfs fsck lfs.img --format json
    """
    rep = fsck(image)
    if fmt == "json":
        echo_json(rep.to_json())
    else:
        for note in rep.notes:
            click.echo(f"note: {shown(note)}")
        for prob in rep.problems:
            click.echo(f"problem: {shown(prob)}")
        click.echo(
            f"{image}: {rep.files} files, {rep.directories} directories, "
            f"{rep.blocks} blocks: {'clean' if rep.ok else f'{len(rep.problems)} problems'}"
        )
    if not rep.ok:
        raise SystemExit(1)


@lfs_group.command("info")
@click.argument("image", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@format_option("text", "json")
def info_cmd(image: Path, fmt: str) -> None:
    """Geometry, the preferred checkpoint and segment utilization of an LFS image.

    \b
    Examples:
      fsage lfs info lfs.img
      fsage lfs info lfs.img --format json
    """
    info: dict[str, Any] = lfs_info(image)
    if fmt == "json":
        echo_json(info)
        return
    geo = info["geometry"]
    for k in (
        "segments",
        "blocks_per_segment",
        "block_size",
        "sector_size",
        "segment_size",
        "first_log_segment",
        "checkpoint_segments",
        "summary_blocks",
        "cleaning_policy",
        "checkpoint_interval",
        "uuid",
    ):
        click.echo(f"{k:22} {geo[k] or '-'}")
    cp = info["checkpoint"]
    click.echo(
        f"{'checkpoint':22} region {cp['region']}, timestamp {cp['timestamp_ms']} ms, "
        f"next segment {cp['next_segment']}"
    )
    u = info["utilization"]
    click.echo(
        f"{'utilization':22} {u['live_blocks']} of {u['data_blocks']} blocks "
        f"({u['fraction']:.1%}); {u['clean_segments']} clean segments"
    )
    echo_table(
        ["utilization", "segments"],
        [[f"{r['low']:.1f}-{r['high']:.1f}", r["segments"]] for r in info["histogram"]],
    )


@lfs_group.command("mount")
@click.argument("image", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("mountpoint", type=click.Path(path_type=Path))
@click.option(
    "--foreground/--daemon",
    default=False,
    show_default=True,
    help="Serve in this process (until unmounted or Ctrl-C), or fork and return.",
)
@click.option(
    "--policy", type=click.Choice(POLICIES), help="Cleaning policy (default: the image's)."
)
@click.option(
    "--writeback/--no-writeback",
    default=False,
    show_default=True,
    help="The kernel's writeback cache: small writes reach the LFS in page-sized runs "
    "(faster), but a write the LFS refuses near full fails late, at fsync or close, and an "
    "open file may show the refused size for a moment after. Off: a refused write fails in "
    "write(2) and the mount always shows what is stored.",
)
@click.option("-o", "options", multiple=True, help="Extra FUSE mount option (repeatable).")
@click.option(
    "--force", is_flag=True, help="Mount an image that fails the check, read-only (not refuse)."
)
@click.option(
    "--trace",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="FSAGE_LFS_TRACE",
    help="Record the image blocks read for file data in FILE, as block-trace text that "
    "`fsage trace import` reads (complete once unmounted; default: $FSAGE_LFS_TRACE).",
)
def mount_cmd(
    image: Path,
    mountpoint: Path,
    foreground: bool,
    policy: str | None,
    writeback: bool,
    options: tuple[str, ...],
    force: bool,
    trace: Path | None,
) -> None:
    """Mount an LFS image through FUSE. `fusermount3 -u MOUNTPOINT` unmounts it: the log is
    written and a checkpoint taken. After a crash (kill -9) the next mount rolls forward.
    The image is checked first (as `fsage lfs fsck` does): a damaged image is refused, or
    with --force mounted read-only, each problem named on stderr. The image is held (no other
    fsage command writes or reads it) until it is unmounted. --trace records the file data
    blocks the server reads (sectors of the image), so a scan of the mount has a block trace
    and its dynamic layout score.

    \b
    Examples:
      fsage lfs mount lfs.img /mnt/lfs
      fsage lfs mount lfs.img /mnt/lfs --foreground --policy cost-benefit
      fsage lfs mount lfs.img /mnt/lfs --writeback   # faster small writes
      fsage lfs mount damaged.img /mnt/lfs --force
      fusermount3 -u /mnt/lfs
      fsage lfs mount lfs.img /mnt/lfs --trace scan.txt   # read the files, unmount, then
      fsage trace import scan.txt --block-size 4096 --format json
    """
    from fsage.lfs.mount import mount

    def ready(pid: int) -> None:
        click.echo(f"{image}: mounted on {mountpoint} (pid {pid})")

    errors = mount(
        image,
        mountpoint,
        foreground=foreground,
        policy=policy,
        options=options,
        writeback=writeback,
        ready=ready,
        force=force,
        trace=None if trace is None else trace.resolve(),
        say=lambda line: click.echo(f"fsage: {line}", err=True),
    )
    if errors:
        raise SystemExit(1)


COMMANDS = [lfs_group]
