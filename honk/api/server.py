"""One aiohttp server for every control surface.

Request path, outermost first:

1. **Connection guard** (a protocol wrapper under aiohttp): at most
   :data:`MAX_API_CONNECTIONS` connections, and a connection that has not
   delivered a complete request head within :data:`HEAD_TIMEOUT` of opening (or
   of its previous response) is closed. A slow-loris client therefore holds one
   socket for seconds, never a handler, and the data path never notices.
2. **CORS** runs before authentication (clash-api.md §1): a preflight is
   answered without a token, with ``Access-Control-Allow-Private-Network`` when
   the browser asks, and every other response carries the allow-origin header
   so a dashboard can read a 401.
3. **Errors**: :class:`~honk.api.errors.ApiError` and aiohttp's own HTTP errors
   become the surface's JSON error body; anything else is logged and a 500.
4. **Authentication**: ``Authorization: Bearer <secret>`` compared in constant
   time; ``?token=`` is accepted only on a WebSocket upgrade. ``/ui`` is public.
5. **Body limit**: a declared body over :data:`MAX_BODY` is refused with 413
   before it is read; aiohttp enforces the same limit on chunked bodies.

Surfaces add their routes through :func:`build_app`; the server itself knows no
endpoint.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import re
import socket
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path

from aiohttp import web

from honk.api.context import Control
from honk.api.errors import ApiError, render, unauthorized
from honk.api.streams import stop_streams
from honk.config.spec import DEFAULT_CLASH_API_CONTROLLER, ClashApiSpec
from honk.core.clock import Clock, TimerHandle
from honk.core.net import parse_host_port
from honk.daemon.logs import kv

log = logging.getLogger("honk.api")

MAX_API_CONNECTIONS = 64  # concurrent API connections; more are closed at accept
MAX_REQUEST_LINE = 8192  # bytes collected for escaping; longer lines go to aiohttp as they are
HEAD_TIMEOUT = 10.0  # seconds a connection may take to deliver a request head (slow-loris bound)
MAX_BODY = 2 * 1024 * 1024  # bytes; the largest body any endpoint accepts (a config upload)
CORS_MAX_AGE = "300"  # seconds a browser may cache a preflight (mihomo's default)
CORS_METHODS = "GET, POST, PUT, PATCH, DELETE"
CORS_HEADERS = "Content-Type, Authorization"
UI_PREFIX = "/ui"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
RouteSource = Callable[[Control], Iterable[web.AbstractRouteDef]]


# --- middlewares ---------------------------------------------------------------------------


def _cors_headers(request: web.Request, response: web.StreamResponse) -> None:
    origin = request.headers.get("Origin")
    if origin and not response.prepared:
        response.headers["Access-Control-Allow-Origin"] = "*"
        response.headers.setdefault("Vary", "Origin")


@web.middleware
async def cors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
        response = web.Response(status=204)
        response.headers.update({
            "Access-Control-Allow-Origin": "*",
            "Access-Control-Allow-Methods": CORS_METHODS,
            "Access-Control-Allow-Headers": CORS_HEADERS,
            "Access-Control-Max-Age": CORS_MAX_AGE,
        })
        if request.headers.get("Access-Control-Request-Private-Network", "").lower() == "true":
            response.headers["Access-Control-Allow-Private-Network"] = "true"
        return response
    try:
        response = await handler(request)
    except web.HTTPException as exc:  # raised past the error middleware (redirects)
        _cors_headers(request, exc)
        raise
    _cors_headers(request, response)
    return response


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        return render(request, exc.status, exc.code, exc.message)
    except web.HTTPRedirection:
        raise
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return render(request, exc.status, None, None)
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception:
        log.exception("API handler failed %s", kv(method=request.method, path=request.path))
        return render(request, 500, "internal", "internal error")


def auth_middleware(secret: str) -> Callable[..., Awaitable[web.StreamResponse]]:
    expected = f"Bearer {secret}".encode()
    token_bytes = secret.encode()

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if secret and not _public(request.path) and not _authorized(request, expected, token_bytes):
            raise unauthorized()
        return await handler(request)

    return middleware


def _public(path: str) -> bool:
    return path == UI_PREFIX or path.startswith(UI_PREFIX + "/")


def _authorized(request: web.Request, expected: bytes, token: bytes) -> bool:
    """Bearer header (the scheme exactly ``Bearer``), or ``?token=`` on a WebSocket upgrade only."""
    if request.headers.get("Upgrade", "").lower() == "websocket":
        given = request.query.get("token", "")
        if given:
            return hmac.compare_digest(given.encode(), token)
    header = request.headers.get("Authorization", "")
    return hmac.compare_digest(header.encode(), expected)


@web.middleware
async def body_limit_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.content_length is not None and request.content_length > MAX_BODY:
        raise ApiError(413, "body_too_large", f"body over {MAX_BODY} bytes")
    return await handler(request)


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

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """A complete head arrived: no deadline while the handler runs, a fresh one after."""
        guard = self.open.get(request.transport) if request.transport is not None else None
        if guard is not None:
            guard.disarm()
        try:
            return await handler(request)
        finally:
            if guard is not None and guard.transport is not None and not guard.transport.is_closing():
                guard.arm()


# --- the server -----------------------------------------------------------------------------


def build_app(control: Control, secret: str, sources: Iterable[RouteSource],
              guard: ConnectionGuard | None = None, ui_dir: Path | None = None) -> web.Application:
    middlewares = [cors_middleware, error_middleware, auth_middleware(secret), body_limit_middleware]
    if guard is not None:
        middlewares.insert(0, guard.middleware)
    app = web.Application(middlewares=middlewares, client_max_size=MAX_BODY)
    for source in sources:
        app.add_routes(list(source(control)))
    if ui_dir is not None:
        _add_ui(app, ui_dir)
    return app


def _add_ui(app: web.Application, ui_dir: Path) -> None:
    """``external_ui``: the dashboard's files under /ui/ (index.html for directories)."""

    async def to_slash(request: web.Request) -> web.StreamResponse:
        raise web.HTTPFound(UI_PREFIX + "/")

    async def index(request: web.Request) -> web.StreamResponse:
        page = ui_dir / "index.html"
        if not page.is_file():
            raise ApiError(404, "resource_not_found", "the external UI has no index.html")
        return web.FileResponse(page)

    app.router.add_get(UI_PREFIX, to_slash)
    app.router.add_get(UI_PREFIX + "/", index)
    app.router.add_static(UI_PREFIX + "/", ui_dir, show_index=False, follow_symlinks=False)


def default_sources() -> list[RouteSource]:
    """Every surface's routes: Clash, native and metrics."""
    from honk.api import clash, metrics, native

    return [clash.routes, native.routes, metrics.routes]


class ApiServer:
    """The listener for ``experimental.clash_api``; the daemon starts, rebinds and stops it."""

    def __init__(self, control: Control, spec: ClashApiSpec, base_dir: Path,
                 sources: Iterable[RouteSource] | None = None) -> None:
        self.control = control
        self.spec = spec
        self.guard = ConnectionGuard(control.clock)
        ui_dir = None
        if spec.external_ui:
            ui_dir = (base_dir / spec.external_ui).resolve()
        self.app = build_app(control, spec.secret, default_sources() if sources is None else sources,
                             self.guard, ui_dir)
        self._runner: web.AppRunner | None = None
        self._server: asyncio.base_events.Server | None = None
        self.bound: tuple[str, int] | None = None

    async def start(self) -> None:
        """Bind and serve; raises OSError (bind failure) with nothing left running."""
        host, port = parse_host_port(self.spec.external_controller or DEFAULT_CLASH_API_CONTROLLER)
        runner = web.AppRunner(self.app, access_log=None, handle_signals=False)
        await runner.setup()
        try:
            loop = asyncio.get_running_loop()
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            self._server = await loop.create_server(
                self.guard.wrap(runner.server), host=host, port=port, family=family,
                reuse_address=True, backlog=128,
            )
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        sock = self._server.sockets[0].getsockname()
        self.bound = (sock[0], sock[1])
        log.info("API serving %s", kv(address=f"{host}:{self.bound[1]}", auth="secret" if self.spec.secret else "none"))

    async def stop(self) -> None:
        """Stop accepting, end open streams and connections."""
        if self._server is not None:
            self._server.close()
            for guard in list(self.guard.open.values()):
                if guard.transport is not None:
                    guard.transport.abort()
            await self._server.wait_closed()
            self._server = None
        await stop_streams(self.app)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
