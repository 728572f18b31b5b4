"""The daemon: the process around the reconciler.

Theory of operation
-------------------
Every change to what runs goes through the reconciler (:mod:`honk.control`): the first
configuration at start, SIGHUP, ``honkctl reload``, the API's reloads, a subscription's
new node set, Selector and pin writes, and shutdown. The reconciler runs them one at a
time on its own task; an apply plans (pure), checks for disruption, prepares
everything that can fail without serving, then commits, which cannot fail. Unchanged
resources keep running as they are: a listener keeps its socket, an outbound its leaf
and runtime, a group its policy state. A refused apply changes nothing.

Subscriptions: a :class:`SubscriptionManager` owns the nodes each subscription
provides. The running spec is the file's spec with those nodes appended
(:func:`merge_nodes`; configured nodes win name clashes). Start waits a bounded
time for first fetches; afterwards every published change of the node set is
applied as a reconciler command, and a reload keeps the nodes of subscriptions whose
URL and User-Agent stay.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import gc
import logging
import os
import signal
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from honk.api.server import ApiServer
from honk.config.diagnostics import ConfigError, Severity
from honk.config.load import load_file
from honk.config.spec import ClashApiSpec, GlobalSpec, InboundUser, Spec, SubscriptionSpec
from honk.connection.descriptors import DescriptorBudget, raise_descriptor_limit
from honk.connection.dispatch import Dispatcher
from honk.connection.mode import GLOBAL_DEFAULT, GLOBAL_GROUP, RoutingMode, global_members
from honk.connection.plane import Plane, SystemResolver, build_plane
from honk.connection.tracker import ConnectionTracker
from honk.connection.warm import WarmUp
from honk.control.apply import Applier, empty_plane
from honk.control.desired import API_TAG, DesiredState, lower
from honk.control.drain import Drainer
from honk.control.errors import ApplyError, Disruptive, FileRefused, Invalid, Stopped
from honk.control.geoupdate import GeodataUpdater, UpdateReport, dial_for_route
from honk.control.health import HealthService
from honk.control.plan import Plan, RunningState, plan
from honk.control.reconciler import Reconciler
from honk.control.report import ApplyReport
from honk.core.clock import Clock, MonotonicClock, timeout_at
from honk.core.errors import FlowClosed, NoRoute
from honk.core.logs import LogBroker, kv, set_level
from honk.core.net import Address, Network
from honk.core.stats import RuntimeStats
from honk.daemon.loopguard import LoopGuard
from honk.daemon.notify import Notifier
from honk.dns.own import OwnLookups, own_lookups, subscription_upstream
from honk.ebpf.service import SlotService
from honk.group.events import ChoiceChanged, FlowsInterrupted, GroupEvent, SelectionMoved
from honk.group.manager import SharedGroupManager
from honk.group.policy import UnknownGroup, UnknownMember
from honk.inbound.mixed import MixedInbound
from honk.inbound.sessions import SessionRegistry
from honk.outbound.base import DialedStream
from honk.outbound.direct import DirectOutbound
from honk.relay.native import close_engines
from honk.subscription.fetch import Dial
from honk.subscription.manager import FIRST_FETCH_WAIT, NodesBySubscription, SubscriptionManager, merge_nodes

log = logging.getLogger("honk.daemon")

SWEEP_INTERVAL = 1.0  # seconds between idle sweeps of the connection table
INTERRUPT_CONFIRM_TIMEOUT = 5.0  # seconds a selection write waits for the flows it interrupted to end
GC_YOUNG_THRESHOLD = 10_000  # container allocations between young-generation collector passes
# (CPython's default is 700): a flow allocates a few hundred containers that reference counting
# frees, so at hundreds of flows a second the default runs the collector over the same short-lived
# objects several times per flow; ten thousand keeps an unreachable cycle for at most a few MB


def log_diagnostics(diagnostics, *, during: str) -> None:
    """Log each config finding at its own severity; never with config values."""
    for d in diagnostics:
        level = {Severity.ERROR: logging.ERROR, Severity.WARNING: logging.WARNING}.get(
            d.severity, logging.INFO
        )
        log.log(
            level,
            "config %s %s",
            d.severity.value,
            kv(during=during, at=str(d.loc), key=d.key_path, code=d.code, problem=d.message),
        )


class Daemon:
    def __init__(
        self, config_path: str | os.PathLike, clock: Clock | None = None, log_level: str | None = None
    ) -> None:
        self.config_path = Path(config_path)
        self._forced_log_level = log_level  # `honk run --debug` outranks the file's log_level
        self.clock: Clock = clock or MonotonicClock()
        self.config: Spec | None = None  # the file's spec as loaded
        self.subscriptions: SubscriptionManager | None = None
        self._closing = False
        self._queued_commands: set[asyncio.Task[None]] = (
            set()
        )  # node sets and interface moves waiting for the reconciler
        self._fetch_plane: Plane | None = None  # only while start() waits for detoured first fetches
        # only while start() waits for the first fetches: the resolvers of dae's sub() DNS rules
        # (there is no DNS service before the first apply) and the exchanger they ask through
        self._start_own: OwnLookups | None = None
        self._start_exchanger: Any = None
        self.tracker = ConnectionTracker(self.clock)
        self.sessions = SessionRegistry()  # inbound sessions by tag
        self.stats = RuntimeStats()  # event counters the API exports
        self.drainer = Drainer(self.tracker, self.clock, self.stats)  # outbound versions leaving service
        self.reconciler = Reconciler()
        self.applier = Applier(self)  # what runs; only reconciler commands touch it
        # routes every flow to the internal reject target until the first commit
        self.dispatcher = Dispatcher(
            empty_plane(self.clock),
            self.tracker,
            self.clock,
            GlobalSpec(),
            SystemResolver(self.clock, GlobalSpec().connect_timeout),
        )
        # what the transparent inbound hands intercepted port-53 queries to, and the DNS-learned
        # names of an address (None: no DNS module configured)
        self.dns_handler: Callable[..., Awaitable[bytes | None]] | None = None
        self.dns_answer_now: Callable[..., bytes | None] | None = None  # its cache hits, without a task
        self.learned_names: Callable[[Any], tuple[str, ...]] | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._stopped = asyncio.Event()
        self.health = HealthService(self.clock)
        self.health.stats = self.stats
        self.loop_guard = LoopGuard(self.stats, self.clock)  # unretrieved task exceptions: logged and counted
        self.dispatcher.on_selection = self.health.note_selection
        self.health.network_listeners.append(self._network_changed)
        # group connectivity for the datapath (the BPF map with a LAN, else memory)
        self.slots = SlotService(self.health.alive)
        self.health.alive.subscribe(self.slots.on_transition)
        self.groups: SharedGroupManager | None = None  # the stable handle on the current group manager
        # flow ids closed by the Selector write in progress (None: none is; automatic changes do not wait)
        self._interrupted: list[str] | None = None
        self.logs = LogBroker()  # live log readers (the API's /logs)
        self.mode = RoutingMode()  # the Clash mode and the GLOBAL choice
        self.dispatcher.mode = self.mode
        self.dispatcher.stats = self.stats
        self.started_wall = 0.0  # wall-clock seconds at ready
        self.started_at = 0.0  # clock.now() at ready (uptime)
        self.warm = WarmUp(self.clock, lambda: self.plane)  # startup preconnect and Selector pins
        self.notify = Notifier()  # systemd's readiness protocol (a no-op outside a Type=notify unit)
        self.geodata = GeodataUpdater(
            self.clock,
            spec=lambda: self.spec,
            dial=self._asset_dial,
            reload=self.reload,
            generation=lambda: self.generation,
        )

    # --- what runs (read-only views of the applier) -----------------------------------

    @property
    def plane(self) -> Plane | None:
        """The published plane (None before the first commit)."""
        return self.applier.plane

    @property
    def spec(self) -> Spec | None:
        """What runs: the file's spec plus subscription nodes."""
        desired = self.applier.running.desired
        return desired.spec if desired is not None else None

    @property
    def inbounds(self) -> dict[str, MixedInbound]:
        return self.applier.inbounds()  # type: ignore[return-value]

    @property
    def api(self) -> ApiServer | None:
        return self.applier.listener(API_TAG)  # type: ignore[return-value]

    @property
    def dns_service(self) -> Any:
        """The running DnsService (None without a dns section): the API's DNS tools and metrics."""
        return self.applier.dns.service

    @property
    def generation(self) -> int:
        """The published plane's epoch (0 before the first commit)."""
        return self.applier.epoch

    epoch = generation

    # --- start ---------------------------------------------------------------

    async def start(self) -> None:
        """Load and apply the file on this task, then start the reconciler. Raises
        ConfigError, ApplyError or OSError and leaves nothing running."""
        raise_descriptor_limit()  # before anything sizes itself from the limit (the dial gates)
        self.dispatcher.descriptors = DescriptorBudget(
            self.clock, stats=self.stats, ended=lambda: self.tracker.removed
        )
        self.stats.descriptor_limit = self.dispatcher.descriptors.limit
        spec = load_file(self.config_path)
        log_diagnostics(spec.diagnostics, during="start")
        self._set_log_level(spec)
        if spec.clash_api is not None:
            self.mode.set(spec.clash_api.default_mode)
        Path(spec.global_.data_dir).mkdir(parents=True, exist_ok=True)
        config, subscriptions = spec, self._subscription_manager(spec)
        own_fetches = any(
            not s.detour and subscription_upstream(config.dns, s) is not None for s in config.subscriptions
        )
        if any(s.detour for s in config.subscriptions) or own_fetches:
            # first downloads through a node of the file, before the real plane exists
            self._fetch_plane = build_plane(config, self.clock, 0)
        if own_fetches:
            self._start_own_lookups(config)
        try:
            await subscriptions.start()
            await subscriptions.wait_settled(FIRST_FETCH_WAIT)
            spec = self._effective(config, subscriptions.nodes())
            saved = await self.health.open_state(spec.global_.data_dir)
            desired = lower(spec)
            first = plan(self.applier.running, desired)  # from empty: never disruptive
            prepared = await self.applier.prepare(
                first, desired, saved_choices=saved, carried=self._fetch_plane
            )
        except BaseException:
            await subscriptions.stop()
            await self._end_start_own_lookups()
            raise
        await self._end_start_own_lookups()
        previous_fetch, self._fetch_plane = self._fetch_plane, None
        self.config, self.subscriptions = config, subscriptions
        report = await self.applier.commit(prepared)
        if self.plane is not None:
            self.plane.retire(previous_fetch)
        self.logs.install()
        self.loop_guard.install(asyncio.get_running_loop())
        self.started_wall, self.started_at = self.clock.wall(), self.clock.now()
        if _node_view(self._effective(config, subscriptions.nodes())) != _node_view(spec):
            self._on_subscription_nodes(subscriptions.nodes())  # published while the plane was being built
        self._sweeper = asyncio.get_running_loop().create_task(
            self.tracker.run_sweeper(SWEEP_INTERVAL), name="honk-idle-sweeper"
        )
        self.reconciler.start()
        self.warm.start()
        settle_heap()
        api = self.api
        api_address = {"api": f"{api.bound[0]}:{api.bound[1]}"} if api is not None and api.bound else {}
        log.debug("first apply: %s", report.summary())
        log.info(
            "honk ready %s",
            kv(
                config=str(self.config_path),
                generation=self.generation,
                **{f"inbound.{n}": str(i.bound) for n, i in self.inbounds.items()},
                **api_address,
            ),
        )

    def publish(self, plane: Plane, resolver: object, *, republish: bool = False) -> None:
        """The applier's one store: new flows route with ``plane`` from now on."""
        glob = plane.spec.global_
        if not republish:
            self._install_group_events(plane)  # before the plane is published
        self.dispatcher.swap_plane(plane, glob, resolver)  # type: ignore[arg-type]
        self._set_log_level(plane.spec)
        if republish:
            return
        if self.groups is None:
            self.groups = SharedGroupManager(plane.groups)
        else:
            self.groups.publish(plane.groups)
        self.stats.retain_groups(set(plane.groups.names))
        self.stats.retain_outbounds(set(plane.outbounds))
        self.tracker.forget_leaves(set(plane.outbounds))
        self.warm.wake()  # its pins follow the new plane's Selectors
        if self.mode.global_choice not in global_members(plane):
            self.mode.global_choice = GLOBAL_DEFAULT

    async def health_sync(self, plane: Plane, *, first: bool) -> None:
        """Hand the published plane's nodes and groups to the health service."""
        if first:
            await self.health.start(plane)
        else:
            await self.health.apply(plane)

    def _install_group_events(self, plane: Plane) -> None:
        """Route what a group manager reports to the daemon; installed before the plane is published."""
        plane.groups.sink = self._group_event

    def _group_event(self, event: GroupEvent) -> None:
        """The one routing point of group events, run synchronously inside the manager's call."""
        match event:
            case ChoiceChanged(group, network, identity):
                self.health.save_choice(group, network, identity)
            case SelectionMoved(group, network):
                self._selection_moved(group, network)
            case FlowsInterrupted(group, network):
                self._interrupt(group, network)

    def _selection_moved(self, group: str, network: Network) -> None:
        self.stats.selection_changed(group, network.value)
        if network is Network.TCP:
            self.warm.wake()  # a Selector's new choice is warmed at once (GH-I-05)

    def _subscription_manager(self, config: Spec) -> SubscriptionManager:
        glob = config.global_
        manager = SubscriptionManager(
            config.subscriptions,
            glob.data_dir if glob.store_subscribe else None,
            self.clock,
            DirectOutbound(self.clock, glob.connect_timeout).dial_tcp,
            self._on_subscription_nodes,
            dial_via=self._dial_via,
            dial_for=self._own_dial,
        )
        manager.stats = self.stats  # before the first fetch
        return manager

    def _own_dial(self, subscription: SubscriptionSpec) -> Dial | None:
        """A direct dial resolving ``subscription``'s URL host through the upstream dae's ``sub()``
        DNS rules of the running configuration pick (at start, before the first apply: of the
        file, asked through the fetch plane); None: no rule picks one."""
        spec = self.spec
        if spec is not None:
            own = own_lookups(spec.dns, self.applier.dns.service, self.clock, spec.global_.connect_timeout)
        else:
            own = self._start_own
        resolver = own.for_subscription(subscription) if own is not None else None
        if resolver is None or own is None:
            return None
        return DirectOutbound(self.clock, own.timeout, resolver=resolver).dial_tcp

    def _start_own_lookups(self, config: Spec) -> None:
        """The sub() rules' resolvers for the first downloads: their upstream exchanges route
        through the fetch plane (the file's nodes and rules), as the DNS service's will through
        the first real plane."""
        from honk.dns.upstream import Exchanger  # dnspython: the file has a dns section

        assert config.dns is not None and self._fetch_plane is not None
        glob = config.global_
        dispatcher = Dispatcher(
            self._fetch_plane,
            self.tracker,
            self.clock,
            glob,
            SystemResolver(self.clock, glob.connect_timeout),
        )
        self._start_exchanger = Exchanger(dispatcher, self.clock)
        self._start_own = OwnLookups(config.dns, self._start_exchanger, self.clock, glob.connect_timeout)

    async def _end_start_own_lookups(self) -> None:
        exchanger, self._start_own, self._start_exchanger = self._start_exchanger, None, None
        if exchanger is not None:
            await exchanger.aclose()

    def _dial_via(self, name: str) -> Dial:
        """Dial through the node or group ``name`` of the plane current at each download."""

        async def dial(target: Address, deadline: float) -> DialedStream:
            plane = self.plane or self._fetch_plane
            if plane is None:
                raise NoRoute(f"{name}: no plane to resolve the subscription detour in")
            leaf = plane.groups.resolve(name, Network.TCP).leaf
            return await leaf.dial_tcp(target, deadline)

        return dial

    @staticmethod
    def _effective(config: Spec, nodes: NodesBySubscription) -> Spec:
        """The spec that runs: the file's nodes, then the subscriptions' nodes."""
        if not nodes:
            return config
        return dataclasses.replace(
            config, nodes=merge_nodes(config.nodes, nodes, (g.name for g in config.groups))
        )

    def _network_changed(self, reason: str) -> None:
        """Links, addresses or routes changed: an ``auto`` interception follows the default
        route (a reconciler command, so it never races an apply)."""
        interception = self.applier.interception
        if (
            self._closing
            or self.reconciler.stopped
            or interception is None
            or not interception.follows_default_route
        ):
            return
        task = asyncio.get_running_loop().create_task(self._follow_default_route(), name="honk-follow-route")
        self._queued_commands.add(task)
        task.add_done_callback(self._queued_commands.discard)

    async def _follow_default_route(self) -> None:
        with contextlib.suppress(Stopped):
            await self.reconciler.call("interfaces", self.applier.follow_default_route)

    def _on_subscription_nodes(self, nodes: NodesBySubscription) -> None:
        """The manager's publish callback: apply the new node set as a reconciler command."""
        if self._closing or self.reconciler.stopped:
            return
        task = asyncio.get_running_loop().create_task(
            self._apply_subscriptions(), name="honk-subscription-apply"
        )
        self._queued_commands.add(task)
        task.add_done_callback(self._queued_commands.discard)

    async def _apply_subscriptions(self) -> None:
        async def apply() -> None:
            if self._closing or self.spec is None or self.config is None or self.subscriptions is None:
                return  # start() builds with the latest nodes itself
            spec = self._effective(self.config, self.subscriptions.nodes())
            if _node_view(spec) != _node_view(self.spec):
                try:
                    await self._reconcile(spec, cause="subscription")
                except ApplyError:
                    pass  # logged; the running configuration stays

        with contextlib.suppress(Stopped):
            await self.reconciler.call("subscription", apply)

    def _set_log_level(self, spec: Spec) -> None:
        set_level(self._forced_log_level or spec.global_.log_level)

    # --- reload --------------------------------------------------------------

    def api_listener(self, spec: ClashApiSpec) -> ApiServer:
        """The applier's factory for the API listener of ``spec`` (this daemon serves it)."""
        return ApiServer(self, spec, self.config_path.parent)

    async def check_spec(self, spec: Spec, path: str | os.PathLike[str]) -> DesiredState:
        """The dry run the API's ``/v1/config/check`` asks for (module :func:`check_spec`)."""
        return await check_spec(spec, path)

    async def reload(self, allow_disruptive: bool = False) -> ApplyReport:
        """Apply the file as it is now (``honkctl reload``, the API). Returns the report;
        raises ApplyError (FileRefused for a file that does not load) with nothing changed."""
        return await self.reconciler.call("reload", lambda: self._reload(allow_disruptive))

    async def update(
        self,
        edit: Callable[[Spec], Spec] | None,
        allow_disruptive: bool = False,
        runtime: Callable[[], None] | None = None,
    ) -> ApplyReport | None:
        """``PATCH /configs``: edit the running configuration inside the reconciler (so it sees
        what the previous command left) and apply the result; ``runtime`` applies settings
        that are not resources (the mode) in the same command, after the apply. A reload
        re-reads the file, which undoes the edit."""

        async def command() -> ApplyReport | None:
            report = None
            if edit is not None:
                assert self.config is not None and self.subscriptions is not None  # set by start()
                config = edit(self.config)
                report = await self._reconcile(
                    self._effective(config, self.subscriptions.nodes()),
                    allow_disruptive=allow_disruptive,
                    cause="update",
                )
                self.config = config
            if runtime is not None:  # only once the edit was applied: a refusal changes nothing
                runtime()
            return report

        return await self.reconciler.call("update", command)

    # --- user edits (no plan: only the named user set changes) ----------------------------

    async def set_users(self, user_set: str, users: Sequence[InboundUser]) -> None:
        """Replace every user of ``user_set`` (an inbound's users; the set is named like it)."""
        await self._edit_users(user_set, lambda _old: tuple(users))

    async def upsert_user(self, user_set: str, user: InboundUser) -> None:
        """Add ``user`` to ``user_set`` or replace the user of that name."""

        def upsert(old: tuple[InboundUser, ...]) -> tuple[InboundUser, ...]:
            if any(u.username == user.username for u in old):
                return tuple(user if u.username == user.username else u for u in old)
            return (*old, user)

        await self._edit_users(user_set, upsert)

    async def remove_user(self, user_set: str, username: str) -> bool:
        """Remove ``username`` from ``user_set``; False (and nothing changed) if it was not there."""

        def remove(old: tuple[InboundUser, ...]) -> tuple[InboundUser, ...] | None:
            kept = tuple(u for u in old if u.username != username)
            return None if len(kept) == len(old) else kept

        return await self._edit_users(user_set, remove)

    async def _edit_users(
        self, user_set: str, change: Callable[[tuple[InboundUser, ...]], tuple[InboundUser, ...] | None]
    ) -> bool:
        async def command() -> bool:
            assert self.config is not None and self.subscriptions is not None  # set by start()
            inbound = next((i for i in self.config.inbounds if i.name == user_set and i.users), None)
            if inbound is None:
                raise Invalid(f"user set {user_set}", "no such user set")
            users = change(inbound.users)
            if users is None:
                return False
            if not users:
                raise Invalid(
                    f"user set {user_set}",
                    "an inbound with users keeps at least one; remove its users in the file instead",
                )
            config = dataclasses.replace(
                self.config,
                inbounds=tuple(
                    dataclasses.replace(i, users=users) if i is inbound else i for i in self.config.inbounds
                ),
            )
            desired = lower(self._effective(config, self.subscriptions.nodes()))
            ended = self.applier.edit_users(user_set, desired)
            self.config = config
            log.info("users changed %s", kv(user_set=user_set, users=len(users), sessions_ended=ended))
            return True

        return await self.reconciler.call("users", command)

    def reload_on_signal(self) -> None:
        """SIGHUP: never blocks, never allows a disruptive change; merged with one queued."""
        self.reconciler.signal_reload(lambda: self._reload(False, signal=True))

    async def _reload(self, allow_disruptive: bool, *, signal: bool = False) -> ApplyReport:
        self.notify.reloading()
        outcome = "reload refused; serving the previous configuration"
        try:
            try:
                spec = await self._read_for_reload()
            except ApplyError as exc:
                self._refused("reload", exc, signal)
                raise
            assert self.subscriptions is not None  # set by start()
            carried = self.subscriptions.carried(spec.subscriptions)
            report = await self._reconcile(
                self._effective(spec, carried), allow_disruptive=allow_disruptive, signal=signal
            )
            self.config = spec
            if self.plane is not None:  # rules disabled at run time last until a reload, as API edits do
                self.plane.router.stats.enable_all()
            await self.subscriptions.reload(spec.subscriptions)  # refreshes them in the background
            outcome = f"serving generation {self.generation}"
            return report
        finally:
            self.notify.ready(outcome)  # serving either way: the new configuration or the old one

    async def _read_for_reload(self) -> Spec:
        """The file as a reload sees it; FileRefused or Invalid (a setting fixed at start)."""
        try:  # parsing is pure work on the file: off the event loop, so flows keep moving
            spec = await asyncio.to_thread(load_file, self.config_path)
        except ConfigError as exc:
            log_diagnostics(exc.diagnostics, during="reload")
            first = exc.errors[0] if exc.errors else None
            text = f"{first.loc}: {first.key_path}: {first.message}" if first is not None else str(exc)
            raise FileRefused(text, exc) from exc
        except OSError as exc:
            raise FileRefused(f"{self.config_path}: {exc.strerror or exc}", exc) from exc
        assert self.config is not None  # set by start()
        if spec.global_.store_subscribe != self.config.global_.store_subscribe:
            raise Invalid("global.store_subscribe", "fixed for the process lifetime; restart to change it")
        log_diagnostics(spec.diagnostics, during="reload")
        return spec

    def _refused(self, cause: str, error: ApplyError, signal: bool) -> None:
        """Count and log a refused apply; the running configuration stays."""
        self.stats.reload_result(False, error.variant)
        if signal and isinstance(error, Disruptive):
            log.error(
                "reload refused, keeping the running config: inbound %s: %s, which would end "
                "its live connections; restart to apply it",
                error.inbound,
                error.reason,
            )
        else:
            log.error("%s: %s; keeping the running config", cause, error)

    async def _reconcile(
        self, spec: Spec, *, allow_disruptive: bool = False, signal: bool = False, cause: str = "reload"
    ) -> ApplyReport:
        """Plan, check, prepare, commit (run only as a reconciler command)."""
        try:
            # lowering and planning are pure work on values: off the event loop, so flows keep moving
            desired, steps = await asyncio.to_thread(_lower_and_plan, self.applier.running, spec)
            disruption = next(steps.disruptions(), None)
            if disruption is not None and not allow_disruptive:
                raise Disruptive(*disruption)
            prepared = await self.applier.prepare(steps, desired)
        except ApplyError as exc:
            self._refused(cause, exc, signal)
            raise
        report = await self.applier.commit(prepared)
        if steps.publishes:  # a new plane's objects are long-lived: out of the collector's full passes
            settle_heap()
        self.stats.reload_result(True, None)
        log.info(
            "%s: %s",
            "subscription nodes applied" if cause == "subscription" else "config reloaded",
            report.summary(),
        )
        return report

    # --- selection writes ------------------------------------------------------

    async def select(self, group: str, member: str, network: Network | None = None) -> list[Network]:
        """A Selector write through the reconciler: it waits for an apply in progress and
        lands in the manager published when it runs, so a write is never acknowledged
        against a replaced manager. The networks whose choice changed (each one persisted).

        Raises :class:`~honk.group.policy.UnknownGroup` or :class:`~honk.group.policy.UnknownMember`."""
        return await self._write(group, lambda groups: groups.select(group, member, network))

    async def pin(self, group: str, member: str | None, network: Network | None = None) -> list[Network]:
        """Pin (``member`` None: unpin) a URLTest or Fallback group's member, through the
        reconciler like :meth:`select`; runtime only, a reload drops it. The networks
        whose pin changed. Raises UnknownGroup (also for Selector and LoadBalance) or UnknownMember."""
        return await self._write(group, lambda groups: groups.pin(group, member, network))

    async def select_global(self, member: str) -> None:
        """Choose what ``GLOBAL`` serves in the global mode. Raises UnknownMember."""

        async def write() -> None:
            if member not in self.global_members():
                raise UnknownMember(GLOBAL_GROUP, member)
            self.mode.global_choice = member

        await self.reconciler.call("select-global", write)

    async def close_flows(self, flow_ids: Sequence[str] | None, reason: str) -> list[str]:
        """Close the live flows ``flow_ids`` (None: every one) through the reconciler, so a
        close never interleaves with an apply; the ids that were live and were asked to end."""

        async def command() -> list[str]:
            ids = [c.id for c in self.tracker.snapshot()] if flow_ids is None else list(flow_ids)
            return [flow_id for flow_id in ids if self.tracker.close(flow_id, FlowClosed(reason))]

        return await self.reconciler.call("close", command)

    def global_members(self) -> list[str]:
        """``GLOBAL``'s members: direct, block, every node, then every group, in config order."""
        return [] if self.plane is None else global_members(self.plane)

    async def update_geodata(self, names: Sequence[str] | None = None) -> UpdateReport:
        """``honkctl geodata update``: download, check and swap the configured geodata, then
        reload when a file changed (:mod:`honk.control.geoupdate`). UpdateBusy while one runs."""
        return await self.geodata.update(names)

    def _asset_dial(self, route: str) -> Dial:
        """How an ``assets`` download connects for ``route`` (routing, direct, a node or group)."""
        timeout = self.spec.global_.connect_timeout if self.spec is not None else GlobalSpec().connect_timeout
        return dial_for_route(
            route,
            direct=DirectOutbound(self.clock, timeout).dial_tcp,
            via=self._dial_via,
            route_flow=self.dispatcher.route,
        )

    async def refresh_subscription(self, name: str) -> bool:
        """Fetch subscription ``name`` now; whether a new body was accepted. KeyError if unknown."""
        if self.subscriptions is None:
            raise KeyError(name)
        return await self.subscriptions.refresh_now(name)

    async def _write(self, group: str, write) -> list[Network]:  # noqa: ANN001 - GroupManager -> changed
        async def command() -> tuple[list[Network], list[str]]:
            if self.plane is None:
                raise RuntimeError("honk is not running")
            if group not in self.plane.groups:
                raise UnknownGroup(group)
            self._interrupted = []
            try:
                return write(self.plane.groups), self._interrupted
            finally:
                self._interrupted = None

        changed, interrupted = await self.reconciler.call("select", command)
        if interrupted:  # the write is reported once the flows it interrupted have ended
            try:
                async with timeout_at(self.clock, self.clock.now() + INTERRUPT_CONFIRM_TIMEOUT):
                    await self.tracker.wait_gone(interrupted)
            except TimeoutError:
                log.warning(
                    "interrupted flows did not end in time %s", kv(group=group, flows=len(interrupted))
                )
        return changed

    def _interrupt(self, group: str, network: Network) -> None:
        """``group``'s selection for ``network`` changed and it has interrupt_connections: close
        the flows that went through it on that network (their chain, captured when each was
        routed, names the group); a URLTest change only starts this."""
        ids = [c.id for c in self.tracker.snapshot() if c.network is network and group in c.chain[:-1]]
        for flow_id in ids:
            self.tracker.close(flow_id, FlowClosed(f"group {group}: its {network.value} selection changed"))
        if ids:
            log.info("interrupted flows %s", kv(group=group, network=network.value, flows=len(ids)))
        if self._interrupted is not None:  # a Selector write waits for these
            self._interrupted.extend(ids)

    # --- shutdown ------------------------------------------------------------

    async def shutdown(self, grace: float | None = None) -> None:
        """Stop accepting, wait up to ``grace`` seconds for live flows, then close the rest.
        Runs as the reconciler's last command; later commands fail with Stopped."""
        self._closing = True
        for task in list(self._queued_commands):
            task.cancel()
        await self.reconciler.stop(lambda: self._shutdown(grace))

    async def _shutdown(self, grace: float | None) -> None:
        api = self.api
        if api is not None:
            await api.stop()
        if self.subscriptions is not None:
            await self.subscriptions.stop()
        if grace is None:
            grace = self.spec.global_.shutdown_grace if self.spec else 0.0
        await self.applier.stop_listeners()
        await self.drainer.aclose()  # pending grace timers never delay shutdown
        live = len(self.tracker)
        if live:
            log.info("draining %s", kv(live_flows=live, grace_s=grace))
            idle = asyncio.ensure_future(self.tracker.wait_idle())
            timer = asyncio.ensure_future(self.clock.sleep(grace))
            await asyncio.wait({idle, timer}, return_when=asyncio.FIRST_COMPLETED)
            for fut in (idle, timer):
                fut.cancel()
            left = len(self.tracker)
            if left:
                self.tracker.close_all("shutdown")
                log.info("closed flows left after grace %s", kv(closed=left))
        await self.sessions.aclose("shutdown")  # handshakes still open, and user-removal timers
        await self.warm.stop()
        await self.health.stop()
        self.loop_guard.uninstall()
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        if self.plane is not None:
            for runtime in self.plane.runtimes.values():
                runtime.close()
        close_engines()  # joins the native relay worker and closes its fds
        log.info("honk stopped")
        self.logs.uninstall()
        self._stopped.set()

    # --- the process -----------------------------------------------------------

    async def run_forever(self) -> None:
        """Start, then serve until SIGTERM/SIGINT; SIGHUP reloads.

        Handlers are installed before ``start`` so a signal that arrives as soon as
        the ready line is out is already ours; a SIGHUP during start is queued for
        the reconciler, which runs it once start has finished.
        """
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        loop.add_signal_handler(signal.SIGHUP, self.reload_on_signal)
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        loop.add_signal_handler(signal.SIGINT, stop.set)
        try:
            await self.start()
            self.notify.ready(f"serving generation {self.generation}")
            await stop.wait()
            log.info("stop requested; no new flows are accepted")
            self.notify.stopping()
            await self.shutdown()
        finally:
            for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)


async def check_file(path: str | os.PathLike) -> DesiredState:
    """``honk check``: load, plan from empty and prepare without binding anything.
    Raises ConfigError (located errors) or ApplyError."""
    return await check_spec(load_file(path), path)


async def check_spec(spec: Spec, path: str | os.PathLike) -> DesiredState:
    """The dry run of ``spec`` (read from ``path``, which places its relative paths):
    everything a start would build, nothing bound, served or dialled. Raises ApplyError."""
    desired = lower(spec)
    steps = plan(RunningState(), desired)
    probe = Daemon(path)
    prepared = await probe.applier.prepare(steps, desired, bind=False)
    prepared.release()
    for runtime in prepared.runtimes.values():  # built, never served: release the nodes
        runtime.close()
    return desired


def _lower_and_plan(running: RunningState, spec: Spec) -> tuple[DesiredState, Plan]:
    desired = lower(spec)
    return desired, plan(running, desired)


def settle_heap() -> None:
    """Freeze what the running configuration keeps (plane, groups, health state) out of the
    cyclic garbage collector's full passes, which would otherwise walk every node's state
    each time (tens of ms with thousands of nodes, a stall new flows wait on). The previous
    generation is unfrozen and collected first, so a reload leaks nothing. The young
    generation's threshold is set to GC_YOUNG_THRESHOLD."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    _young, *older = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *older)
    _trim_malloc()


def _trim_malloc() -> None:
    """Hand the C heap's free pages back to the kernel (glibc keeps them after the start's
    and a reload's short-lived allocations: parsing, building, importing)."""
    try:
        libc = ctypes.CDLL(None)
        libc.malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass


def _node_view(spec: Spec) -> tuple:
    """The node set as routing sees it: ids, names and subscription tags, in order."""
    return tuple((n.id, n.name, n.subscription) for n in spec.nodes)
