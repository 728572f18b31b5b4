"""Trojan and VLESS nodes that cannot work end in typed errors, within the deadline.

The peers are a real v2ray 4.34 server (tests/helpers/peerservers.py) and small
asyncio servers in the test's own loop that speak something else. Measured
against v2ray: a wrong Trojan password (no fallback configured) or an unknown
VLESS UUID is answered by a close with not one byte sent, under a millisecond
after the request on loopback, over TCP and WebSocket alike. honk's leaves
turn that close into ``closed-before-data`` (Trojan, which has no denial
message) and ``no-response`` (VLESS), the flow's typed end. Where that end
surfaces depends on the transport:

* TCP + TLS and WebSocket + TLS: the dial sends the request header and hands
  the relay the server's socket with a :class:`~honk.proto.tls_framing.TlsFraming`;
  the relay engine moves the records (and frames) and its end is the framing's
  typed error (``framing.error_for``). No bridge is involved, so the bridge logs nothing.
* Plain WebSocket (and plain VLESS over TCP): the stream is bridged
  (:mod:`honk.outbound.bridge`), which logs the error once as
  ``bridged stream failed`` and keeps it as its verdict (``BridgeEnd``).

The direct-leaf tests relay a client's flow with the relay honk picks
(:func:`honk.relay.relay_engine`) and check the relay's typed end over TCP +
TLS, the bridge's verdict and line where there is a bridge. Through honk's
mixed port the TCP + TLS flow ends as promptly, and one ``flow failed`` line
of the connection layer names its typed end (the bridge no longer sees it).

Certificate problems fail the dial as :class:`TlsFailed`; a server that speaks
another protocol fails the TLS handshake, the WebSocket upgrade, or (VLESS)
the response header. A silent server is not an error past the dial: the
relay's idle timeout ends such a flow.

Every failing case has a positive control: the same server with the right
credentials, or with ``allowInsecure=1``, carries bytes (through
:func:`helpers.inprocess.open_through`, which applies a dial's framing).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import re
import socket
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import trustme
from helpers.aio import close_writer, socks5_open
from helpers.engines import poll
from helpers.inprocess import honk_via, leaf_from_link, open_through
from helpers.peerservers import v2ray_server
from helpers.servers import EchoServer

from honk.core.errors import ClientGone, DialError, DialTimeout, HonkError, UpstreamFailed
from honk.core.net import Address
from honk.outbound.bridge import bridge_stream
from honk.outbound.channel import CodecChannel
from honk.outbound.tls import TlsFailed
from honk.relay import relay_engine
from honk.relay.stream import StreamConn

STEP = 10.0  # seconds: the bound on any single wait in these tests
PROMPT = 2.0  # seconds: a refusal v2ray answers in under 1 ms must end the flow well within this
SHORT_DEADLINE = 0.5  # seconds: the dial deadline for servers that never answer
EOF_LAG = 0.05  # seconds between a failed write and the EOF that explains it, in the simulated race
WRONG_UUID = "00000000-0000-4000-8000-000000000000"
WRONG_PASSWORD = "not-the-password"
PAYLOAD = b"GET / HTTP/1.1\r\nHost: example\r\n\r\n"  # what a client sends first; some bytes a server reads

# The typed error each protocol ends a refused flow with: the relay's end over TCP + TLS, the bridge's
# logged verdict over WebSocket.
REFUSED = {"trojan": ("TrojanError", "closed-before-data"), "vless": ("VlessProtocolError", "no-response")}
PROTOCOLS = ("trojan", "vless")
TRANSPORTS = ("tcp", "ws")


@pytest.fixture
def trust(monkeypatch):
    def use(ca_path) -> None:
        monkeypatch.setenv("SSL_CERT_FILE", str(ca_path))

    return use


@pytest.fixture
def no_trust(monkeypatch) -> None:
    """The system store only: the tests' CAs are in it only through SSL_CERT_FILE."""
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)


@pytest.fixture
def bridge_log(caplog):
    """The bridge's failure lines as ``(error type, reason)`` pairs."""
    caplog.set_level(logging.INFO, logger="honk.outbound.bridge")

    def failures() -> list[tuple[str, str]]:
        out = []
        for record in caplog.records:
            if record.name == "honk.outbound.bridge" and record.getMessage().startswith(
                "bridged stream failed"
            ):
                fields = dict(part.split("=", 1) for part in record.getMessage().split()[3:])
                out.append((fields["error"], fields["reason"]))
        return out

    return failures


_ERROR = re.compile(r"\berror=(\S+)")
_REASON = re.compile(r"\breason=(?:\w+: )?([\w-]+)")  # a slug, or a codec error's text ("trojan: <slug> ...")


@pytest.fixture
def ends_log(caplog):
    """Every line of honk's, at any level, that names a flow's typed end, as ``(error type, reason)`` pairs:
    the bridge's ``bridged stream failed`` and any ``flow ended``/``failed`` line of the inbound, the
    connection layer or the relay."""
    caplog.set_level(logging.DEBUG, logger="honk")

    def ends() -> list[tuple[str, str]]:
        out = []
        for record in caplog.records:
            if not record.name.startswith("honk."):
                continue
            message = record.getMessage()
            error, reason = _ERROR.search(message), _REASON.search(message)
            if error is not None and reason is not None:
                out.append((error.group(1), reason.group(1)))
        return out

    return ends


class ExpiredCA(trustme.CA):
    """A CA whose leaf certificates expired long ago (v2ray serves them without complaint)."""

    def issue_cert(self, *identities: str, **kwargs) -> trustme.LeafCert:  # noqa: ANN003
        past = datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC)
        kwargs.setdefault("not_before", past)
        kwargs.setdefault("not_after", past + datetime.timedelta(days=1))
        return super().issue_cert(*identities, **kwargs)


def _insecure(link: str) -> str:
    base, _, name = link.partition("#")
    return f"{base}&allowInsecure=1#{name}"


def _local(protocol: str, port: int, *, tls: bool, transport: str = "tcp") -> str:
    """A node link to a local server on ``port``; over TLS without verification (these servers' certificates are
    not the point). Trojan links always say TLS."""
    params = f"type={transport}" + ("&path=/honk-ws" if transport == "ws" else "")
    params += "&security=tls&sni=localhost&allowInsecure=1" if tls else "&security=none"
    if protocol == "trojan":
        return f"trojan://{WRONG_PASSWORD}@127.0.0.1:{port}?{params}#node"
    return f"vless://{WRONG_UUID}@127.0.0.1:{port}?{params}&encryption=none#node"


def _typed(error: HonkError | None) -> tuple[str, str] | None:
    """An error as ``(error type, reason)``; None for none."""
    return None if error is None else (type(error).__name__, getattr(error, "reason", "-"))


async def _read_to_end(reader: asyncio.StreamReader) -> bytes:
    """What comes back until the flow ends: EOF, or a reset or broken pipe (the refusal can end the flow
    before the client's first byte is taken, the header having gone at dial time)."""
    try:
        return await asyncio.wait_for(reader.read(), STEP)  # read() returns at EOF
    except (ConnectionResetError, BrokenPipeError):
        return b""


async def _exchange(
    leaf,
    target: Address,
    payload: bytes,  # noqa: ANN001
) -> tuple[bytes, float, HonkError | None, HonkError | None]:
    """Dial ``target`` through ``leaf`` and relay a client's flow over it with the relay honk picks, as the
    inbounds do; the client sends ``payload`` and reads until the flow ends. What came back, how long it
    took, the relay's own typed end (None: clean), and a bridged stream's verdict (``BridgeEnd.failure``;
    None: not bridged, or no failure)."""
    started = time.monotonic()
    dialed = await leaf.dial_tcp(target, time.monotonic() + STEP)
    client, lan = socket.socketpair()
    conn = StreamConn(ClientGone)
    try:
        await asyncio.get_running_loop().connect_accepted_socket(lambda: conn, client)
    except BaseException:
        client.close()
        lan.close()
        dialed.sock.close()
        raise
    relaying = asyncio.ensure_future(relay_engine(leaf.clock).run(conn, dialed.sock, dialed.framing))
    reader, writer = await asyncio.open_connection(sock=lan)
    try:
        writer.write(payload)
        got = await _read_to_end(reader)
        elapsed = time.monotonic() - started
    finally:
        await close_writer(writer)
    error = None
    try:
        await asyncio.wait_for(relaying, STEP)
    except HonkError as exc:
        error = exc
    return got, elapsed, error, dialed.bridge.failure if dialed.bridge is not None else None


async def _dial_failure(leaf, target: Address) -> tuple[DialError, float]:  # noqa: ANN001
    started = time.monotonic()
    with pytest.raises(DialError) as info:
        await leaf.dial_tcp(target, time.monotonic() + STEP)
    return info.value, time.monotonic() - started


async def _echoes(leaf, echo: EchoServer) -> None:  # noqa: ANN001
    """The positive control: ``leaf`` carries bytes to the echo server and back (its dial's framing applied by
    the relay engine, as honk's own sockets get it)."""
    sock = await open_through(leaf, Address(*echo.address), time.monotonic() + STEP)
    reader, writer = await asyncio.open_connection(sock=sock)
    try:
        writer.write(PAYLOAD)
        assert await asyncio.wait_for(reader.readexactly(len(PAYLOAD)), STEP) == PAYLOAD
    finally:
        await close_writer(writer)


# --- wrong credentials ----------------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_wrong_credentials_end_the_flow_with_the_protocols_typed_error(
    run, trust, bridge_log, protocol, transport
) -> None:
    """Over TCP + TLS and WebSocket + TLS the relay engine ends the flow with the framing's typed error and
    nothing is bridged; over plain WebSocket the bridge keeps that error as the flow's verdict and logs it once."""
    with EchoServer() as echo, v2ray_server(protocol, transport=transport) as peer:
        relayed = peer.tls  # TLS (under WebSocket too): the records go to the relay engine
        trust(peer.ca_path)
        run(_echoes(leaf_from_link(peer.share_link()), echo))
        assert bridge_log() == []
        wrong = peer.share_link(uuid=WRONG_UUID, password=WRONG_PASSWORD)
        got, elapsed, end, verdict = run(_exchange(leaf_from_link(wrong), Address(*echo.address), PAYLOAD))
        assert len(peer.accepted()) == 1  # the control's request only
    assert got == b""  # the client's side just ends
    assert elapsed < PROMPT
    if relayed:  # the relay engine carried the records and read the close itself
        assert (_typed(end), verdict, bridge_log()) == (REFUSED[protocol], None, [])
    else:  # bridged: the bridge read the close, kept it as the flow's verdict and logged it once
        assert (_typed(verdict), bridge_log()) == (REFUSED[protocol], [REFUSED[protocol]])


async def _refused_through_honk(
    link: str, echo: EchoServer, settled: Callable[[], bool] | None = None
) -> tuple[int, bytes, float]:
    """A SOCKS5 client of honk's mixed port (routing to the node of ``link``) sends a request's first bytes to
    the echo server: the CONNECT's reply code, what came back until EOF, and how long that took. With
    ``settled``, honk stays up until it holds (the client can see EOF before honk has handled the
    flow's end; leaving earlier would close the flow as "test over" instead)."""
    async with honk_via(link) as port:
        started = time.monotonic()
        reader, writer, code, _ = await socks5_open(port, *echo.address)
        writer.write(PAYLOAD)
        got = await _read_to_end(reader)
        elapsed = time.monotonic() - started
        await close_writer(writer)
        if settled is not None:
            await poll(settled, "honk to handle the flow's end")
    return code, got, elapsed


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_wrong_credentials_through_honks_mixed_port_end_the_flow_promptly_without_a_bridge(
    run, trust, bridge_log, protocol
) -> None:
    with EchoServer() as echo, v2ray_server(protocol) as peer:
        trust(peer.ca_path)
        code, got, elapsed = run(
            _refused_through_honk(peer.share_link(uuid=WRONG_UUID, password=WRONG_PASSWORD), echo)
        )
    assert code == 0  # neither protocol waits for the server before the payload: the dial succeeds
    assert (got, elapsed < PROMPT) == (b"", True)
    assert bridge_log() == []  # TCP + TLS: the relay engine carried the records


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_wrong_credentials_through_honks_mixed_port_log_the_flows_typed_end_once(
    run, trust, ends_log, protocol
) -> None:
    with EchoServer() as echo, v2ray_server(protocol) as peer:
        trust(peer.ca_path)
        code, got, _ = run(
            _refused_through_honk(
                peer.share_link(uuid=WRONG_UUID, password=WRONG_PASSWORD),
                echo,
                settled=lambda: ends_log() != [],
            )
        )
    assert (code, got) == (0, b"")
    assert ends_log() == [REFUSED[protocol]]


class _ClosedUnderTheWrite:
    """A channel whose server has just closed: the next write fails, and its EOF arrives a moment later."""

    def __init__(self) -> None:
        self._closed = asyncio.Event()

    async def receive(self) -> bytes:
        await self._closed.wait()
        return b""

    def write(self, data: bytes) -> None:
        asyncio.get_running_loop().call_later(EOF_LAG, self._closed.set)  # the close is still on its way
        raise UpstreamFailed("write after close")

    async def drain(self) -> None:
        pass

    def write_eof(self) -> None:
        pass

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_write_that_finds_the_server_gone_reports_the_protocols_reading_of_the_close(
    run, bridge_log, protocol
) -> None:
    """The race the real servers leave open on a bridged stream (WebSocket: the client writes just as the
    refusal's close lands), made certain."""

    async def main() -> bytes:
        leaf = leaf_from_link(_local(protocol, 9, tls=True))
        stream = leaf.stream(Address("127.0.0.1", 9))
        plain = bridge_stream(
            CodecChannel(_ClosedUnderTheWrite(), stream.encode, stream.decode, at_eof=stream.at_eof)
        )
        reader, writer = await asyncio.open_connection(sock=plain)
        writer.write(PAYLOAD)
        got = await asyncio.wait_for(reader.read(), STEP)
        await close_writer(writer)
        return got

    assert run(main()) == b""
    assert bridge_log() == [REFUSED[protocol]]


# --- certificates ---------------------------------------------------------------------


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_wrong_server_name_fails_the_dial_and_passes_with_verification_off(run, trust, protocol) -> None:
    with EchoServer() as echo, v2ray_server(protocol) as peer:
        trust(peer.ca_path)
        link = peer.share_link(sni="other.example")
        error, elapsed = run(_dial_failure(leaf_from_link(link), Address(*echo.address)))
        assert isinstance(error, TlsFailed) and (error.phase, error.reason) == ("tls", "certificate-name")
        assert elapsed < PROMPT
        run(_echoes(leaf_from_link(_insecure(link)), echo))


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_certificate_from_an_unknown_ca_is_untrusted_and_passes_with_verification_off(
    run, no_trust, protocol, transport
) -> None:
    with EchoServer() as echo, v2ray_server(protocol, transport=transport) as peer:
        link = peer.share_link()
        error, elapsed = run(_dial_failure(leaf_from_link(link), Address(*echo.address)))
        assert isinstance(error, TlsFailed) and error.reason == "certificate-untrusted"
        assert elapsed < PROMPT
        run(_echoes(leaf_from_link(_insecure(link)), echo))


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_expired_certificate_is_an_expiry_error_and_passes_with_verification_off(
    run, trust, protocol
) -> None:
    with EchoServer() as echo, v2ray_server(protocol, ca=ExpiredCA()) as peer:
        trust(peer.ca_path)  # the CA is trusted: only the dates are wrong
        link = peer.share_link()
        error, elapsed = run(_dial_failure(leaf_from_link(link), Address(*echo.address)))
        assert isinstance(error, TlsFailed) and error.reason == "certificate-expired"
        assert elapsed < PROMPT
        run(_echoes(leaf_from_link(_insecure(link)), echo))


# --- servers speaking another protocol ------------------------------------------------

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _http_server(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A web server's answer to bytes it cannot parse, then a close."""
    await reader.read(4096)
    writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
    await writer.drain()
    writer.close()


async def _ssh_server(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """An SSH server: its banner first, then it waits for the client's."""
    writer.write(b"SSH-2.0-OpenSSH_9.6\r\n")
    await writer.drain()
    await reader.read()
    writer.close()


async def _silent_server(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Accepts and never says a word."""
    await reader.read()
    writer.close()


FOREIGN = {"http": _http_server, "ssh": _ssh_server}


@contextlib.asynccontextmanager
async def _serving(handler: Handler, *, tls: bool = False) -> AsyncIterator[int]:
    """``handler`` serving on a free loopback port (behind TLS when ``tls``) until the block ends; yields the port."""
    tasks: set[asyncio.Task[None]] = set()
    context = None
    if tls:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        trustme.CA().issue_cert("localhost").configure_cert(context)

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        tasks.add(asyncio.current_task())  # type: ignore[arg-type]
        with contextlib.suppress(OSError, asyncio.CancelledError):  # cancelled: the test is over
            await handler(reader, writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0, ssl=context)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.wait_closed()


async def _foreign_dial(
    handler: Handler, link_for: Callable[[int], str], *, tls: bool = False, deadline: float = STEP
) -> tuple[DialError, float]:
    async with _serving(handler, tls=tls) as port:
        leaf = leaf_from_link(link_for(port), connect_timeout=deadline)
        started = time.monotonic()
        with pytest.raises(DialError) as info:
            await leaf.dial_tcp(Address("127.0.0.1", 9), time.monotonic() + deadline)
        return info.value, time.monotonic() - started


@pytest.mark.parametrize("server", sorted(FOREIGN))
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_server_speaking_another_protocol_fails_the_tls_handshake(run, protocol, server) -> None:
    error, elapsed = run(_foreign_dial(FOREIGN[server], lambda port: _local(protocol, port, tls=True)))
    assert isinstance(error, TlsFailed) and (error.phase, error.reason) == ("tls", "handshake")
    assert elapsed < PROMPT


@pytest.mark.parametrize("server", sorted(FOREIGN))
@pytest.mark.parametrize(("protocol", "tls"), [("trojan", True), ("vless", True), ("vless", False)])
def test_a_server_speaking_another_protocol_fails_the_websocket_upgrade(run, protocol, tls, server) -> None:
    error, elapsed = run(
        _foreign_dial(FOREIGN[server], lambda port: _local(protocol, port, tls=tls, transport="ws"), tls=tls)
    )
    assert not isinstance(error, DialTimeout) and error.phase == "handshake"
    assert elapsed < PROMPT


@pytest.mark.parametrize("server", sorted(FOREIGN))
@pytest.mark.parametrize("tls", [False, True])
def test_a_server_speaking_another_protocol_is_not_a_vless_response(run, bridge_log, tls, server) -> None:
    """Over TLS the relay engine reads the bad version; plain VLESS over TCP is bridged, which logs it."""

    async def main() -> tuple[bytes, float, HonkError | None, HonkError | None]:
        async with _serving(FOREIGN[server], tls=tls) as port:
            return await _exchange(
                leaf_from_link(_local("vless", port, tls=tls)), Address("127.0.0.1", 9), PAYLOAD
            )

    got, elapsed, end, verdict = run(main())
    assert (got, elapsed < PROMPT) == (b"", True)
    bad_version = ("VlessProtocolError", "bad-version")
    if tls:  # TCP + TLS: the relay engine read the header
        assert (_typed(end), verdict, bridge_log()) == (bad_version, None, [])
    else:  # plain VLESS is bridged
        assert (_typed(verdict), bridge_log()) == (bad_version, [bad_version])


@pytest.mark.parametrize(
    ("protocol", "tls", "transport", "phase"),
    [
        ("trojan", False, "tcp", "tls"),
        ("vless", False, "tcp", "tls"),
        ("trojan", True, "ws", "handshake"),
        ("vless", True, "ws", "handshake"),
        ("vless", False, "ws", "handshake"),
    ],
)
def test_a_silent_server_times_out_the_dial_in_its_phase(run, protocol, tls, transport, phase) -> None:
    """The silent server speaks TLS when ``tls``, or nothing at all: a link over TLS (Trojan's always is) then
    waits for a handshake that never comes."""

    def link(port: int) -> str:
        return _local(protocol, port, tls=tls or phase == "tls", transport=transport)

    error, elapsed = run(_foreign_dial(_silent_server, link, tls=tls, deadline=SHORT_DEADLINE))
    assert isinstance(error, DialTimeout) and error.phase == phase
    assert SHORT_DEADLINE * 0.9 <= elapsed < SHORT_DEADLINE + PROMPT
