"""The live-connection table.

One owner: :class:`ConnectionTracker` alone adds and removes entries. The flow
that opened an entry (a relay, an HTTP forwarder, a UDP association) owns its
byte counters and ``last_activity`` and exposes them through a
:class:`FlowHandle`; the tracker only reads them. Readers (API, metrics,
``honkctl``) get :class:`ConnectionInfo` snapshots, immutable copies.

Idle flows are found by one sweeper for all flows (:meth:`ConnectionTracker.run_sweeper`,
driven by the injected clock) instead of a timer per flow; the sweeper asks
the flow to close with ``IdleTimeout`` and the flow removes its own entry
(:meth:`TrackedFlow.release`) once it has actually ended.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from dataclasses import dataclass
from typing import Protocol

from honk.config.spec import DEFAULT_RELAY_IDLE_TIMEOUT, DEFAULT_UDP_IDLE_TIMEOUT
from honk.core.clock import Clock
from honk.core.errors import FlowClosed, HonkError, IdleTimeout
from honk.core.net import Address, Network

__all__ = ["ConnectionInfo", "ConnectionTracker", "FlowHandle", "TrackedFlow"]


class FlowHandle(Protocol):
    """What a live flow shows the tracker (a relay, a forwarder, a UDP association)."""

    bytes_up: int  # client → upstream, bytes
    bytes_down: int  # upstream → client, bytes
    last_activity: float  # clock.now() of the last byte or datagram

    def close(self, reason: HonkError | None = None) -> None:
        """Ask the flow to end with ``reason``; must be idempotent and not block."""



# Flow ids: a random per-process prefix and a counter, formatted like a UUID (what
# dashboards expect). Unique within the process without a urandom call per flow.
_FLOW_ID_PREFIX = uuid.uuid4().hex[:16]
_flow_counter = itertools.count(1)


def _next_flow_id() -> str:
    h = f"{_FLOW_ID_PREFIX}{next(_flow_counter):016x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"

@dataclass(frozen=True, slots=True)
class ConnectionInfo:
    """An immutable snapshot of one live flow."""

    id: str  # UUID-shaped, unique within this process, stable for the flow's life
    network: Network
    inbound: str  # inbound tag
    source: Address  # the client
    target: Address  # what the client asked for (a domain when it gave one)
    rule: str  # the routing rule that matched
    chain: tuple[str, ...]  # outbound names from the rule's target to the leaf
    upload: int  # bytes client → upstream so far
    download: int  # bytes upstream → client so far
    start: float  # wall-clock seconds since the epoch (clock.wall())
    plane_generation: int  # the Plane generation that routed the flow
    engine: str = ""  # the relay engine carrying a TCP flow ("native", "copy", ...); "" for others


def _as_error(reason: HonkError | str | None) -> HonkError:
    if isinstance(reason, HonkError):
        return reason
    return FlowClosed(reason or "closed by request")


class TrackedFlow:
    """A live entry. ``close(reason)`` reaches the flow's handle; ``release()`` removes it."""

    __slots__ = (
        "id",
        "network",
        "inbound",
        "source",
        "target",
        "rule",
        "chain",
        "start",
        "plane_generation",
        "close_reason",
        "_handle",
        "_tracker",
    )

    def __init__(
        self,
        tracker: ConnectionTracker,
        handle: FlowHandle,
        *,
        network: Network,
        inbound: str,
        source: Address,
        target: Address,
        rule: str,
        chain: tuple[str, ...],
        start: float,
        plane_generation: int,
    ) -> None:
        self.id = _next_flow_id()
        self.network = network
        self.inbound = inbound
        self.source = source
        self.target = target
        self.rule = rule
        self.chain = chain
        self.start = start
        self.plane_generation = plane_generation
        self.close_reason: HonkError | None = None
        self._handle = handle
        self._tracker = tracker

    @property
    def upload(self) -> int:
        return self._handle.bytes_up

    @property
    def download(self) -> int:
        return self._handle.bytes_down

    @property
    def last_activity(self) -> float:
        return self._handle.last_activity

    @property
    def engine(self) -> str:
        """Which relay engine carries the flow (the handle's ``engine``), "" if it has none."""
        return getattr(self._handle, "engine", "")

    @property
    def closing(self) -> bool:
        return self.close_reason is not None

    def close(self, reason: HonkError | str | None = None) -> None:
        """Ask the flow to end; the first reason is kept.

        ``reason`` is a typed error (``IdleTimeout``, ...), or a short text that
        becomes ``FlowClosed(text)``; ``None`` means ``FlowClosed("closed by request")``.
        """
        if self.close_reason is None:
            self.close_reason = _as_error(reason)
        self._handle.close(self.close_reason)

    def retarget(self, target: Address, rule: str, chain: tuple[str, ...]) -> None:
        """Record what the flow now carries (a UDP association learns it from its first datagram)."""
        self.target, self.rule, self.chain = target, rule, chain

    def release(self) -> None:
        """The flow has ended: remove it from the table. Idempotent."""
        self._tracker._remove(self.id)

    def info(self) -> ConnectionInfo:
        return ConnectionInfo(
            id=self.id,
            network=self.network,
            inbound=self.inbound,
            source=self.source,
            target=self.target,
            rule=self.rule,
            chain=self.chain,
            upload=self._handle.bytes_up,
            download=self._handle.bytes_down,
            start=self.start,
            plane_generation=self.plane_generation,
            engine=self.engine,
        )


class ConnectionTracker:
    """The table of live flows, keyed by id."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        # Used by run_sweeper unless it is given others (seconds); the
        # Dispatcher sets them from GlobalSpec.
        self.relay_idle_timeout = DEFAULT_RELAY_IDLE_TIMEOUT
        self.udp_idle_timeout = DEFAULT_UDP_IDLE_TIMEOUT
        self._flows: dict[str, TrackedFlow] = {}
        self._gone: dict[str, asyncio.Future[None]] = {}  # flow id -> resolves when it is removed
        self._idle = asyncio.Event()
        self._idle.set()
        self._ended_up = 0  # bytes of flows that have ended, client → upstream
        self._ended_down = 0  # and upstream → client
        self._ended_by_leaf: dict[str, list[int]] = {}  # leaf name -> [up, down] of ended flows
        self.opened = 0  # flows registered since start

    def __len__(self) -> int:
        return len(self._flows)

    def open(
        self,
        handle: FlowHandle,
        *,
        network: Network,
        inbound: str,
        source: Address,
        target: Address,
        rule: str,
        chain: tuple[str, ...],
        plane_generation: int,
    ) -> TrackedFlow:
        """Register a live flow; the caller must ``release()`` it when the flow ends."""
        flow = TrackedFlow(
            self,
            handle,
            network=network,
            inbound=inbound,
            source=source,
            target=target,
            rule=rule,
            chain=tuple(chain),
            start=self._clock.wall(),
            plane_generation=plane_generation,
        )
        self._flows[flow.id] = flow
        self._idle.clear()
        self.opened += 1
        return flow

    def _remove(self, flow_id: str) -> None:
        flow = self._flows.pop(flow_id, None)
        if flow is not None:
            up, down = flow.upload, flow.download
            self._ended_up += up
            self._ended_down += down
            if flow.chain:
                ended = self._ended_by_leaf.setdefault(flow.chain[-1], [0, 0])
                ended[0] += up
                ended[1] += down
        if not self._flows:
            self._idle.set()
        waiter = self._gone.pop(flow_id, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait_gone(self, flow_ids: list[str]) -> None:
        """Return once none of ``flow_ids`` is live any more (closing flows finish their end)."""
        loop = asyncio.get_running_loop()
        waits = []
        for flow_id in flow_ids:
            if flow_id in self._flows:
                waiter = self._gone.get(flow_id)
                if waiter is None:
                    waiter = self._gone[flow_id] = loop.create_future()
                waits.append(waiter)
        if waits:
            await asyncio.gather(*(asyncio.shield(w) for w in waits))

    def totals(self) -> tuple[int, int]:
        """Bytes relayed since start (ended flows and live ones so far): (up, down)."""
        up, down = self._ended_up, self._ended_down
        for flow in self._flows.values():
            up += flow.upload
            down += flow.download
        return up, down

    def bytes_by_leaf(self) -> dict[str, tuple[int, int, int]]:
        """Per leaf name: (bytes up, bytes down since start, live flows now)."""
        out = {name: (up, down, 0) for name, (up, down) in self._ended_by_leaf.items()}
        for flow in self._flows.values():
            if flow.chain:
                up, down, live = out.get(flow.chain[-1], (0, 0, 0))
                out[flow.chain[-1]] = (up + flow.upload, down + flow.download, live + 1)
        return out

    def forget_leaves(self, keep: set[str]) -> None:
        """Drop the ended-flow bytes of leaves the running configuration no longer has."""
        for name in [n for n in self._ended_by_leaf if n not in keep]:
            del self._ended_by_leaf[name]

    def snapshot(self) -> list[ConnectionInfo]:
        """Immutable copies of every live flow, oldest first."""
        return [flow.info() for flow in self._flows.values()]

    def get(self, flow_id: str) -> ConnectionInfo | None:
        flow = self._flows.get(flow_id)
        return flow.info() if flow is not None else None

    def close(self, flow_id: str, reason: HonkError | str | None = None) -> bool:
        """Ask one flow to end (default ``FlowClosed``); False if no such flow."""
        flow = self._flows.get(flow_id)
        if flow is None:
            return False
        flow.close(reason)
        return True

    def close_all(self, reason: HonkError | str | None = None) -> int:
        """Ask every live flow to end; returns how many were asked."""
        flows = list(self._flows.values())
        for flow in flows:
            flow.close(reason)
        return len(flows)

    async def wait_idle(self) -> None:
        """Return once no flow is live (immediately if none is)."""
        while self._flows:
            await self._idle.wait()

    def sweep_idle(self, now: float, relay_idle_timeout: float, udp_idle_timeout: float) -> list[str]:
        """Close every flow silent for at least its timeout (seconds); returns their ids.

        TCP flows use ``relay_idle_timeout``, UDP associations ``udp_idle_timeout``.
        Flows already closing are skipped.
        """
        closed = []
        for flow in list(self._flows.values()):
            if flow.closing:
                continue
            limit = udp_idle_timeout if flow.network is Network.UDP else relay_idle_timeout
            silent = now - flow.last_activity
            if silent >= limit:
                flow.close(IdleTimeout(f"no traffic for {silent:.1f}s"))
                closed.append(flow.id)
        return closed

    async def run_sweeper(
        self,
        interval: float,
        *,
        relay_idle_timeout: float | None = None,
        udp_idle_timeout: float | None = None,
    ) -> None:
        """Sweep idle flows every ``interval`` seconds of the tracker's clock, until cancelled.

        Timeouts default to the tracker's ``relay_idle_timeout`` / ``udp_idle_timeout``
        attributes, read at every sweep.
        """
        if interval <= 0:
            raise ValueError("sweep interval must be positive")
        while True:
            await self._clock.sleep(interval)
            self.sweep_idle(
                self._clock.now(),
                self.relay_idle_timeout if relay_idle_timeout is None else relay_idle_timeout,
                self.udp_idle_timeout if udp_idle_timeout is None else udp_idle_timeout,
            )
