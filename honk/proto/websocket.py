"""The client side of a WebSocket (RFC 6455) as a byte transport, without I/O.

V2Ray-style WebSocket transports carry the proxy protocol's bytes in binary
messages: :func:`client_handshake` builds the upgrade request,
:func:`parse_handshake_response` checks the ``101`` answer (its
``Sec-WebSocket-Accept`` included) and says how long the head is,
:class:`WsEncoder` frames outgoing bytes (client frames are always masked), and
:class:`WsDecoder` turns the server's frames into payload bytes, answering
pings and reporting a close. Early data (bytes in the upgrade request) is not
used.

Errors are :class:`WebSocketError` (a :class:`~honk.core.errors.HonkError`)
with a stable ``reason``: ``handshake-status``, ``handshake-accept``,
``handshake-malformed``, ``handshake-too-large``, ``masked-server-frame``,
``bad-opcode``, ``bad-control-frame``, ``reserved-bits``, ``frame-too-large``.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass

from honk.core.errors import HonkError

__all__ = [
    "ENGINE_ERRORS",
    "MAX_FRAME_PAYLOAD",
    "MAX_HANDSHAKE_HEAD",
    "WebSocketError",
    "WsDecoder",
    "WsEncoder",
    "WsEvents",
    "client_handshake",
    "parse_handshake_response",
]

ACCEPT_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"  # RFC 6455 section 1.3
MAX_HANDSHAKE_HEAD = 16 * 1024  # bytes: a 101 response head beyond this is garbage
MAX_FRAME_PAYLOAD = 16 * 1024 * 1024  # bytes: a larger frame from the server is refused
MAX_CONTROL_PAYLOAD = 125  # RFC 6455 section 5.5
SEND_FRAME = 64 * 1024  # bytes of payload per frame honk sends

OP_CONTINUATION, OP_TEXT, OP_BINARY = 0x0, 0x1, 0x2
OP_CLOSE, OP_PING, OP_PONG = 0x8, 0x9, 0xA
_DATA_OPS = frozenset({OP_CONTINUATION, OP_TEXT, OP_BINARY})
_CONTROL_OPS = frozenset({OP_CLOSE, OP_PING, OP_PONG})
_STATUS_LINE = re.compile(rb"HTTP/1\.1 (\d{3})(?: [^\r\n]*)?")
# A server frame's errors as the relay engine's worker numbers them (code = index + 1; see
# honk.proto.tls_framing): the engine unframes WebSocket inside TLS with the same checks.
ENGINE_ERRORS = ("reserved-bits", "bad-opcode", "masked-server-frame", "bad-control-frame", "frame-too-large")


class WebSocketError(HonkError):
    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"websocket: {reason}" + (f" ({detail})" if detail else ""))
        self.reason = reason


def _accept_for(key: str) -> str:
    return base64.b64encode(hashlib.sha1(key.encode("ascii") + ACCEPT_GUID).digest()).decode("ascii")


def client_handshake(host: str, path: str, key: str | None = None) -> tuple[bytes, str]:
    """The upgrade request and the key whose accept value the answer must carry."""
    key = key or base64.b64encode(os.urandom(16)).decode("ascii")
    path = path or "/"
    if not path.startswith("/"):
        path = "/" + path
    lines = [
        f"GET {path} HTTP/1.1",
        f"Host: {host}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Key: {key}",
        "Sec-WebSocket-Version: 13",
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8"), key


def parse_handshake_response(buf: bytes, key: str) -> int | None:
    """The length of a valid ``101`` head at the start of ``buf``; None while incomplete."""
    end = buf.find(b"\r\n\r\n", 0, MAX_HANDSHAKE_HEAD + 4)
    if end < 0:
        if not b"HTTP/".startswith(bytes(buf[:5])):
            raise WebSocketError("handshake-malformed", "the answer is not an HTTP response")
        if len(buf) >= MAX_HANDSHAKE_HEAD + 4:
            raise WebSocketError("handshake-too-large")
        return None
    lines = bytes(buf[:end]).split(b"\r\n")
    m = _STATUS_LINE.fullmatch(lines[0])
    if m is None:
        raise WebSocketError("handshake-malformed", "bad status line")
    if m.group(1) != b"101":
        raise WebSocketError("handshake-status", f"the server answered {m.group(1).decode()}")
    headers: dict[bytes, bytes] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon:
            raise WebSocketError("handshake-malformed", "a header line without a colon")
        headers[name.strip().lower()] = value.strip()
    if headers.get(b"upgrade", b"").lower() != b"websocket":
        raise WebSocketError("handshake-malformed", "no Upgrade: websocket")
    if headers.get(b"sec-websocket-accept", b"").decode("latin-1") != _accept_for(key):
        raise WebSocketError("handshake-accept", "Sec-WebSocket-Accept does not match the key")
    return end + 4


def _frame(opcode: int, payload: bytes, mask: bytes) -> bytes:
    n = len(payload)
    if n < 126:
        head = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
    elif n < 1 << 16:
        head = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
    else:
        head = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, n)
    return head + mask + _apply_mask(payload, mask)


def _apply_mask(data: bytes, mask: bytes) -> bytes:
    """XOR with the repeating 4-byte mask, a whole-int operation rather than a per-byte loop."""
    if not data:
        return b""
    n = len(data)
    key = int.from_bytes((mask * (n // 4 + 1))[:n], "big")
    return (int.from_bytes(data, "big") ^ key).to_bytes(n, "big")


class WsEncoder:
    """Masked client frames; ``random`` supplies each frame's 4-byte mask (tests pin it)."""

    def __init__(self, random: Callable[[int], bytes] = os.urandom) -> None:
        self._random = random

    def binary(self, data: bytes) -> bytes:
        """``data`` as binary frames of at most SEND_FRAME bytes each."""
        return b"".join(
            _frame(OP_BINARY, data[i : i + SEND_FRAME], self._random(4))
            for i in range(0, len(data), SEND_FRAME)
        )

    def pong(self, payload: bytes) -> bytes:
        return _frame(OP_PONG, payload, self._random(4))

    def close(self, code: int = 1000) -> bytes:
        return _frame(OP_CLOSE, struct.pack("!H", code), self._random(4))


@dataclass(slots=True)
class WsEvents:
    """What one :meth:`WsDecoder.feed` produced."""

    data: bytes = b""  # payload bytes of data frames, in order
    pongs: tuple[bytes, ...] = ()  # payloads of pings to answer with pongs
    closed: int | None = None  # the close code (1005 when none was given), once the server closed


class WsDecoder:
    """Server frames to payload bytes. Server frames must not be masked (RFC 6455 5.1)."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self.closed = False

    @property
    def partial(self) -> bool:
        """Whether the bytes fed so far end inside a frame."""
        return bool(self._buf)

    def feed(self, data: bytes) -> WsEvents:
        if self.closed:
            return WsEvents()
        self._buf += data
        out = bytearray()
        pongs: list[bytes] = []
        closed: int | None = None
        while (frame := self._next()) is not None:
            opcode, payload = frame
            if opcode in _DATA_OPS:
                out += payload
            elif opcode == OP_PING:
                pongs.append(payload)
            elif opcode == OP_CLOSE:
                closed = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else 1005
                self.closed = True
                self._buf.clear()
                break
        return WsEvents(bytes(out), tuple(pongs), closed)

    def _next(self) -> tuple[int, bytes] | None:
        buf = self._buf
        if len(buf) < 2:
            return None
        b0, b1 = buf[0], buf[1]
        if b0 & 0x70:
            raise WebSocketError("reserved-bits", "no extension was negotiated")
        opcode = b0 & 0x0F
        if opcode not in _DATA_OPS and opcode not in _CONTROL_OPS:
            raise WebSocketError("bad-opcode", f"opcode {opcode:#x}")
        if b1 & 0x80:
            raise WebSocketError("masked-server-frame")
        size = b1 & 0x7F
        offset = 2
        if size == 126:
            if len(buf) < 4:
                return None
            size = struct.unpack_from("!H", buf, 2)[0]
            offset = 4
        elif size == 127:
            if len(buf) < 10:
                return None
            size = struct.unpack_from("!Q", buf, 2)[0]
            offset = 10
        if opcode in _CONTROL_OPS and (size > MAX_CONTROL_PAYLOAD or not b0 & 0x80):
            raise WebSocketError("bad-control-frame", "control frames are short and never fragmented")
        if size > MAX_FRAME_PAYLOAD:
            raise WebSocketError("frame-too-large", f"{size} bytes")
        if len(buf) < offset + size:
            return None
        payload = bytes(buf[offset : offset + size])
        del buf[: offset + size]
        return opcode, payload
