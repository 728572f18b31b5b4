"""The mixed inbound end to end over loopback: real sockets, the real Plane, curl.

Every test body is a coroutine run once on stock asyncio and once on uvloop.
Origins are threads (http.server, TLS, UDP echo) so they work under either loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import logging
import random
import socket
import ssl
import struct
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import trustme
from helpers.aio import close_writer, rule, socks5_open
from helpers.peers import curl
from helpers.servers import SHUTDOWN_POLL, EchoServer

from honk.config.spec import (
    GlobalSpec,
    InboundSpec,
    InboundUser,
    MatchArg,
    Predicate,
    RoutingSpec,
    RuleSpec,
    Spec,
)
from honk.connection.dispatch import Dispatcher
from honk.connection.plane import SystemResolver, build_plane
from honk.connection.tracker import ConnectionTracker
from honk.core.clock import Clock, FakeClock, MonotonicClock
from honk.core.net import Address, Network
from honk.inbound.mixed import HANDSHAKE_TIMEOUT, MixedInbound
from honk.proto.socks5 import build_udp_datagram, parse_udp_datagram

STEP = 2.0  # seconds: the most any single wait in these tests may take


# --- origins ----------------------------------------------------------------------------


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        body = f"hello from origin path={self.path} host={self.headers.get('Host')}".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.send_header(
            "X-Proxy-Headers-Seen", ",".join(k for k in self.headers if k.lower().startswith("proxy"))
        )
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length)
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


class Origin:
    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.server.daemon_threads = True
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, args=(SHUTDOWN_POLL,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def origin():
    server = Origin()
    yield server
    server.close()


@pytest.fixture(scope="module")
def tls_origin(tmp_path_factory):
    ca = trustme.CA()
    cert = ca.issue_cert("localhost", "127.0.0.1")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(context)
    ca_path = tmp_path_factory.mktemp("ca") / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_path))
    server = Origin(context)
    server.ca_path = str(ca_path)  # type: ignore[attr-defined]
    yield server
    server.close()


@pytest.fixture
def echo():
    with EchoServer() as server:
        yield server


class UdpEcho:
    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                data, addr = self.sock.recvfrom(65536)
                self.sock.sendto(b"echo:" + data, addr)

    def close(self) -> None:
        self.sock.close()


# --- honk under test -----------------------------------------------------------------------


@dataclass
class Env:
    inbound: MixedInbound
    tracker: ConnectionTracker
    dispatcher: Dispatcher
    clock: Clock

    @property
    def port(self) -> int:
        assert self.inbound.bound is not None
        return self.inbound.bound.port


BLOCK_TEST_DOMAIN = RuleSpec(
    predicates=(Predicate("domain", (MatchArg("full", "blocked.test"),)),), outbound="block"
)


@contextlib.asynccontextmanager
async def honk(
    *,
    rules: tuple[RuleSpec, ...] = (BLOCK_TEST_DOMAIN,),
    users: tuple[InboundUser, ...] = (),
    clock: Clock | None = None,
) -> AsyncIterator[Env]:
    clock = clock or MonotonicClock()
    glob = GlobalSpec(connect_timeout=2.0)
    inbound_spec = InboundSpec(name="lan", kind="mixed", host="127.0.0.1", port=0, users=users)
    spec = Spec(global_=glob, inbounds=(inbound_spec,), routing=RoutingSpec(rules=rules, fallback="direct"))
    tracker = ConnectionTracker(clock)
    dispatcher = Dispatcher(build_plane(spec, clock, 1), tracker, clock, glob, SystemResolver(clock, 2.0))
    inbound = MixedInbound(inbound_spec, dispatcher, clock)
    await inbound.start()
    try:
        yield Env(inbound, tracker, dispatcher, clock)
    finally:
        await inbound.aclose()
        tracker.close_all("test over")
        await asyncio.wait_for(tracker.wait_idle(), STEP)


# --- clients -------------------------------------------------------------------------------


# --- curl ------------------------------------------------------------------------------------


def test_mixed_curl_socks5_hostname_fetches_body_from_local_origin(run, origin: Origin) -> None:
    async def main() -> None:
        async with honk() as env:
            code, out, err = await curl(
                "--socks5-hostname", f"127.0.0.1:{env.port}", f"http://localhost:{origin.port}/a"
            )
            assert code == 0, err
            assert out == f"hello from origin path=/a host=localhost:{origin.port}"

    run(main())


def test_mixed_curl_http_proxy_fetches_body_with_absolute_form(run, origin: Origin) -> None:
    async def main() -> None:
        async with honk() as env:
            code, out, err = await curl(
                "-i", "-x", f"http://127.0.0.1:{env.port}", f"http://127.0.0.1:{origin.port}/b?c=1"
            )
            assert code == 0, err
            assert out.startswith("HTTP/1.1 200")
            assert out.endswith(f"hello from origin path=/b?c=1 host=127.0.0.1:{origin.port}")
            assert "X-Proxy-Headers-Seen: \r\n" in out  # curl's Proxy-Connection did not reach the origin

    run(main())


def test_mixed_curl_https_through_connect_reaches_local_tls_origin(run, tls_origin: Origin) -> None:
    async def main() -> None:
        async with honk() as env:
            code, out, err = await curl(
                "--cacert",
                tls_origin.ca_path,  # type: ignore[attr-defined]
                "-x",
                f"http://127.0.0.1:{env.port}",
                "--proxytunnel",
                f"https://localhost:{tls_origin.port}/tls",
            )
            assert code == 0, err
            assert out == f"hello from origin path=/tls host=localhost:{tls_origin.port}"

    run(main())


# --- HTTP keep-alive ---------------------------------------------------------------------------


async def _read_response(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), STEP)
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
    )
    return head, await asyncio.wait_for(reader.readexactly(length), STEP)


def test_mixed_http_keep_alive_answers_several_requests_on_one_connection(run, origin: Origin) -> None:
    async def main() -> None:
        async with honk() as env:
            reader, writer = await asyncio.open_connection("127.0.0.1", env.port)
            hosts = [f"127.0.0.1:{origin.port}", f"127.0.0.1:{origin.port}", f"localhost:{origin.port}"]
            bodies = []
            for i, host in enumerate(hosts):
                writer.write(f"GET http://{host}/r{i} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
                head, body = await _read_response(reader)
                assert head.startswith(b"HTTP/1.1 200")
                bodies.append(body.decode())
            writer.write(
                f"POST http://{hosts[0]}/p HTTP/1.1\r\nHost: {hosts[0]}\r\nContent-Length: 5\r\n\r\nhello".encode()
            )
            _, echoed = await _read_response(reader)
            await close_writer(writer)

            assert bodies == [f"hello from origin path=/r{i} host={h}" for i, h in enumerate(hosts)]
            assert echoed == b"hello"

    run(main())


def test_mixed_http_pipelined_requests_are_answered_in_order(run, origin: Origin) -> None:
    async def main() -> None:
        async with honk() as env:
            reader, writer = await asyncio.open_connection("127.0.0.1", env.port)
            host = f"127.0.0.1:{origin.port}"
            writer.write(
                b"".join(f"GET http://{host}/{i} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode() for i in range(3))
            )
            bodies = [(await _read_response(reader))[1] for _ in range(3)]
            await close_writer(writer)

            assert [b.split(b" ")[3] for b in bodies] == [b"path=/0", b"path=/1", b"path=/2"]

    run(main())


# --- refusals ------------------------------------------------------------------------------------


def test_mixed_blocked_domain_gets_socks5_reply_2_and_http_403(run) -> None:
    async def main() -> None:
        async with honk() as env:
            _, writer, rep, _ = await socks5_open(env.port, "blocked.test", 80)
            await close_writer(writer)
            reader, writer = await asyncio.open_connection("127.0.0.1", env.port)
            writer.write(b"GET http://blocked.test/ HTTP/1.1\r\nHost: blocked.test\r\n\r\n")
            http_head = await asyncio.wait_for(reader.read(), STEP)
            await close_writer(writer)
            reader, writer = await asyncio.open_connection("127.0.0.1", env.port)
            writer.write(b"CONNECT blocked.test:443 HTTP/1.1\r\nHost: blocked.test:443\r\n\r\n")
            connect_head = await asyncio.wait_for(reader.read(), STEP)
            await close_writer(writer)

            assert rep == 0x02
            assert http_head.startswith(b"HTTP/1.1 403 ")
            assert connect_head.startswith(b"HTTP/1.1 403 ")

    run(main())


def test_mixed_refused_dial_gets_socks5_reply_5_and_http_502(run) -> None:
    async def main() -> None:
        with socket.socket() as probe:  # a port nothing listens on
            probe.bind(("127.0.0.1", 0))
            closed_port = probe.getsockname()[1]
        async with honk() as env:
            _, writer, rep, _ = await socks5_open(env.port, "127.0.0.1", closed_port)
            await close_writer(writer)
            reader, writer = await asyncio.open_connection("127.0.0.1", env.port)
            writer.write(f"CONNECT 127.0.0.1:{closed_port} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            head = await asyncio.wait_for(reader.read(), STEP)
            await close_writer(writer)

            assert rep == 0x05
            assert head.startswith(b"HTTP/1.1 502 ")

    run(main())


def test_mixed_socks5_bind_gets_reply_7(run) -> None:
    async def main() -> None:
        async with honk() as env:
            _, writer, rep, _ = await socks5_open(env.port, "127.0.0.1", 1, cmd=2)
            await close_writer(writer)
            assert rep == 0x07

    run(main())


# --- the connection table ----------------------------------------------------------------------------


def test_mixed_tracker_lists_open_flow_with_rule_and_chain_then_drops_it(run, echo: EchoServer) -> None:
    async def main() -> None:
        rules = (BLOCK_TEST_DOMAIN, rule("dport", str(echo.port), "direct"))
        async with honk(rules=rules) as env:
            reader, writer, rep, _ = await socks5_open(env.port, "127.0.0.1", echo.port)
            assert rep == 0
            writer.write(b"ping")
            assert await asyncio.wait_for(reader.readexactly(4), STEP) == b"ping"

            [info] = env.tracker.snapshot()
            assert info.network is Network.TCP
            assert info.inbound == "lan"
            assert info.target == Address("127.0.0.1", echo.port)
            assert info.rule == f"dport({echo.port})"
            assert info.chain == ("direct",)
            assert (info.upload, info.download) == (4, 4)
            assert info.plane_generation == 1

            writer.write_eof()
            assert await asyncio.wait_for(reader.read(), STEP) == b""
            await asyncio.wait_for(env.tracker.wait_idle(), STEP)
            await close_writer(writer)
            assert env.tracker.snapshot() == []

    run(main())


def test_mixed_tracker_close_by_id_ends_the_relay(run, echo: EchoServer) -> None:
    async def main() -> None:
        async with honk() as env:
            reader, writer, rep, _ = await socks5_open(env.port, "127.0.0.1", echo.port)
            writer.write(b"x")
            await asyncio.wait_for(reader.readexactly(1), STEP)
            [info] = env.tracker.snapshot()

            env.tracker.close(info.id)

            with contextlib.suppress(ConnectionResetError):
                assert await asyncio.wait_for(reader.read(), STEP) == b""
            await asyncio.wait_for(env.tracker.wait_idle(), STEP)
            await close_writer(writer)

    run(main())


# --- misbehaving clients ---------------------------------------------------------------------------------


def _reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def _send_and_close(port: int, data: bytes) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    with contextlib.suppress(OSError):
        writer.write(data)
        await writer.drain()
        writer.write_eof()
        await asyncio.wait_for(reader.read(), STEP)
    await close_writer(writer)


async def _vanish_mid_handshake(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"\x05\x01\x00")
    assert await asyncio.wait_for(reader.readexactly(2), STEP) == b"\x05\x00"  # being served
    writer.write(b"\x05\x01\x00\x03\x0aexam")
    await writer.drain()
    _reset(writer)


def test_mixed_bad_clients_end_only_their_own_flow_with_a_typed_error_and_log_line(
    run, origin: Origin, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="honk.inbound")
    rng = random.Random(7)
    garbage = b"\x16" + rng.randbytes(9_999)

    async def healthy(port: int) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        host = f"127.0.0.1:{origin.port}"
        writer.write(f"GET http://{host}/ok HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        _, body = await _read_response(reader)
        await close_writer(writer)
        return body

    async def main() -> bytes:
        async with honk() as env:
            results = await asyncio.gather(
                _send_and_close(env.port, garbage),
                _send_and_close(env.port, b"\x05\x02\x00"),
                _send_and_close(env.port, b"GET http://a.test/ HTTP/1.1\r\nX-Big: " + b"a" * (70 * 1024)),
                _vanish_mid_handshake(env.port),
                healthy(env.port),
            )
            await asyncio.wait_for(env.inbound.wait_closed(), STEP)
            return results[-1]

    body = run(main())

    assert body.startswith(b"hello from origin path=/ok")
    lines = [r.getMessage() for r in caplog.records if "flow ended during handshake" in r.getMessage()]
    reasons = sorted(line.split("reason=")[1] for line in lines)
    assert reasons == ["bad-request", "client-gone", "header-too-large", "truncated"], lines
    assert all("inbound=lan source=127.0.0.1:" in line for line in lines)
    errors = {line.split("error=")[1].split()[0] for line in lines}
    assert errors == {"ClientProtocolError", "ClientGone"}


def test_mixed_silent_client_is_cut_off_at_the_handshake_deadline(
    run, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="honk.inbound")

    async def main() -> bytes:
        clock = FakeClock()
        async with honk(clock=clock) as env:
            reader, writer = await asyncio.open_connection("127.0.0.1", env.port)
            writer.write(b"\x05")
            await writer.drain()
            while clock.sleepers == 0:  # the watchdog is armed once the connection is served
                await asyncio.sleep(0)
            clock.advance(HANDSHAKE_TIMEOUT - 0.5)
            await asyncio.sleep(0)
            assert env.inbound.active == 1
            clock.advance(0.5)
            data = b""  # an abort may reach the client as a reset rather than an EOF
            with contextlib.suppress(ConnectionResetError):
                data = await asyncio.wait_for(reader.read(), STEP)
            await close_writer(writer)
            await asyncio.wait_for(env.inbound.wait_closed(), STEP)
            return data

    assert run(main()) == b""
    assert any("error=HandshakeTimeout reason=timeout" in r.getMessage() for r in caplog.records)


# --- half-close -----------------------------------------------------------------------------------------


def test_mixed_half_close_client_eof_reaches_upstream_and_answer_still_arrives(run, echo: EchoServer) -> None:
    async def main() -> None:
        async with honk() as env:
            reader, writer, rep, _ = await socks5_open(env.port, "127.0.0.1", echo.port)
            writer.write(b"all of it")
            writer.write_eof()  # the echo server answers, then shuts down only after our EOF
            answer = await asyncio.wait_for(reader.read(), STEP)
            await close_writer(writer)
            await asyncio.wait_for(env.tracker.wait_idle(), STEP)
            assert rep == 0
            assert answer == b"all of it"

    run(main())


def test_mixed_half_close_through_http_connect_with_pipelined_payload(run, echo: EchoServer) -> None:
    async def main() -> None:
        async with honk() as env:
            reader, writer = await asyncio.open_connection("127.0.0.1", env.port)
            writer.write(f"CONNECT 127.0.0.1:{echo.port} HTTP/1.1\r\nHost: x\r\n\r\nearly bytes".encode())
            writer.write_eof()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), STEP)
            rest = await asyncio.wait_for(reader.read(), STEP)
            await close_writer(writer)
            assert head.startswith(b"HTTP/1.1 200 Connection established")
            assert rest == b"early bytes"

    run(main())


# --- UDP ASSOCIATE --------------------------------------------------------------------------------------------


def test_mixed_udp_associate_round_trip_and_removal_when_control_closes(run) -> None:
    udp_echo = UdpEcho()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        async with honk() as env:
            reader, writer, rep, bound = await socks5_open(env.port, "0.0.0.0", 0, cmd=3)
            assert rep == 0
            relay_ip = socket.inet_ntoa(bound[:4])
            relay_port = struct.unpack("!H", bound[4:6])[0]
            client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            client.setblocking(False)
            client.bind(("127.0.0.1", 0))
            try:
                target = Address("127.0.0.1", udp_echo.port)
                client.sendto(build_udp_datagram(target, b"ping"), (relay_ip, relay_port))
                reply = parse_udp_datagram(await asyncio.wait_for(loop.sock_recv(client, 65536), STEP))
                [info] = env.tracker.snapshot()
                assert info.network is Network.UDP
                assert info.target == target
                assert info.chain == ("direct",)
                assert (info.upload, info.download) == (4, 9)
            finally:
                client.close()
            assert reply.address == target
            assert reply.payload == b"echo:ping"

            await close_writer(writer)
            await asyncio.wait_for(env.tracker.wait_idle(), STEP)
            assert env.tracker.snapshot() == []

    try:
        run(main())
    finally:
        udp_echo.close()


def test_mixed_udp_associate_drops_blocked_targets_and_strangers(run) -> None:
    udp_echo = UdpEcho()
    rules = (rule("dport", str(udp_echo.port), "block"),)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        async with honk(rules=rules) as env:
            _, writer, rep, bound = await socks5_open(env.port, "0.0.0.0", 0, cmd=3)
            relay = (socket.inet_ntoa(bound[:4]), struct.unpack("!H", bound[4:6])[0])
            other = UdpEcho()  # a second echo on an allowed port proves the association still works
            client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            client.setblocking(False)
            client.bind(("127.0.0.1", 0))
            try:
                client.sendto(build_udp_datagram(Address("127.0.0.1", udp_echo.port), b"no"), relay)
                client.sendto(build_udp_datagram(Address("127.0.0.1", other.port), b"yes"), relay)
                reply = parse_udp_datagram(await asyncio.wait_for(loop.sock_recv(client, 65536), STEP))
            finally:
                client.close()
                other.close()
            await close_writer(writer)
            assert reply.payload == b"echo:yes"  # the blocked datagram never came back

    try:
        run(main())
    finally:
        udp_echo.close()


def test_mixed_udp_association_ends_after_idle_timeout_on_the_clock(run) -> None:
    async def main() -> None:
        clock = FakeClock()
        async with honk(clock=clock) as env:
            reader, writer, rep, _ = await socks5_open(env.port, "0.0.0.0", 0, cmd=3)
            assert len(env.tracker) == 1
            clock.advance(env.dispatcher.global_spec.udp_idle_timeout)
            assert (
                len(env.tracker.sweep_idle(clock.now(), 300, env.dispatcher.global_spec.udp_idle_timeout))
                == 1
            )
            assert await asyncio.wait_for(reader.read(), STEP) == b""  # the control connection is closed too
            await asyncio.wait_for(env.tracker.wait_idle(), STEP)
            await close_writer(writer)

    run(main())


# --- authentication -----------------------------------------------------------------------------------------


USERS = (InboundUser("alice", "s3cret"),)


def test_mixed_user_password_inbound_accepts_right_and_refuses_wrong_credentials(run, origin: Origin) -> None:
    async def main() -> None:
        async with honk(users=USERS) as env:
            _, good, ok_rep, _ = await socks5_open(
                env.port, "127.0.0.1", origin.port, auth=("alice", "s3cret")
            )
            await close_writer(good)
            reader, bad = await asyncio.open_connection("127.0.0.1", env.port)
            bad.write(b"\x05\x01\x02\x01\x05alice\x05wrong")
            status = await asyncio.wait_for(reader.read(), STEP)
            await close_writer(bad)
            _, noauth, noauth_rep, _ = await socks5_open(env.port, "127.0.0.1", origin.port)
            await close_writer(noauth)

            code, out, err = await curl(
                "-x", f"http://alice:s3cret@127.0.0.1:{env.port}", f"http://127.0.0.1:{origin.port}/auth"
            )
            assert code == 0, err
            assert out.startswith("hello from origin path=/auth")
            code, out, _ = await curl(
                "-i", "-x", f"http://alice:nope@127.0.0.1:{env.port}", f"http://127.0.0.1:{origin.port}/auth"
            )
            assert out.startswith("HTTP/1.1 407")
            assert 'Proxy-Authenticate: Basic realm="honk"' in out
            code, out, err = await curl(
                "--socks5-hostname",
                f"127.0.0.1:{env.port}",
                "--proxy-user",
                "alice:s3cret",
                f"http://127.0.0.1:{origin.port}/s5",
            )
            assert code == 0, err

            assert ok_rep == 0
            assert status == b"\x05\x02\x01\x01"  # method 0x02 chosen, then status 0x01
            assert noauth_rep == 0xFF

    run(main())


# --- plane swaps ----------------------------------------------------------------------------------------------


def test_mixed_swap_plane_routes_new_flows_while_established_flows_keep_their_sockets(
    run, echo: EchoServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="honk.connection")  # a flow's line is at info

    async def main() -> None:
        async with honk() as env:
            reader, writer, rep, _ = await socks5_open(env.port, "127.0.0.1", echo.port)
            assert rep == 0
            blocking = Spec(
                global_=env.dispatcher.global_spec,
                inbounds=(env.inbound.spec,),
                routing=RoutingSpec(rules=(rule("dport", str(echo.port), "block"),), fallback="direct"),
            )
            env.dispatcher.swap_plane(build_plane(blocking, env.clock, 2))

            _, refused, new_rep, _ = await socks5_open(env.port, "127.0.0.1", echo.port)
            await close_writer(refused)
            writer.write(b"still here")
            writer.write_eof()
            answer = await asyncio.wait_for(reader.read(), STEP)
            await close_writer(writer)

            assert new_rep == 0x02
            assert answer == b"still here"

    run(main())
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("flow opened ")]
    assert lines == [
        f"flow opened network=tcp inbound=lan source={lines[0].split('source=')[1].split()[0]} "
        f"target=127.0.0.1:{echo.port} rule=fallback chain=direct"
    ]
