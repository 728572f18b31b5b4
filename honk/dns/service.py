"""The DNS service: one query in, one reply out, for every ingress.

::

    query bytes ─► wire.parse_query        malformed: FORMERR / NOTIMP from the raw header, or dropped
                ─► RequestRouter.decide     reject → empty NOERROR; asis → the intercepted destination
                ─► DnsCache.get             key (qname, qtype, qclass, upstream or asis destination)
                ─► Exchanger.exchange       (a miss; identical misses in flight share one exchange)
                ─► response fallback        accept, or reject → empty NOERROR
                ─► cache, learn, render     the client's id and question, TTLs = lifetime left

The standalone listener (``listener.py``) and the transparent inbound both
call :meth:`DnsService.handle`. Nothing raises out of it: a failed exchange is
SERVFAIL, an unexpected error is logged with its traceback and answered
SERVFAIL too.

Cache lifetimes: a positive answer lives ``fixed_domain_ttl`` of its name if
set (0: never cached), else ``optimistic_cache_ttl`` (0: the answer's lowest
TTL); a negative one (NXDOMAIN, NODATA) lives its SOA's negative TTL, 1..300
s. The lifetime is written into every record the client receives, on a miss
and (as the time left) on every hit. ``optimistic_cache: false`` turns all of
that off: replies pass through as the upstream sent them.

The cache and the learned names are objects of their own, so a reload keeps
them: :meth:`DnsService.rebuilt` makes the next configuration's service over
the same learning, and over the same cache minus the entries of upstreams
whose definition changed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Hashable, Mapping

import dns.message
import dns.rcode

from honk.config.spec import DnsSpec, DnsUpstreamSpec
from honk.connection.dispatch import Dispatcher
from honk.core.clock import Clock
from honk.core.net import Address, IPAddress
from honk.daemon.logs import kv
from honk.dns import wire
from honk.dns.cache import CacheKey, DnsCache
from honk.dns.learning import DomainLearning
from honk.dns.rules import RequestRouter
from honk.dns.upstream import EXCHANGE_TIMEOUT, Destination, ExchangeFailed, Exchanger

__all__ = ["MAX_QUERIES_IN_FLIGHT", "DnsService"]

log = logging.getLogger("honk.dns")

# Queries answered at once; beyond this a query is REFUSED at once rather than queued
# behind a stalled upstream (upstream honk's 2,048-query permit).
MAX_QUERIES_IN_FLIGHT = 2048


class _Outcome:
    """What one exchange produced, shared by the queries that waited for it."""

    __slots__ = ("wire", "lifetime")

    def __init__(self, wire: bytes | None, lifetime: int | None) -> None:
        self.wire = wire  # the reply, TTLs already set to ``lifetime`` when it has one; None: rejected
        self.lifetime = lifetime  # seconds it is cached for; None: not cached, TTLs as sent


class DnsService:
    def __init__(self, spec: DnsSpec, dispatcher: Dispatcher, clock: Clock, *, cache: DnsCache | None = None,
                 learning: DomainLearning | None = None, exchange_timeout: float = EXCHANGE_TIMEOUT,
                 exchanger: Exchanger | None = None) -> None:
        """``cache`` and ``learning``: carried over from the previous service (see :meth:`rebuilt`);
        new ones by default. The cache is resized to ``spec.max_cache_size``. ``exchanger``:
        what talks to upstreams (tests pass a fake); default one over ``dispatcher``."""
        self.spec = spec
        self._dispatcher = dispatcher
        self._clock = clock
        if cache is None:
            cache = DnsCache(clock, spec.max_cache_size)
        elif cache.max_entries != spec.max_cache_size:
            cache.resize(spec.max_cache_size)
        self.cache = cache
        self.learning = learning if learning is not None else DomainLearning(clock)
        self._router = RequestRouter(spec.request_rules, spec.request_fallback)
        self._upstreams: Mapping[str, DnsUpstreamSpec] = {u.name: u for u in spec.upstreams}
        self._fixed = dict(spec.fixed_domain_ttl)
        self._exchanger = exchanger if exchanger is not None else Exchanger(dispatcher, clock, exchange_timeout)
        self._flights: dict[CacheKey, asyncio.Task[_Outcome]] = {}
        self._failing: set[str] = set()  # upstreams in a failure streak (told at info once per streak)
        self._in_flight = 0

    def rebuilt(self, spec: DnsSpec) -> DnsService:
        """The service for ``spec`` over this one's learning and cache; cached answers of an
        upstream whose definition changed or went away are dropped (asis answers stay)."""
        same = {name for name, u in self._upstreams.items() if spec.upstream(name) == u}
        self.cache.retain(lambda scope: not isinstance(scope, str) or scope in same)
        return DnsService(spec, self._dispatcher, self._clock, cache=self.cache, learning=self.learning,
                          exchanger=self._exchanger)

    def learned_names(self, ip: IPAddress | str) -> tuple[str, ...]:
        """The live names ``ip`` was given out for (see :class:`DomainLearning`)."""
        return self.learning.learned_names(ip)

    async def handle(self, query: bytes, client: Address | None, original: Address | None, *,
                     tcp: bool = False) -> bytes | None:
        """The reply to ``query`` (None: drop it). ``client`` is the asking socket's peer;
        ``original`` the intercepted destination (None for the standalone listener, where
        ``asis`` fails); ``tcp``: the query came over TCP (no UDP size limit, and ``asis``
        asks over TCP)."""
        if self._in_flight >= MAX_QUERIES_IN_FLIGHT:
            log.debug("dns query refused %s", kv(reason="overloaded", client=client))
            return wire.header_reply(query, dns.rcode.REFUSED)
        self._in_flight += 1
        try:
            return await self._handle(query, client, original, tcp)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - one query never takes the service down
            log.exception("dns query failed unexpectedly %s", kv(client=client))
            return wire.header_reply(query, dns.rcode.SERVFAIL)
        finally:
            self._in_flight -= 1

    async def _handle(self, raw: bytes, client: Address | None, original: Address | None,
                      tcp: bool) -> bytes | None:
        parsed = wire.parse_query(raw)
        if not isinstance(parsed, wire.DnsQuery):
            log.debug("dns query malformed %s", kv(client=client, size=len(raw),
                                                  answer="dropped" if parsed is None else "error"))
            return parsed
        query = parsed
        action = self._router.decide(query.qname, query.qtype)
        if action == "reject":
            log.debug("dns query rejected %s", kv(name=query.qname, qtype=query.qtype, client=client))
            return wire.reply_to(query)
        destination = self._destination(action, original, tcp)
        if destination is None:
            log.debug("dns query failed %s", kv(name=query.qname, upstream=action, reason="no-destination"))
            return wire.reply_to(query, dns.rcode.SERVFAIL)
        scope: Hashable = action if action != "asis" else ("asis", original)
        key: CacheKey = (query.qname, query.qtype, query.qclass, scope)
        if self.spec.optimistic_cache:
            hit = self.cache.get(key)
            if hit is not None:
                return self._send(dns.message.from_wire(hit.wire), query, hit.ttl, tcp)
        try:
            outcome = await self._shared(key, destination, query, raw, client, tcp)
        except ExchangeFailed:
            return wire.reply_to(query, dns.rcode.SERVFAIL)
        if outcome.wire is None:
            return wire.reply_to(query)
        return self._send(dns.message.from_wire(outcome.wire), query, None, tcp)

    def _destination(self, action: str, original: Address | None, tcp: bool) -> Destination | None:
        if action == "asis":
            if original is None:
                return None
            return Destination("asis", "tcp" if tcp else "udp", original)
        upstream = self._upstreams.get(action)
        if upstream is None:  # the config checks every action; a hand-built spec may not
            return None
        return Destination(upstream.name, upstream.protocol, Address(upstream.host, upstream.port),
                           upstream.outbound)

    async def _shared(self, key: CacheKey, destination: Destination, query: wire.DnsQuery, raw: bytes,
                      client: Address | None, tcp: bool) -> _Outcome:
        """The outcome of one exchange for ``key``; a query that finds one in flight waits for it
        (shielded: a client giving up does not cancel the others' answer)."""
        flight = self._flights.get(key)
        if flight is None:
            flight = asyncio.get_running_loop().create_task(
                self._exchange(key, destination, query, raw, client, tcp), name="honk-dns-exchange")
            self._flights[key] = flight
            flight.add_done_callback(lambda done: self._landed(key, done))
        return await asyncio.shield(flight)

    def _landed(self, key: CacheKey, flight: asyncio.Task[_Outcome]) -> None:
        if self._flights.get(key) is flight:
            del self._flights[key]
        if not flight.cancelled():
            flight.exception()  # retrieved: every waiter may have given up already

    async def aclose(self) -> None:
        """Cancel the exchanges in flight (their waiters get SERVFAIL-free cancellation)."""
        flights = list(self._flights.values())
        for flight in flights:
            flight.cancel()
        await asyncio.gather(*flights, return_exceptions=True)

    async def _exchange(self, key: CacheKey, destination: Destination, query: wire.DnsQuery, raw: bytes,
                        client: Address | None, tcp: bool) -> _Outcome:
        try:
            reply = await self._exchanger.exchange(destination, query.message, raw, client, tcp=tcp)
        except ExchangeFailed as exc:
            self._failed(destination, query, exc)
            raise
        if destination.label in self._failing:
            self._failing.discard(destination.label)
            log.info("dns upstream answering again %s", kv(upstream=destination.label))
        if self.spec.response_fallback == "reject":
            log.debug("dns reply rejected %s", kv(name=query.qname, upstream=destination.label))
            return _Outcome(None, None)
        lifetime = self._lifetime(query.qname, reply) if self.spec.optimistic_cache else None
        if lifetime is not None:
            wire.set_ttls(reply, lifetime)
        data = reply.to_wire()
        if lifetime:
            self.cache.put(key, data, lifetime)
        return _Outcome(data, lifetime)

    def _failed(self, destination: Destination, query: wire.DnsQuery, exc: ExchangeFailed) -> None:
        log.debug("dns exchange failed %s", kv(name=query.qname, upstream=destination.label,
                                               server=destination.address, reason=exc.reason, error=str(exc)))
        if destination.label not in self._failing:
            self._failing.add(destination.label)
            log.info("dns upstream failing %s", kv(upstream=destination.label, server=destination.address,
                                                   reason=exc.reason))

    def _lifetime(self, qname: str, reply: dns.message.Message) -> int | None:
        """Seconds to cache ``reply`` for (its TTLs become that); None: not cacheable."""
        verdict = wire.classify(reply)
        if verdict == wire.Verdict.OTHER:
            return None
        fixed = self._fixed.get(qname)
        if fixed is not None:
            return fixed or None
        if verdict == wire.Verdict.NEGATIVE:
            return wire.negative_ttl(reply)
        return self.spec.optimistic_cache_ttl or wire.min_answer_ttl(reply) or None

    def _send(self, reply: dns.message.Message, query: wire.DnsQuery, ttl: int | None, tcp: bool) -> bytes:
        """Render ``reply`` for this client (``ttl``: the cache's time left, written into every
        record) and learn its addresses at the TTLs it carries."""
        if ttl is not None:
            wire.set_ttls(reply, ttl)
        for ip, owner, record_ttl in wire.address_records(reply):
            self.learning.record(ip, (query.qname, owner) if owner != query.qname else (query.qname,),
                                 record_ttl)
        return wire.render(reply, query, tcp=tcp)
