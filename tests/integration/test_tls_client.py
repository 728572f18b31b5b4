"""TLS to a node's server: each way a certificate can be wrong is its own typed error.

The server is haproxy terminating TLS (tests/helpers/peerservers.py ``tls_front``)
with certificates from trustme: trusted, self-signed (another CA), expired, and
issued for another name. A plain TCP server stands for "speaks another protocol".
A node's own CA (its ``ca`` link parameter) is exercised through the transport a
VLESS link describes, with no ``SSL_CERT_FILE`` in the environment.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import socket
import threading
import time

import pytest
import trustme
from helpers.peerservers import tls_front
from helpers.servers import EchoServer

from honk.config.links import parse_node_link
from honk.config.spec import GlobalSpec
from honk.core.clock import FakeClock, MonotonicClock
from honk.core.errors import ConfigRefused, DialError, DialTimeout
from honk.outbound.proxy import ProxyLeaf
from honk.outbound.tls import (
    TRUST_STORE_RECHECK,
    TlsFailed,
    ca_path,
    client_context,
    tls_connect,
    tls_verification,
)
from honk.outbound.transport import TransportSpec, open_transport
from honk.relay.stream import StreamConn

STEP = 5.0


async def _dial(port: int, server_name: str, *, verify: bool = True, deadline_s: float = STEP) -> StreamConn:
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setblocking(False)
    await loop.sock_connect(sock, ("127.0.0.1", port))
    clock = MonotonicClock()
    context = client_context(verify, (), "", "node", clock.now())
    return await tls_connect(sock, context, server_name, clock, clock.now() + deadline_s, "node")


async def _handshake(port: int, server_name: str, *, verify: bool = True, deadline_s: float = STEP) -> None:
    (await _dial(port, server_name, verify=verify, deadline_s=deadline_s)).abort()


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


@pytest.mark.parametrize(
    ("params", "verify"),
    [
        ((), True),
        ((("allowInsecure", "1"),), False),
        ((("insecure", "false"),), True),
        ((("allow_insecure", "ON"),), False),
    ],
)
def test_link_booleans_decide_verification(params, verify) -> None:
    assert tls_verification(params) is verify


@pytest.mark.parametrize(
    "params", [(("allowInsecure", "maybe"),), (("allowInsecure", "1"), ("insecure", "0"))]
)
def test_unknown_or_conflicting_verification_values_are_refused(params) -> None:
    with pytest.raises(ConfigRefused):
        tls_verification(params)


# --- a node's own CA ---------------------------------------------------------------------

UUID = "b831381d-6324-4d53-ad4f-8cda48b30811"


async def _node_handshake(port: int, query: str) -> None:
    """TLS to 127.0.0.1:``port`` through the transport of a VLESS link with ``query``."""
    node = parse_node_link(f"vless://{UUID}@127.0.0.1:{port}?security=tls&sni=localhost&{query}#ca-node")
    leaf = ProxyLeaf(node, GlobalSpec(connect_timeout=STEP), MonotonicClock())
    channel = await open_transport(
        leaf, TransportSpec.from_params(node.params, node.host), leaf.clock.now() + STEP
    )
    channel.abort()


@pytest.fixture
def no_system_ca(monkeypatch):
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)


@pytest.fixture
def private_ca(tmp_path) -> tuple[trustme.CA, str]:
    ca = trustme.CA()
    path = tmp_path / "private-ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return ca, str(path)


def test_a_node_with_its_own_ca_accepts_a_certificate_from_it(run, echo, no_system_ca, private_ca) -> None:
    ca, path = private_ca
    with tls_front(echo.port, ca=ca) as front:
        run(_node_handshake(front.port, f"ca={path}"))


def test_without_its_ca_the_same_server_is_untrusted(run, echo, no_system_ca, private_ca) -> None:
    ca, _ = private_ca
    with tls_front(echo.port, ca=ca) as front:
        with pytest.raises(TlsFailed) as info:
            run(_node_handshake(front.port, ""))
        assert info.value.reason == "certificate-untrusted"


def test_a_nodes_ca_replaces_the_system_store_rather_than_adding_to_it(
    run, echo, trusting, private_ca
) -> None:
    _, path = private_ca  # the server's CA is in SSL_CERT_FILE, the node names another one
    with tls_front(echo.port, ca=trusting) as front:
        run(_node_handshake(front.port, ""))
        with pytest.raises(TlsFailed) as info:
            run(_node_handshake(front.port, f"ca={path}"))
        assert info.value.reason == "certificate-untrusted"


@pytest.mark.parametrize(
    "content", [None, b"", b"not a certificate\n", b"\xff\xfe-----BEGIN CERTIFICATE-----"]
)
def test_an_unusable_ca_file_is_refused_at_the_dial_naming_the_node_and_the_path(
    run, tmp_path, content
) -> None:
    path = tmp_path / "missing.pem" if content is None else tmp_path / "bad.pem"
    if content is not None:
        path.write_bytes(content)
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        with pytest.raises(ConfigRefused) as info:
            run(_node_handshake(port, f"ca={path}"))
        server.setblocking(False)
        with pytest.raises(BlockingIOError):
            server.accept()  # refused before anything was dialled
    assert "ca-node" in str(info.value) and str(path) in str(info.value)
    assert not isinstance(info.value, DialError)


def test_a_node_naming_two_different_ca_files_is_refused() -> None:
    assert ca_path((("ca", " /etc/a.pem "), ("ca", "/etc/a.pem"))) == "/etc/a.pem"
    with pytest.raises(ConfigRefused):
        ca_path((("ca", "/etc/a.pem"), ("ca", "/etc/b.pem")))


@pytest.fixture
def echo():
    with EchoServer() as server:
        yield server


def test_dials_share_one_context_until_the_ca_file_is_replaced(private_ca) -> None:
    """Loading a trust store costs milliseconds: it happens once per store, not per dial."""
    _, path = private_ca
    clock = FakeClock(start=500.0)
    first = client_context(True, ("h2",), path, "node", clock.now())
    assert client_context(True, ("h2",), path, "node", clock.now()) is first
    assert client_context(False, ("h2",), path, "node", clock.now()) is not first  # another verification
    with open(path, "ab") as file:  # the file changes (here: grows by another CA)
        file.write(trustme.CA().cert_pem.bytes())
    clock.advance(TRUST_STORE_RECHECK / 2)
    assert client_context(True, ("h2",), path, "node", clock.now()) is first  # not looked at again yet
    clock.advance(TRUST_STORE_RECHECK / 2)
    assert client_context(True, ("h2",), path, "node", clock.now()) is not first  # the next look rebuilds


def test_a_burst_of_dials_looks_at_the_trust_store_file_once(monkeypatch, private_ca) -> None:
    _, path = private_ca
    monkeypatch.setenv("SSL_CERT_FILE", path)
    clock = FakeClock(start=900.0)
    client_context(True, (), "", "node", clock.now())
    looks = []
    real_stat = os.stat
    monkeypatch.setattr(os, "stat", lambda p, *a, **k: (looks.append(p), real_stat(p, *a, **k))[1])
    for _ in range(100):
        client_context(True, (), "", "node", clock.now())
    assert looks == []
    clock.advance(TRUST_STORE_RECHECK)
    client_context(True, (), "", "node", clock.now())
    assert path in looks


def test_the_system_store_context_follows_ssl_cert_file(monkeypatch, private_ca) -> None:
    _, path = private_ca
    monkeypatch.setenv("SSL_CERT_FILE", path)
    ours = client_context(True, (), "", "node", 0.0)
    assert client_context(True, (), "", "node", 0.0) is ours
    monkeypatch.delenv("SSL_CERT_FILE")  # counts at once, within the recheck interval too
    assert client_context(True, (), "", "node", 0.0) is not ours


async def _dial_resumed(port: int, server_name: str = "localhost") -> bool:
    """One dial and an echo round trip; whether its handshake resumed an earlier session."""
    conn = await _dial(port, server_name)
    try:
        conn.write(b"ping")
        assert await conn.receive() == b"ping"  # reading also takes in the tickets the server sent
        assert conn.transport is not None
        return conn.transport.get_extra_info("ssl_object").session_reused
    finally:
        conn.abort()


def test_the_next_dial_to_the_same_server_resumes_its_tls13_session(run, echo, trusting) -> None:
    with tls_front(echo.port, ca=trusting) as front:  # haproxy sends TLS 1.3 tickets, as most servers do
        assert [run(_dial_resumed(front.port)) for _ in range(3)] == [False, True, True]


def test_a_session_is_offered_only_to_the_server_it_came_from(run, echo, trusting) -> None:
    with tls_front(echo.port, ca=trusting) as first, tls_front(echo.port, ca=trusting) as second:
        assert run(_dial_resumed(first.port)) is False
        assert run(_dial_resumed(second.port)) is False  # another address: a full handshake
        assert run(_dial_resumed(first.port, "127.0.0.1")) is False  # another server name too
        # Had either dial in between been filed under the first server, the first server would
        # now be offered a session it never issued, refuse it and handshake in full.
        assert run(_dial_resumed(first.port)) is True
