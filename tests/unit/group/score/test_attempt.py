"""Score's attempt, guard and reporter lifecycle (GH-K-05, GH-K-17, GH-K-20, GH-K-69..78)."""

from __future__ import annotations

import asyncio
import errno
import gc

import pytest

from honk.core.errors import (
    FlowClosed,
    IdleTimeout,
    OutboundDrained,
    RelayError,
    UpstreamFailed,
)
from honk.core.net import Network
from honk.group.score.attempt import (
    Ending,
    Episode,
    Result,
    ScoreAttemptRefused,
    ScoreFeedback,
    ScoreLifecycleError,
    Traversal,
    classify_relay_end,
)
from honk.group.score.cells import Outcome
from honk.group.score.cohort import Cohorts, FailResult
from honk.group.score.constants import RECOVERY_REPORTERS, RX_PUBLISH_INTERVAL
from honk.group.score.evidence import ScoreEvidence
from honk.group.score.keys import AggregateKey, ScoreTarget
from honk.relay.ends import client_error, local_error, upstream_error

NODE = "node-a"
TARGET = ScoreTarget.of("192.0.2.7", 443)
RESPONSE_DELAY = 0.05
STEP = RX_PUBLISH_INTERVAL / 2
NBYTES = 1200


def _path(*groups: str, target: ScoreTarget | None = TARGET) -> list[Traversal]:
    return [Traversal(group, Network.TCP, target, NODE) for group in groups]


def _feedback(evidence: ScoreEvidence, cohorts: Cohorts, *groups: str) -> ScoreFeedback:
    return ScoreFeedback.of(_path(*(groups or ("g",))), evidence, cohorts)


def _global(evidence: ScoreEvidence, group: str = "g"):
    return evidence.aggregate.peek(AggregateKey(group, Network.TCP, None, NODE))


def _cell(group: str = "g"):
    return _path(group)[0].cohort_cell()


def _flowing(feedback: ScoreFeedback, at: float = 0.0):
    """A reporter that set up, sent and received at ``at``."""
    reporter = feedback.start().begin(at).into_reporter(at)
    reporter.setup(at)
    reporter.tx(at, NBYTES)
    reporter.rx(at + RESPONSE_DELAY, NBYTES)
    return reporter


# --- attempt and guard ---------------------------------------------------------------------------


def test_attempt_begins_once() -> None:
    attempt = _feedback(ScoreEvidence(), Cohorts()).start()
    attempt.begin(0.0)
    assert attempt.begun
    with pytest.raises(ScoreLifecycleError):
        attempt.begin(1.0)


def test_begin_is_refused_when_the_member_was_pruned_and_admits_nothing() -> None:
    evidence = ScoreEvidence([("outer", NODE), ("g", NODE)])
    attempt = _feedback(evidence, Cohorts(), "outer", "g").start()
    evidence.prune([("outer", NODE)])
    with pytest.raises(ScoreAttemptRefused):
        attempt.begin(0.0)
    assert _global(evidence, "outer") is None  # all-or-nothing: no cell created for "outer"


def test_guard_transfers_once_and_not_after_close() -> None:
    feedback = _feedback(ScoreEvidence(), Cohorts())
    guard = feedback.start().begin(0.0)
    guard.into_reporter(0.0)
    with pytest.raises(ScoreLifecycleError):
        guard.into_reporter(0.0)
    closed = feedback.start().begin(0.0)
    closed.close()
    assert closed.cancelled
    with pytest.raises(ScoreLifecycleError):
        closed.into_reporter(0.0)


def test_dropped_guard_cancels_neutrally() -> None:
    evidence = ScoreEvidence()
    feedback = _feedback(evidence, Cohorts())
    guard = feedback.start().begin(0.0)
    with feedback.start().begin(0.0) as scoped:
        pass
    assert scoped.cancelled
    del guard
    gc.collect()
    cell = _global(evidence)
    assert cell is not None and cell.attempts.value(0.0) == 0.0


def test_closing_a_transferred_guard_does_not_cancel_the_reporter() -> None:
    evidence = ScoreEvidence()
    guard = _feedback(evidence, Cohorts()).start().begin(0.0)
    reporter = guard.into_reporter(0.0)
    guard.close()
    assert not guard.cancelled
    reporter.setup(0.0)
    assert reporter.settle(1.0, Result.success()).outcome is Outcome.SUCCESS


# --- reporter ------------------------------------------------------------------------------------


def test_setup_and_first_response_publish_once_with_their_own_time() -> None:
    reporter = _feedback(ScoreEvidence(), Cohorts()).start().begin(0.0).into_reporter(0.0)
    assert reporter.setup(1.0)
    assert not reporter.setup(2.0)
    reporter.tx(1.1, NBYTES)
    reporter.rx(1.5, NBYTES)  # the first positive RX is the first response
    assert not reporter.first_response(3.0)
    assert (reporter.setup_at, reporter.first_response_at) == (1.0, 1.5)
    assert reporter.response_time == pytest.approx(0.5)


def test_settle_contributes_one_outcome() -> None:
    evidence = ScoreEvidence()
    reporter = _flowing(_feedback(evidence, Cohorts()))
    first = reporter.settle(1.0, Result.success())
    assert first is not None and first.outcome is Outcome.USEFUL
    assert reporter.settle(2.0, Result.failure()) is None
    cell = _global(evidence)
    assert cell.attempts.value(2.0) == pytest.approx(1.0, rel=1e-3)
    assert cell.failures.value(2.0) == 0.0


@pytest.mark.parametrize(
    ("setup", "respond", "result", "expected"),
    [
        (True, True, Result.success(), Outcome.USEFUL),
        (True, False, Result.success(), Outcome.SUCCESS),
        (False, False, Result.failure(), Outcome.SETUP_FAILURE),
        (True, False, Result.failure(), Outcome.FAILURE),
        (True, True, Result.idle(), Outcome.USEFUL),
        (True, False, Result.idle(), Outcome.FAILURE),
    ],
)
def test_settlement_maps_the_ending_onto_one_cell_outcome(setup, respond, result, expected) -> None:
    reporter = _feedback(ScoreEvidence(), Cohorts()).start().begin(0.0).into_reporter(0.0)
    if setup:
        reporter.setup(0.1)
        reporter.tx(0.1, NBYTES)
    if respond:
        reporter.first_response(0.2)
    assert reporter.settle(1.0, result).outcome is expected


@pytest.mark.parametrize("ending", [Ending.CANCELLED, Ending.REJECTED, Ending.SHUTDOWN, Ending.CLIENT_GONE])
def test_neutral_endings_record_nothing_but_keep_the_held_rx(ending) -> None:
    evidence, cohorts = ScoreEvidence(), Cohorts()
    reporter = _flowing(_feedback(evidence, cohorts))
    held_at = RESPONSE_DELAY + STEP
    reporter.rx(held_at, NBYTES)  # inside the throttle interval: held
    settled = reporter.settle(held_at + STEP, Result.neutral(ending))
    assert settled.outcome is None and settled.ending is ending
    assert _global(evidence).attempts.value(1.0) == 0.0
    assert cohorts.reporters(_cell(), held_at + STEP) == 1
    assert cohorts.failures(_cell()) == 0


def test_dropping_an_unsettled_reporter_cancels() -> None:
    evidence = ScoreEvidence()
    reporter = _flowing(_feedback(evidence, Cohorts()))
    del reporter
    gc.collect()
    assert _global(evidence).attempts.value(1.0) == 0.0


def test_nested_attribution_counts_each_traversed_group_once() -> None:
    evidence, cohorts = ScoreEvidence(), Cohorts()
    feedback = ScoreFeedback.of(_path("outer", "inner", "outer"), evidence, cohorts)
    assert [step.group for step in feedback.traversed] == ["outer", "inner"]
    _flowing(feedback).settle(1.0, Result.success())
    for group in ("outer", "inner"):
        assert _global(evidence, group).useful.value(1.0) == pytest.approx(1.0, rel=1e-3)
        assert cohorts.reporters(_cell(group), 1.0) == 1


def _fail(cohorts: Cohorts, evidence: ScoreEvidence, at: float) -> None:
    reporter = _flowing(_feedback(evidence, cohorts), at)
    reporter.settle(at + 1.0, Result.failure())


def test_clones_count_once_toward_the_recovery_quorum() -> None:
    evidence, cohorts = ScoreEvidence(), Cohorts()
    _fail(cohorts, evidence, 0.0)
    assert cohorts.open_episode(_cell()) is not None
    feedback = _feedback(evidence, cohorts)
    for i in range(RECOVERY_REPORTERS):  # a flow, its retries and clones: one business identity
        source = feedback if i % 2 == 0 else feedback.clone()
        _flowing(source, 10.0 + i)
    assert cohorts.open_episode(_cell()) is not None
    assert cohorts.reporters(_cell(), 14.0) == 1
    for i in range(RECOVERY_REPORTERS - 1):  # independent business flows complete the quorum
        _flowing(_feedback(evidence, cohorts), 15.0 + i)
    assert cohorts.open_episode(_cell()) is None


def test_starting_feedback_leaves_its_clones_meaning_unchanged() -> None:
    feedback = _feedback(ScoreEvidence(), Cohorts())
    clone = feedback.clone()
    first, second = feedback.start(), clone.start()
    assert first.reporter != second.reporter
    assert first.reporter.key == second.reporter.key == feedback.origin
    assert clone == feedback and clone.traversed == feedback.traversed


def test_tx_only_reporters_never_recover() -> None:
    evidence, cohorts = ScoreEvidence(), Cohorts()
    _fail(cohorts, evidence, 0.0)
    for i in range(RECOVERY_REPORTERS + 1):
        reporter = _feedback(evidence, cohorts).start().begin(10.0 + i).into_reporter(10.0 + i)
        reporter.setup(10.0 + i)
        reporter.tx(10.0 + i, NBYTES)
        reporter.settle(11.0 + i, Result.success())
    assert cohorts.open_episode(_cell()) is not None
    assert cohorts.reporters(_cell(), 20.0) == 0


def test_rx_before_any_tx_is_not_credited() -> None:
    cohorts = Cohorts()
    reporter = _feedback(ScoreEvidence(), cohorts).start().begin(0.0).into_reporter(0.0)
    reporter.setup(0.0)
    reporter.rx(0.5, NBYTES)
    assert cohorts.reporters(_cell(), 0.5) == 0


def test_client_side_termination_is_neutral_but_upstream_failure_counts() -> None:
    evidence, cohorts = ScoreEvidence(), Cohorts()
    gone = _flowing(_feedback(evidence, cohorts))
    gone.settle(1.0, classify_relay_end(client_error(errno.ECONNRESET)))
    assert cohorts.failures(_cell()) == 0 and _global(evidence).failures.value(1.0) == 0.0
    lost = _flowing(_feedback(evidence, cohorts), 2.0)
    lost.settle(3.0, classify_relay_end(upstream_error(errno.ECONNRESET)))
    assert cohorts.failures(_cell()) == 1
    assert _global(evidence).failures.value(3.0) == pytest.approx(1.0, rel=1e-3)


def test_neutral_end_keeps_prior_failure_state() -> None:
    evidence, cohorts = ScoreEvidence(), Cohorts()
    _fail(cohorts, evidence, 0.0)
    episode = cohorts.open_episode(_cell())
    _flowing(_feedback(evidence, cohorts), 5.0).settle(6.0, classify_relay_end(client_error(errno.EPIPE)))
    assert cohorts.open_episode(_cell()) == episode
    assert cohorts.failures(_cell()) == 1


@pytest.mark.parametrize(
    "err",
    [
        errno.ECONNRESET,
        errno.ECONNABORTED,
        errno.EPIPE,
        errno.ENOTCONN,
        errno.ETIMEDOUT,
        errno.EHOSTUNREACH,
        errno.ENETUNREACH,
        None,
    ],
)
def test_client_side_errnos_are_neutral_and_upstream_ones_fail(err) -> None:
    assert classify_relay_end(client_error(err)).ending is Ending.CLIENT_GONE
    assert classify_relay_end(upstream_error(err)).ending is Ending.FAILURE


@pytest.mark.parametrize(
    ("error", "ending"),
    [
        (None, Ending.SUCCESS),
        (FlowClosed("closed by request"), Ending.CANCELLED),
        (OutboundDrained(), Ending.CANCELLED),
        (asyncio.CancelledError(), Ending.CANCELLED),
        (IdleTimeout("idle"), Ending.IDLE),
        (UpstreamFailed("upstream connection lost"), Ending.FAILURE),
        (client_error(errno.EINVAL), Ending.FAILURE),  # unexpected errno on the client: not neutral
        (local_error(errno.ENOMEM), Ending.FAILURE),
        (RelayError("relay failed"), Ending.FAILURE),
        (ValueError("unclassified"), Ending.FAILURE),
    ],
)
def test_relay_ends_classify_by_type(error, ending) -> None:
    assert classify_relay_end(error).ending is ending


def test_a_broken_node_codec_is_node_scoped_and_a_mux_session_reset_is_not() -> None:
    from honk.proto.mux import MuxSessionReset
    from honk.proto.shadowsocks import ShadowsocksAuthError

    assert classify_relay_end(ShadowsocksAuthError("bad-tag")).node_scoped is True
    reset = classify_relay_end(MuxSessionReset(7))
    assert reset.ending is Ending.FAILURE and not reset.node_scoped  # one flow's end: the target path's
    assert not classify_relay_end(UpstreamFailed("upstream connection lost")).node_scoped  # decided by setup


def test_flows_ended_by_one_error_object_or_by_errors_it_caused_share_one_episode() -> None:
    from honk.proto.mux import MuxError

    carrier = MuxError("carrier-lost", "reset")  # a mux carrier's loss: the same object to every stream
    first, second = classify_relay_end(carrier), classify_relay_end(carrier)
    assert first.node_scoped and first.episode is second.episode
    cause = ConnectionResetError(104, "reset")
    wrapped = [UpstreamFailed("upstream connection lost") for _ in range(2)]
    for error in wrapped:
        error.__cause__ = cause
    assert classify_relay_end(wrapped[0]).episode is classify_relay_end(wrapped[1]).episode
    # separate failures stay separate episodes; an episode the caller names wins
    assert (
        classify_relay_end(UpstreamFailed("a")).episode is not classify_relay_end(UpstreamFailed("b")).episode
    )
    named = Episode()
    assert classify_relay_end(carrier, episode=named).episode is named


def test_one_failure_fans_out_with_one_episode_to_several_flows() -> None:
    evidence, cohorts = ScoreEvidence(), Cohorts()
    flows = [_flowing(_feedback(evidence, cohorts)) for _ in range(3)]
    carrier = Episode()
    results = [
        flow.settle(1.0 + i * STEP, classify_relay_end(upstream_error(errno.ECONNRESET), episode=carrier))
        for i, flow in enumerate(flows)
    ]
    assert all(r.outcome is Outcome.FAILURE for r in results)
    assert cohorts.failures(_cell()) == len(flows)
    assert cohorts.open_episode(_cell()) == carrier
    assert cohorts.fail(_cell(), 3.0, episode=carrier) is FailResult.KEPT


def test_independent_failures_are_separate_episodes() -> None:
    assert Result.failure().episode != Result.failure().episode
    assert classify_relay_end(UpstreamFailed("x")).episode != classify_relay_end(UpstreamFailed("x")).episode


def test_settlement_flushes_a_held_rx_at_its_own_time() -> None:
    evidence, cohorts = ScoreEvidence(), Cohorts()
    _fail(cohorts, evidence, 0.0)
    reporter = _flowing(_feedback(evidence, cohorts), 10.0)
    reporter.rx(10.0 + RESPONSE_DELAY + STEP, NBYTES)  # held
    reporter.settle(11.0, Result.success())
    assert cohorts.reporters(_cell(), 11.0) == 1
    assert reporter.rx_bytes == 2 * NBYTES and reporter.tx_bytes == NBYTES


def test_rx_after_settlement_is_ignored() -> None:
    cohorts = Cohorts()
    reporter = _feedback(ScoreEvidence(), cohorts).start().begin(0.0).into_reporter(0.0)
    reporter.settle(0.5, Result.neutral())
    reporter.setup(1.0)
    reporter.tx(1.0, NBYTES)
    reporter.rx(1.1, NBYTES)
    assert reporter.setup_at is None and reporter.rx_bytes == 0
    assert cohorts.reporters(_cell(), 1.1) == 0


def test_neutral_result_refuses_a_non_neutral_ending() -> None:
    with pytest.raises(ValueError):
        Result.neutral(Ending.FAILURE)


def test_late_feedback_for_pruned_membership_is_ignored() -> None:
    evidence, cohorts = ScoreEvidence([("outer", NODE), ("g", NODE)]), Cohorts()
    reporter = _flowing(ScoreFeedback.of(_path("outer", "g"), evidence, cohorts))
    evidence.prune([("outer", NODE)])
    reporter.settle(1.0, Result.failure())
    assert cohorts.failures(_cell("g")) == 0 and cohorts.open_episode(_cell("g")) is None
    assert cohorts.failures(_cell("outer")) == 1
    assert _global(evidence, "outer").failures.value(1.0) == pytest.approx(1.0, rel=1e-3)
