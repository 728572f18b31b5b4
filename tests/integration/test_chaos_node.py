"""The chaos node (tests/helpers/chaos.py) against a real SOCKS5 client and an echo origin on
loopback: each behaviour as a client sees it, and as the node counts it.

The client is the blocking one of helpers/socks.py, run in a thread, so that what it reads
after an RST (the bytes before it, then the reset) is the kernel's answer and not a stream
reader's buffering; the node and the origin run on the test's loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from helpers.aio import close_writer
from helpers.chaos import ChaosBehaviour, ChaosNode, chaos_node
from helpers.engines import poll
from helpers.peers import require_ipv6_loopback
from helpers.sockets import roundtrip
from helpers.socks import socks5_connect

PAYLOAD = b"chaos node echo probe " * 4 + b"\n"
QUIET = 0.3  # seconds a bounded wait gives a reply that must not come
STEP = 5.0  # seconds: the bound on any wait that must succeed


@dataclass
class Echo:
    host: str
    port: int = 0
    connections: int = 0


@contextlib.asynccontextmanager
async def echo_origin(host: str = "127.0.0.1") -> AsyncIterator[Echo]:
    """Echo everything until EOF, then close; counts connections."""
    echo = Echo(host)
    tasks: set[asyncio.Task[None]] = set()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        echo.connections += 1
        task = asyncio.current_task()
        assert task is not None
        tasks.add(task)
        try:
            with contextlib.suppress(OSError, asyncio.CancelledError):  # cancelled: the origin closes
                while data := await reader.read(65536):
                    writer.write(data)
                    await writer.drain()
        finally:
            writer.close()  # not awaited: a cancel landing there would end the task cancelled
            tasks.discard(task)

    server = await asyncio.start_server(serve, host, 0)
    echo.port = server.sockets[0].getsockname()[1]
    try:
        yield echo
    finally:
        server.close()
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.wait_closed()


@pytest.fixture(autouse=True)
async def no_loop_errors():
    """Nothing the loop reports (an unretrieved task exception, a callback error) goes unseen."""
    loop = asyncio.get_running_loop()
    seen: list[dict] = []
    loop.set_exception_handler(lambda _loop, context: seen.append(context))
    yield
    gc.collect()  # an unretrieved task exception is reported when the task is collected
    loop.set_exception_handler(None)
    assert not seen, seen


async def connect(node: ChaosNode, host: str, port: int, timeout: float = STEP) -> tuple[socket.socket, int]:
    """A CONNECT through ``node`` from the blocking client; the socket and the reply code."""
    return await asyncio.to_thread(socks5_connect, (node.host, node.port), host, port, timeout=timeout)


async def exchange(sock: socket.socket, payload: bytes = PAYLOAD) -> bytes:
    """Send ``payload``, read until as many bytes came back, EOF or an error (which is raised)."""
    return await asyncio.to_thread(roundtrip, sock, payload)


async def read_until_end(sock: socket.socket) -> tuple[bytes, str]:
    """Everything until the connection ends; and how it ended ("eof" or "reset")."""

    def run() -> tuple[bytes, str]:
        got = b""
        try:
            while chunk := sock.recv(65536):
                got += chunk
        except ConnectionResetError:
            return got, "reset"
        return got, "eof"

    return await asyncio.to_thread(run)


async def unanswered(node: ChaosNode) -> bool:
    """Whether a greeting to ``node`` stays unanswered for QUIET seconds."""

    def run() -> bool:
        with socket.create_connection((node.host, node.port), STEP) as sock:
            sock.sendall(b"\x05\x01\x00")  # version 5, one method: no auth
            sock.settimeout(QUIET)
            try:
                return sock.recv(2) == b""  # EOF is no answer either
            except TimeoutError:
                return True

    return await asyncio.to_thread(run)


@pytest.mark.parametrize(
    ("node_host", "target"), [("127.0.0.1", "127.0.0.1"), ("::1", "::1"), ("127.0.0.1", "localhost")]
)
async def test_a_normal_flow_is_echoed_and_attributed(node_host, target):
    if ":" in node_host:
        require_ipv6_loopback()
    origin_host = "::1" if ":" in target else "127.0.0.1"
    async with echo_origin(origin_host) as origin, chaos_node(name="n1", host=node_host) as node:
        assert node.link == (
            f"socks5://[::1]:{node.port}" if ":" in node_host else f"socks5://127.0.0.1:{node.port}"
        )
        sock, code = await connect(node, target, origin.port)
        with sock:
            assert code == 0
            assert await exchange(sock) == PAYLOAD
        await poll(lambda: node.records and node.records[0].ended is not None, "the flow's end")
        stats = node.stats
        assert (stats.accepted, stats.requests, stats.succeeded) == (1, 1, 1)
        assert (stats.refused, stats.blackholed, stats.silenced, stats.reset) == (0, 0, 0, 0)
        assert stats.bytes_up == stats.bytes_down == len(PAYLOAD)
        [record] = node.records
        assert record.target == (target, origin.port)
        assert (record.outcome, record.reply) == ("ok", 0)
        assert record.first_up == PAYLOAD[:64]
        assert record.started <= record.ended <= time.monotonic()


async def test_refusal_share_one_answers_the_configured_code():
    async with echo_origin() as origin, chaos_node(behaviour=ChaosBehaviour(refuse_share=1.0)) as node:
        sock, code = await connect(node, "127.0.0.1", origin.port)
        sock.close()
        assert code == 0x05  # connection refused, by default
        node.behaviour.refuse_code = 0x03  # network unreachable
        sock, code = await connect(node, "127.0.0.1", origin.port)
        sock.close()
        assert code == 0x03
        assert (node.stats.requests, node.stats.refused, node.stats.succeeded) == (2, 2, 0)
        assert [r.outcome for r in node.records] == ["refused", "refused"]
        assert origin.connections == 0  # a refused CONNECT never reaches the target


async def test_a_refusal_share_of_half_refuses_about_half_and_the_same_ones_for_the_same_seed():
    async def codes(seed: int) -> list[int]:
        async with (
            echo_origin() as origin,
            chaos_node(seed=seed, behaviour=ChaosBehaviour(refuse_share=0.5)) as node,
        ):
            out = []
            for _ in range(40):
                sock, code = await connect(node, "127.0.0.1", origin.port)
                sock.close()
                out.append(code)
            assert node.stats.refused == out.count(0x05)
            assert node.stats.succeeded == out.count(0)
            return out

    first = await codes(seed=7)
    assert set(first) == {0, 0x05}
    assert 10 <= first.count(0x05) <= 30, first
    assert await codes(seed=7) == first  # deterministic with the seed


async def test_a_blackhole_never_answers_and_is_counted():
    async with echo_origin() as origin, chaos_node(behaviour=ChaosBehaviour(blackhole=True)) as node:
        assert await unanswered(node)  # not even the greeting's answer comes
        assert node.stats.blackholed == 1 and node.stats.requests == 0
        [record] = node.records
        assert (record.outcome, record.reply, record.target) == ("blackholed", None, None)
        assert origin.connections == 0


async def test_reset_right_after_the_reply():
    async with echo_origin() as origin, chaos_node(behaviour=ChaosBehaviour(reset_after=0)) as node:
        sock, code = await connect(node, "127.0.0.1", origin.port)
        with sock:
            assert code == 0
            got, how = await read_until_end(sock)
        assert (got, how) == (b"", "reset")
        assert (node.stats.succeeded, node.stats.reset) == (1, 1)
        assert node.records[0].outcome == "reset"


async def test_reset_after_n_bytes_downstream():
    n = 40
    async with echo_origin() as origin, chaos_node(behaviour=ChaosBehaviour(reset_after=n)) as node:
        sock, code = await connect(node, "127.0.0.1", origin.port)
        with sock:
            assert code == 0
            await asyncio.to_thread(sock.sendall, PAYLOAD)
            got, how = await read_until_end(sock)
        assert got == PAYLOAD[:n]
        assert how in ("reset", "eof")
        assert node.stats.reset == 1 and node.stats.bytes_down == n
        assert node.records[0].outcome == "reset"


async def test_silence_after_the_reply():
    async with echo_origin() as origin, chaos_node(behaviour=ChaosBehaviour(silent=True)) as node:
        sock, code = await connect(node, "127.0.0.1", origin.port)
        with sock:
            assert code == 0
            sock.settimeout(QUIET)
            with pytest.raises(TimeoutError):
                await exchange(sock)
        assert node.stats.silenced == 1 and node.stats.succeeded == 0
        assert node.records[0].outcome == "silenced"
        assert origin.connections == 0


async def test_a_bandwidth_cap_slows_a_transfer():
    size, rate = 200 * 1024, 1024 * 1024
    payload = bytes(range(256)) * (size // 256)
    async with echo_origin() as origin, chaos_node(behaviour=ChaosBehaviour(bandwidth=rate)) as node:
        sock, code = await connect(node, "127.0.0.1", origin.port)
        assert code == 0
        sock.setblocking(False)
        reader, writer = await asyncio.open_connection(sock=sock)
        try:
            started = time.monotonic()
            writer.write(payload)
            echoed = await asyncio.wait_for(reader.readexactly(size), STEP)
            elapsed = time.monotonic() - started
        finally:
            await close_writer(writer)
        assert echoed == payload
        assert elapsed >= 0.15, elapsed  # 200 KiB at 1 MiB/s is 0.195 s each way, pipelined
        assert node.stats.bytes_up == node.stats.bytes_down == size


async def test_connect_latency_delays_the_reply_and_chunk_latency_each_chunk():
    delay = 0.2
    async with (
        echo_origin() as origin,
        chaos_node(behaviour=ChaosBehaviour(connect_delay=delay, connect_jitter=0.05)) as node,
    ):
        started = time.monotonic()
        sock, code = await connect(node, "127.0.0.1", origin.port)
        replied = time.monotonic() - started
        with sock:
            assert code == 0
            assert replied >= delay, replied
            node.behaviour.chunk_delay = 1.0  # a running flow keeps its settings
            started = time.monotonic()
            assert await exchange(sock) == PAYLOAD
            assert time.monotonic() - started < 0.5
            node.behaviour.chunk_delay = 0.1
        sock, code = await connect(node, "127.0.0.1", origin.port)  # the next one has them
        with sock:
            started = time.monotonic()
            assert await exchange(sock) == PAYLOAD
            assert time.monotonic() - started >= 0.2  # 0.1 s each way


async def test_a_change_of_behaviour_applies_to_the_next_connect():
    async with echo_origin() as origin, chaos_node() as node:
        sock, code = await connect(node, "127.0.0.1", origin.port)
        with sock:
            assert code == 0
            node.behaviour.refuse_share = 1.0
            assert await exchange(sock) == PAYLOAD  # the flow already relaying is untouched
        sock, code = await connect(node, "127.0.0.1", origin.port)
        sock.close()
        assert code == 0x05
        node.behaviour = ChaosBehaviour(blackhole=True)  # a whole new behaviour object works too
        assert await unanswered(node)
        node.behaviour.blackhole = False
        sock, code = await connect(node, "127.0.0.1", origin.port)
        with sock:
            assert code == 0
            assert await exchange(sock) == PAYLOAD
        assert [r.outcome for r in node.records] == ["ok", "refused", "blackholed", "ok"]


async def test_close_ends_every_connection_and_task():
    async with echo_origin() as origin:
        node = ChaosNode("n1")
        await node.start()
        held = []
        node.behaviour.silent = True
        sock, code = await connect(node, "127.0.0.1", origin.port)
        assert code == 0
        held.append(sock)
        node.behaviour = ChaosBehaviour(blackhole=True)
        held.append(await asyncio.to_thread(socket.create_connection, (node.host, node.port), STEP))
        await asyncio.to_thread(held[-1].sendall, b"\x05\x01\x00")
        await poll(lambda: node.stats.blackholed == 1, "the greeting, blackholed")
        node.behaviour = ChaosBehaviour()
        sock, code = await connect(node, "127.0.0.1", origin.port)
        assert code == 0
        held.append(sock)
        await poll(lambda: origin.connections == 1, "the relayed flow at the origin")
        await node.close()
        assert not node._tasks
        for sock in held:
            with sock:
                sock.settimeout(STEP)
                _, how = await read_until_end(sock)
                assert how in ("eof", "reset")
        await node.close()  # twice is harmless
        assert [r.outcome for r in node.records] == ["silenced", "blackholed", "ok"]
