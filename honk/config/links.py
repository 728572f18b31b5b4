"""Share links -> :class:`NodeSpec`, inbound URLs -> :class:`InboundSpec`, node identity.

Supported node schemes: ``socks5://`` (and ``socks5h://``, the same protocol),
``http://`` and ``https://`` proxies::

    scheme://[user[:password]@]host[:port][/][?query][#name]

Credentials and the fragment are percent-decoded. ``socks5`` requires an
explicit port; ``http``/``https`` follow the nodes reference ("a URL-shaped
share link defaults an omitted port to 443").

Shadowsocks (``ss://``, SIP002 and the older whole-link base64 form)::

    ss://base64url(method:password)@host:port[/][?plugin=...][#name]
    ss://pct(method):pct(password)@host:port[/][?...][#name]
    ss://base64(method:password@host:port)[#name]

Base64 may use either alphabet, with or without padding. Decoded credentials
are literal (no percent-decoding); in the base64 form the last ``@`` ends the
credentials, so a password may contain ``@``, and the credentials may
themselves be base64. Only the AEAD ciphers of :mod:`honk.proto.shadowsocks`
are accepted (``unsupported-cipher`` otherwise), and a link that needs a
SIP003 plugin is refused (``unsupported-plugin``): honk runs no plugins.

VMess, VLESS and Trojan (transports TCP and WebSocket, optionally over TLS)::

    vmess://base64(JSON)         the v2rayN form: v, ps, add, port, id, aid, scy, net,
                                 type, host, path, tls, sni, alpn
    vless://uuid@host[:port][/]?type=&security=&sni=&path=&host=&alpn=&flow=&ca=[#name]
    trojan://password@host[:port][/]?sni=&type=&path=&host=&allowInsecure=&ca=[#name]

Their dial shape is normalised into ``params`` (``type``, ``security``, ``sni``,
``host``, ``path``, ``alpn``, ``allowInsecure``, ``ca``; see :func:`v2_shape`), so
equal dials get equal ids however the link spelled them. ``ca`` is honk's own
parameter: the path of a PEM file whose CA the node's TLS trusts instead of the
system store (read at dial time, :func:`honk.outbound.tls.client_context`); ``https://``
links carry it as a plain query parameter. VMess needs alterId 0 (the AEAD
header; ``unsupported-alter-id`` otherwise) and one of the ciphers in
:data:`VMESS_CIPHERS`; VLESS needs no ``flow`` (``unsupported-flow``) and defaults to
TLS, as upstream's canonical VLESS links do; Trojan always runs over TLS. UUIDs must be
valid and are stored in canonical lowercase form.

Other known proxy schemes are rejected as not supported by this version;
anything else is an unknown scheme.

Errors raise :class:`LinkError` whose message never contains the link, a
credential, or any other value from it.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import ipaddress
import json
import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import unquote as pct_decode

from honk._fast.nodeid import node_id
from honk.config.policies import parse_policy
from honk.config.spec import NODE_ID_NAMESPACE, InboundSpec, InboundUser, NodeSpec
from honk.config.values import parse_bool, parse_seconds
from honk.proto.ss_methods import CIPHERS as SS_CIPHERS
from honk.proto.vmess import SECURITIES as VMESS_SECURITIES

NODE_SCHEMES = {"socks5": "socks5", "socks5h": "socks5", "http": "http", "https": "https"}
DEFAULT_PORTS = {"http": 443, "https": 443}  # socks5: an explicit port is required
DEFAULT_V2_PORT = 443  # vless/trojan: a URL-shaped link defaults an omitted port to 443 (nodes reference)
KNOWN_UNSUPPORTED = (
    "ssr",
    "hysteria2",
    "hy2",
    "tuic",
    "anytls",
    "juicity",
)
V2_SCHEMES = ("vmess", "vless", "trojan")
# VMess body ciphers honk dials, as v2ray names them: the codec's (``auto``: the client picks;
# the legacy "zero" and the pre-AEAD ciphers are refused).
VMESS_CIPHERS = tuple(VMESS_SECURITIES)
VMESS_DEFAULT_CIPHER = "auto"  # v2rayN: an absent or empty `scy` means auto
V2_TRANSPORTS = ("tcp", "ws")  # stream transports honk dials ("" means tcp)
V2_SECURITIES = ("none", "tls")
# Upstream nodes reference: share-link verification booleans, compared after strip + lower-casing.
INSECURE_TRUE = frozenset({"true", "yes", "1", "on"})
INSECURE_FALSE = frozenset({"false", "f", "no", "n", "0", "off", "t", "y"})
INSECURE_KEYS = ("allowInsecure", "allow_insecure", "insecure")
CA_KEY = "ca"  # honk's per-node CA parameter: a path to a PEM file (no upstream spelling exists)
REALITY_KEYS = ("pbk", "sid", "spx")  # REALITY parameters: a transport honk does not dial
INBOUND_SCHEMES = ("mixed", "redirect")
# the listener kind each inbound scheme makes: redirect:// is the REDIRECT (nat) transparent TCP inbound
INBOUND_KINDS = {"mixed": "mixed", "redirect": "redir"}
# query parameters that are display metadata, not part of how a node is dialled
DISPLAY_PARAMS = frozenset({"remark", "remarks", "name", "tag"})
# honk's own parameter: what a reload does to the node's live flows when the node is
# replaced or removed (keep, close, or a duration to close after); not how it is dialled
DRAIN_PARAM = "drain"
# Mux.Cool for a VMess or VLESS node: ``mux=1`` in a vless:// query, ``"mux"`` in a vmess:// JSON
# (honk's own parameter, as v2rayN's links carry none); part of the dial shape, so of the id
MUX_PARAM = "mux"
_MUX_ON = frozenset({"1", "true", "yes", "on"})
_MUX_OFF = frozenset({"", "0", "false", "no", "off"})
NON_IDENTITY_PARAMS = DISPLAY_PARAMS | {DRAIN_PARAM}

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")


class LinkError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class ParsedUrl:
    scheme: str  # lowercase
    username: str | None
    password: str | None
    host: str  # unbracketed, normalised
    port: int | None
    params: tuple[tuple[str, str], ...]
    fragment: str


def parse_url(text: str, *, allow_zero_port: bool = False) -> ParsedUrl:
    s = text.strip()
    m = _SCHEME.match(s)
    if not m:
        raise LinkError("unknown-scheme", "link has no 'scheme://' prefix")
    scheme = m.group(1).lower()
    rest = s[m.end() :]
    rest, _, fragment = rest.partition("#")
    rest, _, query = rest.partition("?")
    authority, _, _path = rest.partition("/")
    userinfo, at, hostport = authority.rpartition("@")
    username = password = None
    if at:
        user, colon, pw = userinfo.partition(":")
        username = pct_decode(user)
        password = pct_decode(pw) if colon else ""
    host, port = _host_port(hostport, allow_zero=allow_zero_port)
    return ParsedUrl(scheme, username, password, host, port, _query_params(query), pct_decode(fragment))


def _query_params(query: str) -> tuple[tuple[str, str], ...]:
    params: list[tuple[str, str]] = []
    for piece in query.split("&"):
        if not piece:
            continue
        k, _, v = piece.partition("=")
        params.append((pct_decode(k.replace("+", " ")), pct_decode(v.replace("+", " "))))
    return tuple(params)


def _host_port(text: str, *, allow_zero: bool = False) -> tuple[str, int | None]:
    if text.startswith("["):
        close = text.find("]")
        if close < 0:
            raise LinkError("invalid-host", "unclosed '[' in the address")
        host = text[1:close]
        try:
            host = str(ipaddress.IPv6Address(host))
        except ValueError:
            raise LinkError("invalid-host", "bracketed address is not IPv6") from None
        tail = text[close + 1 :]
        if not tail:
            return host, None
        if not tail.startswith(":"):
            raise LinkError("invalid-host", "unexpected text after ']'")
        return host, _port(tail[1:], allow_zero)
    if text.count(":") > 1:
        raise LinkError("invalid-host", "an IPv6 address must be bracketed")
    host, colon, port_text = text.partition(":")
    host = normalise_host(host)
    return host, _port(port_text, allow_zero) if colon else None


def normalise_host(host: str) -> str:
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host.rstrip(".").lower()


def _port(text: str, allow_zero: bool = False) -> int:
    if not re.fullmatch(r"\d{1,5}", text) or not (0 if allow_zero else 1) <= int(text) <= 65535:
        raise LinkError("invalid-port", "port must be a number in 1..65535")
    return int(text)


# dae's node chain, ``'socks5://a -> ss://b'``: a second link after an arrow
_CHAIN = re.compile(r"->\s*[A-Za-z][A-Za-z0-9+.-]*://")


def parse_node_link(link: str, tag: str | None = None) -> NodeSpec:
    """A share link as a node; ``tag`` (a dae tag or structured key) names it. The node keeps
    its link (dae's DNS ``node(link_keyword: ...)`` tests it)."""
    return dataclasses.replace(_parse_link(link, tag), link=link.strip())


def _parse_link(link: str, tag: str | None) -> NodeSpec:
    if _CHAIN.search(link):
        raise LinkError(
            "unsupported-node-chain",
            "node chains ('link -> link') are not supported yet: honk dials each node directly",
        )
    m = _SCHEME.match(link.strip())
    scheme = m.group(1).lower() if m else ""
    if scheme in KNOWN_UNSUPPORTED:
        raise LinkError("unsupported-scheme", f"the {scheme} protocol is not supported by this version")
    if scheme == "ss" and m is not None:
        return _parse_ss(link.strip()[m.end() :], tag)
    if scheme == "vmess" and m is not None:
        return _parse_vmess(link.strip()[m.end() :], tag)
    if scheme in ("vless", "trojan") and m is not None:
        return _parse_vless_trojan(scheme, link.strip()[m.end() :], tag)
    if scheme not in NODE_SCHEMES:
        raise LinkError("unknown-scheme", "share link uses an unknown scheme")
    url = parse_url(link)
    if not url.host:
        raise LinkError("missing-host", "share link has no host")
    port = url.port if url.port is not None else DEFAULT_PORTS.get(scheme)
    if port is None:
        raise LinkError("missing-port", f"a {scheme} link needs an explicit port")
    name = tag or url.fragment or f"{scheme}-{url.host}"
    node = NodeSpec(
        name=name,
        protocol=NODE_SCHEMES[scheme],
        host=url.host,
        port=port,
        username=url.username,
        password=url.password,
        params=url.params,
    )
    return with_node_id(node)


# --- Shadowsocks --------------------------------------------------------------------

_BASE64_TEXT = re.compile(r"[A-Za-z0-9+/_\-]+")


def _base64_text(text: str) -> str | None:
    """``text`` decoded as base64 (either alphabet, padding optional) to UTF-8, or None."""
    s = text.strip().rstrip("=")
    if not _BASE64_TEXT.fullmatch(s) or len(s) % 4 == 1:
        return None
    s = s.replace("-", "+").replace("_", "/")
    try:
        return base64.b64decode(s + "=" * (-len(s) % 4), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None


def _ss_credentials(text: str, *, percent_encoded: bool) -> tuple[str, str]:
    """``method:password`` from the userinfo; it may be base64 of the pair (decoded literally)."""
    if ":" in text:
        method, _, password = text.partition(":")
        if percent_encoded:
            return pct_decode(method), pct_decode(password)
        return method, password
    decoded = _base64_text(pct_decode(text) if percent_encoded else text)
    if decoded is None or ":" not in decoded:
        raise LinkError("invalid-credentials", "ss credentials are neither method:password nor its base64")
    method, _, password = decoded.partition(":")
    return method, password


def _parse_ss(body: str, tag: str | None) -> NodeSpec:
    """The part of an ``ss://`` link after the scheme, as a node (forms: module docstring)."""
    body, _, fragment = body.partition("#")
    body, _, query = body.partition("?")
    userinfo, at, rest = body.rpartition("@")
    if at:  # SIP002
        method, password = _ss_credentials(userinfo, percent_encoded=True)
        hostport, _, _path = rest.partition("/")
    else:  # the whole-link base64 form
        decoded = _base64_text(pct_decode(body.rstrip("/")))
        if decoded is None or "@" not in decoded:
            raise LinkError(
                "invalid-link", "ss link is neither SIP002 nor base64 of method:password@host:port"
            )
        credentials, _, hostport = decoded.rpartition("@")
        method, password = _ss_credentials(credentials, percent_encoded=False)
    method = method.lower()
    if method not in SS_CIPHERS:
        raise LinkError(
            "unsupported-cipher",
            "the Shadowsocks cipher is not supported (use " + ", ".join(SS_CIPHERS) + ")",
        )
    if not password:
        raise LinkError("missing-password", "an ss link needs a password")
    host, port = _host_port(hostport)
    if not host:
        raise LinkError("missing-host", "share link has no host")
    if port is None:
        raise LinkError("missing-port", "an ss link needs an explicit port")
    params = []
    for key, value in _query_params(query):
        if key == "plugin":
            if value:
                raise LinkError("unsupported-plugin", "the node needs a SIP003 plugin; honk runs none")
            continue  # an empty plugin is no plugin
        params.append((key, value))
    node = NodeSpec(
        name=tag or pct_decode(fragment) or f"ss-{host}",
        protocol="ss",
        host=host,
        port=port,
        password=password,
        params=tuple(params),
        encryption=method,
    )
    return with_node_id(node)


# --- VMess, VLESS and Trojan -------------------------------------------------------


def _one(claims: list[tuple[str, str]], what: str) -> str:
    """The single value the non-empty (stripped) ``claims`` agree on, or "" when there are none."""
    values = {v.strip() for _, v in claims if v.strip()}
    if len(values) > 1:
        raise LinkError(f"conflicting-{what}", f"the link gives conflicting {what} values")
    return values.pop() if values else ""


def insecure_claimed(values: Iterable[str]) -> bool:
    """Whether certificate-verification words (upstream's booleans) turn checks off: ValueError
    ``"invalid"`` for a word that is not a boolean, ``"conflicting"`` when they disagree."""
    verdicts = set()
    for value in values:
        text = value.strip().lower()
        if text in INSECURE_TRUE:
            verdicts.add(True)
        elif text in INSECURE_FALSE:
            verdicts.add(False)
        else:
            raise ValueError("invalid")
    if len(verdicts) > 1:
        raise ValueError("conflicting")
    return verdicts == {True}


def _insecure(claims: list[tuple[str, str]]) -> bool:
    try:
        return insecure_claimed(v for _, v in claims)
    except ValueError as exc:
        if str(exc) == "invalid":
            raise LinkError("invalid-allow-insecure", "allowInsecure must be a true or false word") from None
        raise LinkError(
            "conflicting-allow-insecure", "the link's certificate-verification claims disagree"
        ) from None


def _uuid(text: str) -> str:
    try:
        return str(uuid.UUID(text.strip()))
    except ValueError:
        raise LinkError("invalid-uuid", "the user id is not a valid UUID") from None


def v2_shape(
    *,
    transport: str,
    security: str,
    sni: str,
    host: str,
    path: str,
    alpn: str,
    insecure: bool,
    ca: str = "",
) -> tuple[tuple[str, str], ...]:
    """The normalised dial shape: transport, TLS posture and their parameters, empties left out.

    ``host`` is the WebSocket Host header; outside WebSocket it only stands in for a
    missing SNI under TLS (upstream's rule), so it is dropped there. TLS-only fields
    are dropped without TLS.
    """
    transport = transport.strip().lower() or "tcp"
    if transport not in V2_TRANSPORTS:
        raise LinkError("unsupported-transport", "the transport is not supported (use tcp or ws)")
    security = security.strip().lower() or "none"
    if security not in V2_SECURITIES:
        raise LinkError("unsupported-security", "the stream security is not supported (use none or tls)")
    host, sni = host.strip(), sni.strip()
    if transport == "ws":
        path = path or "/"  # an empty WebSocket path is the root: the same dial
    else:
        sni = sni or (host if security == "tls" else "")
        host = ""
        path = ""
    alpn = ",".join(p.strip() for p in alpn.split(",") if p.strip())
    shape = [("type", transport), ("security", security), ("host", host), ("path", path)]
    if security == "tls":
        shape += [
            ("sni", normalise_host(sni) if sni else ""),
            ("alpn", alpn),
            ("allowInsecure", "1" if insecure else ""),
            (CA_KEY, ca.strip()),
        ]
    return tuple((k, v) for k, v in shape if v)


def _parse_vless_trojan(scheme: str, body: str, tag: str | None) -> NodeSpec:
    """The part of a ``vless://`` or ``trojan://`` link after the scheme, as a node."""
    body, _, fragment = body.partition("#")
    body, _, query = body.partition("?")
    authority, _, _path = body.partition("/")
    userinfo, at, hostport = authority.rpartition("@")
    credential = pct_decode(userinfo)
    if not at or not credential:
        what = "a user id" if scheme == "vless" else "a password"
        raise LinkError("missing-credentials", f"a {scheme} link needs {what} before '@'")
    host, port = _host_port(hostport)
    if not host:
        raise LinkError("missing-host", "share link has no host")
    params = _query_params(query)

    def claims(*keys: str) -> list[tuple[str, str]]:
        return [(k, v) for k, v in params if k in keys]

    if any(v.strip() for _, v in claims(*REALITY_KEYS)):
        raise LinkError("unsupported-security", "REALITY is not supported")
    if _one(claims("headerType"), "header-type").lower() not in ("", "none"):
        raise LinkError("unsupported-transport", "TCP header obfuscation is not supported")
    security = _one(claims("security"), "security").lower()
    username = password = None
    if scheme == "vless":
        if _one(claims("flow"), "flow"):
            raise LinkError("unsupported-flow", "VLESS flows (XTLS Vision) are not supported")
        if _one(claims("encryption"), "encryption").lower() not in ("", "none"):
            raise LinkError("unsupported-encryption", "VLESS encryption other than none is not supported")
        username = _uuid(credential)
        security = security or "tls"  # upstream: canonical VLESS links default to TLS
    else:
        if security not in ("", "tls"):
            raise LinkError("unsupported-security", "trojan runs only over TLS")
        password = credential
        security = "tls"
    shape = v2_shape(
        transport=_one(claims("type", "network"), "transport"),
        security=security,
        sni=_one(claims("sni", "peer"), "sni"),
        host=_one(claims("host"), "host"),
        path=_one(claims("path"), "path"),
        alpn=_one(claims("alpn"), "alpn"),
        insecure=_insecure(claims(*INSECURE_KEYS)),
        ca=_one(claims(CA_KEY), "ca"),
    )
    if scheme == "vless":
        shape += _mux(_one(claims(MUX_PARAM), MUX_PARAM))
    if drain := _one(claims(DRAIN_PARAM), DRAIN_PARAM):
        shape += ((DRAIN_PARAM, drain),)
    name = tag or pct_decode(fragment) or _one(claims("remark", "remarks"), "remark") or f"{scheme}-{host}"
    node = NodeSpec(
        name=name,
        protocol=scheme,
        host=host,
        port=port if port is not None else DEFAULT_V2_PORT,
        username=username,
        password=password,
        params=shape,
    )
    return with_node_id(node)


def _json_text(obj: dict[str, object], key: str) -> str:
    """A v2rayN JSON field as text: strings as they are, integers written out, absent/null as ""."""
    value = obj.get(key)
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise LinkError("invalid-field", f"the vmess field '{key}' must be text or a number")


def _mux(value: str) -> tuple[tuple[str, str], ...]:
    """The dial shape's Mux.Cool part of a ``mux`` value: ``(("mux", "1"),)`` or nothing."""
    value = value.strip().lower()
    if value in _MUX_ON:
        return ((MUX_PARAM, "1"),)
    if value in _MUX_OFF:
        return ()
    raise LinkError("invalid-mux", "mux must be 1/true or 0/false")


def _parse_vmess(body: str, tag: str | None) -> NodeSpec:
    """The part of a ``vmess://`` link after the scheme (v2rayN's base64 JSON), as a node."""
    body = body.partition("#")[0]
    decoded = _base64_text(pct_decode(body))
    if decoded is None:
        raise LinkError("invalid-link", "a vmess link must be base64 of a JSON object")
    try:
        obj = json.loads(decoded)
    except (ValueError, RecursionError):
        raise LinkError("invalid-link", "a vmess link must be base64 of a JSON object") from None
    if not isinstance(obj, dict):
        raise LinkError("invalid-link", "a vmess link must be base64 of a JSON object")
    aid = _json_text(obj, "aid").strip() or "0"
    if not aid.isascii() or not aid.isdigit():
        raise LinkError("invalid-alter-id", "the vmess alterId must be a number")
    if int(aid) > 0:
        raise LinkError(
            "unsupported-alter-id", "vmess alterId must be 0 (the legacy header is not supported)"
        )
    cipher = _json_text(obj, "scy").strip().lower() or VMESS_DEFAULT_CIPHER
    if cipher not in VMESS_CIPHERS:
        raise LinkError(
            "unsupported-cipher", "the vmess cipher is not supported (use " + ", ".join(VMESS_CIPHERS) + ")"
        )
    address = _json_text(obj, "add").strip()
    if address.startswith("[") and address.endswith("]"):
        address = address[1:-1]
    host = normalise_host(address)
    if not host:
        raise LinkError("missing-host", "share link has no host")
    port_text = _json_text(obj, "port").strip()
    if not port_text:
        raise LinkError("missing-port", "a vmess link needs a port")
    port = _port(port_text)
    if _json_text(obj, "type").strip().lower() not in ("", "none"):
        raise LinkError("unsupported-transport", "TCP header obfuscation is not supported")
    tls = _json_text(obj, "tls").strip().lower()
    shape = v2_shape(
        transport=_json_text(obj, "net"),
        security=tls,
        sni=_json_text(obj, "sni"),
        host=_json_text(obj, "host"),
        path=_json_text(obj, "path"),
        alpn=_json_text(obj, "alpn"),
        insecure=False,
    )
    mux = obj.get(MUX_PARAM)
    shape += _mux("1" if mux is True else "0" if mux is False else _json_text(obj, MUX_PARAM))
    node = NodeSpec(
        name=tag or _json_text(obj, "ps") or f"vmess-{host}",
        protocol="vmess",
        host=host,
        port=port,
        username=_uuid(_json_text(obj, "id")),
        params=shape,
        encryption=cipher,
    )
    return with_node_id(node)


def with_node_id(node: NodeSpec) -> NodeSpec:
    """``node`` with its derived :func:`derive_node_id` identity (every construction path ends here).
    Raises LinkError for a ``drain`` parameter that names no policy."""
    for key, value in node.params:
        if key == DRAIN_PARAM:
            try:
                parse_policy(value, parse_seconds)
            except ValueError as exc:
                raise LinkError("invalid-drain", f"drain {exc}") from None
    return dataclasses.replace(node, id=derive_node_id(node))


INBOUND_OPEN_PARAM = "allow_unauthenticated"  # the one inbound URL parameter (see InboundSpec)


def parse_inbound_url(url_text: str, name: str | None = None) -> InboundSpec:
    """``mixed://[user:pass@]host:port[?allow_unauthenticated=true]``; an unnamed inbound is
    ``{scheme}-{port}``.

    Port 0 asks the OS for a free port (the daemon reports the bound address);
    the integration tests rely on it. Otherwise the port is 1..65535.
    """
    m = _SCHEME.match(url_text.strip())
    scheme = m.group(1).lower() if m else ""
    if scheme not in INBOUND_SCHEMES:
        raise LinkError(
            "unsupported-inbound", "inbound scheme is not supported (use mixed:// or redirect://)"
        )
    url = parse_url(url_text, allow_zero_port=True)
    if not url.host:
        raise LinkError("missing-host", "inbound has no listen address")
    if url.port is None:
        raise LinkError("missing-port", "inbound needs an explicit port")
    users: tuple[InboundUser, ...] = ()
    if url.username is not None:
        if not url.username:
            raise LinkError("invalid-user", "inbound user name is empty")
        if scheme == "redirect":
            raise LinkError("invalid-user", "a redirect inbound takes no users (its clients are intercepted)")
        users = (InboundUser(url.username, url.password or ""),)
    allow_unauthenticated = False
    for key, value in url.params:
        if key != INBOUND_OPEN_PARAM:
            raise LinkError(
                "unknown-param",
                f"inbound parameter {key!r} is not supported (the only one is {INBOUND_OPEN_PARAM})",
            )
        allow_unauthenticated, problem = parse_bool(value)
        if problem == "invalid-bool":
            raise LinkError("invalid-bool", f"{INBOUND_OPEN_PARAM} must be true or false")
    return InboundSpec(
        name=name or url.fragment or f"{scheme}-{url.port}",
        kind=INBOUND_KINDS[scheme],
        host=url.host,
        port=url.port,
        users=users,
        allow_unauthenticated=allow_unauthenticated,
    )


def _escape(field: str) -> str:
    return field.replace("\\", "\\\\").replace("|", "\\|")


def derive_node_id(node: NodeSpec) -> uuid.UUID:
    """Stable content identity: UUID v5 over
    ``protocol|host|port|credential-fingerprint|dial-shape``.

    The name is not part of it, so renaming a node keeps its id. The credential
    fingerprint is the SHA-256 of ``username NUL password [NUL cipher]`` (empty
    when the link has no credentials); the dial shape is the sorted non-display query
    parameters. Each field escapes ``\\`` and ``|`` before joining.
    """
    if node.username is None and node.password is None and node.encryption is None:
        fingerprint = ""
    else:
        material = (node.username or "") + "\0" + (node.password or "")
        if node.encryption is not None:  # Shadowsocks: the cipher is part of the credential
            material += "\0" + node.encryption
        fingerprint = hashlib.sha256(material.encode("utf-8", "surrogatepass")).hexdigest()
    shape = "&".join(
        f"{_escape(k)}={_escape(v)}"
        for k, v in sorted(p for p in node.params if p[0] not in NON_IDENTITY_PARAMS)
    )
    fields = (node.protocol, node.host, str(node.port), fingerprint, shape)
    return node_id(uuid.uuid5(NODE_ID_NAMESPACE, "|".join(_escape(f) for f in fields)))
