"""Planning: a pure diff of the running desired state against a new one.

``plan(running, desired)`` validates ``desired`` and returns the ordered steps that
take the daemon from one to the other, plus the new version table. It touches no
socket, file or clock, so every rule below is tested on hand-built desired states.

* DNS, the route and user sets are rebuilt when their declaration changed.
* An outbound is reused while its declaration is equal (and DNS is unchanged, unless
  it is the reject kind, which never resolves); otherwise it is built as the tag's
  next version and its old version is drained after the new plane is published.
  Versions are per tag, shared by outbounds and groups, and never repeat: a removed
  tag keeps its entry, so adding it back continues the count.
* A group is reused only when its declaration (with its resolved members) is equal and
  nothing it can select through (members, nested groups, final; transitively) is
  rebuilt. Groups are never drained: a flow belongs to the leaf it was opened on.
* Inbounds are matched by bind: the same bind with another declaration swaps the
  handler on the running socket; a bind nobody runs is bound; a bind nobody wants
  stops accepting; a tag nobody wants has its sessions closed.
* Changes that by nature end an inbound's live connections carry a ``Disrupt`` step,
  which the caller must allow.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from honk.config.expr import MUST_RULES
from honk.config.policies import ClosePolicy
from honk.control.desired import TRANSPARENT_KINDS, DesiredState, InboundDecl
from honk.control.errors import ApplyError, DuplicateTag, Invalid, UnknownReference

TUN_SETTINGS_CHANGED = "the tun inbound's settings changed; its runtime restarts and its flows end"
TUN_DEVICE_CHANGED = "the tun device changed; the old device and its flows end"
INTERCEPTION_CHANGED = (
    "the transparent inbound's interception changed; its kernel rules are replaced and its flows end"
)


@dataclass(frozen=True, slots=True)
class OutboundId:
    """One build of an outbound or group tag."""

    tag: str
    version: int

    def __str__(self) -> str:
        return f"{self.tag}@v{self.version}"


@dataclass(frozen=True, slots=True)
class Resource:
    kind: str  # "dns", "outbound", "group", "route", "user set", "inbound"
    tag: str = ""
    version: int = 0  # outbounds only

    def __str__(self) -> str:
        if self.kind in ("dns", "route"):
            return self.kind
        if self.kind == "outbound":
            return f"outbound {self.tag}@v{self.version}"
        return f"{self.kind} {self.tag}"


@dataclass(frozen=True, slots=True)
class Build:
    resource: Resource


@dataclass(frozen=True, slots=True)
class Reuse:
    resource: Resource


@dataclass(frozen=True, slots=True)
class Bind:
    tag: str
    bind: object  # BindSpec


@dataclass(frozen=True, slots=True)
class PublishPlane:
    pass


@dataclass(frozen=True, slots=True)
class SwapHandler:
    tag: str


@dataclass(frozen=True, slots=True)
class Disrupt:
    inbound: str
    reason: str


@dataclass(frozen=True, slots=True)
class StopAccepting:
    tag: str
    bind: object  # BindSpec


@dataclass(frozen=True, slots=True)
class CloseSessions:
    tag: str


@dataclass(frozen=True, slots=True)
class Drain:
    id: OutboundId
    policy: ClosePolicy


Step = Build | Reuse | Bind | PublishPlane | SwapHandler | Disrupt | StopAccepting | CloseSessions | Drain


@dataclass(frozen=True, slots=True)
class RunningState:
    """The last committed desired state (None before the first apply) and the latest
    version of every outbound and group tag ever applied (never pruned)."""

    desired: DesiredState | None = None
    versions: dict[str, int] = field(default_factory=dict)


EMPTY = RunningState()


@dataclass(slots=True)
class Plan:
    steps: list[Step]
    versions: dict[str, int]

    def disruptions(self) -> Iterator[tuple[str, str]]:
        for step in self.steps:
            if isinstance(step, Disrupt):
                yield step.inbound, step.reason

    @property
    def publishes(self) -> bool:
        return any(isinstance(s, PublishPlane) for s in self.steps)

    def version_of(self, tag: str) -> int:
        return self.versions[tag]


# --- validation --------------------------------------------------------------------------------


def validate(desired: DesiredState) -> None:
    """Raise the first :class:`ApplyError` of ``desired``: empty or duplicate tags, or a
    reference to something it does not declare."""
    _unique("outbound", [o.tag for o in desired.outbounds])
    _unique("group", [g.tag for g in desired.groups])
    _unique("inbound", [i.tag for i in desired.inbounds])
    _unique("user set", [u.tag for u in desired.user_sets])
    # a group may share a node's tag (upstream honk's config.dae does): the group answers to
    # it, the node stays the group member its name selects (honk.group.manager)
    outbound_tags = {o.tag for o in desired.outbounds}
    targets = outbound_tags | {g.tag for g in desired.groups}
    for g in desired.groups:
        # a default may name a subscription node not fetched yet: it is only a preference
        for ref in (*g.members, *((g.spec.final,) if g.spec.final else ())):
            if ref not in targets:
                raise UnknownReference(f"group {g.tag}", "outbound", ref)
    route = desired.route.routing
    for ref in (*(r.outbound for r in route.rules if r.outbound != MUST_RULES), route.fallback):
        if ref not in targets:
            raise UnknownReference("route", "outbound", ref)
    sets = {u.tag for u in desired.user_sets}
    binds: dict[object, str] = {}
    for i in desired.inbounds:
        if i.users is not None and i.users not in sets:
            raise UnknownReference(f"inbound {i.tag}", "user set", i.users)
        if i.bind in binds:
            raise Invalid(f"inbound {i.tag}", f"inbound {binds[i.bind]} is already bound to {i.bind}")
        binds[i.bind] = i.tag


def _unique(kind: str, tags: list[str]) -> None:
    seen: set[str] = set()
    for tag in tags:
        if not tag:
            raise Invalid(kind, "a tag must not be empty")
        if tag in seen:
            raise DuplicateTag(kind, tag)
        seen.add(tag)


# --- planning ----------------------------------------------------------------------------------


def plan(running: RunningState, desired: DesiredState) -> Plan:
    """The steps from ``running`` to ``desired``, in the fixed order: DNS, outbounds,
    groups, route, user sets, inbounds, PublishPlane (when the plane changed), swaps and
    disruptions, stops, session closes, drains. Raises :class:`ApplyError` from validation;
    nothing after validation fails."""
    validate(desired)
    prev = running.desired
    versions = dict(running.versions)
    steps: list[Step] = []
    drains: list[Drain] = []
    plane_changed = False

    def next_version(tag: str) -> int:
        versions[tag] = versions.get(tag, 0) + 1
        return versions[tag]

    # DNS
    dns_changed = prev is None or prev.dns != desired.dns
    steps.append(Build(Resource("dns")) if dns_changed else Reuse(Resource("dns")))
    plane_changed |= dns_changed

    # outbounds
    rebuilt: set[str] = set()
    for out in desired.outbounds:
        before = prev.outbound(out.tag) if prev is not None else None
        if (
            before is not None
            and before == out
            and not (dns_changed and out.uses_dns)
            and out.tag in versions
        ):
            steps.append(Reuse(Resource("outbound", out.tag, versions[out.tag])))
            continue
        if before is not None and out.tag in versions:
            drains.append(
                Drain(OutboundId(out.tag, versions[out.tag]), _drain_policy(out.tag, desired, prev))
            )
        steps.append(Build(Resource("outbound", out.tag, next_version(out.tag))))
        rebuilt.add(out.tag)
        plane_changed = True
    if prev is not None:
        for out in prev.outbounds:
            if desired.outbound(out.tag) is None:
                drains.append(
                    Drain(OutboundId(out.tag, versions[out.tag]), _drain_policy(out.tag, desired, prev))
                )
                plane_changed = True

    # groups: rebuilt when changed or when anything they select through is (a fixed point)
    changed = {
        g.tag for g in desired.groups if prev is None or prev.group(g.tag) != g or g.tag not in versions
    }
    grew = True
    while grew:
        grew = False
        for g in desired.groups:
            if g.tag not in changed and any(t in rebuilt or t in changed for t in g.reaches):
                changed.add(g.tag)
                grew = True
    for g in desired.groups:
        if g.tag in changed:
            next_version(g.tag)
            steps.append(Build(Resource("group", g.tag)))
            plane_changed = True
        else:
            steps.append(Reuse(Resource("group", g.tag)))
    if prev is not None and any(desired.group(g.tag) is None for g in prev.groups):
        plane_changed = True  # routes to a removed group stop

    # route
    route_changed = prev is None or prev.route != desired.route
    steps.append(Build(Resource("route")) if route_changed else Reuse(Resource("route")))
    plane_changed |= route_changed

    # user sets: never touch the plane or an inbound's steps
    for users in desired.user_sets:
        same = prev is not None and prev.user_set(users.tag) == users
        steps.append((Reuse if same else Build)(Resource("user set", users.tag)))

    # inbounds, matched by bind
    late: list[Step] = []
    running_by_bind = {i.bind: i for i in prev.inbounds} if prev is not None else {}
    running_by_tag = {i.tag: i for i in prev.inbounds} if prev is not None else {}
    for inbound in desired.inbounds:
        on_bind = running_by_bind.get(inbound.bind)
        if on_bind == inbound:
            steps.append(Reuse(Resource("inbound", inbound.tag)))
        elif on_bind is not None:
            steps.append(Build(Resource("inbound", inbound.tag)))
            late.append(SwapHandler(inbound.tag))
            reason = _swap_disruption(on_bind, inbound)
            if reason:
                late.append(Disrupt(inbound.tag, reason))
        else:
            steps.append(Bind(inbound.tag, inbound.bind))
            steps.append(Build(Resource("inbound", inbound.tag)))
            same_tag = running_by_tag.get(inbound.tag)
            if same_tag is not None and same_tag.kind == "tun" and inbound.kind == "tun":
                late.append(Disrupt(inbound.tag, TUN_DEVICE_CHANGED))
    wanted_binds = {i.bind for i in desired.inbounds}
    wanted_tags = {i.tag for i in desired.inbounds}
    stops = [
        StopAccepting(i.tag, i.bind) for i in (prev.inbounds if prev else ()) if i.bind not in wanted_binds
    ]
    closes = [CloseSessions(i.tag) for i in (prev.inbounds if prev else ()) if i.tag not in wanted_tags]

    if plane_changed:
        steps.append(PublishPlane())
    steps += late
    steps += stops
    steps += closes
    steps += drains
    return Plan(steps, versions)


def _drain_policy(tag: str, desired: DesiredState, prev: DesiredState | None) -> ClosePolicy:
    """Fixed at plan time: the first outbound with the tag (desired first, then running)
    decides through its own override; otherwise the new default."""
    decl = desired.outbound(tag) or (prev.outbound(tag) if prev is not None else None)
    if decl is not None and decl.drain is not None:
        return decl.drain
    return desired.policies.drain


def _swap_disruption(running: InboundDecl, desired: InboundDecl) -> str | None:
    """Why swapping ``running``'s handler for ``desired`` ends live connections, if it does."""
    if running.kind == "tun":
        return TUN_SETTINGS_CHANGED
    if running.kind in TRANSPARENT_KINDS and running.interception != desired.interception:
        return INTERCEPTION_CHANGED
    return None


__all__ = [
    "EMPTY",
    "ApplyError",
    "Bind",
    "Build",
    "CloseSessions",
    "Disrupt",
    "Drain",
    "OutboundId",
    "Plan",
    "PublishPlane",
    "Resource",
    "Reuse",
    "RunningState",
    "Step",
    "StopAccepting",
    "SwapHandler",
    "plan",
    "validate",
]
