"""Draining outbound versions that left service (requirements RL-47..RL-51, RL-70).

When a commit replaces or removes an outbound, the version it replaced (``tag@vN``)
is handed to the daemon's one :class:`Drainer` with the drain policy in effect:

* ``keep``: nothing is closed; the version is only noted, so the
  ``honk_outbound_draining_versions`` gauge shows it while it still holds flows;
* ``close``: its flows are closed now, each ending with ``OutboundDrained``;
* ``close_after(grace)``: a task sleeps ``grace`` seconds of the injected clock,
  then closes them. :meth:`Drainer.aclose` (shutdown) cancels every pending
  timer at once and closes nothing itself: shutdown never waits for a grace.

The drainer holds version ids (strings), never the leaf objects, so a replaced
version is not kept alive by it. New flows never open on a drained version (the
published plane no longer serves it), so a version that holds no flow is
forgotten.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from honk.config.policies import CLOSE_AFTER_KIND, CLOSE_KIND, ClosePolicy
from honk.connection.tracker import ConnectionTracker
from honk.core.clock import Clock
from honk.core.errors import OutboundDrained
from honk.core.logs import kv
from honk.core.stats import RuntimeStats

__all__ = ["Drainer", "outbound_tag"]

log = logging.getLogger("honk.control")

_VERSION_MARK = "@v"  # OutboundId's text: tag@vN
# Drained versions kept before the ones without flows are forgotten without a scrape asking
# (draining() forgets them too); the bound then doubles with what is left, so pruning stays
# amortised over many drains.
_PRUNE_FLOOR = 256


def outbound_tag(outbound_id: str) -> str:
    """The tag of an outbound version's text (``proxy@v3`` -> ``proxy``); a plain name is its own."""
    tag, mark, version = outbound_id.rpartition(_VERSION_MARK)
    return tag if mark and version.isdigit() else outbound_id


class Drainer:
    """The drains of one daemon: which versions left service, and their pending close timers."""

    def __init__(self, tracker: ConnectionTracker, clock: Clock, stats: RuntimeStats | None = None) -> None:
        self._tracker = tracker
        self._clock = clock
        self._stats = stats
        self._drained: set[str] = set()  # versions out of service that may still hold flows
        self._timers: dict[str, asyncio.Task[None]] = {}  # version -> its close_after timer
        self._closed = False
        self._prune_at = _PRUNE_FLOOR

    def drain(self, outbound_id: str, policy: ClosePolicy) -> None:
        """``outbound_id`` left service: apply ``policy`` to its flows (see the module docstring).

        Accepts anything whose ``str`` is the version's text (an ``OutboundId``)."""
        version = str(outbound_id)
        self._cancel_timer(version)  # a version is drained once; a repeat replaces the pending policy
        self._drained.add(version)
        if len(self._drained) > self._prune_at:
            self._prune(self._tracker.versions_with_flows())
            self._prune_at = max(_PRUNE_FLOOR, 2 * len(self._drained))
        log.info("outbound drained %s", kv(outbound_version=version, policy=str(policy)))
        if policy.kind == CLOSE_KIND:
            self._close(version, policy)
        elif policy.kind == CLOSE_AFTER_KIND and not self._closed:
            self._timers[version] = asyncio.get_running_loop().create_task(self._close_after(version, policy))

    def draining(self) -> dict[str, int]:
        """Per tag, the versions that left service and still hold flows (the metric's gauge).

        Forgets the drained versions that no longer hold any."""
        live = self._tracker.versions_with_flows()
        self._prune(live)
        out: dict[str, int] = {}
        for version in self._drained:
            if live.get(version, 0) > 0:
                tag = outbound_tag(version)
                out[tag] = out.get(tag, 0) + 1
        return out

    @property
    def pending(self) -> int:
        """close_after timers not yet fired."""
        return len(self._timers)

    async def aclose(self) -> None:
        """Cancel every pending close_after timer now (shutdown closes the flows itself)."""
        self._closed = True
        timers = list(self._timers.values())
        self._timers.clear()
        for task in timers:
            task.cancel()
        for task in timers:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # -- internals -------------------------------------------------------------------------------

    async def _close_after(self, version: str, policy: ClosePolicy) -> None:
        await self._clock.sleep(policy.grace)
        if self._timers.get(version) is asyncio.current_task():  # fired: no longer pending
            del self._timers[version]
        self._close(version, policy)

    def _close(self, version: str, policy: ClosePolicy) -> None:
        closed = self._tracker.close_version(version, OutboundDrained())
        if self._stats is not None:
            self._stats.drained_closed(policy.label, closed)
        log.info("drained flows closed %s", kv(outbound_version=version, policy=str(policy), flows=closed))

    def _prune(self, live: dict[str, int]) -> None:
        """Forget drained versions without flows (none opens on them again) and without a timer."""
        self._drained = {v for v in self._drained if live.get(v, 0) > 0 or v in self._timers}

    def _cancel_timer(self, version: str) -> None:
        task = self._timers.pop(version, None)
        if task is not None:
            task.cancel()
