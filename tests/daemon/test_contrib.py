"""The example configuration in contrib/ loads; the systemd units and the cron line that
`fsage daemon --install-units` / `--install-cron` write name the real fsage and pass
systemd-analyze verify (when it is installed)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import threading
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from fsage.cli import main
from fsage.snapshotter.daemon import DaemonLockedError, DatabaseLock, load_config
from fsage.snapshotter.schedule import CronSchedule, Interval
from fsage.snapshotter.units import calendar_of, fsage_command, install_cron, install_units

CONTRIB = Path(__file__).resolve().parents[2] / "contrib"


def test_example_config_loads() -> None:
    config = load_config(CONTRIB / "fsage.toml")
    assert config.database == Path("/var/lib/fsage/fsage.db")
    assert [(t.name, str(t.source)) for t in config.targets] == [
        ("home", "/dev/sdb1"),
        ("scratch", "/srv/scratch"),
    ]
    assert config.targets[0].jitter == 600.0
    assert config.targets[1].schedule.text == "0 */6 * * *"


def test_cron_lines_installed_with_the_real_path(tmp_path: Path) -> None:
    cfg = tmp_path / "fsage.toml"
    shutil.copy(CONTRIB / "fsage.toml", cfg)
    path = install_cron(tmp_path / "fsage", cfg, load_config(cfg))
    lines = [x for x in path.read_text().splitlines() if x and x[0] != "#"]
    # One line per schedule: home nightly, scratch every 6 hours.
    assert len(lines) == 2
    run = [*shlex.split(fsage_command()), "daemon", "--config", str(cfg), "--once"]
    for line, when, target in zip(
        lines, ["30 2 * * *", "0 */6 * * *"], ["home", "scratch"], strict=True
    ):
        fields = line.split()
        assert " ".join(fields[:5]) == when and fields[5] == "root"
        assert fields[6:] == [*run, "--wait-for-lock", "6h", "--target", target]
    # the command in it runs this fsage
    cmd = [*shlex.split(fsage_command()), "daemon", "--config", str(cfg), "--check"]
    env = {**os.environ, "PYTHONPATH": str(CONTRIB.parent)}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"{cfg}: ok, 2 target(s)")
    assert "fsage-scratch.timer runs scratch at cron '0 */6 * * *'" in proc.stdout


def _elapses(specs: list[str], n: int) -> list[datetime]:
    """The next ``n`` times systemd's calendar fires for any of ``specs`` (UTC)."""
    times: set[datetime] = set()
    for spec in specs:
        out = subprocess.run(
            ["systemd-analyze", "calendar", f"--iterations={n}", spec],
            capture_output=True,
            text=True,
            env={**os.environ, "TZ": "UTC"},
            check=True,
        ).stdout
        for m in re.finditer(r"(?:Next elapse|Iter\. #\d+): \w+ (\S+ \S+) UTC", out):
            times.add(datetime.fromisoformat(m.group(1)))
    return sorted(times)[:n]


@pytest.mark.parametrize(
    "cron",
    [
        "30 2 * * *",
        "0 */6 * * *",
        "*/20 9-17 * * mon-fri",
        "0 3 1,15 * sun",  # cron(8): the 1st, the 15th and every Sunday
        "15 4 */2 * *",
        "0 0 1 jan,jul *",
        "@weekly",
    ],
)
def test_timer_calendars_fire_when_the_cron_expression_does(cron: str) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("needs systemd-analyze (Debian package systemd)")
    croniter = pytest.importorskip("croniter").croniter
    specs = list(calendar_of(CronSchedule.parse(cron)))
    got = _elapses(specs, 40)
    start = got[0] - timedelta(seconds=1)
    day_or = cron.split()[2][0] != "*" and cron.split()[4][0] != "*" if " " in cron else False
    it = croniter(cron, start, day_or=day_or)
    want = [it.get_next(datetime) for _ in range(40)]
    assert got == want


def test_intervals_as_calendars_and_the_daemon_when_none_fits(tmp_path: Path) -> None:
    assert calendar_of(Interval.parse("6h")) == ("*-*-* 00/6:00:00 UTC",)
    assert calendar_of(Interval.parse("15m")) == ("*-*-* *:00/15:00 UTC",)
    assert calendar_of(Interval.parse("7m")) == ()
    cfg = tmp_path / "odd.toml"
    cfg.write_text(
        f'database = "{tmp_path}/f.db"\n'
        '[[target]]\nname = "a"\nsource = "/dev/null"\nevery = "7m"\n'
        "retention = { last = 10 }\n"
    )
    units = tmp_path / "units"
    r = CliRunner()
    res = r.invoke(main, ["daemon", "--config", str(cfg), "--install-units", str(units)])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in units.iterdir()) == ["fsage-daemon.service"]
    assert "no timers (every 7m has no calendar form): run fsage-daemon.service" in res.output
    res = r.invoke(main, ["daemon", "--config", str(cfg), "--install-cron", str(tmp_path / "c")])
    assert res.exit_code != 0 and "has no cron form" in res.output
    assert not (tmp_path / "c").exists()


def test_systemd_units_installed_by_the_cli_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("needs systemd-analyze (Debian package systemd)")
    cfg = tmp_path / "etc" / "fsage.toml"
    cfg.parent.mkdir()
    shutil.copy(CONTRIB / "fsage.toml", cfg)
    units = tmp_path / "units"
    result = CliRunner().invoke(
        main, ["daemon", "--config", str(cfg), "--install-units", str(units)]
    )
    assert result.exit_code == 0, result.output
    names = [
        "fsage-daemon.service",
        "fsage-home.service",
        "fsage-home.timer",
        "fsage-scratch.service",
        "fsage-scratch.timer",
    ]
    assert sorted(p.name for p in units.iterdir()) == names
    assert "fsage-home.timer runs home at cron '30 2 * * *'" in result.output
    assert "fsage-daemon.service keeps every schedule itself" in result.output
    for name in names:
        text = (units / name).read_text()
        assert "@" not in text.replace("@FSAGE", "")
        if name.endswith(".service"):
            (exec_line,) = [x for x in text.splitlines() if x.startswith("ExecStart=")]
            assert exec_line.startswith(f"ExecStart={fsage_command()} daemon --config {cfg}")
    scratch = (units / "fsage-scratch.timer").read_text()
    assert "OnCalendar=*-*-* 00,06,12,18:00:00\n" in scratch
    assert "RandomizedDelaySec=600s" in scratch
    assert (units / "fsage-scratch.service").read_text().count("--target scratch") == 1
    proc = subprocess.run(
        ["systemd-analyze", "verify", *(str(units / n) for n in names)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0 and proc.stderr.strip() == "", proc.stderr


def test_one_schedule_keeps_the_plain_names(tmp_path: Path) -> None:
    cfg = tmp_path / "one.toml"
    cfg.write_text(
        f'database = "{tmp_path}/f.db"\nschedule = "0 1 * * *"\n'
        '[[target]]\nname = "a"\nsource = "/dev/null"\n'
        '[[target]]\nname = "b"\nsource = "/dev/null"\n'
    )
    written = install_units(tmp_path / "u", cfg, load_config(cfg))
    assert sorted(p.name for p in written) == [
        "fsage-daemon.service",
        "fsage.service",
        "fsage.timer",
    ]
    service = (tmp_path / "u" / "fsage.service").read_text()
    assert "--target" not in service and "--once --no-jitter" in service


def test_systemd_analyze_verify_catches_a_missing_executable(tmp_path: Path) -> None:
    """The check above can fail: a unit naming a path that does not exist is refused."""
    if shutil.which("systemd-analyze") is None:
        pytest.skip("needs systemd-analyze (Debian package systemd)")
    cfg = CONTRIB / "fsage.toml"
    install_units(tmp_path, cfg, load_config(cfg), command="/nonexistent/fsage")
    proc = subprocess.run(
        ["systemd-analyze", "verify", str(tmp_path / "fsage-home.service")],
        capture_output=True,
        text=True,
    )
    assert "/nonexistent/fsage" in proc.stderr


def test_a_run_waits_for_the_lock_another_holds(tmp_path: Path) -> None:
    """Two timers' runs that meet take turns: the second waits for the first's lock."""
    db = tmp_path / "f.db"
    first = DatabaseLock(db)
    first.acquire()
    second = DatabaseLock(db)
    with pytest.raises(DaemonLockedError):
        second.acquire(0.1)
    # Released once the refusal is seen (a timer started before it could fire first on a
    # loaded machine); the second gets the lock after that release, not before.
    released: list[float] = []

    def release() -> None:
        released.append(time.monotonic())
        first.release()

    threading.Timer(0.5, release).start()
    second.acquire(10.0)
    assert released and time.monotonic() - released[0] < 5
    second.release()
