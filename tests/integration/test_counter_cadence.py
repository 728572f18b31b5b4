"""Byte counters a person can read (issue 36): a steady download is seen moving every second.

An origin on loopback sends an HTTP body at a steady rate it paces itself, and a client
fetches it through the daemon's mixed port on each TCP path: SOCKS5 (the fast path's engine
dial, and its Python dial for a domain), HTTP CONNECT (the native relay and the asyncio copy
relay), an absolute-form request (the HTTP forwarder), and a Shadowsocks node against a real
ss-server (the engine's framing, the copy relay's). The /traffic stream paces the readings:
at each of its 1 Hz frames the flow's ``download`` in /connections and /v1/connections (what
``honkctl connections`` prints), /connections' ``downloadTotal``, /traffic's ``downTotal`` and
/metrics' relayed bytes must be at least what the client had received LAG seconds earlier,
and no frame may read 0 B/s while the body is moving.

With ``HONK_NO_EXTENSIONS=1`` the ``native`` paths force the engine (``HONK_RELAY=native``,
``HONK_FASTPATH=on``), so the twin carries them; ``make test`` leaves that run to
tests/unit/relay/test_relay_reports.py, which drives both engines' reports directly.
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import contextlib
import itertools
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import aiohttp
import pytest
from helpers.aio import close_writer, socks5_open
from helpers.apidaemon import (
    LAN_INBOUND,
    api_base,
    api_block,
    bearer,
    metric_samples,
    quiet_global,
    running_daemon,
)
from helpers.engines import poll
from helpers.peerservers import ss_server, v2ray_server

from honk._fast.relay_py import REPORT_INTERVAL
from honk.daemon.app import Daemon

SECRET = "cadence-secret"
RATE = 2 * 1024 * 1024  # bytes a second the origin sends: the reported 2 MB/s download
WRITE = 16 * 1024  # bytes per paced write (128 writes a second)
SEND_LIMIT = 20  # seconds the origin sends at most (a bound; the test reads for about five)
BODY = RATE * SEND_LIMIT  # the body's Content-Length: a whole number of writes
READ_SIZE = 64 * 1024  # bytes the client asks for per read
READINGS = 3  # /traffic frames checked per path, one a second
SLACK = 0.5  # seconds of scheduling slack on a 2-core machine running origin, client and daemon
LAG = REPORT_INTERVAL + SLACK  # a counter may trail the client by one report interval plus slack
FRAME_WAIT = 5.0  # seconds one /traffic frame may take to arrive
SS_METHOD, SS_PASSWORD = "chacha20-ietf-poly1305", "cadence-pass"
METRIC_DOWN = ("honk_relayed_bytes_total", frozenset({("direction", "down")}))

DIRECT = "routing {\n    fallback: direct\n}\n"


def ss_routing(port: int) -> str:
    userinfo = base64.urlsafe_b64encode(f"{SS_METHOD}:{SS_PASSWORD}".encode()).decode().rstrip("=")
    return f"node {{\n    hk: 'ss://{userinfo}@127.0.0.1:{port}'\n}}\nrouting {{\n    fallback: hk\n}}\n"


# --- the origin and the client ------------------------------------------------------------------


@contextlib.asynccontextmanager
async def paced_origin() -> AsyncIterator[int]:
    """An HTTP origin answering any request with BODY bytes at RATE, in WRITE-byte writes paced
    by its own clock (load, not synchronization); yields its port."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % BODY)
            chunk = b"x" * WRITE
            start, sent = loop.time(), 0
            while sent < BODY:
                await asyncio.sleep(max(0.0, start + sent / RATE - loop.time()))
                writer.write(chunk)
                sent += WRITE
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client left: the test is over
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


class Download:
    """The client's end: what it has received (after the proxy's own handshake reply), and when."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self.marks: list[tuple[float, int]] = [(time.monotonic(), 0)]
        self._task = asyncio.get_running_loop().create_task(self._read(reader))

    @property
    def total(self) -> int:
        return self.marks[-1][1]

    async def _read(self, reader: asyncio.StreamReader) -> None:
        total = 0
        while data := await reader.read(READ_SIZE):
            total += len(data)
            self.marks.append((time.monotonic(), total))

    def received_by(self, when: float) -> int:
        """Bytes the client had received at monotonic time ``when``."""
        i = bisect.bisect_right(self.marks, (when, float("inf"))) - 1
        return self.marks[i][1] if i >= 0 else 0

    async def stop(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


async def request(writer: asyncio.StreamWriter, target: str, port: int) -> None:
    writer.write(f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
    await writer.drain()


async def open_download(lan: int, way: str, origin: int) -> tuple[Download, asyncio.StreamWriter]:
    """Start the download through the mixed port: ``socks`` (an IP target), ``socks-domain``,
    ``connect`` (HTTP CONNECT) or ``forward`` (an absolute-form request)."""
    if way in ("socks", "socks-domain"):
        host = "localhost" if way == "socks-domain" else "127.0.0.1"
        reader, writer, code, _ = await socks5_open(lan, host, origin)
        assert code == 0, f"SOCKS5 reply {code:#x}"
        await request(writer, "/", origin)
    elif way == "connect":
        reader, writer = await asyncio.open_connection("127.0.0.1", lan)
        writer.write(f"CONNECT 127.0.0.1:{origin} HTTP/1.1\r\nHost: 127.0.0.1:{origin}\r\n\r\n".encode())
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), FRAME_WAIT)
        assert head.split(b" ", 2)[1] == b"200", head
        await request(writer, "/", origin)
    else:
        reader, writer = await asyncio.open_connection("127.0.0.1", lan)
        await request(writer, f"http://127.0.0.1:{origin}/", origin)
    return Download(reader), writer


# --- the readings --------------------------------------------------------------------------------


@dataclass
class Reading:
    """What the API showed at one /traffic frame, and when each value was asked for."""

    at: float  # when the frame arrived
    rate: int  # /traffic `down`: bytes a second over the last tick
    traffic_total: int  # /traffic `downTotal`
    asked: float  # when /connections, /v1/connections and /metrics were asked (in that order)
    flow: int  # the flow's `download` in /connections
    connections_total: int  # /connections `downloadTotal`
    native_flow: int  # the flow's `download` in /v1/connections (honkctl connections)
    metric: float  # honk_relayed_bytes_total{direction="down"}


async def get_json(http: aiohttp.ClientSession, url: str) -> dict:
    async with http.get(url) as response:
        assert response.status == 200, await response.text()
        return await response.json()


def the_flow(flows: list[dict], origin: int, port_of: Callable[[dict], int]) -> dict:
    """The one flow to the origin's port among ``flows`` (``port_of`` reads a flow's target port)."""
    mine = [flow for flow in flows if port_of(flow) == origin]
    assert len(mine) == 1, flows
    return mine[0]


async def readings(daemon: Daemon, origin: int) -> list[Reading]:
    """READINGS readings, one per /traffic frame; the stream opens while the body is moving."""
    base = api_base(daemon)
    out = []
    async with (
        aiohttp.ClientSession(headers=bearer(SECRET)) as http,
        http.ws_connect(base + "/traffic") as ws,
    ):
        for _ in range(READINGS):
            msg = await asyncio.wait_for(ws.receive(), FRAME_WAIT)
            at = time.monotonic()
            assert msg.type is aiohttp.WSMsgType.TEXT, msg
            frame = json.loads(msg.data)
            asked = time.monotonic()
            clash = await get_json(http, base + "/connections")
            native = await get_json(http, base + "/v1/connections")
            async with http.get(base + "/metrics") as response:
                metrics = metric_samples(await response.text())
            out.append(
                Reading(
                    at=at,
                    rate=frame["down"],
                    traffic_total=frame["downTotal"],
                    asked=asked,
                    flow=the_flow(
                        clash["connections"], origin, lambda f: int(f["metadata"]["destinationPort"])
                    )["download"],
                    connections_total=clash["downloadTotal"],
                    native_flow=the_flow(
                        native["connections"], origin, lambda f: int(f["target"].rsplit(":", 1)[1])
                    )["download"],
                    metric=metrics[METRIC_DOWN],
                )
            )
    return out


def check(download: Download, seen: list[Reading]) -> None:
    """Every counter is current to within LAG, and no frame reads 0 B/s."""
    for n, r in enumerate(seen):
        floor_frame = download.received_by(r.at - LAG)
        floor_asked = download.received_by(r.asked - LAG)
        where = f"reading {n}: client had {floor_asked} bytes {LAG}s before; {r}"
        assert r.rate > 0, "/traffic read 0 B/s while the body was moving: " + where
        assert r.traffic_total >= floor_frame, "/traffic downTotal lags: " + where
        assert r.flow >= floor_asked, "/connections download lags: " + where
        assert r.connections_total >= floor_asked, "/connections downloadTotal lags: " + where
        assert r.native_flow >= floor_asked, "/v1/connections download lags: " + where
        assert r.metric >= floor_asked, "/metrics relayed bytes lag: " + where
    for before, after in itertools.pairwise(seen):
        assert after.flow > before.flow, (
            f"the flow's download stood still between two readings: {before} {after}"
        )


# --- the paths -----------------------------------------------------------------------------------

# (how the client asks, which relay: native = the engine, compiled or its twin; copy = asyncio)
PLAIN_PATHS = [
    ("socks", "native"),  # the fast path: the engine dials and relays
    ("socks-domain", "native"),  # the fast path: Python dials a domain, the engine relays (hs_relay)
    ("connect", "native"),  # Dispatcher.relay on NativeRelay
    ("connect", "copy"),  # Dispatcher.relay on the asyncio CopyRelay
    ("forward", "native"),  # the absolute-form HTTP forwarder (counts per response chunk)
]
SS_PATHS = [
    ("socks", "native"),  # the engine seals and opens the node's AEAD chunks
    ("connect", "copy"),  # the copy relay applies the framing in Python
]


def use_relay(monkeypatch: pytest.MonkeyPatch, relay: str) -> None:
    """Choose the relay the daemon starts with (read at inbound start and per flow)."""
    if relay == "native":
        monkeypatch.setenv("HONK_RELAY", "native")
        monkeypatch.setenv("HONK_FASTPATH", "on")
    else:
        monkeypatch.setenv("HONK_RELAY", "copy")


async def steady_download(tmp_path, routing: str, way: str) -> None:
    config = quiet_global() + LAN_INBOUND + routing + api_block(SECRET)
    async with paced_origin() as origin, running_daemon(tmp_path, config) as daemon:
        download, writer = await open_download(daemon.inbounds["lan"].bound.port, way, origin)
        try:
            # a second of body first: the readings start on a flow that is moving
            await poll(lambda: download.total >= RATE, "the first second of the body")
            seen = await readings(daemon, origin)
            check(download, seen)
        finally:
            await download.stop()
            await close_writer(writer)


@pytest.mark.parametrize(("way", "relay"), PLAIN_PATHS, ids=[f"{w}-{r}" for w, r in PLAIN_PATHS])
async def test_a_steady_download_is_counted_within_a_second_on_every_plain_path(
    tmp_path, monkeypatch, way, relay
):
    use_relay(monkeypatch, relay)
    await steady_download(tmp_path, DIRECT, way)


@pytest.mark.peer
@pytest.mark.parametrize(("way", "relay"), SS_PATHS, ids=[f"{w}-{r}" for w, r in SS_PATHS])
async def test_a_steady_download_through_a_shadowsocks_node_is_counted_within_a_second(
    tmp_path, monkeypatch, way, relay
):
    use_relay(monkeypatch, relay)
    with ss_server(SS_METHOD, SS_PASSWORD, udp=False) as peer:  # CI=true: a missing ss-server fails
        await steady_download(tmp_path, ss_routing(peer.port), way)


# (protocol, transport): the engine's own TLS records (Trojan over TCP + TLS), and a Python
# channel stack bridged to the engine (VMess over WebSocket)
V2RAY_PATHS = [("trojan", "tcp"), ("vmess", "ws")]


@pytest.mark.peer
@pytest.mark.parametrize(("protocol", "transport"), V2RAY_PATHS, ids=[f"{p}-{t}" for p, t in V2RAY_PATHS])
async def test_a_steady_download_through_a_v2ray_node_is_counted_within_a_second(
    tmp_path, monkeypatch, protocol, transport
):
    with v2ray_server(protocol, transport=transport) as peer:  # CI=true: a missing v2ray fails
        if peer.ca_path is not None:
            monkeypatch.setenv("SSL_CERT_FILE", str(peer.ca_path))
        routing = f"node {{\n    hk: '{peer.share_link()}'\n}}\nrouting {{\n    fallback: hk\n}}\n"
        await steady_download(tmp_path, routing, "socks")
