"""An aioquic server in the test's own loop, recording the handshakes it completes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import trustme
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.asyncio.server import QuicServer
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import ConnectionTerminated, HandshakeCompleted, QuicEvent

H3 = "h3"


@dataclass
class QuicPeer:
    host: str
    port: int
    handshakes: list[str | None] = field(default_factory=list)  # ALPN of each completed handshake
    terminations: list[int] = field(default_factory=list)  # error codes of connections that ended


@contextlib.asynccontextmanager
async def quic_server(
    cert: trustme.LeafCert, host: str = "127.0.0.1", alpn: tuple[str, ...] = (H3,), port: int = 0
) -> AsyncIterator[QuicPeer]:
    """An aioquic server on ``host:port`` (0: a free port) presenting ``cert``."""
    config = QuicConfiguration(is_client=False, alpn_protocols=list(alpn))
    with cert.cert_chain_pems[0].tempfile() as certfile, cert.private_key_pem.tempfile() as keyfile:
        config.load_cert_chain(certfile, keyfile)
    peer = QuicPeer(host, port)

    class Recording(QuicConnectionProtocol):
        def quic_event_received(self, event: QuicEvent) -> None:
            if isinstance(event, HandshakeCompleted):
                peer.handshakes.append(event.alpn_protocol)
            elif isinstance(event, ConnectionTerminated):
                peer.terminations.append(event.error_code)

    transport, server = await asyncio.get_running_loop().create_datagram_endpoint(
        lambda: QuicServer(configuration=config, create_protocol=Recording), local_addr=(host, port)
    )
    peer.port = transport.get_extra_info("sockname")[1]
    try:
        yield peer
    finally:
        server.close()
