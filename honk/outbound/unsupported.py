"""A leaf for a node whose protocol has no factory in the registry: every dial is refused.

Every protocol the link parser produces has one today (schemes honk cannot dial are refused
when a configuration or a subscription is read), so this stands in only for a spec built
some other way."""

from __future__ import annotations

from honk.core.errors import NotSupported
from honk.core.net import Address
from honk.outbound.base import Capabilities, DialedStream


class UnsupportedOutbound:
    """Stands in for a declared node so groups and routing can name it; every dial
    raises :class:`NotSupported`."""

    def __init__(self, name: str, protocol: str) -> None:
        self.name = name
        self.protocol = protocol
        self.runtime = None

    @property
    def supports_udp(self) -> bool:
        return False

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(tcp=False, udp=False)

    async def dial_tcp(self, target: Address, deadline: float) -> DialedStream:
        raise NotSupported(
            f"{self.name}: dialing {self.protocol} nodes is not supported by this version of honk"
        )

    def __repr__(self) -> str:
        return f"UnsupportedOutbound(name={self.name!r}, protocol={self.protocol!r})"
