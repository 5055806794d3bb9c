"""The floor under a replay's time: its system calls alone, made by a small C program.

``fsage replay`` runs an op stream through its C executor, with Python around each op (the
replay loop, the op objects), the ops inferred from the snapshots in a thread, and the interval
ends. ``syscall_floor`` runs the same op stream (``fsage.replay.deltas.snapshot_deltas``, the
builder the replay uses, so the same ops in the same order) as bare system calls: the stream is
encoded into a flat file first (not timed), ``bench/syscall_floor.c`` is compiled with gcc, and
run on a fresh file system of the same geometry on a loop device, ending each interval as the
replay does. What the replay takes above this is what fsage adds.

    python3 bench/syscall_floor.py --history /dev/shm/hist/sqla-4k [--until ID] [--end remount]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fsage.replay.deltas import IntraDay, snapshot_deltas
from fsage.replay.loopdev import LoopDevice
from fsage.replay.recreate import make_filesystem
from fsage.workload import SPECIAL_KINDS, Op, symlink_target

#: The op kinds in the order of syscall_floor.c's enum.
FLOOR_KINDS = (
    *("create", "append", "overwrite", "truncate", "punch", "fallocate", "mkdir", "delete"),
    *("rename", "link", "symlink", "mknod", "fsync", "sync", "snapshot", "setattr"),
)
_SOURCE = Path(__file__).resolve().parent / "syscall_floor.c"


def compile_floor(dest_dir: Path) -> Path:
    """gcc -O2 syscall_floor.c into ``dest_dir``; the executable's path."""
    exe = dest_dir / "syscall_floor"
    if not exe.exists():
        proc = subprocess.run(
            ["gcc", "-O2", "-Wall", "-o", str(exe), str(_SOURCE)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if proc.returncode != 0:
            raise RuntimeError(f"compiling {_SOURCE}: {proc.stderr.strip()}")
    return exe


def _text(s: str) -> bytes:
    raw = os.fsencode(s)
    return struct.pack("<i", len(raw)) + raw + b"\0"


def encode(ops: list[Op]) -> bytes:
    """The op stream as syscall_floor.c reads it: the directory table (parent index, name),
    the number of snapshot markers, then one record per op (kind, directory of the path and
    of the destination, special-file kind, size, offset, the two last components, the
    symlink text, and the directories whose descriptors the op makes stale)."""
    ids: dict[str, int] = {}
    table: list[tuple[int, str]] = []

    def dir_id(path: str) -> int:
        if not path:
            return -1
        got = ids.get(path)
        if got is None:
            head, _, name = path.rpartition("/")
            parent = dir_id(head)
            got = ids[path] = len(table)
            table.append((parent, name))
        return got

    def stale(path: str) -> list[int]:
        if path not in ids:
            return []
        below = path + "/"
        return [i for p, i in ids.items() if p == path or p.startswith(below)]

    recs: list[bytes] = []
    marks = 0
    for op in ops:
        kind = FLOOR_KINDS.index(op.op)
        head, _, name = op.path.rpartition("/")
        d = dir_id(head) if op.path else -1
        d2, name2 = -1, ""
        if op.op in ("rename", "link"):
            head2, _, name2 = op.dest.rpartition("/")
            d2 = dir_id(head2)
        special = SPECIAL_KINDS.index(op.label) if op.op == "mknod" else 0
        size, offset = op.size, op.offset
        if op.op == "setattr":  # flags, the mode and the mtime where mknod and data ops put theirs
            special = (op.mode is not None) | (op.mtime_ns is not None) << 1
            size, offset = op.mode or 0, op.mtime_ns or 0
        text = symlink_target(op) if op.op == "symlink" else ""
        inval: list[int] = []
        if op.op in ("delete", "rename"):
            inval = stale(op.path) + (stale(op.dest) if op.op == "rename" else [])
        marks += op.op == "snapshot"
        recs.append(
            struct.pack("<iiiiqq", kind, d, d2, special, size, offset)
            + _text(name) + _text(name2) + _text(text)
            + struct.pack(f"<i{len(inval)}i", len(inval), *inval)
        )  # fmt: skip
    head = [struct.pack("<i", len(table))]
    head += [struct.pack("<i", parent) + _text(name) for parent, name in table]
    head.append(struct.pack("<i", marks))
    return b"".join(head + recs)


def replay_ops(db: Path, fs_name: str, until: str, intra: IntraDay | None = None) -> list[Op]:
    """The ops a replay of ``fs_name`` up to ``until`` runs, snapshot markers included."""
    from fsage.db.store import Store

    with Store.open(db, readonly=True) as store:
        _header, ops, _stats = snapshot_deltas(store, fs_name, until=until, intra=intra)
    return ops


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def syscall_floor(
    ops: list[Op],
    image_like: Path,
    end: str,
    tmp: Path,
    fstype: str = "ext4",
    *,
    keep_image: bool = False,
) -> dict[str, Any]:
    """Run ``ops`` as bare system calls on a fresh file system of ``image_like``'s geometry
    (``tmp/floor.img``, removed afterwards unless ``keep_image``; mkfs and the first mount not
    timed), each interval ended with ``end``: the program's own timings (wall, user, system
    for the ops, the interval ends and the final unmount), and ``seconds``/``cpu_seconds``,
    their sums."""
    from fsage.snapshotter import read_source

    exe = compile_floor(tmp)
    stream = tmp / "floor.ops"
    stream.write_bytes(encode(ops))
    img = tmp / "floor.img"
    make_filesystem(img, read_source(image_like))
    mnt = Path(tempfile.mkdtemp(prefix="fsage-floor-", dir=tmp))
    loop = LoopDevice(img, fstype)
    try:
        loop.mount(mnt)
        cpu0 = _children_cpu()
        proc = subprocess.run(
            [str(exe), str(stream), loop.dev, str(mnt), fstype, end],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        cpu = _children_cpu() - cpu0
        if proc.returncode != 0:
            raise RuntimeError(f"syscall_floor failed: {proc.stderr.strip()}")
        out: dict[str, Any] = json.loads(proc.stdout)
    finally:
        loop.umount(mnt)  # a no-op when the program unmounted it
        loop.detach()
        with contextlib.suppress(OSError):
            mnt.rmdir()
        if not keep_image:
            img.unlink(missing_ok=True)
        stream.unlink(missing_ok=True)
    parts = ("ops", "interval_ends", "final_unmount")
    out["seconds"] = sum(out[f"{p}_seconds"] for p in parts)
    out["cpu_seconds"] = sum(out[f"{p}_user"] + out[f"{p}_system"] for p in parts)
    out["process_cpu_seconds"] = cpu
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--history", type=Path, required=True, help="bench/replay_histories.py --out")
    ap.add_argument("--until", default=None, help="snapshot id (default: the last)")
    ap.add_argument("--end", default="remount", help="interval end: remount, sync, none...")
    args = ap.parse_args()
    info = json.loads((args.history / "history.json").read_text())
    until = args.until or str(info["snapshot_ids"][-1])
    ops = replay_ops(args.history / "h.db", info["name"], until)
    tmp = Path(tempfile.mkdtemp(prefix="fsage-floor-"))
    try:
        t0 = time.perf_counter()
        res = syscall_floor(ops, args.history / "orig.img", args.end, tmp)
        res["wall_with_setup"] = time.perf_counter() - t0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
