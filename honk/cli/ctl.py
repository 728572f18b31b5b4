"""``honkctl``: inspect and steer a running honk daemon through its native API (``/v1``);
``dns`` uses the Clash API's ``/dns/query`` and ``/cache/dns/flush``, and ``rules`` its
``/rules`` and ``/rules/disable``, which have no native twin.

The address and secret come from ``--api``/``--secret``, the environment
(``HONK_API``, ``HONK_API_SECRET``), or the ``experimental.clash_api`` block of a
honk configuration (``-c``, default ``/etc/honk/config.dae`` when it exists).
Output is a human table by default and the API's own JSON with ``--json``.

Startup cost matters (scripts call honkctl in loops): only the standard library,
click and :mod:`honk.cli.client` are imported up front; the configuration
loader only when the address has to come from a file.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NoReturn, TextIO

import click

from honk import __version__
from honk.cli import tables
from honk.cli.client import (
    DEFAULT_TIMEOUT,
    DELAY_SLACK,
    ApiCallError,
    ApiClient,
    ConnectError,
    Reply,
    Unauthorized,
    segment,
)

DEFAULT_CONFIG = "/etc/honk/config.dae"  # where packaged honk keeps its configuration
DEFAULT_API = "http://127.0.0.1:9090"  # the Clash API's default external_controller
DEFAULT_DELAY_TIMEOUT_MS = 5000  # what the API itself defaults to (and mihomo's dashboards send)
MAX_DELAY_TIMEOUT_MS = 32767  # the API's ceiling: an int16 of milliseconds
RELOAD_TIMEOUT = 60.0  # seconds at least for a reload: a large configuration takes a while to build
LOGS_IDLE_WINDOW = 1.0  # seconds: `logs` without -f ends once the stream was quiet this long
SPINNER_FRAMES = "|/-\\"
SPINNER_INTERVAL = 0.1  # seconds between spinner frames
LOG_LEVELS = ("trace", "debug", "info", "warn", "warning", "error", "silent")  # what /v1/logs accepts
NETWORKS = ("tcp", "udp", "both")
GEODATA_NAMES = ("geosite", "geoip")  # what the API's geodata update takes
# seconds the daemon allows one geodata file and its checksum (honk.control.geoupdate's DOWNLOAD_TIMEOUT
# and CHECKSUM_TIMEOUT; not imported: honkctl starts without the daemon's modules)
GEODATA_FILE_BUDGET = 600.0 + 10.0
GEODATA_UPDATE_TIMEOUT = len(GEODATA_NAMES) * GEODATA_FILE_BUDGET + RELOAD_TIMEOUT  # then the reload
GEODATA_FAILED_STATUS = 422  # the API's answer when a file was not updated (its body is the report)
# `dns query`'s names for the numbers mihomo's JSON carries (RFC 1035, 3596, 2782, 9460, 8659, 6895);
# not dnspython's tables: honkctl starts without it
DNS_TYPE_NAMES = {
    1: "A",
    2: "NS",
    5: "CNAME",
    6: "SOA",
    12: "PTR",
    15: "MX",
    16: "TXT",
    28: "AAAA",
    33: "SRV",
    64: "SVCB",
    65: "HTTPS",
    257: "CAA",
}
DNS_RCODE_NAMES = {0: "NOERROR", 1: "FORMERR", 2: "SERVFAIL", 3: "NXDOMAIN", 4: "NOTIMP", 5: "REFUSED"}
DNS_SECTIONS = ("Answer", "Authority", "Additional")
ZERO_TIME_YEAR = 1  # mihomo's hitAt/missAt of a rule never hit or missed: Go's zero time, year 1

# Exit codes (documented in `honkctl --help`).
EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_UNAUTHORIZED = 4
EXIT_CONFIG_INVALID = 5
EXIT_CODES: dict[int, str] = {
    EXIT_OK: "success",
    EXIT_REFUSED: 'the daemon refused the request (prints "error: <code>: <message>")',
    EXIT_USAGE: "usage error (bad option or argument)",
    EXIT_UNREACHABLE: "cannot reach the daemon (refused, unresolvable, no answer in time)",
    EXIT_UNAUTHORIZED: "unauthorized: the API secret is wrong or missing",
    EXIT_CONFIG_INVALID: "check: the configuration is invalid",
}
UNAUTHORIZED_MESSAGE = "error: unauthorized: the API secret was rejected (set --secret or HONK_API_SECRET)"

CONFIG_FORMATS = {".dae": "dae", ".toml": "toml", ".json": "json"}
ANY_HOST = {
    "0.0.0.0": "127.0.0.1",
    "": "127.0.0.1",
    "::": "::1",
}  # a wildcard listener is reached on loopback


def _epilog() -> str:
    # "\b" keeps click from re-wrapping the block
    lines = ["\b", "Exit codes:"]
    lines += [f"  {code}  {text}" for code, text in EXIT_CODES.items()]
    lines += [
        "",
        "\b",
        "Address and secret, first found wins:",
        "  --api / HONK_API, then the -c file's experimental.clash_api external_controller,",
        "  then http://127.0.0.1:9090;",
        "  --secret / HONK_API_SECRET (or HONK_SECRET), then the -c file's secret. A file's",
        "  secret is only sent to the file's own address unless -c is given explicitly.",
    ]
    return "\n".join(lines)


# --- the address from a configuration file ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FileApi:
    url: str | None  # None: the file enables no API
    secret: str


def _controller_url(controller: str, path: str) -> str:
    from honk.core.net import parse_host_port

    try:
        host, port = parse_host_port(controller)
    except ValueError as exc:
        raise click.UsageError(f"{path}: external_controller {controller!r}: {exc}") from None
    if port == 0:
        raise click.UsageError(f"{path}: external_controller picks a free port at start (port 0); pass --api")
    host = ANY_HOST.get(host, host)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _clash_api_block(path: str) -> Any:
    """The ``experimental.clash_api`` block of ``path``: the full loader first, then (for a file
    that does not validate, say while it is being edited) the entry file's own block alone."""
    from honk.config.build import build_clash_api
    from honk.config.diagnostics import ConfigError
    from honk.config.load import load_file
    from honk.config.tree import Sink

    try:
        return load_file(path).clash_api
    except ConfigError as exc:
        failure = exc
    fmt = CONFIG_FORMATS.get(os.path.splitext(path)[1].lower())
    try:
        with open(path, encoding="utf-8-sig") as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise click.UsageError(f"{path}: cannot read ({exc})") from None
    sink = Sink()
    if fmt == "dae":
        from honk.config import dae

        doc, _ = dae.read(text, path, sink)
    elif fmt is not None:
        from honk.config import structured

        doc = structured.read(text, fmt, path, sink)
    else:
        doc = None
    if doc is None or doc.clash_api is None:
        raise click.UsageError(f"{path}: the file does not load ({failure}); pass --api")
    block_sink = Sink()
    spec = build_clash_api(doc.clash_api, block_sink)
    if block_sink.has_errors:
        raise click.UsageError(f"{path}: the file does not load ({failure}); pass --api")
    return spec


def read_file_api(path: str) -> FileApi:
    block = _clash_api_block(path)
    if block is None:
        return FileApi(None, "")
    return FileApi(_controller_url(block.external_controller, path), block.secret)


# --- context -----------------------------------------------------------------------------------


class Ctl:
    """Per-invocation state: options as given, resolved into a client on first use."""

    def __init__(
        self, api: str | None, secret: str | None, config: str | None, as_json: bool, timeout: float
    ) -> None:
        self.api = api
        self.secret = secret
        self.config = config
        self.json = as_json
        self.timeout = timeout
        self.origin = ""
        self._client: ApiClient | None = None

    def _resolve(self) -> tuple[str, str]:
        url, secret = self.api, self.secret
        self.origin = "address from --api or HONK_API"
        file = self.config
        if file is None and os.path.isfile(DEFAULT_CONFIG):
            file = DEFAULT_CONFIG
        # a file's secret goes only to the file's address, unless the file was named explicitly
        want_secret = secret is None and (url is None or self.config is not None)
        if file is not None and (url is None or want_secret):
            found = read_file_api(file)
            if url is None:
                if found.url is None:
                    url = DEFAULT_API
                    self.origin = f"the default address: {file} has no experimental.clash_api block"
                else:
                    url = found.url
                    self.origin = f"address from experimental.clash_api in {file}"
            if want_secret and found.url is not None:
                secret = found.secret
        if url is None:
            url, self.origin = DEFAULT_API, "the default address; set --api or HONK_API"
        return url, secret or ""

    @property
    def client(self) -> ApiClient:
        if self._client is None:
            url, secret = self._resolve()
            try:
                self._client = ApiClient(url, secret, self.timeout)
            except ValueError as exc:
                raise click.UsageError(f"API address ({self.origin}): {exc}") from None
        return self._client

    def show(self, reply: Reply, human: Callable[[Any], str]) -> None:
        """The API's JSON as received with --json, else the human rendering."""
        if self.json:
            click.echo(reply.text.strip())
        else:
            text = human(reply.data)
            if text:
                click.echo(text)


pass_ctl = click.make_pass_decorator(Ctl)


def _fail(code: int, message: str) -> NoReturn:
    click.echo(message, err=True)
    sys.exit(code)


class CtlGroup(click.Group):
    """Maps the client's typed failures to the documented exit codes."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ApiCallError as exc:
            ctl = ctx.find_object(Ctl)
            if ctl is not None and ctl.json and exc.body is not None:
                click.echo(json.dumps(exc.body, ensure_ascii=False))
            if isinstance(exc, Unauthorized):
                _fail(EXIT_UNAUTHORIZED, UNAUTHORIZED_MESSAGE)
            _fail(EXIT_REFUSED, f"error: {exc.code}: {exc.message}")
        except ConnectError as exc:
            ctl = ctx.find_object(Ctl)
            origin = f" ({ctl.origin})" if ctl is not None and ctl.origin else ""
            _fail(EXIT_UNREACHABLE, f"error: {exc}{origin}")


def _set_json(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    ctl = ctx.find_object(Ctl)
    if value and ctl is not None:
        ctl.json = True


def json_flag(f: Callable[..., Any]) -> Callable[..., Any]:
    """``--json`` also after the command name (``honkctl groups --json``)."""
    return click.option(
        "--json",
        "as_json",
        is_flag=True,
        expose_value=False,
        callback=_set_json,
        help="Print the API's JSON as received.",
    )(f)


class Spinner:
    """A spinner on stderr while a slow request runs, only when stderr is a terminal."""

    def __init__(self, label: str, stream: TextIO | None = None) -> None:
        self.label = label
        self.stream = stream or sys.stderr
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _spin(self) -> None:
        frame = 0
        while not self._stop.wait(SPINNER_INTERVAL):
            self.stream.write(f"\r{SPINNER_FRAMES[frame % len(SPINNER_FRAMES)]} {self.label}")
            self.stream.flush()
            frame += 1

    def __enter__(self) -> Spinner:
        isatty = getattr(self.stream, "isatty", None)
        if isatty is not None and isatty():
            self._thread = threading.Thread(target=self._spin, name="honkctl-spinner", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self.stream.write("\r" + " " * (tables.width(self.label) + 2) + "\r")
        self.stream.flush()


# --- the program -------------------------------------------------------------------------------


@click.group(cls=CtlGroup, epilog=_epilog(), context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="honkctl")
@click.option(
    "--api",
    envvar="HONK_API",
    default=None,
    metavar="URL",
    help="Base URL of the daemon's API, e.g. http://127.0.0.1:9090 (HONK_API).",
)
@click.option(
    "--secret",
    envvar=["HONK_API_SECRET", "HONK_SECRET"],
    default=None,
    metavar="SECRET",
    help="API secret (HONK_API_SECRET; HONK_SECRET is still read).",
)
@click.option(
    "-c",
    "--config",
    "config",
    type=click.Path(dir_okay=False),
    default=None,
    help=f"honk configuration to read the API address and secret from [default: {DEFAULT_CONFIG} "
    "if it exists].",
)
@click.option("--json", "as_json", is_flag=True, help="Print the API's JSON as received (for scripts).")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=DEFAULT_TIMEOUT,
    show_default=True,
    metavar="SECONDS",
    help="Per-request timeout.",
)
@click.pass_context
def cli(
    ctx: click.Context, api: str | None, secret: str | None, config: str | None, as_json: bool, timeout: float
) -> None:
    """Inspect and steer a running honk daemon.

    Talks to the daemon's native API (/v1), and for `dns` and `rules` to its
    Clash API, on the listener of its experimental.clash_api block.
    """
    ctx.obj = Ctl(api, secret, config, as_json, timeout)


# --- status, version ---------------------------------------------------------------------------


def _status_text(d: dict[str, Any]) -> str:
    conns = d.get("connections") or {}
    traffic = d.get("traffic") or {}
    nodes = d.get("nodes") or {}
    api = d.get("api") or {}
    return tables.pairs(
        [
            ("honk", d.get("version")),
            ("uptime", tables.duration(d.get("uptime_s"))),
            ("generation", d.get("generation")),
            ("mode", d.get("mode")),
            ("connections", f"tcp {conns.get('tcp', 0)}, udp {conns.get('udp', 0)}"),
            ("traffic", f"up {tables.size(traffic.get('up'))}, down {tables.size(traffic.get('down'))}"),
            ("nodes", f"{nodes.get('alive', 0)} alive of {nodes.get('total', 0)}"),
            ("groups", d.get("groups")),
            ("api", api.get("address")),
        ]
    )


@cli.command()
@json_flag
@pass_ctl
def status(ctl: Ctl) -> None:
    """Uptime, mode, connections, traffic, counts."""
    ctl.show(ctl.client.request("GET", "/v1/status"), _status_text)


@cli.command()
@json_flag
@pass_ctl
def version(ctl: Ctl) -> None:
    """The versions of honkctl and of the daemon."""
    reply = ctl.client.request("GET", "/v1/version")
    if ctl.json:
        ctl.show(reply, str)
        return
    d = reply.data
    click.echo(f"honkctl {__version__}")
    click.echo(
        f"honk {d.get('version')} (api {d.get('api')}, pid {d.get('pid')}, "
        f"up {tables.duration(d.get('uptime_s'))})"
    )


# --- groups ------------------------------------------------------------------------------------


def _served(group: dict[str, Any], net: str) -> str:
    """What the group serves on ``net``: the member, the leaf behind it, a pin marker."""
    member = (group.get("selection") or {}).get(net)
    if member is None:
        return tables.EMPTY
    chain = (group.get("chain") or {}).get(net) or []
    text = member
    if chain and chain[-1] != member:
        text += f" -> {chain[-1]}"
    if ((group.get("pinned") or {}).get(net)) == member:
        text += " (pinned)"
    return text


def _groups_text(d: dict[str, Any]) -> str:
    rows = [
        (g.get("name"), g.get("policy"), _served(g, "tcp"), _served(g, "udp"), len(g.get("members") or []))
        for g in d.get("groups") or []
    ]
    return tables.table(("NAME", "POLICY", "TCP", "UDP", "MEMBERS"), rows, right=(4,))


def _per_network(value: dict[str, Any] | None) -> str | None:
    if not value:
        return None
    tcp, udp = value.get("tcp"), value.get("udp")
    if tcp is None and udp is None:
        return None
    if tcp == udp:
        return f"{tcp} (tcp, udp)"
    return f"tcp {tables.cell(tcp)}, udp {tables.cell(udp)}"


def _group_text(g: dict[str, Any]) -> str:
    chain = g.get("chain") or {}
    head = tables.pairs(
        [
            ("name", g.get("name")),
            ("id", g.get("id")),
            ("policy", g.get("policy")),
            ("tcp", _served(g, "tcp")),
            ("tcp chain", " -> ".join(chain.get("tcp") or []) or None),
            ("udp", _served(g, "udp")),
            ("udp chain", " -> ".join(chain.get("udp") or []) or None),
            ("choice", _per_network(g.get("choice"))),
            ("pinned", _per_network(g.get("pinned"))),
            ("check url", g.get("check_url")),
            ("interrupts", "yes" if g.get("interrupt_connections") else "no"),
            ("leaves", len(g.get("leaves") or [])),
        ]
    )
    selection = g.get("selection") or {}
    rows = [
        (m, "*" if selection.get("tcp") == m else "", "*" if selection.get("udp") == m else "")
        for m in g.get("members") or []
    ]
    return head + "\n\n" + tables.table(("MEMBER", "TCP", "UDP"), rows)


@cli.command()
@json_flag
@pass_ctl
def groups(ctl: Ctl) -> None:
    """Every group with what it serves on TCP and UDP."""
    ctl.show(ctl.client.request("GET", "/v1/groups"), _groups_text)


@cli.command()
@click.argument("name")
@json_flag
@pass_ctl
def group(ctl: Ctl, name: str) -> None:
    """One group: policy, selection and chain per network, members."""
    ctl.show(ctl.client.request("GET", f"/v1/groups/{segment(name)}"), _group_text)


network_option = click.option(
    "--network",
    type=click.Choice(NETWORKS),
    default="both",
    show_default=True,
    help="Which selection to change.",
)


@cli.command()
@click.argument("group_name", metavar="GROUP")
@click.argument("member")
@network_option
@json_flag
@pass_ctl
def select(ctl: Ctl, group_name: str, member: str, network: str) -> None:
    """Make GROUP serve MEMBER (choice, or pin).

    On a Selector this sets the choice; on a URLTest or Fallback group it pins
    MEMBER until `unpin`.
    """
    reply = ctl.client.request(
        "PUT", f"/v1/groups/{segment(group_name)}/selection", json_body={"member": member, "network": network}
    )

    def text(d: dict[str, Any]) -> str:
        changed = d.get("changed") or []
        if changed:
            return (
                f"{d.get('group', group_name)}: {d.get('member', member)} selected for {', '.join(changed)}"
            )
        return f"{d.get('group', group_name)}: {d.get('member', member)} was already selected ({network})"

    ctl.show(reply, text)


@cli.command()
@click.argument("group_name", metavar="GROUP")
@network_option
@json_flag
@pass_ctl
def unpin(ctl: Ctl, group_name: str, network: str) -> None:
    """Drop a URLTest/Fallback group's pin.

    The group's policy chooses again.
    """
    reply = ctl.client.request(
        "DELETE", f"/v1/groups/{segment(group_name)}/selection", query={"network": network}
    )

    def text(d: dict[str, Any]) -> str:
        cleared = d.get("cleared") or []
        name = d.get("group", group_name)
        return f"{name}: pin cleared for {', '.join(cleared)}" if cleared else f"{name}: no pin to clear"

    ctl.show(reply, text)


# --- nodes -------------------------------------------------------------------------------------


def _link_status(links: dict[str, Any] | None, family: str) -> str:
    link = (links or {}).get(family)
    return link.get("status", tables.EMPTY) if link else tables.EMPTY


def _summary_status(links: dict[str, Any] | None) -> str:
    statuses = [link.get("status") for link in (links or {}).values() if link]
    if not statuses:
        return tables.EMPTY
    for status in ("alive", "dead"):
        if status in statuses:
            return status
    return "unknown"


def _udp_status(node: dict[str, Any]) -> str:
    if not node.get("udp"):
        return tables.EMPTY
    health = node.get("health") or {}
    return _summary_status(health.get("data_udp") or health.get("dns_udp"))


def _node_name(node: dict[str, Any]) -> str:
    return str(node.get("name")) + (" (demoted)" if node.get("demoted") else "")


def _nodes_text(d: dict[str, Any]) -> str:
    rows = []
    for n in d.get("nodes") or []:
        tcp = (n.get("health") or {}).get("tcp")
        rows.append(
            (
                _node_name(n),
                n.get("protocol"),
                _link_status(tcp, "v4"),
                _link_status(tcp, "v6"),
                _udp_status(n),
                tables.delay((n.get("latency") or {}).get("last_ms")),
            )
        )
    return tables.table(("NAME", "PROTOCOL", "TCP4", "TCP6", "UDP", "LAST"), rows, right=(5,))


HISTORY_SHOWN = 5  # recent probes listed per link in `node NAME`


def _history(entries: Iterable[dict[str, Any]]) -> str:
    shown = [
        ("x" if e.get("failed") else tables.delay(e.get("delay_ms"))) for e in list(entries)[-HISTORY_SHOWN:]
    ]
    return ", ".join(shown)


def _node_text(n: dict[str, Any]) -> str:
    latency = n.get("latency") or {}
    head = tables.pairs(
        [
            ("name", n.get("name")),
            ("id", n.get("id")),
            ("protocol", n.get("protocol")),
            ("server", n.get("server")),
            ("subscription", n.get("subscription")),
            ("udp", "yes" if n.get("udp") else "no"),
            ("demoted", "yes" if n.get("demoted") else "no"),
            ("last delay", tables.delay(latency.get("last_ms"))),
        ]
    )
    rows = []
    for domain, links in (n.get("health") or {}).items():
        for family, link in (links or {}).items():
            rows.append(
                (
                    domain,
                    family,
                    link.get("status"),
                    tables.delay(link.get("average_ms")),
                    _history(link.get("history") or []),
                )
            )
    if not rows:
        return head
    return (
        head
        + "\n\n"
        + tables.table(("CHECK", "FAMILY", "STATUS", "AVERAGE", "RECENT (x = failed)"), rows, right=(3,))
    )


@cli.command()
@json_flag
@pass_ctl
def nodes(ctl: Ctl) -> None:
    """The health table: TCP per family, UDP, the last delay."""
    ctl.show(ctl.client.request("GET", "/v1/nodes"), _nodes_text)


@cli.command()
@click.argument("name")
@json_flag
@pass_ctl
def node(ctl: Ctl, name: str) -> None:
    """One node: server, health per check and family, history."""
    ctl.show(ctl.client.request("GET", f"/v1/nodes/{segment(name)}"), _node_text)


# --- delay -------------------------------------------------------------------------------------


def _delay_text(d: dict[str, Any]) -> str:
    rows = []
    for name, result in (d.get("results") or {}).items():
        ms = result.get("delay_ms")
        rows.append(
            (name, tables.delay(ms) if ms is not None else f"failed: {result.get('error') or 'error'}")
        )
    return tables.table(("NAME", "DELAY"), rows)


@cli.command()
@click.argument("target", metavar="NODE|GROUP")
@click.option("--url", default=None, help="URL to measure [default: the daemon's delay URL].")
@click.option(
    "--timeout",
    "timeout_ms",
    type=click.IntRange(1, MAX_DELAY_TIMEOUT_MS),
    default=DEFAULT_DELAY_TIMEOUT_MS,
    show_default=True,
    metavar="MS",
    help="How long the test may take, in milliseconds.",
)
@json_flag
@pass_ctl
def delay(ctl: Ctl, target: str, url: str | None, timeout_ms: int) -> None:
    """Delay-test a node, or each member of a group.

    Measures an HTTP request to --url through the node(s). A spinner runs on stderr while waiting (only on a terminal).
    """
    body: dict[str, Any] = {"target": target, "timeout_ms": timeout_ms}
    if url:
        body["url"] = url
    wait = max(ctl.timeout, timeout_ms / 1000 + DELAY_SLACK)
    with Spinner(f"testing {target}"):
        reply = ctl.client.request("POST", "/v1/delay", json_body=body, timeout=wait)
    ctl.show(reply, _delay_text)


# --- connections -------------------------------------------------------------------------------


def _connections_text(d: dict[str, Any]) -> str:
    conns = d.get("connections") or []
    rows = [
        (
            c.get("id"),
            c.get("network"),
            c.get("inbound"),
            c.get("source"),
            c.get("target"),
            " -> ".join(c.get("chain") or []),
            tables.size(c.get("upload")),
            tables.size(c.get("download")),
            tables.age(c.get("start")),
        )
        for c in conns
    ]
    totals = d.get("totals") or {}
    table = tables.table(
        ("ID", "NET", "INBOUND", "SOURCE", "TARGET", "CHAIN", "UP", "DOWN", "AGE"), rows, right=(6, 7, 8)
    )
    return (
        f"{table}\n\n{len(conns)} connection(s); since start: up {tables.size(totals.get('up'))}, "
        f"down {tables.size(totals.get('down'))}"
    )


@cli.group(cls=CtlGroup, invoke_without_command=True)
@json_flag
@click.pass_context
def connections(ctx: click.Context) -> None:
    """List live connections; `connections close` ends some."""
    if ctx.invoked_subcommand is None:
        ctl = ctx.find_object(Ctl)
        assert ctl is not None
        ctl.show(ctl.client.request("GET", "/v1/connections"), _connections_text)


@connections.command()
@click.argument("conn_id", metavar="[ID]", required=False)
@click.option(
    "--group", "group_name", metavar="G", default=None, help="Close every connection through group G."
)
@click.option("--node", "node_name", metavar="N", default=None, help="Close every connection through node N.")
@click.option("--all", "close_all", is_flag=True, help="Close every connection.")
@json_flag
@pass_ctl
def close(
    ctl: Ctl, conn_id: str | None, group_name: str | None, node_name: str | None, close_all: bool
) -> None:
    """Close the connection ID, or those through a group or node, or all."""
    given = sum(x for x in (conn_id is not None, group_name is not None, node_name is not None, close_all))
    if given != 1:
        raise click.UsageError("give exactly one of ID, --group, --node or --all")
    if conn_id is not None:
        reply = ctl.client.request("DELETE", f"/v1/connections/{segment(conn_id)}")
    else:
        query = {"group": group_name, "node": node_name, "all": "true" if close_all else None}
        reply = ctl.client.request("DELETE", "/v1/connections", query=query)
    ctl.show(reply, lambda d: f"closed {d.get('closed', 0)} connection(s)")


# --- users -------------------------------------------------------------------------------------


@cli.group(cls=CtlGroup)
def users() -> None:
    """Change an inbound's users without a reload (the user set is named like the inbound).

    A removed user's live sessions follow the configuration's user_removal
    (close by default); a file reload re-reads the users the file declares.
    """


@users.command("put")
@click.argument("user_set", metavar="SET")
@click.argument("username", metavar="USER")
@click.option("--password-stdin", is_flag=True, help="Read the password from standard input (one line).")
@json_flag
@pass_ctl
def users_put(ctl: Ctl, user_set: str, username: str, password_stdin: bool) -> None:
    """Add USER to SET, or change USER's password (asked for, never an argument)."""
    if password_stdin:
        password = click.get_text_stream("stdin").readline().rstrip("\r\n")
    else:
        password = click.prompt("password", hide_input=True, confirmation_prompt=True)
    reply = ctl.client.request(
        "PUT", f"/v1/users/{segment(user_set)}/{segment(username)}", json_body={"password": password}
    )
    ctl.show(reply, lambda d: f"user {username} of {user_set} set")


@users.command("remove")
@click.argument("user_set", metavar="SET")
@click.argument("username", metavar="USER")
@json_flag
@pass_ctl
def users_remove(ctl: Ctl, user_set: str, username: str) -> None:
    """Remove USER from SET (exit 1 if SET is unknown; a USER not there changes nothing)."""
    reply = ctl.client.request("DELETE", f"/v1/users/{segment(user_set)}/{segment(username)}")
    ctl.show(
        reply,
        lambda d: (
            f"user {username} removed from {user_set}"
            if d.get("removed")
            else f"{user_set} has no user {username}; nothing changed"
        ),
    )


# --- reload, check -----------------------------------------------------------------------------


@cli.command()
@click.option(
    "--allow-disruptive",
    is_flag=True,
    help="Apply even a change that ends live connections (a transparent inbound's interception).",
)
@json_flag
@pass_ctl
def reload(ctl: Ctl, allow_disruptive: bool) -> None:
    """Make the daemon apply its configuration file as it is now.

    Prints what the apply did (built, swapped, drained, rebound, restarted,
    removed, reused). Exits 1 when the daemon refuses the file or the change;
    it keeps running what it ran, and the error says why.
    """
    query = {"allow_disruptive": "true"} if allow_disruptive else None
    with Spinner("reloading"):
        reply = ctl.client.request(
            "POST", "/v1/reload", query=query, timeout=max(ctl.timeout, RELOAD_TIMEOUT)
        )
    d = reply.data or {}
    if ctl.json:
        ctl.show(reply, str)
    elif d.get("applied"):
        click.echo(f"config reloaded: {d.get('summary')}")


def _diag_line(file: str, diag: dict[str, Any]) -> str:
    where = file
    if diag.get("line"):
        where += f":{diag['line']}"
        if diag.get("column"):
            where += f":{diag['column']}"
    return (
        f"{where}: {diag.get('severity')}: {diag.get('key_path') or 'document'}: "
        f"{diag.get('message')} [{diag.get('code')}]"
    )


@cli.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@json_flag
@pass_ctl
def check(ctl: Ctl, file: str) -> None:
    """Validate a configuration file in the daemon.

    FILE (.dae, .toml or .json) is checked, not applied. Prints the summary, or the located diagnostics and exits 5. Only FILE's own
    text is sent: includes are not followed.
    """
    fmt = CONFIG_FORMATS.get(os.path.splitext(file)[1].lower())
    if fmt is None:
        raise click.UsageError(f"{file}: configuration files end in .dae, .toml or .json")
    try:
        with open(file, encoding="utf-8-sig") as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise click.UsageError(f"{file}: cannot read ({exc})") from None
    reply = ctl.client.request(
        "POST", "/v1/config/check", query={"format": fmt}, text_body=text, accept=(422,)
    )
    d = reply.data or {}
    diagnostics = d.get("diagnostics") or []
    if ctl.json:
        ctl.show(reply, str)
    else:
        for diag in diagnostics:
            click.echo(_diag_line(file, diag), err=True)
    if reply.status == 422:
        if not ctl.json:
            errors = sum(1 for diag in diagnostics if diag.get("severity") == "error")
            click.echo(f"{file}: invalid ({errors} error(s))", err=True)
        sys.exit(EXIT_CONFIG_INVALID)
    if not ctl.json:
        click.echo(f"{file}: ok: {d.get('summary', '')}".rstrip())


# --- geodata -----------------------------------------------------------------------------------


@cli.group(cls=CtlGroup)
def geodata() -> None:
    """`geodata update`: download the configured geodata and reload.

    The files are geosite.dat and geoip.dat, which routing rules read; their
    URLs and route are the configuration's assets.geodata.
    """


def _geodata_line(asset: dict[str, Any]) -> str:
    status = asset.get("status")
    if status == "updated":
        verified = ", checksum verified" if asset.get("verified") else ""
        detail = f"({asset.get('bytes')} bytes, {asset.get('codes')} codes{verified}) {asset.get('file')}"
    elif status == "unchanged":
        detail = str(asset.get("file"))
    else:
        detail = f"({asset.get('reason')})"
    return f"{asset.get('name')}: {status} {detail}"


@geodata.command("update")
@click.option(
    "--name", type=click.Choice(GEODATA_NAMES), default=None, help="Only this file [default: both]."
)
@json_flag
@pass_ctl
def geodata_update(ctl: Ctl, name: str | None) -> None:
    """Download the files assets.geodata names, check and swap them in.

    Each file is downloaded the way assets.geodata.route says (routing, direct,
    or through a node or group), checked (it must parse and hold every code the
    running rules use) and swapped in atomically; the daemon then reloads so
    routing uses it. Prints, per file, updated (bytes, codes), unchanged, or
    failed (reason); a failed file keeps its old content. Exits 1 when a file
    failed or the reload was refused.
    """
    with Spinner("updating geodata"):
        reply = ctl.client.request(
            "POST",
            "/v1/geodata/update",
            query={"name": name},
            timeout=max(ctl.timeout, GEODATA_UPDATE_TIMEOUT),
            accept=(GEODATA_FAILED_STATUS,),
        )
    d = reply.data or {}
    if ctl.json:
        ctl.show(reply, str)
    else:
        for asset in d.get("assets") or []:
            click.echo(_geodata_line(asset), err=asset.get("status") == "failed")
        if d.get("reload_error"):
            click.echo(f"reload refused: {d['reload_error']}", err=True)
        elif d.get("reloaded"):
            click.echo(f"reloaded: generation {d.get('generation')}")
    if reply.status == GEODATA_FAILED_STATUS or not d.get("ok", False):
        sys.exit(EXIT_REFUSED)


# --- dns ---------------------------------------------------------------------------------------


@cli.group(cls=CtlGroup)
def dns() -> None:
    """`dns query`, `dns flush`: ask honk's DNS service, empty its cache.

    They use the Clash API's /dns/query and /cache/dns/flush (mihomo's), so a
    daemon without a dns section answers `dns query` with an error.
    """


def _dns_type(number: Any) -> str:
    return DNS_TYPE_NAMES.get(number, f"TYPE{number}") if isinstance(number, int) else str(number)


def _dns_answer(d: Any) -> str:
    """mihomo's /dns/query JSON as a status line and one zone-file line per record."""
    if not isinstance(d, dict):
        return str(d)
    status = d.get("Status")
    head = [DNS_RCODE_NAMES.get(status, f"RCODE{status}") if isinstance(status, int) else str(status)]
    head += [
        f"{q.get('Name')} {_dns_type(q.get('Qtype'))}" for q in d.get("Question") or [] if isinstance(q, dict)
    ]
    head += [flag for flag in ("TC", "AD", "CD") if d.get(flag)]
    rows = [
        [record.get("name"), record.get("TTL"), _dns_type(record.get("type")), record.get("data")]
        for section in DNS_SECTIONS
        for record in d.get(section) or []
        if isinstance(record, dict)
    ]
    lines = [" ".join(head)]
    if rows:
        lines.append(tables.table(["name", "ttl", "type", "data"], rows, right=(1,)))
    return "\n".join(lines)


@dns.command("query")
@click.argument("name")
@click.option(
    "--type",
    "qtype",
    default="A",
    show_default=True,
    metavar="TYPE",
    help="The record type: A, AAAA, CNAME, MX, TXT, PTR, ...",
)
@json_flag
@pass_ctl
def dns_query(ctl: Ctl, name: str, qtype: str) -> None:
    """Ask honk's DNS service for NAME as a LAN client would (request rules, cache, upstream).

    Prints the response code and the records with the TTLs a client would get
    (a cached answer shows the time it has left). With --json, mihomo's JSON.
    """
    reply = ctl.client.request("GET", "/dns/query", query={"name": name, "type": qtype.upper()})
    ctl.show(reply, _dns_answer)


@dns.command("flush")
@json_flag
@pass_ctl
def dns_flush(ctl: Ctl) -> None:
    """Empty the DNS answer cache: the next query for each name asks its upstream again."""
    ctl.client.request("POST", "/cache/dns/flush")
    if not ctl.json:
        click.echo("dns cache flushed")


# --- rules -------------------------------------------------------------------------------------


def _ago(text: Any) -> str:
    """An API time as how long ago it was; ``-`` for the zero time (never) or none."""
    when = tables.parse_time(text) if isinstance(text, str) else None
    if when is None or when.year == ZERO_TIME_YEAR:
        return tables.EMPTY
    return f"{tables.age(text)} ago"


def _rules_text(d: dict[str, Any]) -> str:
    rules = [r for r in d.get("rules") or [] if isinstance(r, dict)]
    rows = []
    for r in rules:
        extra = r.get("extra") or {}
        rows.append(
            (
                r.get("index"),
                r.get("type"),
                r.get("payload"),
                r.get("proxy"),
                "disabled" if extra.get("disabled") else "enabled",
                extra.get("hitCount", 0),
                _ago(extra.get("hitAt")),
                extra.get("missCount", 0),
                _ago(extra.get("missAt")),
            )
        )
    table = tables.table(
        ("#", "TYPE", "PAYLOAD", "PROXY", "STATE", "HITS", "LAST HIT", "MISSES", "LAST MISS"),
        rows,
        right=(0, 5, 6, 7, 8),
    )
    disabled = sum(1 for r in rules if (r.get("extra") or {}).get("disabled"))
    return f"{table}\n\n{len(rules)} rule(s), the last the fallback; {disabled} disabled"


@cli.group(cls=CtlGroup, invoke_without_command=True)
@json_flag
@click.pass_context
def rules(ctx: click.Context) -> None:
    """Routing rules: hits, misses, state; `rules disable`/`enable`.

    Lists the rules in order, the fallback last, each with its state, how many
    flows it matched (hits) and how many evaluated it and went on (misses), and
    when it last did. The counts run since the rules were last compiled: a reload
    that changes them starts again. A disabled rule is skipped until enabled
    again or until such a reload. Uses the Clash API's /rules and /rules/disable.
    """
    if ctx.invoked_subcommand is None:
        ctl = ctx.find_object(Ctl)
        assert ctl is not None
        ctl.show(ctl.client.request("GET", "/rules"), _rules_text)


def _switch_rules(ctl: Ctl, indexes: tuple[int, ...], disabled: bool) -> None:
    ctl.client.request("PATCH", "/rules/disable", json_body={str(i): disabled for i in indexes})
    if not ctl.json:
        verb = "disabled" if disabled else "enabled"
        click.echo(f"{verb} rule(s) {', '.join(str(i) for i in sorted(set(indexes)))}")


@rules.command("disable")
@click.argument("indexes", metavar="INDEX...", nargs=-1, required=True, type=click.IntRange(min=0))
@json_flag
@pass_ctl
def rules_disable(ctl: Ctl, indexes: tuple[int, ...]) -> None:
    """Skip rules by index until enabled again.

    INDEX is the rule's number in `honkctl rules` (the fallback cannot be disabled).
    """
    _switch_rules(ctl, indexes, True)


@rules.command("enable")
@click.argument("indexes", metavar="INDEX...", nargs=-1, required=True, type=click.IntRange(min=0))
@json_flag
@pass_ctl
def rules_enable(ctl: Ctl, indexes: tuple[int, ...]) -> None:
    """Route by disabled rules again, by index."""
    _switch_rules(ctl, indexes, False)


# --- logs --------------------------------------------------------------------------------------


def _log_line(line: str) -> str:
    try:
        event = json.loads(line)
    except ValueError:
        return line
    if not isinstance(event, dict):
        return line
    return (
        f"{tables.clock_time(event.get('time'))} {str(event.get('level', '')).upper():5} "
        f"{event.get('logger', '')}: {event.get('message', '')}"
    )


@cli.command()
@click.option("-f", "--follow", is_flag=True, help="Keep streaming until interrupted (Ctrl-C).")
@click.option(
    "--level",
    type=click.Choice(LOG_LEVELS, case_sensitive=False),
    default="info",
    show_default=True,
    help="The least severe level shown.",
)
@json_flag
@pass_ctl
def logs(ctl: Ctl, follow: bool, level: str) -> None:
    """Print the daemon's log events as they happen.

    With -f, stream until Ctrl-C (exit 0); the daemon going away ends it with
    exit 3. Without -f, print what arrives and exit once the stream has been
    quiet for 1 second. With --json, one JSON object per line as the daemon
    sent it.
    """
    stream = ctl.client.lines(
        "/v1/logs", query={"level": level.lower()}, idle=None if follow else LOGS_IDLE_WINDOW
    )
    try:
        for line in stream:
            click.echo(line if ctl.json else _log_line(line))
    except KeyboardInterrupt:
        pass  # Ctrl-C is how -f ends
    finally:
        stream.close()


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
