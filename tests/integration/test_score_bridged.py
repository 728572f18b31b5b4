"""Score sees the failures of bridged upstreams (issue 11, GH-K-14/15/17/20).

A stream the relay cannot carry itself (TLS, WebSocket, a Mux.Cool carrier) reaches the relay
through a socket pair, whose end only ever closes cleanly. These tests run flows through honk's
mixed port and a Score group over a real v2ray node (VLESS over TLS with ``mux=1``), cut the
carrier under them, and read what Score recorded: one node-scoped failure episode holding every
failed flow, not a run of successes; and a deliberate close of the carrier records nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import dns.message
import pytest
from helpers.aio import close_writer, socks5_open
from helpers.engines import poll
from helpers.inprocess import node_from_link
from helpers.peerservers import v2ray_server
from helpers.servers import echo_server

from honk.alive.outcome import Family
from honk.config.spec import (
    GlobalSpec,
    GroupSpec,
    InboundSpec,
    Policy,
    RoutingSpec,
    Spec,
    name_filter,
)
from honk.connection.dispatch import Dispatcher
from honk.connection.plane import SystemResolver, build_plane
from honk.connection.tracker import ConnectionTracker
from honk.core.clock import MonotonicClock
from honk.core.net import Address, Network
from honk.dns.upstream import Destination, ExchangeFailed, Exchanger
from honk.group.manager import GroupManager
from honk.group.score.keys import AggregateKey, ScoreTarget
from honk.inbound.mixed import MixedInbound
from honk.outbound.mux import MuxCarrier, pool_for

LOOPBACK = "127.0.0.1"
GROUP = "Smart"
FLOWS = 4
STEP = 10.0  # seconds: connect timeout and the most one exchange may take
PAYLOAD = b"honk bridged score"
MUX = (("mux", "1"),)  # links do not carry it


@dataclass
class Honk:
    """honk's mixed port routing everything to a Score group of one mux node."""

    port: int
    groups: GroupManager
    tracker: ConnectionTracker
    clock: MonotonicClock
    leaf: object  # the node's outbound
    dispatcher: Dispatcher

    def carriers(self) -> list[MuxCarrier]:
        return pool_for(self.leaf).carriers


@contextlib.asynccontextmanager
async def honk_score_via(link: str) -> AsyncIterator[Honk]:
    clock = MonotonicClock()
    glob = GlobalSpec(connect_timeout=STEP)
    inbound_spec = InboundSpec(name="lan", kind="mixed", host=LOOPBACK, port=0)
    node = node_from_link(link, MUX)
    group = GroupSpec(GROUP, policy=Policy.SCORE, has_filter_lines=True, filters=(name_filter(node.name),))
    spec = Spec(
        global_=glob,
        inbounds=(inbound_spec,),
        nodes=(node,),
        groups=(group,),
        routing=RoutingSpec(rules=(), fallback=GROUP),
    )
    tracker = ConnectionTracker(clock)
    plane = build_plane(spec, clock, 1)
    dispatcher = Dispatcher(plane, tracker, clock, glob, SystemResolver(clock, STEP))
    inbound = MixedInbound(inbound_spec, dispatcher, clock)
    await inbound.start()
    try:
        assert inbound.bound is not None
        yield Honk(inbound.bound.port, plane.groups, tracker, clock, plane.outbounds[node.name], dispatcher)
    finally:
        await inbound.aclose()
        tracker.close_all("test over")
        await asyncio.wait_for(tracker.wait_idle(), STEP)
        pool_for(plane.outbounds[node.name]).close()


@contextlib.asynccontextmanager
async def _flows(
    honk: Honk, target: int
) -> AsyncIterator[list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]:
    """FLOWS SOCKS5 flows through honk to the echo server, each answered once."""
    pipes = []
    try:
        for _ in range(FLOWS):
            reader, writer, code, _ = await socks5_open(honk.port, LOOPBACK, target)
            assert code == 0
            pipes.append((reader, writer))
            writer.write(PAYLOAD)
            assert await asyncio.wait_for(reader.readexactly(len(PAYLOAD)), STEP) == PAYLOAD
        yield pipes
    finally:
        for _, writer in pipes:
            await close_writer(writer)


def _node_id(honk: Honk):
    [node_id] = [node for group, node in honk.groups.score_membership() if group == GROUP]
    return node_id


def _cells(honk: Honk, target: int) -> list:
    """The global, family and exact evidence cells of the flows' target on the node."""
    score_target = ScoreTarget.of(LOOPBACK, target)
    return honk.groups.score.evidence.layers(
        GROUP, Network.TCP, score_target, _node_id(honk), score_target.ip
    )


def _counted(honk: Honk, cell, field: str) -> int:
    return 0 if cell is None else round(getattr(cell, field).value(honk.clock.now()))


@contextlib.asynccontextmanager
async def _carrier_cut(
    monkeypatch, fastpath: str, cut: Callable[[MuxCarrier], None]
) -> AsyncIterator[tuple[Honk, int]]:
    """FLOWS answered flows on one carrier, ``cut(carrier)`` under them, each client's EOF read and
    every client closed (so every relay has ended and settled); yields honk and the target port."""
    monkeypatch.setenv("HONK_FASTPATH", fastpath)
    with v2ray_server("vless", mux=True) as peer:
        monkeypatch.setenv("SSL_CERT_FILE", str(peer.ca_path))
        async with echo_server() as target, honk_score_via(peer.share_link()) as honk:
            async with _flows(honk, target) as pipes:
                [carrier] = honk.carriers()
                assert len(carrier.streams) == FLOWS  # every flow rides the one carrier
                cut(carrier)
                for reader, _ in pipes:
                    assert await asyncio.wait_for(reader.read(), STEP) == b""
            yield honk, target


@pytest.mark.parametrize("fastpath", ["on", "off"])
async def test_a_lost_mux_carrier_is_one_node_scoped_failure_episode_for_every_flow_on_it(
    monkeypatch, fastpath
):
    # the physical connection dies under the flows
    async with _carrier_cut(monkeypatch, fastpath, lambda carrier: carrier.channel.abort()) as (honk, target):
        glob = AggregateKey(GROUP, Network.TCP, None, _node_id(honk))
        cohorts = honk.groups.score.cohorts
        await poll(lambda: cohorts.failures(glob) == FLOWS, "every flow's failure")
        # node-scoped: the node's aggregates hold the episode, so every target escapes it
        assert cohorts.open_episode(glob) is not None
        assert cohorts.open_episode(AggregateKey(GROUP, Network.TCP, Family.V4, _node_id(honk))) is not None
        assert cohorts.episode_failures(glob) == 1  # one carrier's loss: one independent failure
        glob_cell, _family, exact = _cells(honk, target)
        assert _counted(honk, glob_cell, "failures") == FLOWS
        assert _counted(honk, exact, "successes") == 0  # not one of them passed for a success


@pytest.mark.parametrize("fastpath", ["on", "off"])
async def test_closing_a_carrier_on_purpose_records_nothing_for_its_flows(monkeypatch, fastpath):
    # honk's own close (the node's runtime going away): not the node's fault
    async with _carrier_cut(monkeypatch, fastpath, lambda carrier: carrier.close()) as (honk, target):
        await poll(lambda: len(honk.tracker) == 0, "the flows to end")
        glob_cell, _family, exact = _cells(honk, target)
        assert _counted(honk, glob_cell, "failures") == 0
        assert _counted(honk, exact, "successes") == 0  # neutral: neither a failure nor a success
        assert honk.groups.score.cohorts.failures(AggregateKey(GROUP, Network.TCP, None, _node_id(honk))) == 0


async def _silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A server that takes what it is sent and never answers."""
    await reader.read()
    writer.close()


@contextlib.asynccontextmanager
async def _silent_target(monkeypatch) -> AsyncIterator[tuple[Honk, int]]:
    """honk over the mux node, and a silent server's port to reach through it."""
    with v2ray_server("vless", mux=True) as peer:
        monkeypatch.setenv("SSL_CERT_FILE", str(peer.ca_path))
        server = await asyncio.start_server(_silent, LOOPBACK, 0)
        async with server, honk_score_via(peer.share_link()) as honk:
            yield honk, server.sockets[0].getsockname()[1]


async def _cut_the_carrier(honk: Honk) -> None:
    """Once the one carrier holds a stream, its physical connection dies."""
    await poll(
        lambda: len(honk.carriers()) == 1 and bool(honk.carriers()[0].streams), "a stream on the carrier"
    )
    honk.carriers()[0].channel.abort()


def _node_failed_once(honk: Honk) -> bool:
    """One failure counted on the node's aggregate, with its episode open there (node-scoped)."""
    glob = AggregateKey(GROUP, Network.TCP, None, _node_id(honk))
    cohorts = honk.groups.score.cohorts
    return cohorts.failures(glob) == 1 and cohorts.open_episode(glob) is not None


async def test_an_http_forward_cut_by_a_lost_carrier_is_the_nodes_failure(monkeypatch):
    """The forward fails on the bridge's clean EOF; Score records the carrier's loss behind it."""
    async with _silent_target(monkeypatch) as (honk, target):
        reader, writer = await asyncio.open_connection(LOOPBACK, honk.port)
        writer.write(
            f"GET http://{LOOPBACK}:{target}/ HTTP/1.1\r\nHost: {LOOPBACK}:{target}\r\n\r\n".encode()
        )
        await _cut_the_carrier(honk)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), STEP)
        assert head.split(b" ")[1] == b"502"
        await close_writer(writer)
        await poll(lambda: _node_failed_once(honk), "the forward's node-scoped failure")


async def test_a_dns_exchange_cut_by_a_lost_carrier_is_the_nodes_failure(monkeypatch):
    """honk's own DNS over TCP through the node: the stream only closes; Score records why."""
    async with _silent_target(monkeypatch) as (honk, port):
        query = dns.message.make_query("bridged.test", "A")
        exchange = asyncio.create_task(
            Exchanger(honk.dispatcher, honk.clock).exchange(
                Destination("up", "tcp", Address(LOOPBACK, port), GROUP), query, query.to_wire(), None
            )
        )
        await _cut_the_carrier(honk)
        with pytest.raises(ExchangeFailed):
            await asyncio.wait_for(exchange, STEP)
        assert _node_failed_once(honk)
