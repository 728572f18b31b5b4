"""The UDP health probes through real proxy peers: the DNS probe and the QUIC handshake probe.

The DNS probe goes through Dante (SOCKS5 UDP ASSOCIATE) and ss-server (Shadowsocks
UDP relay) to a loopback responder; the QUIC handshake goes through the same kinds
of leaf to an aioquic server in the test's loop. The last test is the situation of
GH-F-20: the DNS target is unreachable through a node whose packet path works, so
the DNS probe fails while the QUIC handshake through the same leaf succeeds (the
health state then keeps DataUdp alive; that logic lives elsewhere).
"""

from __future__ import annotations

import contextlib
import select
import socket
import time
from collections.abc import Iterator

import pytest
import trustme
from helpers.dns import UdpDnsResponder
from helpers.inprocess import leaf_from_link
from helpers.peerservers import danted, ss_server
from helpers.quic import quic_server

from honk.alive.outcome import ProbeError
from honk.alive.probe_dns import measure_dns
from honk.alive.probe_quic import measure_quic_handshake
from honk.core.clock import MonotonicClock
from honk.core.net import Address
from honk.outbound.base import DatagramSink, EndpointLost, PacketEndpoint

STEP = 5.0  # seconds: the bound on any wait for something that must happen
STAGE = 3.0  # seconds: the stage timeout of probes that must succeed
BLOCKED_STAGE = 0.5  # seconds: the stage timeout of a probe whose target never answers
SS_METHOD = "chacha20-ietf-poly1305"
SS_PASSWORD = "probe-secret"
DNS_NAME = "health.honk.test"
DNS_ANSWER = "192.0.2.80"


class RecordingLeaf:
    """A leaf that keeps the endpoints it opened, to check every probe closed its own."""

    def __init__(self, leaf) -> None:  # noqa: ANN001 - an Outbound
        self.leaf = leaf
        self.name = leaf.name
        self.protocol = leaf.protocol
        self.capabilities = leaf.capabilities
        self.endpoints: list[PacketEndpoint] = []

    async def dial_udp(
        self, receive: DatagramSink, deadline: float, on_lost: EndpointLost | None = None
    ) -> PacketEndpoint:
        endpoint = await self.leaf.dial_udp(receive, deadline, on_lost)
        self.endpoints.append(endpoint)
        return endpoint

    @property
    def all_closed(self) -> bool:
        return bool(self.endpoints) and all(endpoint.closed for endpoint in self.endpoints)


@contextlib.contextmanager
def _node(kind: str) -> Iterator[str]:
    """The share link of a running UDP-capable peer: ``danted`` or ``ss``."""
    if kind == "danted":
        with danted() as peer:
            yield f"socks5://{peer.host}:{peer.port}"
        return
    with ss_server(SS_METHOD, SS_PASSWORD, udp=True) as peer:
        yield f"ss://{SS_METHOD}:{SS_PASSWORD}@{peer.host}:{peer.port}"


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def cert(ca: trustme.CA) -> trustme.LeafCert:
    return ca.issue_cert("localhost", "127.0.0.1")


@pytest.mark.parametrize("kind", ["danted", "ss"])
def test_dns_probe_through_a_proxy_node_is_answered_after_exactly_one_query(run, kind) -> None:
    async def main(leaf: RecordingLeaf, dns: UdpDnsResponder) -> float:
        sample = await measure_dns(
            leaf, Address(dns.host, dns.port), MonotonicClock(), stage_timeout=STAGE, name=DNS_NAME
        )
        return sample.rtt

    with _node(kind) as link, UdpDnsResponder({DNS_NAME: DNS_ANSWER}) as dns:
        leaf = RecordingLeaf(leaf_from_link(link))
        rtt = run(main(leaf, dns))
        assert dns.queries == 1 and dns.counts[DNS_NAME] == 1
    assert 0 < rtt < STAGE
    assert len(leaf.endpoints) == 1 and leaf.all_closed


@pytest.mark.parametrize("kind", ["ss", "danted"])
def test_quic_handshake_through_a_proxy_node_completes(run, ca, cert, kind) -> None:
    # The client completes on the server's verified Finished, which proves the server took part;
    # the server's own completion needs our last datagram, which a proxy tearing the association
    # down right after the probe may drop, so it is not waited for here.
    async def main(leaf: RecordingLeaf) -> float:
        async with quic_server(cert) as peer:
            trust = ca.cert_pem.bytes()
            sample = await measure_quic_handshake(
                leaf, peer.host, peer.port, MonotonicClock(), stage_timeout=STAGE, ssl_context_or_cafile=trust
            )
            return sample.rtt

    with _node(kind) as link:
        leaf = RecordingLeaf(leaf_from_link(link))
        rtt = run(main(leaf))
    assert 0 < rtt < STAGE
    assert len(leaf.endpoints) == 1 and leaf.all_closed


def test_a_blocked_dns_target_fails_while_quic_through_the_same_leaf_succeeds(run, ca, cert) -> None:
    async def main(leaf: RecordingLeaf, blocked: Address) -> tuple[ProbeError, float, float]:
        clock = MonotonicClock()
        started = time.monotonic()
        with pytest.raises(ProbeError) as failed:
            await measure_dns(leaf, blocked, clock, stage_timeout=BLOCKED_STAGE)
        dns_elapsed = time.monotonic() - started
        async with quic_server(cert) as peer:
            sample = await measure_quic_handshake(
                leaf,
                peer.host,
                peer.port,
                clock,
                stage_timeout=STAGE,
                ssl_context_or_cafile=ca.cert_pem.bytes(),
            )
        return failed.value, dns_elapsed, sample.rtt

    # bound and never read: datagrams to it vanish, as behind a firewall that drops DNS
    with _node("ss") as link, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as silent:
        silent.bind(("127.0.0.1", 0))
        leaf = RecordingLeaf(leaf_from_link(link))
        error, dns_elapsed, quic_rtt = run(main(leaf, Address(*silent.getsockname())))
        assert select.select([silent], [], [], STEP)[0], "the DNS query never reached its target"
        assert len(silent.recv(4096)) > 12  # one DNS message, relayed by ss-server
    assert (error.phase, error.reason) == ("reply", "timeout")
    assert dns_elapsed < BLOCKED_STAGE + 1.0
    assert 0 < quic_rtt < STAGE
    assert len(leaf.endpoints) == 2 and leaf.all_closed
