"""honk's mixed port in the test's own event loop, routing everything to one node."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
from collections.abc import AsyncIterator
from typing import Any

from honk.config.links import parse_node_link, with_node_id
from honk.config.spec import GlobalSpec, InboundSpec, NodeSpec, RoutingSpec, Spec
from honk.connection.dispatch import Dispatcher
from honk.connection.plane import SystemResolver, build_plane
from honk.connection.tracker import ConnectionTracker
from honk.core.clock import Clock, MonotonicClock
from honk.core.net import Address
from honk.inbound.mixed import MixedInbound
from honk.outbound.registry import build_outbounds
from honk.relay.native import framed_socket

STEP = 10.0  # seconds: connect timeout and the bound on draining at the end


def node_from_link(link: str, params: tuple[tuple[str, str], ...] = ()) -> NodeSpec:
    """The node of ``link`` (named ``node``) with ``params`` added (``("mux", "1")``: links do not carry it)."""
    node = parse_node_link(link, "node")
    return with_node_id(dataclasses.replace(node, params=(*node.params, *params))) if params else node


def leaf_from_link(
    link: str,
    *,
    connect_timeout: float = STEP,
    clock=None,  # noqa: ANN001, ANN201
    params: tuple[tuple[str, str], ...] = (),
):
    """The leaf the registry builds for the node of ``link`` (see node_from_link), with its runtime."""
    spec = Spec(global_=GlobalSpec(connect_timeout=connect_timeout), nodes=(node_from_link(link, params),))
    return build_outbounds(spec, clock or MonotonicClock())[0]["node"]


async def open_through(leaf, target: Address, deadline: float) -> socket.socket:  # noqa: ANN001
    """A plain socket to ``target`` through ``leaf``: the dialled stream, its framing applied by the relay engine."""
    dialed = await leaf.dial_tcp(target, deadline)
    return dialed.sock if dialed.framing is None else framed_socket(dialed.sock, dialed.framing)


@contextlib.asynccontextmanager
async def mixed_inbound(
    spec: Spec, clock: Clock, engine: Any = None
) -> AsyncIterator[tuple[MixedInbound, Dispatcher]]:
    """``spec``'s first inbound (a mixed one) serving on a new dispatcher and tracker, with
    ``engine`` for its fast path (default: the inbound's own choice). At the end the inbound is
    closed, its flows ended and drained, and ``engine`` (when given) closed."""
    glob = spec.global_
    tracker = ConnectionTracker(clock)
    dispatcher = Dispatcher(
        build_plane(spec, clock, 1), tracker, clock, glob, SystemResolver(clock, glob.connect_timeout)
    )
    inbound = MixedInbound(spec.inbounds[0], dispatcher, clock, engine=engine)
    await inbound.start()
    try:
        yield inbound, dispatcher
    finally:
        await inbound.aclose()
        tracker.close_all("test over")
        await asyncio.wait_for(tracker.wait_idle(), STEP)
        if engine is not None:
            engine.close()


@contextlib.asynccontextmanager
async def honk_via(
    link: str, *, connect_timeout: float = STEP, params: tuple[tuple[str, str], ...] = ()
) -> AsyncIterator[int]:
    """A mixed inbound on a free loopback port whose fallback is the node of ``link``; yields the port."""
    inbound_spec = InboundSpec(name="lan", kind="mixed", host="127.0.0.1", port=0)
    spec = Spec(
        global_=GlobalSpec(connect_timeout=connect_timeout),
        inbounds=(inbound_spec,),
        nodes=(node_from_link(link, params),),
        routing=RoutingSpec(rules=(), fallback="node"),
    )
    async with mixed_inbound(spec, MonotonicClock()) as (inbound, _):
        assert inbound.bound is not None
        yield inbound.bound.port


async def dns_through_honk(
    link: str, dns_address: tuple[str, int], name: str, qid: int, params: tuple[tuple[str, str], ...] = ()
) -> tuple[int, int, list[str]]:
    """A DNS query from a SOCKS5 UDP ASSOCIATE client of honk (routing to the node of ``link``)
    to ``dns_address``; returns the parsed answer after checking it names the responder as its source."""
    from helpers.aio import close_writer, socks5_open
    from helpers.dns import build_query, parse_answer
    from helpers.socks import encode_address

    async with honk_via(link, params=params) as port:
        reader, writer, code, tail = await socks5_open(port, "0.0.0.0", 0, cmd=3)
        assert code == 0
        relay_port = int.from_bytes(tail[4:6], "big")
        loop = asyncio.get_running_loop()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            udp.setblocking(False)
            udp.connect(("127.0.0.1", relay_port))
            header = b"\x00\x00\x00" + encode_address(*dns_address)
            await loop.sock_sendall(udp, header + build_query(name, qid))
            reply = await asyncio.wait_for(loop.sock_recv(udp, 2048), STEP)
        await close_writer(writer)
    assert reply.startswith(header)  # the answer names the responder as its source
    return parse_answer(reply[len(header) :])
