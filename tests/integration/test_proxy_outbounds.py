"""SOCKS5 and HTTP CONNECT nodes against real servers (dante, microsocks, tinyproxy, haproxy TLS),
and UDP through honk's mixed port to SOCKS5 and Shadowsocks nodes (dante, ss-server).

Two layers: the outbounds on their own (a dial, then bytes through it), and honk's
mixed port routing everything to one node, driven by curl and by a SOCKS5 UDP client.
Misbehaving servers (closing mid-handshake, sending garbage, stalling) are small
Python servers here: no packaged server misbehaves on demand.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from helpers.aio import close_writer
from helpers.dns import UdpDnsResponder, build_query, parse_answer
from helpers.inprocess import dns_through_honk, honk_via
from helpers.peers import curl, require
from helpers.peerservers import SS_METHODS, danted, https_proxy, microsocks, ss_server, tinyproxy
from helpers.servers import EchoServer, HttpOrigin

from honk.config.links import parse_node_link
from honk.config.spec import GlobalSpec, Spec
from honk.core.clock import MonotonicClock
from honk.core.errors import DialError, DialTimeout, ProxyAuthFailed, TargetRefused
from honk.core.net import Address
from honk.outbound.registry import build_outbounds

STEP = 5.0  # seconds any single wait may take
DNS_NAME = "node.honk.test"
DNS_ANSWER = "192.0.2.44"


def _leaf(link: str, *, connect_timeout: float = 2.0):
    spec = Spec(global_=GlobalSpec(connect_timeout=connect_timeout), nodes=(parse_node_link(link, "node"),))
    outbounds, _ = build_outbounds(spec, MonotonicClock())
    return outbounds["node"]


def _link(scheme: str, host: str, port: int, auth: tuple[str, str] | None = None) -> str:
    userinfo = f"{auth[0]}:{auth[1]}@" if auth else ""
    return f"{scheme}://{userinfo}{host}:{port}"


async def _echo_through(leaf, echo: EchoServer, payload: bytes) -> bytes:
    clock = MonotonicClock()
    dialed = await leaf.dial_tcp(Address("127.0.0.1", echo.port), clock.now() + STEP)
    reader, writer = await asyncio.open_connection(sock=dialed.sock)
    try:
        writer.write(payload)  # no half-close: microsocks ends both directions at the first EOF
        return await asyncio.wait_for(reader.readexactly(len(payload)), STEP)
    finally:
        await close_writer(writer)


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    with EchoServer() as server:
        yield server


@pytest.fixture(scope="module")
def origin() -> Iterator[HttpOrigin]:
    with HttpOrigin() as server:
        yield server


# --- the outbounds on their own ---------------------------------------------------------------


@pytest.mark.parametrize(
    "peer", ["danted", "microsocks", "microsocks+auth", "tinyproxy", "tinyproxy+auth", "https+auth"]
)
def test_outbound_dials_through_a_real_server_and_bytes_flow_both_ways(run, echo, peer, monkeypatch) -> None:
    # tinyproxy's config cannot hold '@' or ':' in a password; SOCKS5 credentials are percent-encoded in links
    auth = (
        (("honk", "p@ss:word") if peer.startswith("microsocks") else ("honk", "secret"))
        if "+auth" in peer
        else None
    )
    with _peer(peer, auth) as (link, ca_path):
        if ca_path:
            monkeypatch.setenv("SSL_CERT_FILE", str(ca_path))  # the system trust store, as users configure it
        payload = os.urandom(256 * 1024)
        leaf = _leaf(link)
        assert run(_echo_through(leaf, echo, payload)) == payload
        assert leaf.runtime.dials["ok"] == 1


@pytest.mark.parametrize("peer", ["microsocks+auth", "tinyproxy+auth", "https+auth"])
def test_wrong_credentials_are_a_typed_authentication_error(run, echo, peer, monkeypatch) -> None:
    with _peer(peer, ("honk", "right")) as (link, ca_path):
        if ca_path:
            monkeypatch.setenv("SSL_CERT_FILE", str(ca_path))
        wrong = link.replace("honk:right@", "honk:wrong@")
        leaf = _leaf(wrong)
        with pytest.raises(ProxyAuthFailed) as info:
            run(_echo_through(leaf, echo, b"x"))
        assert info.value.phase == "auth" and "wrong" not in str(info.value)
        assert leaf.runtime.dials["auth"] == 1


def test_missing_credentials_are_an_authentication_error_too(run, echo) -> None:
    with microsocks("honk", "pw") as peer:
        with pytest.raises(ProxyAuthFailed, match="requires authentication"):
            run(_echo_through(_leaf(_link("socks5", peer.host, peer.port)), echo, b"x"))


def test_https_proxy_with_an_untrusted_certificate_fails_in_the_tls_phase(run, echo) -> None:
    with https_proxy() as peer:  # its CA is not in the trust store
        with pytest.raises(DialError) as info:
            run(_echo_through(_leaf(_link("https", peer.host, peer.port)), echo, b"x"))
        assert info.value.phase == "tls"


def test_a_refused_target_keeps_the_proxy_reply(run) -> None:
    with danted() as peer, socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))  # bound, never listening: connection refused
        leaf = _leaf(_link("socks5", peer.host, peer.port))
        with pytest.raises(TargetRefused) as info:
            run(leaf.dial_tcp(Address("127.0.0.1", hole.getsockname()[1]), time.monotonic() + STEP))
        assert info.value.reply == 0x05  # connection refused, as dante reported it


def test_socks5_udp_associate_through_dante_carries_a_dns_query(run) -> None:
    async def main(leaf, dns: UdpDnsResponder) -> list[str]:
        answers: asyncio.Queue[tuple[bytes, Address]] = asyncio.Queue()
        endpoint = await leaf.dial_udp(
            lambda data, source: answers.put_nowait((data, source)), time.monotonic() + STEP
        )
        try:
            endpoint.send(build_query(DNS_NAME, 0x4242), Address(dns.host, dns.port))
            data, source = await asyncio.wait_for(answers.get(), STEP)
            assert source == Address(dns.host, dns.port)
            qid, rcode, ips = parse_answer(data)
            assert (qid, rcode) == (0x4242, 0)
            return ips
        finally:
            endpoint.close()

    with danted() as peer, UdpDnsResponder({DNS_NAME: DNS_ANSWER}) as dns:
        assert run(main(_leaf(_link("socks5", peer.host, peer.port)), dns)) == [DNS_ANSWER]


# --- misbehaving servers ---------------------------------------------------------------------


class _BadServer:
    """A TCP server that answers every connection with ``behaviour``: close, garbage, or stall."""

    def __init__(self, behaviour: str) -> None:
        self.behaviour = behaviour
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.sock.accept()
                conn.recv(1024)  # the client's first message
                if self.behaviour == "close":
                    conn.close()
                elif self.behaviour == "garbage":
                    conn.sendall(b"\x17\x03\x03 this is not a proxy\r\n\r\n")
                    self.held.append(conn)
                else:
                    self.held.append(conn)  # stall: read, never answer

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


@pytest.mark.parametrize("scheme", ["socks5", "http"])
@pytest.mark.parametrize("behaviour", ["close", "garbage", "stall"])
def test_a_broken_server_is_a_typed_setup_error_within_the_deadline_and_spares_other_flows(
    run, echo, scheme, behaviour
) -> None:
    deadline_s = 0.5

    async def main(bad: _BadServer, good_link: str) -> None:
        leaf = _leaf(_link(scheme, "127.0.0.1", bad.port))
        good = _leaf(good_link)
        started = time.monotonic()
        failing = asyncio.ensure_future(leaf.dial_tcp(Address("127.0.0.1", echo.port), started + deadline_s))
        assert await _echo_through(good, echo, b"unaffected") == b"unaffected"  # while the bad dial hangs
        with pytest.raises(DialError) as info:
            await failing
        elapsed = time.monotonic() - started
        error = info.value
        assert error.phase == "handshake"
        assert isinstance(error, DialTimeout) == (behaviour == "stall")
        assert elapsed < deadline_s + 0.5
        assert leaf.runtime.dials["handshake"] == 1

    bad = _BadServer(behaviour)
    try:
        with danted() as peer:
            run(main(bad, _link("socks5", peer.host, peer.port)))
    finally:
        bad.close()


# --- honk's mixed port, one node -------------------------------------------------------------


@pytest.mark.parametrize("peer", ["danted", "microsocks+auth", "tinyproxy", "tinyproxy+auth", "https+auth"])
@pytest.mark.parametrize("client", ["socks5h", "http"])
def test_curl_through_honk_reaches_the_origin_via_each_node(run, origin, peer, client, monkeypatch) -> None:
    async def main(link: str) -> None:
        async with honk_via(link) as port:
            path = f"/via/{peer}/{client}"
            code, body, err = await curl("-x", f"{client}://127.0.0.1:{port}", origin.url(path))
            assert (code, body) == (0, HttpOrigin.body_for(path).decode()), err

    with _peer(peer, ("honk", "secret") if peer.endswith("+auth") else None) as (link, ca_path):
        if ca_path:
            monkeypatch.setenv("SSL_CERT_FILE", str(ca_path))
        run(main(link))


@pytest.mark.parametrize("node", ["danted", *(f"ss-{m}" for m in SS_METHODS)])
def test_honk_carries_socks5_udp_through_a_proxy_node(run, node) -> None:
    async def main(link: str, dns: UdpDnsResponder) -> None:
        assert await dns_through_honk(link, dns.address, DNS_NAME, 7) == (7, 0, [DNS_ANSWER])

    with _udp_node(node) as link, UdpDnsResponder({DNS_NAME: DNS_ANSWER}) as dns:
        run(main(link, dns))


@contextlib.contextmanager
def _udp_node(name: str) -> Iterator[str]:
    if name == "danted":
        with danted() as peer:
            yield _link("socks5", peer.host, peer.port)
        return
    method = name.removeprefix("ss-")
    with ss_server(method, "udp-secret", udp=True) as peer:
        userinfo = base64.urlsafe_b64encode(f"{method}:udp-secret".encode()).decode().rstrip("=")
        yield f"ss://{userinfo}@{peer.host}:{peer.port}"


# --- peers by name ------------------------------------------------------------------------------


@contextlib.contextmanager
def _peer(name: str, auth: tuple[str, str] | None) -> Iterator[tuple[str, str | None]]:
    """The share link of a running peer and, for TLS, the CA file to trust."""
    user, password = auth if auth else (None, None)
    kind = name.split("+")[0]
    if kind == "danted":
        with danted() as peer:
            yield _link("socks5", peer.host, peer.port), None
    elif kind == "microsocks":
        with microsocks(user, password) as peer:
            yield _link("socks5", peer.host, peer.port, auth), None
    elif kind == "tinyproxy":
        with tinyproxy(user, password) as peer:
            yield _link("http", peer.host, peer.port, auth), None
    else:
        with https_proxy(user, password) as peer:
            yield _link("https", peer.host, peer.port, auth), str(peer.ca_path)


def test_sockets_to_the_proxy_carry_the_bypass_mark(run, echo) -> None:
    from honk.outbound.direct import BYPASS_MARK, SO_MARK

    try:
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, SO_MARK, 1)
    except PermissionError:  # CI runs as root: the mark must be testable there
        require(False, "setting SO_MARK needs CAP_NET_ADMIN")

    async def main(leaf) -> tuple[int, int]:
        dialed = await leaf.dial_tcp(Address("127.0.0.1", echo.port), time.monotonic() + STEP)
        endpoint = await leaf.dial_udp(lambda data, source: None, time.monotonic() + STEP)
        try:
            udp_sock = endpoint._transport.get_extra_info("socket")
            return (
                dialed.sock.getsockopt(socket.SOL_SOCKET, SO_MARK),
                udp_sock.getsockopt(socket.SOL_SOCKET, SO_MARK),
            )
        finally:
            dialed.sock.close()
            endpoint.close()

    with danted() as peer:
        assert run(main(_leaf(_link("socks5", peer.host, peer.port)))) == (BYPASS_MARK, BYPASS_MARK)


def test_honk_process_dials_the_node_its_config_file_declares(tmp_path, echo) -> None:
    from helpers.proc import HonkProcess
    from helpers.socks import socks5_connect

    cfg = tmp_path / "honk.dae"
    with microsocks("honk", "secret") as peer:
        cfg.write_text(
            "global {\n    log_level: info\n    data_dir: ./var\n}\n"
            "inbound {\n    lan: 'mixed://127.0.0.1:0'\n}\n"
            f"node {{\n    upstream: 'socks5://honk:secret@127.0.0.1:{peer.port}'\n}}\n"
            "routing {\n    fallback: upstream\n}\n"
        )
        with HonkProcess(cfg) as honk:
            sock, rep = socks5_connect(honk.inbound(), "127.0.0.1", echo.port)
            with sock:
                assert rep == 0
                sock.sendall(b"through the node")
                assert sock.recv(100) == b"through the node"
    # with the node's server gone, the same config cannot reach the echo server: it really went via the node
    with HonkProcess(cfg) as honk:
        sock, rep = socks5_connect(honk.inbound(), "127.0.0.1", echo.port)
        sock.close()
        assert rep == 0x05  # connection refused by the node's (absent) server
