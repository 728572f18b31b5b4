"""Encrypted DNS upstreams against real servers on loopback, through direct and through a node.

* DoT and DoH: Debian's dnsdist (``helpers/dnsdist.py``) in front of the helper responder;
  a node is a SOCKS5 peer (microsocks) carrying the TCP stream TLS runs over.
* DoQ and DoH3: an aioquic server in the test (``helpers/doq.py``); a node is Dante,
  whose UDP ASSOCIATE carries the QUIC datagrams.

The certificates come from a trustme CA the test trusts through ``SSL_CERT_FILE`` (honk
uses the system's store). Every test body runs on stock asyncio and on uvloop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import struct
from collections.abc import AsyncIterator, Iterator

import dns.message
import dns.rdatatype
import pytest
import trustme
from helpers.aio import rule
from helpers.dns import build_query, parse_answer
from helpers.dnsdist import Backend, DnsdistPeer, dnsdist
from helpers.doq import doq_server
from helpers.peers import require_module
from helpers.peerservers import danted, established_to, microsocks, ss_server

from honk.config.dns import parse_upstream_uri
from honk.config.links import parse_node_link
from honk.config.spec import (
    DnsSpec,
    DnsUpstreamSpec,
    GlobalSpec,
    GroupSpec,
    NodeSpec,
    Policy,
    RoutingSpec,
    Spec,
    name_filter,
)
from honk.connection.dispatch import Dispatcher
from honk.connection.plane import SystemResolver, build_plane
from honk.connection.tracker import ConnectionTracker
from honk.core.clock import Clock, MonotonicClock
from honk.core.net import Address
from honk.dns.service import DnsService
from honk.dns.upstream import Destination, ExchangeFailed, Exchanger

STEP = 5.0  # seconds: the most any single wait in these tests may take
RCODE_SERVFAIL = 2
RECORDS = {f"host{i}.example.test": f"10.0.0.{i}" for i in range(1, 21)}
NAME, ADDRESS = "host1.example.test", "10.0.0.1"
CONCURRENT = 12  # queries sent at once to see them share one connection
SS_METHOD, SS_PASSWORD = "aes-128-gcm", "dns-encrypted-pw"
SS_EGRESS = "127.0.0.3"  # where ss-server's own sockets come from: not honk's 127.0.0.1


def dispatcher_for(spec: Spec, clock: Clock) -> Dispatcher:
    return Dispatcher(
        build_plane(spec, clock, 1),
        ConnectionTracker(clock),
        clock,
        spec.global_,
        SystemResolver(clock, STEP),
    )


def destination(uri: str, outbound: str | None = None) -> Destination:
    protocol, host, port = parse_upstream_uri(uri)
    return Destination("up", protocol, Address(host, port), outbound)


async def ask(exchanger: Exchanger, target: Destination, name: str) -> list[str]:
    """The A records ``target`` answers for ``name``."""
    wire = build_query(name, 1)
    reply = await asyncio.wait_for(exchanger.exchange(target, dns.message.from_wire(wire), wire, None), STEP)
    return [rd.address for rrset in reply.answer if rrset.rdtype == dns.rdatatype.A for rd in rrset]


@contextlib.asynccontextmanager
async def exchanger_for(spec: Spec | None = None) -> AsyncIterator[Exchanger]:
    clock = MonotonicClock()
    exchanger = Exchanger(dispatcher_for(spec or Spec(), clock), clock)
    try:
        yield exchanger
    finally:
        await exchanger.aclose()


def node_spec(port: int) -> Spec:
    return Spec(nodes=(parse_node_link(f"socks5://127.0.0.1:{port}", "edge"),))


def group_spec(port: int) -> Spec:
    """The node under a Selector group ``proxy``: an upstream forced to ``proxy`` reaches it."""
    group = GroupSpec("proxy", policy=Policy.SELECTOR, filters=(name_filter("edge"),), has_filter_lines=True)
    return Spec(nodes=node_spec(port).nodes, groups=(group,))


@pytest.fixture
def front(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Backend, DnsdistPeer]]:
    """The backend behind dnsdist, whose CA the process trusts."""
    with Backend(RECORDS) as responder, dnsdist(responder.address) as peer:
        monkeypatch.setenv("SSL_CERT_FILE", str(peer.ca_path))
        yield responder, peer


@pytest.fixture
def quic_ca(monkeypatch: pytest.MonkeyPatch, tmp_path) -> trustme.CA:  # noqa: ANN001 - pytest's tmp_path
    require_module("aioquic")
    ca = trustme.CA()
    path = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(path))
    monkeypatch.setenv("SSL_CERT_FILE", str(path))
    return ca


def dot_uri(peer: DnsdistPeer, host: str = "127.0.0.1") -> str:
    return f"tls://{host}:{peer.dot_port}"


def doh_uri(peer: DnsdistPeer, host: str = "127.0.0.1") -> str:
    return f"https://{host}:{peer.doh_port}/dns-query"


# --- DoT and DoH through direct ----------------------------------------------------------------


@pytest.mark.parametrize("kind", ["tls", "https"])
def test_dot_and_doh_answer_through_direct_on_one_reused_connection(run, front, kind):
    responder, peer = front

    async def body() -> None:
        target = destination(dot_uri(peer) if kind == "tls" else doh_uri(peer))
        async with exchanger_for() as exchanger:
            assert await ask(exchanger, target, NAME) == [ADDRESS]
            names = [f"host{i}.example.test" for i in range(2, 2 + CONCURRENT)]
            answers = await asyncio.gather(*(ask(exchanger, target, n) for n in names))
            assert answers == [[RECORDS[n]] for n in names]
            assert await ask(exchanger, target, "nowhere.example.test") == []  # NXDOMAIN passes through
            assert exchanger.pool.dials == 1  # every query after the first rode the same connection
            assert established_to(peer.dot_port if kind == "tls" else peer.doh_port) == 1
        assert responder.queries == CONCURRENT + 2

    run(body())


def test_a_hostname_upstream_verifies_the_certificate_for_its_name(run, front):
    _, peer = front

    async def body() -> None:
        async with exchanger_for() as exchanger:
            assert await ask(exchanger, destination(dot_uri(peer, "localhost")), NAME) == [ADDRESS]
            named = destination(f"tls://127.0.0.1:{peer.dot_port}?tls_server_name=localhost")
            assert await ask(exchanger, named, NAME) == [ADDRESS]

    run(body())


def test_a_certificate_for_another_name_fails_the_exchange_as_a_tls_dial(run, front):
    _, peer = front

    async def body() -> None:
        async with exchanger_for() as exchanger:
            wrong = destination(f"tls://127.0.0.1:{peer.dot_port}?tls_server_name=other.test")
            with pytest.raises(ExchangeFailed) as failed:
                await ask(exchanger, wrong, NAME)
            assert failed.value.reason == "dial-tls-certificate-name"

    run(body())


def test_an_untrusted_certificate_is_servfail_from_the_service(run, monkeypatch):
    async def body(port: int) -> None:
        upstream = DnsUpstreamSpec("default", *parse_upstream_uri(f"https://127.0.0.1:{port}"))
        clock = MonotonicClock()
        service = DnsService(DnsSpec(upstreams=(upstream,)), dispatcher_for(Spec(), clock), clock)
        assert parse_answer(await service.handle(build_query(NAME, 7), None, None))[:2] == (7, RCODE_SERVFAIL)

    with Backend(RECORDS) as responder, dnsdist(responder.address) as peer:
        monkeypatch.delenv("SSL_CERT_FILE", raising=False)  # the system store knows no test CA
        run(body(peer.doh_port))
        assert responder.queries == 0


# --- plain UDP and TCP against the same real server ----------------------------------------------


@pytest.mark.parametrize("scheme", ["udp", "tcp", "udp+tcp"])
def test_plain_upstreams_answer_from_dnsdist_through_direct_and_through_a_node(run, front, scheme):
    responder, peer = front

    async def body(proxy_port: int) -> None:
        uri = f"{scheme}://127.0.0.1:{peer.plain_port}"
        async with exchanger_for(node_spec(proxy_port)) as exchanger:
            assert await ask(exchanger, destination(uri), NAME) == [ADDRESS]
            # through the node: a proxy leaf carries DNS over TCP (its stream), whatever the scheme
            assert await ask(exchanger, destination(uri, outbound="edge"), "host2.example.test") == [
                RECORDS["host2.example.test"]
            ]
            assert await ask(exchanger, destination(uri), "nowhere.example.test") == []
        assert responder.queries == 3

    with microsocks() as proxy:
        run(body(proxy.port))


# --- DoT and DoH through a node -----------------------------------------------------------------


@pytest.mark.parametrize("kind", ["tls", "https"])
def test_dot_and_doh_forced_through_a_socks5_node_ride_its_stream(run, front, kind):
    responder, peer = front

    async def body(proxy_port: int) -> None:
        target = destination(dot_uri(peer) if kind == "tls" else doh_uri(peer), outbound="edge")
        async with exchanger_for(node_spec(proxy_port)) as exchanger:
            answers = await asyncio.gather(
                *(ask(exchanger, target, f"host{i}.example.test") for i in (1, 2, 3))
            )
            assert answers == [["10.0.0.1"], ["10.0.0.2"], ["10.0.0.3"]]
            assert exchanger.pool.dials == 1
            assert established_to(proxy_port) == 1  # the one connection is the node's stream
        assert responder.queries == 3

    with microsocks() as proxy:
        run(body(proxy.port))


@pytest.mark.parametrize("kind", ["tls", "https"])
def test_dot_and_doh_forced_through_a_shadowsocks_node_ride_its_framed_stream(run, front, kind):
    responder, peer = front

    async def body(ss_port: int) -> None:
        spec = Spec(
            nodes=(NodeSpec("edge", "ss", "127.0.0.1", ss_port, password=SS_PASSWORD, encryption=SS_METHOD),)
        )
        target = destination(dot_uri(peer) if kind == "tls" else doh_uri(peer), outbound="edge")
        async with exchanger_for(spec) as exchanger:
            answers = await asyncio.gather(*(ask(exchanger, target, f"host{i}.example.test") for i in (1, 2)))
            assert answers == [["10.0.0.1"], ["10.0.0.2"]]
            assert exchanger.pool.dials == 1
            assert established_to(ss_port) == 1
        assert responder.queries == 2

    with ss_server(SS_METHOD, SS_PASSWORD, udp=False) as server:
        run(body(server.port))


def test_doh_forced_through_a_group_rides_its_selected_nodes_stream(run, front):
    responder, peer = front

    async def body(proxy_port: int) -> None:
        async with exchanger_for(group_spec(proxy_port)) as exchanger:
            target = destination(doh_uri(peer), outbound="proxy")
            assert await ask(exchanger, target, NAME) == [ADDRESS]
            assert await ask(exchanger, target, "host2.example.test") == ["10.0.0.2"]
            assert exchanger.pool.dials == 1
            assert established_to(proxy_port) == 1
        assert responder.queries == 2

    with danted() as proxy:
        run(body(proxy.port))


def test_doh_the_routing_rules_send_to_a_node_rides_its_stream(run, front):
    responder, peer = front

    async def body(proxy_port: int) -> None:
        spec = Spec(
            nodes=node_spec(proxy_port).nodes,
            routing=RoutingSpec(rules=(rule("dport", str(peer.doh_port), "edge"),), fallback="direct"),
        )
        async with exchanger_for(spec) as exchanger:
            assert await ask(exchanger, destination(doh_uri(peer)), NAME) == [ADDRESS]
            assert established_to(proxy_port) == 1
        assert responder.queries == 1

    with microsocks() as proxy:
        run(body(proxy.port))


def test_dot_through_a_dead_node_fails_as_a_dial_and_dials_again_next_time(run, front):
    _, peer = front

    async def body() -> None:
        with socket.socket() as hole:
            hole.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
            spec = Spec(
                global_=GlobalSpec(connect_timeout=1.0),
                nodes=(parse_node_link(f"socks5://127.0.0.1:{hole.getsockname()[1]}", "edge"),),
            )
            async with exchanger_for(spec) as exchanger:
                target = destination(dot_uri(peer), outbound="edge")
                for _ in range(2):
                    with pytest.raises(ExchangeFailed) as failed:
                        await ask(exchanger, target, NAME)
                    assert failed.value.reason.startswith("dial-")
                assert exchanger.pool.dials == 0

    run(body())


# --- HTTP/3 offered by a DoH server (Alt-Svc) ----------------------------------------------------


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_doh_moves_to_http3_once_the_server_offers_it(run, monkeypatch):
    ca = trustme.CA()
    port = free_udp_port()

    async def body(peer: DnsdistPeer) -> None:
        async with (
            doq_server(RECORDS, ca.issue_cert("127.0.0.1"), port=port) as h3,
            exchanger_for() as exchanger,
        ):
            target = destination(doh_uri(peer))
            assert await ask(exchanger, target, NAME) == [ADDRESS]  # HTTP/2, which carries the offer
            for i in (2, 3):
                assert await ask(exchanger, target, f"host{i}.example.test") == [f"10.0.0.{i}"]
            assert h3.connections == ["h3"]
            assert [name for name, _ in h3.queries] == ["host2.example.test", "host3.example.test"]

    with Backend(RECORDS) as backend, dnsdist(backend.address, ca=ca, alt_svc=f'h3=":{port}"; ma=60') as peer:
        monkeypatch.setenv("SSL_CERT_FILE", str(peer.ca_path))
        run(body(peer))
        assert backend.queries == 1


def test_doh_stays_on_http2_when_the_offered_http3_does_not_answer(run, monkeypatch, caplog):
    port = free_udp_port()  # nobody serves it
    caplog.set_level(logging.DEBUG, logger="honk.dns")

    async def body(peer: DnsdistPeer) -> None:
        async with exchanger_for() as exchanger:
            target = destination(doh_uri(peer))
            for i in (1, 2, 3):
                assert await ask(exchanger, target, f"host{i}.example.test") == [f"10.0.0.{i}"]

    with Backend(RECORDS) as backend, dnsdist(backend.address, alt_svc=f'h3=":{port}"') as peer:
        monkeypatch.setenv("SSL_CERT_FILE", str(peer.ca_path))
        run(body(peer))
        assert backend.queries == 3
    tried = [r for r in caplog.records if r.getMessage().startswith("dns upstream stays on HTTP/2")]
    assert len(tried) == 1  # tried once, then left alone for ALT_SVC_RETRY


# --- a server that closes ---------------------------------------------------------------------


@contextlib.asynccontextmanager
async def one_answer_dot_server(ca: trustme.CA) -> AsyncIterator[tuple[int, list[int]]]:
    """A DoT server answering one query per connection, then closing it (RFC 7858 §3.4 lets a
    server close whenever); yields its port and the count of connections it took."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    accepted: list[int] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        try:
            (length,) = struct.unpack("!H", await reader.readexactly(2))
            query = dns.message.from_wire(await reader.readexactly(length))
            reply = dns.message.make_response(query)
            wire = reply.to_wire()
            writer.write(struct.pack("!H", len(wire)) + wire)
            await writer.drain()
        finally:
            writer.close()
            with contextlib.suppress(OSError, ssl.SSLError):
                await writer.wait_closed()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=context)
    try:
        yield server.sockets[0].getsockname()[1], accepted
    finally:
        server.close()
        await server.wait_closed()


def test_dot_dials_again_after_the_server_closed_the_connection(run, quic_ca):
    async def body() -> None:
        async with one_answer_dot_server(quic_ca) as (port, accepted), exchanger_for() as exchanger:
            target = destination(f"tls://127.0.0.1:{port}")
            for _ in range(3):
                assert await ask(exchanger, target, NAME) == []  # an empty NOERROR answer
            assert len(accepted) == 3

    run(body())


# --- DoQ and DoH3 -------------------------------------------------------------------------------


@pytest.mark.parametrize(("scheme", "alpn"), [("quic", "doq"), ("h3", "h3")])
def test_doq_and_doh3_answer_through_direct_on_one_quic_connection(run, quic_ca, scheme, alpn):
    async def body() -> None:
        async with (
            doq_server(RECORDS, quic_ca.issue_cert("127.0.0.1")) as server,
            exchanger_for() as exchanger,
        ):
            target = destination(f"{scheme}://127.0.0.1:{server.port}")
            assert await ask(exchanger, target, NAME) == [ADDRESS]
            names = [f"host{i}.example.test" for i in range(2, 2 + CONCURRENT)]
            answers = await asyncio.gather(*(ask(exchanger, target, n) for n in names))
            assert answers == [[RECORDS[n]] for n in names]
            assert server.connections == [alpn]
            assert len(server.queries) == CONCURRENT + 1
            assert {qid for _, qid in server.queries} == {0}  # RFC 9250 §4.2.1, RFC 8484 §4.1

    run(body())


@pytest.mark.parametrize("scheme", ["quic", "h3"])
def test_doq_and_doh3_forced_through_a_socks5_node_ride_its_udp_association(run, quic_ca, scheme):
    async def body(proxy_port: int) -> None:
        async with (
            doq_server(RECORDS, quic_ca.issue_cert("127.0.0.1")) as server,
            exchanger_for(node_spec(proxy_port)) as exchanger,
        ):
            target = destination(f"{scheme}://127.0.0.1:{server.port}", outbound="edge")
            assert await ask(exchanger, target, NAME) == [ADDRESS]
            assert await ask(exchanger, target, "host2.example.test") == ["10.0.0.2"]
            assert len(server.connections) == 1
            assert established_to(proxy_port) == 1  # the association's control connection

    with danted() as proxy:
        run(body(proxy.port))


def test_doq_forced_through_a_group_rides_its_selected_nodes_udp_association(run, quic_ca):
    async def body(proxy_port: int) -> None:
        async with (
            doq_server(RECORDS, quic_ca.issue_cert("127.0.0.1")) as server,
            exchanger_for(group_spec(proxy_port)) as exchanger,
        ):
            target = destination(f"quic://127.0.0.1:{server.port}", outbound="proxy")
            assert await ask(exchanger, target, NAME) == [ADDRESS]
            assert server.connections == ["doq"]
            assert established_to(proxy_port) == 1

    with danted() as proxy:
        run(body(proxy.port))


def test_doq_forced_through_a_shadowsocks_node_rides_its_udp_relay(run, quic_ca):
    async def body(ss_port: int) -> None:
        spec = Spec(
            nodes=(NodeSpec("edge", "ss", "127.0.0.1", ss_port, password=SS_PASSWORD, encryption=SS_METHOD),)
        )
        async with (
            doq_server(RECORDS, quic_ca.issue_cert("127.0.0.1")) as server,
            exchanger_for(spec) as exchanger,
        ):
            target = destination(f"quic://127.0.0.1:{server.port}", outbound="edge")
            assert await ask(exchanger, target, NAME) == [ADDRESS]
            assert server.connections == ["doq"]
            assert {host for host, _ in server.clients} == {SS_EGRESS}  # every datagram came from ss-server

    with ss_server(SS_METHOD, SS_PASSWORD, udp=True, egress=SS_EGRESS) as relay:
        run(body(relay.port))


def test_doq_through_a_node_without_udp_fails_as_unsupported(run, quic_ca):
    async def body(proxy_port: int) -> None:
        spec = Spec(nodes=(parse_node_link(f"http://127.0.0.1:{proxy_port}", "edge"),))
        async with (
            doq_server(RECORDS, quic_ca.issue_cert("127.0.0.1")) as server,
            exchanger_for(spec) as exchanger,
        ):
            with pytest.raises(ExchangeFailed) as failed:
                await ask(exchanger, destination(f"quic://127.0.0.1:{server.port}", outbound="edge"), NAME)
            assert failed.value.reason == "dial-unsupported"
            assert server.connections == []

    with microsocks() as proxy:  # any port: the node is never dialled
        run(body(proxy.port))
