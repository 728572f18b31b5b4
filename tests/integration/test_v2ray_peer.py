"""The v2ray peer harness proven with v2ray's own client, independently of honk.

curl goes through a v2ray client (SOCKS5 in, VMess/VLESS/Trojan out) to a v2ray server and
on to a loopback HTTP origin; a hand-written SOCKS5 UDP client sends a DNS query the same
way. The wrong UUID, the wrong TLS name and mux carrier counts show the harness really
configures what it says. If these pass, a failing honk VMess/VLESS/Trojan interop test
points at honk, not at the harness.
"""

from __future__ import annotations

import contextlib
import dataclasses
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from helpers import peers
from helpers.dns import RCODE_NOERROR, UdpDnsResponder, build_query, parse_answer
from helpers.peers import require_binary
from helpers.peerservers import (
    V2RAY_MUX_CONCURRENCY,
    VMESS_SECURITIES,
    tcp_accepts,
    v2ray_client,
    v2ray_server,
)
from helpers.servers import EchoServer, HttpOrigin
from helpers.sockets import roundtrip
from helpers.socks import socks5_connect, socks5_udp_exchange

STEP = 5.0  # seconds: the most any single exchange in these tests may take
CURL_MAX_TIME = 10  # seconds: curl's own bound on a whole transfer
REFUSAL_WAIT = 3  # seconds: a v2ray server drops a client it refuses silently; bounds curl's wait
POLL_INTERVAL = 0.01  # seconds between checks of a polled condition

DNS_NAME = "v2ray.honk.test"
DNS_IPS = ("192.0.2.17",)  # RFC 5737 TEST-NET-1: a documentation address

REPLY_SUCCEEDED = 0x00  # RFC 1928 §6: the SOCKS5 success reply

# The shapes the issue asks the peer for: name -> v2ray_server keyword arguments.
SHAPES = {
    "vmess-tcp": dict(protocol="vmess"),
    "vmess-ws": dict(protocol="vmess", transport="ws"),
    "vmess-mux": dict(protocol="vmess", mux=True),
    "vless-tls": dict(protocol="vless"),
    "trojan-tls": dict(protocol="trojan"),
}
UDP_SHAPES = ("vmess-tcp", "vless-tls", "trojan-tls")


@pytest.fixture
def origin() -> Iterator[HttpOrigin]:
    with HttpOrigin() as server:
        yield server


@pytest.fixture
def responder() -> Iterator[UdpDnsResponder]:
    with UdpDnsResponder({DNS_NAME: DNS_IPS}) as server:
        yield server


def curl_through(
    proxy: tuple[str, int], url: str, max_time: int = CURL_MAX_TIME
) -> subprocess.CompletedProcess[str]:
    """curl ``url`` through the SOCKS5 proxy (names resolved by the proxy), with a bounded run time."""
    return subprocess.run(
        [
            require_binary("curl"),
            "-sS",
            "--max-time",
            str(max_time),
            "--socks5-hostname",
            f"{proxy[0]}:{proxy[1]}",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=max_time + STEP,
    )


def wait_for(condition: Callable[[], bool], timeout: float = STEP) -> bool:
    """Poll ``condition`` until it holds or ``timeout`` passes; its last value."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return condition()
        time.sleep(POLL_INTERVAL)  # polling interval of a bounded wait, not synchronisation
    return True


@contextlib.contextmanager
def open_streams(
    proxy: tuple[str, int], target: tuple[str, int], count: int
) -> Iterator[list[socket.socket]]:
    """``count`` SOCKS5 CONNECTs to ``target``, each proven live by an echo round trip, held open."""
    with contextlib.ExitStack() as stack:
        streams = []
        for i in range(count):
            sock, reply = socks5_connect(proxy, *target, timeout=STEP)
            stack.enter_context(sock)
            assert reply == REPLY_SUCCEEDED
            payload = f"stream {i}".encode()
            assert roundtrip(sock, payload) == payload
            streams.append(sock)
        yield streams


# --- TCP through each protocol and transport --------------------------------------------------


@pytest.mark.peer
@pytest.mark.parametrize("shape", list(SHAPES))
def test_curl_fetches_the_origin_through_a_v2ray_client_and_server(origin: HttpOrigin, shape: str) -> None:
    with v2ray_server(**SHAPES[shape]) as server, v2ray_client(server) as client:
        result = curl_through(client.address, origin.url(f"/via-{shape}"))
        accepted = server.accepted()
    assert result.returncode == 0, result.stderr
    assert result.stdout == HttpOrigin.body_for(f"/via-{shape}").decode()
    assert origin.paths == [f"/via-{shape}"]
    assert len(accepted) == 1 and f"127.0.0.1:{origin.port}" in accepted[0], "the server itself relayed it"


@pytest.mark.peer
@pytest.mark.parametrize("security", [s for s in VMESS_SECURITIES if s != "aes-128-gcm"])
def test_vmess_peer_carries_each_other_body_cipher(origin: HttpOrigin, security: str) -> None:
    with v2ray_server("vmess", security=security) as server, v2ray_client(server) as client:
        result = curl_through(client.address, origin.url(f"/{security}"))
    assert result.returncode == 0, result.stderr
    assert origin.paths == [f"/{security}"]


@pytest.mark.peer
def test_vless_and_trojan_servers_always_use_tls() -> None:
    with v2ray_server("vless") as vless, v2ray_server("trojan", password="s3cret") as trojan:
        assert vless.tls and trojan.tls
        assert trojan.password == "s3cret"
        for server in (vless, trojan):
            with (
                socket.create_connection(server.address, timeout=STEP) as raw,
                server.client_context().wrap_socket(raw, server_hostname="localhost") as tls,
            ):
                assert tls.version() is not None  # the handshake completed against the test CA


# --- Mux.Cool ---------------------------------------------------------------------------------


@pytest.mark.peer
def test_a_mux_client_carries_concurrent_streams_on_one_connection() -> None:
    streams = V2RAY_MUX_CONCURRENCY // 2
    with (
        EchoServer() as echo,
        v2ray_server("vmess", mux=True) as server,
        v2ray_client(server) as client,
        open_streams(client.address, echo.address, streams),
    ):
        assert wait_for(lambda: len(server.accepted()) == streams)
        assert server.carriers() == 1


@pytest.mark.peer
def test_without_mux_each_stream_has_its_own_connection() -> None:
    streams = V2RAY_MUX_CONCURRENCY // 2
    with (
        EchoServer() as echo,
        v2ray_server("vmess", mux=True) as server,
        v2ray_client(server, mux=False) as client,
        open_streams(client.address, echo.address, streams),
    ):
        assert wait_for(lambda: server.carriers() == streams)


# --- UDP: a DNS query over the client's SOCKS5 UDP ASSOCIATE --------------------------------


@pytest.mark.peer
@pytest.mark.parametrize("shape", UDP_SHAPES)
def test_v2ray_peer_relays_a_dns_query_over_socks5_udp(responder: UdpDnsResponder, shape: str) -> None:
    with v2ray_server(**SHAPES[shape]) as server, v2ray_client(server) as client:
        reply = socks5_udp_exchange(client.address, responder.address, build_query(DNS_NAME, 0x2B2B))
    assert parse_answer(reply) == (0x2B2B, RCODE_NOERROR, list(DNS_IPS))
    assert responder.counts[DNS_NAME] == 1


# --- refusals prove the harness really configures authentication and TLS ---------------------


@pytest.mark.peer
@pytest.mark.parametrize("protocol", ["vmess", "vless"])
def test_a_client_with_another_uuid_gets_nothing_through(origin: HttpOrigin, protocol: str) -> None:
    with v2ray_server(protocol) as server:
        impostor = dataclasses.replace(server, uuid=str(uuid.uuid4()))
        with v2ray_client(impostor) as client:
            result = curl_through(client.address, origin.url("/impostor"), max_time=REFUSAL_WAIT)
    assert result.returncode != 0
    assert origin.paths == []


@pytest.mark.peer
def test_a_trojan_client_with_another_password_gets_nothing_through(origin: HttpOrigin) -> None:
    with v2ray_server("trojan", password="right") as server:
        with v2ray_client(dataclasses.replace(server, password="wrong")) as client:
            result = curl_through(client.address, origin.url("/wrong"), max_time=REFUSAL_WAIT)
    assert result.returncode != 0
    assert origin.paths == []


@pytest.mark.peer
def test_a_tls_client_asking_for_a_name_outside_the_certificate_fails(origin: HttpOrigin) -> None:
    with v2ray_server("trojan") as server, v2ray_client(server, server_name="elsewhere.example") as client:
        result = curl_through(client.address, origin.url("/misnamed"), max_time=REFUSAL_WAIT)
    assert result.returncode != 0
    assert origin.paths == []


# --- lifecycle --------------------------------------------------------------------------------


@pytest.mark.peer
def test_leaving_v2ray_peers_stops_them_and_frees_their_ports() -> None:
    with v2ray_server("vmess") as server, v2ray_client(server) as client:
        assert tcp_accepts(server.port)() and tcp_accepts(client.port)()
    assert not tcp_accepts(server.port)()
    assert not tcp_accepts(client.port)()


def test_v2ray_server_refuses_an_unknown_protocol_before_starting() -> None:
    with pytest.raises(ValueError, match="protocol"):
        with v2ray_server("shadowsocks"):
            pass


def test_missing_v2ray_fails_the_test_under_ci(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no v2ray anywhere
    monkeypatch.setattr(peers, "IN_CI", True)
    with pytest.raises(pytest.fail.Exception, match="v2ray is required in CI"):
        with v2ray_server("vmess"):
            pass


def test_missing_v2ray_skips_outside_ci(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(peers, "IN_CI", False)
    with pytest.raises(pytest.skip.Exception):
        with v2ray_server("vmess"):
            pass
