"""``honk``: run the daemon, check a configuration file, or ask a running daemon to reload."""

from __future__ import annotations

import asyncio
import sys

import click

from honk import __version__

EXIT_CONFIG = 1  # the configuration was rejected
EXIT_RUNTIME = 2  # honk could not start (bind failure, permissions, another instance holds the lock)
EXIT_NOT_RUNNING = 3  # honk reload: no daemon holds the PID lock


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="honk")
def cli() -> None:
    """honk: a transparent-proxy router daemon.

    Configuration files are read by extension: .dae (the dae dialect),
    .toml or .json (the same schema, structured).
    """


@cli.command()
@click.argument("file", required=False, type=click.Path(dir_okay=False))
@click.option(
    "-c",
    "--config",
    "config",
    type=click.Path(dir_okay=False),
    help="Configuration file (.dae, .toml or .json); the same as FILE.",
)
def check(file: str | None, config: str | None) -> None:
    """Dry-run FILE: everything a start would build (routes, outbounds, groups, listeners'
    handlers), binding nothing. Prints a one-line summary, or the errors.

    Exits 1 when a start would refuse it. A port that is taken is not found here:
    nothing is bound."""

    from honk.config.diagnostics import ConfigError
    from honk.config.load import summary
    from honk.control.errors import ApplyError
    from honk.daemon.app import check_file

    config = config or file
    if config is None:
        raise click.UsageError("give the configuration file as FILE or -c")
    try:
        desired = asyncio.run(check_file(config))
    except ConfigError as exc:
        for d in exc.diagnostics:
            click.echo(str(d), err=True)
        click.echo(f"{config}: invalid ({len(exc.errors)} error(s))", err=True)
        sys.exit(EXIT_CONFIG)
    except OSError as exc:
        click.echo(f"{config}: cannot read ({exc.strerror or exc})", err=True)
        sys.exit(EXIT_CONFIG)
    except ApplyError as exc:
        click.echo(f"configuration invalid: {exc}", err=True)
        sys.exit(EXIT_CONFIG)
    spec = desired.spec
    for d in spec.diagnostics:
        click.echo(str(d), err=True)
    click.echo(f"{config}: ok: {summary(spec)}")


pid_file_option = click.option(
    "--pid-file",
    "pid_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="PID lock file [default: /run/honk/honk.pid as root, else <data_dir>/honk.pid].",
)


def _pid_path_from_config(config: str) -> str:
    """The default PID lock path for CONFIG (its data_dir); ConfigError when the file does not load."""
    from honk.config.load import load_file
    from honk.daemon.pidlock import default_pid_path

    return str(default_pid_path(load_file(config).global_.data_dir))


@cli.command()
@click.option(
    "-c",
    "--config",
    "config",
    required=True,
    type=click.Path(dir_okay=False),
    help="Configuration file (.dae, .toml or .json).",
)
@click.option("--debug", is_flag=True, help="Log at debug level whatever the file says.")
@pid_file_option
def run(config: str, debug: bool, pid_file: str | None) -> None:
    """Run the daemon on CONFIG until SIGTERM or SIGINT; SIGHUP reloads CONFIG.

    One daemon per PID lock file: a second `honk run` with the same lock exits
    with an error.
    """
    import uvloop

    from honk.config.diagnostics import ConfigError
    from honk.control.errors import ApplyError
    from honk.core.logs import setup_logging
    from honk.daemon.app import Daemon, log_diagnostics
    from honk.daemon.pidlock import AlreadyRunning, PidLock

    setup_logging("debug" if debug else "info")

    def invalid(exc: ConfigError) -> None:
        log_diagnostics(exc.diagnostics, during="start")
        click.echo(f"{config}: invalid ({len(exc.errors)} error(s)); honk did not start", err=True)
        sys.exit(EXIT_CONFIG)

    if pid_file is None:
        try:
            pid_file = _pid_path_from_config(config)
        except ConfigError as exc:
            invalid(exc)
    lock = PidLock(pid_file)
    try:
        lock.acquire()
    except AlreadyRunning as exc:
        click.echo(f"honk did not start: {exc}", err=True)
        sys.exit(EXIT_RUNTIME)
    except OSError as exc:
        click.echo(f"honk did not start: cannot lock {pid_file}: {exc.strerror or exc}", err=True)
        sys.exit(EXIT_RUNTIME)

    daemon = Daemon(config, log_level="debug" if debug else None)

    async def main() -> None:
        await daemon.run_forever()

    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(main())
    except ConfigError as exc:
        invalid(exc)
    except ApplyError as exc:  # the first apply was refused: nothing was started
        click.echo(f"honk did not start: {exc}", err=True)
        sys.exit(EXIT_CONFIG)
    except OSError as exc:
        click.echo(f"honk did not start: {exc.strerror or exc}", err=True)
        sys.exit(EXIT_RUNTIME)
    finally:
        lock.release()


@cli.command()
@click.option(
    "-c",
    "--config",
    "config",
    type=click.Path(dir_okay=False),
    default=None,
    help="The running daemon's configuration file (locates the PID lock through its data_dir).",
)
@pid_file_option
def reload(config: str | None, pid_file: str | None) -> None:
    """Signal the running daemon to reload its configuration (SIGHUP).

    The daemon is found through its PID lock file: --pid-file, else the default
    for CONFIG's data_dir (or for the default data_dir without -c). Exits 3 when
    no daemon holds the lock.
    """
    import signal

    from honk.config.diagnostics import ConfigError
    from honk.config.spec import DEFAULT_DATA_DIR
    from honk.daemon.pidlock import NotRunning, default_pid_path, signal_running

    if pid_file is None:
        if config is None:
            pid_file = str(default_pid_path(DEFAULT_DATA_DIR))
        else:
            try:
                pid_file = _pid_path_from_config(config)
            except ConfigError as exc:
                for d in exc.diagnostics:
                    click.echo(str(d), err=True)
                click.echo(
                    f"{config}: does not load ({len(exc.errors)} error(s)), so its data_dir and PID "
                    "file are unknown; pass --pid-file",
                    err=True,
                )
                sys.exit(EXIT_CONFIG)
    try:
        pid = signal_running(pid_file, signal.SIGHUP)
    except NotRunning as exc:
        click.echo(str(exc), err=True)
        sys.exit(EXIT_NOT_RUNNING)
    except OSError as exc:
        click.echo(f"cannot signal the daemon through {pid_file}: {exc.strerror or exc}", err=True)
        sys.exit(EXIT_RUNTIME)
    click.echo(f"reload signalled to pid {pid}")


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
