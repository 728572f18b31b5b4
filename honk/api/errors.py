"""Typed API errors and how each surface renders them.

Handlers raise :class:`ApiError`; the server's error middleware renders it in the
shape of the surface the request went to: the Clash API's ``{"message": …}``, or
the native API's ``{"error": {"code", "message"}}`` with a stable ``code``.
"""

from __future__ import annotations

import json

from aiohttp import web

NATIVE_PREFIX = "/v1/"


class ApiError(Exception):
    """A request the API refuses: HTTP ``status``, a stable ``code``, a human ``message``."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


# The Clash contract's fixed messages (clash-api.md §1 "Error body").
CLASH_MESSAGES = {
    400: "Body invalid",
    401: "Unauthorized",
    404: "Resource not found",
    413: "Body too large",
    429: "Too many failed authentications",
    504: "Timeout",
}

# Stable native codes for the statuses aiohttp raises on its own.
NATIVE_CODES = {
    400: "invalid_request",
    401: "unauthorized",
    404: "resource_not_found",
    405: "method_not_allowed",
    413: "body_too_large",
    500: "internal",
    503: "unavailable",
    504: "timeout",
}


def unauthorized() -> ApiError:
    return ApiError(401, "unauthorized", "Unauthorized")


def not_found(what: str = "Resource not found") -> ApiError:
    return ApiError(404, "resource_not_found", what)


def bad_request(message: str = "Body invalid", code: str = "invalid_request") -> ApiError:
    return ApiError(400, code, message)


def refused(error: Exception) -> ApiError:
    """An :class:`~honk.control.errors.ApplyError` as the API answers it: 400 for a
    configuration, build or bind refusal, 409 for a disruptive change, 503 once the
    reconciler has shut down; the message is the error's own text."""
    status = getattr(error, "status", 400)
    code = "reload_" + getattr(error, "variant", "refused")
    return ApiError(status, code, str(error))


def is_native(request: web.Request) -> bool:
    return request.path.startswith(NATIVE_PREFIX)


def render(request: web.Request, status: int, code: str | None, message: str | None) -> web.Response:
    """The error response for ``request``'s surface."""
    if is_native(request):
        body = {
            "error": {
                "code": code or NATIVE_CODES.get(status, "error"),
                "message": message or CLASH_MESSAGES.get(status, "error"),
            }
        }
    else:
        body = {"message": message or CLASH_MESSAGES.get(status, "error")}
    return web.Response(
        status=status, text=json.dumps(body, ensure_ascii=False), content_type="application/json"
    )
