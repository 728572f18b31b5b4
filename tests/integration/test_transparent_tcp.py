"""The transparent inbound's TCP path on loopback, without a router: a REDIRECT listener whose
original destination the test sets (there is no NAT on loopback). Sniffed bytes reach the
upstream first; a client that waits for the server to speak is dialled once the sniffing
timeout of the clock has passed; refusals reset the client; closing the inbound's tag ends a
connection still sniffing; a swap serves new flows with the new settings; the listener rests
while no descriptor is left and accepts again by itself."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
from collections.abc import AsyncIterator
from types import SimpleNamespace

import pytest
from helpers.descriptors import descriptors_exhausted
from helpers.engines import poll
from helpers.servers import echo_server

from honk.config.spec import GlobalSpec, RoutingSpec, Spec
from honk.connection.dispatch import Dispatcher
from honk.connection.plane import build_plane
from honk.connection.tracker import ConnectionTracker
from honk.core.clock import FakeClock
from honk.core.net import Address
from honk.core.stats import RuntimeStats
from honk.daemon.loopguard import LoopGuard
from honk.inbound.sessions import SessionRegistry
from honk.inbound.tproxy import TransparentInbound, TransparentSpec

STEP = 5.0  # seconds of real time a step may take
SNIFFING_TIMEOUT = 0.1
BANNER = b"SSH-2.0-honk-test\r\n"
REQUEST = b"GET / HTTP/1.1\r\nHost: video.test\r\n\r\n"


class Pointed(TransparentInbound):
    """Every accepted flow 'was addressed to' ``original``."""

    original: Address

    def _original(self, conn, spec):  # noqa: ANN001, ANN202
        return self.original


async def _no_resolver(host: str) -> list:
    return []


@contextlib.asynccontextmanager
async def pointed(
    original_port: int, *, fallback: str = "direct", dial_mode: str = "domain", learned=None
) -> AsyncIterator[SimpleNamespace]:  # noqa: ANN001
    clock = FakeClock()
    glob = GlobalSpec(connect_timeout=STEP)
    spec = Spec(global_=glob, routing=RoutingSpec(fallback=fallback))
    tracker = ConnectionTracker(clock)
    dispatcher = Dispatcher(build_plane(spec, clock, 1), tracker, clock, glob, _no_resolver)
    sessions = SessionRegistry()
    inbound = Pointed(
        TransparentSpec(
            "lan", "redir", "127.0.0.1", 0, dial_mode=dial_mode, sniffing_timeout=SNIFFING_TIMEOUT
        ),
        dispatcher,
        clock,
        learned_names=learned,
        sessions=sessions,
    )
    inbound.original = Address("127.0.0.1", original_port)
    await inbound.start()
    try:
        yield SimpleNamespace(inbound=inbound, clock=clock, tracker=tracker, sessions=sessions)
    finally:
        await inbound.aclose()
        tracker.close_all("test over")
        await asyncio.wait_for(tracker.wait_idle(), STEP)


async def connect(t) -> socket.socket:  # noqa: ANN001
    sock = socket.socket()
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", t.inbound.bound.port))
    return sock


async def recv(sock: socket.socket, n: int = 65536) -> bytes:
    return await asyncio.wait_for(asyncio.get_running_loop().sock_recv(sock, n), STEP)


@contextlib.asynccontextmanager
async def banner_server() -> AsyncIterator[SimpleNamespace]:
    """A server that speaks first (like SSH), counting its clients."""
    seen = SimpleNamespace(port=0, accepted=0)

    async def speak(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.accepted += 1
        writer.write(BANNER)
        with contextlib.suppress(OSError):
            await writer.drain()
            await reader.read()
        writer.close()

    server = await asyncio.start_server(speak, "127.0.0.1", 0)
    seen.port = server.sockets[0].getsockname()[1]
    try:
        yield seen
    finally:
        server.close()


async def test_sniffed_bytes_reach_the_upstream_first_and_the_flow_is_routed_by_the_learned_name():
    async with echo_server() as port, pointed(port, learned=lambda ip: ["video.test"]) as t:
        sock = await connect(t)
        with sock:
            sock.send(REQUEST)
            got = b""
            while len(got) < len(REQUEST):
                got += await recv(sock)
            assert got == REQUEST
            [info] = t.tracker.snapshot()
            assert (info.inbound, info.target, info.rule) == ("lan", Address("video.test", port), "fallback")


async def test_a_client_waiting_for_the_server_is_dialled_once_the_sniffing_timeout_passes():
    async with banner_server() as server, pointed(server.port) as t:
        sock = await connect(t)
        with sock:
            await poll(lambda: t.clock.sleepers > 0, "the sniffing deadline")
            await asyncio.sleep(0.05)
            assert server.accepted == 0  # still sniffing
            t.clock.advance(SNIFFING_TIMEOUT)
            assert await recv(sock) == BANNER
            assert server.accepted == 1


async def test_the_ip_mode_dials_at_once():
    async with banner_server() as server, pointed(server.port, dial_mode="ip") as t:
        sock = await connect(t)
        with sock:
            assert await recv(sock) == BANNER


async def test_a_blocked_flow_is_reset_and_the_listener_carries_on(caplog):
    async with pointed(9, fallback="block", dial_mode="ip") as t:
        for _ in range(2):
            sock = await connect(t)
            with sock, pytest.raises(ConnectionResetError):
                await recv(sock)
        await poll(lambda: t.inbound.active == 0, "the refused flows to end")
        assert len(t.tracker) == 0


async def test_closing_the_tag_ends_a_connection_still_sniffing():
    async with pointed(9) as t:
        sock = await connect(t)
        with sock:
            await poll(lambda: t.inbound.active == 1 and t.clock.sleepers > 0, "sniffing")
            assert t.sessions.close_tag("lan") == 1
            with contextlib.suppress(ConnectionResetError):
                assert await recv(sock) == b""
            await poll(lambda: t.inbound.active == 0, "the connection to end")


async def test_a_swap_serves_new_flows_with_the_new_tag_and_mode():
    async with echo_server() as port, pointed(port) as t:
        with pytest.raises(ValueError, match="kind, bind"):
            t.inbound.swap(TransparentSpec("lan", "tproxy", "127.0.0.1", 0))
        t.inbound.swap(TransparentSpec("lan2", "redir", "127.0.0.1", 0, dial_mode="ip"))
        sock = await connect(t)
        with sock:
            sock.send(b"x")
            assert await recv(sock) == b"x"
            [info] = t.tracker.snapshot()
            assert info.inbound == "lan2"


async def test_a_redirect_listener_refuses_a_connection_that_was_not_redirected():
    clock = FakeClock()
    glob = GlobalSpec(connect_timeout=STEP)
    dispatcher = Dispatcher(
        build_plane(Spec(global_=glob), clock, 1), ConnectionTracker(clock), clock, glob, _no_resolver
    )
    inbound = TransparentInbound(TransparentSpec("redir", "redir", "127.0.0.1", 0), dispatcher, clock)
    await inbound.start()
    try:
        sock = await connect(SimpleNamespace(inbound=inbound))
        with sock, pytest.raises(ConnectionResetError):
            await recv(sock)
    finally:
        await inbound.aclose()


async def test_the_transparent_listener_accepts_again_once_descriptors_are_free():
    stats = RuntimeStats()
    guard = LoopGuard(stats)
    guard.install(asyncio.get_running_loop())
    try:
        async with banner_server() as origin, pointed(origin.port, dial_mode="ip") as t:
            client = socket.socket()  # made before the descriptors run out; connecting takes none
            client.setblocking(False)
            bound = t.inbound.bound
            listener = f"{bound.host}:{bound.port}"
            with descriptors_exhausted():
                assert client.connect_ex((bound.host, bound.port)) in (0, errno.EINPROGRESS)
                await poll(
                    lambda: stats.accept_rests[listener] >= 1,
                    "the transparent listener to find no descriptor to accept with",
                )
            with client:
                assert await recv(client) == BANNER  # accepted once free, and proxied
            assert stats.loop_errors == {}
    finally:
        guard.uninstall()
