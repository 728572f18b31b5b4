"""The SOCKS5 CONNECT fast path of the mixed inbound, over the compiled engine and its twin.

Each test builds a MixedInbound whose listening socket is served by one relay
engine (``native``: relay_c, when built; ``twin``: relay_py), on asyncio and on
uvloop, and checks what a client and the operator see.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import socket
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from helpers.aio import close_writer, rule, socks5_open
from helpers.engines import ENGINES as RELAY_ENGINES
from helpers.engines import FASTPATH_ENGINES, fastpath_engine
from helpers.inprocess import mixed_inbound
from helpers.peers import require, require_ipv6_loopback
from helpers.servers import EchoServer
from helpers.sockets import open_fds, unanswered_port
from helpers.socks import encode_address

from honk.config.spec import (
    GlobalSpec,
    InboundSpec,
    InboundUser,
    RoutingSpec,
    RuleSpec,
    Spec,
)
from honk.connection.tracker import ConnectionTracker
from honk.core.clock import Clock, FakeClock, MonotonicClock
from honk.core.net import Address
from honk.inbound.mixed import MixedInbound
from honk.relay.native import close_engines

STEP = 5.0
ENGINES = FASTPATH_ENGINES


@pytest.fixture(params=ENGINES)
def engine_name(request: pytest.FixtureRequest) -> str:
    return request.param


BLOCKED = rule("domain", "blocked.test", "block", key="full")


@dataclass
class Env:
    inbound: MixedInbound
    tracker: ConnectionTracker
    clock: Clock
    engine: object

    @property
    def port(self) -> int:
        assert self.inbound.bound is not None
        return self.inbound.bound.port


@contextlib.asynccontextmanager
async def honk(
    engine_name: str,
    *,
    rules: tuple[RuleSpec, ...] = (BLOCKED,),
    users: tuple[InboundUser, ...] = (),
    clock: Clock | None = None,
    host: str = "127.0.0.1",
) -> AsyncIterator[Env]:
    clock = clock or MonotonicClock()
    ispec = InboundSpec(name="lan", kind="mixed", host=host, port=0, users=users)
    spec = Spec(
        global_=GlobalSpec(connect_timeout=2.0),
        inbounds=(ispec,),
        routing=RoutingSpec(rules=rules, fallback="direct"),
    )
    engine = fastpath_engine(engine_name)
    async with mixed_inbound(spec, clock, engine) as (inbound, dispatcher):
        assert (inbound._fast is not None) == (not users)
        yield Env(inbound, dispatcher.tracker, clock, engine)


async def _echo_round(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes) -> bytes:
    writer.write(data)
    return await asyncio.wait_for(reader.readexactly(len(data)), STEP)


async def _one_echo_flow(port: int, echo_port: int, data: bytes) -> None:
    """One short flow through the inbound on ``port``: CONNECT, one echo of ``data``, both FINs."""
    reader, writer, rep, _ = await socks5_open(port, "127.0.0.1", echo_port)
    assert rep == 0
    assert await _echo_round(reader, writer, data) == data
    writer.write_eof()
    assert await asyncio.wait_for(reader.read(), STEP) == b""
    await close_writer(writer)


class Echo6:
    """An echo server on ::1."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        self.sock.bind(("::1", 0))
        self.sock.listen()
        self.port = self.sock.getsockname()[1]
        import threading

        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        import threading

        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.sock.accept()
                threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    @staticmethod
    def _echo(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            while data := conn.recv(65536):
                conn.sendall(data)

    def close(self) -> None:
        self.sock.close()


# --- CONNECT ------------------------------------------------------------------------------------


def test_fastpath_connects_ipv4_and_domain_targets_and_relays(run, engine_name, caplog) -> None:
    caplog.set_level(logging.INFO, logger="honk.connection")  # a flow's line is at info

    async def main() -> None:
        with EchoServer() as echo:
            async with honk(engine_name) as env:
                for host in ("127.0.0.1", "localhost"):
                    reader, writer, rep, bound = await socks5_open(env.port, host, echo.port)
                    assert rep == 0
                    assert (
                        socket.inet_ntoa(bound[:4]) == "127.0.0.1" and struct.unpack("!H", bound[4:])[0] > 0
                    )
                    assert (
                        await _echo_round(reader, writer, b"ping " + host.encode())
                        == b"ping " + host.encode()
                    )
                    [info] = env.tracker.snapshot()
                    assert info.target == Address(host, echo.port)
                    assert info.engine in ("native", "native-python")
                    writer.write_eof()
                    assert await asyncio.wait_for(reader.read(), STEP) == b""
                    await asyncio.wait_for(env.tracker.wait_idle(), STEP)
                    await close_writer(writer)

    run(main())
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("flow opened ")]
    assert len(lines) == 2
    assert lines[0].startswith("flow opened network=tcp inbound=lan source=127.0.0.1:")
    assert lines[0].endswith("rule=fallback chain=direct")


def test_fastpath_connects_an_ipv6_target(run, engine_name) -> None:
    require_ipv6_loopback()

    async def main() -> None:
        echo = Echo6()
        try:
            async with honk(engine_name) as env:
                reader, writer, rep, bound = await socks5_open(env.port, "::1", echo.port)
                assert rep == 0
                assert socket.inet_ntop(socket.AF_INET6, bound[:16]) == "::1"
                assert await _echo_round(reader, writer, b"six") == b"six"
                [info] = env.tracker.snapshot()
                assert info.target == Address("::1", echo.port)
                await close_writer(writer)
        finally:
            echo.close()

    run(main())


def test_fastpath_pipelined_payload_after_the_request_goes_upstream_first(run, engine_name) -> None:
    async def main() -> None:
        with EchoServer() as echo:
            async with honk(engine_name) as env:
                reader, writer = await asyncio.open_connection("127.0.0.1", env.port)
                # greeting, request and payload in one write, as optimistic clients do
                writer.write(
                    b"\x05\x01\x00" + b"\x05\x01\x00" + encode_address("127.0.0.1", echo.port) + b"early"
                )
                got = await asyncio.wait_for(reader.readexactly(2 + 10 + 5), STEP)
                assert got[:2] == b"\x05\x00"  # method
                assert got[2:6] == b"\x05\x00\x00\x01"  # success, IPv4 bound address
                assert got[12:] == b"early"  # echoed: it reached the upstream after the request
                await close_writer(writer)

    run(main())


# --- refusals -------------------------------------------------------------------------------------


def test_fastpath_blocked_target_gets_reply_2(run, engine_name, caplog) -> None:
    caplog.set_level(logging.DEBUG, logger="honk.inbound")

    async def main() -> None:
        async with honk(engine_name, rules=(BLOCKED, rule("dport", "9", "block"))) as env:
            for host, port in (("blocked.test", 80), ("127.0.0.1", 9)):
                reader, writer, rep, _ = await socks5_open(env.port, host, port)
                assert rep == 0x02
                assert await asyncio.wait_for(reader.read(), STEP) == b""
                await close_writer(writer)
            assert env.tracker.snapshot() == []

    run(main())
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("flow refused")]
    assert len(lines) == 2 and all("error=Blocked" in line for line in lines)


def test_fastpath_refused_connect_gets_reply_5(run, engine_name, caplog) -> None:
    caplog.set_level(logging.INFO, logger="honk.inbound")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]

    async def main() -> None:
        async with honk(engine_name) as env:
            reader, writer, rep, bound = await socks5_open(env.port, "127.0.0.1", closed_port)
            assert rep == 0x05
            assert bound == b"\x00" * 6
            assert await asyncio.wait_for(reader.read(), STEP) == b""
            await close_writer(writer)
            await asyncio.wait_for(env.inbound.wait_closed(), STEP)

    run(main())
    assert any(
        "flow refused inbound=lan" in r.getMessage() and "error=ConnectFailed" in r.getMessage()
        for r in caplog.records
    )


def test_fastpath_connect_deadline_on_the_injected_clock_gets_reply_6(run, engine_name, caplog) -> None:
    caplog.set_level(logging.INFO, logger="honk.inbound")

    async def main() -> None:
        clock = FakeClock()
        with unanswered_port() as port:
            async with honk(engine_name, clock=clock) as env:
                reader, writer = await asyncio.open_connection("127.0.0.1", env.port)
                writer.write(b"\x05\x01\x00\x05\x01\x00" + encode_address("127.0.0.1", port))
                assert await asyncio.wait_for(reader.readexactly(2), STEP) == b"\x05\x00"
                while clock.sleepers == 0:  # the connect deadline is armed
                    await asyncio.sleep(0.001)
                clock.advance(1.9)
                await asyncio.sleep(0.05)
                assert env.inbound.active == 1
                clock.advance(0.2)
                head = await asyncio.wait_for(reader.readexactly(10), STEP)
                assert head[1] == 0x06
                assert await asyncio.wait_for(reader.read(), STEP) == b""
                await close_writer(writer)
                await asyncio.wait_for(env.inbound.wait_closed(), STEP)

    run(main())
    assert any("error=DialTimeout" in r.getMessage() for r in caplog.records)


# --- handover -------------------------------------------------------------------------------------


def test_fastpath_hands_http_bind_and_udp_associate_to_python(run, engine_name) -> None:
    async def main() -> None:
        with EchoServer() as echo:
            async with honk(engine_name) as env:
                reader, writer = await asyncio.open_connection("127.0.0.1", env.port)
                writer.write(f"CONNECT 127.0.0.1:{echo.port} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), STEP)
                assert head.startswith(b"HTTP/1.1 200")
                assert await _echo_round(reader, writer, b"via http") == b"via http"
                await close_writer(writer)

                _, writer, rep, _ = await socks5_open(env.port, "127.0.0.1", 1, cmd=2)
                assert rep == 0x07
                await close_writer(writer)

                reader, writer, rep, bound = await socks5_open(env.port, "0.0.0.0", 0, cmd=3)
                assert rep == 0
                assert struct.unpack("!H", bound[4:6])[0] > 0
                await close_writer(writer)
                await asyncio.wait_for(env.tracker.wait_idle(), STEP)

    run(main())


def test_inbound_with_users_keeps_the_python_path(run, engine_name) -> None:
    async def main() -> None:
        with EchoServer() as echo:
            async with honk(engine_name, users=(InboundUser("alice", "s3cret"),)) as env:
                reader, writer, rep, _ = await socks5_open(
                    env.port, "127.0.0.1", echo.port, auth=("alice", "s3cret")
                )
                assert rep == 0
                assert await _echo_round(reader, writer, b"authed") == b"authed"
                await close_writer(writer)
                _, writer, rep, _ = await socks5_open(env.port, "127.0.0.1", echo.port)
                assert rep == 0xFF
                await close_writer(writer)

    run(main())


def test_fastpath_bad_clients_end_only_their_own_flow_with_the_log_line(run, engine_name, caplog) -> None:
    caplog.set_level(logging.INFO, logger="honk.inbound")

    async def send_and_close(port: int, data: bytes) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        got = b""
        with contextlib.suppress(OSError):
            writer.write(data)
            await writer.drain()
            writer.write_eof()
            got = await asyncio.wait_for(reader.read(), STEP)
        await close_writer(writer)
        return got

    async def vanish(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"\x05\x01\x00")
        assert await asyncio.wait_for(reader.readexactly(2), STEP) == b"\x05\x00"
        writer.write(b"\x05\x01\x00\x03\x0aexam")
        await writer.drain()
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()

    async def main() -> list[bytes]:
        with EchoServer() as echo:
            async with honk(engine_name) as env:
                healthy = await socks5_open(env.port, "127.0.0.1", echo.port)
                results = await asyncio.gather(
                    send_and_close(env.port, b"\x16garbage"),
                    send_and_close(env.port, b"\x05\x02\x00"),
                    send_and_close(env.port, b"\x05\x01\x00\x04\x01\x00"),  # bad version in the request
                    send_and_close(env.port, b"\x05\x01\x00\x05\x09\x00\x01" + bytes(6)),  # unknown command
                    send_and_close(env.port, b"\x05\x01\x00\x05\x01\x00\x07" + bytes(6)),  # unknown atyp
                    vanish(env.port),
                )
                reader, writer, rep, _ = healthy
                assert rep == 0
                assert await _echo_round(reader, writer, b"still fine") == b"still fine"
                await close_writer(writer)
                await asyncio.wait_for(env.inbound.wait_closed(), STEP)
                return results

    results = run(main())
    assert results[3].startswith(b"\x05\x00\x05\x07")  # 0x07 after the method choice, as the codec says
    assert results[4].startswith(b"\x05\x00\x05\x08")
    lines = [r.getMessage() for r in caplog.records if "flow ended during handshake" in r.getMessage()]
    reasons = sorted(line.split("reason=")[1] for line in lines)
    assert reasons == [
        "bad-address-type",
        "bad-command",
        "bad-request",
        "bad-version",
        "client-gone",
        "truncated",
    ], lines
    assert all("inbound=lan source=127.0.0.1:" in line for line in lines)


def test_fastpath_slow_client_is_handed_over_and_cut_off_on_the_injected_clock(
    run, engine_name, caplog
) -> None:
    caplog.set_level(logging.INFO, logger="honk.inbound")

    async def main() -> None:
        clock = FakeClock()
        async with honk(engine_name, clock=clock) as env:
            reader, writer = await asyncio.open_connection("127.0.0.1", env.port)
            writer.write(b"\x05\x01\x00")
            assert await asyncio.wait_for(reader.readexactly(2), STEP) == b"\x05\x00"
            assert env.inbound.active == 1
            while clock.sleepers == 0:  # handed over after HS_HANDOVER_AFTER: the watchdog is armed
                await asyncio.sleep(0.01)
            clock.advance(10.0)
            data = b""
            with contextlib.suppress(ConnectionResetError):
                data = await asyncio.wait_for(reader.read(), STEP)
            assert data == b""
            await close_writer(writer)
            await asyncio.wait_for(env.inbound.wait_closed(), STEP)

    run(main())
    assert any("error=HandshakeTimeout reason=timeout" in r.getMessage() for r in caplog.records)


# --- the connection table ---------------------------------------------------------------------------


def test_fastpath_tracker_lists_flows_with_rule_and_chain_and_close_by_id_ends_one(run, engine_name) -> None:
    async def main() -> None:
        with EchoServer() as echo:
            rules = (BLOCKED, rule("dport", str(echo.port), "direct"))
            async with honk(engine_name, rules=rules) as env:
                clients = [await socks5_open(env.port, "127.0.0.1", echo.port) for _ in range(3)]
                for reader, writer, rep, _ in clients:
                    assert rep == 0
                    assert await _echo_round(reader, writer, b"abcd") == b"abcd"
                infos = env.tracker.snapshot()
                assert len(infos) == 3
                for info in infos:
                    assert info.rule == f"dport({echo.port})"
                    assert info.chain == ("direct",)
                    assert info.inbound == "lan"
                    assert (info.upload, info.download) == (4, 4)
                victim = infos[1]
                assert env.tracker.close(victim.id)
                ends = []
                for reader, writer, _, _ in clients:
                    try:
                        writer.write(b"x")
                        ends.append(await asyncio.wait_for(reader.read(1), 0.5))
                    except (TimeoutError, ConnectionResetError):
                        ends.append(None)
                assert ends.count(b"") == 1 and ends.count(b"x") == 2
                assert len(env.tracker.snapshot()) == 2
                for _, writer, _, _ in clients:
                    await close_writer(writer)
                await asyncio.wait_for(env.tracker.wait_idle(), STEP)

    run(main())


def test_fastpath_aclose_ends_live_flows_and_stop_accepting_frees_the_port(run, engine_name) -> None:
    async def main() -> None:
        with EchoServer() as echo:
            async with honk(engine_name) as env:
                reader, writer, rep, _ = await socks5_open(env.port, "127.0.0.1", echo.port)
                assert rep == 0
                port = env.port
                await env.inbound.stop_accepting()
                with socket.socket() as again:  # the port is free at once
                    again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    again.bind(("127.0.0.1", port))
                assert await _echo_round(reader, writer, b"alive") == b"alive"  # live flows stay
                await env.inbound.aclose()
                with contextlib.suppress(ConnectionResetError):
                    assert await asyncio.wait_for(reader.read(), STEP) == b""
                await close_writer(writer)
                assert env.inbound.active == 0

    run(main())


# --- resources -------------------------------------------------------------------------------------


def test_fastpath_leaves_no_fd_after_many_flows(run, engine_name) -> None:
    total = 5_000 if engine_name == "native" else 2_000  # any per-flow leak is thousands of fds

    async def flows(count: int) -> None:
        with EchoServer() as echo:
            async with honk(engine_name) as env:
                for _ in range(max(count // 50, 1)):
                    await asyncio.wait_for(
                        asyncio.gather(
                            *(_one_echo_flow(env.port, echo.port, b"hi") for _ in range(min(count, 50)))
                        ),
                        30,
                    )
                await asyncio.wait_for(env.tracker.wait_idle(), STEP)
                await asyncio.wait_for(env.inbound.wait_closed(), STEP)

    async def main() -> None:
        gc.collect()
        close_engines()
        await flows(1)  # the loop's own lazily created fds exist after this
        await asyncio.sleep(0.05)
        before = open_fds()
        await flows(total)
        await asyncio.sleep(0.05)
        assert open_fds() == before

    run(main())


@pytest.mark.skipif(
    bool(os.environ.get("HONK_NO_EXTENSIONS")), reason="HONK_NO_EXTENSIONS: only the twin runs"
)
def test_a_short_flow_wakes_the_loops_thread_for_its_request_open_and_end_only(run) -> None:
    """The compiled worker holds a flow's byte counts, first byte and half-closes until an urgent
    event (request, OPEN, END) rides with them: one flow at a time, that is three wake-ups of
    the loop's thread, where its seven events took five or six on their own; and no byte goes
    uncounted."""
    require("compiled" in RELAY_ENGINES, "the compiled relay engine (make build)")
    flows = 20

    async def main() -> None:
        with EchoServer() as echo:
            async with honk("native") as env:
                before, totals = env.engine.wakeups, env.tracker.totals()
                for _ in range(flows):
                    await _one_echo_flow(env.port, echo.port, b"hello")
                    await asyncio.wait_for(env.tracker.wait_idle(), STEP)
                wakeups = env.engine.wakeups - before
                # 3 per flow here; a turn slower than EVENT_DEFER may flush once more (each flow
                # alone took 5 to 6 when every event woke the loop's thread)
                assert wakeups <= 4 * flows, wakeups
                up, down = env.tracker.totals()
                assert (up - totals[0], down - totals[1]) == (5 * flows, 5 * flows)

    run(main())
