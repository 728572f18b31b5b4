"""The mixed inbound as the reload reconciler drives it, over real loopback sockets.

bind() before serve(), close_unserved(), handler swaps on the same listening socket
(asyncio path and SOCKS5 fast path), sessions closed by tag, principals revoked under
each removal policy (FakeClock for the grace), and the refusal of a revoked principal's
first flow. Every test body runs on stock asyncio and on uvloop; the fast-path tests
also run over each relay engine (the compiled one when built, and its Python twin).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import socket
from collections.abc import AsyncIterator

import pytest
from helpers.aio import close_writer, socks5_open, until
from helpers.engines import FASTPATH_ENGINES, fastpath_engine
from helpers.servers import EchoServer, HttpOrigin
from helpers.socks import encode_address

from honk.config.policies import CLOSE, KEEP, close_after
from honk.config.spec import GlobalSpec, InboundSpec, InboundUser, RoutingSpec, Spec
from honk.connection.dispatch import Dispatcher
from honk.connection.plane import SystemResolver, build_plane
from honk.connection.tracker import ConnectionTracker
from honk.core.clock import FakeClock
from honk.inbound.mixed import MixedInbound
from honk.inbound.sessions import USER_REMOVED_TEXT, SessionRegistry, admit

STEP = 5.0  # seconds: the most any single wait may take
YIELDS = 10_000  # loop turns a test waits for something the loop does by itself (an accept)
GRACE = 5.0  # seconds of the FakeClock: the close_after grace
JUST_BEFORE = 4.9  # seconds: still inside the grace
NO_REPLY_TURNS = 50  # loop turns a client waits to show that nothing answered it
HTTP_FORBIDDEN = b"HTTP/1.1 403 "
HTTP_AUTH_REQUIRED = b"HTTP/1.1 407 "
SOCKS_NOT_ALLOWED = 0x02
SOCKS_METHOD_REFUSED = 0xFF  # what socks5_open reports for a refused method or failed auth

ALICE = InboundUser("alice", "wonderland")
BOB = InboundUser("bob", "builder")

ENGINES = FASTPATH_ENGINES


@pytest.fixture(params=ENGINES)
def engine_name(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def asyncio_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inbounds built without an explicit engine serve on the asyncio path."""
    monkeypatch.setenv("HONK_FASTPATH", "off")


class World:
    """One dispatcher, tracker and session registry; the inbounds a test makes on them."""

    def __init__(self, clock: FakeClock) -> None:
        glob = GlobalSpec(connect_timeout=2.0)
        spec = Spec(global_=glob, inbounds=(), routing=RoutingSpec(rules=(), fallback="direct"))
        self.clock = clock
        self.tracker = ConnectionTracker(clock)
        self.dispatcher = Dispatcher(
            build_plane(spec, clock, 1), self.tracker, clock, glob, SystemResolver(clock, 2.0)
        )
        self.sessions = SessionRegistry()
        self.inbounds: list[MixedInbound] = []
        self.engines: list[object] = []

    def inbound(
        self, name: str, users: tuple[InboundUser, ...] = (), engine: str | None = None
    ) -> MixedInbound:
        fast = None
        if engine is not None:
            fast = fastpath_engine(engine)
            self.engines.append(fast)
        inbound = MixedInbound(
            _spec(name, users), self.dispatcher, self.clock, engine=fast, sessions=self.sessions
        )
        self.inbounds.append(inbound)
        return inbound

    async def serving(
        self, name: str, users: tuple[InboundUser, ...] = (), engine: str | None = None
    ) -> tuple[MixedInbound, int]:
        """An inbound bound and served, with its port."""
        inbound = self.inbound(name, users, engine)
        await inbound.start()
        return inbound, _port(inbound)

    async def aclose(self) -> None:
        for inbound in self.inbounds:
            await inbound.aclose()
        self.tracker.close_all("test over")
        await asyncio.wait_for(self.tracker.wait_idle(), STEP)
        for engine in self.engines:
            engine.close()  # type: ignore[attr-defined]


def _spec(name: str, users: tuple[InboundUser, ...] = ()) -> InboundSpec:
    return InboundSpec(name=name, kind="mixed", host="127.0.0.1", port=0, users=users)


@contextlib.asynccontextmanager
async def world() -> AsyncIterator[World]:
    w = World(FakeClock())
    try:
        yield w
    finally:
        await w.aclose()


def _port(inbound: MixedInbound) -> int:
    assert inbound.bound is not None
    return inbound.bound.port


def listening_inodes(port: int) -> list[int]:
    """Inodes of the kernel's LISTEN sockets on ``port`` (IPv4 and IPv6)."""
    inodes = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError), open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                local, state, inode = fields[1], fields[3], int(fields[9])
                if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                    inodes.append(inode)
    return inodes


async def connect_through(port: int, echo: EchoServer, auth: tuple[str, str] | None = None):
    reader, writer, rep, _ = await socks5_open(port, "127.0.0.1", echo.port, auth=auth)
    assert rep == 0, f"CONNECT refused with {rep:#x}"
    return reader, writer


async def echoes(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes = b"ping") -> bool:
    writer.write(data)
    return await asyncio.wait_for(reader.readexactly(len(data)), STEP) == data


async def ended(reader: asyncio.StreamReader) -> bool:
    """The proxy ended the client's connection (EOF or reset) within STEP."""
    try:
        rest = await asyncio.wait_for(reader.read(), STEP)
    except (ConnectionResetError, BrokenPipeError):
        return True
    return rest == b""


def _basic(user: InboundUser) -> str:
    return base64.b64encode(f"{user.username}:{user.password}".encode()).decode()


def _http_get(origin: HttpOrigin, path: str, user: InboundUser | None = None) -> bytes:
    auth = f"Proxy-Authorization: Basic {_basic(user)}\r\n" if user is not None else ""
    return (f"GET {origin.url(path)} HTTP/1.1\r\nHost: 127.0.0.1:{origin.port}\r\n{auth}\r\n").encode()


async def _read_head(reader: asyncio.StreamReader) -> bytes:
    return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), STEP)


async def _read_response(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await _read_head(reader)
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
    )
    return head, await asyncio.wait_for(reader.readexactly(length), STEP)


# --- bind, serve, close_unserved ---------------------------------------------------------------


@pytest.mark.parametrize("path", ["asyncio", *ENGINES])
def test_a_client_that_connects_between_bind_and_serve_is_served_only_after_serve(
    run, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HONK_FASTPATH", "off")

    async def main() -> None:
        loop = asyncio.get_running_loop()
        with EchoServer() as echo:
            async with world() as w:
                inbound = w.inbound("lan", engine=None if path == "asyncio" else path)
                await inbound.bind()
                client = socket.create_connection(("127.0.0.1", _port(inbound)))  # the backlog takes it
                try:
                    client.setblocking(False)
                    client.sendall(b"\x05\x01\x00")
                    for _ in range(NO_REPLY_TURNS):
                        await asyncio.sleep(0)
                    with pytest.raises(BlockingIOError):
                        client.recv(2)
                    assert len(w.sessions) == 0 and inbound.active == 0

                    await inbound.serve()

                    assert await asyncio.wait_for(loop.sock_recv(client, 2), STEP) == b"\x05\x00"
                    await loop.sock_sendall(client, b"\x05\x01\x00" + encode_address("127.0.0.1", echo.port))
                    reply = await asyncio.wait_for(loop.sock_recv(client, 10), STEP)
                    assert reply[1] == 0
                    await loop.sock_sendall(client, b"queued")
                    assert await asyncio.wait_for(loop.sock_recv(client, 6), STEP) == b"queued"
                finally:
                    client.close()

    run(main())


def test_close_unserved_releases_the_port_at_once(run, asyncio_path) -> None:
    async def main() -> None:
        async with world() as w:
            inbound = w.inbound("lan")
            await inbound.bind()
            port = _port(inbound)
            assert listening_inodes(port)

            inbound.close_unserved()

            assert listening_inodes(port) == []
            with socket.socket() as again:  # no SO_REUSEADDR: the port must really be free
                again.bind(("127.0.0.1", port))
                again.listen()
            with pytest.raises(RuntimeError):
                await inbound.serve()

    run(main())


def test_bind_failure_raises_oserror_and_leaves_nothing_open(run, asyncio_path) -> None:
    async def main() -> None:
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            async with world() as w:
                inbound = MixedInbound(
                    InboundSpec("lan", "mixed", "127.0.0.1", port), w.dispatcher, w.clock, sessions=w.sessions
                )
                with pytest.raises(OSError):
                    await inbound.bind()
                assert inbound.bound is None
                assert len(listening_inodes(port)) == 1  # only the test's own socket

    run(main())


# --- swaps ---------------------------------------------------------------------------------------


def test_swap_keeps_the_socket_and_old_flows_while_new_clients_must_authenticate(run, asyncio_path) -> None:
    async def main() -> None:
        with EchoServer() as echo:
            async with world() as w:
                inbound, port = await w.serving("lan")
                [inode] = listening_inodes(port)
                old_reader, old_writer = await connect_through(port, echo)

                inbound.swap(_spec("lan", (ALICE,)))

                assert listening_inodes(port) == [inode]
                assert await echoes(old_reader, old_writer, b"still here")
                _, w1, rep, _ = await socks5_open(port, "127.0.0.1", echo.port)
                assert rep == SOCKS_METHOD_REFUSED
                _, w2, rep, _ = await socks5_open(port, "127.0.0.1", echo.port, auth=("alice", "wrong"))
                assert rep == SOCKS_METHOD_REFUSED
                reader, writer = await connect_through(port, echo, auth=(ALICE.username, ALICE.password))
                assert await echoes(reader, writer)
                r3, w3 = await asyncio.open_connection("127.0.0.1", port)
                w3.write(f"CONNECT 127.0.0.1:{echo.port} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                assert (await _read_head(r3)).startswith(HTTP_AUTH_REQUIRED)
                for writer_ in (old_writer, w1, w2, writer, w3):
                    await close_writer(writer_)

    run(main())


def test_swap_from_the_fast_path_to_users_moves_the_same_listening_socket(run, engine_name) -> None:
    async def main() -> None:
        with EchoServer() as echo:
            async with world() as w:
                inbound = w.inbound("lan", engine=engine_name)
                await inbound.start()
                assert inbound._fast is not None  # the engine accepts
                port = _port(inbound)
                [inode] = listening_inodes(port)
                old_reader, old_writer = await connect_through(port, echo)

                inbound.swap(_spec("lan", (ALICE,)))

                assert listening_inodes(port) == [inode]
                assert await echoes(old_reader, old_writer, b"fast flow lives")
                _, w1, rep, _ = await socks5_open(port, "127.0.0.1", echo.port)
                # refused: by method (asyncio), or, if the compiled worker accepted it before the
                # move landed, at the request (the fast path never skips a required password)
                assert rep in (SOCKS_METHOD_REFUSED, SOCKS_NOT_ALLOWED)
                reader, writer = await connect_through(port, echo, auth=(ALICE.username, ALICE.password))
                assert await echoes(reader, writer)
                assert listening_inodes(port) == [inode]

                inbound.swap(_spec("lan"))  # back to no users: the asyncio server may stay

                r2, w2 = await connect_through(port, echo)
                assert await echoes(r2, w2)
                assert listening_inodes(port) == [inode]
                for writer_ in (old_writer, w1, writer, w2):
                    await close_writer(writer_)

    run(main())


def test_a_fast_path_handshake_that_spans_a_swap_to_users_is_refused(run, engine_name) -> None:
    async def main() -> None:
        with EchoServer() as echo:
            async with world() as w:
                inbound = w.inbound("lan", engine=engine_name)
                await inbound.start()
                reader, writer = await asyncio.open_connection("127.0.0.1", _port(inbound))
                writer.write(b"\x05\x01\x00")
                assert (
                    await asyncio.wait_for(reader.readexactly(2), STEP) == b"\x05\x00"
                )  # the worker answered

                inbound.swap(_spec("lan", (ALICE,)))
                writer.write(b"\x05\x01\x00" + encode_address("127.0.0.1", echo.port))

                reply = await asyncio.wait_for(reader.readexactly(10), STEP)
                assert reply[1] == SOCKS_NOT_ALLOWED
                assert w.tracker.opened == 0
                await close_writer(writer)

    run(main())


def test_a_renamed_handler_tags_new_sessions_and_old_ones_keep_their_tag(run, asyncio_path) -> None:
    async def main() -> None:
        with EchoServer() as echo:
            async with world() as w:
                inbound, port = await w.serving("lan")
                old_reader, old_writer = await connect_through(port, echo)

                inbound.swap(_spec("office"))
                new_reader, new_writer = await connect_through(port, echo)

                assert sorted(info.inbound for info in w.tracker.snapshot()) == ["lan", "office"]
                assert w.sessions.close_tag("lan") == 1
                assert await ended(old_reader)
                assert await echoes(new_reader, new_writer)
                await close_writer(old_writer)
                await close_writer(new_writer)

    run(main())


def test_swap_refuses_another_bind(run, asyncio_path) -> None:
    async def main() -> None:
        async with world() as w:
            inbound = w.inbound("lan")
            await inbound.start()
            with pytest.raises(ValueError):
                inbound.swap(InboundSpec("lan", "mixed", "127.0.0.1", _port(inbound) + 1))

    run(main())


# --- sessions by tag -----------------------------------------------------------------------------


def test_close_tag_ends_handshaking_and_relaying_sessions_of_that_tag_only(run, asyncio_path) -> None:
    async def main() -> None:
        with EchoServer() as echo:
            async with world() as w:
                lan, wan = w.inbound("lan"), w.inbound("wan")
                await lan.start()
                await wan.start()
                relaying_r, relaying_w = await connect_through(_port(lan), echo)
                shaking_r, shaking_w = await asyncio.open_connection("127.0.0.1", _port(lan))
                shaking_w.write(b"\x05\x01\x00")
                assert (
                    await asyncio.wait_for(shaking_r.readexactly(2), STEP) == b"\x05\x00"
                )  # now mid-handshake
                other_r, other_w = await connect_through(_port(wan), echo)
                await lan.stop_accepting()  # sessions outlive their listener (RL-43)
                assert await echoes(relaying_r, relaying_w)

                assert w.sessions.close_tag("lan", "inbound lan was removed") == 2

                assert await ended(relaying_r)
                assert await ended(shaking_r)
                assert await echoes(other_r, other_w)
                await until(lambda: not w.sessions.sessions("lan"), "lan's sessions finished", YIELDS)
                for writer in (relaying_w, shaking_w, other_w):
                    await close_writer(writer)

    run(main())


def test_close_tag_ends_the_fast_paths_flows_of_that_tag(run, engine_name) -> None:
    async def main() -> None:
        with EchoServer() as echo:
            async with world() as w:
                inbound = w.inbound("lan", engine=engine_name)
                await inbound.start()
                reader, writer = await connect_through(_port(inbound), echo)
                await inbound.stop_accepting()
                assert await echoes(reader, writer)

                assert w.sessions.close_tag("lan") == 1

                assert await ended(reader)
                await close_writer(writer)

    run(main())


# --- principals -------------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["keep", "close", "close_after"])
def test_revoke_applies_the_policy_to_sessions_of_that_principal_only(run, asyncio_path, policy: str) -> None:
    async def main() -> None:
        with EchoServer() as echo:
            async with world() as w:
                lan, wan = w.inbound("lan", (ALICE, BOB)), w.inbound("wan", (ALICE,))
                await lan.start()
                await wan.start()
                alice = await connect_through(_port(lan), echo, auth=(ALICE.username, ALICE.password))
                bob = await connect_through(_port(lan), echo, auth=(BOB.username, BOB.password))
                alice_on_wan = await connect_through(_port(wan), echo, auth=(ALICE.username, ALICE.password))
                chosen = {"keep": KEEP, "close": CLOSE, "close_after": close_after(GRACE)}[policy]

                w.sessions.revoke([lan.admissions["alice"]], chosen, w.clock)

                if policy == "keep":
                    assert await echoes(*alice)
                elif policy == "close":
                    assert await ended(alice[0])
                else:
                    w.clock.advance(JUST_BEFORE)
                    assert await echoes(*alice)
                    w.clock.advance(GRACE - JUST_BEFORE)
                    assert await ended(alice[0])
                assert await echoes(*bob)
                assert await echoes(*alice_on_wan)
                for _, writer in (alice, bob, alice_on_wan):
                    await close_writer(writer)

    run(main())


def test_revoked_principal_is_refused_on_the_sessions_first_flow(run, asyncio_path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="honk.inbound")

    async def main() -> None:
        with EchoServer() as echo:
            async with world() as w:
                inbound = w.inbound("lan", (ALICE,))
                await inbound.start()
                reader, writer = await asyncio.open_connection("127.0.0.1", _port(inbound))
                writer.write(b"\x05\x01\x02\x01\x05alice\x0awonderland")
                assert (
                    await asyncio.wait_for(reader.readexactly(4), STEP) == b"\x05\x02\x01\x00"
                )  # authenticated

                w.sessions.revoke([inbound.admissions["alice"]], KEEP, w.clock)
                writer.write(b"\x05\x01\x00" + encode_address("127.0.0.1", echo.port))

                reply = await asyncio.wait_for(reader.readexactly(10), STEP)
                assert reply[1] == SOCKS_NOT_ALLOWED
                assert await ended(reader)
                assert w.tracker.opened == 0
                await close_writer(writer)

    run(main())
    lines = [r.getMessage() for r in caplog.records if USER_REMOVED_TEXT in r.getMessage()]
    assert lines == [f"{USER_REMOVED_TEXT} inbound=lan user=alice"]
    assert all(r.levelno == logging.INFO for r in caplog.records if USER_REMOVED_TEXT in r.getMessage())


def test_an_http_request_under_a_revoked_principal_is_refused_with_403(run, asyncio_path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="honk.inbound")

    async def main() -> None:
        with HttpOrigin() as origin:
            async with world() as w:
                inbound = w.inbound("lan", (ALICE, BOB))
                await inbound.start()
                reader, writer = await asyncio.open_connection("127.0.0.1", _port(inbound))
                await until(lambda: len(w.sessions) == 1, "the connection was accepted", YIELDS)
                # a reload removes alice while the connection (served with the old table) is open
                admissions, revoked = admit(inbound.admissions, "lan", (BOB,))
                w.sessions.revoke(revoked, KEEP, w.clock)
                inbound.store_users(admissions)

                writer.write(_http_get(origin, "/first", ALICE))

                assert (await _read_head(reader)).startswith(HTTP_FORBIDDEN)
                assert await ended(reader)
                assert origin.paths == []
                await close_writer(writer)

    run(main())
    assert sum(USER_REMOVED_TEXT in r.getMessage() for r in caplog.records) == 1


def test_keep_spares_an_http_session_that_already_opened_a_flow(run, asyncio_path) -> None:
    async def main() -> None:
        with HttpOrigin() as origin:
            async with world() as w:
                inbound = w.inbound("lan", (ALICE,))
                await inbound.start()
                reader, writer = await asyncio.open_connection("127.0.0.1", _port(inbound))
                writer.write(_http_get(origin, "/before", ALICE))
                head, _ = await _read_response(reader)
                assert head.startswith(b"HTTP/1.1 200")

                w.sessions.revoke([inbound.admissions["alice"]], KEEP, w.clock)
                writer.write(_http_get(origin, "/after", ALICE))

                head, body = await _read_response(reader)
                assert head.startswith(b"HTTP/1.1 200")
                assert body == HttpOrigin.body_for("/after")
                await close_writer(writer)

    run(main())


def test_store_users_applies_to_connections_accepted_afterwards(run, asyncio_path) -> None:
    async def main() -> None:
        with EchoServer() as echo:
            async with world() as w:
                inbound, port = await w.serving("lan", (ALICE,))
                kept = inbound.admissions["alice"]
                admissions, revoked = admit(inbound.admissions, "lan", (ALICE, BOB))

                inbound.store_users(admissions)

                assert revoked == [] and inbound.admissions["alice"] is kept
                reader, writer = await connect_through(port, echo, auth=(BOB.username, BOB.password))
                assert await echoes(reader, writer)
                [session] = w.sessions.sessions("lan")
                assert session.principal is admissions["bob"]
                await close_writer(writer)

    run(main())


def test_registry_aclose_ends_a_stalled_handshake_and_a_pending_grace_at_once(run, asyncio_path) -> None:
    async def main() -> None:
        with EchoServer() as echo:
            async with world() as w:
                inbound = w.inbound("lan", (ALICE,))
                await inbound.start()
                alice = await connect_through(_port(inbound), echo, auth=(ALICE.username, ALICE.password))
                stalled_r, stalled_w = await asyncio.open_connection("127.0.0.1", _port(inbound))
                stalled_w.write(b"\x05")  # half a greeting, then nothing
                await until(lambda: len(w.sessions) == 2, "the stalled client was accepted", YIELDS)
                w.sessions.revoke([inbound.admissions["alice"]], close_after(3600.0), w.clock)

                assert await w.sessions.aclose() == 2

                assert w.sessions.pending_timers == 0
                assert await ended(alice[0])
                assert await ended(stalled_r)
                await close_writer(alice[1])
                await close_writer(stalled_w)

    run(main())
