"""`fsage daemon` and `fsage status`: nightly snapshot collection and how it is going."""

from __future__ import annotations

import sys
from datetime import datetime
from pathlib import Path

import click
from click.core import ParameterSource

from fsage.cli.common import db_option, echo_csv, echo_json, echo_table, format_option
from fsage.errors import UsageError
from fsage.snapshotter.daemon import (
    ConfigError,
    Daemon,
    DaemonConfig,
    TargetStatus,
    daemon_status,
    load_config,
)
from fsage.snapshotter.schedule import parse_duration

_config_option = click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Daemon configuration file (TOML).",
)


@click.command()
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="Daemon configuration file (TOML).",
)
@click.option("--once", is_flag=True, help="Run every target now, then exit (for cron).")
@click.option(
    "--target",
    "targets",
    multiple=True,
    metavar="NAME",
    help="With --once: only this target (repeatable).",
)
@click.option("--no-jitter", is_flag=True, help="Ignore the configured jitter.")
@click.option(
    "--wait-for-lock",
    "lock_wait",
    default="1s",
    show_default=True,
    metavar="DURATION",
    help="How long to wait for another fsage daemon run that holds the database (the "
    "timers' services wait 6h, so that runs of two schedules that meet take turns).",
)
@click.option("--check", is_flag=True, help="Only validate the configuration and exit.")
@click.option(
    "--install-units",
    "units_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Write the systemd units for this configuration and this fsage's path to DIR (e.g. "
    "/etc/systemd/system), then exit: a timer and a service per schedule (fsage.timer and "
    "fsage.service when all targets share one, else fsage-TARGET.timer/.service), and "
    "fsage-daemon.service, the long-running daemon, to use instead of them. Says which runs "
    'each target; a schedule no calendar can say (every = "7m") leaves the daemon only.',
)
@click.option(
    "--install-cron",
    "cron_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the cron lines for this configuration (one per schedule) to FILE (e.g. "
    "/etc/cron.d/fsage), then exit.",
)
def daemon(
    config_path: Path,
    once: bool,
    targets: tuple[str, ...],
    no_jitter: bool,
    lock_wait: str,
    check: bool,
    units_dir: Path | None,
    cron_file: Path | None,
) -> None:
    """Snapshot the configured targets on their schedules, recording every attempt.

    Runs until SIGTERM or SIGINT; a snapshot in progress then rolls back (or is kept whole if
    it had committed) and the daemon exits 0. With --once every target runs now and the exit
    status is 1 if any failed. One daemon per database: a second one exits with an error.

    \b
    Configuration:
      database = "/var/lib/fsage/fsage.db"
      schedule = "30 2 * * *"      # cron; or every = "6h"
      jitter = "10m"
      [retention]
      daily = 14
      monthly = 12
      [[target]]
      name = "home"
      source = "/dev/sdb1"

    \b
    Examples:
      fsage daemon --config /etc/fsage/fsage.toml
      fsage daemon --config fsage.toml --once
      fsage daemon --config fsage.toml --check
      fsage daemon --config /etc/fsage/fsage.toml --install-units /etc/systemd/system
    """
    if targets and not once:
        raise UsageError("--target needs --once")
    config = _load_config(config_path)
    try:
        wait = parse_duration(lock_wait)
    except ValueError as exc:
        raise UsageError(f"--wait-for-lock: {exc}") from None
    if units_dir is not None or cron_file is not None or check:
        from fsage.snapshotter.units import describe_units, install_cron, install_units

        written = install_units(units_dir, config_path, config) if units_dir is not None else []
        if cron_file is not None:
            written.append(install_cron(cron_file, config_path, config))
        for path in written:
            click.echo(f"wrote {path}")
        if check:
            n = len(config.targets)
            click.echo(f"{config_path}: ok, {n} target(s), database {config.database}")
        if check or units_dir is not None:
            for line in describe_units(config):
                click.echo(line)
        return
    runner = Daemon(config, use_jitter=not no_jitter, lock_wait=wait)
    code = runner.run_once(targets) if once else runner.run_forever()
    sys.exit(code)


def _load_config(path: Path) -> DaemonConfig:
    """The configuration at ``path``; its problems are printed one a line, then fsage exits."""
    try:
        return load_config(path)
    except ConfigError as exc:
        for line in exc.problems:
            click.echo(f"fsage: error: {line}", err=True)
        sys.exit(exc.exit_code)


def _when(value: datetime | None) -> str:
    if value is None:
        return "-"
    return value.astimezone().strftime("%Y-%m-%d %H:%M:%S")


@click.command()
@db_option
@_config_option
@format_option("text", "json", "csv")
def status(db: Path, config_path: Path | None, fmt: str) -> None:
    """Per daemon target: the last success, the last failure with its error, the next run.

    With --config the targets and their schedules come from the configuration (and so does
    the database); with --db only, from what the daemon recorded. Times are local in the
    text table, ISO 8601 with their offset in JSON and CSV (one row per target, the fields
    of JSON's targets).

    \b
    Examples:
      fsage status --config /etc/fsage/fsage.toml
      fsage status --db /var/lib/fsage/fsage.db --format json
      fsage status --config /etc/fsage/fsage.toml --format csv
    """
    ctx = click.get_current_context()
    config = None
    if config_path is not None:
        if ctx.get_parameter_source("db") not in (ParameterSource.DEFAULT, None):
            raise UsageError("give --db or --config, not both (the config names the database)")
        config = _load_config(config_path)
        db = config.database
    result = daemon_status(db, config)
    if fmt == "json":
        echo_json(result.to_json())
        return
    if fmt == "csv":
        rows = [t.to_json() for t in result.targets]
        fields = list(TargetStatus.__dataclass_fields__)
        echo_csv(fields, [[r[k] for k in fields] for r in rows])
        return
    if result.daemon_pid is None:
        running = "not running"
    elif result.daemon_pid:
        running = f"running (pid {result.daemon_pid})"
    else:
        running = "running"
    click.echo(f"database {result.database}; daemon {running}")
    echo_table(
        ["target", "last success", "snapshot", "last failure", "error", "next run"],
        [
            [
                t.target,
                _when(t.last_success_at),
                t.last_success_snapshot,
                _when(t.last_failure_at),
                t.last_failure_error,
                _when(t.next_run),
            ]
            for t in result.targets
        ],
    )


COMMANDS = [daemon, status]
