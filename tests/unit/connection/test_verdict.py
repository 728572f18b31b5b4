"""FlowVerdict, sans-I/O on a fake clock: one relayed flow's outcome for its node's health and
its Score reporter (issue 32, items 4 and 5). Every case runs with the response deadline on the
clock's own timer and on a shared :class:`~honk.core.clock.Deadlines` (the SOCKS fast path's)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from honk.connection.verdict import FlowVerdict, observe_flow
from honk.core.clock import Deadlines, FakeClock
from honk.core.errors import ClientGone, FlowClosed, UpstreamFailed

RESPONSE_TIMEOUT = 10.0


class Traffic:
    """A node's health sink: what the verdict told it."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def flow_answered(self) -> None:
        self.events.append("answered")

    def flow_failed(self, family: int) -> None:
        self.events.append(f"failed/v{family}")


class Reporter:
    """A Score reporter's surface the verdict drives."""

    def __init__(self) -> None:
        self.tx_bytes = self.rx_bytes = 0
        self.settled: list = []

    def tx(self, now: float, nbytes: int) -> None:
        self.tx_bytes += nbytes

    def rx(self, now: float, nbytes: int) -> None:
        if not self.settled:
            self.rx_bytes += nbytes

    def settle(self, now: float, result) -> None:  # noqa: ANN001
        self.settled.append((now, result))


SHARED = False  # the response deadlines go on a shared Deadlines (set by the ``scheduling`` fixture)


@pytest.fixture(autouse=True, params=["clock", "deadlines"])
def scheduling(request, monkeypatch):
    monkeypatch.setattr(f"{__name__}.SHARED", request.param == "deadlines")


def flow(family: int = 4, reporter: Reporter | None = None, timeout: float = RESPONSE_TIMEOUT):
    clock = FakeClock()
    traffic = Traffic()
    leaf = SimpleNamespace(name="n", health_family=family, runtime=SimpleNamespace(traffic=traffic))
    deadlines = Deadlines(clock) if SHARED else None
    return clock, traffic, FlowVerdict(clock, leaf, reporter, timeout, deadlines)


def test_answered_flows_on_shared_deadlines_arm_the_clock_once_not_per_flow():
    clock = FakeClock()
    armed = []
    arm = clock.call_later
    clock.call_later = lambda delay, callback: armed.append(delay) or arm(delay, callback)
    deadlines = Deadlines(clock)
    traffic = Traffic()
    leaf = SimpleNamespace(name="n", health_family=4, runtime=SimpleNamespace(traffic=traffic))
    for _ in range(200):
        verdict = FlowVerdict(clock, leaf, None, RESPONSE_TIMEOUT, deadlines)
        verdict(100, 0)
        verdict(0, 100)
        clock.advance(0.01)
    assert traffic.events == ["answered"] * 200
    assert len(armed) == 1 and len(deadlines) == 0  # 2 s of flows, 10 s deadlines: armed once
    silent = FlowVerdict(clock, leaf, None, RESPONSE_TIMEOUT, deadlines)
    silent(100, 0)
    clock.advance(RESPONSE_TIMEOUT)
    assert traffic.events[-1] == "failed/v4"  # a silent one after them is still judged on time


def test_the_first_response_byte_is_an_answered_flow_and_stops_the_deadline():
    clock, traffic, verdict = flow()
    verdict(100, 0)
    clock.advance(1.0)
    verdict(0, 5)
    clock.advance(RESPONSE_TIMEOUT * 2)
    verdict.end(UpstreamFailed("reset later"))
    assert traffic.events == ["answered"]


def test_data_sent_and_nothing_back_within_the_response_timeout_fails_the_node_and_the_score_attempt():
    reporter = Reporter()
    clock, traffic, verdict = flow(family=6, reporter=reporter)
    clock.advance(2.0)  # idle before the client speaks: not counted
    verdict(100, 0)
    clock.advance(RESPONSE_TIMEOUT - 0.01)
    assert traffic.events == []
    clock.advance(0.01)
    assert traffic.events == ["failed/v6"]
    assert len(reporter.settled) == 1 and reporter.settled[0][1].ending.name == "FAILURE"
    verdict(0, 5)  # a late answer is still relayed; the verdict stands
    verdict.end(None)
    assert traffic.events == ["failed/v6"] and reporter.tx_bytes == 100


def test_a_client_still_sending_is_not_waiting_and_the_deadline_runs_from_its_last_byte():
    clock, traffic, verdict = flow()
    for _ in range(30):  # an upload, or a one-way stream: a byte every second for 30 s
        verdict(1000, 0)
        clock.advance(1.0)
    assert traffic.events == []
    clock.advance(RESPONSE_TIMEOUT - 1.0 - 0.01)
    assert traffic.events == []
    clock.advance(0.01)  # response_timeout after its last byte, still nothing back
    assert traffic.events == ["failed/v4"]


def test_a_flow_that_never_sends_is_never_judged():
    clock, traffic, verdict = flow()
    clock.advance(RESPONSE_TIMEOUT * 10)
    verdict.end(None)
    assert traffic.events == []
    assert verdict.timer is None


def test_an_upstream_reset_after_data_and_before_any_answer_fails_the_node():
    clock, traffic, verdict = flow()
    verdict(10, 0)
    verdict.end(UpstreamFailed("connection reset by peer"))
    assert traffic.events == ["failed/v4"]
    clock.advance(RESPONSE_TIMEOUT)
    assert traffic.events == ["failed/v4"]  # the deadline was cancelled: one outcome per flow


@pytest.mark.parametrize("error", [ClientGone("client reset"), FlowClosed("closed by request"), None])
def test_a_flow_ended_by_its_client_or_by_honk_before_the_deadline_says_nothing(error):
    clock, traffic, verdict = flow()
    verdict(10, 0)
    clock.advance(1.0)
    verdict.end(error)
    clock.advance(RESPONSE_TIMEOUT)
    assert traffic.events == []


def test_a_zero_response_timeout_turns_the_deadline_off():
    clock, traffic, verdict = flow(timeout=0.0)
    verdict(10, 0)
    clock.advance(3600.0)
    assert traffic.events == [] and verdict.timer is None


def test_nobody_listening_gives_no_observer():
    clock = FakeClock()
    assert observe_flow(clock, SimpleNamespace(name="direct", runtime=None), None, RESPONSE_TIMEOUT) is None
    direct_in_score = observe_flow(
        clock, SimpleNamespace(name="direct", runtime=None), Reporter(), RESPONSE_TIMEOUT
    )
    assert direct_in_score is not None  # Score still hears a direct member's silence
