"""Subscriptions over real loopback sockets: fetch, the manager on a FakeClock, and the daemon.

The origin is :class:`SubServer`, a small threaded HTTP/1.1 server whose replies a
test sets per path (length-delimited, chunked, read-until-close, redirects, a
never-ending body, or no answer at all), optionally behind TLS from a trustme CA.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import signal
import socket
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme
from helpers.peers import require_binary
from helpers.proc import HonkProcess
from helpers.servers import EchoServer, free_port
from helpers.sockets import roundtrip
from helpers.socks import socks5_connect

from honk import __version__
from honk.config.links import parse_node_link
from honk.config.spec import GlobalSpec, SubscriptionSpec
from honk.core.clock import FakeClock, MonotonicClock
from honk.outbound.direct import DirectOutbound
from honk.outbound.shadowsocks import ShadowsocksOutbound
from honk.subscription.fetch import MAX_REDIRECTS, SubscriptionFetchError, fetch
from honk.subscription.formats import MAX_BODY_BYTES
from honk.subscription.manager import SubscriptionManager
from honk.subscription.store import SubscriptionStore, body_key

STEP = 10.0  # seconds: the most one exchange may take in a test (real time)
SECRET = "s3cretPW"
SS_USERINFO = base64.urlsafe_b64encode(f"aes-256-gcm:{SECRET}".encode()).decode().rstrip("=")
BODY_A = f"socks5://127.0.0.1:1081#node-a\nss://{SS_USERINFO}@127.0.0.1:8388#node-ss\n".encode()
BODY_B = b"socks5://127.0.0.1:1082#node-b\n"


# --- the origin -----------------------------------------------------------------------------


@dataclass
class Reply:
    status: int = 200
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()
    chunked: bool = False
    until_close: bool = False  # no length: the body ends when the server closes
    endless: bool = False  # chunked, and it never ends
    hang: bool = False  # read the request, then answer nothing
    raw: bytes | None = None  # these bytes instead of a response


class SubServer:
    """HTTP/1.1 on 127.0.0.1, one thread per connection; ``replies`` maps a path to its reply."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.replies: dict[str, Reply] = {}
        self.requests: list[tuple[str, dict[str, str]]] = []
        self._tls = tls
        self._cond = threading.Condition()
        self._closing = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, path: str) -> str:
        return f"{'https' if self._tls else 'http'}://127.0.0.1:{self.port}{path}"

    def wait_requests(self, count: int, timeout: float = STEP) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: len(self.requests) >= count, timeout):
                raise AssertionError(f"{len(self.requests)} requests arrived, expected {count}")

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            if self._tls is not None:
                conn = self._tls.wrap_socket(conn, server_side=True)
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                head += chunk
            line, *fields = head.split(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")
            path = line.split(" ")[1]
            headers = {k.strip().lower(): v.strip() for k, _, v in (f.partition(":") for f in fields)}
            with self._cond:
                self.requests.append((path, headers))
                self._cond.notify_all()
            self._answer(conn, self.replies.get(path, Reply(404)))
        except OSError:
            pass
        finally:
            conn.close()

    def _answer(self, conn: socket.socket, reply: Reply) -> None:
        if reply.hang:
            self._closing.wait()
            return
        if reply.raw is not None:
            conn.sendall(reply.raw)
            return
        head = [f"HTTP/1.1 {reply.status} Reply", *(f"{k}: {v}" for k, v in reply.headers)]
        if reply.chunked or reply.endless:
            head.append("Transfer-Encoding: chunked")
        elif reply.until_close:
            head.append("Connection: close")
        else:
            head.append(f"Content-Length: {len(reply.body)}")
        conn.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        if reply.endless:
            piece = b"#" * 65536
            while not self._closing.is_set():
                conn.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))  # ends when the client hangs up
        elif reply.chunked:
            half = len(reply.body) // 2
            for part in (reply.body[:half], reply.body[half:]):
                if part:
                    conn.sendall(b"%x\r\n%s\r\n" % (len(part), part))
            conn.sendall(b"0\r\n\r\n")
        else:
            conn.sendall(reply.body)

    def close(self) -> None:
        self._closing.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread; close alone does not
        self._listener.close()


@pytest.fixture
def origin():
    server = SubServer()
    yield server
    server.close()


@pytest.fixture(scope="module")
def ca():
    return trustme.CA()


@pytest.fixture
def tls_origin(ca):
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1", "localhost").configure_cert(server_ctx)
    server = SubServer(tls=server_ctx)
    yield server
    server.close()


def client_context(ca: trustme.CA) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ca.configure_trust(ctx)
    return ctx


async def get(url: str, clock=None, **kwargs):
    clock = clock or MonotonicClock()
    return await fetch(
        url, dial=DirectOutbound(clock, STEP).dial_tcp, clock=clock, deadline=clock.now() + STEP, **kwargs
    )


def fetch_error(run, url: str, **kwargs) -> SubscriptionFetchError:
    with pytest.raises(SubscriptionFetchError) as info:
        run(get(url, **kwargs))
    return info.value


# --- fetch ----------------------------------------------------------------------------------


def test_fetch_returns_the_body_and_identifies_as_honk(run, origin):
    origin.replies["/sub?token=x"] = Reply(body=BODY_A)
    result = run(get(origin.url("/sub?token=x")))
    assert (result.body, result.status, result.redirects) == (BODY_A, 200, 0)
    path, headers = origin.requests[0]
    assert path == "/sub?token=x"
    assert headers["user-agent"] == f"honk/{__version__}"
    assert headers["host"] == f"127.0.0.1:{origin.port}"


def test_a_configured_user_agent_replaces_the_default(run, origin):
    origin.replies["/sub"] = Reply(body=BODY_A)
    run(get(origin.url("/sub"), user_agent="clash.meta"))
    assert origin.requests[0][1]["user-agent"] == "clash.meta"


def test_non_ascii_in_the_url_path_is_percent_encoded_and_escapes_are_kept(run, origin):
    origin.replies["/s%C3%BCb?t=a%2Fb"] = Reply(body=BODY_A)
    assert run(get(origin.url("/süb?t=a%2Fb"))).body == BODY_A


@pytest.mark.parametrize("shape", ["chunked", "until_close"])
def test_chunked_and_read_until_close_bodies_arrive_whole(run, origin, shape):
    origin.replies["/sub"] = Reply(body=BODY_A * 50, **{shape: True})
    assert run(get(origin.url("/sub"))).body == BODY_A * 50


def test_https_is_verified_against_the_given_trust(run, tls_origin, ca):
    tls_origin.replies["/sub"] = Reply(body=BODY_A)
    assert run(get(tls_origin.url("/sub"), ssl_context=client_context(ca))).body == BODY_A


def test_https_with_an_untrusted_certificate_is_a_tls_error(run, tls_origin):
    tls_origin.replies["/sub"] = Reply(body=BODY_A)
    assert fetch_error(run, tls_origin.url("/sub"), ssl_context=client_context(trustme.CA())).reason == "tls"


def test_redirects_are_followed_up_to_the_limit(run, origin):
    for hop in range(MAX_REDIRECTS):
        origin.replies[f"/r{hop}"] = Reply(302 if hop % 2 else 301, headers=(("Location", f"/r{hop + 1}"),))
    origin.replies[f"/r{MAX_REDIRECTS}"] = Reply(body=BODY_B)
    result = run(get(origin.url("/r0")))
    assert (result.body, result.redirects) == (BODY_B, MAX_REDIRECTS)


def test_one_redirect_too_many_fails(run, origin):
    for hop in range(MAX_REDIRECTS + 1):
        origin.replies[f"/r{hop}"] = Reply(307, headers=(("Location", origin.url(f"/r{hop + 1}")),))
    origin.replies[f"/r{MAX_REDIRECTS + 1}"] = Reply(body=BODY_B)
    assert fetch_error(run, origin.url("/r0")).reason == "too-many-redirects"
    assert len(origin.requests) == MAX_REDIRECTS + 1


@pytest.mark.parametrize(
    ("location", "reason"),
    [
        ("http://127.0.0.2:1/sub", "redirect-private-address"),
        ("http://[::1]:1/sub", "redirect-private-address"),
        ("http://10.1.2.3/sub", "redirect-private-address"),
        ("file:///etc/passwd", "redirect-scheme"),
        ("http://[::1/sub", "redirect-invalid"),
    ],
)
def test_redirects_to_other_internal_addresses_or_schemes_are_refused(run, origin, location, reason):
    origin.replies["/sub"] = Reply(302, headers=(("Location", location),))
    assert fetch_error(run, origin.url("/sub")).reason == reason
    assert len(origin.requests) == 1  # nothing was dialled for the refused hop


def test_a_redirect_from_https_to_http_is_refused(run, tls_origin, ca):
    tls_origin.replies["/sub"] = Reply(301, headers=(("Location", f"http://127.0.0.1:{tls_origin.port}/x"),))
    assert (
        fetch_error(run, tls_origin.url("/sub"), ssl_context=client_context(ca)).reason
        == "redirect-downgrade"
    )


def test_a_non_2xx_status_is_an_error_with_the_status(run, origin):
    origin.replies["/sub"] = Reply(503, body=b"maintenance")
    err = fetch_error(run, origin.url("/sub"))
    assert (err.reason, err.status) == ("http-status", 503)


def test_a_declared_length_over_the_cap_is_refused_before_the_body(run, origin):
    origin.replies["/sub"] = Reply(body=b"#" * 2048)
    assert fetch_error(run, origin.url("/sub"), max_bytes=1024).reason == "body-too-large"


def test_an_endless_body_stops_at_eight_mebibytes_while_reading(run, origin):
    origin.replies["/sub"] = Reply(endless=True)  # the server never ends it: the cap must
    assert fetch_error(run, origin.url("/sub")).reason == "body-too-large"
    assert MAX_BODY_BYTES == 8 * 1024 * 1024


def test_a_malformed_response_is_reported_as_such(run, origin):
    origin.replies["/sub"] = Reply(raw=b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
    assert fetch_error(run, origin.url("/sub")).reason == "malformed-response"


def test_a_refused_connection_is_a_dial_failure(run):
    assert fetch_error(run, f"http://127.0.0.1:{free_port()}/sub").reason == "dial-failed"


def test_a_server_that_never_answers_fails_at_the_deadline_on_the_injected_clock(run, origin):
    origin.replies["/sub"] = Reply(hang=True)

    async def scenario() -> str:
        clock = FakeClock()
        task = asyncio.ensure_future(get(origin.url("/sub"), clock=clock))
        await asyncio.to_thread(origin.wait_requests, 1)
        assert not task.done()
        clock.advance(STEP)
        with pytest.raises(SubscriptionFetchError) as info:
            await asyncio.wait_for(task, STEP)
        return info.value.reason

    assert run(scenario()) == "timeout"


def test_a_download_through_a_shadowsocks_outbound_reaches_the_origin(run, origin):
    from helpers.peerservers import ss_server

    origin.replies["/sub"] = Reply(body=BODY_A)
    clock = MonotonicClock()
    with ss_server("aes-256-gcm", SECRET, udp=False) as peer:
        leaf = ShadowsocksOutbound(
            parse_node_link(f"ss://{SS_USERINFO}@127.0.0.1:{peer.port}#ss"), GlobalSpec(), clock
        )
        result = run(fetch(origin.url("/sub"), dial=leaf.dial_tcp, clock=clock, deadline=clock.now() + STEP))
    assert result.body == BODY_A and [path for path, _ in origin.requests] == ["/sub"]


# --- the manager on a FakeClock ---------------------------------------------------------------


class Published(list):
    """What the manager published, in order."""

    def names(self, index: int = -1) -> dict[str, list[str]]:
        return {tag: [n.name for n in nodes] for tag, nodes in self[index].items()}


def manager(specs, data_dir, clock: FakeClock, published: Published) -> SubscriptionManager:
    return SubscriptionManager(specs, data_dir, clock, DirectOutbound(clock, STEP).dial_tcp, published.append)


async def until(condition, bound: float = STEP) -> None:
    """Poll ``condition`` until it holds; fail after ``bound`` seconds of real time."""
    loop = asyncio.get_running_loop()
    end = loop.time() + bound
    while not condition():
        if loop.time() > end:
            raise AssertionError("condition did not hold in time")
        await asyncio.sleep(0.005)


def idle(m: SubscriptionManager, clock: FakeClock, attempts: int) -> bool:
    """Every subscription finished ``attempts`` refreshes and sleeps until its next one."""
    return all(s.attempts == attempts for s in m.states()) and clock.sleepers == len(m.states())


def test_manager_refreshes_every_interval_and_publishes_changes(run, origin, tmp_path):
    origin.replies["/sub"] = Reply(body=BODY_A)
    spec = SubscriptionSpec("paid", origin.url("/sub"), interval=3600.0)

    async def scenario() -> None:
        clock, published = FakeClock(), Published()
        m = manager([spec], tmp_path, clock, published)
        await m.start()
        await until(lambda: idle(m, clock, 1))
        assert published.names() == {"paid": ["node-a", "node-ss"]}
        assert all(n.subscription == "paid" for n in published[-1]["paid"])

        origin.replies["/sub"] = Reply(body=BODY_B)
        clock.advance(3599.0)
        assert len(origin.requests) == 1 and m.states()[0].attempts == 1
        clock.advance(1.0)
        await until(lambda: idle(m, clock, 2))
        assert published.names() == {"paid": ["node-b"]} and len(published) == 2

        clock.advance(3600.0)  # the same body again: nothing new to publish
        await until(lambda: idle(m, clock, 3))
        assert len(published) == 2
        await m.stop()

    run(scenario())


@pytest.mark.parametrize(
    "broken",
    [
        pytest.param(Reply(body=b""), id="empty"),
        pytest.param(Reply(body=b"vmess://only-unsupported\n"), id="no-usable-node"),
        pytest.param(Reply(body=b"proxies: [unclosed\n"), id="malformed"),
        pytest.param(Reply(body=b"\xff\xfe\xfd"), id="bad-encoding"),
        pytest.param(Reply(500), id="http-error"),
        pytest.param(Reply(endless=True), id="huge"),
    ],
)
def test_a_failed_refresh_keeps_the_previous_nodes_and_stored_body(run, origin, tmp_path, broken):
    origin.replies["/sub"] = Reply(body=BODY_A)
    spec = SubscriptionSpec("paid", origin.url("/sub"), interval=60.0)

    async def scenario() -> None:
        clock, published = FakeClock(), Published()
        m = manager([spec], tmp_path, clock, published)
        await m.start()
        await until(lambda: idle(m, clock, 1))
        origin.replies["/sub"] = broken
        clock.advance(60.0)
        await until(lambda: idle(m, clock, 2))
        state = m.states()[0]
        assert state.last_error is not None and state.nodes == 2
        assert m.nodes() == published[-1] and len(published) == 1
        await m.stop()

    run(scenario())
    store = SubscriptionStore.open(tmp_path)
    try:
        assert store.load(body_key(spec.url, None)) == BODY_A
    finally:
        store.close()


def test_stored_nodes_are_available_at_start_without_network(run, tmp_path):
    url = f"http://127.0.0.1:{free_port()}/sub"  # nothing listens there
    store = SubscriptionStore.open(tmp_path)
    store.save(body_key(url, None), BODY_A, now=1.0)
    store.close()

    async def scenario() -> None:
        clock, published = FakeClock(), Published()
        m = manager([SubscriptionSpec("paid", url, interval=0.0)], tmp_path, clock, published)
        await m.start()
        # Published before any fetch finished.
        assert published.names() == {"paid": ["node-a", "node-ss"]} and m.states()[0].restored
        await m.wait_settled()  # a restored subscription does not hold the start up
        await until(lambda: m.states()[0].attempts == 1)
        assert m.states()[0].last_error == "dial-failed"
        assert m.nodes() == published[-1] and len(published) == 1
        await m.stop()

    run(scenario())


def test_cache_false_neither_restores_nor_stores_and_forgets_an_older_body(run, origin, tmp_path):
    origin.replies["/sub"] = Reply(body=BODY_B)
    spec = SubscriptionSpec("paid", origin.url("/sub"), interval=0.0, cache=False)
    store = SubscriptionStore.open(tmp_path)
    store.save(body_key(spec.url, None), BODY_A, now=1.0)
    store.close()

    async def scenario() -> None:
        clock, published = FakeClock(), Published()
        m = manager([spec], tmp_path, clock, published)
        await m.start()
        assert published == []
        await until(lambda: m.states()[0].attempts == 1)
        assert published.names() == {"paid": ["node-b"]}
        await m.stop()

    run(scenario())
    store = SubscriptionStore.open(tmp_path)
    try:
        assert store.load(body_key(spec.url, None)) is None
    finally:
        store.close()


def test_without_a_data_dir_nothing_is_stored(run, origin, tmp_path):
    origin.replies["/sub"] = Reply(body=BODY_A)

    async def scenario() -> None:
        clock, published = FakeClock(), Published()
        m = manager([SubscriptionSpec("paid", origin.url("/sub"), interval=0.0)], None, clock, published)
        await m.start()
        await until(lambda: m.states()[0].attempts == 1)
        assert published.names() == {"paid": ["node-a", "node-ss"]}
        await m.stop()

    run(scenario())
    assert not (tmp_path / "state").exists()


def test_reload_keeps_nodes_of_unchanged_sources_renamed_drops_removed_and_refreshes(run, origin, tmp_path):
    origin.replies["/a"] = Reply(body=BODY_A)
    origin.replies["/b"] = Reply(body=BODY_B)
    a = SubscriptionSpec("paid", origin.url("/a"), interval=0.0)
    b = SubscriptionSpec("free", origin.url("/b"), interval=0.0)

    async def scenario() -> None:
        clock, published = FakeClock(), Published()
        m = manager([a, b], tmp_path, clock, published)
        await m.start()
        await until(lambda: [s.attempts for s in m.states()] == [1, 1])
        renamed = SubscriptionSpec("premium", a.url, interval=0.0)
        carried = m.carried([renamed])
        assert {tag: [n.name for n in nodes] for tag, nodes in carried.items()} == {
            "premium": ["node-a", "node-ss"]
        }
        assert all(n.subscription == "premium" for n in carried["premium"])
        before = len(origin.requests)
        count = len(published)
        await m.reload([renamed])
        assert m.nodes() == carried and len(published) == count  # the caller applied it
        await until(lambda: m.states()[0].attempts == 1)
        assert len(origin.requests) == before + 1  # refreshed in the background
        assert [s.name for s in m.states()] == ["premium"]
        await m.stop()

    run(scenario())


def test_stop_during_a_hanging_fetch_returns_and_records_nothing(run, origin, tmp_path):
    origin.replies["/sub"] = Reply(hang=True)

    async def scenario() -> None:
        clock, published = FakeClock(), Published()
        m = manager([SubscriptionSpec("paid", origin.url("/sub"))], tmp_path, clock, published)
        await m.start()
        await asyncio.to_thread(origin.wait_requests, 1)
        await asyncio.wait_for(m.stop(), STEP)
        assert m.states()[0].attempts == 0 and published == []
        await m.stop()  # twice is harmless

    run(scenario())


# --- the daemon ------------------------------------------------------------------------------


def write_config(path: Path, sub_url: str, echo_port: int, extra_global: str = "") -> None:
    path.write_text(
        "global {\n"
        "    data_dir: ./var\n"
        f"{extra_global}"
        "}\n"
        "inbound {\n"
        "    lan: 'mixed://127.0.0.1:0'\n"
        "}\n"
        "subscription {\n"
        f"    paid: '{sub_url}'\n"
        "}\n"
        "group {\n"
        "    proxy {\n"
        "        filter: subtag(paid) && name(keyword: socks)\n"
        "    }\n"
        "}\n"
        "routing {\n"
        f"    dport({echo_port}) -> proxy\n"
        "    fallback: direct\n"
        "}\n"
    )


@contextlib.contextmanager
def socks_peer():
    from helpers.peerservers import microsocks

    require_binary("microsocks")
    with microsocks() as peer:
        yield peer


def test_daemon_routes_through_a_node_from_a_subscription_selected_by_subtag(tmp_path):
    cfg = tmp_path / "honk.dae"
    with EchoServer() as echo, socks_peer() as peer:
        origin = SubServer()
        try:
            origin.replies["/sub"] = Reply(
                body=f"socks5://{peer.host}:{peer.port}#socks-hk\n".encode() + b"vmess://unsupported\n"
            )
            write_config(cfg, origin.url("/sub"), echo.port)
            with HonkProcess(cfg, "--debug") as honk:
                proxy = honk.inbound()
                honk.wait_for(r"subscription updated .*subscription=paid nodes=1 skipped=1")
                sock, rep = socks5_connect(proxy, "127.0.0.1", echo.port)
                assert rep == 0
                assert roundtrip(sock, b"via the subscription") == b"via the subscription"
                sock.close()
                line = honk.wait_for(r"flow opened network=tcp .*target=127\.0\.0\.1:\d+ .*chain=(\S+)")
                assert line.group(1) == "proxy>socks-hk"
        finally:
            origin.close()


def test_daemon_starts_from_the_stored_body_when_the_subscription_is_unreachable(tmp_path):
    cfg = tmp_path / "honk.dae"
    with EchoServer() as echo, socks_peer() as peer:
        origin = SubServer()
        origin.replies["/sub"] = Reply(body=f"socks5://{peer.host}:{peer.port}#socks-hk\n".encode())
        write_config(cfg, origin.url("/sub"), echo.port)
        try:
            with HonkProcess(cfg) as honk:
                honk.wait_for(r"subscription updated .*nodes=1")
        finally:
            origin.close()  # from now on the subscription cannot be fetched
        with HonkProcess(cfg, "--debug") as honk:
            proxy = honk.inbound()
            honk.wait_for(r"subscription restored from store .*subscription=paid nodes=1")
            sock, rep = socks5_connect(proxy, "127.0.0.1", echo.port)
            assert rep == 0 and roundtrip(sock, b"offline start") == b"offline start"
            sock.close()
            honk.wait_for(
                r"subscription refresh failed; previous nodes kept .*reason=dial-failed nodes_kept=1"
            )


def test_daemon_applies_a_changed_subscription_after_sighup_as_a_new_generation(tmp_path):
    cfg = tmp_path / "honk.dae"
    with EchoServer() as echo, socks_peer() as peer:
        origin = SubServer()
        try:
            origin.replies["/sub"] = Reply(body=f"socks5://{peer.host}:{peer.port}#socks-one\n".encode())
            write_config(cfg, origin.url("/sub"), echo.port)
            with HonkProcess(cfg, "--debug") as honk:
                proxy = honk.inbound()
                honk.wait_for(r"subscription updated .*nodes=1")
                origin.replies["/sub"] = Reply(body=f"socks5://{peer.host}:{peer.port}#socks-two\n".encode())
                mark = honk.mark()
                honk.signal(signal.SIGHUP)
                # The reload carries socks-one; the background refresh then brings socks-two.
                honk.wait_for(
                    r"config reloaded: .*reused \[dns, outbound direct@v1, outbound block@v1, outbound socks-one@v1",
                    after=mark,
                )
                honk.wait_for(
                    r"subscription nodes applied: built \[outbound socks-two@v1, group proxy\]; drained \[socks-one@v1\]",
                    after=mark,
                )
                sock, rep = socks5_connect(proxy, "127.0.0.1", echo.port)
                assert rep == 0 and roundtrip(sock, b"two") == b"two"
                sock.close()
                assert (
                    honk.wait_for(r"flow opened network=tcp .*chain=(\S+)", after=mark).group(1)
                    == "proxy>socks-two"
                )
        finally:
            origin.close()


def test_changing_store_subscribe_needs_a_restart(tmp_path):
    cfg = tmp_path / "honk.dae"
    with EchoServer() as echo:
        write_config(cfg, f"http://127.0.0.1:{free_port()}/sub", echo.port)
        with HonkProcess(cfg) as honk:
            honk.inbound()
            write_config(
                cfg, f"http://127.0.0.1:{free_port()}/sub", echo.port, "    store_subscribe: false\n"
            )
            mark = honk.mark()
            honk.signal(signal.SIGHUP)
            honk.wait_for(
                r"reload: global.store_subscribe: fixed for the process lifetime; restart to change it; "
                r"keeping the running config",
                after=mark,
            )


def test_a_refresh_gives_a_changed_node_a_new_runtime_and_keeps_the_others(tmp_path, run):
    """In process, to look at the planes: unchanged nodes keep NodeId and runtime, a changed one
    gets a new runtime and the old one is closed once the new plane is published."""
    from honk.daemon.app import Daemon

    def body(b_port: int) -> bytes:
        return (
            f"socks5://127.0.0.1:1080#socks-a\nsocks5://u:p@127.0.0.1:{b_port}#socks-b\n"
            "socks5://127.0.0.1:1082#socks-c\n"
        ).encode()

    async def main(origin: SubServer) -> None:
        daemon = Daemon(cfg)
        await daemon.start()
        try:
            first = daemon.plane
            assert first is not None and {"socks-a", "socks-b", "socks-c"} <= first.outbounds.keys()
            kept = {n: first.outbounds[n].runtime for n in ("socks-a", "socks-b", "socks-c")}
            ids = {n: first.outbounds[n].node.id for n in kept}
            origin.replies["/sub"] = Reply(body=body(2081))  # socks-b moves to another port
            assert await daemon.reload()
            loop = asyncio.get_running_loop()
            give_up = loop.time() + STEP
            while daemon.plane.outbounds["socks-b"].node.port != 2081:  # the background refresh lands
                assert loop.time() < give_up, "the refreshed subscription was never applied"
                await asyncio.sleep(0.01)
            now = daemon.plane.outbounds
            for name in ("socks-a", "socks-c"):
                assert now[name].node.id == ids[name] and now[name].runtime is kept[name]
                assert not kept[name].closed
            assert now["socks-b"].node.id != ids["socks-b"]
            assert now["socks-b"].runtime is not kept["socks-b"] and kept["socks-b"].closed
        finally:
            await daemon.shutdown(0.0)

    cfg = tmp_path / "honk.dae"
    origin = SubServer()
    try:
        origin.replies["/sub"] = Reply(body=body(2080))
        cfg.write_text(
            "global {\n    data_dir: ./var\n}\n"
            "inbound {\n    lan: 'mixed://127.0.0.1:0'\n}\n"
            f"subscription {{\n    paid: '{origin.url('/sub')}'\n}}\n"
            "routing {\n    fallback: direct\n}\n"
        )
        run(main(origin))
    finally:
        origin.close()


def test_a_subscription_with_a_detour_downloads_through_that_node(tmp_path, run):
    """The detour names a node of the file; its runtime counts the download's dial."""
    from helpers.peerservers import microsocks

    from honk.daemon.app import Daemon

    async def main() -> None:
        daemon = Daemon(cfg)
        await daemon.start()
        try:
            plane = daemon.plane
            assert plane is not None and "socks-hk" in plane.outbounds  # the body arrived
            assert plane.outbounds["up"].runtime.dials["ok"] >= 1  # through the detour
        finally:
            await daemon.shutdown(0.0)

    cfg = tmp_path / "honk.dae"
    origin = SubServer()
    try:
        origin.replies["/sub"] = Reply(body=b"socks5://127.0.0.1:1080#socks-hk\n")
        with microsocks("honk", "detour") as peer:
            cfg.write_text(
                "global {\n    data_dir: ./var\n}\n"
                "inbound {\n    lan: 'mixed://127.0.0.1:0'\n}\n"
                f"node {{\n    up: 'socks5://honk:detour@127.0.0.1:{peer.port}'\n}}\n"
                f"subscription {{\n    paid: {{\n        url: '{origin.url('/sub')}'\n        detour: up\n    }}\n}}\n"
                "routing {\n    fallback: direct\n}\n"
            )
            run(main())
    finally:
        origin.close()
