"""Damaged images through the mount: refused in one line, or mounted read-only with --force,
never wrong data and never a traceback.

The corpus: an image with files of every size class in nested directories, then copies of it
with bytes flipped, zeroed or overwritten in one metadata area each: the newest checkpoint's
head, its segment usage table, segment summaries, the inode map, inode table and inode vector
blocks, and directory blocks. Each copy is mounted as a user would (``fsage lfs mount``), then
with ``--force``. Oracles: the test's own record of every file's content and of the tree, the
kernel's answers, and ``cmp`` of the image before and after a read-only mount.

* refused: exit status not 0, one line on stderr, no "Traceback";
* mounted without --force: every file reads back as written (the damage was where nothing
  live is), the tree lists exactly the recorded names;
* mounted with --force: read-only (a write gets EROFS, or EIO where the directory it would
  go in is damaged), the image unchanged after unmount;
  every read gives the recorded bytes or fails (EIO...), never other bytes.

``bench/lfs_damage.py`` runs a larger corpus and prints the counts.
"""

from __future__ import annotations

import errno
import os
import random
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from fsage.lfs import format as fmt
from fsage.lfs import lfs_pb2
from fsage.lfs.fs import LFS, mkfs
from fsage.lfs.mount import fuse_available
from tests.lfs.test_mount_checks import _wait_gone

REPO = Path(__file__).resolve().parents[2]
AREAS = (
    "checkpoint",
    "usage table",
    "summaries",
    "inode map",
    "inode table",
    "inode vector",
    "directories",
)


def build(path: Path, seed: int = 1) -> dict[str, bytes]:
    """The base image; returns every file's path and content."""
    mkfs(path, size=8 << 20, blocks_per_segment=32, block_size=1024)
    rng = random.Random(seed)
    files: dict[str, bytes] = {}
    with LFS.open(path) as fs:
        for d in ("d", "d/e", "f"):
            fs.mkdir(d)
        for i in range(60):
            name = f"{rng.choice(['', 'd/', 'd/e/', 'f/'])}file{i:03d}"
            data = rng.randbytes(rng.choice((30, 900, 9000, 200_000)))
            fs.create(name)
            fs.write(name, 0, data)
            files[name] = data
        for name in rng.sample(sorted(files), 10):  # some dead blocks in the log
            fs.unlink(name)
            del files[name]
    return files


def areas(path: Path) -> dict[str, list[tuple[int, int]]]:
    """(offset, length) of the live copy of each metadata area."""
    with LFS.open(path, readonly=True) as fs:
        geo, bs = fs.geo, fs.geo.block_size
        start, _ = fmt.checkpoint_region(geo, fs.cp_which)
        cp, why = fmt.read_checkpoint(fs.fd, geo, fs.cp_which)
        assert cp is not None, why
        head = lfs_pb2.Checkpoint()
        head.CopyFrom(cp)
        del head.segusage[:]
        head_len = 4 + len(head.SerializeToString())
        table_len = len(cp.SerializeToString()) - (head_len - 4)
        out: dict[str, list[tuple[int, int]]] = {
            "checkpoint": [(start, head_len)],
            "usage table": [(start + head_len, table_len)],
            "summaries": [
                (geo.seg_offset(s) + geo.data_blocks_per_segment * bs, geo.summary_blocks * bs)
                for s in range(geo.first_log_segment, geo.segments)
                if fs.live[s]
            ],
            "directories": [],
        }
        for name, ino in (
            ("inode map", fmt.INO_INOMAP),
            ("inode table", fmt.INO_INOTBL),
            ("inode vector", fmt.INO_INOVEC),
        ):
            out[name] = [(geo.addr_offset(a), bs) for a, _, _ in fs.file_blocks(ino)]
        for ino in fs.inodes():
            if fs.is_dir(ino):
                out["directories"] += [(geo.addr_offset(a), bs) for a, _, _ in fs.file_blocks(ino)]
    return {k: v for k, v in out.items() if v}


def mutate(raw: bytes, spans: list[tuple[int, int]], rng: random.Random) -> bytes:
    """A copy of ``raw`` with one span flipped, zeroed or overwritten in part."""
    data = bytearray(raw)
    off, n = rng.choice(spans)
    kind = rng.randrange(3)
    if kind == 0:
        for _ in range(rng.randint(1, 8)):
            data[off + rng.randrange(n)] ^= 1 << rng.randrange(8)
    elif kind == 1:
        a = off + rng.randrange(n)
        b = min(off + n, a + rng.randint(1, 64))
        data[a:b] = bytes(b - a)
    else:
        a = off + rng.randrange(n)
        b = min(off + n, a + rng.randint(4, 64))
        data[a:b] = rng.randbytes(b - a)
    return bytes(data)


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(REPO))


def _unmount(mp: Path, pid: int) -> None:
    subprocess.run(["fusermount3", "-u", str(mp)], check=False, timeout=30)
    _wait_gone(pid)


def _tree(mp: Path) -> set[str]:
    return {str(p.relative_to(mp)) for p in mp.rglob("*") if not p.is_dir()}


def check_one(img: Path, mp: Path, files: dict[str, bytes], force: bool) -> tuple[str, str]:
    """Mount ``img`` (with ``--force`` or not) and judge it: (outcome, detail). Outcomes:
    refused, same, errors (reads that failed, none wrong), wrong, traceback."""
    args = ["--force"] if force else []
    out = subprocess.run(
        [sys.executable, "-m", "fsage", "lfs", "mount", str(img), str(mp), *args],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    if "Traceback" in out.stderr or "Traceback" in out.stdout:
        return "traceback", out.stderr[-300:]
    if out.returncode != 0:
        lines = out.stderr.strip().splitlines()
        if len(lines) != 1:
            return "traceback", f"{len(lines)} lines: {out.stderr[-300:]}"
        return "refused", lines[0]
    m = re.search(r"\(pid (\d+)\)", out.stdout)
    assert m, out.stdout
    pid = int(m.group(1))
    before = img.read_bytes() if force else b""
    outcome, detail = "same", ""
    try:
        try:
            shown = _tree(mp)
        except OSError as exc:
            shown, outcome, detail = set(), "errors", f"listing: {exc.strerror}"
        if outcome == "same" and shown != set(files) and not force:
            outcome, detail = "wrong", f"tree differs: {sorted(shown ^ set(files))[:3]}"
        for name in sorted(set(files) & shown):
            try:
                got = (mp / name).read_bytes()
            except OSError as exc:
                if outcome == "same":
                    outcome, detail = "errors", f"{name}: {exc.strerror}"
                continue
            if got != files[name]:
                outcome, detail = "wrong", f"{name}: {len(got)} octets read, {len(files[name])}"
                break
        if force and "read-only" in out.stderr:
            try:
                (mp / "new-file").write_bytes(b"x")
                outcome, detail = "wrong", "a write to a read-only mount succeeded"
            except OSError as exc:
                # EIO: the kernel looks the new name up before it refuses the write, and the
                # lookup in a damaged directory fails
                if exc.errno not in (errno.EROFS, errno.EIO):
                    outcome, detail = "wrong", f"a write gave {exc.strerror}, not EROFS"
        elif force and outcome == "same" and shown != set(files):
            outcome, detail = "wrong", f"tree differs: {sorted(shown ^ set(files))[:3]}"
    finally:
        _unmount(mp, pid)
    if force and "read-only" in out.stderr and img.read_bytes() != before:
        return "wrong", "a read-only mount changed the image"
    return outcome, detail


def run_corpus(
    work: Path, per_area: int, seed: int = 7, say: object = None
) -> tuple[Counter[tuple[str, str, str]], list[str]]:
    """Mutants of every area, each mounted plain and with --force: counts by (area, mode,
    outcome), and the details of every wrong or traceback outcome."""
    base = work / "base.img"
    files = build(base)
    spans = areas(base)
    raw = base.read_bytes()
    rng = random.Random(seed)
    img, mp = work / "m.img", work / "mnt"
    mp.mkdir(exist_ok=True)
    counts: Counter[tuple[str, str, str]] = Counter()
    bad: list[str] = []
    for area in AREAS:
        for k in range(per_area):
            img.write_bytes(mutate(raw, spans[area], rng))
            for force in (False, True):
                mode = "--force" if force else "plain"
                outcome, detail = check_one(img, mp, files, force)
                counts[(area, mode, outcome)] += 1
                if outcome in ("wrong", "traceback"):
                    bad.append(f"{area} #{k} {mode}: {outcome}: {detail}")
                if callable(say):
                    say(f"{area} #{k} {mode}: {outcome} {detail[:100]}")
    img.unlink(missing_ok=True)
    base.unlink(missing_ok=True)
    return counts, bad


def test_areas_cover_every_kind(tmp_path: Path) -> None:
    img = tmp_path / "b.img"
    build(img)
    got = areas(img)
    assert set(got) == set(AREAS)
    with open(img, "rb") as f:  # the checkpoint head is a valid length prefix
        off, n = got["checkpoint"][0]
        f.seek(off)
        body = int.from_bytes(f.read(4), "big")
    assert body == n - 4 + got["usage table"][0][1]


@pytest.mark.slow
@pytest.mark.skipif(fuse_available() is not None, reason=f"no FUSE here: {fuse_available()}")
def test_damaged_images_are_refused_or_read_right_through_the_mount(tmp_path: Path) -> None:
    counts, bad = run_corpus(tmp_path, per_area=1)
    assert not bad, bad[:5]
    assert sum(counts.values()) == 2 * len(AREAS)
    assert sum(v for (_, _, o), v in counts.items() if o == "refused") > 0


def test_a_garbled_name_is_found_not_shown(tmp_path: Path) -> None:
    """A byte changed inside a name leaves a valid directory file naming another file: the
    directory's checksum (kept in the inode vector) finds it, and fsck names the directory."""
    from fsage.lfs.fsck import fsck

    img = tmp_path / "n.img"
    files = build(img)
    name = next(n for n in sorted(files) if n.startswith("d/file"))
    raw = bytearray(img.read_bytes())
    spans = areas(img)["directories"]
    needle = name.rsplit("/", 1)[1].encode()
    hits = [off + i for off, n in spans for i in [raw[off : off + n].find(needle)] if i >= 0]
    assert hits, "the name is in a directory block"
    raw[hits[0] + len(needle) - 1] ^= 0x10  # "file006" -> "file00&": still valid UTF-8
    img.write_bytes(bytes(raw))
    rep = fsck(img)
    assert any("checksum" in p for p in rep.problems), rep.problems


@pytest.mark.skipif(fuse_available() is not None, reason=f"no FUSE here: {fuse_available()}")
def test_a_time_past_2262_is_damage_and_still_lists(tmp_path: Path) -> None:
    """A garbled time that no 64-bit count of nanoseconds holds: fsck names it (the image
    mounted as healthy and every listing of its directory failed with EIO), and a --force
    mount lists the tree and reads every file."""
    from fsage.lfs.fsck import fsck

    img, mp = tmp_path / "t.img", tmp_path / "mnt"
    files = build(img)
    name = sorted(files)[0]
    with LFS.open(img) as fs:
        fs.setattr(name, mtime_ms=10_591_934_021_984)  # a flipped high byte: year 2305
    rep = fsck(img)
    assert any("mtime" in p and "2262" in p for p in rep.problems), rep.problems
    mp.mkdir()
    outcome, detail = check_one(img, mp, files, force=True)
    assert outcome == "same", detail
