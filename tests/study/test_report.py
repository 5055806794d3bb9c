"""The study report: its table, rank orders, CSV and HTML, from stored rows of known values."""

from __future__ import annotations

import csv
import io
import math
import statistics
from pathlib import Path
from typing import Any

import pytest

from fsage.reports.study import study_csv, study_html, study_table, study_text
from fsage.study.store import StudyRow


def _result(fs: str, step: int, aged: float, clean: float, score: float) -> dict[str, Any]:
    return {
        "fs": fs,
        "step": step,
        "layout_score": score,
        "block_size": 4096,
        "blocks_total": 1000,
        "blocks_free": 250,
        "largest_free_extent": 256,
        "locality": {"dynamic_layout_score_path": 0.9},
        "scan": {
            "aged_seconds": aged,
            "clean_seconds": clean,
            "ratio": aged / clean,
            "verdict": "slower",
            "bytes": 2**29,
            "files": 10,
            "aged_s_per_gib": aged * 2,
            "clean_s_per_gib": clean * 2,
            "trace": {"score": 0.8},
        },
        "modeled": {"hdd": {"aged_seconds": aged * 10, "clean_seconds": clean * 10, "ratio": 1.5}},
        "age": {"nospace": 0},
    }


def _study() -> StudyRow:
    results = [
        _result("ext4", 1, 1.0, 1.0, 1.0),
        _result("x<b>fs", 1, 2.0, 1.0, 1.0),
        _result("ext4", 2, 3.0, 1.0, 0.9),
        _result("x<b>fs", 2, 2.5, 1.0, 0.95),
        {"fs": "lfs", "step": 1, "error": "measuring: broken"},
    ]
    params = {"filesystems": ["ext4", "x<b>fs", "lfs"], "workload": "preset:mail", "size": 2**30,
              "steps": 2, "seed": 1}  # fmt: skip
    return StudyRow(1, "2026-01-01T00:00:00+00:00", "/tmp/s", params, None, results)


def test_table_rows_ranks_and_failures() -> None:
    t = study_table(_study())
    assert [(r["fs"], r["step"]) for r in t["rows"]] == [
        ("ext4", 1), ("x<b>fs", 1), ("ext4", 2), ("x<b>fs", 2)
    ]  # fmt: skip
    r = t["rows"][2]
    assert r["aged_s_per_gib"] == 6.0 and r["ratio"] == 3.0 and r["gib"] == 0.5
    assert r["free_share"] == 0.25 and r["largest_free_mib"] == 1.0
    assert r["dynamic_score"] == 0.8 and r["hdd_aged_s"] == 30.0
    rank = t["rank_order"]["scan_aged_s_per_gib"]
    assert rank["fresh"] == ["ext4", "x<b>fs"] and rank["aged"] == ["x<b>fs", "ext4"]
    assert rank["changed"] is True
    assert t["failures"] == [{"fs": "lfs", "step": 1, "error": "measuring: broken"}]
    text = study_text(_study())
    assert "lfs left the study at step 1: measuring: broken" in text
    assert "(changed: ext4 / x<b>fs)" in text


def test_csv_has_a_row_per_step_and_file_system() -> None:
    rows = list(csv.DictReader(io.StringIO(study_csv(_study()))))
    assert len(rows) == 4
    assert rows[3]["fs"] == "x<b>fs" and float(rows[3]["ratio"]) == 2.5


def test_html_is_self_contained_and_escaped(tmp_path: Path) -> None:
    out = tmp_path / "s.html"
    study_html(_study(), out)
    text = out.read_text()
    assert "x<b>fs" not in text
    assert "x&lt;b&gt;fs" in text or "x\\u003cb\\u003efs" in text
    assert "<script src" not in text
    assert "left the study at step 1" in text


def test_the_aged_rank_is_taken_where_every_file_system_was_still_measured() -> None:
    s = _study()
    s.results.append(_result("ext4", 3, 0.5, 1.0, 0.9))  # x<b>fs left before step 3
    rank = study_table(s)["rank_order"]["scan_aged_s_per_gib"]
    assert rank["last_step"] == 2
    assert rank["aged"] == ["x<b>fs", "ext4"]


def test_fresh_vs_aged_rank_compares_the_clean_copies_with_the_aged_trees() -> None:
    # step 2: clean copies ext4 1.0 < x<b>fs 1.0 (name order on a tie), aged ext4 3.0 > 2.5
    rank = study_table(_study())["rank_order"]["scan_clean_vs_aged"]
    assert rank["last_step"] == 2
    assert rank["fresh"] == ["ext4", "x<b>fs"] and rank["aged"] == ["x<b>fs", "ext4"]
    assert rank["changed"] is True


def _with_rounds(spread: float) -> StudyRow:
    """Steps 1 and 2 swap ext4 and x<b>fs by aged scan time; each scan timed in 4 rounds
    spread by ``spread`` around the stored median."""
    s = _study()
    for r in s.results:
        sc = r.get("scan")
        if sc:
            a = sc["aged_seconds"]
            sc["aged_values"] = [a * (1 + spread * d) for d in (-1.0, -0.3, 0.3, 1.0)]
    return s


def _t_interval(values: list[float]) -> tuple[float, float]:
    # 95 % t interval of the geometric mean, t(0.975, 3) = 3.18245 from a printed table
    logs = [math.log(v) for v in values]
    half = 3.18245 * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(statistics.fmean(logs) - half), math.exp(statistics.fmean(logs) + half)


@pytest.mark.parametrize("spread", [0.02, 0.6])
def test_a_swap_counts_as_a_change_only_beyond_the_intervals(spread: float) -> None:
    s = _with_rounds(spread)
    rows = study_table(s)["rows"]
    spans = {}
    for r, res in zip(rows, [x for x in s.results if "error" not in x], strict=True):
        lo, hi = _t_interval(res["scan"]["aged_values"])
        gib = res["scan"]["bytes"] / 2**30
        assert r["aged_s_per_gib_low"] == pytest.approx(lo / gib, rel=1e-4)
        assert r["aged_s_per_gib_high"] == pytest.approx(hi / gib, rel=1e-4)
        spans[(r["fs"], r["step"])] = (lo, hi)

    def apart(step: int) -> bool:
        (a0, a1), (b0, b1) = spans[("ext4", step)], spans[("x<b>fs", step)]
        return a1 < b0 or b1 < a0

    rank = study_table(s)["rank_order"]["scan_aged_s_per_gib"]
    assert rank["fresh"] == ["ext4", "x<b>fs"] and rank["aged"] == ["x<b>fs", "ext4"]
    want = "changed" if apart(1) and apart(2) else "same within noise"
    assert rank["verdict"] == want and rank["changed"] is (want == "changed")
    assert (spread < 0.1) is (want == "changed")  # both cases are exercised
    assert f"({want}" in study_text(s)


def test_seed_001_disks_are_in_the_table_and_the_page(tmp_path: Path) -> None:
    s = _study()
    s.results[0]["modeled"]["lfs-15ms"] = {"aged_seconds": 4.0, "clean_seconds": 2.0, "ratio": 2.0}
    row = study_table(s)["rows"][0]
    assert row["lfs-15ms_aged_s"] == 4.0 and row["lfs-15ms_ratio"] == 2.0
    assert row["hp97560_ratio"] is None  # not modeled in this row
    out = tmp_path / "s.html"
    study_html(s, out)
    text = out.read_text()
    assert "seed 001&#x27;s disks" in text or "seed 001's disks" in text
    assert "15 ms, 5 MB/s aged (s)" in text and "HP97560" in text


def test_an_unknown_largest_free_extent_is_not_drawn_as_zero() -> None:
    s = _study()
    s.results[0]["largest_free_extent"] = 0  # free blocks counted, no extents listed
    s.results[1]["largest_free_extent"] = 0
    s.results[1]["blocks_free"] = 0  # a full file system: its largest is 0
    rows = study_table(s)["rows"]
    assert rows[0]["largest_free_mib"] is None and rows[1]["largest_free_mib"] == 0.0


def test_the_ratio_interval_is_shown_and_drawn(tmp_path: Path) -> None:
    s = _study()
    s.results[0]["scan"].update(ci_low=0.8, ci_high=1.3, rounds=7)
    row = study_table(s)["rows"][0]
    assert row["ratio_interval"] == "0.80-1.30" and row["rounds"] == 7
    out = tmp_path / "s.html"
    study_html(s, out)
    text = out.read_text()
    assert '"arrayminus"' in text and "0.80-1.30" in text


def _db(tmp_path: Path) -> Path:
    from fsage.db.store import Store
    from fsage.study.store import create_study, save_result

    db = tmp_path / "s.db"
    s = _study()
    with Store.open(db, create=True) as store:
        sid = create_study(store, tmp_path / "out", s.params)
        for r in s.results:
            save_result(store, sid, r["step"], r["fs"], {k: v for k, v in r.items()
                                                         if k not in ("step", "fs")})  # fmt: skip
    return db


def test_fsage_report_study_writes_the_study_page(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from fsage.cli import main

    db = _db(tmp_path)
    out = tmp_path / "r.html"
    res = CliRunner().invoke(main, ["report", "--study", "1", "--db", str(db), "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "study 1" in res.output and "figure(s)" in res.output
    text = out.read_text()
    assert "Rank order, fastest first" in text and "Modeled on disks" in text
    res = CliRunner().invoke(main, ["report", "--study", "2", "--db", str(db), "-o", str(out)])
    assert res.exit_code != 0 and "no study 2" in res.output
    assert "Traceback" not in res.output
    res = CliRunner().invoke(
        main, ["report", "--study", "1", "--fs", "ext4", "--db", str(db), "-o", str(out)]
    )
    assert res.exit_code != 0 and "drop --fs" in res.output


@pytest.mark.chromium
@pytest.mark.slow
def test_the_study_page_draws_in_chromium(tmp_path: Path) -> None:
    """Every figure draws, none overlaps another's text or leaves its box (the page's own
    layout checks, as for `fsage report`)."""
    import re
    import shutil

    from tests.reports.test_report import CHROMIUM, _chromium_dom

    if not Path(CHROMIUM).exists() and shutil.which("chromium") is None:
        pytest.skip("chromium not installed")
    out = tmp_path / "s.html"
    n = study_html(_study(), out)
    dom = _chromium_dom(out, tmp_path / "profile")
    body = re.search(r"<body([^>]*)>", dom)
    assert body, dom[:500]
    attrs = body.group(1)
    assert 'data-done="1"' in attrs and "data-errors" not in attrs
    assert f'data-plots="{n}"' in attrs and f'data-plots-drawn="{n}"' in attrs
    assert re.findall(r'data-overlaps="([^"]*)"', dom) == [""] * n
    assert re.findall(r'data-overflow="([^"]*)"', dom) == ["0"] * n


def test_a_missing_trace_names_its_steps() -> None:
    """A gap in the trace figure is named by step; a file system never traced is said once."""
    from fsage.reports.study import _untraced_notes

    rows = [{"fs": "ext4", "step": s, "dynamic_score": None if s == 5 else 0.9} for s in (1, 5, 6)]
    rows += [{"fs": "lfs", "step": s, "dynamic_score": None} for s in (1, 2)]
    rows += [{"fs": "xfs", "step": s, "dynamic_score": 0.95} for s in (1, 2)]
    assert _untraced_notes(rows) == ["ext4: no block trace at step 5.", "lfs: no block trace."]
