"""Glue between the flow paths and Score's reporters (:mod:`honk.group.score.attempt`).

A flow routed through a Score group carries a :class:`~honk.group.score.attempt.ScoreFeedback`
on its :class:`~honk.connection.dispatch.Routed` (``routed.score``). The paths that do I/O use
this module so that every business path reports the same way (GH-K-24):

* :func:`begin` admits the attempt before node-specific work (the dial budget wait included);
  the guard is handed to a reporter only when physical I/O starts (:meth:`ScoreBusinessGuard.into_reporter`).
* :func:`setup_failure` maps a dial error onto a Score result: a local refusal (no dial permit,
  no socket) is neutral, a refusal the proxy relayed from the target (phase ``target``) and any
  failure of a ``direct`` leaf (it has no proxy of its own) are the target path's, everything
  else before setup is the node's.
* :class:`~honk.connection.verdict.FlowVerdict` is what a relay engine calls with byte counts
  (``engine.observer``): TX announces the reporter, RX feeds the throttled publication (GH-K-72).
* :func:`settle_relay` settles a relayed flow from its typed end (:func:`classify_relay_end`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from honk.core.clock import Clock
from honk.core.errors import CapacityRefused, ClientGone, DialError, FlowClosed, HonkError
from honk.group.score.attempt import (
    Ending,
    Episode,
    Result,
    ScoreAttemptRefused,
    ScoreBusinessGuard,
    ScoreFeedback,
    ScoreReporter,
    classify_relay_end,
)

__all__ = ["ScoreAttemptRefused", "begin", "report_setup", "settle_relay", "setup_failure"]


# Ends of a dial that say nothing about the node: no dial permit or socket here, the client left,
# the flow was closed or cancelled.
_NEUTRAL_SETUP_ENDS = (CapacityRefused, ClientGone, FlowClosed, asyncio.CancelledError)


def begin(feedback: ScoreFeedback | None, clock: Clock) -> ScoreBusinessGuard | None:
    """A new attempt of the flow admitted into its Score groups; None for a flow outside Score.
    Raises :class:`ScoreAttemptRefused` when the selected member left its group meanwhile."""
    if feedback is None:
        return None
    return feedback.start().begin(clock.now())


def setup_failure(leaf: Any, error: BaseException, episode: Episode | None = None) -> Result | None:
    """The Score result of a dial that failed before setup; None: neutral (nothing recorded).
    ``episode``: the failure is one shared by several flows (one carrier's dial)."""
    if isinstance(error, _NEUTRAL_SETUP_ENDS) or not isinstance(error, HonkError):
        return None
    if getattr(leaf, "protocol", None) == "direct":
        return Result.failure(episode, node_scoped=False)
    if isinstance(error, DialError) and error.phase == "target":
        return Result.failure(episode, node_scoped=False)
    return Result.failure(episode, node_scoped=True)


def report_setup(
    guard: ScoreBusinessGuard | None,
    clock: Clock,
    leaf: Any,
    error: BaseException | None,
    *,
    episode: Episode | None = None,
    dial_started: float | None = None,
) -> ScoreReporter | None:
    """Hand ``guard`` to a reporter once the dial ended: setup stamped on success, the failure
    (or the neutral end) settled otherwise. None without a guard or after a failure.
    ``dial_started``: when the dial really began, after its permit (setup latency runs from there)."""
    if guard is None:
        return None
    now = clock.now()
    if error is None:
        reporter = guard.into_reporter(now, dial_started)
        reporter.setup(now)
        return reporter
    result = setup_failure(leaf, error, episode)
    if result is None:
        guard.close()
    else:
        guard.into_reporter(now, dial_started).settle(now, result)
    return None


def settle_relay(reporter: ScoreReporter | None, clock: Clock, error: BaseException | None) -> None:
    """Settle a relayed flow from how it ended (None: both directions finished)."""
    if reporter is not None:
        reporter.settle(clock.now(), classify_relay_end(error))


def cancel(reporter: ScoreReporter | None, clock: Clock, ending: Ending = Ending.CANCELLED) -> None:
    """Settle neutrally (shutdown, cancellation): nothing recorded."""
    if reporter is not None:
        reporter.cancel(clock.now(), ending)
