"""honk as a process relaying through a Shadowsocks node to a real ss-server, fetched by curl.

Path of every request: curl -> honk's mixed port -> the ``ss`` node (the relay
seals and opens the AEAD chunks) -> ss-server (shadowsocks-libev) -> a local
HTTP origin. Each cipher runs on each relay: the compiled engine (default when
built), its pure-Python twin (``HONK_NO_EXTENSIONS=1 HONK_RELAY=native
HONK_FASTPATH=on``) and the asyncio copy relay (``HONK_RELAY=copy``). Each
process is asked three ways: SOCKS5 (the fast path's ``hs_relay``), HTTP
CONNECT (``Dispatcher.relay``) and an absolute-form HTTP request (the
forwarder's framed socket).
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.peers import require_binary
from helpers.peerservers import SS_METHODS, ss_server
from helpers.proc import HonkProcess

from honk._fast import relay as fast_relay

PASSWORD = "relay through ss"
BODY_SIZE = 3 * 1024 * 1024 + 12345  # several hundred chunks each way, not a multiple of 0x3FFF
CURL_TIMEOUT = 20  # seconds

RELAYS = {
    "twin": {"HONK_NO_EXTENSIONS": "1", "HONK_RELAY": "native", "HONK_FASTPATH": "on"},
    "copy": {"HONK_RELAY": "copy"},
}
if fast_relay.IMPLEMENTATION == "compiled":
    RELAYS = {"compiled": {"HONK_REQUIRE_EXTENSIONS": "1"}, **RELAYS}


def _body(size: int) -> bytes:
    """Deterministic bytes of any length (so the test knows the digest without keeping a copy)."""
    block = hashlib.sha256(str(size).encode()).digest() * 2048  # 64 KiB
    return (block * (size // len(block) + 1))[:size]


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        body = _body(int(self.path.rsplit("/", 1)[-1]))
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def origin() -> Iterator[int]:
    """An HTTP origin answering ``GET /bytes/N`` with ``_body(N)``; yields its port."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def _config(path: Path, method: str, port: int) -> Path:
    userinfo = base64.urlsafe_b64encode(f"{method}:{PASSWORD}".encode()).decode().rstrip("=")
    path.write_text(
        "global {\n    log_level: info\n    data_dir: ./var\n}\n"
        "inbound {\n    lan: 'mixed://127.0.0.1:0'\n}\n"
        f"node {{\n    ss_node: 'ss://{userinfo}@127.0.0.1:{port}#ss_node'\n}}\n"
        "routing {\n    fallback: ss_node\n}\n"
    )
    return path


def _curl(*args: str) -> bytes:
    curl = require_binary("curl")
    out = subprocess.run(
        [curl, "-sS", "--fail", "--max-time", str(CURL_TIMEOUT), *args],
        capture_output=True,
        timeout=CURL_TIMEOUT + 10,
    )
    assert out.returncode == 0, out.stderr.decode(errors="replace")
    return out.stdout


@pytest.mark.parametrize("relay", list(RELAYS))
@pytest.mark.parametrize("method", SS_METHODS)
def test_curl_fetches_a_body_through_an_ss_node_on_every_relay(tmp_path, origin, method, relay) -> None:
    expected = hashlib.sha256(_body(BODY_SIZE)).hexdigest()
    url = f"http://127.0.0.1:{origin}/bytes/{BODY_SIZE}"
    with ss_server(method, PASSWORD, udp=False) as server:
        with HonkProcess(_config(tmp_path / "honk.dae", method, server.port), env=RELAYS[relay]) as honk:
            host, port = honk.inbound()
            proxy = f"{host}:{port}"
            for how in (
                ["--socks5-hostname", proxy],
                ["-p", "-x", f"http://{proxy}"],
                ["-x", f"http://{proxy}"],
            ):
                body = _curl(*how, url)
                assert len(body) == BODY_SIZE, how
                assert hashlib.sha256(body).hexdigest() == expected, how
