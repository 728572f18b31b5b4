"""Subscription bodies -> nodes. Pure: no I/O, no clock, no logging.

:func:`parse_body` detects the format the way upstream's ``simple`` type does:

* share-link lists: one link per line, as plain text or as base64 (standard or
  URL-safe alphabet, padding optional, whitespace between chunks allowed). A
  leading UTF-8 BOM is dropped from the body and from the decoded text. Blank
  lines, ``#`` comments and Shadowrocket ``REMARKS=`` / ``STATUS=`` lines are
  skipped without a diagnostic; every other line goes through
  :func:`honk.config.links.parse_node_link`;
* SIP008 JSON: ``{"servers": [...]}`` or a bare array of server objects
  (Shadowsocks only);
* Clash YAML or JSON: a top-level ``proxies`` sequence (``socks5``, ``http``,
  ``ss``/``shadowsocks``, ``vmess``, ``vless``, ``trojan``);
* sing-box JSON: ``outbounds`` (``socks``, ``http``, ``shadowsocks``,
  ``vmess``, ``vless``, ``trojan``; the structural ``selector``, ``urltest``,
  ``direct``, ``block`` and ``dns`` are not nodes and are passed over silently).

A VMess, VLESS or Trojan entry becomes the node its share link gives (the same
dial shape through :func:`honk.config.links.v2_shape`, so the same id), over TCP or
WebSocket, with or without TLS (Trojan always with). Clash reads ``uuid``,
``alterId``, ``cipher``, ``password``, ``tls``, ``servername``/``sni``,
``skip-cert-verify``, ``alpn``, ``flow``, ``network`` and ``ws-opts`` (``path``,
``headers.Host``; the older ``ws-path``/``ws-headers`` too); sing-box reads
``uuid``, ``security``, ``alter_id``, ``password``, ``flow``, ``tls``
(``enabled``, ``server_name``, ``insecure``, ``alpn``, ``certificate_path`` as the
node's ``ca``) and ``transport`` (``ws``: ``path``, ``headers.Host``). What honk
cannot dial skips the entry: other transports (``unsupported-transport``),
REALITY or plaintext Trojan (``unsupported-security``), a flow
(``unsupported-flow``), alterId above 0 (``unsupported-alter-id``), multiplexing,
ECH, certificate pins, client certificates or an inline sing-box certificate
(``unsupported-feature``). Client-side options that do not change what the
server accepts are not carried: uTLS fingerprints, WebSocket early data, other
WebSocket headers, packet encodings, VMess padding and authenticated length.

Detection order: a body that starts with ``{`` or ``[`` and decodes as JSON is
structured; otherwise a body with a ``scheme://`` line is a link list; otherwise
a body that decodes as base64 is a link list; otherwise YAML is tried.

Admission: an entry that cannot become a node of a protocol this version
dials (socks5, http, https, ss, vmess, vless, trojan) is skipped with an :class:`EntryDiagnostic`
(1-based line or array position, a static reason slug; never the entry, its
name or a credential). The first occurrence of a node id wins; later ones are
``duplicate-node`` diagnostics naming the first's index. At most
:data:`MAX_DIAGNOSTICS` diagnostics are kept, the rest are only counted.
Every admitted node carries ``subscription=<tag>``. A body that yields no
usable node raises :class:`SubscriptionError`.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import ipaddress
import json
import math
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from honk.config.links import (
    VMESS_CIPHERS,
    VMESS_DEFAULT_CIPHER,
    LinkError,
    normalise_host,
    parse_node_link,
    v2_shape,
    with_node_id,
)
from honk.config.spec import NodeSpec
from honk.core.errors import HonkError
from honk.proto.ss_methods import CIPHERS as SS_CIPHERS

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_DIAGNOSTICS",
    "SUPPORTED_PROTOCOLS",
    "EntryDiagnostic",
    "ParsedBody",
    "SubscriptionError",
    "parse_body",
]

MAX_BODY_BYTES = 8 * 1024 * 1024  # "Each body is at most 8 MiB" (upstream subscription reference)
MAX_DIAGNOSTICS = 128  # "at most 128 nonterminal diagnostics" per body, then one truncation summary
# The longest name, server or credential taken from a structured entry. Bodies may share
# one huge YAML anchor across many entries; the bound keeps hashing them cheap.
MAX_FIELD_CHARS = 4096
TRUNCATED = "subscription-diagnostics-truncated"
SUPPORTED_PROTOCOLS = frozenset({"socks5", "http", "https", "ss", "vmess", "vless", "trojan"})

UTF8_BOM = b"\xef\xbb\xbf"
_LINK_LINE = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://")
_METADATA_PREFIXES = ("remarks=", "status=")  # Shadowrocket list metadata
_BASE64_BODY = re.compile(r"[A-Za-z0-9+/\-_=\s]+")
_B64_URLSAFE = str.maketrans("-_", "+/")
_DIGITS = re.compile(r"\d{1,5}")
_BIGGEST_NUMBER = 10**64  # numeric credentials beyond this are not credentials


V2_TYPES = {"vmess": "vmess", "vless": "vless", "trojan": "trojan"}
CLASH_TYPES = {"socks5": "socks5", "http": "http", "ss": "ss", "shadowsocks": "ss", **V2_TYPES}
SINGBOX_TYPES = {"socks": "socks5", "http": "http", "shadowsocks": "ss", **V2_TYPES}
SINGBOX_STRUCTURAL = frozenset({"selector", "urltest", "direct", "block", "dns"})


class SubscriptionError(HonkError):
    """A body was rejected as a whole; ``reason`` is a static slug.

    Reasons: ``body-too-large``, ``invalid-encoding``, ``empty-body``,
    ``unrecognised-format``, ``no-usable-node`` (``diagnostics`` then says why
    each entry was skipped).
    """

    def __init__(self, reason: str, diagnostics: tuple[EntryDiagnostic, ...] = (), omitted: int = 0) -> None:
        super().__init__(f"subscription body rejected: {reason}")
        self.reason = reason
        self.diagnostics = diagnostics
        self.omitted = omitted


@dataclass(frozen=True, slots=True)
class EntryDiagnostic:
    """Why one entry of a body was skipped."""

    index: int  # 1-based: the physical line of a link list, the position in a structured array
    reason: str  # static slug: unsupported-protocol, invalid-port, duplicate-node, ...
    first: int = 0  # duplicate-node: the index of the occurrence that was kept

    def __str__(self) -> str:
        tail = f" (first at {self.first})" if self.first else ""
        return f"entry {self.index}: {self.reason}{tail}"


@dataclass(frozen=True, slots=True)
class ParsedBody:
    """The usable nodes of one body, in body order, and why the other entries were skipped."""

    format: str  # "links", "links-base64", "sip008", "clash", "sing-box"
    nodes: tuple[NodeSpec, ...]
    diagnostics: tuple[EntryDiagnostic, ...] = ()
    omitted: int = 0  # diagnostics past MAX_DIAGNOSTICS, summarised as subscription-diagnostics-truncated

    @property
    def skipped(self) -> int:
        return len(self.diagnostics) + self.omitted


def parse_body(body: bytes, subscription: str = "") -> ParsedBody:
    """Detect the format of ``body`` and turn its entries into nodes tagged ``subscription``.

    Raises :class:`SubscriptionError`; nothing else for any input.
    """
    if len(body) > MAX_BODY_BYTES:
        raise SubscriptionError("body-too-large")
    if body.startswith(UTF8_BOM):
        body = body[len(UTF8_BOM) :]
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise SubscriptionError("invalid-encoding") from None
    if not text.strip():
        raise SubscriptionError("empty-body")
    admission = _Admission(subscription)
    if text.lstrip()[:1] in ("{", "["):
        doc = _load_json(text)
        if doc is not _UNREADABLE:
            return _structured(doc, admission)
    if _has_link_line(text):
        return _links(text, admission, "links")
    decoded = _decode_base64(text)
    if decoded is not None:
        return _links(decoded.removeprefix("\ufeff"), admission, "links-base64")
    doc = _load_yaml(text)
    if doc is not _UNREADABLE:
        return _structured(doc, admission)
    raise SubscriptionError("unrecognised-format")


# --- admission ------------------------------------------------------------------------


class _Skip(Exception):
    """An entry cannot become a node; ``reason`` is its static slug."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _Admission:
    """Collects nodes (first node id wins) and bounded diagnostics for one body."""

    def __init__(self, subscription: str) -> None:
        self.subscription = subscription
        self.nodes: list[NodeSpec] = []
        self.first: dict[uuid.UUID, int] = {}
        self.diagnostics: list[EntryDiagnostic] = []
        self.omitted = 0

    def skip(self, index: int, reason: str, first: int = 0) -> None:
        if len(self.diagnostics) < MAX_DIAGNOSTICS:
            self.diagnostics.append(EntryDiagnostic(index, reason, first))
        else:
            self.omitted += 1

    def admit(self, index: int, node: NodeSpec) -> None:
        if node.protocol not in SUPPORTED_PROTOCOLS:
            self.skip(index, "unsupported-protocol")
            return
        first = self.first.get(node.id)
        if first is not None:
            self.skip(index, "duplicate-node", first)
            return
        self.first[node.id] = index
        self.nodes.append(dataclasses.replace(node, subscription=self.subscription))

    def result(self, fmt: str) -> ParsedBody:
        if not self.nodes:
            raise SubscriptionError("no-usable-node", tuple(self.diagnostics), self.omitted)
        return ParsedBody(fmt, tuple(self.nodes), tuple(self.diagnostics), self.omitted)


# --- share-link lists ------------------------------------------------------------------


def _has_link_line(text: str) -> bool:
    return any(_LINK_LINE.match(line.strip()) for line in text.split("\n"))


def _links(text: str, admission: _Admission, fmt: str) -> ParsedBody:
    for lineno, raw in enumerate(text.split("\n"), start=1):
        line = raw.strip()
        if not line or line.startswith("#") or line.lower().startswith(_METADATA_PREFIXES):
            continue
        try:
            node = parse_node_link(line)
        except LinkError as exc:
            admission.skip(lineno, exc.code)
            continue
        if any(key == "plugin" and value for key, value in node.params):
            admission.skip(lineno, "unsupported-plugin")  # honk runs no SIP003 plugins
            continue
        admission.admit(lineno, node)
    return admission.result(fmt)


def _decode_base64(text: str) -> str | None:
    """The body as base64 of UTF-8 text (either alphabet, padding optional), or None."""
    if not _BASE64_BODY.fullmatch(text):
        return None
    compact = "".join(text.split()).rstrip("=")
    if not compact or "=" in compact or len(compact) % 4 == 1:
        return None
    try:
        data = base64.b64decode(compact.translate(_B64_URLSAFE) + "=" * (-len(compact) % 4), validate=True)
    except (binascii.Error, ValueError):
        return None
    try:
        return data.removeprefix(UTF8_BOM).decode("utf-8")
    except UnicodeDecodeError:
        return None


# --- structured bodies -----------------------------------------------------------------

_UNREADABLE = object()


def _load_json(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return _UNREADABLE


def _load_yaml(text: str) -> Any:
    import yaml  # only Clash bodies need it: a daemon without subscriptions never loads it

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when built with it
    try:
        return yaml.load(text, Loader=loader)  # noqa: S506 - a safe loader
    except Exception:  # noqa: BLE001 - any failure of the third-party decoder means "not YAML"
        return _UNREADABLE


def _structured(doc: Any, admission: _Admission) -> ParsedBody:
    builder: Callable[[Any], NodeSpec | None]
    if isinstance(doc, list):
        fmt, items, builder = "sip008", doc, _sip008_entry
    elif isinstance(doc, dict) and isinstance(doc.get("proxies"), list):
        fmt, items, builder = "clash", doc["proxies"], _clash_entry
    elif isinstance(doc, dict) and isinstance(doc.get("outbounds"), list):
        fmt, items, builder = "sing-box", doc["outbounds"], _singbox_entry
    elif isinstance(doc, dict) and isinstance(doc.get("servers"), list):
        fmt, items, builder = "sip008", doc["servers"], _sip008_entry
    else:
        raise SubscriptionError("unrecognised-format")
    for index, entry in enumerate(items, start=1):
        try:
            node = builder(entry)
        except _Skip as skip:
            admission.skip(index, skip.reason)
            continue
        if node is not None:
            admission.admit(index, node)
    return admission.result(fmt)


def _text(value: object, reason: str) -> str | None:
    """A name or credential scalar: strings as they are, finite numbers as decimal text,
    None when absent. Booleans, lists, maps and non-finite numbers skip the entry."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise _Skip(reason)
    if isinstance(value, int):
        if abs(value) >= _BIGGEST_NUMBER:
            raise _Skip(reason)
        text = str(value)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise _Skip(reason)
        text = repr(value)
    elif isinstance(value, str):
        text = value
    else:
        raise _Skip(reason)
    if len(text) > MAX_FIELD_CHARS:
        raise _Skip("field-too-long")
    return text


def _name(value: object, default: str) -> str:
    try:
        text = _text(value, "invalid-name")
    except _Skip:
        return default
    return text if text and text.strip() else default


def _server(value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _Skip("missing-server")
    host = value.strip()
    if len(host) > MAX_FIELD_CHARS:
        raise _Skip("field-too-long")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if any(c.isspace() or c in "/@?#[]" for c in host):
        raise _Skip("invalid-server")
    host = normalise_host(host)
    if not host or (":" in host and not _is_ipv6(host)):  # "host:port" is not a server
        raise _Skip("invalid-server")
    return host


def _is_ipv6(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).version == 6
    except ValueError:
        return False


def _port(value: object) -> int:
    if isinstance(value, bool):
        raise _Skip("invalid-port")
    if isinstance(value, int):
        port = value
    elif isinstance(value, str) and _DIGITS.fullmatch(value.strip()):
        port = int(value.strip())
    else:
        raise _Skip("invalid-port")
    if not 1 <= port <= 65535:
        raise _Skip("invalid-port")
    return port


def _no_plugin(*values: object) -> None:
    """Skip entries that need a SIP003 plugin: honk runs none."""
    for value in values:
        if isinstance(value, dict) or (value is not None and value != "" and value is not False):
            raise _Skip("unsupported-plugin")


def _flag(value: object, reason: str) -> bool:
    if value is None:
        return False
    if isinstance(value, bool):
        return value
    raise _Skip(reason)


def _ss_node(name: str, host: str, port: int, method: object, password: object) -> NodeSpec:
    """A Shadowsocks node built like the ``ss://`` parser builds one, so both give one id."""
    cipher = _text(method, "invalid-cipher")
    if not cipher or not cipher.strip():
        raise _Skip("missing-cipher")
    cipher = cipher.strip().lower()
    if cipher not in SS_CIPHERS:
        raise _Skip("unsupported-cipher")
    secret = _text(password, "invalid-password")
    if not secret:
        raise _Skip("missing-password")
    return with_node_id(NodeSpec(name, "ss", host, port, password=secret, encryption=cipher))


def _proxy_node(
    name: str,
    protocol: str,
    host: str,
    port: int,
    username: object,
    password: object,
    params: tuple[tuple[str, str], ...] = (),
) -> NodeSpec:
    """A socks5/http/https node built like a share link: any credential present makes
    both strings (``user@host`` has an empty password), so both give one id."""
    user = _text(username, "invalid-username")
    secret = _text(password, "invalid-password")
    if user is not None or secret is not None:
        user, secret = user or "", secret or ""
    return with_node_id(NodeSpec(name, protocol, host, port, username=user, password=secret, params=params))


def _tls_params(sni: object, insecure: bool) -> tuple[tuple[str, str], ...]:
    params: list[tuple[str, str]] = []
    name = _text(sni, "invalid-sni")
    if name and name.strip():
        params.append(("sni", name.strip()))
    if insecure:
        params.append(("allowInsecure", "1"))
    return tuple(params)


def _agreeing(entry: dict[str, Any], *keys: str) -> object:
    """The one value several alias keys give (absent/blank ones ignored); disagreement skips."""
    return _same(*(entry.get(key) for key in keys))


def _same(*values: object) -> object:
    """The one value the non-absent, non-blank ``values`` agree on (None if none); disagreement skips."""
    found: list[object] = []
    for value in values:
        if value is None or (isinstance(value, str) and not value.strip()):
            continue
        found.append(value)
    if any(v != found[0] for v in found[1:]):
        raise _Skip("conflicting-fields")
    return found[0] if found else None


def _entry_type(entry: Any) -> str:
    """A structured entry's ``type``, lower-cased; skipped when the entry is no object or has none."""
    if not isinstance(entry, dict):
        raise _Skip("not-an-object")
    kind = entry.get("type")
    if not isinstance(kind, str):
        raise _Skip("missing-type")
    return kind.strip().lower()


def _clash_entry(entry: Any) -> NodeSpec:
    kind = _entry_type(entry)
    protocol = CLASH_TYPES.get(kind)
    if protocol is None:
        raise _Skip("unsupported-protocol")
    _no_plugin(entry.get("plugin"), entry.get("plugin-opts"))
    host = _server(entry.get("server"))
    port = _port(entry.get("port"))
    name = _name(entry.get("name"), f"{kind}-{host}:{port}")
    tls = _flag(entry.get("tls"), "invalid-tls")
    if protocol in V2_TYPES:
        return _clash_v2(protocol, entry, name, host, port, tls)
    if protocol == "ss":
        if tls or _flag(entry.get("udp-over-tcp"), "invalid-udp-over-tcp"):
            raise _Skip("unsupported-feature")
        return _ss_node(name, host, port, entry.get("cipher"), entry.get("password"))
    params: tuple[tuple[str, str], ...] = ()
    if tls:
        if protocol != "http":
            raise _Skip("unsupported-feature")  # SOCKS5 over TLS
        protocol = "https"
        insecure = _agreeing(entry, "skip-cert-verify", "skip_cert_verify", "insecure")
        params = _tls_params(
            _agreeing(entry, "sni", "servername", "server-name"), _flag(insecure, "invalid-skip-cert-verify")
        )
    return _proxy_node(name, protocol, host, port, entry.get("username"), entry.get("password"), params)


def _sip008_entry(entry: Any) -> NodeSpec:
    if not isinstance(entry, dict):
        raise _Skip("not-an-object")
    _no_plugin(entry.get("plugin"), entry.get("plugin_opts"))
    host = _server(entry.get("server"))
    port = _port(entry.get("server_port"))
    name = _name(entry.get("remarks"), f"ss-{host}:{port}")
    return _ss_node(name, host, port, entry.get("method"), entry.get("password"))


def _singbox_entry(entry: Any) -> NodeSpec | None:
    kind = _entry_type(entry)
    if kind in SINGBOX_STRUCTURAL:
        return None  # groups and builtins of the profile, not proxy nodes
    protocol = SINGBOX_TYPES.get(kind)
    if protocol is None:
        raise _Skip("unsupported-protocol")
    if entry.get("detour") or _enabled(entry.get("multiplex")):
        raise _Skip("unsupported-feature")  # chaining and multiplexing are not dropped silently
    host = _server(entry.get("server"))
    port = _port(entry.get("server_port"))
    name = _name(entry.get("tag"), f"{kind}-{host}:{port}")
    if protocol in V2_TYPES:
        return _singbox_v2(protocol, entry, name, host, port)
    if protocol == "ss":
        _no_plugin(entry.get("plugin"), entry.get("plugin_opts"))
        if _enabled(entry.get("udp_over_tcp")):
            raise _Skip("unsupported-feature")
        return _ss_node(name, host, port, entry.get("method"), entry.get("password"))
    if protocol == "socks5":
        if entry.get("version") not in (None, "5", 5) or _enabled(entry.get("udp_over_tcp")):
            raise _Skip("unsupported-feature")  # SOCKS4/4a, UDP over TCP
        return _proxy_node(name, protocol, host, port, entry.get("username"), entry.get("password"))
    if entry.get("path") not in (None, "", "/") or entry.get("headers"):
        raise _Skip("unsupported-feature")
    params: tuple[tuple[str, str], ...] = ()
    tls = entry.get("tls")
    if tls is not None and not isinstance(tls, dict):
        raise _Skip("invalid-tls")
    if tls and _flag(tls.get("enabled"), "invalid-tls"):
        if any(_enabled(tls.get(key)) for key in ("utls", "reality", "ech")):
            raise _Skip("unsupported-feature")
        protocol = "https"
        params = _tls_params(tls.get("server_name"), _flag(tls.get("insecure"), "invalid-tls"))
    return _proxy_node(name, protocol, host, port, entry.get("username"), entry.get("password"), params)


def _enabled(block: object) -> bool:
    """A sing-box feature object (or flag) that is switched on."""
    if isinstance(block, dict):
        return block.get("enabled") is True
    return block is True


# --- VMess, VLESS and Trojan entries -----------------------------------------------------


def _v2_node(
    name: str,
    protocol: str,
    host: str,
    port: int,
    credential: object,
    *,
    transport: str,
    security: str,
    sni: object = None,
    ws_host: object = None,
    path: object = None,
    alpn: str = "",
    insecure: bool = False,
    ca: object = None,
    cipher: str | None = None,
) -> NodeSpec:
    """A VMess/VLESS/Trojan node built like its share link, so both give one node and one id."""
    if protocol == "trojan":
        secret = _text(credential, "invalid-password")
        if not secret:
            raise _Skip("missing-password")
        username, password = None, secret
    else:
        username, password = _uuid(credential), None
    try:
        shape = v2_shape(
            transport=transport,
            security=security,
            sni=_text(sni, "invalid-sni") or "",
            host=_text(ws_host, "invalid-host") or "",
            path=_text(path, "invalid-path") or "",
            alpn=alpn,
            insecure=insecure,
            ca=_text(ca, "invalid-ca") or "",
        )
    except LinkError as exc:
        raise _Skip(exc.code) from None
    node = NodeSpec(
        name, protocol, host, port, username=username, password=password, params=shape, encryption=cipher
    )
    return with_node_id(node)


def _uuid(value: object) -> str:
    text = _text(value, "invalid-uuid")
    if not text or not text.strip():
        raise _Skip("missing-uuid")
    try:
        return str(uuid.UUID(text.strip()))
    except ValueError:
        raise _Skip("invalid-uuid") from None


def _vmess_cipher(value: object) -> str:
    cipher = (_text(value, "invalid-cipher") or "").strip().lower() or VMESS_DEFAULT_CIPHER
    if cipher not in VMESS_CIPHERS:
        raise _Skip("unsupported-cipher")
    return cipher


def _alter_id(value: object) -> None:
    """Only alterId 0 (the AEAD header) is dialled; absent or blank means 0."""
    text = (_text(value, "invalid-alter-id") or "").strip() or "0"
    if not text.isascii() or not text.isdigit():
        raise _Skip("invalid-alter-id")
    if int(text) > 0:
        raise _Skip("unsupported-alter-id")


def _no_flow(value: object) -> None:
    if (_text(value, "invalid-flow") or "").strip():
        raise _Skip("unsupported-flow")  # XTLS flows (Vision)


def _alpn(value: object) -> str:
    """ALPN as the share links write it: a list (or a comma-separated string) joined by commas."""
    if value is None or isinstance(value, str):
        return _text(value, "invalid-alpn") or ""
    if isinstance(value, list):
        return ",".join(_text(item, "invalid-alpn") or "" for item in value)
    raise _Skip("invalid-alpn")


def _word(value: object, reason: str) -> str:
    """A keyword field (network, transport type) lower-cased; absent or blank is ""."""
    return (_text(value, reason) or "").strip().lower()


def _host_header(headers: object) -> object:
    """The Host of a WebSocket header map (any case); a list must hold one value."""
    if headers is None:
        return None
    if not isinstance(headers, dict):
        raise _Skip("invalid-headers")
    hosts = [value for key, value in headers.items() if isinstance(key, str) and key.lower() == "host"]
    if len(hosts) > 1:
        raise _Skip("conflicting-fields")
    host = hosts[0] if hosts else None
    if isinstance(host, list):
        if len(host) > 1:
            raise _Skip("unsupported-feature")  # a Host chosen per connection
        host = host[0] if host else None
    return host


def _clash_on(value: object) -> bool:
    """A Clash option block (``smux``, ``ech-opts``) or flag that is switched on."""
    if isinstance(value, dict):
        return value.get("enabled") is True or value.get("enable") is True
    return value is True


def _clash_v2(protocol: str, entry: dict[str, Any], name: str, host: str, port: int, tls: bool) -> NodeSpec:
    if entry.get("reality-opts"):
        raise _Skip("unsupported-security")
    if _clash_on(entry.get("smux")) or _clash_on(entry.get("ech-opts")):
        raise _Skip("unsupported-feature")
    if any(entry.get(key) for key in ("fingerprint", "certificate", "private-key")):
        raise _Skip("unsupported-feature")  # a certificate pin, a client certificate
    network = _word(entry.get("network"), "invalid-network") or "tcp"
    path = ws_host = None
    if network == "ws":
        opts = entry.get("ws-opts")
        if opts is None:
            opts = {}
        if not isinstance(opts, dict):
            raise _Skip("invalid-ws-opts")
        if opts.get("v2ray-http-upgrade") is True:
            raise _Skip("unsupported-transport")  # HTTPUpgrade, not WebSocket
        path = _same(opts.get("path"), entry.get("ws-path"))
        ws_host = _same(_host_header(opts.get("headers")), _host_header(entry.get("ws-headers")))
    elif network != "tcp":
        raise _Skip("unsupported-transport")  # http, h2, grpc, ...
    cipher = None
    if protocol == "vmess":
        _alter_id(_agreeing(entry, "alterId", "alter-id", "aid"))
        cipher = _vmess_cipher(entry.get("cipher"))
        credential = entry.get("uuid")
    elif protocol == "vless":
        _no_flow(entry.get("flow"))
        if _word(entry.get("encryption"), "invalid-encryption") not in ("", "none"):
            raise _Skip("unsupported-encryption")
        credential = entry.get("uuid")
    else:
        credential = entry.get("password")
        tls = True  # Trojan always runs over TLS
    insecure = _agreeing(entry, "skip-cert-verify", "skip_cert_verify", "insecure")
    return _v2_node(
        name,
        protocol,
        host,
        port,
        credential,
        transport=network,
        security="tls" if tls else "none",
        sni=_agreeing(entry, "sni", "servername", "server-name"),
        ws_host=ws_host,
        path=path,
        alpn=_alpn(entry.get("alpn")),
        insecure=_flag(insecure, "invalid-skip-cert-verify"),
        cipher=cipher,
    )


def _singbox_v2(protocol: str, entry: dict[str, Any], name: str, host: str, port: int) -> NodeSpec:
    tls = entry.get("tls")
    if tls is not None and not isinstance(tls, dict):
        raise _Skip("invalid-tls")
    tls = tls or {}
    secure = _flag(tls.get("enabled"), "invalid-tls")
    sni = alpn = ca = None
    insecure = False
    if secure:
        if _enabled(tls.get("reality")):
            raise _Skip("unsupported-security")
        if _enabled(tls.get("ech")) or tls.get("certificate") or tls.get("disable_sni") is True:
            raise _Skip("unsupported-feature")  # an inline CA is not a file honk can name
        sni, alpn, ca = tls.get("server_name"), tls.get("alpn"), tls.get("certificate_path")
        insecure = _flag(tls.get("insecure"), "invalid-tls")
    elif protocol == "trojan":
        raise _Skip("unsupported-security")  # a Trojan share link always means TLS
    transport = entry.get("transport")
    if transport is not None and not isinstance(transport, dict):
        raise _Skip("invalid-transport")
    transport = transport or {}
    network = _word(transport.get("type"), "invalid-transport") or "tcp"
    if network not in ("tcp", "ws"):
        raise _Skip("unsupported-transport")  # http, grpc, quic, httpupgrade
    cipher = None
    if protocol == "vmess":
        _alter_id(entry.get("alter_id"))
        cipher = _vmess_cipher(entry.get("security"))
        credential = entry.get("uuid")
    elif protocol == "vless":
        _no_flow(entry.get("flow"))
        credential = entry.get("uuid")
    else:
        credential = entry.get("password")
    return _v2_node(
        name,
        protocol,
        host,
        port,
        credential,
        transport=network,
        security="tls" if secure else "none",
        sni=sni,
        ws_host=_host_header(transport.get("headers")) if network == "ws" else None,
        path=transport.get("path") if network == "ws" else None,
        alpn=_alpn(alpn),
        insecure=insecure,
        ca=ca,
        cipher=cipher,
    )
