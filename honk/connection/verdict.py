"""What one relayed TCP flow says about its node, once it has something to say.

A node can confirm a connection and then fail the flow: reset it, or accept the
client's bytes and never answer. The dial saw a success; only the relay can see
the rest. :class:`FlowVerdict` is the relay engine's ``observer`` (it is told
``(up, down)`` byte deltas) for every flow through a proxy node or a Score group,
and it decides the flow's one outcome:

* **answered** -- the first response byte arrived: a good flow for the node's
  health (:meth:`~honk.alive.traffic.NodeTraffic.flow_answered`);
* **silent** -- the client sent data, stopped, and nothing came back within
  ``response_timeout`` of the last byte honk saw it send: a failed attempt for
  Score and a TCP traffic failure for health, logged once. The flow itself goes
  on: the client decides when to give up, and a late answer is still relayed;
* **reset before any answer** -- the relay ended with an upstream failure after
  the client sent data and before any response byte: a traffic failure;
* nothing otherwise: a flow that sent nothing (an idle connection, a server that
  speaks first and did), a client that left, a flow closed by honk.

The timer starts at the first upstream byte, so a long-lived connection that sends
nothing is never judged, and it runs from the client's latest byte, so a client
that is still sending (an upload, a one-way stream) is not waiting for an answer
and is not judged either. The relay engines report bytes at most once a second
(the first a second after the flow opened, or with the first response byte), so
the deadline can run up to a second late; it never runs early.

It also forwards every byte count to the flow's Score reporter (TX announces the
reporter, RX feeds its publication, GH-K-72), so one observer serves both.
"""

from __future__ import annotations

import logging
from typing import Any

from honk.alive.traffic import NodeTraffic, traffic_of
from honk.core.clock import Clock, Deadlines, TimerHandle
from honk.core.errors import CodecError, UpstreamFailed
from honk.core.logs import kv
from honk.group.score.attempt import Result, ScoreReporter

__all__ = ["FlowVerdict", "observe_flow"]

log = logging.getLogger("honk.connection")


class FlowVerdict:
    """The observer of one relayed flow: byte counts to Score, one outcome to health."""

    __slots__ = (
        "clock",
        "decided",
        "deadlines",
        "leaf",
        "reporter",
        "response_timeout",
        "sent_at",
        "last_sent",
        "timer",
        "traffic",
    )

    def __init__(
        self,
        clock: Clock,
        leaf: Any,
        reporter: ScoreReporter | None,
        response_timeout: float,
        deadlines: Deadlines | None = None,
        traffic: NodeTraffic | None = None,
    ) -> None:
        self.clock = clock
        # the response deadline's timer: one heap entry on the relay's shared Deadlines (nearly
        # every flow is answered in time: a loop timer each would cost more), else the clock's own
        self.deadlines = deadlines
        self.reporter = reporter
        self.traffic = traffic if traffic is not None else traffic_of(leaf)
        self.leaf = leaf  # its name and health family are read only when the flow failed
        self.response_timeout = response_timeout
        self.sent_at: float | None = None  # when honk first saw the client's bytes go upstream
        self.last_sent = 0.0  # ... and last: the deadline runs from here
        self.timer: TimerHandle | None = None
        self.decided = False  # the outcome is given (answered or failed), or nobody listens

    def __call__(self, up: int, down: int) -> None:
        reporter = self.reporter
        if self.decided and reporter is None:
            return  # the verdict is given and Score does not listen: a relay's later chunks cost nothing
        now = self.clock.now()
        if up:
            if reporter is not None:
                reporter.tx(now, up)
            self.last_sent = now
            if self.sent_at is None:
                self.sent_at = now
                if (
                    not self.decided and not down and self.response_timeout > 0
                ):  # answered in the same report: no timer
                    self._arm(now + self.response_timeout)
        if down:
            if reporter is not None:
                reporter.rx(now, down)
            if not self.decided:
                self._stop()
                if self.traffic is not None:
                    self.traffic.flow_answered()

    def end(self, error: BaseException | None) -> None:
        """The relay ended with ``error`` (None: both directions finished). A flow that sent
        data and had its upstream fail before any answer failed; anything else says nothing."""
        if self.decided:
            return
        self._stop()
        if (
            self.sent_at is not None
            and isinstance(error, UpstreamFailed | CodecError)
            and self.traffic is not None
        ):
            self.traffic.flow_failed(self.family)

    @property
    def family(self) -> int:
        """The health family of the flow's node (4 for a named server)."""
        return getattr(self.leaf, "health_family", 4)

    @property
    def leaf_name(self) -> str:
        return getattr(self.leaf, "name", "")

    def _silent(self) -> None:
        self.timer = None
        if self.decided:
            return
        now = self.clock.now()
        waited = now - self.last_sent
        if waited < self.response_timeout:  # the client sent more since: it was not waiting yet
            self._arm(self.last_sent + self.response_timeout)
            return
        self.decided = True
        log.info("flow got no response %s", kv(node=self.leaf_name, after=f"{now - self.last_sent:.1f}s"))
        if self.traffic is not None:
            self.traffic.flow_failed(self.family)
        if self.reporter is not None:
            # the target path's failure (after setup, GH-K-14): Score leaves this node for the target
            self.reporter.settle(now, Result.failure())

    def _arm(self, when: float) -> None:
        if self.deadlines is not None:
            self.timer = self.deadlines.at(when, self._silent)
        else:
            self.timer = self.clock.call_later(when - self.clock.now(), self._silent)

    def _stop(self) -> None:
        self.decided = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


def observe_flow(
    clock: Clock,
    leaf: Any,
    reporter: ScoreReporter | None,
    response_timeout: float,
    deadlines: Deadlines | None = None,
) -> FlowVerdict | None:
    """The observer a relay of ``leaf`` gets: None when neither a node's health nor Score
    listens (``direct`` and ``block`` outside Score). ``deadlines``: where its response
    deadline waits (the caller's, on ``clock``)."""
    traffic = traffic_of(leaf)
    if reporter is None and traffic is None:
        return None
    return FlowVerdict(clock, leaf, reporter, response_timeout, deadlines, traffic)
