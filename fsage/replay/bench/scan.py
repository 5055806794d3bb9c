"""The ``scan`` suite: does the file system read like an aged one?

A scan is a cold read of a tree (the whole file system or ``--path``) in path order
(:mod:`.scantree`), what grep -r, tar, a backup or a build does. Conway et al. (FAST'17) judge
aging by it: the time on the aged file system over the time on a clean copy of the same tree,
made in the same run on a fresh file system of the same mkfs parameters (the aged/clean ratio),
judged from paired rounds (:mod:`.paired`).

* An image is attached read-only to a loop device with direct I/O (so the image's blocks are
  not served from the host's page cache) and mounted read-only; before each scan it is
  unmounted, the caches dropped and mounted again. The clean copy is made by fsage beside the
  image (``.NAME.fsage-scan-clean``, sparse, removed after), one writer, path order, then
  handled the same way. The two are scanned alternately (aged first in odd rounds, clean
  first in even ones) so that drift in the machine's load falls on both.
* A mounted directory is scanned in place: each file is advised out of the page cache
  (posix_fadvise DONTNEED) and, as root, the caches are dropped. Where it is on a loop device,
  the clean copy has the mkfs parameters of the image behind it and is read through a loop
  device as the directory is (direct I/O or not); on another device it has none (said).
* The clean copy of an ext image has the parameters fsage's ext reader recovers, of an xfs
  image the geometry xfs_info prints (:mod:`.cleancopy`); btrfs has none (said).

With ``--trace`` each scan runs under the block tracer of :mod:`fsage.trace`; its requests'
dynamic layout score is kept with the time, the layout that explains it.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

from fsage.errors import FsageError, UsageError
from fsage.layout import Layout
from fsage.replay.bench.cleancopy import tool_output
from fsage.replay.bench.layoutscore import BenchLayout, old_files_score
from fsage.replay.bench.paired import paired_effect
from fsage.replay.bench.record import BenchRun, store_run
from fsage.replay.bench.scantree import (
    AgedCleanVerdict,
    ScanRead,
    aged_clean_verdict,
    evict_tree,
    read_tree,
    relative_spread,
)
from fsage.replay.bench.suites import BenchOptions, Result, stopping_rule
from fsage.replay.bench.target import BENCH_PREFIX, can_drop_caches, drop_caches, is_root

Say = Callable[[str], None]
#: Traced scans tried before a scan runs untraced.
TRACE_ATTEMPTS = 3

#: Mount type and read-only options per image kind: no journal replay on a read-only device.
_MOUNT = {"ext": ("ext4", "ro,noload"), "xfs": ("xfs", "ro,norecovery"), "btrfs": ("btrfs", "ro")}


def _tool(argv: list[str], what: str) -> str:
    return tool_output(argv, what).strip()


class ScanImage:
    """An image on a read-only loop device with direct I/O, mounted read-only while scanned."""

    def __init__(self, image: Path, kind: str, say: Say, *, direct: bool = True) -> None:
        from fsage.ager.images import clear_stale_mounts, mount_dir

        if kind not in _MOUNT:
            raise UsageError(f"{image}: a {kind} image cannot be scanned through the kernel")
        self.image = image
        self.fstype, self.options = _MOUNT[kind]
        clear_stale_mounts(image, say)
        # what was written to the image through a page-cached loop device may still be dirty
        # in the host's cache: on disk first, so that direct reads of it see it
        fd = os.open(image, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        dio = f"--direct-io={'on' if direct else 'off'}"
        self.dev = _tool(
            ["losetup", "--find", "--show", "--read-only", dio, str(image)],
            f"attaching {image}",
        )
        self.mnt = mount_dir("scan")
        self.mounted = False

    @property
    def direct_io(self) -> bool:
        """Whether the loop device really reads the image with direct I/O (the image's own
        file system may refuse it; drop_caches then keeps the host's cache of it cold)."""
        name = Path(self.dev).name
        try:
            return Path(f"/sys/block/{name}/loop/dio").read_text().strip() == "1"
        except OSError:
            return False

    def mount(self) -> None:
        if not self.mounted:
            _tool(
                ["mount", "-t", self.fstype, "-o", self.options, self.dev, str(self.mnt)],
                f"mounting {self.image} read-only",
            )
            self.mounted = True

    def umount(self) -> None:
        from fsage.ager.images import umount

        if self.mounted:
            umount(self.mnt)
            self.mounted = False

    def cold(self) -> None:
        """Unmount (the file system's caches go), drop the page cache, mount again."""
        self.umount()
        drop_caches()
        self.mount()

    def close(self) -> None:
        try:
            self.umount()
        finally:
            with contextlib.suppress(FsageError):
                _tool(["losetup", "-d", self.dev], f"detaching {self.dev}")
            with contextlib.suppress(OSError):
                self.mnt.rmdir()


@dataclass
class Tree:
    """One side of the comparison: where its tree is and how to start it cold."""

    name: str  # "aged" or "clean"
    root: Path  # the scanned tree
    device: Path  # the block device its reads go to (traced)
    start_cold: Callable[[], None]
    block_size: int


def _subpath(path: str | None) -> PurePosixPath:
    if not path:
        return PurePosixPath(".")
    p = PurePosixPath(path.lstrip("/") or ".")
    if ".." in p.parts:
        raise UsageError(f"--path {path!r}: a path inside the file system, without '..'")
    return p


def image_tree(
    image: Path,
    kind: str,
    name: str,
    say: Say,
    stack: contextlib.ExitStack,
    block_size: int | None = None,
) -> tuple[Tree, list[str]]:
    """``image`` attached read-only (direct I/O) and mounted once for many scans, detached
    when ``stack`` closes: each scan of the returned tree still starts cold (unmount, drop
    the caches, mount), but the loop device is set up once, not once per scan. With the
    notes a scan of it gives (the loop device's page cache). ``block_size`` (the traced
    requests' unit) defaults to the mounted file system's."""
    img = ScanImage(Path(os.path.realpath(image)), kind, say)
    stack.callback(img.close)
    img.mount()
    notes: list[str] = []
    if not img.direct_io:
        notes.append(
            "the loop device reads the image through the host's page cache (its file system "
            "refuses direct I/O); the caches are dropped before every scan instead"
        )
    bs = block_size or os.statvfs(img.mnt).f_frsize
    return Tree(name, img.mnt, Path(img.dev), img.cold, bs), notes


def scan_tree(tree: Tree, *, trace: bool, label: str, notes: list[str], say: Say) -> ScanRead:
    """One cold path-order read of ``tree`` (traced when asked; see :func:`_traced_scan`)."""
    return _traced_scan(tree, label, notes, say) if trace else _scan(tree, False)


def _scan(tree: Tree, trace: bool) -> ScanRead:
    tree.start_cold()
    if not trace:
        return read_tree(tree.root)
    from fsage.trace import parse_blkparse, record_call, resolve_device

    dev = resolve_device(tree.device)
    got: list[ScanRead] = []

    def call() -> tuple[int, float]:
        got.append(read_tree(tree.root))
        return 0, got[-1].seconds

    rec = record_call(dev, call, cold=False)
    read = got[-1]
    tr = parse_blkparse(
        rec.text.splitlines(),
        device=(dev.major, dev.minor),
        source=f"the trace of {dev.name}",
        device_sectors=dev.size_sectors,
    )
    read.trace = {**tr.score(tree.block_size, dev.start_sector), "tool": rec.tool}
    return read


def _traced_scan(tree: Tree, label: str, notes: list[str], say: Say) -> ScanRead:
    """A traced scan; again (up to :data:`TRACE_ATTEMPTS` in all) when the tracer lost it or
    was busy (the kernel's tracer is one per machine, and another trace can hold it), then
    the scan untraced, said."""
    from fsage.trace import TraceError

    last = ""
    for attempt in range(1, TRACE_ATTEMPTS + 1):
        try:
            return _scan(tree, True)
        except TraceError as exc:
            last = str(exc)
            again = "; scanning once more" if attempt < TRACE_ATTEMPTS else ""
            say(f"fsage: {label}: the trace failed ({exc}){again}")
            time.sleep(attempt)
    notes.append(f"{label} is not traced: {last}")
    return _scan(tree, False)


def run_scan(
    target: Path, opts: BenchOptions, db: Path | None = None, echo: Say | None = None
) -> BenchRun:
    """The ``scan`` suite on ``target`` (an image or a mounted directory); stored in ``db``
    when given. See the module doc."""
    say = echo or (lambda s: None)
    target = Path(target)
    if not target.exists():
        raise UsageError(f"{target}: no such file or directory")
    sub = _subpath(opts.path)
    if opts.trace and not is_root():
        raise UsageError("--trace needs root (block tracing)")
    started = datetime.now(UTC)
    t0 = time.perf_counter()
    notes: list[str] = []
    with contextlib.ExitStack() as stack:
        if target.is_dir():
            aged, before, clean = _directory_side(target, sub, opts, notes, say, stack)
        elif target.is_file():
            aged, before, clean = _image_sides(target, sub, opts, notes, say, stack)
        else:
            raise UsageError(f"{target}: not a directory or an image file")
        if opts.trace:
            from fsage.trace import resolve_device

            # a tree on no block device (tmpfs) cannot be traced: said once, before any scan
            for tree in (aged, clean):
                if tree is not None:
                    resolve_device(tree.device)
        for n in notes:
            say(f"fsage: {n}")
        reads = _alternate(aged, clean, opts, notes, say)
    aged_reads = reads["aged"]
    clean_reads = reads.get("clean", [])
    if clean_reads and aged_reads[0].bytes != clean_reads[0].bytes:
        notes.append(
            f"the clean copy read {clean_reads[0].bytes:,} bytes where the aged tree read "
            f"{aged_reads[0].bytes:,}"
        )
    results = _side_results("aged", aged_reads)
    summary: dict[str, Any] = {
        "path": str(sub),
        "aged": _side_summary(aged_reads),
        "clean": _side_summary(clean_reads) if clean_reads else None,
    }
    if clean_reads:
        results += _side_results("clean", clean_reads)
        v = aged_clean_verdict([r.seconds for r in aged_reads], [r.seconds for r in clean_reads])
        summary["aged_clean"] = v.to_json()
        if v.ratio is not None:
            results.append(Result("aged_clean_ratio", v.ratio, "x", {"verdict": v.verdict}))
        notes.append(f"aged/clean: {v.text()}")
    layout = None
    if before is not None:
        layout = BenchLayout(before.facts.block_size, None, old_files_score(before, BENCH_PREFIX))
    from fsage.db.store import default_fs_name

    run = BenchRun(
        suite="scan",
        target=str(target),
        via=_via(target, clean is not None),
        fs_name=opts.name or (default_fs_name(before.facts) if before else target.name),
        started_at=started.isoformat(timespec="seconds"),
        seconds=time.perf_counter() - t0,
        cold=can_drop_caches(),
        params={
            "path": str(sub),
            "repeat": len(aged_reads),
            "ci_width": opts.ci_width,
            "budget": opts.budget,
            "until_decided": opts.until_decided,
            "trace": opts.trace,
            "scan": summary,
        },
        results=results,
        layout=layout,
        notes=notes,
    )
    if db is not None:
        from fsage.db.store import Store

        with Store.open(db, create=True) as store:
            uuid = None if before is None else before.facts.uuid
            store_run(store, run, uuid=uuid, named=opts.name is not None)
            if opts.trace:
                _save_traces(store, run)
    return run


def _save_traces(store: Any, run: BenchRun) -> None:
    """The last traced scan of each tree into the traces table (``fsage trace list``): the
    aged tree's with the file system's latest snapshot, beside its modeled score."""
    from fsage.trace import save_trace

    scan = run.params["scan"]
    for name in ("aged", "clean"):
        side = scan.get(name) or {}
        tr = side.get("trace")
        if not tr:
            continue
        row = save_trace(
            store,
            tr,
            snapshot_id=run.snapshot_id if name == "aged" else None,
            source=f"bench scan ({tr.get('tool', 'trace')})",
            device=None,
            command=f"fsage bench --suite scan: run {run.run_id}, {name} tree {scan['path']}",
            params={"bench_run": run.run_id, "tree": name, "seconds": side["seconds"]},
        )
        tr["trace_id"] = row.id
        if row.modeled_score is not None:
            tr["modeled_score"] = row.modeled_score
    # the run's stored parameters name the traces, as its printed ones do
    with store.transaction() as tx:
        tx.execute(
            "UPDATE bench_runs SET params = ? WHERE id = ?",
            (json.dumps(run.params, default=str), run.run_id),
        )


def _via(target: Path, with_clean: bool) -> str:
    if target.is_dir():
        return f"{target} (mounted directory, files advised out of the page cache)"
    what = f"{target} on a read-only loop device"
    return what + (" and its clean copy, alternately" if with_clean else "")


def _directory_side(
    target: Path,
    sub: PurePosixPath,
    opts: BenchOptions,
    notes: list[str],
    say: Say,
    stack: contextlib.ExitStack,
) -> tuple[Tree, Layout | None, Tree | None]:
    if Path(os.path.realpath(target)) == Path("/") and str(sub) == ".":
        raise UsageError("refusing to scan '/': give a directory or --path")
    root = target / sub
    if not root.is_dir():
        raise UsageError(f"--path {opts.path}: no such directory in {target}")
    cold = can_drop_caches()
    if not cold:
        notes.append(
            "not root: files are advised out of the page cache, but directories and inodes "
            "may still be cached (a warm start for the metadata)"
        )

    def start() -> None:
        evict_tree(root)
        if cold:
            drop_caches()

    before: Layout | None = None
    try:
        from fsage.snapshotter import read_source

        before = read_source(target)
    except FsageError as exc:
        notes.append(f"no layout score: the target's layout cannot be read ({exc})")
    bs = before.facts.block_size if before is not None else os.statvfs(root).f_frsize
    aged = Tree("aged", root, target, start, bs)
    if not opts.baseline:
        return aged, before, None
    from fsage.ager.images import image_kind
    from fsage.replay.bench.cleancopy import loop_backing, loop_direct_io

    backing, why = loop_backing(target)
    kind = None if backing is None else image_kind(backing)
    if backing is None or kind is None or not is_root():
        why = why or ("scanning its image needs root" if kind else f"{backing}: not an image")
        notes.append(f"no clean copy of the mounted directory: {why}")
        return aged, before, None
    base: Layout | None = None
    if kind == "ext":
        from fsage.snapshotter import read_source

        try:
            base = read_source(backing)  # only its mkfs parameters are used
        except FsageError as exc:
            notes.append(f"no clean copy: {backing} cannot be read ({exc})")
            return aged, before, None
    direct = loop_direct_io(target)
    notes.append(
        f"the clean copy has the mkfs parameters of {backing}, the image mounted there, and is "
        f"read as it is (loop device {'with' if direct else 'without'} direct I/O)"
    )
    clean = _clean_side(backing, kind, base, root, sub, bs, notes, say, stack, direct=direct)
    return aged, before, clean


def _image_sides(
    target: Path,
    sub: PurePosixPath,
    opts: BenchOptions,
    notes: list[str],
    say: Say,
    stack: contextlib.ExitStack,
) -> tuple[Tree, Layout | None, Tree | None]:
    from fsage.ager.images import can_loop_mount, image_kind

    kind = image_kind(target)
    if kind is None:
        raise UsageError(f"{target}: not a directory or a recognised file-system image")
    if kind == "lfs":
        raise UsageError(
            f"{target}: an LFS image cannot be mounted by the kernel; mount it with "
            "`fsage lfs mount` and scan the directory"
        )
    if not can_loop_mount() or not is_root():
        raise UsageError(
            f"{target}: scanning an image needs root and loop devices; give a mounted directory"
        )
    image = Path(os.path.realpath(target))
    from fsage.snapshotter import read_source

    before: Layout | None = None
    try:
        before = read_source(image)
    except FsageError as exc:
        notes.append(f"no layout score: the image cannot be read ({exc})")
    if before is not None and "needs_recovery" in (before.facts.mkfs.get("features") or []):
        # read-only, the journal is not replayed: the scan would read a state the kernel
        # never showed, and the clean copy would copy it
        raise UsageError(
            f"{target}: its journal needs recovery (not unmounted cleanly); mount and unmount "
            "it once, or e2fsck -fy it, before scanning"
        )
    aged_img = ScanImage(image, kind, say)
    stack.callback(aged_img.close)
    aged_img.mount()
    bs = before.facts.block_size if before is not None else os.statvfs(aged_img.mnt).f_frsize
    root = aged_img.mnt / sub
    if not root.is_dir():
        raise UsageError(f"--path {opts.path}: no such directory in {target}")
    if not aged_img.direct_io:
        notes.append(
            "the loop device reads the image through the host's page cache (its file system "
            "refuses direct I/O); the caches are dropped before every scan instead"
        )
    aged = Tree("aged", root, Path(aged_img.dev), aged_img.cold, bs)
    if not opts.baseline:
        return aged, before, None
    clean = _clean_side(image, kind, before, root, sub, bs, notes, say, stack)
    return aged, before, clean


def _clean_side(
    image: Path,
    kind: str,
    before: Layout | None,
    root: Path,
    sub: PurePosixPath,
    bs: int,
    notes: list[str],
    say: Say,
    stack: contextlib.ExitStack,
    *,
    direct: bool = True,
) -> Tree | None:
    """The clean copy of ``root`` on a fresh file system of ``image``'s mkfs parameters,
    read-only on its own loop device (with direct I/O or not, as the aged side reads);
    None (and why, in ``notes``) where it cannot be made."""
    from fsage.replay.bench.cleancopy import make_clean_copy

    if kind == "ext" and (before is None or not before.facts.mkfs.get("blocks_count")):
        notes.append(f"no clean copy: the mkfs parameters of {image} cannot be read")
        return None
    if kind not in ("ext", "xfs"):
        notes.append(
            f"no clean copy: the mkfs parameters of a {kind} image are not recovered "
            "(fsage reads back those of ext and xfs only)"
        )
        return None
    clean_path = image.with_name(f".{image.name}.fsage-scan-clean")
    stack.callback(lambda: clean_path.unlink(missing_ok=True))
    notes += make_clean_copy(clean_path, kind, root, sub, say, layout=before, original=image)
    clean_img = ScanImage(clean_path, kind, say, direct=direct)
    stack.callback(clean_img.close)
    clean_img.mount()
    return Tree("clean", clean_img.mnt / sub, Path(clean_img.dev), clean_img.cold, bs)


def _alternate(
    aged: Tree, clean: Tree | None, opts: BenchOptions, notes: list[str], say: Say
) -> dict[str, list[ScanRead]]:
    """Rounds of one scan of each tree, each tree first in every other round, until the
    stopping rule of :mod:`.paired` ends them (at least ``opts.repeat`` rounds)."""
    out: dict[str, list[ScanRead]] = {"aged": []}
    sides = [aged] if clean is None else [aged, clean]
    if clean is not None:
        out["clean"] = []
    rule = stopping_rule(opts)
    t0 = time.perf_counter()
    i = 0
    while True:
        order = sides if i % 2 == 0 else sides[::-1]
        for tree in order:
            label = f"scan {i + 1} of the {tree.name} tree"
            r = _traced_scan(tree, label, notes, say) if opts.trace else _scan(tree, False)
            out[tree.name].append(r)
            traced = "" if r.trace is None else f", traced score {_fmt(r.trace.get('score'))}"
            say(f"fsage: {label}: {r.seconds:.2f} s, {r.mb_per_s:.1f} MB/s{traced}")
        i += 1
        effects = []
        if clean is not None:
            effects.append(
                paired_effect([r.seconds for r in out["aged"]], [r.seconds for r in out["clean"]])
            )
        why = rule.why_stop(effects, i, time.perf_counter() - t0)
        if why is not None:
            if clean is not None:
                notes.append(f"{i} rounds: {why}")
            return out


def _fmt(x: Any) -> str:
    return "-" if x is None else f"{float(x):.4f}"


def _side_summary(reads: list[ScanRead]) -> dict[str, Any]:
    import numpy as np

    secs = [r.seconds for r in reads]
    med = float(np.median(secs))
    first = reads[0]
    out: dict[str, Any] = {
        "seconds": med,
        "values": secs,
        "spread": relative_spread(secs),
        "mb_per_s": first.bytes / 1e6 / med if med > 0 else 0.0,
        "bytes": first.bytes,
        "files": first.files,
        "dirs": first.dirs,
    }
    traces = [r.trace for r in reads if r.trace is not None]
    if traces:
        out["trace"] = traces[-1]
        out["trace_scores"] = [t.get("score") for t in traces]
    return out


def _side_results(name: str, reads: list[ScanRead]) -> list[Result]:
    s = _side_summary(reads)
    params: dict[str, Any] = {
        "tree": name,
        "repeats": len(reads),
        "values": s["values"],
        "spread": s["spread"],
        "bytes": s["bytes"],
        "files": s["files"],
        "dirs": s["dirs"],
    }
    if "trace" in s:
        params["trace"] = s["trace"]
    rate = dict(params, values=[r.mb_per_s for r in reads])
    return [
        Result("scan", s["seconds"], "s", params),
        Result("scan_rate", s["mb_per_s"], "MB/s", rate),
    ]


def verdict_of(run: BenchRun) -> AgedCleanVerdict | None:
    """The aged/clean verdict of a scan run, from its two series of times."""
    scan = run.params.get("scan") or {}
    a, c = scan.get("aged"), scan.get("clean")
    if not a or not c:
        return None
    return aged_clean_verdict(a["values"], c["values"])
