"""honk's mixed port in the test's own event loop, routing everything to one node."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from honk.config.links import parse_node_link
from honk.config.spec import GlobalSpec, InboundSpec, RoutingSpec, Spec
from honk.connection.dispatch import Dispatcher
from honk.connection.plane import SystemResolver, build_plane
from honk.connection.tracker import ConnectionTracker
from honk.core.clock import MonotonicClock
from honk.inbound.mixed import MixedInbound

STEP = 10.0  # seconds: connect timeout and the bound on draining at the end


@contextlib.asynccontextmanager
async def honk_via(link: str, *, connect_timeout: float = STEP) -> AsyncIterator[int]:
    """A mixed inbound on a free loopback port whose fallback is the node of ``link``; yields the port."""
    clock = MonotonicClock()
    glob = GlobalSpec(connect_timeout=connect_timeout)
    inbound_spec = InboundSpec(name="lan", kind="mixed", host="127.0.0.1", port=0)
    spec = Spec(global_=glob, inbounds=(inbound_spec,), nodes=(parse_node_link(link, "node"),),
                routing=RoutingSpec(rules=(), fallback="node"))
    tracker = ConnectionTracker(clock)
    dispatcher = Dispatcher(build_plane(spec, clock, 1), tracker, clock, glob, SystemResolver(clock, connect_timeout))
    inbound = MixedInbound(inbound_spec, dispatcher, clock)
    await inbound.start()
    try:
        assert inbound.bound is not None
        yield inbound.bound.port
    finally:
        await inbound.aclose()
        tracker.close_all("test over")
        await asyncio.wait_for(tracker.wait_idle(), STEP)
