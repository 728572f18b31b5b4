"""Mux.Cool carriers for VMess and VLESS nodes: many flows over one protocol stream.

A node asks for multiplexing with a ``mux`` parameter (``1``/``true``) in its
``params``: ``mux=1`` in a ``vless://`` query or ``"mux"`` in a ``vmess://`` link's
JSON (:mod:`honk.config.links`). Such a node dials each TCP flow as a logical stream:

* :class:`MuxPool` is the node's set of carriers. It lives as long as the
  node's :class:`~honk.outbound.runtime.NodeRuntime` (one pool per runtime,
  whichever leaf generation asks), opens a carrier when none has room and
  counts them (:attr:`MuxPool.carrier_count`). A node has no carrier cap of its
  own: every carrier holds a permit of the process carrier gate
  (:mod:`honk.outbound.admission`), and that gate alone bounds them (GH-J-06:
  "This global gate is authoritative; Mux.Cool does not impose a second per-node
  two-carrier limit").
* :class:`MuxCarrier` is one physical stream: the protocol's stream to
  :data:`~honk.proto.mux.MUX_COOL_TARGET` over the node's transport, holding up
  to :data:`MAX_STREAMS_PER_CARRIER` sessions
  (:class:`~honk.proto.mux.MuxClientSessions`). The runtime owns it; it closes
  itself after :data:`MUX_IDLE_TIMEOUT` seconds without a session, on the
  leaf's clock. A retired carrier (its node left service in a reload, or was
  found dead) takes no new stream and closes when its last stream ends. When
  the carrier fails (EOF, reset, a codec or framing error) every session on it
  ends with that one error object and the carrier logs the episode once.
* :class:`MuxStream` is one logical stream as a
  :class:`~honk.outbound.channel.Channel` (New frame on open, Keep frames for
  data, End on ``write_eof``), which the leaf hands to the relay through
  :func:`~honk.outbound.bridge.bridge_stream`. A server End ends only its stream.

A mux node's UDP associations ride the same carriers, one UDP session per target
(:mod:`honk.outbound.mux_udp`): one frame is one datagram.

Mux.Cool has no per-session flow control: like v2ray's client, the carrier stops
reading while one stream holds :data:`STREAM_BUFFER_LIMIT` unread bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

from honk.core.clock import Clock, TimerHandle, timeout_at
from honk.core.errors import CapacityRefused, CodecError, DialTimeout, FlowClosed
from honk.core.logs import kv
from honk.core.net import Address, Network
from honk.outbound.admission import AdmissionWatch, CarrierPermit, process_gates
from honk.outbound.base import DialedStream
from honk.outbound.bridge import bridged
from honk.outbound.channel import Channel
from honk.outbound.runtime import WarmOwner
from honk.proto.mux import (
    MAX_DATA,
    MuxClientSessions,
    MuxDecoder,
    MuxError,
    MuxEventKind,
    MuxFrame,
    MuxSession,
    SessionState,
    encode_frame,
)

__all__ = [
    "MAX_STREAMS_PER_CARRIER",
    "MUX_IDLE_TIMEOUT",
    "MuxCarrier",
    "MuxPool",
    "MuxStream",
    "mux_requested",
    "pool_for",
]

# v2ray's client defaults to 8 sessions per carrier; honk allows more so that one carrier
# serves a node's usual fan-out (issue 5 asks for 50 streams on one carrier)
MAX_STREAMS_PER_CARRIER = 128
MUX_IDLE_TIMEOUT = 30.0  # seconds a carrier without sessions stays open (honk's choice)
STREAM_BUFFER_LIMIT = 256 * 1024  # unread bytes one stream may hold before the carrier stops reading
# the warm owners whose node keeps one idle carrier: the TCP path's session (a Selector's pin,
# GH-I-04) and the UDP path's (the UDP warm set, GH-I-06), since both ride the node's one shared
# pool; preconnect only seeds bare connections (GH-I-08, 09)
SESSION_OWNERS = WarmOwner.SELECTOR_PIN | WarmOwner.UDP_WARM

MUX_TRUE = frozenset({"1", "true", "yes", "on"})

log = logging.getLogger("honk.outbound.mux")

OpenCarrier = Callable[[float], Awaitable[Channel]]


def mux_requested(params: tuple[tuple[str, str], ...]) -> bool:
    """Whether a node's params ask for Mux.Cool (``mux=1`` or ``mux=true``)."""
    return dict(params).get("mux", "").strip().lower() in MUX_TRUE


class MuxStream:
    """One logical TCP stream on a carrier, as a Channel."""

    def __init__(self, carrier: MuxCarrier, session: MuxSession) -> None:
        self.carrier = carrier
        self.session = session
        self._buf = bytearray()
        self._ended = False  # the server ended the session, or the carrier failed
        self._waiter: asyncio.Future[None] | None = None
        self._drained: asyncio.Future[None] | None = None
        self._closed = False

    @property
    def error(self) -> BaseException | None:
        """What ended the stream abnormally (the carrier's shared error, or a session reset)."""
        return self.session.error

    # -- fed by the carrier ---------------------------------------------------------

    def _deliver(self, data: bytes) -> None:
        self._buf += data
        self._wake()

    def _end(self) -> None:
        self._ended = True
        self._wake()
        self._wake_drained()

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _wake_drained(self) -> None:
        waiter, self._drained = self._drained, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _until_drained(self) -> None:
        while len(self._buf) > STREAM_BUFFER_LIMIT and not self._ended and not self._closed:
            self._drained = asyncio.get_running_loop().create_future()
            await self._drained

    # -- Channel --------------------------------------------------------------------

    async def receive(self) -> bytes:
        while True:
            if self._buf:
                data = bytes(self._buf)
                self._buf.clear()
                self._wake_drained()
                return data
            if self._ended or self._closed:
                if self.session.error is not None:
                    raise self.session.error
                return b""
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter

    def write(self, data: bytes) -> None:
        if self.session.error is not None:
            raise self.session.error
        if self.session.state is not SessionState.OPEN:
            return  # the server ended the session: nothing more goes out on it
        view = memoryview(data)
        for start in range(0, len(view), MAX_DATA):
            self.carrier.send(
                self.carrier.sessions.send(self.session.id, bytes(view[start : start + MAX_DATA]))
            )

    async def drain(self) -> None:
        await self.carrier.drain()
        if self.session.error is not None:
            raise self.session.error

    def write_eof(self) -> None:
        if self.session.state is SessionState.OPEN:
            self.carrier.send(self.carrier.sessions.close(self.session.id))

    def close(self) -> None:
        """Done with the stream: drop it from the carrier (an End with the error option if still open)."""
        if self._closed:
            return
        self._closed = True
        self._wake()
        self._wake_drained()
        self.carrier.forget(self)

    def abort(self) -> None:
        self.close()


class MuxCarrier:
    """One physical Mux.Cool carrier of a node and the logical streams on it."""

    def __init__(self, pool: MuxPool, channel: Channel) -> None:
        self.pool = pool
        self.channel = channel  # the protocol's stream to v1.mux.cool
        self.sessions = MuxClientSessions(MAX_STREAMS_PER_CARRIER)
        self.streams: dict[int, MuxStream] = {}
        self.closed = False
        self.retired = False
        self._decoder = MuxDecoder()
        self._idle: TimerHandle | None = None
        self._retire_check: asyncio.Handle | None = None  # an idle retired carrier's close, next turn
        self._draining = asyncio.Lock()  # the transport wakes one drain waiter at a time
        self._reader = asyncio.get_running_loop().create_task(self._read())
        # the carrier's slot of the process carrier gate (GH-J-06), given back once in MuxPool.discard
        self.permit: CarrierPermit | None = None

    @property
    def usable(self) -> bool:
        return not self.closed and not self.retired and not self.sessions.full

    @property
    def idle(self) -> bool:
        """No session is open on the carrier."""
        return self.sessions.idle

    def retire(self) -> None:
        """Take no new streams; close once the open ones have ended (the node was found dead,
        or left service in a reload). An idle one closes on the loop's next turn rather than
        now: a carrier a retiring runtime just adopted was opened for a flow that was already
        dialling, and that flow's stream opens on it without yielding (:meth:`MuxPool.open_stream`)."""
        if self.closed:
            return
        self.retired = True
        self._cancel_idle()
        if not self.sessions.idle:
            return  # forget() and a server End close it after the last stream
        if self._retire_check is None:
            self._retire_check = asyncio.get_running_loop().call_soon(self._close_if_idle)

    def _close_if_idle(self) -> None:
        self._retire_check = None
        self._arm_idle()

    def open_stream(self, target: Address) -> MuxStream:
        session, frame = self.sessions.open(Network.TCP, target)
        stream = MuxStream(self, session)
        self.streams[session.id] = stream
        self._cancel_idle()
        self.send(frame)
        return stream

    def open_packets(self, target: Address, first: bytes, flow: Any) -> MuxSession:
        """A UDP session to ``target`` whose New frame carries the datagram ``first``; ``flow``
        (:class:`~honk.outbound.mux_udp.MuxPacketSession`) receives its replies and its end."""
        session, frame = self.sessions.open(Network.UDP, target, first)
        self.streams[session.id] = flow
        self._cancel_idle()
        self.send(frame)
        return session

    def send(self, frame: MuxFrame) -> None:
        if self.sessions.failure is not None:
            raise self.sessions.failure
        try:
            self.channel.write(encode_frame(frame))
        except Exception as exc:  # noqa: BLE001 - whatever broke the carrier is its failure
            self.fail(exc)
            raise self.sessions.failure from None  # type: ignore[misc]

    async def drain(self) -> None:
        if self.sessions.failure is not None:
            raise self.sessions.failure
        try:
            async with self._draining:
                await self.channel.drain()
        except Exception as exc:  # noqa: BLE001
            self.fail(exc)
            raise self.sessions.failure from None  # type: ignore[misc]

    def forget(self, stream: MuxStream) -> None:
        """A stream's owner closed it: end its session here (telling the server if it still sends)."""
        session = stream.session
        if self.streams.get(session.id) is stream:
            del self.streams[session.id]
        if self.sessions.get(session.id) is session:
            was_open = session.state is SessionState.OPEN
            frame = self.sessions.abort(session.id)
            if was_open and self.sessions.failure is None and not self.closed:
                with contextlib.suppress(Exception):
                    self.send(frame)
        self._arm_idle()

    def close(self) -> None:
        """Close the carrier (the runtime going away, or idle): its streams end with one error,
        a deliberate close (neutral for Score: it says nothing about the node)."""
        if not self.closed:
            self.fail(FlowClosed("the node's mux carrier was closed"), quiet=True)

    def fail(self, error: BaseException, *, quiet: bool = False) -> None:
        """The carrier is gone: every stream on it ends with one error object (one episode for
        Score, logged once). A loss that is not already the carrier's codec error becomes one
        (``carrier-lost``, caused by it): losing the carrier is the node's failure, for every
        stream on it."""
        if self.closed:
            return
        self.closed = True
        if not isinstance(error, FlowClosed) and not (isinstance(error, CodecError) and error.carrier_wide):
            lost = MuxError(
                "carrier-lost", f"{type(error).__name__}: {getattr(error, 'reason', '') or error}"
            )
            lost.__cause__ = error
            error = lost
        ended = self.sessions.fail(error)
        if not quiet or ended:
            log.warning(
                "mux carrier failed %s",
                kv(
                    node=self.pool.name,
                    streams=len(ended),
                    error=type(error).__name__,
                    reason=getattr(error, "reason", "") or str(error),
                ),
            )
        for session in ended:
            stream = self.streams.get(session.id)
            if stream is not None:
                stream._end()
        self._cancel_idle()
        if self._retire_check is not None:
            self._retire_check.cancel()
            self._retire_check = None
        self._reader.cancel()
        self.channel.abort()
        self.pool.discard(self)

    async def _read(self) -> None:
        try:
            while data := await self.channel.receive():
                for frame in self._decoder.feed(data):
                    await self._dispatch(frame)
            self._decoder.feed(b"")  # raises if the carrier stopped inside a frame
            raise MuxError("carrier-closed", "the server closed the carrier")
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure ends every session with it
            self.fail(exc)

    async def _dispatch(self, frame: MuxFrame) -> None:
        event = self.sessions.receive(frame)
        if event.reply is not None:
            self.send(event.reply)
        if event.session is None:
            return
        stream = self.streams.get(event.session.id)
        if stream is None:
            return
        if event.session.network is Network.UDP:  # one frame, one datagram: no stream buffer to drain
            if event.kind is MuxEventKind.END:
                stream._end()
                self._arm_idle()
            else:
                stream._datagram(event.data, event.source or event.session.target)
            return
        if event.data:
            stream._deliver(event.data)
        if event.kind is MuxEventKind.END:
            stream._end()
            self._arm_idle()
        elif event.data:
            await stream._until_drained()  # head-of-line, as v2ray: no per-session window

    def _arm_idle(self) -> None:
        if self.closed or not self.sessions.idle:
            return
        if self.retired:
            self.close()
            return
        if self._idle is not None:
            return
        self._idle = self.pool.clock.call_later(MUX_IDLE_TIMEOUT, self._idle_expired)

    def _cancel_idle(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None

    def _idle_expired(self) -> None:
        self._idle = None
        if self.sessions.idle and not self.closed:
            if self.pool.keeps(self):  # the node is held warm: its one carrier waits for the next flow
                self._arm_idle()
                return
            log.debug("mux carrier idle %s", kv(node=self.pool.name))
            self.close()


class MuxPool:
    """A node's Mux.Cool carriers: opened on demand, bounded, owned by the node's runtime."""

    def __init__(self, name: str, clock: Clock, runtime: Any = None) -> None:
        self.name = name
        self.clock = clock
        # the node's NodeRuntime (None for a leaf built outside a registry); weak, since the
        # module's pool table is keyed by the runtime and must not keep it alive
        self._runtime = weakref.ref(runtime) if runtime is not None else None
        self.carriers: list[MuxCarrier] = []
        self.opened = 0  # carriers opened over the pool's life
        self._dialing = asyncio.Lock()

    @property
    def runtime(self) -> Any:
        return self._runtime() if self._runtime is not None else None

    @property
    def carrier_count(self) -> int:
        """Physical carriers open right now."""
        return len(self.carriers)

    async def dial(self, open_carrier: OpenCarrier, target: Address, deadline: float) -> DialedStream:
        """A logical stream to ``target``, bridged to a socket for the relay."""
        stream = await self.open_stream(open_carrier, target, deadline)
        return bridged(stream)

    async def open_stream(self, open_carrier: OpenCarrier, target: Address, deadline: float) -> MuxStream:
        carrier = await self.acquire(open_carrier, deadline)
        return carrier.open_stream(target)

    async def acquire(self, open_carrier: OpenCarrier, deadline: float) -> MuxCarrier:
        """A carrier with room for one more session: one that is open, else a new one (one
        carrier dial at a time: concurrent callers wait and share it)."""
        carrier = self.with_room()
        if carrier is None:
            admission = AdmissionWatch()
            try:
                async with timeout_at(self.clock, deadline):
                    async with self._dialing:  # one carrier dial at a time: the others wait and share it
                        carrier = self.with_room()
                        if carrier is None:
                            carrier = await self._open(open_carrier, deadline, admission)
            except TimeoutError:
                if admission.interrupted:  # still waiting for a carrier slot: a local refusal (GH-J-07)
                    raise CapacityRefused(f"{self.name}: no mux carrier slot before the deadline") from None
                raise DialTimeout(self.name, "connect", "mux: no carrier before the deadline") from None
        return carrier

    async def ensure_carrier(self, open_carrier: OpenCarrier, deadline: float) -> bool:
        """A usable carrier, opened now when there is none (warm-up: the session a pinned node
        keeps); whether it opened one. Shares the one-dial-at-a-time lock with the flows."""
        if self.with_room() is not None:
            return False
        async with timeout_at(self.clock, deadline):
            async with self._dialing:
                if self.with_room() is not None:
                    return False
                await self._open(open_carrier, deadline)
                return True

    def keeps(self, carrier: MuxCarrier) -> bool:
        """Whether ``carrier`` stays open while idle: the node is held warm by an owner that
        keeps a session (a Selector's pin, the UDP warm set) and it is the pool's first usable
        carrier (only one is kept)."""
        runtime = self.runtime
        if runtime is None or runtime.closed or not runtime.warm & SESSION_OWNERS:
            return False  # a node out of service keeps nothing idle
        return self.with_room() is carrier

    @property
    def has_room(self) -> bool:
        """A carrier can take another stream now: a dial opens no physical connection."""
        return self.with_room() is not None

    def with_room(self) -> MuxCarrier | None:
        """The first carrier that takes another session now, if any."""
        return next((c for c in self.carriers if c.usable), None)

    async def _open(
        self, open_carrier: OpenCarrier, deadline: float, admission: AdmissionWatch | None = None
    ) -> MuxCarrier:
        # no per-node cap (GH-J-06): every physical carrier holds a process carrier slot for its
        # whole life, idle included, and that global gate is the only bound on how many open
        permit = await process_gates().carrier_permit(deadline, clock=self.clock, watch=admission)
        try:
            channel = await open_carrier(deadline)
            carrier = MuxCarrier(self, channel)
        except BaseException:
            permit.release()
            raise
        carrier.permit = permit
        self.carriers.append(carrier)
        self.opened += 1
        if (runtime := self.runtime) is not None:
            runtime.own(carrier)
        return carrier

    def discard(self, carrier: MuxCarrier) -> None:
        if carrier.permit is not None:
            carrier.permit.release()  # idempotent: a carrier gives its slot back once
        with contextlib.suppress(ValueError):
            self.carriers.remove(carrier)
        if (runtime := self.runtime) is not None:
            runtime.release(carrier)

    def close(self) -> None:
        for carrier in list(self.carriers):
            carrier.close()


# One pool per runtime: a rebuilt leaf of the same node (same NodeId, same runtime) keeps its carriers.
_pools: weakref.WeakKeyDictionary[Any, MuxPool] = weakref.WeakKeyDictionary()


def pool_for(leaf: Any) -> MuxPool:
    """The carrier pool of ``leaf``'s node: its runtime's, or the leaf's own without a runtime."""
    owner = leaf.runtime if leaf.runtime is not None else leaf
    pool = _pools.get(owner)
    # a retiring runtime keeps its pool: its busy carriers still count, and a flow of the old
    # plane still dialling gets a carrier the runtime adopts retired (NodeRuntime.own)
    if pool is None or (leaf.runtime is not None and leaf.runtime.closed and not leaf.runtime.retiring):
        pool = _pools[owner] = MuxPool(leaf.name, leaf.clock, leaf.runtime)
    pool.name = leaf.name
    return pool
