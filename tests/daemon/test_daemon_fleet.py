"""Daemon configuration for nightly collection at fleet scale: export after each snapshot,
retention of targets that run several times a day."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from fsage.snapshotter.daemon import ConfigError, Daemon, Log, load_config
from fsage.snapshotter.retention import Retention

from .conftest import write_config


def test_a_sub_daily_target_inheriting_a_daily_retention_is_refused(tmp_path: Path) -> None:
    body = 'database = "f.db"\n[retention]\ndaily = 14\n'
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        body + '[[target]]\nname = "six"\nsource = "/srv"\nschedule = "0 */6 * * *"\n'
        '[[target]]\nname = "night"\nsource = "/srv"\n'
        '[[target]]\nname = "often"\nsource = "/srv"\nevery = "30m"\n'
    )
    with pytest.raises(ConfigError) as err:
        load_config(cfg)
    assert err.value.problems == [
        f"{cfg}: target 1 ('six'): runs 4 times a day but inherits the top-level retention "
        "(daily 14), which keeps one snapshot a day and would delete the others; give the "
        "target its own, e.g. retention = { hourly = 28, daily = 14 }",
        f"{cfg}: target 3 ('often'): runs 48 times a day but inherits the top-level retention "
        "(daily 14), which keeps one snapshot a day and would delete the others; give the "
        "target its own, e.g. retention = { hourly = 336, daily = 14 }",
    ]
    # its own retention, or an inherited one that keeps intra-day snapshots, is accepted
    cfg.write_text(
        body + '[[target]]\nname = "six"\nsource = "/srv"\nschedule = "0 */6 * * *"\n'
        "retention = { hourly = 28, daily = 14 }\n"
        '[[target]]\nname = "night"\nsource = "/srv"\n'
    )
    config = load_config(cfg)
    assert [t.retention for t in config.targets] == [
        Retention(hourly=28, daily=14),
        Retention(daily=14),
    ]
    cfg.write_text(
        'database = "f.db"\n[retention]\nlast = 8\ndaily = 14\n'
        '[[target]]\nname = "six"\nsource = "/srv"\nevery = "6h"\n'
    )
    assert load_config(cfg).targets[0].retention == Retention(last=8, daily=14)


def test_export_after_each_snapshot(tmp_path: Path, two_images: tuple[Path, Path]) -> None:
    pytest.importorskip("pyarrow")
    pytest.importorskip("duckdb")
    from fsage.fleet.query import fleet_tables

    a, b = two_images
    out = tmp_path / "export"
    cfg = write_config(
        tmp_path / "fsage.toml",
        'database = "fsage.db"\nexport_dir = "export"\nexport_host = "web1"\n',
        {"a": a, "b": b},
    )
    config = load_config(cfg)
    assert config.export_dir == out and config.export_host == "web1"
    stream = io.StringIO()
    daemon = Daemon(config, log=Log(stream, style="plain"), use_jitter=False)
    assert daemon.run_once() == 0
    assert daemon.run_once(["a"]) == 0
    log = stream.getvalue()
    assert log.count("target a: exported 1 snapshot(s)") == 2
    assert log.count("target b: exported 1 snapshot(s)") == 1
    fss = fleet_tables(out, ("filesystems",))["filesystems"]
    assert sorted((r["host"], r["fs"], r["snapshots"]) for r in fss) == [
        ("web1", "a", 2),
        ("web1", "b", 1),
    ]


def test_a_failed_export_is_logged_and_the_run_stays_ok(
    tmp_path: Path, two_images: tuple[Path, Path]
) -> None:
    a, _ = two_images
    (tmp_path / "export").write_text("not a directory")
    cfg = write_config(
        tmp_path / "fsage.toml", 'database = "fsage.db"\nexport_dir = "export"\n', {"a": a}
    )
    stream = io.StringIO()
    daemon = Daemon(load_config(cfg), log=Log(stream, style="plain"), use_jitter=False)
    assert daemon.run_once() == 0
    assert "warning: target a: export failed: " in stream.getvalue()
    assert "exists and is not a directory" in stream.getvalue()


def test_bad_export_keys(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        'database = "f.db"\nexport_dir = 3\nexport_host = "a/b"\n'
        '[[target]]\nname = "x"\nsource = "/srv"\n'
    )
    with pytest.raises(ConfigError) as err:
        load_config(cfg)
    assert [p.split(": ", 1)[1] for p in err.value.problems] == [
        "export_dir: expected a directory path (a non-empty string)",
        "export_host: expected a host name (a non-empty string without '/')",
    ]
