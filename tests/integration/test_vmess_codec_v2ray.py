"""The VMess codec against a real v2ray (Debian's 4.34) server: request header and chunks out,
response header and chunks back, for each body security, over TCP and for the UDP command.

Path: a plain socket -> v2ray's VMess inbound (alterId 0, so AEAD only) -> freedom -> a local
echo server (TCP) or a UDP echo socket.
"""

from __future__ import annotations

import contextlib
import hashlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from helpers.peerservers import v2ray_server
from helpers.servers import EchoServer

from honk.core.net import Address
from honk.proto.vmess import COMMAND_TCP, COMMAND_UDP, MAX_PAYLOAD, VmessClient, VmessResponseDecoder

USER = "b831381d-6324-4d53-ad4f-8cda48b30811"
SECURITIES = ("aes-128-gcm", "chacha20-poly1305", "none")
IO_TIMEOUT = 10.0  # seconds for any one socket operation against loopback
UPLOAD_SIZE = 5 * MAX_PAYLOAD + 777  # several full chunks and a partial one


@pytest.fixture(scope="module")
def server() -> Iterator[object]:
    with v2ray_server("vmess", uuid=USER) as peer:
        yield peer


@pytest.fixture(scope="module")
def echo() -> Iterator[EchoServer]:
    with EchoServer() as srv:
        yield srv


@contextlib.contextmanager
def udp_echo() -> Iterator[int]:
    """A UDP socket on loopback that sends every datagram back; yields its port."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                data, peer = sock.recvfrom(65535)
                sock.sendto(data, peer)

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


def _read_until(sock: socket.socket, decoder: VmessResponseDecoder, want: int) -> list[bytes]:
    """Packets decoded from ``sock`` until their total length reaches ``want`` (or the server closes)."""
    packets: list[bytes] = []
    total = 0
    while total < want:
        data = sock.recv(65536)
        if not data:
            break
        new = decoder.feed_packets(data)
        packets += new
        total += sum(map(len, new))
    return packets


@pytest.mark.parametrize("security", SECURITIES)
def test_tcp_echo_through_v2ray_round_trips_with_each_security(server, echo, security):
    client = VmessClient(USER, security, COMMAND_TCP, Address("127.0.0.1", echo.port), now=time.time())
    decoder = client.response_decoder()
    upload = hashlib.sha256(security.encode()).digest() * (UPLOAD_SIZE // 32 + 1)
    upload = upload[:UPLOAD_SIZE]
    with socket.create_connection(server.address, timeout=IO_TIMEOUT) as sock:
        sock.sendall(client.request_header() + client.encrypt(upload))
        got = b"".join(_read_until(sock, decoder, len(upload)))
        assert decoder.header_received
        assert hashlib.sha256(got).hexdigest() == hashlib.sha256(upload).hexdigest()
        sock.sendall(client.eof())
        # After our end the server finishes the stream (an empty chunk or a close); nothing more arrives.
        while data := sock.recv(65536):
            assert decoder.feed(data) == b""
    assert not decoder.failed


@pytest.mark.parametrize("security", SECURITIES)
def test_udp_command_through_v2ray_echoes_each_packet(server, security):
    with udp_echo() as port:
        client = VmessClient(USER, security, COMMAND_UDP, Address("127.0.0.1", port), now=time.time())
        decoder = client.response_decoder()
        packets = [b"first datagram", b"x" * 1200, b"third"]
        with socket.create_connection(server.address, timeout=IO_TIMEOUT) as sock:
            sock.sendall(client.request_header() + b"".join(client.encrypt(p) for p in packets))
            got = _read_until(sock, decoder, sum(map(len, packets)))
    assert got == packets


STALE_CLOCK = 600.0  # seconds; v2ray accepts auth ids within 120 s of its own clock


@pytest.mark.parametrize(
    ("user", "skew"),
    [("27848739-7e62-4138-9fd3-098a63964b6b", 0.0), (USER, -STALE_CLOCK)],
    ids=["wrong-uuid", "stale-clock"],
)
def test_v2ray_refuses_a_header_with_the_wrong_uuid_or_a_stale_timestamp(server, echo, user, skew):
    client = VmessClient(
        user, "aes-128-gcm", COMMAND_TCP, Address("127.0.0.1", echo.port), now=time.time() + skew
    )
    decoder = client.response_decoder()
    with socket.create_connection(server.address, timeout=IO_TIMEOUT) as sock:
        sock.sendall(client.request_header() + client.encrypt(b"hello"))
        sock.shutdown(socket.SHUT_WR)
        # v2ray drains and closes a connection it cannot authenticate; it never answers.
        with contextlib.suppress(ConnectionResetError):
            while data := sock.recv(65536):
                decoder.feed(data)
    assert not decoder.header_received
