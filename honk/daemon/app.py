"""The daemon: one owner for the running configuration and its listeners.

Theory of operation
-------------------
``Daemon.start`` loads the file, builds a :class:`~honk.connection.plane.Plane`
(routes, groups, outbounds), hands it to the :class:`Dispatcher`, binds every
inbound and starts the idle sweeper. After that, every change to what runs goes
through one ``asyncio.Lock``:

* ``reload()`` (SIGHUP) loads the file again. A file that does not load changes
  nothing: the old plane and listeners keep serving and the located errors are
  logged. A file that loads becomes a new plane; the dispatcher swaps it in one
  reference assignment, so a new flow sees either the old or the new plane, and
  established flows keep their sockets. Listeners whose spec is unchanged keep
  their socket; changed or new ones are bound before the old ones stop, and a
  bind failure undoes the whole reload.
* ``shutdown()`` (SIGTERM/SIGINT) stops accepting, lets live flows finish
  within the grace period, then closes what is left.

Subscriptions: a :class:`SubscriptionManager` owns the nodes each subscription
provides. The running spec is the file's spec with those nodes appended
(:func:`merge_nodes`; configured nodes win name clashes). Start waits a bounded
time for first fetches; afterwards every published change of the node set is
applied through the same path as a reload (a new plane generation), and a
reload keeps the nodes of subscriptions whose URL and User-Agent stay.

This is the foundation's "full rebuild" reload; the plan → prepare → commit
reconciler replaces the middle of ``reload()`` later.
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
from pathlib import Path

from honk.alive.service import HealthService
from honk.api.server import ApiServer
from honk.config.diagnostics import ConfigError, Severity
from honk.config.load import load_file
from honk.config.spec import InboundSpec, Spec
from honk.connection.dispatch import Dispatcher
from honk.connection.plane import Plane, SystemResolver, build_plane
from honk.connection.tracker import ConnectionTracker
from honk.control.mode import GLOBAL_DEFAULT, GLOBAL_GROUP, RoutingMode, global_members
from honk.core.clock import Clock, MonotonicClock, timeout_at
from honk.core.errors import FlowClosed, NoRoute
from honk.core.net import Address, Network
from honk.core.stats import RuntimeStats
from honk.daemon.logs import LogBroker, kv, set_level
from honk.group.manager import SharedGroupManager
from honk.group.policy import UnknownGroup, UnknownMember
from honk.inbound.mixed import MixedInbound
from honk.outbound.base import DialedStream
from honk.outbound.direct import DirectOutbound
from honk.relay.native import close_engines
from honk.subscription.fetch import Dial
from honk.subscription.manager import FIRST_FETCH_WAIT, NodesBySubscription, SubscriptionManager, merge_nodes

log = logging.getLogger("honk.daemon")

SWEEP_INTERVAL = 1.0  # seconds between idle sweeps of the connection table
INTERRUPT_CONFIRM_TIMEOUT = 5.0  # seconds a selection write waits for the flows it interrupted to end


def log_diagnostics(diagnostics, *, during: str) -> None:
    """Log each config finding at its own severity; never with config values."""
    for d in diagnostics:
        level = {Severity.ERROR: logging.ERROR, Severity.WARNING: logging.WARNING}.get(
            d.severity, logging.INFO
        )
        log.log(level, "config %s %s", d.severity.value, kv(during=during, at=str(d.loc), key=d.key_path,
                                                            code=d.code, problem=d.message))


class Daemon:
    def __init__(self, config_path: str | os.PathLike, clock: Clock | None = None,
                 log_level: str | None = None) -> None:
        self.config_path = Path(config_path)
        self._forced_log_level = log_level  # `honk run --debug` outranks the file's log_level
        self.clock: Clock = clock or MonotonicClock()
        self.spec: Spec | None = None  # what runs: the file's spec plus subscription nodes
        self.config: Spec | None = None  # the file's spec as loaded
        self.subscriptions: SubscriptionManager | None = None
        self._applying: set[asyncio.Task[None]] = set()  # subscription changes waiting for the lock
        self._closing = False
        self._fetch_plane: Plane | None = None  # only while start() waits for detoured first fetches
        self.plane: Plane | None = None
        self.tracker = ConnectionTracker(self.clock)
        self.dispatcher: Dispatcher | None = None
        self.inbounds: dict[str, MixedInbound] = {}
        self._lock = asyncio.Lock()
        self._sweeper: asyncio.Task[None] | None = None
        self._stopped = asyncio.Event()
        self._generation = 0
        self.stats = RuntimeStats()  # event counters the API exports
        self.health = HealthService(self.clock)
        self.health.stats = self.stats
        self.groups: SharedGroupManager | None = None  # the stable handle on the current group manager
        # flow ids closed by the Selector write in progress (None: none is; automatic changes do not wait)
        self._interrupted: list[str] | None = None
        self.logs = LogBroker()  # live log readers (the API's /logs)
        self.mode = RoutingMode()  # the Clash mode and the GLOBAL choice
        self.api: ApiServer | None = None
        self.started_wall = 0.0  # wall-clock seconds at ready
        self.started_at = 0.0  # clock.now() at ready (uptime)

    @property
    def generation(self) -> int:
        """The published plane's generation."""
        return self._generation

    # --- start ---------------------------------------------------------------

    async def start(self) -> None:
        """Load, build and bind; raises ConfigError or OSError and leaves nothing running."""
        spec = load_file(self.config_path)
        log_diagnostics(spec.diagnostics, during="start")
        self._set_log_level(spec)
        if spec.clash_api is not None:
            self.mode.set(spec.clash_api.default_mode)
        Path(spec.global_.data_dir).mkdir(parents=True, exist_ok=True)
        config, subscriptions = spec, self._subscription_manager(spec)
        if any(s.detour for s in config.subscriptions):
            # first downloads through a node of the file, before the real plane exists
            self._fetch_plane = build_plane(config, self.clock, 0)
        started: dict[str, MixedInbound] = {}
        try:
            await subscriptions.start()
            await subscriptions.wait_settled(FIRST_FETCH_WAIT)
            spec = self._effective(config, subscriptions.nodes())
            self._generation = 1
            saved = await self.health.open_state(spec.global_.data_dir)
            plane = build_plane(spec, self.clock, self._generation, previous=self._fetch_plane,
                                health=self.health.filter, saved_choices=saved)
            self._install_callbacks(plane)  # before the plane is published
            plane.retire(self._fetch_plane)
            self._fetch_plane = None
            resolver = SystemResolver(self.clock, spec.global_.connect_timeout)
            self.dispatcher = Dispatcher(plane, self.tracker, self.clock, spec.global_, resolver)
            self.dispatcher.on_selection = self.health.note_selection
            self.dispatcher.mode = self.mode
            self.dispatcher.stats = self.stats
            for ispec in spec.inbounds:
                started[ispec.name] = await self._bind(ispec)
            if spec.clash_api is not None:
                api = ApiServer(self, spec.clash_api, self.config_path.parent)
                await api.start()
                self.api = api
        except BaseException:
            if self.api is not None:
                await self.api.stop()
                self.api = None
            for inbound in started.values():
                await inbound.stop_accepting()
            await subscriptions.stop()
            raise
        self.spec, self.config, self.plane, self.inbounds = spec, config, plane, started
        self.groups = SharedGroupManager(plane.groups)
        self.subscriptions = subscriptions
        await self.health.start(plane)
        self.logs.install()
        self.started_wall, self.started_at = self.clock.wall(), self.clock.now()
        if _node_view(self._effective(config, subscriptions.nodes())) != _node_view(spec):
            self._on_subscription_nodes(subscriptions.nodes())  # published while the plane was being built
        self._sweeper = asyncio.get_running_loop().create_task(
            self.tracker.run_sweeper(SWEEP_INTERVAL), name="honk-idle-sweeper"
        )
        settle_heap()
        api_address = {"api": f"{self.api.bound[0]}:{self.api.bound[1]}"} if self.api and self.api.bound else {}
        log.info("honk ready %s", kv(config=str(self.config_path), generation=self._generation,
                                     **{f"inbound.{n}": str(i.bound) for n, i in started.items()}, **api_address))

    def _install_callbacks(self, plane: Plane) -> None:
        """What a group manager reports to the daemon; installed before the plane is published."""
        plane.groups.on_choice = self.health.save_choice
        plane.groups.on_interrupt = self._interrupt
        plane.groups.on_change = self._selection_moved

    def _selection_moved(self, group: str, network: Network) -> None:
        self.stats.selection_changed(group, network.value)

    def _subscription_manager(self, config: Spec) -> SubscriptionManager:
        glob = config.global_
        manager = SubscriptionManager(
            config.subscriptions,
            glob.data_dir if glob.store_subscribe else None,
            self.clock,
            DirectOutbound(self.clock, glob.connect_timeout).dial_tcp,
            self._on_subscription_nodes,
            dial_via=self._dial_via,
        )
        manager.stats = self.stats  # before the first fetch
        return manager

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
        return dataclasses.replace(config, nodes=merge_nodes(config.nodes, nodes))

    def _on_subscription_nodes(self, nodes: NodesBySubscription) -> None:
        """The manager's publish callback: apply the new node set once the lock is free."""
        if self._closing:
            return
        task = asyncio.get_running_loop().create_task(self._apply_subscriptions(), name="honk-subscription-apply")
        self._applying.add(task)
        task.add_done_callback(self._applying.discard)

    async def _apply_subscriptions(self) -> None:
        async with self._lock:
            if self._closing or self.spec is None or self.config is None or self.subscriptions is None:
                return  # start() builds with the latest nodes itself
            spec = self._effective(self.config, self.subscriptions.nodes())
            if _node_view(spec) != _node_view(self.spec):
                await self._apply(spec, cause="subscription")

    def _set_log_level(self, spec: Spec) -> None:
        set_level(self._forced_log_level or spec.global_.log_level)

    async def _bind(self, ispec: InboundSpec) -> MixedInbound:
        if self.dispatcher is None:
            raise RuntimeError("dispatcher missing")
        inbound = MixedInbound(ispec, self.dispatcher, self.clock)
        await inbound.start()
        return inbound

    # --- reload --------------------------------------------------------------

    async def reload(self) -> bool:
        """Apply the file as it is now; return whether it was applied."""
        applied = await self._reload()
        self.stats.reload(applied)
        return applied

    async def _reload(self) -> bool:
        async with self._lock:
            try:
                spec = load_file(self.config_path)
            except ConfigError as exc:
                log_diagnostics(exc.diagnostics, during="reload")
                log.error("reload rejected; the running configuration is unchanged %s",
                          kv(errors=len(exc.errors), generation=self._generation))
                return False
            except OSError as exc:
                log.error("reload rejected; the running configuration is unchanged %s",
                          kv(error=type(exc).__name__, reason=exc.strerror or str(exc)))
                return False
            assert self.config is not None and self.subscriptions is not None  # set by start()
            if spec.global_.store_subscribe != self.config.global_.store_subscribe:
                log.error("reload rejected; the running configuration is unchanged %s",
                          kv(error="restart-required", key="global.store_subscribe"))
                return False
            log_diagnostics(spec.diagnostics, during="reload")
            carried = self.subscriptions.carried(spec.subscriptions)
            if not await self._apply(self._effective(spec, carried)):
                return False
            await self._apply_api(spec)
            self.config = spec
            await self.subscriptions.reload(spec.subscriptions)  # refreshes them in the background
            return True

    async def _apply(self, spec: Spec, cause: str = "reload") -> bool:
        """Build and swap in a plane for ``spec``; ``cause`` ("reload", "subscription") names the log lines."""
        assert self.spec is not None and self.dispatcher is not None  # set by start()
        generation = self._generation + 1
        try:
            plane = build_plane(spec, self.clock, generation, previous=self.plane, health=self.health.filter)
            self._install_callbacks(plane)  # before the plane is published
        except Exception as exc:  # noqa: BLE001 - a plane that cannot be built must not replace the old one
            log.error("%s rejected; the running configuration is unchanged %s",
                      cause, kv(error=type(exc).__name__, reason=str(exc)))
            return False

        old = {i.name: i for i in self.spec.inbounds}
        new = {i.name: i for i in spec.inbounds}
        keep = {n for n in new if n in old and old[n] == new[n]}
        bound: dict[str, MixedInbound] = {}
        try:
            for name in new.keys() - keep:
                if name in old and (old[name].host, old[name].port) == (new[name].host, new[name].port):
                    continue  # same address, changed settings: rebind after the old one stops
                bound[name] = await self._bind(new[name])
        except OSError as exc:
            for inbound in bound.values():
                await inbound.stop_accepting()
            log.error("%s rejected; the running configuration is unchanged %s",
                      cause, kv(error="bind-failed", reason=exc.strerror or str(exc)))
            return False

        # Commit: nothing below may fail the reload.
        resolver = SystemResolver(self.clock, spec.global_.connect_timeout)
        self.dispatcher.swap_plane(plane, spec.global_, resolver)
        plane.retire(self.plane)  # shared resources of removed or changed nodes
        self._set_log_level(spec)
        for name in old.keys() - keep:
            await self.inbounds.pop(name).stop_accepting()
        for name in new.keys() - keep - bound.keys():
            try:
                bound[name] = await self._bind(new[name])
            except OSError as exc:
                log.error("inbound could not be rebound %s", kv(inbound=name, reason=exc.strerror or str(exc)))
        self.inbounds.update(bound)
        self.spec, self.plane, self._generation = spec, plane, generation
        if self.groups is not None:
            self.groups.publish(plane.groups)
        self.stats.retain_groups(set(plane.groups.names))
        self.stats.retain_outbounds(set(plane.outbounds))
        self.tracker.forget_leaves(set(plane.outbounds))
        if self.mode.global_choice not in self.global_members():
            self.mode.global_choice = GLOBAL_DEFAULT
        await self.health.apply(plane)
        settle_heap()
        log.info("%s applied %s", cause, kv(generation=generation, nodes=len(spec.nodes), inbounds_kept=len(keep),
                                            inbounds_started=len(bound), live_flows=len(self.tracker)))
        return True

    async def _apply_api(self, spec: Spec) -> None:
        """Follow a changed ``experimental.clash_api`` block: a new listener is bound before the
        old one stops (same address: after), and a listener that cannot bind is logged while
        the rest of the reload stands."""
        assert self.config is not None
        if spec.clash_api == self.config.clash_api:
            return
        old, new = self.api, spec.clash_api
        same_address = (old is not None and new is not None
                        and old.spec.external_controller == new.external_controller)
        if old is not None and (new is None or same_address):
            await old.stop()
            self.api = old = None
        if new is None:
            return
        api = ApiServer(self, new, self.config_path.parent)
        try:
            await api.start()
        except OSError as exc:
            log.error("API listener not started %s", kv(address=new.external_controller,
                                                       reason=exc.strerror or str(exc)))
            return
        if old is not None:
            await old.stop()
        self.api = api

    # --- selection writes ------------------------------------------------------

    async def select(self, group: str, member: str, network: Network | None = None) -> list[Network]:
        """A Selector write through the control owner: it waits for a reload in progress and
        applies to the manager published when it returns, so a write is never acknowledged
        against a replaced manager. The networks whose choice changed (each one persisted).

        Raises :class:`~honk.group.policy.UnknownGroup` or :class:`~honk.group.policy.UnknownMember`."""
        return await self._write(group, lambda groups: groups.select(group, member, network))

    async def pin(self, group: str, member: str | None, network: Network | None = None) -> list[Network]:
        """Pin (``member`` None: unpin) a URLTest or Fallback group's member, through the
        control owner like :meth:`select`; runtime only, a reload drops it. The networks
        whose pin changed. Raises UnknownGroup (also for Selector and LoadBalance) or UnknownMember."""
        return await self._write(group, lambda groups: groups.pin(group, member, network))

    async def select_global(self, member: str) -> None:
        """Choose what ``GLOBAL`` serves in the global mode. Raises UnknownMember."""
        async with self._lock:
            if member not in self.global_members():
                raise UnknownMember(GLOBAL_GROUP, member)
            self.mode.global_choice = member

    def global_members(self) -> list[str]:
        """``GLOBAL``'s members: direct, block, every node, then every group, in config order."""
        return [] if self.plane is None else global_members(self.plane)

    async def refresh_subscription(self, name: str) -> bool:
        """Fetch subscription ``name`` now; whether a new body was accepted. KeyError if unknown."""
        if self.subscriptions is None:
            raise KeyError(name)
        return await self.subscriptions.refresh_now(name)

    async def _write(self, group: str, write) -> list[Network]:  # noqa: ANN001 - GroupManager -> changed
        async with self._lock:
            if self.plane is None:
                raise RuntimeError("honk is not running")
            if group not in self.plane.groups:
                raise UnknownGroup(group)
            self._interrupted = []
            try:
                changed = write(self.plane.groups)
            finally:
                interrupted, self._interrupted = self._interrupted, None
        if interrupted:  # the write is reported once the flows it interrupted have ended
            try:
                async with timeout_at(self.clock, self.clock.now() + INTERRUPT_CONFIRM_TIMEOUT):
                    await self.tracker.wait_gone(interrupted)
            except TimeoutError:
                log.warning("interrupted flows did not end in time %s", kv(group=group, flows=len(interrupted)))
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
        """Stop accepting, wait up to ``grace`` seconds for live flows, then close the rest."""
        self._closing = True
        for task in self._applying:
            task.cancel()
        async with self._lock:
            if self.api is not None:
                await self.api.stop()
                self.api = None
            if self.subscriptions is not None:
                await self.subscriptions.stop()
            if grace is None:
                grace = self.spec.global_.shutdown_grace if self.spec else 0.0
            for inbound in self.inbounds.values():
                await inbound.stop_accepting()
            self.inbounds.clear()
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
            await self.health.stop()
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
        the ready line is out is already ours; a SIGHUP during start waits on the
        lock and then reloads.
        """
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        reloads: set[asyncio.Task[bool]] = set()

        def on_hup() -> None:
            if self.spec is None:
                return  # nothing to reload yet; start() reads the file as it is
            task = loop.create_task(self.reload(), name="honk-reload")
            reloads.add(task)
            task.add_done_callback(reloads.discard)

        loop.add_signal_handler(signal.SIGHUP, on_hup)
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        loop.add_signal_handler(signal.SIGINT, stop.set)
        try:
            await self.start()
            await stop.wait()
            log.info("stop requested; no new flows are accepted")
            await self.shutdown()
        finally:
            for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)


def settle_heap() -> None:
    """Freeze what the running configuration keeps (plane, groups, health state) out of the
    cyclic garbage collector's full passes, which would otherwise walk every node's state
    each time (tens of ms with thousands of nodes, a stall new flows wait on). The previous
    generation is unfrozen and collected first, so a reload leaks nothing."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
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
