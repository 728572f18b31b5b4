"""The API listener: one socket for every control surface, bound at start, served on demand.

The daemon binds the listener when it starts (so a bad address fails the start or the
reload at once) but loads the web stack (aiohttp, the surfaces, prometheus-client; about
15 MB) only when the first connection arrives; that connection waits in the kernel's
backlog meanwhile. A router nobody queries keeps its memory.

Under aiohttp sits the **connection guard**, a protocol wrapper: at most
:data:`MAX_API_CONNECTIONS` connections, and a connection that has not delivered a
complete request head within :data:`HEAD_TIMEOUT` of opening (or of its previous
response) is closed, so a slow-loris client holds one socket for seconds, never a
handler, and the data path never notices. It also escapes a raw request line's target
before aiohttp parses it. The middlewares and routes are in :mod:`honk.api.webapp`.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import re
import socket
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from honk.api.context import Control
from honk.config.spec import DEFAULT_CLASH_API_CONTROLLER, ClashApiSpec
from honk.core.clock import Clock, TimerHandle
from honk.core.logs import kv
from honk.core.net import parse_host_port

if TYPE_CHECKING:
    from aiohttp import web

log = logging.getLogger("honk.api")

MAX_API_CONNECTIONS = 64  # concurrent API connections; more are closed at accept
MAX_REQUEST_LINE = 8192  # bytes collected for escaping; longer lines go to aiohttp as they are
HEAD_TIMEOUT = 10.0  # seconds a connection may take to deliver a request head (slow-loris bound)
MAX_BODY = 2 * 1024 * 1024  # bytes; the largest body any endpoint accepts (a config upload)
BACKLOG = 128  # connections the kernel queues, the first ones while the web stack loads
LOAD_RETRY = 1.0  # seconds before a failed load of the web stack waits for a connection again


# --- the connection guard ---------------------------------------------------------------------


_REQUEST_LINE = re.compile(rb"([A-Z]+) (.+) (HTTP/\d\.\d)\r\n", re.S)


def escape_request_line(line: bytes) -> bytes:
    """Percent-encode the spaces, controls and non-ASCII bytes of a request line's target.

    Yacd-meta puts group names in ``PUT /proxies/{name}`` without encoding them, and a
    client that sends the bytes as they are (no browser in between) produces a request
    line HTTP parsers refuse. Escaping them is what a browser would have done."""
    match = _REQUEST_LINE.fullmatch(line)
    if match is None or all(0x21 <= b < 0x7F for b in match.group(2)):
        return line
    target = b"".join(b"%%%02X" % b if b <= 0x20 or b >= 0x7F else bytes((b,)) for b in match.group(2))
    return b"%s %s %s\r\n" % (match.group(1), target, match.group(3))


class _Guard(asyncio.Protocol):
    """Wraps aiohttp's per-connection protocol: enforces the head deadline and the cap, and
    escapes a raw request line before aiohttp parses it."""

    def __init__(self, inner: asyncio.Protocol, registry: ConnectionGuard) -> None:
        self.inner = inner
        self.registry = registry
        self.transport: asyncio.Transport | None = None
        self.timer: TimerHandle | None = None
        self.line: bytearray | None = bytearray()  # the request line being collected; None: passing through

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if len(self.registry.open) >= MAX_API_CONNECTIONS:
            self.registry.refused += 1
            transport.abort()  # type: ignore[attr-defined]
            return
        self.registry.open[transport] = self
        self.arm()
        self.inner.connection_made(transport)

    def arm(self) -> None:
        """Wait for the next request head (its line is collected and escaped)."""
        self.line = bytearray()
        self.disarm()
        self.timer = self.registry.clock.call_later(HEAD_TIMEOUT, self._expire)

    def disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _expire(self) -> None:
        self.timer = None
        if self.transport is not None:
            self.registry.expired += 1
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.disarm()
        if self.registry.open.pop(self.transport, None) is not None:
            self.inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.line is not None:
            self.line += data
            end = self.line.find(b"\r\n")
            if end < 0 and len(self.line) < MAX_REQUEST_LINE:
                return
            collected, self.line = bytes(self.line), None
            data = collected if end < 0 else escape_request_line(collected[: end + 2]) + collected[end + 2 :]
        self.inner.data_received(data)  # type: ignore[attr-defined]

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()  # type: ignore[attr-defined]

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


class ConnectionGuard:
    """The open API connections and what the guard refused or expired (for tests and stats)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.open: dict[asyncio.BaseTransport, _Guard] = {}
        self.refused = 0
        self.expired = 0

    def wrap(self, factory: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        return lambda: _Guard(factory(), self)


class ApiServer:
    """The listener for ``experimental.clash_api``; the daemon starts, rebinds and stops it."""

    def __init__(self, control: Control, spec: ClashApiSpec, base_dir: Path) -> None:
        self.control = control
        self.spec = spec
        self.guard = ConnectionGuard(control.clock)
        self._ui_dir = (base_dir / spec.external_ui).resolve() if spec.external_ui else None
        self.app: web.Application | None = None  # built by load(), at the first connection
        self.bound: tuple[str, int] | None = None
        self._sock: socket.socket | None = None
        self._loading: asyncio.Task[Any] | None = None
        self._load_retry: TimerHandle | None = None  # a failed load's retry, pending
        self._runner: web.AppRunner | None = None
        self._server: asyncio.base_events.Server | None = None
        self._base_dir = base_dir
        self._retiring: set[asyncio.Task[None]] = set()  # runners replaced by a swap, finishing

    async def start(self) -> None:
        """Bind and serve; raises OSError (bind failure) with nothing left open."""
        await self.bind()
        await self.serve()

    async def bind(self) -> None:
        """Bind and listen without serving (connections wait in the backlog until
        :meth:`serve`); raises OSError with nothing left open."""
        host, port = parse_host_port(self.spec.external_controller or DEFAULT_CLASH_API_CONTROLLER)
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(BACKLOG)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        self.bound = sock.getsockname()[:2]

    async def serve(self) -> None:
        """Start answering on the bound socket (the web stack loads at the first connection)."""
        assert self._sock is not None and self.bound is not None
        asyncio.get_running_loop().add_reader(self._sock.fileno(), self._first_connection)
        host = parse_host_port(self.spec.external_controller or DEFAULT_CLASH_API_CONTROLLER)[0]
        log.info(
            "API listening %s",
            kv(address=f"{host}:{self.bound[1]}", auth="secret" if self.spec.secret else "none"),
        )

    def close_unserved(self) -> None:
        """Release a socket bound for an apply that was refused."""
        if self._sock is not None and self._loading is None:
            self._sock.close()
            self._sock = None

    async def swap(self, spec: ClashApiSpec) -> None:
        """Serve new connections with ``spec``'s secret and UI on the same socket. Open
        connections finish the request in flight (the one that asked for this gets its
        answer), then close: streams authenticated under the old secret end."""
        self.spec = spec
        self._ui_dir = (self._base_dir / spec.external_ui).resolve() if spec.external_ui else None
        if self._runner is None:
            return  # not loaded yet: the first connection builds the app from the new spec
        webapp = importlib.import_module("honk.api.webapp")
        old_app, old_runner = self.app, self._runner
        app = webapp.build_app(self.control, spec.secret, webapp.SURFACES, self.guard, self._ui_dir)
        runner = webapp.runner(app)
        await runner.setup()
        self.app, self._runner = app, runner
        task = asyncio.get_running_loop().create_task(
            self._retire(old_app, old_runner), name="honk-api-retire"
        )
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _retire(self, app: web.Application | None, runner: web.AppRunner) -> None:
        from honk.api.streams import stop_streams

        await asyncio.sleep(0)  # let the handler that asked for the swap write its answer
        if app is not None:
            await stop_streams(app)
        await runner.cleanup()

    def _first_connection(self) -> None:
        if self._sock is not None:
            asyncio.get_running_loop().remove_reader(self._sock.fileno())
        self._loading = asyncio.get_running_loop().create_task(self._serve(), name="honk-api-load")
        self._loading.add_done_callback(self._loaded)

    def _loaded(self, task: asyncio.Task[Any]) -> None:
        """A failed load (no descriptor left to import the web stack with, during a burst) is
        retried: the listener waits for its next connection again instead of never answering."""
        if task.cancelled() or (exc := task.exception()) is None or self._loading is not task:
            return
        self._loading = None
        log.warning(
            "API failed to load, retrying %s",
            kv(error=type(exc).__name__, reason=str(exc) or "-", retry_in=f"{LOAD_RETRY}s"),
        )
        self._load_retry = self.control.clock.call_later(LOAD_RETRY, self._rearm)

    def _rearm(self) -> None:
        self._load_retry = None
        if self._sock is not None and self._loading is None:
            asyncio.get_running_loop().add_reader(self._sock.fileno(), self._first_connection)

    async def load(self) -> web.Application:
        """Load the web stack and serve now (the first connection does this); the application."""
        if self._loading is None:
            self._cancel_retry()
            self._first_connection()
        assert self._loading is not None
        await asyncio.shield(self._loading)
        assert self.app is not None
        return self.app

    async def _serve(self) -> None:
        # the import takes a few hundred ms: in a thread, so the data path keeps running
        webapp = await asyncio.to_thread(importlib.import_module, "honk.api.webapp")
        app = webapp.build_app(self.control, self.spec.secret, webapp.SURFACES, self.guard, self._ui_dir)
        runner = webapp.runner(app)
        await runner.setup()
        self.app, self._runner = app, runner
        try:
            # the factory reads the current runner, so a swap serves new connections at once
            self._server = await asyncio.get_running_loop().create_server(
                self.guard.wrap(lambda: self._runner.server()), sock=self._sock, backlog=BACKLOG
            )
        except BaseException:
            await runner.cleanup()
            self.app = self._runner = None
            raise
        log.info("API serving %s", kv(address=f"{self.bound[0]}:{self.bound[1]}" if self.bound else "-"))

    async def stop_accepting(self) -> None:
        """A reload moved or removed the API: accept nothing more here; the requests in
        flight (the one that asked for this among them) finish, then the rest closes."""
        if self._loading is None or self._server is None:
            await self.stop()
            return
        self._server.close()
        task = asyncio.get_running_loop().create_task(
            self._retire(self.app, self._runner), name="honk-api-retire"
        )
        self.app = self._runner = None
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    def _cancel_retry(self) -> None:
        if self._load_retry is not None:
            self._load_retry.cancel()
            self._load_retry = None

    async def stop(self) -> None:
        """Stop accepting, end open streams and connections."""
        self._cancel_retry()
        if self._loading is None:
            if self._sock is not None:
                asyncio.get_running_loop().remove_reader(self._sock.fileno())
        else:
            try:
                await self._loading
            except Exception:  # noqa: BLE001 - it was logged by nobody: say it now, then stop anyway
                log.exception("API listener failed to load")
        if self._server is not None:
            self._server.close()
            for held in list(self.guard.open.values()):
                if held.transport is not None:
                    held.transport.abort()
            await self._server.wait_closed()
            self._server = None
        if self.app is not None:
            from honk.api.streams import stop_streams

            await stop_streams(self.app)
        for task in list(self._retiring):
            task.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None
