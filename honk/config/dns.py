"""The ``dns`` section's entries -> :class:`~honk.config.spec.DnsSpec`.

The keys, spellings and defaults are upstream honk's DNS reference. What honk
does not do yet (encrypted upstreams, ``use_host``, ``ipversion_prefer``,
response rules other than the fallback, ``sip``/``ip``/``upstream``
conditions, ``regex:``/``geosite:`` names) is a located ``not-yet-supported``
error, so a configuration never loads with DNS behaving other than written.

Entries arrive as described on :attr:`honk.config.tree.Doc.dns`; scalar
settings follow the usual rule (the last occurrence wins), upstreams and rules
append in source order. No dnspython here: loading a configuration stays
cheap, the resolver's modules load only when the service runs.
"""

from __future__ import annotations

import ipaddress
import re

from honk.config import values as V
from honk.config.expr import ExprError, parse_call, split_arg
from honk.config.spec import (
    DNS_PORT,
    DNS_QTYPE_ANY,
    DNS_REQUEST_BUILTINS,
    DNS_RESPONSE_ACTIONS,
    DnsBindSpec,
    DnsCondition,
    DnsRequestRule,
    DnsSpec,
    DnsUpstreamSpec,
    MatchArg,
)
from honk.config.tree import Entry, Sink

__all__ = ["QTYPE_NAMES", "build_dns", "parse_bind", "parse_upstream_uri"]

NOT_YET = "not-yet-supported"
MAX_TTL = 2**31 - 1  # RFC 2181 §8: a TTL is at most 2^31 - 1 seconds
MAX_QTYPE = 0xFFFF

# The QTYPE names the reference recognises (RFC 1035 §3.2.2, RFC 3596, RFC 2782, RFC 9460).
QTYPE_NAMES = {
    "a": 1, "ns": 2, "cname": 5, "soa": 6, "ptr": 12, "mx": 15, "txt": 16,
    "aaaa": 28, "srv": 33, "svcb": 64, "https": 65, "any": 255,
}

BIND_SCHEMES = {"udp": (True, False), "tcp": (False, True), "tcp+udp": (True, True)}
UPSTREAM_SCHEMES = {"udp": "udp", "tcp+udp": "udp", "tcp": "tcp"}  # tcp+udp behaves as udp (reference)
ENCRYPTED_SCHEMES = frozenset({"tls", "https", "h3", "http3", "quic"})
_HOSTNAME = re.compile(r"^(?=.{1,253}\.?$)[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
                       r"(?:\.[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)*\.?$")
_FORBIDDEN = ("@", "/", "?", "#", "\\")


class NotYetSupported(ValueError):
    """A documented form honk does not implement yet."""


# --- addresses ----------------------------------------------------------------------------


def _host_port(rest: str, *, port_required: bool) -> tuple[str, int | None]:
    """``host:port``, ``[v6]:port`` (and without the port when allowed); an empty host stays ''."""
    if any(c in rest for c in _FORBIDDEN):
        raise ValueError("userinfo, paths, queries, fragments and backslashes are not allowed")
    if rest.startswith("["):
        close = rest.find("]")
        if close < 0:
            raise ValueError("an IPv6 address misses its closing ']'")
        host, tail = rest[1:close], rest[close + 1 :]
        if "%" in host:
            raise ValueError("IPv6 zone identifiers are not allowed")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError("the bracketed host is not an IPv6 address") from None
        if not tail:
            port_text = None
        elif tail.startswith(":"):
            port_text = tail[1:]
        else:
            raise ValueError("expected ':port' after the bracketed address")
    else:
        if "[" in rest or "]" in rest:
            raise ValueError("malformed brackets")
        if rest.count(":") > 1:
            raise ValueError("an IPv6 address must be bracketed")
        host, sep, port_text = rest.partition(":")
        if not sep:
            port_text = None
        elif host and not _valid_host(host):
            raise ValueError("the host is neither an IP address nor a hostname")
    if port_text is None:
        if port_required:
            raise ValueError("an explicit port is required")
        return host, None
    if not port_text.isascii() or not port_text.isdigit() or int(port_text) > 65535:
        raise ValueError("the port must be a decimal number 0-65535")
    return host, int(port_text)


def _valid_host(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return bool(_HOSTNAME.match(host))
    return True


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def parse_bind(text: str) -> DnsBindSpec:
    """A ``bind`` value (not empty): ``IP:port`` (UDP) or ``udp|tcp|tcp+udp://host:port``.

    Raises ValueError naming what is wrong."""
    scheme, sep, rest = text.partition("://")
    if not sep:
        host, port = _host_port(text, port_required=True)
        if not _is_ip(host):
            raise ValueError("without a scheme the address must be a numeric IP:port (a hostname needs "
                             "udp://, tcp:// or tcp+udp://)")
        return DnsBindSpec(host, port or 0)
    transports = BIND_SCHEMES.get(scheme.lower())
    if transports is None:
        raise ValueError("the scheme must be udp, tcp or tcp+udp")
    host, port = _host_port(rest, port_required=True)
    if host and not _valid_host(host):
        raise ValueError("the host is neither an IP address nor a hostname")
    return DnsBindSpec(host, port or 0, udp=transports[0], tcp=transports[1])


def parse_upstream_uri(text: str) -> tuple[str, str, int]:
    """An upstream URI as ``(protocol, host, port)``: bare ``host[:port]``, ``udp://``,
    ``tcp://`` or ``tcp+udp://`` (as udp), port 53 by default.

    Raises :class:`NotYetSupported` for the encrypted schemes, ValueError otherwise."""
    scheme, sep, rest = text.partition("://")
    if sep:
        key = scheme.lower()
        if key in ENCRYPTED_SCHEMES:
            raise NotYetSupported(f"{key}:// upstreams are not supported yet (udp, tcp and tcp+udp are)")
        protocol = UPSTREAM_SCHEMES.get(key)
        if protocol is None:
            raise ValueError("unknown upstream scheme")
    else:
        protocol, rest = "udp", text
    if not rest.startswith("[") and rest.count(":") > 1 and _is_ip(rest):
        host, port = rest, None  # a bare IPv6 literal without a port
    else:
        host, port = _host_port(rest, port_required=False)
    if not host:
        raise ValueError("the upstream needs a host")
    if not _valid_host(host):
        raise ValueError("the host is neither an IP address nor a hostname")
    return protocol, host.rstrip(".").lower() if not _is_ip(host) else host, DNS_PORT if port is None else port


# --- rules -------------------------------------------------------------------------------


def _condition(term: str) -> DnsCondition:
    call = parse_call(term, bare_prefixes=False)
    if call.args is None:  # parse_call never answers this without bare prefixes
        raise ExprError("invalid-rule", "expected qname(...) or qtype(...)")
    if call.name == "qname":
        names = []
        for raw in call.args:
            arg = split_arg(raw)
            key = arg.key or "suffix"  # a bare argument is a suffix (reference)
            if key in ("regex", "geosite"):
                raise ExprError(NOT_YET, f"qname({key}: ...) is not supported yet (suffix, keyword and full are)")
            if key not in ("suffix", "keyword", "full"):
                raise ExprError("invalid-value", "qname(...) accepts suffix:, keyword: and full: arguments")
            value = arg.value.strip().lower().rstrip(".")
            if not value:
                raise ExprError("invalid-value", "empty qname argument")
            names.append(MatchArg(key, value))
        if not names:
            raise ExprError("invalid-value", "qname() needs an argument")
        return DnsCondition("qname", names=tuple(names), negated=call.negated)
    if call.name == "qtype":
        qtypes = [_qtype(V.unquote(raw)) for raw in call.args]
        if not qtypes:
            raise ExprError("invalid-value", "qtype() needs an argument")
        return DnsCondition("qtype", qtypes=tuple(qtypes), negated=call.negated)
    if call.name == "sip":
        raise ExprError(NOT_YET, "sip(...) request conditions are not supported yet")
    if call.name in ("ip", "upstream"):
        raise ExprError("invalid-value", f"{call.name}(...) is a response condition")
    raise ExprError("unknown-dns-condition", "a DNS request condition is qname(...) or qtype(...)")


def _qtype(text: str) -> int:
    s = text.strip().lower()
    if s == "*":
        return DNS_QTYPE_ANY
    if s in QTYPE_NAMES:
        return QTYPE_NAMES[s]
    if s.isascii() and s.isdigit() and int(s) <= MAX_QTYPE:
        return int(s)
    raise ExprError("invalid-value", "qtype accepts A, AAAA, CNAME, MX, TXT, NS, PTR, SOA, SRV, HTTPS, "
                                     "SVCB, ANY, * or a number 0-65535")


def _rule_text(e: Entry, sink: Sink) -> str | None:
    if isinstance(e.value, str):
        return e.value
    sink.error("invalid-type", e.path, "expected a rule string", e.loc)
    return None


def parse_request_rule(e: Entry, sink: Sink) -> DnsRequestRule | None:
    text = _rule_text(e, sink)
    if text is None:
        return None
    arrow = V.find_unquoted(text, "->")
    if arrow < 0:
        if V.find_unquoted(text, "->", depth_aware=False) >= 0:
            sink.error("unterminated-matcher", e.path, "a condition's argument list is not closed", e.loc)
        else:
            sink.error("missing-arrow", e.path, "a DNS rule needs '-> action'", e.loc)
        return None
    conditions = []
    ok = True
    for term in V.split_unquoted(text[:arrow], "&&"):
        try:
            conditions.append(_condition(term))
        except ExprError as exc:
            sink.error(exc.code, e.path, exc.message, e.loc)
            ok = False
    action = V.unquote(text[arrow + 2 :])
    if not action:
        sink.error("invalid-rule", e.path, "rule has no action after '->'", e.loc)
        ok = False
    return DnsRequestRule(tuple(conditions), action, e.loc) if ok else None


# --- the section ---------------------------------------------------------------------------


def _seconds(e: Entry, sink: Sink) -> int | None:
    """A whole number of seconds (an integer, or a duration such as ``10m``), 0 .. 2^31-1."""
    value = e.value
    if isinstance(value, bool):
        seconds = None
    elif isinstance(value, int) and not e.raw:
        seconds = value
    elif isinstance(value, str):
        parsed = V.parse_seconds(V.unquote(value) if e.raw else value)
        seconds = int(parsed) if parsed is not None and parsed == int(parsed) else None
    else:
        seconds = None
    if seconds is None or not 0 <= seconds <= MAX_TTL:
        sink.error("invalid-value", e.path, "expected whole seconds (0 or more)", e.loc)
        return None
    return seconds


def _upstream(name: str, e: Entry, sink: Sink) -> DnsUpstreamSpec | None:
    value = e.value
    tag: str | None = None
    if isinstance(value, dict) and not e.raw:
        uri, tag = value.get("url"), value.get("outbound")
        for extra in set(value) - {"url", "outbound"}:
            sink.warning("unknown-key", f"{e.path}.{extra}", "unknown key is ignored", e.loc)
        if not isinstance(uri, str) or not (tag is None or isinstance(tag, str)):
            sink.error("invalid-type", e.path, "expected a 'url' string and an optional 'outbound' string", e.loc)
            return None
    elif isinstance(value, str):
        uri = value
        arrow = V.find_unquoted(value, "->", depth_aware=False)
        legacy = re.search(r"\s+outbound\s*:", value)
        if arrow >= 0:
            uri, tag = value[:arrow], value[arrow + 2 :]
        elif legacy is not None and V.is_quoted(value[: legacy.start()]):
            uri, tag = value[: legacy.start()], value[legacy.end() :]  # the legacy same-line form
        uri = V.unquote(uri)
    else:
        sink.error("invalid-type", e.path, "expected an upstream URI string", e.loc)
        return None
    if tag is not None:
        tag = V.unquote(tag)
        if not tag:
            sink.error("invalid-value", e.path, "'->' must name a node or group", e.loc)
            return None
    try:
        protocol, host, port = parse_upstream_uri(uri.strip())
    except NotYetSupported as exc:
        sink.error(NOT_YET, e.path, str(exc), e.loc)
        return None
    except ValueError as exc:
        sink.error("invalid-value", e.path, f"upstream URI: {exc}", e.loc)
        return None
    return DnsUpstreamSpec(name, protocol, host, port, tag, e.loc)


def build_dns(entries: list[Entry] | None, sink: Sink) -> tuple[DnsSpec | None, list[tuple[str, Entry]]]:
    """The section's spec (None when there is no ``dns`` section) and the ``-> tag`` targets
    of its upstreams, for the loader's cross-reference check against nodes and groups."""
    if entries is None:
        return None, []
    base = DnsSpec()
    section = entries[0] if entries and entries[0].key is None else None
    values: dict[str, object] = {}
    explicit_upstreams = False
    block_entry: Entry | None = None  # the first upstream block
    upstreams: list[DnsUpstreamSpec] = []
    upstream_entries: dict[str, Entry] = {}
    targets: list[tuple[str, Entry]] = []
    rules: list[tuple[DnsRequestRule, Entry]] = []
    request_fallback: tuple[str, Entry] | None = None
    fixed: dict[str, int] = {}
    for e in entries:
        key = e.key
        if key is None:
            continue
        head, _, rest = key.partition(".")
        if key == "upstream":
            explicit_upstreams = True
            block_entry = block_entry or e
        elif head == "upstream":
            if rest in upstream_entries:
                sink.error("duplicate-upstream", e.path, f"upstream '{rest}' is declared twice", e.loc)
                continue
            if rest in DNS_REQUEST_BUILTINS or not rest:
                sink.error("invalid-value", e.path, "an upstream name must not be empty, reject or asis", e.loc)
                continue
            upstream_entries[rest] = e
            spec = _upstream(rest, e, sink)
            if spec is not None:
                upstreams.append(spec)
                if spec.outbound is not None:
                    targets.append((spec.outbound, e))
        elif head == "fixed_domain_ttl":
            domain = rest.strip().strip("'\"").lower().rstrip(".")
            seconds = _seconds(e, sink)
            if not domain:
                sink.error("invalid-value", e.path, "empty domain", e.loc)
            elif seconds is not None:
                fixed[domain] = seconds
        elif key == "request":
            rule = parse_request_rule(e, sink)
            if rule is not None:
                rules.append((rule, e))
        elif key == "request.fallback":
            action = V.get_str(e, sink)
            if action is not None:
                if action:
                    request_fallback = (action, e)
                else:
                    sink.error("invalid-value", e.path, "the fallback must name reject, asis or an upstream", e.loc)
        elif key == "response":
            sink.error(NOT_YET, e.path, "response rules are not supported yet (only 'fallback: accept|reject')",
                       e.loc)
        elif key == "response.fallback":
            action = V.get_str(e, sink)
            if action is None:
                continue
            if action in DNS_RESPONSE_ACTIONS:
                values["response_fallback"] = action
            else:
                sink.error(NOT_YET, e.path, "a response fallback other than accept or reject (a re-query) "
                                            "is not supported yet", e.loc)
        else:
            _setting(key, e, values, sink)
    if explicit_upstreams or upstreams:
        values["upstreams"] = tuple(upstreams)
    declared = {u.name for u in values.get("upstreams", base.upstreams)}  # type: ignore[attr-defined]
    known = declared | set(upstream_entries)  # a refused upstream is reported once, not at every use
    for rule, e in rules:
        if rule.action not in DNS_REQUEST_BUILTINS and rule.action not in known:
            sink.error("unknown-dns-upstream", e.path, f"action '{rule.action}' names no upstream "
                                                       "(nor reject or asis)", e.loc)
    if request_fallback is not None:
        values["request_fallback"], fallback_entry = request_fallback
        if request_fallback[0] not in DNS_REQUEST_BUILTINS and request_fallback[0] not in known:
            sink.error("unknown-dns-upstream", fallback_entry.path, f"the request fallback "
                       f"'{request_fallback[0]}' names no upstream (nor reject or asis)", fallback_entry.loc)
    elif base.request_fallback not in known and block_entry is not None:
        sink.error("unknown-dns-upstream", block_entry.path, f"the upstream block replaces the built-in "
                   f"'{base.request_fallback}' upstream the request fallback uses: declare it or set "
                   "routing.request.fallback", block_entry.loc)
    return DnsSpec(
        request_rules=tuple(r for r, _ in rules),
        fixed_domain_ttl=tuple(sorted(fixed.items())),
        loc=section.loc if section is not None else base.loc,
        **values,  # type: ignore[arg-type]
    ), targets


def _setting(key: str, e: Entry, values: dict[str, object], sink: Sink) -> None:
    if key == "bind":
        text = V.get_str(e, sink)
        if text is None:
            return
        if not text:
            values["bind"] = None
            return
        try:
            bind = parse_bind(text)
        except ValueError as exc:
            sink.error("invalid-value", e.path, f"bind: {exc}", e.loc)
            return
        values["bind"] = DnsBindSpec(bind.host, bind.port, bind.udp, bind.tcp, e.loc)
    elif key == "use_host":
        flag = V.get_bool(e, sink)
        if flag:
            sink.error(NOT_YET, e.path, "use_host is not supported yet", e.loc)
    elif key == "ipversion_prefer":
        text = V.get_str(e, sink) if not isinstance(e.value, int) else str(e.value)
        if text is None:
            return
        if text.strip() in ("4", "6"):
            sink.error(NOT_YET, e.path, "ipversion_prefer is not supported yet (both families are answered "
                                        "as asked)", e.loc)
        else:
            sink.error("invalid-value", e.path, "ipversion_prefer accepts 4 or 6", e.loc)
    elif key == "optimistic_cache":
        flag = V.get_bool(e, sink)
        if flag is not None:
            values[key] = flag
    elif key == "optimistic_cache_ttl":
        seconds = _seconds(e, sink)
        if seconds is not None:
            values[key] = seconds
    elif key == "max_cache_size":
        n = V.get_int(e, sink)
        if n is None:
            return
        if n < 0:
            sink.error("invalid-value", e.path, "max_cache_size must not be negative", e.loc)
        elif n == 0:
            sink.warning("invalid-value", e.path, "max_cache_size 0 is read as 1 entry", e.loc)
            values[key] = 1
        else:
            values[key] = n
    else:
        sink.warning("unknown-key", e.path, "unknown key is ignored", e.loc)
