"""Mux.Cool (v2ray's multiplexer) frames and a client session table, without I/O.

Theory of operation:
  * A carrier is one VMess or VLESS stream whose target is
    :data:`MUX_COOL_TARGET`. On it, both sides exchange frames:
    ``metadata-length(2) metadata [data-length(2) data]``. The metadata is
    ``session-id(2) status(1) option(1)`` and, for a New frame (and for a UDP
    Keep frame, which names the datagram's peer), ``network(1)`` plus the
    target in v2ray's port-then-address layout. The data part is present when
    the option has :data:`OPTION_DATA`; :data:`OPTION_ERROR` on an End frame
    says the session ended abnormally.
  * :func:`encode_frame` and :class:`MuxDecoder` turn :class:`MuxFrame` into
    bytes and back. Malformed frames raise :class:`MuxProtocolError`; a
    decoder that failed refuses all further input (the carrier is lost).
  * :class:`MuxClientSessions` is the client's table of logical sessions on
    one carrier: it allocates ids, builds the frames to send, maps received
    frames to sessions and tracks each session's state. A carrier failure
    ends every session with the one error object it was given (one episode);
    a server End ends only its own session.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterator
from dataclasses import dataclass

from honk.core.errors import CapacityRefused, CodecError
from honk.core.net import Address, Network
from honk.proto.splitter import StreamSplitter
from honk.proto.vless import AddressFormatError, encode_port_address, parse_port_address

__all__ = [
    "DEFAULT_CONCURRENCY",
    "MAX_CONCURRENCY",
    "MAX_DATA",
    "MAX_METADATA",
    "MUX_COOL_TARGET",
    "OPTION_DATA",
    "OPTION_ERROR",
    "MuxClientSessions",
    "MuxDecoder",
    "MuxError",
    "MuxEvent",
    "MuxEventKind",
    "MuxFrame",
    "MuxProtocolError",
    "MuxSession",
    "MuxSessionReset",
    "SessionState",
    "SessionStatus",
    "encode_frame",
]

# v2ray's mux client dials this pseudo-target (app/proxyman/outbound, common/mux/client.go)
MUX_COOL_TARGET = Address("v1.mux.cool", 9527)

OPTION_DATA = 0x01
OPTION_ERROR = 0x02

NETWORK_TCP = 0x01
NETWORK_UDP = 0x02

MAX_METADATA = 512  # v2ray's FrameMetadata.Unmarshal rejects longer metadata
MAX_DATA = 0xFFFF  # the data length is two bytes
META_HEAD = 4  # session id, status, option
MAX_SESSION_ID = 0xFFFF

DEFAULT_CONCURRENCY = 8  # v2ray's mux "concurrency" default: logical sessions per carrier
MAX_CONCURRENCY = 1024  # the largest "concurrency" v2ray's configuration accepts

_U16 = struct.Struct("!H")
_HEAD = struct.Struct("!HBB")

_NETWORK_BYTE = {Network.TCP: NETWORK_TCP, Network.UDP: NETWORK_UDP}
_BYTE_NETWORK = {NETWORK_TCP: Network.TCP, NETWORK_UDP: Network.UDP}


class SessionStatus(enum.IntEnum):
    """The metadata's status byte."""

    NEW = 0x01
    KEEP = 0x02
    END = 0x03
    KEEP_ALIVE = 0x04


_STATUSES = frozenset(int(s) for s in SessionStatus)


# --- errors ----------------------------------------------------------------------


class MuxError(CodecError):
    """A Mux.Cool carrier or session failed; ``reason`` is a stable slug."""

    protocol = "mux"


class MuxProtocolError(MuxError):
    """The carrier's bytes break Mux.Cool framing; the whole carrier is unusable."""


class MuxSessionReset(MuxError):
    """The server ended one session with the error option; the others are unaffected."""

    carrier_wide = False

    def __init__(self, session_id: int) -> None:
        super().__init__("session-reset", f"session {session_id}")
        self.session_id = session_id


# --- frames ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MuxFrame:
    """One Mux.Cool frame.

    ``data`` is ``None`` when the frame has no data part (``b""`` is an empty
    one). ``network`` and ``target`` are set on New frames and on UDP Keep
    frames that name the datagram's peer; elsewhere they are ``None``.
    """

    session_id: int
    status: SessionStatus
    data: bytes | None = None
    error: bool = False
    network: Network | None = None
    target: Address | None = None

    @property
    def option(self) -> int:
        return (OPTION_DATA if self.data is not None else 0) | (OPTION_ERROR if self.error else 0)


def encode_frame(frame: MuxFrame) -> bytes:
    """The wire bytes of ``frame``. Raises ValueError for a frame the format cannot hold."""
    if not 0 <= frame.session_id <= MAX_SESSION_ID:
        raise ValueError("a Mux.Cool session id is 16 bits")
    meta = _HEAD.pack(frame.session_id, int(frame.status), frame.option)
    if frame.status is SessionStatus.NEW or frame.target is not None:
        if frame.network is None or frame.target is None:
            raise ValueError("a New frame needs a network and a target")
        meta += bytes((_NETWORK_BYTE[frame.network],)) + encode_port_address(frame.target)
    parts = [_U16.pack(len(meta)), meta]
    if frame.data is not None:
        if len(frame.data) > MAX_DATA:
            raise ValueError(f"a Mux.Cool frame carries at most {MAX_DATA} bytes")
        parts += [_U16.pack(len(frame.data)), frame.data]
    return b"".join(parts)


class MuxDecoder(StreamSplitter[MuxFrame]):
    """Splits a carrier's byte stream into :class:`MuxFrame` objects, in any split.

    Raises :class:`MuxProtocolError` (``metadata-too-short``,
    ``metadata-too-long``, ``bad-status``, ``bad-network``,
    ``bad-address-type``, ``bad-domain``, ``empty-domain``,
    ``truncated-address``, ``truncated-frame``); after that every feed
    raises again.
    """

    error = MuxProtocolError
    truncated = ("truncated-frame", "EOF inside a frame")
    stream = "carrier"

    def _split(self, buf: bytearray, out: list[MuxFrame]) -> int:
        pos = 0
        while len(buf) - pos >= 2:
            (meta_len,) = _U16.unpack_from(buf, pos)
            if meta_len > MAX_METADATA:
                self._fail(MuxProtocolError("metadata-too-long", f"{meta_len} bytes"))
            if meta_len < META_HEAD:
                self._fail(MuxProtocolError("metadata-too-short", f"{meta_len} bytes"))
            meta_end = pos + 2 + meta_len
            if len(buf) < meta_end:
                break
            # the metadata is checked as soon as it is whole, before waiting for the data
            frame = self._metadata(bytes(buf[pos + 2 : meta_end]))
            end = meta_end
            if frame.data is not None:
                if len(buf) < meta_end + 2:
                    break
                (data_len,) = _U16.unpack_from(buf, meta_end)
                end = meta_end + 2 + data_len
                if len(buf) < end:
                    break
                frame = _with_data(frame, bytes(buf[meta_end + 2 : end]))
            out.append(frame)
            pos = end
        return pos

    def _metadata(self, meta: bytes) -> MuxFrame:
        session_id, status, option = _HEAD.unpack_from(meta)
        if status not in _STATUSES:
            self._fail(MuxProtocolError("bad-status", f"status {status:#04x}"))
        kind = SessionStatus(status)
        network: Network | None = None
        target: Address | None = None
        # New frames always name a target; Keep frames may (UDP peers); other bits are ignored, as v2ray does
        if kind is SessionStatus.NEW or (kind is SessionStatus.KEEP and len(meta) > META_HEAD):
            if len(meta) == META_HEAD:  # a New frame that stops before its network byte
                self._fail(MuxProtocolError("truncated-address"))
            network = _BYTE_NETWORK.get(meta[META_HEAD])
            if network is None:
                self._fail(MuxProtocolError("bad-network", f"network {meta[META_HEAD]:#04x}"))
            try:
                parsed = parse_port_address(meta, META_HEAD + 1)
            except AddressFormatError as exc:
                self._fail(MuxProtocolError(exc.reason))
            if parsed is None:
                self._fail(MuxProtocolError("truncated-address"))
            target = parsed[0]
        data = b"" if option & OPTION_DATA else None  # a placeholder until the data arrives
        return MuxFrame(session_id, kind, data, bool(option & OPTION_ERROR), network, target)


def _with_data(frame: MuxFrame, data: bytes) -> MuxFrame:
    return MuxFrame(frame.session_id, frame.status, data, frame.error, frame.network, frame.target)


# --- the client's session table --------------------------------------------------


class SessionState(enum.Enum):
    OPEN = "open"  # both directions flow
    HALF_CLOSED = "half-closed"  # honk sent End; the server may still send until its own End
    ENDED = "ended"  # the server ended it, honk aborted it, or the carrier failed


@dataclass(eq=False, slots=True)
class MuxSession:
    """One logical stream or UDP session on a carrier.

    ``error`` is ``None`` for a clean end; otherwise the error that ended it
    (the carrier's shared error, or a :class:`MuxSessionReset`).
    """

    id: int
    network: Network
    target: Address
    state: SessionState = SessionState.OPEN
    error: BaseException | None = None


class MuxEventKind(enum.Enum):
    DATA = "data"  # payload for a live session
    END = "end"  # the server ended the session
    IGNORED = "ignored"  # keep-alive, or a frame for no live session


@dataclass(frozen=True, slots=True)
class MuxEvent:
    """What one received frame means.

    ``source`` is the UDP peer a Keep frame named; ``reply`` is a frame the
    carrier should send back (an End for data on a session honk no longer
    has, so the server stops sending it).
    """

    kind: MuxEventKind
    session: MuxSession | None = None
    data: bytes = b""
    source: Address | None = None
    reply: MuxFrame | None = None


class MuxClientSessions:
    """The client's sessions on one carrier, at most ``max_sessions`` at a time.

    Session ids count up from 1 (as v2ray's client does), wrap at 65535 and
    skip ids still in use. After :meth:`fail` the table is closed: every
    session ended with the same error, and :meth:`open` raises it.
    """

    def __init__(self, max_sessions: int = DEFAULT_CONCURRENCY) -> None:
        if not 1 <= max_sessions <= MAX_CONCURRENCY:
            raise ValueError(f"max_sessions must be 1..{MAX_CONCURRENCY}")
        self.max_sessions = max_sessions
        self._sessions: dict[int, MuxSession] = {}
        self._last_id = 0
        self.failure: BaseException | None = None
        self.opened = 0  # sessions opened over the table's life, for counters

    def __len__(self) -> int:
        return len(self._sessions)

    def __iter__(self) -> Iterator[MuxSession]:
        return iter(list(self._sessions.values()))

    def get(self, session_id: int) -> MuxSession | None:
        return self._sessions.get(session_id)

    @property
    def full(self) -> bool:
        return len(self._sessions) >= self.max_sessions

    @property
    def idle(self) -> bool:
        """No live session: the carrier may be closed once its idle timer runs out."""
        return not self._sessions

    # -- sending --------------------------------------------------------------------

    def open(
        self, network: Network, target: Address, data: bytes | None = None
    ) -> tuple[MuxSession, MuxFrame]:
        """A new session and its New frame (carrying ``data`` if given).

        Raises the carrier's error after :meth:`fail`, and
        :class:`~honk.core.errors.CapacityRefused` when the table is full.
        """
        if self.failure is not None:
            raise self.failure
        if self.full:
            raise CapacityRefused(f"mux carrier holds {self.max_sessions} sessions already")
        session = MuxSession(self._allocate(), network, target)
        self._sessions[session.id] = session
        self.opened += 1
        return session, MuxFrame(session.id, SessionStatus.NEW, data, network=network, target=target)

    def send(self, session_id: int, data: bytes, peer: Address | None = None) -> MuxFrame:
        """A Keep frame with ``data``; ``peer`` names the datagram's destination on a UDP session."""
        session = self._live(session_id)
        if session.state is not SessionState.OPEN:
            raise ValueError("the session no longer sends")
        if session.network is Network.UDP:
            return MuxFrame(
                session_id, SessionStatus.KEEP, data, network=Network.UDP, target=peer or session.target
            )
        return MuxFrame(session_id, SessionStatus.KEEP, data)

    def close(self, session_id: int) -> MuxFrame:
        """honk is done sending: the End frame to send. The session stays until the server's End."""
        session = self._live(session_id)
        session.state = SessionState.HALF_CLOSED
        return MuxFrame(session_id, SessionStatus.END)

    def abort(self, session_id: int) -> MuxFrame:
        """End the session at once, with the error option: the End frame to send."""
        session = self._live(session_id)
        self._end(session, None)
        return MuxFrame(session_id, SessionStatus.END, error=True)

    @staticmethod
    def keep_alive() -> MuxFrame:
        """A KeepAlive frame (session 0, no data), for an otherwise quiet carrier."""
        return MuxFrame(0, SessionStatus.KEEP_ALIVE)

    # -- receiving ------------------------------------------------------------------

    def receive(self, frame: MuxFrame) -> MuxEvent:
        """Map one frame from the server onto its session."""
        status = frame.status
        if status is SessionStatus.KEEP_ALIVE or status is SessionStatus.NEW:
            # a server never opens sessions towards a client; v2ray's client drains such frames too
            return MuxEvent(MuxEventKind.IGNORED)
        session = self._sessions.get(frame.session_id)
        if status is SessionStatus.END:
            if session is None:
                return MuxEvent(MuxEventKind.IGNORED)
            self._end(session, MuxSessionReset(session.id) if frame.error else None)
            return MuxEvent(MuxEventKind.END, session, frame.data or b"")
        if session is None:
            # the server still sends for a session honk dropped: tell it to stop
            return MuxEvent(MuxEventKind.IGNORED, reply=MuxFrame(frame.session_id, SessionStatus.END))
        source = frame.target if session.network is Network.UDP else None
        return MuxEvent(MuxEventKind.DATA, session, frame.data or b"", source)

    def fail(self, error: BaseException) -> list[MuxSession]:
        """The carrier is gone: end every session with ``error`` (the same object) and close the table."""
        if self.failure is None:
            self.failure = error
        ended = list(self._sessions.values())
        for session in ended:
            self._end(session, self.failure)
        return ended

    # -- helpers --------------------------------------------------------------------

    def _allocate(self) -> int:
        candidate = self._last_id
        for _ in range(MAX_SESSION_ID):
            candidate = candidate % MAX_SESSION_ID + 1  # 1..65535, never 0
            if candidate not in self._sessions:
                self._last_id = candidate
                return candidate
        raise CapacityRefused("no free Mux.Cool session id")  # unreachable below MAX_CONCURRENCY

    def _live(self, session_id: int) -> MuxSession:
        session = self._sessions.get(session_id)
        if session is None:
            raise KeyError(f"no live mux session {session_id}")
        return session

    def _end(self, session: MuxSession, error: BaseException | None) -> None:
        session.state = SessionState.ENDED
        session.error = error
        del self._sessions[session.id]
