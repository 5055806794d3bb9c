"""The fleet report and summary as a reader meets them: buckets in bytes, a device counted once,
outliers that say which way they lie, the biggest measured losses drawn, and outputs that go
where they are asked (standard output for '-', one line for a directory that does not exist)."""

from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("duckdb")

from fsage.db.store import Store
from fsage.fleet.export import export_parquet
from fsage.fleet.query import ONE_SCORED, SHORT_SPAN, fleet_tables
from fsage.fleet.report import MIN_SPAN, sections
from fsage.fleet.synth import synthetic_history

SHARED = "11111111-2222-3333-4444-555555555555"


def cli(*args: str | Path) -> Any:
    from click.testing import CliRunner

    from fsage.cli import main

    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Host h: / and /usr of one device (one UUID), a data disk of 1 KiB blocks and a file
    system of one snapshot. Returns (database, dataset)."""
    tmp = tmp_path_factory.mktemp("fleet")
    db, ds = tmp / "h.db", tmp / "ds"
    with Store.open(db, create=True) as store:
        synthetic_history(store, "root", files=300, snapshots=10, seed=1, uuid=SHARED)
        synthetic_history(store, "usr", files=300, snapshots=10, seed=2, uuid=SHARED)
        synthetic_history(store, "data", files=300, snapshots=10, seed=3, block_size=1024)
        synthetic_history(store, "new", files=100, snapshots=1, seed=4)
    export_parquet(db, ds, host="h")
    return db, ds


def analyzed(db: Path, fs: str) -> dict[str, Any]:
    out = cli("analyze", "--db", db, "--fs", fs, "--format", "json")
    assert out.exit_code == 0, out.output
    (a,) = json.loads(out.stdout)["snapshots"]
    return dict(a)


def test_free_space_counts_a_device_once(fleet: tuple[Path, Path]) -> None:
    db, ds = fleet
    free = fleet_tables(ds, ("free",))["free"]
    # usr stands for the shared device (same time as root: the later name), then data, new
    want: dict[int, int] = {}
    for fs in ("usr", "data", "new"):
        a = analyzed(db, fs)
        for r in a["free_extents"]:
            want[r["min_bytes"]] = want.get(r["min_bytes"], 0) + r["blocks"] * a["block_size"]
    assert {r["min_bytes"]: r["free_bytes"] for r in free} == want
    assert max(r["filesystems"] for r in free) == 3  # of four file systems
    total = sum(want.values())
    for r in free:
        assert r["share_of_free_space"] == pytest.approx(r["free_bytes"] / total)


def test_size_buckets_have_one_labelling(fleet: tuple[Path, Path]) -> None:
    db, ds = fleet
    t = fleet_tables(ds, ("size", "files_by_size"))
    labels = {r["bucket"]: r["label"] for r in t["size"]}
    # files_by_size numbers and labels buckets as the size table does
    for r in t["files_by_size"]:
        assert labels[r["bucket"]] == r["label"]
    # the 1 KiB-block file system's analyze buckets, by their labels in bytes
    a = analyzed(db, "data")
    mine = {r["label"]: r["files"] for r in t["files_by_size"] if r["fs"] == "data"}
    assert mine == {r["label"]: r["files"] for r in a["by_size"]}
    text = cli("fleet", ds, "--table", "size")
    assert text.exit_code == 0 and "block_size" not in text.stdout
    assert all(lab in text.stdout for lab in labels.values())


def test_outliers_say_their_direction(fleet: tuple[Path, Path]) -> None:
    _, ds = fleet
    rows = fleet_tables(ds, ("outliers",), threshold=0.0)["outliers"]
    assert rows
    for r in rows:
        below = r["value"] < r["fleet_mean"]
        if r["metric"] == "layout_score":
            assert r["direction"] == ("worse" if below else "better") + " layout than the fleet"
        elif below:
            assert r["direction"] == "declining faster than the fleet"
        else:
            assert r["direction"] in ("declining slower than the fleet", "improving (score rising)")
            assert (r["direction"] == "improving (score rising)") == (r["value"] > 0)


def _fs(host: str, fs: str, snaps: int, total: float | None, rate: float | None) -> dict[str, Any]:
    return {"host": host, "fs": fs, "snapshots": snaps, "span_days": float(snaps - 1),
            "layout_score": 0.9, "total_change": total, "change_per_month": rate,
            "free_fraction": 0.5}  # fmt: skip


def _trend(host: str, fs: str, scores: list[float]) -> list[dict[str, Any]]:
    t0 = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
    return [
        {"host": host, "fs": fs, "snapshot_id": i + 1, "layout_score": s,
         "taken_at": (t0 + dt.timedelta(days=i)).isoformat()}
        for i, s in enumerate(scores)
    ]  # fmt: skip


def test_the_trend_figure_draws_the_biggest_measured_losses() -> None:
    """12 file systems rising by millionths must not fill the figure while two that lost 0.06
    and 0.10 in under a week are left out; what is not drawn is said."""
    fss, trend = [], []
    for i in range(12):  # rising steadily: ranked first by a signed rate
        scores = [0.99 + 1e-4 * d for d in range(30)]
        fss.append(_fs("r", f"up{i}", 30, scores[-1] - scores[0], 3e-3))
        trend += _trend("r", f"up{i}", scores)
    for name, drop in (("big", 0.10), ("mid", 0.06)):
        scores = [0.98 - drop * d / 3 for d in range(4)]
        fss.append(_fs("s", name, 4, scores[-1] - scores[0], None))
        trend += _trend("s", name, scores)
    flat = [0.95 + (0.0002 if d % 2 else 0.0) for d in range(10)]  # a wobble, no loss
    fss.append(_fs("f", "flat", 10, flat[-1] - flat[0], -1e-5))
    trend += _trend("f", "flat", flat)
    fss.append(_fs("o", "one", 1, None, None))
    trend += _trend("o", "one", [0.97])
    empty: list[dict[str, Any]] = []
    t = {"filesystems": fss, "trend": trend, "size": empty, "free": empty, "outliers": empty}
    sec = sections(t)[0]
    (fig,) = sec.figures
    names = [tr["name"] for tr in fig["data"]]
    assert names == ["s/big (-0.1000)", "s/mid (-0.0600)"]
    lo, hi = fig["layout"]["yaxis"]["range"]
    assert hi - lo >= MIN_SPAN and lo <= 0.88 and hi >= 0.98
    notes = " ".join(sec.notes)
    assert "1 have one snapshot" in notes
    assert "12 have a layout score that rose measurably" in notes
    assert "1 changed by less than" in notes


def test_the_scatter_says_which_file_systems_it_leaves_out() -> None:
    """Its dots are the file systems with a change per month and a score; the rest are
    counted by reason, not silently missing."""
    fss = [_fs("r", f"long{i}", 30, -0.01, -0.01) for i in range(3)]
    fss += [_fs("s", "short", 3, -0.002, None), _fs("o", "one", 1, None, None)]
    fss.append({**_fs("n", "unscored", 30, None, 0.0), "layout_score": None})
    trend = [row for r in fss for row in _trend(r["host"], r["fs"], [0.9] * r["snapshots"])]
    t = {"filesystems": fss, "trend": trend, "size": [], "free": [], "outliers": []}
    (scatter,) = [s for s in sections(t) if s.id == "fleet-scatter"]
    (fig,) = scatter.figures
    assert len(fig["data"][0]["x"]) == 3
    assert scatter.notes == [
        f"3 of 6 file systems drawn; not drawn: 1 ({SHORT_SPAN}); 1 ({ONE_SCORED}); "
        "1 (no layout score (no file of two blocks or more))."
    ]


def test_histories_of_different_periods_are_drawn_from_their_own_start() -> None:
    """A history of 2026 beside ones of 2025 would squeeze them into a tenth of a date
    axis: then each is drawn in days from its own first snapshot; histories of one period
    keep their dates."""
    fss, trend = [], []
    for name, start in (("old", dt.datetime(2025, 1, 1)), ("new", dt.datetime(2026, 11, 1))):
        scores = [0.99 - 0.01 * d for d in range(20)]
        fss.append(_fs("h", name, 20, scores[-1] - scores[0], -0.015))
        trend += [
            {"host": "h", "fs": name, "snapshot_id": i + 1, "layout_score": v,
             "taken_at": (start + dt.timedelta(days=i)).replace(tzinfo=dt.UTC).isoformat()}
            for i, v in enumerate(scores)
        ]  # fmt: skip
    empty: list[dict[str, Any]] = []
    t = {"filesystems": fss, "trend": trend, "size": empty, "free": empty, "outliers": empty}
    sec = sections(t)[0]
    (fig,) = sec.figures
    for tr in fig["data"]:
        assert tr["x"][0] == 0 and tr["x"][-1] == pytest.approx(19)
    assert fig["layout"]["xaxis"]["title"]["text"].startswith("days since")
    assert any("different periods" in n for n in sec.notes)
    together = {"filesystems": fss[:1], "trend": [p for p in trend if p["fs"] == "old"],
                "size": empty, "free": empty, "outliers": empty}  # fmt: skip
    (fig,) = sections(together)[0].figures
    assert str(fig["data"][0]["x"][0]).startswith("2025-01-01")


def test_nothing_measurable_draws_no_figure() -> None:
    fss = [_fs("r", "up", 5, 4e-7, None)]
    t = {"filesystems": fss, "trend": _trend("r", "up", [0.99 + 1e-7 * d for d in range(5)]),
         "size": [], "free": [], "outliers": []}  # fmt: skip
    sec = sections(t)[0]
    assert sec.figures == [] and any("nothing to draw" in n for n in sec.notes)
    assert not any("The 0 file systems" in n for n in sec.notes)


def test_short_histories_follow_by_their_loss(fleet: tuple[Path, Path], tmp_path: Path) -> None:
    """The file systems table ranks by change per month; those too short for a rate come
    after, biggest total loss first, as its caption says (not in name order)."""
    db, ds = tmp_path / "h.db", tmp_path / "ds"
    shutil.copyfile(fleet[0], db)  # the module's database stays as the other tests have it
    with Store.open(db) as store:
        for i, seed in enumerate((21, 22, 23)):
            synthetic_history(store, f"short{i}", files=300, snapshots=3, seed=seed)
    export_parquet(db, ds, host="h")
    rows = fleet_tables(ds, ("filesystems",))["filesystems"]
    rated = [r for r in rows if r["change_per_month"] is not None]
    short = [r for r in rows if r["change_per_month"] is None and r["total_change"] is not None]
    assert len(short) == 3 and rows[: len(rated)] == rated
    changes = [r["total_change"] for r in short]
    assert changes == sorted(changes) and changes != [
        r["total_change"] for r in sorted(short, key=lambda r: r["fs"])
    ]
    assert rows[-1]["total_change"] is None  # one snapshot: last


def test_report_outputs(fleet: tuple[Path, Path], tmp_path: Path, monkeypatch: Any) -> None:
    db, ds = fleet
    monkeypatch.chdir(tmp_path)
    r = cli("fleet", "report", ds, "-o", "-")
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith("<!DOCTYPE html>") and r.stdout.rstrip().endswith("</html>")
    assert not (tmp_path / "-").exists()
    sub = tmp_path / "sub"
    sub.mkdir()
    for args, says in (
        (("fleet", "report", ds, "-o", "/nonexistent/f.html"), "no such directory"),
        (("report", "--db", db, "-o", "/nonexistent/r.html"), "no such directory"),
        (("fleet", "report", ds, "-o", sub), "is a directory"),
        (("report", "--db", db, "-o", sub), "is a directory"),
        # a place no file can be made in: the temporary file beside it is what failed
        (("report", "--db", db, "-o", "/proc/version"), "written to .version."),
    ):
        r = cli(*args)
        assert r.exit_code == 1, (args, r.output)
        assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
        (line,) = r.stderr.strip().splitlines()
        assert line.startswith("fsage: error: ") and "Traceback" not in r.output
        assert says in line, line
    sub.rmdir()
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    r = cli("report", "--db", db, "-o", "-")
    assert r.exit_code == 0 and r.stdout.startswith("<!DOCTYPE html>")
    out = tmp_path / "r.html"
    assert cli("report", "--db", db, "-o", out).exit_code == 0
    assert out.stat().st_mode & 0o777 == 0o600


def test_the_rate_axis_is_never_narrower_than_a_measurable_loss() -> None:
    from fsage.fleet.report import MIN_LOSS, _rate_axis

    lo, hi = _rate_axis([2.6e-6, 2.7e-6, 2.5e-6])["range"]
    assert hi - lo >= 2 * MIN_LOSS - 1e-15 and lo <= 0 <= hi
    lo, hi = _rate_axis([-0.09, -0.01])["range"]
    assert lo < -0.09 and hi >= 0
