"""The outbound interface every leaf protocol implements.

A leaf dials the upstream side of one flow. TCP dials return a connected,
non-blocking ``socket.socket`` so the relay engine can drive the file
descriptor directly (splice on plain streams in the fast path). Protocols that
need user-space framing (AEAD, TLS) will return a stream object instead; that
extension comes with those protocols.
"""

from __future__ import annotations

import socket
from typing import Protocol

from honk.core.net import Address


class Outbound(Protocol):
    """A leaf outbound: ``direct``, ``block``, or a proxy node."""

    name: str  # display name: the node tag, or "direct" / "block"
    protocol: str  # "direct", "block", "socks5", ...

    @property
    def supports_udp(self) -> bool:
        """Whether this leaf can carry UDP flows at all."""

    async def dial_tcp(self, target: Address, deadline: float) -> socket.socket:
        """Open a TCP connection to ``target`` through this leaf.

        ``deadline`` is an absolute time on the dialer's clock. Raises
        :class:`honk.core.errors.Blocked` for ``block``,
        :class:`honk.core.errors.DialTimeout` when the deadline passes,
        :class:`honk.core.errors.DialError` (with ``phase``) for other failures,
        :class:`honk.core.errors.NotSupported` if the protocol cannot dial yet.
        """
