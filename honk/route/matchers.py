"""Traffic matchers: one class per predicate kind, compiled once from config.

Theory of operation:
  * :func:`compile_predicate` turns one :class:`~honk.config.spec.Predicate`
    into a matcher object. All parsing (CIDRs, port ranges, regexes) happens
    here, never per flow.
  * Per flow, the router builds one :class:`FlowView` (the few facts the
    matchers read, already parsed) and calls ``matcher.match(view)``.
  * A matcher answers the *positive* question; negation is applied by the
    router. Facts that are unknown answer ``False``, so a negated matcher over
    an unknown fact holds (an unsniffed domain is "not x"). The one exception
    is the destination IP after a failed resolution, which the router handles
    itself: see :mod:`honk.route.router`.

Nothing here reads a clock; the only I/O is reading a geodata file (once per
content, :mod:`honk.geo.assets`) when a rule names a ``geosite:``/``geoip:``/``ext:`` code.
"""

from __future__ import annotations

import bisect
import functools
import ipaddress
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from honk.config.spec import MatchArg, Predicate, RuleSpec
from honk.core.errors import HonkError
from honk.core.net import FlowMeta, IPAddress, Network
from honk.geo.assets import GEOIP_FILE, GEOIP_MMDB_FILES, GEOSITE_FILE, GeoAssets
from honk.geo.dat import GeoDataError
from honk.netlink.owner import comm_name

log = logging.getLogger(__name__)

# Predicates whose answer depends on the destination IP. A domain target must
# be resolved before a rule containing one of these can be decided.
DESTINATION_IP_PREDICATES = frozenset({"dip", "ipversion"})

# Predicates about facts a mixed (SOCKS5/HTTP) port cannot observe.
UNOBSERVABLE_PREDICATES = frozenset({"mac", "dscp"})
PROCESS_PREDICATES = frozenset({"pname"})  # need the flow's local process (FlowMeta.process)

# `geoip: private`: private, loopback, link-local, CGNAT, documentation,
# multicast and otherwise reserved ranges, for both families.
PRIVATE_CIDRS: tuple[str, ...] = (
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.0.2.0/24",
    "192.88.99.0/24",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "198.51.100.0/24",
    "203.0.113.0/24",
    "224.0.0.0/4",
    "240.0.0.0/4",
    "255.255.255.255/32",
    "::/128",
    "::1/128",
    "64:ff9b:1::/48",
    "100::/64",
    "2001:db8::/32",
    "fc00::/7",
    "fe80::/10",
    "ff00::/8",
)

IP_PARSE_CACHE_SIZE = 4096  # distinct host strings whose IP parse is remembered

_IPV4_MAPPED = ipaddress.ip_network("::ffff:0:0/96")


class RouteCompileError(HonkError, ValueError):
    """A routing predicate could not be compiled (the loader should have caught it)."""


def unmap(ip: IPAddress) -> IPAddress:
    """``::ffff:a.b.c.d`` becomes ``a.b.c.d``; every other address is returned as is."""
    if ip.version == 6:
        mapped = ip.ipv4_mapped
        if mapped is not None:
            return mapped
    return ip


@functools.lru_cache(maxsize=IP_PARSE_CACHE_SIZE)
def _host_ip(host: str) -> IPAddress | None:
    """The un-mapped IP of an already normalised ``Address.host``, or None for a name.

    Cached: LAN sources and popular destinations repeat, and ``ip_address``
    failing on a name costs more than the whole rule walk for a short list.
    """
    try:
        return unmap(ipaddress.ip_address(host))
    except ValueError:
        return None


def _label_suffixes(host: str) -> frozenset[str]:
    """``a.b.c`` -> ``{a.b.c, b.c, c}``: every suffix that starts on a label boundary."""
    out = [host]
    dot = host.find(".")
    while dot >= 0:
        out.append(host[dot + 1 :])
        dot = host.find(".", dot + 1)
    return frozenset(out)


@dataclass(frozen=True, slots=True)
class FlowView:
    """The facts matchers read, parsed once per flow.

    ``domain`` is the requested host name (lower case, no trailing dot) or
    ``None`` when the client gave an IP literal; ``domain_suffixes`` holds its
    label-boundary suffixes (empty without a domain). ``dst_ip``/``src_ip`` are
    already un-mapped (an IPv4-mapped IPv6 address is its IPv4 address); ``None``
    means unknown.
    """

    network: Network
    domain: str | None
    domain_suffixes: frozenset[str]
    dst_ip: IPAddress | None
    src_ip: IPAddress | None
    dport: int
    sport: int
    process: str | None = None  # the local process's name (the host's own flows only)

    @classmethod
    def of(cls, meta: FlowMeta) -> FlowView:
        target = meta.target
        target_ip = _host_ip(target.host)
        domain = None if target_ip is not None else target.host
        resolved = meta.resolved
        return cls(
            network=meta.network,
            domain=domain,
            domain_suffixes=_NO_SUFFIXES if domain is None else _label_suffixes(domain),
            dst_ip=target_ip if resolved is None else unmap(resolved),
            src_ip=_host_ip(meta.source.host),
            dport=target.port,
            sport=meta.source.port,
            process=meta.process,
        )


_NO_SUFFIXES: frozenset[str] = frozenset()


class Matcher(Protocol):
    """One compiled predicate, answering the positive question."""

    kind: str
    needs_dst_ip: bool

    def match(self, view: FlowView) -> bool: ...


# --- domain ----------------------------------------------------------------------


def _normalise_domain(value: str) -> str:
    return value.strip().rstrip(".").lower()


class DomainMatcher:
    """``domain(...)``: suffix (bare or ``suffix:``), ``full:``, ``keyword:``, ``regex:``, and the
    lists of ``geosite:`` and ``ext:`` codes (read from ``geo``, see :mod:`honk.geo.assets`).

    Suffixes match on a label boundary: ``example.com`` matches ``example.com``
    and ``a.example.com``, never ``badexample.com``. Regexes use ``re.search``
    against the lower-cased host and are compiled case-insensitively, since
    host names are case-insensitive; a list's many keywords or regexes are one
    compiled alternation each, so a lookup costs a few set probes and at most two
    searches however long the lists are.
    """

    kind = "domain"
    needs_dst_ip = False
    __slots__ = ("_suffixes", "_full", "_keywords", "_keyword_re", "_regex")

    def __init__(self, args: tuple[MatchArg, ...], geo: GeoAssets | None = None) -> None:
        suffixes: set[str] = set()
        full: set[str] = set()
        keywords: list[str] = []
        regexes: list[str] = []
        for arg in args:
            key = arg.key.strip().lower()
            if key in ("", "suffix"):
                value = _normalise_domain(arg.value).lstrip(".")
                if value:
                    suffixes.add(value)
            elif key == "full":
                full.add(_normalise_domain(arg.value))
            elif key == "keyword":
                keyword = arg.value.strip().lower()
                if keyword:
                    keywords.append(keyword)
            elif key == "regex":
                regexes.append(_checked_regex(arg.value, "domain(regex: ...)"))
            elif key in ("geosite", "ext"):
                listed = _geodata(geo).domains(arg.value, ext=key == "ext")
                suffixes.update(listed.suffixes)
                full.update(listed.full)
                keywords.extend(listed.keywords)
                regexes.extend(
                    _checked_regex(r, f"domain({key}: {arg.value.strip()})") for r in listed.regexes
                )
            else:
                raise RouteCompileError(f"domain(...): unknown argument kind {arg.key!r}")
        self._suffixes = frozenset(suffixes)
        self._full = frozenset(full)
        unique = tuple(dict.fromkeys(keywords))
        # a few keywords: `in` each; many: one alternation of literals
        self._keywords = unique if len(unique) <= KEYWORD_SCAN_MAX else ()
        self._keyword_re = re.compile(_trie_pattern(unique)) if len(unique) > KEYWORD_SCAN_MAX else None
        self._regex = (
            re.compile("|".join(f"(?:{r})" for r in dict.fromkeys(regexes)), re.IGNORECASE)
            if regexes
            else None
        )

    def match(self, view: FlowView) -> bool:
        host = view.domain
        if host is None:
            return False
        if host in self._full:
            return True
        if not self._suffixes.isdisjoint(view.domain_suffixes):
            return True
        for keyword in self._keywords:
            if keyword in host:
                return True
        if self._keyword_re is not None and self._keyword_re.search(host) is not None:
            return True
        return self._regex is not None and self._regex.search(host) is not None


KEYWORD_SCAN_MAX = 8  # keywords tested one by one; more are searched as one alternation


def _trie_pattern(words: tuple[str, ...]) -> str:
    """One regular expression matching any of ``words`` (non-empty), factored as a trie: the
    engine tries one branch per character instead of every word at every position (about
    2.5 times faster than a flat alternation of 40 keywords)."""
    trie: dict[str, Any] = {}
    for word in words:
        node = trie
        for ch in word:
            node = node.setdefault(ch, {})
        node[""] = {}  # a word ends here

    def emit(node: dict[str, Any]) -> str:
        branches = [re.escape(ch) + emit(child) for ch, child in sorted(node.items()) if ch]
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        if "" in node:  # a shorter word already matched: what follows is optional
            return f"(?:{body})?"
        return body

    return emit(trie)


def _checked_regex(pattern: str, where: str) -> str:
    try:
        re.compile(pattern, re.IGNORECASE)
    except re.error as exc:
        raise RouteCompileError(f"{where}: invalid regular expression {pattern!r}: {exc}") from None
    return pattern


def _geodata(geo: GeoAssets | None) -> GeoAssets:
    return geo if geo is not None else GeoAssets()


# --- IP sets ---------------------------------------------------------------------


class IPSet:
    """A set of CIDRs as sorted, merged integer intervals per family; lookups bisect."""

    __slots__ = ("_starts", "_ends")

    def __init__(self, networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network]) -> None:
        self._starts: dict[int, list[int]] = {4: [], 6: []}
        self._ends: dict[int, list[int]] = {4: [], 6: []}
        by_version: dict[int, list[tuple[int, int]]] = {4: [], 6: []}
        for net in networks:
            net = _unmap_network(net)
            by_version[net.version].append((int(net.network_address), int(net.broadcast_address)))
        for version, spans in by_version.items():
            spans.sort()
            merged: list[list[int]] = []
            for start, end in spans:
                if merged and start <= merged[-1][1] + 1:
                    merged[-1][1] = max(merged[-1][1], end)
                else:
                    merged.append([start, end])
            self._starts[version] = [s for s, _ in merged]
            self._ends[version] = [e for _, e in merged]

    def __contains__(self, ip: IPAddress) -> bool:
        """``ip`` must already be un-mapped (see :func:`unmap`)."""
        version = ip.version
        starts = self._starts[version]
        value = int(ip)
        i = bisect.bisect_right(starts, value) - 1
        return i >= 0 and value <= self._ends[version][i]

    def __bool__(self) -> bool:
        return bool(self._starts[4] or self._starts[6])


def _unmap_network(
    net: ipaddress.IPv4Network | ipaddress.IPv6Network,
) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    """An IPv6 network inside ``::ffff:0:0/96`` becomes the IPv4 network it maps."""
    if net.version == 6 and net.prefixlen >= 96 and net.subnet_of(_IPV4_MAPPED):  # type: ignore[arg-type]
        low = int(net.network_address) & 0xFFFFFFFF
        return ipaddress.IPv4Network((low, net.prefixlen - 96))
    return net


_PRIVATE_NETWORKS = tuple(ipaddress.ip_network(c) for c in PRIVATE_CIDRS)


class IPMatcher:
    """``dip(...)`` / ``sip(...)``: IPs, CIDRs (host bits tolerated), ``geoip: private`` (built
    in), and the lists of other ``geoip:`` and ``ext:`` codes (read from ``geo``)."""

    __slots__ = ("kind", "needs_dst_ip", "_set", "_outside", "_destination")

    def __init__(self, kind: str, args: tuple[MatchArg, ...], geo: GeoAssets | None = None) -> None:
        self.kind = kind
        self._destination = kind == "dip"
        self.needs_dst_ip = self._destination
        networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
        outside: list[IPSet] = []  # reverse_match lists: an address outside one matches
        for arg in args:
            key = arg.key.strip().lower()
            value = arg.value.strip()
            if key == "":
                try:
                    networks.append(ipaddress.ip_network(value, strict=False))
                except ValueError:
                    raise RouteCompileError(f"{kind}(...): not an IP or CIDR: {value!r}") from None
            elif key == "geoip" and value.lower() == "private":
                networks.extend(_PRIVATE_NETWORKS)
            elif key in ("geoip", "ext"):
                listed = _geodata(geo).networks(value, ext=key == "ext")
                if listed.reverse:
                    outside.append(IPSet(list(listed.networks)))
                else:
                    networks.extend(listed.networks)
            else:
                raise RouteCompileError(f"{kind}(...): unknown argument kind {arg.key!r}")
        self._set = IPSet(networks)
        self._outside = tuple(outside)

    def match(self, view: FlowView) -> bool:
        ip = view.dst_ip if self._destination else view.src_ip
        if ip is None:
            return False
        if ip in self._set:
            return True
        return any(ip not in s for s in self._outside)


# --- ports -----------------------------------------------------------------------


def _parse_port(kind: str, text: str) -> int:
    try:
        port = int(text.strip(), 10)
    except ValueError:
        raise RouteCompileError(f"{kind}(...): not a port: {text!r}") from None
    if not 0 <= port <= 65535:
        raise RouteCompileError(f"{kind}(...): port out of range: {port}")
    return port


class PortMatcher:
    """``dport(...)`` / ``sport(...)``: single ports and inclusive ``start-end`` ranges."""

    __slots__ = ("kind", "needs_dst_ip", "_singles", "_ranges", "_destination")

    def __init__(self, kind: str, args: tuple[MatchArg, ...]) -> None:
        self.kind = kind
        self.needs_dst_ip = False
        self._destination = kind == "dport"
        singles: set[int] = set()
        ranges: list[tuple[int, int]] = []
        for arg in args:
            if arg.key.strip():
                raise RouteCompileError(f"{kind}(...): unknown argument kind {arg.key!r}")
            low_text, sep, high_text = arg.value.strip().partition("-")
            if not sep:
                singles.add(_parse_port(kind, low_text))
                continue
            low, high = _parse_port(kind, low_text), _parse_port(kind, high_text)
            if low > high:
                raise RouteCompileError(f"{kind}(...): empty range {low}-{high}")
            ranges.append((low, high))
        self._singles = frozenset(singles)
        self._ranges = tuple(sorted(ranges))

    def match(self, view: FlowView) -> bool:
        port = view.dport if self._destination else view.sport
        if port in self._singles:
            return True
        for low, high in self._ranges:
            if low <= port <= high:
                return True
        return False


# --- small enumerations ------------------------------------------------------------


class L4ProtoMatcher:
    """``l4proto(tcp, udp)``."""

    kind = "l4proto"
    needs_dst_ip = False
    __slots__ = ("_networks",)

    def __init__(self, args: tuple[MatchArg, ...]) -> None:
        networks: set[Network] = set()
        for arg in args:
            value = arg.value.strip().lower()
            try:
                networks.add(Network(value))
            except ValueError:
                raise RouteCompileError(f"l4proto(...): expected tcp or udp, got {value!r}") from None
        self._networks = frozenset(networks)

    def match(self, view: FlowView) -> bool:
        return view.network in self._networks


_IP_VERSIONS = {"4": 4, "ipv4": 4, "v4": 4, "6": 6, "ipv6": 6, "v6": 6}


class IPVersionMatcher:
    """``ipversion(4, 6)``: the family of the (un-mapped) destination IP."""

    kind = "ipversion"
    needs_dst_ip = True
    __slots__ = ("_versions",)

    def __init__(self, args: tuple[MatchArg, ...]) -> None:
        versions: set[int] = set()
        for arg in args:
            value = arg.value.strip().lower()
            if value not in _IP_VERSIONS:
                raise RouteCompileError(f"ipversion(...): expected 4 or 6, got {value!r}")
            versions.add(_IP_VERSIONS[value])
        self._versions = frozenset(versions)

    def match(self, view: FlowView) -> bool:
        ip = view.dst_ip
        return ip is not None and ip.version in self._versions


class ProcessNameMatcher:
    """``pname(name, ...)``: the host's own flow from a process of one of these names, compared
    as the kernel keeps them (cut to ``COMM_MAX`` characters, case-sensitive, as dae does). A
    flow without a local process (a LAN client, a proxy client elsewhere) never matches."""

    kind = "pname"
    needs_dst_ip = False
    __slots__ = ("_names",)

    def __init__(self, args: tuple[MatchArg, ...]) -> None:
        names = set()
        for arg in args:
            if arg.key.strip():
                raise RouteCompileError(f"pname(...): a process name takes no key, got {arg.key.strip()!r}")
            name = arg.value.strip()
            if not name:
                raise RouteCompileError("pname(...): an empty process name")
            names.add(comm_name(name))
        self._names = frozenset(names)

    def match(self, view: FlowView) -> bool:
        return view.process is not None and view.process in self._names


class UnobservableMatcher:
    """``mac``/``dscp``: honk's listeners cannot observe these, so they never match.

    A negated one therefore always holds.
    """

    needs_dst_ip = False
    __slots__ = ("kind",)

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def match(self, view: FlowView) -> bool:
        return False


# --- entry point -------------------------------------------------------------------


def compile_predicate(predicate: Predicate, geo: GeoAssets | None = None) -> Matcher:
    """Compile one predicate's arguments (alternatives) into a positive matcher; geodata
    codes are read from ``geo`` (None: the default asset directories).

    Raises :class:`RouteCompileError` for an unknown predicate, a malformed
    argument, or a geodata code the data cannot answer.
    """
    name = predicate.name
    args = predicate.args
    try:
        if name == "domain":
            return DomainMatcher(args, geo)
        if name in ("dip", "sip"):
            return IPMatcher(name, args, geo)
    except GeoDataError as exc:
        raise RouteCompileError(f"{describe_predicate(predicate)}: {exc}") from None
    if name in ("dport", "sport"):
        return PortMatcher(name, args)
    if name == "l4proto":
        return L4ProtoMatcher(args)
    if name == "ipversion":
        return IPVersionMatcher(args)
    if name in PROCESS_PREDICATES:
        return ProcessNameMatcher(args)
    if name in UNOBSERVABLE_PREDICATES:
        return UnobservableMatcher(name)
    raise RouteCompileError(f"unknown traffic predicate {name!r}")


def geodata_files(rules: Iterable[RuleSpec]) -> tuple[str, ...]:
    """The geodata files ``rules`` read (``geosite.dat``, ``geoip.dat`` and the MaxMind DBs that
    stand in for it, ``ext:`` files), once each in first-use order; ``geoip: private`` reads none."""
    names: dict[str, None] = {}
    for rule in rules:
        for predicate in rule.predicates:
            for arg in predicate.args:
                key, value = arg.key.strip().lower(), arg.value.strip()
                if key == "geosite":
                    names.setdefault(GEOSITE_FILE)
                elif key == "geoip" and value.lower() != "private":
                    names.setdefault(GEOIP_FILE)
                    for name in GEOIP_MMDB_FILES:  # one appearing or changing changes the answer too
                        names.setdefault(name)
                elif key == "ext":
                    names.setdefault(value.rpartition(":")[0] or value)
    return tuple(names)


def describe_predicate(predicate: Predicate) -> str:
    """Short human text: ``!dport(22,8000-8080)``, ``domain(suffix:ads.example)``."""
    args = ",".join(
        f"{a.key.strip()}:{a.value.strip()}" if a.key.strip() else a.value.strip() for a in predicate.args
    )
    return f"{'!' if predicate.negated else ''}{predicate.name}({args})"
