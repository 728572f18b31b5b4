"""The Clash API's JSON objects, built from what runs (clash-api.md §3, §4).

Pure functions: they read a plane, the health state and tracker snapshots and
return plain dicts, so they are tested without sockets. Handlers in
:mod:`honk.api.clash` only gather the inputs and send the result.

Naming: honk's builtin outbounds ``direct`` and ``block`` appear as ``DIRECT``
(type ``Direct``) and ``REJECT`` (type ``Reject``), in member lists and chains
too; :func:`honk_name` maps a dashboard's name back, a real name first.

Proxy objects are marshalled by Go in mihomo, so their keys come out sorted;
these views sort them the same way. Nothing here shows a credential: a leaf is
described by its name, protocol, NodeId and health only.
"""

from __future__ import annotations

import datetime
import functools
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from honk.alive.checkurl import DEFAULT_DELAY_URL
from honk.alive.group_checks import GroupChecks
from honk.alive.health import AliveDialerSet, Status
from honk.alive.outcome import Domain, Family
from honk.api.jsonio import dumps
from honk.config.spec import GroupSpec, NodeSpec, Policy, Predicate, RuleSpec, Spec
from honk.connection.flowlog import FlowOpened
from honk.connection.mode import global_members, mode_rule
from honk.connection.plane import Plane
from honk.connection.tracker import ConnectionInfo
from honk.core.logs import LogEvent
from honk.core.net import Network
from honk.core.stats import OutboundCounts, StaggerCounts
from honk.group.filter import health_family_of, node_id_of
from honk.group.manager import GroupManager
from honk.group.policy import Selector
from honk.outbound.base import Outbound
from honk.route.router import EMPTY_RULE_TEXT, FALLBACK_RULE_TEXT, describe_rule
from honk.route.rulestats import NEVER, RuleRow

GLOBAL = "GLOBAL"
CLASH_NAMES = {"direct": "DIRECT", "block": "REJECT"}  # honk builtin -> Clash spelling
HONK_NAMES = {clash: honk for honk, clash in CLASH_NAMES.items()}
HISTORY_LENGTH = 10  # mihomo's defaultHistoriesNum: a proxy shows its last 10 tests
MAX_DELAY_MS = 65535  # delays are uint16 in mihomo's JSON
TIME_TEXT_CACHE = 65536  # formatted history times kept (2,000 nodes x 2 histories x 10 entries, with room)
EXPECTED_ANY = "*"  # expectedStatus when no status filter is configured
MODE_LIST = ["rule", "global", "direct"]  # sing-box's `mode-list`, read by metacubexd and zashboard

# Group policy -> mihomo type string; Score has no Clash equivalent and shows as URLTest
# (clash-api.md §6.2: "Avoid Smart").
GROUP_TYPES = {
    Policy.SELECTOR: "Selector",
    Policy.URLTEST: "URLTest",
    Policy.SCORE: "URLTest",
    Policy.FALLBACK: "Fallback",
    Policy.LOADBALANCE: "LoadBalance",
}
# honk leaf protocol -> mihomo adapter type (MH constant/adapters.go spellings)
LEAF_TYPES = {
    "direct": "Direct",
    "block": "Reject",
    "ss": "Shadowsocks",
    "socks5": "Socks5",
    "http": "Http",
    "https": "Http",
    "vmess": "Vmess",
    "vless": "Vless",
    "trojan": "Trojan",
}
# Policies a Clash PUT may set: a Selector choice, or a URLTest/Fallback pin ("fixed").
PINNABLE = (Policy.URLTEST, Policy.FALLBACK)


# --- names and small values ------------------------------------------------------------------


def clash_name(name: str) -> str:
    """How a dashboard sees an outbound name."""
    return CLASH_NAMES.get(name, name)


def honk_name(name: str, known: Iterable[str] | Mapping[str, Any]) -> str:
    """A dashboard's name as honk's: a real name as is, else DIRECT/REJECT as the builtins."""
    if name in known:
        return name
    return HONK_NAMES.get(name, name)


_ZONES: dict[int, datetime.timezone] = {}  # UTC offset (s) -> zone, so formatting builds none


@functools.lru_cache(maxsize=TIME_TEXT_CACHE)
def rfc3339(wall: float) -> str:
    """Local time with offset and microseconds (mihomo writes RFC 3339 with nanoseconds).

    Cached: a dashboard polls /proxies every few seconds and the same history entries come
    back each time (2,000 nodes × 20 entries)."""
    offset = time.localtime(wall).tm_gmtoff
    zone = _ZONES.get(offset)
    if zone is None:
        zone = _ZONES[offset] = datetime.timezone(datetime.timedelta(seconds=offset))
    return datetime.datetime.fromtimestamp(wall, zone).isoformat(timespec="microseconds")


def delay_ms(seconds: float) -> int:
    """A measured delay in whole milliseconds, 1-65535: 0 means a failure to dashboards."""
    return max(1, min(MAX_DELAY_MS, round(seconds * 1000)))


def history_view(entries: Sequence[tuple[float, float, bool]]) -> list[dict[str, Any]]:
    """The last :data:`HISTORY_LENGTH` ``(wall, delay s, failed)`` entries; a failure is delay 0."""
    return [
        {"time": rfc3339(at), "delay": 0 if failed else delay_ms(value)}
        for at, value, failed in entries[-HISTORY_LENGTH:]
    ]


def _sorted(obj: dict[str, Any]) -> dict[str, Any]:
    return dict(sorted(obj.items()))


# --- the proxies view ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ProxyContext:
    """What the proxy views read: the running plane, node and group health, the GLOBAL choice.

    Make one per request: it caches lookups over the plane (a node's spec by name, the group
    check URLs by member) so a listing of thousands of nodes stays linear."""

    plane: Plane
    alive: AliveDialerSet | None = None
    checks: GroupChecks | None = None
    global_choice: str = "direct"  # the honk name GLOBAL serves
    _cache: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def node_spec(self, name: str) -> NodeSpec | None:
        """The spec of the node serving under ``name`` (the first declaration)."""
        nodes = self._cache.get("nodes")
        if nodes is None:
            nodes = self._cache["nodes"] = {}
            for node in self.spec.nodes:
                nodes.setdefault(node.name, node)
        return nodes.get(name)

    def check_urls(self, member: str) -> list[str]:
        """The check_url of every group that has ``member`` and a check URL that counts."""
        by_member = self._cache.get("check_urls")
        if by_member is None:
            by_member = self._cache["check_urls"] = {}
            if self.checks is not None:
                for group in self.groups.names:
                    url = self.checks.url_of(group)
                    if url:
                        for name in self.groups.members(group):
                            urls = by_member.setdefault(name, [])
                            if url not in urls:
                                urls.append(url)
        return by_member.get(member, [])

    @property
    def groups(self) -> GroupManager:
        return self.plane.groups

    @property
    def spec(self) -> Spec:
        return self.plane.spec

    def group_spec(self, name: str) -> GroupSpec | None:
        return self.spec.group(name)

    def has_synthetic_global(self) -> bool:
        """A configured group named GLOBAL replaces the synthetic one (as in mihomo)."""
        return GLOBAL not in self.groups

    def global_check_url(self) -> str:
        """The global TCP check URL, "" when the TCP probe is a raw connect."""
        urls = self.spec.global_.tcp_check_url
        return urls[0] if urls else ""

    def test_url(self, group: str | None = None) -> str:
        """A group's ``testUrl``: its own check_url, else the global one, else the delay default."""
        spec = self.group_spec(group) if group is not None else None
        if spec is not None and spec.check_url:
            return spec.check_url
        return self.global_check_url() or DEFAULT_DELAY_URL


def _base(name: str, kind: str, *, alive: bool, udp: bool) -> dict[str, Any]:
    """Fields every Clash proxy object has (MH adapter/outbound/base.go)."""
    return {
        "alive": alive,
        "dialer-proxy": "",
        "extra": {},
        "history": [],
        "interface": "",
        "mptcp": False,
        "name": name,
        "routing-mark": 0,
        "smux": False,
        "tfo": False,
        "type": kind,
        "udp": udp,
        "uot": False,
        "xudp": False,
    }


def leaf_type(leaf: Outbound) -> str:
    protocol = getattr(leaf, "protocol", "")
    return LEAF_TYPES.get(protocol, protocol.capitalize() or "Unknown")


def _node_alive(alive: AliveDialerSet | None, node_id: uuid.UUID | None, family: Family) -> bool:
    """A node's ``alive`` as a dashboard counts it (``alive === true`` members of a group).

    The TCP health verdict in the node's health family ``family``, the family its server is
    reached on and the only one it is probed and judged in (GH-D-07, GH-K-01): the state of
    the other family, never recorded, cannot mask a dead one. While there is no verdict (a
    failure in the registration grace or below the death threshold is only history), the
    newest observation decides, as mihomo's ``alive`` follows its last URL test: a probe of
    that family or a delay test of any URL. With none, the node counts as alive. This is
    the view only: a delay test is never health evidence (GH-L-11)."""
    if alive is None or node_id is None:
        return True
    status = alive.status(node_id, Domain.TCP, family)
    if status is not Status.UNKNOWN:
        return status is not Status.DEAD
    newest: tuple[float, float, bool] | None = None
    for entries in (alive.history(node_id, Domain.TCP, family), *alive.url_histories(node_id).values()):
        if entries and (newest is None or entries[-1][0] >= newest[0]):
            newest = entries[-1]
    return newest is None or not newest[2]


def _merged(*histories: Sequence[tuple[float, float, bool]]) -> list[tuple[float, float, bool]]:
    return sorted((entry for history in histories for entry in history), key=lambda entry: entry[0])


def leaf_extra(
    ctx: ProxyContext, name: str, node_id: uuid.UUID | None, family: Family = Family.V4
) -> dict[str, Any]:
    """Per-URL histories (what dashboards read first for a group's ``testUrl``): the node's
    delay tests by URL, the global TCP check's probes (in the node's health family ``family``,
    the one it is probed in), each group check_url it is a member for."""
    if node_id is None:
        return {}
    by_url: dict[str, list[tuple[float, float, bool]]] = {}
    if ctx.alive is not None:
        for url, entries in ctx.alive.url_histories(node_id).items():
            by_url[url] = list(entries)
        check_url = ctx.global_check_url()
        if check_url:
            probes = ctx.alive.history(node_id, Domain.TCP, family)
            if probes:
                by_url[check_url] = _merged(by_url.get(check_url, ()), probes)
    if ctx.checks is not None:
        for url in ctx.check_urls(name):
            checked = ctx.checks.history(name, url)
            if checked:
                by_url[url] = _merged(by_url.get(url, ()), checked)
    out = {}
    for url, entries in by_url.items():
        if not entries:
            continue
        out[url] = {"alive": not entries[-1][2], "history": history_view(entries)}
    return out


def leaf_proxy(ctx: ProxyContext, name: str, leaf: Outbound) -> dict[str, Any]:
    """A leaf (node or builtin) as a Clash Proxy."""
    node_id = node_id_of(leaf)
    family = health_family_of(leaf)
    obj = _base(
        clash_name(name),
        leaf_type(leaf),
        alive=_node_alive(ctx.alive, node_id, family),
        udp=bool(leaf.supports_udp),
    )
    obj["id"] = str(node_id) if node_id is not None else ""
    node = ctx.node_spec(name)
    obj["provider-name"] = node.subscription if node is not None and node.subscription else ""
    if node_id is not None and ctx.alive is not None:
        obj["history"] = history_view(ctx.alive.latency_history(node_id))
    obj["extra"] = leaf_extra(ctx, name, node_id, family)
    return _sorted(obj)


def group_type(spec: GroupSpec | None) -> str:
    return GROUP_TYPES[spec.policy] if spec is not None else "Selector"


def group_now(groups: GroupManager, group: str, chain: tuple[str, ...] | None = None) -> str:
    """The member serving TCP now (honk name): a Selector's effective choice, otherwise the
    member the current TCP selection ``chain`` (read when not given) passes through; ""
    when nothing resolves."""
    policy = groups.policy(group)
    if isinstance(policy, Selector):
        return policy.chosen(Network.TCP) or ""
    if chain is None:
        chain = groups.selection_chain(group, Network.TCP)
    return chain[1] if len(chain) >= 2 else ""


def group_fixed(groups: GroupManager, group: str) -> str:
    """The TCP pin of a URLTest/Fallback group (honk name), "" when automatic."""
    pinned = getattr(groups, "pinned", None)
    if pinned is None:
        return ""
    return pinned(group).get(Network.TCP, "")


def _group_udp(ctx: ProxyContext, group: str) -> bool:
    outbounds = ctx.plane.outbounds
    return any(
        bool(outbounds[leaf].supports_udp)
        for leaf in ctx.groups.leaf_node_names_in_group(group)
        if leaf in outbounds
    )


def group_proxy(ctx: ProxyContext, name: str) -> dict[str, Any]:
    """A configured group as a Clash Proxy with the group additions."""
    spec = ctx.group_spec(name)
    kind = group_type(spec)
    groups = ctx.groups
    chain = groups.selection_chain(name, Network.TCP)
    obj = _base(name, kind, alive=bool(chain), udp=_group_udp(ctx, name))
    obj["all"] = [clash_name(m) for m in groups.members(name)]
    obj["now"] = clash_name(group_now(groups, name, chain))
    obj["testUrl"] = ctx.test_url(name)
    obj["hidden"] = False
    obj["icon"] = ""
    if kind != "Selector":
        obj["expectedStatus"] = EXPECTED_ANY
    if spec is not None and spec.policy in PINNABLE:
        fixed = group_fixed(groups, name)
        obj["fixed"] = clash_name(fixed) if fixed else ""
    return _sorted(obj)


def global_proxy(ctx: ProxyContext) -> dict[str, Any]:
    """The synthetic GLOBAL selector: every group's position in ``all`` is its display order."""
    members = global_members(ctx.plane)
    obj = _base(GLOBAL, "Selector", alive=True, udp=True)
    obj["all"] = [clash_name(m) for m in members]
    obj["now"] = clash_name(ctx.global_choice)
    obj["testUrl"] = ctx.test_url()
    obj["hidden"] = False
    obj["icon"] = ""
    return _sorted(obj)


def proxy(ctx: ProxyContext, name: str) -> dict[str, Any] | None:
    """One proxy by honk name (GLOBAL included), or None; built once per context (a provider
    listing repeats the same members many times)."""
    built = ctx._cache.setdefault("proxies", {})
    if name in built:
        return built[name]
    if name in ctx.groups:
        found: dict[str, Any] | None = group_proxy(ctx, name)
    elif name in ctx.plane.outbounds:
        found = leaf_proxy(ctx, name, ctx.plane.outbounds[name])
    elif name == GLOBAL and ctx.has_synthetic_global():
        found = global_proxy(ctx)
    else:
        found = None
    built[name] = found
    return found


def lookup(ctx: ProxyContext, clash: str) -> str | None:
    """The honk name a dashboard's name refers to (GLOBAL included), or None."""
    outbounds, groups = ctx.plane.outbounds, ctx.groups
    if clash in groups or clash in outbounds:
        return clash
    if clash == GLOBAL and ctx.has_synthetic_global():
        return GLOBAL
    name = HONK_NAMES.get(clash)
    return name if name is not None and name in outbounds else None


def proxy_json(ctx: ProxyContext, name: str) -> str:
    """:func:`proxy` encoded, once per context: listings join these texts (a provider listing
    repeats the same members many times)."""
    encoded = ctx._cache.setdefault("json", {})
    text = encoded.get(name)
    if text is None:
        text = encoded[name] = dumps(proxy(ctx, name))
    return text


def listed(ctx: ProxyContext) -> list[str]:
    """The honk names ``GET /proxies`` lists: every leaf, every group, then GLOBAL; a name a
    group shares with a node once (the entry is the group's, which answers to that name)."""
    names = list(dict.fromkeys([*ctx.plane.outbounds, *ctx.groups.names]))
    return [*names, GLOBAL] if ctx.has_synthetic_global() else names


def proxy_entry(ctx: ProxyContext, name: str) -> str:
    """``"<clash name>":<proxy>``, one member of the ``GET /proxies`` object."""
    return f"{dumps(clash_name(name))}:{proxy_json(ctx, name)}"


PROXIES_HEAD, PROXIES_TAIL = '{"proxies":{', "}}"


def proxies_json(ctx: ProxyContext) -> str:
    """``GET /proxies``: every leaf, every group and GLOBAL, keyed by their Clash names."""
    return PROXIES_HEAD + ",".join(proxy_entry(ctx, name) for name in listed(ctx)) + PROXIES_TAIL


def groups_list(ctx: ProxyContext) -> dict[str, Any]:
    """``GET /group``: the groups only (GLOBAL last)."""
    out = [proxy(ctx, name) for name in ctx.groups.names]
    if ctx.has_synthetic_global():
        out.append(global_proxy(ctx))
    return {"proxies": out}


# --- providers --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProviderInfo:
    """What the views know of one subscription (from the subscription manager)."""

    name: str
    updated_at: float | None = None  # wall-clock seconds of the last accepted body
    # the Subscription-Userinfo header's values: upload, download, total (bytes), expire (unix s)
    usage: Mapping[str, int] | None = None


def _provider_json(
    ctx: ProxyContext, name: str, vehicle: str, members: Iterable[str], test_url: str, **extra: Any
) -> str:
    """A ProxyProvider object, its ``proxies`` joined from the members' encoded texts."""
    head = dumps(
        {
            "expectedStatus": EXPECTED_ANY,
            "name": name,
            "testUrl": test_url,
            "type": "Proxy",
            "vehicleType": vehicle,
            **extra,
        }
    )
    items = ",".join(proxy_json(ctx, m) for m in members if proxy(ctx, m) is not None)
    return head[:-1] + ',"proxies":[' + items + "]}"


def subscription_nodes(plane: Plane, subscription: str) -> list[str]:
    """The leaf names a subscription provides in the running plane (a name another node took
    first is not this subscription's leaf)."""
    out = []
    for node in plane.spec.nodes:
        if node.subscription != subscription:
            continue
        leaf = plane.outbounds.get(node.name)
        if leaf is not None and node_id_of(leaf) == node.id and node.name not in out:
            out.append(node.name)
    return out


def subscription_info(usage: Mapping[str, int]) -> dict[str, int]:
    """mihomo's SubscriptionInfo: capitalised keys, no json tags."""
    keys = {"upload": "Upload", "download": "Download", "total": "Total", "expire": "Expire"}
    return {clash: int(usage.get(key, 0)) for key, clash in keys.items()}


def provider_members(ctx: ProxyContext, subscriptions: Sequence[ProviderInfo]) -> dict[str, list[str]]:
    """Each provider's member names: a provider per subscription, ``default`` with every proxy,
    and a Compatible provider per group (dashboards drop the last two kinds)."""
    out = {info.name: subscription_nodes(ctx.plane, info.name) for info in subscriptions}
    out["default"] = global_members(ctx.plane)
    for name in ctx.groups.names:
        out.setdefault(name, list(ctx.groups.members(name)))  # a subscription of the same name keeps it
    return out


def provider_json(ctx: ProxyContext, subscriptions: Sequence[ProviderInfo], name: str) -> str | None:
    """One provider (see :func:`provider_members`), or None when there is no such provider."""
    members = provider_members(ctx, subscriptions).get(name)
    if members is None:
        return None
    info = next((i for i in subscriptions if i.name == name), None)
    if info is None:
        return _provider_json(
            ctx, name, "Compatible", members, ctx.test_url(name if name in ctx.groups else None)
        )
    extra: dict[str, Any] = {}
    if info.updated_at:
        extra["updatedAt"] = rfc3339(info.updated_at)
    if info.usage:
        extra["subscriptionInfo"] = subscription_info(info.usage)
    return _provider_json(ctx, name, "HTTP", members, ctx.test_url(), **extra)


def provider_entry(ctx: ProxyContext, subscriptions: Sequence[ProviderInfo], name: str) -> str:
    """``"<name>":<provider>``, one member of the ``GET /providers/proxies`` object."""
    return f"{dumps(name)}:{provider_json(ctx, subscriptions, name)}"


PROVIDERS_HEAD, PROVIDERS_TAIL = '{"providers":{', "}}"


def providers_json(ctx: ProxyContext, subscriptions: Sequence[ProviderInfo]) -> str:
    """``GET /providers/proxies``."""
    entries = (provider_entry(ctx, subscriptions, name) for name in provider_members(ctx, subscriptions))
    return PROVIDERS_HEAD + ",".join(entries) + PROVIDERS_TAIL


def provider_leaves(ctx: ProxyContext, provider: str, subscriptions: Sequence[str]) -> list[str] | None:
    """The names a provider's health check measures (members for a group), or None if unknown."""
    if provider in subscriptions:
        return subscription_nodes(ctx.plane, provider)
    if provider == "default":
        return global_members(ctx.plane)
    if provider in ctx.groups:
        return list(ctx.groups.members(provider))
    return None


# --- rules ------------------------------------------------------------------------------------

# honk predicate (and argument kind) -> mihomo rule type
_DOMAIN_TYPES = {
    "": "DomainSuffix",
    "suffix": "DomainSuffix",
    "full": "Domain",
    "keyword": "DomainKeyword",
    "regex": "DomainRegex",
    "geosite": "GeoSite",
}
_PLAIN_TYPES = {
    "dport": "DstPort",
    "sport": "SrcPort",
    "l4proto": "Network",
    "pname": "ProcessName",
    "dscp": "DSCP",
    "ipversion": "IPVersion",
    "mac": "SrcMAC",
}
MATCH = "Match"


def _arg_type(predicate: str, key: str) -> str:
    key = key.strip().lower()
    if predicate == "domain":
        return _DOMAIN_TYPES.get(key, "Domain")
    if predicate == "dip":
        return "GeoIP" if key == "geoip" else "IPCIDR"
    if predicate == "sip":
        return "SrcGeoIP" if key == "geoip" else "SrcIPCIDR"
    return _PLAIN_TYPES.get(predicate, predicate)


def predicate_view(predicate: Predicate) -> tuple[str, str]:
    """(type, payload) of one predicate: its alternatives of one kind share a type and their
    payload is comma-joined; mixed kinds become an OR; a negation a NOT."""
    parts: dict[str, list[str]] = {}
    for arg in predicate.args:
        parts.setdefault(_arg_type(predicate.name, arg.key), []).append(arg.value.strip())
    if len(parts) == 1:
        ((kind, values),) = parts.items()
        view = (kind, ",".join(values))
    else:
        view = ("OR", _logic([(kind, ",".join(values)) for kind, values in parts.items()]))
    if predicate.negated:
        return ("NOT", _logic([view]))
    return view


def _logic(views: Sequence[tuple[str, str]]) -> str:
    """mihomo's logic-rule payload: ``((Type,payload),(Type,payload))``."""
    return "(" + ",".join(f"({kind},{payload})" for kind, payload in views) + ")"


def rule_type(rule: RuleSpec) -> tuple[str, str]:
    """(type, payload) of a rule: one predicate as itself, several as an AND, none as Match."""
    if not rule.predicates:
        return (MATCH, "")
    if len(rule.predicates) == 1:
        return predicate_view(rule.predicates[0])
    return ("AND", _logic([predicate_view(p) for p in rule.predicates]))


# Go's zero time.Time as mihomo marshals it: the hitAt or missAt of a rule never hit or missed
ZERO_TIME = "0001-01-01T00:00:00Z"
_NO_COUNTS = RuleRow(disabled=False, hits=0, hit_at=NEVER, misses=0, miss_at=NEVER)


def rule_time(wall: float) -> str:
    return rfc3339(wall) if wall > NEVER else ZERO_TIME


def rule_extra(row: RuleRow) -> dict[str, Any]:
    """mihomo's per-rule ``extra`` (since v1.19.19): the disabled flag, hits and misses."""
    return {
        "disabled": row.disabled,
        "hitCount": row.hits,
        "hitAt": rule_time(row.hit_at),
        "missCount": row.misses,
        "missAt": rule_time(row.miss_at),
    }


def rules(spec: Spec, counters: Sequence[RuleRow] = ()) -> dict[str, Any]:
    """``GET /rules``: the routing rules in order, then the fallback as a Match rule, each
    with its ``extra`` from ``counters`` (one row per rule, then the fallback's; zeros when the
    rows do not fit the spec's rules)."""
    routing = spec.routing
    if len(counters) != len(routing.rules) + 1:
        counters = [_NO_COUNTS] * (len(routing.rules) + 1)
    out = []
    for index, rule in enumerate(routing.rules):
        kind, payload = rule_type(rule)
        out.append(
            {
                "index": index,
                "type": kind,
                "payload": payload,
                "proxy": clash_name(rule.outbound),
                "size": -1,
                "extra": rule_extra(counters[index]),
            }
        )
    out.append(
        {
            "index": len(out),
            "type": MATCH,
            "payload": "",
            "proxy": clash_name(routing.fallback),
            "size": -1,
            "extra": rule_extra(counters[-1]),
        }
    )
    return {"rules": out}


def rule_changes(body: Any, rules: int) -> dict[int, bool]:
    """``PATCH /rules/disable``'s body (``{"3": true}``: disable rule 3; ``false`` enables it)
    as index -> disabled, for a list of ``rules`` rules; ValueError naming what is wrong: not
    an object, a key that is no decimal index, a value that is not a bool, the fallback's
    index (``rules``, which cannot be disabled) or one past it."""
    if not isinstance(body, dict):
        raise ValueError("the body must be a JSON object of rule index to true (disable) or false (enable)")
    changes: dict[int, bool] = {}
    for key, value in body.items():
        if not (key.isascii() and key.isdigit()):
            raise ValueError(f"rule index {key!r} is not a whole number")
        index = int(key)
        if type(value) is not bool:
            raise ValueError(f"rule {index}: the value must be true (disable) or false (enable)")
        if index == rules:
            raise ValueError(f"rule {index} is the fallback (Match) rule, which cannot be disabled")
        if index > rules:
            raise ValueError(f"no rule {index}: the rules are 0..{rules} (the last is the fallback)")
        changes[index] = value
    return changes


def rule_index(spec: Spec) -> dict[str, tuple[str, str]]:
    """A tracked flow's rule text (the router's description) -> (type, payload)."""
    out = {FALLBACK_RULE_TEXT: (MATCH, ""), EMPTY_RULE_TEXT: (MATCH, "")}
    for rule in spec.routing.rules:
        out.setdefault(describe_rule(rule), rule_type(rule))
    return out


# --- connections ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class InboundInfo:
    """A listener as connection metadata shows it."""

    kind: str  # "mixed", ...
    host: str
    port: int


def connection_view(
    info: ConnectionInfo, rules_by_text: Mapping[str, tuple[str, str]], inbounds: Mapping[str, InboundInfo]
) -> dict[str, Any]:
    """One flow as mihomo's TrackerInfo: chains leaf first (honk's chain runs from the rule's
    target to the leaf), ports as strings, cumulative counters; plus honk's own
    ``outbound_version``, the leaf version (``tag@vN``) the flow was opened on."""
    rule, payload = rules_by_text.get(info.rule, (info.rule, ""))
    inbound = inbounds.get(info.inbound)
    target = info.target
    return {
        "id": info.id,
        "upload": info.upload,
        "download": info.download,
        "start": rfc3339(info.start),
        "chains": [clash_name(name) for name in reversed(info.chain)],
        "rule": rule,
        "rulePayload": payload,
        "outbound_version": info.outbound_version,
        "metadata": {
            "network": info.network.value,
            # sing-box's form "<inbound type>/<tag>": a mixed listener does not say whether the
            # client spoke SOCKS5 or HTTP
            "type": f"{inbound.kind if inbound else 'inbound'}/{info.inbound}",
            "sourceIP": info.source.host,
            "destinationIP": target.host if target.ip is not None else "",
            "sourceGeoIP": None,
            "destinationGeoIP": None,
            "sourceIPASN": "",
            "destinationIPASN": "",
            "sourcePort": str(info.source.port),
            "destinationPort": str(target.port),
            "inboundIP": inbound.host if inbound else "",
            "inboundPort": str(inbound.port if inbound else 0),
            "inboundName": info.inbound,
            "inboundUser": info.user,
            "host": target.host if target.ip is None else "",
            "dnsMode": "normal",
            "uid": 0,
            "process": "",
            "processPath": "",
            "specialProxy": "",
            "specialRules": "",
            "remoteDestination": "",
            "dscp": 0,
            "sniffHost": "",
        },
    }


def connections(
    infos: Iterable[ConnectionInfo],
    totals: tuple[int, int],
    memory: int,
    rules_by_text: Mapping[str, tuple[str, str]],
    inbounds: Mapping[str, InboundInfo],
) -> dict[str, Any]:
    """``GET /connections``: the complete snapshot (dashboards diff successive ones)."""
    up, down = totals
    return {
        "downloadTotal": down,
        "uploadTotal": up,
        "memory": memory,
        "connections": [connection_view(info, rules_by_text, inbounds) for info in infos],
    }


# --- streams' frames --------------------------------------------------------------------------


def traffic(previous: tuple[int, int], current: tuple[int, int], seconds: float) -> dict[str, int]:
    """One /traffic frame: bytes per second over the last ``seconds``, and the totals."""
    up = max(0, current[0] - previous[0])
    down = max(0, current[1] - previous[1])
    scale = 1.0 / seconds if seconds > 0 else 0.0
    return {
        "up": round(up * scale),
        "down": round(down * scale),
        "upTotal": current[0],
        "downTotal": current[1],
    }


def rss_from_statm(text: str, page_size: int) -> int:
    """Resident bytes from /proc/self/statm (its second field, in pages); 0 if unreadable."""
    fields = text.split()
    try:
        return int(fields[1]) * page_size
    except (IndexError, ValueError):
        return 0


def memory(inuse: int) -> dict[str, int]:
    return {"inuse": inuse, "oslimit": 0}


# A flow routed by a mode, bypassing the rules: mihomo writes the mode's outbound alone.
_MODE_USING = {mode_rule("global"): GLOBAL, mode_rule("direct"): CLASH_NAMES["direct"]}


class _FlowRules:
    """The rule index (:func:`rule_index`) of the spec the last flow line named: one spec
    routes every flow until a reload, so it is built once per spec, not per line."""

    spec: Spec | None = None
    index: Mapping[str, tuple[str, str]] = {}


def _flow_rules(spec: Spec | None) -> Mapping[str, tuple[str, str]]:
    if spec is None:
        return {FALLBACK_RULE_TEXT: (MATCH, ""), EMPTY_RULE_TEXT: (MATCH, "")}
    if _FlowRules.spec is not spec:
        _FlowRules.index = rule_index(spec)
        _FlowRules.spec = spec
    return _FlowRules.index


def clash_chain(chain: Sequence[str]) -> str:
    """mihomo's ``Chain.String()``: the rule's target, with the leaf in brackets when they differ
    (honk's chain runs from the rule's target to the leaf)."""
    if not chain:
        return ""
    if len(chain) == 1:
        return clash_name(chain[0])
    return f"{clash_name(chain[0])}[{clash_name(chain[-1])}]"


def flow_log_text(flow: FlowOpened) -> str:
    """A ``flow opened`` line as mihomo writes a connection's (``tunnel.logMetadata``):
    ``[TCP] src --> target match Type(payload) using Group[leaf]``; a mode's flow
    ``… using GLOBAL`` or ``… using DIRECT``."""
    head = f"[{flow.network.value.upper()}] {flow.source} --> {flow.target}"
    using = _MODE_USING.get(flow.rule)
    if using is not None:
        return f"{head} using {using}"
    kind, payload = _flow_rules(flow.spec).get(flow.rule, (flow.rule, ""))
    matched = f"{kind}({payload})" if payload else kind
    return f"{head} match {matched} using {clash_chain(flow.chain)}"


def log_message(event: LogEvent) -> str:
    """An event's payload in a Clash log stream: a flow line in mihomo's shape (the record's
    facts), any other line as honk wrote it."""
    if isinstance(event.flow, FlowOpened):
        return flow_log_text(event.flow)
    return event.message


def log_plain(level: str, message: str) -> dict[str, str]:
    return {"type": level, "payload": message}


def log_structured(wall: float, level: str, message: str) -> dict[str, Any]:
    return {
        "time": datetime.datetime.fromtimestamp(wall).strftime("%H:%M:%S"),
        "level": level,
        "message": message,
        "fields": [],
    }


# --- /configs ---------------------------------------------------------------------------------

LOOPBACK_HOSTS = ("127.0.0.1", "::1", "localhost")
ANY_HOSTS = ("0.0.0.0", "::", "")


def configs(spec: Spec, mode: str, log_level: str, mixed_port: int) -> dict[str, Any]:
    """``GET /configs``: mihomo's General keys that are true of honk (and ``mode-list``)."""
    mixed = next((i for i in spec.inbounds if i.kind == "mixed"), None)
    host = mixed.host if mixed is not None else "127.0.0.1"
    allow_lan = host not in LOOPBACK_HOSTS and not host.startswith("127.")
    return {
        "port": 0,
        "socks-port": 0,
        "redir-port": 0,
        "tproxy-port": 0,
        "mixed-port": mixed_port,
        "allow-lan": allow_lan,
        "bind-address": "*" if host in ANY_HOSTS else host,
        "authentication": [],
        "skip-auth-prefixes": [],
        "lan-allowed-ips": [],
        "lan-disallowed-ips": [],
        "inbound-tfo": False,
        "inbound-mptcp": False,
        "mode": mode.lower(),
        "mode-list": list(MODE_LIST),
        "log-level": log_level,
        "ipv6": True,
        "unified-delay": True,  # a delay test reports the second request's round trip only
        "interface-name": "",
        "routing-mark": 0,
        "sniffing": False,
        "tun": {"enable": False},
    }


# --- /stats -------------------------------------------------------------------------------------


def stats(
    outbounds: Iterable[str],
    dials: Mapping[str, OutboundCounts],
    traffic: Mapping[str, tuple[int, int, int]],
    flows: Iterable[ConnectionInfo],
    score: Mapping[str, Any],
    stagger: Mapping[str, int] | None = None,
    pool: Mapping[str, int] | None = None,
    warm: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """``GET /stats``: upstream honk's userspace snapshot, with the parts honk has so far —
    one row per outbound (connections started and open, bytes each way, failed dials), the
    live flows per network, ``udp.stagger`` (cold UDP preparations, StaggerCounts), ``pool``
    (ready pools: hits, misses, entries), ``warm`` (nodes held by each warm owner, the sessions
    they keep by protocol, startup preconnect's deposits) and ``score`` (``/stats.score``: the
    Score counters and evidence cache totals, GH-K-130)."""
    rows = []
    for name in outbounds:
        counts = dials.get(name)
        up, down, live = traffic.get(name, (0, 0, 0))
        rows.append(
            {
                "name": clash_name(name),
                "totalConns": counts.connections if counts is not None else 0,
                "activeConns": live,
                "upload": up,
                "download": down,
                "errors": counts.errors if counts is not None else 0,
            }
        )
    active = {"tcp": 0, "udp": 0}
    for flow in flows:
        active[flow.network.value] += 1
    return {
        "outbounds": rows,
        "tcp": {"activeFlows": active["tcp"]},
        "udp": {"activeFlows": active["udp"], "stagger": dict(stagger or StaggerCounts().as_dict())},
        "pool": dict(pool or {"readyHits": 0, "readyMisses": 0, "entries": 0}),
        "warm": dict(warm or {"nodes": {"selector": 0, "udp": 0}, "sessions": {}, "preconnected": 0}),
        "score": dict(score),
    }
