"""The standalone DNS listener of ``dns.bind``: UDP and/or TCP on one address.

The lifecycle is the one the reconciler drives for every listener:
``bind()`` binds every selected transport, all or nothing (a hostname: the
first of its addresses, in resolution order, on which every transport binds;
the wildcard: dual-stack ``::``, else ``0.0.0.0``); ``serve()`` starts
answering; ``close_unserved()`` releases what a refused apply bound;
``stop_accepting()`` closes the sockets, letting queries already being
answered finish; ``aclose()`` also ends open TCP connections.

Each query goes to :attr:`DnsListener.service`, which a reload may replace
(:meth:`swap`): a query is answered by the service current when it arrived.
The sockets are ordinary and unmarked, and a wildcard or LAN-facing bind
answers anyone who can reach it (restrict it with the firewall).

TCP follows RFC 7766: two-octet length framing, several queries per
connection (answered as they complete, at most :data:`TCP_PIPELINE` at a
time), and :data:`TCP_IDLE_TIMEOUT` for each read and write. A frame the
service drops (no readable header) ends the connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import logging
import socket
from typing import Protocol

from honk.config.spec import DnsBindSpec
from honk.core.clock import Clock, timeout_at
from honk.core.logs import kv
from honk.core.net import Address
from honk.dns.wire import TCP_LENGTH
from honk.inbound.lifecycle import BindThenServe

__all__ = ["TCP_IDLE_TIMEOUT", "TCP_PIPELINE", "DnsListener", "QueryHandler"]

log = logging.getLogger("honk.dns")

TCP_IDLE_TIMEOUT = 30.0  # seconds per length read, body read and write (upstream honk's bound)
TCP_PIPELINE = 16  # queries of one TCP connection answered at once; more wait to be read
MAX_TCP_CONNECTIONS = 256  # open TCP connections; newcomers beyond are closed at once
BACKLOG = 128
EPHEMERAL_ATTEMPTS = 8  # port 0 with both transports: tries to find a port free for UDP and TCP
MAX_UDP_QUERY = 65535
CLIENT_HOSTS_CACHED = 4096  # client addresses whose parsed form is remembered (a LAN has far fewer)


class QueryHandler(Protocol):
    async def handle(
        self, query: bytes, client: Address | None, original: Address | None, *, tcp: bool = False
    ) -> bytes | None: ...


def _peer(addr: tuple) -> Address | None:
    """The client as an Address; an IPv4-mapped IPv6 peer (a dual-stack socket) as IPv4."""
    try:
        host = _client_host(addr[0])
    except (ValueError, IndexError, TypeError):
        return None
    return Address(host, addr[1])


@functools.lru_cache(maxsize=CLIENT_HOSTS_CACHED)
def _client_host(text: str) -> str:
    """A peer's address text, unmapped and canonical; cached, since a LAN's few clients ask
    again and again and parsing costs more than answering a cached query."""
    ip = ipaddress.ip_address(text)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip)


class DnsListener(BindThenServe):
    def __init__(self, spec: DnsBindSpec, service: QueryHandler, clock: Clock) -> None:
        self.spec = spec
        self.service = service
        self._clock = clock
        self._udp_sock: socket.socket | None = None
        self._tcp_sock: socket.socket | None = None
        self._udp_transport: asyncio.DatagramTransport | None = None
        self._tcp_server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._serving = False
        self._stopped = False
        self.bound: Address | None = None

    def swap(self, service: QueryHandler) -> None:
        """Answer queries arriving from now with ``service`` (a reload's rebuilt one)."""
        self.service = service

    # -- lifecycle ---------------------------------------------------------------------

    async def bind(self) -> None:
        """Bind every selected transport; raises OSError with nothing left open."""
        if self._udp_sock or self._tcp_sock or self._serving or self._stopped:
            raise RuntimeError("dns listener: bind() is called once, first")
        errors: list[OSError] = []
        for host in await self._candidates():
            try:
                self._udp_sock, self._tcp_sock = self._bind_on(host)
            except OSError as exc:
                errors.append(exc)
                continue
            sock = self._udp_sock or self._tcp_sock
            assert sock is not None
            name = sock.getsockname()
            self.bound = Address(name[0], name[1])
            return
        raise errors[-1] if errors else OSError(f"dns listener: {self.spec.host!r} has no address")

    async def _candidates(self) -> list[str]:
        host = self.spec.host
        if host == "":
            return ["::", "0.0.0.0"] if socket.has_ipv6 else ["0.0.0.0"]
        try:
            ipaddress.ip_address(host)
        except ValueError:
            pass
        else:
            return [host]
        infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_DGRAM)
        seen: list[str] = []
        for info in infos:
            address = str(info[4][0])
            if address not in seen:
                seen.append(address)
        return seen

    def _bind_on(self, host: str) -> tuple[socket.socket | None, socket.socket | None]:
        for _ in range(EPHEMERAL_ATTEMPTS if self.spec.port == 0 and self.spec.udp and self.spec.tcp else 1):
            udp = tcp = None
            try:
                port = self.spec.port
                if self.spec.udp:
                    udp = _socket(host, socket.SOCK_DGRAM)
                    udp.bind((host, port))
                    port = udp.getsockname()[1]
                if self.spec.tcp:
                    tcp = _socket(host, socket.SOCK_STREAM)
                    tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    tcp.bind((host, port))
                    tcp.listen(BACKLOG)
                return udp, tcp
            except OSError as exc:
                for s in (udp, tcp):
                    if s is not None:
                        s.close()
                error = exc
                if self.spec.port != 0:
                    break
        raise error

    async def serve(self) -> None:
        if not (self._udp_sock or self._tcp_sock) or self._serving or self._stopped:
            raise RuntimeError("dns listener: serve() needs bound, unserved sockets")
        self._serving = True
        loop = asyncio.get_running_loop()
        if self._udp_sock is not None:
            self._udp_transport, _ = await loop.create_datagram_endpoint(
                lambda: _UdpProtocol(self), sock=self._udp_sock
            )
        if self._tcp_sock is not None:
            self._tcp_server = await asyncio.start_server(
                self._tcp_client, sock=self._tcp_sock, backlog=BACKLOG
            )
        transports = ",".join(t for t, on in (("udp", self.spec.udp), ("tcp", self.spec.tcp)) if on)
        log.info("dns listening %s", kv(address=self.bound, transports=transports))

    def close_unserved(self) -> None:
        """Release the sockets :meth:`bind` made (a refused apply)."""
        if self._serving:
            raise RuntimeError("dns listener: close_unserved() after serve(); use stop_accepting()")
        self._stopped = True
        for sock in (self._udp_sock, self._tcp_sock):
            if sock is not None:
                sock.close()
        self._udp_sock = self._tcp_sock = None

    async def stop_accepting(self) -> None:
        """Stop receiving queries and accepting connections; answers being computed still go
        out over open TCP connections. Idempotent."""
        self._stopped = True
        if self._udp_transport is not None:
            self._udp_transport.close()
            self._udp_transport = None
        if self._tcp_server is not None:
            self._tcp_server.close()
            self._tcp_server = None
        for sock in (self._udp_sock, self._tcp_sock):
            if sock is not None:
                sock.close()
        self._udp_sock = self._tcp_sock = None

    async def aclose(self) -> None:
        """:meth:`stop_accepting`, then end every open connection and query task."""
        await self.stop_accepting()
        for writer in list(self._writers):
            writer.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- serving ---------------------------------------------------------------------

    def _spawn(self, coro) -> asyncio.Task[None]:  # noqa: ANN001 - a coroutine
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _udp_query(self, transport: asyncio.DatagramTransport, data: bytes, addr: tuple) -> None:
        reply = await self.service.handle(data, _peer(addr), None)
        if reply is not None and not transport.is_closing():
            transport.sendto(reply, addr)

    async def _tcp_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._writers) >= MAX_TCP_CONNECTIONS:
            log.debug("dns connection refused %s", kv(reason="too-many-connections"))
            writer.close()
            return
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        self._writers.add(writer)
        client = _peer(writer.get_extra_info("peername") or ())
        pipeline = asyncio.Semaphore(TCP_PIPELINE)
        lock = asyncio.Lock()
        answers: set[asyncio.Task[None]] = set()
        ended = asyncio.Event()  # a frame was dropped or a write failed: the connection ends
        try:
            while not ended.is_set():
                try:
                    async with timeout_at(self._clock, self._clock.now() + TCP_IDLE_TIMEOUT):
                        (length,) = TCP_LENGTH.unpack(await reader.readexactly(TCP_LENGTH.size))
                        query = await reader.readexactly(length)
                except (asyncio.IncompleteReadError, TimeoutError, ConnectionError):
                    break
                await pipeline.acquire()
                if ended.is_set():
                    pipeline.release()
                    break
                answer = self._spawn(self._tcp_answer(query, client, writer, lock, pipeline, ended))
                answers.add(answer)
                answer.add_done_callback(answers.discard)
            if answers:
                await asyncio.gather(*answers, return_exceptions=True)
        finally:
            self._writers.discard(writer)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _tcp_answer(
        self,
        query: bytes,
        client: Address | None,
        writer: asyncio.StreamWriter,
        lock: asyncio.Lock,
        pipeline: asyncio.Semaphore,
        ended: asyncio.Event,
    ) -> None:
        try:
            reply = await self.service.handle(query, client, None, tcp=True)
            if reply is None:
                log.debug("dns connection closed %s", kv(client=client, reason="malformed-frame"))
                ended.set()
                writer.close()
                return
            async with lock:
                if writer.is_closing():
                    return
                writer.write(TCP_LENGTH.pack(len(reply)) + reply)
                async with timeout_at(self._clock, self._clock.now() + TCP_IDLE_TIMEOUT):
                    await writer.drain()
        except (TimeoutError, ConnectionError):
            ended.set()
            writer.close()
        finally:
            pipeline.release()


class _UdpProtocol(asyncio.DatagramProtocol):
    def __init__(self, listener: DnsListener) -> None:
        self._listener = listener
        self._transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple) -> None:
        transport = self._transport
        if transport is None:
            return
        answer_now = getattr(self._listener.service, "answer_now", None)
        answer = answer_now(data, _peer(addr), None) if answer_now is not None else None
        if answer is not None:  # a cache hit, answered from bytes in this callback: no task
            transport.sendto(answer, addr)
            return
        self._listener._spawn(self._listener._udp_query(transport, data, addr))

    def error_received(self, exc: Exception) -> None:
        log.debug("dns listener socket error %s", kv(error=exc))


def _socket(host: str, kind: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, kind)
    try:
        if family == socket.AF_INET6 and host == "::":
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # the wildcard serves IPv4 too
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock
