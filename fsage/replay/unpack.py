"""A real history from released source trees: successive releases unpacked over one directory
each on a loop-mounted ext4, with a snapshot after every batch.

This is how a file system ages under a developer who follows upstream: every release
overwrites the files it ships (GNU tar unlinks an existing file and creates it anew, as package
managers and version control do), files a release dropped stay behind, directories
accumulate. The snapshots are taken the way a nightly collection takes them: the file system
is unmounted (everything on disk), read, and mounted again.

``history_size`` estimates the space the last state needs, so a caller can size the file
system to a fullness; ``unpack_history`` builds the image and records its snapshots.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from fsage.ager.images import mount, mount_dir, run_tool, umount
from fsage.errors import UsageError

#: One snapshot's batch: (directory under the root, release tarball) pairs, unpacked in order.
Batch = Sequence[tuple[str, Path]]


@dataclass
class UnpackedHistory:
    image: Path
    fs_name: str
    snapshot_ids: list[int]
    block_size: int
    size: int
    fullness: list[float]  # used / total after each batch


def history_size(
    batches: Sequence[Batch], block_size: int, members: Sequence[str] = ()
) -> tuple[int, int]:
    """(bytes, inodes) the file system holds after the last batch: every path any release
    shipped (of those matching a ``members`` pattern, when given), at the largest size it had
    (files are never removed), rounded up to blocks, plus a block per directory."""
    files: dict[str, int] = {}
    dirs: set[str] = set()
    for batch in batches:
        for where, tarball in batch:
            proc = subprocess.run(
                ["tar", "-tvf", str(tarball), "--quoting-style=literal", "--wildcards", *members],
                capture_output=True,
                text=True,
                errors="surrogateescape",
                check=False,
            )
            if proc.returncode != 0:
                raise UsageError(f"cannot read {tarball}: {proc.stderr.strip()[-200:]}")
            for line in proc.stdout.splitlines():
                f = line.split(None, 5)  # type+mode, owner, size, date, time, name
                if len(f) < 6:
                    continue
                name = f[5].split(" -> ")[0].split(" link to ")[0]
                parts = [x for x in name.split("/")[1:] if x]  # --strip-components=1
                if not parts:
                    continue
                path = "/".join([where, *parts])
                if f[0].startswith("d"):
                    dirs.add(path)
                else:
                    size = int(f[2]) if f[0].startswith("-") and f[2].isdigit() else 0
                    files[path] = max(files.get(path, 0), size)
                    dirs.add(path.rpartition("/")[0])
    nbytes = sum(-(-s // block_size) * block_size for s in files.values())
    nbytes += len(dirs) * block_size
    return nbytes, len(files) + len(dirs)


def unpack_history(
    batches: Sequence[Batch],
    image: Path,
    db: Path,
    fs_name: str,
    *,
    block_size: int = 4096,
    size: int,
    inodes: int | None = None,
    members: Sequence[str] = (),
    echo: Callable[[str], None] | None = None,
) -> UnpackedHistory:
    """Make an ext4 of ``size`` bytes and ``block_size`` on ``image``, unpack each batch in
    turn (``tar --strip-components=1`` into its directory; only the members matching one of
    the shell patterns ``members``, when given) through a loop mount, and record a snapshot of
    ``fs_name`` in ``db`` after every batch."""
    from fsage.db.store import Store
    from fsage.snapshotter import read_source

    say = echo or (lambda s: None)
    with open(image, "wb") as fh:
        fh.truncate(size)
    argv = ["mkfs.ext4", "-F", "-q", "-b", str(block_size), "-L", fs_name[:16]]
    if inodes:
        argv += ["-N", str(inodes)]
    run_tool([*argv, "-E", "nodiscard", str(image)], f"making {image}")
    mnt = mount_dir("unpack")
    ids: list[int] = []
    full: list[float] = []
    mounted = False
    try:
        with Store.open(db, create=True) as store:
            for i, batch in enumerate(batches):
                mount(image, mnt)
                mounted = True
                for where, tarball in batch:
                    dest = mnt / where
                    dest.mkdir(parents=True, exist_ok=True)
                    run_tool(
                        ["tar", "-xf", str(tarball), "--strip-components=1", "--no-same-owner",
                         "-C", str(dest), "--wildcards", *members],
                        f"unpacking {tarball}",
                    )  # fmt: skip
                st = os.statvfs(mnt)
                full.append(1 - st.f_bfree / st.f_blocks)
                umount(mnt)
                mounted = False
                summ = store.add_snapshot(
                    read_source(image),
                    name=fs_name,
                    source=str(image),
                    label=" ".join(Path(t).name for _, t in batch),
                )
                ids.append(int(summ.snapshot_id))
                say(f"  batch {i + 1}/{len(batches)}: fullness {full[-1]:.3f}")
    finally:
        if mounted:
            umount(mnt)
        with contextlib.suppress(OSError):
            mnt.rmdir()
    return UnpackedHistory(image, fs_name, ids, block_size, size, full)


__all__ = ["Batch", "UnpackedHistory", "history_size", "unpack_history"]
