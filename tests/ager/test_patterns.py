"""Write patterns and the presets built from them: the streams they generate run on a real
directory and an offline ext image and leave exactly the tree the generator's model holds."""

from __future__ import annotations

import collections
import subprocess
from pathlib import Path

import pytest

from fsage.ager.generator import Generator
from fsage.ager.images import make_image
from fsage.ager.patterns import PATTERN_KINDS, PATTERNS, PRESET_DOCS
from fsage.ager.posix import PosixExecutor
from fsage.ager.profile import MIX_KINDS, get_preset
from fsage.workload import NoSpaceError, Op

from .helpers import tree_of

MIB = 1 << 20
PRESETS = ("desktop", "news", "vcs", "database", "mail")


def _ops(name: str, capacity: int, seed: int = 1, churn: float = 0.5) -> tuple[Generator, list[Op]]:
    gen = Generator(get_preset(name).with_overrides(fill=0.6, churn=churn), seed, capacity)
    return gen, list(gen.ops())


def _model_tree(gen: Generator) -> dict[str, int]:
    out = {p: r.size for p, r in gen.files.items()}
    out.update({d + "/": -1 for d in gen.dir_depth if d})
    return out


def test_patterns_are_mix_kinds_and_documented() -> None:
    assert set(PATTERN_KINDS) <= set(MIX_KINDS)
    for name in PRESETS:
        prof = get_preset(name)
        assert set(prof.mix) & set(PATTERN_KINDS), name
        assert name in PRESET_DOCS
    assert all(len(PATTERNS[k]) > 40 for k in PATTERN_KINDS)


@pytest.mark.parametrize("name", PRESETS)
def test_preset_stream_runs_on_a_directory_and_matches_the_model(tmp_path: Path, name: str) -> None:
    # desktop's prealloc is 4% of its mix, and mail's bursts of 128 files use up much of a
    # churn: a churn of one capacity gives their rarer patterns room to run.
    gen, ops = _ops(name, 16 * MIB, churn=1.0 if name in ("desktop", "mail") else 0.5)
    counts = collections.Counter(op.op for op in ops)
    with PosixExecutor(tmp_path) as ex:
        for op in ops:
            ex.apply(op)
    assert tree_of(tmp_path) == _model_tree(gen)
    # Each preset issues the ops of its patterns.
    want = {
        "desktop": {"rename", "fsync", "sync", "fallocate", "append"},
        "news": {"create", "delete", "fsync"},
        "vcs": {"rename", "mkdir", "delete"},
        "database": {"overwrite", "punch", "fsync", "append"},
        "mail": {"append", "sync", "create", "delete"},  # a burst is ~a third of 16 MiB
    }[name]
    assert want <= set(counts), counts
    # Bulk tree removal removes directories too.
    if name == "vcs":
        made = counts["mkdir"]
        assert sum(1 for d in gen.dir_depth if d) < made


def test_news_spool_expires_oldest_first() -> None:
    gen, ops = _ops("news", 16 * MIB, seed=3, churn=1.0)
    created = [op.path for op in ops if op.op == "create" and op.path.endswith(".art")]
    deleted = [op.path for op in ops if op.op == "delete" and op.path.endswith(".art")]
    assert len(deleted) > 1000
    assert deleted == created[: len(deleted)]  # FIFO expiry
    assert abs(gen.fullness() - 0.6) <= 0.006


@pytest.mark.parametrize("name", ["desktop", "database"])
def test_preset_on_offline_ext_image(tmp_path: Path, name: str) -> None:
    pytest.importorskip("fsage._ext2fs")
    from fsage.ager.offline import OfflineExtExecutor

    img = make_image(tmp_path / "e.img", "ext4", 64 * MIB)
    ex = OfflineExtExecutor(img)
    bs, total, _used = ex.capacity_blocks()
    prof = get_preset(name).with_overrides(fill=0.6, churn=0.5)
    gen = Generator(prof, 5, total * bs, probe=ex.capacity_blocks, block_size=bs)
    kinds: collections.Counter[str] = collections.Counter()
    for op in gen.ops():
        kinds[op.op] += 1
        try:
            ex.apply(op)
        except NoSpaceError:
            gen.nospace(op)
    full = gen.fullness()
    ex.close()
    fsck = subprocess.run(["e2fsck", "-fn", str(img)], capture_output=True, text=True)
    assert fsck.returncode == 0, fsck.stdout
    assert kinds["punch"] + kinds["fallocate"] > 0
    assert abs(full - 0.6) <= 0.01


@pytest.mark.needs_root
def test_fill_out_of_inodes_stops_with_the_cause(tmp_path: Path) -> None:
    # 256 inodes hold ~0.8 MiB of articles: the fill of 0.8 of 32 MiB can never be reached.
    from fsage.ager.run import AgeOptions, age
    from fsage.errors import FsageError

    img = tmp_path / "few-inodes.img"
    with open(img, "wb") as fh:
        fh.truncate(32 * MIB)
    subprocess.run(["mkfs.ext4", "-F", "-q", "-N", "256", str(img)], check=True)
    prof = get_preset("news").with_overrides(fill=0.8, churn=0.0, ops_limit=200_000)
    with pytest.raises(FsageError, match="inodes of the file system are in use"):
        age(img, AgeOptions(profile=prof, seed=1, mode="mount"))


def test_trickle_interleaves_small_files_in_one_directory() -> None:
    from fsage.ager.profile import Profile

    prof = Profile(name="t", mix={"trickle": 1.0}, fill=0.5, churn=0.5)
    gen = Generator(prof, 2, 16 * MIB)
    ops = list(gen.ops())
    first = next(i for i, op in enumerate(ops) if op.op == "append")
    # A round: one piece appended to each of the 32 files, then a sync.
    round_ = ops[first : first + 33]
    assert [op.op for op in round_] == ["append"] * 32 + ["sync"]
    assert len({op.path for op in round_[:32]}) == 32
    assert len({op.path.rpartition("/")[0] for op in round_[:32]}) == 1  # one directory
    assert all(op.size <= 8 * 1024 for op in round_[:32])
    # The files end at their own sizes, in the model as in the stream.
    grown = collections.Counter()
    for op in ops:
        if op.op == "append":
            grown[op.path] += op.size
    assert {p: n for p, n in grown.items() if p in gen.files} == {
        p: gen.files[p].size for p in grown if p in gen.files
    }
