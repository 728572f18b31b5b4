"""Warm-up: startup preconnect, the Selector pin and the UDP warm set (design area I, GH-I-01..12).

A router's users feel the first flow after a selection change or after idle: a new server
connection, and for a mux node a new carrier with its protocol handshake. Warm-up keeps the
reusable resource of the nodes they are about to use open ahead of them:

* **Startup preconnect** (``preconnect_node_count``): one pass at startup. Candidates are every
  group's current TCP pick first, then the nodes in configuration order, only proxy nodes whose
  dial starts with a bare TCP connection (not a mux node: its carrier is a session). Each gets one
  bare server connection deposited in its ready pool (:mod:`honk.outbound.ready`). ``'auto'``
  takes at most PRECONNECT_AUTO_NODES nodes, 0 disables it, N takes at most N; attempts run at
  most PRECONNECT_AUTO_CONCURRENCY (auto) or PRECONNECT_MAX_CONCURRENCY at once. It sets no
  ownership bit: a seed, not a retention.
* **Selector pin**: every Selector's TCP choice (an unhealthy explicit choice included: health
  never substitutes for a Selector) keeps its leaf warm, deduplicated by node (NodeId): a mux
  node keeps one carrier open (its session), any other proxy node one bare server connection
  ready. The pin holds the runtime's ``SELECTOR_PIN`` bit; a node that stops being a choice is
  let go, and only when no owner is left does its future reuse drain (flows on it continue).
  A change of choice wakes the pass at once; every REPAIR_INTERVAL seconds it also repairs what
  was consumed, lost or expired, and reaps stale ready connections.
* **UDP warm set** (``udp_warm_node_count`` N, opt-in: 0 turns it off): on every pass each
  group's top ``min(N, UDP_WARM_PER_GROUP)`` reusable UDP leaves for each address family (the
  leaves whose health family, the family their server is reached on, is that family: a leaf is
  judged in its own health family only, GH-D-07), in the order the group would serve UDP now,
  are gathered, re-ranked process-wide (every group's best first), deduplicated by node and
  capped at ``UDP_WARM_RETAINED_PER_N × N``.
  A reusable UDP leaf is a mux node carrying UDP: its associations ride the node's shared
  carriers (:mod:`honk.outbound.mux_udp`), so one kept open serves a cold association's first
  datagram. The set holds the runtime's ``UDP_WARM`` bit, independent of the pin's
  (GH-I-08): a node leaving the set is let go, and drains only if no other owner holds it.
  At most UDP_WARM_CONCURRENCY carrier opens run at once.

Warm-up only reads the groups with silent peeks (no last-resort warning, nothing committed).
It reports setup quality only (GH-F-26, GH-I-12): each bare connection or carrier it opens is one
targetless setup-time sample, in the opening's own time, for every Score group that reaches the
node (:meth:`~honk.group.manager.GroupManager.observe_warm_setup`, Score's aggregate layer,
GH-K-03). A failed opening reports nothing, and nothing it does reaches health, reliability, a
real-flow streak, recovery or availability (GH-K-39, GH-K-41). Its own connections go through
the dial budget like any physical dial.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from honk.alive.outcome import Family
from honk.config.spec import PRECONNECT_AUTO
from honk.core.clock import Clock
from honk.core.errors import HonkError, NoRoute
from honk.core.logs import kv
from honk.core.net import Network
from honk.group.policy import Selector
from honk.outbound.mux import pool_for
from honk.outbound.runtime import NodeRuntime, WarmOwner

__all__ = [
    "PRECONNECT_AUTO_CONCURRENCY",
    "PRECONNECT_AUTO_NODES",
    "PRECONNECT_MAX_CONCURRENCY",
    "REPAIR_INTERVAL",
    "UDP_WARM_CONCURRENCY",
    "UDP_WARM_PER_GROUP",
    "UDP_WARM_RETAINED_PER_N",
    "WarmUp",
    "bare_poolable",
    "pin_targets",
    "pool_stats",
    "preconnect_candidates",
    "udp_reusable",
    "udp_warm_targets",
    "warm_stats",
]

log = logging.getLogger("honk.connection.warm")

REPAIR_INTERVAL = 10.0  # "A 10-second pass repairs state that was lost, consumed or expired"
PRECONNECT_AUTO_NODES = 8  # "'auto' selects at most 8 nodes"
PRECONNECT_AUTO_CONCURRENCY = 4  # 'auto' runs at most four attempts at once (upstream honk's choice)
PRECONNECT_MAX_CONCURRENCY = 8  # "explicit N ... but at most 8 concurrent attempts"
PIN_CONCURRENCY = 8  # pins repaired at once (honk's choice: one pass never floods the dial budget)
UDP_WARM_PER_GROUP = 3  # "each group's top min(N, 3) reusable UDP leaves for each address family"
UDP_WARM_CONCURRENCY = 4  # "At most 4 warm attempts run concurrently"
UDP_WARM_RETAINED_PER_N = 4  # "the retained process-wide set is re-ranked and capped at 4 × N"


def _proxy(leaf: Any) -> bool:
    return getattr(leaf, "runtime", None) is not None and getattr(leaf, "server", None) is not None


def bare_poolable(leaf: Any) -> bool:
    """A proxy leaf whose dial starts with a bare TCP connection to its server (not a mux
    node, whose reusable resource is its carrier; never ``direct`` or ``block``)."""
    return _proxy(leaf) and not getattr(leaf, "mux", False)


def udp_reusable(leaf: Any) -> bool:
    """A leaf whose UDP path rides reusable shared state: a mux node that carries UDP (its
    associations are sessions on the node's carriers)."""
    return _proxy(leaf) and getattr(leaf, "mux", False) and bool(leaf.capabilities.udp)


def _pick(groups: Any, name: str) -> Any:
    """The leaf ``name`` serves TCP with now, by a silent peek; None when it serves nothing."""
    try:
        return groups.resolve(name, Network.TCP, peek=True).leaf
    except NoRoute:
        return None


def preconnect_candidates(plane: Any, count: int) -> list[Any]:
    """The leaves startup preconnect warms (GH-I-02): every group's current TCP pick first, in
    group order, then the nodes in configuration order; bare-poolable ones only, each node
    once; at most PRECONNECT_AUTO_NODES for ``PRECONNECT_AUTO``, at most ``count`` otherwise."""
    limit = PRECONNECT_AUTO_NODES if count == PRECONNECT_AUTO else count
    if limit <= 0:
        return []
    groups, outbounds = plane.groups, plane.outbounds
    ordered = [_pick(groups, name) for name in groups.names]
    ordered += [outbounds.get(node.name) for node in plane.spec.nodes]
    out: list[Any] = []
    seen: set[Any] = set()
    for leaf in ordered:
        if leaf is None or not bare_poolable(leaf) or leaf.runtime.node_id in seen:
            continue
        seen.add(leaf.runtime.node_id)
        out.append(leaf)
        if len(out) >= limit:
            break
    return out


def pin_targets(plane: Any) -> dict[Any, Any]:
    """Each Selector's TCP choice as a leaf, by node (GH-I-03): a leaf member itself, however
    unhealthy; a sub-group member's current pick. Proxy leaves only, each node once (the
    first Selector's leaf generation)."""
    groups, outbounds = plane.groups, plane.outbounds
    out: dict[Any, Any] = {}
    for name in groups.names:
        policy = groups.policy(name)
        if not isinstance(policy, Selector):
            continue
        member = policy.chosen(Network.TCP)
        if member is None:
            continue
        leaf = outbounds.get(member) if groups.member_is_leaf(name, member) else _pick(groups, member)
        if leaf is not None and _proxy(leaf):
            out.setdefault(leaf.runtime.node_id, leaf)
    return out


def udp_warm_targets(plane: Any, count: int) -> dict[Any, Any]:
    """The UDP warm set for N = ``count`` (GH-I-06, 07), as leaves by node: each group's top
    ``min(N, UDP_WARM_PER_GROUP)`` reusable UDP leaves per address family (the leaves whose
    health family it is), re-ranked process-wide by their place in their group (then group
    order, then IPv4 before IPv6), deduplicated by node, at most ``UDP_WARM_RETAINED_PER_N × N``.
    Empty when N is 0."""
    if count <= 0:
        return {}
    groups = plane.groups
    per_group = min(count, UDP_WARM_PER_GROUP)
    ranked: list[tuple[int, int, int, Any]] = []
    for index, name in enumerate(groups.names):
        for family in (Family.V4, Family.V6):
            leaves = groups.udp_warm_leaves(name, family, per_group, udp_reusable)
            ranked += [(place, index, family.value, leaf) for place, leaf in enumerate(leaves)]
    ranked.sort(key=lambda entry: entry[:3])
    out: dict[Any, Any] = {}
    cap = UDP_WARM_RETAINED_PER_N * count
    for *_, leaf in ranked:
        if len(out) >= cap:
            break
        out.setdefault(leaf.runtime.node_id, leaf)
    return out


class WarmUp:
    """The daemon's warm-up: the startup preconnect pass, then the Selector pins and the UDP
    warm set, passed over together on every wake and every REPAIR_INTERVAL. One instance; it
    reads the published plane at each pass, and :meth:`wake` is a choice change or a new plane."""

    def __init__(self, clock: Clock, plane: Callable[[], Any]) -> None:
        self.clock = clock
        self._plane = plane  # the published plane, read at each pass
        self._pinned: dict[Any, NodeRuntime] = {}  # node -> runtime holding SELECTOR_PIN
        self._udp_held: dict[Any, NodeRuntime] = {}  # node -> runtime holding UDP_WARM
        self._task: asyncio.Task | None = None
        self._wake: asyncio.Future | None = None
        self._woken = False  # a wake that came while a pass ran: the next one starts at once
        self._resting = asyncio.Event()  # set while no pass runs (between passes, or not started)
        self._resting.set()
        self.preconnected = 0  # bare connections startup preconnect deposited
        self.passes = 0

    # --- control ------------------------------------------------------------------------------

    def start(self) -> None:
        """Run the preconnect pass once, then the pins, on this loop."""
        if self._task is None:
            self._resting.clear()
            self._task = asyncio.get_running_loop().create_task(self._run(), name="honk-warm-up")

    def wake(self) -> None:
        """An effective choice changed (or a new plane): pass again now."""
        self._woken = True
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    async def stop(self) -> None:
        """Stop passing and let every pin go (the runtimes close with their plane)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._resting.set()
        _hold_only(self._pinned, {}, WarmOwner.SELECTOR_PIN)
        _hold_only(self._udp_held, {}, WarmOwner.UDP_WARM)

    async def rested(self) -> None:
        """Return once no pass runs (the startup passes done, say): for a caller that wants
        what warm-up opened settled before it measures."""
        await self._resting.wait()

    @property
    def pinned(self) -> frozenset[Any]:
        """The nodes the Selector pins hold now."""
        return frozenset(self._pinned)

    @property
    def udp_held(self) -> frozenset[Any]:
        """The nodes the UDP warm set holds now."""
        return frozenset(self._udp_held)

    # --- passes -------------------------------------------------------------------------------

    async def _run(self) -> None:
        plane = self._plane()
        if plane is not None:
            try:
                await self.preconnect(plane)
            except Exception:  # noqa: BLE001 - a seed that failed must not stop the pins
                log.exception("warm-up preconnect failed")
        while True:
            try:
                await asyncio.gather(self.pin_pass(), self.udp_pass())
            except Exception:  # noqa: BLE001 - a pass's surprise must not end warm-up
                log.exception("warm-up pass failed")
            await self._sleep_or_wake()

    async def _sleep_or_wake(self) -> None:
        if self._woken:
            self._woken = False
            return
        wake = self._wake = asyncio.get_running_loop().create_future()
        timer = self.clock.call_later(REPAIR_INTERVAL, lambda: wake.done() or wake.set_result(None))
        self._resting.set()
        try:
            await wake
        finally:
            self._resting.clear()
            timer.cancel()
            self._wake = None
            self._woken = False

    async def preconnect(self, plane: Any) -> int:
        """The startup pass: one bare connection per candidate into its ready pool; how many."""
        count = plane.spec.global_.preconnect_node_count
        leaves = preconnect_candidates(plane, count)
        if not leaves:
            return 0
        limit = asyncio.Semaphore(
            PRECONNECT_AUTO_CONCURRENCY
            if count == PRECONNECT_AUTO
            else min(count, PRECONNECT_MAX_CONCURRENCY)
        )
        results = await asyncio.gather(*(self._deposit(plane, leaf, limit) for leaf in leaves))
        deposited = sum(results)
        self.preconnected += deposited
        log.info("warm-up preconnect %s", kv(nodes=len(leaves), deposited=deposited))
        return deposited

    async def pin_pass(self) -> None:
        """Hold every Selector choice's node, let go of the others, and keep each held node's
        resource ready; reap stale ready connections of every node."""
        plane = self._plane()
        if plane is None:
            return
        self.passes += 1
        targets = pin_targets(plane)
        _hold_only(self._pinned, targets, WarmOwner.SELECTOR_PIN)
        now = self.clock.now()
        for runtime in plane.runtimes.values():
            runtime.ready.reap(now)
        limit = asyncio.Semaphore(PIN_CONCURRENCY)
        await asyncio.gather(*(self._keep_warm(plane, leaf, limit) for leaf in targets.values()))

    async def udp_pass(self) -> None:
        """Re-rank the UDP warm set: hold its nodes' UDP bit, let go of the nodes that left it,
        and keep each held node's carrier open (GH-I-06, 07)."""
        plane = self._plane()
        if plane is None:
            return
        targets = udp_warm_targets(plane, plane.spec.global_.udp_warm_node_count)
        _hold_only(self._udp_held, targets, WarmOwner.UDP_WARM)
        limit = asyncio.Semaphore(UDP_WARM_CONCURRENCY)
        await asyncio.gather(
            *(self._ensure_carrier(plane, leaf, limit, Network.UDP) for leaf in targets.values())
        )

    async def _keep_warm(self, plane: Any, leaf: Any, limit: asyncio.Semaphore) -> None:
        """A pinned leaf's resource: its mux carrier, else one ready server connection."""
        if getattr(leaf, "mux", False):
            await self._ensure_carrier(plane, leaf, limit)
        elif not leaf.runtime.ready.has_ready(self.clock.now()):
            await self._deposit(plane, leaf, limit)

    async def _ensure_carrier(
        self, plane: Any, leaf: Any, limit: asyncio.Semaphore, network: Network = Network.TCP
    ) -> None:
        """A held mux leaf's carrier, opened when it has none with room (at most ``limit`` at
        once); its opening time is a setup sample for ``network``'s Score groups (a Selector pin
        keeps the TCP path's session, the UDP warm set the UDP path's); a failure is only logged
        (warm-up reports no failure to health or Score)."""
        if pool_for(leaf).has_room:
            return
        async with limit:
            deadline = self.clock.now() + plane.spec.global_.connect_timeout
            opened: list[float] = []

            async def open_carrier(deadline: float) -> Any:  # timed: the opening alone, no lock wait
                started = self.clock.now()
                carrier = await leaf.open_mux_carrier(deadline)
                opened.append(self.clock.now() - started)
                return carrier

            try:
                if await pool_for(leaf).ensure_carrier(open_carrier, deadline):
                    log.debug("warm-up carrier opened %s", kv(node=leaf.name))
                    if opened:
                        self._setup_sample(plane, leaf, network, opened[0])
            except (HonkError, TimeoutError, OSError) as exc:
                log.debug("warm-up carrier failed %s", kv(node=leaf.name, error=type(exc).__name__))

    async def _deposit(self, plane: Any, leaf: Any, limit: asyncio.Semaphore) -> int:
        """One bare server connection of ``leaf`` into its ready pool, under the dial budget;
        1 if deposited. Its connect time (the permit's wait excluded) is a TCP setup sample for
        the node's Score groups; a failure is only logged: warm-up reports no failure to health
        or Score."""
        async with limit:
            deadline = self.clock.now() + plane.spec.global_.connect_timeout
            budget = getattr(plane, "admission", None)
            try:
                if budget is not None:
                    async with budget.permit(deadline):
                        started = self.clock.now()
                        sock = await leaf.connector.connect(leaf.server, deadline)
                else:
                    started = self.clock.now()
                    sock = await leaf.connector.connect(leaf.server, deadline)
            except (HonkError, OSError) as exc:
                log.debug("warm-up connection failed %s", kv(node=leaf.name, error=type(exc).__name__))
                return 0
            elapsed = self.clock.now() - started
            if leaf.runtime.closed:  # its plane was retired meanwhile: nobody would close it
                sock.close()
                return 0
            self._setup_sample(plane, leaf, Network.TCP, elapsed)
            return int(leaf.runtime.ready.deposit(sock, self.clock.now()))

    def _setup_sample(self, plane: Any, leaf: Any, network: Network, seconds: float) -> None:
        """Warm-up's one Score report: setup quality (GH-F-26), a targetless sample of the time
        it took to open ``leaf``'s connection, for every Score group of ``plane`` that reaches the
        node (GH-K-03). Never reliability, streaks, recovery or availability (GH-K-39, GH-K-41)."""
        observe = getattr(plane.groups, "observe_warm_setup", None)
        if observe is not None:
            observe(leaf, network, seconds, self.clock.now())


def _hold_only(held: dict[Any, NodeRuntime], targets: dict[Any, Any], owner: WarmOwner) -> None:
    """Make ``held`` (node -> runtime holding ``owner``) the runtimes of ``targets`` (node -> leaf):
    the nodes that left are let go, a node whose runtime changed lets its old one go."""
    for node in [n for n in held if n not in targets]:
        held.pop(node).let_go(owner)
    for node, leaf in targets.items():
        runtime = held.get(node)
        if runtime is not None and runtime is not leaf.runtime:  # (a new runtime: the node changed)
            runtime.let_go(owner)
        leaf.runtime.hold(owner)
        held[node] = leaf.runtime


def pool_stats(plane: Any) -> dict[str, int]:
    """``/stats`` ``pool``: the ready pools of the plane's nodes, summed."""
    runtimes = plane.runtimes.values()
    return {
        "readyHits": sum(r.ready.hits for r in runtimes),
        "readyMisses": sum(r.ready.misses for r in runtimes),
        "entries": sum(r.ready.entries for r in runtimes),
    }


def warm_stats(plane: Any, warm: WarmUp) -> dict[str, Any]:
    """``/stats`` ``warm``: the plane's nodes held by each owner, the sessions (mux carriers)
    held nodes keep open by protocol, and the connections startup preconnect deposited."""
    runtimes = plane.runtimes.values()
    nodes = {
        "selector": sum(1 for r in runtimes if r.warm & WarmOwner.SELECTOR_PIN),
        "udp": sum(1 for r in runtimes if r.warm & WarmOwner.UDP_WARM),
    }
    sessions: dict[str, int] = {}
    seen: set[Any] = set()
    for leaf in plane.outbounds.values():
        runtime = getattr(leaf, "runtime", None)
        if runtime is None or not getattr(leaf, "mux", False) or not runtime.warm or runtime.node_id in seen:
            continue
        seen.add(runtime.node_id)
        sessions[leaf.protocol] = sessions.get(leaf.protocol, 0) + pool_for(leaf).carrier_count
    return {"nodes": nodes, "sessions": sessions, "preconnected": warm.preconnected}
