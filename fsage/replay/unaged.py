"""The unaged control: a snapshot's files written in one go onto an empty file system of the
recorded geometry, with no history before them. A verdict that calls this faithful cannot tell
an aged recreation from a fresh copy; ``fsage noise-floor`` records this plain copy's distances
to the snapshot, and the verdict places a recreation between a rerun of its op stream (0) and
the copy (1), failing whenever its tolerances would pass the copy (``fsage.replay.verdict``;
``bench/verdict.py`` checks it on real histories).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path

from fsage.layout import Layout
from fsage.replay.deltas import DeltaBuilder, history, make_header, to_ns
from fsage.workload import write_workload


def fresh_copy(db: Path, fs_name: str, until: str | None, workdir: Path | None = None) -> Layout:
    """The layout of snapshot ``until`` of ``fs_name`` (default: the latest) created fresh by
    ``fsage age --ops`` (one interval from an empty file system) on a file system made with
    the recorded mkfs parameters. Nothing is left in ``workdir``."""
    from fsage.ager.run import AgeOptions, age
    from fsage.db.store import Store
    from fsage.replay.recreate import make_filesystem
    from fsage.snapshotter import read_source

    with Store.open(db) as store:
        chain, _ = history(store, fs_name, until)
        first = store.load_layout(chain[0].id)
        final = store.load_layout(chain[-1].id)
    builder = DeltaBuilder()
    ops = builder.interval(None, final, start_ns=None, end_ns=to_ns(chain[-1].taken_at))
    header = make_header(fs_name, None, [chain[-1]], builder, None, "first")
    base = Path(tempfile.mkdtemp(prefix="fsage-fresh-", dir=workdir))
    try:
        ops_file, image = base / "ops.jsonl", base / "fresh.img"
        write_workload(ops_file, header, ops)
        make_filesystem(image, first)
        age(image, AgeOptions(ops_file=ops_file, db=base / "fresh.db", name="fresh", force=True))
        return read_source(image)
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(base)


__all__ = ["fresh_copy"]
