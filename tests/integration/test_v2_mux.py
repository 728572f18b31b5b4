"""Mux.Cool carriers (honk.outbound.mux) against a real v2ray server and a loopback echo server.

A node whose params carry ``mux=1`` dials every TCP flow as a logical stream on
one shared carrier: the tests count the physical connections v2ray sees and the
carriers honk's pool holds, move a distinct payload through each stream with a
SHA-256 check, end one stream, kill the carrier, and let an idle carrier time out.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import time
from collections.abc import Awaitable, Callable

import pytest
from helpers.inprocess import leaf_from_link
from helpers.peerservers import v2ray_server
from helpers.servers import EchoServer

import honk.outbound.mux as mux
from honk.core.clock import Clock, FakeClock
from honk.core.errors import CapacityRefused
from honk.core.net import Address
from honk.outbound import admission
from honk.outbound.admission import ProcessGates
from honk.outbound.mux import MUX_IDLE_TIMEOUT, MuxPool, pool_for
from honk.proto.mux import MuxError

STEP = 10.0  # seconds: the bound on any one exchange or poll
STREAMS = 50
PAYLOAD = 64 * 1024
POLL = 0.01  # seconds between checks of a polled condition

Pipe = tuple[asyncio.StreamReader, asyncio.StreamWriter]


def _mux_leaf(peer, clock: Clock | None = None):
    """The node of ``peer``'s link with ``mux=1`` in its params (links do not carry it), built by the registry."""
    leaf = leaf_from_link(peer.share_link(), clock=clock, params=(("mux", "1"),))
    assert leaf.mux and leaf.runtime is not None
    return leaf


async def _until(condition: Callable[[], bool], what: str) -> None:
    """Poll ``condition`` until it holds, for at most STEP seconds."""
    loop = asyncio.get_running_loop()
    end = loop.time() + STEP
    while not condition():
        assert loop.time() < end, f"timed out waiting for {what}"
        await asyncio.sleep(POLL)


async def _open(leaf, echo: EchoServer) -> Pipe:
    dialed = await leaf.dial_tcp(Address("127.0.0.1", echo.port), leaf.clock.now() + STEP)
    return await asyncio.open_connection(sock=dialed.sock)


async def _round_trip(pipe: Pipe, payload: bytes) -> bool:
    reader, writer = pipe
    writer.write(payload)
    got = await asyncio.wait_for(reader.readexactly(len(payload)), STEP)
    return hashlib.sha256(got).digest() == hashlib.sha256(payload).digest()


async def _all_round_trip(pipes: list[Pipe]) -> list[bool]:
    return list(await asyncio.gather(*(_round_trip(p, os.urandom(PAYLOAD)) for p in pipes)))


async def _close(pipes: list[Pipe]) -> None:
    for _, writer in pipes:
        writer.close()
    for _, writer in pipes:
        with contextlib.suppress(OSError):
            await writer.wait_closed()


def _with_streams(
    leaf, echo: EchoServer, count: int, body: Callable[[MuxPool, list[Pipe]], Awaitable[None]]
) -> Callable[[], Awaitable[None]]:
    async def main() -> None:
        pipes = list(await asyncio.gather(*(_open(leaf, echo) for _ in range(count))))
        try:
            await body(pool_for(leaf), pipes)
        finally:
            await _close(pipes)
            pool_for(leaf).close()

    return main


@pytest.fixture
def trust(monkeypatch):
    def use(peer) -> None:
        if peer.ca_path is not None:
            monkeypatch.setenv("SSL_CERT_FILE", str(peer.ca_path))

    return use


@pytest.mark.parametrize("protocol", ["vmess", "vless"])
def test_fifty_concurrent_streams_share_one_carrier_and_each_echoes_its_own_data(
    run, trust, protocol
) -> None:
    async def body(pool: MuxPool, pipes: list[Pipe]) -> None:
        assert await _all_round_trip(pipes) == [True] * STREAMS
        assert pool.carrier_count == 1 and pool.opened == 1
        assert len(pool.carriers[0].sessions) == STREAMS
        assert peer.carriers() == 1

    with EchoServer() as echo, v2ray_server(protocol, mux=True) as peer:
        trust(peer)
        leaf = _mux_leaf(peer)
        run(_with_streams(leaf, echo, STREAMS, body)())


def test_ending_one_stream_leaves_the_other_forty_nine_working(run) -> None:
    async def body(pool: MuxPool, pipes: list[Pipe]) -> None:
        assert await _all_round_trip(pipes) == [True] * STREAMS
        carrier = pool.carriers[0]
        await _close(pipes[:1])
        await _until(lambda: len(carrier.sessions) == STREAMS - 1, "the ended stream's session to go")
        assert await _all_round_trip(pipes[1:]) == [True] * (STREAMS - 1)
        assert pool.carriers == [carrier] and not carrier.closed

    with EchoServer() as echo, v2ray_server("vmess", mux=True) as peer:
        run(_with_streams(_mux_leaf(peer), echo, STREAMS, body)())


def test_killing_the_carrier_ends_all_fifty_streams_with_one_error(run, caplog) -> None:
    async def body(pool: MuxPool, pipes: list[Pipe]) -> None:
        assert await _all_round_trip(pipes) == [True] * STREAMS
        carrier = pool.carriers[0]
        streams = list(carrier.streams.values())
        assert len(streams) == STREAMS
        caplog.clear()
        carrier.channel.abort()  # the physical connection dies under the 50 streams
        for reader, _ in pipes:
            assert await asyncio.wait_for(reader.read(), STEP) == b""
        errors = {id(s.error) for s in streams}
        assert len(errors) == 1 and isinstance(streams[0].error, MuxError)
        failures = [
            r for r in caplog.records if r.name == "honk.outbound.mux" and "carrier failed" in r.message
        ]
        assert len(failures) == 1 and f"streams={STREAMS}" in failures[0].getMessage()
        assert pool.carrier_count == 0 and leaf.runtime.open_resources == 0

    caplog.set_level(logging.INFO, logger="honk.outbound.mux")
    with EchoServer() as echo, v2ray_server("vmess", mux=True) as peer:
        leaf = _mux_leaf(peer)
        run(_with_streams(leaf, echo, STREAMS, body)())


def test_a_carrier_without_streams_closes_after_the_idle_timeout(run) -> None:
    clock = FakeClock(wall_offset=time.time() - 1000.0)  # VMess headers carry the wall time v2ray checks

    async def body(pool: MuxPool, pipes: list[Pipe]) -> None:
        assert await _all_round_trip(pipes) == [True]
        carrier = pool.carriers[0]
        await _close(pipes)
        await _until(lambda: carrier.sessions.idle, "the carrier to have no session")
        clock.advance(MUX_IDLE_TIMEOUT - 1)
        assert pool.carrier_count == 1 and not carrier.closed
        clock.advance(1)
        assert pool.carrier_count == 0 and carrier.closed
        await _until(lambda: peer.carriers() == 0, "v2ray to see the carrier close")

    with EchoServer() as echo, v2ray_server("vmess", mux=True) as peer:
        leaf = _mux_leaf(peer, clock)
        run(_with_streams(leaf, echo, 1, body)())


def test_a_node_held_warm_keeps_its_idle_carrier_until_its_last_owner_lets_go(run) -> None:
    from honk.outbound.runtime import WarmOwner

    clock = FakeClock(wall_offset=time.time() - 1000.0)

    async def body(pool: MuxPool, pipes: list[Pipe]) -> None:
        runtime = pool.runtime
        runtime.hold(WarmOwner.SELECTOR_PIN)  # a Selector's choice: its session is kept
        assert await _all_round_trip(pipes) == [True]
        carrier = pool.carriers[0]
        await _close(pipes)
        await _until(lambda: carrier.sessions.idle, "the carrier to have no session")
        clock.advance(3 * MUX_IDLE_TIMEOUT)
        assert pool.carriers == [carrier] and not carrier.closed  # idle, but warm
        assert runtime.let_go(WarmOwner.SELECTOR_PIN)  # the last owner: future reuse drains
        assert carrier.closed and pool.carrier_count == 0
        await _until(lambda: peer.carriers() == 0, "v2ray to see the carrier close")

    with EchoServer() as echo, v2ray_server("vmess", mux=True) as peer:
        leaf = _mux_leaf(peer, clock)
        run(_with_streams(leaf, echo, 1, body)())


def test_the_last_owner_letting_go_retires_a_busy_carrier_without_cutting_its_flow(run) -> None:
    from honk.outbound.runtime import WarmOwner

    async def body(pool: MuxPool, pipes: list[Pipe]) -> None:
        runtime = pool.runtime
        runtime.hold(WarmOwner.SELECTOR_PIN)
        runtime.hold(WarmOwner.UDP_WARM)
        carrier = pool.carriers[0]
        assert not runtime.let_go(WarmOwner.SELECTOR_PIN)  # the other owner keeps the shared pool
        assert pool.carriers == [carrier] and carrier.usable
        assert runtime.let_go(WarmOwner.UDP_WARM)  # the last one: future reuse drains
        assert carrier.retired and not carrier.closed  # no new flow on it, the live one goes on
        assert await _all_round_trip(pipes) == [True]
        await _close(pipes)
        await _until(lambda: carrier.closed, "the retired carrier to close once its flow ended")

    with EchoServer() as echo, v2ray_server("vmess", mux=True) as peer:
        run(_with_streams(_mux_leaf(peer), echo, 1, body)())


def test_full_carriers_open_another_with_no_per_node_cap_until_the_process_carrier_gate_refuses(
    run, monkeypatch
) -> None:
    """GH-J-06: the process carrier gate alone bounds a node's carriers (no per-node limit: honk
    once stopped at four); the carrier beyond the gate waits and is refused at its deadline."""
    per_carrier, gate = 2, 6
    monkeypatch.setattr(mux, "MAX_STREAMS_PER_CARRIER", per_carrier)
    gates = ProcessGates(dial_gate=64, carrier_gate=gate)
    monkeypatch.setattr(admission, "_process_gates", gates)
    full = per_carrier * gate
    clock = FakeClock(wall_offset=time.time() - 1000.0)  # VMess headers carry the wall time v2ray checks

    async def body(pool: MuxPool, pipes: list[Pipe]) -> None:
        assert await _all_round_trip(pipes) == [True] * full
        assert pool.carrier_count == gate > 4 and gates.carriers_in_use == gate
        beyond = asyncio.ensure_future(_open(leaf, echo))
        await _until(lambda: gates.carriers_waiting == 1, "the carrier beyond the gate to wait for a permit")
        clock.advance(STEP)
        with pytest.raises(CapacityRefused):
            await beyond
        assert peer.carriers() == gate

    with EchoServer() as echo, v2ray_server("vmess", mux=True) as peer:
        leaf = _mux_leaf(peer, clock)
        run(_with_streams(leaf, echo, full, body)())


def test_closing_the_node_runtime_closes_its_carriers(run) -> None:
    async def body(pool: MuxPool, pipes: list[Pipe]) -> None:
        assert await _all_round_trip(pipes) == [True, True]
        carrier = pool.carriers[0]
        leaf.runtime.close()
        assert carrier.closed and pool.carrier_count == 0
        for reader, _ in pipes:
            assert await asyncio.wait_for(reader.read(), STEP) == b""
        await _until(lambda: peer.carriers() == 0, "v2ray to see the carrier close")

    with EchoServer() as echo, v2ray_server("vmess", mux=True) as peer:
        leaf = _mux_leaf(peer)
        run(_with_streams(leaf, echo, 2, body)())


def test_purging_a_dead_node_retires_its_busy_carrier_without_cutting_its_streams(run) -> None:
    """The alive→dead purge: streams on the carrier keep working, a new dial gets a new carrier,
    and the retired carrier closes once its last stream ends."""

    async def body(pool: MuxPool, pipes: list[Pipe]) -> None:
        old = pool.carriers[0]
        assert leaf.runtime.purge() == 1
        assert old.retired and not old.closed
        assert await _all_round_trip(pipes) == [True, True]  # live flows are never cut
        fresh = await _open(leaf, echo)
        try:
            assert pool.carrier_count == 2 and pool.carriers[1] is not old
            assert await _round_trip(fresh, b"new flow") is True
        finally:
            await _close([fresh])
        await _close(pipes)
        await _until(lambda: old.closed, "the retired carrier to close after its last stream")

    with EchoServer() as echo, v2ray_server("vmess", mux=True) as peer:
        leaf = _mux_leaf(peer)
        run(_with_streams(leaf, echo, 2, body)())
