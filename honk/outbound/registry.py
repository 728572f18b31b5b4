"""Build the leaf outbounds of a Spec, keyed by name, and own their runtimes.

Leaf protocols register a factory by protocol name; a declared node whose
protocol has no factory yet becomes an :class:`UnsupportedOutbound`, so groups
and rules can still name it and dialing it fails with ``NotSupported``.

Every proxy leaf gets the :class:`~honk.outbound.runtime.NodeRuntime` of its
NodeId: the one passed in ``runtimes`` (from the plane being replaced) when
the node is unchanged, else a new one. Identity is the NodeId alone, which
covers everything that decides how the node is dialled; a rename keeps it.

A proxy leaf reaches its server through its ``connector`` (a DirectOutbound); when
dae's ``node()``/``subnode()`` DNS rules pick an upstream for the node, the applier
passes that upstream's resolver (:mod:`honk.dns.own`) and the connector resolves the
server name through it instead of the system resolver.
"""

from __future__ import annotations

import importlib
import logging
import uuid
from collections.abc import Callable, Mapping

from honk.config.spec import BUILTIN_OUTBOUNDS, GlobalSpec, NodeSpec, Spec
from honk.core.clock import Clock
from honk.outbound.base import Outbound
from honk.outbound.block import BlockOutbound
from honk.outbound.direct import DirectOutbound
from honk.outbound.runtime import NodeRuntime
from honk.outbound.unsupported import UnsupportedOutbound
from honk.route.resolve import Resolver

log = logging.getLogger(__name__)

OutboundFactory = Callable[[NodeSpec, GlobalSpec, Clock], Outbound]

_FACTORIES: dict[str, OutboundFactory] = {}


def register_protocol(protocol: str, factory: OutboundFactory) -> None:
    """Make nodes of ``protocol`` dialable through ``factory``. Raises ValueError if taken."""
    if protocol in _FACTORIES:
        raise ValueError(f"outbound protocol {protocol!r} registered twice")
    _FACTORIES[protocol] = factory


def registered_protocols() -> tuple[str, ...]:
    return tuple(_FACTORIES)


register_protocol(
    "direct", lambda node, glob, clock: DirectOutbound(clock, glob.connect_timeout, name=node.name)
)
register_protocol("block", lambda node, glob, clock: BlockOutbound(name=node.name))


def _on_first_use(module: str, name: str) -> OutboundFactory:
    """A factory that imports its leaf module when a node of the protocol is first built,
    so a configuration pays only for the protocols it uses (Shadowsocks pulls in
    ``cryptography``, HTTPS the ``ssl`` module)."""

    def build(node: NodeSpec, glob: GlobalSpec, clock: Clock) -> Outbound:
        leaf_class = getattr(importlib.import_module(module), name)
        return leaf_class(node, glob, clock)

    return build


register_protocol("socks5", _on_first_use("honk.outbound.socks5", "Socks5Outbound"))
register_protocol("http", _on_first_use("honk.outbound.http", "HttpOutbound"))
register_protocol("https", _on_first_use("honk.outbound.http", "HttpOutbound"))
register_protocol("ss", _on_first_use("honk.outbound.shadowsocks", "ShadowsocksOutbound"))
register_protocol("trojan", _on_first_use("honk.outbound.trojan", "TrojanOutbound"))
register_protocol("vless", _on_first_use("honk.outbound.vless", "VlessOutbound"))
register_protocol("vmess", _on_first_use("honk.outbound.vmess", "VmessOutbound"))


def build_outbounds(
    spec: Spec, clock: Clock, runtimes: Mapping[uuid.UUID, NodeRuntime] | None = None
) -> tuple[dict[str, Outbound], dict[uuid.UUID, NodeRuntime]]:
    """One leaf per name -- the built-in ``direct`` and ``block`` first, then the
    declared nodes; the first declaration of a name wins -- and the runtimes of
    the proxy leaves by NodeId (reused from ``runtimes`` when present)."""
    previous = runtimes or {}
    used: dict[uuid.UUID, NodeRuntime] = {}
    glob = spec.global_
    outbounds: dict[str, Outbound] = {
        "direct": DirectOutbound(clock, glob.connect_timeout),
        "block": BlockOutbound(),
    }
    for node in spec.nodes:
        if node.name in outbounds:
            if node.name in BUILTIN_OUTBOUNDS:
                log.warning("node %s shadows a built-in outbound and is ignored", node.name)
            else:
                log.warning(
                    "node name %s is declared more than once; the first declaration is used", node.name
                )
            continue
        outbounds[node.name] = build_leaf(node, glob, clock, previous, used)
    return outbounds, used


def build_leaf(
    node: NodeSpec,
    glob: GlobalSpec,
    clock: Clock,
    previous: Mapping[uuid.UUID, NodeRuntime],
    used: dict[uuid.UUID, NodeRuntime],
    resolver: Resolver | None = None,
) -> Outbound:
    """One leaf for ``node``. A proxy leaf gets the runtime of its NodeId: one already in
    ``used`` (this build), else the open one in ``previous``, else a new one; it is
    recorded in ``used``. ``resolver``: what resolves a proxy leaf's server name (None: the
    system resolver). Raises what the protocol's constructor raises."""
    factory = _FACTORIES.get(node.protocol)
    if factory is None:
        return UnsupportedOutbound(node.name, node.protocol)
    leaf = factory(node, glob, clock)
    if resolver is not None and isinstance(getattr(leaf, "connector", None), DirectOutbound):
        leaf.connector = DirectOutbound(
            clock,
            glob.connect_timeout,
            name=node.name,  # type: ignore[attr-defined]
            resolver=resolver,
        )
    if node.protocol not in BUILTIN_OUTBOUNDS:
        runtime = used.get(node.id) or previous.get(node.id)
        if runtime is None or runtime.closed:
            runtime = NodeRuntime(node.id, node.name)
        runtime.name = node.name
        leaf.runtime = used[node.id] = runtime
    return leaf


def retire_runtimes(old: Mapping[uuid.UUID, NodeRuntime], new: Mapping[uuid.UUID, NodeRuntime]) -> int:
    """Retire the runtimes of ``old`` that ``new`` no longer uses (:meth:`NodeRuntime.retire`: idle
    resources close now, flows already on the node run on); returns how many."""
    retired = 0
    for node_id, runtime in old.items():
        if new.get(node_id) is not runtime:
            runtime.retire()
            retired += 1
    return retired
