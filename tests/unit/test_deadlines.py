"""honk.core.clock.Deadlines: many one-shot deadlines on one timer of the injected clock (the SOCKS
fast path's connect deadlines). Driven by a FakeClock: the clock's own timer count shows that one
timer at most is armed, that a stream of flows does not arm one per flow, and that none stays
armed once the last one fired with nothing pending."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from honk.core.clock import DEADLINES_COMPACT, Deadlines, FakeClock


async def test_deadlines_fire_in_order_on_a_single_timer() -> None:
    clock = FakeClock()
    deadlines = Deadlines(clock)
    fired: list[str] = []
    for name, delay in (("c", 3.0), ("a", 1.0), ("b", 2.0)):
        deadlines.at(clock.now() + delay, lambda name=name: fired.append(name))
    assert clock.sleepers == 1 and len(deadlines) == 3
    clock.advance(1.5)
    assert fired == ["a"] and clock.sleepers == 1
    clock.advance(10.0)
    assert fired == ["a", "b", "c"]
    assert clock.sleepers == 0 and len(deadlines) == 0


async def test_a_cancelled_deadline_never_fires_and_the_timer_goes_once_nothing_is_pending() -> None:
    clock = FakeClock()
    deadlines = Deadlines(clock)
    fired: list[int] = []
    handles = [deadlines.at(clock.now() + 5.0, lambda i=i: fired.append(i)) for i in range(3)]
    handles[1].cancel()
    handles[1].cancel()  # twice: no effect
    clock.advance(5.0)
    assert fired == [0, 2]
    handles[0].cancel()  # after it fired: no effect
    assert len(deadlines) == 0
    later = deadlines.at(clock.now() + 1.0, lambda: fired.append(9))
    later.cancel()
    assert clock.sleepers == 1  # still armed for the cancelled one, until it would have fired
    clock.advance(2.0)
    assert fired == [0, 2]
    assert clock.sleepers == 0  # it fired, found nothing pending and armed nothing


async def test_an_earlier_deadline_rearms_the_timer() -> None:
    clock = FakeClock()
    deadlines = Deadlines(clock)
    fired: list[str] = []
    deadlines.at(clock.now() + 10.0, lambda: fired.append("late"))
    deadlines.at(clock.now() + 1.0, lambda: fired.append("early"))
    assert clock.sleepers == 1
    clock.advance(1.0)
    assert fired == ["early"]
    clock.advance(9.0)
    assert fired == ["early", "late"]


async def test_a_failing_callback_is_reported_and_the_others_still_run() -> None:
    clock = FakeClock()
    deadlines = Deadlines(clock)
    reported: list[BaseException] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, context: reported.append(context["exception"]))
    fired: list[str] = []

    def boom() -> None:
        raise RuntimeError("boom")

    deadlines.at(clock.now() + 1.0, boom)
    deadlines.at(clock.now() + 1.0, lambda: fired.append("after"))
    clock.advance(1.0)
    assert fired == ["after"]
    assert [str(e) for e in reported] == ["boom"]


async def test_cancelled_entries_are_swept_when_they_outnumber_the_live_ones() -> None:
    clock = FakeClock()
    deadlines = Deadlines(clock)
    keep = deadlines.at(clock.now() + 1.0, lambda: None)
    handles = [deadlines.at(clock.now() + 2.0, lambda: None) for _ in range(3 * DEADLINES_COMPACT)]
    for handle in handles:
        handle.cancel()
    assert len(deadlines) == 1
    assert len(deadlines._heap) <= 2 * DEADLINES_COMPACT  # swept, not grown without bound
    keep.cancel()
    assert deadlines._heap == []
    clock.advance(1.0)
    assert clock.sleepers == 0


async def test_a_stream_of_connects_arms_the_clock_once_per_deadline_length_not_per_flow() -> None:
    """Flows one after another, each connecting (its deadline cancelled) before the next starts:
    the pending count falls to zero each time, and still the clock's timer is armed only when the
    earlier one fired, about once per deadline's length."""
    clock = FakeClock()
    deadlines = Deadlines(clock)
    armed = 0
    arm = clock.call_later

    def counting(delay, callback):
        nonlocal armed
        armed += 1
        return arm(delay, callback)

    clock.call_later = counting
    fired: list[int] = []
    for i in range(1000):  # 1,000 flows over 10 s, 4 s deadlines
        deadlines.at(clock.now() + 4.0, lambda i=i: fired.append(i)).cancel()
        clock.advance(0.01)
    assert fired == []
    assert armed <= 10 / 4.0 + 1, f"the clock was armed {armed} times for 1,000 flows"
    straggler = deadlines.at(clock.now() + 4.0, lambda: fired.append(-1))
    clock.advance(4.0)
    assert fired == [-1]  # a deadline after the stream still fires on time
    assert straggler.cancelled and clock.sleepers == 0


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0.1, 50.0), st.booleans()), min_size=1, max_size=40),
    st.lists(st.floats(0.1, 20.0), min_size=1, max_size=10),
)
def test_each_deadline_fires_once_at_its_time_unless_cancelled(plan, steps) -> None:
    async def main() -> None:
        clock = FakeClock()
        deadlines = Deadlines(clock)
        fired: list[tuple[int, float]] = []
        handles = [
            deadlines.at(clock.now() + delay, lambda i=i: fired.append((i, clock.now())))
            for i, (delay, _) in enumerate(plan)
        ]
        start = clock.now()
        for handle, (_, cancel) in zip(handles, plan, strict=True):
            if cancel:
                handle.cancel()
        for step in steps:
            clock.advance(step)
        clock.advance(100.0)
        expected = sorted(i for i, (_, cancel) in enumerate(plan) if not cancel)
        assert sorted(i for i, _ in fired) == expected
        for i, at in fired:
            assert at >= start + plan[i][0]
        assert clock.sleepers == 0 and len(deadlines) == 0

    asyncio.run(main())
