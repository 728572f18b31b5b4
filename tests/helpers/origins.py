"""A check-URL origin: HTTP/1.1 keep-alive answering every request with 204, plain or TLS."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass


@dataclass
class Origin204:
    port: int
    requests: int = 0


@contextlib.asynccontextmanager
async def generate_204(
    host: str = "127.0.0.1",
    port: int = 0,
    tls: ssl.SSLContext | None = None,
    status: bytes = b"204 No Content",
) -> AsyncIterator[Origin204]:
    """Serve 204 (or ``status``, empty body) to every request on ``host:port`` (0: a free
    port) over keep-alive HTTP/1.1, counting requests."""
    origin = Origin204(port)

    class Answer(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport
            self.buffer = b""

        def data_received(self, data: bytes) -> None:
            self.buffer += data
            while b"\r\n\r\n" in self.buffer:
                _, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
                origin.requests += 1
                self.transport.write(b"HTTP/1.1 " + status + b"\r\nContent-Length: 0\r\n\r\n")

    server = await asyncio.get_running_loop().create_server(Answer, host, port, ssl=tls)
    origin.port = server.sockets[0].getsockname()[1]
    try:
        yield origin
    finally:
        server.close()
        await server.wait_closed()
