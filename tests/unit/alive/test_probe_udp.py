"""The UDP DNS probe and the QUIC handshake probe through the direct leaf, on loopback.

The direct leaf is honk's DirectOutbound; honk's SOCKS5 association carries a
``direct`` flow's datagrams on its own sockets, so the leaf here adds the same
plain-datagram path as ``dial_udp`` and keeps its endpoints for the checks.
DNS answers come from tests/helpers/dns.py (its responder, or a socket the test
answers from by hand when a wrong id, a foreign source or exact timing is the
point); QUIC peers are aioquic servers in the test's loop with trustme
certificates. Schedules run on a FakeClock, real round trips on the monotonic one.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import time
from collections.abc import Callable

import pytest
import trustme
from helpers.dns import UdpDnsResponder, build_response
from helpers.inprocess import leaf_from_link
from helpers.peers import require
from helpers.quic import H3, quic_server

from honk.alive.outcome import ProbeError, ProbeSample
from honk.alive.probe_dns import DEFAULT_DNS_TARGET, dns_check_target, measure_dns
from honk.alive.probe_quic import measure_quic_handshake, quic_probe_target
from honk.core.clock import Clock, FakeClock, MonotonicClock
from honk.core.errors import HonkError, UpstreamFailed
from honk.core.net import Address
from honk.outbound.base import DatagramSink, EndpointLost
from honk.outbound.direct import DirectOutbound

STEP = 5.0  # seconds: the bound on any wait for something that must happen
STAGE = 2.0  # seconds: the probes' stage timeout where the stage is expected to finish
SHORT_STAGE = 0.3  # seconds: the stage timeout of probes that must run out on the real clock
DNS_NAME = "probe.honk.test"
DNS_ANSWER = "192.0.2.53"


# --- the direct leaf with its plain-datagram UDP path -------------------------------------------


class _Inbox(asyncio.DatagramProtocol):
    def __init__(self, endpoint: DirectUdpEndpoint) -> None:
        self.endpoint = endpoint

    def datagram_received(self, data: bytes, addr: tuple) -> None:
        self.endpoint.arrived(data, Address(addr[0], addr[1]))


class DirectUdpEndpoint:
    """Unconnected sockets of the host, one per family: datagrams to anyone, replies from anyone."""

    def __init__(self, receive: DatagramSink, on_lost: EndpointLost | None) -> None:
        self._receive = receive
        self._on_lost = on_lost
        self._transports: dict[int, asyncio.DatagramTransport] = {}
        self.closed = False
        self.sent: list[tuple[bytes, Address]] = []
        self.delivered = 0

    async def open(self, direct: DirectOutbound) -> None:
        loop = asyncio.get_running_loop()
        for family, wildcard in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
            try:
                sock = socket.socket(family, socket.SOCK_DGRAM)
            except OSError:
                continue  # no IPv6 on this host
            try:
                sock.setblocking(False)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                direct.mark_socket(sock)
                sock.bind((wildcard, 0))
                transport, _ = await loop.create_datagram_endpoint(lambda: _Inbox(self), sock=sock)
                self._transports[family] = transport
            except OSError:
                sock.close()

    def arrived(self, data: bytes, source: Address) -> None:
        if not self.closed:
            self.delivered += 1
            self._receive(data, source)

    def send(self, payload: bytes, target: Address) -> None:
        assert target.ip is not None, "the probes pin an IP before they send"
        transport = self._transports.get(socket.AF_INET6 if target.ip.version == 6 else socket.AF_INET)
        if not self.closed and transport is not None:
            self.sent.append((payload, target))
            transport.sendto(payload, (target.host, target.port))

    def fail(self) -> None:
        """End the endpoint the way a dead server does: on_lost with an error."""
        self._finish(UpstreamFailed("the path went away"))

    def close(self) -> None:
        self._finish(None)

    def _finish(self, error: HonkError | None) -> None:
        if self.closed:
            return
        self.closed = True
        for transport in self._transports.values():
            transport.close()
        if self._on_lost is not None:
            self._on_lost(error)


class DirectUdpLeaf:
    """``direct``: DirectOutbound for TCP, the host's own datagram sockets for UDP."""

    protocol = "direct"
    runtime = None

    def __init__(self, clock: Clock) -> None:
        self.direct = DirectOutbound(clock, STEP)
        self.name = self.direct.name
        self.capabilities = self.direct.capabilities
        self.endpoints: list[DirectUdpEndpoint] = []

    async def dial_udp(
        self, receive: DatagramSink, deadline: float, on_lost: EndpointLost | None = None
    ) -> DirectUdpEndpoint:
        endpoint = DirectUdpEndpoint(receive, on_lost)
        await endpoint.open(self.direct)
        self.endpoints.append(endpoint)
        return endpoint

    @property
    def only_endpoint(self) -> DirectUdpEndpoint:
        assert len(self.endpoints) == 1
        return self.endpoints[0]


async def _until(condition: Callable[[], bool], what: str) -> None:
    """Poll ``condition`` on the loop for at most STEP seconds."""
    deadline = time.monotonic() + STEP
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {STEP}s: {what}")
        await asyncio.sleep(0.005)


@contextlib.contextmanager
def _udp_socket() -> socket.socket:
    """A non-blocking UDP socket on 127.0.0.1 the test reads from and answers with by hand."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.setblocking(False)
        sock.bind(("127.0.0.1", 0))
        yield sock
    finally:
        sock.close()


def _at(sock: socket.socket) -> Address:
    host, port = sock.getsockname()[:2]
    return Address(host, port)


async def _recv(sock: socket.socket) -> tuple[bytes, tuple]:
    return await asyncio.wait_for(asyncio.get_running_loop().sock_recvfrom(sock, 4096), STEP)


async def _first_ip(host: str) -> str:
    infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_DGRAM)
    return str(infos[0][4][0])


def _with_id(message: bytes, qid: int) -> bytes:
    return qid.to_bytes(2, "big") + message[2:]


# --- dns_check_target --------------------------------------------------------------------------


def test_the_first_ip_literal_anywhere_wins_over_earlier_names() -> None:
    assert dns_check_target(["dns.example", " ", "1.1.1.1:5353", "9.9.9.9"]) == Address("1.1.1.1", 5353)
    assert dns_check_target(["dns.example:54", "2001:db8::53"]) == Address("2001:db8::53", 53)


def test_without_literals_the_first_name_is_used_with_port_53_by_default() -> None:
    assert dns_check_target(["  resolver.example  ", "other.example:5300"]) == Address("resolver.example", 53)
    assert dns_check_target(["resolver.example:5300", "other.example"]) == Address("resolver.example", 5300)


def test_no_usable_entries_fall_back_to_google_dns() -> None:
    assert dns_check_target([]) == DEFAULT_DNS_TARGET == Address("8.8.8.8", 53)
    assert dns_check_target(["", "   ", " , "]) == Address("8.8.8.8", 53)


def test_a_comma_separated_string_is_split_and_trimmed() -> None:
    assert dns_check_target("resolver.example , 9.9.9.9:5353,") == Address("9.9.9.9", 5353)


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ("::1", Address("::1", 53)),
        ("[::1]", Address("::1", 53)),
        ("[2001:db8::1]:5353", Address("2001:db8::1", 5353)),
        ("192.0.2.1:65535", Address("192.0.2.1", 65535)),
        ("192.0.2.1:1", Address("192.0.2.1", 1)),
    ],
)
def test_ipv6_bare_and_bracketed_and_port_bounds_parse(entry: str, expected: Address) -> None:
    assert dns_check_target([entry]) == expected


@pytest.mark.parametrize(
    "entry",
    [
        "192.0.2.1:0",
        "192.0.2.1:65536",
        "192.0.2.1:",
        "192.0.2.1:dns",
        "192.0.2.1:+53",
        "192.0.2.1:٥٣",
        "[::1]:0",
        "[::1]:x",
        "[::1]53",
        "[::1",
        "[192.0.2.1]",
        "2001:db8::zz",
        "name.example:99999",
        "bad host",
        "-bad.example",
        "1.2.3.256",
    ],
)
def test_malformed_entries_are_refused(entry: str) -> None:
    with pytest.raises(ValueError):
        dns_check_target([entry])


def test_a_malformed_entry_is_refused_even_when_a_literal_would_win() -> None:
    with pytest.raises(ValueError):
        dns_check_target(["9.9.9.9", "10.0.0.1:70000"])


# --- measure_dns -----------------------------------------------------------------------------


async def test_dns_probe_through_the_direct_leaf_reports_a_positive_rtt_after_one_query() -> None:
    clock, leaf = MonotonicClock(), DirectUdpLeaf(MonotonicClock())
    with UdpDnsResponder({DNS_NAME: DNS_ANSWER}) as dns:
        server = Address(dns.host, dns.port)
        sample = await measure_dns(leaf, server, clock, stage_timeout=STAGE, name=DNS_NAME)
        assert dns.queries == 1 and dns.counts[DNS_NAME] == 1
    assert isinstance(sample, ProbeSample) and not sample.fallback
    assert 0 < sample.rtt < STAGE
    endpoint = leaf.only_endpoint
    assert endpoint.closed and len(endpoint.sent) == 1


async def test_any_rcode_proves_the_path_so_nxdomain_is_a_success() -> None:
    leaf = DirectUdpLeaf(MonotonicClock())
    with UdpDnsResponder({DNS_NAME: DNS_ANSWER}) as dns:  # the default name is unknown: NXDOMAIN
        sample = await measure_dns(leaf, Address(dns.host, dns.port), MonotonicClock(), stage_timeout=STAGE)
        assert dns.counts["www.google.com"] == 1
    assert sample.rtt > 0 and leaf.only_endpoint.closed


async def test_rtt_is_send_to_answer_on_the_injected_clock() -> None:
    clock = FakeClock()
    leaf = DirectUdpLeaf(clock)
    with _udp_socket() as server:
        probe = asyncio.ensure_future(
            measure_dns(leaf, _at(server), clock, stage_timeout=STAGE, name=DNS_NAME)
        )
        query, peer = await _recv(server)
        clock.advance(0.25)
        server.sendto(build_response(query, {DNS_NAME: [DNS_ANSWER]}), peer)
        sample = await asyncio.wait_for(probe, STEP)
    assert sample.rtt == pytest.approx(0.25)
    assert leaf.only_endpoint.closed


async def test_a_wrong_id_and_a_foreign_source_are_ignored_until_the_real_answer() -> None:
    clock = FakeClock()
    leaf = DirectUdpLeaf(clock)
    with _udp_socket() as server, _udp_socket() as stranger:
        probe = asyncio.ensure_future(
            measure_dns(leaf, _at(server), clock, stage_timeout=STAGE, name=DNS_NAME)
        )
        query, peer = await _recv(server)
        answer = build_response(query, {DNS_NAME: [DNS_ANSWER]})
        qid = int.from_bytes(query[:2], "big")
        server.sendto(_with_id(answer, qid ^ 0xFFFF), peer)  # the server, another id
        stranger.sendto(answer, peer)  # the right id, another source
        await _until(lambda: leaf.only_endpoint.delivered == 2, "both decoys delivered")
        assert not probe.done()
        clock.advance(0.5)
        server.sendto(answer, peer)
        sample = await asyncio.wait_for(probe, STEP)
    assert sample.rtt == pytest.approx(0.5)  # not 0: neither decoy was taken for the answer


async def test_only_wrong_ids_end_in_a_reply_timeout() -> None:
    clock = FakeClock()
    leaf = DirectUdpLeaf(clock)
    with _udp_socket() as server:
        probe = asyncio.ensure_future(measure_dns(leaf, _at(server), clock, stage_timeout=STAGE))
        query, peer = await _recv(server)
        qid = int.from_bytes(query[:2], "big")
        server.sendto(_with_id(build_response(query, {}), (qid + 1) & 0xFFFF), peer)
        await _until(lambda: leaf.only_endpoint.delivered == 1, "the wrong answer delivered")
        clock.advance(STAGE)
        with pytest.raises(ProbeError) as info:
            await asyncio.wait_for(probe, STEP)
    assert (info.value.phase, info.value.reason) == ("reply", "timeout")
    assert leaf.only_endpoint.closed


async def test_an_unparseable_answer_with_our_id_is_reported_as_malformed_at_the_stage_end() -> None:
    clock = FakeClock()
    leaf = DirectUdpLeaf(clock)
    with _udp_socket() as server:
        probe = asyncio.ensure_future(measure_dns(leaf, _at(server), clock, stage_timeout=STAGE))
        query, peer = await _recv(server)
        server.sendto(query[:2] + b"\x81\x80 not dns", peer)
        await _until(lambda: leaf.only_endpoint.delivered == 1, "the garbage delivered")
        assert not probe.done()  # a valid answer could still come
        clock.advance(STAGE)
        with pytest.raises(ProbeError) as info:
            await asyncio.wait_for(probe, STEP)
    assert (info.value.phase, info.value.reason) == ("reply", "malformed")


async def test_our_query_echoed_back_is_not_an_answer() -> None:
    clock = FakeClock()
    leaf = DirectUdpLeaf(clock)
    with _udp_socket() as server:
        probe = asyncio.ensure_future(measure_dns(leaf, _at(server), clock, stage_timeout=STAGE))
        query, peer = await _recv(server)
        server.sendto(query, peer)  # same id, parses, but QR is clear
        await _until(lambda: leaf.only_endpoint.delivered == 1, "the echo delivered")
        clock.advance(STAGE)
        with pytest.raises(ProbeError) as info:
            await asyncio.wait_for(probe, STEP)
    assert info.value.reason == "malformed"


async def test_a_silent_server_is_a_reply_timeout_within_the_stage_on_the_real_clock() -> None:
    leaf = DirectUdpLeaf(MonotonicClock())
    with _udp_socket() as silent:
        started = time.monotonic()
        with pytest.raises(ProbeError) as info:
            await measure_dns(leaf, _at(silent), MonotonicClock(), stage_timeout=SHORT_STAGE)
        elapsed = time.monotonic() - started
        query, _ = await _recv(silent)  # the one query did go out
    assert (info.value.phase, info.value.reason) == ("reply", "timeout")
    assert SHORT_STAGE * 0.9 <= elapsed < SHORT_STAGE + 1.0
    assert len(query) > 12 and leaf.only_endpoint.closed


async def test_an_endpoint_that_ends_while_waiting_fails_the_probe_as_lost() -> None:
    clock = FakeClock()
    leaf = DirectUdpLeaf(clock)
    with _udp_socket() as server:
        probe = asyncio.ensure_future(measure_dns(leaf, _at(server), clock, stage_timeout=STAGE))
        await _recv(server)
        leaf.only_endpoint.fail()
        with pytest.raises(ProbeError) as info:
            await asyncio.wait_for(probe, STEP)
    assert (info.value.phase, info.value.reason) == ("reply", "lost")


async def test_cancelling_the_probe_closes_its_endpoint() -> None:
    clock = FakeClock()
    leaf = DirectUdpLeaf(clock)
    with _udp_socket() as server:
        probe = asyncio.ensure_future(measure_dns(leaf, _at(server), clock, stage_timeout=STAGE))
        await _recv(server)
        assert not leaf.only_endpoint.closed
        probe.cancel()
        with pytest.raises(asyncio.CancelledError):
            await probe
    assert leaf.only_endpoint.closed


async def test_a_leaf_that_cannot_open_its_udp_path_is_a_dial_failure() -> None:
    with socket.socket() as hole:  # bound, never listening: the SOCKS5 control connection is refused
        hole.bind(("127.0.0.1", 0))
        leaf = leaf_from_link(f"socks5://127.0.0.1:{hole.getsockname()[1]}")
        with pytest.raises(ProbeError) as info:
            await measure_dns(leaf, Address("127.0.0.1", 53), MonotonicClock(), stage_timeout=STAGE)
    assert (info.value.phase, info.value.reason) == ("dial", "connect")


async def test_a_named_server_is_resolved_once_and_answers_from_its_ip() -> None:
    leaf = DirectUdpLeaf(MonotonicClock())
    with UdpDnsResponder({DNS_NAME: DNS_ANSWER}) as dns:
        if await _first_ip("localhost") != dns.host:
            require(False, "localhost does not resolve to 127.0.0.1 first on this host")
        named = Address("localhost", dns.port)
        sample = await measure_dns(leaf, named, MonotonicClock(), stage_timeout=STAGE)
    assert sample.rtt > 0
    assert [target for _, target in leaf.only_endpoint.sent] == [Address(dns.host, dns.port)]


# --- quic_probe_target ---------------------------------------------------------------------------


def test_quic_target_is_the_first_https_url_with_port_443_by_default() -> None:
    assert quic_probe_target(["https://www.gstatic.com/generate_204"]) == ("www.gstatic.com", 443)
    assert quic_probe_target(["  HTTPS://Check.Example:8443/x?y  ", "http://b"]) == ("check.example", 8443)
    assert quic_probe_target(["https://[2001:db8::1]:4433/"]) == ("2001:db8::1", 4433)


@pytest.mark.parametrize(
    "urls",
    [
        [],
        ["http://check.example/"],
        ["http://check.example/", "https://second.example/"],
        ["https://"],
        ["https://check.example:99999/"],
        ["https://check.example:0/"],
        ["https://[::1/"],
        ["check.example"],
        ["ftp://check.example/"],
    ],
)
def test_a_missing_or_non_https_first_url_disables_the_quic_probe(urls: list[str]) -> None:
    assert quic_probe_target(urls) is None


# --- measure_quic_handshake ----------------------------------------------------------------------


def _quic(
    leaf,
    port: int,
    trust,
    *,
    host: str = "127.0.0.1",
    clock: Clock | None = None,  # noqa: ANN001
    stage: float = STAGE,
    server_name: str | None = None,
):  # noqa: ANN202
    """measure_quic_handshake to ``host:port`` trusting ``trust`` (PEM bytes of the CA, a path, a context)."""
    return measure_quic_handshake(
        leaf,
        host,
        port,
        clock or MonotonicClock(),
        stage_timeout=stage,
        ssl_context_or_cafile=trust,
        server_name=server_name,
    )


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def cert(ca: trustme.CA) -> trustme.LeafCert:
    return ca.issue_cert("localhost", "127.0.0.1", "::1")


async def test_quic_handshake_through_the_direct_leaf_reports_a_positive_rtt(ca, cert) -> None:
    leaf = DirectUdpLeaf(MonotonicClock())
    async with quic_server(cert) as peer:
        sample = await _quic(leaf, peer.port, ca.cert_pem.bytes())
        # the client's Finished completes the server's side; then the probe's CONNECTION_CLOSE ends it
        await _until(lambda: peer.handshakes == [H3] and peer.terminations == [0], "handshake, then close")
    assert 0 < sample.rtt < STAGE and not sample.fallback
    endpoint = leaf.only_endpoint
    assert endpoint.closed
    assert len(endpoint.sent[0][0]) >= 1200  # the client Initial is padded (RFC 9000 section 14.1)


@pytest.mark.parametrize("trust", ["path", "context"])
async def test_quic_trust_can_be_a_ca_file_or_an_ssl_context(ca, cert, tmp_path, trust) -> None:
    if trust == "path":
        anchor = tmp_path / "ca.pem"
        ca.cert_pem.write_to_path(str(anchor))
    else:
        anchor = ssl.create_default_context(cadata=ca.cert_pem.bytes().decode())
    leaf = DirectUdpLeaf(MonotonicClock())
    async with quic_server(cert) as peer:
        sample = await _quic(leaf, peer.port, anchor)
    assert sample.rtt > 0


async def test_quic_host_name_is_resolved_once_and_pinned_and_names_the_certificate(ca, cert) -> None:
    pinned = await _first_ip("localhost")
    leaf = DirectUdpLeaf(MonotonicClock())
    async with quic_server(cert, host=pinned) as peer:
        sample = await _quic(leaf, peer.port, ca.cert_pem.bytes(), host="localhost")
    assert sample.rtt > 0
    assert {target for _, target in leaf.only_endpoint.sent} == {Address(pinned, peer.port)}


async def test_quic_with_an_untrusted_certificate_fails_in_tls(cert) -> None:
    stranger = trustme.CA()  # the client trusts this CA, the server's certificate is from another
    leaf = DirectUdpLeaf(MonotonicClock())
    async with quic_server(cert) as peer:
        with pytest.raises(ProbeError) as info:
            await _quic(leaf, peer.port, stranger.cert_pem.bytes())
        assert peer.handshakes == []
    assert (info.value.phase, info.value.reason) == ("quic", "tls")
    assert leaf.only_endpoint.closed


async def test_quic_with_a_certificate_for_another_name_fails_in_tls(ca, cert) -> None:
    leaf = DirectUdpLeaf(MonotonicClock())
    async with quic_server(cert) as peer:
        with pytest.raises(ProbeError) as info:
            await _quic(leaf, peer.port, ca.cert_pem.bytes(), server_name="other.example")
    assert info.value.reason == "tls"


async def test_quic_server_without_h3_refuses_the_handshake(ca, cert) -> None:
    leaf = DirectUdpLeaf(MonotonicClock())
    async with quic_server(cert, alpn=("hq-interop",)) as peer:
        with pytest.raises(ProbeError) as info:
            await _quic(leaf, peer.port, ca.cert_pem.bytes())
    assert (info.value.phase, info.value.reason) == ("quic", "tls")  # no_application_protocol is a TLS alert


async def test_quic_with_nothing_listening_times_out_within_the_stage(ca) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as gone:
        gone.bind(("127.0.0.1", 0))
        port = gone.getsockname()[1]
    leaf = DirectUdpLeaf(MonotonicClock())
    started = time.monotonic()
    with pytest.raises(ProbeError) as info:
        await _quic(leaf, port, ca.cert_pem.bytes(), stage=SHORT_STAGE)
    assert (info.value.phase, info.value.reason) == ("quic", "timeout")
    assert time.monotonic() - started < SHORT_STAGE + 1.0
    assert leaf.only_endpoint.closed


async def test_quic_retransmits_on_the_injected_clock_and_times_out_on_it(ca) -> None:
    clock = FakeClock()
    leaf = DirectUdpLeaf(clock)
    with _udp_socket() as silent:
        probe = asyncio.ensure_future(_quic(leaf, _at(silent).port, ca.cert_pem.bytes(), clock=clock))
        first, _ = await _recv(silent)
        await asyncio.sleep(0)
        assert len(leaf.only_endpoint.sent) == 1  # no time has passed: no retransmission yet
        clock.advance(1.0)  # past the first probe timeout: 2 x the 100 ms initial RTT (RFC 9002 6.2.2)
        await _recv(silent)
        assert len(leaf.only_endpoint.sent) >= 2 and not probe.done()
        clock.advance(STAGE)
        with pytest.raises(ProbeError) as info:
            await asyncio.wait_for(probe, STEP)
    assert info.value.reason == "timeout"
    assert len(first) >= 1200 and leaf.only_endpoint.closed


async def test_quic_dial_failure_of_the_leaf_is_a_quic_dial_error(ca) -> None:
    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))
        leaf = leaf_from_link(f"socks5://127.0.0.1:{hole.getsockname()[1]}")
        with pytest.raises(ProbeError) as info:
            await _quic(leaf, 443, ca.cert_pem.bytes())
    assert (info.value.phase, info.value.reason) == ("quic", "dial")


async def test_cancelling_the_quic_probe_closes_its_endpoint(ca) -> None:
    clock = FakeClock()
    leaf = DirectUdpLeaf(clock)
    with _udp_socket() as silent:
        probe = asyncio.ensure_future(_quic(leaf, _at(silent).port, ca.cert_pem.bytes(), clock=clock))
        await _recv(silent)
        probe.cancel()
        with pytest.raises(asyncio.CancelledError):
            await probe
    assert leaf.only_endpoint.closed and clock.sleepers == 0
