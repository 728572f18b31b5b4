"""The two relay engines side by side, and what a test needs to watch one flow on them.

``ENGINES`` names the engines present (``compiled`` only with a build, never under
HONK_NO_EXTENSIONS); the ``engine`` fixture of ``tests/unit/relay/conftest.py``
yields one of each per test.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from helpers.sockets import unix_pair
from honk._fast import relay as fast_relay
from honk._fast import relay_py
from honk.core.clock import FakeClock
from honk.relay.copy import CopyRelay
from honk.relay.native import NativeRelay

STEP = 5.0  # seconds: the most any single wait may take

ENGINES = ["twin"]
if fast_relay.IMPLEMENTATION == "compiled":
    ENGINES.insert(0, "compiled")
# the fast path's engines by the names its tests use: the native worker when compiled, and the twin
FASTPATH_ENGINES = ["native", "twin"] if fast_relay.IMPLEMENTATION == "compiled" else ["twin"]


def fastpath_engine(name: str) -> Any:
    """A new engine of FASTPATH_ENGINES' ``name`` on the running loop."""
    return engine_class("compiled" if name == "native" else name)(asyncio.get_running_loop())


def engine_class(name: str) -> Any:
    if name == "compiled":
        from honk._fast.relay_c import Engine

        return Engine
    return relay_py.Engine


RELAYS = ["copy", *(f"native-{e}" for e in ENGINES)]  # the relays a flow can run on


@contextlib.contextmanager
def relay_of(kind: str) -> Iterator[Any]:
    """A relay of ``kind`` (one of RELAYS) on a fake clock; a native one on its own engine."""
    clock = FakeClock()
    if kind == "copy":
        yield CopyRelay(clock)
        return
    engine = engine_class(kind.removeprefix("native-"))(asyncio.get_running_loop())
    try:
        yield NativeRelay(clock, engine)
    finally:
        engine.close()


@contextlib.asynccontextmanager
async def relay_flow(kind: str, start: Callable[[Any], Awaitable[tuple[socket.socket, Any, Any]]]):
    """One flow on a relay of ``kind``: ``start(relay)`` gives (client socket, server end, run task);
    yields (relay, client socket, server end, run task) and closes both sockets after."""
    with relay_of(kind) as relay:
        lan, server, task = await start(relay)
        try:
            yield relay, lan, server, task
        finally:
            lan.close()
            server.sock.close()


class Recorder:
    """A flow's listener: its events, and a future for its END."""

    def __init__(self) -> None:
        self.events: list[tuple[int, int, int]] = []
        self.ended: asyncio.Future[tuple[int, int]] = asyncio.get_running_loop().create_future()

    def relay_event(self, kind: int, a: int, b: int, t: float) -> None:
        self.events.append((kind, a, b))
        if kind == relay_py.EV_END and not self.ended.done():
            self.ended.set_result((a, b))

    async def end(self) -> tuple[int, int]:
        return await asyncio.wait_for(asyncio.shield(self.ended), STEP)


class FramedServer:
    """The test's server end of a framed flow: ``take`` opens the wire bytes a read brought."""

    sock: socket.socket

    def take(self, data: bytes) -> bytes:
        raise NotImplementedError

    async def recv_plain(self, n: int) -> bytes:
        loop = asyncio.get_running_loop()
        out = bytearray()
        while len(out) < n:
            data = await asyncio.wait_for(loop.sock_recv(self.sock, 1 << 20), STEP)
            assert data, f"EOF after {len(out)} of {n} bytes"
            out += self.take(data)
        assert len(out) == n
        return bytes(out)

    async def recv_until_eof(self) -> bytes:
        loop = asyncio.get_running_loop()
        out = bytearray()
        while data := await asyncio.wait_for(loop.sock_recv(self.sock, 1 << 20), STEP):
            out += self.take(data)
        return bytes(out)


class FramedRig:
    """One framed flow on ``engine``: the test's client socket ``lan``, its server end ``srv``
    (played by ``server``, which ``make(srv)`` builds with the flow's ``framing``), the recorder."""

    def __init__(
        self,
        engine: Any,
        make: Callable[[socket.socket], tuple[Any, Any]],
        pair: Callable[[], tuple[socket.socket, socket.socket]] = unix_pair,
        preamble: bytes = b"",
        before_add: bytes = b"",
    ) -> None:
        self.lan, lan_peer = pair()
        self.srv, upstream = pair()
        self.server, self.framing = make(self.srv)
        self.rec = Recorder()
        if before_add:  # already queued when the engine takes over: its first read sees all of it
            self.lan.sendall(before_add)
        self.id = engine.add(lan_peer.detach(), upstream.detach(), self.rec, preamble, framing=self.framing)

    def close(self) -> None:
        for sock in (self.lan, self.srv):
            with contextlib.suppress(OSError):
                sock.close()


@contextlib.contextmanager
def framed_rig(
    engine: Any, make: Callable[[socket.socket], tuple[Any, Any]], **kwargs: Any
) -> Iterator[FramedRig]:
    r = FramedRig(engine, make, **kwargs)
    try:
        yield r
    finally:
        r.close()


def upstream_failure(err: int) -> tuple[int, int]:
    """The END a flow gets when its upstream's bytes fail the framing with ``err``."""
    return (relay_py.END_ERROR, (relay_py.SIDE_UPSTREAM << 16) | err)


async def recv_exactly(sock: socket.socket, n: int) -> bytes:
    loop = asyncio.get_running_loop()
    out = bytearray()
    while len(out) < n:
        data = await asyncio.wait_for(loop.sock_recv(sock, 1 << 20), STEP)
        assert data, f"EOF after {len(out)} of {n} bytes"
        out += data
    return bytes(out)


async def recv_until_eof(sock: socket.socket) -> bytes:
    loop = asyncio.get_running_loop()
    out = bytearray()
    while data := await asyncio.wait_for(loop.sock_recv(sock, 1 << 20), STEP):
        out += data
    return bytes(out)


async def poll(condition: Callable[[], bool], what: str) -> None:
    """Wait (bounded) until ``condition()`` holds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + STEP
    while not condition():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.001)


# --- listener mode: the engine dials a node itself (hs_connect) ---------------------------------

SOCKS_CONNECT_LOOPBACK_80 = b"\x05\x01\x00" + b"\x05\x01\x00\x01\x7f\x00\x00\x01\x00\x50"  # greeting, CONNECT


class DialingListener:
    """Answers the engine's SOCKS5 request with hs_connect: the engine dials ``node`` itself with
    ``framing`` and ``head``; a handover fails the test."""

    def __init__(self, engine: Any, node: tuple[str, int], framing: Any, head: bytes, rec: Recorder) -> None:
        self.engine, self.node, self.framing, self.head, self.rec = engine, node, framing, head, rec

    def socks_request(self, token: int, src_host: str, src_port: int, host: str, port: int) -> None:
        self.engine.hs_connect(token, self.node[0], self.node[1], -1, self.rec, self.framing, self.head)

    def socks_handover(
        self, fd: int, data: bytes, answered: int, err: int, src_host: str, src_port: int
    ) -> None:
        os.close(fd)
        raise AssertionError("the handshake was handed over")

    def socks_dropped(self) -> None:
        pass


async def engine_dialled(
    engine: Any, framing: Any, head: bytes, early: bytes
) -> tuple[socket.socket, socket.socket, Recorder, int]:
    """A SOCKS5 client (CONNECT 127.0.0.1:80, then ``early``) whose request the engine dials to a
    node the test plays: (the client, the node's accepted end, the recorder, the listener id)."""
    loop = asyncio.get_running_loop()
    rec = Recorder()
    node = socket.create_server(("127.0.0.1", 0))
    node.setblocking(False)
    listening = socket.create_server(("127.0.0.1", 0))
    lid = engine.listen(listening.fileno(), DialingListener(engine, node.getsockname(), framing, head, rec))
    client = socket.create_connection(listening.getsockname())
    client.setblocking(False)
    await loop.sock_sendall(client, SOCKS_CONNECT_LOOPBACK_80 + early)
    srv, _ = await asyncio.wait_for(loop.sock_accept(node), STEP)
    srv.setblocking(False)
    node.close()
    listening.close()
    return client, srv, rec, lid
