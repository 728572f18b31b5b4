"""One reporter's RX publication throttle and settlement flush (GH-K-43, GH-K-79)."""

from __future__ import annotations

from honk.group.score.cohort import Cohorts, Credit, Kind, Reporter
from honk.group.score.constants import COHORT_GAP, RX_PUBLISH_INTERVAL
from honk.group.score.reporter import Outcome, RxPublisher, Settled

CELL = ("node-a", "t1.example:443")


class RecordingSink:
    """Records what reaches the cohort: (event, now, at)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, float, float | None]] = []

    def tx(self, cell, reporter, now):
        self.events.append(("tx", now, None))

    def rx(self, cell, reporter, now, *, kind, at=None):
        self.events.append(("rx", now, at))
        return Credit.COUNTED

    @property
    def rx_times(self) -> list[float]:
        return [now if at is None else at for kind, now, at in self.events if kind == "rx"]


def _sent(sink, *, at: float = 0.0, kind: Kind = Kind.TRAFFIC) -> RxPublisher:
    publisher = RxPublisher(CELL, Reporter("r1"), sink, kind=kind)
    publisher.setup(at)
    publisher.tx(at)
    return publisher


def test_first_rx_publishes_at_once_then_at_most_once_per_interval() -> None:
    sink = RecordingSink()
    publisher = _sent(sink)
    assert publisher.rx(0.1) is Credit.COUNTED
    for t in (0.2, 0.5, 1.0):
        assert publisher.rx(t) is None
    assert publisher.held == 1.0
    assert publisher.rx(0.1 + RX_PUBLISH_INTERVAL) is Credit.COUNTED
    assert publisher.held is None  # superseded by the newer publication
    assert publisher.rx(1.5) is None
    assert publisher.rx(2.2) is not None
    assert sink.rx_times == [0.1, 1.1, 2.2]
    times = sink.rx_times
    assert all(b - a >= RX_PUBLISH_INTERVAL for a, b in zip(times, times[1:], strict=False))


def test_tx_only_callbacks_never_flush_a_suppressed_receive() -> None:
    sink = RecordingSink()
    publisher = _sent(sink)
    publisher.rx(1.0)
    publisher.rx(1.5)
    for t in (2.0, 3.0, 10.0):
        publisher.tx(t)
    assert sink.rx_times == [1.0]
    assert publisher.held == 1.5
    assert [e for e in sink.events if e[0] == "tx"] == [("tx", 0.0, None)]


def test_settlement_flushes_at_event_time_never_at_cleanup_time() -> None:
    sink = RecordingSink()
    publisher = _sent(sink)
    publisher.rx(1.0)
    publisher.rx(1.4)
    assert publisher.settle(9.0, Outcome.SUCCESS) == Settled(1.4, True)
    assert sink.events[-1] == ("rx", 9.0, 1.4)
    assert sink.rx_times == [1.0, 1.4]


def test_settlement_happens_at_most_once() -> None:
    sink = RecordingSink()
    publisher = _sent(sink)
    publisher.rx(1.0)
    publisher.rx(1.2)
    assert publisher.settle(2.0, Outcome.SUCCESS) is not None
    assert publisher.settle(3.0, Outcome.SUCCESS) is None
    assert publisher.rx(5.0) is None
    assert sink.rx_times == [1.0, 1.2]


def test_settlement_with_nothing_held_flushes_nothing() -> None:
    sink = RecordingSink()
    publisher = _sent(sink)
    publisher.rx(1.0)
    assert publisher.settle(2.0, Outcome.SUCCESS) == Settled(None, True)
    assert sink.rx_times == [1.0]


def test_neutral_outcomes_keep_factual_rx_and_record_no_success() -> None:
    for outcome in (Outcome.CANCELLED, Outcome.REJECTED, Outcome.SHUTDOWN):
        sink = RecordingSink()
        publisher = _sent(sink)
        publisher.rx(1.0)
        publisher.rx(1.3)
        assert publisher.settle(4.0, outcome) == Settled(1.3, False)
        assert sink.rx_times == [1.0, 1.3]


def test_rx_before_setup_and_tx_is_neither_published_nor_held() -> None:
    sink = RecordingSink()
    publisher = RxPublisher(CELL, Reporter("r1"), sink)
    assert publisher.rx(0.5) is None
    publisher.tx(0.6)  # TX before setup is not a set-up reporter's TX
    assert publisher.rx(0.7) is None
    publisher.setup(1.0)
    assert publisher.rx(1.1) is None
    assert publisher.held is None
    publisher.tx(1.2)
    assert publisher.rx(1.3) is not None
    assert sink.rx_times == [1.3]
    assert publisher.settle(2.0, Outcome.SUCCESS) == Settled(None, True)


def test_post_failure_rx_held_in_the_interval_recovers_at_settlement_with_its_event_time() -> None:
    cohorts = Cohorts()
    cohorts.fail(CELL, 0.0, episode="e")
    publishers = []
    for i in range(4):
        publisher = RxPublisher(CELL, Reporter(f"r{i}"), cohorts)
        publisher.setup(-1.0)
        publisher.tx(-1.0)
        publishers.append(publisher)
    # r0 had published just before the failure, so its post-failure RX is held.
    publishers[0].rx(-0.5)
    for i, publisher in enumerate(publishers[1:], start=1):
        assert publisher.rx(float(i)) is Credit.COUNTED
    assert publishers[0].rx(0.2) is None
    assert cohorts.open_episode(CELL) == "e"  # no timer turns the held RX into progress
    publishers[0].settle(30.0, Outcome.CANCELLED)
    assert cohorts.open_episode(CELL) is None
    # Event time 3.0 (the newest credit), not the cleanup time 30.0.
    assert cohorts.lease_valid(CELL, 62.9)
    assert not cohorts.lease_valid(CELL, 63.0)


def test_settlement_cannot_flush_across_expired_support() -> None:
    cohorts = Cohorts()
    publisher = RxPublisher(CELL, Reporter("r1"), cohorts)
    publisher.setup(0.0)
    publisher.tx(0.0)
    publisher.rx(1.0)
    publisher.rx(1.5)
    publisher.settle(1.5 + COHORT_GAP, Outcome.SUCCESS)
    assert cohorts.reporters(CELL, 1.5 + COHORT_GAP) == 0


def test_probe_reporter_publications_never_recover() -> None:
    cohorts = Cohorts()
    cohorts.fail(CELL, 0.0, episode="e")
    for i in range(6):
        publisher = RxPublisher(CELL, Reporter(f"p{i}"), cohorts, kind=Kind.PROBE)
        publisher.setup(1.0)
        publisher.tx(1.0)
        publisher.rx(2.0 + i)
        publisher.settle(10.0, Outcome.SUCCESS)
    assert cohorts.open_episode(CELL) == "e"
    assert not cohorts.observed_usable(CELL, 10.0)
