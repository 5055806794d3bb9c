"""The scan suite's clean copy: a fresh file system of the aged one's mkfs parameters holding
a copy of its tree, written by fsage in path order with one writer.

* ext: the parameters fsage's ext reader recovers (:func:`fsage.replay.recreate.make_filesystem`).
* xfs: the geometry ``xfs_info`` prints for the image (block and sector size, allocation
  groups, data and log size, inode size, directory block size, stripe unit and width, and
  the feature flags), given back to ``mkfs.xfs``.
* A mounted directory: the parameters of the image behind its loop device, when there is one.
* btrfs and anything else: none, and the reason is said.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from fsage.errors import FsageError, UsageError
from fsage.layout import Layout
from fsage.private import private_opener
from fsage.replay.bench.scantree import copy_tree

Say = Callable[[str], None]

#: xfs_info's feature flags that mkfs.xfs takes back, by its option group.
_XFS_META = ("crc", "finobt", "rmapbt", "reflink", "bigtime", "inobtcount")


def tool_output(argv: list[str], what: str) -> str:
    """Run a tool and return its standard output; its last line of complaint as one FsageError
    naming ``what`` when it cannot run or fails."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise FsageError(f"{what}: cannot run {argv[0]}: {exc.strerror}") from None
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stderr or proc.stdout).strip().splitlines() if ln.strip()]
        raise FsageError(f"{what}: {lines[-1] if lines else f'exit {proc.returncode}'}")
    return proc.stdout


def parse_xfs_info(text: str) -> dict[str, dict[str, str]]:
    """``xfs_info``'s output as {section: {key: value}} (sections: meta-data, data, naming,
    log, realtime; a continuation line ``=`` belongs to the section above it)."""
    out: dict[str, dict[str, str]] = {}
    section = ""
    for line in text.splitlines():
        head, sep, rest = line.partition("=")
        if not sep:
            continue
        if head.strip():
            section = head.strip()
        # "version 2" and "internal log" are values without a key
        fields = out.setdefault(section, {})
        for key, value in re.findall(r"([\w-]+)=(\S+?)(?:,|\s|$)", rest):
            fields[key] = value
        first = rest.strip().split("=")[0].split()
        if first and first[0] in ("version", "internal", "external") and len(first) >= 2:
            fields.setdefault("kind", " ".join(first[:2]))
    return out


def xfs_geometry(image: Path) -> dict[str, dict[str, str]]:
    return parse_xfs_info(tool_output(["xfs_info", str(image)], f"reading the geometry of {image}"))


def xfs_mkfs_argv(geo: dict[str, dict[str, str]], image: Path) -> list[str]:
    """``mkfs.xfs`` arguments that make a file system of ``geo``'s geometry in ``image``."""
    meta, data = geo.get("meta-data", {}), geo.get("data", {})
    naming, log = geo.get("naming", {}), geo.get("log", {})
    if "log" in geo and geo["log"].get("kind", "internal log") != "internal log":
        raise UsageError(f"{image}: an xfs with an external log has no clean copy")
    if geo.get("realtime", {}).get("blocks", "0") != "0":
        raise UsageError(f"{image}: an xfs with a realtime section has no clean copy")
    bsize = int(data["bsize"])
    argv = ["mkfs.xfs", "-q", "-f", "-b", f"size={bsize}", "-s", f"size={meta['sectsz']}"]
    d = [f"agcount={meta['agcount']}", f"size={int(data['blocks']) * bsize}"]
    sunit, swidth = int(data.get("sunit", "0")), int(data.get("swidth", "0"))
    if sunit:  # in file-system blocks
        d += [f"su={sunit * bsize}", f"sw={max(swidth // sunit, 1)}"]
    argv += ["-d", ",".join(d)]
    m = [f"{k}={meta[k]}" for k in _XFS_META if k in meta]
    if m:
        argv += ["-m", ",".join(m)]
    i = [f"size={meta['isize']}"]
    i += [f"{k}={meta[k]}" for k in ("sparse", "nrext64") if k in meta]
    if "imaxpct" in data:
        i.append(f"maxpct={data['imaxpct']}")
    argv += ["-i", ",".join(i)]
    n = [f"size={naming['bsize']}"] if "bsize" in naming else []
    if meta.get("crc") == "0" and "ftype" in naming:  # always on with crc
        n.append(f"ftype={naming['ftype']}")
    if n:
        argv += ["-n", ",".join(n)]
    lg = [f"size={int(log['blocks']) * int(log.get('bsize', bsize))}"]
    if "sectsz" in log:
        lg.append(f"sectsize={log['sectsz']}")
    if int(log.get("sunit", "0")):
        lg.append(f"sunit={int(log['sunit']) * bsize // 512}")
    argv += ["-l", ",".join(lg), str(image)]
    return argv


#: The xfs_info fields that must come out the same on the clean copy.
XFS_SAME = {
    "meta-data": ("isize", "agcount", "agsize", "sectsz", "crc", "finobt", "sparse", "rmapbt",
                  "reflink", "bigtime", "inobtcount", "nrext64"),
    "data": ("bsize", "blocks", "imaxpct", "sunit", "swidth"),
    "naming": ("bsize", "ftype"),
    "log": ("bsize", "blocks", "sectsz", "sunit"),
}  # fmt: skip


def make_xfs_like(original: Path, image: Path) -> list[str]:
    """An empty xfs in ``image`` (sparse) of ``original``'s geometry; notices of what differs."""
    geo = xfs_geometry(original)
    bsize = int(geo["data"]["bsize"])
    with open(image, "wb", opener=private_opener) as fh:  # a copy of the user's tree
        fh.truncate(int(geo["data"]["blocks"]) * bsize)
    tool_output(xfs_mkfs_argv(geo, image), f"making an xfs on {image}")
    made = xfs_geometry(image)
    diff = [
        f"{sec} {k} {geo[sec][k]} vs {made.get(sec, {}).get(k)}"
        for sec, keys in XFS_SAME.items()
        for k in keys
        if k in geo.get(sec, {}) and geo[sec][k] != made.get(sec, {}).get(k)
    ]
    return ["the clean copy's geometry differs: " + "; ".join(diff)] if diff else []


def loop_backing(directory: Path) -> tuple[Path | None, str]:
    """The image file behind the loop device ``directory``'s file system is mounted from, or
    None and why there is none."""
    st = os.stat(directory)
    major, minor = os.major(st.st_dev), os.minor(st.st_dev)
    sysdev = Path(f"/sys/dev/block/{major}:{minor}")
    if not sysdev.exists():
        return None, f"its file system is on no block device ({major}:{minor})"
    name = sysdev.resolve().name
    backing = sysdev / "loop" / "backing_file"
    if not backing.exists():
        return None, (
            f"it is on /dev/{name}, not a loop device (a clean copy of a device's file system "
            "needs as much room again: give an image)"
        )
    path = Path(backing.read_text().strip())
    if not path.is_file():
        return None, f"/dev/{name}'s image {path} is gone"
    return path, ""


def loop_direct_io(directory: Path) -> bool:
    """Whether the loop device ``directory``'s file system is on reads with direct I/O."""
    st = os.stat(directory)
    dio = Path(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/loop/dio")
    try:
        return dio.read_text().strip() == "1"
    except OSError:
        return False


def make_clean_copy(
    image: Path,
    kind: str,
    src: Path,
    sub: PurePosixPath,
    say: Say,
    *,
    layout: Layout | None = None,
    original: Path | None = None,
) -> list[str]:
    """A fresh file system in ``image`` of the mkfs parameters of ``layout`` (ext) or of the
    image ``original`` (xfs), holding a copy of the tree ``src`` at the same path ``sub``;
    notices of what differs."""
    from fsage.ager.images import mount_dir
    from fsage.replay.loopdev import LoopDevice
    from fsage.replay.recreate import make_filesystem

    say("fsage: copying the tree onto a fresh file system of the same mkfs parameters")
    t0 = time.perf_counter()
    if kind == "xfs":
        assert original is not None
        notes = make_xfs_like(original, image)
        fstype = "xfs"
    else:
        assert layout is not None
        notes = make_filesystem(image, layout)
        fstype = "ext4"
    loop = LoopDevice(image, fstype, say)
    mnt = mount_dir("scan")
    try:
        loop.mount(mnt)
        try:
            dst = mnt / sub
            dst.mkdir(parents=True, exist_ok=True)
            try:
                stats = copy_tree(src, dst)
                os.sync()
            except OSError as exc:
                raise FsageError(
                    f"copying {src} onto the clean file system: {exc.strerror} "
                    f"({os.fsdecode(exc.filename or '')})"
                ) from None
        finally:
            loop.umount(mnt)
    finally:
        loop.detach()
        with contextlib.suppress(OSError):
            mnt.rmdir()
    notes += stats.notes
    notes.append(
        f"clean copy: {stats.files:,} files, {stats.dirs:,} directories, "
        f"{stats.bytes / 2**20:,.1f} MiB written in {time.perf_counter() - t0:.1f} s"
    )
    return notes
