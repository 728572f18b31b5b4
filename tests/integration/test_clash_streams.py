"""The Clash API's live streams (/traffic, /memory, /connections, /logs) over WebSocket and
chunked GET against a running daemon, at the real clock's 1 Hz, and closing connections."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import pytest
from helpers.aio import close_writer, socks5_open
from helpers.apidaemon import LAN_INBOUND, api_base, api_block, bearer, quiet_global, running_daemon
from helpers.engines import poll
from helpers.servers import echo_server

from honk.daemon.app import Daemon

SECRET = "stream-secret"
STEP = 5.0  # seconds: the most one frame may take to arrive
TICK_LOW, TICK_HIGH = 0.8, 2.0  # seconds: bounds on the gap between two 1 Hz frames

CONFIG = (
    quiet_global()
    + LAN_INBOUND
    + """routing {
    fallback: direct
}
"""
    + api_block(SECRET)
)


@dataclass
class Api:
    daemon: Daemon
    base: str
    http: aiohttp.ClientSession  # authenticated by header
    anonymous: aiohttp.ClientSession  # no header: WebSockets authenticate with ?token=

    def url(self, path: str) -> str:
        return self.base + path

    def ws(self, path: str, **params: str):  # noqa: ANN201 - aiohttp's ws_connect context manager
        return self.anonymous.ws_connect(self.url(path), params={"token": SECRET, **params})

    @property
    def mixed_port(self) -> int:
        return self.daemon.inbounds["lan"].bound.port


@pytest.fixture
async def api(tmp_path) -> AsyncIterator[Api]:
    async with (
        running_daemon(tmp_path, CONFIG) as daemon,
        aiohttp.ClientSession(headers=bearer(SECRET)) as http,
        aiohttp.ClientSession() as anonymous,
    ):
        yield Api(daemon, api_base(daemon), http, anonymous)


async def ws_frames(ws: aiohttp.ClientWebSocketResponse, count: int) -> list[tuple[float, dict]]:
    out = []
    for _ in range(count):
        msg = await asyncio.wait_for(ws.receive(), STEP)
        assert msg.type is aiohttp.WSMsgType.TEXT, msg
        out.append((time.monotonic(), json.loads(msg.data)))
    return out


async def line_frames(resp: aiohttp.ClientResponse, count: int) -> list[tuple[float, dict]]:
    out = []
    for _ in range(count):
        line = await asyncio.wait_for(resp.content.readline(), STEP)
        assert line.endswith(b"\n"), line
        out.append((time.monotonic(), json.loads(line)))
    return out


def one_hertz(frames: list[tuple[float, dict]]) -> bool:
    return TICK_LOW <= frames[1][0] - frames[0][0] < TICK_HIGH


# --- /traffic and /memory -----------------------------------------------------------------------


async def test_traffic_over_websocket_sends_rates_and_totals_at_one_hertz(api):
    async with api.ws("/traffic") as ws:
        frames = await ws_frames(ws, 2)
    assert all(set(f) == {"up", "down", "upTotal", "downTotal"} for _, f in frames)
    assert one_hertz(frames)


async def test_traffic_over_chunked_get_is_one_json_object_per_line(api):
    async with api.http.get(api.url("/traffic")) as resp:
        assert resp.status == 200
        frames = await line_frames(resp, 2)
    assert all(set(f) == {"up", "down", "upTotal", "downTotal"} for _, f in frames)
    assert one_hertz(frames)


async def test_traffic_counts_bytes_relayed_through_the_daemon(api):
    async with echo_server() as echo, api.ws("/traffic") as ws:
        reader, writer, code, _ = await socks5_open(api.mixed_port, "127.0.0.1", echo)
        assert code == 0
        writer.write(b"x" * 5000)
        assert len(await asyncio.wait_for(reader.readexactly(5000), STEP)) == 5000
        await close_writer(writer)
        await poll(lambda: api.daemon.tracker.totals() == (5000, 5000), "the flow's bytes in the totals")
        frames = await ws_frames(ws, 3)
    assert frames[-1][1]["upTotal"] == 5000 and frames[-1][1]["downTotal"] == 5000
    assert sum(f["up"] for _, f in frames) > 0  # the rate saw the bytes once


async def test_memory_starts_at_zero_then_reports_resident_bytes(api):
    async with api.ws("/memory") as ws:
        frames = await ws_frames(ws, 2)
    assert frames[0][1] == {"inuse": 0, "oslimit": 0}
    assert frames[1][1]["inuse"] > 1_000_000 and frames[1][1]["oslimit"] == 0
    assert one_hertz(frames)
    async with api.http.get(api.url("/memory")) as resp:
        frames = await line_frames(resp, 2)
    assert frames[0][1]["inuse"] == 0 and frames[1][1]["inuse"] > 0


# --- /connections -------------------------------------------------------------------------------


async def test_connections_stream_full_snapshots_with_the_flow_metadata(api):
    async with echo_server() as echo:
        reader, writer, code, _ = await socks5_open(api.mixed_port, "127.0.0.1", echo)
        assert code == 0
        try:
            async with api.ws("/connections") as ws:
                frames = await ws_frames(ws, 2)
            assert one_hertz(frames)
            snapshot = frames[-1][1]
            assert set(snapshot) == {"downloadTotal", "uploadTotal", "memory", "connections"}
            (conn,) = snapshot["connections"]
            assert conn["chains"] == ["DIRECT"] and conn["rule"] == "Match"
            meta = conn["metadata"]
            assert meta["destinationIP"] == "127.0.0.1" and meta["destinationPort"] == str(echo)
            assert meta["network"] == "tcp" and meta["inboundName"] == "lan"
            assert meta["inboundPort"] == str(api.mixed_port) and isinstance(meta["sourcePort"], str)
            async with api.http.get(api.url("/connections"), params={"stream": "true"}) as resp:
                lines = await line_frames(resp, 2)
            assert [c["id"] for c in lines[0][1]["connections"]] == [conn["id"]]
        finally:
            await close_writer(writer)


async def test_connections_interval_is_honoured_and_a_plain_get_is_one_snapshot(api):
    async with api.ws("/connections", interval="200") as ws:
        frames = await ws_frames(ws, 2)
    assert frames[1][0] - frames[0][0] < 0.6
    async with api.http.get(api.url("/connections")) as resp:
        assert resp.status == 200
        assert (await resp.json())["connections"] == []
    async with api.http.get(api.url("/connections"), params={"interval": "soon"}) as resp:
        assert resp.status == 400


async def test_deleting_a_connection_removes_its_id_from_the_next_snapshot(api):
    async with echo_server() as echo:
        reader, writer, code, _ = await socks5_open(api.mixed_port, "127.0.0.1", echo)
        assert code == 0
        try:
            async with api.http.get(api.url("/connections")) as resp:
                (conn,) = (await resp.json())["connections"]
            async with api.http.delete(api.url(f"/connections/{conn['id']}")) as resp:
                assert resp.status == 204
            async with api.ws("/connections") as ws:
                ((_, snapshot),) = await ws_frames(ws, 1)
            assert conn["id"] not in [c["id"] for c in snapshot["connections"]]
            assert await asyncio.wait_for(reader.read(), STEP) == b""  # the client saw the close
        finally:
            await close_writer(writer)
    async with api.http.delete(api.url("/connections/no-such-id")) as resp:
        assert resp.status == 204


async def test_deleting_all_connections_closes_every_flow(api):
    async with echo_server() as echo:
        opened = [await socks5_open(api.mixed_port, "127.0.0.1", echo) for _ in range(2)]
        try:
            await poll(lambda: len(api.daemon.tracker) == 2, "two tracked flows")
            async with api.http.delete(api.url("/connections")) as resp:
                assert resp.status == 204
            await poll(lambda: len(api.daemon.tracker) == 0, "every flow closed")
        finally:
            for _, writer, _, _ in opened:
                await close_writer(writer)


# --- /logs --------------------------------------------------------------------------------------


async def reload_until(api: Api, ws_or_resp, read) -> dict:  # noqa: ANN001 - a WS or a chunked response
    """Reload (it logs "config reloaded" at info) and return the frame that reports it."""
    assert await api.daemon.reload()
    deadline = time.monotonic() + STEP
    while time.monotonic() < deadline:
        ((_, frame),) = await read(ws_or_resp, 1)
        if "config reloaded" in json.dumps(frame):
            return frame
    raise AssertionError("no log frame for the reload")


async def test_logs_over_websocket_in_clash_form(api):
    async with api.ws("/logs", level="info") as ws:
        await poll(lambda: api.daemon.logs.readers == 1, "the log reader")
        frame = await reload_until(api, ws, ws_frames)
    assert frame["type"] == "info" and "config reloaded" in frame["payload"]
    await poll(lambda: api.daemon.logs.readers == 0, "the reader gone with its client")


async def test_logs_in_structured_form_over_chunked_get(api):
    async with api.http.get(api.url("/logs"), params={"level": "info", "format": "structured"}) as resp:
        assert resp.status == 200
        await poll(lambda: api.daemon.logs.readers == 1, "the log reader")
        frame = await reload_until(api, resp, line_frames)
    assert frame["level"] == "info" and frame["fields"] == [] and "config reloaded" in frame["message"]
    assert len(frame["time"]) == 8 and frame["time"].count(":") == 2
    await poll(lambda: api.daemon.logs.readers == 0, "the quiet chunked stream ended with its client")


async def test_trace_and_silent_levels_are_accepted(api):
    async with api.ws("/logs", level="trace") as ws:
        await poll(lambda: api.daemon.logs.readers == 1, "the trace reader")
        frame = await reload_until(api, ws, ws_frames)
        assert frame["type"] == "info"
    async with api.ws("/logs", level="silent") as ws:
        await poll(lambda: api.daemon.logs.readers == 1, "the silent reader")
        assert await api.daemon.reload()
        await ws.close()
    async with api.http.get(api.url("/logs"), params={"level": "silent"}) as resp:
        assert resp.status == 200


async def test_an_unknown_log_level_is_400(api):
    async with api.http.get(api.url("/logs"), params={"level": "verbose"}) as resp:
        assert resp.status == 400 and (await resp.json())["message"]
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        async with api.ws("/logs", level="verbose"):
            pass
    assert refused.value.status == 400


# --- authentication and ends ------------------------------------------------------------------


async def test_a_websocket_needs_its_token_and_a_plain_get_cannot_use_one(api):
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        async with api.anonymous.ws_connect(api.url("/traffic"), params={"token": "wrong"}):
            pass
    assert refused.value.status == 401
    async with api.anonymous.get(api.url("/traffic"), params={"token": SECRET}) as resp:
        assert resp.status == 401


async def test_a_stream_ends_when_the_server_stops(api):
    async with api.ws("/logs", level="info") as ws, api.http.get(api.url("/traffic")) as resp:
        await line_frames(resp, 1)
        await poll(lambda: api.daemon.logs.readers == 1, "the log reader")
        started = time.monotonic()
        await api.daemon.api.stop()
        msg = await asyncio.wait_for(ws.receive(), STEP)
        assert msg.type in (
            aiohttp.WSMsgType.CLOSE,
            aiohttp.WSMsgType.CLOSED,
            aiohttp.WSMsgType.CLOSING,
            aiohttp.WSMsgType.ERROR,
        )
        with contextlib.suppress(aiohttp.ClientPayloadError, aiohttp.ClientConnectionError):
            while await asyncio.wait_for(resp.content.readline(), STEP):
                pass
        assert time.monotonic() - started < 2.0
        await poll(lambda: api.daemon.logs.readers == 0, "the log stream ended")


async def test_stop_streams_ends_every_open_stream_at_once(api):
    from honk.api.streams import stop_streams

    async with api.ws("/logs", level="info") as ws, api.http.get(api.url("/memory")) as resp:
        await line_frames(resp, 1)
        await poll(lambda: api.daemon.logs.readers == 1, "the log reader")
        await stop_streams(api.daemon.api.app)
        assert api.daemon.logs.readers == 0  # ended before stop_streams returned
        msg = await asyncio.wait_for(ws.receive(), STEP)
        assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR)
        with contextlib.suppress(aiohttp.ClientPayloadError, aiohttp.ClientConnectionError):
            assert await asyncio.wait_for(resp.content.read(), STEP) == b""
