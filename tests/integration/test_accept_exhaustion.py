"""Every accept loop survives running out of descriptors: while none is left, a client waits in
the listener's backlog and the listener rests (counted, warned about once); once descriptors are
free again it accepts by itself and the waiting client is served. The data path (the mixed
inbound, on asyncio and on the relay engine's fast path), the API (whose web stack loads at its
first connection) and the DNS listener are each exhausted on purpose, in this process."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import importlib
import logging
import socket
from collections.abc import AsyncIterator

import aiohttp
from helpers.aio import close_writer
from helpers.apidaemon import api_base, api_block, bearer, quiet_global, running_daemon
from helpers.descriptors import descriptors_exhausted
from helpers.dns import DnsResponder, build_query, parse_answer
from helpers.engines import poll
from helpers.servers import EchoServer

from honk.api import server as api_server
from honk.config.spec import DnsBindSpec, DnsSpec, DnsUpstreamSpec, Spec
from honk.connection.dispatch import Dispatcher
from honk.connection.plane import SystemResolver, build_plane
from honk.connection.tracker import ConnectionTracker
from honk.core.clock import MonotonicClock
from honk.core.stats import RuntimeStats
from honk.daemon.loopguard import LoopGuard
from honk.dns.listener import DnsListener
from honk.dns.service import DnsService

STEP = 10.0  # seconds: the most one wait may take (an asyncio listener rests one second)
SECRET = "s3cret"
USER, PASSWORD = "alice", "wonderland"  # an inbound with users is served on asyncio, not the fast path


def listener_address(host: str, port: int) -> str:
    return f"{host}:{port}"


def client_socket() -> socket.socket:
    """A client socket made before descriptors run out; it connects (which takes no new
    descriptor) once they have, into the listener's backlog."""
    client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    client.setblocking(False)
    return client


def connect(client: socket.socket, port: int) -> None:
    assert client.connect_ex(("127.0.0.1", port)) in (0, errno.EINPROGRESS)


async def socks_echo(client: socket.socket, target: tuple[str, int], auth: tuple[str, str] | None) -> bytes:
    """A SOCKS5 CONNECT on the connected ``client``, then one echo; the bytes echoed."""
    reader, writer = await asyncio.open_connection(sock=client)
    try:
        writer.write(b"\x05\x01" + (b"\x02" if auth else b"\x00"))
        assert (await asyncio.wait_for(reader.readexactly(2), STEP))[1] == (2 if auth else 0)
        if auth:
            user, password = (a.encode() for a in auth)
            writer.write(b"\x01" + bytes((len(user),)) + user + bytes((len(password),)) + password)
            assert (await asyncio.wait_for(reader.readexactly(2), STEP)) == b"\x01\x00"
        host, port = target
        writer.write(b"\x05\x01\x00\x01" + socket.inet_aton(host) + port.to_bytes(2, "big"))
        reply = await asyncio.wait_for(reader.readexactly(10), STEP)
        assert reply[1] == 0, f"SOCKS reply {reply[1]:#x}"
        writer.write(b"ping")
        return await asyncio.wait_for(reader.readexactly(4), STEP)
    finally:
        await close_writer(writer)


def daemon_config(tmp_path, echo_port: int) -> str:  # noqa: ANN001
    return (
        quiet_global(tmp_path / "var")
        + f"""inbound {{
    lan: 'mixed://{USER}:{PASSWORD}@127.0.0.1:0'
}}
routing {{
    dport({echo_port}) -> direct
    fallback: direct
}}
"""
        + api_block(SECRET)
    )


async def test_the_mixed_inbound_and_the_api_accept_again_once_descriptors_are_free(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="honk.daemon")
    with EchoServer() as echo:
        async with running_daemon(tmp_path, daemon_config(tmp_path, echo.port)) as daemon:
            lan = daemon.inbounds["lan"].bound
            api_host, api_port = daemon.api.bound
            lan_client = client_socket()
            api_client = client_socket()
            lan_listener = listener_address(lan.host, lan.port)
            with descriptors_exhausted():
                connect(lan_client, lan.port)
                connect(api_client, api_port)
                await poll(
                    lambda: daemon.stats.accept_rests[lan_listener] >= 1,
                    "the mixed inbound to find no descriptor to accept with",
                )
            assert await socks_echo(lan_client, ("127.0.0.1", echo.port), (USER, PASSWORD)) == b"ping"
            # the API's first connection waited in its backlog through the exhaustion
            reader, writer = await asyncio.open_connection(sock=api_client)
            writer.write(
                f"GET /version HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {SECRET}\r\n"
                "Connection: close\r\n\r\n".encode()
            )
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), STEP)
            await close_writer(writer)
            assert head.startswith(b"HTTP/1.1 200"), head
            assert daemon.stats.loop_errors == {}  # a rest is not an unhandled error
    warnings = [r.getMessage() for r in caplog.records if "listener out of resources" in r.getMessage()]
    assert any(f"listener={lan_listener}" in w and "error=EMFILE" in w for w in warnings)


async def test_the_relay_engines_fast_path_accepts_again_once_descriptors_are_free(
    tmp_path, caplog, monkeypatch
):
    monkeypatch.setenv("HONK_FASTPATH", "on")  # the compiled engine, or its twin under HONK_NO_EXTENSIONS
    caplog.set_level(logging.WARNING, logger="honk.daemon")
    text = daemon_config(tmp_path, 9).replace(f"{USER}:{PASSWORD}@", "")  # no users: the engine accepts
    with EchoServer() as echo:
        async with running_daemon(tmp_path, text) as daemon:
            inbound = daemon.inbounds["lan"]
            assert inbound._fast is not None, "a no-auth mixed inbound is served by the engine's fast path"
            lan = inbound.bound
            client = client_socket()
            listener = listener_address(lan.host, lan.port)
            with descriptors_exhausted():
                connect(client, lan.port)
                await poll(
                    lambda: daemon.stats.accept_rests[listener] >= 1,
                    "the engine's listener to find no descriptor to accept with",
                )
            assert await socks_echo(client, ("127.0.0.1", echo.port), None) == b"ping"
            assert daemon.stats.loop_errors == {}
    assert any(
        f"listener={listener}" in r.getMessage()
        for r in caplog.records
        if "listener out of resources" in r.getMessage()
    )


async def test_a_failed_first_load_of_the_api_is_retried_at_the_next_connection(tmp_path, monkeypatch):
    real_import = importlib.import_module
    failures: list[str] = []

    def import_module(name: str, package: str | None = None):  # noqa: ANN202
        if name == "honk.api.webapp" and not failures:
            failures.append(
                name
            )  # what a burst does to the first load: no descriptor to read the module with
            raise OSError(24, "Too many open files")
        return real_import(name, package)

    monkeypatch.setattr(api_server.importlib, "import_module", import_module)
    with EchoServer() as echo:
        async with running_daemon(tmp_path, daemon_config(tmp_path, echo.port)) as daemon:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=STEP)) as session:
                # the first client waits in the backlog through the failed load and its retry
                async with session.get(f"{api_base(daemon)}/version", headers=bearer(SECRET)) as response:
                    assert response.status == 200
                async with session.get(f"{api_base(daemon)}/version", headers=bearer(SECRET)) as response:
                    assert response.status == 200
            assert failures == ["honk.api.webapp"]
            assert daemon.api.app is not None


@contextlib.asynccontextmanager
async def guarded_loop() -> AsyncIterator[RuntimeStats]:
    """The daemon's loop exception handler on the test's loop, counting into fresh stats."""
    stats = RuntimeStats()
    guard = LoopGuard(stats)
    guard.install(asyncio.get_running_loop())
    try:
        yield stats
    finally:
        guard.uninstall()


async def test_the_dns_listener_accepts_tcp_again_once_descriptors_are_free():
    clock = MonotonicClock()
    with DnsResponder({"www.example.test": "10.1.2.3"}) as responder:
        dns_spec = DnsSpec(
            upstreams=(DnsUpstreamSpec("default", "udp", responder.host, responder.port, None),)
        )
        spec = Spec()
        dispatcher = Dispatcher(
            build_plane(spec, clock, 1),
            ConnectionTracker(clock),
            clock,
            spec.global_,
            SystemResolver(clock, STEP),
        )
        listener = DnsListener(
            DnsBindSpec("127.0.0.1", 0, udp=False, tcp=True), DnsService(dns_spec, dispatcher, clock), clock
        )
        async with guarded_loop() as stats:
            await listener.start()
            try:
                host, port = listener.bound.host, listener.bound.port
                client = client_socket()
                with descriptors_exhausted():
                    connect(client, port)
                    await poll(
                        lambda: stats.accept_rests[listener_address(host, port)] >= 1,
                        "the DNS listener to find no descriptor to accept with",
                    )
                reader, writer = await asyncio.open_connection(sock=client)
                query = build_query("www.example.test", 0x1234)
                writer.write(len(query).to_bytes(2, "big") + query)
                length = int.from_bytes(await asyncio.wait_for(reader.readexactly(2), STEP), "big")
                answer = await asyncio.wait_for(reader.readexactly(length), STEP)
                await close_writer(writer)
                qid, rcode, addresses = parse_answer(answer)
                assert (qid, rcode, addresses) == (0x1234, 0, ["10.1.2.3"])
            finally:
                await listener.aclose()
