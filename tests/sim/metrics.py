"""Figures of one simulation run (issue 11, acceptance 2).

* best-node fraction: of the routed flows arriving after ``warmup``, how many went to a best
  available node for their target at their arrival: the highest success probability then, ties
  broken by mean latency (setup + response); nodes equal on both are all best;
* escape, per outage window of a node: from the outage's start to the first flow (to a target the
  outage covers) routed elsewhere, in seconds and in flows still sent to the failing node; and how
  many of those flows were sent after the first failed flow's settlement (0: the policy escaped
  within that settlement);
* switches and flaps per hour, counted per target with :class:`SwitchHistory`, the same
  definition ``/stats.score`` uses (a flap returns to the previous winner within ``FLAP_WINDOW``
  ordinary selections).
"""

from __future__ import annotations

from dataclasses import dataclass

from honk.group.score.switches import SwitchHistory

from .engine import FlowRecord, RunResult, Script

SECONDS_PER_HOUR = 3600.0
LATENCY_TIE = 1e-9  # seconds; mean latencies closer than this are equal
_SCOPE = ("sim", "tcp")  # the SwitchHistory counter scope


def best_nodes(script: Script, target: str, t: float) -> frozenset[str]:
    """The best available nodes for ``target`` at ``t`` (empty when every node fails it)."""
    top = max(n.success_at(target, t) for n in script.nodes)
    if top <= 0.0:
        return frozenset()
    likely = [n for n in script.nodes if n.success_at(target, t) == top]
    fastest = min(n.mean_latency for n in likely)
    return frozenset(n.name for n in likely if n.mean_latency - fastest < LATENCY_TIE)


@dataclass(frozen=True, slots=True)
class Escape:
    node: str
    outage_start: float
    seconds: float | None  # None: every covered flow until the outage ended still went to the node
    flows: int  # flows sent to the failing node from the outage's start until the escape
    flows_after_first_failure: int  # of those, how many arrived after the first failed one settled


@dataclass(frozen=True, slots=True)
class Figures:
    policy: str
    generated: int
    routed: int
    unrouted: int
    succeeded: int
    best_fraction: float  # over routed flows arriving after the warm-up (1.0 when none is judged)
    judged: int  # flows the best fraction is taken over
    escapes: tuple[Escape, ...]
    switches: int
    flaps: int
    hours: float

    @property
    def switches_per_hour(self) -> float:
        return self.switches / self.hours

    @property
    def flaps_per_hour(self) -> float:
        return self.flaps / self.hours

    def summary(self) -> str:
        lines = [
            f"{self.policy}: {self.generated} flows ({self.unrouted} unrouted, {self.succeeded} ok), "
            f"best node {self.best_fraction:.1%} of {self.judged}, "
            f"switches/h {self.switches_per_hour:.1f}, flaps/h {self.flaps_per_hour:.1f}",
        ]
        for e in self.escapes:
            took = "never" if e.seconds is None else f"{e.seconds:.1f}s"
            lines.append(
                f"  escape {e.node}@{e.outage_start:.0f}s: {took}, {e.flows} flows "
                f"({e.flows_after_first_failure} after the first failure settled)"
            )
        return "\n".join(lines)


def _escape(
    flows: list[FlowRecord], node: str, start: float, end: float, targets: frozenset[str] | None
) -> Escape:
    covered = [f for f in flows if start <= f.arrived < end and (targets is None or f.target in targets)]
    stuck: list[FlowRecord] = []
    escaped_at: float | None = None
    for f in covered:
        if f.node is None:
            continue  # no pick: neither on the failing node nor on another
        if f.node != node:
            escaped_at = f.arrived
            break
        stuck.append(f)
    first_failure = min((f.settled for f in stuck if not f.ok and f.settled is not None), default=None)
    late = 0 if first_failure is None else sum(1 for f in stuck if f.arrived >= first_failure)
    return Escape(node, start, None if escaped_at is None else escaped_at - start, len(stuck), late)


def figures(result: RunResult, warmup: float = 0.0) -> Figures:
    script, flows = result.script, result.flows
    routed = [f for f in flows if f.node is not None]
    judged = [f for f in routed if f.arrived >= warmup]
    on_best = sum(1 for f in judged if f.node in best_nodes(script, f.target, f.arrived))
    history = SwitchHistory()
    for f in routed:  # every committed selection is an ordinary one here: adapters have no trials
        history.record(*_SCOPE, f.target, f.node)
    counters = history.counters.get(_SCOPE)
    escapes = tuple(
        _escape(flows, n.name, o.start, o.end, o.targets) for n in script.nodes for o in n.outages
    )
    return Figures(
        policy=result.policy,
        generated=result.generated,
        routed=len(routed),
        unrouted=len(flows) - len(routed),
        succeeded=sum(1 for f in routed if f.ok),
        best_fraction=on_best / len(judged) if judged else 1.0,
        judged=len(judged),
        escapes=escapes,
        switches=counters.ordinary_switch if counters else 0,
        flaps=counters.switch_flap if counters else 0,
        hours=script.duration / SECONDS_PER_HOUR,
    )
