"""ConnectionTracker: the live-connection table, driven by FakeClock."""

from __future__ import annotations

import asyncio

import pytest
from helpers.tracking import FakeHandle

from honk.connection.tracker import ConnectionInfo, ConnectionTracker
from honk.core.clock import FakeClock
from honk.core.errors import FlowClosed, HalfCloseTimeout, IdleTimeout
from honk.core.net import Address, Network


def _open(
    tracker: ConnectionTracker, handle: FakeHandle, network: Network = Network.TCP, rule: str = "fallback"
):
    return tracker.open(
        handle,
        network=network,
        inbound="lan",
        source=Address("127.0.0.1", 50000),
        target=Address("example.com", 443),
        rule=rule,
        chain=("proxy", "hk1"),
        plane_generation=3,
    )


def test_tracker_snapshot_lists_open_flow_with_its_fields_and_live_counters() -> None:
    clock = FakeClock()
    tracker = ConnectionTracker(clock)
    handle = FakeHandle(clock)
    flow = _open(tracker, handle)
    handle.bytes_up, handle.bytes_down = 10, 20

    [info] = tracker.snapshot()

    assert info == ConnectionInfo(
        id=flow.id,
        network=Network.TCP,
        inbound="lan",
        source=Address("127.0.0.1", 50000),
        target=Address("example.com", 443),
        rule="fallback",
        chain=("proxy", "hk1"),
        upload=10,
        download=20,
        start=clock.wall(),
        plane_generation=3,
    )
    assert len(tracker) == 1
    assert tracker.get(flow.id) == info


def test_tracker_snapshot_is_an_immutable_copy() -> None:
    clock = FakeClock()
    tracker = ConnectionTracker(clock)
    handle = FakeHandle(clock)
    _open(tracker, handle)
    [before] = tracker.snapshot()

    handle.bytes_up = 99

    assert before.upload == 0
    with pytest.raises(AttributeError):
        before.upload = 5  # type: ignore[misc]


def test_tracker_ids_are_unique_uuid4_strings() -> None:
    clock = FakeClock()
    tracker = ConnectionTracker(clock)
    ids = {_open(tracker, FakeHandle(clock)).id for _ in range(50)}

    assert len(ids) == 50
    assert all(len(i) == 36 and i[14] == "4" for i in ids)


def test_tracker_release_removes_the_flow_and_is_idempotent() -> None:
    clock = FakeClock()
    tracker = ConnectionTracker(clock)
    flow = _open(tracker, FakeHandle(clock))

    flow.release()
    flow.release()

    assert tracker.snapshot() == []
    assert tracker.get(flow.id) is None
    assert len(tracker) == 0


def test_tracker_close_by_id_reaches_the_handle_with_flow_closed() -> None:
    clock = FakeClock()
    tracker = ConnectionTracker(clock)
    handle = FakeHandle(clock)
    flow = _open(tracker, handle)

    assert tracker.close(flow.id)
    assert not tracker.close("no-such-id")

    [reason] = handle.closed_with
    assert isinstance(reason, FlowClosed)
    assert len(tracker) == 1  # still listed until the flow itself has ended


def test_tracker_close_all_accepts_a_text_reason() -> None:
    clock = FakeClock()
    tracker = ConnectionTracker(clock)
    handles = [FakeHandle(clock) for _ in range(3)]
    for handle in handles:
        _open(tracker, handle)

    assert tracker.close_all("shutdown") == 3

    assert all(
        isinstance(h.closed_with[0], FlowClosed) and str(h.closed_with[0]) == "shutdown" for h in handles
    )


def test_tracker_sweep_closes_only_flows_silent_past_their_network_timeout() -> None:
    clock = FakeClock()
    tracker = ConnectionTracker(clock)
    tcp_idle, tcp_busy, udp_idle = FakeHandle(clock), FakeHandle(clock), FakeHandle(clock)
    idle_flow = _open(tracker, tcp_idle)
    _open(tracker, tcp_busy)
    udp_flow = _open(tracker, udp_idle, Network.UDP)
    clock.advance(60)
    tcp_busy.last_activity = clock.now()

    closed = tracker.sweep_idle(clock.now(), relay_idle_timeout=300, udp_idle_timeout=60)
    assert closed == [udp_flow.id]
    clock.advance(240)
    closed = tracker.sweep_idle(clock.now(), relay_idle_timeout=300, udp_idle_timeout=60)

    assert closed == [idle_flow.id]
    assert isinstance(tcp_idle.closed_with[0], IdleTimeout)
    assert tcp_busy.closed_with == []
    assert len(udp_idle.closed_with) == 1  # a closing flow is not asked twice


async def test_tracker_sweeper_runs_on_the_clock() -> None:
    clock = FakeClock()
    tracker = ConnectionTracker(clock)
    tracker.relay_idle_timeout = 10
    handle = FakeHandle(clock)
    _open(tracker, handle)
    sweeper = asyncio.ensure_future(tracker.run_sweeper(1.0))
    await asyncio.sleep(0)

    for _ in range(9):
        clock.advance(1.0)
        await asyncio.sleep(0)
    assert handle.closed_with == []
    clock.advance(1.0)
    await asyncio.sleep(0)
    sweeper.cancel()

    assert isinstance(handle.closed_with[0], IdleTimeout)


async def test_tracker_wait_idle_returns_when_the_last_flow_is_released() -> None:
    clock = FakeClock()
    tracker = ConnectionTracker(clock)
    await tracker.wait_idle()  # nothing live: returns at once
    first, second = _open(tracker, FakeHandle(clock)), _open(tracker, FakeHandle(clock))
    waiter = asyncio.ensure_future(tracker.wait_idle())

    first.release()
    await asyncio.sleep(0)
    assert not waiter.done()
    second.release()
    await asyncio.wait_for(waiter, 1)


def test_totals_keep_the_bytes_of_ended_flows_and_count_live_ones_so_far() -> None:
    clock = FakeClock()
    tracker = ConnectionTracker(clock)
    first, second = FakeHandle(clock), FakeHandle(clock)
    ended = _open(tracker, first)
    _open(tracker, second)
    first.bytes_up, first.bytes_down = 100, 1000
    second.bytes_up, second.bytes_down = 5, 50
    assert tracker.totals() == (105, 1050)
    ended.release()
    ended.release()  # idempotent: the bytes are not counted twice
    second.bytes_up = 7
    assert tracker.totals() == (107, 1050)
    assert tracker.opened == 2


# --- the half-close timeout --------------------------------------------------------------------


def test_a_half_closed_flow_silent_for_the_half_close_timeout_is_closed() -> None:
    clock = FakeClock()
    tracker = ConnectionTracker(clock)
    handle = FakeHandle(clock)
    handle.half_closed_at = clock.now()  # the client's FIN went upstream; the server holds its side
    _open(tracker, handle)
    clock.advance(9.9)
    assert tracker.sweep_idle(clock.now(), 300, 60, 10.0) == []
    clock.advance(0.1)
    assert len(tracker.sweep_idle(clock.now(), 300, 60, 10.0)) == 1
    [reason] = handle.closed_with
    assert isinstance(reason, HalfCloseTimeout)
    assert isinstance(reason, FlowClosed)  # honk's own decision: neutral for the node


def test_a_half_closed_flow_that_still_moves_bytes_is_kept() -> None:
    clock = FakeClock()
    tracker = ConnectionTracker(clock)
    handle = FakeHandle(clock)
    handle.half_closed_at = clock.now()  # the client is done; the server is still answering
    _open(tracker, handle)
    for _ in range(5):
        clock.advance(8.0)
        handle.last_activity = clock.now()
        assert tracker.sweep_idle(clock.now(), 300, 60, 10.0) == []
    assert handle.closed_with == []


def test_an_open_flow_only_waits_for_the_idle_timeout_and_zero_turns_the_linger_off() -> None:
    clock = FakeClock()
    tracker = ConnectionTracker(clock)
    open_handle, half_handle = FakeHandle(clock), FakeHandle(clock)
    half_handle.half_closed_at = clock.now()
    _open(tracker, open_handle)
    _open(tracker, half_handle)
    clock.advance(60.0)
    assert tracker.sweep_idle(clock.now(), 300, 60, 0.0) == []
    assert len(tracker.sweep_idle(clock.now(), 300, 60, 10.0)) == 1
    assert open_handle.closed_with == [] and len(half_handle.closed_with) == 1
