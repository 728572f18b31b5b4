"""The health state fed by real probes through a Shadowsocks node (acceptance 3 of the health
issue; F suggested tests 5 and 8): a blocked :53 with a working QUIC handshake leaves DataUdp
alive and DnsUdp dead without a purge; with an http:// check URL no QUIC probe runs; a delay
test to a failing URL is history only."""

from __future__ import annotations

import socket
import ssl
import uuid

import pytest
import trustme
from helpers.dns import UdpDnsResponder
from helpers.inprocess import node_from_link
from helpers.origins import generate_204
from helpers.peers import free_tcp_udp_port
from helpers.peerservers import ss_server
from helpers.quic import quic_server

from honk.alive.health import AliveDialerSet, Status
from honk.alive.outcome import Domain, Family, ProbeError, ProbeSample
from honk.alive.prober import NodeProber
from honk.alive.runner import HealthRunner
from honk.alive.thresholds import PROBE_DEATH_THRESHOLD, REGISTRATION_GRACE
from honk.config.spec import GlobalSpec, Spec
from honk.connection.plane import build_plane
from honk.control.health import node_leaves
from honk.core.clock import MonotonicClock

V4 = Family.V4
STAGE = 2.0  # seconds: connect_timeout, the probes' stage budget (a blocked DNS target costs one)
SS = ("chacha20-ietf-poly1305", "udp-state-pass")


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def ss():
    with ss_server(*SS) as peer:
        yield peer


def silent_udp_port() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    return sock


class Health:
    """One node's health state and runner, with a real prober through the node."""

    def __init__(self, ss, settings: GlobalSpec, *, score: bool, ca: trustme.CA) -> None:
        clock = MonotonicClock()
        link = f"ss://{SS[0]}:{SS[1]}@{ss.host}:{ss.port}#node"
        plane = build_plane(Spec(global_=settings, nodes=(node_from_link(link),)), clock, 1)
        leaves = node_leaves(plane)
        (self.node_id,) = leaves
        self.deaths: list[tuple[uuid.UUID, str]] = []
        self.alive = AliveDialerSet(clock, on_dead=lambda nid, name: self.deaths.append((nid, name)))
        self.alive.register_node(self.node_id, "node")
        self.alive.node(self.node_id).registered_at -= REGISTRATION_GRACE
        context = ssl.create_default_context()
        ca.configure_trust(context)
        prober = NodeProber(
            leaves, settings, clock, score_leaves={self.node_id} if score else (), ssl_context=context
        )
        self.runner = HealthRunner(self.alive, prober, clock, check_interval=30.0)

    async def cycles(self, n: int) -> None:
        for _ in range(n):
            await self.runner.run_cycle()

    def history(self) -> dict[str, list[bool]]:
        """Which probes failed, per domain (for assertion messages)."""
        return {d.value: [failed for _, _, failed in self.alive.history(self.node_id, d, V4)] for d in Domain}

    def status(self, domain: Domain) -> Status:
        return self.alive.status(self.node_id, domain, V4)


async def test_blocked_dns_with_a_working_quic_handshake_keeps_data_udp_alive_and_purges_nothing(ss, ca):
    cert = ca.issue_cert("127.0.0.1")
    port = free_tcp_udp_port()
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(tls)
    blocked = silent_udp_port()
    try:
        async with generate_204(port=port, tls=tls), quic_server(cert, port=port):
            settings = GlobalSpec(
                connect_timeout=STAGE,
                tcp_check_url=(f"https://127.0.0.1:{port}/generate_204",),
                udp_check_dns=(f"127.0.0.1:{blocked.getsockname()[1]}",),
            )
            health = Health(ss, settings, score=True, ca=ca)
            await health.cycles(PROBE_DEATH_THRESHOLD[Domain.DNS_UDP])
    finally:
        blocked.close()
    # DataUdp alive is the QUIC handshakes' doing: the DNS probe failed every round
    seen = (
        health.status(Domain.TCP),
        health.status(Domain.DNS_UDP),
        health.status(Domain.DATA_UDP),
        health.deaths,
        health.history(),
    )
    assert seen[:3] == (Status.ALIVE, Status.DEAD, Status.ALIVE), seen
    assert health.alive.udp_selectable(health.node_id, V4)
    assert health.deaths == [], seen


async def test_with_an_http_check_url_no_quic_probe_runs_and_both_udp_domains_fail(ss, ca):
    cert = ca.issue_cert("127.0.0.1")
    port = free_tcp_udp_port()
    blocked = silent_udp_port()
    try:
        async with generate_204(port=port), quic_server(cert, port=port) as quic:
            settings = GlobalSpec(
                connect_timeout=STAGE,
                tcp_check_url=(f"http://127.0.0.1:{port}/generate_204",),
                udp_check_dns=(f"127.0.0.1:{blocked.getsockname()[1]}",),
            )
            health = Health(ss, settings, score=True, ca=ca)
            await health.cycles(PROBE_DEATH_THRESHOLD[Domain.DNS_UDP])
    finally:
        blocked.close()
    assert quic.handshakes == []
    assert health.status(Domain.DNS_UDP) is Status.DEAD and health.status(Domain.DATA_UDP) is Status.DEAD
    assert health.status(Domain.TCP) is Status.ALIVE
    assert set(health.deaths) == {(health.node_id, "node")}  # no live sibling: each UDP death purges


async def test_a_working_dns_target_marks_both_udp_domains_alive(ss, ca):
    with UdpDnsResponder({"www.google.com": "10.0.0.1"}) as dns:
        settings = GlobalSpec(
            connect_timeout=STAGE, tcp_check_url=(), udp_check_dns=(f"127.0.0.1:{dns.port}",)
        )
        health = Health(ss, settings, score=False, ca=ca)
        await health.cycles(1)
        assert dns.queries == 1
    assert health.status(Domain.DNS_UDP) is Status.ALIVE and health.status(Domain.DATA_UDP) is Status.ALIVE


async def test_a_delay_test_to_a_failing_url_is_history_only(ss, ca):
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    settings = GlobalSpec(connect_timeout=STAGE, tcp_check_url=())
    health = Health(ss, settings, score=True, ca=ca)
    for _ in range(5):
        assert isinstance(
            await health.runner.delay_test(health.node_id, f"http://127.0.0.1:{port}/"), ProbeError
        )
    node = health.alive.node(health.node_id)
    assert node.dial_failures == 0 and health.status(Domain.TCP) is Status.UNKNOWN
    assert [failed for _, _, failed in health.alive.history(health.node_id, Domain.TCP, V4)] == [True] * 5
    async with generate_204() as origin:
        sample = await health.runner.delay_test(health.node_id, f"http://127.0.0.1:{origin.port}/")
    assert isinstance(sample, ProbeSample) and origin.requests == 2  # HEAD twice
    assert node.latencies.last_real_sample()[1] == pytest.approx(sample.rtt)
