"""What a study measures on one file system after a step.

* a snapshot of the aged file system into the database, and from it the layout score (whole
  and by size), locality between files and free space;
* a clean copy of the aged tree, made by fsage in the same step on a fresh file system of the
  same kind and size (path order, one writer);
* cold path-order scans of the aged image and of its copy, alternately (aged first in odd
  rounds), as the ``scan`` suite reads them, with the block trace of the aged tree's first
  scan when asked (the LFS's from its server, ``--trace``);
* the modeled time of each path-order scan on the seed papers' disks and a modern HDD, since a
  VM's disk is not a spinning one.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fsage.layout import Layout
from fsage.replay.bench.scantree import ScanRead
from fsage.study.members import Member

Say = Callable[[str], None]
#: Disks the scans are modeled on: seed 000's, seed 001's (its usual 15 ms / 5 MB/s disk,
#: Sprite LFS's, a faster one, and the two HP disks of its simulations) and a modern HDD.
MODELS = ("dsp3105", "lfs-15ms", "sprite-17.5ms", "lfs-10ms", "hp97560", "hpc3323a", "hdd")


def layout_metrics(layout: Layout) -> tuple[dict[str, Any], dict[str, float]]:
    """The snapshot's figures a study keeps, and its modeled path-order scan seconds."""
    from fsage.analyzer.analysis import SnapshotAnalyzer

    an = SnapshotAnalyzer(layout)
    full = an.run(frozenset({"size", "free", "locality"}), (), 2, True)
    loc = full.get("locality") or {}
    near = loc.get("neighbour_distance") or {}
    out: dict[str, Any] = {
        "block_size": full["block_size"],
        "blocks_total": full["blocks_total"],
        "blocks_free": full["blocks_free"],
        "files": full["files"],
        "directories": full["directories"],
        "data_blocks": full["data_blocks"],
        "layout_score": full["layout_score"],
        "by_size": [
            {
                k: b[k]
                for k in ("label", "min_blocks", "max_blocks", "files", "blocks", "layout_score")
            }
            for b in full.get("by_size") or []
        ],
        "free_extents": [
            {k: b[k] for k in ("label", "min_blocks", "max_blocks", "count", "blocks")}
            for b in full.get("free_extents") or []
        ],
        "largest_free_extent": full.get("largest_free_extent"),
        "locality": {
            "adjacent_share": near.get("adjacent_share"),
            "le_1mib_share": near.get("le_1mib_share"),
            "farther_share": near.get("farther_share"),
            "same_group_share": loc.get("same_group_share"),
            "dynamic_layout_score_path": loc.get("dynamic_layout_score_path"),
        },
    }
    return out, modeled_seconds(an)


def modeled_seconds(an: Any) -> dict[str, float]:
    """Seconds a cold path-order read of the snapshot takes on each of :data:`MODELS`."""
    from fsage.analyzer.diskmodel import get_model

    req = an.path_reads()
    bs = int(an.layout.facts.block_size)
    return {
        name: float(get_model(name).service_ms(req.start * bs, req.length * bs).sum()) / 1000.0
        for name in MODELS
    }


def _snapshot(store: Any, layout: Layout, name: str, source: str, label: str) -> int:
    summary = store.add_snapshot(layout, name=name, source=source, label=label)
    return int(summary.snapshot_id)


def measure_step(
    m: Member,
    step: int,
    *,
    store: Any,
    fs_name: str,
    trace: bool,
    repeat: int,
    say: Say,
) -> dict[str, Any]:
    """Everything a study keeps about ``m`` after ``step`` (see the module doc)."""
    from fsage.replay.bench.scantree import copy_tree
    from fsage.snapshotter import read_source
    from fsage.study.rounds import final_decision

    t0 = time.perf_counter()
    times: dict[str, float] = {}
    m.make(m.clean_image)
    try:
        with contextlib.ExitStack() as stack:
            aged_mnt = stack.enter_context(m.mounted())
            t = time.perf_counter()
            layout = read_source(aged_mnt)
            snap = _snapshot(store, layout, fs_name, str(m.image), f"study step {step}")
            out, modeled_aged = layout_metrics(layout)
            times["snapshot"] = time.perf_counter() - t
            t = time.perf_counter()
            clean_mnt = stack.enter_context(m.mounted(m.clean_image, readonly=False))
            stats = copy_tree(aged_mnt, clean_mnt)
            os.sync()
            clean_layout = read_source(clean_mnt)
            clean_out, modeled_clean = layout_metrics(clean_layout)
            times["clean_copy"] = time.perf_counter() - t
        out["snapshot_id"] = snap
        out["clean_copy"] = {
            "files": stats.files,
            "dirs": stats.dirs,
            "bytes": stats.bytes,
            "layout_score": clean_out["layout_score"],
            "locality": clean_out["locality"],
        }
        out["modeled"] = {
            name: {
                "aged_seconds": modeled_aged[name],
                "clean_seconds": modeled_clean[name],
                "ratio": modeled_aged[name] / modeled_clean[name] if modeled_clean[name] else None,
            }
            for name in MODELS
        }
        t = time.perf_counter()
        out["scan"] = _scans(
            m, trace=trace, repeat=repeat, say=say, block_size=int(out["block_size"])
        )
        times["scan"] = time.perf_counter() - t
        d = final_decision(out["scan"]["aged_values"], out["scan"]["clean_values"], repeat)
        out["scan"].update(
            ratio=d.ratio,
            verdict=d.verdict,
            ci_low=d.low,
            ci_high=d.high,
            ci_confidence=d.confidence,
        )
    finally:
        m.clean_image.unlink(missing_ok=True)
    times["total"] = time.perf_counter() - t0
    out["seconds"] = times
    return out


def _scans(
    m: Member, *, trace: bool, repeat: int, say: Say, block_size: int | None = None
) -> dict[str, Any]:
    """The aged file system and its clean copy scanned alternately (each a cold path-order
    read), for the rounds :func:`fsage.study.rounds.stop_reason` asks.

    A kernel file system's two images are each attached to a read-only direct-I/O loop device
    once per step; every scan still unmounts, drops the caches and mounts again before reading.
    With ``trace`` the aged tree's first scan is traced (the layout it reads is the same in
    every round); the LFS's server records that scan's reads."""
    from fsage.study.rounds import stop_reason

    values: dict[str, list[float]] = {"aged": [], "clean": []}
    last: dict[str, ScanRead] = {}
    notes: list[str] = []
    tr: dict[str, Any] | None = None
    io: dict[str, list[dict[str, int]]] = {}
    with contextlib.ExitStack() as stack:
        scan = (
            _lfs_scanner(m, trace, notes, say, stack, io)
            if m.kind == "lfs"
            else _kernel_scanner(m, trace, notes, say, stack, block_size)
        )
        t0 = time.perf_counter()
        i = 0
        while (
            why := stop_reason(values["aged"], values["clean"], time.perf_counter() - t0, repeat)
        ) is None:
            order = ["aged", "clean"] if i % 2 == 0 else ["clean", "aged"]
            for side in order:
                r = scan(side, i)
                values[side].append(r.seconds)
                last[side] = r
                if side == "aged" and r.trace is not None:
                    tr = r.trace
            i += 1
    aged, clean = last["aged"], last["clean"]
    out: dict[str, Any] = {
        "aged_seconds": float(sorted(values["aged"])[len(values["aged"]) // 2]),
        "clean_seconds": float(sorted(values["clean"])[len(values["clean"]) // 2]),
        "aged_values": values["aged"],
        "clean_values": values["clean"],
        "bytes": int(aged.bytes),
        "files": int(aged.files),
        "clean_bytes": int(clean.bytes),
        "trace": None if tr is None else {k: tr.get(k) for k in _TRACE_KEYS if k in tr},
        "notes": notes,
        "rounds": i,
        "stopped": why,
    }
    if io:
        from fsage.replay.bench.target import can_drop_caches

        out["image_reads"] = io
        notes += cold_check(io, can_drop_caches())
    gib = out["bytes"] / 2**30
    out["aged_s_per_gib"] = out["aged_seconds"] / gib if gib else None
    out["clean_s_per_gib"] = out["clean_seconds"] / gib if gib else None
    return out


Scanner = Callable[[str, int], "ScanRead"]


def _kernel_scanner(
    m: Member,
    trace: bool,
    notes: list[str],
    say: Say,
    stack: contextlib.ExitStack,
    block_size: int | None,
) -> Scanner:
    """Scans of a kernel file system's images, each on a loop device attached once."""
    from fsage.ager.images import image_kind
    from fsage.replay.bench.scan import Tree, image_tree, scan_tree

    trees: dict[str, Tree] = {}
    for side, image in (("aged", m.image), ("clean", m.clean_image)):
        kind = image_kind(image) or m.kind
        trees[side], said = image_tree(image, kind, side, say, stack, block_size)
        notes += [n for n in said if n not in notes]
    if trace:
        from fsage.trace import resolve_device

        resolve_device(trees["aged"].device)  # said before any scan when it cannot be traced

    def scan(side: str, i: int) -> ScanRead:
        label = f"{m.kind}: scan {i + 1} of the {side} tree"
        traced = trace and side == "aged" and i == 0
        return scan_tree(trees[side], trace=traced, label=label, notes=notes, say=say)

    return scan


def _lfs_scanner(
    m: Member,
    trace: bool,
    notes: list[str],
    say: Say,
    stack: contextlib.ExitStack,
    io: dict[str, list[dict[str, int]]],
) -> Scanner:
    """Scans of the LFS and its copy, each side served by one server for all its rounds.

    A side's first round reads through a server just started (nothing of the image cached);
    before every later round the server is asked to drop its own caches (a control request,
    :mod:`fsage.lfs.control`) and the kernel's are dropped, so the round reads the image as
    the first did; the octets the server reads in each round (``io``) show whether it did.
    Starting a server per round (the image checked and opened each time) cost seconds a
    round. With ``trace`` the aged side's first round is recorded by its server."""
    import shutil
    import tempfile

    from fsage.lfs import blocktrace, control
    from fsage.lfs.blocktrace import score_file
    from fsage.replay.bench.scantree import evict_tree, read_tree
    from fsage.replay.bench.target import can_drop_caches, drop_caches

    sides = {"aged": m.image, "clean": m.clean_image}
    cold = can_drop_caches()
    if not cold:
        notes.append(
            "not root: files are advised out of the page cache, but directories and inodes "
            "may still be cached (a warm start for the metadata)"
        )
    # a short path: a Unix socket's name is at most 107 octets
    sockdir = Path(tempfile.mkdtemp(prefix="fsage-lfs-control-"))
    stack.callback(shutil.rmtree, sockdir, True)
    trace_file = m.image.with_suffix(".trace").resolve()
    servers: dict[str, tuple[Path, Path]] = {}

    def scan(side: str, i: int) -> ScanRead:
        image = sides[side]
        fresh = side not in servers
        if fresh:
            sock = sockdir / side
            env = {control.ENV: str(sock)}
            if trace and side == "aged":  # the server records the first round's reads
                env[blocktrace.ENV] = str(trace_file)
            servers[side] = (stack.enter_context(m.mounted(image, env=env)), sock)
        mnt, sock = servers[side]
        if not fresh:
            control.request(sock, "drop-caches")
        root = m.scan_target(image, mnt)
        if cold:
            drop_caches()
        else:
            evict_tree(root)
        before = control.request(sock, "io")["io"]
        r = read_tree(root)
        after = control.request(sock, "io")["io"]
        io.setdefault(side, []).append({k: after[k] - before[k] for k in after if k in before})
        if fresh and trace and side == "aged":
            control.request(sock, "stop-trace")
            r.trace = score_file(trace_file, image)
            trace_file.unlink()
        return r

    return scan


def cold_check(io: dict[str, list[dict[str, int]]], from_device: bool) -> list[str]:
    """Rounds that were not as cold as their side's first (a server just started): the server
    asked less of the image (``rchar``, its reads through the page cache or not), or, with
    ``from_device``, storage gave it less than it asked (``read_bytes``: the image's pages
    were still cached). Readahead makes ``read_bytes`` exceed ``rchar`` by varying amounts, so
    it is held against the round's own ``rchar``; a tenth is the tolerance."""
    out = []
    for side, rounds in io.items():
        first = rounds[0].get("rchar", 0) if rounds else 0
        for i, r in enumerate(rounds, start=1):
            asked, got = r.get("rchar", 0), r.get("read_bytes", 0)
            if i > 1 and asked < 0.9 * first:
                out.append(
                    f"round {i} of the {side} tree: the server read {asked / 2**20:.1f} MiB of "
                    f"the image, {first / 2**20:.1f} MiB in the first (a fresh server): not cold"
                )
            elif from_device and got < 0.9 * asked:
                out.append(
                    f"round {i} of the {side} tree: storage gave the server {got / 2**20:.1f} "
                    f"MiB of the {asked / 2**20:.1f} MiB it read: not cold"
                )
    return out


_TRACE_KEYS = (
    "score",
    "requests",
    "discontiguous",
    "blocks",
    "reread_blocks",
    "block_size",
    "tool",
)
