"""The per-flow pipeline between an inbound and the relay.

For a TCP flow an inbound calls, in order:

1. :meth:`Dispatcher.connect` -- ``plane.decide(meta)`` picks the rule and the
   leaf, then ``leaf.dial_tcp(target, deadline=clock.now() + connect_timeout)``.
   It raises ``Blocked``, ``NoRoute``, ``DialError``/``DialTimeout`` or
   ``NotSupported``, which the inbound turns into its protocol's refusal.
2. the inbound's own success reply (SOCKS5 ``0x00``, HTTP ``200``);
3. :meth:`Dispatcher.relay` -- registers the flow in the tracker with its rule
   and chain, relays until it ends, and removes it.

The plane is read once per flow, at ``connect``: :meth:`Dispatcher.swap_plane`
affects only flows that start afterwards, established flows keep their
sockets. This object holds no per-flow state.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from honk.config.spec import GlobalSpec
from honk.connection.tracker import ConnectionTracker, FlowHandle, TrackedFlow
from honk.core.clock import Clock
from honk.core.errors import HonkError
from honk.core.net import FlowMeta, Network
from honk.outbound.base import Outbound
from honk.relay import relay_engine
from honk.relay.stream import StreamConn

__all__ = ["Dispatcher", "Resolver", "Routed", "Upstream", "format_chain"]

log = logging.getLogger("honk.connection")

# host → IP literals; the plane's SystemResolver is one.
Resolver = Callable[[str], Awaitable[Sequence[Any]]]


class PlaneLike(Protocol):
    """What the dispatcher needs of ``honk.connection.plane.Plane``."""

    generation: int

    async def decide(self, meta: FlowMeta, resolver: Resolver) -> Any: ...


@dataclass(frozen=True, slots=True)
class Routed:
    """A routing decision for one flow, with the plane generation that made it."""

    meta: FlowMeta
    outbound: str  # the rule's target (an outbound or a group)
    rule: str
    chain: tuple[str, ...]  # rule target → ... → leaf
    leaf: Outbound
    plane_generation: int


@dataclass(frozen=True, slots=True)
class Upstream:
    """A dialed upstream for one TCP flow."""

    routed: Routed
    sock: socket.socket
    framing: Any = None  # DialedStream.framing: None for a plain stream


def format_chain(chain: Sequence[str]) -> str:
    return ">".join(chain) if chain else "-"


class Dispatcher:
    def __init__(
        self,
        plane: PlaneLike,
        tracker: ConnectionTracker,
        clock: Clock,
        global_spec: GlobalSpec,
        resolver: Resolver,
    ) -> None:
        self._plane = plane
        self.tracker = tracker
        self.clock = clock
        self.resolver = resolver
        # told the chain of every real selection (the health service wakes idle URLTest groups)
        self.on_selection: Callable[[tuple[str, ...]], None] | None = None
        self._apply_settings(global_spec)

    def _apply_settings(self, global_spec: GlobalSpec) -> None:
        self.global_spec = global_spec
        self.tracker.relay_idle_timeout = global_spec.relay_idle_timeout
        self.tracker.udp_idle_timeout = global_spec.udp_idle_timeout

    @property
    def plane(self) -> PlaneLike:
        return self._plane

    def swap_plane(
        self, plane: PlaneLike, global_spec: GlobalSpec | None = None, resolver: Resolver | None = None
    ) -> None:
        """New flows route with ``plane`` (and dial with the given settings and resolver);
        established flows are untouched, except that idle timeouts apply to all flows."""
        if global_spec is not None:
            self._apply_settings(global_spec)
        if resolver is not None:
            self.resolver = resolver
        self._plane = plane

    async def route(self, meta: FlowMeta) -> Routed:
        """Decide the rule and leaf for ``meta``; raises ``NoRoute`` (and whatever the plane raises)."""
        plane = self._plane
        return self._routed(meta, await plane.decide(meta, self.resolver), plane.generation)

    def route_now(self, meta: FlowMeta) -> Routed | None:
        """:meth:`route` when the plane can decide without awaiting (no DNS needed), else
        ``None`` (call :meth:`route`). Raises what :meth:`route` raises."""
        plane = self._plane
        decide_now = getattr(plane, "decide_now", None)
        if decide_now is None:
            return None
        decision = decide_now(meta)
        if decision is None:
            return None
        return self._routed(meta, decision, plane.generation)

    def _routed(self, meta: FlowMeta, decision: Any, generation: int) -> Routed:
        chain = tuple(decision.selection.chain)
        if self.on_selection is not None and len(chain) > 1:
            self.on_selection(chain)
        return Routed(
            meta=meta,
            outbound=decision.route.outbound,
            rule=decision.route.rule,
            chain=chain,
            leaf=decision.selection.leaf,
            plane_generation=generation,
        )

    async def connect(self, meta: FlowMeta) -> Upstream:
        """Route and dial a TCP flow; raises Blocked/NoRoute/DialError/DialTimeout/NotSupported."""
        routed = await self.route(meta)
        deadline = self.clock.now() + self.global_spec.connect_timeout
        dialed = await routed.leaf.dial_tcp(meta.target, deadline)
        return Upstream(routed, dialed.sock, dialed.framing)

    def track(self, routed: Routed, handle: FlowHandle, network: Network = Network.TCP) -> TrackedFlow:
        """Register a flow the caller relays itself (HTTP forwarding, UDP)."""
        meta = routed.meta
        return self.tracker.open(
            handle,
            network=network,
            inbound=meta.inbound,
            source=meta.source,
            target=meta.target,
            rule=routed.rule,
            chain=routed.chain,
            plane_generation=routed.plane_generation,
        )

    async def relay(self, upstream: Upstream, client: StreamConn) -> HonkError | None:
        """Relay until the flow ends; returns how it ended (``None`` = both sides finished)."""
        routed = upstream.routed
        meta = routed.meta
        engine = relay_engine(self.clock)
        flow = self.track(routed, engine)
        log.debug(
            "TCP connection inbound=%s source=%s target=%s rule=%s chain=%s",
            meta.inbound,
            meta.source,
            meta.target,
            routed.rule,
            format_chain(routed.chain),
        )
        try:
            await engine.run(client, upstream.sock, upstream.framing)
        except HonkError as exc:
            return exc
        finally:
            flow.release()
        return None
