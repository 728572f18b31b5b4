"""Groups end to end: SOCKS5 clients of honk's mixed port, routed to a URLTest and a Selector
group over two real danted nodes, with real flows and real probes feeding node health.

Unit tests pin the policies on scripted leaves; this file shows that the pieces agree when
real sockets fail: a dead server makes the dispatcher's dial fail, the failure reaches the
health state, and the next selection reflects it. The health state and the probe scheduler
run on a fake clock (grace periods and cooldowns are minutes long); sockets, dials and probe
timings use the monotonic clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from helpers.aio import STEP, close_writer, rule, socks5_open
from helpers.engines import poll
from helpers.peers import require_binary
from helpers.peerservers import SocksPeer, danted, established_to

from honk.alive.health import AliveDialerSet, Status
from honk.alive.outcome import Domain, Family
from honk.alive.prober import NodeProber
from honk.alive.runner import HealthRunner
from honk.alive.thresholds import PROBE_COOLDOWN_MIN, PROBE_DEATH_THRESHOLD, REGISTRATION_GRACE
from honk.alive.traffic import NodeTraffic
from honk.config.links import with_node_id
from honk.config.spec import (
    FilterTerm,
    GlobalSpec,
    GroupSpec,
    InboundSpec,
    MatchArg,
    NodeFilter,
    NodeSpec,
    Policy,
    RoutingSpec,
    Spec,
)
from honk.connection.dispatch import Dispatcher
from honk.connection.plane import SystemResolver, build_plane
from honk.connection.tracker import ConnectionInfo, ConnectionTracker
from honk.control.health import node_leaves
from honk.core.clock import FakeClock, MonotonicClock
from honk.core.net import Network
from honk.group.filter import HealthFilter
from honk.inbound.mixed import MixedInbound

V4 = Family.V4
TCP_DEATH = PROBE_DEATH_THRESHOLD[Domain.TCP]
PAYLOAD = b"through which node?"
# Probe samples that make n1 the URLTest winner: far apart compared with the tolerance
N1_RTT, N2_RTT = 0.010, 0.050
TOLERANCE = 0.005


class CountingEcho:
    """An echo origin on loopback that counts the connections it accepted (from anyone)."""

    def __init__(self) -> None:
        self.accepted = 0
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> CountingEcho:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def aclose(self) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()


@dataclass
class Flow:
    """One SOCKS5 CONNECT through honk's mixed port."""

    reply: int
    writer: asyncio.StreamWriter
    reader: asyncio.StreamReader

    @property
    def source_port(self) -> int:
        return self.writer.get_extra_info("sockname")[1]


class World:
    """honk's mixed port in this loop: flows to ``pick_origin`` go to the Selector ``pick``,
    to ``direct_origin`` to ``direct``, all others to the URLTest group ``auto``; both groups
    hold nodes n1 and n2 (one danted each). Real traffic and real raw TCP probes feed one
    AliveDialerSet."""

    def __init__(self, peers: dict[str, SocksPeer], pick_origin: int, direct_origin: int) -> None:
        self.clock = MonotonicClock()
        self.health_clock = FakeClock()
        # no check URL: the raw TCP probe, a plain connect to the node's server address
        self.glob = GlobalSpec(connect_timeout=STEP, tcp_check_url=())
        self.inbound_spec = InboundSpec(name="lan", kind="mixed", host="127.0.0.1", port=0)
        nodes = tuple(
            with_node_id(NodeSpec(name, "socks5", peer.host, peer.port)) for name, peer in peers.items()
        )
        self.spec = Spec(
            global_=self.glob,
            inbounds=(self.inbound_spec,),
            nodes=nodes,
            groups=(
                _group("auto", Policy.URLTEST, tolerance=TOLERANCE),
                _group("pick", Policy.SELECTOR),
            ),
            routing=RoutingSpec(
                rules=(rule("dport", str(pick_origin), "pick"), rule("dport", str(direct_origin), "direct")),
                fallback="auto",
            ),
        )
        self.ids = {node.name: node.id for node in nodes}
        self.alive = AliveDialerSet(self.health_clock)
        for node in nodes:
            self.alive.register_node(node.id, node.name)
        self.health_clock.advance(REGISTRATION_GRACE + 1)  # past the registration grace
        self.plane = build_plane(self.spec, self.clock, 1, health=HealthFilter(self.alive))
        leaves = node_leaves(self.plane)
        for node_id, leaf in leaves.items():
            leaf.runtime.traffic = NodeTraffic(self.alive, node_id)
        self.runner = HealthRunner(
            self.alive, NodeProber(leaves, self.glob, self.clock), self.health_clock, check_interval=30.0
        )
        self.tracker = ConnectionTracker(self.clock)
        self.dispatcher = Dispatcher(
            self.plane, self.tracker, self.clock, self.glob, SystemResolver(self.clock, STEP)
        )
        self.inbound = MixedInbound(self.inbound_spec, self.dispatcher, self.clock)
        # the ranking's probe samples: n1 wins
        self.alive.notify_check_success(self.ids["n1"], Domain.TCP, V4, N1_RTT)
        self.alive.notify_check_success(self.ids["n2"], Domain.TCP, V4, N2_RTT)

    # --- flows ------------------------------------------------------------------------------

    async def open(self, origin_port: int) -> Flow:
        """A CONNECT to the origin; when honk accepts it, one echoed round trip."""
        assert self.inbound.bound is not None
        reader, writer, reply, _ = await socks5_open(self.inbound.bound.port, "127.0.0.1", origin_port)
        flow = Flow(reply, writer, reader)
        if reply == 0:
            writer.write(PAYLOAD)
            assert await asyncio.wait_for(reader.readexactly(len(PAYLOAD)), STEP) == PAYLOAD
        return flow

    def info(self, flow: Flow) -> ConnectionInfo:
        """The tracker's record of a live flow (who carried it)."""
        mine = [c for c in self.tracker.snapshot() if c.source.port == flow.source_port]
        assert len(mine) == 1, mine
        return mine[0]

    async def carried(self, origin_port: int) -> tuple[str, ...]:
        """Open a flow, check it is served, return its chain, close it."""
        flow = await self.open(origin_port)
        try:
            assert flow.reply == 0
            await poll(
                lambda: any(c.source.port == flow.source_port for c in self.tracker.snapshot()),
                "the flow to be tracked",
            )
            return self.info(flow).chain
        finally:
            await self.close(flow)

    async def close(self, flow: Flow) -> None:
        port = flow.source_port
        await close_writer(flow.writer)
        await poll(lambda: not any(c.source.port == port for c in self.tracker.snapshot()), "the flow to end")

    # --- health -----------------------------------------------------------------------------

    def serving(self, group: str) -> str:
        """The leaf ``group`` would serve a TCP flow now (a peek: no policy state moves)."""
        return self.plane.groups.resolve(group, Network.TCP, peek=True).leaf.name

    def status(self, name: str) -> Status:
        return self.alive.status(self.ids[name], Domain.TCP, V4)

    async def probe(self, *names: str) -> None:
        """One real raw TCP probe of each node, published to the health state."""
        before = self.runner.probes_run
        self.runner.emergency(self.ids[n] for n in names)
        await poll(
            lambda: self.runner.probes_run == before + len(names) and self.runner.in_flight == 0,
            "the probes to finish",
        )

    async def recovery_tick(self) -> None:
        """What the recovery scheduler does once the dead states' cooldown has passed."""
        self.health_clock.advance(PROBE_COOLDOWN_MIN)
        await asyncio.wait_for(self.runner.run_recovery(), STEP)


def retries_from(caplog: pytest.LogCaptureFixture, node: str) -> int:
    """How many flows the dispatcher's retry round moved off ``node`` after its dial failed."""
    return sum(
        1 for r in caplog.records if "dial retried" in r.getMessage() and f"failed={node} " in r.getMessage()
    )


def _group(name: str, policy: Policy, **kw: object) -> GroupSpec:
    members = NodeFilter((FilterTerm("name", (MatchArg("", "n1"), MatchArg("", "n2"))),))
    return GroupSpec(name, policy=policy, filters=(members,), has_filter_lines=True, **kw)


@contextlib.contextmanager
def killable(
    peer_cm: contextlib.AbstractContextManager[SocksPeer],
) -> Iterator[tuple[SocksPeer, contextlib.ExitStack]]:
    """A peer whose server the test may stop early (closing the stack); stopped at the end anyway."""
    with contextlib.ExitStack() as stack:
        yield stack.enter_context(peer_cm), stack


@dataclass
class Rig:
    world: World
    peers: dict[str, SocksPeer]
    stops: dict[str, contextlib.ExitStack]
    auto: CountingEcho
    pick: CountingEcho
    direct: CountingEcho

    async def kill(self, name: str) -> None:
        """Stop the node's danted (SIGTERM, reaped) and check nothing listens on its port any more."""
        await asyncio.to_thread(self.stops[name].close)
        with (
            pytest.raises(ConnectionRefusedError),
            socket.create_connection(self.peers[name].address, timeout=STEP),
        ):
            pass


@pytest.fixture
async def rig():
    require_binary("danted")
    origins = [await CountingEcho().start() for _ in range(3)]
    auto, pick, direct = origins
    try:
        with killable(danted()) as (p1, s1), killable(danted()) as (p2, s2):
            peers = {"n1": p1, "n2": p2}
            world = World(peers, pick.port, direct.port)
            await world.inbound.start()
            try:
                yield Rig(world, peers, {"n1": s1, "n2": s2}, auto, pick, direct)
            finally:
                await world.inbound.aclose()
                world.tracker.close_all("test over")
                await asyncio.wait_for(world.tracker.wait_idle(), STEP)
                await world.runner.stop()
    finally:
        for origin in origins:
            await origin.aclose()


async def test_every_route_serves_through_its_own_path_while_both_nodes_live(rig):
    w = rig.world
    flow = await w.open(rig.auto.port)
    assert flow.reply == 0
    await poll(lambda: established_to(rig.peers["n1"].port) == 1, "honk's connection to n1's danted")
    assert established_to(rig.peers["n2"].port) == 0
    await poll(lambda: len(w.tracker) == 1, "the flow to be tracked")
    assert w.info(flow).chain == ("auto", "n1")
    await w.close(flow)
    w.plane.groups.select("pick", "n2")
    assert await w.carried(rig.pick.port) == ("pick", "n2")
    assert await w.carried(rig.direct.port) == ("direct",)
    assert (rig.auto.accepted, rig.pick.accepted, rig.direct.accepted) == (1, 1, 1)


async def test_after_the_urltest_winners_server_dies_each_new_flow_is_served_through_the_next_node(
    rig, caplog
):
    caplog.set_level(logging.INFO, logger="honk.connection")
    w = rig.world
    assert await w.carried(rig.auto.port) == ("auto", "n1")
    await rig.kill("n1")
    for _ in range(3):
        assert await w.carried(rig.auto.port) == ("auto", "n2")
    assert rig.auto.accepted == 4
    # the first two were rescued by the retry round; their failures struck n1, so the third went to n2 first
    assert retries_from(caplog, "n1") == 2


async def test_killing_the_urltest_winners_server_moves_new_flows_to_the_next_node_after_one_strike(
    rig, caplog
):
    caplog.set_level(logging.INFO, logger="honk.connection")
    w = rig.world
    assert await w.carried(rig.auto.port) == ("auto", "n1")
    await rig.kill("n1")
    for _ in range(2):  # each flow's dial through n1 fails; the retry round serves it through n2
        assert await w.carried(rig.auto.port) == ("auto", "n2")
    assert w.alive.node(w.ids["n1"]).strikes == 1  # two consecutive real dial failures
    assert w.serving("auto") == "n2"  # the struck winner ranks below n2
    retried = retries_from(caplog, "n1")
    assert await w.carried(rig.auto.port) == ("auto", "n2")
    assert retries_from(caplog, "n1") == retried  # the new flow went to n2 first: n1 was not dialled


async def test_a_struck_node_does_not_return_on_one_lucky_probe(rig, caplog):
    caplog.set_level(logging.INFO, logger="honk.connection")
    w = rig.world
    w.plane.groups.select("pick", "n1")
    await rig.kill("n1")
    for _ in range(2):  # real flows pinned to n1 by the Selector: two real dial failures
        refused = await w.open(rig.pick.port)
        assert refused.reply != 0
        await close_writer(refused.writer)
    n1 = w.alive.node(w.ids["n1"])
    assert n1.strikes == 1
    assert await w.carried(rig.auto.port) == ("auto", "n2")
    assert retries_from(caplog, "n1") == 0  # URLTest ranked the struck n1 below n2: n1 was not dialled
    with socket.create_server(rig.peers["n1"].address):  # something answers on n1's port, once
        await w.probe("n1")
    assert n1.state(Domain.TCP, V4).history.snapshot()[-1][2] is False  # the probe succeeded
    assert w.status("n1") is Status.ALIVE
    assert n1.strikes == 1  # a probe clears no strike: that takes two real dial successes
    assert await w.carried(rig.auto.port) == ("auto", "n2")
    assert retries_from(caplog, "n1") == 0


async def test_a_node_dead_by_probes_needs_two_probe_successes_to_return(rig, caplog):
    caplog.set_level(logging.INFO, logger="honk.connection")
    w = rig.world
    await rig.kill("n1")
    for _ in range(TCP_DEATH):
        await w.probe("n1")
    assert w.status("n1") is Status.DEAD
    assert w.serving("auto") == "n2"
    assert await w.carried(rig.auto.port) == ("auto", "n2")
    assert retries_from(caplog, "n1") == 0  # a dead member is not dialled at all
    with socket.create_server(rig.peers["n1"].address):
        await w.recovery_tick()  # one lucky probe
        assert w.status("n1") is Status.DEAD
        assert w.serving("auto") == "n2"
        await w.recovery_tick()  # the second success in a row revives it
        assert w.status("n1") is Status.ALIVE


async def test_a_selector_whose_choice_died_refuses_rather_than_using_its_sibling_or_direct(rig):
    w = rig.world
    w.plane.groups.select("pick", "n1")
    assert await w.carried(rig.pick.port) == ("pick", "n1")
    await rig.kill("n1")
    for _ in range(TCP_DEATH):
        await w.probe("n1", "n2")
    assert (w.status("n1"), w.status("n2")) == (Status.DEAD, Status.ALIVE)
    accepted = rig.pick.accepted
    refused = await w.open(rig.pick.port)
    try:
        assert refused.reply != 0
    finally:
        await close_writer(refused.writer)
    assert rig.pick.accepted == accepted  # nothing reached the origin: not through n2, not direct
    # n2 was alive and serving all along
    assert await w.carried(rig.auto.port) == ("auto", "n2")
    assert await w.carried(rig.direct.port) == ("direct",)
