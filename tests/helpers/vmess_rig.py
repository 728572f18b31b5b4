"""The test's VMess server end of one flow, played with the codec's own primitives.

It opens the request chunks the relay seals (masked lengths, counter nonces) and
writes a response header and chunks for the relay to open. The dial already sent
the request header, so the flow starts at the body.
"""

from __future__ import annotations

import asyncio
import socket
import struct

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from helpers.engines import FramedServer
from honk.core.net import Address
from honk.proto.vmess import (
    COMMAND_TCP,
    MAX_PAYLOAD,
    SALT_RESP_IV,
    SALT_RESP_KEY,
    SALT_RESP_LEN_IV,
    SALT_RESP_LEN_KEY,
    VmessClient,
    _ChunkCodec,
    kdf,
)

TARGET = Address("127.0.0.1", 80)


class VmessServer(FramedServer):
    """The test's VMess server end of one flow (the request header is already consumed)."""

    def __init__(self, sock: socket.socket, client: VmessClient) -> None:
        self.sock = sock
        self.request = _ChunkCodec(client.security, client.body_key, client.body_iv)
        self.response = _ChunkCodec(client.security, client.response_key, client.response_iv)
        self._check = client.response_check
        self._key, self._iv = client.response_key, client.response_iv
        self._buf = bytearray()
        self._size: int | None = None  # the open request chunk's length, once read
        self.ended = False  # the client's empty chunk arrived

    def header(self, check: int | None = None) -> bytes:
        """The sealed response header (echoing the check byte unless told otherwise)."""
        plain = bytes((self._check if check is None else check, 0, 0, 0))
        length = AESGCM(kdf(self._key, SALT_RESP_LEN_KEY)[:16]).encrypt(
            kdf(self._iv, SALT_RESP_LEN_IV)[:12], struct.pack("!H", len(plain)), None
        )
        return length + AESGCM(kdf(self._key, SALT_RESP_KEY)[:16]).encrypt(
            kdf(self._iv, SALT_RESP_IV)[:12], plain, None
        )

    def chunks(self, data: bytes, size: int = MAX_PAYLOAD) -> bytes:
        return b"".join(self.response.seal(data[i : i + size]) for i in range(0, len(data), size))

    async def send(self, wire: bytes) -> None:
        await asyncio.get_running_loop().sock_sendall(self.sock, wire)

    def _open(self) -> bytes:
        out = bytearray()
        while not self.ended:
            if self._size is None:
                if len(self._buf) < 2:
                    break
                self._size = struct.unpack("!H", self._buf[:2])[0] ^ self.request.mask.next()
                del self._buf[:2]
            size = self._size
            if len(self._buf) < size:
                break
            out += self.request.open(bytes(self._buf[:size]))
            self.ended = size == self.request.overhead
            del self._buf[:size]
            self._size = None
        return bytes(out)

    def take(self, data: bytes) -> bytes:
        self._buf += data
        return self._open()

    async def recv_until_eof(self) -> bytes:
        out = await super().recv_until_eof()
        assert not self._buf, "bytes after the ending chunk"
        return out


def vmess_client(security: str) -> VmessClient:
    client = VmessClient("b831381d-6324-4d53-ad4f-8cda48b30811", security, COMMAND_TCP, TARGET, 1.7e9)
    client.request_header()  # what the dial sent
    return client
