"""The aiohttp application behind the API listener: middlewares and the surfaces' routes.

Imported when the listener meets its first connection (see :class:`honk.api.server.ApiServer`),
so a daemon nobody queries never loads the web stack.

Request path, outermost first (the connection guard in :mod:`honk.api.server` runs below it):

1. **Guard hand-off**: a complete request head arrived, so the head deadline is off while
   the handler runs and on again after the response.
2. **CORS** runs before authentication (clash-api.md §1): a preflight is
   answered without a token, with ``Access-Control-Allow-Private-Network`` when
   the browser asks. Every other response of a request with an ``Origin`` gets the
   allow-origin header from the application's ``on_response_prepare`` signal, which
   aiohttp fires for every response as its head is sent: JSON, streamed and chunked
   bodies, WebSocket upgrades, files, errors (a dashboard can read a 401). A handler
   that prepares its own response cannot skip it.
3. **Errors**: :class:`~honk.api.errors.ApiError` and aiohttp's own HTTP errors
   become the surface's JSON error body; anything else is logged and a 500.
4. **Authentication**: ``Authorization: Bearer <secret>`` compared in constant
   time; ``?token=`` is accepted only on a WebSocket upgrade. ``/ui`` is public.
   A source that keeps failing is answered 429 for a while (:mod:`honk.api.authguard`);
   every failure is logged at info and counted (``honk_api_auth_failures_total``).
5. **Body limit**: a declared body over :data:`~honk.api.server.MAX_BODY` is refused with
   413 before it is read; aiohttp enforces the same limit on chunked bodies.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path

from aiohttp import web

from honk.api import clash, metrics, native
from honk.api.authguard import REJECTED, THROTTLED, AuthThrottle
from honk.api.context import Control
from honk.api.errors import ApiError, render, unauthorized
from honk.api.server import MAX_BODY, ConnectionGuard
from honk.core.logs import kv

log = logging.getLogger("honk.api")

CORS_MAX_AGE = "300"  # seconds a browser may cache a preflight (mihomo's default)
CORS_METHODS = "GET, POST, PUT, PATCH, DELETE"
CORS_HEADERS = "Content-Type, Authorization"
UI_PREFIX = "/ui"
RUNNER_SHUTDOWN = 1.0  # seconds open requests get when the listener stops

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
RouteSource = Callable[[Control], Iterable[web.AbstractRouteDef]]
SURFACES: tuple[RouteSource, ...] = (clash.routes, native.routes, metrics.routes)


# --- middlewares ---------------------------------------------------------------------------


async def _cors_on_prepare(request: web.Request, response: web.StreamResponse) -> None:
    """Every response's head, as it is sent: allow any origin to read it (the API's secret,
    not the origin, guards it; clash-api.md §1)."""
    if "Origin" in request.headers:
        response.headers["Access-Control-Allow-Origin"] = "*"
        response.headers.setdefault("Vary", "Origin")


@web.middleware
async def cors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A preflight is answered here, before authentication (it carries no token)."""
    if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
        response = web.Response(status=204)
        response.headers.update(
            {
                "Access-Control-Allow-Methods": CORS_METHODS,
                "Access-Control-Allow-Headers": CORS_HEADERS,
                "Access-Control-Max-Age": CORS_MAX_AGE,
            }
        )
        if request.headers.get("Access-Control-Request-Private-Network", "").lower() == "true":
            response.headers["Access-Control-Allow-Private-Network"] = "true"
        return response
    return await handler(request)


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


def auth_middleware(secret: str, control: Control) -> Callable[..., Awaitable[web.StreamResponse]]:
    """Bearer authentication, with failed attempts limited per source (:mod:`honk.api.authguard`,
    on the daemon's clock) and counted in the daemon's ``stats.api_auth_failures``."""
    expected = f"Bearer {secret}".encode()
    token_bytes = secret.encode()
    throttle = AuthThrottle(control.clock)
    counts = control.stats.api_auth_failures

    def count(result: str) -> None:
        counts[result] += 1

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if secret and not _public(request.path):
            source = request.remote or ""
            if throttle.throttled(source):
                count(THROTTLED)
                response = render(request, 429, "too_many_failures", "Too many failed authentications")
                response.headers["Retry-After"] = str(throttle.retry_after(source))
                return response
            if not _authorized(request, expected, token_bytes):
                throttle.failed(source)
                count(REJECTED)
                log.info("API authentication failed %s", kv(source=source, path=request.path))
                raise unauthorized()
        return await handler(request)

    return middleware


def _public(path: str) -> bool:
    return path == UI_PREFIX or path.startswith(UI_PREFIX + "/")


def _same(given: str, expected: bytes) -> bool:
    """Constant time in the secret: both sides hashed to one length first, so neither the
    secret's bytes nor its length show in the time a wrong guess takes."""
    return hmac.compare_digest(hashlib.sha256(given.encode()).digest(), hashlib.sha256(expected).digest())


def _authorized(request: web.Request, expected: bytes, token: bytes) -> bool:
    """Bearer header (the scheme exactly ``Bearer``), or ``?token=`` on a WebSocket upgrade only."""
    if request.headers.get("Upgrade", "").lower() == "websocket":
        given = request.query.get("token", "")
        if given:
            return _same(given, token)
    return _same(request.headers.get("Authorization", ""), expected)


@web.middleware
async def body_limit_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.content_length is not None and request.content_length > MAX_BODY:
        raise ApiError(413, "body_too_large", f"body over {MAX_BODY} bytes")
    return await handler(request)


def guard_middleware(guard: ConnectionGuard) -> Callable[..., Awaitable[web.StreamResponse]]:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        """A complete head arrived: no deadline while the handler runs, a fresh one after."""
        held = guard.open.get(request.transport) if request.transport is not None else None
        if held is not None:
            held.disarm()
        try:
            return await handler(request)
        finally:
            if held is not None and held.transport is not None and not held.transport.is_closing():
                held.arm()

    return middleware


def build_app(
    control: Control,
    secret: str,
    sources: Iterable[RouteSource],
    guard: ConnectionGuard | None = None,
    ui_dir: Path | None = None,
) -> web.Application:
    middlewares = [cors_middleware, error_middleware, auth_middleware(secret, control), body_limit_middleware]
    if guard is not None:
        middlewares.insert(0, guard_middleware(guard))
    app = web.Application(middlewares=middlewares, client_max_size=MAX_BODY)
    app.on_response_prepare.append(_cors_on_prepare)
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


# aiohttp 3.9 moved the shutdown grace onto the runner; Debian 12's 3.8 would hand the keyword to
# every request handler, which refuses it (its cleanup has no grace to bound)
_RUNNER_TAKES_SHUTDOWN = "shutdown_timeout" in inspect.signature(web.BaseRunner.__init__).parameters


def runner(app: web.Application) -> web.AppRunner:
    grace = {"shutdown_timeout": RUNNER_SHUTDOWN} if _RUNNER_TAKES_SHUTDOWN else {}
    return web.AppRunner(app, access_log=None, handle_signals=False, **grace)
