"""`fsage demo`: the whole toolchain on a small embedded example, needing no root.

It makes an ext4 image from a seeded tree of lognormal/Pareto-sized files (seed 004's hFS
distribution), snapshots it, ages it with the ``mail`` preset (through the kernel when root with
loop devices, else offline through libext2fs) taking snapshots as it goes, and writes the HTML
report. Whole-file creates and deletes leave ext4 nearly as laid out as new (hfs-surge ended the
demo at layout score 0.999); files arriving side by side by small pieces, each writeback
allocating the pieces since the last, fragment it within the demo's time. The aging takes the
seeded files into its model, so its churn replaces them too. Everything lives in one working
directory that the demo marks as its own, so a second run replaces only what the first made.
"""

from __future__ import annotations

import collections
import random
import re
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fsage.ager.distributions import HFS_SURGE
from fsage.ager.patterns import PRESET_DOCS
from fsage.ager.profile import get_preset
from fsage.ager.run import AgeOptions, AgeResult, age
from fsage.db.store import SnapshotSummary, Store
from fsage.errors import FsageError, UnsafeTargetError
from fsage.private import private_file, private_mkdir, write_private_text
from fsage.reports import report_data_from_store, write_report
from fsage.snapshotter import read_source

MARKER = ".fsage-demo"
FILES_PER_DIR = 64  # seed 004: a new directory with probability 1/64
#: The preset that ages the demo (``fsage age --profile mail`` runs its mix on the files it makes).
AGING_PRESET = "mail"
_JOURNAL_OP = re.compile(rb'^\{"op": ?"([a-z]+)"', re.M)


@dataclass
class DemoResult:
    workdir: Path
    image: Path
    db: Path
    report: Path
    first: SnapshotSummary
    aging: AgeResult


def prepare_workdir(workdir: Path) -> None:
    """Create the demo directory, or reuse one an earlier demo made; refuse anything else."""
    if workdir.exists():
        if not workdir.is_dir():
            raise UnsafeTargetError(f"{workdir} exists and is not a directory")
        if any(workdir.iterdir()) and not (workdir / MARKER).exists():
            raise UnsafeTargetError(
                f"{workdir} is not empty and was not made by fsage demo; choose another --dir"
            )
    # Private (fsage.private): the image and everything beside it name the demo's files.
    private_mkdir(workdir, parents=True, exist_ok=True)
    write_private_text(workdir / MARKER, "made by fsage demo\n")


def make_tree(root: Path, files: int, seed: int) -> int:
    """A seeded tree of ``files`` files with hFS sizes; returns the bytes written."""
    rng = random.Random(seed)
    total = 0
    dirs = [root]
    for i in range(files):
        if rng.random() < 1 / FILES_PER_DIR:
            parent = rng.choice(dirs)
            new = parent / f"d{len(dirs):04d}"
            new.mkdir()
            dirs.append(new)
        size = HFS_SURGE.sample(rng, cap=8 << 20)
        path = rng.choice(dirs) / f"f{i:05d}"
        with open(path, "wb") as fh:
            fh.write(rng.randbytes(min(size, 4096)) * (size // 4096 + 1) if size else b"")
            fh.truncate(size)
        total += size
    return total


def make_image(image: Path, tree: Path, data_bytes: int) -> None:
    size_mib = max(32, int(data_bytes * 1.6) // (1 << 20) + 16)
    argv = ["mke2fs", "-q", "-F", "-t", "ext4", "-L", "fsage-demo", "-d", str(tree),
            str(image), f"{size_mib}M"]  # fmt: skip
    private_file(image)  # mke2fs keeps the mode of the file it writes into
    try:
        subprocess.run(argv, check=True, capture_output=True, text=True)
    except FileNotFoundError:
        raise FsageError("mke2fs not found: install e2fsprogs") from None
    except subprocess.CalledProcessError as exc:
        raise FsageError(f"mke2fs failed: {exc.stderr.strip()}") from None


def run_demo(
    workdir: Path,
    files: int = 3000,
    seed: int = 42,
    churn: float = 0.5,
    echo: Callable[[str], None] = print,
    progress: bool = False,
) -> DemoResult:
    prepare_workdir(workdir)
    image = workdir / "demo.img"
    db = workdir / "fsage.db"
    report = workdir / "report.html"
    for old in (image, db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
        old.unlink(missing_ok=True)
    (workdir / (image.name + ".fsage-age")).unlink(missing_ok=True)
    for journal in workdir.glob(image.name + ".fsage-age.*.ops.jsonl"):
        journal.unlink()  # the op streams an earlier demo's aging ran
    with tempfile.TemporaryDirectory(dir=workdir, prefix="tree-") as tmp:
        echo(f"making {files} files with hFS sizes (seed {seed})")
        data = make_tree(Path(tmp), files, seed)
        echo(f"making ext4 image {image} from {data / (1 << 20):.1f} MiB of files")
        make_image(image, Path(tmp), data)
    with Store.open(db, create=True) as store:
        first = store.add_snapshot(read_source(image), name="demo", source=str(image))
    echo(first.line())

    profile = get_preset(AGING_PRESET).with_overrides(fill=0.8, churn=churn, ops_limit=None)
    opts = AgeOptions(
        profile=profile, seed=seed, db=db, name="demo",
        snapshot_every=max(files * 3, 2000),  # ~6 snapshots at the default churn, any --files
        force=True,  # the image holds the files this demo just made
        adopt=True,  # ...and the aging deletes and replaces them too
        progress=progress,
    )  # fmt: skip
    echo(
        f"aging {image} to 80% full, then {churn}x its capacity of churn, with the "
        f"{AGING_PRESET} preset: {PRESET_DOCS[AGING_PRESET]}"
    )
    aged = age(image, opts, echo=echo)
    echo(
        f"aged: {aged.ops} ops ({op_counts(aged)}), {aged.bytes_written / (1 << 20):.0f} MiB "
        f"written, {aged.fullness:.0%} full, {len(aged.snapshots)} snapshots "
        f"({aged.description})"
    )
    with Store.open(db) as store:
        figures = write_report(report, report_data_from_store(store, "demo"))
    echo(f"wrote {report} ({figures} figures)")
    return DemoResult(workdir, image, db, report, first, aged)


def op_counts(aged: AgeResult) -> str:
    """The ops the aging ran, by kind, most first (from its journal: one op per line, its kind
    the first field)."""
    if aged.journal is None:
        return "no journal"
    kinds = _JOURNAL_OP.findall(Path(aged.journal).read_bytes())
    counts = sorted(collections.Counter(k.decode() for k in kinds).items(), key=lambda kv: -kv[1])
    return ", ".join(f"{n} {kind}" for kind, n in counts)


__all__ = ["AGING_PRESET", "DemoResult", "make_tree", "op_counts", "prepare_workdir", "run_demo"]
