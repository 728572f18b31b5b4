"""Runtime counters the control surfaces export (``/metrics``, ``/stats``).

Plain integers updated where events happen (a dial ends, a probe ends, a
selection moves, a reload or subscription refresh finishes); the API reads
them at scrape time. Labels are drawn from small fixed sets (networks,
results, error kinds, probe kinds, apply error variants, drain policies) or
from the configuration's group names, so their number never grows with
traffic, targets or node count. Nothing here
holds a target, a credential or a Score cell.
"""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass

from honk.core.errors import (
    Blocked,
    CapacityRefused,
    DialError,
    DialTimeout,
    HonkError,
    NoRoute,
    NotSupported,
    ProxyAuthFailed,
    TargetRefused,
)

# Upper bounds (seconds) of the probe-duration histogram buckets; +Inf is implied.
PROBE_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

# Error kinds a dial can end with, most specific first: the only values the "kind" label takes.
_KINDS: tuple[tuple[type[HonkError], str], ...] = (
    (DialTimeout, "timeout"),
    (TargetRefused, "target_refused"),
    (ProxyAuthFailed, "proxy_auth"),
    (DialError, "dial"),
    (CapacityRefused, "capacity"),
    (Blocked, "blocked"),
    (NoRoute, "no_route"),
    (NotSupported, "not_supported"),
)
DIAL_ERROR_KINDS = (*(kind for _, kind in _KINDS), "other")

# The fixed label values of the other counters; exporters list them all so a series exists (at 0)
# before its first event and a rate over it starts from a known value.
DIAL_NETWORKS = ("tcp", "udp")
PROBE_KINDS = ("tcp", "udp", "url")  # a node's TCP probe, its UDP round, a group member's check_url
PROBE_RESULTS = ("ok", "error")
RELOAD_RESULTS = ("applied", "refused")
# The error label of a refusal reported without its ApplyError variant (Daemon.reload's bool):
# the base ApplyError variant, what a file that does not load or build is.
UNSPECIFIED_REFUSAL = "invalid"
# Drain policies that close flows (keep never does): the values of the "policy" label.
DRAIN_CLOSING_POLICIES = ("close", "close_after")
SUBSCRIPTION_RESULTS = ("accepted", "unchanged", "failed")


def error_kind(exc: BaseException) -> str:
    """The bounded label for how a dial failed."""
    for cls, kind in _KINDS:
        if isinstance(exc, cls):
            return kind
    return "other"


class Histogram:
    """Cumulative-ready bucket counts, a sum and a count (Prometheus histogram semantics)."""

    __slots__ = ("counts", "total", "count")

    def __init__(self) -> None:
        self.counts = [0] * (len(PROBE_BUCKETS) + 1)  # the last slot is +Inf
        self.total = 0.0
        self.count = 0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(PROBE_BUCKETS, seconds)] += 1
        self.total += seconds
        self.count += 1

    def cumulative(self) -> list[tuple[str, int]]:
        """(upper bound text, cumulative count) per bucket, +Inf last."""
        out, running = [], 0
        for bound, n in zip((*map(str, PROBE_BUCKETS), "+Inf"), self.counts, strict=True):
            running += n
            out.append((bound, running))
        return out


@dataclass(slots=True)
class OutboundCounts:
    connections: int = 0  # flows whose upstream connected through the outbound
    errors: int = 0  # dials through the outbound that failed


@dataclass(slots=True)
class StaggerCounts:
    """``/stats`` ``udp.stagger``: cold UDP preparations (honk.connection.stagger) and what
    became of their attempts."""

    plans: int = 0  # cold preparations run (several candidates raced)
    attempts: int = 0  # candidate preparations started
    wins: int = 0  # preparations that committed a winner
    failures: int = 0  # ... that ended with no candidate left
    timeouts: int = 0  # ... whose deadline passed first
    errors: int = 0  # observed preparation errors (each one a health event of its node)
    drained: int = 0  # started attempts aborted and drained (after a winner, at the deadline)
    rejected: int = 0  # successes no longer eligible, dropped neutrally

    def as_dict(self) -> dict[str, int]:
        return {
            "plans": self.plans,
            "attempts": self.attempts,
            "wins": self.wins,
            "failures": self.failures,
            "timeouts": self.timeouts,
            "errors": self.errors,
            "drained": self.drained,
            "rejected": self.rejected,
        }


# What asyncio tells the loop's exception handler when a server's accept() found no descriptor,
# buffer or memory (it rests a second, then accepts again); honk's engine listeners report their
# rests with the same message, so one handler counts them all (honk.daemon.loopguard).
ACCEPT_EXHAUSTED = "socket.accept() out of system resource"


class RuntimeStats:
    """Event counters for one daemon. One instance, owned by the daemon, shared by reference."""

    def __init__(self) -> None:
        self.dials: Counter[tuple[str, str, str]] = Counter()  # (network, result, kind)
        self.outbounds: dict[str, OutboundCounts] = {}  # by leaf name: the /stats outbound rows
        self.probes: dict[tuple[str, str], Histogram] = {}  # (probe kind, result) -> durations
        self.selection_changes: Counter[tuple[str, str]] = Counter()  # (group, network)
        self.reloads: Counter[tuple[str, str]] = Counter()  # (applied | refused, error variant or "")
        self.drained_flows: Counter[str] = Counter()  # drain policy label -> flows its drains closed
        self.subscription_refreshes: Counter[str] = Counter()  # result: accepted | unchanged | failed
        self.udp_stagger = StaggerCounts()
        # errors asyncio reported to the loop's handler (unretrieved task exceptions, failed
        # callbacks) by exception type: honk.daemon.loopguard.LoopGuard counts them
        self.loop_errors: Counter[str] = Counter()
        # new flows refused because the flows' share of the descriptor limit was spent
        # (honk.connection.descriptors), and that limit (0 until the daemon sized its budget)
        self.descriptor_refusals = 0
        # times a listener's accept found no descriptor or memory and rested, by listening address
        self.accept_rests: Counter[str] = Counter()
        self.descriptor_limit = 0
        # failed API authentications by result: rejected (401) | throttled (429, honk.api.authguard)
        self.api_auth_failures: Counter[str] = Counter()

    def dial(self, network: str, error: BaseException | None, outbound: str = "") -> None:
        """A dial through ``outbound`` (a leaf name) ended with ``error`` (None: connected)."""
        if error is None:
            self.dials[(network, "ok", "")] += 1
        else:
            self.dials[(network, "error", error_kind(error))] += 1
        if outbound:
            counts = self.outbounds.get(outbound)
            if counts is None:
                counts = self.outbounds[outbound] = OutboundCounts()
            if error is None:
                counts.connections += 1
            else:
                counts.errors += 1

    def retain_outbounds(self, names: set[str]) -> None:
        """Forget the counts of outbounds the running configuration no longer has."""
        for name in [n for n in self.outbounds if n not in names]:
            del self.outbounds[name]

    def probe(self, kind: str, ok: bool, seconds: float) -> None:
        key = (kind, "ok" if ok else "error")
        histogram = self.probes.get(key)
        if histogram is None:
            histogram = self.probes[key] = Histogram()
        histogram.observe(seconds)

    def selection_changed(self, group: str, network: str) -> None:
        self.selection_changes[(group, network)] += 1

    def retain_groups(self, names: set[str]) -> None:
        """Forget the counters of groups the running configuration no longer has."""
        for key in [k for k in self.selection_changes if k[0] not in names]:
            del self.selection_changes[key]

    def reload(self, applied: bool) -> None:
        """An apply whose refusal kind is not known (:meth:`reload_result` says it)."""
        self.reload_result(applied, None if applied else UNSPECIFIED_REFUSAL)

    def reload_result(self, applied: bool, error_variant: str | None) -> None:
        """An apply ended: applied, or refused with ``error_variant`` (``ApplyError.variant``)."""
        if applied:
            self.reloads[("applied", "")] += 1
        else:
            self.reloads[("refused", error_variant or UNSPECIFIED_REFUSAL)] += 1

    def drained_closed(self, policy_label: str, n: int) -> None:
        """A drain under ``policy_label`` (``ClosePolicy.label``) closed ``n`` flows."""
        if n > 0:
            self.drained_flows[policy_label] += n

    def subscription_refresh(self, result: str) -> None:
        self.subscription_refreshes[result] += 1
