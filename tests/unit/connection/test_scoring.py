"""honk.connection.scoring, sans-I/O: how a dial's end and a relay's end become Score results,
and how a relay engine's byte counts reach the flow's reporter through its observer (issue 11)."""

from __future__ import annotations

import asyncio
import ipaddress
from types import SimpleNamespace

import pytest

from honk.connection import scoring
from honk.connection.verdict import FlowVerdict
from honk.core.clock import FakeClock
from honk.core.errors import (
    CapacityRefused,
    ClientGone,
    CodecError,
    DialError,
    DialTimeout,
    FlowClosed,
    IdleTimeout,
    ProxyAuthFailed,
    TargetRefused,
    UpstreamFailed,
)
from honk.core.net import Network
from honk.group.score.attempt import Ending, Episode, ScoreFeedback, Traversal
from honk.group.score.cohort import Cohorts
from honk.group.score.evidence import ScoreEvidence
from honk.group.score.keys import ScoreTarget

GROUP = "Smart"
NODE = ("node", "n1")
TARGET = ScoreTarget.of("192.0.2.7", 443)
PROXY_LEAF = SimpleNamespace(name="n1", protocol="socks5")
DIRECT_LEAF = SimpleNamespace(name="direct", protocol="direct")
STEP = 0.25  # seconds between the events of one simulated flow
REPLY_CODE = 5  # SOCKS5 "connection refused" as a proxy relays it
NO_DEADLINE = 0.0  # response_timeout 0: these tests pin the byte counts, not the response deadline


class Rig:
    """One Score group's evidence and cohorts, and a feedback for one flow through it."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.evidence = ScoreEvidence()
        self.cohorts = Cohorts()
        self.step = Traversal(GROUP, Network.TCP, TARGET, NODE)
        self.feedback = ScoreFeedback.of([self.step], self.evidence, self.cohorts)

    def exact(self):
        return self.evidence.layers(GROUP, Network.TCP, TARGET, NODE)[2]

    def node_episodes(self) -> list:
        return [self.cohorts.open_episode(cell) for cell in self.step.node_cells()]

    def target_episode(self):
        return self.cohorts.open_episode(self.step.cohort_cell())

    def reporter(self):
        """A set-up reporter, as a successful dial hands it over."""
        guard = scoring.begin(self.feedback, self.clock)
        reporter = scoring.report_setup(guard, self.clock, PROXY_LEAF, None)
        assert reporter is not None
        return reporter


# --- begin ---------------------------------------------------------------------------------------


def test_a_flow_outside_score_begins_no_attempt():
    assert scoring.begin(None, FakeClock()) is None


def test_begin_admits_the_attempt_before_any_io():
    rig = Rig()
    guard = scoring.begin(rig.feedback, rig.clock)
    assert guard is not None and guard.begun_at == rig.clock.now()
    assert rig.exact() is not None  # admission creates the cells, recording nothing yet
    assert rig.exact().attempts.value(rig.clock.now()) == 0


def test_setup_latency_runs_from_the_dials_real_start_after_its_permit():
    rig = Rig()
    guard = scoring.begin(rig.feedback, rig.clock)
    rig.clock.advance(2.0)  # waiting for a dial permit: honk's wait, not the node's (GH-K-76)
    started = rig.clock.now()
    rig.clock.advance(STEP)
    reporter = scoring.report_setup(guard, rig.clock, PROXY_LEAF, None, dial_started=started)
    assert reporter is not None and reporter.setup_at - reporter.begun_at == pytest.approx(STEP)


def test_begin_is_refused_when_the_member_left_its_group():
    rig = Rig()
    rig.evidence.prune(set())
    with pytest.raises(scoring.ScoreAttemptRefused):
        scoring.begin(rig.feedback, rig.clock)


# --- setup_failure ---------------------------------------------------------------------------------


def failure_scope(leaf, error) -> bool | None:
    """Whether the setup failure is node-scoped (False: the target path's); it must be a failure."""
    result = scoring.setup_failure(leaf, error)
    assert result is not None and result.ending is Ending.FAILURE
    return result.node_scoped


@pytest.mark.parametrize(
    "error",
    [
        CapacityRefused("no dial permit"),
        ClientGone("the client left"),
        FlowClosed("closed"),
        asyncio.CancelledError(),
    ],
    ids=["capacity", "client-gone", "flow-closed", "cancelled"],
)
@pytest.mark.parametrize("leaf", [PROXY_LEAF, DIRECT_LEAF], ids=["proxy", "direct"])
def test_local_refusals_and_client_or_cancellation_ends_are_neutral(leaf, error):
    assert scoring.setup_failure(leaf, error) is None


def test_an_error_that_is_not_honks_is_neutral():
    assert scoring.setup_failure(PROXY_LEAF, RuntimeError("a bug, not the node")) is None


def test_a_refusal_the_proxy_relayed_from_the_target_is_target_scoped():
    assert failure_scope(PROXY_LEAF, TargetRefused("n1", REPLY_CODE, "refused")) is False


@pytest.mark.parametrize(
    "error",
    [
        DialError("direct", "connect", "refused"),
        DialTimeout("direct", "connect", "timed out"),
        DialError("direct", "resolve", "no address"),
        UpstreamFailed("reset"),
    ],
    ids=["connect", "timeout", "resolve", "other-honk-error"],
)
def test_any_failure_of_a_direct_leaf_is_target_scoped(error):
    assert failure_scope(DIRECT_LEAF, error) is False


@pytest.mark.parametrize(
    "error",
    [
        DialError("n1", "connect", "refused"),
        DialTimeout("n1", "connect", "timed out"),
        DialError("n1", "tls", "bad certificate"),
        DialError("n1", "handshake", "garbage"),
        ProxyAuthFailed("n1", "bad password"),
    ],
    ids=["connect", "timeout", "tls", "handshake", "auth"],
)
def test_other_dial_errors_of_a_proxy_are_node_scoped(error):
    assert failure_scope(PROXY_LEAF, error) is True


def test_a_setup_failure_carries_the_shared_episode_when_given():
    episode = Episode()
    result = scoring.setup_failure(PROXY_LEAF, DialError("n1", "connect", "refused"), episode)
    assert result is not None and result.episode is episode


# --- report_setup ----------------------------------------------------------------------------------


def test_report_setup_without_a_guard_reports_nothing():
    assert scoring.report_setup(None, FakeClock(), PROXY_LEAF, None) is None


def test_a_successful_dial_hands_the_guard_to_a_set_up_reporter():
    rig = Rig()
    guard = scoring.begin(rig.feedback, rig.clock)
    rig.clock.advance(STEP)
    reporter = scoring.report_setup(guard, rig.clock, PROXY_LEAF, None)
    assert reporter is not None and guard.transferred
    assert reporter.setup_at == rig.clock.now()


def test_a_neutral_dial_end_cancels_the_guard_and_records_nothing():
    rig = Rig()
    guard = scoring.begin(rig.feedback, rig.clock)
    assert scoring.report_setup(guard, rig.clock, PROXY_LEAF, CapacityRefused("no permit")) is None
    assert guard.cancelled
    assert rig.exact().attempts.value(rig.clock.now()) == 0
    assert rig.target_episode() is None


def test_a_node_scoped_setup_failure_opens_an_episode_on_the_nodes_aggregate_cells():
    rig = Rig()
    guard = scoring.begin(rig.feedback, rig.clock)
    assert scoring.report_setup(guard, rig.clock, PROXY_LEAF, DialError("n1", "connect", "refused")) is None
    now = rig.clock.now()
    assert rig.exact().setup_failures.value(now) == 1
    assert rig.target_episode() is not None
    assert all(episode is not None for episode in rig.node_episodes())


def test_a_target_scoped_setup_failure_leaves_the_nodes_aggregate_cells_without_an_episode():
    rig = Rig()
    guard = scoring.begin(rig.feedback, rig.clock)
    scoring.report_setup(guard, rig.clock, DIRECT_LEAF, DialError("direct", "connect", "refused"))
    assert rig.exact().setup_failures.value(rig.clock.now()) == 1
    assert rig.target_episode() is not None
    assert rig.node_episodes() and all(episode is None for episode in rig.node_episodes())


# --- the relay observer (FlowVerdict's Score half) -------------------------------------------------------------------------------


def test_the_relay_observer_feeds_tx_and_rx_at_the_clocks_time():
    rig = Rig()
    reporter = rig.reporter()
    observer = FlowVerdict(rig.clock, PROXY_LEAF, reporter, NO_DEADLINE)
    rig.clock.advance(STEP)
    observer(10, 0)
    assert (reporter.tx_bytes, reporter.rx_bytes) == (10, 0)
    rig.clock.advance(STEP)
    observer(0, 7)
    assert (reporter.tx_bytes, reporter.rx_bytes) == (10, 7)
    assert reporter.first_response_at == rig.clock.now()
    assert reporter.response_time == pytest.approx(2 * STEP)


def test_the_relay_observer_announces_the_reporter_so_its_rx_is_credited():
    rig = Rig()
    reporter = rig.reporter()
    observer = FlowVerdict(rig.clock, PROXY_LEAF, reporter, NO_DEADLINE)
    observer(3, 0)
    rig.clock.advance(STEP)
    observer(0, 3)
    assert rig.cohorts.reporters(rig.step.cohort_cell(), rig.clock.now()) == 1


def test_rx_without_any_tx_is_not_credited_to_the_cohort():
    rig = Rig()
    reporter = rig.reporter()
    FlowVerdict(rig.clock, PROXY_LEAF, reporter, NO_DEADLINE)(0, 5)
    assert reporter.rx_bytes == 5
    assert rig.cohorts.reporters(rig.step.cohort_cell(), rig.clock.now()) == 0


def test_the_relay_observer_ignores_zero_counts():
    rig = Rig()
    reporter = rig.reporter()
    FlowVerdict(rig.clock, PROXY_LEAF, reporter, NO_DEADLINE)(0, 0)
    assert (reporter.tx_bytes, reporter.rx_bytes, reporter.first_response_at) == (0, 0, None)


# --- settle_relay --------------------------------------------------------------------------------


def _relayed(rig: Rig, *, answered: bool):
    reporter = rig.reporter()
    observer = FlowVerdict(rig.clock, PROXY_LEAF, reporter, NO_DEADLINE)
    observer(4, 0)
    if answered:
        rig.clock.advance(STEP)
        observer(0, 4)
    return reporter


def test_settle_relay_without_a_reporter_does_nothing():
    scoring.settle_relay(None, FakeClock(), None)


def test_both_directions_finishing_after_a_response_is_a_useful_completion():
    rig = Rig()
    reporter = _relayed(rig, answered=True)
    scoring.settle_relay(reporter, rig.clock, None)
    now = rig.clock.now()
    assert reporter.settlement.ending is Ending.SUCCESS
    assert rig.exact().useful.value(now) == 1


def test_both_directions_finishing_without_a_response_is_a_plain_success():
    rig = Rig()
    reporter = _relayed(rig, answered=False)
    scoring.settle_relay(reporter, rig.clock, None)
    now = rig.clock.now()
    assert rig.exact().successes.value(now) == 1
    assert rig.exact().useful.value(now) == 0


@pytest.mark.parametrize(
    "error",
    [ClientGone("reset by the client"), FlowClosed("operator"), asyncio.CancelledError()],
    ids=["client-gone", "flow-closed", "cancelled"],
)
def test_client_side_and_deliberate_relay_ends_are_neutral(error):
    rig = Rig()
    reporter = _relayed(rig, answered=True)
    scoring.settle_relay(reporter, rig.clock, error)
    assert reporter.settlement.outcome is None
    assert rig.exact().attempts.value(rig.clock.now()) == 0


def test_an_upstream_failure_after_setup_is_target_scoped():
    rig = Rig()
    reporter = _relayed(rig, answered=True)
    scoring.settle_relay(reporter, rig.clock, UpstreamFailed("reset by the upstream"))
    assert rig.exact().failures.value(rig.clock.now()) == 1
    assert rig.target_episode() is not None
    assert all(episode is None for episode in rig.node_episodes())


def test_a_codec_error_is_node_scoped():
    rig = Rig()
    reporter = _relayed(rig, answered=True)
    scoring.settle_relay(reporter, rig.clock, CodecError("aead", "tag mismatch"))
    assert rig.exact().failures.value(rig.clock.now()) == 1
    assert rig.node_episodes() and all(episode is not None for episode in rig.node_episodes())


@pytest.mark.parametrize(
    ("answered", "useful", "failures"),
    [(True, 1, 0), (False, 0, 1)],
    ids=["after-a-response", "without-a-response"],
)
def test_idle_expiry_is_a_success_after_a_response_else_a_failure(answered, useful, failures):
    rig = Rig()
    reporter = _relayed(rig, answered=answered)
    scoring.settle_relay(reporter, rig.clock, IdleTimeout("no traffic"))
    now = rig.clock.now()
    assert rig.exact().useful.value(now) == useful
    assert rig.exact().failures.value(now) == failures


def test_a_relay_settles_once():
    rig = Rig()
    reporter = _relayed(rig, answered=True)
    scoring.settle_relay(reporter, rig.clock, None)
    scoring.settle_relay(reporter, rig.clock, UpstreamFailed("late"))
    now = rig.clock.now()
    assert rig.exact().attempts.value(now) == 1
    assert rig.exact().failures.value(now) == 0


def test_cancel_settles_neutrally():
    rig = Rig()
    reporter = _relayed(rig, answered=True)
    scoring.cancel(reporter, rig.clock, Ending.SHUTDOWN)
    assert reporter.settlement.ending is Ending.SHUTDOWN
    assert rig.exact().attempts.value(rig.clock.now()) == 0


def test_an_ip_destination_decides_the_family_of_a_name_target():
    """A name target with the address actually used keys an exact cell (of that family)."""
    evidence, cohorts = ScoreEvidence(), Cohorts()
    target = ScoreTarget.of("example.test", 80)
    step = Traversal(GROUP, Network.TCP, target, NODE, ipaddress.ip_address("192.0.2.1"))
    guard = scoring.begin(ScoreFeedback.of([step], evidence, cohorts), FakeClock())
    assert guard is not None
    assert evidence.layers(GROUP, Network.TCP, target, NODE, step.destination)[2] is not None
