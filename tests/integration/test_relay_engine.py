"""One conformance suite over every relay engine, on real sockets, on asyncio and uvloop.

Engines: ``copy`` (CopyRelay, the reference), ``native`` (NativeRelay over the
compiled engine; absent under HONK_NO_EXTENSIONS or without a build) and
``twin`` (NativeRelay over the pure-Python twin ``relay_py.Engine``).

Layout of every flow: ``lan`` is the test's client socket, whose peer is
wrapped in a StreamConn the way an inbound hands it over; ``remote`` is the
test's origin socket, whose peer is the "dialed" upstream socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import hashlib
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator

import pytest
from helpers.descriptors import descriptors_exhausted
from helpers.engines import poll
from helpers.peers import require
from helpers.sockets import open_fds, reset, tcp_pair, unix_pair

from benchmarks import flowcost
from honk._fast import relay as fast_relay
from honk._fast import relay_py
from honk.connection.tracker import ConnectionTracker
from honk.core.clock import FakeClock
from honk.core.errors import ClientGone, FlowClosed, HonkError, UpstreamFailed
from honk.core.net import Address, Network
from honk.relay import relay_engine
from honk.relay.copy import CopyRelay
from honk.relay.native import NativeRelay, close_engines
from honk.relay.stream import StreamConn

STEP = 5.0  # seconds: the most any single wait may take
GiB = 1024**3
MiB = 1024**2

ENGINES = ["copy", "twin"]
if fast_relay.IMPLEMENTATION == "compiled":
    ENGINES.insert(1, "native")


def _engine_class(name: str):
    if name == "native":
        from honk._fast.relay_c import Engine

        return Engine
    return relay_py.Engine


class Engines:
    """Makes relays of one kind on the running loop; ``close()`` closes its native engine."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.clock = FakeClock()
        self.engine = None
        if name != "copy":
            self.engine = _engine_class(name)(asyncio.get_running_loop())

    def relay(self):
        if self.engine is None:
            return CopyRelay(self.clock)
        return NativeRelay(self.clock, self.engine)

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()


@contextlib.contextmanager
def one_tcp_flow(engine_name: str, listener: socket.socket) -> Iterator[tuple[Engines, Flow]]:
    """The engines under test and one client/upstream TCP flow; both closed afterwards."""
    engines = Engines(engine_name)
    flow = Flow(lambda: tcp_pair(listener))
    try:
        yield engines, flow
    finally:
        flow.close()
        engines.close()


@pytest.fixture(params=ENGINES)
def engine_name(request: pytest.FixtureRequest) -> str:
    return request.param


class Flow:
    """One client connection and one upstream connection around a relay."""

    def __init__(self, pair: Callable[[], tuple[socket.socket, socket.socket]]) -> None:
        self.lan, self._lan_peer = pair()
        self.remote, self.upstream = pair()
        self.client: StreamConn | None = None

    async def client_conn(self) -> StreamConn:
        conn = StreamConn(ClientGone)
        await asyncio.get_running_loop().connect_accepted_socket(lambda: conn, sock=self._lan_peer)
        self.client = conn
        return conn

    async def start(self, relay) -> asyncio.Future[None]:
        client = self.client or await self.client_conn()
        return asyncio.ensure_future(relay.run(client, self.upstream))

    def close(self) -> None:
        for sock in (self.lan, self.remote):
            with contextlib.suppress(OSError):
                sock.close()


async def _recv_until_eof(sock: socket.socket) -> bytes:
    loop = asyncio.get_running_loop()
    out = bytearray()
    while chunk := await loop.sock_recv(sock, 65536):
        out += chunk
    return bytes(out)


@pytest.fixture
def listener():
    with socket.create_server(("127.0.0.1", 0)) as srv:
        yield srv


# --- bulk ---------------------------------------------------------------------------------------

_BLOCK = os.urandom(4 * MiB)
_DIGESTS: dict[int, str] = {}


def _expected_digest(total: int) -> str:
    if total not in _DIGESTS:
        h = hashlib.sha256()
        for _ in range(total // len(_BLOCK)):
            h.update(_BLOCK)
        _DIGESTS[total] = h.hexdigest()
    return _DIGESTS[total]


def _send_all(sock: socket.socket, total: int) -> None:
    sock.setblocking(True)
    view = memoryview(_BLOCK)
    for _ in range(total // len(_BLOCK)):
        sock.sendall(view)
    sock.shutdown(socket.SHUT_WR)


def _hash_until_eof(sock: socket.socket, out: list) -> None:
    sock.setblocking(True)
    h = hashlib.sha256()
    buf = bytearray(1 * MiB)
    view = memoryview(buf)
    n = 0
    while got := sock.recv_into(buf):
        h.update(view[:got])
        n += got
    out.extend((n, h.hexdigest()))


async def _both_ways(flow: Flow, total: int) -> tuple[list, list]:
    """``total`` bytes sent each way at once through ``flow``, each end hashing what it gets:
    ([bytes, sha256] at the origin, [bytes, sha256] at the client)."""
    up: list = []
    down: list = []
    threads = [
        threading.Thread(target=_send_all, args=(flow.lan, total)),
        threading.Thread(target=_send_all, args=(flow.remote, total)),
        threading.Thread(target=_hash_until_eof, args=(flow.remote, up)),
        threading.Thread(target=_hash_until_eof, args=(flow.lan, down)),
    ]
    for t in threads:
        t.start()
    await asyncio.to_thread(lambda: [t.join() for t in threads])
    return up, down


def test_bulk_both_ways_at_once_arrives_intact(run, engine_name, listener) -> None:
    total = 64 * MiB if engine_name == "twin" else GiB

    async def main() -> None:
        with one_tcp_flow(engine_name, listener) as (engines, flow):
            relay = engines.relay()
            task = await flow.start(relay)
            up, down = await _both_ways(flow, total)
            await asyncio.wait_for(task, STEP)
            assert up == [total, _expected_digest(total)]
            assert down == [total, _expected_digest(total)]
            assert (relay.bytes_up, relay.bytes_down) == (total, total)

    _expected_digest(total)
    run(main())


@pytest.mark.parametrize("engine_name", [e for e in ENGINES if e != "copy"])  # the copy relay takes no pipes
def test_a_bulk_flow_with_no_descriptor_for_a_pipe_copies_instead_of_ending(
    run, engine_name, listener
) -> None:
    total = 8 * MiB

    async def main() -> None:
        with one_tcp_flow(engine_name, listener) as (engines, flow):
            relay = engines.relay()
            await flow.client_conn()
            with descriptors_exhausted(spare=1):  # the relay's dup of the client fits, a pipe does not
                task = await flow.start(relay)
                up, down = await _both_ways(flow, total)
                await asyncio.wait_for(task, STEP)
            assert up == [total, _expected_digest(total)]
            assert down == [total, _expected_digest(total)]

    _expected_digest(total)
    run(main())


# --- half-close ---------------------------------------------------------------------------------


@pytest.mark.parametrize("first", ["client", "upstream"])
def test_half_close_keeps_the_other_direction_and_ends_cleanly(run, engine_name, listener, first) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        with one_tcp_flow(engine_name, listener) as (engines, flow):
            relay = engines.relay()
            task = await flow.start(relay)
            a, b = (flow.lan, flow.remote) if first == "client" else (flow.remote, flow.lan)
            await loop.sock_sendall(a, b"question")
            a.shutdown(socket.SHUT_WR)
            assert await asyncio.wait_for(_recv_until_eof(b), STEP) == b"question"  # EOF arrived
            for _ in range(20):  # the other direction still flows, repeatedly
                await loop.sock_sendall(b, b"answer" * 100)
                got = b""
                while len(got) < 600:
                    got += await asyncio.wait_for(loop.sock_recv(a, 65536), STEP)
                assert got == b"answer" * 100
            assert not task.done()
            b.shutdown(socket.SHUT_WR)
            assert await asyncio.wait_for(_recv_until_eof(a), STEP) == b""
            await asyncio.wait_for(task, STEP)  # clean: no exception
            expected = (8, 12000) if first == "client" else (12000, 8)
            assert (relay.bytes_up, relay.bytes_down) == expected
            if engine_name != "copy":
                assert relay.half_closed == 0b11

    run(main())


# --- resets -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("who", "expected"), [("client", ClientGone), ("upstream", UpstreamFailed)])
def test_reset_is_typed_by_side_and_keeps_the_errno(run, engine_name, listener, who, expected) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        with one_tcp_flow(engine_name, listener) as (engines, flow):
            relay = engines.relay()
            task = await flow.start(relay)
            await loop.sock_sendall(flow.lan, b"ping")
            assert await asyncio.wait_for(loop.sock_recv(flow.remote, 10), STEP) == b"ping"
            reset(flow.lan if who == "client" else flow.remote)
            with pytest.raises(expected) as info:
                await asyncio.wait_for(task, STEP)
            assert info.value.errno == errno.ECONNRESET
            assert type(info.value) is expected

    run(main())


# --- many flows ------------------------------------------------------------------------------------


def test_closing_one_of_100_flows_by_id_leaves_the_others_intact(run, engine_name, listener) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        engines = Engines(engine_name)
        tracker = ConnectionTracker(engines.clock)
        flows = [Flow(lambda: tcp_pair(listener)) for _ in range(100)]
        try:
            tasks, ids = [], []
            for flow in flows:
                relay = engines.relay()
                tracked = tracker.open(
                    relay,
                    network=Network.TCP,
                    inbound="t",
                    source=Address("127.0.0.1", 1),
                    target=Address("127.0.0.1", 2),
                    rule="r",
                    chain=("direct",),
                    plane_generation=1,
                )
                tasks.append(await flow.start(relay))
                ids.append(tracked.id)
            assert tracker.snapshot()[0].engine in ("copy", "native", "native-python")
            victim = 37
            tracker.close(ids[victim])
            with pytest.raises(FlowClosed):
                await asyncio.wait_for(tasks[victim], STEP)

            payload = os.urandom(256 * 1024)

            async def exchange(flow: Flow) -> tuple[bytes, bytes]:
                async def one_way(src: socket.socket, dst: socket.socket) -> bytes:
                    sender = asyncio.ensure_future(loop.sock_sendall(src, payload))
                    got = bytearray()
                    while len(got) < len(payload):
                        got += await loop.sock_recv(dst, 65536)
                    await sender
                    src.shutdown(socket.SHUT_WR)
                    return bytes(got)

                return await asyncio.gather(one_way(flow.lan, flow.remote), one_way(flow.remote, flow.lan))

            others = [f for i, f in enumerate(flows) if i != victim]
            results = await asyncio.wait_for(asyncio.gather(*(exchange(f) for f in others)), 30)
            assert all(up == payload and down == payload for up, down in results)
            await asyncio.wait_for(asyncio.gather(*(t for i, t in enumerate(tasks) if i != victim)), STEP)
        finally:
            for flow in flows:
                flow.close()
            engines.close()

    run(main())


def test_no_fd_left_after_10000_short_flows_and_close(run, engine_name) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()

        async def short(make: Callable[[], object]) -> None:
            flow = Flow(unix_pair)
            try:
                task = await flow.start(make())
                await loop.sock_sendall(flow.lan, b"hi")
                flow.lan.shutdown(socket.SHUT_WR)
                assert await _recv_until_eof(flow.remote) == b"hi"
                await loop.sock_sendall(flow.remote, b"yo")
                flow.remote.shutdown(socket.SHUT_WR)
                assert await _recv_until_eof(flow.lan) == b"yo"
                await task
            finally:
                flow.close()

        # Engines left by earlier tests' loops would otherwise close (on GC) mid-count.
        gc.collect()
        close_engines()
        # one flow first, so that the loop's own lazily created fds are already there
        await short(lambda: CopyRelay(FakeClock()))
        await asyncio.sleep(0.01)
        before = open_fds()
        engines = Engines(engine_name)
        for _ in range(100):
            await asyncio.wait_for(asyncio.gather(*(short(engines.relay) for _ in range(100))), 30)
        # an engine closed with live flows ends them and frees everything too
        live = [Flow(unix_pair) for _ in range(10)]
        relays = [engines.relay() for _ in live]
        tasks = [await f.start(r) for f, r in zip(live, relays, strict=True)]
        await asyncio.sleep(0.05)
        if engines.engine is None:  # the copy engine has no shared engine: close each relay
            for relay in relays:
                relay.close()
        engines.close()
        for task in tasks:
            with pytest.raises(FlowClosed):
                await asyncio.wait_for(task, STEP)
        for flow in live:
            flow.close()
        await asyncio.sleep(0.01)
        assert open_fds() == before

    run(main())


# --- handshake leftovers ------------------------------------------------------------------------------


def test_preamble_and_early_client_eof_reach_upstream_in_order(run, engine_name, listener) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        with one_tcp_flow(engine_name, listener) as (engines, flow):
            client = await flow.client_conn()
            await loop.sock_sendall(flow.lan, b"CONNECT x\r\n\r\npipelined")
            flow.lan.shutdown(socket.SHUT_WR)
            data = b""
            while chunk := await client.receive():  # read through to EOF, as a slow handshake might
                data += chunk
            client.unread(data[len(b"CONNECT x\r\n\r\n") :])
            client.write(b"HTTP/1.1 200 OK\r\n\r\n")  # the reply queued just before the handoff
            relay = engines.relay()
            task = await flow.start(relay)

            assert await asyncio.wait_for(_recv_until_eof(flow.remote), STEP) == b"pipelined"
            await loop.sock_sendall(flow.remote, b"reply")
            flow.remote.shutdown(socket.SHUT_WR)
            assert await asyncio.wait_for(_recv_until_eof(flow.lan), STEP) == b"HTTP/1.1 200 OK\r\n\r\nreply"
            await asyncio.wait_for(task, STEP)
            assert (relay.bytes_up, relay.bytes_down) == (9, 5)

    run(main())


def test_preamble_precedes_later_client_bytes(run, engine_name, listener) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        with one_tcp_flow(engine_name, listener) as (engines, flow):
            client = await flow.client_conn()
            await loop.sock_sendall(flow.lan, b"first")
            assert await client.receive() == b"first"
            client.unread(b"first")
            task = await flow.start(engines.relay())
            await loop.sock_sendall(flow.lan, b"+second")
            flow.lan.shutdown(socket.SHUT_WR)
            assert await asyncio.wait_for(_recv_until_eof(flow.remote), STEP) == b"first+second"
            flow.remote.shutdown(socket.SHUT_WR)
            await asyncio.wait_for(task, STEP)

    run(main())


# --- counters and events -------------------------------------------------------------------------------


def test_counters_are_exact_and_first_upstream_byte_is_reported_once(run, engine_name, listener) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        engines = Engines(engine_name)
        flow = Flow(lambda: tcp_pair(listener))
        firsts: list[float] = []
        try:
            relay = engines.relay()
            if isinstance(relay, NativeRelay):
                original = relay.relay_event

                def spy(kind: int, a: int, b: int, t: float) -> None:
                    if kind == relay_py.EV_FIRST_BYTE:
                        firsts.append(t)
                    original(kind, a, b, t)

                relay.relay_event = spy  # type: ignore[method-assign]
            task = await flow.start(relay)
            up = down = 0
            for i in range(1, 30):
                await loop.sock_sendall(flow.lan, b"u" * i)
                up += i
                got = 0
                while got < i:
                    got += len(await asyncio.wait_for(loop.sock_recv(flow.remote, 65536), STEP))
                await loop.sock_sendall(flow.remote, b"d" * (2 * i))
                down += 2 * i
                got = 0
                while got < 2 * i:
                    got += len(await asyncio.wait_for(loop.sock_recv(flow.lan, 65536), STEP))
                assert (relay.bytes_up, relay.bytes_down) == (up, down)  # live, not only at the end
            flow.lan.shutdown(socket.SHUT_WR)
            flow.remote.shutdown(socket.SHUT_WR)
            await asyncio.wait_for(task, STEP)
            assert (relay.bytes_up, relay.bytes_down) == (up, down)
            if isinstance(relay, NativeRelay):
                assert len(firsts) == 1
                assert relay.first_byte_at == firsts[0]
        finally:
            flow.close()
            engines.close()

    run(main())


def test_close_before_run_and_idle_close_end_with_the_reason(run, engine_name, listener) -> None:
    async def main() -> None:
        engines = Engines(engine_name)
        flows = [Flow(lambda: tcp_pair(listener)) for _ in range(2)]
        try:
            early = engines.relay()
            early.close()
            with pytest.raises(FlowClosed):
                await asyncio.wait_for(await flows[0].start(early), STEP)
            relay = engines.relay()
            task = await flows[1].start(relay)
            await asyncio.sleep(0.01)
            relay.close(UpstreamFailed("operator says so"))
            relay.close()  # idempotent; the first reason wins
            with pytest.raises(UpstreamFailed, match="operator says so"):
                await asyncio.wait_for(task, STEP)
            assert await asyncio.wait_for(_recv_until_eof(flows[1].remote), STEP) == b""
        finally:
            for flow in flows:
                flow.close()
            engines.close()

    run(main())


# --- the engine API itself (native engines only) ----------------------------------------------------------


class _Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[int, int, int]] = []
        self.ended = asyncio.get_running_loop().create_future()

    def relay_event(self, kind: int, a: int, b: int, t: float) -> None:
        self.events.append((kind, a, b))
        if kind == relay_py.EV_END:
            self.ended.set_result((a, b))


@pytest.mark.parametrize("name", [e for e in ENGINES if e != "copy"])
def test_engine_forced_copy_path_moves_the_same_bytes(run, name, listener) -> None:
    async def main() -> None:
        engine = _engine_class(name)(asyncio.get_running_loop())
        flow = Flow(lambda: tcp_pair(listener))
        try:
            rec = _Recorder()
            lan_fd = flow._lan_peer.detach()
            up_fd = flow.upstream.detach()
            engine.add(lan_fd, up_fd, rec, b"pre:", False, True)
            sent = os.urandom(3 * MiB)
            assert await _push_and_collect(flow.lan, flow.remote, sent) == b"pre:" + sent
            flow.remote.shutdown(socket.SHUT_WR)
            assert await asyncio.wait_for(rec.ended, STEP) == (relay_py.END_CLEAN, 0)
            kinds = [k for k, _, _ in rec.events]
            assert kinds[0] == relay_py.EV_OPEN and kinds[-1] == relay_py.EV_END
            assert rec.events[-2] == (
                relay_py.EV_BYTES,
                len(sent),
                0,
            )  # the preamble is not read from a socket
            assert (
                kinds.count(relay_py.EV_HALF_CLOSE) <= 1
            )  # the second EOF ended the flow (the first waits for a report)
            assert relay_py.EV_FIRST_BYTE not in kinds
        finally:
            flow.close()
            engine.close()

    run(main())


@contextlib.asynccontextmanager
async def _pinged_flow(name: str, listener: socket.socket) -> AsyncIterator[tuple[Flow, _Recorder]]:
    """One loopback flow relayed by engine ``name`` to a recorder, the client's "ping" already
    delivered upstream."""
    loop = asyncio.get_running_loop()
    engine = _engine_class(name)(loop)
    flow = Flow(lambda: tcp_pair(listener))
    try:
        rec = _Recorder()
        engine.add(flow._lan_peer.detach(), flow.upstream.detach(), rec)
        await loop.sock_sendall(flow.lan, b"ping")
        assert await asyncio.wait_for(loop.sock_recv(flow.remote, 4), STEP) == b"ping"
        yield flow, rec
    finally:
        flow.close()
        engine.close()


@pytest.mark.parametrize("name", [e for e in ENGINES if e != "copy"])
def test_a_short_flow_is_told_open_first_byte_totals_and_end(run, name, listener) -> None:
    """A flow that ends within its first report interval is told four events: OPEN, FIRST_BYTE
    with the totals so far (the client's bytes before the answer), the final BYTES, END. Its
    half-close waited for a report that never came (END says both), and so did its first
    BYTES: each is one call less on the loop's thread per flow."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        began = time.monotonic()
        async with _pinged_flow(name, listener) as (flow, rec):
            await loop.sock_sendall(flow.remote, b"pong!")
            assert await asyncio.wait_for(loop.sock_recv(flow.lan, 5), STEP) == b"pong!"
            flow.lan.shutdown(socket.SHUT_WR)
            assert await asyncio.wait_for(_recv_until_eof(flow.remote), STEP) == b""
            flow.remote.shutdown(socket.SHUT_WR)
            assert await asyncio.wait_for(rec.ended, STEP) == (relay_py.END_CLEAN, 0)
            short = time.monotonic() - began < relay_py.REPORT_INTERVAL
            assert rec.events[0] == (relay_py.EV_OPEN, 0, 0)
            assert (relay_py.EV_FIRST_BYTE, 4, 5) in rec.events
            assert rec.events[-2:] == [(relay_py.EV_BYTES, 4, 5), (relay_py.EV_END, relay_py.END_CLEAN, 0)]
            if short:  # a stalled machine may have let a report fall due: then it may say more
                assert rec.events == [
                    (relay_py.EV_OPEN, 0, 0),
                    (relay_py.EV_FIRST_BYTE, 4, 5),
                    (relay_py.EV_BYTES, 4, 5),
                    (relay_py.EV_END, relay_py.END_CLEAN, 0),
                ]
                # what benchmarks.flowcost feeds the fast path as a short flow's events is this sequence
                assert [kind for kind, _, _ in rec.events] == [
                    kind for kind, _, _ in flowcost.SHORT_FLOW_EVENTS
                ]

    run(main())


@pytest.mark.parametrize("name", [e for e in ENGINES if e != "copy"])
def test_a_lingering_half_close_is_told_with_the_next_report(run, name, listener) -> None:
    """The client's EOF forwarded while the upstream keeps its side open: HALF_CLOSE comes with
    the flow's next report, within a report interval (the tracker's half-close linger starts
    from it), and the second EOF still comes as END alone."""

    async def main() -> None:
        async with _pinged_flow(name, listener) as (flow, rec):
            flow.lan.shutdown(socket.SHUT_WR)
            assert await asyncio.wait_for(_recv_until_eof(flow.remote), STEP) == b""
            shut = time.monotonic()
            await poll(
                lambda: any(kind == relay_py.EV_HALF_CLOSE for kind, _, _ in rec.events),
                "the client's half-close",
            )
            assert time.monotonic() - shut < STEP
            half = [e for e in rec.events if e[0] == relay_py.EV_HALF_CLOSE]
            assert half == [(relay_py.EV_HALF_CLOSE, 0, 0)]
            flow.remote.shutdown(socket.SHUT_WR)
            assert await asyncio.wait_for(rec.ended, STEP) == (relay_py.END_CLEAN, 0)
            assert [e for e in rec.events if e[0] == relay_py.EV_HALF_CLOSE] == half

    run(main())


@pytest.mark.compiled
@pytest.mark.skipif(
    fast_relay.IMPLEMENTATION != "compiled",
    reason="the compiled engine's eventfd hand-over (the twin delivers on the loop itself)",
)
def test_events_handed_over_while_the_loop_delivers_ride_the_same_wakeup(run) -> None:
    """The compiled engine's loop thread, while it delivers a batch, looks at the queue again
    instead of having the worker write the eventfd: an END the worker hands over while a
    listener of the batch still runs is delivered by the same call, not by another wake-up."""
    from honk._fast.relay_c import Engine

    async def main() -> None:
        engine = Engine(asyncio.get_running_loop())
        pairs = [unix_pair() for _ in range(4)]  # two flows: (lan, peer), (remote, upstream) each
        try:
            seen: list[tuple[str, int, int]] = []
            ended = asyncio.get_running_loop().create_future()
            ids: dict[str, int] = {}

            class Listener:
                def __init__(self, name: str) -> None:
                    self.name = name

                def relay_event(self, kind: int, a: int, b: int, t: float) -> None:
                    seen.append((self.name, kind, engine.wakeups))
                    if self.name == "a" and kind == relay_py.EV_OPEN:
                        engine.cancel(ids["b"])  # the worker ends b and hands its END over now
                        within = asyncio.get_running_loop().time() + STEP
                        while engine.queued_events() == 0:  # waiting on the worker's thread, bounded
                            assert asyncio.get_running_loop().time() < within, "the worker never ended b"
                    if self.name == "b" and kind == relay_py.EV_END:
                        ended.set_result(None)

            for name, (lan, remote) in zip("ab", (pairs[0:2], pairs[2:4]), strict=True):
                ids[name] = engine.add(lan[1].detach(), remote[1].detach(), Listener(name))
            await asyncio.wait_for(ended, STEP)
            opened_a = next(w for n, k, w in seen if n == "a" and k == relay_py.EV_OPEN)
            ended_b = next(w for n, k, w in seen if n == "b" and k == relay_py.EV_END)
            assert ended_b == opened_a, seen  # one delivery call carried both
        finally:
            for pair in pairs:
                for sock in pair:
                    with contextlib.suppress(OSError):
                        sock.close()
            engine.close()

    run(main())


def _pipe_fds() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:")
    return count


@pytest.mark.skipif(
    bool(os.environ.get("HONK_NO_EXTENSIONS")), reason="HONK_NO_EXTENSIONS: only the twin runs"
)
def test_native_short_flows_hold_no_pipe_and_a_bulk_direction_takes_one(run, listener) -> None:
    require("native" in ENGINES, "the compiled relay engine is not built")  # a build CI requires

    async def main() -> None:
        engine = _engine_class("native")(asyncio.get_running_loop())
        flows = [Flow(lambda: tcp_pair(listener)) for _ in range(20)]
        try:
            before = _pipe_fds()
            for flow in flows:
                engine.add(flow._lan_peer.detach(), flow.upstream.detach(), _Recorder())
            for flow in flows:  # a request and its answer, then the flow idles
                flow.lan.sendall(b"q" * 100)
                assert await _recv_exactly(flow.remote, 100) == b"q" * 100
                flow.remote.sendall(b"a" * 300)
                assert await _recv_exactly(flow.lan, 300) == b"a" * 300
            assert _pipe_fds() == before
            bulk = os.urandom(3 * MiB)
            await asyncio.get_running_loop().sock_sendall(flows[0].lan, bulk)
            assert await _recv_exactly(flows[0].remote, len(bulk)) == bulk
            assert _pipe_fds() == before + 2  # the up direction of flow 0 splices through its pipe
        finally:
            for flow in flows:
                flow.close()
            engine.close()

    run(main())


def test_small_writes_against_a_stalled_reader_arrive_in_order(run, engine_name, listener) -> None:
    """A short send parks its rest; bytes read later queue behind it, whatever path a direction takes."""

    async def main() -> None:
        with one_tcp_flow(engine_name, listener) as (engines, flow):
            # a small send buffer towards a reader that does not read: the relay's sends come up short
            flow.upstream.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
            relay = engines.relay()
            task = await flow.start(relay)
            sent = bytearray()
            for i in range(5000):  # one small read per piece: the relay never sees a full buffer
                piece = bytes([i % 251]) * 1000
                flow.lan.send(piece)
                sent += piece
                if not await _relay_read(relay, len(sent), 0.2):
                    break  # stalled: the last piece was read and only partly sent on
            else:
                pytest.fail("the relay never stalled against a reader that does not read")
            for i in range(3):  # these wait behind the parked rest
                flow.lan.send(b"later%d" % i)
                sent += b"later%d" % i
            flow.lan.shutdown(socket.SHUT_WR)
            got = await asyncio.wait_for(_recv_until_eof(flow.remote), STEP)
            assert got == bytes(sent)
            flow.remote.shutdown(socket.SHUT_WR)
            await asyncio.wait_for(task, STEP)

    run(main())


async def _relay_read(relay, total: int, within: float) -> bool:
    """Whether the relay has read ``total`` client bytes within ``within`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while relay.bytes_up < total:
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.001)
    return True


async def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    loop = asyncio.get_running_loop()
    out = bytearray()
    while len(out) < n:
        chunk = await asyncio.wait_for(loop.sock_recv(sock, n - len(out)), STEP)
        assert chunk, "EOF before the expected bytes"
        out += chunk
    return bytes(out)


async def _push_and_collect(src: socket.socket, dst: socket.socket, data: bytes) -> bytes:
    loop = asyncio.get_running_loop()

    async def push() -> None:
        await loop.sock_sendall(src, data)
        src.shutdown(socket.SHUT_WR)

    sender = asyncio.ensure_future(push())
    got = await asyncio.wait_for(_recv_until_eof(dst), STEP)
    await sender
    return got


def test_relay_engine_honours_honk_relay(monkeypatch) -> None:
    clock = FakeClock()
    monkeypatch.setenv("HONK_RELAY", "copy")
    assert isinstance(relay_engine(clock), CopyRelay)
    monkeypatch.setenv("HONK_RELAY", "native")
    assert isinstance(relay_engine(clock), NativeRelay)
    monkeypatch.delenv("HONK_RELAY")
    expected = NativeRelay if fast_relay.IMPLEMENTATION == "compiled" else CopyRelay
    assert isinstance(relay_engine(clock), expected)


def test_error_types_are_honk_errors() -> None:
    assert issubclass(ClientGone, HonkError) and issubclass(UpstreamFailed, HonkError)
