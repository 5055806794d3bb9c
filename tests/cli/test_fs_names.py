"""One rule names a file system in the database, whichever command records it first: the name
it already has there, else its label, else fs-<first 8 characters of its uuid>. An aging run
keeps its --name when resumed."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from images import dumpe2fs_header, make_ext_image

from fsage.ager.generator import Generator
from fsage.ager.offline import OfflineExtExecutor
from fsage.ager.profile import get_preset
from fsage.ager.run import AgeOptions, age
from fsage.cli import main
from fsage.db.store import Store
from fsage.workload import Op, OpFailedError, write_workload

MIB = 1 << 20

pytestmark = pytest.mark.slow


@pytest.fixture
def stream(tmp_path: Path) -> Path:
    gen = Generator(get_preset("hfs-surge").with_overrides(fill=0.4), 5, 24 * MIB)
    path = tmp_path / "ops.jsonl"
    write_workload(path, gen.header(), gen.ops())
    return path


def _names(db: Path) -> dict[str, int]:
    """File-system name -> snapshots recorded under it."""
    with Store.open(db) as store:
        counts: dict[str, int] = {}
        for s in store.snapshots():
            counts[s.fs_name] = counts.get(s.fs_name, 0) + 1
        return counts


def test_age_and_snapshot_name_an_image_alike(tmp_path: Path, stream: Path) -> None:
    r = CliRunner()
    labelled = make_ext_image(tmp_path, "ext4", size="32M", extra=["-L", "scratch"], name="l.img")
    db = tmp_path / "a.db"
    res = r.invoke(
        main,
        ["age", str(labelled), "--ops", str(stream), "--offline", "--db", str(db),
         "--snapshot-every", "500"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    snap = r.invoke(main, ["snapshot", str(labelled), "--db", str(db)])
    assert snap.exit_code == 0, snap.output
    counts = _names(db)
    assert list(counts) == ["scratch"] and counts["scratch"] >= 3

    # No label: fs- and the uuid dumpe2fs reads, first by snapshot, then by age.
    bare = make_ext_image(tmp_path, "ext4", size="32M", name="bare.img")
    uuid = dumpe2fs_header(bare)["Filesystem UUID"]
    db2 = tmp_path / "b.db"
    snap = r.invoke(main, ["snapshot", str(bare), "--db", str(db2)])
    assert snap.exit_code == 0, snap.output
    assert re.match(rf"snapshot 1 of fs-{uuid[:8]}:", snap.output)
    res = r.invoke(
        main,
        ["age", str(bare), "--ops", str(stream), "--offline", "--db", str(db2),
         "--snapshot-every", "500"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert list(_names(db2)) == [f"fs-{uuid[:8]}"]


def test_resume_keeps_the_name(
    tmp_path: Path, stream: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    image = make_ext_image(tmp_path, "ext4", size="32M", extra=["-L", "scratch"], name="d.img")
    db = tmp_path / "a.db"
    real = OfflineExtExecutor.apply
    calls = [0]

    def failing(self: OfflineExtExecutor, op: Op) -> int:
        calls[0] += 1
        if calls[0] == 1201:
            raise OpFailedError("create 'x': Input/output error")
        return real(self, op)

    opts = AgeOptions(ops_file=stream, mode="offline", db=db, snapshot_every=500, name="demo")
    with monkeypatch.context() as m:
        m.setattr(OfflineExtExecutor, "apply", failing)
        with pytest.raises(OpFailedError):
            age(image, opts)
    record = json.loads((tmp_path / "d.img.fsage-age").read_text())
    assert record["ops_done"] == 1200 and not record["finished"]
    res = age(image, AgeOptions(resume=True, db=db, snapshot_every=500))
    assert res.finished and res.resumed_from == 1200
    counts = _names(db)
    assert list(counts) == ["demo"] and counts["demo"] >= 4
    with Store.open(db) as store:
        params = [
            json.loads(p) for (p,) in store.con.execute("SELECT params FROM aging_runs ORDER BY id")
        ]
    # The resumed run continues the interrupted run's row.
    assert [(p["name"], p.get("resumed_at")) for p in params] == [("demo", [1200])]


def _bench_names(db: Path) -> list[str]:
    with Store.open(db) as store:
        return [n for (n,) in store.con.execute("SELECT fs_name FROM bench_runs ORDER BY id")]


@pytest.mark.needs_root
def test_bench_names_an_image_as_snapshot_does(tmp_path: Path) -> None:
    r = CliRunner()
    bench = ["--suite", "seq", "--size", "128K", "--file-size", "64K", "--repeat", "1"]
    bench += ["--no-baseline", "--format", "json"]
    labelled = make_ext_image(tmp_path, "ext4", size="32M", extra=["-L", "scratch"], name="l.img")
    bare = make_ext_image(tmp_path, "ext4", size="32M", name="bare.img")
    uuid = dumpe2fs_header(bare)["Filesystem UUID"]
    db = tmp_path / "b.db"
    # Unknown to the database: the label, else fs- and the uuid dumpe2fs reads.
    for image, expected in ((labelled, "scratch"), (bare, f"fs-{uuid[:8]}")):
        res = r.invoke(main, ["bench", str(image), "--db", str(db), *bench])
        assert res.exit_code == 0, res.output
        assert json.loads(res.stdout)["fs_name"] == expected
    # Known by other names: the first, which a snapshot without --name takes too, unless --name
    # says otherwise.
    for name in ("home", "spare"):
        snap = r.invoke(main, ["snapshot", str(bare), "--db", str(db), "--name", name])
        assert snap.exit_code == 0, snap.output
    res = r.invoke(main, ["bench", str(bare), "--db", str(db), *bench])
    assert res.exit_code == 0, res.output
    res = r.invoke(main, ["bench", str(bare), "--db", str(db), "--name", "other", *bench])
    assert res.exit_code == 0, res.output
    assert _bench_names(db) == ["scratch", f"fs-{uuid[:8]}", "home", "other"]
