"""The Plane: the immutable bundle the data path reads for every new flow.

A Plane holds one generation's compiled router, group table and leaf
outbounds, built together from one :class:`~honk.config.spec.Spec`. A reload
builds a new Plane (carrying Selector choices over) and swaps one reference,
so a flow sees either the old plane or the new one, never a mix.

:meth:`Plane.decide` is the only async part: it drives the sans-I/O router
through DNS when a rule needs the destination IP, then resolves the routed
name to one leaf.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from honk.config.expr import MUST_RULES
from honk.config.spec import Spec
from honk.core.clock import Clock
from honk.core.errors import HonkError
from honk.core.net import FlowMeta, IPAddress, Network
from honk.geo.assets import GeoAssets
from honk.group.filter import HealthFilter
from honk.group.manager import GroupManager, Identity, Selection
from honk.group.score.keys import ScoreTarget
from honk.outbound.admission import DialBudget
from honk.outbound.base import Outbound
from honk.outbound.registry import build_outbounds, retire_runtimes
from honk.outbound.runtime import NodeRuntime
from honk.route.resolve import Resolver, SystemResolver
from honk.route.router import NeedsResolution, RouteDecision, Router
from honk.route.rulestats import NEVER

__all__ = ["Decision", "Plane", "SystemResolver", "build_plane", "score_target"]

log = logging.getLogger(__name__)


def score_target(meta: FlowMeta) -> ScoreTarget | None:
    """The flow's target as Score keys it; None when it does not normalize (Score then ranks
    on the aggregate rather than refusing the flow)."""
    target = meta.target
    ip = target.ip
    if ip is not None and getattr(ip, "scope_id", None) is None:  # parsed once already, by the Address
        return ScoreTarget(str(ip), target.port, ip)
    try:
        return ScoreTarget.of(target.host, target.port)
    except ValueError:
        return None


def _flow_target(groups: GroupManager, outbound: str, meta: FlowMeta) -> ScoreTarget | None:
    """The Score target of a flow routed to ``outbound``: only a group can lead to a Score group."""
    return score_target(meta) if outbound in groups else None


# Not frozen, as FlowMeta (honk.core.net): built per flow, never mutated.
@dataclass(slots=True)
class Decision:
    """The route taken and the leaf it resolved to.

    ``resolved`` is the destination IP routing looked up for a domain target
    (``None`` when no rule needed one, or the lookup failed).
    """

    route: RouteDecision
    selection: Selection
    resolved: IPAddress | None = None


@dataclass(frozen=True, slots=True)
class Plane:
    generation: int
    router: Router
    groups: GroupManager
    outbounds: dict[str, Outbound]
    spec: Spec
    # proxy leaves' runtimes by NodeId; the next plane reuses those of unchanged nodes
    runtimes: dict[uuid.UUID, NodeRuntime] = dataclasses.field(default_factory=dict)
    # this generation's physical dial budget (max_concurrent_dials, under the process gate)
    admission: DialBudget | None = None
    # the clock whose wall time the router's rule counters record (None: hits and misses are
    # counted, their times stay unset)
    clock: Clock | None = None

    def retire(self, previous: Plane | None) -> int:
        """Retire the runtimes of ``previous`` this plane does not use (call after publishing);
        how many. Retiring, not closing: a node's idle resources close now, but flows already
        on it (a busy mux carrier's streams) run on until the drain policy ends them (the
        reload's Drain steps) or they end on their own (``keep``)."""
        return retire_runtimes(previous.runtimes, self.runtimes) if previous is not None else 0

    def decide_now(self, meta: FlowMeta) -> Decision | None:
        """:meth:`decide` without awaiting: ``None`` when a rule needs the destination IP of
        a domain target (then call :meth:`decide`, which starts over). Raises what
        :meth:`decide` raises. Nothing is cached: every flow is routed afresh."""
        clock = self.clock
        result = self.router.route(meta, now=clock.wall() if clock is not None else NEVER)
        if isinstance(result, NeedsResolution):  # counted nothing: decide() starts over
            return None
        return Decision(
            result,
            self.groups.resolve(
                result.outbound,
                meta.network,
                target=_flow_target(self.groups, result.outbound, meta),
                destination=meta.resolved,
            ),
        )

    async def decide(self, meta: FlowMeta, resolver: Resolver) -> Decision:
        """Route ``meta`` and resolve the target name to one leaf.

        ``resolver`` is called at most once, and only when a rule needs the
        destination IP of a domain target; a failed lookup
        (:class:`~honk.route.resolve.ResolveError`, ``OSError``, or no address)
        makes destination-IP rules not match. Raises
        :class:`~honk.core.errors.NoRoute` when no dialable leaf results.
        """
        clock = self.clock
        result = self.router.route(meta, now=clock.wall() if clock is not None else NEVER)
        resolved: IPAddress | None = None
        if isinstance(result, NeedsResolution):  # nothing counted yet: the resumed search counts the flow
            host = meta.target.host
            try:
                addresses = await resolver(host)
            except (HonkError, OSError) as exc:
                log.debug("routing lookup of %s failed: %s", host, exc)
                addresses = []
            now = clock.wall() if clock is not None else NEVER
            if addresses:
                resolved = addresses[0]
                meta = dataclasses.replace(meta, resolved=resolved)
                result = self.router.route(meta, start=result.rule_index, now=now)
            else:
                result = self.router.route(meta, start=result.rule_index, resolution_failed=True, now=now)
            if isinstance(result, NeedsResolution):  # the router contract rules this out
                raise RuntimeError("router asked for resolution twice")
        selection = self.groups.resolve(
            result.outbound,
            meta.network,
            target=_flow_target(self.groups, result.outbound, meta),
            destination=meta.resolved,
        )
        return Decision(result, selection, resolved)


def build_plane(
    spec: Spec,
    clock: Clock,
    generation: int,
    previous: Plane | None = None,
    *,
    health: HealthFilter | None = None,
    saved_choices: Mapping[str, Mapping[Network, Identity]] | None = None,
) -> Plane:
    """Build every part of a Plane from ``spec``.

    Selector choices of ``previous`` (else ``saved_choices``, at startup) survive for
    groups and member identities that still exist, and unchanged nodes (same NodeId)
    keep their runtimes; call :meth:`Plane.retire` once the new plane is published.
    ``health`` is the groups' view of node health (None: every leaf eligible). Raises
    :class:`~honk.route.matchers.RouteCompileError` for a rule that cannot be compiled.
    """
    router = Router.compile(spec.routing, GeoAssets(spec.global_.data_dir))
    outbounds, runtimes = build_outbounds(spec, clock, previous.runtimes if previous is not None else None)
    groups = GroupManager.build(
        spec,
        outbounds,
        health=health,
        clock=clock,
        previous=previous.groups if previous is not None else None,
        saved=saved_choices,
    )
    targets = {rule.outbound for rule in spec.routing.rules if rule.outbound != MUST_RULES} | {
        spec.routing.fallback
    }
    for name in sorted(targets):
        if name not in groups and name not in outbounds:
            log.warning("routing names %r, which is neither a group nor an outbound; its flows fail", name)
    admission = DialBudget(spec.global_.max_concurrent_dials, clock)
    return Plane(
        generation=generation,
        router=router,
        groups=groups,
        outbounds=outbounds,
        spec=spec,
        runtimes=runtimes,
        admission=admission,
        clock=clock,
    )
