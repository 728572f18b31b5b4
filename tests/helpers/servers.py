"""Origin servers on loopback for end-to-end tests (threads, so tests stay loop-agnostic)."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import socket
import threading
from collections.abc import AsyncIterator


class EchoServer:
    """A TCP server on 127.0.0.1 that echoes every byte back; one thread per client."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._threads: list[threading.Thread] = []
        self._conns: list[socket.socket] = []
        self._accept = threading.Thread(target=self._serve, daemon=True)
        self._accept.start()

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self._conns.append(conn)
            t = threading.Thread(target=self._echo, args=(conn,), daemon=True)
            t.start()
            self._threads.append(t)

    @staticmethod
    def _echo(conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := conn.recv(65536):
                conn.sendall(data)
            conn.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._listener.close()
        for c in self._conns:
            with contextlib.suppress(OSError):
                c.close()

    def __enter__(self) -> EchoServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


SHUTDOWN_POLL = 0.02  # seconds: how often HttpOrigin's serving thread checks for close()


class _OriginHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        origin: HttpOrigin = self.server.origin  # type: ignore[attr-defined]
        with origin.lock:
            origin.paths.append(self.path)
        body = HttpOrigin.body_for(self.path)
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


class HttpOrigin:
    """A plain HTTP/1.1 server on 127.0.0.1 answering every GET with :meth:`body_for` its path.

    ``paths`` records each request's target, so a test can tell the request really arrived.
    """

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.lock = threading.Lock()
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _OriginHandler)
        self._server.daemon_threads = True
        self._server.origin = self  # type: ignore[attr-defined]
        self.port = self._server.server_address[1]
        # serve_forever notices shutdown() only between polls; its default 0.5 s would stall each close.
        self._thread = threading.Thread(target=self._server.serve_forever, args=(SHUTDOWN_POLL,), daemon=True)
        self._thread.start()

    @staticmethod
    def body_for(path: str) -> bytes:
        return f"honk test origin: {path}".encode()

    def url(self, path: str = "/", host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> HttpOrigin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.asynccontextmanager
async def echo_server() -> AsyncIterator[int]:
    """An echo server on the running loop (127.0.0.1); yields its port."""

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()
