"""VMess AEAD client codec: known answers from an independent reference, and a round trip
through a minimal server written here from the protocol description (v2ray proxy/vmess)."""

from __future__ import annotations

import functools
import hashlib
import hmac
import ipaddress
import struct
import uuid as uuidlib
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305

from honk.core.errors import HonkError
from honk.core.net import Address
from honk.proto.vmess import (
    COMMAND_TCP,
    COMMAND_UDP,
    MAX_PAYLOAD,
    VmessAuthError,
    VmessClient,
    VmessError,
    VmessProtocolError,
    auth_id,
    check_alter_id,
    cmd_key,
    kdf,
    open_aead_header,
    seal_aead_header,
)

USER = "b831381d-6324-4d53-ad4f-8cda48b30811"
OTHER_USER = "27848739-7e62-4138-9fd3-098a63964b6b"
NOW = 1_700_000_000  # a fixed clock for the auth id
TARGET = Address("example.com", 443)
SECURITIES = ("aes-128-gcm", "chacha20-poly1305", "none")
SECURITY_NIBBLE = {"aes-128-gcm": 3, "chacha20-poly1305": 4, "none": 5}


def counting_random() -> Callable[[int], bytes]:
    """A deterministic ``random(n)``: successive bytes of a counter."""
    state = {"next": 0}

    def take(n: int) -> bytes:
        start = state["next"]
        state["next"] += n
        return bytes((start + i) % 256 for i in range(n))

    return take


# --- a second, straightforward implementation from the spec text ----------------------


def ref_kdf(key: bytes, *path: bytes) -> bytes:
    """Nested HMAC-SHA256 built from the stdlib: each salt's HMAC uses the previous HMAC as its hash."""

    def layer(salt: bytes, parent, data: bytes = b"") -> hmac.HMAC:
        return hmac.new(salt, data, parent)

    make = hashlib.sha256
    for salt in (b"VMess AEAD KDF", *path):
        make = functools.partial(layer, salt, make)
    return make(key).digest()


def ref_cmd_key(user: str) -> bytes:
    return hashlib.md5(uuidlib.UUID(user).bytes + b"c48619fe-8f02-49e0-b9e9-edf763e17e21").digest()


def _aead(security: str, key: bytes):
    if security == "aes-128-gcm":
        return AESGCM(key)
    if security == "chacha20-poly1305":
        k1 = hashlib.md5(key).digest()
        return ChaCha20Poly1305(k1 + hashlib.md5(k1).digest())
    return None


class RefChunks:
    """One body direction as the server sees it: SHAKE128 length masks, counter nonces."""

    def __init__(self, security: str, key: bytes, iv: bytes) -> None:
        self.aead = _aead(security, key)
        self.masks = hashlib.shake_128(iv).digest(2 * 4096)
        self.iv = iv
        self.n = 0

    def _mask(self) -> int:
        return struct.unpack_from("!H", self.masks, 2 * self.n)[0]

    def _nonce(self) -> bytes:
        return struct.pack("!H", self.n) + self.iv[2:12]

    def write(self, payload: bytes) -> bytes:
        sealed = payload if self.aead is None else self.aead.encrypt(self._nonce(), payload, None)
        out = struct.pack("!H", len(sealed) ^ self._mask()) + sealed
        self.n += 1
        return out

    def read_all(self, data: bytes) -> tuple[list[bytes], bool]:
        """Every chunk payload in ``data`` and whether the terminating empty chunk was seen."""
        out, pos = [], 0
        while pos < len(data):
            size = struct.unpack_from("!H", data, pos)[0] ^ self._mask()
            body = data[pos + 2 : pos + 2 + size]
            pos += 2 + size
            plain = body if self.aead is None else self.aead.decrypt(self._nonce(), body, None)
            self.n += 1
            if not plain:
                assert pos == len(data), "bytes after the terminating chunk"
                return out, True
            out.append(plain)
        return out, False


@dataclass
class OpenedRequest:
    timestamp: int
    iv: bytes
    key: bytes
    check: int
    options: int
    security: int
    command: int
    target: Address
    body: bytes


def server_open(user: str, data: bytes) -> OpenedRequest:
    """The server's side: find the header in ``data``, check every field, return it and the body bytes."""
    key = ref_cmd_key(user)
    aid, nonce = data[:16], data[34:42]
    plain_id = (
        Cipher(algorithms.AES(ref_kdf(key, b"AES Auth ID Encryption")[:16]), modes.ECB())
        .decryptor()
        .update(aid)
    )
    assert zlib.crc32(plain_id[:12]).to_bytes(4, "big") == plain_id[12:]
    length_key = ref_kdf(key, b"VMess Header AEAD Key_Length", aid, nonce)[:16]
    length_nonce = ref_kdf(key, b"VMess Header AEAD Nonce_Length", aid, nonce)[:12]
    (length,) = struct.unpack("!H", AESGCM(length_key).decrypt(length_nonce, data[16:34], aid))
    header_key = ref_kdf(key, b"VMess Header AEAD Key", aid, nonce)[:16]
    header_nonce = ref_kdf(key, b"VMess Header AEAD Nonce", aid, nonce)[:12]
    end = 42 + length + 16
    header = AESGCM(header_key).decrypt(header_nonce, data[42:end], aid)
    assert header[0] == 1
    padding_len, security = header[35] >> 4, header[35] & 0x0F
    assert header[36] == 0
    port = struct.unpack_from("!H", header, 38)[0]
    kind = header[40]
    if kind == 1:
        host, pos = str(ipaddress.IPv4Address(header[41:45])), 45
    elif kind == 3:
        host, pos = str(ipaddress.IPv6Address(header[41:57])), 57
    else:
        assert kind == 2
        host, pos = header[42 : 42 + header[41]].decode(), 42 + header[41]
    pos += padding_len
    fnv = 0x811C9DC5
    for b in header[:pos]:
        fnv = ((fnv ^ b) * 0x01000193) % 2**32
    assert header[pos:] == fnv.to_bytes(4, "big")
    return OpenedRequest(
        timestamp=int.from_bytes(plain_id[:8], "big"),
        iv=header[1:17],
        key=header[17:33],
        check=header[33],
        options=header[34],
        security=security,
        command=header[37],
        target=Address(host, port),
        body=data[end:],
    )


def server_response(req: OpenedRequest, security: str, check: int | None = None) -> tuple[bytes, RefChunks]:
    """The sealed response header (check byte, options, no command) and the writer for the response body."""
    key = hashlib.sha256(req.key).digest()[:16]
    iv = hashlib.sha256(req.iv).digest()[:16]
    header = bytes((req.check if check is None else check, req.options, 0, 0))
    sealed_len = AESGCM(ref_kdf(key, b"AEAD Resp Header Len Key")[:16]).encrypt(
        ref_kdf(iv, b"AEAD Resp Header Len IV")[:12], struct.pack("!H", len(header)), None
    )
    sealed = AESGCM(ref_kdf(key, b"AEAD Resp Header Key")[:16]).encrypt(
        ref_kdf(iv, b"AEAD Resp Header IV")[:12], header, None
    )
    return sealed_len + sealed, RefChunks(security, key, iv)


def connect(security: str = "aes-128-gcm", command: int = COMMAND_TCP, target: Address = TARGET):
    client = VmessClient(USER, security, command, target, now=NOW, random=counting_random())
    return client, client.request_header()


# --- known answers ------------------------------------------------------------------------


def test_cmd_key_is_md5_of_the_uuid_bytes_and_the_vmess_magic():
    assert cmd_key(USER) == ref_cmd_key(USER)
    assert cmd_key(USER.upper()) == cmd_key(USER)  # the UUID, not its spelling
    assert cmd_key(USER) != cmd_key(OTHER_USER)


@pytest.mark.parametrize(
    "path",
    [
        (),
        (b"AES Auth ID Encryption",),
        (b"VMess Header AEAD Key", b"\x01" * 16, b"\x02" * 8),
        (b"s" * 100, b"t"),
        (b"s", b"t" * 100, b"u" * 64, b"v" * 65),
    ],
    ids=["root-only", "auth-id", "header-key", "long-salt", "long-inner-salts"],
)
def test_kdf_equals_the_nested_hmac_chain_built_from_the_stdlib(path):
    key = ref_cmd_key(USER)
    assert kdf(key, *path) == ref_kdf(key, *path)
    assert len(kdf(key, *path)) == 32


def test_kdf_depends_on_the_order_of_the_path():
    key = ref_cmd_key(USER)
    assert kdf(key, b"a", b"b") != kdf(key, b"b", b"a")


def test_auth_id_is_one_aes_block_over_timestamp_random_and_crc32():
    key = ref_cmd_key(USER)
    plain = NOW.to_bytes(8, "big") + b"\xaa\xbb\xcc\xdd"
    plain += zlib.crc32(plain).to_bytes(4, "big")
    aes = Cipher(algorithms.AES(ref_kdf(key, b"AES Auth ID Encryption")[:16]), modes.ECB()).encryptor()
    assert auth_id(key, NOW, b"\xaa\xbb\xcc\xdd") == aes.update(plain) + aes.finalize()


def test_auth_ids_of_many_connections_and_two_ids_each_match_a_fresh_cipher():
    """The auth-id cipher is kept per id and reused: every block must still be its own."""
    keys = [ref_cmd_key(USER), ref_cmd_key("b831381d-6324-4d53-ad4f-8cda48b30811")]
    for i in range(50):
        key = keys[i % 2]
        rand = i.to_bytes(4, "big")
        plain = (NOW + i).to_bytes(8, "big") + rand
        plain += zlib.crc32(plain).to_bytes(4, "big")
        aes = Cipher(algorithms.AES(ref_kdf(key, b"AES Auth ID Encryption")[:16]), modes.ECB()).encryptor()
        assert auth_id(key, NOW + i, rand) == aes.update(plain) + aes.finalize()
    assert cmd_key(USER) == keys[0] and cmd_key(USER) is cmd_key(USER)  # kept per id


def test_sealed_header_opens_with_the_reference_and_with_open_aead_header():
    key = ref_cmd_key(USER)
    sealed = seal_aead_header(key, b"header bytes", NOW, b"\x01\x02\x03\x04", b"n" * 8)
    assert sealed[34:42] == b"n" * 8
    assert len(sealed) == 16 + 18 + 8 + len(b"header bytes") + 16
    assert open_aead_header(key, sealed) == (b"header bytes", NOW)


def test_a_header_sealed_for_another_user_is_an_authentication_error():
    sealed = seal_aead_header(ref_cmd_key(OTHER_USER), b"header", NOW, b"\x00" * 4, b"\x00" * 8)
    with pytest.raises(VmessAuthError):
        open_aead_header(ref_cmd_key(USER), sealed)


# --- the request header ---------------------------------------------------------------------


@pytest.mark.parametrize("security", SECURITIES)
def test_request_header_carries_options_sm_security_command_and_time(security):
    client, header = connect(security)
    req = server_open(USER, header)
    assert req.body == b""
    assert req.timestamp == NOW
    assert (req.iv, req.key, req.check) == (client.body_iv, client.body_key, client.response_check)
    assert req.options == 0x01 | 0x04  # ChunkStream | ChunkMasking, no GlobalPadding
    assert req.security == SECURITY_NIBBLE[security]
    assert req.command == COMMAND_TCP
    assert req.target == TARGET


@pytest.mark.parametrize(
    "target",
    [Address("192.0.2.7", 53), Address("2001:db8::1", 8443), Address("a.b.example", 1)],
    ids=["ipv4", "ipv6", "domain"],
)
def test_request_header_encodes_each_address_kind_port_first(target):
    _, header = connect(command=COMMAND_UDP, target=target)
    req = server_open(USER, header)
    assert (req.command, req.target) == (COMMAND_UDP, target)


def test_request_header_for_another_user_fails_the_server_check():
    _, header = connect()
    with pytest.raises(AssertionError):  # the auth id's CRC does not hold under the wrong key
        server_open(OTHER_USER, header)


def test_unknown_security_and_bad_uuid_are_refused_without_echoing_the_value():
    with pytest.raises(ValueError, match="unknown VMess security"):
        VmessClient(USER, "rc4", COMMAND_TCP, TARGET, now=NOW)
    with pytest.raises(ValueError) as info:
        VmessClient("not-a-uuid-secret", "none", COMMAND_TCP, TARGET, now=NOW)
    assert "not-a-uuid-secret" not in str(info.value)


def test_check_alter_id_accepts_zero_and_rejects_the_legacy_header():
    check_alter_id(0)
    with pytest.raises(VmessError) as info:
        check_alter_id(64)
    assert info.value.reason == "legacy-alter-id"
    assert "alterId" in str(info.value)
    assert isinstance(info.value, HonkError)


# --- bodies, both directions -------------------------------------------------------------


@pytest.mark.parametrize("security", SECURITIES)
def test_tcp_round_trip_through_the_reference_server(security):
    client, header = connect(security)
    upload = bytes(range(256)) * 200  # 51200 bytes: four chunks
    req = server_open(USER, header + client.encrypt(upload) + client.eof())
    chunks, ended = RefChunks(security, req.key, req.iv).read_all(req.body)
    assert ended
    assert [len(c) for c in chunks] == [MAX_PAYLOAD, MAX_PAYLOAD, MAX_PAYLOAD, len(upload) - 3 * MAX_PAYLOAD]
    assert b"".join(chunks) == upload

    response_header, writer = server_response(req, security)
    wire = response_header + writer.write(b"hello ") + writer.write(b"world") + writer.write(b"")
    decoder = client.response_decoder()
    assert decoder.feed(wire) == b"hello world"
    assert decoder.header_received and decoder.ended


@pytest.mark.parametrize("security", SECURITIES)
def test_response_fed_one_byte_at_a_time_decodes_the_same(security):
    client, header = connect(security)
    response_header, writer = server_response(server_open(USER, header), security)
    wire = response_header + writer.write(b"x" * 1000) + writer.write(b"yz") + writer.write(b"")
    decoder = client.response_decoder()
    assert b"".join(decoder.feed(wire[i : i + 1]) for i in range(len(wire))) == b"x" * 1000 + b"yz"
    assert decoder.ended


def test_udp_packets_travel_one_chunk_each_and_come_back_as_packets():
    client, header = connect("aes-128-gcm", COMMAND_UDP, Address("192.0.2.1", 53))
    req = server_open(USER, header + client.encrypt(b"query-1") + client.encrypt(b"q2"))
    packets, ended = RefChunks("aes-128-gcm", req.key, req.iv).read_all(req.body)
    assert (packets, ended) == ([b"query-1", b"q2"], False)
    response_header, writer = server_response(req, "aes-128-gcm")
    decoder = client.response_decoder()
    assert decoder.feed_packets(response_header + writer.write(b"answer-1") + writer.write(b"a2")) == [
        b"answer-1",
        b"a2",
    ]


def test_udp_packet_larger_than_a_chunk_is_refused():
    client, _ = connect(command=COMMAND_UDP)
    with pytest.raises(ValueError):
        client.encrypt(b"x" * (MAX_PAYLOAD + 1))


def test_empty_tcp_write_sends_nothing_and_eof_only_once():
    client, _ = connect()
    assert client.encrypt(b"") == b""
    client.eof()
    with pytest.raises(ValueError):
        client.eof()


# --- refusals ---------------------------------------------------------------------------


def _response(security: str = "aes-128-gcm", check: int | None = None):
    client, header = connect(security)
    response_header, writer = server_response(server_open(USER, header), security, check)
    return client.response_decoder(), response_header, writer


def test_wrong_response_check_byte_is_an_authentication_error():
    client, header = connect()
    req = server_open(USER, header)
    decoder, response_header, _ = _response(check=(req.check + 1) % 256)
    with pytest.raises(VmessAuthError) as info:
        decoder.feed(response_header)
    assert info.value.reason == "response-check-mismatch"


@pytest.mark.parametrize("index", [0, 17, 18, 25], ids=["length", "length-tag", "header", "header-tag"])
def test_flipped_byte_in_the_response_header_is_an_authentication_error(index):
    decoder, response_header, _ = _response()
    tampered = bytearray(response_header)
    tampered[index] ^= 0x01
    with pytest.raises(VmessAuthError):
        decoder.feed(bytes(tampered))
    assert decoder.failed


@pytest.mark.parametrize("security", ["aes-128-gcm", "chacha20-poly1305"])
def test_flipped_byte_in_a_sealed_chunk_is_an_authentication_error(security):
    decoder, response_header, writer = _response(security)
    chunk = bytearray(writer.write(b"payload"))
    chunk[5] ^= 0x80
    with pytest.raises(VmessAuthError) as info:
        decoder.feed(response_header + bytes(chunk))
    assert info.value.reason == "bad-chunk-tag"


def test_a_response_for_another_connection_is_an_authentication_error():
    decoder, _, _ = _response()
    other = VmessClient(USER, "aes-128-gcm", COMMAND_TCP, TARGET, now=NOW)
    other_header, _ = server_response(server_open(USER, other.request_header()), "aes-128-gcm")
    with pytest.raises(VmessAuthError):
        decoder.feed(other_header)


def test_a_chunk_shorter_than_its_tag_is_a_protocol_error():
    decoder, response_header, writer = _response()
    mask = struct.unpack_from("!H", writer.masks, 0)[0]
    with pytest.raises(VmessProtocolError) as info:
        decoder.feed(response_header + struct.pack("!H", 5 ^ mask) + b"x" * 5)
    assert info.value.reason == "short-chunk"


def test_bytes_after_the_terminating_chunk_are_a_protocol_error():
    decoder, response_header, writer = _response()
    decoder.feed(response_header + writer.write(b""))
    assert decoder.ended
    with pytest.raises(VmessProtocolError):
        decoder.feed(b"\x00")


def test_a_failed_decoder_refuses_further_input():
    decoder, response_header, _ = _response()
    with pytest.raises(VmessAuthError):
        decoder.feed(b"\x00" * len(response_header))
    with pytest.raises(VmessProtocolError) as info:
        decoder.feed(response_header)
    assert info.value.reason == "decoder-failed"
