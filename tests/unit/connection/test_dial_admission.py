"""The dial admission budget and the process gates (honk.outbound.admission, design section J).

Every schedule runs on a FakeClock: waiters park on the gates, the test moves time
past their deadlines by hand, and each check reads the counters the dispatcher will read.
"""

from __future__ import annotations

import asyncio
import resource

import pytest

from honk.config.spec import DEFAULT_MAX_CONCURRENT_DIALS
from honk.core.clock import FakeClock, timeout_at
from honk.core.errors import CapacityRefused
from honk.outbound import admission
from honk.outbound.admission import (
    MAX_CARRIER_GATE,
    MIN_CARRIER_GATE,
    MIN_DIAL_GATE,
    AdmissionWatch,
    DialBudget,
    ProcessGates,
    gate_sizes,
    process_gates,
)

LATER = 60.0  # seconds: a deadline no test reaches unless it advances the clock on purpose
BOUND = 1000  # loop iterations a polled condition may take


async def _until(condition, what: str) -> None:
    for _ in range(BOUND):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"never happened: {what}")


async def _settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


async def _hold(budget: DialBudget, count: int, deadline: float) -> list:
    return [await budget.acquire(deadline) for _ in range(count)]


# --- sizing -------------------------------------------------------------------------


def test_gate_sizes_follow_the_descriptor_limit_with_a_floor_and_a_carrier_cap() -> None:
    assert gate_sizes(1024) == ((1024 - 256) // 2, (1024 - 256) // 4)
    assert gate_sizes(65536) == ((65536 - 256) // 2, MAX_CARRIER_GATE)
    assert gate_sizes(100) == (MIN_DIAL_GATE, MIN_CARRIER_GATE)
    dials, carriers = gate_sizes(resource.RLIM_INFINITY)
    assert dials == ((1 << 20) - 256) // 2 and carriers == MAX_CARRIER_GATE


def test_process_gates_are_sized_once_from_the_soft_descriptor_limit(monkeypatch) -> None:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    monkeypatch.setattr(admission, "_process_gates", None)
    gates = process_gates()
    assert (gates.dial_size, gates.carrier_size) == gate_sizes(soft)
    assert process_gates() is gates


def test_explicit_gate_sizes_override_the_descriptor_limit() -> None:
    gates = ProcessGates(dial_gate=5, carrier_gate=2)
    assert (gates.dial_size, gates.carrier_size) == (5, 2)
    assert (gates.dials_in_use, gates.carriers_in_use) == (0, 0)


# --- J1 default and clamp ----------------------------------------------------------------


async def test_the_65th_dial_waits_while_the_default_64_are_in_flight() -> None:
    clock = FakeClock()
    gates = ProcessGates(dial_gate=1000, carrier_gate=2)
    budget = DialBudget(DEFAULT_MAX_CONCURRENT_DIALS, clock, gates)
    assert budget.effective_limit == 64
    held = await _hold(budget, 64, clock.now() + LATER)
    assert budget.in_use == 64 and gates.dials_in_use == 64

    late = asyncio.ensure_future(budget.acquire(clock.now() + LATER))
    await _settle()
    assert not late.done() and budget.waiting == 1 and budget.in_use == 64

    held.pop().release()
    permit = await asyncio.wait_for(late, 1.0)
    assert budget.in_use == 64 and budget.waiting == 0 and gates.dials_in_use == 64
    for p in [*held, permit]:
        p.release()
    assert budget.in_use == 0 and gates.dials_in_use == 0


def test_a_configured_limit_is_clamped_to_the_process_dial_gate() -> None:
    budget = DialBudget(10_000, FakeClock(), ProcessGates(dial_gate=1000, carrier_gate=2))
    assert budget.limit == 10_000 and budget.effective_limit == 1000


def test_a_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError):
        DialBudget(0, FakeClock(), ProcessGates(dial_gate=4, carrier_gate=2))


# --- J3 reload overlap --------------------------------------------------------------------


async def test_a_new_generation_gets_only_what_the_shared_gate_leaves_until_the_old_dials_end() -> None:
    clock = FakeClock()
    gates = ProcessGates(dial_gate=100, carrier_gate=2)
    old = DialBudget(64, clock, gates)
    new = DialBudget(128, clock, gates)
    assert new.effective_limit == 100
    deadline = clock.now() + LATER
    old_permits = await _hold(old, 64, deadline)

    tasks = [asyncio.ensure_future(new.acquire(deadline)) for _ in range(50)]
    await _until(lambda: new.in_use == 36, "the new generation to take the 36 free slots")
    await _settle()
    assert new.in_use == 36 and new.waiting == 14 and gates.dials_in_use == 100

    for permit in old_permits[:10]:
        permit.release()
    await _until(lambda: new.in_use == 46, "ten released slots to reach the new generation")
    assert old.in_use == 54 and new.waiting == 4 and gates.dials_in_use == 100

    for permit in old_permits[10:]:
        permit.release()
    await asyncio.wait_for(asyncio.gather(*tasks), 1.0)
    assert new.in_use == 50 and new.waiting == 0 and old.in_use == 0 and gates.dials_in_use == 50
    for task in tasks:
        task.result().release()
    assert gates.dials_in_use == 0


async def test_an_old_generation_waiter_is_not_overtaken_by_a_later_new_generation_acquirer() -> None:
    clock = FakeClock()
    gates = ProcessGates(dial_gate=2, carrier_gate=2)
    old, new = DialBudget(64, clock, gates), DialBudget(64, clock, gates)
    held = await _hold(old, 2, clock.now() + LATER)
    first = asyncio.ensure_future(old.acquire(clock.now() + LATER))
    await _settle()
    second = asyncio.ensure_future(new.acquire(clock.now() + LATER))
    await _settle()
    assert gates.dials_waiting == 2

    held[0].release()
    await _until(first.done, "the first waiter to get the freed slot")
    await _settle()
    assert not second.done() and new.waiting == 1
    first.result().release()
    (await asyncio.wait_for(second, 1.0)).release()
    held[1].release()
    assert gates.dials_in_use == 0


# --- J5 timeout classification --------------------------------------------------------


async def test_a_deadline_passing_while_waiting_is_a_capacity_refusal_and_leaves_no_registration() -> None:
    clock = FakeClock()
    gates = ProcessGates(dial_gate=10, carrier_gate=2)
    budget = DialBudget(1, clock, gates)
    holder = await budget.acquire(clock.now() + LATER)

    watch = AdmissionWatch()
    refused = asyncio.ensure_future(budget.acquire(clock.now() + 5.0, watch))
    await _until(lambda: clock.sleepers == 1, "the waiter's deadline timer")
    assert watch.pending and budget.waiting == 1
    clock.advance(5.0)
    with pytest.raises(CapacityRefused):
        await refused
    assert budget.waiting == 0 and watch.interrupted and not watch.pending and clock.sleepers == 0

    nxt = asyncio.ensure_future(budget.acquire(clock.now() + LATER))
    await _settle()
    holder.release()
    permit = await asyncio.wait_for(nxt, 1.0)  # the slot goes to the next waiter, not the vanished one
    assert budget.in_use == 1 and gates.dials_in_use == 1
    permit.release()
    assert budget.in_use == 0 and gates.dials_in_use == 0


async def test_a_waiter_held_back_only_by_the_process_gate_times_out_without_consuming_a_slot() -> None:
    clock = FakeClock()
    gates = ProcessGates(dial_gate=3, carrier_gate=2)
    other, budget = DialBudget(3, clock, gates), DialBudget(5, clock, gates)
    held = await _hold(other, 3, clock.now() + LATER)

    refused = asyncio.ensure_future(budget.acquire(clock.now() + 2.0))
    await _until(lambda: gates.dials_waiting == 1, "the waiter to queue on the process gate")
    clock.advance(2.0)
    with pytest.raises(CapacityRefused):
        await refused
    assert gates.dials_waiting == 0 and budget.waiting == 0 and budget.in_use == 0

    waiters = [asyncio.ensure_future(budget.acquire(clock.now() + LATER)) for _ in range(3)]
    await _until(lambda: gates.dials_waiting == 3, "three waiters on the process gate")
    for permit in held:
        permit.release()
    await asyncio.wait_for(asyncio.gather(*waiters), 1.0)
    assert budget.in_use == 3 and other.in_use == 0 and gates.dials_in_use == 3
    for task in waiters:
        task.result().release()
    assert gates.dials_in_use == 0


async def test_an_old_generation_at_its_own_limit_does_not_hold_back_the_new_generation() -> None:
    clock = FakeClock()
    gates = ProcessGates(dial_gate=10, carrier_gate=2)
    old, new = DialBudget(2, clock, gates), DialBudget(64, clock, gates)
    held = await _hold(old, 2, clock.now() + LATER)
    blocked = asyncio.ensure_future(old.acquire(clock.now() + LATER))
    await _settle()
    assert old.waiting == 1

    permit = await asyncio.wait_for(new.acquire(clock.now() + LATER), 1.0)
    assert new.in_use == 1 and old.waiting == 1 and gates.dials_in_use == 3
    held[0].release()
    await asyncio.wait_for(blocked, 1.0)
    assert old.in_use == 2 and old.waiting == 0
    for p in [permit, held[1], blocked.result()]:
        p.release()
    assert gates.dials_in_use == 0


async def test_an_outer_deadline_scope_interrupting_a_pending_acquisition_is_reported_by_the_watch() -> None:
    clock = FakeClock()
    budget = DialBudget(1, clock, ProcessGates(dial_gate=4, carrier_gate=2))
    holder = await budget.acquire(clock.now() + LATER)
    deadline = clock.now() + 3.0

    async def dial() -> str:
        scope = budget.permit(deadline)
        try:
            async with timeout_at(clock, deadline):  # the caller's own scope, armed first
                async with scope:
                    return "dialled"
        except TimeoutError:
            return "capacity" if scope.watch.interrupted else "timeout"

    task = asyncio.ensure_future(dial())
    await _until(lambda: clock.sleepers == 2, "both deadline timers")
    clock.advance(3.0)
    assert await task == "capacity"
    assert budget.waiting == 0 and budget.in_use == 1
    holder.release()


async def test_an_outer_timeout_before_admission_started_is_an_ordinary_timeout() -> None:
    clock = FakeClock()
    budget = DialBudget(1, clock, ProcessGates(dial_gate=4, carrier_gate=2))
    deadline = clock.now() + 3.0

    async def dial() -> str:
        scope = budget.permit(deadline)
        try:
            async with timeout_at(clock, deadline):
                await clock.sleep(10.0)  # a DNS resolution that outlives the deadline
                async with scope:
                    return "dialled"
        except TimeoutError:
            return "capacity" if scope.watch.interrupted else "timeout"

    task = asyncio.ensure_future(dial())
    await _until(lambda: clock.sleepers == 2, "the deadline and the resolver's sleep")
    clock.advance(3.0)
    assert await task == "timeout"
    assert budget.in_use == 0 and budget.waiting == 0


async def test_a_free_slot_is_granted_without_arming_a_timer() -> None:
    clock = FakeClock()
    budget = DialBudget(2, clock, ProcessGates(dial_gate=4, carrier_gate=2))
    async with budget.permit(clock.now() + 1.0) as permit:
        assert clock.sleepers == 0 and budget.in_use == 1 and not permit.released
    assert budget.in_use == 0 and permit.released


# --- cancellation ------------------------------------------------------------------------


async def test_cancelling_a_waiting_acquirer_removes_it_and_the_next_waiter_gets_the_slot() -> None:
    clock = FakeClock()
    gates = ProcessGates(dial_gate=4, carrier_gate=2)
    budget = DialBudget(1, clock, gates)
    holder = await budget.acquire(clock.now() + LATER)
    gone = asyncio.ensure_future(budget.acquire(clock.now() + LATER))
    await _settle()
    nxt = asyncio.ensure_future(budget.acquire(clock.now() + LATER))
    await _until(lambda: budget.waiting == 2, "two waiters")

    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert budget.waiting == 1 and clock.sleepers == 1

    holder.release()
    permit = await asyncio.wait_for(nxt, 1.0)
    assert budget.in_use == 1 and gates.dials_in_use == 1
    permit.release()
    assert budget.in_use == 0 and gates.dials_in_use == 0


async def test_a_waiter_cancelled_just_as_the_slot_reaches_it_passes_the_slot_on() -> None:
    clock = FakeClock()
    gates = ProcessGates(dial_gate=4, carrier_gate=2)
    budget = DialBudget(1, clock, gates)
    holder = await budget.acquire(clock.now() + LATER)
    unlucky = asyncio.ensure_future(budget.acquire(clock.now() + LATER))
    await _settle()
    nxt = asyncio.ensure_future(budget.acquire(clock.now() + LATER))
    await _until(lambda: budget.waiting == 2, "two waiters")

    holder.release()  # hands the slot to ``unlucky`` ...
    unlucky.cancel()  # ... which is cancelled before it runs
    with pytest.raises(asyncio.CancelledError):
        await unlucky
    permit = await asyncio.wait_for(nxt, 1.0)
    assert budget.in_use == 1 and gates.dials_in_use == 1
    permit.release()
    assert budget.in_use == 0 and gates.dials_in_use == 0


async def test_cancelling_a_holder_releases_both_its_slots() -> None:
    clock = FakeClock()
    gates = ProcessGates(dial_gate=4, carrier_gate=2)
    budget = DialBudget(2, clock, gates)
    entered = asyncio.Event()

    async def dial() -> None:
        async with budget.permit(clock.now() + LATER):
            entered.set()
            await asyncio.Event().wait()  # the connect that never finishes

    task = asyncio.ensure_future(dial())
    await asyncio.wait_for(entered.wait(), 1.0)
    assert budget.in_use == 1 and gates.dials_in_use == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert budget.in_use == 0 and gates.dials_in_use == 0


async def test_an_error_inside_the_permit_releases_it_and_release_is_idempotent() -> None:
    clock = FakeClock()
    gates = ProcessGates(dial_gate=4, carrier_gate=2)
    budget = DialBudget(2, clock, gates)
    with pytest.raises(ConnectionRefusedError):
        async with budget.permit(clock.now() + LATER):
            raise ConnectionRefusedError
    assert budget.in_use == 0 and gates.dials_in_use == 0

    permit = await budget.acquire(clock.now() + LATER)
    permit.release()
    permit.release()
    assert budget.in_use == 0 and gates.dials_in_use == 0


# --- J6 carrier gate ----------------------------------------------------------------------


async def test_a_third_carrier_waits_across_generations_until_a_permit_is_released() -> None:
    clock = FakeClock()
    gates = ProcessGates(dial_gate=100, carrier_gate=2)
    old, new = DialBudget(64, clock, gates), DialBudget(128, clock, gates)
    assert old.gates is new.gates  # the carrier gate is the one both generations see
    first = await old.gates.carrier_permit(clock.now() + LATER, clock=clock)
    second = await new.gates.carrier_permit(clock.now() + LATER, clock=clock)
    third = asyncio.ensure_future(new.gates.carrier_permit(clock.now() + LATER, clock=clock))
    await _settle()
    assert not third.done() and gates.carriers_in_use == 2 and gates.carriers_waiting == 1

    first.release()
    permit = await asyncio.wait_for(third, 1.0)
    assert gates.carriers_in_use == 2 and gates.carriers_waiting == 0
    first.release()  # a second release of the same permit changes nothing
    assert gates.carriers_in_use == 2 and first.released
    second.release()
    permit.release()
    assert gates.carriers_in_use == 0


async def test_a_carrier_permit_not_granted_before_its_deadline_is_a_capacity_refusal() -> None:
    clock = FakeClock()
    gates = ProcessGates(dial_gate=4, carrier_gate=1)
    held = await gates.carrier_permit(clock.now() + LATER, clock=clock)
    watch = AdmissionWatch()
    late = asyncio.ensure_future(gates.carrier_permit(clock.now() + 4.0, clock=clock, watch=watch))
    await _until(lambda: clock.sleepers == 1, "the waiter's deadline timer")
    clock.advance(4.0)
    with pytest.raises(CapacityRefused):
        await late
    assert watch.interrupted and gates.carriers_waiting == 0
    held.release()
    assert gates.carriers_in_use == 0
    again = await gates.carrier_permit(clock.now() + 1.0, clock=clock)
    assert gates.carriers_in_use == 1
    again.release()
