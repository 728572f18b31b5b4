"""The routing rules the kernel classifier can evaluate, as entries of its rule table. Pure.

The classifier (``datapath.bpf.c``) sees a packet's destination address, destination port,
protocol and family, and walks its table in order: the first matching entry decides. So
it may only hold rules whose every predicate is about those facts (``dip`` CIDRs,
``dport`` ports and ranges, ``l4proto``, ``ipversion``; negated ports, protocols and
versions too, as their complements), and only the *prefix* of the rule list before the
first rule it cannot evaluate: a packet that matches no entry passes to userspace, which
routes it from the top, so a later rule can never win over an earlier userspace-only one.

Each rule expands to the product of its alternatives (CIDRs x port ranges x protocol),
all with the rule's order. A rule whose expansion does not fit under
:data:`KERNEL_RULES_MAX` ends the table before it. An entry's target is the group's
ordinal in the slot layout, or :data:`NOT_A_GROUP` (``direct``, ``block``, a node), which
the classifier always passes.

Destinations honk never intercepts (the nftables bypass: private, loopback, link-local,
multicast and broadcast ranges) come first as pass entries, so a rule such as
``l4proto(udp) -> g`` cannot drop DHCP or LAN traffic that userspace never sees.
"""

from __future__ import annotations

import ipaddress
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from honk.config.spec import MatchArg, Predicate, RoutingSpec, RuleSpec
from honk.ebpf.slots import GroupLayout
from honk.netlink.nftables import BYPASS_V4, BYPASS_V6
from honk.route.matchers import PRIVATE_CIDRS

KERNEL_RULES_MAX = 128  # entries in one bank of the classifier's table (HONK_RULES_MAX)
NOT_A_GROUP = 0xFFFFFFFF  # the classifier passes entries with this target
BYPASS_ORDER = -1  # the order of the bypass entries, ahead of every rule

FAMILY_ANY, FAMILY_V4, FAMILY_V6 = 0, 4, 6
L4_ANY, L4_TCP, L4_UDP = 0, 6, 17  # IPPROTO_*
PORT_MIN, PORT_MAX = 0, 65535

DEFAULT_BYPASS = (*BYPASS_V4, *BYPASS_V6)
RULE_STRUCT = struct.Struct("=16s16sBBBBHHI")  # struct honk_rule, 44 bytes

_L4 = {"tcp": L4_TCP, "udp": L4_UDP}
_IP_VERSIONS = {
    "4": FAMILY_V4,
    "ipv4": FAMILY_V4,
    "v4": FAMILY_V4,
    "6": FAMILY_V6,
    "ipv6": FAMILY_V6,
    "v6": FAMILY_V6,
}
_IPV4_MAPPED = ipaddress.ip_network("::ffff:0:0/96")

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True, slots=True)
class KernelRule:
    """One entry: ``network`` None matches any address of ``family`` (FAMILY_ANY: both)."""

    order: int  # the routing rule's index (BYPASS_ORDER for the bypass)
    family: int
    network: IPNetwork | None
    l4proto: int
    dport_low: int
    dport_high: int
    target: int

    @property
    def prefix_len(self) -> int:
        return self.network.prefixlen if self.network is not None else 0

    def pack(self) -> bytes:
        """The entry as the classifier's ``struct honk_rule`` (addresses in network order)."""
        if self.network is None:
            addr = mask = bytes(16)
        else:
            addr = self.network.network_address.packed.ljust(16, b"\0")
            mask = self.network.netmask.packed.ljust(16, b"\0")
        return RULE_STRUCT.pack(
            addr,
            mask,
            self.family,
            self.prefix_len,
            self.l4proto,
            0,
            self.dport_low,
            self.dport_high,
            self.target,
        )


@dataclass(frozen=True, slots=True)
class KernelTable:
    """The compiled table: ``rules`` routing rules made it (a prefix), ``stopped`` says why
    the next did not (None: all of them)."""

    entries: tuple[KernelRule, ...]
    rules: int
    stopped: str | None = None


class _NotExpressible(Exception):
    """A predicate the classifier cannot evaluate."""


def compile_kernel_rules(
    routing: RoutingSpec,
    layout: GroupLayout,
    *,
    bypass: Iterable[str] = DEFAULT_BYPASS,
    limit: int = KERNEL_RULES_MAX,
) -> KernelTable:
    """The kernel table for ``routing``: the bypass, then the expressible prefix of the rules."""
    entries = [
        KernelRule(BYPASS_ORDER, net.version, net, L4_ANY, PORT_MIN, PORT_MAX, NOT_A_GROUP)
        for net in (_unmap(ipaddress.ip_network(c, strict=False)) for c in bypass)
    ]
    if len(entries) > limit:
        return KernelTable((), 0, f"the bypass alone needs {len(entries)} entries (limit {limit})")
    ordinals = {name: i for i, name in enumerate(layout.groups)}
    for order, rule in enumerate(routing.rules):
        try:
            expanded = _expand_rule(order, rule, ordinals.get(rule.outbound, NOT_A_GROUP))
        except _NotExpressible as exc:
            return KernelTable(tuple(entries), order, f"rule {order}: {exc}")
        if len(entries) + len(expanded) > limit:
            return KernelTable(
                tuple(entries),
                order,
                f"rule {order}: {len(expanded)} entries would pass the limit of {limit}",
            )
        entries.extend(expanded)
    return KernelTable(tuple(entries), len(routing.rules))


def _expand_rule(order: int, rule: RuleSpec, target: int) -> list[KernelRule]:
    """The entries of one rule (possibly none: it never matches); raises _NotExpressible."""
    families = {FAMILY_V4, FAMILY_V6}
    protocols = {L4_TCP, L4_UDP}
    ports: list[tuple[int, int]] = [(PORT_MIN, PORT_MAX)]
    networks: list[IPNetwork] | None = None
    for predicate in rule.predicates:
        name = predicate.name
        if name == "dip":
            if predicate.negated:
                raise _NotExpressible("a negated dip(...)")
            found = _networks(predicate.args)
            networks = found if networks is None else _intersect_networks(networks, found)
        elif name == "dport":
            ranges = _port_ranges(predicate.args)
            if predicate.negated:
                ranges = _complement(ranges)
            ports = _intersect(ports, ranges)
        elif name == "l4proto":
            chosen = _choices(predicate, _L4, "l4proto")
            protocols &= ({L4_TCP, L4_UDP} - chosen) if predicate.negated else chosen
        elif name == "ipversion":
            chosen = _choices(predicate, _IP_VERSIONS, "ipversion")
            families &= ({FAMILY_V4, FAMILY_V6} - chosen) if predicate.negated else chosen
        else:
            raise _NotExpressible(f"{name}(...) is decided in userspace")
    if not families or not protocols or not ports:
        return []
    l4proto = L4_ANY if len(protocols) == 2 else next(iter(protocols))
    if networks is None:
        family = FAMILY_ANY if len(families) == 2 else next(iter(families))
        places: list[tuple[int, IPNetwork | None]] = [(family, None)]
    else:
        places = [(n.version, n) for n in _dedupe(networks) if n.version in families]
    return [
        KernelRule(order, family, net, l4proto, low, high, target)
        for family, net in places
        for low, high in ports
    ]


def _networks(args: Sequence[MatchArg]) -> list[IPNetwork]:
    """A dip(...)'s CIDRs as the router reads them: literals and ``geoip: private``; a geodata
    list (another ``geoip:`` code, ``ext:``) is decided in userspace, by the router's matcher."""
    out: list[IPNetwork] = []
    for arg in args:
        key, value = arg.key.strip().lower(), arg.value.strip()
        if key == "":
            try:
                out.append(_unmap(ipaddress.ip_network(value, strict=False)))
            except ValueError:
                raise _NotExpressible(f"dip({value}) is not a CIDR") from None
        elif key == "geoip" and value.lower() == "private":
            out.extend(ipaddress.ip_network(c) for c in PRIVATE_CIDRS)
        else:
            raise _NotExpressible(f"dip({arg.key}: ...) is decided in userspace")
    return out


def _intersect_networks(a: list[IPNetwork], b: list[IPNetwork]) -> list[IPNetwork]:
    """Two dip(...) in one rule: two CIDRs are nested or disjoint, so the intersection is the
    smaller of each nested pair."""
    out = []
    for x in a:
        for y in b:
            if x.version == y.version and (x.subnet_of(y) or y.subnet_of(x)):  # type: ignore[arg-type]
                out.append(x if x.prefixlen >= y.prefixlen else y)
    return out


def _dedupe(networks: list[IPNetwork]) -> list[IPNetwork]:
    seen: dict[IPNetwork, None] = {}
    for net in networks:
        seen.setdefault(net)
    return list(seen)


def _unmap(net: IPNetwork) -> IPNetwork:
    """An IPv4-mapped IPv6 network is the IPv4 network (the router un-maps addresses too)."""
    if net.version == 6 and net.prefixlen >= 96 and net.subnet_of(_IPV4_MAPPED):  # type: ignore[arg-type]
        return ipaddress.IPv4Network((int(net.network_address) & 0xFFFFFFFF, net.prefixlen - 96))
    return net


def _port_ranges(args: Sequence[MatchArg]) -> list[tuple[int, int]]:
    ranges = []
    for arg in args:
        if arg.key.strip():
            raise _NotExpressible(f"dport({arg.key}: ...) is decided in userspace")
        low_text, sep, high_text = arg.value.strip().partition("-")
        try:
            low = int(low_text, 10)
            high = int(high_text, 10) if sep else low
        except ValueError:
            raise _NotExpressible(f"dport({arg.value}) is not a port") from None
        if not PORT_MIN <= low <= high <= PORT_MAX:
            raise _NotExpressible(f"dport({arg.value}) is not a port range")
        ranges.append((low, high))
    return _merge(ranges)


def _merge(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for low, high in sorted(ranges):
        if out and low <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], high))
        else:
            out.append((low, high))
    return out


def _complement(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out, start = [], PORT_MIN
    for low, high in ranges:
        if low > start:
            out.append((start, low - 1))
        start = high + 1
    if start <= PORT_MAX:
        out.append((start, PORT_MAX))
    return out


def _intersect(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out = []
    for low_a, high_a in a:
        for low_b, high_b in b:
            low, high = max(low_a, low_b), min(high_a, high_b)
            if low <= high:
                out.append((low, high))
    return _merge(out)


def _choices(predicate: Predicate, names: dict[str, int], kind: str) -> set[int]:
    chosen = set()
    for arg in predicate.args:
        value = arg.value.strip().lower()
        if value not in names:
            raise _NotExpressible(f"{kind}({value}) is not understood here")
        chosen.add(names[value])
    return chosen
