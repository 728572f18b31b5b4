"""The built-in ``block`` outbound: every dial is refused at once."""

from __future__ import annotations

from honk.core.errors import Blocked
from honk.core.net import Address
from honk.outbound.base import Capabilities, DialedStream


class BlockOutbound:
    """Refuses every flow with :class:`Blocked`; the inbound answers with its refusal."""

    protocol = "block"
    runtime = None

    def __init__(self, name: str = "block") -> None:
        self.name = name

    @property
    def supports_udp(self) -> bool:
        # UDP routed here is refused the same way, not reported as unsupported.
        return True

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(tcp=True, udp=True, udp_mode="none")

    async def dial_tcp(self, target: Address, deadline: float) -> DialedStream:
        raise Blocked(f"{self.name}: {target} is blocked")

    def __repr__(self) -> str:
        return f"BlockOutbound(name={self.name!r})"
