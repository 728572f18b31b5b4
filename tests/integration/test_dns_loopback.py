"""The DNS service and its standalone listener over loopback: real sockets, the real Plane.

The upstream is the helper responder (``helpers/dns.py``: UDP, and TCP on the same port);
proxies are real peers (microsocks). Every test body runs on stock asyncio and on uvloop.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
from collections.abc import AsyncIterator

from helpers.aio import close_writer, rule
from helpers.dns import DnsResponder, build_query, parse_answer
from helpers.peerservers import microsocks

from honk.config.links import parse_node_link
from honk.config.spec import (
    DnsBindSpec,
    DnsCondition,
    DnsRequestRule,
    DnsSpec,
    DnsUpstreamSpec,
    GlobalSpec,
    MatchArg,
    RoutingSpec,
    Spec,
)
from honk.connection.dispatch import Dispatcher
from honk.connection.plane import SystemResolver, build_plane
from honk.connection.tracker import ConnectionTracker
from honk.core.clock import Clock, FakeClock, MonotonicClock
from honk.core.net import Address
from honk.dns.listener import TCP_IDLE_TIMEOUT, DnsListener
from honk.dns.service import DnsService

STEP = 5.0  # seconds: the most any single wait in these tests may take
RCODE_SERVFAIL = 2
NAME, ADDRESS = "www.example.test", "10.1.2.3"


def dispatcher_for(spec: Spec, clock: Clock) -> Dispatcher:
    return Dispatcher(
        build_plane(spec, clock, 1),
        ConnectionTracker(clock),
        clock,
        spec.global_,
        SystemResolver(clock, STEP),
    )


def upstream_of(
    responder: DnsResponder, protocol: str = "udp", outbound: str | None = None
) -> DnsUpstreamSpec:
    return DnsUpstreamSpec("default", protocol, responder.host, responder.port, outbound)


def service_for(dns_spec: DnsSpec, spec: Spec | None = None, clock: Clock | None = None) -> DnsService:
    clock = clock or MonotonicClock()
    return DnsService(dns_spec, dispatcher_for(spec or Spec(), clock), clock)


@contextlib.asynccontextmanager
async def listening(
    service: DnsService, *, udp: bool = True, tcp: bool = True, clock: Clock | None = None
) -> AsyncIterator[tuple[str, int]]:
    listener = DnsListener(DnsBindSpec("127.0.0.1", 0, udp=udp, tcp=tcp), service, clock or MonotonicClock())
    await listener.start()
    try:
        assert listener.bound is not None
        yield (listener.bound.host, listener.bound.port)
    finally:
        await listener.aclose()


async def udp_ask(address: tuple[str, int], wire: bytes) -> bytes:
    loop = asyncio.get_running_loop()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.setblocking(False)
        sock.connect(address)
        await loop.sock_sendall(sock, wire)
        return await asyncio.wait_for(loop.sock_recv(sock, 65535), STEP)


async def tcp_ask(address: tuple[str, int], *wires: bytes) -> list[bytes]:
    """Every query on one connection, written at once; the replies in the order they came."""
    reader, writer = await asyncio.open_connection(*address)
    try:
        writer.write(b"".join(struct.pack("!H", len(w)) + w for w in wires))
        replies = []
        for _ in wires:
            (length,) = struct.unpack("!H", await asyncio.wait_for(reader.readexactly(2), STEP))
            replies.append(await asyncio.wait_for(reader.readexactly(length), STEP))
        return replies
    finally:
        await close_writer(writer)


# --- answered through routing ------------------------------------------------------------------


def test_udp_and_tcp_queries_to_the_listener_are_answered_through_a_direct_route(run):
    async def body() -> None:
        with DnsResponder({NAME: ADDRESS, "other.test": "10.9.9.9"}) as responder:
            service = service_for(DnsSpec(upstreams=(upstream_of(responder),)))
            async with listening(service) as address:
                assert parse_answer(await udp_ask(address, build_query(NAME, 11))) == (11, 0, [ADDRESS])
                first, second = await tcp_ask(
                    address, build_query("other.test", 12), build_query("nx.test", 13)
                )
            assert {parse_answer(first)[0], parse_answer(second)[0]} == {12, 13}
            answers = {parse_answer(r)[0]: parse_answer(r)[1:] for r in (first, second)}
            assert answers == {12: (0, ["10.9.9.9"]), 13: (3, [])}  # NXDOMAIN passes through
            assert service.learning.learned_names(ADDRESS) == (NAME,)

    run(body())


def test_a_cached_second_answer_does_not_reach_the_responder(run):
    async def body() -> None:
        with DnsResponder({NAME: ADDRESS}) as responder:
            async with listening(service_for(DnsSpec(upstreams=(upstream_of(responder),)))) as address:
                await udp_ask(address, build_query(NAME, 1))
                assert parse_answer(await udp_ask(address, build_query(NAME.upper(), 2))) == (2, 0, [ADDRESS])
                (reply,) = await tcp_ask(address, build_query(NAME, 3))
                assert parse_answer(reply) == (3, 0, [ADDRESS])
            assert (responder.queries, responder.tcp_queries) == (1, 0)

    run(body())


def test_a_truncated_udp_answer_is_asked_again_over_tcp(run):
    async def body() -> None:
        with DnsResponder({NAME: ADDRESS}, truncate_udp=True) as responder:
            service = service_for(DnsSpec(upstreams=(upstream_of(responder),)))
            reply = await service.handle(build_query(NAME, 5), None, None)
            assert parse_answer(reply) == (5, 0, [ADDRESS])
            assert (responder.queries, responder.tcp_queries) == (1, 1)

    run(body())


def test_a_tcp_upstream_is_asked_over_tcp_only(run):
    async def body() -> None:
        with DnsResponder({NAME: ADDRESS}) as responder:
            service = service_for(DnsSpec(upstreams=(upstream_of(responder, "tcp"),)))
            assert parse_answer(await service.handle(build_query(NAME, 6), None, None)) == (6, 0, [ADDRESS])
            assert (responder.queries, responder.tcp_queries) == (0, 1)

    run(body())


def test_a_forced_upstream_through_a_socks5_node_is_carried_as_tcp_dns(run):
    async def body(proxy_port: int) -> None:
        with DnsResponder({NAME: ADDRESS}) as responder:
            spec = Spec(nodes=(parse_node_link(f"socks5://127.0.0.1:{proxy_port}", "edge"),))
            service = service_for(DnsSpec(upstreams=(upstream_of(responder, outbound="edge"),)), spec)
            assert parse_answer(await service.handle(build_query(NAME, 7), None, None)) == (7, 0, [ADDRESS])
            assert (responder.queries, responder.tcp_queries) == (0, 1)

    with microsocks() as peer:
        run(body(peer.port))


def test_an_upstream_the_rules_route_to_a_proxy_is_carried_as_tcp_dns(run):
    async def body(proxy_port: int) -> None:
        with DnsResponder({NAME: ADDRESS}) as responder:
            spec = Spec(
                nodes=(parse_node_link(f"socks5://127.0.0.1:{proxy_port}", "edge"),),
                routing=RoutingSpec(rules=(rule("dport", str(responder.port), "edge"),), fallback="direct"),
            )
            service = service_for(DnsSpec(upstreams=(upstream_of(responder),)), spec)
            assert parse_answer(await service.handle(build_query(NAME, 8), None, None)) == (8, 0, [ADDRESS])
            assert (responder.queries, responder.tcp_queries) == (0, 1)

    with microsocks() as peer:
        run(body(peer.port))


def test_an_upstream_routed_to_block_is_servfail_and_nothing_is_sent(run):
    async def body() -> None:
        with DnsResponder({NAME: ADDRESS}) as responder:
            spec = Spec(routing=RoutingSpec(rules=(rule("dport", str(responder.port), "block"),)))
            service = service_for(DnsSpec(upstreams=(upstream_of(responder),)), spec)
            qid, rcode, _ = parse_answer(await service.handle(build_query(NAME, 9), None, None))
            assert (qid, rcode) == (9, RCODE_SERVFAIL)
            forced = service_for(DnsSpec(upstreams=(upstream_of(responder, outbound="block"),)))
            assert parse_answer(await forced.handle(build_query(NAME, 10), None, None))[1] == RCODE_SERVFAIL
            assert (responder.queries, responder.tcp_queries) == (0, 0)

    run(body())


def test_an_unanswering_upstream_is_servfail_at_the_exchange_deadline(run):
    async def body() -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as silent:
            silent.bind(("127.0.0.1", 0))
            silent.setblocking(False)
            clock = FakeClock()
            upstream = DnsUpstreamSpec("default", "udp", "127.0.0.1", silent.getsockname()[1])
            service = service_for(DnsSpec(upstreams=(upstream,)), clock=clock)
            pending = asyncio.ensure_future(service.handle(build_query(NAME, 14), None, None))
            loop = asyncio.get_running_loop()
            await asyncio.wait_for(loop.sock_recv(silent, 512), STEP)  # the query went out
            clock.advance(1.0)  # the resend
            await asyncio.wait_for(loop.sock_recv(silent, 512), STEP)
            clock.advance(4.0)  # the exchange deadline
            assert parse_answer(await asyncio.wait_for(pending, STEP))[:2] == (14, RCODE_SERVFAIL)

    run(body())


# --- actions -------------------------------------------------------------------------------


def test_reject_is_an_empty_noerror_answer_and_asis_asks_the_intercepted_destination(run):
    async def body() -> None:
        with DnsResponder({NAME: ADDRESS}) as responder:
            rules = (
                DnsRequestRule((DnsCondition("qname", names=(MatchArg("suffix", "ads.test"),)),), "reject"),
            )
            service = service_for(DnsSpec(request_rules=rules, request_fallback="asis"))
            async with listening(service) as address:
                assert parse_answer(await udp_ask(address, build_query("x.ads.test", 21))) == (21, 0, [])
                # the standalone listener has no intercepted destination: asis fails
                assert parse_answer(await udp_ask(address, build_query(NAME, 22)))[1] == RCODE_SERVFAIL
            original = Address(responder.host, responder.port)
            reply = await service.handle(build_query(NAME, 23), Address("192.168.1.9", 40000), original)
            assert parse_answer(reply) == (23, 0, [ADDRESS])
            assert responder.queries == 1

    run(body())


# --- the listener ----------------------------------------------------------------------------


def test_random_datagrams_and_frames_never_stop_the_listener(run):
    async def body() -> None:
        with DnsResponder({NAME: ADDRESS}) as responder:
            async with listening(service_for(DnsSpec(upstreams=(upstream_of(responder),)))) as address:
                rng = random.Random(20240601)
                loop = asyncio.get_running_loop()
                with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                    sock.setblocking(False)
                    sock.connect(address)
                    for _ in range(300):
                        await loop.sock_sendall(sock, rng.randbytes(rng.randrange(0, 200)))
                for _ in range(20):
                    with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
                        reader, writer = await asyncio.open_connection(*address)
                        frame = rng.randbytes(rng.randrange(0, 60))
                        writer.write(struct.pack("!H", len(frame)) + frame)
                        await asyncio.wait_for(reader.read(65535), STEP)  # an answer, or the close
                        await close_writer(writer)
                assert parse_answer(await udp_ask(address, build_query(NAME, 31))) == (31, 0, [ADDRESS])
                (reply,) = await tcp_ask(address, build_query(NAME, 32))
                assert parse_answer(reply) == (32, 0, [ADDRESS])

    run(body())


def test_a_tcp_client_silent_for_the_idle_timeout_is_closed(run):
    async def body() -> None:
        clock = FakeClock()
        rules = (DnsRequestRule((DnsCondition("qtype", qtypes=(1,)),), "reject"),)
        service = service_for(DnsSpec(request_rules=rules), clock=clock)
        async with listening(service, udp=False, clock=clock) as address:
            reader, writer = await asyncio.open_connection(*address)
            query = build_query(NAME, 41)
            writer.write(struct.pack("!H", len(query)) + query)
            await asyncio.wait_for(
                reader.readexactly(2 + 12), STEP
            )  # answered: the next read's timer is armed
            await asyncio.wait_for(reader.read(65535), STEP)  # the rest of the answer (its question)
            assert clock.sleepers == 1  # the idle timer of the next read, nothing else
            clock.advance(TCP_IDLE_TIMEOUT - 0.5)
            assert clock.sleepers == 1
            clock.advance(0.5)
            assert await asyncio.wait_for(reader.read(1), STEP) == b""
            await close_writer(writer)

    run(body())


def test_port_zero_binds_udp_and_tcp_on_one_port_and_an_unserved_bind_is_released(run):
    async def body() -> None:
        service = service_for(DnsSpec())
        first = DnsListener(DnsBindSpec("127.0.0.1", 0, udp=True, tcp=True), service, MonotonicClock())
        await first.bind()
        assert first.bound is not None
        port = first.bound.port
        first.close_unserved()
        again = DnsListener(DnsBindSpec("127.0.0.1", port, udp=True, tcp=True), service, MonotonicClock())
        await again.bind()  # the port came back at once
        taken = DnsListener(DnsBindSpec("127.0.0.1", port, udp=False, tcp=True), service, MonotonicClock())
        try:
            await taken.bind()
        except OSError:
            pass
        else:
            raise AssertionError("a bound port was bound twice")
        await again.serve()
        await again.stop_accepting()
        try:
            await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            pass
        else:
            raise AssertionError("a stopped listener still accepts")

    run(body())


def test_a_hostname_bind_takes_its_first_address_that_binds(run):
    async def body() -> None:
        listener = DnsListener(DnsBindSpec("localhost", 0), service_for(DnsSpec()), MonotonicClock())
        await listener.bind()
        try:
            assert listener.bound is not None and listener.bound.host in ("127.0.0.1", "::1")
        finally:
            listener.close_unserved()

    run(body())


def test_a_swapped_service_answers_queries_arriving_afterwards(run):
    async def body() -> None:
        with DnsResponder({NAME: ADDRESS}) as responder:
            old = service_for(DnsSpec(request_fallback="reject", upstreams=(upstream_of(responder),)))
            listener = DnsListener(DnsBindSpec("127.0.0.1", 0), old, MonotonicClock())
            await listener.start()
            try:
                address = (listener.bound.host, listener.bound.port)
                assert parse_answer(await udp_ask(address, build_query(NAME, 51))) == (51, 0, [])
                listener.swap(old.rebuilt(DnsSpec(upstreams=(upstream_of(responder),))))
                assert parse_answer(await udp_ask(address, build_query(NAME, 52))) == (52, 0, [ADDRESS])
            finally:
                await listener.aclose()

    run(body())


def test_a_forced_upstream_through_a_dead_proxy_is_servfail(run):
    async def body() -> None:
        with socket.socket() as hole:
            hole.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
            spec = Spec(
                global_=GlobalSpec(connect_timeout=1.0),
                nodes=(parse_node_link(f"socks5://127.0.0.1:{hole.getsockname()[1]}", "edge"),),
            )
            service = service_for(
                DnsSpec(upstreams=(DnsUpstreamSpec("default", "udp", "127.0.0.1", 53, "edge"),)), spec
            )
            assert parse_answer(await service.handle(build_query(NAME, 61), None, None))[1] == RCODE_SERVFAIL

    run(body())
