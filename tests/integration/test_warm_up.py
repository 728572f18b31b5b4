"""Warm-up against real nodes (issue 12 acceptance 2): a Selector's choice is kept warm, so the
first flow after a switch opens no new physical connection to its server; the UDP warm set
keeps a URLTest's top mux node's carrier open, so a new UDP association's first query rides it.

Each node reaches its server through a counting forwarder, which counts the physical
connections the server is sent. honk's mixed port routes everything to a Selector; the test
switches the Selector as the Clash API does, lets warm-up run, sends one flow through the new
choice and checks the forwarder saw no new connection: a SOCKS5 node (dante) served from its
ready pool, a VMess node with Mux.Cool (v2ray) from the carrier warm-up kept open. A reload
that leaves the node unchanged keeps that very carrier.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import threading
from collections.abc import AsyncIterator, Iterator

from helpers.aio import close_writer, socks5_open
from helpers.dns import UdpDnsResponder, build_query, parse_answer
from helpers.peerservers import danted, v2ray_server
from helpers.servers import EchoServer
from helpers.socks import encode_address

from honk.config.links import parse_node_link, with_node_id
from honk.config.spec import (
    GlobalSpec,
    GroupSpec,
    InboundSpec,
    NodeSpec,
    Policy,
    RoutingSpec,
    Spec,
    name_filter,
)
from honk.connection.dispatch import Dispatcher
from honk.connection.plane import Plane, SystemResolver, build_plane
from honk.connection.tracker import ConnectionTracker
from honk.connection.warm import WarmUp
from honk.core.clock import MonotonicClock
from honk.group.events import GroupEvent, SelectionMoved
from honk.inbound.mixed import MixedInbound
from honk.outbound.mux import pool_for
from honk.outbound.runtime import WarmOwner

STEP = 10.0  # seconds any single wait may take
POLL = 0.01


class CountingForwarder:
    """A loopback TCP forwarder to ``target_port`` that counts the connections it accepts."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self.sock.accept()
                self.accepted += 1
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
                for a, b in ((client, upstream), (upstream, client)):
                    threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.sock.close()


@contextlib.contextmanager
def _forwarders(port: int) -> Iterator[tuple[CountingForwarder, CountingForwarder]]:
    """Two counting forwarders to the server on ``port``: two nodes of one server."""
    first, second = CountingForwarder(port), CountingForwarder(port)
    try:
        yield first, second
    finally:
        first.close()
        second.close()


def _via(node: NodeSpec, forwarder: CountingForwarder, name: str, *, mux: bool = False) -> NodeSpec:
    params = (*node.params, ("mux", "1")) if mux else node.params
    return with_node_id(
        dataclasses.replace(node, name=name, host="127.0.0.1", port=forwarder.port, params=params)
    )


def _spec(nodes: tuple[NodeSpec, ...], *, policy: Policy = Policy.SELECTOR, udp_warm: int = 0) -> Spec:
    names = tuple(n.name for n in nodes)
    group = GroupSpec("pick", policy=policy, has_filter_lines=True, filters=(name_filter(*names),))
    return Spec(
        global_=GlobalSpec(connect_timeout=STEP, preconnect_node_count=0, udp_warm_node_count=udp_warm),
        inbounds=(InboundSpec(name="lan", kind="mixed", host="127.0.0.1", port=0),),
        nodes=nodes,
        groups=(group,),
        routing=RoutingSpec(rules=(), fallback="pick"),
    )


class Router:
    """honk's plane, dispatcher, mixed port and warm-up in the test's loop."""

    def __init__(self, spec: Spec) -> None:
        self.clock = MonotonicClock()
        self.plane: Plane = build_plane(spec, self.clock, 1)
        self.warm = WarmUp(self.clock, lambda: self.plane)
        self.tracker = ConnectionTracker(self.clock)
        self.dispatcher = Dispatcher(
            self.plane, self.tracker, self.clock, spec.global_, SystemResolver(self.clock, STEP)
        )
        self.inbound = MixedInbound(spec.inbounds[0], self.dispatcher, self.clock)
        self._wire()

    def _wire(self) -> None:
        def route(event: GroupEvent) -> None:  # as the daemon routes a selection move
            if isinstance(event, SelectionMoved):
                self.warm.wake()

        self.plane.groups.sink = route

    def reload(self, spec: Spec) -> Plane:
        previous, self.plane = (
            self.plane,
            build_plane(spec, self.clock, self.plane.generation + 1, previous=self.plane),
        )
        self._wire()
        self.dispatcher.swap_plane(self.plane, spec.global_, SystemResolver(self.clock, STEP))
        self.plane.retire(previous)
        self.warm.wake()
        return self.plane

    async def echo_through(self, echo: EchoServer, payload: bytes) -> bytes:
        reader, writer, code, _ = await socks5_open(self.inbound.bound.port, "127.0.0.1", echo.port)
        assert code == 0
        try:
            writer.write(payload)
            return await asyncio.wait_for(reader.readexactly(len(payload)), STEP)
        finally:
            await close_writer(writer)

    async def dns_through(self, dns: UdpDnsResponder, name: str, qid: int) -> tuple[int, int, list[str]]:
        """One query from a SOCKS5 UDP ASSOCIATE client of the mixed port; the parsed answer."""
        reader, writer, code, tail = await socks5_open(self.inbound.bound.port, "0.0.0.0", 0, cmd=3)
        assert code == 0
        loop = asyncio.get_running_loop()
        header = b"\x00\x00\x00" + encode_address(dns.host, dns.port)
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
                udp.setblocking(False)
                udp.connect(("127.0.0.1", int.from_bytes(tail[4:6], "big")))
                await loop.sock_sendall(udp, header + build_query(name, qid))
                reply = await asyncio.wait_for(loop.sock_recv(udp, 2048), STEP)
        finally:
            await close_writer(writer)
        assert reply.startswith(header)  # the answer names the responder as its source
        return parse_answer(reply[len(header) :])


@contextlib.asynccontextmanager
async def running(spec: Spec) -> AsyncIterator[Router]:
    router = Router(spec)
    await router.inbound.start()
    router.warm.start()
    try:
        yield router
    finally:
        await router.warm.stop()
        await router.inbound.aclose()
        router.tracker.close_all("test over")
        await asyncio.wait_for(router.tracker.wait_idle(), STEP)
        for runtime in router.plane.runtimes.values():
            runtime.close()


async def _until(condition, what: str) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + STEP
    while not condition():
        assert loop.time() < end, f"timed out waiting for {what}"
        await asyncio.sleep(POLL)


def test_after_a_selector_switch_the_first_socks5_flow_takes_the_warm_connection(run) -> None:
    async def main(first: CountingForwarder, second: CountingForwarder, echo: EchoServer, port: int) -> None:
        node = parse_node_link(f"socks5://127.0.0.1:{port}", "dante")
        spec = _spec((_via(node, first, "d1"), _via(node, second, "d2")))
        async with running(spec) as router:
            d1, d2 = router.plane.outbounds["d1"].runtime, router.plane.outbounds["d2"].runtime
            await _until(lambda: d1.ready.entries == 1, "the first choice warmed")
            assert (first.accepted, second.accepted) == (1, 0)
            router.plane.groups.select("pick", "d2")  # the Clash API's PUT /proxies/pick
            await _until(lambda: d2.ready.entries == 1, "the new choice warmed")
            assert second.accepted == 1 and d2.warm == WarmOwner.SELECTOR_PIN
            assert not d1.warm and d1.ready.entries == 0  # the old choice let go
            assert (
                await router.echo_through(echo, b"first flow after the switch")
                == b"first flow after the switch"
            )
            assert second.accepted == 1  # no new physical connection: the warm one carried it
            assert d2.ready.hits == 1

    with danted() as peer, EchoServer() as echo:
        with _forwarders(peer.port) as (first, second):
            run(main(first, second, echo, peer.port))


def test_after_a_switch_a_vmess_mux_flow_rides_the_warm_carrier_and_a_reload_keeps_it(run) -> None:
    async def main(first: CountingForwarder, second: CountingForwarder, echo: EchoServer, link: str) -> None:
        node = parse_node_link(link, "v2ray")
        spec = _spec((_via(node, first, "v1", mux=True), _via(node, second, "v2", mux=True)))
        async with running(spec) as router:
            v1, v2 = router.plane.outbounds["v1"], router.plane.outbounds["v2"]
            await _until(lambda: pool_for(v1).carrier_count == 1, "the first choice's carrier")
            router.plane.groups.select("pick", "v2")
            await _until(lambda: pool_for(v2).carrier_count == 1, "the new choice's carrier")
            carrier = pool_for(v2).carriers[0]
            assert (first.accepted, second.accepted) == (1, 1)
            assert await router.echo_through(echo, b"over the warm carrier") == b"over the warm carrier"
            assert second.accepted == 1 and pool_for(v2).opened == 1  # a logical stream, no new carrier
            plane = router.reload(spec)  # nothing changed: the node keeps its runtime, and so its carrier
            assert plane.outbounds["v2"].runtime is v2.runtime
            await _until(lambda: router.warm.passes >= 3, "warm-up to pass over the new plane")
            assert pool_for(plane.outbounds["v2"]).carriers == [carrier] and not carrier.closed
            assert await router.echo_through(echo, b"after the reload") == b"after the reload"
            assert second.accepted == 1

    with v2ray_server("vmess", mux=True) as peer, EchoServer() as echo:
        with _forwarders(peer.port) as (first, second):
            run(main(first, second, echo, peer.share_link()))


def test_the_udp_warm_set_keeps_a_urltests_top_mux_node_warm_for_a_new_udp_association(run) -> None:
    async def main(
        first: CountingForwarder, second: CountingForwarder, dns: UdpDnsResponder, link: str
    ) -> None:
        node = parse_node_link(link, "v2ray")
        spec = _spec(
            (_via(node, first, "v1", mux=True), _via(node, second, "v2", mux=True)),
            policy=Policy.URLTEST,
            udp_warm=1,
        )
        async with running(spec) as router:
            v1, v2 = router.plane.outbounds["v1"], router.plane.outbounds["v2"]
            await _until(lambda: pool_for(v1).carrier_count == 1, "the top node's carrier")
            await router.warm.rested()
            assert v1.runtime.warm == WarmOwner.UDP_WARM and not v2.runtime.warm  # N = 1: the top one
            assert (first.accepted, second.accepted) == (1, 0)
            assert await router.dns_through(dns, "warm.honk.test", 0x51) == (0x51, 0, ["192.0.2.81"])
            assert first.accepted == 1 and pool_for(v1).opened == 1  # a UDP session on the warm carrier
            assert second.accepted == 0  # the cold race won at its first start: the second never dialled

    with v2ray_server("vmess", mux=True) as peer, UdpDnsResponder({"warm.honk.test": "192.0.2.81"}) as dns:
        with _forwarders(peer.port) as (first, second):
            run(main(first, second, dns, peer.share_link()))
