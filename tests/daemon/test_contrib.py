"""The example configuration in contrib/ loads; the systemd units and the cron line that
`fsage daemon --install-units` / `--install-cron` write name the real fsage and pass
systemd-analyze verify (when it is installed)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from fsage.cli import main
from fsage.snapshotter.daemon import load_config
from fsage.snapshotter.schedule import CronSchedule
from fsage.snapshotter.units import UNITS, fsage_command, install_cron, install_units

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


def test_cron_line_installed_with_the_real_path(tmp_path: Path) -> None:
    cfg = tmp_path / "fsage.toml"
    shutil.copy(CONTRIB / "fsage.toml", cfg)
    path = install_cron(tmp_path / "fsage", cfg)
    lines = [x for x in path.read_text().splitlines() if x and x[0] != "#"]
    assert len(lines) == 1
    fields = lines[0].split()
    CronSchedule.parse(" ".join(fields[:5]))
    assert fields[5] == "root"
    assert fields[6:] == [*shlex.split(fsage_command()), "daemon", "--config", str(cfg), "--once"]
    # the command in it runs this fsage
    cmd = [*shlex.split(fsage_command()), "daemon", "--config", str(cfg), "--check"]
    env = {**os.environ, "PYTHONPATH": str(CONTRIB.parent)}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"{cfg}: ok, 2 target(s)")


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
    written = sorted(p.name for p in units.iterdir())
    assert written == sorted(UNITS)
    for name in UNITS:
        text = (units / name).read_text()
        assert "@FSAGE@" not in text and "@CONFIG@" not in text
        if name.endswith(".service"):
            (exec_line,) = [x for x in text.splitlines() if x.startswith("ExecStart=")]
            assert exec_line.startswith(f"ExecStart={fsage_command()} daemon --config {cfg}")
    proc = subprocess.run(
        ["systemd-analyze", "verify", *(str(units / n) for n in UNITS)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0 and proc.stderr.strip() == "", proc.stderr


def test_systemd_analyze_verify_catches_a_missing_executable(tmp_path: Path) -> None:
    """The check above can fail: a unit naming a path that does not exist is refused."""
    if shutil.which("systemd-analyze") is None:
        pytest.skip("needs systemd-analyze (Debian package systemd)")
    install_units(tmp_path, CONTRIB / "fsage.toml", command="/nonexistent/fsage")
    proc = subprocess.run(
        ["systemd-analyze", "verify", str(tmp_path / "fsage.service")],
        capture_output=True,
        text=True,
    )
    assert "/nonexistent/fsage" in proc.stderr
