"""A DNS over QUIC (RFC 9250) and DNS over HTTP/3 server on loopback, built on aioquic.

Debian 12 packages no DoQ or DoH3 server (dnsdist learnt them in 1.9), so the test
runs its own in its loop, written from the RFCs and aioquic's server API rather than
honk's client: one server offers ALPN ``doq`` and ``h3`` and answers by the one the
handshake picked. Answers come from a records table (name -> IPv4s, NXDOMAIN
otherwise) built with dnspython; every query, connection and the client address it
came from is recorded so tests can see reuse and which path carried it.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field

import dns.message
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset
import trustme
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.asyncio.server import QuicServer
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import DataReceived, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import HandshakeCompleted, QuicEvent, StreamDataReceived

ALPN_DOQ = "doq"
LENGTH = struct.Struct("!H")
TTL = 60


@dataclass
class DoqPeer:
    host: str
    port: int
    connections: list[str | None] = field(default_factory=list)  # the ALPN of each completed handshake
    queries: list[tuple[str, int]] = field(default_factory=list)  # (name, wire id) of each query answered
    clients: set[tuple[str, int]] = field(default_factory=set)  # source addresses datagrams came from


def answer(records: Mapping[str, str], query_wire: bytes) -> tuple[bytes, str, int]:
    """The reply to ``query_wire`` (same id), the asked name and the query's id."""
    query = dns.message.from_wire(query_wire)
    reply = dns.message.make_response(query)
    question = query.question[0]
    name = question.name.to_text(omit_final_dot=True).lower()
    address = records.get(name)
    if address is None:
        reply.set_rcode(dns.rcode.NXDOMAIN)
    elif question.rdtype == dns.rdatatype.A:
        reply.answer.append(
            dns.rrset.from_text(question.name, TTL, dns.rdataclass.IN, dns.rdatatype.A, address)
        )
    return reply.to_wire(), name, query.id


@contextlib.asynccontextmanager
async def doq_server(
    records: Mapping[str, str], cert: trustme.LeafCert, host: str = "127.0.0.1", port: int = 0
) -> AsyncIterator[DoqPeer]:
    """The server on UDP ``port`` (0: a free one) of ``host``, presenting ``cert``."""
    config = QuicConfiguration(is_client=False, alpn_protocols=[ALPN_DOQ, *H3_ALPN])
    with cert.cert_chain_pems[0].tempfile() as certfile, cert.private_key_pem.tempfile() as keyfile:
        config.load_cert_chain(certfile, keyfile)
    peer = DoqPeer(host, 0)

    class Serving(QuicConnectionProtocol):
        def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003 - aioquic's signature
            super().__init__(*args, **kwargs)
            self._h3: H3Connection | None = None
            self._streams: dict[int, bytearray] = {}

        def datagram_received(self, data, addr) -> None:  # noqa: ANN001 - asyncio's signature
            peer.clients.add(addr[:2])
            super().datagram_received(data, addr)

        def quic_event_received(self, event: QuicEvent) -> None:
            if isinstance(event, HandshakeCompleted):
                peer.connections.append(event.alpn_protocol)
                if event.alpn_protocol in H3_ALPN:
                    self._h3 = H3Connection(self._quic)
            elif isinstance(event, StreamDataReceived):
                if self._h3 is not None:
                    for h3_event in self._h3.handle_event(event):
                        self._http(h3_event)
                else:
                    self._doq(event)

        def _doq(self, event: StreamDataReceived) -> None:
            buf = self._streams.setdefault(event.stream_id, bytearray())
            buf += event.data
            if not event.end_stream:
                return
            del self._streams[event.stream_id]
            (length,) = LENGTH.unpack_from(buf)
            wire, name, qid = answer(records, bytes(buf[LENGTH.size : LENGTH.size + length]))
            peer.queries.append((name, qid))
            self._quic.send_stream_data(event.stream_id, LENGTH.pack(len(wire)) + wire, end_stream=True)
            self.transmit()

        def _http(self, event: object) -> None:
            assert self._h3 is not None
            if isinstance(event, HeadersReceived):
                headers = dict(event.headers)
                assert (
                    headers[b":method"] == b"POST" and headers[b"content-type"] == b"application/dns-message"
                )
                self._streams[event.stream_id] = bytearray()
            elif isinstance(event, DataReceived):
                self._streams[event.stream_id] += event.data
            if getattr(event, "stream_ended", False):
                wire, name, qid = answer(records, bytes(self._streams.pop(event.stream_id)))
                peer.queries.append((name, qid))
                self._h3.send_headers(
                    event.stream_id,
                    [
                        (b":status", b"200"),
                        (b"content-type", b"application/dns-message"),
                        (b"content-length", str(len(wire)).encode()),
                    ],
                )
                self._h3.send_data(event.stream_id, wire, end_stream=True)
                self.transmit()

    transport, server = await asyncio.get_running_loop().create_datagram_endpoint(
        lambda: QuicServer(configuration=config, create_protocol=Serving), local_addr=(host, port)
    )
    peer.port = transport.get_extra_info("sockname")[1]
    try:
        yield peer
    finally:
        server.close()
