"""A node's runtime: the reusable resources one node owns, and who keeps it warm.

The registry creates one :class:`NodeRuntime` per :class:`~uuid.UUID` node
identity and hands the same object to every rebuilt outbound of that node, so a
reload or a subscription refresh that leaves a node's configuration unchanged
(same NodeId) keeps its runtime: its bridges, UDP endpoints and counters. A node
whose configuration changed has a new NodeId and starts with a new runtime; the
old one is retired once the plane that used it is replaced (:meth:`NodeRuntime.retire`):
what is idle closes at once, what still carries flows closes when they end, so a
reload cuts no flow; the drain policy decides when those flows end.

The runtime owns what a node *shares* between flows (pools, sessions,
carriers, warm connections) and closes it when the node goes. What belongs to
one flow (a TLS bridge, a UDP association's endpoint) stays with that flow,
so retiring a node never cuts a live connection.
"""

from __future__ import annotations

import contextlib
import enum
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any, Protocol

from honk.outbound.ready import ReadyPool, bypassed


class Closable(Protocol):
    def close(self) -> None: ...


class TrafficReporter(Protocol):
    """Where a node's real traffic reports to (health; see honk.alive.traffic.NodeTraffic).
    ``family`` is 4 or 6: the address family the node's server is reached over."""

    def dial(
        self, outcome: Any, family: int, latency: float | None = None, pool_hit: bool = False
    ) -> None: ...

    def packets_failed(self, family: int) -> None: ...

    def packets_answered(self, family: int) -> None: ...


class WarmOwner(enum.IntFlag):
    """Who asked for a node to be kept warm; it stays warm while any bit is set."""

    STARTUP = 1  # startup preconnect
    SELECTOR_PIN = 2  # a Selector's chosen member
    UDP_WARM = 4  # the UDP warm set


class NodeRuntime:
    """Resources and counters of one node (by NodeId), shared across plane generations."""

    def __init__(self, node_id: uuid.UUID, name: str) -> None:
        self.node_id = node_id
        self.name = name  # display name of the latest generation that uses it
        self.warm = WarmOwner(0)
        # dial outcomes by kind: "ok", or a failure phase ("connect", "auth", "target", ...)
        self.dials: Counter[str] = Counter()
        self.traffic: TrafficReporter | None = None  # set by the health service
        self.ready = ReadyPool()  # bare server connections opened ahead (warm-up)
        self._resources: set[Closable] = set()
        # out of service: no plane builds on it and warm-up leaves it alone (retired or closed)
        self.closed = False
        # retired and not closed: resources still carrying flows live until those flows end
        self.retiring = False

    def own(self, resource: Closable) -> None:
        """Close ``resource`` when the runtime closes, unless :meth:`release` comes first.
        A retiring runtime takes it retired (a flow opened on the old plane was still dialling
        when the reload came): it serves that flow and closes after it."""
        if self.closed:
            if self.retiring and (retire := getattr(resource, "retire", None)) is not None:
                self._resources.add(resource)
                retire()
                return
            resource.close()
            return
        self._resources.add(resource)

    def release(self, resource: Closable) -> None:
        self._resources.discard(resource)

    @property
    def open_resources(self) -> int:
        return len(self._resources)

    def hold(self, owner: WarmOwner) -> None:
        """``owner`` wants the node kept warm (GH-I-08: the owners are independent bits)."""
        self.warm |= owner

    def let_go(self, owner: WarmOwner) -> bool:
        """``owner`` no longer wants the node warm. When no owner is left, future reuse drains:
        ready connections and idle carriers close, busy carriers take no new flows and close
        when theirs end (an active flow is never cut, GH-I-09). Whether it drained."""
        if not self.warm & owner:
            return False
        self.warm &= ~owner
        if self.warm:
            return False  # another owner still wants the shared resources
        self._drain_reuse()
        return True

    def is_warm(self) -> bool:
        """Kept warm by an owner, or holding shared resources that live flows use."""
        return bool(self.warm) or bool(self._resources)

    @contextlib.contextmanager
    def cold_guard(self) -> Iterator[None]:
        """Around a probe through a cold runtime: whatever shared resource the probe
        opened (a mux carrier) and no flow adopted meanwhile is closed when it ends,
        so health checks never keep an unwanted carrier alive. A warm runtime is left as it is.
        A probe never takes a ready connection (its delay must include the connect)."""
        if self.is_warm():
            with bypassed():
                yield
            return
        before = set(self._resources)
        try:
            with bypassed():
                yield
        finally:
            for resource in list(self._resources - before):
                if getattr(resource, "idle", True):
                    self._resources.discard(resource)
                    resource.close()

    def purge(self) -> int:
        """The node was found dead: pooled resources stop being reused. An idle one closes
        now; one still carrying flows takes no new ones and closes when they end, so no live
        connection is cut. How many were closed or retired. (UDP endpoints belong to their
        association, which drops them on its own failure.)"""
        return self._drain_reuse()

    def _drain_reuse(self) -> int:
        purged = self.ready.drain()
        for resource in list(self._resources):
            if getattr(resource, "idle", True):
                self._resources.discard(resource)
                resource.close()
            elif (retire := getattr(resource, "retire", None)) is not None:
                retire()
            else:
                continue
            purged += 1
        return purged

    def retire(self) -> int:
        """The node left service (a reload changed or removed it): no plane uses the runtime
        again. Ready connections and idle carriers close now; a carrier still carrying flows
        takes no new ones and closes when its last ends, so the drain policy alone decides
        when live flows end (``keep``: on their own). How many resources were closed or retired."""
        if self.closed:
            return 0
        self.closed = self.retiring = True
        return self._drain_reuse()

    def close(self) -> None:
        """Stop everything the node owns, flows on it included; idempotent (after
        :meth:`retire` too: then it ends what the retirement left running)."""
        if self.closed and not self.retiring:
            return
        self.closed, self.retiring = True, False
        self.ready.drain()
        for resource in list(self._resources):
            resource.close()
        self._resources.clear()

    def __repr__(self) -> str:
        return (
            f"NodeRuntime(node_id={self.node_id}, name={self.name!r}, closed={self.closed}, "
            f"retiring={self.retiring})"
        )
