"""The honkctl HTTP client against a real loopback HTTP server (the standard library's)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from helpers.servers import free_port

from honk.cli.client import (
    ApiCallError,
    ApiClient,
    ConnectError,
    RequestTimeout,
    Unauthorized,
    normalize_base,
    segment,
)

POLL = 0.01  # seconds: serve_forever's shutdown poll (teardown waits for one)
Handler = Callable[[BaseHTTPRequestHandler], None]


class Server:
    """A threaded HTTP server; ``handle`` answers every request; ``seen`` records them."""

    def __init__(self, handle: Handler) -> None:
        self.seen: list[dict] = []
        self.release = threading.Event()  # set at teardown: handlers that hold a connection return
        outer = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                outer.seen.append(
                    {"method": self.command, "path": self.path, "headers": dict(self.headers), "body": body}
                )
                handle(self)

            do_GET = do_POST = do_PUT = do_DELETE = _any

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.httpd.owner = self  # type: ignore[attr-defined]
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(POLL,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def serve() -> Iterator[Callable[[Handler], Server]]:
    servers: list[Server] = []

    def start(handle: Handler) -> Server:
        servers.append(Server(handle))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def reply(
    h: BaseHTTPRequestHandler, status: int, body: object, content_type: str = "application/json"
) -> None:
    data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    h.send_response(status)
    h.send_header("Content-Type", content_type)
    h.send_header("Content-Length", str(len(data)))
    h.end_headers()
    h.wfile.write(data)


def chunk(h: BaseHTTPRequestHandler, data: bytes) -> None:
    h.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
    h.wfile.flush()


def hold(h: BaseHTTPRequestHandler) -> None:
    """Keep the connection open, saying nothing more, until the test ends."""
    h.server.owner.release.wait(30)  # type: ignore[attr-defined]


def test_a_request_carries_the_bearer_secret_and_a_json_body_and_returns_the_parsed_reply(serve):
    server = serve(lambda h: reply(h, 200, {"group": "proxy", "changed": ["tcp"]}))
    client = ApiClient(server.url, "s3cret")
    got = client.request("PUT", "/v1/groups/p/selection", json_body={"member": "b", "network": "tcp"})
    assert got.status == 200 and got.data == {"group": "proxy", "changed": ["tcp"]}
    assert json.loads(got.text) == got.data
    req = server.seen[0]
    assert req["method"] == "PUT" and req["path"] == "/v1/groups/p/selection"
    assert req["headers"]["Authorization"] == "Bearer s3cret"
    assert req["headers"]["Content-Type"] == "application/json"
    assert json.loads(req["body"]) == {"member": "b", "network": "tcp"}


def test_no_secret_sends_no_authorization_header(serve):
    server = serve(lambda h: reply(h, 200, {}))
    ApiClient(server.url).get("/v1/status")
    assert "Authorization" not in server.seen[0]["headers"]


def test_names_with_spaces_slashes_and_non_ascii_travel_as_one_encoded_segment(serve):
    server = serve(lambda h: reply(h, 200, {}))
    ApiClient(server.url).get(f"/v1/groups/{segment('香港 / fast')}", query={"network": "both"})
    assert server.seen[0]["path"] == "/v1/groups/%E9%A6%99%E6%B8%AF%20%2F%20fast?network=both"


def test_a_native_error_body_becomes_a_typed_error_with_its_code_and_message(serve):
    server = serve(lambda h: reply(h, 404, {"error": {"code": "group_not_found", "message": "no group 'x'"}}))
    with pytest.raises(ApiCallError) as info:
        ApiClient(server.url).get("/v1/groups/x")
    assert (info.value.status, info.value.code, info.value.message) == (
        404,
        "group_not_found",
        "no group 'x'",
    )
    assert not isinstance(info.value, Unauthorized)


def test_401_is_unauthorized(serve):
    server = serve(lambda h: reply(h, 401, {"error": {"code": "unauthorized", "message": "Unauthorized"}}))
    with pytest.raises(Unauthorized) as info:
        ApiClient(server.url, "wrong").get("/v1/status")
    assert info.value.status == 401 and info.value.code == "unauthorized"


def test_a_non_json_error_keeps_the_status_as_code_and_quotes_the_text(serve):
    server = serve(lambda h: reply(h, 502, "upstream broke", content_type="text/plain"))
    with pytest.raises(ApiCallError) as info:
        ApiClient(server.url).get("/v1/status")
    assert info.value.code == "http_502" and info.value.message == "upstream broke"


def test_an_accepted_error_status_is_returned_with_its_body(serve):
    body = {"error": {"code": "config_invalid", "message": "1 error"}, "diagnostics": [{"line": 3}]}
    server = serve(lambda h: reply(h, 422, body))
    got = ApiClient(server.url).request("POST", "/v1/config/check", text_body="global {}", accept=(422,))
    assert got.status == 422 and got.data == body
    assert server.seen[0]["headers"]["Content-Type"].startswith("text/plain")
    assert server.seen[0]["body"] == b"global {}"


def test_a_success_that_is_not_json_is_a_bad_response(serve):
    server = serve(lambda h: reply(h, 200, "<html>", content_type="text/html"))
    with pytest.raises(ApiCallError) as info:
        ApiClient(server.url).get("/v1/status")
    assert info.value.code == "bad_response"


def test_a_closed_port_is_a_connect_error_naming_the_url_and_the_refusal():
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ConnectError) as info:
        ApiClient(url).get("/v1/status")
    assert info.value.url == url and "refused" in info.value.reason
    assert str(info.value).startswith(f"cannot reach the daemon at {url}")


def test_a_daemon_that_never_answers_is_a_request_timeout_within_the_timeout(serve):
    server = serve(hold)  # read the request, say nothing
    client = ApiClient(server.url, timeout=0.3)
    started = time.monotonic()
    with pytest.raises(RequestTimeout) as info:
        client.get("/v1/status")
    assert time.monotonic() - started < 5
    assert "no answer within 0.3 s" in str(info.value)


def test_a_per_request_timeout_overrides_the_default(serve):
    server = serve(hold)
    client = ApiClient(server.url, timeout=30)
    with pytest.raises(RequestTimeout) as info:
        client.request("POST", "/v1/delay", json_body={}, timeout=0.2)
    assert info.value.timeout == 0.2


def ndjson(lines: list[bytes], end: str) -> Handler:
    """A chunked NDJSON answer of ``lines``; then ``end``: "finish" (last chunk), "hold" (keep the
    connection open until teardown) or "break" (close without the last chunk)."""

    def handle(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "application/x-ndjson")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        for line in lines:
            chunk(h, line)
        if end == "finish":
            h.wfile.write(b"0\r\n\r\n")
        elif end == "hold":
            hold(h)
        else:
            h.close_connection = True
            h.connection.shutdown(socket.SHUT_RDWR)

    return handle


def test_lines_yields_each_ndjson_line_even_when_one_spans_two_chunks(serve):
    server = serve(ndjson([b'{"a": 1}\n{"b"', b": 2}\n"], "finish"))
    assert list(ApiClient(server.url).lines("/v1/logs", query={"level": "info"})) == ['{"a": 1}', '{"b": 2}']
    assert server.seen[0]["path"] == "/v1/logs?level=info"


def test_lines_with_an_idle_window_stops_once_the_stream_is_quiet(serve):
    server = serve(ndjson([b'{"a": 1}\n', b'{"b": 2}\n'], "hold"))
    started = time.monotonic()
    assert list(ApiClient(server.url).lines("/v1/logs", idle=0.3)) == ['{"a": 1}', '{"b": 2}']
    assert time.monotonic() - started < 5


def test_a_stream_cut_before_its_last_chunk_is_a_connect_error(serve):
    server = serve(ndjson([b'{"a": 1}\n'], "break"))
    got: list[str] = []
    with pytest.raises(ConnectError) as info:
        for line in ApiClient(server.url).lines("/v1/logs"):
            got.append(line)
    assert got == ['{"a": 1}'] and "stream broke" in info.value.reason


def test_a_refused_stream_raises_the_api_error(serve):
    server = serve(lambda h: reply(h, 400, {"error": {"code": "invalid_request", "message": "level: bad"}}))
    with pytest.raises(ApiCallError) as info:
        list(ApiClient(server.url).lines("/v1/logs", query={"level": "loud"}))
    assert info.value.code == "invalid_request"


@pytest.mark.parametrize(
    ("given", "base"),
    [
        ("127.0.0.1:9090", "http://127.0.0.1:9090"),
        ("http://[::1]:9090/", "http://[::1]:9090"),
        ("https://router.lan/honk/", "https://router.lan/honk"),
    ],
)
def test_base_urls_are_normalized(given, base):
    assert normalize_base(given) == base


@pytest.mark.parametrize("bad", ["ftp://host:21", "http://", "http://host:99999"])
def test_unusable_base_urls_are_refused(bad):
    with pytest.raises(ValueError):
        normalize_base(bad)


def test_a_path_prefix_in_the_base_url_is_kept(serve):
    server = serve(lambda h: reply(h, 200, {}))
    ApiClient(server.url + "/honk/").get("/v1/status")
    assert server.seen[0]["path"] == "/honk/v1/status"
