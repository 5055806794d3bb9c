"""Convergence mode: Geriatrix profiles read as Geriatrix reads them, histograms kept
incrementally, a chi-square test computed on counts, and no claim of convergence it did not
reach."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from fsage.ager.distributions import MIB
from fsage.ager.generator import Generator, chi2_sf, chi_square_test
from fsage.ager.profile import Histogram, Profile, load_profile
from fsage.errors import WorkloadError

# Geriatrix's "agrawal" profile (its three distribution files).
AGRAWAL = {
    "size_distribution.txt": "11\n8 1\n32 7\n128 16\n512 40\n2048 50\n8192 46\n32768 35\n"
    "131072 20\n524288 10\n2097152 4\n8388608 1\n",
    "age_distribution.txt": "10\n10.74 1\n31 2\n85.98 8\n240 20\n687.87 44\n1945.59 75\n"
    "5502.98 144\n15768 146\n44023.9 23\n122640 1\n",
    "dir_distribution.txt": "15\n1 1 1\n2 2 5\n3 14 13\n4 15 19\n5 23 30\n6 24 36\n7 42 32\n"
    "8 22 26\n9 15 22\n10 12 17\n11 7 8\n12 4 5\n13 3 2\n14 2 1\n15 1 1\n",
}


def _profile_dir(tmp: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (tmp / name).write_text(text)
    return tmp


def test_agrawal_read_as_geriatrix_reads_it(tmp_path: Path) -> None:
    prof = load_profile(str(_profile_dir(tmp_path, AGRAWAL)))
    assert prof.mode == "convergence" and prof.age_relative
    assert prof.mix == {"create": 0.5, "delete": 0.5}
    assert prof.age_hist is not None and prof.depth_hist is not None
    # Age bucket edges are fractions of the run: 10.74 of 122640 ops, ..., 1.
    assert prof.age_hist.edges[0] == pytest.approx(10.74 / 122640)
    assert prof.age_hist.edges[-1] == 1.0
    assert prof.depth_dirs == (1, 5, 13, 19, 30, 36, 32, 26, 22, 17, 8, 5, 2, 1, 1)


def test_agrawal_fill_on_2gib(tmp_path: Path) -> None:
    """Known answers: Geriatrix's tree for agrawal has 222 directories (218 sibling
    directories and the chain d1/.../d14 where a depth has fewer siblings than its number);
    filling 0.8 of 2 GiB with agrawal's mean file (26,290,408 bytes per 230 files, 115,792
    bytes once small files take a whole 4 KiB block) makes 0.8 * 2 GiB / 115,792 = 14,837
    files; the fill has no deletes and writes no more than the fill."""
    cap = 2 << 30
    prof = load_profile(str(_profile_dir(tmp_path, AGRAWAL))).with_overrides(churn=0.0)
    gen = Generator(prof, 3, cap)
    ops = list(gen.ops())
    assert gen.stats.counts == {"mkdir": 222, "create": len(gen.files)}
    assert abs(len(gen.files) - 14_837) < 30
    assert gen.stats.bytes_written <= 0.806 * cap
    sizes = {int(e) for e in AGRAWAL_SIZES}
    assert {f.size for f in gen.files.values()} == sizes  # bucket values, nothing between
    for path, rec in gen.files.items():
        assert path.count("/") == rec.depth  # depth d: d directories above the file
        assert 1 <= rec.depth <= 15
    # Files at depth 3 are spread over the 13 siblings d1/d2/d1 .. d1/d2/d13.
    parents = {gen.files[o.path].parent for o in ops if o.op == "create"}
    at3 = {p for p in parents if gen.dir_depth[p] == 3}
    assert at3 == {f"d1/d2/d{k}" for k in range(1, 14)}
    chain14 = "/".join(f"d{k}" for k in range(1, 15))
    assert {p for p in parents if gen.dir_depth[p] == 15} == {f"{chain14}/d1"}
    rep = gen.convergence_report()
    assert rep["histograms"]["size"]["passed"] and rep["histograms"]["depth"]["passed"]
    # The fill alone cannot give agrawal's ages: fsage says so.
    assert not rep["converged"] and not rep["histograms"]["age"]["passed"]
    assert gen.stats.converged_at is None


AGRAWAL_SIZES = [8, 32, 128, 512, 2048, 8192, 32768, 131072, 524288, 2097152, 8388608]


def _brute(gen: Generator) -> dict[str, list[int]]:
    p = gen.profile
    now = gen.stats.ops
    out: dict[str, list[int]] = {}
    for key, hist in (("size", p.size_hist), ("age", p.age_hist), ("depth", p.depth_hist)):
        if hist is None:
            continue
        counts = [0] * len(hist.edges)
        for rec in gen.files.values():
            if key == "size":
                v: float = rec.size
            elif key == "age":
                # Relative edges are fractions of the planned end (of the ops so far before
                # the plan is fixed).
                scale = (gen.age_plan or now) if p.age_relative else 1
                v = (now - rec.born) / scale if scale else 0.0
            else:
                v = rec.depth
            counts[hist.bucket(v)] += 1
        out[key] = counts
    return out


@pytest.mark.parametrize("relative", [True, False])
def test_incremental_histograms_match_a_full_count(relative: bool) -> None:
    prof = Profile(
        name="t",
        mode="convergence",
        fill=0.6,
        churn=3.0,
        mix={"create": 1, "delete": 1, "rename": 0.2, "append": 0.2, "truncate": 0.1},
        size_hist=Histogram((4096.0, 16384.0, 65536.0), (2, 1, 1)),
        age_hist=Histogram((0.05, 0.3, 1.0) if relative else (50.0, 500.0, 5000.0), (1, 2, 1)),
        age_relative=relative,
        depth_hist=Histogram((0.0, 1.0, 2.0, 4.0), (1, 2, 2, 1)),
        depth_dirs=(0, 3, 2, 0),
        confidence=0.999999,
        tolerance=0.0,  # never converges: the run goes on to its budget
    )
    gen = Generator(prof, 5, 32 * MIB)
    checked = 0
    for i, _op in enumerate(gen.ops()):
        if i % 997 == 0 and gen.stats.ops:
            assert gen.histogram_counts() == _brute(gen)
            checked += 1
    assert checked >= 5
    assert gen.histogram_counts() == _brute(gen)
    assert gen.stats.counts.get("rename", 0) > 0


def _small_profile(churn: float) -> Profile:
    return Profile(
        name="small",
        mode="convergence",
        fill=0.5,
        churn=churn,
        mix={"create": 0.5, "delete": 0.5},
        size_hist=Histogram((4096.0, 32768.0, 262144.0), (5, 3, 2)),
        age_hist=Histogram((0.1, 0.5, 1.0), (3, 5, 2)),
        age_relative=True,
        depth_hist=Histogram((1.0, 2.0), (1, 1)),
        depth_dirs=(2, 4),
        check_every=200,
    )


def test_converges_and_says_so() -> None:
    gen = Generator(_small_profile(churn=50.0), 2, 64 * MIB)
    n = sum(1 for _ in gen.ops())
    rep = gen.convergence_report()
    assert rep["converged"] and gen.stats.converged_at == rep["ops"]
    assert n < gen.stats.converged_at + 1  # stopped there, well short of the budget
    assert gen.stats.bytes_written < 20 * 64 * MIB
    for h in rep["histograms"].values():
        assert h["passed"] and h["p_value"] >= 0.05 and h["max_diff"] <= 0.02


def test_short_churn_is_honoured_and_not_called_converged() -> None:
    cap = 64 * MIB
    gen = Generator(_small_profile(churn=0.3), 2, cap)
    for _ in gen.ops():
        pass
    st = gen.stats
    assert st.fill_bytes is not None and st.fill_bytes <= 0.506 * cap
    after = st.bytes_written - st.fill_bytes
    assert 0.3 * cap <= after < 0.3 * cap + 262144
    rep = gen.convergence_report()
    assert not rep["converged"] and st.converged_at is None
    assert not rep["histograms"]["age"]["passed"]


def test_chi_square_merges_small_buckets() -> None:
    # n = 100: expected 50, 30, 19, 1 -> the last bucket joins the third (20 expected).
    r = chi_square_test([0.5, 0.3, 0.19, 0.01], [45, 35, 17, 3], 0.95)
    assert r["groups"] == [[0, 0], [1, 1], [2, 3]]
    chi2 = 25 / 50 + 25 / 30 + 0 / 20
    assert r["chi2"] == pytest.approx(chi2)
    assert r["dof"] == 2
    assert r["p_value"] == pytest.approx(math.exp(-chi2 / 2))  # chi-square(2) tail
    assert r["passed"]
    # Way off: 0.95 confidence rejects.
    bad = chi_square_test([0.5, 0.5], [70, 30], 0.95)
    assert bad["chi2"] == pytest.approx(16.0) and not bad["passed"]
    assert bad["p_value"] == pytest.approx(chi2_sf(16.0, 1))
    # A file where the target has none can never pass.
    assert not chi_square_test([1.0, 0.0], [99, 1], 0.95)["passed"]
    # Too few files to test two buckets.
    assert not chi_square_test([0.5, 0.5], [2, 2], 0.95)["passed"]


def test_bad_geriatrix_files(tmp_path: Path) -> None:
    files = dict(AGRAWAL)
    files["dir_distribution.txt"] = "2\n1 1\n2 1\n"  # no sub-directory column
    with pytest.raises(WorkloadError, match="Geriatrix"):
        load_profile(str(_profile_dir(tmp_path, files)))
    with pytest.raises(WorkloadError, match="depth_dirs"):
        Profile(
            name="x",
            mode="convergence",
            size_hist=Histogram((1.0,), (1.0,)),
            depth_hist=Histogram((1.0, 2.0), (1.0, 1.0)),
            depth_dirs=(1,),
        )


def test_age_ops_needed_is_geriatrix_plan(tmp_path: Path) -> None:
    """Geriatrix's calculateT from the raw files: bucket i spans (c[i-1], c[i]] / c[-1] of the
    ops and needs weight[i] / sum(weights) of the files, one born every other op; agrawal's
    third bucket (86 - 31 of 122640 ops for 8/464 of the files) bounds it."""
    prof = load_profile(str(_profile_dir(tmp_path, AGRAWAL)))
    rows = [ln.split() for ln in AGRAWAL["age_distribution.txt"].splitlines()[1:]]
    cut = [float(r[0]) for r in rows]
    w = [float(r[1]) for r in rows]
    by_hand = max(
        2 * (w[i] / sum(w)) * 14_850 / ((cut[i] - (cut[i - 1] if i else 0.0)) / cut[-1])
        for i in range(len(cut) - 1)
    )
    assert 1_142_000 < by_hand < 1_143_000
    gen = Generator(prof, 1, 2 << 30)
    assert gen.age_ops_needed(14_850) == math.ceil(by_hand)


def test_agrawal_ages_are_measured_against_the_planned_end(tmp_path: Path) -> None:
    """Agrawal on 32 MiB (about 220 files), model only. The plan (Geriatrix's op count for
    the files the fill made) is fixed when the fill ends; age bucket edges are fractions of
    it, in ops; deletions aim at the ages the files will have at the plan's end, so the age
    histogram passes there, and not before: the young buckets are over-full until then."""
    prof = load_profile(str(_profile_dir(tmp_path, AGRAWAL))).with_overrides(churn=100.0)
    for seed in (1, 2, 3):
        gen = Generator(prof, seed, 32 * MIB)
        plan = None
        filled = 0  # files when the fill ended
        early: list[bool] = []
        for _ in gen.ops():
            st = gen.stats
            if st.phase == "fill":
                filled = len(gen.files)
            elif plan is None:
                plan = gen.age_plan
                assert plan == gen.age_ops_needed(filled) and plan > 10 * st.ops
            if plan is not None and st.ops in (plan // 4, plan // 2, (plan * 3) // 4):
                early.append(gen.convergence_report()["histograms"]["age"]["passed"])
        assert plan is not None and gen.age_plan == plan  # fixed, not moved by the churn
        assert early == [False, False, False]
        rep = gen.convergence_report()
        assert rep["age_planned_end"] == plan == rep["age_reachable_at"]
        assert gen.stats.stopped_by == "converged" and rep["converged"]
        assert gen.stats.converged_at is not None and gen.stats.converged_at >= plan
        age = rep["histograms"]["age"]
        assert age["passed"] and age["max_diff"] <= prof.tolerance
        assert gen.histogram_counts() == _brute(gen)  # edges: fractions of the plan, in ops
    from fsage.cli.age import convergence_lines

    assert f"(fraction of the planned {plan:,} ops)" in "\n".join(convergence_lines(rep))


@pytest.mark.slow
def test_agrawal_converges_after_geriatrix_plan_not_before_claiming_it(tmp_path: Path) -> None:
    """Agrawal on 256 MiB (about 1,850 files), model only: with a budget of 100 capacities
    the run goes on past the fill until every histogram passes — the ages at the planned end
    (141k ops), where the old ages relative to the ops so far passed by chance at 91k ops
    with a chi-square of 12.2 — and says so only then."""
    prof = load_profile(str(_profile_dir(tmp_path, AGRAWAL))).with_overrides(churn=100.0)
    gen = Generator(prof, 1, 256 * MIB)
    for _ in gen.ops():
        pass
    rep = gen.convergence_report()
    plan = gen.age_plan
    assert plan is not None and plan > 100_000
    assert gen.stats.stopped_by == "converged" and rep["converged"]
    assert gen.stats.converged_at is not None and gen.stats.converged_at >= plan
    for h in rep["histograms"].values():
        assert h["passed"] and h["max_diff"] <= prof.tolerance
    assert rep["histograms"]["age"]["chi2"] < 6.0


def test_report_says_how_many_ops_the_age_histogram_needs(tmp_path: Path) -> None:
    from fsage.cli.age import convergence_lines

    prof = load_profile(str(_profile_dir(tmp_path, AGRAWAL))).with_overrides(churn=0.5)
    gen = Generator(prof, 1, 64 * MIB)
    for _ in gen.ops():
        pass
    rep = gen.convergence_report()
    assert not rep["converged"] and gen.stats.stopped_by == "churn"
    need = gen.age_ops_needed()
    assert need is not None and rep["age_reachable_at"] == need > rep["ops"]
    text = "\n".join(convergence_lines(rep))
    assert text.startswith("NOT converged") and f"needs about {need:,} ops" in text
