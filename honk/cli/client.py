"""A small synchronous client for honk's native API (``/v1/...``), and the two Clash API
routes ``honkctl dns`` uses (``/dns/query``, ``/cache/dns/flush``), which have no native twin.

Standard library only (``http.client``): ``honkctl`` starts in a few tens of
milliseconds and never imports aiohttp. One connection per request; the API is
on loopback or a LAN and requests are rare.

Failures are typed so the CLI can map them to exit codes:

* :class:`ConnectError`: the daemon cannot be reached (refused, unresolvable,
  the connection dropped, no answer in time);
* :class:`ApiCallError`: the daemon answered with an error status; ``code`` and
  ``message`` come from the native error body ``{"error": {"code", "message"}}``;
  :class:`Unauthorized` is the 401 case.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from honk import __version__

DEFAULT_TIMEOUT = 10.0  # seconds per request (connect, then each read)
DELAY_SLACK = (
    5.0  # seconds past a delay test's own timeout: the daemon answers within timeout + a small slack
)
STREAM_READ = 65536  # bytes asked of a stream per read
ERROR_SNIPPET = 200  # characters of a non-JSON error body quoted in the message
USER_AGENT = f"honkctl/{__version__}"


class ClientError(Exception):
    """Base of the client's failures."""


class ConnectError(ClientError):
    """The daemon at ``url`` could not be reached; ``reason`` says how."""

    def __init__(self, url: str, reason: str) -> None:
        self.url = url
        self.reason = reason
        super().__init__(f"cannot reach the daemon at {url}: {reason}")


class RequestTimeout(ConnectError):
    """The daemon accepted the connection but did not answer within ``timeout`` seconds."""

    def __init__(self, url: str, timeout: float) -> None:
        self.timeout = timeout
        super().__init__(url, f"no answer within {timeout:g} s")


class ApiCallError(ClientError):
    """The daemon refused the request: HTTP ``status``, stable ``code``, ``message``; ``body``
    is the parsed JSON body (or None)."""

    def __init__(self, status: int, code: str, message: str, body: Any = None) -> None:
        self.status = status
        self.code = code
        self.message = message
        self.body = body
        super().__init__(f"{code}: {message}")


class Unauthorized(ApiCallError):
    """401: the secret is wrong or missing."""


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    data: Any  # the parsed JSON body
    text: str  # the body as received


def segment(name: str) -> str:
    """``name`` as one path segment: every reserved character, space and non-ASCII encoded."""
    return quote(name, safe="")


def normalize_base(url: str) -> str:
    """``host:port`` or a full URL as ``scheme://host:port[/prefix]`` (no trailing slash);
    ValueError when it is not an http(s) URL."""
    text = url.strip()
    if "://" not in text:
        text = "http://" + text
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    parts.port  # noqa: B018 - raises ValueError for a bad port
    return f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"


class ApiClient:
    """Requests to the native API at ``base_url`` with ``Authorization: Bearer <secret>``."""

    def __init__(self, base_url: str, secret: str = "", timeout: float = DEFAULT_TIMEOUT) -> None:
        self.base_url = normalize_base(base_url)
        parts = urlsplit(self.base_url)
        self._https = parts.scheme == "https"
        self._host = parts.hostname or ""
        self._port = parts.port or (443 if self._https else 80)
        self._prefix = parts.path
        self.secret = secret
        self.timeout = timeout

    # --- plumbing ------------------------------------------------------------------------------

    def _connection(self, timeout: float | None) -> http.client.HTTPConnection:
        if self._https:
            return http.client.HTTPSConnection(
                self._host, self._port, timeout=timeout, context=ssl.create_default_context()
            )
        return http.client.HTTPConnection(self._host, self._port, timeout=timeout)

    def _headers(self, content_type: str | None) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        if self.secret:
            headers["Authorization"] = f"Bearer {self.secret}"
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    def _target(self, path: str, query: Mapping[str, Any] | None) -> str:
        target = self._prefix + path
        if query:
            target += "?" + urlencode({k: v for k, v in query.items() if v is not None})
        return target

    def _open(
        self,
        method: str,
        path: str,
        query: Mapping[str, Any] | None,
        body: bytes | None,
        content_type: str | None,
        timeout: float | None,
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """Send the request and read the response head; ConnectError on any transport failure."""
        conn = self._connection(timeout)
        try:
            conn.request(method, self._target(path, query), body=body, headers=self._headers(content_type))
            return conn, conn.getresponse()
        except BaseException as exc:
            conn.close()
            raise self._transport_error(exc, timeout) from None

    def _transport_error(self, exc: BaseException, timeout: float | None) -> BaseException:
        if isinstance(exc, TimeoutError):
            return RequestTimeout(self.base_url, timeout or 0.0)
        if isinstance(exc, socket.gaierror):
            return ConnectError(self.base_url, f"cannot resolve {self._host} ({exc.strerror or exc})")
        if isinstance(exc, http.client.RemoteDisconnected):
            return ConnectError(self.base_url, "the connection closed before an answer")
        if isinstance(exc, ssl.SSLError):
            return ConnectError(self.base_url, f"TLS: {exc.reason or exc}")
        if isinstance(exc, OSError):
            return ConnectError(self.base_url, (exc.strerror or str(exc)).lower())
        if isinstance(exc, http.client.HTTPException):
            return ConnectError(self.base_url, f"not an HTTP answer ({type(exc).__name__})")
        return exc

    @staticmethod
    def _error(status: int, reason: str, text: str, data: Any) -> ApiCallError:
        code, message = f"http_{status}", reason or "error"
        err = data.get("error") if isinstance(data, dict) else None
        if isinstance(err, dict):
            code = str(err.get("code") or code)
            message = str(err.get("message") or message)
        elif isinstance(data, dict) and "message" in data:  # a Clash route's body, or an older honk
            message = str(data["message"])
        elif text.strip():
            message = text.strip()[:ERROR_SNIPPET]
        cls = Unauthorized if status == 401 else ApiCallError
        return cls(status, code, message, data)

    # --- requests ------------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        json_body: Any = None,
        text_body: str | None = None,
        content_type: str | None = None,
        timeout: float | None = None,
        accept: tuple[int, ...] = (),
    ) -> Reply:
        """One request; the JSON reply for a 2xx status or one in ``accept``, else ApiCallError."""
        body: bytes | None = None
        if json_body is not None:
            body = json.dumps(json_body, ensure_ascii=False).encode()
            content_type = content_type or "application/json"
        elif text_body is not None:
            body = text_body.encode()
            content_type = content_type or "text/plain; charset=utf-8"
        wait = self.timeout if timeout is None else timeout
        conn, resp = self._open(method, path, query, body, content_type, wait)
        try:
            raw = resp.read()
        except BaseException as exc:
            raise self._transport_error(exc, wait) from None
        finally:
            conn.close()
        text = raw.decode("utf-8", "replace")
        try:
            data = json.loads(text) if text.strip() else None
        except ValueError:
            data = None
            if 200 <= resp.status < 300 or resp.status in accept:
                raise ApiCallError(
                    resp.status, "bad_response", f"the answer is not JSON: {text.strip()[:ERROR_SNIPPET]!r}"
                ) from None
        if 200 <= resp.status < 300 or resp.status in accept:
            return Reply(resp.status, data, text)
        raise self._error(resp.status, resp.reason, text, data)

    def get(self, path: str, **kw: Any) -> Any:
        return self.request("GET", path, **kw).data

    def post(self, path: str, json_body: Any = None, **kw: Any) -> Any:
        return self.request("POST", path, json_body=json_body, **kw).data

    def put(self, path: str, json_body: Any = None, **kw: Any) -> Any:
        return self.request("PUT", path, json_body=json_body, **kw).data

    def delete(self, path: str, **kw: Any) -> Any:
        return self.request("DELETE", path, **kw).data

    def lines(
        self, path: str, *, query: Mapping[str, Any] | None = None, idle: float | None = None
    ) -> Iterator[str]:
        """The lines of a streamed (chunked NDJSON) body, without their newlines, as they arrive.

        ``idle``: stop quietly once no line arrived for that many seconds; None waits forever.
        The stream ending before its last chunk (the daemon stopped) is a ConnectError.
        """
        conn, resp = self._open("GET", path, query, None, None, self.timeout)
        try:
            if not 200 <= resp.status < 300:
                text = resp.read().decode("utf-8", "replace")
                try:
                    data = json.loads(text)
                except ValueError:
                    data = None
                raise self._error(resp.status, resp.reason, text, data)
            if conn.sock is not None:
                conn.sock.settimeout(idle)
            pending = b""
            while True:
                try:
                    # read1, not readline: http.client's readline hides a cut chunked stream as its end
                    data = resp.read1(STREAM_READ)
                except TimeoutError:
                    return  # idle for `idle` seconds: the window is over
                except (http.client.IncompleteRead, OSError) as exc:
                    raise ConnectError(self.base_url, f"the stream broke ({type(exc).__name__})") from None
                if not data:  # the last chunk arrived
                    if pending.strip():
                        yield pending.decode("utf-8", "replace").strip()
                    return
                *complete, pending = (pending + data).split(b"\n")
                for raw in complete:
                    line = raw.decode("utf-8", "replace").rstrip("\r")
                    if line:
                        yield line
        finally:
            conn.close()
