"""The daemon's health service: wires the health state, the runner, the state database
and the network watcher to the running plane.

* On start it opens the state database under ``data_dir``, registers the plane's
  proxy nodes, restores each node's last real delay (display only, at most 24 h
  old; liveness always starts unknown), and starts the probe loops, the delay
  writer (every 60 s) and the netlink watcher.
* On every published plane (reload, subscription change) it registers new nodes,
  forgets removed ones, starts a new probe generation over the new leaves and
  replaces the group ``check_url`` registry. Unchanged nodes keep their health.
* A node found dead has its runtime purged: pooled carriers stop being reused.
* On stop it cancels and drains every probe, writes the delays once more and
  closes the database.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable, Iterable

from honk.alive.group_checks import GroupCheck, GroupChecks
from honk.alive.health import AliveDialerSet
from honk.alive.netwatch import NetworkWatcher
from honk.alive.outcome import Domain, Family
from honk.alive.prober import NodeProber
from honk.alive.runner import HealthRunner
from honk.alive.thresholds import DELAY_PERSIST_INTERVAL
from honk.alive.traffic import NodeTraffic
from honk.config.expr import MUST_RULES
from honk.config.spec import GroupSpec, Policy
from honk.connection.plane import Plane
from honk.core.clock import Clock
from honk.core.errors import HonkError
from honk.core.net import Network
from honk.core.statedb import StateDB, state_db_path
from honk.core.stats import RuntimeStats
from honk.group.filter import HealthFilter
from honk.group.manager import Identity, identity_from_text, identity_text
from honk.group.score.heuristic import ProbeIdentity
from honk.outbound.base import Outbound

log = logging.getLogger(__name__)


def node_leaves(plane: Plane) -> dict[uuid.UUID, Outbound]:
    """The plane's proxy leaves by NodeId (``direct``, ``block`` and unsupported nodes have none)."""
    leaves = {}
    for node in plane.spec.nodes:
        leaf = plane.outbounds.get(node.name)
        runtime = getattr(leaf, "runtime", None)
        if leaf is not None and runtime is not None and runtime.node_id == node.id:
            leaves[node.id] = leaf
    return leaves


def _reachable_leaves(plane: Plane, name: str, seen: set[str] | None = None) -> set[uuid.UUID]:
    """NodeIds below ``name`` through members and finals (the reachable-final closure)."""
    seen = set() if seen is None else seen
    if name in seen:
        return set()
    seen.add(name)
    groups = plane.groups
    if name not in groups:
        runtime = getattr(plane.outbounds.get(name), "runtime", None)
        return {runtime.node_id} if runtime is not None else set()
    out: set[uuid.UUID] = set()
    spec = _group_spec(plane, name)
    for member in (*groups.members(name), *((spec.final,) if spec is not None and spec.final else ())):
        out |= _reachable_leaves(plane, member, seen)
    return out


def _score_groups_by_node(plane: Plane) -> dict[uuid.UUID, tuple[str, ...]]:
    """Every node a Score group can serve, with those groups."""
    membership = getattr(plane.groups, "score_membership", None)
    out: dict[uuid.UUID, list[str]] = {}
    for group, node_id in membership() if membership is not None else ():
        if isinstance(node_id, uuid.UUID):
            out.setdefault(node_id, []).append(group)
    return {node: tuple(sorted(groups)) for node, groups in out.items()}


def _group_spec(plane: Plane, name: str) -> GroupSpec | None:
    return next((g for g in plane.spec.groups if g.name == name), None)


class HealthService:
    """Owns node health for the daemon's lifetime, across plane generations."""

    def __init__(self, clock: Clock, *, watch_network: bool = True) -> None:
        self.clock = clock
        self.alive = AliveDialerSet(clock, on_dead=self._purge, on_emergency=self._emergency)
        self.group_checks = GroupChecks(clock)
        self.runner: HealthRunner | None = None
        self.db: StateDB | None = None
        self.watcher: NetworkWatcher | None = None
        self._watch_network = watch_network
        self._plane: Plane | None = None
        self._writer: asyncio.Task[None] | None = None
        self._writes: set[asyncio.Task[None]] = set()  # Selector choices being written
        self._opened = False
        self.filter = HealthFilter(self.alive, self.group_checks)  # the groups' view of health
        self.alive.on_probe_rtt = self._probe_rtt
        self._score_groups: dict[uuid.UUID, tuple[str, ...]] = {}  # node → the Score groups it serves in
        self.stats: RuntimeStats | None = None  # probe durations go here once set
        # told after the probes of each network change (the daemon's `auto` interfaces follow it)
        self.network_listeners: list[Callable[[str], None]] = []

    # --- lifecycle ---------------------------------------------------------------

    async def open_state(self, data_dir: str) -> dict[str, dict[Network, Identity]]:
        """Open the state database; the Selector choices it keeps, for the first plane."""
        try:
            self._opened = True
            self.db = await asyncio.to_thread(StateDB, state_db_path(data_dir))
        except Exception as exc:  # noqa: BLE001 - health runs without persistence rather than not at all
            log.warning("state database unavailable; delays and choices are not kept (%s)", exc)
            self.db = None
            return {}
        stored = await asyncio.to_thread(self.db.load_choices)
        saved: dict[str, dict[Network, Identity]] = {}
        for group, by_network in stored.items():
            for network, text in by_network.items():
                identity = identity_from_text(text)
                if identity is not None and network in (n.value for n in Network):
                    saved.setdefault(group, {})[Network(network)] = identity
        return saved

    def save_choice(self, group: str, network: Network, identity: Identity) -> None:
        """A Selector write changed ``network``'s choice: keep it (in a worker thread)."""
        if self.db is None:
            return
        task = asyncio.get_running_loop().create_task(
            asyncio.to_thread(self.db.save_choice, group, network.value, identity_text(identity)),
            name="honk-save-choice",
        )
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def start(self, plane: Plane) -> None:
        glob = plane.spec.global_
        if self.db is None and not self._opened:
            await self.open_state(glob.data_dir)
        await self._register(plane)
        if self.db is not None:
            saved = await asyncio.to_thread(self.db.load_delays, self.clock.wall())
            restored = self.alive.restore_delays(saved)
            log.info("restored %d node delays from the state database", restored)
        self.runner = HealthRunner(
            self.alive,
            self._prober(plane),
            self.clock,
            check_interval=glob.check_interval,
            group_checks=self.group_checks,
        )
        self.runner.stats = self.stats
        self._plan(plane)
        self.runner.start()
        self._writer = asyncio.get_running_loop().create_task(self._write_delays(), name="honk-delay-writer")
        if self._watch_network:
            watcher = NetworkWatcher(self._network_changed, self.clock)
            try:
                await watcher.start()
                self.watcher = watcher
            except HonkError as exc:
                log.warning("network changes are not watched: %s", exc)

    def _network_changed(self, reason: str) -> None:
        if self.runner is not None:
            self.runner.network_changed(reason)
        for listener in self.network_listeners:
            listener(reason)

    async def apply(self, plane: Plane) -> None:
        """A new plane was published: probe its nodes from now on. Probes started before it are
        stale at once, before anything here waits: the reload's commit has just cleared Score's
        probe baselines, and none of those results may refill them (GH-K-12)."""
        if self.runner is None:
            return
        self.alive.next_generation()
        await self._register(plane)
        await self.runner.reload(self._prober(plane), plane.spec.global_.check_interval)
        self._plan(plane)

    async def stop(self) -> None:
        if self.watcher is not None:
            await self.watcher.stop()
            self.watcher = None
        if self._writer is not None:
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer
            self._writer = None
        if self.runner is not None:
            await self.runner.stop()
        if self._writes:
            await asyncio.gather(*self._writes, return_exceptions=True)
        if self.db is not None:
            await self._save()
            self.db.close()
            self.db = None

    def note_selection(self, chain: tuple[str, ...]) -> None:
        """A real flow was routed through ``chain`` (groups, then the leaf): an idle URLTest
        group on it wakes and probes at once."""
        if self.runner is not None:
            for name in chain[:-1]:
                self.runner.note_selection(name)

    # --- internals --------------------------------------------------------------------

    async def _register(self, plane: Plane) -> None:
        leaves = node_leaves(plane)
        for node_id, leaf in leaves.items():
            self.alive.register_node(node_id, leaf.name)
            leaf.runtime.traffic = NodeTraffic(self.alive, node_id)
        gone = self.alive.retain_only(leaves)
        self._plane = plane
        self._score_groups = _score_groups_by_node(plane)
        if gone and self.db is not None:
            await asyncio.to_thread(self.db.forget, gone)

    def _probe_rtt(self, node_id: uuid.UUID, domain: Domain, family: Family, rtt: float) -> None:
        """A ranked probe RTT of a node some Score group holds: the quality baseline of Score's
        first-choice heuristic, scoped by the configured probe (GH-K-32, GH-K-64). It is never
        availability evidence: probes cannot recover a node (GH-K-39)."""
        plane = self._plane
        groups = self._score_groups.get(node_id)
        if plane is None or not groups:
            return
        performance = getattr(getattr(plane.groups, "score", None), "performance", None)
        observe = getattr(performance, "observe_probe", None)
        if observe is None:
            return
        glob = plane.spec.global_
        if domain is Domain.TCP:
            network, probe = (
                Network.TCP,
                ProbeIdentity(",".join(glob.tcp_check_url), glob.tcp_check_http_method, glob.check_interval),
            )
        else:
            network, probe = (
                Network.UDP,
                ProbeIdentity(",".join(glob.udp_check_dns), domain.value, glob.check_interval),
            )
        now = self.clock.now()
        for group in groups:
            observe(group, network, family, node_id, probe, rtt, now)

    def _prober(self, plane: Plane) -> NodeProber:
        score = set()
        for group in plane.spec.groups:
            if group.policy is Policy.SCORE and group.name in plane.groups:
                score |= _reachable_leaves(plane, group.name)
        return NodeProber(node_leaves(plane), plane.spec.global_, self.clock, score_leaves=score)

    def _plan(self, plane: Plane) -> None:
        """Tell the runner which nodes it must keep probing and which groups check their own URL."""
        assert self.runner is not None
        always: set[uuid.UUID] = set()
        urltest: dict[str, tuple[float | None, set[uuid.UUID]]] = {}
        for group in plane.spec.groups:
            if group.name not in plane.groups:
                continue
            leaves = _reachable_leaves(plane, group.name)
            if group.policy is Policy.URLTEST:
                urltest[group.name] = (group.idle_timeout, leaves)
            else:
                always |= leaves
        for rule_target in {r.outbound for r in plane.spec.routing.rules if r.outbound != MUST_RULES} | {
            plane.spec.routing.fallback
        }:
            if rule_target not in plane.groups:
                always |= _reachable_leaves(plane, rule_target)
        self.runner.set_demand(always, urltest)
        self.group_checks.sync_group_check_urls(self._group_checks(plane))

    def _group_checks(self, plane: Plane) -> Iterable[GroupCheck]:
        for group in plane.spec.groups:
            if group.check_url and group.name in plane.groups:
                yield GroupCheck(
                    group.name,
                    group.policy,
                    group.check_url,
                    self._member_leaves(plane, group.name),
                    group.check_interval,
                )

    @staticmethod
    def _member_leaves(plane: Plane, group: str):  # noqa: ANN205 - MemberResolver
        def resolve() -> list[tuple[str, uuid.UUID]]:
            out = []
            for member in plane.groups.members(group):
                try:
                    # a peek: reading the (member, leaf) pairs moves no winner, cursor or Score pick
                    leaf = plane.groups.resolve(member, Network.TCP, peek=True).leaf
                except HonkError:
                    continue
                runtime = getattr(leaf, "runtime", None)
                if runtime is not None:
                    out.append((member, runtime.node_id))
            return out

        return resolve

    def _emergency(self, node_id: uuid.UUID) -> None:
        if self.runner is not None:
            self.runner.emergency([node_id])

    def _purge(self, node_id: uuid.UUID, name: str) -> None:
        plane = self._plane
        runtime = plane.runtimes.get(node_id) if plane is not None else None
        if runtime is not None:
            purged = runtime.purge()
            if purged:
                log.info("node %s is dead: %d pooled carriers retired", name, purged)

    async def _write_delays(self) -> None:
        while True:
            await self.clock.sleep(DELAY_PERSIST_INTERVAL)
            await self._save()

    async def _save(self) -> None:
        if self.db is None:
            return
        delays = self.alive.last_real_delays()
        if delays:
            try:
                await asyncio.to_thread(self.db.save_delays, delays)
            except Exception as exc:  # noqa: BLE001 - a write failure costs the cache, not the daemon
                log.warning("could not write node delays to the state database: %s", exc)
