"""One vocabulary across commands: every option has help, listings have CSV, '-' means
stdin/stdout, filters that match nothing fail, and "files" means regular files everywhere."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import click
import pytest
from analyzer.images import make_image
from click.testing import CliRunner

from fsage.cli import main


def _commands(cmd: click.Command, name: str) -> list[tuple[str, click.Command]]:
    if isinstance(cmd, click.Group):
        out = []
        for sub in cmd.list_commands(click.Context(cmd)):
            got = cmd.get_command(click.Context(cmd), sub)
            assert got is not None
            out += _commands(got, f"{name} {sub}")
        return out
    return [(name, cmd)]


def test_every_option_has_help() -> None:
    missing = [
        f"{name} {'/'.join(p.opts)}"
        for name, cmd in _commands(main, "fsage")
        for p in cmd.params
        if isinstance(p, click.Option) and not p.help and p.name != "help"
    ]
    assert missing == []


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("voc")
    img = make_image(work, seed=3, block_size=4096, size_mb=16, files=150, max_bytes=30_000)
    dbp = work / "v.db"
    r = CliRunner().invoke(main, ["snapshot", str(img), "--db", str(dbp), "--format", "json"])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.output)
    assert summary["id"] == 1 and summary["files"] < summary["inodes"]
    return dbp


def _run(*args: str, ok: bool = True) -> str:
    r = CliRunner().invoke(main, list(args))
    assert (r.exit_code == 0) == ok, r.output
    return r.output


def test_files_are_regular_files_in_every_command(db: Path) -> None:
    (snap,) = json.loads(_run("snapshots", "--db", str(db), "--format", "json"))
    (a,) = json.loads(_run("analyze", "--db", str(db), "--format", "json"))["snapshots"]
    shown = json.loads(_run("show", "1", "--db", str(db), "--format", "json"))
    regular = sum(1 for e in shown if int(e["mode"], 8) & 0o170000 == 0o100000)
    assert snap["regular_files"] == a["files"] == regular
    assert snap["files"] == len(shown)  # the stored count is of every user inode
    rows = list(csv.DictReader(io.StringIO(_run("snapshots", "--db", str(db), "--format", "csv"))))
    assert int(rows[0]["files"]) == regular and int(rows[0]["inodes"]) == len(shown)


def test_listings_have_csv(db: Path) -> None:
    for args in (
        ["snapshots"],
        ["show", "1"],
        ["runs"],
        ["analyze"],
        ["analyze", "--history"],
        ["trace", "list"],
    ):
        out = _run(*args, "--db", str(db), "--format", "csv")
        head = next(csv.reader(io.StringIO(out)))
        assert head[0] == ("path" if args[0] == "show" else "id"), (args, head)


def test_filters_that_match_nothing_fail(db: Path) -> None:
    for args in (
        ["runs", "--kind", "nope"],
        ["show", "1", "--path", "/nope"],
        ["snapshots", "--fs", "nope"],
        ["analyze", "--fs", "nope"],
        ["trace", "list", "--fs", "nope"],
    ):
        out = _run(*args, "--db", str(db), ok=False)
        assert out.startswith("fsage: error: ") and "Traceback" not in out, args


def test_dash_is_stdout_and_stdin(tmp_path: Path) -> None:
    r = CliRunner().invoke(
        main,
        ["workload", "generate", "--profile", "hfs-surge", "--capacity", "16M", "--ops-limit",
         "20", "-o", "-"],
    )  # fmt: skip
    assert r.exit_code == 0, r.stderr
    assert r.stdout.splitlines()[0].startswith('{"fsage_workload"')
    assert len(r.stdout.splitlines()) == 21 and "20 ops" in r.stderr
    back = CliRunner().invoke(main, ["workload", "show", "-"], input=r.stdout)
    assert back.exit_code == 0 and "20 ops" in back.output


def test_free_blocks_have_one_value_in_every_command(tmp_path: Path) -> None:
    """A reader whose own free count differs from its free map (a live ext4 holding
    preallocations for files being written) shows the map's in the listing as in analyze,
    with its own count beside it in analyze's JSON."""
    from fsage.db.store import Store
    from fsage.snapshotter import read_source

    img = make_image(tmp_path, seed=4, block_size=4096, size_mb=16, files=60, max_bytes=30_000)
    layout = read_source(img)
    mapped = layout.blocks_free
    assert layout.facts.free_space_known and mapped == int(layout.free.blocks)
    layout.facts.blocks_free = mapped + 587  # what statvfs says while ext4 holds some blocks
    db = tmp_path / "free.db"
    with Store.open(db, create=True) as store:
        store.add_snapshot(layout, name="x")
    (snap,) = json.loads(_run("snapshots", "--db", str(db), "--format", "json"))
    (a,) = json.loads(_run("analyze", "--db", str(db), "--format", "json"))["snapshots"]
    assert snap["blocks_free"] == a["blocks_free"] == mapped
    assert a["blocks_free_reported"] == mapped + 587
    assert snap["blocks_used"] == layout.facts.blocks_total - mapped


@pytest.mark.parametrize("command", [["analyze"], ["fleet"], ["fleet", "summary"]])
def test_help_states_the_one_trend_rule(command: list[str]) -> None:
    res = CliRunner().invoke(main, [*command, "--help"], terminal_width=1000)
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    for words in (
        "in analyze, fleet and the report alike, over the snapshots that have a layout score",
        "A change is negative when the score falls",
        "needs two scored snapshots 7 days or more apart",
    ):
        assert words in text, (command, words)
