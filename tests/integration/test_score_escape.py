"""Score end to end (issue 11, acceptance 3): a Score group over the builtin ``direct`` and a
Shadowsocks node to a real ss-server. Once the Shadowsocks path starts dropping connections,
new flows move to the healthy node, and ``/stats.score`` counts why.

The Shadowsocks node dials a switchable forwarder in front of ss-server: while it passes,
bytes go both ways; once it drops, every connection it accepts is reset at once (SO_LINGER 0),
which is what a node whose path started dropping connections looks like to honk.

So that the Shadowsocks node is the better one while it works (as a proxy in front of a slow
direct route is), ss-server reaches the origin from 127.0.0.2 and the origin answers flows from
any other source (direct's) only after DIRECT_DELAY: Score's first-choice heuristic then prefers
the Shadowsocks node, and the test checks that it did before the path starts dropping.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import socket
import struct

import aiohttp
import pytest
from helpers.aio import close_writer, socks5_open
from helpers.apidaemon import LAN_INBOUND, api_base, api_block, bearer, quiet_global, running_daemon
from helpers.peers import require_binary
from helpers.peerservers import ss_server

METHOD = "chacha20-ietf-poly1305"
PASSWORD = "score-escape"
SECRET = "score-secret"
WARM_FLOWS = 12  # flows while both paths work: enough for Score to settle on an incumbent
AFTER_FLOWS = 12  # flows once the Shadowsocks path drops
ESCAPE_WITHIN = 2  # failed flows before Score has escaped: a node-scoped one escapes at once, a
#                    target-path one on the episode's second independent failure
PAYLOAD = b"honk score escape probe\n"
STEP = 5.0  # seconds: the bound on any single wait
SS_EGRESS = "127.0.0.2"  # where ss-server's connections to the origin come from
DIRECT_DELAY = 0.05  # seconds the origin waits before answering any other source (direct)


class DropSwitch:
    """A TCP forwarder to ``upstream`` that can start dropping (resetting) every connection."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.dropping = False
        self.accepted = 0  # connections that reached the switch (each one a flow through the node)
        self.server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        assert self.server is not None
        return self.server.sockets[0].getsockname()[1]

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)

    async def close(self) -> None:
        assert self.server is not None
        self.server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self.dropping:
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()  # RST
            return
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.transport.abort()
            self._tasks.discard(task)
            return
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            up_writer.transport.abort()
            writer.transport.abort()
            self._tasks.discard(task)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError, asyncio.IncompleteReadError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()


@contextlib.asynccontextmanager
async def echo_origin():
    """A TCP server that echoes one line back and closes (late to anyone but ss-server)."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            line = await reader.readline()
            if writer.get_extra_info("peername")[0] != SS_EGRESS:
                await asyncio.sleep(DIRECT_DELAY)
            writer.write(line)
            await writer.drain()
        await close_writer(writer)

    server = await asyncio.start_server(serve, "0.0.0.0", 0)  # noqa: S104 - reached on 127.0.0.1 and .2
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


def config(ss_port: int) -> str:
    userinfo = base64.urlsafe_b64encode(f"{METHOD}:{PASSWORD}".encode()).decode().rstrip("=")
    return (
        quiet_global()
        + LAN_INBOUND
        + f"node {{\n    ss: 'ss://{userinfo}@127.0.0.1:{ss_port}'\n}}\n"
        + "group {\n    auto {\n        filter: name(ss, direct)\n        policy: score\n    }\n}\n"
        + "routing {\n    fallback: auto\n}\n"
        + api_block(SECRET)
    )


async def one_flow(lan_port: int, origin_port: int) -> bool:
    """A SOCKS5 CONNECT through honk to the echo origin; whether the echo came back whole."""
    try:
        reader, writer, code, _ = await socks5_open(lan_port, "127.0.0.1", origin_port)
    except (OSError, asyncio.IncompleteReadError):
        return False
    try:
        if code != 0:
            return False
        writer.write(PAYLOAD)
        try:
            echoed = await asyncio.wait_for(reader.readline(), STEP)
        except (OSError, asyncio.IncompleteReadError):
            return False
        return echoed == PAYLOAD
    finally:
        await close_writer(writer)
        await asyncio.sleep(0)


@pytest.fixture
def ss_peer():
    require_binary("ss-server")  # with CI=true a missing peer fails here
    with ss_server(METHOD, PASSWORD, udp=False, egress=SS_EGRESS) as ss:
        yield ss


async def score_stats(daemon) -> dict:
    async with (
        aiohttp.ClientSession() as http,
        http.get(api_base(daemon) + "/v1/stats/score", headers=bearer(SECRET)) as resp,
    ):
        assert resp.status == 200
        return await resp.json()


async def flows_until_idle(daemon) -> None:
    """Wait until honk has let go of every flow (each one settled its Score reporter)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + STEP
    while len(daemon.tracker):
        assert loop.time() < deadline, "flows still tracked"
        await asyncio.sleep(0.001)


async def test_a_score_group_moves_new_flows_off_a_shadowsocks_path_that_starts_dropping(tmp_path, ss_peer):
    switch = DropSwitch((ss_peer.host, ss_peer.port))
    await switch.start()
    try:
        async with echo_origin() as origin_port, running_daemon(tmp_path, config(switch.port)) as daemon:
            lan_port = daemon.inbounds["lan"].bound.port

            # Both paths work: every flow succeeds, and Score settles on the faster Shadowsocks node.
            for _ in range(WARM_FLOWS):
                assert await one_flow(lan_port, origin_port)
                await flows_until_idle(daemon)
            before = switch.accepted
            assert await one_flow(lan_port, origin_port)
            await flows_until_idle(daemon)
            assert switch.accepted == before + 1, "precondition: the Shadowsocks node is the incumbent"

            # The Shadowsocks path starts dropping every connection.
            switch.dropping = True
            failed = 0
            results = []
            for _ in range(AFTER_FLOWS):
                ok = await one_flow(lan_port, origin_port)
                await flows_until_idle(daemon)
                results.append(ok)
                failed += not ok
            assert failed <= ESCAPE_WITHIN, results
            assert all(results[ESCAPE_WITHIN:]), results  # after the escape, every new flow works
            dropped_at = switch.accepted
            assert await one_flow(lan_port, origin_port)
            assert switch.accepted == dropped_at  # served by direct: the dropping node is not dialled

            stats = await score_stats(daemon)
            [tcp] = [g for g in stats["groups"] if g["group"] == "auto" and g["network"] == "tcp"]
            reasons = tcp["reasons"]
            assert reasons["freshFailureBypass"] + reasons["incumbentIneligible"] >= 1, reasons
            text = str(stats)
            assert "127.0.0.1" not in text and str(origin_port) not in text  # no target in the API
    finally:
        await switch.close()
