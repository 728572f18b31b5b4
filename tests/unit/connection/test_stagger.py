"""Cold URLTest UDP preparation (honk.connection.stagger, design area G), on a FakeClock.

Each candidate's preparation is a future the test settles by hand; the test moves time to
exact instants and lets the loop run, then reads when each candidate started, what was
committed, discarded and reported as an observed error.
"""

from __future__ import annotations

import asyncio

import pytest

from honk.connection.stagger import (
    COLD_MAX_IN_FLIGHT,
    ColdPreparationFailed,
    ColdPreparationTimeout,
    Stagger,
    preparation_deadline,
    prepare_first,
    start_offset,
)
from honk.core.clock import FakeClock
from honk.core.stats import StaggerCounts

MS = 0.001
FAR = 60.0  # seconds: a deadline a test reaches only on purpose
BOUND = 200  # loop iterations a polled condition may take
EPSILON = 1e-9  # past an instant, so that float sums never leave a timer one ulp short


class Race:
    """Candidates whose preparations the test ends; records every callback in order."""

    def __init__(
        self, clock: FakeClock, count: int, *, deadline: float = FAR, recheck_fails: str = ""
    ) -> None:
        self.clock = clock
        self.t0 = clock.now()
        self.names = [f"c{i + 1}" for i in range(count)]  # 1-based names, as the seed's tests count
        self.pending: dict[str, asyncio.Future] = {}
        self.started: dict[str, float] = {}
        self.events: list[tuple] = []
        self.ineligible: set[str] = set()
        self.eligible_calls: list[str] = []
        self.on_cancel: dict[
            str, object
        ] = {}  # what a cancelled preparation does instead: a result or an error
        self.recheck_fails = recheck_fails  # eligible on its success, no longer at the recheck
        self.counts = StaggerCounts()
        self.task = asyncio.ensure_future(
            prepare_first(
                self.names,
                self.prepare,
                clock=clock,
                deadline=self.t0 + deadline,
                eligible=self.eligible,
                commit=lambda c, r: self.events.append(("commit", c, r)),
                observed_error=lambda c, e: self.events.append(("error", c, type(e).__name__)),
                discard=lambda r: self.events.append(("discard", r)),
                counts=self.counts,
            )
        )

    async def prepare(self, name: str) -> str:
        self.started[name] = self.clock.now() - self.t0
        future = self.pending[name] = asyncio.get_running_loop().create_future()
        try:
            return await future
        except asyncio.CancelledError:
            instead = self.on_cancel.get(name)
            self.events.append(("drained", name))
            if isinstance(instead, BaseException):
                raise instead from None
            if instead is not None:
                return instead  # it finished just as it was aborted
            raise

    def eligible(self, name: str) -> bool:
        self.eligible_calls.append(name)
        if name == self.recheck_fails and self.eligible_calls.count(name) > 1:
            return False
        return name not in self.ineligible

    async def at(self, ms: float) -> None:
        """Move the clock to ``ms`` after the start and let the loop run."""
        await settle()  # the race runs first (it starts counting when it first runs)
        target = self.t0 + ms * MS + EPSILON
        if target > self.clock.now():
            self.clock.advance(target - self.clock.now())
        await settle()

    def succeed(self, name: str, result: str) -> None:
        self.pending[name].set_result(result)

    def fail(self, name: str) -> None:
        self.pending[name].set_exception(ConnectionRefusedError("no UDP here"))

    def starts_ms(self) -> dict[str, float]:
        return {name: round(at / MS, 3) for name, at in self.started.items()}

    def errors(self) -> list[str]:
        return [e[1] for e in self.events if e[0] == "error"]


async def settle() -> None:
    for _ in range(BOUND):
        await asyncio.sleep(0)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def test_start_offsets_are_absolute_0_30_80_then_every_80_ms():
    assert [round(start_offset(i) / MS, 6) for i in range(7)] == [0, 30, 80, 160, 240, 320, 400]


def test_deadline_is_ten_seconds_or_four_connect_timeouts():
    assert preparation_deadline(1.0) == 10.0
    assert preparation_deadline(5.0) == 20.0


def test_schedule_waits_for_capacity_and_keeps_later_offsets_absolute():
    stagger = Stagger(6, 0.0, FAR)
    assert stagger.due(0.0) == [0]
    assert stagger.due(0.1) == [1, 2]  # both offsets passed: they start at once, in order
    assert len(stagger.in_flight) == COLD_MAX_IN_FLIGHT == 3
    assert stagger.due(0.2) == [] and stagger.wakeup() is None  # three in flight: a full-capacity wait
    stagger.finished(0)
    assert stagger.due(0.2) == [3]  # its offset (160 ms) is past: it starts on the free slot
    stagger.finished(1)
    assert stagger.due(0.22) == [] and stagger.wakeup() == pytest.approx(0.24)  # the 5th keeps 240 ms


async def test_stagger_offsets_with_a_slow_early_attempt(clock):
    race = Race(clock, 6)
    for ms in (0, 30, 80, 160):
        await race.at(ms)
    assert race.starts_ms() == {"c1": 0, "c2": 30, "c3": 80}  # the 4th waits: three in flight
    await race.at(200)
    race.fail("c1")
    await settle()
    assert race.starts_ms()["c4"] == 200  # capacity freed at 200 ms: it starts at once
    await race.at(220)
    race.fail("c2")
    await settle()
    assert "c5" not in race.started  # not at 220, and not pushed to 280 either
    await race.at(240)
    assert race.starts_ms()["c5"] == 240  # its absolute offset
    assert race.errors() == ["c1", "c2"]  # each failure is one observed error
    race.task.cancel()
    await settle()


async def test_winner_waits_for_every_loser_to_drain_then_is_rechecked_and_committed(clock):
    race = Race(clock, 3)
    race.on_cancel["c3"] = "c3-session"  # c3 finished just as it was aborted: never published
    for ms in (0, 30, 80, 90):
        await race.at(ms)
    race.succeed("c2", "c2-session")
    await settle()
    assert race.task.done()
    assert race.task.result() == ("c2", "c2-session")
    drained = [e for e in race.events if e[0] == "drained"]
    assert sorted(drained) == [("drained", "c1"), ("drained", "c3")]
    commit = race.events.index(("commit", "c2", "c2-session"))
    assert all(race.events.index(e) < commit for e in drained)  # drained before the commit
    assert ("discard", "c3-session") in race.events[:commit]  # the loser's result closed, not committed
    assert race.eligible_calls == ["c2", "c2"]  # on its success, and again after the drain
    assert race.errors() == []
    assert clock.sleepers == 0  # no timer left behind
    assert race.counts == StaggerCounts(plans=1, attempts=3, wins=1, drained=2)


async def test_a_loser_cancelled_while_draining_is_neutral(clock):
    race = Race(clock, 2)
    await race.at(30)
    race.succeed("c2", "s2")
    await settle()
    assert race.task.result() == ("c2", "s2")
    assert ("drained", "c1") in race.events and race.errors() == []


async def test_an_error_a_loser_completed_with_found_while_draining_counts_once(clock):
    race = Race(clock, 2)
    race.on_cancel["c1"] = ConnectionResetError("it had failed already")
    await race.at(30)
    race.succeed("c2", "s2")
    await settle()
    assert race.task.result() == ("c2", "s2")
    assert race.events.count(("error", "c1", "ConnectionResetError")) == 1


async def test_a_winner_ineligible_at_the_recheck_is_neutral_and_the_next_success_wins(clock):
    race = Race(clock, 4, recheck_fails="c2")
    for ms in (0, 30, 80):
        await race.at(ms)
    race.succeed("c2", "s2")
    await settle()
    assert not race.task.done()
    assert ("discard", "s2") in race.events  # neutral: never committed, never an error
    assert not any(e[0] == "commit" for e in race.events) and race.errors() == []
    assert "c4" not in race.started
    await race.at(160)
    assert race.starts_ms()["c4"] == 160  # the schedule goes on at the 4th's own offset
    race.succeed("c4", "s4")
    await settle()
    assert race.task.result() == ("c4", "s4")
    assert race.events[-1] == ("commit", "c4", "s4")
    assert race.counts == StaggerCounts(plans=1, attempts=4, wins=1, drained=2, rejected=1)


async def test_a_winner_ineligible_at_the_recheck_with_nobody_left_fails_the_plan(clock):
    race = Race(clock, 3, recheck_fails="c2")
    for ms in (0, 30, 80):
        await race.at(ms)
    race.succeed("c2", "s2")
    await settle()
    with pytest.raises(ColdPreparationFailed) as failed:
        race.task.result()
    assert failed.value.errors == () and race.errors() == []


async def test_deadline_stops_new_starts_and_drains_the_running(clock):
    race = Race(clock, 5, deadline=preparation_deadline(1.0))
    for ms in (0, 30, 80, 160):
        await race.at(ms)
    await race.at(10_000)
    assert race.task.done()
    with pytest.raises(ColdPreparationTimeout):
        race.task.result()
    assert set(race.started) == {"c1", "c2", "c3"}
    assert sorted(e for e in race.events if e[0] == "drained") == [("drained", f"c{i}") for i in (1, 2, 3)]
    assert race.errors() == []  # the deadline is not a health event
    assert clock.sleepers == 0
    assert race.counts == StaggerCounts(plans=1, attempts=3, timeouts=1, drained=3)


async def test_no_candidate_starts_at_or_after_the_deadline(clock):
    race = Race(clock, 200, deadline=1.0)
    ms = 0.0
    while not race.task.done():
        await race.at(ms)
        for name in [n for n, f in race.pending.items() if not f.done()]:
            race.fail(name)  # each fails as soon as it starts
        await settle()
        ms += 10
    assert max(race.started.values()) < 1.0
    assert len(race.started) == 1 + sum(1 for i in range(1, 200) if start_offset(i) < 1.0)
    with pytest.raises(ColdPreparationFailed):
        race.task.result()
    assert len(race.errors()) == len(race.started)


async def test_a_winner_committed_just_before_the_deadline_is_not_cut(clock):
    race = Race(clock, 1, deadline=preparation_deadline(1.0))
    await race.at(9_900)
    race.succeed("c1", "s1")
    await settle()
    assert race.task.result() == ("c1", "s1")
    await race.at(10_500)
    assert race.task.result() == ("c1", "s1") and clock.sleepers == 0


async def test_every_failure_fails_the_plan_with_the_observed_errors(clock):
    race = Race(clock, 2)
    await race.at(30)
    race.fail("c1")
    race.fail("c2")
    await settle()
    with pytest.raises(ColdPreparationFailed) as failed:
        race.task.result()
    assert len(failed.value.errors) == 2 and race.errors() == ["c1", "c2"]
    assert race.counts == StaggerCounts(plans=1, attempts=2, failures=1, errors=2)


async def test_cancelling_the_preparation_drains_every_attempt_neutrally(clock):
    race = Race(clock, 3)
    race.on_cancel["c2"] = "s2"
    for ms in (0, 30, 80):
        await race.at(ms)
    race.task.cancel()
    await settle()
    assert race.task.cancelled()
    assert sorted(e[1] for e in race.events if e[0] == "drained") == ["c1", "c2", "c3"]
    assert ("discard", "s2") in race.events and race.errors() == [] and clock.sleepers == 0
