"""A server that keeps its side open after the client finished cannot pin a flow's descriptors:
once one direction has ended and nothing moves for ``half_close_timeout``, honk closes the rest.
Before that, and while bytes still move, the half-closed flow lives on (a slow last answer after
a client's FIN still arrives). The sweep is run at a chosen clock time, so no test waits."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from helpers.aio import close_writer, socks5_open
from helpers.apidaemon import quiet_global, running_daemon
from helpers.engines import poll

from honk.config.spec import DEFAULT_HALF_CLOSE_TIMEOUT
from honk.core.errors import HalfCloseTimeout

STEP = 5.0  # seconds: the most one wait may take
HALF_CLOSE = 4.0  # the test config's half_close_timeout (seconds)
MARGIN = 0.5  # seconds past a timeout at which the sweep is run


class HoldingServer:
    """An origin that reads until the client's EOF, answers once, and then keeps its side open."""

    def __init__(self) -> None:
        self.got_eof = asyncio.Event()
        self.closed_by_peer = asyncio.Event()
        self.port = 0
        self.writers: list[asyncio.StreamWriter] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        while await reader.read(4096):
            pass
        self.got_eof.set()
        writer.write(b"late answer")  # after the client's FIN, as an HTTP/1.0 server would
        await writer.drain()
        with contextlib.suppress(ConnectionError):
            while await reader.read(4096):  # the read side is done; this waits for honk's close
                pass
        self.closed_by_peer.set()


@contextlib.asynccontextmanager
async def holding_server() -> AsyncIterator[HoldingServer]:
    origin = HoldingServer()
    server = await asyncio.start_server(origin.handle, "127.0.0.1", 0)
    origin.port = server.sockets[0].getsockname()[1]
    try:
        yield origin
    finally:
        for writer in origin.writers:
            writer.close()
        server.close()
        await server.wait_closed()


def config(tmp_path) -> str:  # noqa: ANN001
    return (
        quiet_global(tmp_path / "var").replace(
            "global {\n", f"global {{\n    half_close_timeout: {HALF_CLOSE:g}s\n", 1
        )
        + """inbound {
    lan: 'mixed://127.0.0.1:0'
}
routing {
    fallback: direct
}
"""
    )


async def test_a_half_closed_flow_whose_server_holds_its_side_is_closed_after_the_timeout(tmp_path):
    async with holding_server() as origin, running_daemon(tmp_path, config(tmp_path)) as daemon:
        assert daemon.dispatcher.global_spec.half_close_timeout == HALF_CLOSE
        reader, writer, code, _tail = await socks5_open(
            daemon.inbounds["lan"].bound.port, "127.0.0.1", origin.port
        )
        assert code == 0
        try:
            writer.write(b"request")
            writer.write_eof()  # the client is done sending
            await asyncio.wait_for(origin.got_eof.wait(), STEP)
            assert await asyncio.wait_for(reader.readexactly(11), STEP) == b"late answer"  # still relayed
            [flow] = daemon.tracker.snapshot()
            tracked = daemon.tracker._flows[flow.id]
            await poll(lambda: tracked.half_closed_at is not None, "the relay to report the client's FIN")
            quiet_since = max(tracked.half_closed_at, tracked.last_activity)

            tracker = daemon.tracker
            assert tracker.sweep_idle(quiet_since + HALF_CLOSE - MARGIN, 300, 60, HALF_CLOSE) == []
            assert tracker.sweep_idle(quiet_since + HALF_CLOSE + MARGIN, 300, 60, HALF_CLOSE) == [flow.id]
            assert isinstance(tracked.close_reason, HalfCloseTimeout)
            assert await asyncio.wait_for(reader.read(), STEP) == b""  # the client's side ends
            await asyncio.wait_for(origin.closed_by_peer.wait(), STEP)  # and so does the server's
            await asyncio.wait_for(tracker.wait_idle(), STEP)
        finally:
            await close_writer(writer)


async def test_the_default_half_close_timeout_applies_without_the_key(tmp_path):
    text = quiet_global(tmp_path / "var") + "inbound {\n    lan: 'mixed://127.0.0.1:0'\n}\n"
    async with running_daemon(tmp_path, text) as daemon:
        assert daemon.tracker.half_close_timeout == DEFAULT_HALF_CLOSE_TIMEOUT == 10.0
