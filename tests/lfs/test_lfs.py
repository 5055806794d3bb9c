"""The LFS of seed 003: format, file operations, indirect pointers, checkpoints, roll-forward,
cut-off writes, cleaning, reader, executor, CLI and bad input."""

from __future__ import annotations

import os
import random
import struct
import zlib
from pathlib import Path

import pytest
from click.testing import CliRunner

from fsage.cli import main
from fsage.errors import FsageError
from fsage.lfs import format as fmt
from fsage.lfs import lfs_pb2
from fsage.lfs.cleaner import POLICIES, Counters, DiskModel, write_cost_metrics
from fsage.lfs.executor import LfsExecutor, is_lfs_image
from fsage.lfs.fs import LFS, LfsOpError, mkfs
from fsage.lfs.fsck import fsck
from fsage.lfs.reader import read_lfs_layout
from fsage.lfs.sim import random_update
from fsage.workload import Op


def small(path: Path, **kw: object) -> Path:
    args: dict[str, object] = {"segments": 48, "blocks_per_segment": 32, "block_size": 4096}
    args.update(kw)
    mkfs(path, **args)  # type: ignore[arg-type]
    return path


# ---------------------------------------------------------------- format


def test_magic_superblock_and_checkpoint_bytes(tmp_path: Path) -> None:
    img = small(tmp_path / "a.img", block_size=2048, sector_size=512)
    raw = img.read_bytes()
    assert raw[:2048] == bytes(2048)  # block 0 is never touched
    assert raw[2048 : 2048 + 256] == fmt.MAGIC
    (n,) = struct.unpack(">I", raw[4096:4100])  # block 2: length-prefixed, big endian
    sb = lfs_pb2.Superblock.FromString(raw[4100 : 4100 + n])
    assert (sb.version, sb.noctet_sector, sb.nsector_blk, sb.nblk_seg, sb.nseg_disk) == (
        2,  # version 2: checksummed summaries
        512,
        4,
        32,
        48,
    )
    assert list(sb.checkpoint_seg) == [1, 2] and sb.first_logseg == 3
    # seed 003's 24 + 24 N_blk, plus a 4-octet CRC-32 per block
    assert sb.nblk_segsummary == -(-(24 + 28 * 32) // 2048) == 1
    # fixed32 fields are little-endian on the protobuf wire: field 1, wire type 5, value 2.
    assert raw[4100:4105] == bytes([0x0D, 2, 0, 0, 0])
    seg = 32 * 2048
    for which in (0, 1):
        start = (1 + which) * seg
        (m,) = struct.unpack(">I", raw[start : start + 4])
        if m == 0:
            continue
        cp = lfs_pb2.Checkpoint.FromString(raw[start + 4 : start + 4 + m])
        dup = struct.unpack(">Q", raw[start + seg - 2048 : start + seg - 2040])[0]
        assert dup == cp.timestamp and len(cp.segusage) == 48
        assert len(cp.inode_inotbl.blkptr) == 15


def test_checkpoint_length_bound_matches_encoder() -> None:
    for nseg in (16, 100, 1000):
        big = (1 << 64) - 1
        simp = lfs_pb2.InodeSimp(size=big, blkptr=[big] * 15, ver=(1 << 32) - 1)
        cp = lfs_pb2.Checkpoint(
            timestamp=big,
            next_seg=(1 << 32) - 1,
            inode_inomap=simp,
            inode_inovec=simp,
            inode_inotbl=simp,
            segusage=[lfs_pb2.SegUsageRec(nblks_live=(1 << 32) - 1, mtime=big)] * nseg,
        )
        assert len(fmt.encode_pb(cp)) == fmt.checkpoint_len_max(nseg)


def test_hand_encoded_directories_and_segment_usage_match_protobuf() -> None:
    """Directory files and the checkpoint's segment usage table are packed without building
    messages; the octets are those protobuf gives."""
    from fsage.lfs.dirs import _encode_dir

    rnd = random.Random(3)
    for _ in range(300):
        d = {
            "".join(
                rnd.choice("ab\u00e9\u20ac\U0001d11e_.") for _ in range(rnd.randrange(0, 300))
            ): (rnd.choice([0, 1, 127, 128, 16383, 16384, (1 << 32) - 1, rnd.randrange(1 << 32)]))
            for _ in range(rnd.randrange(0, 30))
        }
        recs = [lfs_pb2.DirFileRec(ino=i, name=n) for n, i in d.items()]
        assert _encode_dir(d) == fmt.encode_pb(lfs_pb2.DirFile(list=recs))
    live = [rnd.choice([-2, 0, 1, 300, (1 << 32) - 1]) for _ in range(500)]
    mtime = [rnd.choice([0, 1, 1 << 40, (1 << 64) - 1]) for _ in range(500)]
    pairs = zip(live, mtime, strict=True)
    usage = [lfs_pb2.SegUsageRec(nblks_live=max(0, a), mtime=b) for a, b in pairs]
    whole = lfs_pb2.Checkpoint(timestamp=9, next_seg=4, segusage=usage).SerializeToString()
    head = lfs_pb2.Checkpoint(timestamp=9, next_seg=4).SerializeToString()
    assert head + fmt.segusage_octets(live, mtime) == whole


@pytest.mark.parametrize(
    ("kw", "msg"),
    [
        ({"segments": 15}, "constraint (2)"),
        ({"segments": 2**20 + 1}, "constraint (2)"),
        ({"blocks_per_segment": 7}, "constraint (3)"),
        ({"blocks_per_segment": 4097}, "constraint (3)"),
        ({"block_size": 256, "sector_size": 256}, "constraint (5)"),
        ({"block_size": 2048 * 512, "sector_size": 512, "blocks_per_segment": 8}, "constraint (4)"),
    ],
)
def test_mkfs_constraints(tmp_path: Path, kw: dict[str, int], msg: str) -> None:
    args: dict[str, int] = {"segments": 48, "blocks_per_segment": 32, "block_size": 4096}
    args.update(kw)
    with pytest.raises(FsageError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        mkfs(tmp_path / "x.img", **args)  # type: ignore[arg-type]


def test_constraint_1_disk_size(tmp_path: Path) -> None:
    geo = mkfs(tmp_path / "s.img", size=5 * 1024 * 1024, blocks_per_segment=16, block_size=4096)
    assert geo.segments == 80 and geo.image_size <= 5 * 1024 * 1024
    with pytest.raises(FsageError, match="constraint \\(1\\)"):
        fmt.make_geometry(
            sector_size=512,
            sectors_per_block=8,
            blocks_per_segment=16,
            segments=81,
            disk_sectors=80 * 16 * 8,
        )


# ---------------------------------------------------------------- file operations


def test_api_round_trip(tmp_path: Path) -> None:
    img = small(tmp_path / "a.img")
    with LFS.open(img) as fs:
        fs.mkdir("d")
        fs.mkdir("d/e")
        fs.create("d/f", 0o600)
        fs.write("d/f", 0, b"x" * 10000)
        fs.write("d/f", 5000, b"y" * 10)
        fs.symlink("d/f", "short")
        fs.symlink("t" * 100, "long")
        fs.create("g")
        fs.rename("g", "d/e/g")
        fs.truncate("d/f", 5005)
        fs.link("d/f", "hard")
    with LFS.open(img) as fs:
        assert sorted(n for n, _ in fs.readdir("")) == ["d", "hard", "long", "short"]
        assert sorted(n for n, _ in fs.readdir("d")) == ["e", "f"]
        assert fs.readdir("d/e")[0][0] == "g"
        assert fs.read("d/f") == b"x" * 5000 + b"y" * 5
        st = fs.stat("d/f")
        assert (st.size, st.nlink, st.mode, st.blocks) == (5005, 2, 0o100600, 2)
        assert fs.stat("d").nlink == 3 and fs.stat("").nlink == 3
        assert fs.readlink("short") == "d/f" and fs.readlink("long") == "t" * 100
        with pytest.raises(LfsOpError, match="not empty"):
            fs.rmdir("d")
        fs.unlink("d/e/g")
        fs.rmdir("d/e")
        fs.unlink("hard")
        assert fs.stat("d/f").nlink == 1 and fs.stat("d").nlink == 2
        with pytest.raises(LfsOpError, match="no such"):
            fs.read("nope")
    assert fsck(img).problems == []


def test_double_and_triple_indirect(tmp_path: Path) -> None:
    # 512-octet blocks: 64 pointers per block, so offset 12+64+4096 is triply indirect.
    img = small(tmp_path / "t.img", segments=200, blocks_per_segment=64, block_size=512)
    rng = random.Random(3)
    data = rng.randbytes(512 * 300)  # direct, single and double indirect
    far = 12 + 64 + 64 * 64 + 777
    with LFS.open(img) as fs:
        fs.create("big")
        fs.write("big", 0, data)
        fs.write("big", far * 512 + 100, b"triple")
    with LFS.open(img) as fs:
        assert fs.read("big", 0, len(data)) == data
        assert fs.read("big", far * 512 + 100, 6) == b"triple"
        assert fs.read("big", 400 * 512, 512) == bytes(512)  # a hole
        kinds = sorted({k for _, k, _ in fs.file_blocks(fs.stat("big").ino) if k >= 0})
        assert kinds == [0, 1, 2]
        fs.truncate("big", 100 * 512)
    rep = fsck(img)
    assert rep.problems == []
    with LFS.open(img) as fs:
        assert fs.stat("big").blocks == 100


# ---------------------------------------------------------------- random ops vs a model


def _random_ops(fs: LFS, rng: random.Random, model: dict[str, bytearray], steps: int) -> None:
    for _ in range(steps):
        r = rng.random()
        if r < 0.3 and len(model) < 30:
            name = f"f{rng.randrange(60)}"
            if name in model:
                continue
            data = rng.randbytes(rng.randrange(0, 40000))
            fs.create(name)
            fs.write(name, 0, data)
            model[name] = bytearray(data)
        elif r < 0.7 and model:
            name = rng.choice(sorted(model))
            m = model[name]
            off = rng.randrange(0, len(m) + 1)
            d = rng.randbytes(rng.randrange(1, 9000))
            fs.write(name, off, d)
            if off + len(d) > len(m):
                m.extend(bytes(off + len(d) - len(m)))
            m[off : off + len(d)] = d
        elif r < 0.8 and model:
            name = rng.choice(sorted(model))
            n = rng.randrange(0, len(model[name]) + 1)
            fs.truncate(name, n)
            del model[name][n:]
        elif model:
            name = rng.choice(sorted(model))
            fs.unlink(name)
            del model[name]


@pytest.mark.parametrize("policy", POLICIES)
def test_cleaning_policies_keep_data(tmp_path: Path, policy: str) -> None:
    # A commit after every operation: the log fills (and is cleaned) far more often than with
    # write buffering, which the property tests of test_lfs_atomic.py run.
    img = small(tmp_path / "c.img", segments=36, cleaning_policy=policy, checkpoint_interval=3)
    rng = random.Random(7)
    model: dict[str, bytearray] = {}
    counters = Counters()
    for _ in range(3):
        with LFS.open(img, commit_interval=0) as fs:
            _random_ops(fs, rng, model, 300)
            counters.add(fs.counters)
    with LFS.open(img) as fs:
        for name, data in model.items():
            assert fs.read(name) == bytes(data)
        assert sorted(n for n, _ in fs.readdir("")) == sorted(model)
    assert counters.segments_freed > 0
    if policy in ("hole-plugging",):
        assert counters.holeplug_blocks > 0 and counters.cleaning_passes == 0
    elif policy != "adaptive":
        assert counters.clean_segs_read + counters.clean_segs_cached > 0
        assert counters.holeplug_passes == 0
    assert fsck(img).problems == []


# ---------------------------------------------------------------- checkpoints and crashes


def test_roll_forward_after_crash(tmp_path: Path) -> None:
    img = small(tmp_path / "r.img", checkpoint_interval=1000)
    fs = LFS.open(img)
    fs.checkpoint()
    fs.mkdir("after")
    fs.create("after/x")
    fs.write("after/x", 0, b"z" * 70000)
    fs.sync()
    os.close(fs.fd)  # crash: no checkpoint on the way out
    fs.closed = True
    with LFS.open(img, readonly=True) as ro:
        assert ro.rolled_forward >= 1
        assert ro.read("after/x") == b"z" * 70000
    assert fsck(img).problems == []
    with LFS.open(img) as fs2:  # writable open writes a checkpoint after rolling forward
        assert fs2.read("after/x") == b"z" * 70000
    with LFS.open(img, readonly=True) as ro:
        assert ro.rolled_forward == 0


@pytest.mark.parametrize("buffered", [False, True])
def test_cut_off_writes_open_to_a_committed_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, buffered: bool
) -> None:
    """Unbuffered, every op commits; buffered, ops commit at ``sync`` (every third op here)
    and whenever the file system decides to: a cut anywhere opens to the state after some
    op, not older than the last ``sync`` fully written and not newer than the op being
    written."""
    img = small(tmp_path / "w.img", checkpoint_interval=2)
    base = img.read_bytes()
    writes: list[tuple[int, bytes]] = []
    real = os.pwrite

    def recording(fd: int, data: bytes | memoryview, off: int) -> int:
        writes.append((off, bytes(data)))
        return real(fd, data, off)

    def recording_v(fd: int, buffers: list[bytes | memoryview], off: int) -> int:
        return recording(fd, b"".join(buffers), off)  # one write, which a cut may tear

    rng = random.Random(11)
    states: list[dict[str, bytes]] = []
    marks: list[int] = []
    monkeypatch.setattr(os, "pwrite", recording)
    monkeypatch.setattr(os, "pwritev", recording_v)
    model: dict[str, bytearray] = {}
    with LFS.open(img, commit_interval=5.0 if buffered else 0) as fs:
        states.append({})
        marks.append(len(writes))
        synced = [True]

        def done() -> None:
            synced.append(not buffered or len(states) % 3 == 0)
            if buffered and synced[-1]:
                fs.sync()
            states.append({k: bytes(v) for k, v in model.items()})
            marks.append(len(writes))

        for i in range(30):
            name = f"f{rng.randrange(8)}"
            if name not in model:
                fs.create(name)
                model[name] = bytearray()
                done()
            elif i % 5 == 4:
                fs.unlink(name)
                del model[name]
                done()
                continue
            data = rng.randbytes(rng.randrange(1, 30000))
            off = rng.randrange(0, len(model[name]) + 1)
            fs.write(name, off, data)
            m = model[name]
            m.extend(bytes(max(0, off + len(data) - len(m))))
            m[off : off + len(data)] = data
            done()
    monkeypatch.undo()
    cut_rng = random.Random(5)
    points = sorted(cut_rng.sample(range(1, len(writes)), min(40, len(writes) - 1)))
    for k in points:
        off, data = writes[k]
        partial = cut_rng.randrange(0, len(data) + 1)
        image = bytearray(base)
        for o, d in writes[:k]:
            image[o : o + len(d)] = d
        image[off : off + partial] = data[:partial]
        cut = tmp_path / "cut.img"
        cut.write_bytes(image)
        with LFS.open(cut, readonly=True) as fs:
            got = {n: fs.read(n) for n, _ in fs.readdir("")}
        # Every op synced (committed) before the cut is there, and nothing of an op that
        # had not started: the state is one between those two.
        lo = max(i for i, m in enumerate(marks) if m <= k and synced[i])
        hi = max(i for i in range(len(marks)) if i == 0 or marks[i - 1] <= k)
        idx = [i for i, st in enumerate(states) if st == got and lo <= i <= hi]
        assert idx, f"cut at write {k}: state not between ops {lo} and {hi}"
        assert fsck(cut).problems == [], f"cut at write {k}"


def test_one_checkpoint_corrupted_uses_the_other(tmp_path: Path) -> None:
    img = small(tmp_path / "k.img")
    with LFS.open(img) as fs:
        fs.create("a")
        fs.write("a", 0, b"1")
    with LFS.open(img) as fs:
        newer = fs.cp_which
    geo = LFS.open(img, readonly=True).geo
    start, length = fmt.checkpoint_region(geo, newer)
    with open(img, "r+b") as fh:  # break the duplicate timestamp of the newer one
        fh.seek(start + length - geo.block_size)
        fh.write(b"\xff" * 8)
    with LFS.open(img, readonly=True) as fs:
        assert fs.cp_which == 1 - newer
        assert any("timestamp does not match" in n for n in fs.notes)
        assert fs.read("a") == b"1"
    start2, _ = fmt.checkpoint_region(geo, 1 - newer)
    with open(img, "r+b") as fh:
        fh.seek(start2 + 4)
        fh.write(b"\x00" * 64)
    with pytest.raises(FsageError, match="both checkpoints are invalid"):
        LFS.open(img)


# ---------------------------------------------------------------- bad input


def test_not_lfs_and_truncated(tmp_path: Path) -> None:
    junk = tmp_path / "junk"
    junk.write_bytes(os.urandom(100000))
    assert not is_lfs_image(junk)
    with pytest.raises(FsageError, match="not an LFS image"):
        LFS.open(junk)
    img = small(tmp_path / "t.img")
    assert is_lfs_image(img)
    data = img.read_bytes()
    cut = tmp_path / "cut.img"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(FsageError, match="truncated"):
        LFS.open(cut)
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    with pytest.raises(FsageError):
        LFS.open(empty)


def test_corrupted_summary_and_inode_table_are_named(tmp_path: Path) -> None:
    img = small(tmp_path / "s.img")
    with LFS.open(img) as fs:
        fs.create("a")
        fs.write("a", 0, b"q" * 9000)
        fs.sync()  # the inode table block is written at the commit
        ino = fs.stat("a").ino
        addr = next(a for a, k, _ in fs.file_blocks(ino) if k == -1)
        tbl_addr = next(
            a for a, k, o in fs.file_blocks(fmt.INO_INOTBL) if k == -1 and o == ino * 256 // 4096
        )
        geo = fs.geo
    seg, blk = fmt.sbn_split(addr)
    summ_off = geo.seg_offset(seg) + geo.data_blocks_per_segment * geo.block_size
    good = img.read_bytes()
    with open(img, "r+b") as fh:
        fh.seek(summ_off + 24 * blk + 4)
        fh.write(struct.pack(">I", 9999))  # wrong inode number in the record
    result = CliRunner().invoke(main, ["lfs", "fsck", str(img)])
    assert result.exit_code == 1
    # the summary's own CRC-32 finds the changed record
    assert f"summary of segment {seg}: checksum mismatch" in result.output
    img.write_bytes(good)
    with open(img, "r+b") as fh:
        fh.seek(summ_off + 24 * blk + 4)
        fh.write(struct.pack(">I", 9999))
        fh.flush()
        # the record changed with its summary's checksum made right again: the record check
        raw = bytearray(os.pread(fh.fileno(), geo.summary_blocks * geo.block_size, summ_off))
        meta = 24 * geo.blocks_per_segment
        struct.pack_into(">I", raw, meta + 8, 0)
        struct.pack_into(">I", raw, meta + 8, zlib.crc32(raw))
        os.pwrite(fh.fileno(), raw, summ_off)
    rep = fsck(img)
    assert any(f"segment {seg} block {blk}: summary" in p for p in rep.problems)
    img.write_bytes(good)
    tseg, tblk = fmt.sbn_split(tbl_addr)
    with open(img, "r+b") as fh:
        fh.seek(geo.addr_offset(tbl_addr) + (ino * 256) % 4096)
        fh.write(struct.pack(">I", 4000))
    result = CliRunner().invoke(main, ["lfs", "fsck", str(img)])
    assert result.exit_code == 1
    assert f"segment {tseg} block {tblk}: checksum mismatch" in result.output


def test_fuzz_flipped_bytes_give_clean_errors(tmp_path: Path) -> None:
    img = small(tmp_path / "f.img", segments=20, blocks_per_segment=16, block_size=1024)
    with LFS.open(img) as fs:
        fs.mkdir("d")
        for i in range(6):
            fs.create(f"d/{i}")
            fs.write(f"d/{i}", 0, bytes([i]) * (i * 3000))
    good = img.read_bytes()
    geo = LFS.open(img, readonly=True).geo
    # Metadata-rich areas: block 1-2, both checkpoint regions, the first log segments.
    hot = [(geo.block_size, 3 * geo.block_size)]
    hot += [(geo.seg_offset(1), geo.seg_offset(geo.first_log_segment + 3))]
    rng = random.Random(2024)
    outcomes = {"ok": 0, "error": 0}
    for _ in range(150):
        data = bytearray(good)
        lo, hi = rng.choice(hot)
        for _ in range(rng.randrange(1, 6)):
            data[rng.randrange(lo, hi)] ^= 1 << rng.randrange(8)
        bad = tmp_path / "bad.img"
        bad.write_bytes(data)
        try:
            with LFS.open(bad, readonly=True) as fs:
                for name, _ in fs.readdir("d"):
                    fs.read(f"d/{name}")
            fsck(bad)
            read_lfs_layout(bad)
            outcomes["ok"] += 1
        except FsageError:
            outcomes["error"] += 1
    assert outcomes["error"] > 0 and outcomes["ok"] > 0


# ---------------------------------------------------------------- reader, executor, CLI


def test_reader_layout(tmp_path: Path) -> None:
    img = small(tmp_path / "l.img")
    with LFS.open(img) as fs:
        fs.mkdir("d")
        fs.create("d/f")
        fs.write("d/f", 0, b"a" * 4096 * 20)
        fs.sync()  # before the sync, block 5 would be rewritten in the segment buffer
        fs.write("d/f", 4096 * 5, b"b" * 4096)  # block 5 moves to the log's end
        ino = fs.stat("d/f").ino
        ptrs = {o: a for a, k, o in fs.file_blocks(ino) if k == -1}
    lay = read_lfs_layout(img)
    assert lay.facts.kind == "lfs"
    paths = lay.paths()
    assert paths[ino] == ["/d/f"]
    i = int((lay.files.ino == ino).nonzero()[0][0])
    ext = lay.files.extents_of(i)
    bps = 32
    expect = sorted((o, (a >> 32) * bps + (a & 0xFFFFFFFF)) for o, a in ptrs.items())
    got = sorted((int(lo) + j, int(ph) + j) for lo, ph, n, _ in ext for j in range(int(n)))
    assert got == expect
    assert len(ext) >= 3  # 0-4, 5 elsewhere, 6-19 (split where a segment ends)
    assert len(lay.facts.groups) == 48
    assert {"start", "length", "live_blocks", "age_ms"} <= set(lay.facts.groups[5])
    live = sum(g["live_blocks"] for g in lay.facts.groups)
    assert lay.facts.blocks_total - lay.facts.blocks_free == live
    assert (
        lay.free.blocks == sum(1 for g in lay.facts.groups[3:] if g["live_blocks"] == 0) * 31
        or lay.free.blocks > 0
    )


def test_executor_runs_a_workload(tmp_path: Path) -> None:
    img = small(tmp_path / "e.img", segments=64)
    with LfsExecutor(img) as ex:
        assert isinstance(ex, LfsExecutor)
        ops = [
            Op("mkdir", "a"),
            Op("create", "a/b/c", size=50000),
            Op("append", "a/b/c", 1000),
            Op("overwrite", "a/b/c", size=10, offset=5),
            Op("truncate", "a/b/c", 30000),
            Op("rename", "a/b/c", dest="x/y"),
            Op("sync"),
            Op("create", "z", size=3),
            Op("delete", "z"),
        ]
        written = sum(ex.apply(op) for op in ops)
        assert written == 51013
        bs, total, used = ex.capacity_blocks()
        assert bs == 4096 and 0 < used < total
        assert ex.write_cost()["write_cost"] >= 1.0
    with LFS.open(img, readonly=True) as fs:
        assert fs.stat("x/y").size == 30000
        assert not fs.exists("a/b/c") and not fs.exists("z")


def test_cli_mkfs_info_fsck(tmp_path: Path) -> None:
    img = tmp_path / "cli.img"
    r = CliRunner().invoke(
        main,
        [
            "lfs",
            "mkfs",
            str(img),
            "--size",
            "8M",
            "--blocks-per-segment",
            "64",
            "--policy",
            "adaptive",
        ],
    )
    assert r.exit_code == 0, r.output
    assert "32 segments" in r.output
    r = CliRunner().invoke(main, ["lfs", "info", str(img), "--format", "json"])
    assert r.exit_code == 0
    import json

    info = json.loads(r.output)
    assert info["geometry"]["cleaning_policy"] == "adaptive"
    assert sum(h["segments"] for h in info["histogram"]) == 32 - 3
    r = CliRunner().invoke(main, ["lfs", "fsck", str(img)])
    assert r.exit_code == 0 and "clean" in r.output
    r = CliRunner().invoke(main, ["lfs", "fsck", str(tmp_path / "cli.img"), "--format", "json"])
    assert json.loads(r.output)["ok"] is True
    junk = tmp_path / "junk"
    junk.write_bytes(b"x" * 5000)
    r = CliRunner().invoke(main, ["lfs", "info", str(junk)])
    assert r.exit_code != 0 and "not an LFS image" in r.output
    for cmd in (
        ["lfs", "--help"],
        ["lfs", "mkfs", "--help"],
        ["lfs", "fsck", "--help"],
        ["lfs", "info", "--help"],
    ):
        r = CliRunner().invoke(main, cmd)
        assert r.exit_code == 0 and "Examples:" in r.output


# ---------------------------------------------------------------- write cost, Figure 5-4


def test_write_cost_equations() -> None:
    # Seed 001 EQ 1/2: one segment of new data, cleaner read 2 and wrote 1 -> 4 and 3.
    c = Counters(
        new_blocks=32, new_requests=1, clean_segs_read=2, clean_blocks_written=32, clean_requests=1
    )
    m = write_cost_metrics(c, block_size=8192, blocks_per_segment=32, disk=DiskModel())
    assert m["write_cost"] == pytest.approx(4.0)
    assert m["cleaner_overhead"] == pytest.approx(3.0)
    # EQ 3: 1 + access x bandwidth / segment size = 1 + 0.015 * 5e6 / 262144.
    assert m["transfer_inefficiency"] == pytest.approx(1 + 0.015 * 5e6 / 262144)
    # All transfers whole segments: EQ 4 equals EQ 5.
    assert m["overall_write_cost"] == pytest.approx(m["write_cost_x_ti"])


def test_figure_5_4_shape() -> None:
    """Small seed 001 Figure 5-4: cleaning wins at 60%, hole-plugging at 97%, adaptive
    follows the cheaper one; cleaning soars at high utilization while hole-plugging stays low."""
    cost = {
        (u, m): random_update(u, m, segments=96, updates_per_block=6).metrics["overall_write_cost"]
        for u in (0.6, 0.97)
        for m in ("clean", "holeplug", "adaptive")
    }
    assert cost[(0.6, "clean")] < cost[(0.6, "holeplug")]
    assert cost[(0.97, "clean")] > 2 * cost[(0.97, "holeplug")]
    assert cost[(0.97, "holeplug")] < 15
    for u in (0.6, 0.97):
        cheaper = min(cost[(u, "clean")], cost[(u, "holeplug")])
        assert cost[(u, "adaptive")] <= cheaper * 1.15


def test_parse_prefixed_says_why_a_message_does_not_decode() -> None:
    msg = lfs_pb2.DirChRec(ino=70, name="f", op=lfs_pb2.DirChRec.ADD)
    raw = b"\xff" * 3 + fmt.encode_pb(msg) + b"tail"
    out = lfs_pb2.DirChRec()
    assert fmt.parse_prefixed(raw, out, 100, offset=3) is None
    assert (out.ino, out.name) == (70, "f")
    n = len(fmt.encode_pb(msg)) - 4
    assert fmt.parse_prefixed(raw, lfs_pb2.DirChRec(), n - 1, offset=3) == f"bad length {n}"
    assert fmt.parse_prefixed(raw[: 3 + n], lfs_pb2.DirChRec(), 100, offset=3) == f"bad length {n}"
    assert fmt.parse_prefixed(raw[:5], lfs_pb2.DirChRec(), 100, offset=3) == "cut off"
    empty = struct.pack(">I", 0)
    assert fmt.parse_prefixed(empty, lfs_pb2.DirFile(), 100) is None
    assert fmt.parse_prefixed(empty, lfs_pb2.DirFile(), 100, empty_ok=False) == "bad length 0"
    junk = struct.pack(">I", 3) + b"\xff\xff\xff"
    assert fmt.parse_prefixed(junk, lfs_pb2.DirFile(), 100) == "does not decode"
