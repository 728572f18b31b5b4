"""The client side of Trojan (trojan-gfw protocol, as v2ray speaks it), without I/O.

Theory of operation:
  * The request is ``hex(SHA-224(password)) CRLF command address CRLF``, the
    address in SOCKS5 form (``ATYP ADDR PORT``, ATYP 1/3/4). The payload
    follows at once; the server sends no response header, so the server's
    bytes on a CONNECT stream are the target's bytes.
  * After a UDP ASSOCIATE request, every datagram in either direction is
    ``address length(2) CRLF payload``. Towards the server the address is the
    destination; from the server it is the source.
    :class:`TrojanUdpDecoder` reads the server's direction.
  * Feeding ``b""`` means EOF; EOF inside a packet is a
    :class:`TrojanProtocolError`, and a decoder that failed refuses all
    further input.

Trojan has no denial message. A server with a fallback answers a wrong
password with its decoy site, which is indistinguishable from the target's
bytes; one without (v2ray 4.34 by default) closes the connection at once,
having sent nothing. :class:`TrojanStreamWatch` turns that close into
``closed-before-data``, the best signal the protocol leaves.
"""

from __future__ import annotations

import enum
import errno
import functools
import hashlib
import struct

from honk.core.errors import ClientProtocolError, CodecError
from honk.core.net import Address
from honk.proto.socks5 import encode_address, parse_address
from honk.proto.splitter import StreamSplitter

__all__ = [
    "CRLF",
    "MAX_UDP_PAYLOAD",
    "TrojanClient",
    "TrojanCommand",
    "TrojanError",
    "TrojanProtocolError",
    "TrojanStreamWatch",
    "TrojanUdpDecoder",
    "encode_udp_packet",
    "password_hash",
]

CRLF = b"\r\n"
HASH_SIZE = 56  # hex of a 28-byte SHA-224 digest
# v2ray's trojan codec (proxy/trojan/protocol.go, maxLength) writes at most this many bytes per UDP packet
MAX_UDP_PAYLOAD = 8192

_LENGTH = struct.Struct("!H")


class TrojanCommand(enum.IntEnum):
    CONNECT = 0x01
    UDP_ASSOCIATE = 0x03


# --- errors ----------------------------------------------------------------------


class TrojanError(CodecError):
    """A Trojan stream could not be read; ``reason`` is a stable slug."""

    protocol = "trojan"


class TrojanProtocolError(TrojanError):
    """The server's UDP framing is malformed (bad address, missing CRLF, truncation)."""


# --- request ---------------------------------------------------------------------


@functools.lru_cache(maxsize=256)  # one per node password: every request of a node sends the same
def password_hash(password: str) -> bytes:
    """The 56 ASCII bytes that authenticate a Trojan request: lower-case hex SHA-224."""
    return hashlib.sha224(password.encode("utf-8")).hexdigest().encode("ascii")


class TrojanClient:
    """One Trojan request. The password is hashed at construction and not kept."""

    def __init__(self, password: str, command: TrojanCommand, target: Address) -> None:
        self._hash = password_hash(password)
        self.command = TrojanCommand(command)
        self.target = target

    def __repr__(self) -> str:  # the hash is as good as the password
        return f"TrojanClient(command={self.command.name}, target={self.target})"

    def request_header(self) -> bytes:
        """The bytes to send before the first payload byte (or the first UDP packet)."""
        return self._hash + CRLF + bytes((int(self.command),)) + encode_address(self.target) + CRLF


# --- CONNECT ---------------------------------------------------------------------


class TrojanStreamWatch:
    """The server's direction of a CONNECT stream: the target's bytes, passed through untouched.

    It watches for the one trace a refusal leaves: an EOF before any byte.
    v2ray without a fallback reads the request, finds no such user and
    closes within milliseconds. The same EOF comes from a target that
    accepted and closed without a byte, so ``closed-before-data`` says what
    happened on the wire, not that the password was wrong.
    """

    def __init__(self) -> None:
        self._seen = False

    @property
    def seen(self) -> bool:
        """Whether the server has sent at least one byte."""
        return self._seen

    @property
    def answered(self) -> bool:
        """The same as :attr:`seen`, under the name the relays' framings use."""
        return self._seen

    pending = False  # no response header: an EOF is never inside one

    def error_for(self, err: int) -> TrojanError:
        """The typed error for a relay engine's FRAMING_* errno about this stream: an EOF
        before any byte (ENOMSG) is ``closed-before-data``; Trojan has no other verdict."""
        if err == errno.ENOMSG:
            return _closed_before_data()
        return TrojanError("bad-framing", f"the relay reported errno {err}")

    def feed(self, data: bytes) -> bytes:
        """``data`` itself; ``b""`` means EOF, a :class:`TrojanError` (``closed-before-data``) if nothing came."""
        if data:
            self._seen = True
            return data
        if not self._seen:
            raise _closed_before_data()
        return b""


def _closed_before_data() -> TrojanError:
    return TrojanError("closed-before-data", "the server closed without sending a byte (wrong password?)")


# --- UDP -------------------------------------------------------------------------


def encode_udp_packet(address: Address, payload: bytes | bytearray | memoryview) -> bytes:
    """One UDP ASSOCIATE packet for ``address``. Raises ValueError above :data:`MAX_UDP_PAYLOAD`."""
    if len(payload) > MAX_UDP_PAYLOAD:
        raise ValueError(f"a Trojan UDP packet holds at most {MAX_UDP_PAYLOAD} bytes")
    return encode_address(address) + _LENGTH.pack(len(payload)) + CRLF + bytes(payload)


class TrojanUdpDecoder(StreamSplitter[tuple[Address, bytes]]):
    """Splits the server's UDP ASSOCIATE stream into ``(source, payload)`` pairs.

    Raises :class:`TrojanProtocolError` (``bad-address-type``, ``bad-domain``,
    ``empty-domain``, ``missing-crlf``, ``truncated-packet``); after that every
    feed raises again.
    """

    error = TrojanProtocolError
    truncated = ("truncated-packet", "EOF inside a UDP packet")

    def _split(self, buf: bytearray, out: list[tuple[Address, bytes]]) -> int:
        pos = 0
        while pos < len(buf):
            try:
                parsed = parse_address(buf, pos)
            except ClientProtocolError as exc:  # the SOCKS5 codec blames a client; here it is the server
                self._fail(TrojanProtocolError(exc.reason))
            if parsed is None:
                break
            source, at = parsed
            if len(buf) < at + 4:
                break
            (length,) = _LENGTH.unpack_from(buf, at)
            if buf[at + 2 : at + 4] != CRLF:
                self._fail(TrojanProtocolError("missing-crlf"))
            end = at + 4 + length
            if len(buf) < end:
                break
            out.append((source, bytes(buf[at + 4 : end])))
            pos = end
        return pos
