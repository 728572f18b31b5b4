"""The API server's boundary: authentication on every route, CORS before auth, body limits,
malformed JSON, and slow or excess clients, none of which touches the data path."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket

import aiohttp
import pytest
import yarl
from helpers.apidaemon import LAN_INBOUND, api_base, api_block, bearer, quiet_global, running_daemon
from helpers.engines import poll
from helpers.servers import EchoServer

from honk.api.authguard import FAILURE_BURST, FAILURE_REFILL
from honk.api.server import HEAD_TIMEOUT, MAX_API_CONNECTIONS, MAX_BODY
from honk.control.errors import BindFailed
from honk.core.clock import FakeClock
from honk.daemon.app import Daemon

SECRET = "s3cret"

ROUTED = """node {
    a: 'socks5://127.0.0.1:9'
}
group {
    proxy {
        filter: name(a)
    }
}
routing {
    fallback: direct
}
"""


def config(tmp_path, secret: str = SECRET, extra: str = "") -> str:  # noqa: ANN001
    """``extra``: more clash_api lines (see api_block)."""
    return quiet_global(tmp_path / "var") + LAN_INBOUND + ROUTED + api_block(secret, extra)


def started(tmp_path, clock=None, secret: str = SECRET, extra: str = ""):  # noqa: ANN001, ANN201
    return running_daemon(tmp_path, config(tmp_path, secret, extra), clock)


def concrete(path: str) -> str:
    """A request path for a route pattern: every {placeholder} filled with a plain name."""
    return re.sub(r"\{[^}]+\}", "proxy", path)


async def test_every_route_refuses_a_request_without_the_secret(tmp_path):
    clock = FakeClock()
    async with started(tmp_path, clock) as daemon:
        app = await daemon.api.load()
        routes = [
            (r.method, r.resource.canonical)
            for r in app.router.routes()
            if r.method not in ("HEAD", "OPTIONS", "*")
        ]
        assert len(routes) > 30  # the Clash, native and metrics surfaces are all there
        async with aiohttp.ClientSession() as session:
            for method, path in routes:
                url = api_base(daemon) + concrete(path)
                for headers in (
                    {},
                    {"Authorization": "Bearer wrong"},
                    {"Authorization": f"Basic {SECRET}"},
                    {"Authorization": SECRET},
                ):
                    clock.advance(FAILURE_REFILL)  # each failure's try given back: 401s, never 429
                    async with session.request(method, url, headers=headers) as response:
                        assert response.status == 401, (method, path, headers)
                        assert await response.json() in (
                            {"message": "Unauthorized"},
                            {"error": {"code": "unauthorized", "message": "Unauthorized"}},
                        )


async def test_the_token_query_authenticates_only_a_websocket_upgrade(tmp_path):
    async with started(tmp_path) as daemon, aiohttp.ClientSession() as session:
        async with session.get(f"{api_base(daemon)}/version?token={SECRET}") as response:
            assert response.status == 401
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            async with session.ws_connect(f"{api_base(daemon)}/traffic?token=wrong") as ws:
                pytest.fail(f"connected with a wrong token: {ws}")
        assert refused.value.status == 401


async def test_a_websocket_upgrade_with_the_token_is_admitted(tmp_path):
    async with started(tmp_path) as daemon:
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(f"{api_base(daemon)}/memory?token={SECRET}") as ws:
                frame = await asyncio.wait_for(ws.receive_json(), 5)
                assert "inuse" in frame


async def test_a_preflight_needs_no_secret_and_grants_private_network_access(tmp_path):
    async with started(tmp_path) as daemon:
        async with aiohttp.ClientSession() as session:
            async with session.options(
                f"{api_base(daemon)}/proxies/My%20Proxy",
                headers={
                    "Origin": "https://board.zash.run.place",
                    "Access-Control-Request-Method": "PUT",
                    "Access-Control-Request-Headers": "authorization,content-type",
                    "Access-Control-Request-Private-Network": "true",
                },
            ) as response:
                assert response.status == 204
                assert response.headers["Access-Control-Allow-Origin"] == "*"
                assert "PUT" in response.headers["Access-Control-Allow-Methods"]
                allowed = response.headers["Access-Control-Allow-Headers"].lower()
                assert "authorization" in allowed and "content-type" in allowed
                assert response.headers["Access-Control-Allow-Private-Network"] == "true"
            async with session.get(
                f"{api_base(daemon)}/version", headers={"Origin": "https://x.example"}
            ) as response:
                assert response.status == 401  # refused, but readable by the dashboard
                assert response.headers["Access-Control-Allow-Origin"] == "*"


async def test_an_empty_secret_admits_every_request(tmp_path):
    async with started(tmp_path, secret="") as daemon:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{api_base(daemon)}/version") as response:
                assert response.status == 200
                assert (await response.json())["meta"] is True


async def test_the_external_ui_is_served_without_the_secret(tmp_path):
    ui = tmp_path / "ui"
    ui.mkdir()
    (ui / "index.html").write_text("<html>dashboard</html>")
    (ui / "app.js").write_text("console.log(1)")
    async with started(tmp_path, extra=f"        external_ui: '{ui}'\n") as daemon:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{api_base(daemon)}/ui", allow_redirects=False) as response:
                assert response.status == 302 and response.headers["Location"] == "/ui/"
            async with session.get(f"{api_base(daemon)}/ui/") as response:
                assert response.status == 200 and "dashboard" in await response.text()
            async with session.get(f"{api_base(daemon)}/ui/app.js") as response:
                assert response.status == 200
            for escape in ("/ui/../honk.dae", "/ui/%2e%2e/honk.dae", "/ui/..%2fhonk.dae"):
                url = yarl.URL(api_base(daemon) + escape, encoded=True)
                async with session.get(url) as response:
                    assert response.status in (401, 403, 404), escape  # never the file
                    assert "clash_api" not in await response.text()


async def test_a_body_over_the_limit_is_refused_before_it_is_read(tmp_path):
    # a raw client: it stops sending at the answer, as an HTTP client library may not (aiohttp
    # 3.8's reports the server's early answer as a disconnect while it is still writing)
    async def refused(head: bytes, body: list[bytes]) -> tuple[bytes, bytes]:
        reader, writer = await asyncio.open_connection(*daemon.api.bound)
        answer_read = asyncio.ensure_future(reader.read(4096))
        try:
            writer.write(head)
            for chunk in body:
                if answer_read.done():  # answered: the rest of the body is never sent
                    break
                writer.write(chunk)
                with contextlib.suppress(ConnectionError):
                    await writer.drain()
            answer = await asyncio.wait_for(answer_read, 10)
        finally:
            answer_read.cancel()
            writer.close()
        status, _, rest = answer.partition(b"\r\n")
        return status, rest.partition(b"\r\n\r\n")[2]

    auth = f"Authorization: Bearer {SECRET}\r\n".encode()
    async with started(tmp_path) as daemon:
        status, _ = await refused(
            b"PUT /proxies/proxy HTTP/1.1\r\nHost: api\r\n" + auth + b"Content-Length: 10485760\r\n\r\n", []
        )
        assert status.startswith(b"HTTP/1.1 413")  # declared: refused on the head, before any body
        chunk = b"100000\r\n" + b"y" * 0x100000 + b"\r\n"
        status, body = await refused(
            b"POST /v1/config/check?format=dae HTTP/1.1\r\nHost: api\r\n"
            + auth
            + b"Transfer-Encoding: chunked\r\n\r\n",
            [chunk] * 10,
        )
        assert status.startswith(b"HTTP/1.1 413")  # chunked: counted as it arrives
        assert b'"body_too_large"' in body
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{api_base(daemon)}/version", headers=bearer(SECRET)) as response:
                assert response.status == 200  # the server carries on
    assert MAX_BODY < 10 * 1024 * 1024


async def test_malformed_json_gets_a_typed_error_on_both_surfaces(tmp_path):
    auth = {**bearer(SECRET), "Content-Type": "application/json"}
    async with started(tmp_path) as daemon:
        async with aiohttp.ClientSession() as session:
            async with session.put(
                f"{api_base(daemon)}/proxies/proxy", data=b"{not json", headers=auth
            ) as response:
                assert response.status == 400
                assert "message" in await response.json()
            async with session.put(
                f"{api_base(daemon)}/v1/groups/proxy/selection", data=b"[1,", headers=auth
            ) as response:
                assert response.status == 400
                assert (await response.json())["error"]["code"] == "invalid_request"
            async with session.put(
                f"{api_base(daemon)}/v1/groups/proxy/selection", data=json.dumps({"member": 5}), headers=auth
            ) as response:
                assert response.status == 400
                assert "member" in (await response.json())["error"]["message"]


def _open_partial(port: int) -> socket.socket:
    """A client that sends half a request head and then nothing (slow loris)."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(b"GET /version HTTP/1.1\r\nHost: honk\r\nX-Slow: ")
    sock.setblocking(False)
    return sock


def _closed_by_peer(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


async def test_slow_loris_clients_are_cut_at_the_head_deadline_and_the_data_path_carries_on(tmp_path):
    clock = FakeClock()
    slow: list[socket.socket] = []
    async with started(tmp_path, clock=clock) as daemon:
        port = daemon.api.bound[1]
        try:
            for _ in range(MAX_API_CONNECTIONS):
                slow.append(_open_partial(port))
            await poll(
                lambda: len(daemon.api.guard.open) == MAX_API_CONNECTIONS, "every slow client accepted"
            )
            excess = _open_partial(port)
            slow.append(excess)
            await poll(lambda: _closed_by_peer(excess), "the connection over the cap to be closed")
            assert daemon.api.guard.refused == 1

            # the data path does not notice: a proxied flow through the mixed inbound works
            with EchoServer() as echo:
                mixed = daemon.inbounds["lan"].bound.port
                reader, writer = await asyncio.open_connection("127.0.0.1", mixed)
                writer.write(f"CONNECT 127.0.0.1:{echo.address[1]} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
                writer.write(b"ping")
                assert await reader.readexactly(4) == b"ping"
                writer.close()

            clock.advance(HEAD_TIMEOUT - 0.5)
            assert not any(_closed_by_peer(s) for s in slow[:-1])
            clock.advance(1.0)
            await poll(lambda: all(_closed_by_peer(s) for s in slow[:-1]), "slow clients cut at the deadline")
            assert daemon.api.guard.expired == MAX_API_CONNECTIONS
            await poll(lambda: not daemon.api.guard.open, "the guard to forget them")

            async with aiohttp.ClientSession() as session:  # the API serves again
                async with session.get(f"{api_base(daemon)}/version", headers=bearer(SECRET)) as response:
                    assert response.status == 200
        finally:
            for sock in slow:
                sock.close()


async def test_a_keepalive_connection_gets_a_fresh_head_deadline_after_each_response(tmp_path):
    clock = FakeClock()
    async with started(tmp_path, clock=clock) as daemon:
        reader, writer = await asyncio.open_connection(*daemon.api.bound)
        request = f"GET /version HTTP/1.1\r\nHost: honk\r\nAuthorization: Bearer {SECRET}\r\n\r\n".encode()
        for _ in range(3):
            clock.advance(HEAD_TIMEOUT - 1.0)  # under the deadline each time: the connection stays
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200")
            length = int(re.search(rb"Content-Length: (\d+)", head).group(1))
            await reader.readexactly(length)
        clock.advance(HEAD_TIMEOUT)
        assert await asyncio.wait_for(reader.read(1), 5) == b""  # idle past the deadline: closed
        writer.close()


async def test_a_changed_secret_swaps_on_the_same_listener_and_a_removed_block_stops_the_api(tmp_path):
    cfg = tmp_path / "honk.dae"
    async with started(tmp_path) as daemon:
        old = daemon.api
        async with aiohttp.ClientSession() as session:  # loaded: the swap replaces a running app
            async with session.get(f"{api_base(daemon)}/version", headers=bearer(SECRET)) as response:
                assert response.status == 200
        cfg.write_text(config(tmp_path, secret="other"))
        report = await daemon.reload()
        assert report.built == ["user set api"] and "inbound api" in report.reused  # a user table store
        assert daemon.api is old  # same bind: the socket stays, the handler changes
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{api_base(daemon)}/version", headers=bearer("other")) as response:
                assert response.status == 200
            async with session.get(f"{api_base(daemon)}/version", headers=bearer(SECRET)) as response:
                assert response.status == 401
        text = cfg.read_text()
        cfg.write_text(text[: text.index("experimental")])
        assert await daemon.reload()
        assert daemon.api is None


async def test_the_web_stack_loads_at_the_first_connection_and_that_connection_is_served(tmp_path):
    async with started(tmp_path) as daemon:
        assert daemon.api.app is None  # bound and listening, nothing loaded: a quiet router keeps its memory
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{api_base(daemon)}/version", headers=bearer(SECRET)) as response:
                assert response.status == 200  # it waited in the backlog while the stack loaded
        assert daemon.api.app is not None


async def test_a_listener_that_cannot_bind_fails_the_start_and_leaves_nothing_running(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cfg = tmp_path / "honk.dae"
        cfg.write_text(
            quiet_global(tmp_path / "var")
            + LAN_INBOUND
            + ROUTED
            + api_block(SECRET).replace("127.0.0.1:0", f"127.0.0.1:{port}")
        )
        daemon = Daemon(cfg)
        with pytest.raises(BindFailed, match=f"^inbound api: binding 127.0.0.1:{port} failed: "):
            await daemon.start()
        assert daemon.api is None and not daemon.inbounds


async def test_a_source_that_keeps_failing_authentication_is_slowed_and_counted(tmp_path):
    """Ten wrong secrets get 401; the eleventh request gets 429 with Retry-After even with the right
    secret (it is not compared), and so does a WebSocket upgrade; after the refill time one more
    try is back. Every failure is in honk_api_auth_failures_total."""
    clock = FakeClock()
    async with started(tmp_path, clock) as daemon, aiohttp.ClientSession() as session:
        base = api_base(daemon)
        for _ in range(FAILURE_BURST):
            async with session.get(f"{base}/version", headers=bearer("guess")) as response:
                assert response.status == 401
        async with session.get(f"{base}/version", headers=bearer(SECRET)) as response:
            assert response.status == 429
            assert int(response.headers["Retry-After"]) == int(FAILURE_REFILL)
            assert await response.json() == {"message": "Too many failed authentications"}
        async with session.get(f"{base}/v1/status", headers=bearer(SECRET)) as response:
            assert response.status == 429
            assert (await response.json())["error"]["code"] == "too_many_failures"
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            async with session.ws_connect(f"{base}/traffic?token={SECRET}"):
                pytest.fail("upgraded while out of tries")
        assert refused.value.status == 429

        clock.advance(FAILURE_REFILL)  # one try back: the right secret passes
        async with session.get(f"{base}/version", headers=bearer(SECRET)) as response:
            assert response.status == 200
        async with session.get(f"{base}/version", headers=bearer("guess")) as response:
            assert response.status == 401  # that try, spent
        async with session.get(f"{base}/version", headers=bearer(SECRET)) as response:
            assert response.status == 429

        # the CORS preflight and the public UI path are never throttled
        async with session.options(
            f"{base}/version",
            headers={"Origin": "https://metacubex.github.io", "Access-Control-Request-Method": "GET"},
        ) as response:
            assert response.status == 204

        clock.advance(FAILURE_REFILL)
        async with session.get(f"{base}/metrics", headers=bearer(SECRET)) as response:
            text = await response.text()
        assert f'honk_api_auth_failures_total{{result="rejected"}} {float(FAILURE_BURST + 1)}' in text
        assert 'honk_api_auth_failures_total{result="throttled"} 4.0' in text
