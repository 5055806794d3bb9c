"""Mutation test of the ext reader: corrupted metadata never yields a wrong healthy file.

A few hundred mutants of small ext2 and ext4 images (with and without metadata checksums) are
made by corrupting one metadata area each: the superblock, the group descriptors, the inode
table (used inodes), extent-tree blocks, indirect blocks and directory blocks; bits flipped,
words set to random or boundary values, ranges zeroed or filled. Each mutant is read by
``read_source`` in its own process, which must end in one of three ways: refused with an
FsageError, recorded with its damage counted, or recorded clean; never a traceback, a crash
or a hang. Every file recorded healthy must have exactly the blocks (data and mapping blocks)
that debugfs lists for its inode. Run directly (``python3 tests/snapshotter/test_ext_mutants.py``)
it prints the counts.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import select
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
sys.path.insert(0, str(TESTS))

from images import TreeSpec, build_tree, dumpe2fs_header, make_ext_image  # noqa: E402

MUTANTS_PER_IMAGE = 80  # x 4 images
TIMEOUT = 60.0

# Reads one image; prints one JSON line. A traceback goes to stderr and exits non-zero.
# Reads the images named on its standard input, one JSON line out per image. A traceback
# goes to stderr and ends the process (the parent records it and starts another).
WORKER = r"""
import json, sys
from fsage.errors import FsageError
from fsage.snapshotter import read_source
for line in sys.stdin:
    try:
        layout = read_source(line.rstrip("\n"))
    except FsageError as exc:
        print(json.dumps({"outcome": "refused", "error": str(exc)}), flush=True)
        continue
    f = layout.files
    healthy = {}
    for i, ino in enumerate(f.ino.tolist()):
        if f.damaged[i] or f.mode[i] & 0o170000 not in (0o100000, 0o040000):
            continue  # symlinks: debugfs lists a fast symlink's target as if it were blocks
        a, b = int(f.ext_off[i]), int(f.ext_off[i + 1])
        blocks = []
        for ph, n in zip(f.ext_physical[a:b].tolist(), f.ext_length[a:b].tolist()):
            blocks.extend(range(ph, ph + n))
        m, k = int(f.meta_off[i]), int(f.meta_off[i + 1])
        for ph, kind in zip(f.meta_physical[m:k].tolist(), f.meta_kind[m:k].tolist()):
            if kind in (1, 2, 3, 4):  # extent-tree and indirect blocks; not xattr blocks
                blocks.append(ph)
        healthy[ino] = sorted(blocks)
    outcome = "damaged" if layout.damaged_files else "clean"
    print(json.dumps({"outcome": outcome, "healthy": healthy}), flush=True)
"""


class Worker:
    """A long-lived reader process; replaced after a traceback, a crash or a hang."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[str] | None = None

    def _start(self) -> subprocess.Popen[str]:
        env = dict(os.environ, PYTHONPATH=str(REPO), FSAGE_SCAN_THREADS="1")
        return subprocess.Popen(
            [sys.executable, "-c", WORKER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )

    def read(self, image: Path) -> tuple[str, str]:
        """("ok", json line) or (traceback|crash|hang|stderr, detail)."""
        if self.proc is None or self.proc.poll() is not None:
            self.proc = self._start()
        proc = self.proc
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        proc.stdin.write(f"{image}\n")
        proc.stdin.flush()
        ready, _, _ = select.select([proc.stdout, proc.stderr], [], [], TIMEOUT)
        if not ready:
            proc.kill()
            proc.wait()
            self.proc = None
            return "hang", ""
        if proc.stdout in ready:
            line = proc.stdout.readline()
            if line:
                return "ok", line
        # stderr first, or stdout closed: the process said something or died
        with contextlib.suppress(OSError):
            proc.stdin.close()
        try:
            err = proc.stderr.read()
            code = proc.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            self.proc = None
            return "stderr", "(no end)"
        self.proc = None
        if code < 0:
            return "crash", f"signal {-code}"
        return ("traceback" if "Traceback" in err else "stderr"), err[-2000:]

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()


@dataclass
class Base:
    name: str
    image: bytes
    block_size: int
    regions: dict[str, list[tuple[int, int]]]  # area -> (offset, length) byte ranges


def _debugfs_script(image: Path, commands: list[str], nocsum: bool = False) -> dict[str, str]:
    """Run debugfs commands in one process; each command's output (and errors) by command."""
    out = subprocess.run(
        ["debugfs", *(["-n"] if nocsum else []), "-f", "-", str(image)],
        input="".join(c + "\n" for c in commands),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        timeout=TIMEOUT,
    ).stdout
    parts = re.split(r"^debugfs: (.*)\n", out, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def _regions(image: Path, block_size: int) -> dict[str, list[tuple[int, int]]]:
    hdr = dumpe2fs_header(image)
    first = int(hdr["First block"])
    groups = -(-int(hdr["Block count"]) // int(hdr["Blocks per group"]))
    desc = int(hdr.get("Group descriptor size", "32"))
    inode_size = int(hdr["Inode size"])
    regions: dict[str, list[tuple[int, int]]] = {
        "superblock": [(1024, 256)],
        "group descriptors": [((first + 1) * block_size, groups * desc)],
    }
    inos = {2}
    todo = [2]
    while todo:  # every inode reachable from the root
        listing = _debugfs_script(image, [f"ls -p <{d}>" for d in todo])
        todo = []
        for text in listing.values():
            for line in text.splitlines():
                parts = line.split("/")
                if len(parts) < 7 or parts[5] in (".", ".."):
                    continue
                ino, mode = int(parts[1]), int(parts[2], 8)
                if ino not in inos:
                    inos.add(ino)
                    if mode & 0o170000 == 0o040000:
                        todo.append(ino)
    cmds = [f"{c} <{i}>" for i in sorted(inos) for c in ("imap", "stat", "blocks")]
    info = _debugfs_script(image, cmds)
    table, etb, ind, dirblocks = [], [], [], []
    for ino in sorted(inos):
        m = re.search(r"located at block (\d+), offset (0x[0-9a-f]+)", info[f"imap <{ino}>"])
        if m:
            table.append((int(m.group(1)) * block_size + int(m.group(2), 16), inode_size))
        text = info[f"stat <{ino}>"]
        etb += [(int(b) * block_size, block_size) for b in re.findall(r"\(ETB\d+\):(\d+)", text)]
        ind += [
            (int(b) * block_size, block_size) for b in re.findall(r"\((?:D|T)?IND\):(\d+)", text)
        ]
        if "Type: directory" in text:
            blocks = info[f"blocks <{ino}>"].split()
            dirblocks += [(int(b) * block_size, block_size) for b in blocks]
    regions["inode table"] = table
    if etb:
        regions["extent blocks"] = etb
    if ind:
        regions["indirect blocks"] = ind
    regions["directories"] = dirblocks
    return regions


def _base(tmp: Path, name: str, fstype: str, features: list[str]) -> Base:
    spec = TreeSpec(
        files=40,
        dirs=6,
        sparse={"holes": (400 * 1024, [(i * 8192, 1024) for i in range(40)])},
        big={"one": 300 * 1024},
    )
    tree = build_tree(tmp / f"tree-{name}", 11, spec)
    image = make_ext_image(
        tmp, fstype, block_size=1024, features=features, tree=tree, size="8M", name=name
    )
    return Base(name, image.read_bytes(), 1024, _regions(image, 1024))


def _mutate(base: Base, rng: random.Random) -> tuple[bytes, str]:
    area = rng.choice(sorted(base.regions))
    off, length = rng.choice(base.regions[area])
    data = bytearray(base.image)
    kind = rng.choice(["flip", "word", "boundary", "zero", "fill"])
    if kind == "flip":
        for _ in range(rng.randint(1, 4)):
            data[off + rng.randrange(length)] ^= 1 << rng.randrange(8)
    elif kind in ("word", "boundary"):
        at = off + rng.randrange(max(1, length // 4)) * 4
        if kind == "word":
            value = rng.getrandbits(32)
        else:
            value = rng.choice([0, 1, 2, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF, 8192, 8193, 65536])
        data[at : at + 4] = value.to_bytes(4, "little")
    else:
        start = off + rng.randrange(length)
        n = min(rng.choice([4, 16, 64, 256, length]), off + length - start)
        data[start : start + n] = (b"\0" if kind == "zero" else b"\xff") * n
    return bytes(data), f"{base.name}: {area}: {kind}"


_FSCK_BLOCKS = re.compile(
    r"^(?:Inode (\d+)(?:,| has| block| extent| logical| end of| i_blocks| i_size| is)"
    r"|.*[Mm]ultiply-claimed block\(s\) in inode (\d+))",
    re.M,
)
_FSCK_ABOUT_BLOCKS = ("block", "extent", "i_size", "i_blocks")


def _e2fsck_block_problems(image: Path) -> set[int]:
    """Inodes whose blocks, extents, size or block count e2fsck -fn finds wrong."""
    out = subprocess.run(
        ["e2fsck", "-fn", str(image)],
        capture_output=True,
        text=True,
        errors="replace",
        timeout=TIMEOUT,
    ).stdout
    found = set()
    for line in out.splitlines():
        m = _FSCK_BLOCKS.match(line)
        if m and any(w in line for w in _FSCK_ABOUT_BLOCKS):
            found.add(int(m.group(1) or m.group(2)))
    return found


def _debugfs_blocks(image: Path, inos: list[int]) -> dict[int, list[int]] | None:
    """The blocks debugfs lists per inode (checksums not verified), None if it cannot open."""
    out = _debugfs_script(image, [f"blocks <{i}>" for i in inos], nocsum=True)
    if any("Filesystem not open" in body for body in out.values()):
        return None
    return {
        int(cmd[8:-1]): sorted(int(b) for b in body.split() if b.isdigit())
        for cmd, body in out.items()
    }


@dataclass
class Result:
    what: str
    outcome: str  # refused, damaged, clean, traceback, crash, hang
    detail: str = ""
    wrong: int = 0  # healthy files whose blocks disagree with debugfs
    unverified: int = 0  # healthy files of a mutant debugfs cannot open
    fsck: int = 0  # healthy files in which e2fsck finds a problem with their blocks


def _run_one(worker: Worker, data: bytes, what: str, workdir: Path, k: int) -> Result:
    image = workdir / f"m{k}.img"
    image.write_bytes(data)
    try:
        status, text = worker.read(image)
        if status != "ok":
            return Result(what, status, text)
        res = json.loads(text)
        if res["outcome"] == "refused":
            return Result(what, "refused", res["error"])
        healthy = {int(k): v for k, v in res["healthy"].items()}
        truth = _debugfs_blocks(image, sorted(healthy))
        if truth is None:
            return Result(what, res["outcome"], "debugfs cannot open it", unverified=len(healthy))
        wrong = [i for i in healthy if truth.get(i) != healthy[i]]
        detail = "; ".join(f"<{i}> {healthy[i][:6]} vs {truth.get(i, [])[:6]}" for i in wrong[:3])
        fsck = sorted(_e2fsck_block_problems(image) & set(healthy))
        if fsck:
            detail += f" e2fsck: block problems in healthy {fsck[:5]}"
        keep = os.environ.get("FSAGE_KEEP_MUTANTS")
        if keep and (fsck or wrong):  # for a closer look: debugfs, e2fsck -fn
            shutil.copyfile(image, Path(keep) / image.name)
        return Result(what, res["outcome"], detail, len(wrong), fsck=len(fsck))
    finally:
        image.unlink()


def run_mutants(per_image: int = MUTANTS_PER_IMAGE, seed: int = 13) -> list[Result]:
    with tempfile.TemporaryDirectory(prefix="fsage-mutants-") as tmp:
        work = Path(tmp)
        bases = [
            _base(work, "ext4.img", "ext4", []),
            _base(work, "ext4-nocsum.img", "ext4", ["^metadata_csum"]),
            _base(work, "ext3.img", "ext3", []),
            _base(work, "ext2.img", "ext2", []),
        ]
        rng = random.Random(seed)
        jobs = [_mutate(b, rng) for b in bases for _ in range(per_image)]
        workers = [Worker(), Worker()]
        try:
            with ThreadPoolExecutor(max_workers=len(workers)) as pool:
                futures = [
                    pool.submit(_run_slice, workers[w], jobs[w :: len(workers)], work, w)
                    for w in range(len(workers))
                ]
                return [r for f in futures for r in f.result()]
        finally:
            for w in workers:
                w.close()


def _run_slice(worker: Worker, jobs: list[tuple[bytes, str]], work: Path, w: int) -> list[Result]:
    return [
        _run_one(worker, data, what, work, w * 100000 + k) for k, (data, what) in enumerate(jobs)
    ]


def summary(results: list[Result]) -> dict[str, int]:
    counts = Counter(r.outcome for r in results)
    return {
        "mutants": len(results),
        "refused": counts["refused"],
        "recorded with damage": counts["damaged"],
        "recorded clean": counts["clean"],
        "tracebacks": counts["traceback"],
        "crashes": counts["crash"],
        "hangs": counts["hang"],
        "stray stderr": counts["stderr"],
        "healthy files with wrong blocks": sum(r.wrong for r in results),
        "healthy files debugfs cannot check": sum(r.unverified for r in results),
        "healthy files with e2fsck block problems": sum(r.fsck for r in results),
    }


@pytest.fixture(scope="module")
def results() -> Iterator[list[Result]]:
    for tool in ("mke2fs", "debugfs", "dumpe2fs"):
        if subprocess.run(["which", tool], capture_output=True).returncode != 0:
            pytest.skip(f"needs {tool}")
    yield run_mutants()


@pytest.mark.slow
def test_mutants_end_cleanly(results: list[Result]) -> None:
    bad = [r for r in results if r.outcome in ("traceback", "crash", "hang", "stderr")]
    assert not bad, [(r.what, r.outcome, r.detail) for r in bad[:5]]
    counts = summary(results)
    assert counts["mutants"] >= 300
    assert counts["refused"] and counts["recorded with damage"]  # the mutations do bite


@pytest.mark.slow
def test_no_healthy_file_disagrees_with_debugfs_or_e2fsck(results: list[Result]) -> None:
    wrong = [r for r in results if r.wrong or r.fsck or r.unverified]
    assert not wrong, [(r.what, r.detail) for r in wrong[:5]]


if __name__ == "__main__":
    all_results = run_mutants(int(sys.argv[1]) if len(sys.argv) > 1 else MUTANTS_PER_IMAGE)
    for r in all_results:
        if r.outcome in ("traceback", "crash", "hang", "stderr") or r.wrong or r.fsck:
            print(r.what, r.outcome, r.wrong, r.detail[:800])
    print(json.dumps(summary(all_results), indent=1))
    by_area = Counter((r.what.split(": ")[1], r.outcome) for r in all_results)
    for key in sorted(by_area):
        print(key, by_area[key])
