"""A reload that changes or removes a Mux.Cool node retires its runtime instead of closing it
(issue 33, item 6): the busy carrier's streams run on under ``keep``, the carrier takes no new
stream and closes after its last one, what is idle closes at once, and a drain policy that ends
flows (``close``, ``close_after``) ends them when it says. In-memory carriers that echo every
stream, a FakeClock, and the plane, tracker and drainer the daemon uses."""

from __future__ import annotations

import asyncio
import base64
import json
import socket

import pytest

import honk.outbound.mux as mux
from honk.config.links import parse_node_link
from honk.config.policies import CLOSE, close_after
from honk.config.spec import Spec
from honk.connection.plane import Plane, build_plane
from honk.connection.tracker import ConnectionTracker
from honk.control.drain import Drainer
from honk.core.clock import FakeClock
from honk.core.errors import HonkError
from honk.core.net import Address, Network
from honk.outbound import admission
from honk.outbound.admission import ProcessGates
from honk.outbound.mux import MuxStream, pool_for
from honk.proto.mux import MuxDecoder, MuxFrame, SessionStatus, encode_frame

TARGET = Address("192.0.2.80", 80)
VMESS_ID = "b831381d-6324-4d53-ad4f-8cda48b30811"
NODE = "m"
LATER = 600.0  # fake seconds: a dial deadline the tests never reach
GRACE = 5.0  # fake seconds of a close_after drain
GATE = 8  # carrier permits of the tests' own process gate
TURNS = 20  # loop turns an in-memory exchange may take


class EchoCarrier:
    """The server side of one carrier in memory: every stream's data comes back on it, an End is
    answered with an End, and the carrier ends when honk aborts it."""

    def __init__(self) -> None:
        self._decoder = MuxDecoder()
        self._inbox: asyncio.Queue[bytes] = asyncio.Queue()
        self.aborted = False

    async def receive(self) -> bytes:
        return await self._inbox.get()

    def write(self, data: bytes) -> None:
        for frame in self._decoder.feed(data):
            if frame.status in (SessionStatus.NEW, SessionStatus.KEEP) and frame.data:
                self._inbox.put_nowait(
                    encode_frame(MuxFrame(frame.session_id, SessionStatus.KEEP, frame.data))
                )
            elif frame.status is SessionStatus.END:
                self._inbox.put_nowait(encode_frame(MuxFrame(frame.session_id, SessionStatus.END)))

    async def drain(self) -> None:
        pass

    def write_eof(self) -> None:
        pass

    def close(self) -> None:
        self.abort()

    def abort(self) -> None:
        if not self.aborted:
            self.aborted = True
            self._inbox.put_nowait(b"")  # the reader sees EOF (it is cancelled first anyway)


class Opener:
    """Opens EchoCarriers; ``gate`` holds a dial in flight while the test reloads."""

    def __init__(self) -> None:
        self.carriers: list[EchoCarrier] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def __call__(self, deadline: float) -> EchoCarrier:
        await self.gate.wait()
        carrier = EchoCarrier()
        self.carriers.append(carrier)
        return carrier


class StreamFlow:
    """A tracked flow over one mux stream, as the tracker sees a relay: closing it closes the stream."""

    bytes_up = bytes_down = 0
    last_activity = 0.0

    def __init__(self, stream: MuxStream) -> None:
        self.stream = stream

    def close(self, reason: HonkError | None = None) -> None:
        self.stream.close()


def _mux_node(link_name: str = NODE, cipher: str = "aes-128-gcm"):
    body = {
        "v": "2",
        "ps": link_name,
        "add": "127.0.0.1",
        "port": "10086",
        "id": VMESS_ID,
        "aid": "0",
        "scy": cipher,
        "net": "tcp",
        "type": "none",
        "tls": "",
        "mux": "1",
    }
    return parse_node_link("vmess://" + base64.b64encode(json.dumps(body).encode()).decode(), link_name)


def _plane(clock: FakeClock, generation: int, previous: Plane | None = None, *nodes) -> Plane:
    return build_plane(Spec(nodes=tuple(nodes)), clock, generation, previous)


async def _turns(n: int = TURNS) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def _echoes(stream: MuxStream, payload: bytes) -> bool:
    stream.write(payload)
    got = b""
    for _ in range(TURNS):
        got += await asyncio.wait_for(stream.receive(), 1.0)
        if len(got) >= len(payload):
            break
    return got == payload


@pytest.fixture
def gate(monkeypatch) -> ProcessGates:
    fresh = ProcessGates(dial_gate=64, carrier_gate=GATE)
    monkeypatch.setattr(admission, "_process_gates", fresh)
    return fresh


@pytest.fixture
def one_stream_carriers(monkeypatch) -> None:
    """One stream fills a carrier, so a second stream opens a second carrier."""
    monkeypatch.setattr(mux, "MAX_STREAMS_PER_CARRIER", 1)


async def test_a_reload_that_removes_the_node_keeps_the_busy_carrier_until_its_last_stream_ends(
    gate, one_stream_carriers
):
    clock, opener = FakeClock(), Opener()
    first = _plane(clock, 1, None, _mux_node())
    runtime, pool = first.outbounds[NODE].runtime, pool_for(first.outbounds[NODE])
    busy = await pool.open_stream(opener, TARGET, clock.now() + LATER)
    spare = await pool.open_stream(opener, TARGET, clock.now() + LATER)
    spare.close()  # its carrier is idle now, waiting out MUX_IDLE_TIMEOUT
    await _turns()
    assert pool.carrier_count == 2 and gate.carriers_in_use == 2
    assert await _echoes(busy, b"before the reload")

    second = _plane(clock, 2, first)  # the node is gone
    assert second.retire(first) == 1
    assert runtime.closed and runtime.retiring
    assert opener.carriers[1].aborted and pool.carrier_count == 1  # the idle carrier went at once
    assert busy.carrier.retired and not busy.carrier.closed
    assert await _echoes(busy, b"after the reload")  # the flow runs on under keep
    assert pool.with_room() is None  # the retired carrier takes no new stream

    busy.close()  # the flow ends on its own
    await _turns()
    assert busy.carrier.closed and opener.carriers[0].aborted
    assert pool.carrier_count == 0 and gate.carriers_in_use == 0
    assert runtime.open_resources == 0 and clock.sleepers == 0  # no carrier, permit or timer left


async def test_a_new_flow_after_the_reload_opens_a_new_carrier_not_the_retired_one(gate):
    clock, opener = FakeClock(), Opener()
    first = _plane(clock, 1, None, _mux_node())
    old_pool = pool_for(first.outbounds[NODE])
    old = await old_pool.open_stream(opener, TARGET, clock.now() + LATER)
    # the node's dial shape changed (another cipher): a new NodeId, a new runtime, a new pool
    second = _plane(clock, 2, first, _mux_node(cipher="chacha20-poly1305"))
    second.retire(first)
    new_pool = pool_for(second.outbounds[NODE])
    assert new_pool is not old_pool
    new = await new_pool.open_stream(opener, TARGET, clock.now() + LATER)
    assert new.carrier is not old.carrier and len(opener.carriers) == 2
    assert len(old.carrier.sessions) == 1  # the retired carrier still carries only its own flow
    assert await _echoes(old, b"old") and await _echoes(new, b"new")

    # removed and added back: the same NodeId again, still a fresh runtime and carrier
    third = _plane(clock, 3, second)
    third.retire(second)
    fourth = _plane(clock, 4, third, _mux_node())
    fourth.retire(third)
    back = await pool_for(fourth.outbounds[NODE]).open_stream(opener, TARGET, clock.now() + LATER)
    assert back.carrier not in (old.carrier, new.carrier)
    for stream in (old, new, back):
        stream.close()
    await _turns()
    assert old.carrier.closed and new.carrier.closed  # retired: closed after their last stream
    assert not back.carrier.closed and gate.carriers_in_use == 1  # in service: idle until its timeout
    fourth.outbounds[NODE].runtime.close()
    assert gate.carriers_in_use == 0


async def test_a_flow_still_dialling_when_the_node_retires_gets_a_carrier_that_closes_after_it(gate):
    clock, opener = FakeClock(), Opener()
    first = _plane(clock, 1, None, _mux_node())
    leaf = first.outbounds[NODE]
    opener.gate.clear()  # the carrier's dial is in flight
    dialling = asyncio.ensure_future(pool_for(leaf).open_stream(opener, TARGET, clock.now() + LATER))
    await _turns()
    _plane(clock, 2, first).retire(first)
    opener.gate.set()
    stream = await asyncio.wait_for(dialling, 1.0)
    assert stream.carrier.retired and await _echoes(stream, b"late but kept")
    stream.close()
    await _turns()
    assert stream.carrier.closed and gate.carriers_in_use == 0

    # warm-up opening a carrier for the retired node meanwhile: nothing adopts it, it closes
    assert await pool_for(leaf).ensure_carrier(opener, clock.now() + LATER)
    await _turns()
    assert opener.carriers[-1].aborted and gate.carriers_in_use == 0


def _tracked(tracker: ConnectionTracker, stream: MuxStream, version: str):
    return tracker.open(
        StreamFlow(stream),
        network=Network.TCP,
        inbound="lan",
        source=Address("127.0.0.1", 1),
        target=TARGET,
        rule="final",
        chain=(NODE,),
        plane_generation=1,
        outbound_version=version,
    )


async def test_a_close_drain_ends_the_flow_at_the_reload_and_the_carrier_with_it(gate):
    clock, opener = FakeClock(), Opener()
    tracker = ConnectionTracker(clock)
    drainer = Drainer(tracker, clock)
    first = _plane(clock, 1, None, _mux_node())
    stream = await pool_for(first.outbounds[NODE]).open_stream(opener, TARGET, clock.now() + LATER)
    flow = _tracked(tracker, stream, "m@v1")
    _plane(clock, 2, first).retire(first)
    assert await _echoes(stream, b"retired, not cut")  # the runtime's retirement cuts nothing itself
    drainer.drain("m@v1", CLOSE)  # the reload's Drain step, after the plane is published
    await _turns()
    assert flow.closing and stream.carrier.closed and gate.carriers_in_use == 0


async def test_a_close_after_drain_ends_the_flow_at_its_grace_and_not_before(gate):
    clock, opener = FakeClock(), Opener()
    tracker = ConnectionTracker(clock)
    drainer = Drainer(tracker, clock)
    first = _plane(clock, 1, None, _mux_node())
    stream = await pool_for(first.outbounds[NODE]).open_stream(opener, TARGET, clock.now() + LATER)
    _tracked(tracker, stream, "m@v1")
    _plane(clock, 2, first).retire(first)
    drainer.drain("m@v1", close_after(GRACE))
    await _turns()
    clock.advance(GRACE / 2)
    await _turns()
    assert not stream.carrier.closed and await _echoes(stream, b"within the grace")
    clock.advance(GRACE / 2)
    await _turns()
    assert stream.carrier.closed and gate.carriers_in_use == 0 and drainer.pending == 0


async def test_closing_a_retired_runtime_ends_what_its_retirement_left_running(gate):
    clock, opener = FakeClock(), Opener()
    first = _plane(clock, 1, None, _mux_node())
    runtime = first.outbounds[NODE].runtime
    stream = await pool_for(first.outbounds[NODE]).open_stream(opener, TARGET, clock.now() + LATER)
    runtime.ready.deposit(socket.socket(), clock.now())  # a warm connection: closed by the retirement
    assert runtime.retire() == 2  # the ready connection closed, the busy carrier retired
    assert runtime.ready.entries == 0 and not stream.carrier.closed
    runtime.close()
    assert stream.carrier.closed and not runtime.retiring and gate.carriers_in_use == 0
