"""TPROXY UDP sessions without a router: datagrams handed to the inbound as its listener would
(client, original destination). One session per pair, sniffing a QUIC Initial for at most the
sniffing timeout of the clock, routing per dial_mode, the idle sweeper and close_inbound ending
sessions, DNS datagrams going to the DNS handler, and (as root, on loopback) replies leaving
from the original destination — or from the source a proxy reported — through a connected
socket that also carries the client's next datagrams."""

from __future__ import annotations

import asyncio
import socket
from types import SimpleNamespace

import pytest
from helpers.peers import require_root

from honk.config.spec import GlobalSpec
from honk.connection.dispatch import Dispatcher
from honk.connection.tracker import ConnectionTracker
from honk.core.clock import FakeClock
from honk.core.net import Address, Network
from honk.inbound.tproxy import TransparentInbound, TransparentSpec
from honk.proto.sniff import QUIC_V1

CLIENT = Address("192.0.2.2", 40000)
ORIGINAL = Address("198.51.100.7", 443)
SNIFFING_TIMEOUT = 0.05
UDP_IDLE = 60.0
STEP = 2.0  # seconds of real time a step may take


class FakeEndpoint:
    def __init__(self, sent: asyncio.Queue, receive) -> None:  # noqa: ANN001
        self.closed = False
        self.receive = receive  # the session's reply sink: (payload, source)
        self._sent = sent

    def send(self, payload: bytes, target: Address) -> None:
        self._sent.put_nowait((payload, target))

    def close(self) -> None:
        self.closed = True


class FakeProxyLeaf:
    protocol = "socks5"
    name = "proxy"
    outbound_id = "proxy@v1"
    capabilities = SimpleNamespace(udp=True)
    health_family = 4
    runtime = None

    def __init__(self) -> None:
        self.sent: asyncio.Queue = asyncio.Queue()
        self.endpoints: list[FakeEndpoint] = []

    async def dial_udp(self, receive, deadline: float, on_lost=None) -> FakeEndpoint:  # noqa: ANN001
        endpoint = FakeEndpoint(self.sent, receive)
        self.endpoints.append(endpoint)
        return endpoint


class RecordingPlane:
    """Every flow to the proxy leaf; remembers what routing saw."""

    generation = 1

    def __init__(self, leaf: FakeProxyLeaf) -> None:
        self.leaf = leaf
        self.metas = []

    async def decide(self, meta, resolver):  # noqa: ANN001, ANN201
        self.metas.append(meta)
        return SimpleNamespace(
            route=SimpleNamespace(outbound="proxy", rule="match", must=False),
            selection=SimpleNamespace(chain=("proxy",), leaf=self.leaf),
        )


async def _no_resolver(host: str) -> list:
    return []


def make(dial_mode: str = "domain++", dns_handler=None):  # noqa: ANN001, ANN201
    clock = FakeClock()
    leaf = FakeProxyLeaf()
    plane = RecordingPlane(leaf)
    tracker = ConnectionTracker(clock)
    dispatcher = Dispatcher(
        plane, tracker, clock, GlobalSpec(connect_timeout=STEP, udp_idle_timeout=UDP_IDLE), _no_resolver
    )
    spec = TransparentSpec("lan", "tproxy", "::", 0, dial_mode=dial_mode, sniffing_timeout=SNIFFING_TIMEOUT)
    inbound = TransparentInbound(spec, dispatcher, clock, dns_handler=dns_handler)
    return SimpleNamespace(clock=clock, leaf=leaf, plane=plane, tracker=tracker, inbound=inbound)


def quic_initials(server_name: str, alpn_count: int = 1) -> list[bytes]:
    """The first datagrams of aioquic's client (many ALPNs: a ClientHello spanning two)."""
    from aioquic.quic.configuration import QuicConfiguration
    from aioquic.quic.connection import QuicConnection

    config = QuicConfiguration(
        is_client=True,
        server_name=server_name,
        supported_versions=[QUIC_V1],
        alpn_protocols=[f"h3-{i:03d}" for i in range(alpn_count)],
    )
    connection = QuicConnection(configuration=config)
    connection.connect((ORIGINAL.host, ORIGINAL.port), now=0.0)
    return [data for data, _ in connection.datagrams_to_send(now=0.0)]


async def sent(t) -> tuple[bytes, Address]:  # noqa: ANN001
    return await asyncio.wait_for(t.leaf.sent.get(), STEP)


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


# --- sniffing and routing --------------------------------------------------------------------------


async def test_a_quic_initials_sni_routes_the_session_by_name_and_the_proxy_dials_it():
    t = make("domain++")
    [initial, *_] = quic_initials("video.test")
    t.inbound._datagram(initial, CLIENT, ORIGINAL)
    assert await sent(t) == (initial, Address("video.test", 443))
    [meta] = t.plane.metas
    assert meta.target == Address("video.test", 443) and str(meta.resolved) == ORIGINAL.host
    assert meta.network is Network.UDP and meta.source == CLIENT and meta.inbound == "lan"
    [info] = t.tracker.snapshot()
    assert (info.network, info.source, info.target) == (Network.UDP, CLIENT, Address("video.test", 443))


async def test_a_quic_flight_cut_short_waits_the_sniffing_timeout_then_routes_by_the_ip():
    t = make("domain++")
    first, second = quic_initials("long-" + "x" * 60 + ".test", alpn_count=400)[:2]
    t.inbound._datagram(first, CLIENT, ORIGINAL)
    await settle()
    assert t.leaf.sent.empty() and not t.plane.metas  # held while the ClientHello is incomplete
    t.clock.advance(SNIFFING_TIMEOUT)
    assert await sent(t) == (first, ORIGINAL)
    t.inbound._datagram(second, CLIENT, ORIGINAL)  # after the plan: forwarded as it comes
    assert await sent(t) == (second, ORIGINAL)
    assert [m.target for m in t.plane.metas] == [ORIGINAL]  # one decision for the session


async def test_a_flight_over_several_datagrams_is_named_before_the_timeout():
    t = make("domain++")
    name = "long-" + "x" * 60 + ".test"
    flight = quic_initials(name, alpn_count=400)
    assert len(flight) > 1
    for datagram in flight:
        t.inbound._datagram(datagram, CLIENT, ORIGINAL)
    for datagram in flight:
        assert await sent(t) == (datagram, Address(name, 443))


async def test_other_udp_is_routed_at_once_by_the_ip_and_one_pair_is_one_session():
    t = make("domain")
    for payload in (b"\x01ping", b"\x02again"):
        t.inbound._datagram(payload, CLIENT, ORIGINAL)
    assert await sent(t) == (b"\x01ping", ORIGINAL)
    assert await sent(t) == (b"\x02again", ORIGINAL)
    t.inbound._datagram(b"other", Address("192.0.2.3", 40000), ORIGINAL)  # another client: another session
    assert await sent(t) == (b"other", ORIGINAL)
    assert len(t.tracker) == 2 and t.inbound.active == 2
    assert len(t.plane.metas) == 2


async def test_malformed_quic_ends_nothing_but_its_sniffing():
    t = make("domain")
    [initial] = quic_initials("video.test")[:1]
    broken = initial[:40] + bytes(b ^ 0xFF for b in initial[40:80]) + initial[80:]
    t.inbound._datagram(broken, CLIENT, ORIGINAL)
    assert await sent(t) == (broken, ORIGINAL)


# --- the end of a session --------------------------------------------------------------------------


async def test_an_idle_session_is_swept_and_the_pair_starts_afresh():
    t = make("ip")
    t.inbound._datagram(b"one", CLIENT, ORIGINAL)
    await sent(t)
    t.clock.advance(UDP_IDLE)
    assert len(t.tracker.sweep_idle(t.clock.now(), 300.0, UDP_IDLE)) == 1
    assert len(t.tracker) == 0 and t.inbound.active == 0
    assert t.leaf.endpoints[0].closed
    t.inbound._datagram(b"two", CLIENT, ORIGINAL)
    assert await sent(t) == (b"two", ORIGINAL)
    assert len(t.tracker) == 1 and len(t.leaf.endpoints) == 2


async def test_close_inbound_ends_the_inbounds_udp_sessions():
    t = make("ip")
    t.inbound._datagram(b"one", CLIENT, ORIGINAL)
    await sent(t)
    assert t.tracker.close_inbound("lan") == 1
    assert len(t.tracker) == 0 and t.inbound.active == 0


async def test_aclose_ends_sessions_still_sniffing():
    t = make("domain++")
    t.inbound._datagram(quic_initials("long-" + "x" * 60 + ".test", alpn_count=400)[0], CLIENT, ORIGINAL)
    assert t.inbound.active == 1
    await t.inbound.aclose()
    assert t.inbound.active == 0 and len(t.tracker) == 0
    assert t.clock.sleepers == 0  # the sniffing timer went with it


# --- DNS, and datagrams that must not be served ------------------------------------------------------


async def test_dns_datagrams_go_to_the_dns_handler_without_a_session():
    asked: asyncio.Queue = asyncio.Queue()

    async def handler(query: bytes, client: Address, original: Address) -> None:
        asked.put_nowait((query, client, original))
        return None  # no answer: nothing is sent

    t = make("ip", dns_handler=handler)
    dns = Address(ORIGINAL.host, 53)
    t.inbound._datagram(b"query", CLIENT, dns)
    assert await asyncio.wait_for(asked.get(), STEP) == (b"query", CLIENT, dns)
    assert len(t.tracker) == 0


async def test_without_a_dns_handler_dns_datagrams_are_proxied_like_any_udp():
    t = make("ip")
    dns = Address(ORIGINAL.host, 53)
    t.inbound._datagram(b"query", CLIENT, dns)
    assert await sent(t) == (b"query", dns)


async def test_a_datagram_addressed_to_the_listener_itself_is_dropped():
    t = make("ip")
    t.inbound.bound = Address("127.0.0.1", 15001)
    t.inbound._datagram(b"loop", CLIENT, Address("127.0.0.1", 15001))
    await settle()
    assert len(t.tracker) == 0 and t.leaf.sent.empty()


async def test_replies_leave_from_the_original_destination_unless_a_proxy_reports_another_source():
    t = make("domain++")
    [initial] = quic_initials("video.test")[:1]
    t.inbound._datagram(initial, CLIENT, ORIGINAL)
    await sent(t)
    [session] = t.inbound._udp_sessions.values()
    assert session._reply_source(ORIGINAL) == ORIGINAL
    assert session._reply_source(Address("video.test", 443)) == ORIGINAL  # as dialled
    assert session._reply_source(Address("203.0.113.9", 443)) == ORIGINAL  # the proxy resolved the name
    assert session._reply_source(Address("203.0.113.9", 3478)) == Address("203.0.113.9", 3478)
    assert session._reply_source(Address("2001:db8::9", 3478)) == ORIGINAL  # not the client's family


# --- real reply sockets (root) ---------------------------------------------------------------------


@pytest.fixture
def client_socket():
    require_root("transparent UDP reply tests")
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    yield sock
    sock.close()


async def test_replies_come_from_the_original_address_and_its_socket_carries_the_next_datagrams(
    client_socket,
):
    t = make("ip")
    client = Address(*client_socket.getsockname())
    original = Address("127.0.0.5", 5300)
    loop = asyncio.get_running_loop()
    try:
        t.inbound._datagram(b"ping", client, original)
        assert await sent(t) == (b"ping", original)
        [endpoint] = t.leaf.endpoints
        endpoint.receive(b"pong", original)
        assert await asyncio.wait_for(loop.sock_recvfrom(client_socket, 2048), STEP) == (
            b"pong",
            ("127.0.0.5", 5300),
        )
        # the pair's next datagram reaches the session through its connected reply socket
        await loop.sock_sendto(client_socket, b"next", ("127.0.0.5", 5300))
        assert await sent(t) == (b"next", original)
        endpoint.receive(b"side", Address("127.0.0.6", 7000))  # a proxy reporting another source
        assert await asyncio.wait_for(loop.sock_recvfrom(client_socket, 2048), STEP) == (
            b"side",
            ("127.0.0.6", 7000),
        )
        assert len(t.tracker) == 1
    finally:
        await t.inbound.aclose()


async def test_a_dns_answer_leaves_from_the_original_address(client_socket):
    async def handler(query: bytes, client: Address, original: Address) -> bytes:
        return b"answer:" + query

    t = make("ip", dns_handler=handler)
    client = Address(*client_socket.getsockname())
    t.inbound._datagram(b"q", client, Address("127.0.0.53", 53))
    got = await asyncio.wait_for(asyncio.get_running_loop().sock_recvfrom(client_socket, 2048), STEP)
    assert got == (b"answer:q", ("127.0.0.53", 53))
    await t.inbound.aclose()
