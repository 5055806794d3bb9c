"""Disk model against seed 001 Table 2-5; trends; the analyze command end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from fsage.analyzer import PRESETS, DiskModel, fit_sizes
from fsage.analyzer.history import change_per_month, change_text
from fsage.cli import main

from .images import make_image

MB = 1_000_000


@pytest.mark.parametrize(
    ("seek", "rpm", "mbps", "t8k", "t1m"),
    [
        # seed 001 Table 2-5: average seek, RPM, bandwidth -> 8 KB and 1 MB transfer (ms)
        (16.7, 3600, 2.5, 28.3, 425),  # Fujitsu M2361A
        (8.0, 7200, 9, 13.1, 123),  # Seagate Barracuda 4
        (6.0, 10025, 29, 9.3, 43.5),  # Seagate Cheetah 18
    ],
)
def test_single_request_matches_seed001_table_2_5(
    seek: float, rpm: int, mbps: float, t8k: float, t1m: float
) -> None:
    m = DiskModel("t", "t", mbps * MB, avg_seek_ms=seek, rpm=rpm)
    one = np.array([0], np.int64)
    assert round(float(m.service_ms(one, np.array([8192]))[0]), 1) == t8k
    assert abs(float(m.service_ms(one, np.array([MB]))[0]) - t1m) < 0.5


def test_sequential_requests_pay_transfer_only() -> None:
    m = PRESETS["lfs-15ms"]
    t = m.service_ms(np.array([0, 4096, 100_000]), np.array([4096, 4096, 4096]))
    assert t[0] == pytest.approx(15 + 4096 / 5e6 * 1000)
    assert t[1] == pytest.approx(4096 / 5e6 * 1000)
    assert t[2] == pytest.approx(15 + 4096 / 5e6 * 1000)
    # seek curve averages the published seek over random distances
    d = PRESETS["dsp3105"]
    rng = np.random.default_rng(1)
    x, y = rng.integers(0, d.capacity, (2, 200_000))
    avg = float(d.positioning_ms(x - y).mean()) - d.half_rotation_ms
    assert avg == pytest.approx(9.5, rel=0.01)


def test_change_per_month() -> None:
    # seed 000: 0.064 lost over four months = a change of -0.016 / month; a rise is positive
    days = [0.0, 365.25 / 3]
    assert change_per_month(days, [0.90, 0.836]) == pytest.approx(-0.016)
    assert change_per_month(days, [0.836, 0.90]) == pytest.approx(0.016)
    assert change_per_month([0.0], [0.9]) is None


def test_change_text_keeps_two_significant_digits() -> None:
    assert change_text(-0.00041) == "-0.00041"
    assert change_text(0.000048) == "+0.000048"
    assert change_text(-0.0123) == "-0.0123"
    assert change_text(0.25) == "+0.2500"
    assert change_text(0.0) == "+0.0000"
    assert change_text(None) == "-"


def test_fit_recovers_parameters() -> None:
    rng = np.random.default_rng(3)
    body = rng.lognormal(8.0, 1.5, 50_000)
    fit = fit_sizes(body, threshold=float(body.max()) + 1)
    assert fit is not None
    assert fit.mu == pytest.approx(8.0, abs=0.03) and fit.sigma == pytest.approx(1.5, abs=0.03)
    tail = 1e6 * (1 - rng.random(20_000)) ** (-1 / 1.3)  # Pareto, alpha 1.3, x_min 1e6
    fit2 = fit_sizes(np.concatenate([body[body < 1e6], tail]), threshold=1e6)
    assert fit2 is not None and fit2.alpha == pytest.approx(1.3, rel=0.05)


def test_analyze_command(tmp_path: Path) -> None:
    img = make_image(tmp_path, seed=11, block_size=4096, size_mb=16, files=200, max_bytes=40_000)
    db = tmp_path / "a.db"
    runner = CliRunner()
    assert (
        runner.invoke(main, ["snapshot", str(img), "--db", str(db), "--name", "t"]).exit_code == 0
    )
    r = runner.invoke(main, ["analyze", "--db", str(db), "--format", "json"])
    assert r.exit_code == 0, r.output
    (a,) = json.loads(r.output)["snapshots"]
    assert a["id"] == 1
    assert {"layout_score", "by_size", "free_extents", "largest_free_extent"} <= set(a)
    for row in a["by_size"]:
        assert set(row) >= {"min_blocks", "max_blocks", "files", "layout_score"}
    # by_size is the same files and blocks as the totals
    assert sum(r["files"] for r in a["by_size"]) == a["scored_files"]
    assert sum(b["blocks"] for b in a["free_extents"]) == a["blocks_free"]
    top = a["free_extents"][-1]
    assert top["min_blocks"] <= a["largest_free_extent"] <= top["max_blocks"]
    for by in ("size", "dir", "age"):
        t = runner.invoke(main, ["analyze", "--db", str(db), "--by", by])
        assert t.exit_code == 0, t.output
        c = runner.invoke(main, ["analyze", "--db", str(db), "--by", by, "--format", "csv"])
        assert c.exit_code == 0 and c.output.startswith("id,fs,")
    bad = runner.invoke(main, ["analyze", "--db", str(db), "--snapshot", "99"])
    assert bad.exit_code != 0 and "fsage: error: no snapshot 99" in bad.output
    missing = runner.invoke(main, ["analyze", "--db", str(tmp_path / "none.db")])
    assert missing.exit_code != 0 and "Traceback" not in missing.output


def _analysis(
    sid: int,
    taken_at: str,
    score: float | None,
    fs: str = "t",
    ops: int | None = None,
    recreation_of: int | None = None,
) -> dict[str, object]:
    return {
        "id": sid,
        "fs": fs,
        "taken_at": taken_at,
        "layout_score": score,
        "files": 10,
        "blocks_free": 100,
        "new_files": 30,
        "changed_files": 3,
        "deleted_files": 6,
        "op_count": ops,
        "bytes_written": None if ops is None else ops * 4096,
        "recreation_of": recreation_of,
    }


def test_trends_give_rates_only_over_meaningful_spans() -> None:
    from fsage.analyzer.history import trends

    # three snapshots minutes apart: no rate per month, no per-day activity, the total change
    quick = [
        _analysis(1, "2026-01-01T00:00:00+00:00", 1.0),
        _analysis(2, "2026-01-01T00:05:00+00:00", 0.95, ops=1000),
        _analysis(3, "2026-01-01T00:10:00+00:00", 0.90, ops=3000),
    ]
    t = trends(quick)["t"]
    assert t["change_per_month"] is None
    assert "10 min" in t["change_per_month_reason"] and "7 days" in t["change_per_month_reason"]
    assert t["total_change"] == pytest.approx(-0.10)
    assert all(a["created_per_day"] is None and a["per_day_reason"] for a in t["activity"])
    # the aging clock: snapshots 2 and 3 carry ops; 0.05 lost over 2000 ops
    assert t["clock"] == "ops"
    assert t["change_per_kop"] == pytest.approx(-0.025)
    assert t["activity"][1]["created_per_kop"] == pytest.approx(30 * 1000 / 2000)
    # seed 000's four months: a rate, and activity per day
    slow = [
        _analysis(1, "2026-01-01T00:00:00+00:00", 0.90),
        _analysis(2, "2026-05-02T18:00:00+00:00", 0.836),
    ]
    t2 = trends(slow)["t"]
    assert t2["change_per_month"] == pytest.approx(-0.016, rel=0.01)
    assert t2["change_per_month_reason"] is None
    assert t2["activity"][0]["created_per_day"] == pytest.approx(30 / 121.75)


def test_trends_start_at_the_first_scored_snapshot() -> None:
    """A history that begins with an empty file system (no layout score) is measured from its
    first scored snapshot, as fsage fleet measures it."""
    from fsage.analyzer.history import trend_line, trends

    hist = [
        _analysis(1, "2026-01-01T00:00:00+00:00", None),
        _analysis(2, "2026-01-03T00:00:00+00:00", 0.99),
        _analysis(3, "2026-02-02T00:00:00+00:00", 0.97),
        _analysis(4, "2026-03-04T00:00:00+00:00", None),
    ]
    t = trends(hist)["t"]
    assert (t["first_layout_score"], t["last_layout_score"]) == (0.99, 0.97)
    assert (t["first_scored_id"], t["last_scored_id"], t["scored_snapshots"]) == (2, 3, 2)
    assert t["total_change"] == pytest.approx(-0.02)
    assert t["span_days"] == pytest.approx(30.0)
    assert t["change_per_month"] == pytest.approx(-0.02 * 365.25 / 12 / 30)
    line = trend_line(t)
    assert "0.990 -> 0.970 (total change -0.0200) over 30.0 days" in line
    assert "change per month -0.0203" in line
    only_empty = trends([_analysis(1, "2026-01-01T00:00:00+00:00", None)])["t"]
    assert only_empty["total_change"] is None
    assert only_empty["change_per_month_reason"] == "no scored snapshot"


def test_trends_put_a_recreation_beside_its_snapshot() -> None:
    from fsage.analyzer.history import trends

    hist = [
        _analysis(1, "2026-01-01T00:00:00+00:00", 0.99, fs="home"),
        _analysis(2, "2026-02-01T00:00:00+00:00", 0.97, fs="home"),
        _analysis(5, "2026-03-01T00:00:00+00:00", 0.96, fs="home-replay", ops=500, recreation_of=2),
    ]
    tr = trends(hist)
    assert set(tr) == {"home"}
    (rec,) = tr["home"]["recreations"]
    assert (rec["id"], rec["recreation_of"], rec["original_layout_score"]) == (5, 2, 0.97)
    assert [s["id"] for s in tr["home"]["snapshots"]] == [1, 2]


def test_show_path_lists_the_subtree_and_says_when_nothing_matches(tmp_path: Path) -> None:
    from fsage.db.store import Store
    from fsage.listing import file_listing

    img = make_image(tmp_path, seed=5, block_size=4096, size_mb=16, files=120, max_bytes=20_000)
    db = tmp_path / "s.db"
    runner = CliRunner()
    assert runner.invoke(main, ["snapshot", str(img), "--db", str(db)]).exit_code == 0
    with Store.open(db) as store:
        layout = store.load_layout(1)
    everything = file_listing(layout)
    dirs = sorted(
        {e.path.rsplit("/", 1)[0] for e in everything if e.path and e.path.count("/") > 1}
    )
    assert dirs
    for d in dirs[:3]:
        # the subtree found from the root down is the full listing filtered by path
        want = [e for e in everything if e.path and (e.path == d or e.path.startswith(d + "/"))]
        assert file_listing(layout, d) == want and want
    r = runner.invoke(main, ["show", "1", "--db", str(db), "--path", "/nope"])
    assert r.exit_code != 0 and "fsage: error: no file at or below /nope" in r.output
