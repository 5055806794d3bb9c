"""The report and the fleet report of two real file systems of different block sizes (mke2fs -d
of a seeded tree, files removed with debugfs to break the free space up), judged on the figures
and tables of the HTML page against e2freefrag and the snapshots' own times: a day-wide time axis
for snapshots taken seconds apart, every e2freefrag bucket on the fleet's free-space axis, a
score axis for the fleet scatter, and changes of layout score that do not round to 0.000."""

from __future__ import annotations

import datetime as dt
import html as htmllib
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import require_tools
from images import TreeSpec, build_tree, debugfs, make_ext_image, run

KIB = 1024
_UNITS = {"": 1, "K": KIB, "M": KIB**2, "G": KIB**3, "T": KIB**4}


def cli(*args: str | Path) -> Any:
    from click.testing import CliRunner

    from fsage.cli import main

    out = CliRunner().invoke(main, [str(a) for a in args])
    assert out.exit_code == 0, out.output
    return out


def figures(page: Path) -> list[dict[str, Any]]:
    """Every plotly figure of a report page, from its embedded JSON."""
    text = page.read_text(encoding="utf-8")
    blobs = re.findall(r"<script type='application/json' id='plot\d+-json'>(.*?)</script>", text)
    return [json.loads(b) for b in blobs]


def figure(page: Path, title: str) -> dict[str, Any]:
    (fig,) = [f for f in figures(page) if f["layout"]["title"]["text"].startswith(title)]
    return fig


def tables(page: Path) -> list[list[list[str]]]:
    """Every table of a page as rows of cell texts (header row first)."""
    out = []
    for t in re.findall(r"<table.*?</table>", page.read_text(encoding="utf-8"), re.S):
        rows = re.findall(r"<tr>(.*?)</tr>", t, re.S)
        out.append([[htmllib.unescape(c) for c in re.findall(r"<t[hd]>(.*?)</t[hd]>", r)]
                    for r in rows])  # fmt: skip
    return out


def e2freefrag_buckets(image: Path) -> set[int]:
    """The lower bound in bytes of each e2freefrag histogram bucket that holds free extents."""
    out = set()
    for line in run(["e2freefrag", image]).splitlines():
        m = re.match(r"\s*(\d+)([KMGT]?)\.\.\.\s*\d+[KMGT]?-\s*:\s*(\d+)", line)
        if m and int(m.group(3)) > 0:
            out.add(int(m.group(1)) * _UNITS[m.group(2)])
    return out


def bucket_bytes(label: str) -> int:
    """The lower bound of a bucket label such as '64 KiB-128 KiB'."""
    m = re.match(r"(\d+) ([KMGT]?)i?B", label)
    assert m, label
    return int(m.group(1)) * _UNITS[m.group(2)]


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two images (1 KiB and 4 KiB blocks) of one seeded tree with every third file removed,
    snapshot into one database seconds apart, and their export."""
    require_tools("mke2fs", "debugfs", "e2freefrag")
    pytest.importorskip("duckdb")
    pytest.importorskip("pyarrow")
    work = tmp_path_factory.mktemp("acc28")
    tree = build_tree(
        work / "tree",
        28,
        TreeSpec(files=160, dirs=4, max_file_size=400 * KIB, big={"big.dat": 6 * KIB * KIB}),
    )
    names = sorted(p.relative_to(tree) for p in tree.rglob("file*.dat"))
    db = work / "two.db"
    images = {}
    for bs in (1024, 4096):
        img = make_ext_image(work, "ext4", block_size=bs, tree=tree, size="24M",
                             name=f"fs{bs}.img", extra=["-L", f"b{bs}"])  # fmt: skip
        debugfs(img, [f"rm /{n}" for n in names[::3]], write=True)
        cli("snapshot", img, "--db", db)
        images[bs] = img
    ds = work / "ds"
    cli("export", "--db", db, "--host", "h", ds)
    return {"work": work, "db": db, "images": images, "dataset": ds}


def test_file_systems_read_seconds_apart_get_a_day_wide_time_axis(two: dict[str, Any]) -> None:
    page = two["work"] / "r.html"
    cli("report", "--db", two["db"], "-o", page)
    snaps = json.loads(cli("snapshots", "--db", two["db"], "--format", "json").stdout)
    if isinstance(snaps, dict):
        snaps = snaps["snapshots"]
    taken = [dt.datetime.fromisoformat(s["taken_at"]).replace(tzinfo=None) for s in snaps]
    assert len(taken) == 2 and max(taken) - min(taken) < dt.timedelta(minutes=5)
    fig = figure(page, "Layout score per snapshot")
    lo, hi = (dt.datetime.fromisoformat(x) for x in fig["layout"]["xaxis"]["range"])
    assert hi - lo >= dt.timedelta(hours=24)
    assert lo < min(taken) and max(taken) < hi


def test_free_space_figures_of_two_block_sizes_share_one_axis(two: dict[str, Any]) -> None:
    page = two["work"] / "r2.html"
    cli("report", "--db", two["db"], "-o", page)
    held = {bs: e2freefrag_buckets(img) for bs, img in two["images"].items()}
    every = set().union(*held.values())
    want = [min(every) * 2**i for i in range((max(every) // min(every)).bit_length())]
    assert len(want) > len(every), "the fixture's free space should leave a bucket empty"
    figs = [f for f in figures(page) if f["layout"]["title"]["text"].startswith("Free space by")]
    assert len(figs) == 2
    for fig in figs:
        bs = 1024 if fig["layout"]["title"]["text"].endswith("b1024") else 4096
        space, extents = fig["data"]
        assert [bucket_bytes(x) for x in space["x"]] == want
        for x, s, e in zip(space["x"], space["y"], extents["y"], strict=True):
            assert (s > 0 or e > 0) == (bucket_bytes(x) in held[bs]), (bs, x)


def test_fleet_free_space_axis_has_every_e2freefrag_bucket(two: dict[str, Any]) -> None:
    page = two["work"] / "fleet.html"
    cli("fleet", "report", two["dataset"], "-o", page)
    held = set().union(*(e2freefrag_buckets(img) for img in two["images"].values()))
    want = []
    b = min(held)
    while b <= max(held):
        want.append(b)
        b *= 2
    assert len(want) > len(held), "the fixture's free space should leave a bucket empty"
    fig = figure(page, "Free space by free-extent size")
    space, extents = fig["data"]
    assert [bucket_bytes(x) for x in space["x"]] == want
    for x, s, e in zip(space["x"], space["y"], extents["y"], strict=True):
        assert (s > 0 or e > 0) == (bucket_bytes(x) in held), x
    # file sizes too: each bucket twice the one before, empty ones kept
    size = [bucket_bytes(x) for x in figure(page, "Layout score by size bucket")["data"][0]["x"]]
    assert size == [size[0] * 2**i for i in range(len(size))]


def test_fleet_changes_do_not_round_to_zero(two: dict[str, Any], tmp_path: Path) -> None:
    # a history of one file system: the 1 KiB-block image, then the same with one more file
    # written into its broken-up free space (a loss of a few ten-thousandths)
    img = tmp_path / "h.img"
    shutil.copyfile(two["images"][1024], img)
    db = tmp_path / "h.db"
    cli("snapshot", img, "--db", db, "--name", "hist", "--taken-at", "2025-01-01T00:00:00Z")
    extra = tmp_path / "extra.dat"
    extra.write_bytes(bytes(range(256)) * 160)
    debugfs(img, [f"write {extra} /extra.dat"], write=True)
    cli("snapshot", img, "--db", db, "--name", "hist", "--taken-at", "2025-02-01T00:00:00Z")
    ds = tmp_path / "ds"
    cli("export", "--db", db, "--host", "h", ds)
    rows = json.loads(cli("fleet", ds, "--format", "json").stdout)["filesystems"]
    (row,) = rows
    change = row["total_change"]
    assert change != 0, "the fixture should change the layout score"
    # one quantity in every command: analyze's change per month is the fleet's
    hist = json.loads(cli("analyze", "--db", db, "--history", "--format", "json").stdout)
    trend = hist["trends"]["hist"]
    assert trend["total_change"] == pytest.approx(change, rel=1e-9)
    assert trend["change_per_month"] == pytest.approx(row["change_per_month"], rel=1e-9)
    page = tmp_path / "fleet.html"
    cli("fleet", "report", ds, "-o", page)
    (trend,) = [t for t in tables(page) if "total change" in t[0]]
    head, cells = trend[0], trend[1]
    for col, want in (("total change", change), ("change per month", row["change_per_month"])):
        shown = float(cells[head.index(col)])
        assert shown != 0 and abs(shown - want) <= abs(want) * 0.06, (col, shown, want)
    text = cli("fleet", ds).stdout
    line = next(ln for ln in text.splitlines() if ln.startswith("h "))
    assert float(line.split()[5]) == pytest.approx(change, rel=0.06)
    scatter = figure(page, "Latest layout score and change per month")
    lo, hi = scatter["layout"]["xaxis"]["range"]
    assert hi <= 1.01 and lo <= row["layout_score"] <= hi
