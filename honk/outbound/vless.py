"""VLESS nodes (no flow): UUID and target, then the stream; the server's answer starts with a short header.

VLESS carries no encryption of its own, so links normally put it over TLS
(``security=tls``). A server that refuses the UUID closes the connection
without answering: the client sees EOF before the response header, a
``truncated-header`` protocol error.
"""

from __future__ import annotations

from honk.core.errors import ConfigRefused
from honk.core.net import Address
from honk.outbound.stacked import StackedLeaf, Stream
from honk.proto.vless import VlessClient, VlessCommand

__all__ = ["VlessOutbound"]


class VlessOutbound(StackedLeaf):
    protocol = "vless"

    def stream(self, target: Address) -> Stream:
        try:
            client = VlessClient(self.node.username or "", VlessCommand.TCP, target)
        except ValueError:
            raise ConfigRefused(f"{self.name}: the VLESS id is not a UUID") from None
        decoder = client.response_decoder()

        def at_eof() -> None:
            if not decoder.header_done:
                decoder.feed(b"")  # raises truncated-header

        return Stream(client.request_header(), decoder.feed, at_eof)
