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

Each flow records the outbound version it was opened on (the leaf's ``outbound_id``,
``tag@vN``), its user and its inbound session, so a drain, a revoked user or a removed
inbound closes exactly its own flows (:meth:`ConnectionTracker.close_version`,
:meth:`~ConnectionTracker.close_session`, :meth:`~ConnectionTracker.close_inbound`). A flow
that carries several upstreams (a UDP association's sub-links) answers for its versions
itself through :class:`MultiVersionHandle`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from honk.config.spec import DEFAULT_HALF_CLOSE_TIMEOUT, DEFAULT_RELAY_IDLE_TIMEOUT, DEFAULT_UDP_IDLE_TIMEOUT
from honk.core.clock import Clock
from honk.core.errors import FlowClosed, HalfCloseTimeout, HonkError, IdleTimeout, OutboundDrained
from honk.core.logs import kv
from honk.core.net import Address, Network

__all__ = ["ConnectionInfo", "ConnectionTracker", "FlowHandle", "MultiVersionHandle", "TrackedFlow"]

log = logging.getLogger("honk.connection")  # the logger of Dispatcher.relay's lines


class FlowHandle(Protocol):
    """What a live flow shows the tracker (a relay, a forwarder, a UDP association)."""

    bytes_up: int  # client → upstream, bytes
    bytes_down: int  # upstream → client, bytes
    last_activity: float  # clock.now() of the last byte or datagram

    def close(self, reason: HonkError | None = None) -> None:
        """Ask the flow to end with ``reason``; must be idempotent and not block."""


class MultiVersionHandle(FlowHandle, Protocol):
    """A flow over several upstreams (a UDP association): a drain closes only the sub-links
    of the drained version and the flow goes on."""

    def outbound_versions(self) -> set[str]:
        """The outbound versions the flow holds upstreams of now."""

    def close_version(self, outbound_id: str, reason: HonkError) -> int:
        """Close the sub-links of ``outbound_id``; 1 if the flow held any, else 0."""


# Flow ids: a random per-process prefix and a counter, formatted like a UUID (what
# dashboards expect). Unique within the process without a urandom call per flow.
_FLOW_ID_PREFIX = uuid.uuid4().hex[:16]
_FLOW_ID_HEAD = (
    f"{_FLOW_ID_PREFIX[:8]}-{_FLOW_ID_PREFIX[8:12]}-{_FLOW_ID_PREFIX[12:]}-"  # its first three groups
)
_flow_counter = itertools.count(1)


def _next_flow_id() -> str:
    count = f"{next(_flow_counter):016x}"  # the last two groups
    return f"{_FLOW_ID_HEAD}{count[:4]}-{count[4:]}"


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
    outbound_version: str = ""  # the leaf version it was opened on (tag@vN); "" before it is routed
    user: str = ""  # the inbound user it authenticated as; "" for none


def _as_error(reason: HonkError | str | None) -> HonkError:
    if isinstance(reason, HonkError):
        return reason
    return FlowClosed(reason or "closed by request")


def _log_end(flow: TrackedFlow) -> None:
    """The end of a flow that was asked to end: its reason's text, at info for a drain (an
    operator wants to see which flows a reload cut), at debug for the rest."""
    reason = flow.close_reason
    if reason is None:
        return
    level = logging.INFO if isinstance(reason, OutboundDrained) else logging.DEBUG
    if log.isEnabledFor(level):
        log.log(
            level,
            "flow ended %s",
            kv(
                id=flow.id,
                inbound=flow.inbound,
                network=flow.network.value,
                outbound_version=flow.outbound_version or "-",
                error=type(reason).__name__,
                reason=str(reason),
            ),
        )


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
        "outbound_version",
        "user",
        "session",
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
        outbound_version: str = "",
        user: str | None = None,
        session: object | None = None,
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
        self.outbound_version = outbound_version
        self.user = user
        self.session = session  # the inbound session (identity only); None for flows without one
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
    def half_closed_at(self) -> float | None:
        """When one of the flow's directions ended (its handle's ``half_closed_at``); None: neither has."""
        return getattr(self._handle, "half_closed_at", None)

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

    def retarget(
        self, target: Address, rule: str, chain: tuple[str, ...], outbound_version: str | None = None
    ) -> None:
        """Record what the flow now carries (a UDP association learns it from its first datagram)."""
        self.target, self.rule, self.chain = target, rule, chain
        if outbound_version is not None:
            self.outbound_version = outbound_version

    def versions(self) -> set[str]:
        """The outbound versions the flow holds: its own, or its sub-links' (a UDP association)."""
        held = getattr(self._handle, "outbound_versions", None)
        if held is not None:
            return held()
        return {self.outbound_version} if self.outbound_version else set()

    def close_version(self, outbound_id: str, reason: HonkError) -> bool:
        """End what the flow holds of ``outbound_id``: the whole flow if it was opened on it,
        only those sub-links if it carries several upstreams; whether anything was closed."""
        if self.closing:
            return False
        partial = getattr(self._handle, "close_version", None)
        if partial is not None:
            return partial(outbound_id, reason) > 0
        if self.outbound_version != outbound_id:
            return False
        self.close(reason)
        return True

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
            outbound_version=self.outbound_version,
            user=self.user or "",
        )


class ConnectionTracker:
    """The table of live flows, keyed by id."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        # Used by run_sweeper unless it is given others (seconds); the
        # Dispatcher sets them from GlobalSpec.
        self.relay_idle_timeout = DEFAULT_RELAY_IDLE_TIMEOUT
        self.udp_idle_timeout = DEFAULT_UDP_IDLE_TIMEOUT
        self.half_close_timeout = DEFAULT_HALF_CLOSE_TIMEOUT
        self._flows: dict[str, TrackedFlow] = {}
        self._gone: dict[str, asyncio.Future[None]] = {}  # flow id -> resolves when it is removed
        self._idle = asyncio.Event()
        self._idle.set()
        self._ended_up = 0  # bytes of flows that have ended, client → upstream
        self._ended_down = 0  # and upstream → client
        self._ended_by_leaf: dict[str, list[int]] = {}  # leaf name -> [up, down] of ended flows
        self.opened = 0  # flows registered since start
        self.removed = 0  # flows ended and removed since start (the descriptor budget's guess reads it)

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
        outbound_version: str = "",
        user: str | None = None,
        session: object | None = None,
    ) -> TrackedFlow:
        """Register a live flow; the caller must ``release()`` it when the flow ends.

        ``outbound_version`` is the ``outbound_id`` of the leaf it was opened on, ``session``
        the inbound session it belongs to (compared by identity)."""
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
            outbound_version=outbound_version,
            user=user,
            session=session,
        )
        self._flows[flow.id] = flow
        self._idle.clear()
        self.opened += 1
        return flow

    def _remove(self, flow_id: str) -> None:
        flow = self._flows.pop(flow_id, None)
        if flow is not None:
            self.removed += 1
            _log_end(flow)
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

    def close_version(self, outbound_id: str, reason: HonkError | str | None = None) -> int:
        """Ask the flows opened on outbound version ``outbound_id`` to end (default
        ``OutboundDrained``); a UDP association closes only its sub-links of that version.
        Returns how many flows were asked."""
        error = _as_error(reason) if reason is not None else OutboundDrained()
        return sum(1 for flow in list(self._flows.values()) if flow.close_version(outbound_id, error))

    def close_session(self, session: object, reason: HonkError | str | None = None) -> int:
        """Ask every flow of the inbound session ``session`` (by identity) to end; how many."""
        if session is None:  # flows without a session belong to no one
            return 0
        return self._close_where(lambda flow: flow.session is session, reason)

    def close_inbound(self, tag: str, reason: HonkError | str | None = None) -> int:
        """Ask every flow accepted by inbound ``tag`` to end; how many."""
        return self._close_where(lambda flow: flow.inbound == tag, reason)

    def _close_where(self, match: Callable[[TrackedFlow], bool], reason: HonkError | str | None) -> int:
        flows = [flow for flow in self._flows.values() if not flow.closing and match(flow)]
        for flow in flows:
            flow.close(reason)
        return len(flows)

    def versions_with_flows(self) -> dict[str, int]:
        """Outbound version -> live flows holding it (closing ones included until they end)."""
        counts: dict[str, int] = {}
        for flow in self._flows.values():
            for version in flow.versions():
                counts[version] = counts.get(version, 0) + 1
        return counts

    async def wait_idle(self) -> None:
        """Return once no flow is live (immediately if none is)."""
        while self._flows:
            await self._idle.wait()

    def sweep_idle(
        self, now: float, relay_idle_timeout: float, udp_idle_timeout: float, half_close_timeout: float = 0.0
    ) -> list[str]:
        """Close every flow silent for at least its timeout (seconds); returns their ids.

        TCP flows use ``relay_idle_timeout``, UDP associations ``udp_idle_timeout``; a flow one
        of whose directions has ended (its handle's ``half_closed_at``) is closed with
        :class:`HalfCloseTimeout` once silent for ``half_close_timeout`` since that end or its
        last byte, whichever came later (0: never). Flows already closing are skipped.
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
                continue
            half_closed_at = flow.half_closed_at
            if half_close_timeout > 0 and half_closed_at is not None:
                quiet = now - max(half_closed_at, flow.last_activity)
                if quiet >= half_close_timeout:
                    flow.close(HalfCloseTimeout(f"half-closed and silent for {quiet:.1f}s"))
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
                self.half_close_timeout,
            )
