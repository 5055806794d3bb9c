"""The noise floor of a recreation: how far two runs of the original op stream land apart.

ext4's allocator is not deterministic (delayed allocation, per-CPU preallocation, the order
writeback reaches the blocks), so two runs of one workload on one kernel differ. The floor is
measured the way a user would by hand: the op stream inferred from the snapshots up to the
judged one (``fsage deltas``) is run ``runs`` times onto fresh file systems of the recorded
geometry, unmounted and mounted again at every snapshot marker (what ``fsage age --ops`` does,
and ``fsage replay``), and the runs are compared with each other
(``fsage.replay.fidelity.noise_between``). The runs go through the replay's own machinery
(``fsage.replay.recreate.run_op_stream``: one loop device for the whole run, remounted with
the system calls) and read each file system once, at its end; ``fsage age --ops`` ran
mount(8) and umount(8) and read and stored a snapshot at every marker.

The floor is measured at a snapshot: each run is compared with that snapshot too (what the
``original`` rule of a verdict judges the stream's bias by), and so is a plain copy of it (its
files written in one go onto an empty file system, ``fsage.replay.unaged``), the yardstick a
verdict places a recreation against; the copy's modeled cold path-order scan is kept as well
(``NoiseFloor.copy_scan``), the one the scan criterion of ``fsage.replay.fidelity_scan`` needs.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from fsage.errors import UsageError
from fsage.layout import Layout
from fsage.replay.deltas import snapshot_deltas
from fsage.replay.fidelity import SOUND_RUNS, NoiseFloor, noise_between
from fsage.replay.unaged import fresh_copy


def noise_floor(
    db: Path,
    fs_name: str,
    until: str | None = None,
    *,
    runs: int = SOUND_RUNS,
    mode: str = "auto",
    workdir: Path | None = None,
    echo: Callable[[str], None] | None = None,
    compare: bool = True,
    copy: bool = True,
) -> tuple[NoiseFloor, list[Layout]]:
    """Run the op stream of ``fs_name`` up to ``until`` ``runs`` times; the floor and the
    layouts the runs ended with. ``compare``: measure each run's distances to the snapshot;
    ``copy``: and a plain copy's. Nothing is left in ``workdir`` (default: a temporary
    directory)."""
    from fsage.db.store import Store
    from fsage.replay.recreate import make_filesystem, run_op_stream
    from fsage.snapshotter import read_source

    say = echo or (lambda s: None)
    if runs < 2:
        raise UsageError("a noise floor needs at least 2 runs")
    with Store.open(db) as store:
        header, ops, _stats = snapshot_deltas(store, fs_name, until=until)
        until_id = header.params["until"]
        first = store.load_layout(int(header.params["snapshots"][0]))
        original = store.load_layout(int(until_id)) if compare or copy else None
    if not first.facts.kind.startswith("ext") or not first.facts.mkfs.get("blocks_count"):
        raise UsageError(f"{fs_name}: the noise floor needs a recorded ext file system")
    base = Path(tempfile.mkdtemp(prefix="fsage-noise-", dir=workdir))
    layouts: list[Layout] = []
    try:
        for r in range(runs):
            image = base / f"run{r}.img"
            make_filesystem(image, first)
            say(f"fsage: noise run {r + 1}/{runs}: {len(ops)} ops onto {image}")
            counts = run_op_stream(image, ops, mode=mode, fstype=first.facts.kind)
            if counts.nospace or counts.failed:
                say(
                    f"fsage: noise run {r + 1}: {counts.nospace} ops skipped for lack of space, "
                    f"{counts.failed} failed (first: {counts.failed_examples[:1]})"
                )
            layouts.append(read_source(image))
            image.unlink()
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(base)
    note = f"{runs} runs of the op stream of {fs_name} up to snapshot {until_id} ({len(ops)} ops)"
    floor = noise_between(layouts, note)
    if original is not None and compare:
        floor.add_original(original, layouts, int(until_id))
    if original is not None and copy:
        say(f"fsage: a plain copy of snapshot {until_id}, the verdict's yardstick")
        floor.add_copy(original, fresh_copy(db, fs_name, str(until_id), workdir))
    return floor, layouts


__all__ = ["noise_floor"]
