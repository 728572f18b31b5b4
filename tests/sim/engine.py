"""Scripted nodes and flows on a FakeClock, driving one group policy through a policy adapter.

A :class:`Script` describes the nodes (per-target success probability, setup and response
latency with jitter, outage windows), the targets, the flow arrival rate, the probe cadence and
the duration. :func:`run` plays it against one :class:`PolicyAdapter` and returns every flow's
:class:`FlowRecord` for :mod:`sim.metrics`.

Determinism: arrivals (times and targets) come from their own seeded stream and each node draws
its outcomes from its own seeded stream, so two policies on the same script see the same flows,
and a node's n-th draw is the same whichever policy sent the flow there.

Events are processed in time order (ties: settlements, then probes, then arrivals, so a result
that is in by an instant is known to a choice made at that instant); the clock is advanced to
each event before it is handled.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from honk.core.clock import Clock, FakeClock

PROBE_TARGET = "probe"  # the target probes measure (a node may fail real targets but pass probes)
MIN_LATENCY = 0.001  # seconds; a jittered latency never drops below this
DEFAULT_FAILURE_LATENCY = 5.0  # seconds from a flow's start until its failure is known (a dial timeout)
CLOCK_START = 1000.0  # the FakeClock's starting time; scripts speak in seconds since the start

# event kinds, in tie-break order
_SETTLE, _PROBE, _ARRIVAL = 0, 1, 2


@dataclass(frozen=True, slots=True)
class Outage:
    """From ``start`` to ``end`` (seconds since the run's start) the node succeeds with ``success``
    on ``targets`` (None: every target, probes included)."""

    start: float
    end: float
    success: float = 0.0
    targets: frozenset[str] | None = None

    def covers(self, target: str, t: float) -> bool:
        return self.start <= t < self.end and (self.targets is None or target in self.targets)


@dataclass(frozen=True, slots=True)
class NodeScript:
    """One scripted node. Latencies in seconds; ``jitter`` is the standard deviation of each draw."""

    name: str
    success: float = 1.0  # default success probability for a target
    target_success: Mapping[str, float] = field(default_factory=dict)
    setup: float = 0.100
    response: float = 0.200
    jitter: float = 0.0
    failure_latency: float = DEFAULT_FAILURE_LATENCY
    outages: tuple[Outage, ...] = ()

    def success_at(self, target: str, t: float) -> float:
        for outage in self.outages:
            if outage.covers(target, t):
                return outage.success
        return self.target_success.get(target, self.success)

    def node_fault(self, target: str, t: float) -> bool:
        """Whether a failure of ``target`` at ``t`` is the node's own (an outage of every target:
        the proxy is down), rather than the path to that target (what a proxy reports as a
        refused or failed CONNECT after its own handshake succeeded)."""
        return any(outage.targets is None and outage.covers(target, t) for outage in self.outages)

    @property
    def mean_latency(self) -> float:
        return self.setup + self.response


@dataclass(frozen=True, slots=True)
class Script:
    nodes: tuple[NodeScript, ...]
    targets: tuple[str, ...]
    duration: float  # seconds
    flow_rate: float = 1.0  # flows per second (Poisson arrivals)
    check_interval: float = 30.0  # seconds between probe rounds
    seed: int = 1

    def node(self, name: str) -> NodeScript:
        return next(n for n in self.nodes if n.name == name)


@dataclass(frozen=True, slots=True)
class FlowOutcome:
    """What a policy is told when a flow settles. Times are clock times (``Clock.now``)."""

    flow_id: int
    target: str
    node: str
    arrived: float
    settled: float
    ok: bool
    setup_latency: float  # until the setup succeeded, or until the failure was known
    response_latency: float | None  # None for a failed flow
    node_fault: bool = (
        False  # a failed flow's cause is the node (outage of every target), not the target path
    )


@dataclass(slots=True)
class FlowRecord:
    """One generated flow, as the metrics see it. ``node`` None: the policy had no pick."""

    flow_id: int
    target: str
    arrived: float  # seconds since the run's start
    node: str | None
    ok: bool = False
    settled: float | None = None  # seconds since the run's start


class PolicyAdapter(Protocol):
    """A group policy as the simulation drives it. Built by a factory ``(nodes, clock) -> adapter``."""

    name: str

    def choose(self, target: str, now: float) -> str | None:
        """The node for a new flow to ``target`` (a committed selection), or None: no pick."""

    def settle(self, outcome: FlowOutcome) -> None:
        """A flow this adapter routed has finished: its outcome and timings."""

    def probe(self, node: str, rtt: float | None, now: float) -> None:
        """A probe of ``node`` on the check cadence: its round trip, or None when it failed."""


AdapterFactory = Callable[[Sequence[str], Clock], PolicyAdapter]


@dataclass(slots=True)
class RunResult:
    script: Script
    policy: str
    flows: list[FlowRecord]
    generated: int
    probes: int


class _NodeRuntime:
    """A node's own random stream, so its draws do not depend on what other nodes were sent."""

    def __init__(self, spec: NodeScript, seed: int) -> None:
        self.spec = spec
        self.rng = random.Random(f"{seed}:node:{spec.name}")

    def _latency(self, mean: float) -> float:
        if self.spec.jitter <= 0:
            return max(mean, MIN_LATENCY)
        return max(self.rng.gauss(mean, self.spec.jitter), MIN_LATENCY)

    def attempt(self, target: str, t: float) -> tuple[bool, float, float | None, bool]:
        """(ok, setup latency or time to failure, response latency or None, node fault) for a
        flow starting at ``t``."""
        ok = self.rng.random() < self.spec.success_at(target, t)
        setup = self._latency(self.spec.setup)
        if not ok:
            return False, self.spec.failure_latency, None, self.spec.node_fault(target, t)
        return True, setup, self._latency(self.spec.response), False


def run(script: Script, factory: AdapterFactory) -> RunResult:
    """Play ``script`` against the adapter ``factory`` builds; every generated flow is recorded."""
    clock = FakeClock(start=CLOCK_START)
    adapter = factory(tuple(n.name for n in script.nodes), clock)
    nodes = {n.name: _NodeRuntime(n, script.seed) for n in script.nodes}
    arrivals = random.Random(f"{script.seed}:arrivals")
    seq = itertools.count()
    events: list[tuple[float, int, int, object]] = []

    def push(t: float, kind: int, payload: object) -> None:
        heapq.heappush(events, (t, kind, next(seq), payload))

    push(0.0, _PROBE, None)
    push(arrivals.expovariate(script.flow_rate), _ARRIVAL, None)
    flows: list[FlowRecord] = []
    probes = 0
    while events:
        t, kind, _, payload = heapq.heappop(events)
        if t > script.duration and kind != _SETTLE:
            continue  # nothing new starts after the end; flows in flight still settle
        clock.advance(max(0.0, CLOCK_START + t - clock.now()))  # equal times may differ by an ulp
        now = clock.now()
        if kind == _ARRIVAL:
            target = arrivals.choice(script.targets)
            node = adapter.choose(target, now)
            record = FlowRecord(len(flows), target, t, node)
            flows.append(record)
            if node is not None:
                ok, setup, response, node_fault = nodes[node].attempt(target, t)
                took = setup + (response or 0.0)
                outcome = FlowOutcome(
                    record.flow_id, target, node, now, now + took, ok, setup, response, node_fault
                )
                push(t + took, _SETTLE, (record, outcome))
            push(t + arrivals.expovariate(script.flow_rate), _ARRIVAL, None)
        elif kind == _PROBE:
            for name, runtime in nodes.items():
                ok, setup, response, _node_fault = runtime.attempt(PROBE_TARGET, t)
                adapter.probe(name, setup + response if ok and response is not None else None, now)
                probes += 1
            push(t + script.check_interval, _PROBE, None)
        else:
            record, outcome = payload  # type: ignore[misc]
            record.ok, record.settled = outcome.ok, t
            adapter.settle(outcome)
    return RunResult(script, adapter.name, flows, len(flows), probes)
