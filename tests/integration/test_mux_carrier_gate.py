"""Mux.Cool carriers and the process carrier gate (GH-J-06) against a real v2ray VLESS server.

Each physical carrier holds one carrier permit from the moment it is dialled until it is
torn down, idle phases included; a carrier beyond the gate waits for a permit and is a
local capacity refusal when its dial deadline passes first. The tests swap in their own
small process gates so that counts start from zero.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import pytest
from helpers.engines import poll
from helpers.inprocess import leaf_from_link
from helpers.peerservers import v2ray_server
from helpers.servers import EchoServer

import honk.outbound.mux as mux
from honk.core.clock import FakeClock
from honk.core.errors import CapacityRefused
from honk.core.net import Address
from honk.outbound import admission
from honk.outbound.admission import ProcessGates
from honk.outbound.mux import MUX_IDLE_TIMEOUT, MuxPool, pool_for

STEP = 10.0  # seconds: the bound on any one exchange or poll (real time)
LATER = 600.0  # fake seconds: a dial deadline the tests never reach unless they mean to
POLL = 0.01  # seconds between checks of a polled condition

Pipe = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@pytest.fixture
def gates(monkeypatch) -> Callable[[int], ProcessGates]:
    """Install fresh process gates with a carrier gate of the given size."""

    def install(carrier_gate: int) -> ProcessGates:
        fresh = ProcessGates(dial_gate=64, carrier_gate=carrier_gate)
        monkeypatch.setattr(admission, "_process_gates", fresh)
        return fresh

    return install


def _vless_mux_leaf(peer, clock: FakeClock, monkeypatch):
    if peer.ca_path is not None:
        monkeypatch.setenv("SSL_CERT_FILE", str(peer.ca_path))
    leaf = leaf_from_link(peer.share_link(), clock=clock, params=(("mux", "1"),))
    assert leaf.mux and leaf.runtime is not None
    return leaf


async def _open(leaf, echo: EchoServer, deadline: float) -> Pipe:
    dialed = await leaf.dial_tcp(Address("127.0.0.1", echo.port), deadline)
    return await asyncio.open_connection(sock=dialed.sock)


async def _echoes(pipe: Pipe, payload: bytes) -> bool:
    reader, writer = pipe
    writer.write(payload)
    return await asyncio.wait_for(reader.readexactly(len(payload)), STEP) == payload


async def _close(pipe: Pipe) -> None:
    _, writer = pipe
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()


def test_a_carrier_holds_its_permit_while_idle_and_gives_it_back_when_it_closes(
    run, gates, monkeypatch
) -> None:
    clock = FakeClock(wall_offset=time.time() - 1000.0)
    gate = gates(4)

    async def main() -> None:
        leaf = _vless_mux_leaf(peer, clock, monkeypatch)
        pool = pool_for(leaf)
        pipe = await _open(leaf, echo, clock.now() + LATER)
        try:
            assert await _echoes(pipe, b"through the carrier")
            carrier = pool.carriers[0]
            assert gate.carriers_in_use == 1 and carrier.permit is not None
        finally:
            await _close(pipe)
        await poll(lambda: carrier.sessions.idle, "the carrier to have no session")
        clock.advance(MUX_IDLE_TIMEOUT - 1)
        assert not carrier.closed and gate.carriers_in_use == 1  # idle, still holding its permit
        clock.advance(1)
        assert carrier.closed and pool.carrier_count == 0
        assert gate.carriers_in_use == 0 and carrier.permit.released
        await poll(lambda: peer.carriers() == 0, "v2ray to see the carrier close")

    with EchoServer() as echo, v2ray_server("vless", mux=True) as peer:
        run(main())


def test_a_carrier_beyond_the_gate_waits_is_refused_at_its_deadline_and_gets_a_freed_permit(
    run, gates, monkeypatch
) -> None:
    clock = FakeClock(wall_offset=time.time() - 1000.0)
    gate = gates(1)
    monkeypatch.setattr(mux, "MAX_STREAMS_PER_CARRIER", 1)  # every second stream needs another carrier

    async def main() -> None:
        leaf = _vless_mux_leaf(peer, clock, monkeypatch)
        pool: MuxPool = pool_for(leaf)
        first = await _open(leaf, echo, clock.now() + LATER)
        assert await _echoes(first, b"first")
        old = pool.carriers[0]

        refused = asyncio.ensure_future(_open(leaf, echo, clock.now() + 5.0))
        await poll(lambda: gate.carriers_waiting == 1, "the second carrier to wait for a permit")
        clock.advance(5.0)
        with pytest.raises(CapacityRefused):
            await refused
        assert gate.carriers_waiting == 0 and pool.carrier_count == 1 and peer.carriers() == 1

        waiting = asyncio.ensure_future(_open(leaf, echo, clock.now() + LATER))
        await poll(lambda: gate.carriers_waiting == 1, "the third carrier to wait for a permit")
        await _close(first)
        await poll(lambda: old.sessions.idle, "the first carrier to have no session")
        assert not waiting.done() and gate.carriers_in_use == 1
        clock.advance(MUX_IDLE_TIMEOUT)  # the idle carrier closes and its permit passes on
        second = await asyncio.wait_for(waiting, STEP)
        try:
            assert await _echoes(second, b"second")
            assert old.closed and pool.carrier_count == 1 and pool.carriers[0] is not old
            assert gate.carriers_in_use == 1 and gate.carriers_waiting == 0
        finally:
            await _close(second)
            pool.close()
        assert gate.carriers_in_use == 0

    with EchoServer() as echo, v2ray_server("vless", mux=True) as peer:
        run(main())


def test_a_killed_carrier_gives_its_permit_back_once(run, gates, monkeypatch) -> None:
    clock = FakeClock(wall_offset=time.time() - 1000.0)
    gate = gates(2)

    async def main() -> None:
        leaf = _vless_mux_leaf(peer, clock, monkeypatch)
        pool = pool_for(leaf)
        pipe = await _open(leaf, echo, clock.now() + LATER)
        try:
            assert await _echoes(pipe, b"before the kill")
            carrier = pool.carriers[0]
            other = await gate.carrier_permit(clock.now() + 1.0, clock=clock)  # someone else's carrier
            assert gate.carriers_in_use == 2
            carrier.channel.abort()  # the physical connection dies
            await poll(lambda: carrier.closed, "the carrier to fail")
            assert gate.carriers_in_use == 1
            carrier.close()
            pool.discard(carrier)  # teardown again: the permit is not given back twice
            assert gate.carriers_in_use == 1
            other.release()
            assert gate.carriers_in_use == 0
        finally:
            await _close(pipe)

    with EchoServer() as echo, v2ray_server("vless", mux=True) as peer:
        run(main())


def test_a_carrier_dial_that_fails_gives_its_permit_back(run, gates) -> None:
    clock = FakeClock()
    gate = gates(1)

    async def refuse(deadline: float):
        raise ConnectionRefusedError("no carrier today")

    async def main() -> None:
        pool = MuxPool("node", clock)
        with pytest.raises(ConnectionRefusedError):
            await pool.open_stream(refuse, Address("127.0.0.1", 9), clock.now() + LATER)
        assert gate.carriers_in_use == 0 and pool.carrier_count == 0
        permit = await gate.carrier_permit(clock.now() + 1.0, clock=clock)  # the only slot is free again
        permit.release()

    run(main())
