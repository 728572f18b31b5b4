"""DirectOutbound over real loopback sockets, on asyncio and on uvloop.

Only 127.0.0.0/8 and ::1 are ever dialed. Timing scenarios run on a FakeClock:
a connect that must "hang" is an injected connector that never finishes, so no
test waits on wall time.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import os
import socket
from collections.abc import Callable

import pytest
from helpers.peers import require_ipv6_loopback

from honk.core.clock import FakeClock, MonotonicClock
from honk.core.errors import Blocked, DialError, DialTimeout
from honk.core.net import Address
from honk.outbound.block import BlockOutbound
from honk.outbound.direct import BYPASS_MARK, CONNECTION_ATTEMPT_DELAY, SO_MARK, ConnectFailed, DirectOutbound
from honk.route.resolve import ResolveError

SAFETY = 10.0  # seconds; only a guard against a hung test, never a synchronisation point
CONNECT_TIMEOUT = 3.0


@pytest.fixture
def ipv6() -> None:
    require_ipv6_loopback()  # with CI=true a machine without ::1 fails these tests


needs_ipv6 = pytest.mark.usefixtures("ipv6")


def listener(host: str) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    sock.listen(8)
    sock.setblocking(False)
    return sock


def closed_port(host: str, port: int = 0) -> socket.socket:
    """A bound socket that does not listen: connecting to it is refused."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.bind((host, port))
    return sock


def fixed_resolver(*answers: str):
    async def resolve(host: str) -> list:
        return [ipaddress.ip_address(a) for a in answers]

    return resolve


async def until(condition: Callable[[], bool], turns: int = 1000) -> None:
    """Let the loop run until ``condition`` holds; fails after ``turns`` iterations."""
    for _ in range(turns):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never held")


class RecordingConnector:
    """Connects for real, except to addresses in ``hang``, whose attempts never finish."""

    def __init__(self, hang: set[str] = frozenset()) -> None:
        self.hang = hang
        self.attempts: list[tuple[str, socket.socket]] = []

    async def __call__(self, sock: socket.socket, address: tuple) -> None:
        self.attempts.append((address[0], sock))
        if address[0] in self.hang:
            await asyncio.get_running_loop().create_future()
        await asyncio.get_running_loop().sock_connect(sock, address)


async def echo_roundtrip(client: socket.socket, server: socket.socket) -> None:
    loop = asyncio.get_running_loop()
    peer, _ = await asyncio.wait_for(loop.sock_accept(server), SAFETY)
    with peer:
        await loop.sock_sendall(client, b"ping")
        assert await asyncio.wait_for(loop.sock_recv(peer, 4), SAFETY) == b"ping"


# --- happy paths ------------------------------------------------------------------


def test_direct_dials_a_local_ipv4_listener(run) -> None:
    async def scenario() -> None:
        clock = MonotonicClock()
        with listener("127.0.0.1") as server:
            port = server.getsockname()[1]
            direct = DirectOutbound(clock, CONNECT_TIMEOUT)
            sock = await asyncio.wait_for(
                direct.connect(Address("127.0.0.1", port), clock.now() + SAFETY), SAFETY
            )
            with sock:
                assert sock.getpeername() == ("127.0.0.1", port)
                assert sock.getblocking() is False
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
                await echo_roundtrip(sock, server)

    run(scenario())


@needs_ipv6
def test_direct_dials_a_local_ipv6_listener(run) -> None:
    async def scenario() -> None:
        clock = MonotonicClock()
        with listener("::1") as server:
            port = server.getsockname()[1]
            direct = DirectOutbound(clock, CONNECT_TIMEOUT)
            sock = await asyncio.wait_for(direct.connect(Address("::1", port), clock.now() + SAFETY), SAFETY)
            with sock:
                assert sock.family == socket.AF_INET6
                assert sock.getpeername()[:2] == ("::1", port)
                await echo_roundtrip(sock, server)

    run(scenario())


def test_direct_resolves_localhost_with_the_system_resolver(run) -> None:
    async def scenario() -> None:
        clock = MonotonicClock()
        families = {ai[4][0] for ai in socket.getaddrinfo("localhost", None, type=socket.SOCK_STREAM)}
        with listener("127.0.0.1") as v4:
            port = v4.getsockname()[1]
            # where localhost also names ::1, listen there too so either family may win
            v6 = listener_on("::1", port) if "::1" in families else None
            try:
                direct = DirectOutbound(clock, CONNECT_TIMEOUT)
                sock = await asyncio.wait_for(
                    direct.connect(Address("localhost", port), clock.now() + SAFETY), SAFETY
                )
                with sock:
                    assert sock.getpeername()[1] == port
            finally:
                if v6 is not None:
                    v6.close()

    run(scenario())


def listener_on(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(8)
    return sock


def test_direct_dial_is_a_plain_stream_with_the_bypass_mark_when_permitted(run) -> None:
    try:
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, SO_MARK, 1)
        permitted = True
    except PermissionError:
        permitted = False

    async def scenario() -> None:
        clock = MonotonicClock()
        with listener("127.0.0.1") as server:
            direct = DirectOutbound(clock, CONNECT_TIMEOUT)
            dialed = await direct.dial_tcp(
                Address("127.0.0.1", server.getsockname()[1]), clock.now() + SAFETY
            )
            with dialed.sock:
                mark = dialed.sock.getsockopt(socket.SOL_SOCKET, SO_MARK)
        assert dialed.framing is None  # a plain stream: the relay splices it
        assert mark == (BYPASS_MARK if permitted else 0)

    run(scenario())


# --- failures -----------------------------------------------------------------------


def test_refused_connection_is_a_typed_dial_error_with_errno(run) -> None:
    async def scenario() -> None:
        clock = MonotonicClock()
        with closed_port("127.0.0.1") as hole:
            direct = DirectOutbound(clock, CONNECT_TIMEOUT)
            with pytest.raises(DialError) as info:
                await asyncio.wait_for(
                    direct.connect(Address("127.0.0.1", hole.getsockname()[1]), clock.now() + SAFETY), SAFETY
                )
        error = info.value
        assert isinstance(error, ConnectFailed) and not isinstance(error, DialTimeout)
        assert (error.outbound, error.phase, error.errno) == ("direct", "connect", errno.ECONNREFUSED)

    run(scenario())


def test_resolution_failure_is_a_resolve_phase_dial_error(run) -> None:
    async def fails(host: str) -> list:
        raise ResolveError(host, "no such name")

    async def scenario() -> None:
        clock = FakeClock()
        direct = DirectOutbound(clock, CONNECT_TIMEOUT, resolver=fails)
        with pytest.raises(DialError) as info:
            await direct.connect(Address("nx.invalid", 80), clock.now() + 10)
        assert info.value.phase == "resolve" and not isinstance(info.value, DialTimeout)

    run(scenario())


# --- Happy Eyeballs ---------------------------------------------------------------


@needs_ipv6
def test_closed_first_family_falls_over_to_the_other_at_once(run) -> None:
    async def scenario() -> None:
        clock = FakeClock()  # never advanced: the fallover must not wait for the attempt delay
        with listener("127.0.0.1") as server:
            port = server.getsockname()[1]
            with closed_port("::1", port):
                connector = RecordingConnector()
                direct = DirectOutbound(
                    clock, CONNECT_TIMEOUT, resolver=fixed_resolver("::1", "127.0.0.1"), connect=connector
                )
                sock = await asyncio.wait_for(
                    direct.connect(Address("dual.test", port), clock.now() + 10), SAFETY
                )
                with sock:
                    assert sock.getpeername() == ("127.0.0.1", port)
                    await echo_roundtrip(sock, server)
        assert [host for host, _ in connector.attempts] == ["::1", "127.0.0.1"]
        assert connector.attempts[0][1].fileno() == -1  # the refused socket is closed

    run(scenario())


@needs_ipv6
def test_next_attempt_starts_after_the_attempt_delay_and_the_loser_is_closed(run) -> None:
    async def scenario() -> None:
        clock = FakeClock()
        with listener("127.0.0.1") as server:
            port = server.getsockname()[1]
            connector = RecordingConnector(hang={"::1"})
            direct = DirectOutbound(
                clock, CONNECT_TIMEOUT, resolver=fixed_resolver("::1", "127.0.0.1"), connect=connector
            )
            dial = asyncio.ensure_future(direct.connect(Address("dual.test", port), clock.now() + 10))
            await until(lambda: len(connector.attempts) == 1 and clock.sleepers == 2)  # deadline + stagger
            clock.advance(CONNECTION_ATTEMPT_DELAY - 0.001)
            for _ in range(20):
                await asyncio.sleep(0)
            assert len(connector.attempts) == 1 and not dial.done()
            clock.advance(0.001)
            sock = await asyncio.wait_for(dial, SAFETY)
            with sock:
                assert sock.getpeername() == ("127.0.0.1", port)
        assert [host for host, _ in connector.attempts] == ["::1", "127.0.0.1"]
        assert connector.attempts[0][1].fileno() == -1  # the hanging attempt was cancelled and closed
        assert clock.sleepers == 0

    run(scenario())


def test_interleaving_starts_with_the_first_returned_family(run) -> None:
    async def scenario() -> None:
        clock = FakeClock()
        connector = RecordingConnector(hang={"127.0.0.2", "127.0.0.3", "::1"})
        direct = DirectOutbound(
            clock,
            CONNECT_TIMEOUT,
            resolver=fixed_resolver("127.0.0.2", "127.0.0.3", "::1"),
            connect=connector,
        )
        dial = asyncio.ensure_future(direct.connect(Address("dual.test", 9), clock.now() + 10))
        for expected in (1, 2, 3):
            await until(lambda n=expected: len(connector.attempts) == n)
            clock.advance(CONNECTION_ATTEMPT_DELAY)
        assert [host for host, _ in connector.attempts] == ["127.0.0.2", "::1", "127.0.0.3"]
        clock.advance(CONNECT_TIMEOUT)
        with pytest.raises(DialTimeout):
            await asyncio.wait_for(dial, SAFETY)

    run(scenario())


def test_connect_deadline_expiry_is_dial_timeout(run) -> None:
    async def scenario() -> None:
        clock = FakeClock()
        connector = RecordingConnector(hang={"127.0.0.1"})
        direct = DirectOutbound(clock, CONNECT_TIMEOUT, connect=connector)
        dial = asyncio.ensure_future(direct.connect(Address("127.0.0.1", 9), clock.now() + 60))
        await until(lambda: len(connector.attempts) == 1 and clock.sleepers == 1)
        clock.advance(CONNECT_TIMEOUT - 0.001)
        for _ in range(20):
            await asyncio.sleep(0)
        assert not dial.done()
        clock.advance(0.001)  # connect_timeout bounds the stage even with a later overall deadline
        with pytest.raises(DialTimeout) as info:
            await asyncio.wait_for(dial, SAFETY)
        assert info.value.phase == "connect"
        assert connector.attempts[0][1].fileno() == -1
        assert clock.sleepers == 0

    run(scenario())


def test_overall_deadline_before_connect_timeout_wins(run) -> None:
    async def scenario() -> None:
        clock = FakeClock()
        connector = RecordingConnector(hang={"127.0.0.1"})
        direct = DirectOutbound(clock, CONNECT_TIMEOUT, connect=connector)
        dial = asyncio.ensure_future(direct.connect(Address("127.0.0.1", 9), clock.now() + 0.5))
        await until(lambda: len(connector.attempts) == 1)
        clock.advance(0.5)
        with pytest.raises(DialTimeout):
            await asyncio.wait_for(dial, SAFETY)

    run(scenario())


def test_resolution_deadline_expiry_is_a_resolve_phase_timeout(run) -> None:
    async def hangs(host: str) -> list:
        await asyncio.get_running_loop().create_future()
        return []

    async def scenario() -> None:
        clock = FakeClock()
        direct = DirectOutbound(clock, CONNECT_TIMEOUT, resolver=hangs)
        dial = asyncio.ensure_future(direct.connect(Address("slow.test", 80), clock.now() + 60))
        await until(lambda: clock.sleepers == 1)
        clock.advance(CONNECT_TIMEOUT)
        with pytest.raises(DialTimeout) as info:
            await asyncio.wait_for(dial, SAFETY)
        assert info.value.phase == "resolve"

    run(scenario())


def test_cancelling_a_dial_closes_its_attempts(run) -> None:
    async def scenario() -> None:
        clock = FakeClock()
        connector = RecordingConnector(hang={"127.0.0.1"})
        direct = DirectOutbound(clock, CONNECT_TIMEOUT, connect=connector)
        dial = asyncio.ensure_future(direct.connect(Address("127.0.0.1", 9), clock.now() + 60))
        await until(lambda: len(connector.attempts) == 1)
        dial.cancel()
        with pytest.raises(asyncio.CancelledError):
            await dial
        assert connector.attempts[0][1].fileno() == -1
        assert clock.sleepers == 0

    run(scenario())


# --- block -----------------------------------------------------------------------


def test_block_raises_blocked(run) -> None:
    async def scenario() -> None:
        with pytest.raises(Blocked):
            await BlockOutbound().dial_tcp(Address("127.0.0.1", 80), deadline=0.0)

    run(scenario())


def test_no_free_file_descriptor_is_a_capacity_refusal_not_a_network_error(run) -> None:
    import resource

    from honk.core.errors import CapacityRefused

    async def scenario() -> None:
        clock = MonotonicClock()
        direct = DirectOutbound(clock, CONNECT_TIMEOUT)
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        lowest_free = next(fd for fd in range(soft) if not _is_open(fd))
        resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))  # every fd below the limit is taken
        try:
            with pytest.raises(CapacityRefused):
                await direct.dial_tcp(Address("127.0.0.1", 9), clock.now() + SAFETY)
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    run(scenario())


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True
