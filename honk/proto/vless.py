"""The client side of VLESS (version 0, no flow, no addons), without I/O.

Theory of operation:
  * The request header is ``version(0) uuid(16) addons-length(0) command``
    followed, except for the Mux command, by the target in v2ray's
    port-then-address layout (:func:`encode_port_address`). The payload
    follows the header on the same stream; there is no handshake round trip.
  * The server answers ``version addons-length addons`` before its payload.
    :class:`VlessResponseDecoder` strips that header and passes the rest
    through. The version must echo the request's; addons are skipped unread
    (honk asks for none, so it has nothing to learn from them).
  * UDP over VLESS carries each datagram as a 2-byte big-endian length and the
    datagram, both ways (:func:`encode_udp_packet`, :class:`VlessUdpDecoder`).
  * Feeding ``b""`` means EOF. EOF inside a header or a packet is a
    :class:`VlessProtocolError`; a decoder that failed refuses all further
    input. EOF before the first byte of the response is ``no-response``: VLESS
    has no denial message, and that is how a server refuses an unknown UUID.

The port-then-address helpers live here because Mux.Cool (and VMess) share
the layout and its address-type numbering, which differs from SOCKS5's.
"""

from __future__ import annotations

import enum
import errno
import functools
import ipaddress
import struct
import uuid as uuidlib
from typing import NoReturn

from honk.core.errors import CodecError
from honk.core.net import Address
from honk.proto.splitter import StreamSplitter

__all__ = [
    "ATYP_DOMAIN",
    "ATYP_IPV4",
    "ATYP_IPV6",
    "MAX_UDP_PAYLOAD",
    "VERSION",
    "VlessClient",
    "VlessCommand",
    "VlessError",
    "VlessProtocolError",
    "VlessResponseDecoder",
    "VlessUdpDecoder",
    "encode_port_address",
    "encode_udp_packet",
    "parse_port_address",
]

VERSION = 0x00  # the only VLESS version (XTLS VLESS spec)
UUID_SIZE = 16

# v2ray's address types (common/protocol AddressType), used by VLESS, VMess and Mux.Cool
ATYP_IPV4 = 0x01
ATYP_DOMAIN = 0x02
ATYP_IPV6 = 0x03

MAX_DOMAIN = 255  # the domain length is one byte
MAX_UDP_PAYLOAD = 0xFFFF  # the packet length prefix is two bytes

_LENGTH = struct.Struct("!H")


class VlessCommand(enum.IntEnum):
    """The request's command byte."""

    TCP = 0x01
    UDP = 0x02
    MUX = 0x03  # Mux.Cool follows; no target in the header


# --- errors ----------------------------------------------------------------------


class VlessError(CodecError):
    """A VLESS stream could not be read; ``reason`` is a stable slug."""

    protocol = "vless"


class VlessProtocolError(VlessError):
    """The server's bytes break VLESS framing (wrong version, truncation)."""


# --- v2ray addresses -------------------------------------------------------------


class AddressFormatError(ValueError):
    """A port-then-address field is malformed; ``reason`` is a slug callers re-type."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def encode_port_address(address: Address) -> bytes:
    """``port(2) type(1) address`` in v2ray's numbering (1 IPv4, 2 domain, 3 IPv6)."""
    port = _LENGTH.pack(address.port)
    ip = address.ip
    if ip is None:
        raw = address.host.encode("idna") if not address.host.isascii() else address.host.encode()
        if not 0 < len(raw) <= MAX_DOMAIN:
            raise ValueError("a domain must be 1..255 bytes")
        return port + bytes((ATYP_DOMAIN, len(raw))) + raw
    if ip.version == 4:
        return port + bytes((ATYP_IPV4,)) + ip.packed
    return port + bytes((ATYP_IPV6,)) + ip.packed


def parse_port_address(buf: bytes | bytearray | memoryview, offset: int) -> tuple[Address, int] | None:
    """The port-then-address field at ``offset`` and the offset past it.

    Returns ``None`` when ``buf`` ends too early; raises
    :class:`AddressFormatError` (``bad-address-type``, ``empty-domain``,
    ``bad-domain``) for malformed bytes.
    """
    head = offset + 3  # port and type
    if len(buf) < head:
        return None
    (port,) = _LENGTH.unpack_from(buf, offset)
    atyp = buf[offset + 2]
    if atyp == ATYP_IPV4:
        end = head + 4
        if len(buf) < end:
            return None
        host = str(ipaddress.IPv4Address(bytes(buf[head:end])))
    elif atyp == ATYP_IPV6:
        end = head + 16
        if len(buf) < end:
            return None
        host = str(ipaddress.IPv6Address(bytes(buf[head:end])))
    elif atyp == ATYP_DOMAIN:
        if len(buf) < head + 1:
            return None
        length = buf[head]
        end = head + 1 + length
        if len(buf) < end:
            return None
        if length == 0:
            raise AddressFormatError("empty-domain")
        try:
            host = bytes(buf[head + 1 : end]).decode("ascii")
        except UnicodeDecodeError:
            raise AddressFormatError("bad-domain") from None
        if not host.isprintable() or " " in host:
            raise AddressFormatError("bad-domain")
    else:
        raise AddressFormatError("bad-address-type")
    return Address(host, port), end


# --- request ---------------------------------------------------------------------


@functools.lru_cache(maxsize=256)  # one per node id: every request of a node sends the same
def _uuid_bytes(value: str | uuidlib.UUID) -> bytes:
    if isinstance(value, uuidlib.UUID):
        return value.bytes
    try:
        return uuidlib.UUID(value).bytes
    except (ValueError, AttributeError, TypeError):
        raise ValueError("the VLESS id is not a UUID") from None  # never echo the secret


class VlessClient:
    """One VLESS request: who (``uuid``), what (``command``) and where (``target``).

    ``target`` is ignored for :attr:`VlessCommand.MUX` (the header carries none)
    and may be ``None`` there; every other command needs it.
    """

    def __init__(self, uuid: str | uuidlib.UUID, command: VlessCommand, target: Address | None) -> None:
        self._id = _uuid_bytes(uuid)
        self.command = VlessCommand(command)
        if target is None and self.command is not VlessCommand.MUX:
            raise ValueError("a VLESS TCP or UDP request needs a target")
        self.target = target

    def __repr__(self) -> str:  # the UUID is the credential
        return f"VlessClient(command={self.command.name}, target={self.target})"

    def request_header(self) -> bytes:
        """The bytes to send before the first payload byte."""
        head = bytes((VERSION,)) + self._id + bytes((0, int(self.command)))
        if self.command is VlessCommand.MUX or self.target is None:
            return head
        return head + encode_port_address(self.target)

    def response_decoder(self) -> VlessResponseDecoder:
        """A decoder for the server's side of this request."""
        return VlessResponseDecoder()


# --- response --------------------------------------------------------------------


class VlessResponseDecoder:
    """The server's direction: strips ``version addons-length addons``, then passes bytes through."""

    def __init__(self, version: int = VERSION) -> None:
        self._version = version
        self._buf = bytearray()
        self._done = False
        self._failed: VlessProtocolError | None = None
        self._received = False

    @property
    def version(self) -> int:
        """The version the response must echo."""
        return self._version

    @property
    def header_done(self) -> bool:
        """Whether the response header has been read in full."""
        return self._done

    @property
    def answered(self) -> bool:
        """Whether any byte of the response arrived (EOF before one is ``no-response``)."""
        return self._received

    @property
    def pending(self) -> bool:
        """Whether part of the response header is kept (EOF now is ``truncated-header``)."""
        return not self._done and bool(self._buf)

    def error_for(self, err: int, version: int | None = None) -> VlessProtocolError:
        """The typed error for a relay engine's FRAMING_* errno about this response (as :meth:`feed`
        raises it): ENOMSG ``no-response``, ENODATA ``truncated-header``, anything else
        ``bad-version`` (``version``: the byte the server sent, when known)."""
        if err == errno.ENOMSG:
            return _no_response()
        if err == errno.ENODATA:
            return _truncated_header()
        return VlessProtocolError("bad-version", "" if version is None else f"version {version}")

    @property
    def failed(self) -> bool:
        return self._failed is not None

    def feed(self, data: bytes | bytearray | memoryview) -> bytes:
        """Payload completed by ``data``; ``b""`` means EOF.

        Raises :class:`VlessProtocolError` (``bad-version``: the first byte
        is not the version, as when the server speaks another protocol;
        ``no-response``: EOF before any byte; ``truncated-header``: EOF
        inside the header); after that every call raises again.
        """
        if self._failed is not None:
            raise VlessProtocolError(self._failed.reason, "the stream already failed")
        if self._done:
            return bytes(data)
        if not data:
            if not self._buf:  # the header is kept until complete, so nothing came at all
                self._fail(_no_response())
            self._fail(_truncated_header())
        self._received = True
        self._buf += data
        buf = self._buf
        if buf[0] != self._version:
            self._fail(VlessProtocolError("bad-version", f"version {buf[0]}"))
        if len(buf) < 2:
            return b""
        end = 2 + buf[1]
        if len(buf) < end:
            return b""
        self._done = True
        rest = bytes(buf[end:])
        self._buf = bytearray()
        return rest

    def _fail(self, error: VlessProtocolError) -> NoReturn:
        self._failed = error
        self._buf = bytearray()
        raise error


def _no_response() -> VlessProtocolError:
    return VlessProtocolError("no-response", "the server closed before answering (wrong id?)")


def _truncated_header() -> VlessProtocolError:
    return VlessProtocolError("truncated-header", "EOF inside the response header")


# --- UDP -------------------------------------------------------------------------


def encode_udp_packet(payload: bytes | bytearray | memoryview) -> bytes:
    """One datagram for a VLESS UDP stream: 2-byte big-endian length, then the payload."""
    if len(payload) > MAX_UDP_PAYLOAD:
        raise ValueError("a VLESS UDP packet holds at most 65535 bytes")
    return _LENGTH.pack(len(payload)) + bytes(payload)


class VlessUdpDecoder(StreamSplitter[bytes]):
    """Splits a VLESS UDP stream (after the response header) into datagrams.

    Raises :class:`VlessProtocolError` (``truncated-packet``) at an EOF inside
    a packet; after that every feed raises again.
    """

    error = VlessProtocolError
    truncated = ("truncated-packet", "EOF inside a UDP packet")

    def _split(self, buf: bytearray, out: list[bytes]) -> int:
        pos = 0
        while len(buf) - pos >= 2:
            (length,) = _LENGTH.unpack_from(buf, pos)
            end = pos + 2 + length
            if len(buf) < end:
                break
            out.append(bytes(buf[pos + 2 : end]))
            pos = end
        return pos
