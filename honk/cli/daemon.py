"""``honk``: run the daemon or check a configuration file."""

from __future__ import annotations

import asyncio
import sys

import click

from honk import __version__

EXIT_CONFIG = 1  # the configuration was rejected
EXIT_RUNTIME = 2  # honk could not start (bind failure, permissions)


def _summary(spec) -> str:
    warnings = sum(1 for d in spec.diagnostics if d.severity.value == "warning")
    return (
        f"{len(spec.inbounds)} inbound(s), {len(spec.nodes)} node(s), {len(spec.groups)} group(s), "
        f"{len(spec.routing.rules)} rule(s), fallback {spec.routing.fallback}; {warnings} warning(s)"
    )


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="honk")
def cli() -> None:
    """honk: a transparent-proxy router daemon.

    Configuration files are read by extension: .dae (the dae dialect),
    .toml or .json (the same schema, structured).
    """


@cli.command()
@click.option("-c", "--config", "config", required=True, type=click.Path(dir_okay=False),
              help="Configuration file (.dae, .toml or .json).")
def check(config: str) -> None:
    """Validate CONFIG and print a one-line summary, or the located errors."""
    from honk.config.diagnostics import ConfigError
    from honk.config.load import load_file
    from honk.connection.plane import build_plane
    from honk.core.clock import MonotonicClock

    try:
        spec = load_file(config)
        build_plane(spec, MonotonicClock(), generation=0)  # compiles routes and groups; binds nothing
    except ConfigError as exc:
        for d in exc.diagnostics:
            click.echo(str(d), err=True)
        click.echo(f"{config}: invalid ({len(exc.errors)} error(s))", err=True)
        sys.exit(EXIT_CONFIG)
    except OSError as exc:
        click.echo(f"{config}: cannot read ({exc.strerror or exc})", err=True)
        sys.exit(EXIT_CONFIG)
    for d in spec.diagnostics:
        click.echo(str(d), err=True)
    click.echo(f"{config}: ok: {_summary(spec)}")


@cli.command()
@click.option("-c", "--config", "config", required=True, type=click.Path(dir_okay=False),
              help="Configuration file (.dae, .toml or .json).")
@click.option("--debug", is_flag=True, help="Log at debug level whatever the file says.")
def run(config: str, debug: bool) -> None:
    """Run the daemon on CONFIG until SIGTERM or SIGINT; SIGHUP reloads CONFIG."""
    import uvloop

    from honk.config.diagnostics import ConfigError
    from honk.daemon.app import Daemon, log_diagnostics
    from honk.daemon.logs import setup_logging

    setup_logging("debug" if debug else "info")
    daemon = Daemon(config, log_level="debug" if debug else None)

    async def main() -> None:
        await daemon.run_forever()

    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(main())
    except ConfigError as exc:
        log_diagnostics(exc.diagnostics, during="start")
        click.echo(f"{config}: invalid ({len(exc.errors)} error(s)); honk did not start", err=True)
        sys.exit(EXIT_CONFIG)
    except OSError as exc:
        click.echo(f"honk did not start: {exc.strerror or exc}", err=True)
        sys.exit(EXIT_RUNTIME)


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
