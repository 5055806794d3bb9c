"""The report's LFS sections: segment utilization of the newest LFS snapshot and write cost
against utilization, one point per aging run (seed 001 Figure 5-4); left out without LFS."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from fsage.ager.profile import get_preset
from fsage.ager.run import AgeOptions, age
from fsage.db.store import Store
from fsage.lfs.fs import mkfs
from fsage.lfs.info import lfs_info
from fsage.reports import ReportData, build_sections, render, report_data_from_store
from fsage.reports.sections_lfs import lfs_extra, lfs_segments, lfs_write_cost
from fsage.workload import Op, WorkloadHeader, write_workload

CHROMIUM = "/usr/bin/chromium"
RUNS = [("greedy", 0.5), ("greedy", 0.8), ("hole-plugging", 0.5), ("hole-plugging", 0.8)]


@pytest.fixture(scope="module")
def lfs_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path]]:
    tmp = tmp_path_factory.mktemp("lfsreport")
    db = tmp / "r.db"
    images = {}
    for policy, fill in RUNS:
        name = f"{policy}-{fill}"
        img = tmp / f"{name}.img"
        mkfs(img, segments=64, blocks_per_segment=32, block_size=4096, cleaning_policy=policy)
        prof = get_preset("random-update").with_overrides(fill=fill, update_factor=2.0)
        res = age(img, AgeOptions(profile=prof, db=db, name=name, seed=1))
        assert res.finished
        images[name] = img
    return db, images


def test_provider_reads_runs_and_segment_usage(lfs_db: tuple[Path, dict[str, Path]]) -> None:
    db, images = lfs_db
    with Store.open(db) as store:
        data = report_data_from_store(store)
    lfs = data.extra["lfs"]
    assert [(r["metrics"]["policy"], r["fs"]) for r in lfs["runs"]] == [
        (p, f"{p}-{f}") for p, f in RUNS
    ]
    # The newest snapshot's segment usage table against `fsage lfs info` on the image.
    assert sorted(s["fs"] for s in lfs["snapshots"]) == sorted(images)
    for s in lfs["snapshots"]:
        info = lfs_info(images[s["fs"]])
        assert s["live"] == [seg["live_blocks"] for seg in info["segments"]]
        assert s["histogram"] == info["histogram"]
        assert s["capacity"] == 31
        assert s["fraction"] == pytest.approx(info["utilization"]["fraction"])


def test_write_cost_against_utilization(lfs_db: tuple[Path, dict[str, Path]]) -> None:
    db, _ = lfs_db
    with Store.open(db) as store:
        data = report_data_from_store(store)
    names = [s.id for s in build_sections(data)]
    assert "lfs-segments" in names and "lfs-write-cost" in names
    sec = lfs_write_cost(data)
    assert sec is not None
    (fig,) = sec.figures
    traces = {t["name"]: t for t in fig["data"]}
    assert set(traces) == {"greedy", "hole-plugging"}
    for policy in traces:
        runs = [r for r in data.extra["lfs"]["runs"] if r["metrics"]["policy"] == policy]
        runs.sort(key=lambda r: r["utilization"]["fraction"])
        assert traces[policy]["x"] == [r["utilization"]["fraction"] for r in runs]
        assert all("after_fill" in r["metrics"] for r in runs)
        want = [r["metrics"]["after_fill"]["overall_write_cost"] for r in runs]
        assert traces[policy]["y"] == want
        assert [round(x, 1) for x in traces[policy]["x"]] == [0.5, 0.8]
    (table,) = sec.tables
    assert len(table.rows) == 4
    # Greedy cleaning costs more at 80% than at 50% (seed 001 Figure 5-4's rising curve).
    g = traces["greedy"]["y"]
    assert g[1] > g[0]
    seg = lfs_segments(data)
    assert seg is not None
    bars = seg.figures[0]["data"]
    assert len(bars) == 4 and all(sum(b["y"]) == 61 for b in bars)  # 64 - 3 system segments


def test_sections_left_out_without_lfs_data(tmp_path: Path) -> None:
    assert lfs_segments(ReportData(analyses=[], trends={})) is None
    assert lfs_write_cost(ReportData(analyses=[], trends={})) is None
    # A database with an aging run on a directory only: no LFS data, no provider result.
    target = tmp_path / "t"
    target.mkdir()
    wl = tmp_path / "w.jsonl"
    write_workload(wl, WorkloadHeader(generator="test"), [Op("create", "f", size=100)])
    db = tmp_path / "d.db"
    age(target, AgeOptions(ops_file=wl, db=db, name="t"))
    with Store.open(db) as store:
        assert lfs_extra(store, None) is None
        data = report_data_from_store(store)
    assert "lfs" not in data.extra
    names = [s.id for s in build_sections(data)]
    assert "lfs-segments" not in names and "lfs-write-cost" not in names
    # Runs without write-cost metrics (a failed run) draw nothing either.
    failed: dict[str, Any] = {
        "runs": [{"id": 1, "fs": None, "target": "x", "metrics": {}, "utilization": {}}]
    }
    data = ReportData(analyses=[], trends={}, extra={"lfs": {**failed, "snapshots": []}})
    assert lfs_segments(data) is None and lfs_write_cost(data) is None


def test_names_are_escaped(tmp_path: Path) -> None:
    img = tmp_path / "x.img"
    mkfs(img, segments=24, blocks_per_segment=32, block_size=4096)
    prof = get_preset("random-update").with_overrides(fill=0.4, update_factor=1.0)
    db = tmp_path / "x.db"
    age(img, AgeOptions(profile=prof, db=db, name="<img src=x onerror=alert(1)>"))
    with Store.open(db) as store:
        html = render(report_data_from_store(store))
    assert "<img src=x" not in html
    assert "&lt;img src=x" in html


@pytest.mark.chromium
@pytest.mark.slow
def test_lfs_plots_draw_in_chromium(lfs_db: tuple[Path, dict[str, Path]], tmp_path: Path) -> None:
    if not Path(CHROMIUM).exists() and shutil.which("chromium") is None:
        pytest.skip("chromium not installed")
    db, _ = lfs_db
    with Store.open(db) as store:
        data = report_data_from_store(store)
    secs = [s for s in build_sections(data) if s.id in ("lfs-segments", "lfs-write-cost")]
    out = tmp_path / "lfs.html"
    out.write_text(render(data, secs), encoding="utf-8")
    p = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--no-first-run",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--virtual-time-budget=30000",
            "--dump-dom",
            out.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    body = re.search(r"<body([^>]*)>", p.stdout)
    assert body, p.stdout[:500]
    attrs = body.group(1)
    assert 'data-plots="2"' in attrs and 'data-plots-drawn="2"' in attrs
    assert "data-errors" not in attrs
