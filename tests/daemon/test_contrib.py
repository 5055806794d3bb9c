"""The files in contrib/: the example configuration loads, the cron line parses, the systemd
units pass systemd-analyze (when it is installed)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from fsage.snapshotter.daemon import load_config
from fsage.snapshotter.schedule import CronSchedule

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


def test_cron_line() -> None:
    lines = [x for x in (CONTRIB / "fsage.cron").read_text().splitlines() if x and x[0] != "#"]
    assert len(lines) == 1
    fields = lines[0].split()
    CronSchedule.parse(" ".join(fields[:5]))
    assert fields[5] == "root"
    assert fields[6:] == [
        "/usr/local/bin/fsage",
        "daemon",
        "--config",
        "/etc/fsage/fsage.toml",
        "--once",
    ]


@pytest.mark.parametrize("unit", ["fsage.service", "fsage.timer", "fsage-daemon.service"])
def test_systemd_units_verify(unit: str, tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("needs systemd-analyze")
    for name in ("fsage.service", "fsage.timer", "fsage-daemon.service"):
        shutil.copy(CONTRIB / name, tmp_path / name)
    proc = subprocess.run(
        ["systemd-analyze", "verify", str(tmp_path / unit)], capture_output=True, text=True
    )
    # The only complaint allowed: fsage is not installed at /usr/local/bin on this machine.
    problems = [
        line
        for line in proc.stderr.splitlines()
        if line.strip() and "/usr/local/bin/fsage is not executable" not in line
    ]
    assert problems == []
