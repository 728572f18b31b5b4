"""UDP over Mux.Cool (honk.outbound.mux_udp) on an in-memory carrier: the frames one association
sends, what a server End of one session does, and the carrier's loss, without sockets."""

from __future__ import annotations

import asyncio

import pytest

from honk.core.clock import FakeClock
from honk.core.errors import HonkError
from honk.core.net import Address, Network
from honk.outbound.mux import MuxPool
from honk.outbound.mux_udp import MuxDatagramEndpoint
from honk.outbound.stream_datagram import MAX_PENDING_PER_STREAM
from honk.proto.mux import MuxDecoder, MuxFrame, SessionStatus, encode_frame

DNS = Address("192.0.2.53", 53)
OTHER = Address("198.51.100.9", 5353)


class MemoryCarrier:
    """The server's side of one carrier, in memory: it decodes what honk writes and sends frames back."""

    def __init__(self) -> None:
        self.frames: list[MuxFrame] = []
        self._decoder = MuxDecoder()
        self._inbox: asyncio.Queue[bytes | BaseException] = asyncio.Queue()
        self.aborted = False

    # -- the Channel honk's carrier reads and writes ---------------------------------

    async def receive(self) -> bytes:
        item = await self._inbox.get()
        if isinstance(item, BaseException):
            raise item
        return item

    def write(self, data: bytes) -> None:
        self.frames += self._decoder.feed(data)

    async def drain(self) -> None:
        pass

    def write_eof(self) -> None:
        pass

    def close(self) -> None:
        self.aborted = True

    def abort(self) -> None:
        self.aborted = True

    # -- the server ------------------------------------------------------------------

    def reply(self, frame: MuxFrame) -> None:
        self._inbox.put_nowait(encode_frame(frame))

    def break_(self, error: BaseException) -> None:
        self._inbox.put_nowait(error)


class Opener:
    """Opens MemoryCarriers, each only when the test lets it."""

    def __init__(self) -> None:
        self.carriers: list[MemoryCarrier] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def __call__(self, deadline: float) -> MemoryCarrier:
        await self.gate.wait()
        carrier = MemoryCarrier()
        self.carriers.append(carrier)
        return carrier


async def _sent(pool: MuxPool, *targets: Address) -> tuple[MuxDatagramEndpoint, MemoryCarrier, list, list]:
    """An association on one open carrier with a datagram sent to each of ``targets``; its
    endpoint, the carrier's server side, the replies it delivered and its losses."""
    opener, got, lost = Opener(), [], []
    await pool.acquire(opener, 10.0)
    endpoint = _endpoint(pool, opener, got, lost)
    for index, target in enumerate(targets):
        endpoint.send(b"q%d" % index, target)
    return endpoint, opener.carriers[0], got, lost


def _endpoint(pool: MuxPool, opener: Opener, got: list, lost: list) -> MuxDatagramEndpoint:
    return MuxDatagramEndpoint(
        "node",
        pool,
        opener,
        lambda: pool.clock.now() + 10.0,
        lambda data, source: got.append((data, source)),
        lost.append,
    )


async def _turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


@pytest.fixture
def pool():
    made = MuxPool("node", FakeClock())
    yield made
    made.close()


async def test_datagrams_sent_before_the_carrier_is_there_wait_then_go_first_in_the_new_frame(pool):
    opener, got, lost = Opener(), [], []
    opener.gate.clear()  # the carrier's server is slow to answer
    endpoint = _endpoint(pool, opener, got, lost)
    for i in range(MAX_PENDING_PER_STREAM + 2):
        endpoint.send(b"q%d" % i, DNS)
    assert endpoint.dropped == 2  # past the queue of a session still opening
    opener.gate.set()
    await _turns()
    frames = opener.carriers[0].frames
    assert frames[0].status is SessionStatus.NEW and frames[0].network is Network.UDP
    assert (frames[0].target, frames[0].data) == (DNS, b"q0")
    assert [(f.status, f.target, f.data) for f in frames[1:]] == [
        (SessionStatus.KEEP, DNS, b"q%d" % i) for i in range(1, MAX_PENDING_PER_STREAM)
    ]
    assert endpoint.sessions == 1 and not lost


async def test_a_reply_is_delivered_from_the_peer_its_frame_names_else_from_the_sessions_target(pool):
    endpoint, carrier, got, lost = await _sent(pool, DNS)
    sid = carrier.frames[0].session_id
    carrier.reply(MuxFrame(sid, SessionStatus.KEEP, b"plain"))
    carrier.reply(MuxFrame(sid, SessionStatus.KEEP, b"named", network=Network.UDP, target=OTHER))
    await _turns()
    assert got == [(b"plain", DNS), (b"named", OTHER)]
    assert pool.opened == 1  # the carrier with room served the new session at once


async def test_a_server_end_of_one_session_ends_only_it_and_the_next_datagram_opens_another(pool):
    endpoint, carrier, _, lost = await _sent(pool, DNS, OTHER)
    first = carrier.frames[0].session_id
    carrier.reply(MuxFrame(first, SessionStatus.END, error=True))  # the server reset DNS's session
    await _turns()
    assert not endpoint.closed and not lost and endpoint.sessions == 1
    endpoint.send(b"c", DNS)
    new = carrier.frames[-1]
    assert (new.status, new.target, new.data) == (SessionStatus.NEW, DNS, b"c") and new.session_id != first


async def test_the_carriers_loss_ends_the_association_once_with_the_carriers_error(pool):
    endpoint, carrier, _, lost = await _sent(pool, DNS, OTHER)
    carrier.reply(MuxFrame(0, SessionStatus.KEEP_ALIVE))  # a keep-alive changes nothing
    carrier.break_(ConnectionResetError("reset by peer"))
    await _turns()
    assert endpoint.closed and len(lost) == 1 and isinstance(lost[0], HonkError)
    assert lost[0].reason == "carrier-lost"
    endpoint.send(b"late", DNS)
    assert endpoint.dropped == 1 and len(lost) == 1


async def test_closing_the_association_ends_its_sessions_and_leaves_the_carrier_to_the_node(pool):
    endpoint, carrier, _, lost = await _sent(pool, DNS)
    endpoint.close()
    end = carrier.frames[-1]
    assert (end.status, end.error) == (SessionStatus.END, True)
    assert lost == [None] and pool.carrier_count == 1 and pool.carriers[0].idle
