"""What every leaf that talks to a proxy server shares.

:class:`ProxyLeaf` reaches the node's server with a
:class:`~honk.outbound.direct.DirectOutbound` named after the node (Happy
Eyeballs, the bypass mark, typed ``resolve``/``connect`` errors), runs the
protocol's handshake under the dial deadline, and counts each dial's outcome
on the node's :class:`~honk.outbound.runtime.NodeRuntime`.

:func:`handshake_scope` turns what can go wrong while a handshake reads and
writes into the typed errors of the ``handshake`` phase: the deadline passing
(:class:`DialTimeout`), the server closing or resetting the connection, a
socket error. The protocol codecs raise their own typed errors (auth, target
refusals, malformed bytes); those pass through unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

from honk.config.spec import GlobalSpec, NodeSpec
from honk.core.clock import Clock, timeout_at
from honk.core.errors import DialError, DialTimeout, HonkError
from honk.core.net import Address
from honk.outbound.base import DialedStream, EnginePlan
from honk.outbound.direct import DirectOutbound
from honk.outbound.runtime import NodeRuntime
from honk.proto.framing import Framing

__all__ = ["ProxyLeaf", "ServerClosed", "handshake_scope", "recv_some"]


class ServerClosed(Exception):
    """The proxy server closed the connection in the middle of a handshake."""


async def recv_some(sock: socket.socket, limit: int) -> bytes:
    """At most ``limit`` bytes from ``sock``; raises :class:`ServerClosed` at EOF."""
    data = await asyncio.get_running_loop().sock_recv(sock, limit)
    if not data:
        raise ServerClosed()
    return data


async def wait_readable(sock: socket.socket) -> None:
    """Wait until ``sock`` has bytes (or EOF) to read, without reading them."""
    loop = asyncio.get_running_loop()
    ready = loop.create_future()
    fd = sock.fileno()
    loop.add_reader(fd, lambda: ready.done() or ready.set_result(None))
    try:
        await ready
    finally:
        loop.remove_reader(fd)


@contextlib.asynccontextmanager
async def handshake_scope(clock: Clock, deadline: float, outbound: str, protocol: str) -> AsyncIterator[None]:
    """Run a handshake body under ``deadline`` with its failures typed (phase ``handshake``)."""
    try:
        async with timeout_at(clock, deadline):
            yield
    except TimeoutError:
        raise DialTimeout(outbound, "handshake", f"{protocol}: no answer before the deadline") from None
    except ServerClosed:
        raise DialError(outbound, "handshake", f"{protocol}: the server closed the connection") from None
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        raise DialError(outbound, "handshake", f"{protocol}: {why}") from None


class ProxyLeaf:
    """Base of leaves that dial through a proxy server (SOCKS5, HTTP, Shadowsocks...)."""

    protocol = "proxy"

    def __init__(self, node: NodeSpec, glob: GlobalSpec, clock: Clock) -> None:
        self.node = node
        self.name = node.name
        self.id = node.id
        self.clock = clock
        self.server = Address(node.host, node.port)
        self.connector = DirectOutbound(clock, glob.connect_timeout, name=node.name)
        self.runtime: NodeRuntime | None = None  # set by the registry

    @property
    def supports_udp(self) -> bool:
        return bool(self.capabilities.udp)

    @property
    def capabilities(self):  # noqa: ANN201 - each leaf returns its Capabilities
        raise NotImplementedError

    async def connect_server(self, deadline: float) -> socket.socket:
        """A connected socket to the node's server: a ready one warm-up opened ahead (its
        runtime's :class:`~honk.outbound.ready.ReadyPool`), else a new connection (whose
        failures are counted)."""
        if self.runtime is not None:
            ready = self.runtime.ready.take(self.clock.now())
            if ready is not None:
                return ready
        try:
            return await self.connector.connect(self.server, deadline)
        except HonkError as exc:
            self.count(exc)
            raise

    def engine_plan(self, target: Address) -> EnginePlan | None:
        """The relay engine's dial of a flow to ``target`` (see :class:`EnginePlan`); None: Python
        dials. The framed protocols offer one; :meth:`framed_plan` is the shared part."""
        return None

    def framed_plan(self, seal: Callable[[], tuple[bytes, Any]]) -> EnginePlan | None:
        """What :meth:`open_framed` does, for the engine: ``seal()`` gives the sealed header and
        the framing (called only when the server is an IP literal the engine can reach)."""
        if self.server.ip is None or not self.connector.engine_dials:
            return None
        head, framing = seal()
        return self.connector.engine_plan(self.server, framing, head)

    def engine_dialed(self, outcome: HonkError | None) -> None:
        """The engine's dial of :meth:`engine_plan` connected (None) or failed: counted as
        :meth:`open_framed` counts its own."""
        self.count(outcome)

    async def open_framed(self, header: bytes, framing: Framing, deadline: float, what: str) -> DialedStream:
        """The node's server reached and ``header`` sent, both under the deadline; the relay
        engine applies ``framing`` to everything after it (Shadowsocks, VMess over plain TCP)."""
        sock = await self.connect_server(deadline)
        try:
            async with handshake_scope(self.clock, deadline, self.name, what):
                await asyncio.get_running_loop().sock_sendall(sock, header)
        except HonkError as exc:
            sock.close()
            self.count(exc)
            raise
        except BaseException:
            sock.close()
            raise
        self.count(None)
        return DialedStream(sock, framing)

    def count(self, outcome: HonkError | None, *, udp: bool = False) -> None:
        """Record one dial's outcome on the runtime (``ok`` or the failure's phase); a failed UDP
        endpoint setup (``udp``) is also a DataUdp failure of the node's health."""
        if self.runtime is None:
            return
        if outcome is None:
            self.runtime.dials["ok"] += 1
        else:
            self.runtime.dials[getattr(outcome, "phase", type(outcome).__name__)] += 1
        # A flow's TCP dial is reported by the dispatcher, which knows its latency.
        if udp and outcome is not None:
            self.udp_setup_failed()

    def udp_setup_failed(self) -> None:
        """The node's UDP path could not be set up: a DataUdp failure of its health."""
        if self.runtime is not None and (traffic := self.runtime.traffic) is not None:
            traffic.packets_failed(self.health_family)

    @property
    def health_family(self) -> int:
        """The address family the node's server is reached over (4 for a named server)."""
        ip = self.server.ip
        return ip.version if ip is not None else 4

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, id={self.id})"
