"""Build the leaf outbounds of a Spec, keyed by name.

Leaf protocols register a factory by protocol name; a declared node whose
protocol has no factory yet becomes an :class:`UnsupportedOutbound`, so groups
and rules can still name it and dialing it fails with ``NotSupported``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from honk.config.spec import BUILTIN_OUTBOUNDS, GlobalSpec, NodeSpec, Spec
from honk.core.clock import Clock
from honk.outbound.base import Outbound
from honk.outbound.block import BlockOutbound
from honk.outbound.direct import DirectOutbound
from honk.outbound.unsupported import UnsupportedOutbound

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


def build_outbounds(spec: Spec, clock: Clock) -> dict[str, Outbound]:
    """One leaf per name: the built-in ``direct`` and ``block`` first, then the
    declared nodes; the first declaration of a name wins."""
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
        factory = _FACTORIES.get(node.protocol)
        if factory is None:
            outbounds[node.name] = UnsupportedOutbound(node.name, node.protocol)
        else:
            outbounds[node.name] = factory(node, glob, clock)
    return outbounds
