"""Real traffic as health evidence (GH-E-14, GH-E-17, GH-E-19, GH-E-20; area E suggested test 7):
UDP associations through a Shadowsocks node report a DataUdp failure only when nothing ever came
back; TCP dials report strikes; probes and target refusals report nothing."""

from __future__ import annotations

import asyncio
import socket
import uuid

import pytest
from helpers.aio import close_writer, socks5_open
from helpers.dns import UdpDnsResponder, build_query
from helpers.engines import poll
from helpers.inprocess import STEP, node_from_link
from helpers.peerservers import ss_server
from helpers.socks import encode_address

from honk.alive.health import AliveDialerSet
from honk.alive.outcome import Domain, Family
from honk.alive.prober import NodeProber
from honk.alive.thresholds import REGISTRATION_GRACE
from honk.alive.traffic import NodeTraffic
from honk.config.spec import GlobalSpec, InboundSpec, RoutingSpec, Spec
from honk.connection.dispatch import Dispatcher
from honk.connection.plane import SystemResolver, build_plane
from honk.connection.tracker import ConnectionTracker
from honk.control.health import node_leaves
from honk.core.clock import MonotonicClock
from honk.core.errors import CapacityRefused, DialError, TargetRefused
from honk.core.net import Address, FlowMeta, Network
from honk.inbound.mixed import MixedInbound

V4 = Family.V4


class Rig:
    """honk's mixed port in this loop, routing everything to one node whose traffic feeds ``alive``."""

    def __init__(self, link: str) -> None:
        self.clock = MonotonicClock()
        self.glob = GlobalSpec(connect_timeout=STEP, tcp_check_url=())
        inbound = InboundSpec(name="lan", kind="mixed", host="127.0.0.1", port=0)
        self.spec = Spec(
            global_=self.glob,
            inbounds=(inbound,),
            nodes=(node_from_link(link),),
            routing=RoutingSpec(rules=(), fallback="node"),
        )
        self.plane = build_plane(self.spec, self.clock, 1)
        self.leaves = node_leaves(self.plane)
        (self.node_id,) = self.leaves
        self.alive = AliveDialerSet(self.clock)
        self.alive.register_node(self.node_id, "node")
        self.alive.node(self.node_id).registered_at -= REGISTRATION_GRACE  # past the grace period
        self.leaves[self.node_id].runtime.traffic = NodeTraffic(self.alive, self.node_id)
        self.tracker = ConnectionTracker(self.clock)
        self.dispatcher = Dispatcher(
            self.plane, self.tracker, self.clock, self.glob, SystemResolver(self.clock, STEP)
        )
        self.inbound = MixedInbound(inbound, self.dispatcher, self.clock)

    def data_udp(self):
        return self.alive.node(self.node_id).state(Domain.DATA_UDP, V4)

    async def associate_and_send(self, target: tuple[str, int], payload: bytes, *, wait_reply: bool):
        reader, writer, code, tail = await socks5_open(self.inbound.bound.port, "0.0.0.0", 0, cmd=3)
        assert code == 0
        relay = int.from_bytes(tail[4:6], "big")
        loop = asyncio.get_running_loop()
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        udp.setblocking(False)
        udp.connect(("127.0.0.1", relay))
        await loop.sock_sendall(udp, b"\x00\x00\x00" + encode_address(*target) + payload)
        if wait_reply:
            await asyncio.wait_for(loop.sock_recv(udp, 2048), STEP)
        return writer, udp

    async def sent_through(self) -> None:
        """Wait until the association's datagram went out through the node's endpoint."""
        await poll(self._endpoint_sent, "the datagram to leave through the node")

    def _endpoint_sent(self) -> bool:
        return any(h.sent for a in self._associations() for h in a._health.values())

    def _associations(self):
        return [f._handle for f in self.tracker._flows.values() if f.network is Network.UDP]

    def idle_out(self) -> list[str]:
        """What the tracker's sweeper does once the association has been silent long enough."""
        return self.tracker.sweep_idle(self.clock.now() + 3600, 3600 * 2, 1.0)


@pytest.fixture
async def rig():
    with ss_server("chacha20-ietf-poly1305", "traffic-pass") as ss:
        rig = Rig(f"ss://chacha20-ietf-poly1305:traffic-pass@{ss.host}:{ss.port}#node")
        await rig.inbound.start()
        try:
            yield rig
        finally:
            await rig.inbound.aclose()
            rig.tracker.close_all("test over")
            await asyncio.wait_for(rig.tracker.wait_idle(), STEP)


async def test_an_endpoint_that_got_a_reply_and_then_idles_out_is_not_a_failure(rig):
    with UdpDnsResponder({"example.com": "10.0.0.1"}) as dns:
        writer, udp = await rig.associate_and_send(
            dns.address, build_query("example.com", 7), wait_reply=True
        )
        assert rig.idle_out()
        udp.close()
        await close_writer(writer)
    assert rig.data_udp().traffic_failures == 0


async def test_an_endpoint_that_never_got_a_reply_and_idles_out_is_one_data_udp_failure(rig):
    silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    silent.bind(("127.0.0.1", 0))
    try:
        writer, udp = await rig.associate_and_send(silent.getsockname(), b"hello?", wait_reply=False)
        await rig.sent_through()
        assert rig.idle_out()
        udp.close()
        await close_writer(writer)
    finally:
        silent.close()
    assert rig.data_udp().traffic_failures == 1
    assert rig.alive.node(rig.node_id).state(Domain.TCP, V4).traffic_failures == 0


async def test_the_client_ending_an_unanswered_association_is_neutral(rig):
    silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    silent.bind(("127.0.0.1", 0))
    try:
        writer, udp = await rig.associate_and_send(silent.getsockname(), b"hello?", wait_reply=False)
        await rig.sent_through()
        udp.close()
        await close_writer(writer)  # the control connection ends: intentional retirement
        await asyncio.wait_for(rig.tracker.wait_idle(), STEP)
    finally:
        silent.close()
    assert rig.alive.node(rig.node_id).peek(Domain.DATA_UDP, V4) is None


async def test_real_dials_feed_strikes_and_probes_through_the_same_leaf_do_not():
    """A node whose server is gone: a flow's dial is a strike, a probe's dial is not."""
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    rig = Rig(f"socks5://127.0.0.1:{port}#node")
    meta = FlowMeta(
        Network.TCP, source=Address("127.0.0.1", 5555), target=Address("127.0.0.1", 80), inbound="lan"
    )
    for _ in range(2):
        with pytest.raises(DialError):
            await rig.dispatcher.connect(meta)
    assert rig.alive.node(rig.node_id).dial_failures == 2
    prober = NodeProber(
        rig.leaves, GlobalSpec(connect_timeout=STEP, tcp_check_url=("http://127.0.0.1:80/",)), rig.clock
    )
    with pytest.raises(Exception):  # noqa: B017 - any probe failure; what matters is what it reports
        await prober.probe_tcp(rig.node_id, V4)
    assert rig.alive.node(rig.node_id).dial_failures == 2
    assert rig.alive.node(rig.node_id).state(Domain.TCP, V4).traffic_failures == 2


def test_refusals_of_one_target_or_for_capacity_are_neutral():
    clock = MonotonicClock()
    alive = AliveDialerSet(clock)
    node = uuid.uuid4()
    alive.register_node(node, "n")
    alive.node(node).registered_at -= REGISTRATION_GRACE
    traffic = NodeTraffic(alive, node)
    traffic.dial(TargetRefused("n", 5, "connection refused by the target"), 4)
    traffic.dial(CapacityRefused("n: carriers full"), 4)
    assert alive.node(node).dial_failures == 0 and alive.node(node).peek(Domain.TCP, V4) is None
    traffic.dial(DialError("n", "connect", "refused"), 4)
    assert alive.node(node).dial_failures == 1
    traffic.dial(None, 4)
    assert alive.node(node).dial_failures == 0


def test_a_failed_udp_endpoint_setup_is_a_data_udp_failure_not_a_tcp_strike():
    rig = Rig("ss://chacha20-ietf-poly1305:pw@127.0.0.1:9#node")
    leaf = rig.leaves[rig.node_id]
    leaf.count(DialError("node", "connect", "UDP socket: refused"), udp=True)
    node = rig.alive.node(rig.node_id)
    assert node.state(Domain.DATA_UDP, V4).traffic_failures == 1
    assert node.dial_failures == 0 and node.state(Domain.TCP, V4).traffic_failures == 0
