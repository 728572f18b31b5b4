"""Write honk(8) and honkctl(1) from the commands' own click help, so the manuals say what
``--help`` says.

    python packaging/deb/manpages.py OUTDIR

Each page has NAME, SYNOPSIS, DESCRIPTION (the group's help), OPTIONS, COMMANDS (every
subcommand, nested ones included, with its arguments and options) and, for honkctl, the
exit codes and address rules of its epilog.
"""

from __future__ import annotations

import datetime
import os
import sys
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from honk import __version__  # noqa: E402
from honk.cli.ctl import cli as ctl_cli  # noqa: E402
from honk.cli.daemon import cli as daemon_cli  # noqa: E402

PAGES = (("honk", 8, daemon_cli, "System Administration"), ("honkctl", 1, ctl_cli, "User Commands"))


def roff(text: str) -> str:
    """``text`` safe in a roff body: backslashes doubled, a leading dot or quote escaped."""
    out = []
    for line in text.replace("\\", "\\e").splitlines():
        out.append("\\&" + line if line.startswith((".", "'")) else line)
    return "\n".join(out)


def paragraphs(help_text: str) -> str:
    """click help text as roff paragraphs; a ``\\b`` block keeps its lines as they are."""
    blocks = [b.strip("\n") for b in help_text.split("\n\n") if b.strip()]
    out = []
    for block in blocks:
        if block.startswith("\b"):
            out.append(".nf\n" + roff(block[1:].strip("\n")) + "\n.fi")
        else:
            out.append(roff(" ".join(line.strip() for line in block.splitlines())))
    return "\n.PP\n".join(out)


def options(command: click.Command, ctx: click.Context) -> str:
    rows = []
    for param in command.get_params(ctx):
        record = param.get_help_record(ctx)
        if record is None:
            continue
        names, text = record
        rows.append(f".TP\n.B {roff(names)}\n{roff(text)}")
    return "\n".join(rows)


def commands(group: click.Group, ctx: click.Context, prefix: str) -> str:
    out = []
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if command is None or command.hidden:
            continue
        sub = click.Context(command, info_name=name, parent=ctx)
        usage = " ".join(command.collect_usage_pieces(sub))
        out.append(f".SS {roff(prefix + ' ' + name)} {roff(usage)}")
        if command.help:
            out.append(paragraphs(command.help))
        opts = options(command, sub)
        if opts:
            out.append(opts)
        if isinstance(command, click.Group):
            out.append(commands(command, sub, f"{prefix} {name}"))
    return "\n".join(out)


def page(name: str, section: int, group: click.Group, manual: str, date: str) -> str:
    ctx = click.Context(group, info_name=name)
    summary = (group.help or "").strip().splitlines()[0].rstrip(".")
    parts = [
        f'.TH {name.upper()} {section} "{date}" "honk {__version__}" "{manual}"',
        ".SH NAME",
        f"{name} \\- {roff(summary.split(': ', 1)[-1])}",
        ".SH SYNOPSIS",
        f".B {name}\n{roff(' '.join(group.collect_usage_pieces(ctx)))}",
        ".SH DESCRIPTION",
        paragraphs(group.help or ""),
        ".SH OPTIONS",
        options(group, ctx),
        ".SH COMMANDS",
        commands(group, ctx, name),
    ]
    if group.epilog:
        parts += [".SH NOTES", paragraphs(group.epilog)]
    parts += [".SH FILES", ".TP\n.I /etc/honk/config.dae\nThe configuration the packaged service runs.",
              ".TP\n.I /etc/honk/api.dae\nThe API address and secret, written once by the package.",
              ".TP\n.I /var/lib/honk\nState: last delays, subscription caches.",
              ".SH SEE ALSO", "honk(8), honkctl(1), systemctl(1)"]
    return "\n".join(parts) + "\n"


def main(argv: list[str]) -> None:
    out = Path(argv[1] if len(argv) > 1 else ".")
    out.mkdir(parents=True, exist_ok=True)
    # SOURCE_DATE_EPOCH (set by dpkg-buildpackage from the changelog) keeps the build reproducible
    stamp = int(os.environ.get("SOURCE_DATE_EPOCH", "0")) or None
    when = datetime.datetime.fromtimestamp(stamp, datetime.UTC) if stamp else datetime.datetime.now(datetime.UTC)
    for name, section, group, manual in PAGES:
        (out / f"{name}.{section}").write_text(page(name, section, group, manual, when.strftime("%Y-%m-%d")))


if __name__ == "__main__":
    main(sys.argv)
