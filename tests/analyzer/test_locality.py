"""Locality between files on generated ext4 images, against debugfs and dumpe2fs: the gaps
between neighbouring files of a directory, each directory's own scan and each subtree's scan
(modeled dynamic layout score), the same whether the image is read offline or live through
its mount."""

from __future__ import annotations

import itertools
import os
import random
import re
import shutil
import statistics
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from fsage.analyzer.analysis import SnapshotAnalyzer
from fsage.analyzer.dynamic import INODE_READAHEAD_BLOCKS

from .images import need

MIB = 1 << 20


@dataclass
class Node:
    """One inode as debugfs shows it."""

    ino: int
    is_dir: bool
    extents: list[tuple[int, int, int]] = field(default_factory=list)  # logical, physical, n
    tree_blocks: list[int] = field(default_factory=list)  # extent-tree blocks
    children: dict[bytes, int] = field(default_factory=dict)  # directories: name -> ino


def _debugfs(img: Path, cmds: list[str]) -> list[str]:
    """The output of each command, run in one debugfs."""
    script = img.with_suffix(".cmds")
    script.write_text("\n".join(cmds) + "\n")
    out = subprocess.run(
        ["debugfs", "-f", str(script), str(img)], check=True, capture_output=True, text=True
    ).stdout
    parts = re.split(r"^debugfs: .*\n", out, flags=re.M)[1:]
    assert len(parts) == len(cmds)
    return parts


def _tree(img: Path) -> dict[int, Node]:
    """Every directory and regular file reachable from the root, with its blocks."""
    nodes = {2: Node(2, True)}
    paths = {2: "/"}
    level = [2]
    while level:
        outs = _debugfs(img, [f"ls -p {paths[d]}" for d in level])
        nxt = []
        for d, out in zip(level, outs, strict=True):
            for ino_s, mode_s, name in re.findall(r"^/(\d+)/(\d+)/\d+/\d+/(.*)/\d*/$", out, re.M):
                if name in (".", ".."):
                    continue
                ino, mode = int(ino_s), int(mode_s, 8)
                if mode & 0o170000 not in (0o040000, 0o100000):
                    continue
                nodes[d].children[name.encode()] = ino
                if ino not in nodes:
                    nodes[ino] = Node(ino, mode & 0o170000 == 0o040000)
                    paths[ino] = paths[d].rstrip("/") + "/" + name
                    if nodes[ino].is_dir:
                        nxt.append(ino)
        level = nxt
    inos = sorted(nodes)
    for ino, out in zip(inos, _debugfs(img, [f"stat <{i}>" for i in inos]), strict=True):
        text = out.split("EXTENTS:", 1)[1] if "EXTENTS:" in out else ""
        for kind, _end, p, q in re.findall(r"\((ETB\d+|\d+)(?:-(\d+))?\):(\d+)(?:-(\d+))?", text):
            if kind.startswith("ETB"):
                nodes[ino].tree_blocks.append(int(p))
            else:
                n = int(q) - int(p) + 1 if q else 1
                nodes[ino].extents.append((int(kind), int(p), n))
        nodes[ino].extents.sort()
    return nodes


@dataclass
class Geometry:
    block_size: int
    blocks_per_group: int
    inodes_per_group: int
    inode_size: int
    inode_tables: list[int]


def _geometry(img: Path) -> Geometry:
    out = subprocess.run(["dumpe2fs", str(img)], check=True, capture_output=True, text=True).stdout

    def num(label: str) -> int:
        m = re.search(rf"^{label}:\s+(\d+)", out, re.M)
        assert m, label
        return int(m.group(1))

    return Geometry(
        num("Block size"),
        num("Blocks per group"),
        num("Inodes per group"),
        num("Inode size"),
        [int(t) for t in re.findall(r"Inode table at (\d+)-", out)],
    )


def _pairs(nodes: dict[int, Node]) -> list[tuple[int, int]]:
    """(directory, gap in blocks) of consecutive regular files with blocks, by name."""
    out = []
    for d in nodes.values():
        files = [
            nodes[i]
            for _, i in sorted(d.children.items())
            if not nodes[i].is_dir and nodes[i].extents
        ]
        for a, b in itertools.pairwise(files):
            last = a.extents[-1][1] + a.extents[-1][2] - 1
            out.append((d.ino, b.extents[0][1] - last - 1))
    return out


def _bucket(gap: int, g: Geometry) -> str:
    d = abs(gap) * g.block_size
    if gap == 0:
        return "adjacent"
    if d <= MIB:
        return "le_1mib"
    return "le_group" if d <= g.blocks_per_group * g.block_size else "farther"


def _scan_score(objs: list[Node], nodes: dict[int, Node], g: Geometry) -> float:
    """A cold read of ``objs`` in order, each: its inode-table readahead window (aligned
    blocks, up to the group's last block holding an inode in use; once per scan), its
    extent-tree blocks, its data in logical order. 1 - requests that seek / blocks read."""
    per_block = g.block_size // g.inode_size
    top: dict[int, int] = {}
    for i in [*nodes, 11]:
        grp = (i - 1) // g.inodes_per_group
        top[grp] = max(top.get(grp, 0), (i - 1) % g.inodes_per_group)
    reqs: list[tuple[int, int]] = []
    seen: set[int] = set()
    for o in objs:
        grp = (o.ino - 1) // g.inodes_per_group
        table = g.inode_tables[grp]
        block = table + ((o.ino - 1) % g.inodes_per_group) // per_block
        aligned = block - block % INODE_READAHEAD_BLOCKS
        start = max(aligned, table)
        end = min(aligned + INODE_READAHEAD_BLOCKS, table + top[grp] // per_block + 1)
        if start not in seen:
            seen.add(start)
            reqs.append((start, max(end, block + 1) - start))
        reqs += [(b, 1) for b in o.tree_blocks]
        reqs += [(p, n) for _, p, n in o.extents]
    seeks = 1 + sum(1 for (a, n), (b, _) in itertools.pairwise(reqs) if b != a + n)
    return 1.0 - seeks / sum(n for _, n in reqs)


def _walk(d: Node, nodes: dict[int, Node]) -> list[Node]:
    out = [d]
    for _, i in sorted(d.children.items()):
        out += _walk(nodes[i], nodes) if nodes[i].is_dir else [nodes[i]]
    return out


def _paths(nodes: dict[int, Node]) -> dict[str, Node]:
    out = {"/": nodes[2]}
    todo = [("/", nodes[2])]
    while todo:
        p, d = todo.pop()
        for name, i in d.children.items():
            if nodes[i].is_dir:
                q = p.rstrip("/") + "/" + name.decode()
                out[q] = nodes[i]
                todo.append((q, nodes[i]))
    return out


SPACERS = (60_000, 700_000, 3_000_000)


def _spaced_image(workdir: Path, block_size: int) -> Path:
    """Six directories of small files copied in by mke2fs -d, with spacer files of 60 KB to
    12 MB between some of them; then the spacers deleted and new files written with debugfs,
    which allocates into the holes: neighbours adjacent, near, a group apart and farther."""
    need("mke2fs", "debugfs", "dumpe2fs")
    rnd = random.Random(5)
    src = workdir / "src"
    spacers = []
    for d in range(6):
        (src / f"d{d}").mkdir(parents=True)
        for i in range(40):
            (src / f"d{d}" / f"{i:03d}").write_bytes(rnd.randbytes(rnd.choice([0, 1, 2, 9]) * 1000))
            if i % 8 == 3:
                size = 12_000_000 if d < 2 and i == 3 else SPACERS[(i // 8 + d) % 3]
                spacers.append(f"/d{d}/{i:03d}s")
                (src / spacers[-1][1:]).write_bytes(rnd.randbytes(size))
    img = workdir / "fs.img"
    subprocess.run(
        [
            *("mke2fs", "-q", "-F", "-t", "ext4", "-b", str(block_size)),
            "-d",
            str(src),
            str(img),
            "160M",
        ],
        check=True,
        capture_output=True,
    )
    blob = workdir / "blob"
    cmds = [f"rm {p}" for p in spacers]
    for j in range(30):
        blob.write_bytes(rnd.randbytes(rnd.randint(1, 30_000)))
        part = workdir / f"blob{j}"
        shutil.copyfile(blob, part)
        cmds.append(f"write {part} /d{j % 6}/{rnd.randrange(40):03d}n")
    (workdir / "cmds").write_text("\n".join(cmds) + "\n")
    subprocess.run(
        ["debugfs", "-w", "-f", str(workdir / "cmds"), str(img)], check=True, capture_output=True
    )
    return img


@pytest.fixture(scope="module", params=[1024, 4096])
def aged_image(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    bs = int(request.param)
    return _spaced_image(tmp_path_factory.mktemp(f"loc{bs}"), bs)


def test_neighbour_gaps_match_debugfs(aged_image: Path) -> None:
    snapshotter = pytest.importorskip("fsage.snapshotter")
    nodes, g = _tree(aged_image), _geometry(aged_image)
    an = SnapshotAnalyzer(snapshotter.read_source(aged_image))
    nd = an.locality()["neighbour_distance"]
    pairs = _pairs(nodes)
    want = {k: 0 for k in ("adjacent", "le_1mib", "le_group", "farther")}
    for _, gap in pairs:
        want[_bucket(gap, g)] += 1
    assert nd["pairs"] == len(pairs) > 150
    assert {k: nd[k] for k in want} == want
    assert nd["group_bytes"] == g.blocks_per_group * g.block_size
    assert nd["forward_share"] == sum(1 for _, gap in pairs if gap >= 0) / len(pairs)
    # adjacent, near and a group apart at least (farther too where groups are 8 MiB)
    assert all(want[k] for k in ("adjacent", "le_1mib", "le_group"))
    assert want["farther"] or g.block_size == 4096
    assert nd["adjacent_share"] == want["adjacent"] / len(pairs)


def test_directory_and_subtree_scans_match_debugfs(aged_image: Path) -> None:
    snapshotter = pytest.importorskip("fsage.snapshotter")
    nodes, g = _tree(aged_image), _geometry(aged_image)
    an = SnapshotAnalyzer(snapshotter.read_source(aged_image))
    by_path = _paths(nodes)
    rows = {r["path"]: r for r in an.by_dir(depth=3)}
    assert set(rows) == set(by_path)
    own_scores = []
    for path, d in by_path.items():
        files = [nodes[i] for _, i in sorted(d.children.items()) if not nodes[i].is_dir]
        own = _scan_score([d, *files], nodes, g) if files else None
        if own is not None:
            own_scores.append(own)
        assert rows[path]["own_scan_score"] == pytest.approx(own, abs=1e-12), path
        assert rows[path]["scan_score"] == pytest.approx(
            _scan_score(_walk(d, nodes), nodes, g), abs=1e-12
        ), path
        # the subtree's neighbours, bucketed
        inside = {n.ino for n in _walk(d, nodes) if n.is_dir}
        sub = [gap for di, gap in _pairs(nodes) if di in inside]
        assert rows[path]["pairs"] == len(sub)
        if sub:
            share = sum(1 for gap in sub if gap == 0) / len(sub)
            assert rows[path]["adjacent_share"] == pytest.approx(share, abs=1e-12)
    loc = an.locality()
    ds = loc["directory_scan"]
    assert ds["scans"] == len(own_scores) == 6  # the root and lost+found hold no file
    assert ds["median"] == pytest.approx(statistics.median(own_scores), abs=1e-12)
    assert ds["mean"] == pytest.approx(statistics.mean(own_scores), abs=1e-12)
    assert sum(ds["histogram"]) == len(own_scores)
    whole = _scan_score(_walk(nodes[2], nodes), nodes, g)
    assert loc["dynamic_layout_score_path"] == pytest.approx(whole, abs=1e-12)
    assert an.model(())["dynamic_layout_score"]["path"] == pytest.approx(whole, abs=1e-12)


def _can_mount() -> bool:
    return os.geteuid() == 0 and Path("/dev/loop-control").exists() and bool(shutil.which("mount"))


@pytest.mark.needs_root
def test_live_and_offline_reads_give_the_same_locality(tmp_path: Path) -> None:
    """Files written through the kernel into several directories at once; the mounted image
    read live (FIEMAP through the mount) and, once unmounted, offline."""
    if not _can_mount():
        pytest.skip("needs root and loop devices")
    snapshotter = pytest.importorskip("fsage.snapshotter")
    img, mnt = tmp_path / "fs.img", tmp_path / "mnt"
    subprocess.run(
        ["mke2fs", "-q", "-F", "-t", "ext4", "-b", "1024", str(img), "32M"],
        check=True,
        capture_output=True,
    )
    mnt.mkdir()
    subprocess.run(["mount", "-o", "loop", str(img), str(mnt)], check=True, capture_output=True)
    try:
        dirs = [mnt / f"d{k}" for k in range(4)]
        for d in dirs:
            d.mkdir()
        for i in range(40):
            # one file in each directory in turn, each forced out before the next
            for k, d in enumerate(dirs):
                with open(d / f"f{i:02d}", "wb") as f:
                    f.write(os.urandom(1024 * (1 + (i + k) % 5)))
                    f.flush()
                    os.fsync(f.fileno())
        live = snapshotter.read_source(img)
    finally:
        subprocess.run(["umount", str(mnt)], check=True, capture_output=True)
    offline = snapshotter.read_source(img)
    a, b = SnapshotAnalyzer(live).locality(), SnapshotAnalyzer(offline).locality()
    assert a["neighbour_distance"] == b["neighbour_distance"]
    assert a["neighbour_distance"]["pairs"] == 4 * 39
    assert a["same_group_share"] == b["same_group_share"]
    assert a["inode_to_data_blocks"] == b["inode_to_data_blocks"]
    assert a["directory_scan"] == b["directory_scan"]
    assert a["dynamic_layout_score_path"] == b["dynamic_layout_score_path"]
    # the interleaving put other directories' files between neighbours
    assert b["neighbour_distance"]["adjacent_share"] < 0.5


def test_gap_buckets_by_bytes_and_an_unknown_group_size() -> None:
    """Worked by hand: gaps in blocks of 1 KiB and 4 KiB; the same byte distance lands in the
    same bucket; without a group size its bucket is None and the gap counts as farther."""
    from fsage.analyzer.locality import gap_distribution

    gaps = np.array([0, 1, -1024, 1025, 8192, 8193, -9000], np.int64)
    small = gap_distribution(gaps, 1024, 8192)  # 1 KiB blocks, 8 MiB groups
    assert [small[k] for k in ("adjacent", "le_1mib", "le_group", "farther")] == [1, 2, 2, 2]
    assert small["forward_share"] == 5 / 7
    assert small["median_bytes"] == 1025 * 1024
    # 4 KiB blocks, 128 MiB groups: 0, 0, 1 MiB back, 1 MiB, 8 MiB, 8 MiB and 8.8 MiB back
    big = gap_distribution(np.array([0, 0, -256, 256, 2048, 2048, -2250], np.int64), 4096, 32768)
    assert [big[k] for k in ("adjacent", "le_1mib", "le_group", "farther")] == [2, 2, 3, 0]
    unknown = gap_distribution(gaps, 1024, None)
    assert unknown["le_group"] is None and unknown["le_group_share"] is None
    assert unknown["farther"] == 4 and unknown["group_bytes"] is None


@pytest.mark.needs_root
def test_xfs_read_live_keeps_its_locality_once_stored(tmp_path: Path) -> None:
    """An xfs tree read through its mount (root inode 128), analysed as read and as loaded
    back from the database: the same walk, neighbours and scans."""
    if not _can_mount() or shutil.which("mkfs.xfs") is None:
        pytest.skip("needs root, loop devices and mkfs.xfs")
    snapshotter = pytest.importorskip("fsage.snapshotter")
    from fsage.db.store import Store

    img, mnt, db = tmp_path / "x.img", tmp_path / "mnt", tmp_path / "x.db"
    with open(img, "wb") as f:
        f.truncate(320 << 20)
    subprocess.run(["mkfs.xfs", "-q", str(img)], check=True, capture_output=True)
    mnt.mkdir()
    subprocess.run(["mount", "-o", "loop", str(img), str(mnt)], check=True, capture_output=True)
    try:
        rnd = random.Random(4)
        for d in range(3):
            (mnt / f"d{d}").mkdir()
            for i in range(20):
                (mnt / f"d{d}" / f"f{i:02d}").write_bytes(rnd.randbytes(rnd.randint(1, 30_000)))
        os.sync()  # xfs maps data still in delayed allocation as no blocks
        live = snapshotter.read_source(mnt)
    finally:
        subprocess.run(["umount", str(mnt)], check=True, capture_output=True)
    a = SnapshotAnalyzer(live).locality()
    with Store.open(db, create=True) as store:
        sid = store.add_snapshot(live, name="x").snapshot_id
        stored = store.load_layout(sid)
    b = SnapshotAnalyzer(stored).locality()
    assert a["neighbour_distance"]["pairs"] == 3 * 19
    assert a["neighbour_distance"] == b["neighbour_distance"]
    assert a["neighbour_distance"]["le_group"] is None  # no AG size from a live read
    assert a["directory_scan"] == b["directory_scan"]
    assert a["directory_scan"]["scans"] == 3
    assert b["dynamic_layout_score_path"] is not None
