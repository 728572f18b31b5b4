"""VMess nodes with the AEAD header (alterId 0) over TCP, TLS or WebSocket.

The request header (sealed with the UUID's command key and the wall-clock
time, which the server checks within two minutes) goes out right after the
transport is up; the body is sealed in chunks with the node's security
(aes-128-gcm, chacha20-poly1305, or none). The server's first bytes are its
sealed response header, checked against the request: another UUID shows as a
server that closes without answering, a forged response as an authentication
error. The legacy MD5 header (alterId > 0) is refused when the node is dialled.
"""

from __future__ import annotations

from honk.core.errors import ConfigRefused
from honk.core.net import Address
from honk.outbound.stacked import StackedLeaf, Stream
from honk.proto.vmess import COMMAND_TCP, VmessClient, VmessProtocolError

__all__ = ["VmessOutbound"]


class VmessOutbound(StackedLeaf):
    protocol = "vmess"

    def stream(self, target: Address) -> Stream:
        params = dict(self.node.params)
        if params.get("aid", "0") not in ("", "0"):
            raise ConfigRefused(f"{self.name}: VMess alterId > 0 (the legacy MD5 header) is not supported")
        security = self.node.encryption or "auto"
        try:
            client = VmessClient(self.node.username or "", security, COMMAND_TCP, target, self.clock.wall())
        except ValueError as exc:
            raise ConfigRefused(f"{self.name}: {exc}") from None
        decoder = client.response_decoder()

        def at_eof() -> None:
            if not decoder.header_received:
                raise VmessProtocolError("no-response", "the server closed before answering (wrong id?)")

        return Stream(client.request_header(), decoder.feed, at_eof, client.encrypt, client.eof)
