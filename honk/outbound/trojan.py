"""Trojan nodes: the password's SHA-224 and the target, then the stream, over TLS.

The header goes out right after the TLS handshake; Trojan has no response, so
a wrong password is not reported by the protocol: the server falls back to its
decoy (or closes), which the client sees as bytes that are not the target's or
an early EOF. The link's ``security``/``type``/``sni``/``path``/``host`` shape
the transport (TLS by default).
"""

from __future__ import annotations

from honk.core.errors import ConfigRefused
from honk.core.net import Address
from honk.outbound.stacked import StackedLeaf, Stream
from honk.proto.trojan import TrojanClient, TrojanCommand

__all__ = ["TrojanOutbound"]


class TrojanOutbound(StackedLeaf):
    protocol = "trojan"
    tls_default = True

    def stream(self, target: Address) -> Stream:
        if not self.node.password:
            raise ConfigRefused(f"{self.name}: a Trojan node needs a password")
        return Stream(TrojanClient(self.node.password, TrojanCommand.CONNECT, target).request_header())
