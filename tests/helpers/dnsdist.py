"""dnsdist (Debian's) as a real DNS front on loopback: plain UDP/TCP, DoT and DoH.

Encrypted DNS clients are only worth what the servers they talk to accept, so the
tests and the benchmark put a real, independently written front between honk and
a records table: dnsdist terminates TCP, TLS (RFC 7858) and HTTP/2 (RFC 8484) and
forwards each query to :class:`Backend`. Its certificate is issued by a trustme CA
the caller trusts.

dnsdist forwards a query that came over TCP (so DoT and DoH too) over TCP, one
backend connection per client connection, kept open; :class:`Backend` therefore
serves every TCP connection on a thread of its own (the one-connection-at-a-time
responder of ``helpers/dns.py`` would leave a second client waiting).

The backend is marked up at start (``setUp()``), so dnsdist sends it no health
checks: every query the responder counts came from a client. Security polling
(a lookup of a public name) is off: nothing here leaves loopback.
"""

from __future__ import annotations

import contextlib
import socketserver
import struct
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import trustme

from helpers.doq import answer
from helpers.peers import require_binary
from helpers.peerservers import LOOPBACK, TLS_NAMES, Probe, _serving, _workdir, tcp_accepts, udp_bound
from helpers.servers import SHUTDOWN_POLL, free_port

DOH_PATH = "/dns-query"
LENGTH = struct.Struct("!H")  # TCP DNS's length prefix (RFC 1035 §4.2.2)
MAX_DATAGRAM = 65535


class Backend:
    """An authoritative responder on one loopback port, UDP and TCP, answering from ``records``
    (name -> IPv4; NXDOMAIN otherwise); ``queries`` counts what it answered, either way."""

    def __init__(self, records: Mapping[str, str]) -> None:
        self.queries = 0
        self._lock = threading.Lock()
        backend = self

        class Udp(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                data, sock = self.request
                sock.sendto(backend._answer(data), self.client_address)

        class Tcp(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                while len(head := self.rfile.read(LENGTH.size)) == LENGTH.size:
                    (length,) = LENGTH.unpack(head)
                    reply = backend._answer(self.rfile.read(length))
                    self.wfile.write(LENGTH.pack(len(reply)) + reply)

        self._records = records
        self._tcp = socketserver.ThreadingTCPServer((LOOPBACK, 0), Tcp)
        self._tcp.daemon_threads = True
        port = self._tcp.server_address[1]
        self._udp = socketserver.UDPServer((LOOPBACK, port), Udp)
        self.address = (LOOPBACK, port)
        self._threads = [
            threading.Thread(
                target=server.serve_forever, args=(SHUTDOWN_POLL,), daemon=True, name="dns-backend"
            )
            for server in (self._tcp, self._udp)
        ]
        for thread in self._threads:
            thread.start()

    def _answer(self, query: bytes) -> bytes:
        with self._lock:
            self.queries += 1
        return answer(self._records, query)[0]

    def close(self) -> None:
        for server in (self._tcp, self._udp):
            server.shutdown()
            server.server_close()

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class DnsdistPeer:
    host: str
    plain_port: int  # UDP and TCP
    dot_port: int
    doh_port: int
    ca: trustme.CA
    ca_path: Path  # the CA's PEM file: what a client trusts (SSL_CERT_FILE)


@contextlib.contextmanager
def dnsdist(
    backend: tuple[str, int],
    *,
    ca: trustme.CA | None = None,
    server_names: Sequence[str] = TLS_NAMES,
    alt_svc: str | None = None,
) -> Iterator[DnsdistPeer]:
    """dnsdist forwarding to ``backend``, its certificate for ``server_names``; ``alt_svc``: an
    ``Alt-Svc`` header its DoH answers carry (an HTTP/3 offer)."""
    binary = require_binary("dnsdist")
    ca = ca or trustme.CA()
    with _workdir("dnsdist") as tmp:
        work = Path(tmp)
        leaf = ca.issue_cert(*server_names)
        cert, key, ca_path = work / "cert.pem", work / "key.pem", work / "ca.pem"
        for blob in leaf.cert_chain_pems:
            blob.write_to_path(str(cert), append=True)
        leaf.private_key_pem.write_to_path(str(key))
        ca.cert_pem.write_to_path(str(ca_path))
        conf = work / "dnsdist.conf"
        ports: dict[str, int] = {}
        doh_options = "{}" if alt_svc is None else f"{{customResponseHeaders={{['alt-svc']='{alt_svc}'}}}}"

        def launch(plain: int) -> tuple[list[str], list[Probe]]:
            ports.update(plain=plain, dot=free_port(), doh=free_port())
            conf.write_text(
                'setSecurityPollSuffix("")\n'
                f'setLocal("{LOOPBACK}:{plain}")\n'
                f'addTLSLocal("{LOOPBACK}:{ports["dot"]}", "{cert}", "{key}")\n'
                f'addDOHLocal("{LOOPBACK}:{ports["doh"]}", "{cert}", "{key}", "{DOH_PATH}", {doh_options})\n'
                f'newServer({{address="{backend[0]}:{backend[1]}"}})\n'
                "getServer(0):setUp()\n"
            )
            argv = [binary, "--supervised", "--disable-syslog", "-C", str(conf)]
            return argv, [
                tcp_accepts(plain),
                udp_bound(plain),
                tcp_accepts(ports["dot"]),
                tcp_accepts(ports["doh"]),
            ]

        with _serving("dnsdist", work, launch):
            yield DnsdistPeer(LOOPBACK, ports["plain"], ports["dot"], ports["doh"], ca, ca_path)
