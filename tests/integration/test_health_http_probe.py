"""The two-round HTTP health probe through real leaves: direct, SOCKS5 to Dante, Shadowsocks to ss-server.

Each leaf carries the probe to two loopback origins written here: a plain
HTTP/1.1 one and an HTTP/2 one over TLS (ALPN ``h2``, a trustme CA the probe's
context trusts). The origin delays round 1 by 300 ms and round 2 by 40 ms, so a
reported RTT near 40 ms shows the warm second round is the one measured. Every
probe must leave this process's descriptor count where it was (origin, probe
and, for Shadowsocks, the relay engine's framing pair all live here).
"""

from __future__ import annotations

import asyncio
import itertools
import ssl
from collections.abc import Callable, Iterator

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import pytest
import trustme
from helpers.engines import poll
from helpers.inprocess import leaf_from_link
from helpers.peerservers import danted, ss_server
from helpers.sockets import open_fds

from honk.alive.checkurl import CheckUrl, parse_check_url
from honk.alive.outcome import ProbeError, ProbeSample
from honk.alive.probe_http import measure_http
from honk.core.clock import MonotonicClock
from honk.outbound.direct import DirectOutbound
from honk.relay.native import shared_engine

STEP = 5.0  # seconds: the bound on any wait here, and the probe's phase budget
LOOPBACK = "127.0.0.1"
SS_METHOD = "aes-128-gcm"
SS_PASSWORD = "honk-probe-pw"
ROUND_DELAYS = (0.3, 0.04)  # seconds the origin waits before answering round 1, round 2

# A transport the probe forgot would still be closed by the garbage collector, with a ResourceWarning:
# as an error, that warning makes "closed afterwards" mean closed by the probe.
pytestmark = pytest.mark.filterwarnings("error::ResourceWarning")


class Origin:
    """A loopback origin answering the n-th request of a connection with ``statuses[n]`` after ``delays[n]``.

    ``kind`` "http1": plain HTTP/1.1, keep-alive. ``kind`` "h2": HTTP/2 over TLS from ``ca``.
    """

    def __init__(
        self,
        kind: str,
        ca: trustme.CA,
        statuses: tuple[int, int],
        delays: tuple[float, float],
        *,
        informational: int = 0,
        goaway_after_first: bool = False,
    ) -> None:
        self.informational = informational  # bytes of 1xx heads before round 2's answer (HTTP/1.1)
        self.goaway_after_first = goaway_after_first  # a graceful GOAWAY right after round 1 (HTTP/2)
        self.kind = kind
        self.ca = ca
        self.statuses = statuses
        self.delays = delays
        self.methods: list[bytes] = []
        self.connections = 0
        self._handlers: set[asyncio.Task] = set()

    async def __aenter__(self) -> Origin:
        if self.kind == "h2":
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            self.ca.issue_cert(LOOPBACK).configure_cert(context)
            context.set_alpn_protocols(["h2"])
            self._server = await asyncio.start_server(self._serve_h2, LOOPBACK, 0, ssl=context)
        else:
            self._server = await asyncio.start_server(self._serve_http1, LOOPBACK, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()
        for task in self._handlers:
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await self._server.wait_closed()

    @property
    def url(self) -> CheckUrl:
        return parse_check_url(
            f"{'https' if self.kind == 'h2' else 'http'}://{LOOPBACK}:{self.port}/generate_204"
        )

    def _answer(self, n: int) -> tuple[float, bytes]:
        last = len(self.statuses) - 1
        return self.delays[min(n, last)], str(self.statuses[min(n, last)]).encode()

    async def _serve_http1(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._handlers.add(asyncio.current_task())  # type: ignore[arg-type]
        try:
            for n in itertools.count():
                request = await reader.readuntil(b"\r\n\r\n")
                self.methods.append(request.split(b" ", 1)[0])
                delay, status = self._answer(n)
                await asyncio.sleep(delay)
                if n == 1 and self.informational:
                    writer.write(_informational_heads(self.informational))
                writer.write(b"HTTP/1.1 " + status + b" X\r\nContent-Length: 0\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # the probe closed the connection, or the test is over
        finally:
            writer.transport.abort()

    async def _serve_h2(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._handlers.add(asyncio.current_task())  # type: ignore[arg-type]
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
        conn.initiate_connection()
        writer.write(conn.data_to_send())
        answers: list[asyncio.Task] = []

        async def answer(stream_id: int, n: int) -> None:
            delay, status = self._answer(n)
            await asyncio.sleep(delay)
            conn.send_headers(stream_id, [(b":status", status)], end_stream=True)
            if n == 0 and self.goaway_after_first:
                conn.close_connection(last_stream_id=stream_id)  # NO_ERROR: a graceful GOAWAY
            writer.write(conn.data_to_send())

        try:
            while data := await reader.read(65536):
                events = conn.receive_data(data)
                writer.write(conn.data_to_send())
                for event in events:
                    if isinstance(event, h2.events.RequestReceived):
                        self.methods.append(dict(event.headers)[b":method"])
                        answers.append(asyncio.create_task(answer(event.stream_id, len(answers))))
        except (ConnectionError, ssl.SSLError, h2.exceptions.ProtocolError, asyncio.CancelledError):
            pass
        finally:
            for task in answers:
                task.cancel()
            writer.transport.abort()


def _informational_heads(total: int) -> bytes:
    """103 Early Hints heads adding up to at least ``total`` bytes."""
    one = (
        b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload; as=style; x="
        + b"a" * 900
        + b"\r\n\r\n"
    )
    return one * (total // len(one) + 1)


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def dante_link() -> Iterator[str]:
    with danted() as peer:
        yield f"socks5://{peer.host}:{peer.port}"


@pytest.fixture(scope="module")
def ss_link() -> Iterator[str]:
    with ss_server(SS_METHOD, SS_PASSWORD, udp=False) as peer:
        yield f"ss://{SS_METHOD}:{SS_PASSWORD}@{peer.host}:{peer.port}#ss"


@pytest.fixture(params=["direct", "socks5-dante", "ss-server"])
def make_leaf(request: pytest.FixtureRequest) -> Callable[[MonotonicClock], object]:
    """The leaf under test, built on the probe's clock."""
    if request.param == "direct":
        return lambda clock: DirectOutbound(clock, STEP, mark=None)
    link = request.getfixturevalue("dante_link" if request.param == "socks5-dante" else "ss_link")
    return lambda clock: leaf_from_link(link, connect_timeout=STEP, clock=clock)


async def probe_through(
    make_leaf: Callable[[MonotonicClock], object], origin: Origin
) -> ProbeSample | ProbeError:
    """One probe through the leaf (outcome returned, not raised); its descriptors must all go afterwards."""
    clock = MonotonicClock()
    leaf = make_leaf(clock)
    shared_engine()  # the loop's relay engine lives as long as the loop: made before the count
    context = ssl.create_default_context(cadata=origin.ca.cert_pem.bytes().decode())
    before = open_fds()
    try:
        return await measure_http(
            leaf.dial_tcp,
            origin.url,
            "GET",
            clock,
            stage_timeout=STEP,  # type: ignore[attr-defined]
            ssl_context=context,
        )
    except ProbeError as error:
        return error
    finally:
        await poll(lambda: open_fds() <= before, "the probe's descriptors to close")
        runtime = getattr(leaf, "runtime", None)
        assert runtime is None or runtime.dials["ok"] == 1  # a proxy leaf carried the one connection


@pytest.mark.parametrize("kind", ["http1", "h2"])
def test_the_reported_rtt_is_the_warm_second_round(run, make_leaf, ca: trustme.CA, kind: str) -> None:
    async def scenario() -> tuple[ProbeSample | ProbeError, list[bytes], int]:
        async with Origin(kind, ca, (204, 204), ROUND_DELAYS) as origin:
            outcome = await probe_through(make_leaf, origin)
            return outcome, origin.methods, origin.connections

    outcome, methods, connections = run(scenario())
    assert isinstance(outcome, ProbeSample), outcome
    assert not outcome.fallback
    assert 0.035 <= outcome.rtt < 0.2  # round 2's 40 ms, not round 1's 300 ms
    assert (methods, connections) == ([b"HEAD", b"GET"], 1)


@pytest.mark.parametrize("kind", ["http1", "h2"])
@pytest.mark.parametrize(("status", "passes"), [(204, True), (301, True), (404, True), (500, False)])
def test_a_second_status_from_200_to_499_passes_and_500_fails(
    run, make_leaf, ca: trustme.CA, kind: str, status: int, passes: bool
) -> None:
    async def scenario() -> ProbeSample | ProbeError:
        async with Origin(kind, ca, (204, status), (0.0, 0.0)) as origin:
            return await probe_through(make_leaf, origin)

    outcome = run(scenario())
    if passes:
        assert outcome == ProbeSample(outcome.rtt) and 0 < outcome.rtt < STEP  # type: ignore[union-attr]
    else:
        assert isinstance(outcome, ProbeError) and (outcome.phase, outcome.reason) == ("request", "status")


def test_informational_heads_over_16_kib_fail_the_probe(run, make_leaf, ca: trustme.CA) -> None:
    async def scenario() -> ProbeSample | ProbeError:
        async with Origin("http1", ca, (204, 204), (0.0, 0.0), informational=17 * 1024) as origin:
            return await probe_through(make_leaf, origin)

    outcome = run(scenario())
    assert isinstance(outcome, ProbeError) and (outcome.phase, outcome.reason) == (
        "request",
        "informational-too-large",
    )


def test_a_goaway_after_round_one_returns_the_validated_first_sample(run, make_leaf, ca: trustme.CA) -> None:
    async def scenario() -> ProbeSample | ProbeError:
        async with Origin("h2", ca, (204, 204), ROUND_DELAYS, goaway_after_first=True) as origin:
            return await probe_through(make_leaf, origin)

    outcome = run(scenario())
    assert isinstance(outcome, ProbeSample) and outcome.fallback
    assert ROUND_DELAYS[0] <= outcome.rtt < STEP  # round 1's time, not round 2's
