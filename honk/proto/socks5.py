"""Server side of SOCKS5 (RFC 1928) with username/password auth (RFC 1929). Sans-I/O.

Theory of operation:
  * :class:`Socks5ServerConnection` owns one client's handshake. Feed it bytes
    with :meth:`~Socks5ServerConnection.receive_data` (``b""`` means EOF), then
    call :meth:`~Socks5ServerConnection.next_event` until it returns
    :data:`NEED_DATA`. Bytes for the client accumulate in
    :meth:`~Socks5ServerConnection.data_to_send`; callers flush them even when
    ``next_event`` raised, so a refusal (``0xFF`` method, auth failure, reply
    ``0x07``/``0x08``) reaches the client before the flow is closed.
  * Events: :class:`Greeting` (the method is already chosen and queued),
    :class:`Credentials` (answer with :meth:`~Socks5ServerConnection.auth_result`),
    :class:`Request` (answer with :meth:`~Socks5ServerConnection.reply`).
  * Malformed input raises :class:`~honk.core.errors.ClientProtocolError` with
    protocol ``socks5`` and a stable reason slug. EOF inside a message raises
    ``ClientProtocolError(reason="truncated")``; EOF between messages raises
    :class:`~honk.core.errors.ClientGone`.
  * After the reply, bytes that arrived behind the request (pipelined data)
    are returned by :meth:`~Socks5ServerConnection.trailing_data`; they belong
    to the relay, not to this codec.

Nothing here touches sockets, the event loop or the clock.
"""

from __future__ import annotations

import enum
import ipaddress
import struct
from dataclasses import dataclass

from honk._fast.socks5hs import errno_reply
from honk.core.errors import (
    AuthenticationFailed,
    Blocked,
    ClientGone,
    ClientProtocolError,
    DialError,
    DialTimeout,
    NoRoute,
    NotSupported,
    TargetRefused,
)
from honk.core.net import Address

__all__ = [
    "ATYP_DOMAIN",
    "ATYP_IPV4",
    "ATYP_IPV6",
    "METHOD_NO_ACCEPTABLE",
    "METHOD_NO_AUTH",
    "METHOD_USERPASS",
    "NEED_DATA",
    "Command",
    "Credentials",
    "Greeting",
    "Reply",
    "Request",
    "Socks5ServerConnection",
    "UdpDatagram",
    "build_reply",
    "build_udp_datagram",
    "encode_address",
    "parse_address",
    "parse_udp_datagram",
    "reply_for",
]

VERSION = 0x05
AUTH_VERSION = 0x01  # RFC 1929 sub-negotiation version

METHOD_NO_AUTH = 0x00
METHOD_USERPASS = 0x02
METHOD_NO_ACCEPTABLE = 0xFF

ATYP_IPV4 = 0x01
ATYP_DOMAIN = 0x03
ATYP_IPV6 = 0x04

PROTOCOL = "socks5"


class Command(enum.IntEnum):
    CONNECT = 0x01
    BIND = 0x02
    UDP_ASSOCIATE = 0x03


_COMMANDS = frozenset(int(c) for c in Command)


class Reply(enum.IntEnum):
    """REP field of a server reply (RFC 1928 section 6)."""

    SUCCEEDED = 0x00
    GENERAL_FAILURE = 0x01
    NOT_ALLOWED = 0x02  # "connection not allowed by ruleset"
    NETWORK_UNREACHABLE = 0x03
    HOST_UNREACHABLE = 0x04
    CONNECTION_REFUSED = 0x05
    TTL_EXPIRED = 0x06  # honk sends it for a dial timeout, as most servers do
    COMMAND_NOT_SUPPORTED = 0x07
    ADDRESS_TYPE_NOT_SUPPORTED = 0x08


# the failure codes RFC 1928 defines (0x01..0x08)
_REPLY_CODES = frozenset(int(r) for r in Reply if r != Reply.SUCCEEDED)


class _NeedData:
    """Sentinel: the codec needs more bytes before it can produce an event."""

    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA = _NeedData()


@dataclass(frozen=True, slots=True)
class Greeting:
    """The client's method list; ``method`` is what the server chose and queued."""

    methods: tuple[int, ...]
    method: int


@dataclass(frozen=True, slots=True)
class Credentials:
    """RFC 1929 username and password; answer with ``auth_result``."""

    username: str
    password: str

    def __repr__(self) -> str:  # never log a password
        return f"Credentials(username={self.username!r})"


@dataclass(frozen=True, slots=True)
class Request:
    """A CONNECT, BIND or UDP ASSOCIATE request; answer with ``reply``."""

    command: Command
    target: Address


Event = Greeting | Credentials | Request


class _State(enum.Enum):
    GREETING = "greeting"
    AUTH = "auth"
    AUTH_PENDING = "auth-pending"  # Credentials emitted, waiting for auth_result
    REQUEST = "request"
    REQUEST_PENDING = "request-pending"  # Request emitted, waiting for reply
    DONE = "done"  # reply sent; remaining bytes are payload
    FAILED = "failed"


# --- addresses -------------------------------------------------------------------


def parse_address(buf: bytes | bytearray | memoryview, offset: int) -> tuple[Address, int] | None:
    """Parse ATYP, DST.ADDR, DST.PORT at ``offset``.

    Returns ``(address, end_offset)`` or ``None`` when ``buf`` ends too early.
    Raises ``ClientProtocolError`` for an unknown address type or a bad domain.
    """
    if len(buf) <= offset:
        return None
    atyp = buf[offset]
    if atyp == ATYP_IPV4:
        end = offset + 1 + 4 + 2
        if len(buf) < end:
            return None
        host = str(ipaddress.IPv4Address(bytes(buf[offset + 1 : offset + 5])))
    elif atyp == ATYP_IPV6:
        end = offset + 1 + 16 + 2
        if len(buf) < end:
            return None
        host = str(ipaddress.IPv6Address(bytes(buf[offset + 1 : offset + 17])))
    elif atyp == ATYP_DOMAIN:
        if len(buf) < offset + 2:
            return None
        length = buf[offset + 1]
        end = offset + 2 + length + 2
        if len(buf) < end:
            return None
        if length == 0:
            raise ClientProtocolError(PROTOCOL, "empty-domain")
        raw = bytes(buf[offset + 2 : offset + 2 + length])
        try:
            host = raw.decode("ascii")
        except UnicodeDecodeError:
            raise ClientProtocolError(PROTOCOL, "bad-domain") from None
        if not host.isprintable() or " " in host:
            raise ClientProtocolError(PROTOCOL, "bad-domain")
    else:
        raise ClientProtocolError(PROTOCOL, "bad-address-type", f"atyp={atyp:#04x}")
    (port,) = struct.unpack_from("!H", buf, end - 2)
    return Address(host, port), end


def encode_address(address: Address) -> bytes:
    """ATYP + ADDR + PORT for ``address`` (IP literals as IPs, names as domains)."""
    ip = address.ip
    port = struct.pack("!H", address.port)
    if ip is None:
        raw = address.host.encode("idna") if not address.host.isascii() else address.host.encode()
        if not 0 < len(raw) <= 255:
            raise ValueError("a SOCKS5 domain must be 1..255 bytes")
        return bytes((ATYP_DOMAIN, len(raw))) + raw + port
    if ip.version == 4:
        return bytes((ATYP_IPV4,)) + ip.packed + port
    return bytes((ATYP_IPV6,)) + ip.packed + port


_UNSPECIFIED = Address("0.0.0.0", 0)


def build_reply(code: Reply | int, bound: Address | None = None) -> bytes:
    """A server reply; ``bound`` defaults to ``0.0.0.0:0`` (what failures carry)."""
    return bytes((VERSION, int(code), 0x00)) + encode_address(bound or _UNSPECIFIED)


# --- UDP -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class UdpDatagram:
    """One SOCKS5 UDP request/reply: ``frag`` is 0 for a whole datagram."""

    frag: int
    address: Address
    payload: bytes


def parse_udp_datagram(data: bytes) -> UdpDatagram:
    """Parse ``RSV(2) FRAG(1) ATYP ADDR PORT DATA``.

    Raises ``ClientProtocolError`` for a short datagram, non-zero RSV or a bad
    address; fragmented datagrams parse fine and the caller drops them.
    """
    if len(data) < 4:
        raise ClientProtocolError(PROTOCOL, "udp-short")
    if data[0] != 0 or data[1] != 0:
        raise ClientProtocolError(PROTOCOL, "udp-bad-reserved")
    parsed = parse_address(data, 3)
    if parsed is None:
        raise ClientProtocolError(PROTOCOL, "udp-short")
    address, end = parsed
    return UdpDatagram(data[2], address, data[end:])


def build_udp_datagram(address: Address, payload: bytes) -> bytes:
    """Wrap ``payload`` from ``address`` in an unfragmented SOCKS5 UDP header."""
    return b"\x00\x00\x00" + encode_address(address) + payload


# --- the server connection -------------------------------------------------------


class Socks5ServerConnection:
    """One client's SOCKS5 handshake, from greeting to reply.

    ``require_auth`` selects the method: ``0x02`` (username/password) when the
    inbound has users, ``0x00`` (no authentication) otherwise. A client that
    offers neither gets ``0xFF`` and a ``ClientProtocolError("no-acceptable-method")``.
    """

    def __init__(self, require_auth: bool) -> None:
        self._require_auth = require_auth
        self._buf = bytearray()
        self._out = bytearray()
        self._eof = False
        self._state = _State.GREETING
        self.username: str | None = None

    # -- input ----------------------------------------------------------------

    def receive_data(self, data: bytes) -> None:
        """Append client bytes; ``b""`` marks EOF. Data after EOF is an API error."""
        if self._eof:
            raise RuntimeError("receive_data after EOF")
        if data:
            self._buf += data
        else:
            self._eof = True

    def next_event(self) -> Event | _NeedData:
        """The next event, or ``NEED_DATA``; raises typed errors (see module doc)."""
        try:
            return self._next_event()
        except (ClientProtocolError, ClientGone, AuthenticationFailed):
            self._state = _State.FAILED
            raise

    def _next_event(self) -> Event | _NeedData:
        state = self._state
        event: Event | _NeedData
        if state is _State.FAILED:
            raise ClientProtocolError(PROTOCOL, "failed")
        if state is _State.GREETING:
            event = self._parse_greeting()
        elif state is _State.AUTH:
            event = self._parse_auth()
        elif state is _State.REQUEST:
            event = self._parse_request()
        else:  # waiting on the caller (auth_result/reply) or finished
            return NEED_DATA
        if event is NEED_DATA and self._eof:
            if self._buf:
                raise ClientProtocolError(PROTOCOL, "truncated", f"state={state.value}")
            raise ClientGone(f"socks5 client closed in state {state.value}")
        return event

    def _parse_greeting(self) -> Greeting | _NeedData:
        buf = self._buf
        if len(buf) < 2:
            if buf and buf[0] != VERSION:
                raise ClientProtocolError(PROTOCOL, "bad-version", f"version={buf[0]:#04x}")
            return NEED_DATA
        if buf[0] != VERSION:
            raise ClientProtocolError(PROTOCOL, "bad-version", f"version={buf[0]:#04x}")
        count = buf[1]
        if len(buf) < 2 + count:
            return NEED_DATA
        methods = tuple(buf[2 : 2 + count])
        del buf[: 2 + count]
        wanted = METHOD_USERPASS if self._require_auth else METHOD_NO_AUTH
        method = wanted if wanted in methods else METHOD_NO_ACCEPTABLE
        self._out += bytes((VERSION, method))
        if method == METHOD_NO_ACCEPTABLE:
            raise ClientProtocolError(PROTOCOL, "no-acceptable-method")
        self._state = _State.AUTH if method == METHOD_USERPASS else _State.REQUEST
        return Greeting(methods, method)

    def _parse_auth(self) -> Credentials | _NeedData:
        buf = self._buf
        if not buf:
            return NEED_DATA
        if buf[0] != AUTH_VERSION:
            self._out += bytes((AUTH_VERSION, 0x01))
            raise ClientProtocolError(PROTOCOL, "bad-auth-version", f"version={buf[0]:#04x}")
        if len(buf) < 2:
            return NEED_DATA
        ulen = buf[1]
        if len(buf) < 2 + ulen + 1:
            return NEED_DATA
        plen = buf[2 + ulen]
        end = 2 + ulen + 1 + plen
        if len(buf) < end:
            return NEED_DATA
        try:
            username = bytes(buf[2 : 2 + ulen]).decode("utf-8")
            password = bytes(buf[3 + ulen : end]).decode("utf-8")
        except UnicodeDecodeError:
            self._out += bytes((AUTH_VERSION, 0x01))
            raise ClientProtocolError(PROTOCOL, "bad-credentials-encoding") from None
        del buf[:end]
        self._state = _State.AUTH_PENDING
        return Credentials(username, password)

    def _parse_request(self) -> Request | _NeedData:
        buf = self._buf
        if not buf:
            return NEED_DATA
        if buf[0] != VERSION:
            raise ClientProtocolError(PROTOCOL, "bad-version", f"version={buf[0]:#04x}")
        if len(buf) < 3:
            return NEED_DATA
        if buf[2] != 0x00:
            raise ClientProtocolError(PROTOCOL, "bad-reserved")
        cmd = buf[1]
        if cmd not in _COMMANDS:
            self._out += build_reply(Reply.COMMAND_NOT_SUPPORTED)
            raise ClientProtocolError(PROTOCOL, "bad-command", f"cmd={cmd:#04x}")
        try:
            parsed = parse_address(buf, 3)
        except ClientProtocolError as exc:
            if exc.reason == "bad-address-type":
                self._out += build_reply(Reply.ADDRESS_TYPE_NOT_SUPPORTED)
            else:
                self._out += build_reply(Reply.GENERAL_FAILURE)
            raise
        if parsed is None:
            return NEED_DATA
        target, end = parsed
        del buf[:end]
        self._state = _State.REQUEST_PENDING
        return Request(Command(cmd), target)

    # -- answers --------------------------------------------------------------

    def auth_result(self, username: str, ok: bool) -> None:
        """Answer :class:`Credentials`; a refusal raises ``AuthenticationFailed``."""
        if self._state is not _State.AUTH_PENDING:
            raise RuntimeError(f"auth_result in state {self._state.value}")
        if not ok:
            self._out += bytes((AUTH_VERSION, 0x01))
            self._state = _State.FAILED
            raise AuthenticationFailed(f"socks5 user {username!r} refused")
        self._out += bytes((AUTH_VERSION, 0x00))
        self.username = username
        self._state = _State.REQUEST

    def reply(self, code: Reply | int, bound: Address | None = None) -> None:
        """Answer the :class:`Request`. After a success the handshake is done."""
        if self._state is not _State.REQUEST_PENDING:
            raise RuntimeError(f"reply in state {self._state.value}")
        self._out += build_reply(code, bound)
        self._state = _State.DONE if code == Reply.SUCCEEDED else _State.FAILED

    # -- output ---------------------------------------------------------------

    def data_to_send(self) -> bytes:
        """Bytes queued for the client since the last call."""
        out = bytes(self._out)
        self._out.clear()
        return out

    def trailing_data(self) -> tuple[bytes, bool]:
        """Unparsed client bytes and whether EOF was seen; consumes the buffer."""
        data = bytes(self._buf)
        self._buf.clear()
        return data, self._eof

    @property
    def done(self) -> bool:
        return self._state is _State.DONE


# --- typed errors → reply codes ----------------------------------------------------


def _errno_of(error: BaseException) -> int | None:
    """The errno carried by ``error`` or by an OSError in its cause/context chain."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        code = getattr(current, "errno", None)
        if isinstance(code, int):
            return code
        current = current.__cause__ or current.__context__
    return None


def reply_for(error: BaseException) -> Reply:
    """The reply code a client sees when its request fails with ``error``.

    Blocked and NoRoute → ``0x02`` (the ruleset refuses or cannot place the
    flow); DialTimeout → ``0x06``; other DialErrors by errno (refused ``0x05``,
    network unreachable ``0x03``, host unreachable ``0x04``, a failed
    ``resolve`` phase ``0x04``), else ``0x01``; an upstream proxy's refusal
    (TargetRefused) keeps its code; NotSupported → ``0x07``.
    """
    if isinstance(error, Blocked | NoRoute):
        return Reply.NOT_ALLOWED
    if isinstance(error, DialTimeout):
        return Reply.TTL_EXPIRED
    if isinstance(error, TargetRefused) and error.reply in _REPLY_CODES:
        return Reply(error.reply)  # an upstream proxy's own refusal, passed on
    if isinstance(error, DialError):
        code = _errno_of(error)
        by_errno = errno_reply(code) if code is not None else 0  # the table the engines reply from
        if by_errno:
            return Reply(by_errno)
        if error.phase == "resolve":
            return Reply.HOST_UNREACHABLE
        return Reply.GENERAL_FAILURE
    if isinstance(error, NotSupported):
        return Reply.COMMAND_NOT_SUPPORTED
    return Reply.GENERAL_FAILURE
