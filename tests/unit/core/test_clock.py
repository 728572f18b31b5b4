import asyncio

import pytest

from honk.core.clock import FakeClock, MonotonicClock, timeout_at


async def _armed(clock: FakeClock, n: int) -> None:
    while clock.sleepers < n:
        await asyncio.sleep(0)


async def test_fake_timers_fire_in_deadline_order_and_cancelled_ones_never():
    clock, fired = FakeClock(), []
    clock.call_later(2.0, lambda: fired.append("b"))
    clock.call_later(1.0, lambda: fired.append("a"))
    clock.call_later(1.5, lambda: fired.append("x")).cancel()
    assert clock.sleepers == 2
    clock.advance(1.0)
    assert fired == ["a"]
    clock.advance(5.0)
    assert fired == ["a", "b"] and clock.sleepers == 0


async def test_fake_sleep_wakes_exactly_at_its_deadline():
    clock = FakeClock()
    sleeper = asyncio.ensure_future(clock.sleep(3.0))
    await _armed(clock, 1)
    clock.advance(2.999)
    await asyncio.sleep(0)
    assert not sleeper.done()
    clock.advance(0.001)
    await sleeper


async def test_timeout_at_raises_timeout_error_at_the_deadline_and_cancels_the_block():
    clock, cancelled = FakeClock(), asyncio.Event()

    async def body():
        async with timeout_at(clock, clock.now() + 5.0) as scope:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.set()
                raise
        return scope

    task = asyncio.ensure_future(body())
    await _armed(clock, 1)
    clock.advance(5.0)
    with pytest.raises(TimeoutError):
        await task
    assert cancelled.is_set() and clock.sleepers == 0


async def test_timeout_at_leaves_a_block_that_finishes_in_time_alone():
    clock = FakeClock()
    async with timeout_at(clock, clock.now() + 1.0) as scope:
        await asyncio.sleep(0)
    assert not scope.expired and clock.sleepers == 0


async def test_timeout_at_does_not_turn_an_outside_cancel_into_a_timeout():
    clock = FakeClock()

    async def body():
        async with timeout_at(clock, clock.now() + 10.0):
            await asyncio.Event().wait()

    task = asyncio.ensure_future(body())
    await _armed(clock, 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_timeout_at_with_a_past_deadline_times_out_at_the_first_await():
    clock = FakeClock()
    with pytest.raises(TimeoutError):
        async with timeout_at(clock, clock.now() - 1.0):
            await asyncio.Event().wait()


async def test_monotonic_clock_timer_runs_on_the_loop():
    done = asyncio.Event()
    MonotonicClock().call_later(0.0, done.set)
    await asyncio.wait_for(done.wait(), 5)
