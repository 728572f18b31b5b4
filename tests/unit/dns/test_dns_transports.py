"""The encrypted upstreams' parts that need no server: URL forms, the protocol string, the
framings, and the DoT and DoH connections driven over an in-memory stream (the DoH one
against h2's own server side)."""

from __future__ import annotations

import asyncio
import struct
from types import SimpleNamespace

import dns.message
import h2.config
import h2.connection
import h2.events
import h2.settings
import pytest

from honk.config import dns_endpoint as endpoint
from honk.config.diagnostics import ConfigError, Severity
from honk.config.dns import parse_upstream_uri
from honk.config.load import load_text
from honk.core.clock import FakeClock
from honk.core.errors import DialError
from honk.core.net import Address
from honk.dns.encrypted import (
    ALT_SVC_CLEAR,
    ALT_SVC_MAX_AGE,
    IDLE_TIMEOUT,
    ConnectionPool,
    DohConnection,
    DotConnection,
    LengthPrefixed,
    authority_of,
    doh_request_headers,
    h3_alternative,
    with_id,
)
from honk.dns.failure import ExchangeFailed
from honk.dns.quic import connect_quic, doq_query
from honk.group.score.attempt import Result

QUIC_SILENT_TIMEOUT = 3.0  # seconds (fake clock) a QUIC dial through a silent node may take in the test
SETTLE_TURNS = 20  # loop turns for a dial to reach its first await on the network

LENGTH = struct.Struct("!H")
SMALL_WINDOW = 16  # bytes: a server flow-control window smaller than one query


# --- URL forms ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("tls://dns.example", ("tls", "dns.example", 853)),
        ("tls://1.1.1.1:8853", ("tls", "1.1.1.1", 8853)),
        ("tls://1.1.1.1?tls_server_name=Cloudflare-DNS.com", ("tls;sni=cloudflare-dns.com", "1.1.1.1", 853)),
        ("https://dns.example/dns-query", ("https", "dns.example", 443)),
        ("https://dns.example", ("https", "dns.example", 443)),
        ("https://dns.example:8443/resolve", ("https;path=/resolve", "dns.example", 8443)),
        (
            "https://[2001:db8::1]/q?tls_server_name=dns.example",
            ("https;path=/q;sni=dns.example", "2001:db8::1", 443),
        ),
        ("h3://dns.example", ("h3", "dns.example", 443)),
        ("HTTP3://dns.example/dns-query", ("h3", "dns.example", 443)),
        ("quic://dns.example", ("quic", "dns.example", 853)),
        ("quic://9.9.9.9:784", ("quic", "9.9.9.9", 784)),
        ("tcp+udp://9.9.9.9", ("udp", "9.9.9.9", 53)),
    ],
)
def test_encrypted_upstream_urls_take_their_rfc_default_ports_and_path(uri, expected):
    assert parse_upstream_uri(uri) == expected


def test_the_default_ports_are_the_rfcs():
    assert (endpoint.DOT_PORT, endpoint.DOH_PORT, endpoint.DOQ_PORT, endpoint.DOH_PATH) == (
        853,
        443,
        853,
        "/dns-query",
    )


@pytest.mark.parametrize(
    "uri",
    [
        "tls://dns.example/path",  # only DoH has a path
        "quic://dns.example/dns-query",
        "https://dns.example/a#b",
        "https://dns.example/a;b",
        "https://dns.example/a b",
        "tls://dns.example?sni=x",  # the one parameter is tls_server_name
        "tls://dns.example?tls_server_name=",
        "tls://dns.example?tls_server_name=1.2.3.4",  # a name, not an address
        "tls://dns.example?tls_server_name=a&x=1",
        "udp://dns.example?tls_server_name=x",  # plain DNS has no certificate
        "tls://user@dns.example",
        "quic://dns.example:0",
        "doh://dns.example",
    ],
)
def test_malformed_encrypted_upstream_urls_are_refused(uri):
    with pytest.raises(ValueError):
        parse_upstream_uri(uri)


def test_a_malformed_encrypted_upstream_is_refused_at_its_line():
    text = "dns {\n    upstream {\n        default: 'tls://1.1.1.1'\n        bad: 'https://x.test/a#b'\n    }\n}\n"
    with pytest.raises(ConfigError) as refused:
        load_text(text, "dae")
    (d,) = [d for d in refused.value.diagnostics if d.severity is Severity.ERROR]
    assert (d.code, d.key_path, d.loc.line) == ("invalid-value", "dns.upstream.bad", 4)


@pytest.mark.parametrize(
    "transport",
    [
        endpoint.Transport("udp"),
        endpoint.Transport("tls", server_name="dns.example"),
        endpoint.Transport("https", "/q"),
        endpoint.Transport("h3", "/a/b", "dns.example"),
        endpoint.Transport("quic"),
    ],
)
def test_a_transport_survives_its_protocol_string(transport):
    assert (
        endpoint.decode(endpoint.encode(transport.kind, transport.path, transport.server_name)) == transport
    )


@pytest.mark.parametrize("protocol", ["doh", "udp;sni=x", "tls;path=/x", "https;path", "https;colour=red"])
def test_a_protocol_string_encode_never_writes_is_refused(protocol):
    with pytest.raises(ValueError):
        endpoint.decode(protocol)


# --- framing -------------------------------------------------------------------------------------


def query(name: str = "a.example", qid: int = 0x1234) -> bytes:
    message = dns.message.make_query(name, "A")
    message.id = qid
    return message.to_wire()


def reply_to(wire: bytes, *, qid: int | None = None) -> bytes:
    message = dns.message.make_response(dns.message.from_wire(wire))
    if qid is not None:
        message.id = qid
    return message.to_wire()


def test_length_prefixed_messages_come_out_whole_however_the_bytes_are_split():
    messages = [query("a.example", 1), query("b.example", 2), b""]
    stream = b"".join(LENGTH.pack(len(m)) + m for m in messages)
    for cut in range(len(stream) + 1):
        frames = LengthPrefixed()
        assert frames.feed(stream[:cut]) + frames.feed(stream[cut:]) == messages
        assert frames.pending == 0


def test_a_doq_query_carries_message_id_zero_after_its_length():
    wire = query(qid=0xBEEF)
    framed = doq_query(wire)
    assert LENGTH.unpack_from(framed)[0] == len(wire)
    assert framed[2:4] == b"\x00\x00" and framed[4:] == wire[2:]


def test_a_doh_request_is_an_rfc_8484_post():
    headers = dict(doh_request_headers("dns.example", "/dns-query", 33))
    assert headers == {
        ":method": "POST",
        ":scheme": "https",
        ":authority": "dns.example",
        ":path": "/dns-query",
        "accept": "application/dns-message",
        "content-type": "application/dns-message",
        "content-length": "33",
    }
    assert authority_of("2001:db8::1", 8443, 443) == "[2001:db8::1]:8443"
    assert authority_of("dns.example", 443, 443) == "dns.example"


# --- DoT over an in-memory stream ------------------------------------------------------------------


class FakeStream:
    """What a connection needs of a StreamConn: writes recorded, reads fed by the test."""

    transport = None

    def __init__(self) -> None:
        self.written = bytearray()
        self.aborted = False
        self._incoming: asyncio.Queue[bytes] = asyncio.Queue()

    def write(self, data: bytes) -> None:
        self.written += data

    async def drain(self) -> None:
        await asyncio.sleep(0)

    async def receive(self) -> bytes:
        return await self._incoming.get()

    def feed(self, data: bytes) -> None:
        self._incoming.put_nowait(data)

    def abort(self) -> None:
        self.aborted = True
        self._incoming.put_nowait(b"")


async def settle() -> None:
    """Let every ready task run until none is (the loop is ours alone)."""
    for _ in range(20):
        await asyncio.sleep(0)


def test_dot_pipelines_queries_and_matches_replies_out_of_order_by_id():
    async def body() -> None:
        stream = FakeStream()
        connection = DotConnection(stream, FakeClock())  # type: ignore[arg-type]
        first = asyncio.ensure_future(connection.exchange(query("a.example", 1)))
        second = asyncio.ensure_future(connection.exchange(query("b.example", 2)))
        await settle()
        sent = LengthPrefixed().feed(bytes(stream.written))
        assert [struct.unpack_from("!H", m)[0] for m in sent] == [1, 2]  # both out before any reply
        stream.feed(b"".join(LENGTH.pack(len(r)) + r for r in (reply_to(sent[1]), reply_to(sent[0]))))
        a, b = await first, await second
        assert dns.message.from_wire(a).question[0].name.to_text() == "a.example."
        assert dns.message.from_wire(b).question[0].name.to_text() == "b.example."
        assert connection.exchanges == 2 and not connection.closed
        await connection.aclose()

    asyncio.run(body())


def test_dot_gives_a_clashing_id_another_on_the_wire_and_restores_it():
    async def body() -> None:
        stream = FakeStream()
        connection = DotConnection(stream, FakeClock())  # type: ignore[arg-type]
        first = asyncio.ensure_future(connection.exchange(query("a.example", 7)))
        second = asyncio.ensure_future(connection.exchange(query("b.example", 7)))
        await settle()
        sent = LengthPrefixed().feed(bytes(stream.written))
        ids = [struct.unpack_from("!H", m)[0] for m in sent]
        assert ids[0] == 7 and ids[1] != 7
        stream.feed(b"".join(LENGTH.pack(len(r)) + r for r in map(reply_to, sent)))
        assert [struct.unpack_from("!H", await f)[0] for f in (first, second)] == [7, 7]
        await connection.aclose()

    asyncio.run(body())


def test_dot_fails_the_queries_in_flight_when_the_server_closes_and_is_not_reused():
    async def body() -> None:
        stream = FakeStream()
        connection = DotConnection(stream, FakeClock())  # type: ignore[arg-type]
        pending = asyncio.ensure_future(connection.exchange(query()))
        await settle()
        stream.feed(b"")  # EOF
        with pytest.raises(ExchangeFailed) as failed:
            await pending
        assert failed.value.reason == "closed" and connection.closed
        with pytest.raises(ExchangeFailed):
            await connection.exchange(query())

    asyncio.run(body())


def test_an_unused_connection_is_closed_after_the_idle_timeout_on_the_clock():
    async def body() -> None:
        clock = FakeClock()
        stream = FakeStream()
        connection = DotConnection(stream, clock)  # type: ignore[arg-type]
        pending = asyncio.ensure_future(connection.exchange(query()))
        await settle()
        clock.advance(IDLE_TIMEOUT * 2)  # busy: no idle timer runs while a query is in flight
        assert not connection.closed
        (sent,) = LengthPrefixed().feed(bytes(stream.written))
        stream.feed(LENGTH.pack(len(reply_to(sent))) + reply_to(sent))
        await pending
        clock.advance(IDLE_TIMEOUT - 1)
        assert not connection.closed
        clock.advance(1)
        assert connection.closed and stream.aborted
        await connection.aclose()

    asyncio.run(body())


class RecordingReporter:
    """What a connection tells the dial's Score reporter: the settlements, in order."""

    def __init__(self) -> None:
        self.settled: list[str] = []

    def tx(self, now: float, nbytes: int) -> None:
        pass

    def rx(self, now: float, nbytes: int) -> None:
        pass

    def settle(self, now: float, result: Result) -> None:
        self.settled.append(result.ending)


@pytest.mark.parametrize(
    ("end", "expected"),
    [("server-closes", Result.failure()), ("we-close", Result.neutral()), ("answered", Result.success())],
)
def test_the_dials_score_reporter_is_settled_once_by_how_the_connection_went(end, expected):
    async def body() -> None:
        reporter = RecordingReporter()
        stream = FakeStream()
        connection = DotConnection(stream, FakeClock(), reporter)  # type: ignore[arg-type]
        pending = asyncio.ensure_future(connection.exchange(query()))
        await settle()
        if end == "answered":
            (sent,) = LengthPrefixed().feed(bytes(stream.written))
            stream.feed(LENGTH.pack(len(reply_to(sent))) + reply_to(sent))
            await pending
        elif end == "server-closes":
            stream.feed(b"")
            await asyncio.gather(pending, return_exceptions=True)
        await connection.aclose()
        await asyncio.gather(pending, return_exceptions=True)
        assert reporter.settled[:1] == [expected.ending]

    asyncio.run(body())


# --- DoH against h2's server side --------------------------------------------------------------------


class H2Server:
    """h2's server state machine fed what the client writes; answers each POST with its body's reply."""

    def __init__(self, stream: FakeStream, status: int = 200) -> None:
        self.h2 = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=False, header_encoding="utf-8")
        )
        self.h2.initiate_connection()
        self.stream = stream
        self.status = status
        self.requests: list[tuple[int, dict[str, str], bytes]] = []
        self._bodies: dict[int, bytearray] = {}
        self._headers: dict[int, dict[str, str]] = {}
        self._seen = 0

    def pump(self) -> None:
        data = bytes(self.stream.written[self._seen :])
        self._seen = len(self.stream.written)
        for event in self.h2.receive_data(data):
            if isinstance(event, h2.events.RequestReceived):
                self._headers[event.stream_id] = dict(event.headers)
                self._bodies[event.stream_id] = bytearray()
            elif isinstance(event, h2.events.DataReceived):
                self._bodies[event.stream_id] += event.data
                self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                body = bytes(self._bodies.pop(event.stream_id))
                self.requests.append((event.stream_id, self._headers.pop(event.stream_id), body))
                answer = reply_to(body) if self.status == 200 else b""
                self.h2.send_headers(
                    event.stream_id,
                    [(":status", str(self.status)), ("content-type", "application/dns-message")],
                )
                self.h2.send_data(event.stream_id, answer, end_stream=True)
        out = self.h2.data_to_send()
        if out:
            self.stream.feed(out)


def test_doh_sends_each_query_on_its_own_stream_with_id_zero_and_restores_the_id():
    async def body() -> None:
        stream = FakeStream()
        connection = DohConnection(stream, FakeClock(), "dns.example", "/dns-query")  # type: ignore[arg-type]
        server = H2Server(stream)
        exchanges = [
            asyncio.ensure_future(connection.exchange(query(f"n{i}.example", 100 + i))) for i in range(5)
        ]
        await settle()
        server.pump()
        replies = await asyncio.gather(*exchanges)
        assert [struct.unpack_from("!H", r)[0] for r in replies] == [100, 101, 102, 103, 104]
        assert sorted(s for s, _, _ in server.requests) == [1, 3, 5, 7, 9]  # five streams, one connection
        assert {b[:2] for _, _, b in server.requests} == {b"\x00\x00"}
        assert all(h[":method"] == "POST" and h[":path"] == "/dns-query" for _, h, _ in server.requests)
        await connection.aclose()

    asyncio.run(body())


def test_doh_waits_for_the_servers_flow_control_window_before_sending_the_rest():
    async def body() -> None:
        stream = FakeStream()
        server = H2Server(stream)
        server.h2.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: SMALL_WINDOW})
        stream.feed(server.h2.data_to_send())  # the server's preface and settings come first
        connection = DohConnection(stream, FakeClock(), "dns.example", "/dns-query")  # type: ignore[arg-type]
        await settle()
        pending = asyncio.ensure_future(connection.exchange(query("a-rather-long-name.example", 9)))
        for _ in range(50):  # each round: the server reads what came, acknowledges it, the client sends more
            await settle()
            server.pump()
            if pending.done():
                break
        assert struct.unpack_from("!H", await pending)[0] == 9
        ((_, _, sent),) = server.requests
        assert len(sent) > SMALL_WINDOW  # it took more than one window
        await connection.aclose()

    asyncio.run(body())


def test_a_doh_answer_other_than_200_fails_that_query_only():
    async def body() -> None:
        stream = FakeStream()
        connection = DohConnection(stream, FakeClock(), "dns.example", "/dns-query")  # type: ignore[arg-type]
        server = H2Server(stream, status=503)
        pending = asyncio.ensure_future(connection.exchange(query()))
        await settle()
        server.pump()
        with pytest.raises(ExchangeFailed) as failed:
            await pending
        assert failed.value.reason == "http-status" and not connection.closed
        await connection.aclose()

    asyncio.run(body())


# --- the pool -------------------------------------------------------------------------------------


def test_concurrent_first_queries_share_one_dial_and_later_ones_reuse_it():
    async def body() -> None:
        pool = ConnectionPool()
        opened: list[DotConnection] = []
        gate = asyncio.Event()

        async def open_() -> DotConnection:
            await gate.wait()
            opened.append(DotConnection(FakeStream(), FakeClock()))  # type: ignore[arg-type]
            return opened[-1]

        waiters = [asyncio.ensure_future(pool.connection("up", open_)) for _ in range(4)]
        await settle()
        gate.set()
        results = await asyncio.gather(*waiters)
        assert len(opened) == 1 and pool.dials == 1
        assert {id(c) for c, _ in results} == {id(opened[0])}
        assert [fresh for _, fresh in results] == [True, False, False, False]
        assert (await pool.connection("up", open_))[1] is False
        pool.retire("up")
        assert opened[0].closed
        await pool.aclose()

    asyncio.run(body())


def test_a_failed_dial_reaches_every_waiter_and_leaves_nothing_pooled():
    async def body() -> None:
        pool = ConnectionPool()

        async def open_() -> DotConnection:
            raise ExchangeFailed("dial-connect")

        results = await asyncio.gather(
            *(pool.connection("up", open_) for _ in range(3)), return_exceptions=True
        )
        assert all(isinstance(r, ExchangeFailed) for r in results)
        assert pool.live("up") is None and pool.dials == 0

    asyncio.run(body())


@pytest.mark.parametrize(
    ("header", "offer"),
    [
        ('h3=":443"', (443, float(ALT_SVC_MAX_AGE))),
        ('h3-29=":8443", h3=":8443"; ma=60', (8443, 60.0)),
        ('h2=":443", h3=":4433";ma=3600;persist=1', (4433, 3600.0)),
        ("clear", ALT_SVC_CLEAR),
        ('h3="other.example:443"', None),  # another host: another server to trust
        ('h3-29=":443"', None),  # drafts only
        ('h3=":0"', None),
        ("h3=:443", None),  # the authority must be quoted
        ("", None),
    ],
)
def test_an_alt_svc_header_offers_http3_only_on_the_same_host(header, offer):
    assert h3_alternative(header) == offer


def test_with_id_replaces_only_the_id():
    wire = query(qid=1)
    assert with_id(wire, 0xABCD)[:2] == b"\xab\xcd" and with_id(wire, 0xABCD)[2:] == wire[2:]


# --- QUIC through a node: what its health hears --------------------------------------------------


class _Traffic:
    def __init__(self) -> None:
        self.heard: list[str] = []

    def packets_failed(self, family: int) -> None:
        self.heard.append(f"failed/{family}")

    def packets_answered(self, family: int) -> None:
        self.heard.append(f"answered/{family}")


class _Node:
    """A proxy leaf whose UDP association cannot open (or hears nothing back)."""

    protocol = "socks5"
    name = "edge"
    health_family = 4

    def __init__(self, error: BaseException | None) -> None:
        self.runtime = SimpleNamespace(traffic=_Traffic())
        self._error = error

    async def dial_udp(self, receive, deadline, on_lost):  # noqa: ANN001, ANN201 - a leaf's dial_udp
        if self._error is not None:
            raise self._error
        return SimpleNamespace(send=lambda data, target: None, close=lambda: None, closed=False)


async def test_a_node_whose_udp_association_fails_a_quic_dial_is_told_to_its_health():
    node = _Node(DialError("edge", "connect", "the relay refused the association"))
    with pytest.raises(DialError):
        await connect_quic(
            None,
            FakeClock(),
            SimpleNamespace(leaf=node, score=None),
            Address("192.0.2.53", 853),
            endpoint.Transport(endpoint.QUIC),
            "up",
            1.0,
        )
    assert node.runtime.traffic.heard == ["failed/4"]


async def test_a_quic_dial_through_a_node_that_hears_nothing_back_counts_against_it():
    clock = FakeClock()
    node = _Node(None)  # the association opens; nothing ever comes back through it
    dial = asyncio.ensure_future(
        connect_quic(
            None,
            clock,
            SimpleNamespace(leaf=node, score=None),
            Address("192.0.2.53", 853),
            endpoint.Transport(endpoint.QUIC),
            "up",
            QUIC_SILENT_TIMEOUT,
        )
    )
    for _ in range(SETTLE_TURNS):  # the dial reaches its wait for the handshake
        await asyncio.sleep(0)
    assert not dial.done() and node.runtime.traffic.heard == []
    clock.advance(QUIC_SILENT_TIMEOUT)
    with pytest.raises(ExchangeFailed) as failed:
        await dial
    assert failed.value.reason == "dial-timeout"
    assert node.runtime.traffic.heard == ["failed/4"]
