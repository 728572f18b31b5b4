"""The DNS service: one query in, one reply out, for every ingress.

::

    query bytes ─► wire.parse_query        malformed: FORMERR / NOTIMP from the raw header, or dropped
                ─► RequestRouter.decide     reject → empty NOERROR; asis → the intercepted destination
                ─► ipversion_prefer         the other family's A/AAAA emptied when the name is known
                                            to have preferred-family addresses (cached, or landing
                                            within 50 ms)
                ─► DnsCache.get             key (qname, qtype, qclass, upstream or asis destination)
                ─► Exchanger.exchange       (a miss; identical misses in flight share one exchange)
                ─► ResponseRouter.decide    accept; reject → empty NOERROR; an upstream → ask it and
                                            decide again (at most MAX_LOOKUP_DEPTH upstreams)
                ─► cache, learn, render     the client's id and question, TTLs = lifetime left

A cache hit in the plain case (see :mod:`honk.dns.fastwire`) is answered from
the cached bytes before any of that is parsed with dnspython: the same request
rules, cache key, counters and learning, the same answer; anything else (a
miss, a query or reply outside the plain case, the family ``ipversion_prefer``
may empty, an answer a UDP client would get truncated) goes the way above.

The standalone listener (``listener.py``) and the transparent inbound both
call :meth:`DnsService.handle`. Nothing raises out of it: a failed exchange is
SERVFAIL, an unexpected error is logged with its traceback and answered
SERVFAIL too. Each query answered there is counted once in ``stats`` (by its
rule's action and how it ended) for ``/metrics``; the Clash API's ``/dns/query``
asks through the same entry, as a client of the standalone listener would.

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
import dns.rdataclass
import dns.rdatatype

from honk.config.spec import DnsSpec, DnsUpstreamSpec
from honk.connection.dispatch import Dispatcher
from honk.core.clock import Clock
from honk.core.logs import kv
from honk.core.net import Address, IPAddress
from honk.dns import fastwire, wire
from honk.dns.cache import CacheKey, DnsCache, DnsStats
from honk.dns.learning import DomainLearning
from honk.dns.rules import DnsQuestion, RequestRouter, ResponseRouter
from honk.dns.upstream import EXCHANGE_TIMEOUT, Destination, ExchangeFailed, Exchanger
from honk.geo.assets import GeoAssets

__all__ = ["MAX_LOOKUP_DEPTH", "MAX_QUERIES_IN_FLIGHT", "PREFERRED_FAMILY_WAIT", "DnsService"]

log = logging.getLogger("honk.dns")

# Queries answered at once; beyond this a query is REFUSED at once rather than queued
# behind a stalled upstream (upstream honk's 2,048-query permit).
MAX_QUERIES_IN_FLIGHT = 2048
# Upstreams one query may be asked of: the request rule's, then those response rules send it to
# (dae's MaxDnsLookupDepth); a response rule asking for one more fails the query (SERVFAIL)
MAX_LOOKUP_DEPTH = 3
# ipversion_prefer: how long a non-preferred answer waits for the preferred family's exchange
# already in flight for the same name (dae: RFC 8305's 50 ms resolution delay)
PREFERRED_FAMILY_WAIT = 0.050  # seconds
# ipversion_prefer -> (the preferred QTYPE, the QTYPE whose answer it empties)
PREFERRED_QTYPES = {4: (dns.rdatatype.A, dns.rdatatype.AAAA), 6: (dns.rdatatype.AAAA, dns.rdatatype.A)}
# honk_dns_queries_total's result for an upstream's reply, by its verdict
_RESULTS = {wire.Verdict.POSITIVE: "answered", wire.Verdict.NEGATIVE: "negative", wire.Verdict.OTHER: "error"}


class _Outcome:
    """What one exchange produced, shared by the queries that waited for it."""

    __slots__ = ("wire", "lifetime")

    def __init__(self, wire: bytes | None, lifetime: int | None) -> None:
        self.wire = wire  # the reply, TTLs already set to ``lifetime`` when it has one; None: rejected
        self.lifetime = lifetime  # seconds it is cached for; None: not cached, TTLs as sent


class DnsService:
    def __init__(
        self,
        spec: DnsSpec,
        dispatcher: Dispatcher,
        clock: Clock,
        *,
        cache: DnsCache | None = None,
        learning: DomainLearning | None = None,
        exchange_timeout: float = EXCHANGE_TIMEOUT,
        exchanger: Exchanger | None = None,
        stats: DnsStats | None = None,
        geo: GeoAssets | None = None,
    ) -> None:
        """``cache``, ``learning`` and ``stats`` (the counters /metrics reads): carried over from the
        previous service (see :meth:`rebuilt`); new ones by default. The cache is resized to ``spec.max_cache_size``. ``exchanger``:
        what talks to upstreams (tests pass a fake); default one over ``dispatcher``. ``geo``: the
        geodata the rules' ``geosite:``/``geoip:``/``ext:`` codes read, the router's own (None: the
        default asset directories); a code it cannot answer raises RouteCompileError."""
        self.spec = spec
        self._dispatcher = dispatcher
        self._clock = clock
        if cache is None:
            cache = DnsCache(clock, spec.max_cache_size)
        elif cache.max_entries != spec.max_cache_size:
            cache.resize(spec.max_cache_size)
        self.cache = cache
        self.learning = learning if learning is not None else DomainLearning(clock)
        self.stats = stats if stats is not None else DnsStats()
        self._geo = geo
        self._router = RequestRouter(spec.request_rules, spec.request_fallback, geo)
        self._responses = ResponseRouter(spec.response_rules, spec.response_fallback, geo)
        self._upstreams: Mapping[str, DnsUpstreamSpec] = {u.name: u for u in spec.upstreams}
        self._fixed = dict(spec.fixed_domain_ttl)
        self._exchanger = (
            exchanger if exchanger is not None else Exchanger(dispatcher, clock, exchange_timeout)
        )
        self._flights: dict[CacheKey, asyncio.Task[_Outcome]] = {}
        self._failing: set[str] = set()  # upstreams in a failure streak (told at info once per streak)
        self._in_flight = 0

    def rebuilt(self, spec: DnsSpec, geo: GeoAssets | None = None) -> DnsService:
        """The service for ``spec`` over this one's learning and cache; cached answers of an
        upstream whose definition changed or went away are dropped (asis answers stay). ``geo``:
        the router's geodata for the new rules (None: this service's)."""
        same = {name for name, u in self._upstreams.items() if spec.upstream(name) == u}
        self.cache.retain(lambda scope: not isinstance(scope, str) or scope in same)
        return DnsService(
            spec,
            self._dispatcher,
            self._clock,
            cache=self.cache,
            learning=self.learning,
            exchanger=self._exchanger,
            stats=self.stats,
            geo=geo if geo is not None else self._geo,
        )

    @property
    def exchanger(self) -> Exchanger:
        """The upstream exchanges, shared by every rebuild of this service (and by the daemon's
        own lookups, honk.dns.own): one set of encrypted connections."""
        return self._exchanger

    def learned_names(self, ip: IPAddress | str) -> tuple[str, ...]:
        """The live names ``ip`` was given out for (see :class:`DomainLearning`)."""
        return self.learning.learned_names(ip)

    async def handle(
        self, query: bytes, client: Address | None, original: Address | None, *, tcp: bool = False
    ) -> bytes | None:
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

    def answer_now(
        self, query: bytes, client: Address | None, original: Address | None, *, tcp: bool = False
    ) -> bytes | None:
        """The answer to ``query`` when it is a cache hit the bytes path serves (see
        :meth:`_fast_hit`), without a task or an await: what a listener tries first, from its
        datagram callback. None, having changed nothing: call :meth:`handle`."""
        if not self.spec.optimistic_cache or self._in_flight >= MAX_QUERIES_IN_FLIGHT:
            return None
        try:
            return self._fast_hit(query, client, original, tcp)
        except Exception:  # noqa: BLE001 - the full path answers (or logs) it instead
            log.debug("dns fast answer failed %s", kv(client=client), exc_info=True)
            return None

    async def _handle(
        self, raw: bytes, client: Address | None, original: Address | None, tcp: bool
    ) -> bytes | None:
        if self.spec.optimistic_cache:
            answer = self._fast_hit(raw, client, original, tcp)
            if answer is not None:
                return answer
        parsed = wire.parse_query(raw)
        if not isinstance(parsed, wire.DnsQuery):
            log.debug(
                "dns query malformed %s",
                kv(client=client, size=len(raw), answer="dropped" if parsed is None else "error"),
            )
            return parsed
        query = parsed
        question = DnsQuestion(query.qname, query.qtype, client.ip if client is not None else None)
        action = self._router.decide(question)
        if action == "reject":
            log.debug("dns query rejected %s", kv(name=query.qname, qtype=query.qtype, client=client))
            self.stats.query(action, "rejected")
            return wire.reply_to(query)
        destination = self._destination(action, original, tcp)
        if destination is None:
            log.debug("dns query failed %s", kv(name=query.qname, upstream=action, reason="no-destination"))
            self.stats.query(action, "failed")
            return wire.reply_to(query, dns.rcode.SERVFAIL)
        key = self._key(query.qname, query.qtype, query.qclass, action, original)
        sibling = self._preferred_sibling(query, client, original)
        if sibling is not None and await self._has_addresses(sibling, wait=False):
            return self._emptied(query, action)
        if self.spec.optimistic_cache:
            hit = self.cache.get(key)
            if hit is not None:
                if sibling is not None and await self._has_addresses(sibling, wait=True):
                    return self._emptied(query, action)
                self.stats.query(action, "cached")
                return self._send(dns.message.from_wire(hit.wire), query, hit.ttl, tcp)
        try:
            outcome = await self._shared(key, destination, query, question, raw, client, original, tcp)
        except ExchangeFailed:
            self.stats.query(action, "failed")
            return wire.reply_to(query, dns.rcode.SERVFAIL)
        if outcome.wire is None:
            self.stats.query(action, "rejected")
            return wire.reply_to(query)
        if sibling is not None and await self._has_addresses(sibling, wait=True):
            return self._emptied(query, action)
        reply = dns.message.from_wire(outcome.wire)
        self.stats.query(action, _RESULTS[wire.classify(reply)])
        return self._send(reply, query, None, tcp)

    def _fast_hit(
        self, raw: bytes, client: Address | None, original: Address | None, tcp: bool
    ) -> bytes | None:
        """A cache hit answered from bytes, as the path below would answer it (request rules, key,
        hit and ``cached`` counted, addresses learned at the time left); None, having changed
        nothing, for whatever that path must handle: not a plain query, reject, no destination,
        the family ``ipversion_prefer`` may empty, no live prepared entry, too big for UDP."""
        query = fastwire.read_query(raw)
        if query is None:
            return None
        prefer = self.spec.ipversion_prefer
        if (
            prefer is not None
            and query.qclass == dns.rdataclass.IN
            and query.qtype == PREFERRED_QTYPES[prefer][1]
        ):
            return None
        action = self._router.decide(
            DnsQuestion(query.qname, query.qtype, client.ip if client is not None else None)
        )
        if action == "reject" or (original is None if action == "asis" else action not in self._upstreams):
            return None
        key = self._key(query.qname, query.qtype, query.qclass, action, original)
        hit = self.cache.peek(key)
        if hit is None:
            return None
        reply, ttl = hit
        answer = reply.answer(query, ttl, tcp)
        if answer is None:
            return None
        self.cache.touch(key)
        self.stats.query(action, "cached")
        for ip, names in reply.learned:
            self.learning.record(ip, names, ttl)
        return answer

    @staticmethod
    def _key(qname: str, qtype: int, qclass: int, action: str, original: Address | None) -> CacheKey:
        """The cache and in-flight key: the question and the request rule's exchange scope."""
        scope: Hashable = action if action != "asis" else ("asis", original)
        return (qname, qtype, qclass, scope)

    # --- ipversion_prefer ---------------------------------------------------------------

    def _preferred_sibling(
        self, query: wire.DnsQuery, client: Address | None, original: Address | None
    ) -> tuple[CacheKey, int] | None:
        """With ``ipversion_prefer``, for a query of the other address family: the key the same
        name's preferred-family query is cached and exchanged under (the request rules choose its
        upstream as they would for it), and that family's QTYPE. None otherwise."""
        prefer = self.spec.ipversion_prefer
        if prefer is None or query.qclass != dns.rdataclass.IN:
            return None
        preferred, emptied = PREFERRED_QTYPES[prefer]
        if query.qtype != emptied:
            return None
        action = self._router.decide(
            DnsQuestion(query.qname, preferred, client.ip if client is not None else None)
        )
        if action == "reject":
            return None
        return self._key(query.qname, preferred, query.qclass, action, original), preferred

    async def _has_addresses(self, sibling: tuple[CacheKey, int], *, wait: bool) -> bool:
        """dae's rule: the name is known to have preferred-family addresses when a live cached
        answer holds one, or (``wait``) when the exchange in flight for it brings one within
        :data:`PREFERRED_FAMILY_WAIT`. honk never asks for the preferred family itself."""
        key, preferred = sibling
        if self.spec.optimistic_cache:
            hit = self.cache.get(key)
            if hit is not None and _holds_family(hit.wire, preferred):
                return True
        flight = self._flights.get(key) if wait else None
        if flight is None:
            return False
        done, _ = await asyncio.wait({flight}, timeout=PREFERRED_FAMILY_WAIT)  # never cancels it
        if not done or flight.cancelled() or flight.exception() is not None:
            return False
        outcome = flight.result()
        return outcome.wire is not None and _holds_family(outcome.wire, preferred)

    def _emptied(self, query: wire.DnsQuery, action: str) -> bytes:
        log.debug("dns answer emptied %s", kv(name=query.qname, qtype=query.qtype, reason="ipversion_prefer"))
        self.stats.query(action, "rejected")
        return wire.reply_to(query)

    def _destination(self, action: str, original: Address | None, tcp: bool) -> Destination | None:
        if action == "asis":
            if original is None:
                return None
            return Destination("asis", "tcp" if tcp else "udp", original)
        upstream = self._upstreams.get(action)
        if upstream is None:  # the config checks every action; a hand-built spec may not
            return None
        return Destination(
            upstream.name, upstream.protocol, Address(upstream.host, upstream.port), upstream.outbound
        )

    async def _shared(
        self,
        key: CacheKey,
        destination: Destination,
        query: wire.DnsQuery,
        question: DnsQuestion,
        raw: bytes,
        client: Address | None,
        original: Address | None,
        tcp: bool,
    ) -> _Outcome:
        """The outcome of one exchange for ``key``; a query that finds one in flight waits for it
        (shielded: a client giving up does not cancel the others' answer)."""
        flight = self._flights.get(key)
        if flight is None:
            flight = asyncio.get_running_loop().create_task(
                self._exchange(key, destination, query, question, raw, client, original, tcp),
                name="honk-dns-exchange",
            )
            self._flights[key] = flight
            flight.add_done_callback(lambda done: self._landed(key, done))
        return await asyncio.shield(flight)

    def _landed(self, key: CacheKey, flight: asyncio.Task[_Outcome]) -> None:
        if self._flights.get(key) is flight:
            del self._flights[key]
        if not flight.cancelled():
            flight.exception()  # retrieved: every waiter may have given up already

    async def aclose(self) -> None:
        """Cancel the exchanges in flight (their waiters get SERVFAIL-free cancellation), then
        close the encrypted upstreams' connections. Called only for the last service of a chain
        of rebuilds (the DNS section removed, or shutdown): a rebuilt one shares the exchanger."""
        flights = list(self._flights.values())
        for flight in flights:
            flight.cancel()
        await asyncio.gather(*flights, return_exceptions=True)
        await self._exchanger.aclose()

    async def _exchange(
        self,
        key: CacheKey,
        destination: Destination,
        query: wire.DnsQuery,
        question: DnsQuestion,
        raw: bytes,
        client: Address | None,
        original: Address | None,
        tcp: bool,
    ) -> _Outcome:
        """Ask ``destination``, then run the response rules on its answer: ``accept`` keeps it,
        ``reject`` empties it, an upstream's name asks that one instead and runs the rules again
        on its answer, at most :data:`MAX_LOOKUP_DEPTH` upstreams in all."""
        asked = 1
        while True:
            reply = await self._ask(destination, query, raw, client, tcp)
            addresses = [ip for ip, _owner, _ttl in wire.address_records(reply)]
            verdict = self._responses.decide(question, destination.label, addresses)
            if verdict == "accept":
                break
            if verdict == "reject":
                log.debug("dns reply rejected %s", kv(name=query.qname, upstream=destination.label))
                return _Outcome(None, None)
            following = self._destination(verdict, original, tcp)
            if following is None or asked >= MAX_LOOKUP_DEPTH:
                reason = "no-destination" if following is None else "lookup-too-deep"
                log.debug(
                    "dns response rule failed %s",
                    kv(
                        name=query.qname, upstream=destination.label, next=verdict, reason=reason, depth=asked
                    ),
                )
                raise ExchangeFailed(reason, f"the response rules sent the query on to {verdict!r}")
            log.debug("dns reply sent on %s", kv(name=query.qname, upstream=destination.label, next=verdict))
            destination, asked = following, asked + 1
        lifetime = self._lifetime(query.qname, reply) if self.spec.optimistic_cache else None
        if lifetime is not None:
            wire.set_ttls(reply, lifetime)
        data = reply.to_wire()
        if lifetime:
            self.cache.put(key, data, lifetime)
        return _Outcome(data, lifetime)

    async def _ask(
        self, destination: Destination, query: wire.DnsQuery, raw: bytes, client: Address | None, tcp: bool
    ) -> dns.message.Message:
        """One exchange with one upstream, counted and its failure streaks told."""
        started = self._clock.now()
        try:
            reply = await self._exchanger.exchange(destination, query.message, raw, client, tcp=tcp)
        except ExchangeFailed as exc:
            self._failed(destination, query, exc)
            raise
        self.stats.exchanged(destination.label, self._clock.now() - started)
        if destination.label in self._failing:
            self._failing.discard(destination.label)
            log.info("dns upstream answering again %s", kv(upstream=destination.label))
        return reply

    def _failed(self, destination: Destination, query: wire.DnsQuery, exc: ExchangeFailed) -> None:
        log.debug(
            "dns exchange failed %s",
            kv(
                name=query.qname,
                upstream=destination.label,
                server=destination.address,
                reason=exc.reason,
                error=str(exc),
            ),
        )
        if destination.label not in self._failing:
            self._failing.add(destination.label)
            log.info(
                "dns upstream failing %s",
                kv(upstream=destination.label, server=destination.address, reason=exc.reason),
            )

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
            self.learning.record(
                ip, (query.qname, owner) if owner != query.qname else (query.qname,), record_ttl
            )
        return wire.render(reply, query, tcp=tcp)


def _holds_family(data: bytes, qtype: int) -> bool:
    """Whether the reply ``data`` answers with at least one address of ``qtype``'s family."""
    version = 4 if qtype == dns.rdatatype.A else 6
    return any(
        ip.version == version for ip, _owner, _ttl in wire.address_records(dns.message.from_wire(data))
    )
