"""Prometheus ``/metrics``: what a router operator scrapes, read from the daemon at scrape time.

One :class:`HonkCollector` per API server, in the server's own
``CollectorRegistry`` (never the process-global one, so two daemons in one
process, as tests run them, do not mix). Nothing is sampled in the background:
each scrape reads the tracker, the health state, the admission gates, the
runtime counters (:class:`~honk.core.stats.RuntimeStats`), the DNS service's
cache and counters, and ``/proc/self``.

Label sets are bounded by the configuration, never by traffic: inbound,
group and outbound tags, node names (``honk_node_alive`` has at most six
series a node, one per health domain and family that has a known state), and
small fixed sets (networks, results, error and probe kinds, apply error
variants, drain policies, Score reasons and cache layers, DNS query results).
DNS series are labelled by the request rule's action (an upstream's name,
``asis`` or ``reject``), never by the name asked. Score series are
labelled by group and network only, read from ``ScoreState.stats()``
(GH-K-130). No target, client address, credential, URL, Score cell or
scorer-private node identity appears in a label or a value.

Reading the state runs on the event loop (it is loop-owned); turning the
families into text, the costly part with thousands of nodes, runs in a worker
thread. Authentication is the API server's (same secret, same middleware).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable, Iterator
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from honk import __version__
from honk.alive.health import Status
from honk.api.authguard import RESULTS as AUTH_RESULTS
from honk.api.context import Control
from honk.config.spec import Policy
from honk.control.errors import ApplyError
from honk.core.stats import (
    DIAL_ERROR_KINDS,
    DIAL_NETWORKS,
    DRAIN_CLOSING_POLICIES,
    PROBE_KINDS,
    PROBE_RESULTS,
    RELOAD_RESULTS,
    SUBSCRIPTION_RESULTS,
    Histogram,
)
from honk.group.score.ranker import CANDIDATE_COUNTERS, FINAL_REASONS
from honk.outbound.admission import process_gates

__all__ = ["METRICS_PATH", "HonkCollector", "routes"]

METRICS_PATH = "/metrics"
_NETWORKS = ("tcp", "udp")  # honk.core.net.Network values
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096  # /proc/self/statm counts pages


class HonkCollector:
    """Builds every ``honk_*`` family from the daemon's state when the registry collects."""

    def __init__(self, control: Control) -> None:
        self.control = control

    def collect(self) -> Iterator[Metric]:
        control = self.control
        plane = control.plane
        stats = control.stats
        yield _info()
        yield _uptime(control)
        yield from _connections(control, plane)
        yield from _admission(plane)
        yield _node_alive(control)
        yield _dials(stats)
        yield _probes(stats)
        yield _selection_changes(stats, plane)
        yield _reloads(stats)
        yield _plane_epoch(control, plane)
        yield _draining_versions(control)
        yield _results(
            "honk_drained_flows_closed",
            "Flows closed by drains of outbound versions that left service, by drain policy.",
            stats.drained_flows,
            DRAIN_CLOSING_POLICIES,
            label="policy",
        )
        yield from _score(plane)
        yield from _dns(getattr(control, "dns_service", None))
        yield _results(
            "honk_subscription_refreshes",
            "Subscription refreshes by result.",
            stats.subscription_refreshes,
            SUBSCRIPTION_RESULTS,
        )
        yield _results(
            "honk_loop_errors",
            "Errors the event loop reported that no task retrieved "
            "(each is logged with its traceback), by exception type.",
            stats.loop_errors,
            (),
            label="exception",
        )
        yield _results(
            "honk_api_auth_failures",
            "Failed API authentications by result: rejected (401) "
            "or throttled (429: the source ran out of tries).",
            stats.api_auth_failures,
            AUTH_RESULTS,
        )
        yield _results(
            "honk_accept_rests",
            "Times a listener's accept found no descriptor or memory "
            "left and rested before accepting again, by listening address.",
            stats.accept_rests,
            (),
            label="listener",
        )
        yield from _process(stats)


# --- families -----------------------------------------------------------------------------


def _info() -> Metric:
    family = GaugeMetricFamily("honk_info", "The running honk version (always 1).", labels=["version"])
    family.add_metric([__version__], 1)
    return family


def _uptime(control: Control) -> Metric:
    ready = control.started_wall  # 0 until the daemon is ready: no uptime yet
    uptime = max(0.0, control.clock.now() - control.started_at) if ready else 0.0
    return GaugeMetricFamily("honk_uptime_seconds", "Seconds since the daemon became ready.", value=uptime)


def _connections(control: Control, plane: Any) -> Iterator[Metric]:
    counts: dict[tuple[str, str], int] = {}
    if plane is not None:  # every configured inbound shows, at 0 while it carries nothing
        for inbound in plane.spec.inbounds:
            for network in _NETWORKS:
                counts[(inbound.name, network)] = 0
    for info in control.tracker.snapshot():
        key = (info.inbound, info.network.value)
        counts[key] = counts.get(key, 0) + 1
    live = GaugeMetricFamily(
        "honk_connections", "Live flows by inbound and network.", labels=["inbound", "network"]
    )
    for (inbound, network), n in counts.items():
        live.add_metric([inbound, network], n)
    yield live
    up, down = control.tracker.totals()
    relayed = CounterMetricFamily(
        "honk_relayed_bytes",
        "Bytes relayed since start, by direction (up: client to upstream).",
        labels=["direction"],
    )
    relayed.add_metric(["up"], up)
    relayed.add_metric(["down"], down)
    yield relayed


def _admission(plane: Any) -> Iterator[Metric]:
    """The process dial gate (shared by every generation) and the running plane's budget."""
    budget = getattr(plane, "admission", None) if plane is not None else None
    gates = budget.gates if budget is not None else process_gates()
    in_use = GaugeMetricFamily(
        "honk_dial_admission_in_use",
        "Dial permits held: the process gate and the running configuration's budget.",
        labels=["scope"],
    )
    waiting = GaugeMetricFamily(
        "honk_dial_admission_waiting", "Dials waiting for a permit.", labels=["scope"]
    )
    limit = GaugeMetricFamily("honk_dial_admission_limit", "Dial permits available in all.", labels=["scope"])
    in_use.add_metric(["process"], gates.dials_in_use)
    waiting.add_metric(["process"], gates.dials_waiting)
    limit.add_metric(["process"], gates.dial_size)
    if budget is not None:
        in_use.add_metric(["plane"], budget.in_use)
        waiting.add_metric(["plane"], budget.waiting)
        limit.add_metric(["plane"], budget.effective_limit)
    yield in_use
    yield waiting
    yield limit


def _node_alive(control: Control) -> Metric:
    """1 alive, 0 dead, per node name and state; unknown states are left out. Names may collide
    in a configuration: the first registered node of a name speaks for it (as Spec.node does)."""
    family = GaugeMetricFamily(
        "honk_node_alive",
        "Node liveness per health domain and address "
        "family (1 alive, 0 dead; unknown states are not exported).",
        labels=["node", "domain", "family"],
    )
    seen: set[str] = set()
    for node in control.health.alive.nodes():
        if node.name in seen:
            continue
        seen.add(node.name)
        for (domain, fam), state in node.states.items():
            if state.status is Status.UNKNOWN:
                continue
            family.add_metric(
                [node.name, domain.value, f"ipv{fam.value}"], 1 if state.status is Status.ALIVE else 0
            )
    return family


def _dials(stats: Any) -> Metric:
    family = CounterMetricFamily(
        "honk_dials",
        "Upstream dials by network, result and error kind.",
        labels=["network", "result", "kind"],
    )
    counts = dict.fromkeys(
        [(net, "ok", "") for net in DIAL_NETWORKS]
        + [(net, "error", kind) for net in DIAL_NETWORKS for kind in DIAL_ERROR_KINDS],
        0,
    )
    counts.update(stats.dials)
    for labels, n in counts.items():
        family.add_metric(list(labels), n)
    return family


def _probes(stats: Any) -> Metric:
    family = HistogramMetricFamily(
        "honk_probe_duration_seconds", "Health probe durations by kind and result.", labels=["kind", "result"]
    )
    for kind in PROBE_KINDS:
        for result in PROBE_RESULTS:
            histogram = stats.probes.get((kind, result)) or Histogram()
            family.add_metric([kind, result], histogram.cumulative(), histogram.total)
    return family


def _selection_changes(stats: Any, plane: Any) -> Metric:
    family = CounterMetricFamily(
        "honk_group_selection_changes",
        "Group selection changes by group and network.",
        labels=["group", "network"],
    )
    counts: dict[tuple[str, str], int] = {}
    if plane is not None:  # every configured group shows, at 0 until its selection first moves
        for group in plane.spec.groups:
            for network in _NETWORKS:
                counts[(group.name, network)] = 0
    counts.update(stats.selection_changes)
    for labels, n in counts.items():
        family.add_metric(list(labels), n)
    return family


def _results(name: str, doc: str, counter: Any, results: Iterable[str], label: str = "result") -> Metric:
    family = CounterMetricFamily(name, doc, labels=[label])
    counts = dict.fromkeys(results, 0)
    counts.update(counter)
    for result, n in counts.items():
        family.add_metric([result], n)
    return family


def _error_variants() -> list[str]:
    """Every ``ApplyError.variant`` defined so far (a fixed set: the error classes), sorted."""
    variants, classes = set(), [ApplyError]
    while classes:
        cls = classes.pop()
        variants.add(cls.variant)
        classes.extend(cls.__subclasses__())
    return sorted(variants)


def _reloads(stats: Any) -> Metric:
    """Applies by result; a refusal by its ApplyError variant, ``error=""`` for an applied one."""
    applied, refused = RELOAD_RESULTS
    family = CounterMetricFamily(
        "honk_reloads",
        "Configuration applies (reloads, API edits) by result and, for a refusal, its error variant.",
        labels=["result", "error"],
    )
    counts = dict.fromkeys([(applied, ""), *((refused, variant) for variant in _error_variants())], 0)
    counts.update(stats.reloads)
    for labels, n in counts.items():
        family.add_metric(list(labels), n)
    return family


def _plane_epoch(control: Control, plane: Any) -> Metric:
    """The reconciler's plane epoch (+1 per published plane); before it, the plane generation."""
    epoch = getattr(control, "epoch", None)
    if epoch is None:
        epoch = getattr(control, "generation", None)
    if epoch is None:
        epoch = getattr(plane, "generation", 0) if plane is not None else 0
    return GaugeMetricFamily(
        "honk_plane_epoch",
        "The published plane's epoch: 0 before the first, +1 per published plane.",
        value=epoch,
    )


def _draining_versions(control: Control) -> Metric:
    """Per tag, outbound versions that left service and still hold flows (none without a drainer)."""
    family = GaugeMetricFamily(
        "honk_outbound_draining_versions",
        "Outbound versions that left service and still hold flows, by outbound tag.",
        labels=["tag"],
    )
    drainer = getattr(control, "drainer", None)
    if drainer is not None:
        for tag, n in sorted(drainer.draining().items()):
            family.add_metric([tag], n)
    return family


_SCORE_CACHE_LAYERS = ("exact", "aggregate")  # the evidence caches; their /stats.score keys start so


def _score_rows(plane: Any, score: dict) -> dict[tuple[str, str], dict]:
    """``/stats.score`` entries by (group, network): every configured Score group at zero on both
    networks first (a rate over a series that appears late misses its first counts), then what
    the ScoreState has counted."""
    zero = {
        "reasons": dict.fromkeys(FINAL_REASONS, 0),
        "candidates": dict.fromkeys(CANDIDATE_COUNTERS, 0),
        "ordinarySwitch": 0,
        "switchFlap": 0,
        "coldAllowance": 0,
        "coldSpent": 0,
    }
    rows = {
        (group.name, network): zero
        for group in plane.spec.groups
        if group.policy is Policy.SCORE
        for network in _NETWORKS
    }
    rows.update({(entry["group"], entry["network"]): entry for entry in score["groups"]})
    return rows


def _score(plane: Any) -> Iterator[Metric]:
    """Score's fixed counters per group and network, and its evidence cache totals (GH-K-130)."""
    group_labels = ["group", "network"]
    reasons = CounterMetricFamily(
        "honk_score_reason",
        "Applied multi-candidate Score ranks by final reason.",
        labels=[*group_labels, "reason"],
    )
    candidates = CounterMetricFamily(
        "honk_score_candidate",
        "Score candidates affected by a filter (candidates, not flows).",
        labels=[*group_labels, "counter"],
    )
    switches = CounterMetricFamily(
        "honk_score_ordinary_switch",
        "Committed ordinary Score winner changes (first choices and trials excluded).",
        labels=group_labels,
    )
    flaps = CounterMetricFamily(
        "honk_score_switch_flap",
        "Ordinary Score switches that returned to the "
        "previous winner soon after leaving it (a subset of the switches).",
        labels=group_labels,
    )
    allowance = GaugeMetricFamily(
        "honk_score_cold_allowance",
        "Score trial budget: the cold allowance frozen for the group's scopes.",
        labels=group_labels,
    )
    spent = CounterMetricFamily(
        "honk_score_cold_spent", "Score optional trials spent (cold and recovery).", labels=group_labels
    )
    entries = GaugeMetricFamily(
        "honk_score_cache_entries", "Score evidence cells held, by cache layer.", labels=["layer"]
    )
    capacity = GaugeMetricFamily(
        "honk_score_cache_capacity", "Score evidence cells a cache layer holds at most.", labels=["layer"]
    )
    evictions = CounterMetricFamily(
        "honk_score_cache_evictions", "Score evidence cells evicted, by cache layer.", labels=["layer"]
    )
    if plane is not None:
        score = plane.groups.score.stats()
        for (group, network), row in _score_rows(plane, score).items():
            for reason in FINAL_REASONS:
                reasons.add_metric([group, network, reason], row["reasons"][reason])
            for counter in CANDIDATE_COUNTERS:
                candidates.add_metric([group, network, counter], row["candidates"][counter])
            switches.add_metric([group, network], row["ordinarySwitch"])
            flaps.add_metric([group, network], row["switchFlap"])
            allowance.add_metric([group, network], row["coldAllowance"])
            spent.add_metric([group, network], row["coldSpent"])
        cache = score["cache"]
        for layer in _SCORE_CACHE_LAYERS:
            entries.add_metric([layer], cache[f"{layer}Entries"])
            capacity.add_metric([layer], cache[f"{layer}Capacity"])
            evictions.add_metric([layer], cache[f"{layer}Evictions"])
    yield from (reasons, candidates, switches, flaps, allowance, spent, entries, capacity, evictions)


def _dns(service: Any) -> Iterator[Metric]:
    """The DNS service's queries, cache and upstream round trips; nothing without a dns section.
    Every configured upstream shows at zero (each result, an empty histogram) before its first
    query."""
    if service is None:
        return
    from honk.dns.cache import DNS_QUERY_RESULTS, LatencyHistogram

    stats, cache = service.stats, service.cache
    upstreams = [upstream.name for upstream in service.spec.upstreams]
    queries = CounterMetricFamily(
        "honk_dns_queries",
        "DNS queries answered, by the request rule's action "
        "(an upstream's name, asis or reject) and result (cached, answered, negative, "
        "error, failed, rejected).",
        labels=["upstream", "result"],
    )
    counts = dict.fromkeys([(name, result) for name in upstreams for result in DNS_QUERY_RESULTS], 0)
    counts.update(stats.queries)
    for labels, n in counts.items():
        queries.add_metric(list(labels), n)
    yield queries
    yield CounterMetricFamily(
        "honk_dns_cache_hits", "DNS cache lookups that found a live answer.", value=cache.hits
    )
    yield CounterMetricFamily(
        "honk_dns_cache_misses", "DNS cache lookups that found no live answer.", value=cache.misses
    )
    yield CounterMetricFamily(
        "honk_dns_cache_evictions",
        "Live DNS answers evicted to keep the cache within its entry or byte bound.",
        value=cache.evictions,
    )
    yield GaugeMetricFamily("honk_dns_cache_entries", "DNS answers cached now.", value=len(cache))
    yield GaugeMetricFamily(
        "honk_dns_cache_bytes", "Estimated memory the cached DNS answers hold.", value=cache.bytes
    )
    latency = HistogramMetricFamily(
        "honk_dns_upstream_latency_seconds",
        "Round trips of DNS exchanges that an upstream answered, by upstream.",
        labels=["upstream"],
    )
    histograms = {name: LatencyHistogram() for name in upstreams}
    histograms.update(stats.latency)
    for name, histogram in histograms.items():
        latency.add_metric([name], histogram.cumulative(), histogram.total)
    yield latency


def _process(stats: Any) -> Iterator[Metric]:
    """Resident memory and open descriptors from /proc/self (Linux), the descriptor limit and the
    flows refused because the flows' share of it was spent."""
    yield CounterMetricFamily(
        "honk_descriptor_refusals",
        "New flows refused at once because the flows' share of the descriptor limit was spent.",
        value=stats.descriptor_refusals,
    )
    if stats.descriptor_limit:
        yield GaugeMetricFamily(
            "honk_process_max_fds",
            "The descriptor limit honk runs with (its soft "
            "RLIMIT_NOFILE, raised to the hard limit at start).",
            value=stats.descriptor_limit,
        )
    try:
        with open("/proc/self/statm", "rb") as f:
            resident_pages = int(f.read().split()[1])
    except (OSError, IndexError, ValueError):
        pass
    else:
        yield GaugeMetricFamily(
            "honk_process_resident_memory_bytes",
            "Resident set size of the honk process.",
            value=resident_pages * _PAGE_SIZE,
        )
    try:
        fds = len(os.listdir("/proc/self/fd"))
    except OSError:
        return
    yield GaugeMetricFamily("honk_process_open_fds", "File descriptors the honk process has open.", value=fds)


# --- the route ----------------------------------------------------------------------------------


class _Collected:
    """Families already read on the loop, for the formatter in the worker thread."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families


def routes(control: Control) -> list[web.RouteDef]:
    """``GET /metrics`` in the Prometheus text format, from this server's own registry."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(HonkCollector(control))

    async def metrics(request: web.Request) -> web.StreamResponse:
        families = list(registry.collect())  # on the loop: the state it reads is the loop's
        body = await asyncio.to_thread(generate_latest, _Collected(families))
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    return [web.get(METRICS_PATH, metrics)]
