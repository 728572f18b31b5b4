"""The validated configuration: immutable, typed, units explicit.

Everything downstream of :mod:`honk.config.load` reads these objects and never
raw text. All durations are ``float`` seconds (the field comments say so);
defaults live here and nowhere else. Source locations are carried for
diagnostics but excluded from equality, so a ``.dae`` file and a ``.toml`` file
that mean the same thing produce equal specs.

Secrets (share-link credentials, inbound passwords, the API secret) are
excluded from ``repr`` so a logged spec never shows them.
"""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass, field

from honk.config.diagnostics import Diagnostic, SourceLoc
from honk.config.policies import DEFAULT_DRAIN, DEFAULT_USER_REMOVAL, ClosePolicy

# --- defaults (upstream honk's global reference) -----------------------------

DEFAULT_TCP_CHECK_URL = "https://www.gstatic.com/generate_204"
DEFAULT_UDP_CHECK_DNS = ("dns.google:53", "8.8.8.8", "2001:4860:4860::8888")
DEFAULT_CHECK_INTERVAL = 30.0  # seconds; global check_interval "30s"
DEFAULT_CHECK_TOLERANCE = 0.050  # seconds; global check_tolerance "50ms"
DEFAULT_CONNECT_TIMEOUT = 3.0  # seconds; connect_timeout_ms 3000 ms stage timeout
DEFAULT_MAX_CONCURRENT_DIALS = 64  # max_concurrent_dials
PRECONNECT_AUTO = -1  # preconnect_node_count: 'auto' (the default): at most 8 nodes; 0 disables
DEFAULT_UDP_WARM_NODE_COUNT = 0  # udp_warm_node_count: the UDP warm set is opt-in
DEFAULT_DATA_DIR = "/var/lib/honk"
DEFAULT_URLTEST_IDLE_TIMEOUT = 1800.0  # seconds; idle_timeout null -> 1800 s
MIN_URLTEST_TOLERANCE = 0.001  # seconds; "effective minimum of 1 ms"
DEFAULT_RELAY_IDLE_TIMEOUT = 300.0  # seconds; relay_idle_timeout_secs 300 s
DEFAULT_UDP_IDLE_TIMEOUT = 60.0  # seconds a UDP association may stay silent
# honk's own key: a relayed TCP flow that sent data and got no byte back within this many
# seconds of its last byte sent failed its node (Score and health), and goes on. Almost every protocol answers its
# first bytes at once (a TLS ServerHello, an SSH banner, an HTTP head); 10 s is several times
# the slowest first answer of a working path over a congested link, and short enough that a
# node that swallows flows is left within one default health-check interval. 0 turns it off.
DEFAULT_RESPONSE_TIMEOUT = 10.0
# honk's own key: a TCP flow one of whose directions has ended (a FIN forwarded) is closed once
# no byte has moved either way for this many seconds, so a server (or client) that holds its side
# open after the other side finished cannot pin two descriptors until the 300 s idle timeout.
# 10 s is twice the 5 s v2ray gives a downlink after its uplink ended: a slow last answer after
# a client's FIN (an HTTP/1.0 request, `nc -N`) still arrives. 0 turns it off.
DEFAULT_HALF_CLOSE_TIMEOUT = 10.0
DEFAULT_SHUTDOWN_GRACE = 5.0  # seconds live flows get on SIGTERM before they are closed
DEFAULT_CLASH_API_CONTROLLER = "127.0.0.1:9090"
MAX_TOP_LEVEL_GROUPS = 250  # "at most 250 top-level user groups"
DEFAULT_SUBSCRIPTION_INTERVAL = 86400.0  # seconds; subscription `interval` "86400s"
DEFAULT_TPROXY_PORT = 12345  # global tproxy_port "12345"
TPROXY_MARK = 0x08000000  # tproxy_mark: "fixed fwmark shared by userspace policy routing and the datapath"
DEFAULT_DIAL_MODE = "domain"  # global dial_mode "domain"
DIAL_MODES = ("ip", "domain", "domain+", "domain++")
DEFAULT_SNIFFING_TIMEOUT = 0.030  # seconds; global sniffing_timeout "30ms"

DIRECT_OUTBOUND = "direct"  # the built-in direct outbound's name
BUILTIN_OUTBOUNDS = (DIRECT_OUTBOUND, "block")

LOG_LEVELS = ("trace", "debug", "info", "warn", "warning", "error", "silent")


class Policy(enum.Enum):
    """Canonical group policies. Spellings accepted by the dialect map onto these."""

    SELECTOR = "selector"
    URLTEST = "urltest"
    LOADBALANCE = "loadbalance"
    FALLBACK = "fallback"
    SCORE = "score"


# Accepted spellings (upstream groups reference); matching is ASCII
# case-insensitive after removing one parenthesised suffix, so `fixed(0)` works.
POLICY_SPELLINGS: dict[str, Policy] = {
    "selector": Policy.SELECTOR,
    "select": Policy.SELECTOR,
    "fixed": Policy.SELECTOR,
    "urltest": Policy.URLTEST,
    "min_moving_avg": Policy.URLTEST,
    "min_avg10": Policy.URLTEST,
    "min": Policy.URLTEST,  # dae's DialerSelectionPolicy_MinLastLatency
    "min_last_latency": Policy.URLTEST,
    "min_last_delay": Policy.URLTEST,
    "random": Policy.LOADBALANCE,  # shown as mihomo's LoadBalance: no Clash type is closer
    "loadbalance": Policy.LOADBALANCE,
    "roundrobin": Policy.LOADBALANCE,
    "round_robin": Policy.LOADBALANCE,
    "balance": Policy.LOADBALANCE,
    "fallback": Policy.FALLBACK,
    "score": Policy.SCORE,
}

# How a spelling refines its policy (GroupSpec.strategy). URLTest ranks by the halving moving
# average ("", dae's min_moving_avg), the newest sample (RANK_LAST, dae's min) or the mean of the
# newest 10 samples (RANK_AVG10, dae's min_avg10); a LoadBalance goes round robin ("") or draws
# uniformly among its eligible members per selection (PICK_RANDOM, dae's random).
RANK_LAST = "last"
RANK_AVG10 = "avg10"
PICK_RANDOM = "random"
POLICY_STRATEGIES: dict[str, str] = {
    "min": RANK_LAST,
    "min_last_latency": RANK_LAST,
    "min_last_delay": RANK_LAST,
    "min_avg10": RANK_AVG10,
    "random": PICK_RANDOM,
}


# --- global --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GlobalSpec:
    log_level: str = "info"
    tcp_check_url: tuple[str, ...] = (DEFAULT_TCP_CHECK_URL,)
    tcp_check_http_method: str = "HEAD"
    udp_check_dns: tuple[str, ...] = DEFAULT_UDP_CHECK_DNS
    check_interval: float = DEFAULT_CHECK_INTERVAL  # seconds, > 0
    check_tolerance: float = DEFAULT_CHECK_TOLERANCE  # seconds
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT  # seconds, per dial stage
    max_concurrent_dials: int = DEFAULT_MAX_CONCURRENT_DIALS
    preconnect_node_count: int = PRECONNECT_AUTO  # startup preconnect: PRECONNECT_AUTO, 0 (off) or N
    udp_warm_node_count: int = DEFAULT_UDP_WARM_NODE_COUNT
    data_dir: str = DEFAULT_DATA_DIR
    relay_idle_timeout: float = DEFAULT_RELAY_IDLE_TIMEOUT  # seconds
    udp_idle_timeout: float = DEFAULT_UDP_IDLE_TIMEOUT  # seconds
    response_timeout: float = DEFAULT_RESPONSE_TIMEOUT  # seconds from the last byte sent; 0: off
    half_close_timeout: float = DEFAULT_HALF_CLOSE_TIMEOUT  # seconds silent after one direction ended; 0: off
    shutdown_grace: float = DEFAULT_SHUTDOWN_GRACE  # seconds
    store_subscribe: bool = True  # keep each subscription's last accepted body for offline starts
    # what a reload does to live flows of a node it replaced or removed (a node link's
    # `drain` parameter overrides it): keep them, close them, or close them after a grace
    drain: ClosePolicy = DEFAULT_DRAIN
    # what a reload does to live sessions of an inbound user it removed or re-keyed
    user_removal: ClosePolicy = DEFAULT_USER_REMOVAL
    # the router: interfaces whose forwarded (LAN) or host-originated (WAN) traffic honk
    # intercepts (empty: none), the transparent port, and how sniffed domains are used
    lan_interface: tuple[str, ...] = ()
    wan_interface: tuple[str, ...] = ()
    tproxy_port: int = DEFAULT_TPROXY_PORT
    so_mark_from_dae: int = 0
    auto_config_kernel_parameter: bool = False
    dial_mode: str = DEFAULT_DIAL_MODE
    sniffing_timeout: float = DEFAULT_SNIFFING_TIMEOUT  # seconds


# --- inbounds --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class InboundUser:
    username: str
    password: str = field(repr=False)


@dataclass(frozen=True, slots=True)
class InboundSpec:
    """One listener, from ``inbound { name: 'mixed://[user:pass@]host:port' }``."""

    name: str
    kind: str  # "mixed" for now; later: "tproxy", "redirect", "socks5", "http"
    host: str  # listen address, unbracketed
    port: int
    users: tuple[InboundUser, ...] = ()
    # ``?allow_unauthenticated=true``: a listener without users on a non-loopback address is an
    # open proxy, refused unless the URL says so
    allow_unauthenticated: bool = False
    loc: SourceLoc = field(default=SourceLoc(), compare=False, repr=False)


# --- nodes -----------------------------------------------------------------------

# Namespace for node identity; UUID v5 over "protocol|host|port|credentials|shape".
NODE_ID_NAMESPACE = uuid.UUID("6f1d3a52-8b4e-5c1a-9d2f-3e7b0c4a1f90")


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """A dialable outbound declared by a share link.

    ``params`` keeps the link's query parameters in order. ``id`` is the stable
    content identity (see :func:`honk.config.links.derive_node_id`); the
    display ``name`` is metadata and does not take part in it.
    """

    name: str
    protocol: str  # "direct", "block", "socks5", ...
    host: str = ""
    port: int = 0
    username: str | None = field(default=None, repr=False)
    password: str | None = field(default=None, repr=False)
    params: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    encryption: str | None = None  # the Shadowsocks or VMess cipher (lowercase), None for other protocols
    id: uuid.UUID = field(default=uuid.UUID(int=0))
    # tag of the subscription that provided the node ('' for nodes declared in the config);
    # subtag(...) filters read it. Not part of the identity.
    subscription: str = field(default="", compare=False)
    loc: SourceLoc = field(default=SourceLoc(), compare=False, repr=False)
    # the share link as written (credentials included: never shown); DNS node(link_keyword: ...)
    link: str = field(default="", compare=False, repr=False)


# --- subscriptions ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SubscriptionSpec:
    """A remote node list from ``subscription { ... }``.

    ``name`` is the tag ``subtag(...)`` filters match (a tagless dae entry is
    named after its URL host). The URL often carries an access token, so it is
    kept out of ``repr``.
    """

    name: str
    url: str = field(repr=False)
    user_agent: str | None = None  # None: requests identify as honk/<version>
    interval: float = DEFAULT_SUBSCRIPTION_INTERVAL  # seconds between refreshes; 0 disables refreshing
    cache: bool = True  # keep the last accepted body in the state db (with global.store_subscribe)
    # the node or group downloads go through (a name declared in the file); None: direct
    detour: str | None = None
    loc: SourceLoc = field(default=SourceLoc(), compare=False, repr=False)

    @property
    def fetch_identity(self) -> tuple[str, str]:
        """What makes two declarations the same remote source: URL and configured User-Agent."""
        return (self.url, self.user_agent or "")


# --- groups ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MatchArg:
    """One argument of a matcher call: ``key`` is '' for a bare value, else the
    prefix the dialect recognises (``suffix``, ``full``, ``keyword``, ``regex``,
    ``geosite``, ``geoip``)."""

    key: str
    value: str


@dataclass(frozen=True, slots=True)
class FilterTerm:
    """``name(...)`` or ``subtag(...)``, possibly negated; arguments are alternatives."""

    kind: str  # "name" | "subtag"
    args: tuple[MatchArg, ...]
    negated: bool = False


@dataclass(frozen=True, slots=True)
class NodeFilter:
    """One ``filter:`` line of node predicates joined by ``&&`` (AND); lines are OR-ed."""

    terms: tuple[FilterTerm, ...]
    # dae's ``[add_latency: d]`` annotation: seconds added to the ranking latency of the nodes
    # this line selects (negative favours them); a node takes the first line that selects it
    add_latency: float = 0.0


def name_filter(*names: str) -> NodeFilter:
    """The filter line ``name(a, b, ...)``: the nodes with exactly these names."""
    return NodeFilter((FilterTerm("name", tuple(MatchArg("", name) for name in names)),))


@dataclass(frozen=True, slots=True)
class GroupSpec:
    name: str
    policy: Policy = Policy.SELECTOR
    filters: tuple[NodeFilter, ...] = ()  # node filters, OR-ed
    subgroups: tuple[str, ...] = ()  # nested group tags from group(...)
    has_filter_lines: bool = False  # any filter line at all (explicit group() selects none)
    default: str | None = None
    final: str | None = None
    check_url: str | None = None
    check_interval: float | None = None  # seconds; the check_url probes' own interval (None: global)
    tolerance: float = DEFAULT_CHECK_TOLERANCE  # seconds; URLTest switch threshold
    idle_timeout: float | None = None  # seconds; None -> DEFAULT_URLTEST_IDLE_TIMEOUT
    interrupt_connections: bool = False  # a selection change closes the flows it served
    id: uuid.UUID | None = None  # structured-only; None -> generated at runtime
    strategy: str = ""  # POLICY_STRATEGIES: the ranking or draw a spelling refines the policy with
    fixed_index: int | None = None  # fixed(N): a Selector's default is its N-th member (0-based)
    loc: SourceLoc = field(default=SourceLoc(), compare=False, repr=False)


# --- routing ---------------------------------------------------------------------


TRAFFIC_PREDICATES = (
    "domain",
    "dip",
    "sip",
    "dport",
    "sport",
    "l4proto",
    "ipversion",
    "pname",
    "mac",
    "dscp",
)


@dataclass(frozen=True, slots=True)
class Predicate:
    """One matcher call in a rule; its arguments are alternatives."""

    name: str  # one of TRAFFIC_PREDICATES
    args: tuple[MatchArg, ...]
    negated: bool = False


@dataclass(frozen=True, slots=True)
class RuleSpec:
    """``p1 && p2 && !p3 -> outbound[(must)]``; all predicates must hold.

    ``outbound`` ``"must_rules"`` (dae's ``-> must_rules``) names no outbound: it means "do
    not hijack this traffic's DNS and continue matching the following rules", so the router
    never ends its search at such a rule; every later decision for that flow is ``must``.
    ``mark`` is dae's per-rule ``-> direct(mark: 0x800)``: the direct dial's socket mark (the
    loader refuses it on any other outbound).
    """

    predicates: tuple[Predicate, ...]
    outbound: str
    must: bool = False
    loc: SourceLoc = field(default=SourceLoc(), compare=False, repr=False)
    mark: int | None = None  # dae's -> x(mark: N) fwmark; None: none written


@dataclass(frozen=True, slots=True)
class RoutingSpec:
    rules: tuple[RuleSpec, ...] = ()
    fallback: str = "direct"
    fallback_must: bool = False  # dae's ``fallback: must_<name>``: the fallback decision is a must one
    fallback_mark: int | None = None  # ``fallback: direct(mark: N)``: the direct dial's socket mark


# --- dns -------------------------------------------------------------------------

# upstream honk's DNS reference: the built-in upstream, the cache defaults
DEFAULT_DNS_UPSTREAM = "default"  # the built-in upstream's name, and the request fallback
DEFAULT_DNS_UPSTREAM_HOST = "223.5.5.5"  # default: 'udp://223.5.5.5:53'
DNS_PORT = 53  # an upstream URI's default port
DEFAULT_DNS_CACHE_TTL = 600  # seconds; optimistic_cache_ttl
DEFAULT_DNS_CACHE_SIZE = 10000  # entries; max_cache_size
DNS_REQUEST_BUILTINS = ("reject", "asis")  # request actions that are not upstream names
DNS_RESPONSE_ACTIONS = ("accept", "reject")  # response actions that are not upstream names
DNS_QTYPE_ANY = -1  # qtype(*): every QTYPE
# dae's DNS conditions: what each side of dns.routing may test (request: the query and its
# client; response: the query, the upstream that answered and the answer's addresses)
DNS_REQUEST_CONDITIONS = ("qname", "qtype", "sip")
DNS_RESPONSE_CONDITIONS = ("qname", "qtype", "upstream", "ip")


@dataclass(frozen=True, slots=True)
class DnsBindSpec:
    """The standalone listener: ``bind: 'tcp+udp://host:port'`` and the other documented forms."""

    host: str  # unbracketed IP literal or hostname; '' is the wildcard
    port: int  # 0 asks for an ephemeral port
    udp: bool = True
    tcp: bool = False
    loc: SourceLoc = field(default=SourceLoc(), compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class DnsUpstreamSpec:
    """One ``upstream { name: 'uri' [-> tag] }`` entry."""

    name: str
    protocol: str  # "udp" (TCP retry when TC is set) or "tcp"
    host: str  # unbracketed IP literal or hostname
    port: int = DNS_PORT
    outbound: str | None = None  # the forced node or group; None: routed like any flow to host:port
    loc: SourceLoc = field(default=SourceLoc(), compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class DnsCondition:
    """``[!]kind(...)``; its arguments are alternatives.

    ``qname``: ``names`` keyed as routing's ``domain(...)`` keys them ('' or ``suffix`` for a
    suffix, ``full``, ``keyword``, ``regex``, ``geosite``, ``ext``). ``qtype``: ``qtypes``.
    ``sip`` (request) and ``ip`` (response, any answer address): ``ips`` keyed as routing's
    ``dip(...)`` ('' for an address or CIDR, ``geoip``, ``ext``). ``upstream`` (response):
    ``upstreams``, the names of the upstreams whose answer it matches.
    """

    kind: str  # "qname" | "qtype" | "sip" | "ip" | "upstream"
    names: tuple[MatchArg, ...] = ()
    qtypes: tuple[int, ...] = ()  # numeric QTYPEs; DNS_QTYPE_ANY for '*'
    negated: bool = False
    ips: tuple[MatchArg, ...] = ()
    upstreams: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class DnsRequestRule:
    """``cond && cond -> action``: all conditions must hold; the action is reject, asis or an upstream."""

    conditions: tuple[DnsCondition, ...]
    action: str
    loc: SourceLoc = field(default=SourceLoc(), compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class DnsResponseRule:
    """``cond && cond -> action`` run on an upstream's answer: ``accept`` it, ``reject`` it (an
    empty NOERROR reply), or an upstream name: ask that upstream and run the rules on its answer."""

    conditions: tuple[DnsCondition, ...]
    action: str
    loc: SourceLoc = field(default=SourceLoc(), compare=False, repr=False)


# dae's selectors of its own lookups (docs/en/configuration/dns.md; component/daedns/router.go):
# the keys each takes ('' is the bare form), and the key a bare argument or an alias is stored as
DNS_OWN_KEYS = {
    "sub": {
        "": "tag",
        "tag": "tag",
        "tag_regex": "tag_regex",
        "regex": "tag_regex",
        "link_keyword": "link_keyword",
        "link_regex": "link_regex",
    },
    "node": {
        "": "name",
        "name": "name",
        "name_keyword": "name_keyword",
        "name_regex": "name_regex",
        "link_keyword": "link_keyword",
        "link_regex": "link_regex",
    },
    "subnode": {
        "": "subtag",
        "subtag": "subtag",
        "subtag_regex": "subtag_regex",
        "regex": "subtag_regex",
        "name": "name",
        "name_keyword": "name_keyword",
        "name_regex": "name_regex",
        "link_keyword": "link_keyword",
        "link_regex": "link_regex",
    },
}


@dataclass(frozen=True, slots=True)
class DnsOwnCall:
    """One ``[!]sub(...)``/``node(...)``/``subnode(...)`` term. Its arguments are alternatives
    (dae ORs them, across keys too); no argument matches every subscription or node (for
    ``subnode``: every node that came from a subscription)."""

    args: tuple[MatchArg, ...] = ()  # keyed by the canonical key of DNS_OWN_KEYS
    negated: bool = False


@dataclass(frozen=True, slots=True)
class DnsOwnRule:
    """``sub(...) [&& sub(...)] -> upstream`` (or ``node``/``subnode``): which upstream resolves
    the daemon's own lookup of a subscription's or a node's host. All calls must match."""

    selector: str  # "sub" | "node" | "subnode"
    calls: tuple[DnsOwnCall, ...]
    upstream: str  # a declared upstream's name
    loc: SourceLoc = field(default=SourceLoc(), compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class DnsSpec:
    """The ``dns { ... }`` section. Present (even empty) means honk answers DNS."""

    bind: DnsBindSpec | None = None
    upstreams: tuple[DnsUpstreamSpec, ...] = (
        DnsUpstreamSpec(DEFAULT_DNS_UPSTREAM, "udp", DEFAULT_DNS_UPSTREAM_HOST),
    )
    request_rules: tuple[DnsRequestRule, ...] = ()
    request_fallback: str = DEFAULT_DNS_UPSTREAM  # reject, asis or an upstream name
    response_rules: tuple[DnsResponseRule, ...] = ()
    response_fallback: str = "accept"  # accept, reject or an upstream name (ask it instead)
    # dae's ipversion_prefer: 4 or 6; the other family's A/AAAA answer is emptied when the
    # name is known to have addresses of this one. None: both families answered as asked
    ipversion_prefer: int | None = None
    optimistic_cache: bool = True
    optimistic_cache_ttl: int = DEFAULT_DNS_CACHE_TTL  # seconds; 0 keeps the answer's own TTL
    max_cache_size: int = DEFAULT_DNS_CACHE_SIZE  # entries, >= 1
    fixed_domain_ttl: tuple[tuple[str, int], ...] = ()  # (exact name, seconds); 0: never cache it
    # dae's sub()/node()/subnode() request rules, in source order (honk.dns.own reads them)
    own_rules: tuple[DnsOwnRule, ...] = ()
    loc: SourceLoc = field(default=SourceLoc(), compare=False, repr=False)

    def upstream(self, name: str) -> DnsUpstreamSpec | None:
        return next((u for u in self.upstreams if u.name == name), None)


# --- experimental ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClashApiSpec:
    # "host:port" or "[v6]:port" the API listens on; the block's presence enables the API
    external_controller: str = DEFAULT_CLASH_API_CONTROLLER
    external_ui: str = ""
    secret: str = field(default="", repr=False)
    default_mode: str = "Rule"
    # a controller on a non-loopback address may run without a secret only when the file says so
    allow_unauthenticated: bool = False


# --- assets ----------------------------------------------------------------------

ASSET_ROUTE_ROUTING = "routing"  # assets route: follow the routing rules (upstream's default)
ASSET_ROUTE_DIRECT = "direct"  # assets route: connect directly


@dataclass(frozen=True, slots=True)
class GeodataSpec:
    """``assets { geodata { ... } }``: where ``honkctl geodata update`` downloads the files.

    A URL (None: not configured) may hold a token, so it is kept out of ``repr``. ``route`` is
    the effective route: ``geodata.route``, else ``assets.route``, else ``routing``; otherwise the
    name of a node or group declared in the file.
    """

    geosite: str | None = field(default=None, repr=False)
    geoip: str | None = field(default=None, repr=False)
    route: str = ASSET_ROUTE_ROUTING

    def url(self, name: str) -> str | None:
        """The configured URL of asset ``name`` (``geosite`` or ``geoip``)."""
        return self.geosite if name == "geosite" else self.geoip if name == "geoip" else None


@dataclass(frozen=True, slots=True)
class AssetsSpec:
    """The ``assets`` section (upstream honk's assets reference)."""

    route: str = ASSET_ROUTE_ROUTING  # the default route of the downloads the section configures
    geodata: GeodataSpec = GeodataSpec()


# --- the whole -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Spec:
    """A validated configuration. ``diagnostics`` (warnings, infos) is excluded
    from equality; an invalid input never becomes a ``Spec``."""

    global_: GlobalSpec = GlobalSpec()
    inbounds: tuple[InboundSpec, ...] = ()
    nodes: tuple[NodeSpec, ...] = ()
    groups: tuple[GroupSpec, ...] = ()
    routing: RoutingSpec = RoutingSpec()
    clash_api: ClashApiSpec | None = None
    subscriptions: tuple[SubscriptionSpec, ...] = ()
    dns: DnsSpec | None = None  # None: no dns section
    assets: AssetsSpec = AssetsSpec()
    source: str = field(default="", compare=False)
    diagnostics: tuple[Diagnostic, ...] = field(default=(), compare=False, repr=False)

    def node(self, name: str) -> NodeSpec | None:
        """The first declared node with this name (names may collide; ids may not)."""
        return next((n for n in self.nodes if n.name == name), None)

    def group(self, name: str) -> GroupSpec | None:
        return next((g for g in self.groups if g.name == name), None)

    def outbound_names(self) -> set[str]:
        """Every name a rule or a group may point at."""
        return set(BUILTIN_OUTBOUNDS) | {n.name for n in self.nodes} | {g.name for g in self.groups}
