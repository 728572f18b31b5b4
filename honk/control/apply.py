"""Prepare and commit: turning a plan into what runs.

:class:`Applier` owns what the reconciler runs: the running desired state and its
version table, the published plane and its epoch, the outbound versions by tag, the
listeners by bind and the admissions by inbound tag. Only the reconciler calls it,
one apply at a time.

* :meth:`Applier.prepare` does everything that can fail, into locals: the resolver,
  the new outbound versions (an unchanged node keeps its leaf object, a changed one
  gets a new leaf; runtimes follow the NodeId), the groups (reused groups keep their
  policy state), the route table, the admissions and the listeners, bound but not
  served, and last the transparent listener's kernel interception (nftables table,
  policy routing), installed once its socket is bound. A failure releases what it bound
  and leaves the applier untouched.
* :meth:`Applier.commit` cannot fail: it publishes the plane in one store, revokes
  removed principals, serves new listeners, swaps handlers, stores user tables, stops
  vanished binds, closes vanished tags' sessions and drains old versions. When the
  transparent listener is gone, its interception is removed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from honk.config.policies import ClosePolicy
from honk.config.spec import InboundSpec, RoutingSpec, Spec
from honk.connection.plane import Plane
from honk.control.desired import API_TAG, TRANSPARENT_KINDS, BindSpec, DesiredState, InboundDecl
from honk.control.errors import BindFailed, BuildFailed
from honk.control.plan import (
    Bind,
    Build,
    CloseSessions,
    Disrupt,
    Drain,
    Plan,
    Reuse,
    RunningState,
    StopAccepting,
    SwapHandler,
)
from honk.control.report import ApplyReport
from honk.core.errors import FlowClosed
from honk.dns.own import own_lookups
from honk.group.manager import GroupManager
from honk.inbound.sessions import Principal, admit
from honk.netlink.interception import InterceptionError, KernelInterception
from honk.outbound.admission import DialBudget
from honk.outbound.base import Outbound
from honk.outbound.block import BlockOutbound
from honk.outbound.registry import build_leaf
from honk.outbound.runtime import NodeRuntime
from honk.route.resolve import SystemResolver
from honk.route.router import Router

if TYPE_CHECKING:
    from pathlib import Path

    from honk.config.spec import ClashApiSpec
    from honk.connection.dispatch import Dispatcher
    from honk.connection.tracker import ConnectionTracker
    from honk.control.drain import Drainer
    from honk.control.health import HealthService
    from honk.core.clock import Clock
    from honk.ebpf.service import SlotService
    from honk.inbound.sessions import SessionRegistry


class ApplyHost(Protocol):
    """What the :class:`Applier` works on: the daemon that composes it (it implements this). The
    applier stores the plane through :meth:`publish`, builds listeners, and swaps the DNS handler;
    the API's listener comes from :meth:`api_listener`, so this layer never imports the API."""

    clock: Clock
    config_path: Path
    dispatcher: Dispatcher
    tracker: ConnectionTracker
    sessions: SessionRegistry
    drainer: Drainer
    health: HealthService
    slots: SlotService
    learned_names: Any
    dns_handler: Any
    dns_answer_now: Any

    def publish(self, plane: Plane, resolver: object, *, republish: bool = False) -> None: ...

    async def health_sync(self, plane: Plane, *, first: bool) -> None: ...

    def api_listener(self, spec: ClashApiSpec) -> Any:
        """A listener serving the API block ``spec`` (not yet bound)."""


log = logging.getLogger("honk.reload")

EMPTY_TAG = ""  # internal targets carry no configured tag


class Listener(Protocol):
    """What the applier needs of a listener (the mixed inbound, the API server)."""

    bound: Any

    async def bind(self) -> None: ...

    async def serve(self) -> None: ...

    def close_unserved(self) -> None: ...

    async def stop_accepting(self) -> None: ...


def empty_plane(clock: Any) -> Plane:
    """The plane before the first commit: every flow goes to the internal reject target."""
    block = BlockOutbound()
    block.outbound_id = f"{EMPTY_TAG}@v0"
    outbounds: dict[str, Outbound] = {"block": block}
    spec = Spec(routing=RoutingSpec(fallback="block"))
    groups = GroupManager.build(spec, outbounds, clock=clock)
    return Plane(
        generation=0,
        router=Router.compile(spec.routing),
        groups=groups,
        outbounds=outbounds,
        spec=spec,
        clock=clock,
    )


@dataclass(slots=True)
class Prepared:
    """Everything an apply built, not yet serving; :meth:`release` undoes it."""

    plan: Plan
    desired: DesiredState
    resolver: Any
    targets: dict[str, Outbound]
    runtimes: dict[uuid.UUID, NodeRuntime]
    groups: GroupManager | None
    router: Router
    admissions: dict[str, dict[str, Principal]]
    revocations: list[tuple[list[Principal], ClosePolicy]] = field(default_factory=list)
    to_start: list[tuple[BindSpec, str, Listener]] = field(default_factory=list)
    swaps: list[tuple[BindSpec, InboundDecl]] = field(default_factory=list)
    user_stores: list[tuple[BindSpec, dict[str, Principal]]] = field(default_factory=list)
    dns_service: Any = None  # the DNS module's service for this apply (None: no dns section)
    # the kernel interception this apply installed, and what ran before it (None: nothing)
    interception: KernelInterception | None = None
    replaced_interception: KernelInterception | None = None
    installed_interception: bool = False
    installed_table: Any = None  # the nftables table install() put in (its `auto` names resolved)

    def release(self) -> None:
        for _bind, _tag, listener in self.to_start:
            listener.close_unserved()
        self.to_start.clear()
        if self.installed_interception:  # put back what ran, or take honk's state out
            self.installed_interception = False
            restore_interception(self.replaced_interception, self.interception)


class Applier:
    """The running set of resources; driven by the reconciler only."""

    def __init__(self, daemon: ApplyHost) -> None:
        self.daemon = daemon
        self.running = RunningState()
        self.plane: Plane | None = None  # the last published plane (None before the first commit)
        self.epoch = 0  # planes published so far
        self.targets: dict[str, Outbound] = {}  # outbound tag -> its current version's leaf
        self.resolver: Any = None
        self.listeners: dict[BindSpec, Listener] = {}
        self.listener_tags: dict[BindSpec, str] = {}
        self.admissions: dict[str, dict[str, Principal]] = {}
        self.interception: KernelInterception | None = None  # installed kernel state (one owner)
        self._table: Any = None  # its nftables table as installed (what `auto` resolved to then)
        self.dns = DnsFront()  # the DNS listener's and the transparent inbound's way to the DNS service

    # --- reading -------------------------------------------------------------------

    def listener(self, tag: str) -> Listener | None:
        for bind, t in self.listener_tags.items():
            if t == tag:
                return self.listeners[bind]
        return None

    def inbounds(self) -> dict[str, Listener]:
        """The proxy listeners by tag (the API listener excluded)."""
        return {tag: self.listeners[bind] for bind, tag in self.listener_tags.items() if tag != API_TAG}

    # --- prepare -------------------------------------------------------------------

    async def prepare(
        self,
        plan: Plan,
        desired: DesiredState,
        *,
        bind: bool = True,
        saved_choices: Any = None,
        carried: Plane | None = None,
    ) -> Prepared:
        """Build everything ``plan`` needs; raises :class:`ApplyError` with nothing changed.
        ``carried``: a plane whose node runtimes the first apply takes over (the one that
        fetched subscriptions through a detour)."""
        daemon = self.daemon
        spec = desired.spec
        glob = spec.global_
        running = self.running.desired
        builds = {str(s.resource) for s in plan.steps if isinstance(s, Build)}

        # 1. DNS
        resolver = self.resolver
        if "dns" in builds or resolver is None:
            try:
                resolver = SystemResolver(daemon.clock, desired.dns.timeout)
            except Exception as exc:  # noqa: BLE001 - any failure refuses the apply
                raise BuildFailed("dns", exc) from exc

        # 1b. the DNS module: a changed section rebuilds the service over the running cache and
        # learning; so does a rebuilt route (its geodata may have changed): both read one GeoAssets
        geo = desired.route.geo()
        dns_service = self.dns.service
        if spec.dns is None:
            dns_service = None
        elif dns_service is None or running is None or running.spec.dns != spec.dns or "route" in builds:
            try:
                dns_service = _dns_service(spec.dns, dns_service, daemon, geo)
            except Exception as exc:  # noqa: BLE001 - any failure refuses the apply
                raise BuildFailed("dns", exc) from exc

        # 2. outbounds, in plan order; a node whose server name dae's node()/subnode() rules send
        # to an upstream resolves it through that upstream (the desired state chose it per node)
        own = own_lookups(spec.dns, dns_service, daemon.clock, desired.dns.timeout)
        targets: dict[str, Outbound] = {}
        used: dict[uuid.UUID, NodeRuntime] = {}
        source = self.plane if self.plane is not None else carried
        previous_runtimes = source.runtimes if source is not None else {}
        for step in plan.steps:
            resource = getattr(step, "resource", None)
            if resource is None or resource.kind != "outbound":
                continue
            decl = desired.outbound(resource.tag)
            assert decl is not None  # the plan was made from desired
            if isinstance(step, Reuse):
                leaf = self.targets[resource.tag]
                runtime = getattr(leaf, "runtime", None)
                if runtime is not None:
                    used[decl.node.id] = runtime
            else:
                try:
                    resolver = own.resolver(decl.own_dns) if own is not None else None
                    leaf = build_leaf(decl.node, glob, daemon.clock, previous_runtimes, used, resolver)
                except Exception as exc:  # noqa: BLE001 - a leaf that cannot be built refuses the apply
                    raise BuildFailed(str(resource), exc) from exc
                leaf.outbound_id = f"{resource.tag}@v{resource.version}"
            targets[resource.tag] = leaf

        # 3. groups; 4. route
        groups = None
        router = self.plane.router if self.plane is not None else None
        if plan.publishes or self.plane is None:
            reused = {
                s.resource.tag for s in plan.steps if isinstance(s, Reuse) and s.resource.kind == "group"
            }
            try:
                groups = GroupManager.build(
                    spec,
                    targets,
                    health=daemon.health.filter,
                    clock=daemon.clock,
                    previous=self.plane.groups if self.plane is not None else None,
                    saved=saved_choices,
                    reuse=reused,
                )
            except Exception as exc:  # noqa: BLE001
                raise BuildFailed("group", exc) from exc
        if "route" in builds or router is None:
            try:
                router = Router.compile(desired.route.routing, geo)
            except Exception as exc:  # noqa: BLE001 - a rule that does not compile refuses the apply
                raise BuildFailed("route", exc) from exc

        prepared = Prepared(
            plan, desired, resolver, targets, used, groups, router, {}, dns_service=dns_service
        )

        # 5. admissions, per desired inbound
        for inbound in desired.inbounds:
            if inbound.kind != "api":
                prepared.admissions[inbound.tag] = self._admit(desired, inbound, prepared.revocations)

        # 6. inbounds
        steps_by_tag = {
            s.resource.tag: s
            for s in plan.steps
            if isinstance(s, Build | Reuse) and s.resource.kind == "inbound"
        }
        try:
            for inbound in desired.inbounds:
                step = steps_by_tag[inbound.tag]
                running_listener = self.listeners.get(inbound.bind)
                if isinstance(step, Build) and inbound.kind == "api":
                    self._check_api(spec)
                if isinstance(step, Build):
                    if running_listener is not None:
                        running_decl = running.inbound(self.listener_tags[inbound.bind]) if running else None
                        if running_decl is not None and _family(running_decl.kind) != _family(inbound.kind):
                            raise BuildFailed(
                                f"inbound {inbound.tag}", "the handler is not of the kind its listener serves"
                            )
                        prepared.swaps.append((inbound.bind, inbound))  # with its user table
                        continue
                    listener = self._make_listener(inbound, spec)
                    if not bind:
                        continue
                    try:
                        await listener.bind()
                    except OSError as exc:
                        raise BindFailed(inbound.tag, str(inbound.bind), exc) from exc
                    prepared.to_start.append((inbound.bind, inbound.tag, listener))
                    if inbound.kind != "api":
                        listener.store_users(prepared.admissions[inbound.tag])  # type: ignore[attr-defined]
                elif running_listener is not None and inbound.kind == "api":
                    # the secret is the API's one user: a new one replaces the app serving new
                    # requests, and streams authenticated with the old one end
                    before = running.user_set(API_TAG) if running is not None else None
                    if before != desired.user_set(API_TAG):
                        prepared.swaps.append((inbound.bind, inbound))
                elif running_listener is not None:
                    table = prepared.admissions[inbound.tag]
                    if not _same_admissions(self.admissions.get(inbound.tag, {}), table):
                        prepared.user_stores.append((inbound.bind, table))
            # 7. the kernel interception, last: its table fails closed, so it goes in only once
            # the transparent socket it diverts to is bound
            prepared.interception = desired_interception(desired)
            prepared.replaced_interception = self.interception
            if bind and prepared.interception is not None and prepared.interception != self.interception:
                try:
                    prepared.installed_table = await asyncio.to_thread(prepared.interception.install)
                except InterceptionError as exc:
                    raise BuildFailed("inbound tproxy", f"interception: {exc}") from exc
                prepared.installed_interception = True
        except BaseException:
            prepared.release()
            raise
        return prepared

    def _admit(
        self,
        desired: DesiredState,
        inbound: InboundDecl,
        revocations: list[tuple[list[Principal], ClosePolicy]],
    ) -> dict[str, Principal]:
        """``inbound``'s user table against its running one; principals it no longer admits
        are queued in ``revocations`` under its removal policy."""
        user_set = desired.user_set(inbound.users) if inbound.users else None
        table, revoked = admit(
            self.admissions.get(inbound.tag), inbound.tag, user_set.users if user_set else ()
        )
        if revoked:
            revocations.append((revoked, inbound.user_removal or desired.policies.user_removal))
        return table

    def _restamp(self, desired: DesiredState) -> None:
        """Nothing routes differently: the plane carries the new spec (settings without steps)."""
        if self.plane is not None:
            self.plane = dataclasses.replace(self.plane, spec=desired.spec)
            self.daemon.publish(self.plane, self.resolver, republish=True)

    def _check_api(self, spec: Spec) -> None:
        """What the API's handler needs that binding does not show: its dashboard directory."""
        assert spec.clash_api is not None
        ui = spec.clash_api.external_ui
        if ui and not (self.daemon.config_path.parent / ui).is_dir():
            raise BuildFailed(f"inbound {API_TAG}", f"external_ui {ui} is not a directory")

    def _make_listener(self, inbound: InboundDecl, spec: Spec) -> Listener:
        daemon = self.daemon
        try:
            if inbound.kind == "api":
                assert spec.clash_api is not None
                return daemon.api_listener(spec.clash_api)
            if inbound.kind == "dns":
                from honk.dns.listener import DnsListener

                assert spec.dns is not None and spec.dns.bind is not None
                return DnsListener(spec.dns.bind, self.dns, daemon.clock)
            if inbound.kind in TRANSPARENT_KINDS:
                from honk.inbound.tproxy import TransparentInbound

                return TransparentInbound(
                    transparent_spec(inbound),
                    daemon.dispatcher,
                    daemon.clock,
                    dns_handler=daemon.dns_handler,
                    learned_names=daemon.learned_names,
                    sessions=daemon.sessions,
                )
            from honk.inbound.mixed import MixedInbound

            return MixedInbound(
                _inbound_spec(spec, inbound.tag), daemon.dispatcher, daemon.clock, sessions=daemon.sessions
            )
        except Exception as exc:  # noqa: BLE001 - a handler that cannot be built refuses the apply
            raise BuildFailed(f"inbound {inbound.tag}", exc) from exc

    # --- commit --------------------------------------------------------------------

    async def commit(self, prepared: Prepared) -> ApplyReport:
        """Make ``prepared`` what runs. Nothing here refuses: the report says what happened."""
        daemon = self.daemon
        plan, desired = prepared.plan, prepared.desired
        spec = desired.spec
        old_targets = self.targets
        self.targets = prepared.targets
        old_plane = self.plane
        self.resolver = prepared.resolver
        if plan.publishes or self.plane is None:
            self.epoch += 1
            plane = Plane(
                generation=self.epoch,
                router=prepared.router,
                groups=prepared.groups,
                outbounds=dict(prepared.targets),
                spec=spec,
                runtimes=prepared.runtimes,
                admission=DialBudget(spec.global_.max_concurrent_dials, daemon.clock),
                clock=daemon.clock,
            )
            interception = prepared.interception  # its `auto` interfaces resolve by `ip`: in the thread
            await asyncio.to_thread(
                lambda: daemon.slots.use_interfaces(interception.lans() if interception is not None else ())
            )
            # fail-open: every slot alive, then the kernel rules and the plane, then the exact slots
            daemon.slots.reload(
                prepared.groups, spec.routing, lambda: daemon.publish(plane, prepared.resolver)
            )
            plane.retire(old_plane)
            self.plane = plane
            if old_plane is not None and prepared.groups is not old_plane.groups:
                prepared.groups.commit_score(daemon.clock.now())  # the reload fence of the shared Score state
            await daemon.health_sync(plane, first=old_plane is None)
        else:
            self._restamp(desired)

        for principals, policy in prepared.revocations:
            daemon.sessions.revoke(principals, policy, daemon.clock)
        await self._use_dns(prepared)
        for bind, tag, listener in prepared.to_start:
            await listener.serve()
            self.listeners[bind] = listener
            self.listener_tags[bind] = tag
        prepared.to_start = []
        for bind, inbound in prepared.swaps:
            listener = self.listeners[bind]
            self.listener_tags[bind] = inbound.tag
            if inbound.kind == "api":
                assert spec.clash_api is not None
                await listener.swap(spec.clash_api)  # type: ignore[attr-defined]
            else:
                # the handler and its user table in one step: no connection sees one without the other
                handler = (
                    transparent_spec(inbound)
                    if inbound.kind in TRANSPARENT_KINDS
                    else _inbound_spec(spec, inbound.tag)
                )
                listener.swap(handler, prepared.admissions[inbound.tag])  # type: ignore[attr-defined]
        for bind, table in prepared.user_stores:
            self.listeners[bind].store_users(table)  # type: ignore[attr-defined]

        report = ApplyReport()
        previous_tags = {i.tag for i in self.running.desired.inbounds} if self.running.desired else set()
        for step in plan.steps:
            if isinstance(step, Reuse):
                report.reused.append(str(step.resource))
            elif isinstance(step, Build):
                report.built.append(str(step.resource))
            elif isinstance(step, Bind):
                if step.tag in previous_tags:
                    report.rebound.append(step.tag)
            elif isinstance(step, SwapHandler):
                report.swapped.append(step.tag)
            elif isinstance(step, Disrupt):
                report.restarted.append(step.inbound)
            elif isinstance(step, StopAccepting):
                listener = self.listeners.pop(step.bind, None)  # type: ignore[arg-type]
                self.listener_tags.pop(step.bind, None)  # type: ignore[arg-type]
                if listener is not None:
                    await listener.stop_accepting()
            elif isinstance(step, CloseSessions):
                error = FlowClosed(f"inbound {step.tag} was removed")
                daemon.sessions.close_tag(step.tag, error)
                daemon.tracker.close_inbound(step.tag, error)
                report.removed.append(step.tag)
            elif isinstance(step, Drain):
                old = old_targets.get(step.id.tag)
                if old is not None and getattr(old, "outbound_id", None) == str(step.id):
                    daemon.drainer.drain(str(step.id), step.policy)
                report.drained.append(str(step.id))
        if prepared.interception is None and self.interception is not None:
            await asyncio.to_thread(self.interception.remove)  # the transparent listener is gone
        if prepared.interception is None or prepared.installed_interception:
            self.interception = prepared.interception
            self._table = prepared.installed_table
        prepared.installed_interception = False
        self.admissions = prepared.admissions
        self.running = RunningState(desired, plan.versions)
        report.epoch = self.epoch
        log.debug(
            "applied: %d built, %d reused, %d swapped, %d drained",
            len(report.built),
            len(report.reused),
            len(report.swapped),
            len(report.drained),
        )
        return report

    def edit_users(self, user_set: str, desired: DesiredState) -> int:
        """The user edit path: ``desired`` differs from the running state only in user set
        ``user_set``. No plan: the inbounds admitting the set get their tables rebuilt
        (every principal of a kept user with the same password stays) and the removed or
        re-keyed users' principals are revoked under each inbound's policy; the plane,
        listeners and versions are untouched. Returns how many sessions were ended or
        scheduled to end. Nothing here fails: admission cannot."""
        daemon = self.daemon
        revocations: list[tuple[list[Principal], ClosePolicy]] = []
        tables = {
            inbound.tag: self._admit(desired, inbound, revocations)
            for inbound in desired.inbounds
            if inbound.users == user_set and inbound.kind != "api"
        }
        acted = sum(
            daemon.sessions.revoke(principals, policy, daemon.clock) for principals, policy in revocations
        )
        for tag, table in tables.items():
            listener = self.listener(tag)
            if listener is not None:
                listener.store_users(table)  # type: ignore[attr-defined]
        self.admissions.update(tables)
        self._restamp(desired)
        self.running = RunningState(desired, self.running.versions)
        return acted

    async def _use_dns(self, prepared: Prepared) -> None:
        """The DNS service of ``prepared`` answers from now on: the DNS listener reads it through
        the front, the transparent inbounds get its handler (or none: port 53 is then proxied)."""
        daemon, old, new = self.daemon, self.dns.service, prepared.dns_service
        if new is old:
            return
        self.dns.service = new
        daemon.dns_handler = self.dns.handle if new is not None else None
        daemon.dns_answer_now = self.dns.answer_now if new is not None else None
        daemon.learned_names = new.learned_names if new is not None else None
        for listener in [*self.listeners.values(), *(entry[2] for entry in prepared.to_start)]:
            if hasattr(listener, "learned_names"):  # a transparent inbound
                listener.dns_handler = daemon.dns_handler  # type: ignore[attr-defined]
                listener.dns_answer_now = daemon.dns_answer_now  # type: ignore[attr-defined]
                listener.learned_names = daemon.learned_names  # type: ignore[attr-defined]
        if new is None and old is not None:
            await old.aclose()  # a rebuilt service shares its state, and its queries finish

    async def follow_default_route(self) -> bool:
        """The network changed (a reconciler command): when an interface list says ``auto`` and
        the default route's interface is another now, swap the nftables table for the new one
        (one transaction; the listener, policy routing and flows stay). Whether it changed."""
        interception = self.interception
        if interception is None or not interception.follows_default_route:
            return False
        table = await asyncio.to_thread(lambda: interception.table)
        if table == self._table:
            return False
        try:
            self._table = await asyncio.to_thread(interception.install_table, table)
        except InterceptionError as exc:  # the old table stays in: it still fails closed
            log.warning("interception not moved to the new default route: %s", exc)
            return False
        return True

    async def stop_listeners(self) -> None:
        """Shutdown: the kernel interception first (the LAN is routed as if honk were not
        there), then every listener."""
        if self.interception is not None:
            await asyncio.to_thread(self.interception.remove)
            self.interception = None
            self._table = None
        await asyncio.to_thread(self.daemon.slots.close)  # the classifier off the LAN interfaces
        for listener in self.listeners.values():
            await listener.stop_accepting()
        self.listeners.clear()
        self.listener_tags.clear()
        if self.dns.service is not None:
            await self.dns.service.aclose()


def _family(kind: str) -> str:
    """Listeners serve one family of handler: the API's, a proxy protocol's, or one transparent kind's."""
    if kind == "api" or kind in TRANSPARENT_KINDS:
        return kind
    return "stream"


class DnsFront:
    """Queries to whichever DNS service is current (None: no dns section; the query is dropped)."""

    def __init__(self) -> None:
        self.service: Any = None

    async def handle(self, query: bytes, client: Any, original: Any, *, tcp: bool = False) -> bytes | None:
        service = self.service
        if service is None:
            return None
        return await service.handle(query, client, original, tcp=tcp)

    def answer_now(self, query: bytes, client: Any, original: Any, *, tcp: bool = False) -> bytes | None:
        """A cache hit answered synchronously (``DnsService.answer_now``), or None: call handle()."""
        service = self.service
        return None if service is None else service.answer_now(query, client, original, tcp=tcp)


def _dns_service(spec: Any, running: Any, daemon: ApplyHost, geo: Any) -> Any:
    """The service for ``spec``: the running one rebuilt (its cache and learning carried), or new;
    its rules read the geodata through ``geo``, the router's GeoAssets."""
    if running is not None:
        return running.rebuilt(spec, geo)
    from honk.dns.service import DnsService  # dnspython loads only for a config with a dns section

    return DnsService(spec, daemon.dispatcher, daemon.clock, geo=geo)


def desired_interception(desired: DesiredState) -> KernelInterception | None:
    """The kernel state the desired transparent listener needs, or None without one."""
    for inbound in desired.inbounds:
        if inbound.kind == "tproxy" and inbound.interception:
            settings = dict(inbound.interception)
            return KernelInterception(
                lan_interfaces=tuple(settings["lan_interface"]),  # type: ignore[arg-type]
                tproxy_port=int(settings["tproxy_port"]),  # type: ignore[arg-type]
                mark=int(settings["mark"]),  # type: ignore[arg-type]
                auto_config_kernel_parameter=bool(settings["auto_config_kernel_parameter"]),
                wan_interfaces=tuple(settings.get("wan_interface", ())),  # type: ignore[arg-type]
            )
    return None


def restore_interception(previous: KernelInterception | None, installed: KernelInterception | None) -> None:
    """Undo an install: the previous state again, or none of honk's (blocking)."""
    try:
        if previous is not None:
            previous.install()
        elif installed is not None:
            installed.remove()
    except InterceptionError as exc:
        log.error("restoring the previous interception failed: %s", exc)


def transparent_spec(inbound: InboundDecl):  # noqa: ANN201 - a honk.inbound.tproxy.TransparentSpec
    from honk.inbound.tproxy import TransparentSpec

    settings = dict(inbound.settings)
    return TransparentSpec(
        name=inbound.tag,
        kind=inbound.kind,
        host=inbound.bind.host,
        port=inbound.bind.port,
        dial_mode=str(settings["dial_mode"]),
        sniffing_timeout=float(settings["sniffing_timeout"]),
    )  # type: ignore[arg-type]


def _inbound_spec(spec: Spec, tag: str) -> InboundSpec:
    found = next((i for i in spec.inbounds if i.name == tag), None)
    assert found is not None, tag
    return found


def _same_admissions(running: dict[str, Principal], new: dict[str, Principal]) -> bool:
    """Same users in the same order, each with the same principal object."""
    return list(running) == list(new) and all(running[k] is new[k] for k in running)
