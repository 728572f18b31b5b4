"""DNS routing: the first rule whose conditions all hold picks the action.

Request rules run on the query (its name, type and client) and pick ``reject``,
``asis`` or an upstream; response rules run on an upstream's answer (the
query's name and type, the upstream that answered, the answer's addresses)
and pick ``accept``, ``reject`` or another upstream to ask (dae's
docs/en/configuration/dns.md). Conditions are ANDed; a condition's arguments
are ORed; ``!`` negates one condition.

The matching is routing's own, so a name or an address means the same in a
DNS rule as in a traffic rule: ``qname(...)`` is a
:class:`~honk.route.matchers.DomainMatcher` (suffixes on a label boundary,
``full``, ``keyword``, ``regex``, ``geosite:`` lists with ``@attr``, ``ext:``),
``ip(...)`` and ``sip(...)`` are :class:`~honk.route.matchers.IPMatcher` s
(addresses, CIDRs, ``geoip:``, ``ext:``). Geodata comes from the
:class:`~honk.geo.assets.GeoAssets` the router reads, so a list is loaded
once for both. A ``sip`` condition whose client is unknown is false, negated
or not (upstream honk's rule), so an internal query never matches by source.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from honk.config.spec import DNS_QTYPE_ANY, DnsCondition, DnsRequestRule, DnsResponseRule
from honk.core.net import Address, FlowMeta, IPAddress, Network
from honk.geo.assets import GeoAssets
from honk.route.matchers import DomainMatcher, FlowView, IPMatcher

__all__ = ["DnsQuestion", "RequestRouter", "ResponseRouter", "condition_holds"]

DNS_INBOUND = "dns"  # the inbound a DNS rule's flow view is built for (no matcher reads it)
_NO_CLIENT = Address("0.0.0.0", 0)  # stands in for an unknown client; sip never reads it (see below)


class DnsQuestion:
    """One query as the rules see it: the routing view of its name and client, built once."""

    __slots__ = ("qname", "qtype", "client_known", "view")

    def __init__(self, qname: str, qtype: int, client: IPAddress | str | None = None) -> None:
        self.qname = qname
        self.qtype = qtype
        self.client_known = client is not None
        source = Address(str(client), 0) if client is not None else _NO_CLIENT
        self.view = FlowView.of(FlowMeta(Network.UDP, source, Address(qname or ".", 0), DNS_INBOUND))


class _Compiled:
    """One condition with its matcher built (``qname``/``ip``/``sip``) or its set (``qtype``/``upstream``)."""

    __slots__ = ("kind", "negated", "matcher", "values")

    def __init__(self, condition: DnsCondition, geo: GeoAssets | None) -> None:
        self.kind = condition.kind
        self.negated = condition.negated
        self.matcher: DomainMatcher | IPMatcher | None = None
        self.values: frozenset[object] = frozenset()
        if self.kind == "qname":
            self.matcher = DomainMatcher(condition.names, geo)
        elif self.kind in ("ip", "sip"):
            self.matcher = IPMatcher("dip" if self.kind == "ip" else "sip", condition.ips, geo)
        elif self.kind == "qtype":
            self.values = frozenset(condition.qtypes)
        else:  # upstream
            self.values = frozenset(condition.upstreams)

    def holds(self, question: DnsQuestion, upstream: str | None, addresses: Sequence[IPAddress]) -> bool:
        kind = self.kind
        if kind == "sip" and not question.client_known:
            return False
        if kind == "qtype":
            hit = DNS_QTYPE_ANY in self.values or question.qtype in self.values
        elif kind == "upstream":
            hit = upstream in self.values
        elif kind == "ip":
            assert self.matcher is not None
            view = question.view
            hit = any(self.matcher.match(dataclasses.replace(view, dst_ip=ip)) for ip in addresses)
        else:  # qname, sip
            assert self.matcher is not None
            hit = self.matcher.match(question.view)
        return hit != self.negated


def condition_holds(
    condition: DnsCondition,
    qname: str,
    qtype: int,
    *,
    client: IPAddress | str | None = None,
    upstream: str | None = None,
    addresses: Sequence[IPAddress] = (),
    geo: GeoAssets | None = None,
) -> bool:
    """One condition on its own (compiled for the call; the routers compile theirs once)."""
    return _Compiled(condition, geo).holds(DnsQuestion(qname, qtype, client), upstream, addresses)


class _Rules:
    def __init__(
        self, rules: Sequence[DnsRequestRule | DnsResponseRule], fallback: str, geo: GeoAssets | None
    ) -> None:
        self._rules = tuple(
            (tuple(_Compiled(c, geo) for c in rule.conditions), rule.action) for rule in rules
        )
        self.fallback = fallback

    def _decide(self, question: DnsQuestion, upstream: str | None, addresses: Sequence[IPAddress]) -> str:
        for conditions, action in self._rules:
            if all(c.holds(question, upstream, addresses) for c in conditions):
                return action
        return self.fallback


class RequestRouter(_Rules):
    """The compiled request rules of one DNS spec. Raises RouteCompileError when a geodata code
    cannot be answered (``honk check`` refuses such a file first)."""

    def __init__(self, rules: Sequence[DnsRequestRule], fallback: str, geo: GeoAssets | None = None) -> None:
        super().__init__(rules, fallback, geo)

    def decide(self, question: DnsQuestion | str, qtype: int | None = None) -> str:
        """``reject``, ``asis`` or an upstream name (``decide(qname, qtype)`` for a query
        without a client)."""
        if not isinstance(question, DnsQuestion):
            question = DnsQuestion(question, qtype if qtype is not None else DNS_QTYPE_ANY)
        return self._decide(question, None, ())


class ResponseRouter(_Rules):
    """The compiled response rules of one DNS spec."""

    def __init__(self, rules: Sequence[DnsResponseRule], fallback: str, geo: GeoAssets | None = None) -> None:
        super().__init__(rules, fallback, geo)

    def decide(self, question: DnsQuestion, upstream: str, addresses: Sequence[IPAddress]) -> str:
        """``accept``, ``reject`` or the upstream to ask instead, for the answer ``upstream``
        gave with these A/AAAA ``addresses``."""
        return self._decide(question, upstream, addresses)
