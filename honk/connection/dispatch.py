"""The per-flow pipeline between an inbound and the relay.

For a TCP flow an inbound calls, in order:

1. :meth:`Dispatcher.connect` -- ``plane.decide(meta)`` picks the rule and the
   leaf, then ``leaf.dial_tcp(target, deadline=clock.now() + connect_timeout)``,
   with one retry round for a URLTest, Fallback or Score pick (:meth:`dial_routed`).
   It raises ``Blocked``, ``NoRoute``, ``DialError``/``DialTimeout`` or
   ``NotSupported``, which the inbound turns into its protocol's refusal.
2. the inbound's own success reply (SOCKS5 ``0x00``, HTTP ``200``);
3. :meth:`Dispatcher.relay` -- registers the flow in the tracker with its rule
   and chain, relays until it ends (its :class:`~honk.connection.verdict.FlowVerdict`
   telling the node's health and Score how it went), and removes it.

The plane is read once per flow, at ``connect``: :meth:`Dispatcher.swap_plane`
affects only flows that start afterwards, established flows keep their
sockets. This object holds no per-flow state.

Every tracked flow records the version of the leaf it was opened on
(:func:`outbound_version`: the ``outbound_id`` the reconciler sets on each leaf,
``tag@vN``), so a drain of that version finds exactly its flows.
"""

from __future__ import annotations

import dataclasses
import logging
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from honk.alive.traffic import traffic_of
from honk.config.spec import GlobalSpec, Policy
from honk.connection import scoring
from honk.connection.descriptors import DescriptorBudget
from honk.connection.flowlog import format_chain, log_flow_opened
from honk.connection.mode import RoutingMode, mode_rule
from honk.connection.plane import Decision, score_target
from honk.connection.tracker import ConnectionTracker, FlowHandle, TrackedFlow
from honk.connection.verdict import observe_flow
from honk.core.clock import Clock
from honk.core.errors import (
    ClientGone,
    DialError,
    DialTimeout,
    FlowClosed,
    HonkError,
    IdleTimeout,
    TargetRefused,
)
from honk.core.logs import kv
from honk.core.net import FlowMeta, Network
from honk.core.stats import RuntimeStats
from honk.group.score.attempt import ScoreFeedback, ScoreReporter
from honk.outbound.base import DialedStream, EnginePlan, Outbound
from honk.outbound.bridge import relay_end
from honk.outbound.direct import DirectOutbound
from honk.proto.framing import Framing
from honk.relay import relay_engine
from honk.relay.stream import StreamConn
from honk.route.router import RouteDecision

__all__ = ["Dispatcher", "EngineDial", "Resolver", "Routed", "Upstream", "format_chain", "outbound_version"]

log = logging.getLogger("honk.connection")

# host → IP literals; the plane's SystemResolver is one.
Resolver = Callable[[str], Awaitable[Sequence[Any]]]


class PlaneLike(Protocol):
    """What the dispatcher needs of ``honk.connection.plane.Plane``."""

    generation: int

    async def decide(self, meta: FlowMeta, resolver: Resolver) -> Any: ...


# Not frozen, as FlowMeta (honk.core.net): built per flow, never mutated.
@dataclass(slots=True)
class Routed:
    """A routing decision for one flow, with the plane generation that made it."""

    meta: FlowMeta
    outbound: str  # the rule's target (an outbound or a group)
    rule: str
    chain: tuple[str, ...]  # rule target → ... → leaf
    leaf: Outbound
    plane_generation: int
    must: bool = False  # a `(must)` rule decided: the flow keeps its original destination
    # the Score groups the selection traversed (None: none); each dial attempt reports to them
    score: ScoreFeedback | None = field(default=None, compare=False)
    # the served attempt's reporter once dialed (``dial_routed``): the relay feeds and settles it
    reporter: ScoreReporter | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class Upstream:
    """A dialed upstream for one TCP flow."""

    routed: Routed
    sock: socket.socket
    framing: Framing | None = None  # DialedStream.framing: None for a plain stream
    bridge: Any = None  # DialedStream.bridge: how a bridged stream's server side ended


def _report(leaf: Any, outcome: HonkError | None, latency: float | None, pool_hit: bool = False) -> None:
    """A flow's dial outcome, for the node's health (real traffic); ``pool_hit``: it took a
    ready connection, so its latency measured no network round trip."""
    traffic = traffic_of(leaf)
    if traffic is not None:
        traffic.dial(outcome, getattr(leaf, "health_family", 4), latency, pool_hit)


def _report_refused_reachable(leaf: Any) -> None:
    """``leaf``'s node refused a target another member of its group then reached."""
    traffic = traffic_of(leaf)
    if traffic is not None:
        traffic.refused_reachable(getattr(leaf, "health_family", 4))


# A timed-out dial is evidence against its node only when it had at least this share of
# connect_timeout from its real start (after its permit) to its deadline: a dial squeezed by
# honk's own waits -- a busy dial budget, an earlier attempt of the same flow -- was never given
# a fair chance, and no healthy node may be blamed for honk's waits (issue 32).
FAIR_DIAL_SHARE = 0.5


def _fair_chance(error: HonkError, started: float | None, deadline: float, connect_timeout: float) -> bool:
    """Whether a failed dial says something about its node: any failure the node or the network
    answered with, and a timeout of a dial that had its fair share of time."""
    if not isinstance(error, DialTimeout):
        return True
    return started is not None and deadline - started >= FAIR_DIAL_SHARE * connect_timeout


def _ready_hit(leaf: Any, now: float) -> bool:
    """Whether a dial through ``leaf`` now takes a ready server connection warm-up opened
    (its take is the dial's first step, with no await before it)."""
    runtime = getattr(leaf, "runtime", None)
    return runtime is not None and not getattr(leaf, "mux", False) and runtime.ready.has_ready(now)


def _needs_admission(leaf: Any, ready_hit: bool = False) -> bool:
    """Whether a dial through ``leaf`` makes a physical connection: ``block`` never does, nor
    does one that takes a ready connection, nor a logical stream on a mux carrier with room."""
    if leaf.protocol == "block" or ready_hit:
        return False
    if getattr(leaf, "mux", False):
        from honk.outbound.mux import pool_for

        return not pool_for(leaf).has_room
    return True


def _score_feedback(plane: Any, chain: tuple[str, ...], leaf: Any, meta: FlowMeta) -> ScoreFeedback | None:
    """The flow's attribution to the Score groups on ``chain`` (None when it traversed none)."""
    feedback = getattr(getattr(plane, "groups", None), "score_feedback", None)
    if feedback is None:
        return None
    return feedback(chain, leaf, meta.network, score_target(meta), meta.resolved)


def log_failed_end(routed: Routed, error: HonkError | None, bridged: bool = False) -> None:
    """One INFO line for a relayed flow that ended with its upstream's failure (a protocol's typed
    refusal, a TLS alert, a reset): what an operator with a wrong credential needs to see. A bridged
    stream's failure is logged by the bridge already; a client's going away, a deliberate close and
    an idle expiry are no failure."""
    if error is None or bridged or isinstance(error, ClientGone | FlowClosed | IdleTimeout):
        return
    meta = routed.meta
    log.info(
        "flow failed %s",
        kv(
            inbound=meta.inbound,
            source=meta.source,
            target=meta.target,
            outbound=routed.leaf.name,
            error=type(error).__name__,
            reason=getattr(error, "reason", "") or str(error),
        ),
    )


def outbound_version(leaf: Any) -> str:
    """The leaf's ``outbound_id`` (``tag@vN``, set by the reconciler on every build), or its
    name for a leaf built without one. Flows, drains and UDP sub-links key on this, never on
    the leaf object: two versions of one tag coexist while one of them drains."""
    return getattr(leaf, "outbound_id", None) or leaf.name


class EngineDial:
    """One dial the relay engine makes itself (:meth:`Dispatcher.engine_dial`): its
    :class:`~honk.outbound.base.EnginePlan` and what :meth:`Dispatcher._dial_leaf` keeps
    around a Python dial (the dial permit, the Score guard, when it began, its deadline)
    until the engine tells how the connect went: :meth:`opened` or :meth:`failed`, once."""

    __slots__ = ("plan", "leaf", "started", "deadline", "_dispatcher", "_guard", "_permit")

    def __init__(
        self,
        dispatcher: Dispatcher,
        leaf: Any,
        plan: EnginePlan,
        guard: Any,
        permit: Any,
        started: float,
        deadline: float,
    ) -> None:
        self.plan = plan
        self.leaf = leaf
        self.started = started
        self.deadline = deadline
        self._dispatcher = dispatcher
        self._guard = guard
        self._permit = permit

    def opened(self, facts: int = 0) -> ScoreReporter | None:
        """Connected (``facts``: what EV_OPEN told of a TLS handshake): the permit goes back, the
        dial is reported; the flow's Score reporter."""
        self._release()
        if self.plan.opened is not None:
            self.plan.opened(facts)
        dialed = getattr(self.leaf, "engine_dialed", None)
        if dialed is not None:
            dialed(None)
        guard, self._guard = self._guard, None
        return self._dispatcher._dialed(self.leaf, guard, self.started)

    def failed(self, error: HonkError) -> None:
        """The connect failed, timed out or was cancelled: reported as a Python dial's failure,
        except when the client left or honk ended it (nothing was learned of the node)."""
        self._release()
        guard, self._guard = self._guard, None
        if isinstance(error, (ClientGone, FlowClosed)):
            scoring.report_setup(guard, self._dispatcher.clock, self.leaf, error)
            return
        dialed = getattr(self.leaf, "engine_dialed", None)
        if dialed is not None:
            dialed(error)
        self._dispatcher._dial_failed(self.leaf, guard, error, self.started, self.deadline)

    def _release(self) -> None:
        if self._permit is not None:
            self._permit.release()
            self._permit = None


class Dispatcher:
    def __init__(
        self,
        plane: PlaneLike,
        tracker: ConnectionTracker,
        clock: Clock,
        global_spec: GlobalSpec,
        resolver: Resolver,
    ) -> None:
        self._plane = plane
        self.tracker = tracker
        self.clock = clock
        self.resolver = resolver
        # told the chain of every real selection (the health service wakes idle URLTest groups)
        self.on_selection: Callable[[tuple[str, ...]], None] | None = None
        # the daemon's event counters (/metrics); None: nothing is counted
        self.stats: RuntimeStats | None = None
        self.mode: RoutingMode | None = None  # the Clash mode; None or "rule": the plane's rules decide
        # the flows' share of the descriptor limit (the daemon sizes it at start); None: unlimited
        self.descriptors: DescriptorBudget | None = None
        self._plane_serial = 0  # +1 per swap_plane: whoever caches a decision knows which plane made it
        self._apply_settings(global_spec)

    def _apply_settings(self, global_spec: GlobalSpec) -> None:
        self.global_spec = global_spec
        self.tracker.relay_idle_timeout = global_spec.relay_idle_timeout
        self.tracker.udp_idle_timeout = global_spec.udp_idle_timeout
        self.tracker.half_close_timeout = global_spec.half_close_timeout

    @property
    def plane(self) -> PlaneLike:
        return self._plane

    @property
    def plane_serial(self) -> int:
        """Which plane is current: changes at every :meth:`swap_plane`, even to an equal generation."""
        return self._plane_serial

    def swap_plane(
        self, plane: PlaneLike, global_spec: GlobalSpec | None = None, resolver: Resolver | None = None
    ) -> None:
        """New flows route with ``plane`` (and dial with the given settings and resolver);
        established flows are untouched, except that idle timeouts apply to all flows."""
        if global_spec is not None:
            self._apply_settings(global_spec)
        if resolver is not None:
            self.resolver = resolver
        self._plane = plane
        self._plane_serial += 1

    @property
    def reads_process(self) -> bool:
        """Whether the current rules name a process (``pname``): transparent flows of the host's
        own then look their process up before routing."""
        return bool(getattr(getattr(self._plane, "router", None), "reads_process", False))

    async def route(self, meta: FlowMeta) -> Routed:
        """Decide the rule and leaf for ``meta``; raises ``NoRoute`` (and whatever the plane raises)."""
        plane = self._plane
        forced = self._forced(plane, meta)
        if forced is not None:
            return forced
        return self._routed(meta, await plane.decide(meta, self.resolver), plane)

    def _forced(self, plane: PlaneLike, meta: FlowMeta) -> Routed | None:
        """The routing of the ``global`` and ``direct`` modes (rules bypassed), or None in ``rule`` mode."""
        outbound = self.mode.override() if self.mode is not None else None
        if outbound is None:
            return None
        selection = plane.groups.resolve(
            outbound, meta.network, target=score_target(meta), destination=meta.resolved
        )
        return self._routed(
            meta, Decision(RouteDecision(outbound, mode_rule(self.mode.mode), False, None), selection), plane
        )

    def route_now(self, meta: FlowMeta) -> Routed | None:
        """:meth:`route` when the plane can decide without awaiting (no DNS needed), else
        ``None`` (call :meth:`route`). Raises what :meth:`route` raises."""
        plane = self._plane
        forced = self._forced(plane, meta)
        if forced is not None:
            return forced
        decide_now = getattr(plane, "decide_now", None)
        if decide_now is None:
            return None
        decision = decide_now(meta)
        if decision is None:
            return None
        return self._routed(meta, decision, plane)

    def _routed(self, meta: FlowMeta, decision: Any, plane: PlaneLike) -> Routed:
        chain = tuple(decision.selection.chain)
        leaf = decision.selection.leaf
        mark = getattr(decision.route, "mark", None)
        if mark is not None and type(leaf) is DirectOutbound:  # `-> direct(mark: N)`: dial with that mark
            leaf = leaf.with_mark(mark)
        if self.on_selection is not None and len(chain) > 1:
            self.on_selection(chain)
        return Routed(
            meta=meta,
            outbound=decision.route.outbound,
            rule=decision.route.rule,
            chain=chain,
            leaf=leaf,
            plane_generation=plane.generation,
            must=decision.route.must,
            score=_score_feedback(plane, chain, leaf, meta) if len(chain) > 1 else None,
        )

    def rescore(self, routed: Routed) -> Routed:
        """``routed`` attributed for its own meta (a changed network or target, a routing made
        outside :meth:`route`): its Score feedback built again from the current plane."""
        return dataclasses.replace(
            routed, score=_score_feedback(self._plane, routed.chain, routed.leaf, routed.meta)
        )

    def cold_udp_candidates(self, routed: Routed) -> list[Routed]:
        """The routings a UDP flow's cold preparation races (GH-G-01): the rule target's
        URLTest members by rank when none has a usable UDP measurement, each as ``routed``
        with its own chain and leaf, the routed leaf among them; [] for every other plan (it
        prepares its one leaf). Only the route's own target counts: a URLTest reached
        through another group is not top level."""
        if routed.meta.network is not Network.UDP or len(routed.chain) < 2:
            return []
        cold = getattr(getattr(self._plane, "groups", None), "cold_udp_candidates", None)
        if cold is None:
            return []
        selections = cold(routed.chain[0])
        if not any(s.leaf is routed.leaf for s in selections):
            return []  # the selection served something else (a pin, a final): that one leaf
        return [
            self.rescore(dataclasses.replace(routed, chain=tuple(s.chain), leaf=s.leaf)) for s in selections
        ]

    def udp_eligible(self, routed: Routed) -> bool:
        """Whether ``routed``'s leaf may still carry UDP for its group on the current plane (the
        cold preparation's winner recheck, GH-G-06)."""
        groups = getattr(self._plane, "groups", None)
        health = getattr(groups, "health", None)
        if health is None or len(routed.chain) < 2:
            return True
        return health.eligible(routed.leaf, Network.UDP, routed.chain[-2], routed.chain[-1])

    async def connect(self, meta: FlowMeta) -> Upstream:
        """Route and dial a TCP flow; raises Blocked/NoRoute/DialError/DialTimeout/NotSupported."""
        routed, dialed = await self.dial_routed(await self.route(meta))
        return Upstream(routed, dialed.sock, dialed.framing, dialed.bridge)

    async def dial_routed(self, routed: Routed) -> tuple[Routed, DialedStream]:
        """Dial a routed TCP flow; the routing it was served by (another leaf of the same group
        after a retry) and the stream.

        A setup failure of a leaf that a URLTest, Fallback or Score group picked gets one
        retry round (:meth:`_retry_round`). A URLTest or Fallback round gets a fresh deadline
        (GH-B-21): the first dial may have spent all of its own. A Score retry shares the first
        dial's deadline (GH-K-77) and is not tried once it is spent. A node refusing the target
        is retried too: when another member then reaches that target, the refusal was the
        node's, and its health counts it (:meth:`NodeTraffic.refused_reachable`); when none
        does, the target refused and nobody is blamed. Typed local refusals, timeouts waiting
        for a dial permit and failures of other policies are final."""
        self.admit(routed)
        timeout = self.global_spec.connect_timeout
        deadline = self.clock.now() + timeout
        try:
            dialed, reporter = await self._dial_leaf(routed.leaf, routed.meta.target, deadline, routed.score)
            return dataclasses.replace(routed, reporter=reporter), dialed
        except HonkError as exc:
            first = exc
        retries, fresh = self._retry_round(routed, first)
        if fresh:
            deadline = self.clock.now() + timeout
        refused = [routed.leaf] if isinstance(first, TargetRefused) else []
        for retry in retries:
            if self.clock.now() >= deadline:
                break  # a spent shared deadline: a retry would fail unheard, and prove nothing
            served = self.rescore(dataclasses.replace(routed, chain=retry.chain, leaf=retry.leaf))
            try:
                dialed, reporter = await self._dial_leaf(
                    served.leaf, routed.meta.target, deadline, served.score
                )
            except HonkError as exc:
                if isinstance(exc, TargetRefused):
                    refused.append(served.leaf)
                continue
            for leaf in refused:  # another member reached the target these refused
                _report_refused_reachable(leaf)
            log.info("dial retried %s", kv(failed=routed.leaf.name, served=retry.leaf.name))
            return dataclasses.replace(served, reporter=reporter), dialed
        raise first

    def admit(self, routed: Routed) -> None:
        """Refuse a new TCP flow at once (:class:`DescriptorsExhausted`, counted, no node charged)
        when the flows' share of the descriptor limit is spent."""
        if self.descriptors is not None and not self.descriptors.admit():
            meta = routed.meta
            raise self.descriptors.refusal(f"{meta.inbound}: {meta.source} -> {meta.target}")

    def engine_dial(self, routed: Routed) -> EngineDial | None:
        """The relay engine's own dial of ``routed`` (the SOCKS fast path), admitted as
        :meth:`dial_routed` admits: None when Python must dial (the leaf offers no
        :class:`~honk.outbound.base.EnginePlan`, a ready connection waits, a group on the chain
        would retry a failed dial, or the dial budget has no permit free right now).
        Raises what :meth:`admit` and Score's admission raise."""
        leaf = routed.leaf
        offer = getattr(leaf, "engine_plan", None)
        now = (
            self.clock.now()
        )  # one reading for the ready check and the deadline: the plan takes microseconds
        if offer is None or _ready_hit(leaf, now) or (len(routed.chain) > 1 and self._retrying_group(routed)):
            return None
        budget = getattr(self._plane, "admission", None)
        permit = budget.try_acquire() if budget is not None else None
        if budget is not None and permit is None:
            return None  # Python's dial waits its turn
        try:
            plan = offer(routed.meta.target)
            if plan is None:
                if permit is not None:
                    permit.release()
                return None
            self.admit(routed)
            guard = None if routed.score is None else scoring.begin(routed.score, self.clock)
        except BaseException:
            if permit is not None:
                permit.release()
            raise
        deadline = now + min(self.global_spec.connect_timeout, plan.timeout)
        return EngineDial(self, leaf, plan, guard, permit, now, deadline)

    def _retrying_group(self, routed: Routed) -> tuple[str, Policy] | None:
        """The group nearest the leaf on ``routed``'s chain that gives a failed dial a retry
        round (URLTest, Fallback, Score), with its policy."""
        groups = getattr(self._plane, "groups", None)
        if getattr(groups, "retry_candidates", None) is None:
            return None
        for name in reversed(routed.chain[:-1]):
            kind = getattr(groups.policy(name), "kind", None) if name in groups else None
            if kind is Policy.URLTEST or kind is Policy.FALLBACK or kind is Policy.SCORE:
                return name, kind
        return None

    def _retry_round(self, routed: Routed, error: HonkError) -> tuple[list[Any], bool]:
        """The retry round of a failed first dial: the candidates, and whether the round gets a
        fresh deadline (URLTest and Fallback) or shares the first dial's (Score)."""
        if not isinstance(error, DialError):
            return [], False
        found = self._retrying_group(routed)
        if found is None:
            return [], False
        name, kind = found
        meta = routed.meta
        retry = self._plane.groups.retry_candidates
        if kind is Policy.SCORE:
            candidates, fresh = (
                retry(name, meta.network, routed.leaf, target=score_target(meta), destination=meta.resolved),
                False,
            )
        else:
            candidates, fresh = retry(name, meta.network, routed.leaf), True
        head = routed.chain[: routed.chain.index(name)]
        return [dataclasses.replace(c, chain=head + c.chain) for c in candidates], fresh

    async def _dial_leaf(
        self, leaf: Any, target: Any, deadline: float, score: ScoreFeedback | None
    ) -> tuple[DialedStream, ScoreReporter | None]:
        """One dial under the dial budget (``block`` and a stream on a mux carrier with room are
        exempt; waiting past the deadline for a permit is a :class:`CapacityRefused`), reported
        to the node's health and to the Score groups it was selected through: admitted before
        the permit wait, a reporter from the dial on (its setup, or its failure). Latency and
        setup quality run from when the dial really started, after its permit (GH-B-18,
        GH-K-76). A timeout that honk's own waits squeezed (:func:`_fair_chance`) is neutral."""
        budget = getattr(self._plane, "admission", None)
        guard = scoring.begin(score, self.clock)
        ready_hit = _ready_hit(leaf, self.clock.now())
        started: float | None = None
        try:
            if budget is not None and _needs_admission(leaf, ready_hit):
                async with budget.permit(deadline):
                    started = self.clock.now()
                    dialed = await leaf.dial_tcp(target, deadline)
            else:
                started = self.clock.now()
                dialed = await leaf.dial_tcp(target, deadline)
        except HonkError as exc:
            self._dial_failed(leaf, guard, exc, started, deadline)
            raise
        except BaseException as exc:  # cancelled: neutral
            scoring.report_setup(guard, self.clock, leaf, exc, dial_started=started)
            raise
        return dialed, self._dialed(leaf, guard, started, ready_hit)

    def _dialed(self, leaf: Any, guard: Any, started: float, ready_hit: bool = False) -> ScoreReporter | None:
        """A dial of ``leaf`` that began at ``started`` is set up: Score, health and stats told."""
        reporter = scoring.report_setup(guard, self.clock, leaf, None, dial_started=started)
        _report(leaf, None, self.clock.now() - started, ready_hit)
        if self.stats is not None:
            self.stats.dial("tcp", None, leaf.name)
        return reporter

    def _dial_failed(
        self, leaf: Any, guard: Any, exc: HonkError, started: float | None, deadline: float
    ) -> None:
        """A dial of ``leaf`` failed: Score and health told when it had a fair chance."""
        if _fair_chance(exc, started, deadline, self.global_spec.connect_timeout):
            scoring.report_setup(guard, self.clock, leaf, exc, dial_started=started)
            _report(leaf, exc, None)
        elif guard is not None:
            guard.close()  # neutral: nothing was learned about the node
        if self.stats is not None:
            self.stats.dial("tcp", exc, leaf.name)

    def track(self, routed: Routed, handle: FlowHandle, network: Network = Network.TCP) -> TrackedFlow:
        """Register an established flow (every TCP path: the relay here, the SOCKS fast path,
        HTTP forwarding) and write its ``flow opened`` line."""
        meta = routed.meta
        flow = self.tracker.open(
            handle,
            network=network,
            inbound=meta.inbound,
            source=meta.source,
            target=meta.target,
            rule=routed.rule,
            chain=routed.chain,
            plane_generation=routed.plane_generation,
            outbound_version=outbound_version(routed.leaf),
            user=meta.user,
            session=meta.session,
        )
        log_flow_opened(
            network,
            meta.inbound,
            meta.source,
            meta.target,
            routed.rule,
            routed.chain,
            getattr(self._plane, "spec", None),
        )
        return flow

    async def relay(self, upstream: Upstream, client: StreamConn) -> HonkError | None:
        """Relay until the flow ends; returns how it ended (``None`` = both sides finished)."""
        routed = upstream.routed
        engine = relay_engine(self.clock)
        reporter = routed.reporter
        verdict = observe_flow(self.clock, routed.leaf, reporter, self.global_spec.response_timeout)
        engine.observer = verdict
        flow = self.track(routed, engine)
        try:
            await engine.run(client, upstream.sock, upstream.framing)
        except HonkError as exc:
            if verdict is not None:
                verdict.end(exc)
            scoring.settle_relay(reporter, self.clock, exc)
            log_failed_end(routed, exc, upstream.bridge is not None)
            return exc
        except BaseException:
            if verdict is not None:
                verdict.end(None)
            scoring.cancel(reporter, self.clock)
            raise
        finally:
            flow.release()
            if upstream.bridge is not None:
                upstream.bridge.relay_ended()
        end = relay_end(None, upstream.bridge)  # a bridged stream's failure ends its socket cleanly
        if verdict is not None:
            verdict.end(end)
        scoring.settle_relay(reporter, self.clock, end)
        return end
