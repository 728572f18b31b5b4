"""The ``dns`` section's entries -> :class:`~honk.config.spec.DnsSpec`.

The keys, spellings and defaults are upstream honk's DNS reference; the
routing grammar is dae's (docs/en/configuration/dns.md): ``request`` rules
test ``qname``/``qtype``/``sip`` and pick ``reject``, ``asis`` or an upstream;
``response`` rules test ``qname``/``qtype``/``upstream``/``ip`` on an
upstream's answer and ``accept`` it, ``reject`` it or ask another upstream.
A rule continues over lines as a routing rule does (the dae reader joins
them). ``qname``, ``ip`` and ``sip`` arguments are read by the routing grammar
(:func:`honk.config.expr.parse_rule`) as ``domain``/``dip``/``sip`` arguments,
so every spelling routing accepts (``geosite:cn@ads``, ``ext:``, ``regex:``,
``contains:``) means the same here, and the geodata they name is checked as
routing's is: a code the data lacks refuses the file.

dae's ``sub()``/``node()``/``subnode()`` select the upstream the daemon's own
lookups of subscription and node host names go to; they are kept as
:class:`~honk.config.spec.DnsOwnRule` (arguments keyed as dae's
component/daedns/router.go keys them) for :mod:`honk.dns.own`. A key dae does
not know, a regex that does not compile, a mix of selectors (or with
``qname``/``qtype``/``sip``) in one rule and a target that is no declared
upstream are located errors, as dae refuses them. ``link_keyword``/``link_regex``
of ``node``/``subnode`` test the node's share link as written (``NodeSpec.link``).
``use_host`` is a located ``not-yet-supported`` error, so a configuration never
loads with DNS behaving other than written.

Entries arrive as described on :attr:`honk.config.tree.Doc.dns`; scalar
settings follow the usual rule (the last occurrence wins), upstreams and rules
append in source order. No dnspython here: loading a configuration stays
cheap, the resolver's modules load only when the service runs.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable

from honk.config import dns_endpoint as endpoint
from honk.config import values as V
from honk.config.expr import Call, ExprError, parse_call, parse_rule
from honk.config.geodata import check_geodata
from honk.config.spec import (
    DNS_OWN_KEYS,
    DNS_QTYPE_ANY,
    DNS_REQUEST_BUILTINS,
    DNS_REQUEST_CONDITIONS,
    DNS_RESPONSE_ACTIONS,
    DNS_RESPONSE_CONDITIONS,
    DnsBindSpec,
    DnsCondition,
    DnsOwnCall,
    DnsOwnRule,
    DnsRequestRule,
    DnsResponseRule,
    DnsSpec,
    DnsUpstreamSpec,
    MatchArg,
    Predicate,
    RuleSpec,
)
from honk.config.tree import Entry, Sink
from honk.core.net import is_ip_literal

__all__ = [
    "QTYPE_NAMES",
    "build_dns",
    "dns_geodata_rules",
    "geodata_rules",
    "parse_bind",
    "parse_upstream_uri",
]

NOT_YET = "not-yet-supported"
RESERVED_ACTIONS = (*DNS_REQUEST_BUILTINS, *DNS_RESPONSE_ACTIONS)  # no upstream may take these names
IP_VERSIONS = ("4", "6")  # what ipversion_prefer accepts
MAX_TTL = 2**31 - 1  # RFC 2181 §8: a TTL is at most 2^31 - 1 seconds
MAX_QTYPE = 0xFFFF

# The QTYPE names the reference recognises (RFC 1035 §3.2.2, RFC 3596, RFC 2782, RFC 9460).
QTYPE_NAMES = {
    "a": 1,
    "ns": 2,
    "cname": 5,
    "soa": 6,
    "ptr": 12,
    "mx": 15,
    "txt": 16,
    "aaaa": 28,
    "srv": 33,
    "svcb": 64,
    "https": 65,
    "any": 255,
}

BIND_SCHEMES = {"udp": (True, False), "tcp": (False, True), "tcp+udp": (True, True)}
# an upstream URI's scheme -> the transport (honk.config.dns_endpoint); tcp+udp behaves as udp (reference);
# udp+tcp is its other spelling (dae's upstream.go alias, upstream honk's parser)
UPSTREAM_SCHEMES = {
    "udp": endpoint.UDP,
    "tcp+udp": endpoint.UDP,
    "udp+tcp": endpoint.UDP,
    "tcp": endpoint.TCP,
    "tls": endpoint.TLS,
    "https": endpoint.HTTPS,
    "h3": endpoint.H3,
    "http3": endpoint.H3,
    "quic": endpoint.QUIC,
}
ENCRYPTED_SCHEMES = frozenset(s for s, kind in UPSTREAM_SCHEMES.items() if kind in endpoint.ENCRYPTED)
SERVER_NAME_PARAM = "tls_server_name"  # the query parameter naming the certificate's name (reference)
_DOH_PATH = re.compile(r"^/(?:(?![#;\\])[!-~])*$")  # a DoH request path: printable ASCII but #, ; and \
_HOSTNAME = re.compile(
    r"^(?=.{1,253}\.?$)[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
    r"(?:\.[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)*\.?$"
)
_FORBIDDEN = ("@", "/", "?", "#", "\\")
# The dns section's settings (each has its branch in _setting); its blocks are DNS_BLOCKS. Any other
# key is an unknown-key warning. docs/configuration.md lists each (its drift test reads these).
DNS_SETTING_KEYS = frozenset(
    {"bind", "use_host", "ipversion_prefer", "optimistic_cache", "optimistic_cache_ttl", "max_cache_size"}
)
DNS_BLOCKS = ("upstream", "routing", "fixed_domain_ttl")  # read by the dae and structured readers
UPSTREAM_TABLE_KEYS = frozenset({"url", "outbound"})  # TOML/JSON: an upstream as a table


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


def parse_bind(text: str) -> DnsBindSpec:
    """A ``bind`` value (not empty): ``IP:port`` (UDP) or ``udp|tcp|tcp+udp://host:port``.

    Raises ValueError naming what is wrong."""
    scheme, sep, rest = text.partition("://")
    if not sep:
        host, port = _host_port(text, port_required=True)
        if not is_ip_literal(host):
            raise ValueError(
                "without a scheme the address must be a numeric IP:port (a hostname needs "
                "udp://, tcp:// or tcp+udp://)"
            )
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
    ``tcp://``, ``tcp+udp://`` (as udp), ``tls://`` (DoT), ``https://host[:port][/path]``
    (DoH), ``h3://`` or ``http3://`` (DoH over HTTP/3, with a path as https) and ``quic://``
    (DoQ). The encrypted forms take ``?tls_server_name=NAME``, the name their certificate is
    checked against (default: the host; an IP literal is checked as an IP address). Ports
    and the DoH path default per :data:`honk.config.dns_endpoint.DEFAULT_PORTS` and ``DOH_PATH``;
    the protocol carries the path and server name (:func:`honk.config.dns_endpoint.encode`).

    Raises ValueError naming what is wrong."""
    scheme, sep, rest = text.partition("://")
    if sep:
        kind = UPSTREAM_SCHEMES.get(scheme.lower())
        if kind is None:
            raise ValueError(f"unknown upstream scheme (one of {', '.join(UPSTREAM_SCHEMES)})")
    else:
        kind, rest = endpoint.UDP, text
    path: str | None = None
    server_name: str | None = None
    if kind in endpoint.ENCRYPTED:
        rest, server_name = _server_name_query(rest)
        if kind in endpoint.HTTP_KINDS and "/" in rest:
            slash = rest.index("/")
            rest, path = rest[:slash], rest[slash:]
            if not _DOH_PATH.match(path):
                raise ValueError("the DoH path must be printable ASCII without spaces, '?', '#', ';' or '\\'")
    if not rest.startswith("[") and rest.count(":") > 1 and is_ip_literal(rest):
        host, port = rest, None  # a bare IPv6 literal without a port
    else:
        host, port = _host_port(rest, port_required=False)
    if not host:
        raise ValueError("the upstream needs a host")
    if not _valid_host(host):
        raise ValueError("the host is neither an IP address nor a hostname")
    host = host.rstrip(".").lower() if not is_ip_literal(host) else host
    if port is None:
        port = endpoint.DEFAULT_PORTS[kind]
    if port == 0:
        raise ValueError("an upstream's port cannot be 0")
    return endpoint.encode(kind, path, server_name), host, port


def _server_name_query(rest: str) -> tuple[str, str | None]:
    """``rest`` without its ``?tls_server_name=NAME`` query, and the name (None: none given)."""
    rest, sep, query = rest.partition("?")
    if not sep:
        return rest, None
    key, eq, value = query.partition("=")
    if key != SERVER_NAME_PARAM or not eq or "&" in value:
        raise ValueError(f"the only query parameter an upstream takes is {SERVER_NAME_PARAM}=NAME")
    if "#" in value or not _HOSTNAME.match(value) or is_ip_literal(value):
        raise ValueError(f"{SERVER_NAME_PARAM} must be a hostname")
    return rest, value.rstrip(".").lower()


# --- rules -------------------------------------------------------------------------------

# dae's selectors of its own lookups (subscription fetches, node server names): they take a
# rule of their own, never mixed with qname/qtype, and name a declared upstream
INTERNAL_SELECTORS = tuple(DNS_OWN_KEYS)
_OWN_KEY = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\s*:")  # a selector argument's ``key:``
_OWN_REGEX_KEYS = ("tag_regex", "subtag_regex", "name_regex", "link_regex")
_FALLBACK_KEYS = re.compile(r"^(fallback|default)\s*:")  # dae: "fallback is also called default"
_ROUTING_PREDICATE = {"qname": "domain", "ip": "dip", "sip": "sip"}  # the routing matcher each reads as
_PLACEHOLDER_TARGET = "direct"  # the outbound of the routing rule a condition's arguments are checked in


def _own_call(call: Call, e: Entry, sink: Sink) -> DnsOwnCall | None:
    """A ``sub``/``node``/``subnode`` term's arguments keyed as dae keys them; None after a
    located error (a key dae does not know, a regex that does not compile, a link key)."""
    keys = DNS_OWN_KEYS[call.name]
    args: list[MatchArg] = []
    for raw in call.args or ():
        m = _OWN_KEY.match(raw) if raw[:1] not in ("'", '"') else None
        key, value = (m.group(1), V.unquote(raw[m.end() :].strip())) if m else ("", V.unquote(raw))
        if key not in keys:
            sink.error(
                "invalid-value",
                e.path,
                f"{call.name}(...) takes the keys {', '.join(k for k in keys if k)} (or a bare {keys['']})",
                e.loc,
            )
            return None
        key = keys[key]
        if key in _OWN_REGEX_KEYS:
            try:
                re.compile(value)
            except (re.error, RecursionError, OverflowError, ValueError):
                sink.error("invalid-regex", e.path, f"{call.name}({key}: ...) does not compile", e.loc)
                return None
        args.append(MatchArg(key, value))
    return DnsOwnCall(tuple(args), call.negated)


def _routing_args(name: str, call: Call, e: Entry, sink: Sink) -> tuple[MatchArg, ...] | None:
    """The arguments of ``qname``/``ip``/``sip``, validated and normalised exactly as routing's
    ``domain``/``dip``/``sip`` arguments are (the routing grammar reads them; its complaints are
    reported at this entry, named after the DNS condition)."""
    if not call.args:
        sink.error("invalid-value", e.path, f"{name}() needs an argument", e.loc)
        return None
    predicate = _ROUTING_PREDICATE[name]
    scratch = Sink()
    parsed = parse_rule(
        f"{predicate}({', '.join(call.args)}) -> {_PLACEHOLDER_TARGET}", e.path, e.loc, scratch
    )
    for d in scratch.items:
        sink.add(d.severity, d.code, e.path, f"{name}(...): {d.message}", e.loc)
    if parsed is None or scratch.has_errors:
        return None
    args = parsed.predicates[0].args
    if name == "qname":  # a bare name is a suffix, as the reference writes it
        args = tuple(MatchArg("suffix", a.value) if a.key == "" else a for a in args)
    return args


def _condition(term: str, phase: str, e: Entry, sink: Sink) -> DnsCondition | Call | None:
    """One term of a ``phase`` rule: a condition, the call of an internal selector, or None
    after a located error."""
    try:
        call = parse_call(term, bare_prefixes=False)
    except ExprError as exc:
        sink.error(exc.code, e.path, exc.message, e.loc)
        return None
    allowed = DNS_REQUEST_CONDITIONS if phase == "request" else DNS_RESPONSE_CONDITIONS
    name = call.name
    if name in INTERNAL_SELECTORS and phase == "request":
        return call
    if name not in allowed:
        other = (
            DNS_RESPONSE_CONDITIONS if phase == "request" else (*DNS_REQUEST_CONDITIONS, *INTERNAL_SELECTORS)
        )
        if name in other:
            sink.error(
                "invalid-value",
                e.path,
                f"{name}(...) is not a {phase} condition (a {phase} rule tests {', '.join(allowed)})",
                e.loc,
            )
        else:
            sink.error(
                "unknown-dns-condition",
                e.path,
                f"a DNS {phase} condition is one of {', '.join(allowed)}",
                e.loc,
            )
        return None
    if name == "qtype":
        if not call.args:
            sink.error("invalid-value", e.path, "qtype() needs an argument", e.loc)
            return None
        try:
            qtypes = tuple(_qtype(V.unquote(raw)) for raw in call.args)
        except ExprError as exc:
            sink.error(exc.code, e.path, exc.message, e.loc)
            return None
        return DnsCondition("qtype", qtypes=qtypes, negated=call.negated)
    if name == "upstream":
        upstreams = tuple(V.unquote(raw) for raw in call.args or ())
        if not upstreams or not all(upstreams):
            sink.error("invalid-value", e.path, "upstream(...) names one or more upstreams", e.loc)
            return None
        return DnsCondition("upstream", upstreams=upstreams, negated=call.negated)
    args = _routing_args(name, call, e, sink)
    if args is None:
        return None
    if name == "qname":
        return DnsCondition("qname", names=args, negated=call.negated)
    return DnsCondition(name, ips=args, negated=call.negated)


def _qtype(text: str) -> int:
    s = text.strip().lower()
    if s == "*":
        return DNS_QTYPE_ANY
    if s in QTYPE_NAMES:
        return QTYPE_NAMES[s]
    if s.isascii() and s.isdigit() and int(s) <= MAX_QTYPE:
        return int(s)
    raise ExprError(
        "invalid-value",
        "qtype accepts A, AAAA, CNAME, MX, TXT, NS, PTR, SOA, SRV, HTTPS, SVCB, ANY, * or a number 0-65535",
    )


def _rule_text(e: Entry, sink: Sink) -> str | None:
    if isinstance(e.value, str):
        return e.value
    sink.error("invalid-type", e.path, "expected a rule string", e.loc)
    return None


def parse_dns_rule(e: Entry, phase: str, sink: Sink) -> DnsRequestRule | DnsResponseRule | DnsOwnRule | None:
    """One ``request`` or ``response`` rule (its lines already joined as dae joins them); None
    after located errors. A rule of dae's internal selectors comes back as :class:`DnsOwnRule`."""
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
    conditions: list[DnsCondition] = []
    selectors: list[Call] = []
    ok = True
    for term in V.split_unquoted(text[:arrow], "&&"):
        found = _condition(term, phase, e, sink)
        if found is None:
            ok = False
        elif isinstance(found, Call):
            selectors.append(found)
        else:
            conditions.append(found)
    action = V.unquote(text[arrow + 2 :].strip())
    if not action:
        sink.error("invalid-rule", e.path, "rule has no action after '->'", e.loc)
        ok = False
    if selectors and conditions:
        sink.error(
            "invalid-rule",
            e.path,
            f"{selectors[0].name}(...) selects honk's own lookups and cannot be "
            "mixed with qname/qtype/sip in one rule",
            e.loc,
        )
        ok = False
    elif len({c.name for c in selectors}) > 1:
        sink.error("invalid-rule", e.path, "sub(), node() and subnode() cannot be mixed in one rule", e.loc)
        ok = False
    calls = [_own_call(c, e, sink) for c in selectors] if ok else []
    if not ok or None in calls:
        return None
    if selectors:
        return DnsOwnRule(selectors[0].name, tuple(calls), action, e.loc)  # type: ignore[arg-type]
    if phase == "request":
        return DnsRequestRule(tuple(conditions), action, e.loc)
    return DnsResponseRule(tuple(conditions), action, e.loc)


def geodata_rules(rules: Iterable[DnsRequestRule | DnsResponseRule]) -> tuple[RuleSpec, ...]:
    """The conditions of ``rules`` that name geodata (``qname``, ``ip``, ``sip``) as routing rules,
    one per DNS rule: what routing's geodata check and the reload's file stamps read."""
    out = []
    for rule in rules:
        # qname keeps its own name (the check reads any name but dip/sip as a domain matcher)
        predicates = tuple(
            Predicate(
                "qname" if c.kind == "qname" else _ROUTING_PREDICATE[c.kind], c.names or c.ips, c.negated
            )
            for c in rule.conditions
            if c.kind in _ROUTING_PREDICATE
        )
        out.append(RuleSpec(predicates, _PLACEHOLDER_TARGET, loc=rule.loc))
    return tuple(out)


def dns_geodata_rules(spec: DnsSpec | None) -> tuple[RuleSpec, ...]:
    """:func:`geodata_rules` of a whole section's request and response rules (none without one)."""
    return geodata_rules((*spec.request_rules, *spec.response_rules)) if spec is not None else ()


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
        for extra in set(value) - UPSTREAM_TABLE_KEYS:
            sink.warning("unknown-key", f"{e.path}.{extra}", "unknown key is ignored", e.loc)
        if not isinstance(uri, str) or not (tag is None or isinstance(tag, str)):
            sink.error(
                "invalid-type", e.path, "expected a 'url' string and an optional 'outbound' string", e.loc
            )
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


def build_dns(
    entries: list[Entry] | None, sink: Sink, data_dir: str | None = None
) -> tuple[DnsSpec | None, list[tuple[str, Entry]]]:
    """The section's spec (None when there is no ``dns`` section) and the ``-> tag`` targets
    of its upstreams, for the loader's cross-reference check against nodes and groups.
    ``data_dir``: where the geodata the conditions name is looked up (``global.data_dir``)."""
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
    rules: dict[str, list[tuple[DnsRequestRule | DnsResponseRule, Entry]]] = {"request": [], "response": []}
    internal: list[tuple[DnsOwnRule, Entry]] = []  # rules of dae's internal selectors
    fallbacks: dict[str, tuple[str, Entry]] = {}
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
            if rest in RESERVED_ACTIONS or not rest:
                sink.error(
                    "invalid-value",
                    e.path,
                    f"an upstream name must not be empty nor one of {', '.join(RESERVED_ACTIONS)}",
                    e.loc,
                )
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
        elif key in rules:
            # dae spells a fallback 'default:' too; the reader keys only 'fallback:' as one
            alias = _FALLBACK_KEYS.match(e.value) if isinstance(e.value, str) else None
            if alias is not None:
                _fallback(
                    key,
                    Entry(f"{key}.fallback", e.value[alias.end() :].strip(), e.path, e.loc, raw=True),
                    fallbacks,
                    sink,
                )
                continue
            rule = parse_dns_rule(e, key, sink)
            if isinstance(rule, DnsOwnRule):
                internal.append((rule, e))
            elif rule is not None:
                rules[key].append((rule, e))
        elif key in ("request.fallback", "response.fallback"):
            _fallback(head, e, fallbacks, sink)
        else:
            _setting(key, e, values, sink)
    if explicit_upstreams or upstreams:
        values["upstreams"] = tuple(upstreams)
    declared = {u.name for u in values.get("upstreams", base.upstreams)}  # type: ignore[attr-defined]
    known = declared | set(upstream_entries)  # a refused upstream is reported once, not at every use
    builtins = {"request": DNS_REQUEST_BUILTINS, "response": DNS_RESPONSE_ACTIONS}
    for phase, phase_rules in rules.items():
        for rule, e in phase_rules:
            if rule.action not in builtins[phase] and rule.action not in known:
                sink.error(
                    "unknown-dns-upstream",
                    e.path,
                    f"action '{rule.action}' names no upstream (nor {' or '.join(builtins[phase])})",
                    e.loc,
                )
            for condition in rule.conditions:
                for name in condition.upstreams:
                    if name not in known:
                        sink.error(
                            "unknown-dns-upstream", e.path, f"upstream({name}) names no upstream", e.loc
                        )
    for own, e in internal:
        if own.upstream not in known:
            sink.error(
                "unknown-dns-upstream",
                e.path,
                f"action '{own.upstream}' names no upstream (dae's "
                "sub()/node()/subnode() rules name a declared one)",
                e.loc,
            )
    for phase, (action, e) in fallbacks.items():
        values[f"{phase}_fallback"] = action
        if action not in builtins[phase] and action not in known:
            sink.error(
                "unknown-dns-upstream",
                e.path,
                f"the {phase} fallback '{action}' names no upstream (nor {' or '.join(builtins[phase])})",
                e.loc,
            )
    if "request" not in fallbacks and base.request_fallback not in known and block_entry is not None:
        sink.error(
            "unknown-dns-upstream",
            block_entry.path,
            f"the upstream block replaces the built-in "
            f"'{base.request_fallback}' upstream the request fallback uses: declare it or set "
            "routing.request.fallback",
            block_entry.loc,
        )
    checked = rules["request"] + rules["response"]
    check_geodata(
        list(zip(geodata_rules(r for r, _ in checked), (e for _, e in checked), strict=True)), data_dir, sink
    )
    return DnsSpec(
        request_rules=tuple(r for r, _ in rules["request"]),  # type: ignore[misc]
        response_rules=tuple(r for r, _ in rules["response"]),  # type: ignore[misc]
        fixed_domain_ttl=tuple(sorted(fixed.items())),
        own_rules=tuple(r for r, _ in internal),
        loc=section.loc if section is not None else base.loc,
        **values,  # type: ignore[arg-type]
    ), targets


def _fallback(phase: str, e: Entry, fallbacks: dict[str, tuple[str, Entry]], sink: Sink) -> None:
    """A ``fallback:`` of ``phase`` (the last one counts); its target is checked with the rules'."""
    action = V.get_str(e, sink)
    if action is None:
        return
    if not action:
        allowed = "reject, asis" if phase == "request" else "accept, reject"
        sink.error("invalid-value", e.path, f"the fallback must name {allowed} or an upstream", e.loc)
        return
    fallbacks[phase] = (action, e)


def _setting(key: str, e: Entry, values: dict[str, object], sink: Sink) -> None:
    if key not in DNS_SETTING_KEYS:
        sink.warning("unknown-key", e.path, "unknown key is ignored", e.loc)
        return
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
        text = (
            str(e.value) if isinstance(e.value, int) and not isinstance(e.value, bool) else V.get_str(e, sink)
        )
        if text is None:
            return
        if text.strip() in IP_VERSIONS:
            values[key] = int(text.strip())
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
