"""``honkctl``: inspect and steer a running honk daemon.

The daemon's control API arrives with the API issue; until then this client
only documents itself.
"""

from __future__ import annotations

import click

from honk import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="honkctl")
@click.option("--api", envvar="HONK_API", default="http://127.0.0.1:9090", show_default=True,
              help="Base URL of the daemon's API (HONK_API).")
@click.option("--secret", envvar="HONK_SECRET", default="", help="API secret (HONK_SECRET).")
@click.pass_context
def cli(ctx: click.Context, api: str, secret: str) -> None:
    """Inspect and steer a running honk daemon.

    No commands yet: the daemon's control API is not served by this version.
    """
    ctx.obj = {"api": api, "secret": secret}


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
