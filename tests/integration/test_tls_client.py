"""TLS to a node's server: each way a certificate can be wrong is its own typed error.

The server is haproxy terminating TLS (tests/helpers/peerservers.py ``tls_front``)
with certificates from trustme: trusted, self-signed (another CA), expired, and
issued for another name. A plain TCP server stands for "speaks another protocol".
"""

from __future__ import annotations

import asyncio
import datetime
import socket
import threading
import time

import pytest
import trustme
from helpers.peerservers import tls_front
from helpers.servers import EchoServer

from honk.core.clock import MonotonicClock
from honk.core.errors import ConfigRefused, DialTimeout
from honk.outbound.tls import TlsFailed, tls_connect, tls_context, tls_verification

STEP = 5.0


async def _handshake(port: int, server_name: str, *, verify: bool = True, deadline_s: float = STEP) -> None:
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setblocking(False)
    await loop.sock_connect(sock, ("127.0.0.1", port))
    clock = MonotonicClock()
    conn = await tls_connect(sock, tls_context(verify), server_name, clock, clock.now() + deadline_s, "node")
    conn.abort()


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def trusting(ca, tmp_path, monkeypatch):
    path = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(path))
    monkeypatch.setenv("SSL_CERT_FILE", str(path))  # the system trust store, as a router configures it
    return ca


def test_a_certificate_from_a_trusted_ca_for_the_name_is_accepted(run, echo, trusting) -> None:
    with tls_front(echo.port, ca=trusting) as front:
        run(_handshake(front.port, "localhost"))


def test_a_self_signed_certificate_is_untrusted(run, echo, trusting) -> None:
    with tls_front(echo.port, ca=trustme.CA()) as front:  # another CA: not in the trust store
        with pytest.raises(TlsFailed) as info:
            run(_handshake(front.port, "localhost"))
        assert info.value.reason == "certificate-untrusted" and info.value.phase == "tls"


def test_the_same_certificate_passes_with_verification_off(run, echo, trusting) -> None:
    with tls_front(echo.port, ca=trustme.CA()) as front:
        run(_handshake(front.port, "localhost", verify=False))


def test_a_certificate_for_another_name_is_a_name_error(run, echo, trusting) -> None:
    with tls_front(echo.port, ca=trusting, server_names=("other.example",)) as front:
        with pytest.raises(TlsFailed) as info:
            run(_handshake(front.port, "localhost"))
        assert info.value.reason == "certificate-name"


def test_an_expired_certificate_is_an_expiry_error(run, echo, trusting, monkeypatch) -> None:
    past = datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC)
    expired = trusting.issue_cert("localhost", not_before=past, not_after=past + datetime.timedelta(days=1))
    with tls_front(echo.port, ca=trusting, leaf=expired) as front:
        with pytest.raises(TlsFailed) as info:
            run(_handshake(front.port, "localhost"))
        assert info.value.reason == "certificate-expired"


def test_a_server_speaking_another_protocol_is_a_handshake_error_within_the_deadline(run) -> None:
    with socket.create_server(("127.0.0.1", 0)) as plain:
        def answer() -> None:
            conn, _ = plain.accept()
            with conn:
                conn.recv(1024)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

        threading.Thread(target=answer, daemon=True).start()
        with pytest.raises(TlsFailed) as info:
            run(_handshake(plain.getsockname()[1], "localhost"))
        assert info.value.reason == "handshake"


def test_a_server_that_never_answers_times_out_in_the_tls_phase(run) -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:
        started = time.monotonic()
        with pytest.raises(DialTimeout) as info:
            run(_handshake(silent.getsockname()[1], "localhost", deadline_s=0.3))
        assert info.value.phase == "tls" and time.monotonic() - started < 2.0


@pytest.mark.parametrize(("params", "verify"), [((), True), ((("allowInsecure", "1"),), False),
                                                ((("insecure", "false"),), True), ((("allow_insecure", "ON"),), False)])
def test_link_booleans_decide_verification(params, verify) -> None:
    assert tls_verification(params) is verify


@pytest.mark.parametrize("params", [(("allowInsecure", "maybe"),), (("allowInsecure", "1"), ("insecure", "0"))])
def test_unknown_or_conflicting_verification_values_are_refused(params) -> None:
    with pytest.raises(ConfigRefused):
        tls_verification(params)


@pytest.fixture
def echo():
    with EchoServer() as server:
        yield server
