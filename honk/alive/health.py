"""The health state of every node: six liveness states each, their counters and histories.

Theory of operation
-------------------
A node (keyed by its NodeId, never by its name) has one :class:`LinkState` per
health domain (Tcp, DnsUdp, DataUdp) and health family (IPv4, IPv6): six states
that never influence each other except through the rules below.

* A state starts *unknown*. Probe and traffic outcomes move it to *alive* or
  *dead*. Unknown TCP counts as usable; unknown UDP inherits TCP (see
  :meth:`AliveDialerSet.udp_selectable`).
* Failures are counted per source, consecutively: the probe count dies at
  :data:`PROBE_DEATH_THRESHOLD`, the traffic count at
  :data:`TRAFFIC_DEATH_THRESHOLD`; a success of the same source resets only its
  own count, so one source never uses up the other's threshold.
* During the first :data:`REGISTRATION_GRACE` seconds after registration a
  failure is written to history but not counted, unless the caller forces it.
* A dead state is probed by the recovery scheduler when its cooldown is due
  (:meth:`due_for_recovery`); a failed recovery probe doubles the cooldown up to
  :data:`PROBE_COOLDOWN_MAX`, two consecutive successes revive it. After
  :meth:`notify_network_change` one success is enough, and every cooldown is due
  at once.
* A transition into *dead* calls ``on_dead(node_id, name)`` so the control
  plane purges the node's pools and UDP endpoints, except that a UDP domain
  dying while its sibling UDP domain of the same family is explicitly alive
  purges nothing: a blocked :53 must not cut working data flows.
* Every probe gets a :class:`ProbeTicket`. A result whose ticket was cancelled,
  or was issued under an older generation (a reload happened meanwhile),
  publishes nothing.

Nothing here does I/O; time comes from the injected clock.
"""

from __future__ import annotations

import collections
import enum
import itertools
import logging
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from honk._fast.movavg import Ema, HalvingAverage
from honk._fast.ring import SYNTHETIC_PLACEHOLDER, URLTEST_LATENCY_CAPACITY, LatencyRing
from honk.alive.outcome import Domain, Family
from honk.alive.thresholds import (
    DELAY_TEST_URLS,
    DETECTOR_EMA_FACTOR,
    DETECTOR_EMA_MARGIN,
    DETECTOR_FLOOR,
    DETECTOR_HEAL_PROBE_SUCCESSES,
    DETECTOR_SLOW_DIALS,
    DIAL_FAILURES_PER_STRIKE,
    FLOW_FAILURE_MIN,
    FLOW_FAILURE_SHARE,
    FLOW_OUTCOME_SPAN,
    FLOW_OUTCOME_WINDOW,
    MIN_STRIKE_CLEARING_SUCCESSES,
    PROBE_COOLDOWN_FACTOR,
    PROBE_COOLDOWN_MAX,
    PROBE_COOLDOWN_MIN,
    PROBE_DEATH_THRESHOLD,
    PROBE_HISTORY,
    RECOVERY_SUCCESSES,
    REGISTRATION_GRACE,
    STRIKE_PROBATION_FACTOR,
    STRIKE_PROBATION_MAX,
    STRIKE_PROBATION_MIN,
    TRAFFIC_DEATH_THRESHOLD,
)
from honk.config.spec import RANK_AVG10, RANK_LAST
from honk.core.clock import Clock

log = logging.getLogger(__name__)

UDP_DOMAINS = (Domain.DNS_UDP, Domain.DATA_UDP)
_SIBLING = {Domain.DNS_UDP: Domain.DATA_UDP, Domain.DATA_UDP: Domain.DNS_UDP}
FAILED_PROBE_DELAY = 0.0  # how history shows a failed probe (Clash dashboards read delay 0 as a failure)

DeathCallback = Callable[[uuid.UUID, str], None]
EmergencyCallback = Callable[[uuid.UUID], None]  # the detector asks for an emergency probe of a node
# (node_id, domain, family, alive) after every change of a state's liveness
TransitionListener = Callable[[uuid.UUID, Domain, Family, bool], None]


class Status(enum.Enum):
    UNKNOWN = "unknown"
    ALIVE = "alive"
    DEAD = "dead"


class LinkState:
    """One domain × family of one node (or one member × check_url of a group)."""

    __slots__ = (
        "status",
        "probe_failures",
        "traffic_failures",
        "recovery_successes",
        "cooldown",
        "due_at",
        "primed",
        "history",
        "average",
        "recent",
    )

    def __init__(self) -> None:
        self.status = Status.UNKNOWN
        self.probe_failures = 0
        self.traffic_failures = 0
        self.recovery_successes = 0
        self.cooldown = 0.0  # seconds between recovery probes while dead; 0 while not dead
        self.due_at = 0.0  # monotonic time the next recovery probe is due (dead only)
        self.primed = False  # after a network change one success revives
        self.history = LatencyRing(PROBE_HISTORY)
        self.average = HalvingAverage()  # URLTest ranking: probe samples only, never placeholders
        # the newest URLTEST_LATENCY_CAPACITY (10) of those same ranking samples: dae's min, min_avg10
        self.recent = LatencyRing(URLTEST_LATENCY_CAPACITY)

    def ranking(self, rank_by: str = "") -> float | None:
        """The ranking latency of the real probe samples (None before the first): the halving
        moving average (""), the newest sample ("last") or the mean of the newest 10 ("avg10")."""
        if rank_by == RANK_LAST:
            sample: tuple[float, float] | None = self.recent.last_real_sample()
            return None if sample is None else sample[1]
        if rank_by == RANK_AVG10:
            mean: float | None = self.recent.real_average()
            return mean
        value: float | None = self.average.value
        return value

    @property
    def dead(self) -> bool:
        return self.status is Status.DEAD

    def record(self, wall: float, rtt: float | None) -> None:
        """Add a probe outcome to history: a delay, or a flagged failure entry."""
        if rtt is None:
            self.history.push(wall, FAILED_PROBE_DELAY, True)
        else:
            self.history.push(wall, rtt, False)

    def die(self, now: float) -> None:
        self.status = Status.DEAD
        self.recovery_successes = 0
        self.cooldown = PROBE_COOLDOWN_MIN
        self.due_at = now + self.cooldown
        self.primed = False

    def revive(self) -> None:
        self.status = Status.ALIVE
        self.probe_failures = 0
        self.traffic_failures = 0
        self.recovery_successes = 0
        self.cooldown = 0.0
        self.due_at = 0.0
        self.primed = False

    def back_off(self, now: float) -> None:
        """A recovery probe failed: wait longer before the next one."""
        self.recovery_successes = 0
        self.primed = False
        self.cooldown = min(self.cooldown * PROBE_COOLDOWN_FACTOR, PROBE_COOLDOWN_MAX)
        self.due_at = now + self.cooldown

    def prime(self, now: float) -> None:
        """The network changed: the cooldown is over and one success is enough."""
        if self.dead:
            self.cooldown = PROBE_COOLDOWN_MIN
            self.due_at = now
            self.primed = True
            self.recovery_successes = 0

    def probe_succeeded(self) -> bool:
        """Apply a probe success; True when the state changed to alive."""
        self.probe_failures = 0
        if self.status is Status.DEAD:
            self.recovery_successes += 1
            if not self.primed and self.recovery_successes < RECOVERY_SUCCESSES:
                return False
        changed = self.status is not Status.ALIVE
        self.revive()
        return changed

    def failure_counts(self, threshold: int, *, traffic: bool) -> bool:
        """Count one failure of one source; True when it reaches that source's threshold."""
        if traffic:
            self.traffic_failures += 1
            return self.traffic_failures >= threshold
        self.probe_failures += 1
        return self.probe_failures >= threshold


@dataclass(frozen=True, slots=True)
class ProbeTicket:
    """Issued when a probe starts; a result publishes only while its ticket is current."""

    generation: int
    serial: int


@dataclass(slots=True)
class NodeHealth:
    """Everything the health subsystem knows about one node."""

    node_id: uuid.UUID
    name: str
    registered_at: float
    states: dict[tuple[Domain, Family], LinkState] = field(default_factory=dict)
    latencies: LatencyRing = field(default_factory=lambda: LatencyRing(URLTEST_LATENCY_CAPACITY))
    version: int = 0  # bumped by every change of this node that can change a selection
    dial_failures: int = 0  # the streak of consecutive real dial failures
    strikes: int = 0  # ranking strikes from dial failures
    clearing: int = 0  # consecutive real dial successes since the last strike
    ema: Ema = field(default_factory=Ema)  # fresh real dial latencies (the degradation detector)
    slow_dials: int = 0  # consecutive real dials slower than the detector's threshold
    detector_strikes: int = 0  # ranking strikes from the detector
    healing: int = -1  # probe successes since the detector's emergency probe; -1: not healing
    # the last real TCP flows' outcomes (clock time, failed), for the flow-failure share
    outcomes: collections.deque[tuple[float, bool]] = field(
        default_factory=lambda: collections.deque(maxlen=FLOW_OUTCOME_WINDOW)
    )
    # delay tests by URL (the Clash `extra` histories), at most DELAY_TEST_URLS URLs, oldest dropped
    url_history: dict[str, LatencyRing] = field(default_factory=dict)
    # seconds a strike demotes for (STRIKE_PROBATION_*), kept after the strikes clear: a relapse
    # within STRIKE_PROBATION_MAX of the last probation's end doubles it; 0: never struck
    probation: float = 0.0
    demoted_until: float = 0.0  # clock time the last probation ends (or ended)
    lapsed: bool = False  # the probation ran out while strikes are still pending

    @property
    def struck(self) -> bool:
        """Carries ranking strikes (pending until real successes clear them)."""
        return self.strikes > 0 or self.detector_strikes > 0

    @property
    def demoted(self) -> bool:
        """Struck and on probation: ranks below every candidate without, bypasses hysteresis."""
        return self.struck and not self.lapsed

    def state(self, domain: Domain, family: Family) -> LinkState:
        key = (domain, family)
        state = self.states.get(key)
        if state is None:
            state = self.states[key] = LinkState()
        return state

    def peek(self, domain: Domain, family: Family) -> LinkState | None:
        return self.states.get((domain, family))


def _traffic_worked(node: NodeHealth, domain: Domain, family: Family) -> None:
    """Real traffic through ``node`` worked in ``domain``: its traffic failure count restarts."""
    state = node.peek(domain, family)
    if state is not None:
        state.traffic_failures = 0


class UnknownNode(KeyError):
    """The node is not registered."""


class AliveDialerSet:
    """Node health keyed by NodeId. Owned by the event loop's thread; not thread-safe."""

    def __init__(
        self,
        clock: Clock,
        on_dead: DeathCallback | None = None,
        on_emergency: EmergencyCallback | None = None,
    ) -> None:
        self.clock = clock
        self.on_dead = on_dead
        self.on_emergency = on_emergency
        self._nodes: dict[uuid.UUID, NodeHealth] = {}
        self._listeners: list[TransitionListener] = []
        self.generation = 0
        # bumped by every change that can change a selection (liveness, averages, strikes):
        # group managers cache their picks per version
        self.version = 0
        self._serials = itertools.count(1)
        self._open_tickets: set[ProbeTicket] = set()
        # told every ranked probe RTT (node, domain, family, seconds): Score's probe baseline
        self.on_probe_rtt: Callable[[uuid.UUID, Domain, Family, float], None] | None = None

    # --- registration --------------------------------------------------------

    def register_node(self, node_id: uuid.UUID, name: str) -> bool:
        """Register a node; True if it is new. An already registered node keeps its state
        (a reload that leaves it unchanged keeps its health) and takes the new name."""
        node = self._nodes.get(node_id)
        if node is not None:
            node.name = name
            return False
        self._nodes[node_id] = NodeHealth(node_id, name, self.clock.now())
        self.version += 1
        return True

    def retain_only(self, node_ids: Iterable[uuid.UUID]) -> list[uuid.UUID]:
        """Forget every node not in ``node_ids``; the forgotten ids."""
        keep = set(node_ids)
        gone = [nid for nid in self._nodes if nid not in keep]
        for nid in gone:
            del self._nodes[nid]
        self.version += 1
        return gone

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._nodes

    def __len__(self) -> int:
        return len(self._nodes)

    def node(self, node_id: uuid.UUID) -> NodeHealth:
        try:
            return self._nodes[node_id]
        except KeyError:
            raise UnknownNode(node_id) from None

    def nodes(self) -> Iterator[NodeHealth]:
        return iter(self._nodes.values())

    def subscribe(self, listener: TransitionListener) -> None:
        """Call ``listener`` after every liveness change (groups and datapath slots recompute)."""
        self._listeners.append(listener)

    # --- generations and tickets ------------------------------------------------

    def next_generation(self) -> int:
        """A reload published a new generation: every open ticket is stale from now on."""
        self.generation += 1
        self._open_tickets.clear()
        return self.generation

    def issue_ticket(self) -> ProbeTicket:
        ticket = ProbeTicket(self.generation, next(self._serials))
        self._open_tickets.add(ticket)
        return ticket

    def retire_ticket(self, ticket: ProbeTicket) -> None:
        """The probe ended or was cancelled: whatever it reports later publishes nothing."""
        self._open_tickets.discard(ticket)

    def is_current(self, ticket: ProbeTicket | None) -> bool:
        """Whether a result under ``ticket`` may still publish (None: an untracked caller)."""
        return ticket is None or (ticket in self._open_tickets and ticket.generation == self.generation)

    @property
    def open_tickets(self) -> int:
        return len(self._open_tickets)

    # --- probe outcomes (notify_check_*) ---------------------------------------

    def notify_check_success(
        self,
        node_id: uuid.UUID,
        domain: Domain,
        family: Family,
        rtt: float,
        ticket: ProbeTicket | None = None,
        rank: bool = True,
    ) -> bool:
        """A probe of ``domain`` succeeded with ``rtt`` seconds; False when it was stale or unknown.
        ``rank`` False: a fallback sample, kept for liveness and history but not for ranking."""
        node = self._nodes.get(node_id)
        if node is None or not self.is_current(ticket):
            return False
        state = node.state(domain, family)
        wall = self.clock.wall()
        self._changed(node)
        state.record(wall, rtt)
        if rank:
            state.average.update(rtt)
            state.recent.push(wall, rtt, False)
            if self.on_probe_rtt is not None:
                self.on_probe_rtt(node_id, domain, family, rtt)
        if domain is Domain.TCP:
            node.latencies.push(wall, rtt, False)
            if node.healing >= 0:
                node.healing += 1
                if node.healing >= DETECTOR_HEAL_PROBE_SUCCESSES:
                    node.detector_strikes, node.healing = 0, -1
        was_dead = state.dead
        if state.probe_succeeded():
            if was_dead and domain is Domain.TCP:
                self._start_over(node)
            self._announce(node, domain, family, True)
        return True

    def _start_over(self, node: NodeHealth) -> None:
        """A dead TCP state was revived by probes: the strikes belonged to the failure that
        killed the node, and the revival (a cooldown, then two consecutive successes) proved it
        works again, so it ranks on its measurements again. Without this a URLTest or Fallback
        would never send it traffic again, and only real traffic clears strikes."""
        if node.struck or node.dial_failures or node.outcomes:
            log.info("node %s: revived; its strikes are cleared", node.name)
        node.strikes = node.detector_strikes = node.clearing = node.dial_failures = 0
        node.slow_dials, node.healing = 0, -1
        node.outcomes.clear()

    def _on_probation(self, node: NodeHealth) -> None:
        """A new strike: demoted for the current probation from now. The first one, or the
        first after STRIKE_PROBATION_MAX quiet seconds, starts at the minimum; a strike after
        the last probation ran out (the node came back and failed again, even after a few
        lucky successes cleared its strikes) doubles it; one while still demoted (the same
        incident's later flows) only restarts it."""
        now = self.clock.now()
        if node.probation == 0.0 or now - node.demoted_until > STRIKE_PROBATION_MAX:
            node.probation = STRIKE_PROBATION_MIN
        elif now >= node.demoted_until:
            node.probation = min(node.probation * STRIKE_PROBATION_FACTOR, STRIKE_PROBATION_MAX)
        node.demoted_until = now + node.probation
        node.lapsed = False

    def lapse_probations(self) -> list[uuid.UUID]:
        """End every probation that ran out (the health runner's recovery tick calls this): the
        node competes on its measurements again while its strikes wait for real successes. The
        nodes whose demotion ended."""
        now = self.clock.now()
        ended = []
        for node in self._nodes.values():
            if node.struck and not node.lapsed and node.demoted_until <= now:
                node.lapsed = True
                self._changed(node)
                ended.append(node.node_id)
                log.info(
                    "node %s: its %.0f s strike probation is over; it competes again",
                    node.name,
                    node.probation,
                )
        return ended

    def notify_check_failure(
        self,
        node_id: uuid.UUID,
        domain: Domain,
        family: Family,
        ticket: ProbeTicket | None = None,
        force: bool = False,
    ) -> bool:
        """A probe of ``domain`` failed; False when the result was stale or the node unknown."""
        node = self._nodes.get(node_id)
        if node is None or not self.is_current(ticket):
            return False
        state = node.state(domain, family)
        now = self.clock.now()
        self._changed(node)
        state.record(self.clock.wall(), None)
        if domain is Domain.TCP and node.healing > 0:
            node.healing = 0  # the successes after the emergency probe must be consecutive
        if state.dead:
            state.back_off(now)
            return True
        if self._in_grace(node, now) and not force:
            return True
        if state.failure_counts(PROBE_DEATH_THRESHOLD[domain], traffic=False):
            self._kill(node, domain, family, now)
        return True

    # --- real traffic (report_*_traffic, record_dial_failure) --------------------

    def report_traffic_success(self, node_id: uuid.UUID, domain: Domain, family: Family) -> None:
        """Real traffic through the node worked: the traffic count restarts. Reviving is the probes' job."""
        node = self._nodes.get(node_id)
        if node is not None:
            _traffic_worked(node, domain, family)

    def report_dial_success(
        self, node_id: uuid.UUID, family: Family, latency: float | None = None, pool_hit: bool = False
    ) -> None:
        """A real TCP dial through the node worked, taking ``latency`` seconds. The failure streak
        ends; strikes clear after max(strikes, 2) consecutive successes; a fresh dial (not a
        ready-pool hit) feeds the degradation detector."""
        node = self._nodes.get(node_id)
        if node is None:
            return
        _traffic_worked(node, Domain.TCP, family)
        node.dial_failures = 0
        if node.struck:
            node.clearing += 1
            if node.clearing >= max(node.strikes + node.detector_strikes, MIN_STRIKE_CLEARING_SUCCESSES):
                node.strikes = node.detector_strikes = node.clearing = 0
                self._changed(node)
                node.healing = -1
        if latency is not None and not pool_hit:
            self._detect(node, latency)

    def _detect(self, node: NodeHealth, latency: float) -> None:
        ema = node.ema
        if ema.warm:
            threshold = max(
                min(DETECTOR_EMA_FACTOR * ema.value, ema.value + DETECTOR_EMA_MARGIN), DETECTOR_FLOOR
            )
            node.slow_dials = node.slow_dials + 1 if latency > threshold else 0
            if node.slow_dials >= DETECTOR_SLOW_DIALS:
                node.slow_dials = 0
                node.detector_strikes += 1
                self._on_probation(node)
                self._changed(node)
                node.clearing = 0
                node.healing = 0
                log.info(
                    "node %s: %d slow dials in a row; one strike and an emergency probe",
                    node.name,
                    DETECTOR_SLOW_DIALS,
                )
                if self.on_emergency is not None:
                    self.on_emergency(node.node_id)
        ema.update(latency)  # self-referential: slow dials move it too

    def report_traffic_failure(
        self, node_id: uuid.UUID, domain: Domain, family: Family, force: bool = False
    ) -> None:
        """Real traffic through the node failed (a classified transport failure, not a neutral event)."""
        node = self._nodes.get(node_id)
        if node is None:
            return
        state = node.state(domain, family)
        if state.dead:
            return
        now = self.clock.now()
        if self._in_grace(node, now) and not force:
            return
        if state.failure_counts(TRAFFIC_DEATH_THRESHOLD[domain], traffic=True):
            self._kill(node, domain, family, now)

    def record_dial_failure(self, node_id: uuid.UUID, family: Family) -> int:
        """A real TCP dial through the node failed: one TCP traffic failure, and each time the
        streak of failures reaches 2, 4, 6 ... one ranking strike and a flagged placeholder in
        the latency collection. The node's strikes."""
        node = self._nodes.get(node_id)
        if node is None:
            return 0
        node.dial_failures += 1
        node.clearing = 0
        self._changed(node)
        if node.dial_failures % DIAL_FAILURES_PER_STRIKE == 0:
            node.strikes += 1
            self._on_probation(node)
            node.latencies.push(self.clock.wall(), SYNTHETIC_PLACEHOLDER, True)
        self.report_traffic_failure(node_id, Domain.TCP, family)
        return node.strikes

    def report_flow(self, node_id: uuid.UUID, failed: bool) -> None:
        """One real TCP flow through the node has its outcome: answered (``failed`` False) or
        failed by the node. When the node's recent failures reach the flow-failure share, one
        ranking strike and an emergency probe (:data:`FLOW_FAILURE_SHARE`)."""
        node = self._nodes.get(node_id)
        if node is None:
            return
        now = self.clock.now()
        window = node.outcomes
        while window and now - window[0][0] > FLOW_OUTCOME_SPAN:
            window.popleft()
        window.append((now, failed))
        if not failed:
            return
        failures = sum(1 for _at, bad in window if bad)
        if failures < FLOW_FAILURE_MIN or failures < FLOW_FAILURE_SHARE * len(window):
            return
        log.info(
            "node %s: %d of its last %d flows failed; one strike and an emergency probe",
            node.name,
            failures,
            len(window),
        )
        window.clear()
        node.strikes += 1
        self._on_probation(node)
        node.clearing = 0
        self._changed(node)
        if self.on_emergency is not None:
            self.on_emergency(node.node_id)

    def record_delay_test(self, node_id: uuid.UUID, family: Family, rtt: float | None, url: str = "") -> None:
        """An on-demand delay test through the node: its history shows the result, but it
        changes no liveness and adds no strike (the target was the caller's choice). With a
        ``url``, the result also goes to that URL's own history."""
        node = self._nodes.get(node_id)
        if node is None:
            return
        wall = self.clock.wall()
        node.state(Domain.TCP, family).record(wall, rtt)
        if rtt is not None:
            node.latencies.push(wall, rtt, False)
        if url:
            ring = node.url_history.pop(url, None)  # re-inserted: the newest URL is kept longest
            if ring is None:
                ring = LatencyRing(URLTEST_LATENCY_CAPACITY)
                while len(node.url_history) >= DELAY_TEST_URLS:
                    del node.url_history[next(iter(node.url_history))]
            node.url_history[url] = ring
            ring.push(wall, FAILED_PROBE_DELAY if rtt is None else rtt, rtt is None)

    def url_histories(self, node_id: uuid.UUID) -> dict[str, list[tuple[float, float, bool]]]:
        """Delay-test history per URL, oldest first: (wall time, delay s, failed)."""
        node = self._nodes.get(node_id)
        if node is None:
            return {}
        return {url: ring.snapshot() for url, ring in node.url_history.items()}

    def latency_history(self, node_id: uuid.UUID) -> list[tuple[float, float, bool]]:
        """The node's latency collection (real samples with their wall times), oldest first."""
        node = self._nodes.get(node_id)
        return [] if node is None else node.latencies.snapshot()

    # --- network change and recovery ----------------------------------------------

    def notify_network_change(self) -> list[tuple[uuid.UUID, Domain, Family]]:
        """Links, addresses or routes changed: clear every cooldown and prime dead states
        so one fresh success revives them. The states to probe now."""
        now = self.clock.now()
        primed = []
        for node in self._nodes.values():
            for (domain, family), state in node.states.items():
                if state.dead:
                    state.prime(now)
                    primed.append((node.node_id, domain, family))
        return primed

    def due_for_recovery(self) -> list[tuple[uuid.UUID, Domain, Family]]:
        """Dead states whose cooldown is over, for the recovery scheduler."""
        now = self.clock.now()
        return [
            (node.node_id, domain, family)
            for node in self._nodes.values()
            for (domain, family), state in node.states.items()
            if state.dead and state.due_at <= now
        ]

    # --- reading ------------------------------------------------------------------

    def status(self, node_id: uuid.UUID, domain: Domain, family: Family) -> Status:
        node = self._nodes.get(node_id)
        state = node.peek(domain, family) if node is not None else None
        return Status.UNKNOWN if state is None else state.status

    def is_alive(self, node_id: uuid.UUID, domain: Domain, family: Family) -> bool:
        """Not known to be dead (an unknown state counts as alive)."""
        return self.status(node_id, domain, family) is not Status.DEAD

    def tcp_alive(self, node_id: uuid.UUID, family: Family) -> bool:
        return self.is_alive(node_id, Domain.TCP, family)

    def has_udp_state(self, node_id: uuid.UUID, family: Family | None = None) -> bool:
        """Whether any UDP outcome was recorded (for one family, or either)."""
        families = tuple(Family) if family is None else (family,)
        return any(
            self.status(node_id, domain, fam) is not Status.UNKNOWN
            for domain in UDP_DOMAINS
            for fam in families
        )

    def udp_selectable(self, node_id: uuid.UUID, family: Family) -> bool:
        """The UDP liveness rule: DataUdp or DnsUdp alive → yes; both dead → no, even with
        TCP alive; no UDP state at all → whatever TCP is."""
        data = self.status(node_id, Domain.DATA_UDP, family)
        dns = self.status(node_id, Domain.DNS_UDP, family)
        if data is Status.ALIVE or dns is Status.ALIVE:
            return True
        if data is Status.UNKNOWN and dns is Status.UNKNOWN:
            return self.tcp_alive(node_id, family)
        # one dead and the other unknown, or both dead: the data path is not known to work
        return data is not Status.DEAD and dns is not Status.DEAD

    def average(self, node_id: uuid.UUID, domain: Domain, family: Family) -> float | None:
        """The halving moving average of the state's real probe samples (ranking), or None."""
        return self.ranking(node_id, domain, family)

    def ranking(self, node_id: uuid.UUID, domain: Domain, family: Family, rank_by: str = "") -> float | None:
        """The state's ranking latency by ``rank_by`` (:meth:`LinkState.ranking`), or None."""
        node = self._nodes.get(node_id)
        state = node.peek(domain, family) if node is not None else None
        return None if state is None else state.ranking(rank_by)

    def demoted(self, node_id: uuid.UUID) -> bool:
        node = self._nodes.get(node_id)
        return node is not None and node.demoted

    def history(self, node_id: uuid.UUID, domain: Domain, family: Family) -> list[tuple[float, float, bool]]:
        """Probe history, oldest first: (wall time, delay s, failed)."""
        node = self._nodes.get(node_id)
        state = node.peek(domain, family) if node is not None else None
        return [] if state is None else state.history.snapshot()

    def last_real_delays(self) -> dict[uuid.UUID, tuple[float, float]]:
        """Each node's newest real TCP delay as (delay s, wall time): what the state database keeps."""
        out = {}
        for node in self._nodes.values():
            sample = node.latencies.last_real_sample()
            if sample is not None:
                at, delay = sample
                out[node.node_id] = (delay, at)
        return out

    def restore_delays(self, samples: dict[uuid.UUID, tuple[float, float]]) -> int:
        """Put persisted delays back into registered nodes' latency collections (display
        only; liveness is never restored). How many were restored."""
        restored = 0
        for node_id, (delay, at) in samples.items():
            node = self._nodes.get(node_id)
            if node is not None and len(node.latencies) == 0:
                node.latencies.push(at, delay, False)
                restored += 1
        return restored

    # --- internals ------------------------------------------------------------------

    def _changed(self, node: NodeHealth) -> None:
        node.version += 1
        self.version += 1

    def node_version(self, node_id: uuid.UUID) -> int:
        """The node's change counter (-1 for an unknown node): cached judgments of it expire with it."""
        node = self._nodes.get(node_id)
        return -1 if node is None else node.version

    def _in_grace(self, node: NodeHealth, now: float) -> bool:
        return now - node.registered_at < REGISTRATION_GRACE

    def _kill(self, node: NodeHealth, domain: Domain, family: Family, now: float) -> None:
        state = node.state(domain, family)
        state.die(now)
        self._changed(node)
        log.info("node %s: %s/IPv%d is dead", node.name, domain.value, family.value)
        self._announce(node, domain, family, False)
        if domain in UDP_DOMAINS:
            sibling = node.peek(_SIBLING[domain], family)
            if sibling is not None and sibling.status is Status.ALIVE:
                log.info(
                    "node %s: %s/IPv%d still alive; UDP endpoints are kept",
                    node.name,
                    _SIBLING[domain].value,
                    family.value,
                )
                return
        if self.on_dead is not None:
            try:
                self.on_dead(node.node_id, node.name)
            except Exception:
                log.exception("node %s: the death callback failed", node.name)

    def _announce(self, node: NodeHealth, domain: Domain, family: Family, alive: bool) -> None:
        for listener in self._listeners:
            try:
                listener(node.node_id, domain, family, alive)
            except Exception:
                log.exception("a health listener failed")
