"""UDP associations of a mux node: one Mux.Cool UDP session per target on the node's carriers.

A VMess or VLESS node with ``mux`` sends its UDP the way v2ray's client does:
a UDP session per target on one of the node's shared carriers
(:class:`~honk.outbound.mux.MuxPool`). The New frame carries the first datagram,
each later datagram is one Keep frame naming its target, and each frame the
server sends back is one reply. No new physical connection is made while a
carrier has room, so a carrier the node keeps warm (a Selector's pin, the UDP
warm set) serves a cold association's first datagram at once.

:class:`MuxDatagramEndpoint` is one association's
:class:`~honk.outbound.base.PacketEndpoint`:

* ``dial_udp`` acquires a carrier before it returns, so an unreachable node
  fails the dial (what cold UDP preparation races on) and not a later send;
* a target's session opens on its first datagram; datagrams sent while its
  carrier is being acquired wait (at most
  :data:`~honk.outbound.stream_datagram.MAX_PENDING_PER_STREAM`, more are
  dropped and counted);
* a server End, clean or with the error option, ends only that target's
  session: the next datagram opens a new one (v2ray ends idle UDP sessions);
* the carrier's loss ends the endpoint with the carrier's one error, reported
  once through ``on_lost``; a target session that cannot get a carrier does too.

At most :data:`~honk.outbound.stream_datagram.MAX_STREAMS_PER_ENDPOINT`
sessions stay open per association; the oldest is ended past that.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from honk.core.errors import HonkError, UpstreamFailed
from honk.core.net import Address
from honk.outbound.base import DatagramSink, EndpointLost
from honk.outbound.bridge import upstream_failure
from honk.outbound.mux import MuxCarrier, MuxPool, OpenCarrier
from honk.outbound.stream_datagram import MAX_PENDING_PER_STREAM, MAX_STREAMS_PER_ENDPOINT
from honk.proto.mux import MAX_DATA, MuxSession, SessionState

__all__ = ["MuxDatagramEndpoint", "MuxPacketSession"]

log = logging.getLogger("honk.outbound.mux_udp")


class MuxPacketSession:
    """One target's UDP session on a carrier (what the carrier delivers frames of it to)."""

    def __init__(self, endpoint: MuxDatagramEndpoint, target: Address) -> None:
        self.endpoint = endpoint
        self.target = target
        self.carrier: MuxCarrier | None = None
        self.session: MuxSession | None = None
        self.pending: list[bytes] = []  # datagrams sent before the carrier was there
        self.task: asyncio.Task[None] | None = None

    def start(self, carrier: MuxCarrier) -> None:
        """Open the session on ``carrier`` with the first waiting datagram, then send the rest."""
        first, *rest = self.pending
        self.pending = []
        self.carrier = carrier
        self.session = carrier.open_packets(self.target, first, self)
        for payload in rest:
            self.send(payload)

    def send(self, payload: bytes) -> None:
        if self.session is None:  # not open yet: the first datagram opens it once a carrier is there
            if len(self.pending) >= MAX_PENDING_PER_STREAM:
                self.endpoint.dropped += 1
                return
            self.pending.append(payload)
            if self.carrier is not None:
                self.start(self.carrier)
            return
        if self.session.state is not SessionState.OPEN:
            self.endpoint.dropped += 1
            return
        assert self.carrier is not None
        self.carrier.send(self.carrier.sessions.send(self.session.id, payload, peer=self.target))

    # -- fed by the carrier ---------------------------------------------------------------

    def _datagram(self, data: bytes, source: Address) -> None:
        self.endpoint._deliver(data, source)

    def _end(self) -> None:
        self.endpoint._session_ended(self)

    # -- ended by the endpoint ------------------------------------------------------------

    def close(self) -> None:
        if self.task is not None and self.task is not asyncio.current_task():
            self.task.cancel()
        if self.carrier is not None and self.session is not None:
            self.carrier.forget(self)  # an End with the error option if it still sends


class MuxDatagramEndpoint:
    """A mux node's UDP path for one association (see the module docstring).

    Counters: ``dropped`` (datagrams sent while their session was gone, or beyond the queue of
    one still opening), ``send_errors`` (datagrams the frame cannot hold).
    """

    def __init__(
        self,
        outbound: str,
        pool: MuxPool,
        open_carrier: OpenCarrier,
        deadline: Callable[[], float],
        receive: DatagramSink,
        on_lost: EndpointLost | None,
    ) -> None:
        self.outbound = outbound
        self.pool = pool
        self._open_carrier = open_carrier
        self._deadline = deadline  # when a session's carrier must be there by, from now
        self._receive = receive
        self._on_lost = on_lost
        self._sessions: dict[Address, MuxPacketSession] = {}  # insertion order: oldest first
        self._closed = False
        self.dropped = 0
        self.send_errors = 0

    async def prepare(self, deadline: float) -> None:
        """Make sure the node has a carrier with room (opening one if needed): the dial."""
        await self.pool.acquire(self._open_carrier, deadline)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def sessions(self) -> int:
        """How many target sessions are open or opening."""
        return len(self._sessions)

    def send(self, payload: bytes, target: Address) -> None:
        if self._closed:
            self.dropped += 1
            return
        if len(payload) > MAX_DATA:
            self.send_errors += 1
            return
        flow = self._sessions.get(target)
        if flow is None:
            flow = self._start(target)
        try:
            flow.send(payload)
        except HonkError as exc:  # the carrier is gone: every session ends with its error
            self.dropped += 1
            self._finish(exc)

    def close(self) -> None:
        self._finish(None)

    def _start(self, target: Address) -> MuxPacketSession:
        while len(self._sessions) >= MAX_STREAMS_PER_ENDPOINT:
            oldest = next(iter(self._sessions))
            self._sessions.pop(oldest).close()
        flow = self._sessions[target] = MuxPacketSession(self, target)
        # the usual case: a carrier has room and the New frame goes out with this datagram
        flow.carrier = self.pool.with_room()
        if flow.carrier is None:
            flow.task = asyncio.get_running_loop().create_task(self._open(flow))
        return flow

    async def _open(self, flow: MuxPacketSession) -> None:
        try:
            carrier = await self.pool.acquire(self._open_carrier, self._deadline())
            if self._sessions.get(flow.target) is flow:
                flow.carrier = carrier
                if flow.pending:
                    flow.start(carrier)
        except asyncio.CancelledError:
            raise
        except HonkError as exc:
            self._finish(exc)
        except OSError as exc:
            self._finish(UpstreamFailed(f"{self.outbound}: UDP over mux failed: {exc.strerror or exc}"))
        finally:
            flow.task = None

    def _deliver(self, data: bytes, source: Address) -> None:
        if not self._closed:
            self._receive(data, source)

    def _session_ended(self, flow: MuxPacketSession) -> None:
        """The server ended ``flow``'s session, or its carrier failed."""
        if self._sessions.get(flow.target) is flow:
            del self._sessions[flow.target]
        session = flow.session
        if session is None or session.error is None or not getattr(session.error, "carrier_wide", True):
            return  # one target's session ended (v2ray's idle end, a reset): the next datagram reopens
        self._finish(upstream_failure(session.error))

    def _finish(self, error: HonkError | None) -> None:
        if self._closed:
            return
        self._closed = True
        sessions, self._sessions = self._sessions, {}
        for flow in sessions.values():
            flow.close()
        if error is not None:
            log.debug("udp over mux ended outbound=%s error=%s", self.outbound, type(error).__name__)
        if self._on_lost is not None:
            self._on_lost(error)
