"""The HTML report: self-contained, escaped, and every plot draws in headless Chromium."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from analyzer.images import make_image
from click.testing import CliRunner

from fsage.cli import main
from fsage.reports import ReportData, Section, Table, register_section, render
from fsage.reports.html import _BUILDERS

HOSTILE = "<img src=x onerror=alert(1)>"
CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("rep")
    img = make_image(work, seed=7, block_size=4096, size_mb=16, files=150, max_bytes=40_000)
    # a hostile name inside the file system
    subprocess.run(
        ["debugfs", "-w", "-R", f"mkdir '/{HOSTILE}'", str(img)], check=True, capture_output=True
    )
    dbp = work / "fsage.db"
    runner = CliRunner()
    for _ in range(3):
        r = runner.invoke(main, ["snapshot", str(img), "--db", str(dbp), "--name", HOSTILE])
        assert r.exit_code == 0, r.output
        subprocess.run(["debugfs", "-w", "-R", "rm /d1/e1/f1", str(img)], capture_output=True)
    return dbp


def _report(db: Path, out: Path) -> str:
    r = CliRunner().invoke(main, ["report", "--db", str(db), "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "3 snapshot(s)" in r.output
    return out.read_text()


def test_report_is_self_contained_and_escaped(db: Path, tmp_path: Path) -> None:
    text = _report(db, tmp_path / "r.html")
    # no network: no external scripts, stylesheets or fetches
    assert not re.search(r"<script[^>]+src=", text)
    assert "<link" not in text
    assert "cdn.plot.ly" not in text.split("</script>", 1)[1]
    # the hostile names never appear raw
    assert HOSTILE not in text
    assert html_escaped(HOSTILE) in text  # in the summary table and the directory table
    assert text.count("class='plot'") == 9


def html_escaped(s: str) -> str:
    import html

    return html.escape(s)


def test_section_api_adds_and_escapes(tmp_path: Path) -> None:
    @register_section("test-extra", order=999)
    def extra(data: ReportData) -> Section | None:
        if "x" not in data.extra:
            return None
        return Section(
            "Extra </h2><script>",
            tables=[Table(["a"], [["<b>"]])],
            figures=[{"data": [{"type": "bar", "x": ["</script>"], "y": [1]}], "layout": {}}],
        )

    try:
        data = ReportData(analyses=[], trends={}, extra={"x": 1})
        text = render(data)
        body = text.split("</head>", 1)[1]
        assert "Extra &lt;/h2&gt;&lt;script&gt;" in body
        assert "<td>&lt;b&gt;</td>" in body
        assert '</script>"' not in body and "\\u003c/script\\u003e" in body
        assert render(ReportData(analyses=[], trends={})).count("test-extra") == 0
    finally:
        _BUILDERS[:] = [b for b in _BUILDERS if b[1] != "test-extra"]


def _chromium_dom(html_path: Path, profile: Path) -> str:
    p = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            f"--user-data-dir={profile}",
            "--virtual-time-budget=30000",
            "--dump-dom",
            html_path.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stdout


@pytest.mark.chromium
@pytest.mark.slow
def test_every_plot_draws_in_chromium(db: Path, tmp_path: Path) -> None:
    if not Path(CHROMIUM).exists() and shutil.which("chromium") is None:
        pytest.skip("chromium not installed")
    out = tmp_path / "r.html"
    _report(db, out)
    dom = _chromium_dom(out, tmp_path / "profile")
    body = re.search(r"<body([^>]*)>", dom)
    assert body, dom[:500]
    attrs = body.group(1)
    assert 'data-done="1"' in attrs
    assert "data-errors" not in attrs
    assert 'data-plots="9"' in attrs and 'data-plots-drawn="9"' in attrs
    # no title, axis label, tick label, legend or button drawn over another
    assert re.findall(r'data-overlaps="([^"]*)"', dom) == [""] * 9
    # every figure fits its box, so none is drawn over the table or heading after it
    assert re.findall(r'data-overflow="([^"]*)"', dom) == ["0"] * 9
    assert re.search(r'<div id="fsage-errors"></div>', dom)
    # the hostile name stayed text: no <img> element was created from it
    assert "<img" not in dom


@pytest.mark.chromium
@pytest.mark.slow
def test_single_snapshot_report_draws(tmp_path: Path) -> None:
    if not Path(CHROMIUM).exists():
        pytest.skip("chromium not installed")
    img = make_image(tmp_path, seed=8, block_size=1024, size_mb=8, files=60, max_bytes=20_000)
    dbp = tmp_path / "one.db"
    runner = CliRunner()
    assert runner.invoke(main, ["snapshot", str(img), "--db", str(dbp)]).exit_code == 0
    out = tmp_path / "one.html"
    r = runner.invoke(main, ["report", "--db", str(dbp), "-o", str(out)])
    assert r.exit_code == 0, r.output
    dom = _chromium_dom(out, tmp_path / "profile")
    attrs = re.search(r"<body([^>]*)>", dom).group(1)  # type: ignore[union-attr]
    n = out.read_text().count("class='plot'")
    assert n >= 6
    assert f'data-plots-drawn="{n}"' in attrs and "data-errors" not in attrs


@pytest.mark.chromium
@pytest.mark.slow
def test_overlapping_text_is_caught(db: Path, tmp_path: Path) -> None:
    """The report's own check compares the boxes of titles, axis titles, tick labels, legends
    and buttons: a legend put on the title is caught, the standard figures (with --compare)
    have no overlap."""
    if not Path(CHROMIUM).exists():
        pytest.skip("chromium not installed")

    @register_section("test-overlap", order=999)
    def bad(data: ReportData) -> Section | None:
        fig = {
            "data": [{"type": "scatter", "name": "a long legend entry", "x": [1, 2], "y": [1, 2]},
                     {"type": "scatter", "name": "another legend entry", "x": [1, 2], "y": [2, 1]}],
            "layout": {"title": {"text": "A title the legend covers", "x": 0.02, "y": 0.95},
                       "legend": {"orientation": "h", "x": 0.02, "y": 1.12, "yanchor": "top"},
                       "margin": {"t": 60}},
        }  # fmt: skip
        return Section("Overlap", figures=[fig])

    try:
        out = tmp_path / "c.html"
        r = CliRunner().invoke(
            main, ["report", "--db", str(db), "-o", str(out), "--compare", "1", "3"]
        )
        assert r.exit_code == 0, r.output
    finally:
        _BUILDERS[:] = [b for b in _BUILDERS if b[1] != "test-overlap"]
    dom = _chromium_dom(out, tmp_path / "profile")
    found = re.findall(r'data-overlaps="([^"]*)"', dom)
    assert len(found) == 12  # 9 standard figures, 2 of the comparison, the bad one
    assert found[:-1] == [""] * 11, found
    assert "title:" in found[-1] and "legend:" in found[-1]


def test_score_over_time_note_gives_signed_changes(db: Path, tmp_path: Path) -> None:
    text = _report(db, tmp_path / "r.html")
    # seed 000's figures in the signed wording of analyze and fleet: a fall is negative
    assert "a change of -0.016 per month at worst, -0.00725 on average" in text
    assert "negative when the score falls" in text
    assert "fall by 0.016" not in text
