"""The desired state: what the daemon should run, lowered from a :class:`~honk.config.spec.Spec`.

The reconciler never plans on a raw ``Spec``: it plans on this form, where every
resource is a value with a tag, so two desired states compare with ``==`` and one
resource's change is visible without looking at any other:

* ``dns``: the resolver settings (every outbound but the reject kind holds the resolver);
* ``outbounds``: ``direct``, ``block`` and each node (its first declaration), with an
  optional drain override (the node link's ``drain`` parameter) and the DNS upstream
  dae's ``node()``/``subnode()`` rules pick for its server name (so a reload that
  changes that choice, or the chosen upstream, rebuilds the node);
* ``groups``: each group with its *resolved* members, so a node added to a filter's
  reach changes the group even though its declaration did not change;
* ``route``: the rules and the fallback;
* ``user_sets``: one per inbound that has users (tagged like the inbound), one ``api``
  set holding the API secret;
* ``inbounds``: the proxy listeners, the transparent listener ``tproxy`` (made by
  ``global.lan_interface``, with the kernel interception it needs), the DNS listener
  ``dns`` (``dns.bind``) and the API listener, each with its ``BindSpec`` (a listener's
  identity);
* ``policies``: the defaults for drains and user removals.

Fields of the spec that are not resources (log level, health timing, subscriptions)
travel in ``spec`` and take effect at commit without a step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from honk.config.dns import dns_geodata_rules
from honk.config.policies import DEFAULT_DRAIN, DEFAULT_USER_REMOVAL, ClosePolicy
from honk.config.spec import (
    BUILTIN_OUTBOUNDS,
    DEFAULT_CLASH_API_CONTROLLER,
    TPROXY_MARK,
    DnsUpstreamSpec,
    GlobalSpec,
    GroupSpec,
    InboundUser,
    NodeSpec,
    RoutingSpec,
    RuleSpec,
    Spec,
)
from honk.config.validate import DNS_INBOUND, TPROXY_INBOUND
from honk.core.net import parse_host_port
from honk.dns.own import node_upstream
from honk.geo.assets import GeoAssets
from honk.group.manager import cut_cycles
from honk.group.membership import resolve_membership
from honk.route.matchers import geodata_files

API_TAG = "api"  # the Clash API listener's inbound tag and user set
DRAIN_PARAM = "drain"  # a node link's parameter naming its drain policy (not part of the NodeId)
TRANSPARENT_KINDS = frozenset({"tproxy", "redir"})
REJECT_PROTOCOLS = frozenset({"block"})
# the transparent listener takes both families on one port; TPROXY hands it foreign addresses
TPROXY_LISTEN_HOST = "::"


@dataclass(frozen=True, slots=True)
class BindSpec:
    """What a listener is bound to; its identity across applies."""

    kind: str  # "tcp", "udp", "unix", "tun", "tproxy", "redir", "dns"
    host: str = ""
    port: int = 0
    path: str = ""  # unix socket path, tun device name, or a DNS listener's transports (tcp+udp)
    # port 0 asks the kernel for any free port: such binds never clash, so each belongs to its tag
    owner: str = ""

    def __str__(self) -> str:
        if self.kind == "unix":
            return f"unix:{self.path}"
        if self.kind == "tun":
            return f"tun {self.path or 'auto'}"
        address = f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"
        return address if self.kind == "tcp" else f"{self.kind} {address}"


@dataclass(frozen=True, slots=True)
class DnsDecl:
    """The resolver's settings (honk resolves through the system, each lookup bounded)."""

    timeout: float  # seconds


@dataclass(frozen=True, slots=True)
class OutboundDecl:
    tag: str
    node: NodeSpec
    drain: ClosePolicy | None = None  # None: the desired state's default
    own_dns: DnsUpstreamSpec | None = None  # resolves the node's server (None: the system resolver)

    @property
    def uses_dns(self) -> bool:
        """Every outbound but the reject kind resolves names, so it holds the resolver."""
        return self.node.protocol not in REJECT_PROTOCOLS


@dataclass(frozen=True, slots=True)
class GroupDecl:
    tag: str
    spec: GroupSpec
    members: tuple[str, ...]  # resolved: nodes, then nested groups (cycle-closing edges cut)

    @property
    def reaches(self) -> tuple[str, ...]:
        """Every tag a selection of this group may pass to: its members and its final."""
        return (*self.members, self.spec.final) if self.spec.final else self.members


@dataclass(frozen=True, slots=True)
class RouteDecl:
    """The rules, and the geodata they read: where it is looked up and each file's (name, path,
    mtime, size), so that a reload after the data changed rebuilds the router."""

    routing: RoutingSpec
    data_dir: str | None = None
    geodata: tuple[tuple[str, str, int, int], ...] = ()

    @classmethod
    def of(cls, routing: RoutingSpec, data_dir: str | None, also: tuple[RuleSpec, ...] = ()) -> RouteDecl:
        """``also``: other rules reading the same geodata (the DNS rules'), stamped with routing's."""
        return cls(routing, data_dir, GeoAssets(data_dir).stamp(geodata_files((*routing.rules, *also))))

    def geo(self) -> GeoAssets:
        return GeoAssets(self.data_dir)


@dataclass(frozen=True, slots=True)
class UserSetDecl:
    tag: str
    users: tuple[InboundUser, ...]


@dataclass(frozen=True, slots=True)
class InboundDecl:
    """One listener. Equality covers every field: a rename on the same bind is a handler swap."""

    tag: str
    kind: str  # "mixed", "api", "tproxy", "redir", "dns"
    bind: BindSpec
    users: str | None = None  # the user set it admits
    user_removal: ClosePolicy | None = None  # None: the desired state's default
    # the transparent kinds' kernel interception: fwmark, table, interfaces, source ranges
    interception: tuple[tuple[str, object], ...] = ()
    settings: tuple[tuple[str, object], ...] = ()  # kind-specific handler settings (api: external_ui)


@dataclass(frozen=True, slots=True)
class Policies:
    drain: ClosePolicy = DEFAULT_DRAIN
    user_removal: ClosePolicy = DEFAULT_USER_REMOVAL


@dataclass(frozen=True, slots=True)
class DesiredState:
    dns: DnsDecl
    outbounds: tuple[OutboundDecl, ...] = ()
    groups: tuple[GroupDecl, ...] = ()
    route: RouteDecl = RouteDecl(RoutingSpec())
    user_sets: tuple[UserSetDecl, ...] = ()
    inbounds: tuple[InboundDecl, ...] = ()
    policies: Policies = Policies()
    # the whole spec: fields without steps (log level, health timing) take effect at commit
    spec: Spec = field(default=Spec(), compare=False, repr=False)
    # tag -> declaration per kind (the first of a tag), so lookups stay O(1) at thousands of nodes
    _index: dict[str, dict[str, object]] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        for kind, items in (
            ("outbound", self.outbounds),
            ("group", self.groups),
            ("inbound", self.inbounds),
            ("user set", self.user_sets),
        ):
            by_tag: dict[str, object] = {}
            for item in items:
                by_tag.setdefault(item.tag, item)
            self._index[kind] = by_tag

    def outbound(self, tag: str) -> OutboundDecl | None:
        return self._index["outbound"].get(tag)  # type: ignore[return-value]

    def group(self, tag: str) -> GroupDecl | None:
        return self._index["group"].get(tag)  # type: ignore[return-value]

    def inbound(self, tag: str) -> InboundDecl | None:
        return self._index["inbound"].get(tag)  # type: ignore[return-value]

    def user_set(self, tag: str) -> UserSetDecl | None:
        return self._index["user set"].get(tag)  # type: ignore[return-value]


def lower(spec: Spec) -> DesiredState:
    """The desired state ``spec`` asks for. Never fails: the loader validated ``spec``."""
    glob = spec.global_
    outbounds: dict[str, OutboundDecl] = {
        name: OutboundDecl(name, NodeSpec(name=name, protocol=name)) for name in BUILTIN_OUTBOUNDS
    }
    for node in spec.nodes:
        if node.name not in outbounds:  # the first declaration of a name wins
            outbounds[node.name] = OutboundDecl(
                node.name, node, node_drain(node), node_upstream(spec.dns, node)
            )
    groups = _lower_groups(spec)
    user_sets: list[UserSetDecl] = []
    inbounds: list[InboundDecl] = []
    for ispec in spec.inbounds:
        users = None
        if ispec.users:
            user_sets.append(UserSetDecl(ispec.name, tuple(ispec.users)))
            users = ispec.name
        settings = transparent_settings(glob) if ispec.kind in TRANSPARENT_KINDS else ()
        inbounds.append(
            InboundDecl(
                ispec.name, ispec.kind, tcp_bind(ispec.host, ispec.port, ispec.name), users, settings=settings
            )
        )
    if glob.lan_interface or glob.wan_interface:
        inbounds.append(
            InboundDecl(
                TPROXY_INBOUND,
                "tproxy",
                BindSpec("tproxy", TPROXY_LISTEN_HOST, glob.tproxy_port),
                interception=(
                    ("lan_interface", glob.lan_interface),
                    ("tproxy_port", glob.tproxy_port),
                    ("mark", TPROXY_MARK),
                    ("auto_config_kernel_parameter", glob.auto_config_kernel_parameter),
                    ("wan_interface", glob.wan_interface),
                ),
                settings=transparent_settings(glob),
            )
        )
    if spec.dns is not None and spec.dns.bind is not None:
        bind = spec.dns.bind
        transports = "+".join(t for t, on in (("tcp", bind.tcp), ("udp", bind.udp)) if on)
        inbounds.append(
            InboundDecl(
                DNS_INBOUND,
                "dns",
                BindSpec(
                    "dns", bind.host, bind.port, transports, owner=DNS_INBOUND if bind.port == 0 else ""
                ),
            )
        )
    if spec.clash_api is not None:
        api = spec.clash_api
        host, port = parse_host_port(api.external_controller or DEFAULT_CLASH_API_CONTROLLER)
        users = None
        if api.secret:
            user_sets.append(UserSetDecl(API_TAG, (InboundUser(API_TAG, api.secret),)))
            users = API_TAG
        inbounds.append(
            InboundDecl(
                API_TAG,
                "api",
                tcp_bind(host, port, API_TAG),
                users,
                settings=(("external_ui", api.external_ui),),
            )
        )
    return DesiredState(
        dns=DnsDecl(glob.connect_timeout),
        outbounds=tuple(outbounds.values()),
        groups=groups,
        route=RouteDecl.of(spec.routing, glob.data_dir, dns_geodata_rules(spec.dns)),
        user_sets=tuple(user_sets),
        inbounds=tuple(inbounds),
        policies=Policies(glob.drain, glob.user_removal),
        spec=spec,
    )


def transparent_settings(glob: GlobalSpec) -> tuple[tuple[str, object], ...]:
    """What a transparent handler reads of the global section (a change swaps the handler)."""
    return (("dial_mode", glob.dial_mode), ("sniffing_timeout", glob.sniffing_timeout))


def tcp_bind(host: str, port: int, tag: str) -> BindSpec:
    return BindSpec("tcp", host, port, owner=tag if port == 0 else "")


def _lower_groups(spec: Spec) -> tuple[GroupDecl, ...]:
    specs: dict[str, GroupSpec] = {}
    for group in spec.groups:
        specs.setdefault(group.name, group)
    memberships = cut_cycles(
        {name: resolve_membership(g, spec.nodes, set(specs)) for name, g in specs.items()}, quiet=True
    )
    return tuple(GroupDecl(name, g, memberships[name].members) for name, g in specs.items())


def node_drain(node: NodeSpec) -> ClosePolicy | None:
    """The node link's own drain policy, if it names one (validated by the loader)."""
    from honk.config.policies import parse_policy
    from honk.config.values import parse_seconds

    for key, value in node.params:
        if key == DRAIN_PARAM:
            try:
                return parse_policy(value, parse_seconds)
            except ValueError:
                return None
    return None
