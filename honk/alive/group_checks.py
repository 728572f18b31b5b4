"""Per-group ``check_url`` health: TCP-only states keyed by (member tag, check_url).

A group with its own ``check_url`` judges its members by that URL instead of
the global probe. The state belongs to the pair (member tag, URL), not to a
node: a member may be a sub-group, probed through its current pick but recorded
under its own tag, so the parent sees one stable member. A failing pair removes
the member only from the groups that use that URL.

The pair's state follows the node rules: three consecutive failures kill it, the
same cooldown paces recovery probes, two consecutive successes revive it, and a
network change primes it. There is no registration grace and no traffic source.
Selector groups pick by hand, so a ``check_url`` on one is ignored with a
warning.

A group may carry its own ``interval`` (dae's per-group ``check_interval``): its pairs
then leave the periodic cycle (which runs at the global ``check_interval``) and are
handed out by :meth:`GroupChecks.own_interval_due` once that interval has passed since
their last result; the runner asks at every recovery tick (at most 5 s apart). A pair
that a group without its own interval also uses stays in the periodic cycle too.

Nothing here does I/O; time comes from the injected clock.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from honk.alive.health import LinkState, Status
from honk.alive.thresholds import GROUP_CHECK_DEATH_THRESHOLD
from honk.config.spec import Policy
from honk.core.clock import Clock

log = logging.getLogger(__name__)

# () -> [(member tag, NodeId of the leaf the member currently resolves to)], resolved afresh per cycle
MemberResolver = Callable[[], list[tuple[str, uuid.UUID]]]


@dataclass(frozen=True, slots=True)
class GroupCheck:
    group: str
    policy: Policy
    url: str
    members: MemberResolver
    interval: float | None = None  # seconds; None: the periodic cycle's (global) interval


class GroupChecks:
    """The registry of groups with a ``check_url`` and the state of each (member, URL) pair."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._groups: dict[str, GroupCheck] = {}
        self._states: dict[tuple[str, str], LinkState] = {}
        self._results_at: dict[tuple[str, str], float] = {}  # monotonic time of the pair's last result
        self.version = 0  # bumped by every change that can change a group's selection

    def sync_group_check_urls(self, checks: Iterable[GroupCheck]) -> None:
        """Replace the registry (on start and reload). Pairs still in use keep their state."""
        groups: dict[str, GroupCheck] = {}
        for check in checks:
            if not check.url:
                continue
            if check.policy is Policy.SELECTOR:
                log.warning("group %s: check_url is ignored; a selector does not pick by health", check.group)
                continue
            groups[check.group] = check
        self._groups = groups
        self.version += 1
        keep = {(member, check.url) for check in groups.values() for member, _ in check.members()}
        self._states = {key: state for key, state in self._states.items() if key in keep}
        self._results_at = {key: at for key, at in self._results_at.items() if key in keep}

    @property
    def groups(self) -> tuple[str, ...]:
        return tuple(self._groups)

    def members_to_probe(self, *, due_only: bool) -> list[tuple[str, str, uuid.UUID]]:
        """(member tag, URL, current leaf) to probe: the not-dead pairs for a periodic cycle,
        or (``due_only``) the dead pairs whose cooldown is over, once per pair."""
        now = self.clock.now()
        out: dict[tuple[str, str], uuid.UUID] = {}
        own = set() if due_only else self._own_interval_pairs()
        for check in self._groups.values():
            for member, leaf in check.members():
                key = (member, check.url)
                if key in out or key in own:
                    continue
                state = self._states.get(key)
                dead = state is not None and state.dead
                if (due_only and dead and state.due_at <= now) or (not due_only and not dead):
                    out[key] = leaf
        return [(member, url, leaf) for (member, url), leaf in out.items()]

    def _intervals(self) -> dict[tuple[str, str], float | None]:
        """Each pair's own interval: the shortest of its groups', None when a group using it
        has none (the periodic cycle probes it)."""
        out: dict[tuple[str, str], float | None] = {}
        for check in self._groups.values():
            for member, _ in check.members():
                key = (member, check.url)
                if key not in out:
                    out[key] = check.interval
                else:
                    known = out[key]
                    out[key] = None if known is None or check.interval is None else min(known, check.interval)
        return out

    def _own_interval_pairs(self) -> set[tuple[str, str]]:
        if all(check.interval is None for check in self._groups.values()):
            return set()
        return {key for key, interval in self._intervals().items() if interval is not None}

    def own_interval_due(self) -> list[tuple[str, str, uuid.UUID]]:
        """(member tag, URL, current leaf) of the not-dead pairs on their groups' own interval
        whose interval has passed since their last result (or that have none yet)."""
        if all(check.interval is None for check in self._groups.values()):
            return []
        now = self.clock.now()
        intervals = self._intervals()
        out: dict[tuple[str, str], uuid.UUID] = {}
        for check in self._groups.values():
            for member, leaf in check.members():
                key = (member, check.url)
                interval = intervals.get(key)
                if key in out or interval is None:
                    continue
                state = self._states.get(key)
                if state is not None and state.dead:
                    continue  # the recovery schedule owns it
                last = self._results_at.get(key)
                if last is None or now - last >= interval:
                    out[key] = leaf
        return [(member, url, leaf) for (member, url), leaf in out.items()]

    def notify(self, member: str, url: str, rtt: float | None) -> None:
        """A probe of ``member`` at ``url`` returned ``rtt`` seconds, or failed (None)."""
        state = self._states.get((member, url))
        if state is None:
            state = self._states[(member, url)] = LinkState()
        now = self.clock.now()
        self.version += 1
        self._results_at[(member, url)] = now
        state.record(self.clock.wall(), rtt)
        if rtt is not None:
            state.average.update(rtt)
            state.recent.push(self.clock.wall(), rtt, False)
            if state.probe_succeeded():
                log.info("member %s is alive again for check_url probes", member)
        elif state.dead:
            state.back_off(now)
        elif state.failure_counts(GROUP_CHECK_DEATH_THRESHOLD, traffic=False):
            state.die(now)
            log.info("member %s is dead for its groups' check_url", member)

    def notify_network_change(self) -> None:
        now = self.clock.now()
        for state in self._states.values():
            state.prime(now)

    def member_alive(self, group: str, member: str) -> bool:
        """Whether ``member`` may serve ``group``: always, unless the group has a check_url
        and the (member, URL) pair is dead."""
        check = self._groups.get(group)
        if check is None:
            return True
        state = self._states.get((member, check.url))
        return state is None or state.status is not Status.DEAD

    def url_of(self, group: str) -> str | None:
        """The group's own check URL, if it has one that counts."""
        check = self._groups.get(group)
        return check.url if check is not None else None

    def average(self, member: str, url: str) -> float | None:
        """The moving average of the pair's probe samples (the group's URLTest ranking)."""
        state = self._states.get((member, url))
        return None if state is None else state.average.value

    def ranking(self, member: str, url: str, rank_by: str = "") -> float | None:
        """The pair's ranking latency by ``rank_by`` (:meth:`LinkState.ranking`), or None."""
        state = self._states.get((member, url))
        return None if state is None else state.ranking(rank_by)

    def history(self, member: str, url: str) -> list[tuple[float, float, bool]]:
        state = self._states.get((member, url))
        return [] if state is None else state.history.snapshot()
