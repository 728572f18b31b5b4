"""The peer-server harness proven with clients that exist independently of honk.

curl talks to Dante, microsocks, tinyproxy and the haproxy TLS front; ss-local talks to
ss-server with each AEAD cipher; a hand-written SOCKS5 UDP client checks Dante's and
ss-local/ss-server's UDP relays against the loopback DNS responder. If these pass, a
failing honk interop test points at honk, not at the harness.
"""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import subprocess
from collections.abc import Iterator

import pytest
import trustme
from helpers.dns import (
    RCODE_FORMERR,
    RCODE_NOERROR,
    RCODE_NOTIMP,
    RCODE_NXDOMAIN,
    TYPE_AAAA,
    UdpDnsResponder,
    build_query,
    build_response,
    parse_answer,
)
from helpers.peers import require_binary
from helpers.peerservers import (
    SS_METHODS,
    PeerStartError,
    danted,
    https_proxy,
    microsocks,
    ss_local,
    ss_server,
    tcp_accepts,
    tinyproxy,
)
from helpers.servers import HttpOrigin
from helpers.socks import socks5_udp_exchange
from hypothesis import given
from hypothesis import strategies as st

STEP = 5.0  # seconds: the most any single exchange in these tests may take
CURL_MAX_TIME = 10  # seconds: curl's own bound on a whole transfer
# ss-server answers a client with the wrong key with silence (it resists probing), so
# that failure shows only as curl giving up; this bounds the wait.
SILENT_REFUSAL_WAIT = 2

DNS_NAME = "peer.honk.test"
DNS_IPS = ("192.0.2.7", "192.0.2.8")  # RFC 5737 TEST-NET-1: documentation addresses


# curl's exit code 60 (CURLE_PEER_FAILED_VERIFICATION): the certificate could not be verified.
CURL_PEER_FAILED_VERIFICATION = 60


# --- fixtures and clients -------------------------------------------------------------------


@pytest.fixture
def origin() -> Iterator[HttpOrigin]:
    with HttpOrigin() as server:
        yield server


@pytest.fixture
def responder() -> Iterator[UdpDnsResponder]:
    with UdpDnsResponder({DNS_NAME: DNS_IPS}) as server:
        yield server


def curl(*args: str, max_time: int = CURL_MAX_TIME) -> subprocess.CompletedProcess[str]:
    """curl quietly with a bounded run time; stdout is the body, then a line with the CONNECT status."""
    return subprocess.run(
        [require_binary("curl"), "-sS", "--max-time", str(max_time), "-w", "\n%{http_connect}", *args],
        capture_output=True,
        text=True,
        timeout=max_time + STEP,
    )


def body_and_connect_status(result: subprocess.CompletedProcess[str]) -> tuple[str, int]:
    body, _, status = result.stdout.rpartition("\n")
    return body, int(status or 0)


# --- SOCKS5: Dante and microsocks -----------------------------------------------------------


@pytest.mark.peer
def test_curl_fetches_the_origin_through_danted(origin: HttpOrigin) -> None:
    with danted() as proxy:
        result = curl("--socks5-hostname", f"{proxy.host}:{proxy.port}", origin.url("/via-danted"))
    body, _ = body_and_connect_status(result)
    assert result.returncode == 0, result.stderr
    assert body == HttpOrigin.body_for("/via-danted").decode()
    assert origin.paths == ["/via-danted"]


@pytest.mark.peer
def test_danted_relays_a_dns_query_over_udp_associate(responder: UdpDnsResponder) -> None:
    with danted() as proxy:
        reply = socks5_udp_exchange(proxy.address, responder.address, build_query(DNS_NAME, 0x5A5A))
    assert parse_answer(reply) == (0x5A5A, RCODE_NOERROR, list(DNS_IPS))
    assert responder.counts[DNS_NAME] == 1


@pytest.mark.peer
def test_curl_fetches_the_origin_through_microsocks_without_auth(origin: HttpOrigin) -> None:
    with microsocks() as proxy:
        result = curl("--socks5-hostname", f"{proxy.host}:{proxy.port}", origin.url("/via-microsocks"))
    assert result.returncode == 0, result.stderr
    assert origin.paths == ["/via-microsocks"]


@pytest.mark.peer
def test_microsocks_with_credentials_admits_the_right_password(origin: HttpOrigin) -> None:
    with microsocks("alice", "open-sesame") as proxy:
        result = curl(
            "--socks5-hostname",
            f"{proxy.host}:{proxy.port}",
            "--proxy-user",
            "alice:open-sesame",
            origin.url("/authed"),
        )
    assert result.returncode == 0, result.stderr
    assert origin.paths == ["/authed"]


@pytest.mark.peer
def test_microsocks_with_credentials_refuses_a_wrong_password(origin: HttpOrigin) -> None:
    with microsocks("alice", "open-sesame") as proxy:
        wrong = curl(
            "--socks5-hostname",
            f"{proxy.host}:{proxy.port}",
            "--proxy-user",
            "alice:guess",
            origin.url("/wrong"),
        )
        missing = curl("--socks5-hostname", f"{proxy.host}:{proxy.port}", origin.url("/missing"))
    assert wrong.returncode != 0
    assert missing.returncode != 0
    assert origin.paths == []


# --- HTTP CONNECT: tinyproxy, plain and behind the TLS front -----------------------------


@pytest.mark.peer
def test_curl_connects_through_tinyproxy(origin: HttpOrigin) -> None:
    with tinyproxy() as proxy:
        result = curl("-p", "-x", proxy.url, origin.url("/tunnelled"))
    body, status = body_and_connect_status(result)
    assert result.returncode == 0, result.stderr
    assert status == 200  # the tunnel really was a CONNECT
    assert body == HttpOrigin.body_for("/tunnelled").decode()


@pytest.mark.peer
def test_tinyproxy_with_basic_auth_admits_the_right_credentials(origin: HttpOrigin) -> None:
    with tinyproxy("bob", "hunter2") as proxy:
        result = curl("-p", "-x", proxy.url, "--proxy-user", "bob:hunter2", origin.url("/basic"))
    assert result.returncode == 0, result.stderr
    assert body_and_connect_status(result)[1] == 200
    assert origin.paths == ["/basic"]


@pytest.mark.peer
def test_tinyproxy_with_basic_auth_answers_407_without_credentials(origin: HttpOrigin) -> None:
    with tinyproxy("bob", "hunter2") as proxy:
        result = curl("-p", "-x", proxy.url, origin.url("/nope"))
    assert result.returncode != 0
    assert body_and_connect_status(result)[1] == 407
    assert origin.paths == []


@pytest.mark.peer
def test_tinyproxy_with_basic_auth_answers_wrong_credentials_with_401(origin: HttpOrigin) -> None:
    # tinyproxy 1.11's own quirk (not 407); HTTP proxy clients meet it here first.
    with tinyproxy("bob", "hunter2") as proxy:
        result = curl("-p", "-x", proxy.url, "--proxy-user", "bob:hunter3", origin.url("/wrong"))
    assert result.returncode != 0
    assert body_and_connect_status(result)[1] == 401
    assert origin.paths == []


@pytest.mark.peer
def test_tinyproxy_refuses_credentials_its_config_cannot_hold() -> None:
    with pytest.raises(ValueError, match="credentials must match"):
        with tinyproxy("bob", "p@ss:word"):
            pass


@pytest.mark.peer
@pytest.mark.parametrize("auth", [None, ("carol", "tls-secret")], ids=["no-auth", "basic-auth"])
def test_curl_connects_through_the_tls_front_trusting_its_ca(
    origin: HttpOrigin, auth: tuple[str, str] | None
) -> None:
    with https_proxy(*(auth or (None, None))) as proxy:
        creds = ["--proxy-user", ":".join(auth)] if auth else []
        result = curl(
            "-p", "--proxy", proxy.url, "--proxy-cacert", str(proxy.ca_path), *creds, origin.url("/over-tls")
        )
    assert result.returncode == 0, result.stderr
    assert body_and_connect_status(result)[1] == 200
    assert origin.paths == ["/over-tls"]


@pytest.mark.peer
def test_tls_front_fails_verification_for_a_client_trusting_another_ca(
    origin: HttpOrigin, tmp_path: os.PathLike[str]
) -> None:
    stranger = os.path.join(tmp_path, "other-ca.pem")
    trustme.CA().cert_pem.write_to_path(stranger)
    with https_proxy() as proxy:
        result = curl("-p", "--proxy", proxy.url, "--proxy-cacert", stranger, origin.url("/untrusted"))
    assert result.returncode == CURL_PEER_FAILED_VERIFICATION, result.stderr
    assert origin.paths == []


# --- Shadowsocks: ss-local into ss-server -------------------------------------------------


@pytest.mark.peer
@pytest.mark.parametrize("method", SS_METHODS)
def test_ss_local_carries_curl_through_ss_server(origin: HttpOrigin, method: str) -> None:
    with ss_server(method, "correct horse", udp=False) as server, ss_local(server) as local:
        result = curl("--socks5-hostname", f"{local.host}:{local.port}", origin.url(f"/ss/{method}"))
    assert result.returncode == 0, result.stderr
    assert origin.paths == [f"/ss/{method}"]


@pytest.mark.peer
@pytest.mark.parametrize("method", SS_METHODS)
def test_ss_server_relays_a_dns_query_over_udp(responder: UdpDnsResponder, method: str) -> None:
    with ss_server(method, "battery staple") as server, ss_local(server, udp=True) as local:
        reply = socks5_udp_exchange(local.address, responder.address, build_query(DNS_NAME, 0x0BAD))
    assert parse_answer(reply) == (0x0BAD, RCODE_NOERROR, list(DNS_IPS))


@pytest.mark.peer
def test_ss_server_carries_nothing_for_a_client_with_another_password(origin: HttpOrigin) -> None:
    with ss_server("aes-256-gcm", "the real one", udp=False) as server:
        impostor = type(server)(server.host, server.port, server.method, "a guess", udp=False)
        with ss_local(impostor) as local:
            result = curl(
                "--socks5-hostname",
                f"{local.host}:{local.port}",
                origin.url("/impostor"),
                max_time=SILENT_REFUSAL_WAIT,
            )
    assert result.returncode != 0
    assert origin.paths == []


# --- the harness itself ---------------------------------------------------------------------


@pytest.mark.peer
def test_a_peer_that_cannot_start_raises_with_its_log_tail() -> None:
    with pytest.raises(PeerStartError, match=r"ss-server exited while starting:\n(.|\n)*cipher"):
        with ss_server("no-such-cipher", "pw"):
            pass


@pytest.mark.peer
def test_leaving_a_peer_stops_its_process_and_frees_its_port() -> None:
    with danted() as proxy:
        assert tcp_accepts(proxy.port)()
    assert not tcp_accepts(proxy.port)()


# --- the DNS responder ----------------------------------------------------------------------


def _ask(responder: UdpDnsResponder, query: bytes) -> bytes:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(STEP)
        sock.sendto(query, responder.address)
        return sock.recv(65535)


def test_dns_responder_answers_a_configured_name_with_its_addresses(responder: UdpDnsResponder) -> None:
    assert parse_answer(_ask(responder, build_query("PEER.honk.test.", 7))) == (
        7,
        RCODE_NOERROR,
        list(DNS_IPS),
    )
    assert responder.wait_for_queries(1) == 1


def test_dns_responder_answers_an_unknown_name_with_nxdomain(responder: UdpDnsResponder) -> None:
    assert parse_answer(_ask(responder, build_query("absent.honk.test", 8))) == (8, RCODE_NXDOMAIN, [])
    assert responder.counts["absent.honk.test"] == 1


def test_dns_responder_answers_aaaa_for_a_known_name_with_no_records(responder: UdpDnsResponder) -> None:
    reply = _ask(responder, build_query(DNS_NAME, 9, qtype=TYPE_AAAA))
    assert parse_answer(reply) == (9, RCODE_NOERROR, [])


def test_dns_responder_serves_an_asyncio_client(run, responder: UdpDnsResponder) -> None:
    async def main() -> bytes:
        loop = asyncio.get_running_loop()
        got: asyncio.Future[bytes] = loop.create_future()

        class Client(asyncio.DatagramProtocol):
            def datagram_received(self, data: bytes, addr: object) -> None:
                if not got.done():
                    got.set_result(data)

        transport, _ = await loop.create_datagram_endpoint(Client, remote_addr=responder.address)
        try:
            transport.sendto(build_query(DNS_NAME, 11))
            reply = await asyncio.wait_for(got, STEP)
            assert await responder.queried(1) == 1
            return reply
        finally:
            transport.close()

    assert parse_answer(run(main())) == (11, RCODE_NOERROR, list(DNS_IPS))


_label = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=63)


@given(
    labels=st.lists(_label, min_size=1, max_size=4),
    qid=st.integers(0, 0xFFFF),
    ips=st.lists(st.ip_addresses(v=4).map(str), min_size=1, max_size=5),
)
def test_dns_wire_codec_round_trips_any_name_id_and_addresses(
    labels: list[str], qid: int, ips: list[str]
) -> None:
    name = ".".join(labels)
    reply = build_response(build_query(name, qid), {name: ips})
    assert reply is not None
    assert parse_answer(reply) == (qid, RCODE_NOERROR, ips)
    assert parse_answer(build_response(build_query("x" + name, qid), {name: ips})) == (
        qid,
        RCODE_NXDOMAIN,
        [],
    )


@given(garbage=st.binary(max_size=80))
def test_dns_responder_answers_garbage_with_formerr_or_silence(garbage: bytes) -> None:
    reply = build_response(garbage, {DNS_NAME: DNS_IPS})
    if reply is not None:
        qid, rcode, _ = parse_answer(reply)
        assert qid == struct.unpack_from("!H", garbage)[0]
        assert rcode in (RCODE_NOERROR, RCODE_NXDOMAIN, RCODE_FORMERR, RCODE_NOTIMP)
