"""How many Mux.Cool carriers one node may open (GH-J-06), on in-memory carriers and a FakeClock.

The process carrier gate is authoritative: a node whose carriers are full opens another for as
long as the gate has a permit, with no per-node cap of its own; the carrier beyond the gate
waits for a permit and is a local capacity refusal at its deadline.
"""

from __future__ import annotations

import asyncio

import pytest

import honk.outbound.mux as mux
from honk.core.clock import FakeClock
from honk.core.errors import CapacityRefused
from honk.core.net import Address
from honk.outbound import admission
from honk.outbound.admission import ProcessGates
from honk.outbound.mux import MuxPool

TARGET = Address("192.0.2.80", 80)
GATE = 7  # carrier permits in the process: more than any per-node limit Mux.Cool had (2, or honk's 4)
PER_CARRIER = 2  # streams one carrier takes, so that a few streams fill a carrier
LATER = 600.0  # fake seconds: a deadline the test reaches only on purpose


class SilentCarrier:
    """One carrier's channel in memory: it takes what honk writes and answers nothing."""

    def __init__(self) -> None:
        self._closed = asyncio.Event()
        self.aborted = False

    async def receive(self) -> bytes:
        await self._closed.wait()
        return b""

    def write(self, data: bytes) -> None:
        pass

    async def drain(self) -> None:
        pass

    def write_eof(self) -> None:
        pass

    def close(self) -> None:
        self.abort()

    def abort(self) -> None:
        self.aborted = True
        self._closed.set()


class Opener:
    def __init__(self) -> None:
        self.opened: list[SilentCarrier] = []

    async def __call__(self, deadline: float) -> SilentCarrier:
        carrier = SilentCarrier()
        self.opened.append(carrier)
        return carrier


@pytest.fixture
def gate(monkeypatch) -> ProcessGates:
    fresh = ProcessGates(dial_gate=64, carrier_gate=GATE)
    monkeypatch.setattr(admission, "_process_gates", fresh)
    monkeypatch.setattr(mux, "MAX_STREAMS_PER_CARRIER", PER_CARRIER)
    return fresh


async def _turns(n: int = 10) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_full_carriers_of_one_node_open_more_than_two_bounded_only_by_the_process_carrier_gate(gate):
    clock = FakeClock()
    pool, opener = MuxPool("node", clock), Opener()
    try:
        streams = [
            await pool.open_stream(opener, TARGET, clock.now() + LATER) for _ in range(GATE * PER_CARRIER)
        ]
        assert pool.carrier_count == len(opener.opened) == GATE > 2  # every carrier full, none refused
        assert gate.carriers_in_use == GATE and len({s.carrier for s in streams}) == GATE

        beyond = asyncio.ensure_future(pool.open_stream(opener, TARGET, clock.now() + 5.0))
        await _turns()
        assert not beyond.done() and gate.carriers_waiting == 1  # waits for the gate, not refused by the node
        clock.advance(5.0)
        with pytest.raises(CapacityRefused):
            await beyond
        assert gate.carriers_waiting == 0 and pool.carrier_count == GATE

        waiting = asyncio.ensure_future(pool.open_stream(opener, TARGET, clock.now() + LATER))
        await _turns()
        assert not waiting.done() and gate.carriers_waiting == 1
        streams[0].carrier.close()  # a carrier torn down gives its permit to the waiting one
        stream = await asyncio.wait_for(waiting, 5.0)
        assert pool.carrier_count == GATE and gate.carriers_in_use == GATE
        assert stream.carrier is pool.carriers[-1] and len(opener.opened) == GATE + 1
    finally:
        pool.close()
    assert gate.carriers_in_use == 0
