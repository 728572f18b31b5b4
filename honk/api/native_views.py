"""The native API's objects (Group, Node, Conn, Diag, status and version), built without I/O.

Each function reads the part that owns the data (the plane's group manager and
outbounds, the health state, the tracker's snapshots, a loader's diagnostics)
and returns plain JSON-ready values. Nothing here changes state: group views
use the manager's peek resolution, so reading a group moves no URLTest winner,
Fallback pin or LoadBalance cursor. No credential of a node is ever read.

Conventions (the contract in docs/api.md): times are RFC 3339 UTC strings with
milliseconds, delays are milliseconds rounded to 3 decimals, byte counts are
integers, networks are ``tcp``/``udp``.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from honk.alive.health import AliveDialerSet, Status
from honk.alive.outcome import Domain, Family
from honk.config.diagnostics import Diagnostic
from honk.config.spec import BUILTIN_OUTBOUNDS, GroupSpec, NodeSpec, Policy, Spec
from honk.connection.tracker import ConnectionInfo
from honk.core.net import Network
from honk.group.filter import health_family_of, node_id_of

if TYPE_CHECKING:
    from honk.connection.plane import Plane

API_VERSION = 1  # the /v1 contract's version, reported by GET /v1/version
HISTORY_ENTRIES = 10  # Link history entries shown: the Clash API's last-10 (mihomo defaultHistoriesNum)
DELAY_DECIMALS = 3  # delays in ms keep microseconds: "delays in ms (float, 3 decimals)"
# configured policies that take a runtime pin (a Score group shows as URLTest in the Clash API,
# but its selection is its ranker's to make, per target: it takes no pin there either)
FIXABLE_POLICIES = (Policy.URLTEST, Policy.FALLBACK)
FAMILY_KEYS = {Family.V4: "v4", Family.V6: "v6"}
STATE_KEYS = tuple((d, f) for d in Domain for f in Family)  # a node's six states, in display order
NETWORKS = (Network.TCP, Network.UDP)

JSON = dict[str, Any]


# --- units ----------------------------------------------------------------------------------


def rfc3339(wall: float) -> str:
    """Wall-clock seconds as ``2026-11-30T12:00:00.123Z`` (UTC, milliseconds)."""
    moment = dt.datetime.fromtimestamp(wall, tz=dt.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def millis(seconds: float | None) -> float | None:
    """Seconds as milliseconds with 3 decimals; None stays None."""
    return None if seconds is None else round(seconds * 1000.0, DELAY_DECIMALS)


def per_network(values: Mapping[Network, object]) -> JSON:
    """``{"tcp": …, "udp": …}`` with None for a network that has no value."""
    return {net.value: values.get(net) for net in NETWORKS}


# --- groups ---------------------------------------------------------------------------------


def group_specs(spec: Spec) -> dict[str, GroupSpec]:
    """Each group's declaration by name (the first one wins, as the manager does)."""
    out: dict[str, GroupSpec] = {}
    for group in spec.groups:
        out.setdefault(group.name, group)
    return out


def group_view(plane: Plane, name: str, specs: Mapping[str, GroupSpec] | None = None) -> JSON:
    """The Group object of ``name`` (KeyError-like UnknownGroup when it is not a group)."""
    groups = plane.groups
    policy = groups.policy(name)
    gspec = (specs if specs is not None else group_specs(plane.spec))[name]
    chains = {net: list(groups.selection_chain(name, net)) for net in NETWORKS}
    # what the group serves now: the hop after the group itself on its current chain
    selection = {net: (chain[1] if len(chain) > 1 else None) for net, chain in chains.items()}
    choice = None
    if gspec.policy is Policy.SELECTOR:
        choice = per_network({net: policy.chosen(net) for net in NETWORKS})  # type: ignore[attr-defined]
    pinned = None
    if gspec.policy in FIXABLE_POLICIES:
        pinned = per_network(groups.pinned(name))
    return {
        "name": name,
        "id": str(groups.identity_of(name).uid),
        "policy": gspec.policy.value,
        "members": list(groups.members(name)),
        "leaves": list(groups.leaf_node_names_in_group(name)),
        "selection": per_network(selection),
        "chain": {net.value: chain for net, chain in chains.items()},
        "choice": choice,
        "pinned": pinned,
        "check_url": gspec.check_url,
        "interrupt_connections": gspec.interrupt_connections,
    }


def groups_view(plane: Plane) -> list[JSON]:
    """Every group in configuration order."""
    specs = group_specs(plane.spec)
    return [group_view(plane, name, specs) for name in plane.groups.names]


# --- nodes ----------------------------------------------------------------------------------


def node_specs(spec: Spec) -> dict[str, NodeSpec]:
    """Each node's declaration by name (the first one wins, as the outbound registry does)."""
    out: dict[str, NodeSpec] = {}
    for node in spec.nodes:
        out.setdefault(node.name, node)
    return out


def server_text(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _history(entries: Iterable[tuple[float, float, bool]]) -> list[JSON]:
    return [
        {"time": rfc3339(at), "delay_ms": millis(delay), "failed": failed} for at, delay, failed in entries
    ]


def link_view(alive: AliveDialerSet, node_id: uuid.UUID, domain: Domain, family: Family) -> JSON:
    """One domain × family state: status, ranking average, the newest history entries."""
    node = alive.node(node_id)
    state = node.peek(domain, family)
    status = Status.UNKNOWN if state is None else state.status
    average = None if state is None else state.average.value
    entries = alive.history(node_id, domain, family)[-HISTORY_ENTRIES:]
    return {"status": status.value, "average_ms": millis(average), "history": _history(entries)}


def health_view(alive: AliveDialerSet, node_id: uuid.UUID | None) -> JSON:
    """``{domain: {family: Link}}`` for the states that exist; {} for a node without health."""
    if node_id is None or node_id not in alive:
        return {}
    states = alive.node(node_id).states
    out: JSON = {}
    for domain, family in STATE_KEYS:
        if (domain, family) in states:
            out.setdefault(domain.value, {})[FAMILY_KEYS[family]] = link_view(alive, node_id, domain, family)
    return out


def latency_view(alive: AliveDialerSet, node_id: uuid.UUID | None) -> JSON:
    """The node's real latency samples (synthetic placeholders are display-excluded)."""
    samples = (
        []
        if node_id is None
        else [(at, d) for at, d, synthetic in alive.latency_history(node_id) if not synthetic]
    )
    return {
        "last_ms": millis(samples[-1][1]) if samples else None,
        "history": [{"time": rfc3339(at), "delay_ms": millis(delay)} for at, delay in samples],
    }


def node_view(
    plane: Plane, alive: AliveDialerSet, name: str, specs: Mapping[str, NodeSpec] | None = None
) -> JSON:
    """The Node object of outbound ``name`` (KeyError when there is none)."""
    leaf = plane.outbounds[name]
    node_id = node_id_of(leaf)
    # a node declared under a builtin's name is ignored by the registry: the builtin has no spec
    nspec = (
        None
        if name in BUILTIN_OUTBOUNDS
        else (specs if specs is not None else node_specs(plane.spec)).get(name)
    )
    return {
        "name": name,
        "id": str(node_id) if node_id is not None else None,
        "protocol": nspec.protocol if nspec is not None else leaf.protocol,
        "server": server_text(nspec.host, nspec.port) if nspec is not None and nspec.host else None,
        "subscription": (nspec.subscription or None) if nspec is not None else None,
        "udp": bool(leaf.supports_udp),
        "demoted": node_id is not None and alive.demoted(node_id),
        "health": health_view(alive, node_id),
        "latency": latency_view(alive, node_id),
    }


def node_alive(alive: AliveDialerSet, node_id: uuid.UUID, family: Family) -> bool:
    """A node counts as alive unless its TCP state in its health family ``family`` (the family
    its server is reached on, the one it is probed and judged in: GH-D-07, GH-K-01) is dead;
    unknown counts as alive, as everywhere in health."""
    if node_id not in alive:
        return True
    return alive.tcp_alive(node_id, family)


def node_counts(plane: Plane, alive: AliveDialerSet) -> JSON:
    """Proxy nodes (outbounds with a NodeId) in total and alive."""
    families = {
        node_id: health_family_of(leaf)
        for leaf in plane.outbounds.values()
        if (node_id := node_id_of(leaf)) is not None
    }
    return {
        "total": len(families),
        "alive": sum(1 for node_id, family in families.items() if node_alive(alive, node_id, family)),
    }


# --- connections, diagnostics ---------------------------------------------------------------


def conn_view(info: ConnectionInfo) -> JSON:
    return {
        "id": info.id,
        "network": info.network.value,
        "inbound": info.inbound,
        "source": str(info.source),
        "target": str(info.target),
        "rule": info.rule,
        "chain": list(info.chain),
        "upload": info.upload,
        "download": info.download,
        "start": rfc3339(info.start),
        "engine": info.engine,
        "outbound_version": info.outbound_version,  # the leaf version it was opened on (tag@vN)
        "user": info.user,
    }


def flows_through_group(flows: Iterable[ConnectionInfo], group: str) -> list[ConnectionInfo]:
    """Flows whose chain passes through ``group`` (the leaf at the end is never a group)."""
    return [info for info in flows if group in info.chain[:-1]]


def flows_on_node(flows: Iterable[ConnectionInfo], node: str) -> list[ConnectionInfo]:
    """Flows whose leaf is ``node``."""
    return [info for info in flows if info.chain and info.chain[-1] == node]


def diag_view(diagnostic: Diagnostic) -> JSON:
    """A loader finding; the loader records lines only, so ``column`` is null until it records more."""
    loc = diagnostic.loc
    column = getattr(loc, "column", 0)
    return {
        "severity": diagnostic.severity.value,
        "code": diagnostic.code,
        "key_path": diagnostic.key_path,
        "line": loc.line or None,
        "column": column or None,
        "message": diagnostic.message,
    }


# --- Score ---------------------------------------------------------------------------------


def score_view(plane: Plane) -> JSON:
    """``/stats.score`` (GH-K-130): the running manager lineage's Score counters and evidence
    cache totals, as :meth:`ScoreState.stats` builds them: fixed reason, candidate, switch and
    budget fields per (group, network), never a node, target or cell identity."""
    return plane.groups.score.stats()


# --- version and status ---------------------------------------------------------------------


def version_view(version: str, pid: int, started_wall: float, uptime: float) -> JSON:
    return {
        "version": version,
        "api": API_VERSION,
        "pid": pid,
        "started_at": rfc3339(started_wall),
        "uptime_s": round(uptime, DELAY_DECIMALS),
    }


def status_view(
    *,
    version: str,
    uptime: float,
    generation: int,
    mode: str,
    plane: Plane,
    alive: AliveDialerSet,
    flows: Iterable[ConnectionInfo],
    totals: tuple[int, int],
    address: str | None,
) -> JSON:
    by_network = {net.value: 0 for net in NETWORKS}
    for info in flows:
        by_network[info.network.value] += 1
    up, down = totals
    return {
        "version": version,
        "uptime_s": round(uptime, DELAY_DECIMALS),
        "generation": generation,
        "mode": mode,
        "connections": by_network,
        "traffic": {"up": up, "down": down},
        "nodes": node_counts(plane, alive),
        "groups": len(plane.groups.names),
        "api": {"address": address},
    }
