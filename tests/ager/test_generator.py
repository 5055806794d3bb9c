"""Generator and distributions: determinism, sampled sizes against each preset, phases."""

from __future__ import annotations

import gzip
import math
import random
from pathlib import Path

import numpy as np
import pytest

from fsage.ager.distributions import (
    HFS_SURGE,
    IMPRESSIONS,
    KIB,
    MIB,
    HybridSize,
    fit_sizes,
    ks_critical,
    ks_statistic,
)
from fsage.ager.generator import Generator, chi2_sf, generate
from fsage.ager.profile import Profile, get_preset, load_profile, parse_geriatrix
from fsage.errors import WorkloadError
from fsage.workload import read_workload, write_workload

CAP = 64 * MIB


def _write(tmp: Path, name: str, profile: str, seed: int) -> bytes:
    header, ops = generate(load_profile(profile), seed, CAP)
    write_workload(tmp / name, header, ops)
    return (tmp / name).read_bytes()


def test_same_seed_same_bytes(tmp_path: Path) -> None:
    a = _write(tmp_path, "a.jsonl", "hfs-surge", 11)
    b = _write(tmp_path, "b.jsonl", "hfs-surge", 11)
    c = _write(tmp_path, "c.jsonl", "hfs-surge", 12)
    assert a == b
    assert a != c
    gz1 = _write(tmp_path, "a.jsonl.gz", "hfs-surge", 11)
    gz2 = _write(tmp_path, "b.jsonl.gz", "hfs-surge", 11)
    assert gz1 == gz2 and gzip.decompress(gz1) == a


def test_header_records_generator_params_seed(tmp_path: Path) -> None:
    _write(tmp_path, "a.jsonl", "hfs-aging", 5)
    header, ops = read_workload(tmp_path / "a.jsonl")
    assert header.generator == "fsage.ager/hybrid"
    assert header.seed == 5
    assert header.params["capacity"] == CAP
    assert header.params["profile"]["name"] == "hfs-aging"
    n = sum(1 for _ in ops)
    assert n == 10_000  # seed 004: the 10k-op aging benchmark


@pytest.mark.parametrize("dist", [HFS_SURGE, IMPRESSIONS], ids=["hfs-surge", "impressions"])
def test_ks_100k_sizes_match_preset(dist: HybridSize) -> None:
    rng = random.Random(2024)
    sample = np.array([dist.sample_float(rng) for _ in range(100_000)])
    d = ks_statistic(sample, dist)
    assert d < ks_critical(100_000, 0.01)
    # The same sample is far from a lognormal with a shifted body: the test can fail.
    wrong = HybridSize(dist.mu + 0.1, dist.sigma, dist.weight, dist.xm, dist.alpha)
    assert ks_statistic(sample, wrong) > 3 * ks_critical(100_000, 0.01)


def test_preset_parameters_are_the_seeds() -> None:
    assert (HFS_SURGE.mu, HFS_SURGE.sigma, HFS_SURGE.weight) == (9.357, 1.318, 0.93)
    assert (HFS_SURGE.xm, HFS_SURGE.alpha) == (133 * KIB, 1.1)
    assert (IMPRESSIONS.mu, IMPRESSIONS.sigma, IMPRESSIONS.weight) == (9.48, 2.46, 0.99994)
    assert (IMPRESSIONS.xm, IMPRESSIONS.alpha) == (512 * MIB, 0.91)
    # Median of the body: e^mu bytes; the sample median of the hybrid sits just above it.
    rng = random.Random(1)
    s = sorted(HFS_SURGE.sample_float(rng) for _ in range(20_001))
    assert math.exp(9.357) < s[10_000] < math.exp(9.357) * 1.15


def test_cap_clips_sizes() -> None:
    rng = random.Random(3)
    sizes = [IMPRESSIONS.sample(rng, cap=1 * MIB) for _ in range(10_000)]
    assert max(sizes) == 1 * MIB  # the tail is heavy enough to hit the cap
    assert min(sizes) >= 0


def test_fit_recovers_parameters() -> None:
    rng = random.Random(9)
    true = HybridSize(mu=9.0, sigma=1.2, weight=0.95, xm=200 * KIB, alpha=1.4)
    sizes = [round(true.sample_float(rng)) for _ in range(50_000)] + [0] * 500
    fit = fit_sizes(sizes)
    assert abs(fit.mu - 9.0) < 0.15
    assert abs(fit.sigma - 1.2) < 0.15
    assert fit.zero == pytest.approx(500 / 50_500)
    assert ks_statistic(sizes, fit) < 0.01


def test_fit_from_layout() -> None:
    from fsage.layout import FileTable, FreeExtents, FsFacts, Layout, LinkTable

    rng = random.Random(4)
    sizes = np.array([round(HFS_SURGE.sample_float(rng)) for _ in range(5000)], np.uint64)
    files = FileTable.empty()
    n = len(sizes) + 1
    cols = {k: np.zeros(n, getattr(files, k).dtype) for k in ("ino", "generation", "mode")}
    table = FileTable(
        ino=np.arange(2, n + 2, dtype=np.uint64),
        generation=cols["generation"],
        mode=np.array([0o40755] + [0o100644] * len(sizes), np.uint32),
        nlink=np.ones(n, np.uint32),
        uid=np.zeros(n, np.uint32),
        gid=np.zeros(n, np.uint32),
        size=np.concatenate([[np.uint64(4096)], sizes]).astype(np.uint64),
        atime=np.zeros(n, np.int64),
        mtime=np.zeros(n, np.int64),
        ctime=np.zeros(n, np.int64),
        crtime=np.zeros(n, np.int64),
        flags=np.zeros(n, np.uint32),
        damaged=np.zeros(n, np.uint32),
        ext_off=np.zeros(n + 1, np.uint64),
        ext_logical=np.zeros(0, np.uint64),
        ext_physical=np.zeros(0, np.uint64),
        ext_length=np.zeros(0, np.uint64),
        ext_flags=np.zeros(0, np.uint32),
        meta_off=np.zeros(n + 1, np.uint64),
        meta_physical=np.zeros(0, np.uint64),
        meta_kind=np.zeros(0, np.uint8),
    )
    layout = Layout(
        FsFacts("ext4", "u", "l", 4096, 1000, 10), table, LinkTable.empty(), FreeExtents.empty()
    )
    fit = fit_sizes(layout)
    assert fit.cap == int(sizes.max())
    assert ks_statistic(sizes[sizes > 0], fit) < 0.03
    assert abs(fit.mu - 9.357) < 0.3


def test_fill_phase_reaches_target_in_model() -> None:
    prof = get_preset("hfs-surge").with_overrides(fill=0.6, churn=0.0)
    gen = Generator(prof, 1, 256 * MIB)
    ops = list(gen.ops())
    assert gen.stats.phase == "churn" and gen.stats.fill_ops == len(ops)
    assert 0.6 <= gen.fullness() < 0.62
    # Directories come at about 1 in 64 creates (seed 004).
    creates = sum(1 for o in ops if o.op == "create")
    mkdirs = sum(1 for o in ops if o.op == "mkdir")
    assert 0.5 / 64 < mkdirs / (creates + mkdirs) < 2.0 / 64


def test_churn_writes_k_times_capacity_and_holds_fullness() -> None:
    prof = get_preset("hfs-surge").with_overrides(fill=0.7, churn=1.0)
    gen = Generator(prof, 2, 128 * MIB)
    seen: list[float] = []
    for i, _ in enumerate(gen.ops()):
        if gen.stats.phase == "churn" and i % 50 == 0:
            seen.append(gen.fullness())
    assert gen.stats.fill_bytes is not None
    churned = gen.stats.bytes_written - gen.stats.fill_bytes
    assert 128 * MIB <= churned < 128 * MIB + 64 * MIB
    # Heavy-tailed sizes swing a small fs, but churn holds it around the fill target.
    assert abs(sum(seen) / len(seen) - 0.7) < 0.05
    assert max(seen) < 0.99
    for kind in ("append", "overwrite", "truncate", "rename", "delete"):
        assert gen.stats.counts.get(kind, 0) > 0


def test_deletes_pick_from_sorted_listing() -> None:
    prof = Profile(name="t", mix={"create": 1, "delete": 1}, dir_prob=0.0, churn=0.5)
    gen = Generator(prof, 3, 32 * MIB)
    seen_delete = 0
    for op in gen.ops():
        if op.op == "delete":
            seen_delete += 1
            assert op.path not in gen.files
    assert seen_delete > 10
    # Replaying the same choices against a differently ordered namespace picks the same
    # victims: the model only ever indexes a sorted list.
    assert all(v == sorted(v) for v in gen.dir_files.values())


def test_random_update_preset() -> None:
    prof = get_preset("random-update").with_overrides(fill=0.5)
    gen = Generator(prof, 4, 64 * MIB)
    ops = list(gen.ops())
    written_blocks = sum(o.size for o in ops if o.op == "create") // 4096
    overwrites = [o for o in ops if o.op == "overwrite"]
    assert len(overwrites) == 10 * written_blocks  # seed 001: ten updates per block written
    assert all(o.size == 4096 and o.offset % 4096 == 0 for o in overwrites)
    writes = [i for i, o in enumerate(ops) if o.op in ("create", "overwrite")]
    syncs = [i for i, o in enumerate(ops) if o.op == "sync"]
    assert len(syncs) == len(writes) // 4  # a sync after every fourth write
    assert ops[writes[3] + 1].op == "sync"


def test_prefragment_preset() -> None:
    gen = Generator(get_preset("prefragment"), 5, 64 * MIB)
    ops = list(gen.ops())
    kept = [p for p in gen.files]
    assert all(gen.files[p].size == 8 * 4096 for p in kept)
    share = len(kept) * 8 / (64 * MIB // 4096)
    assert 0.37 < share <= 0.40
    deleted = {o.path for o in ops if o.op == "delete"}
    assert deleted and not deleted & set(kept)


AGRAWAL_SIZE = """11
8 1
32 7
128 16
512 40
2048 50
8192 46
32768 35
131072 20
524288 10
2097152 4
8388608 1
"""


def test_geriatrix_profile_and_convergence(tmp_path: Path) -> None:
    h = parse_geriatrix(AGRAWAL_SIZE)
    assert h.edges[0] == 8 and h.weights[4] == 50 and len(h.edges) == 11
    (tmp_path / "size_distribution.txt").write_text(AGRAWAL_SIZE)
    (tmp_path / "dir_distribution.txt").write_text("3\n1 1 1\n2 2 5\n3 4 13\n")
    prof = load_profile(str(tmp_path)).with_overrides(fill=0.5, churn=1.0, check_every=200)
    assert prof.mode == "convergence"
    gen = Generator(prof, 6, 64 * MIB)
    for _ in gen.ops():
        pass
    rep = gen.convergence_report()
    assert rep["converged"]
    assert rep["histograms"]["size"]["max_diff"] <= 0.02
    assert rep["histograms"]["depth"]["max_diff"] <= 0.02
    assert gen.stats.converged_at is not None
    assert sum(rep["histograms"]["size"]["ideal"]) == pytest.approx(1.0)
    with pytest.raises(WorkloadError):
        parse_geriatrix("3\n1 1\n")


def test_chi2_sf_matches_tables() -> None:
    # Standard chi-square table: 5% critical values.
    assert chi2_sf(3.841, 1) == pytest.approx(0.05, abs=2e-4)
    assert chi2_sf(18.307, 10) == pytest.approx(0.05, abs=2e-4)
    assert chi2_sf(6.635, 1) == pytest.approx(0.01, abs=2e-4)


def test_bad_profiles(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="unknown profile"):
        load_profile("no-such-preset")
    bad = tmp_path / "p.json"
    bad.write_text('{"fill": 1.5}')
    with pytest.raises(WorkloadError, match="fill"):
        load_profile(str(bad))
    bad.write_text('{"colour": 1}')
    with pytest.raises(WorkloadError, match="unknown keys"):
        load_profile(str(bad))
    good = tmp_path / "q.json"
    good.write_text('{"base": "hfs-surge", "fill": 0.5, "mix": {"create": 1, "delete": 1}}')
    p = load_profile(str(good))
    assert p.fill == 0.5 and p.sizes == HFS_SURGE and p.name == "q"
