"""Flows know the outbound version they were opened on (RL-48, RL-52, RL-53): real SOCKS5 flows
through a running daemon carry it into the tracker and both connection APIs, a drain of that
version ends exactly its flows with the drain's text, and a UDP association keys its sub-links
by version and follows the plane current at each datagram."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator
from types import SimpleNamespace

import aiohttp
from helpers.aio import close_writer, socks5_open, until
from helpers.apidaemon import api_base, bearer, quiet_global, running_daemon
from helpers.engines import poll
from helpers.servers import echo_server, free_port

from honk.config.policies import CLOSE
from honk.config.spec import GlobalSpec, InboundSpec, RoutingSpec, Spec
from honk.connection.dispatch import Dispatcher
from honk.connection.plane import SystemResolver, build_plane
from honk.connection.tracker import ConnectionTracker
from honk.connection.udp import UdpAssociation
from honk.control.drain import Drainer
from honk.core.clock import FakeClock, MonotonicClock
from honk.core.errors import OUTBOUND_DRAINED_TEXT, OutboundDrained
from honk.core.net import Address
from honk.core.stats import RuntimeStats
from honk.inbound.mixed import MixedInbound
from honk.proto.socks5 import build_udp_datagram

SECRET = "versions-secret"
STEP = 5.0  # seconds: the most one step may take
# explicit ports: the test needs only that they are free, and two port-0 binds of one host
# must not be taken for one address
CONFIG = """inbound {{
    lan: 'mixed://127.0.0.1:{lan}'
}}
routing {{
    fallback: direct
}}
experimental {{
    clash_api {{
        external_controller: '127.0.0.1:{api}'
        secret: '{secret}'
    }}
}}
"""


def config() -> str:
    return quiet_global() + CONFIG.format(lan=free_port(), api=free_port(), secret=SECRET)


async def _echoed(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes) -> bytes:
    writer.write(data)
    return await asyncio.wait_for(reader.readexactly(len(data)), STEP)


# --- TCP flows through a running daemon -----------------------------------------------------------


async def test_connections_in_both_apis_carry_the_outbound_version_the_flow_was_opened_on(tmp_path):
    async with (
        running_daemon(tmp_path, config()) as daemon,
        echo_server() as echo,
        aiohttp.ClientSession(headers=bearer(SECRET)) as http,
    ):
        daemon.plane.outbounds["direct"].outbound_id = "direct@v1"  # what the reconciler sets
        reader, writer, code, _ = await socks5_open(daemon.inbounds["lan"].bound.port, "127.0.0.1", echo)
        assert code == 0
        try:
            assert await _echoed(reader, writer, b"ping") == b"ping"
            base = api_base(daemon)
            async with http.get(f"{base}/connections") as resp:
                (clash,) = (await resp.json())["connections"]
            async with http.get(f"{base}/v1/connections") as resp:
                (native,) = (await resp.json())["connections"]
            assert clash["outbound_version"] == "direct@v1"
            assert native["outbound_version"] == "direct@v1"
        finally:
            await close_writer(writer)


@contextlib.asynccontextmanager
async def mixed_inbound(clock: MonotonicClock) -> AsyncIterator[tuple[MixedInbound, Dispatcher]]:
    """A mixed inbound routing everything direct (the fast path where the engine is compiled)."""
    glob = GlobalSpec(connect_timeout=STEP)
    inbound_spec = InboundSpec(name="lan", kind="mixed", host="127.0.0.1", port=0)
    spec = Spec(global_=glob, inbounds=(inbound_spec,), routing=RoutingSpec(rules=(), fallback="direct"))
    tracker = ConnectionTracker(clock)
    dispatcher = Dispatcher(build_plane(spec, clock, 1), tracker, clock, glob, SystemResolver(clock, STEP))
    inbound = MixedInbound(inbound_spec, dispatcher, clock)
    await inbound.start()
    try:
        yield inbound, dispatcher
    finally:
        await inbound.aclose()
        tracker.close_all("test over")
        await asyncio.wait_for(tracker.wait_idle(), STEP)


async def test_a_close_drain_ends_only_the_drained_versions_flows_with_the_drain_text(caplog):
    clock = MonotonicClock()
    async with mixed_inbound(clock) as (inbound, dispatcher), echo_server() as echo:
        tracker, stats = dispatcher.tracker, RuntimeStats()
        port = inbound.bound.port
        leaf = dispatcher.plane.outbounds["direct"]
        leaf.outbound_id = "direct@v1"  # what the reconciler sets on each build
        old_reader, old_writer, _, _ = await socks5_open(port, "127.0.0.1", echo)
        # the SOCKS reply comes before the server tracks the flow (and reads its version)
        await until(lambda: tracker.versions_with_flows() == {"direct@v1": 1}, "the first flow tracked")
        leaf.outbound_id = "direct@v2"  # a rebuild: new flows open on the next version
        new_reader, new_writer, _, _ = await socks5_open(port, "127.0.0.1", echo)
        try:
            assert await _echoed(old_reader, old_writer, b"old") == b"old"
            assert await _echoed(new_reader, new_writer, b"new") == b"new"
            assert tracker.versions_with_flows() == {"direct@v1": 1, "direct@v2": 1}
            drainer = Drainer(tracker, clock, stats)

            with caplog.at_level(logging.INFO, logger="honk.connection"):
                drainer.drain("direct@v1", CLOSE)
                with contextlib.suppress(ConnectionResetError):
                    assert await asyncio.wait_for(old_reader.read(), STEP) == b""
                await poll(lambda: len(tracker) == 1, "the drained flow to end")

            assert await _echoed(new_reader, new_writer, b"still") == b"still"
            [info] = tracker.snapshot()
            assert info.outbound_version == "direct@v2"
            assert stats.drained_flows == {"close": 1}
            ended = [r.getMessage() for r in caplog.records if r.getMessage().startswith("flow ended")]
            assert any(OUTBOUND_DRAINED_TEXT in line and "direct@v1" in line for line in ended), ended
        finally:
            await close_writer(old_writer)
            await close_writer(new_writer)


# --- UDP: sub-links by version, the plane read per datagram -----------------------------------------


class FakeEndpoint:
    def __init__(self, version: str, sent: asyncio.Queue) -> None:
        self.version = version
        self.closed = False
        self._sent = sent

    def send(self, payload: bytes, target: Address) -> None:
        self._sent.put_nowait((self.version, payload))

    def close(self) -> None:
        self.closed = True


class FakeProxyLeaf:
    """A proxy leaf as the association sees it: one endpoint per dial_udp."""

    protocol = "socks5"
    capabilities = SimpleNamespace(udp=True)
    health_family = 4
    runtime = None

    def __init__(self, name: str, outbound_id: str, sent: asyncio.Queue) -> None:
        self.name = name
        self.outbound_id = outbound_id
        self.endpoints: list[FakeEndpoint] = []
        self._sent = sent

    async def dial_udp(self, receive, deadline: float, on_lost) -> FakeEndpoint:  # noqa: ANN001
        endpoint = FakeEndpoint(self.outbound_id, self._sent)
        self.endpoints.append(endpoint)
        return endpoint


class StubPlane:
    """One plane generation whose rules send everything to ``leaf``; counts its decisions."""

    def __init__(self, generation: int, leaf: FakeProxyLeaf) -> None:
        self.generation = generation
        self.leaf = leaf
        self.decisions = 0

    async def decide(self, meta, resolver):  # noqa: ANN001, ANN201
        self.decisions += 1
        return SimpleNamespace(
            route=SimpleNamespace(outbound=self.leaf.name, rule="match", must=False),
            selection=SimpleNamespace(chain=(self.leaf.name,), leaf=self.leaf),
        )


async def _no_resolver(host: str) -> list:
    return []


async def test_a_udp_association_keys_sub_links_by_version_and_follows_the_plane_per_datagram():
    sent: asyncio.Queue = asyncio.Queue()
    v1 = FakeProxyLeaf("proxy", "proxy@v1", sent)
    v2 = FakeProxyLeaf("proxy", "proxy@v2", sent)  # same tag and name, the next build
    clock = FakeClock()
    tracker = ConnectionTracker(clock)
    plane1, plane2 = StubPlane(1, v1), StubPlane(2, v2)
    dispatcher = Dispatcher(plane1, tracker, clock, GlobalSpec(), _no_resolver)
    client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    client.bind(("127.0.0.1", 0))
    assoc = UdpAssociation(
        dispatcher,
        inbound="lan",
        client=Address("127.0.0.1", client.getsockname()[1]),
        requested=Address("0.0.0.0", 0),
    )
    bound = await assoc.start("127.0.0.1", "127.0.0.1")
    target = Address("198.51.100.7", 53)

    async def through(payload: bytes) -> str:
        client.sendto(build_udp_datagram(target, payload), (bound.host, bound.port))
        version, got = await asyncio.wait_for(sent.get(), STEP)
        assert got == payload
        return version

    try:
        assert await through(b"a") == "proxy@v1"
        assert await through(b"b") == "proxy@v1"
        assert plane1.decisions == 1  # one decision per target within a plane

        dispatcher.swap_plane(plane2)
        assert await through(b"c") == "proxy@v2"  # the datagram after the swap follows the new plane
        assert (len(v1.endpoints), len(v2.endpoints)) == (1, 1)  # two sub-links, not one by name
        assert tracker.versions_with_flows() == {"proxy@v1": 1, "proxy@v2": 1}

        assert tracker.close_version("proxy@v1", OutboundDrained()) == 1
        assert v1.endpoints[0].closed and not v2.endpoints[0].closed
        assert len(tracker) == 1 and not assoc.closed  # the association goes on
        assert await through(b"d") == "proxy@v2"
        assert tracker.versions_with_flows() == {"proxy@v2": 1}
        [info] = tracker.snapshot()
        assert info.outbound_version == "proxy@v2"
    finally:
        assoc.close()
        client.close()
