"""dae's ``sub()``/``node()``/``subnode()``: which upstream resolves the daemon's own lookups.

honk looks up two kinds of names for itself: a node's server (``proxy.example.com`` in a
share link) and a subscription URL's host. Without a rule both go to the system resolver.
A router whose system resolver is the DNS service itself, or whose ISP resolver lies about
the provider's names, needs those lookups sent elsewhere; dae lets the ``dns.routing.request``
block pick a declared upstream for them (docs/en/configuration/dns.md). The matching is dae's
(component/daedns/router.go):

* a rule holds calls of one selector joined by ``&&``; every call must match;
* a call's arguments are alternatives (across keys too); ``!`` negates the call; a call
  without arguments matches everything it can see;
* ``subnode`` rules are tried first, and only for a node that came from a subscription;
  then the ``node`` rules; ``sub`` rules only for subscription fetches;
* the first matching rule names the upstream; no match means no rule applies (the ordinary
  resolver, never the request fallback).

A chosen upstream is asked A and AAAA through :class:`honk.dns.upstream.Exchanger`, i.e.
through honk's routing (or the upstream's ``-> tag``) like any of the DNS service's
exchanges, and the answer reaches no cache: it is the daemon's lookup, not a client's.
:class:`UpstreamResolver` keeps the resolver contract of :mod:`honk.route.resolve` (an IP
literal returned as is; distinct addresses, IPv4 first as glibc orders them without a
global IPv6 route; :class:`ResolveError`, or :class:`ResolveTimeout` once its deadline on the
injected clock passes), so :class:`~honk.outbound.direct.DirectOutbound` needs no change.

The matching half imports no dnspython: the desired state reads it for every load (a node's
chosen upstream is part of its build identity, so a reload that changes it rebuilds the
node). dnspython and the exchanger load only when a resolver is asked.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

from honk.config.spec import (
    DnsOwnCall,
    DnsOwnRule,
    DnsSpec,
    DnsUpstreamSpec,
    MatchArg,
    NodeSpec,
    SubscriptionSpec,
)
from honk.core.clock import Clock, timeout_at
from honk.core.net import Address, IPAddress, is_ip_literal
from honk.route.resolve import ResolveError, Resolver, ResolveTimeout

if TYPE_CHECKING:
    from honk.dns.upstream import Exchanger

__all__ = ["OwnLookups", "UpstreamResolver", "node_upstream", "own_lookups", "subscription_upstream"]

SUB, NODE, SUBNODE = "sub", "node", "subnode"
TYPE_A, TYPE_AAAA = 1, 28  # RFC 1035 §3.2.2, RFC 3596 §2.1
QUESTION_ORDER = (TYPE_A, TYPE_AAAA)  # IPv4 first: glibc's order on a host without a global IPv6 route
TIMEOUT_REASON = "timeout"  # ExchangeFailed's reason for a passed deadline (honk.dns.failure)


# --- matching -----------------------------------------------------------------------------


def _arg_matches(arg: MatchArg, fields: dict[str, str]) -> bool:
    """One argument against the looked-up thing's fields (``tag``/``link`` or ``name``/``subtag``)."""
    kind, _, how = arg.key.partition("_")
    value = fields[kind]
    if how == "keyword":
        return arg.value in value
    if how == "regex":
        return re.search(arg.value, value) is not None
    return value == arg.value


def _call_matches(call: DnsOwnCall, fields: dict[str, str]) -> bool:
    matched = not call.args or any(_arg_matches(a, fields) for a in call.args)
    return matched != call.negated


def _first(rules: Iterable[DnsOwnRule], selector: str, fields: dict[str, str]) -> str | None:
    for rule in rules:
        if rule.selector == selector and all(_call_matches(c, fields) for c in rule.calls):
            return rule.upstream
    return None


def node_upstream_name(rules: Iterable[DnsOwnRule], node: NodeSpec) -> str | None:
    """The upstream the rules pick for ``node``'s server name: a ``subnode`` rule for a node from a
    subscription, else a ``node`` rule; None when none matches."""
    rules = tuple(rules)
    fields = {"name": node.name, "subtag": node.subscription, "link": node.link}
    if node.subscription:
        chosen = _first(rules, SUBNODE, fields)
        if chosen is not None:
            return chosen
    return _first(rules, NODE, fields)


def node_upstream(dns: DnsSpec | None, node: NodeSpec) -> DnsUpstreamSpec | None:
    """The declared upstream that resolves ``node``'s server (None: the ordinary resolver). A node
    whose server is an IP literal looks nothing up, so it has none."""
    if dns is None or not dns.own_rules or not node.host or is_ip_literal(node.host):
        return None
    name = node_upstream_name(dns.own_rules, node)
    return dns.upstream(name) if name is not None else None


def subscription_upstream(dns: DnsSpec | None, subscription: SubscriptionSpec) -> DnsUpstreamSpec | None:
    """The declared upstream a ``sub`` rule picks for fetching ``subscription`` (tested on its tag
    and its URL, dae's ``link``); None: the ordinary resolver."""
    if dns is None or not dns.own_rules:
        return None
    name = _first(dns.own_rules, SUB, {"tag": subscription.name, "link": subscription.url})
    return dns.upstream(name) if name is not None else None


# --- resolving ----------------------------------------------------------------------------


class UpstreamResolver:
    """A :data:`~honk.route.resolve.Resolver` asking one declared upstream for A and AAAA.

    Each call is bounded by ``timeout`` seconds on ``clock``; A and AAAA are asked at once."""

    def __init__(self, upstream: DnsUpstreamSpec, exchanger: Exchanger, clock: Clock, timeout: float) -> None:
        self.upstream = upstream
        self._exchanger = exchanger
        self._clock = clock
        self._timeout = timeout

    def __repr__(self) -> str:
        return f"UpstreamResolver(upstream={self.upstream.name!r})"

    async def __call__(self, host: str) -> list[IPAddress]:
        if is_ip_literal(host):
            return [ipaddress.ip_address(host)]
        try:
            async with timeout_at(self._clock, self._clock.now() + self._timeout):
                outcomes = await asyncio.gather(
                    *(self._ask(host, rdtype) for rdtype in QUESTION_ORDER), return_exceptions=True
                )
        except TimeoutError:
            raise ResolveTimeout(
                host, f"upstream {self.upstream.name}: no answer within {self._timeout:g}s"
            ) from None
        seen: dict[IPAddress, None] = {}
        failures: list[BaseException] = []
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                if not isinstance(outcome, Exception):
                    raise outcome  # cancellation and the like are not a lookup's failure
                failures.append(outcome)
                continue
            for ip in outcome:
                seen.setdefault(ip, None)
        if seen:
            return list(seen)
        if failures:
            first = failures[0]
            if all(getattr(f, "reason", None) == TIMEOUT_REASON for f in failures):
                raise ResolveTimeout(host, f"upstream {self.upstream.name}: {first}")
            if isinstance(first, ResolveError):
                raise first
            raise ResolveError(host, f"upstream {self.upstream.name}: {first}")
        raise ResolveError(host, f"upstream {self.upstream.name}: no IPv4 or IPv6 address")

    async def _ask(self, host: str, rdtype: int) -> list[IPAddress]:
        """The ``rdtype`` addresses of ``host`` in the upstream's answer (any owner: a CNAME chain's
        target included, as getaddrinfo follows it). Raises ExchangeFailed or ResolveError."""
        import dns.exception
        import dns.message
        import dns.rcode

        from honk.dns.upstream import Destination

        try:
            query = dns.message.make_query(host, rdtype)
        except (dns.exception.DNSException, ValueError) as exc:
            raise ResolveError(host, f"not a valid DNS name: {exc}") from None
        u = self.upstream
        destination = Destination(u.name, u.protocol, Address(u.host, u.port), u.outbound)
        reply = await self._exchanger.exchange(destination, query, query.to_wire(), None)
        rcode = reply.rcode()
        if rcode != dns.rcode.NOERROR:
            raise ResolveError(host, f"upstream {u.name}: {dns.rcode.to_text(rcode)}")
        return [
            ipaddress.ip_address(rd.address)
            for rrset in reply.answer
            if rrset.rdtype == rdtype
            for rd in rrset
        ]


class OwnLookups:
    """The resolvers ``dns``'s ``sub``/``node``/``subnode`` rules give, over one exchanger
    (the DNS service's: its encrypted upstreams' connections are shared and closed with it)."""

    def __init__(self, dns: DnsSpec, exchanger: Exchanger, clock: Clock, timeout: float) -> None:
        self.dns = dns
        self._exchanger = exchanger
        self._clock = clock
        self.timeout = timeout  # seconds each lookup may take

    def resolver(self, upstream: DnsUpstreamSpec | None) -> Resolver | None:
        """A resolver over ``upstream`` (None for None)."""
        if upstream is None:
            return None
        return UpstreamResolver(upstream, self._exchanger, self._clock, self.timeout)

    def for_node(self, node: NodeSpec) -> Resolver | None:
        """The resolver of ``node``'s server name; None: no rule selects it (the ordinary one)."""
        return self.resolver(node_upstream(self.dns, node))

    def for_subscription(self, subscription: SubscriptionSpec) -> Resolver | None:
        """The resolver of ``subscription``'s URL host; None: no rule selects it."""
        return self.resolver(subscription_upstream(self.dns, subscription))


def own_lookups(dns: DnsSpec | None, service: object, clock: Clock, timeout: float) -> OwnLookups | None:
    """The resolvers of ``dns``'s rules over the running DNS service's exchanger (None: no rules,
    or no service yet). Sharing it, rather than building an exchanger per apply, keeps one set of
    upstream connections (DoT/DoH/DoQ) that the service chain closes when it ends; the service
    keeps the exchanger across rebuilds, so resolvers of reused leaves stay valid."""
    if dns is None or not dns.own_rules or service is None:
        return None
    exchanger = service.exchanger
    return OwnLookups(dns, exchanger, clock, timeout)
